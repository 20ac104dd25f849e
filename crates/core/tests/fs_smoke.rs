//! The engine's operations end to end on a small device: namespace, data,
//! remount.

use flintfs_core::{
    errno, Fs, FsOptions, ManualClock, MkfsOptions, RenameFlags, SetAttributes, XattrFlags, FORGOTTEN_BATCH_FILES,
};
use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash, ZoneState};

mod common;

fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks: 4,
        zone_count: 64,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

fn assert_clean<D: flintfs_flash::FlashDevice>(fs: &mut Fs<D>) {
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

/// Faults of a wearing device: `bad_fraction` of the blocks bad from the
/// factory, and programs failing with `failure_probability` at
/// `endurance_cycles` erases, in proportion before and after.
fn wearing(bad_fraction: f64, endurance_cycles: u32, failure_probability: f64, seed: u64) -> FaultConfig {
    FaultConfig {
        factory_bad_block_fraction: bad_fraction,
        endurance_cycles,
        program_failure_probability_at_endurance: failure_probability,
        failure_growth_exponent: 1.0,
        ..FaultConfig::none(seed)
    }
}

/// Checks `fs`, remounts it, and reads every file in `expected` back
/// (by name, from the root) as it was. The fault model must have failed
/// some programs on the way.
fn survives_a_remount<'a>(
    mut fs: Fs<MemoryFlash>,
    clock: ManualClock,
    expected: impl IntoIterator<Item = (&'a String, &'a Vec<u8>)>,
) {
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    assert!(flash.lifetime_counters().program_failures_injected > 0, "the fault model failed some programs");
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    for (name, data) in expected {
        let attributes = fs.lookup(1, name.as_bytes()).unwrap();
        // Not assert_eq: a mismatch of megabytes would print them all.
        assert!(fs.read(attributes.ino, 0, data.len() as u64 + 1).unwrap() == *data, "{name}");
    }
    assert_clean(&mut fs);
}

/// A formatted and mounted device of `geometry` with `faults`.
fn faulty(geometry: Geometry, faults: FaultConfig, clock: &ManualClock) -> Fs<MemoryFlash> {
    let flash = MemoryFlash::memory(geometry, DeviceOptions { faults, ..DeviceOptions::default() }).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap().0
}

fn fresh() -> (MemoryFlash, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash =
        MemoryFlash::memory(geometry(), DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() })
            .unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    (flash, clock)
}

#[test]
fn files_and_directories_survive_a_remount() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let dir = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap();
    let file = fs.create(dir.ino, b"f", 0o644, 0, 0).unwrap();
    fs.write(file.ino, 0, b"hello").unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let large = fs.create(1, b"large", 0o644, 0, 0).unwrap();
    fs.write(large.ino, 0, &big).unwrap();
    fs.setxattr(file.ino, b"user.a", b"1", XattrFlags::default()).unwrap();
    fs.symlink(1, b"link", b"d/f", 0, 0).unwrap();
    assert_eq!(fs.lookup(1, b"d").unwrap().nlink, 2);
    assert_eq!(fs.read(file.ino, 0, 100).unwrap(), b"hello");
    assert_eq!(fs.read(large.ino, 0, 300_000).unwrap(), big);
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    eprintln!("{report:?}");
    let dir = fs.lookup(1, b"d").unwrap();
    let file = fs.lookup(dir.ino, b"f").unwrap();
    assert_eq!(fs.read(file.ino, 0, 100).unwrap(), b"hello");
    assert_eq!(fs.getxattr(file.ino, b"user.a").unwrap(), b"1");
    let large = fs.lookup(1, b"large").unwrap();
    assert_eq!(fs.read(large.ino, 0, 300_000).unwrap(), big);
    let link = fs.lookup(1, b"link").unwrap();
    assert_eq!(fs.readlink(link.ino).unwrap(), b"d/f");
    assert_eq!(fs.rmdir(1, b"d").unwrap_err().errno, errno::ENOTEMPTY);
    fs.rename(dir.ino, b"f", 1, b"g", RenameFlags::default()).unwrap();
    fs.rmdir(1, b"d").unwrap();
    fs.setattr(large.ino, &SetAttributes { size: Some(5000), ..SetAttributes::default() }).unwrap();
    assert_eq!(fs.read(large.ino, 0, 300_000).unwrap(), big[..5000]);
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let g = fs.lookup(1, b"g").unwrap();
    assert_eq!(fs.read(g.ino, 0, 100).unwrap(), b"hello");
    assert_eq!(fs.lookup(1, b"d").unwrap_err().errno, errno::ENOENT);
    let large = fs.lookup(1, b"large").unwrap();
    assert_eq!(fs.read(large.ino, 0, 300_000).unwrap(), big[..5000]);
    assert_clean(&mut fs);
}

/// The node cache's bound counts what a file's inode holds, not a page:
/// a cache of 16 pages keeps the inodes of 60 files beside their
/// directory's pages, so a second walk of them reads no node page from
/// flash. (Charged a page each, 16 pages held 16 inodes, and every walk
/// read them all again.) Inodes made dirty are charged a page again, and
/// once written back what they hold, inline bytes included, so they no
/// longer all fit; the files still read back.
#[test]
fn the_node_cache_charges_an_inode_what_it_holds() {
    let (flash, clock) = fresh();
    let options = FsOptions::smallest(4096);
    let (mut fs, _) = Fs::mount(flash, options.clone(), Box::new(clock.clone())).unwrap();
    let count = 60;
    let name = |index: usize| format!("f{index:02}");
    for index in 0..count {
        let file = fs.create(1, name(index).as_bytes(), 0o644, 0, 0).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, options.clone(), Box::new(clock.clone())).unwrap();
    let walk = |fs: &mut Fs<MemoryFlash>| {
        for index in 0..count {
            let file = fs.lookup(1, name(index).as_bytes()).unwrap();
            assert_eq!(fs.getattr(file.ino).unwrap().ino, file.ino);
            fs.forget(file.ino, 1).unwrap();
        }
    };
    walk(&mut fs);
    let read_by_first_walk = fs.counters().node_pages_read;
    assert!(read_by_first_walk > 0, "a fresh mount reads the inodes from flash");
    walk(&mut fs);
    assert_eq!(fs.counters().node_pages_read, read_by_first_walk, "the second walk found every inode cached");
    // Inodes growing in place: 1,000 inline bytes each, 60,000 in all,
    // are charged to a 64 KiB cache, which pushes the least recent out.
    for index in 0..count {
        let file = fs.lookup(1, name(index).as_bytes()).unwrap();
        fs.write(file.ino, 0, &vec![index as u8; 1000]).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    let (used, bound) = fs.memory_bytes();
    assert!(used <= bound, "{used} bytes held against a bound of {bound}");
    let before = fs.counters().node_pages_read;
    walk(&mut fs);
    assert!(fs.counters().node_pages_read > before, "the grown inodes no longer all fit");
    for index in 0..count {
        let file = fs.lookup(1, name(index).as_bytes()).unwrap();
        assert_eq!(fs.read(file.ino, 0, 4096).unwrap(), vec![index as u8; 1000]);
        fs.forget(file.ino, 1).unwrap();
    }
    assert_clean(&mut fs);
}

/// Files let go by their last reference stay known until a batch of them
/// is looked at together; the batch drops every one with nothing in
/// memory, keeps one with buffered data and a dirty inode, and the
/// checkpoint that writes those drops it too.
#[test]
fn files_let_go_are_dropped_a_batch_at_a_time_and_never_with_state() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let name = |index: usize| format!("f{index:04}");
    for index in 0..FORGOTTEN_BATCH_FILES {
        let file = fs.create(1, name(index).as_bytes(), 0o644, 0, 0).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    // New inodes are dirty when let go: what no checkpoint has written yet
    // stays known, and the checkpoint drops it.
    fs.checkpoint().unwrap();
    let at_start = fs.known_files();
    assert!(at_start < 4, "{at_start} files known with none held");

    let buffered = fs.lookup(1, name(0).as_bytes()).unwrap().ino;
    fs.write(buffered, 0, &vec![7u8; 8192]).unwrap();
    fs.forget(buffered, 1).unwrap();
    for index in 1..FORGOTTEN_BATCH_FILES - 1 {
        let file = fs.lookup(1, name(index).as_bytes()).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    assert_eq!(fs.known_files(), at_start + FORGOTTEN_BATCH_FILES - 1, "let go, not looked at yet");
    let last = fs.lookup(1, name(FORGOTTEN_BATCH_FILES - 1).as_bytes()).unwrap();
    fs.forget(last.ino, 1).unwrap();
    assert_eq!(fs.known_files(), at_start + 1, "the batch keeps only the file with state");
    fs.checkpoint().unwrap();
    assert_eq!(fs.known_files(), at_start);
    let file = fs.lookup(1, name(0).as_bytes()).unwrap();
    assert_eq!(fs.read(file.ino, 0, 16384).unwrap(), vec![7u8; 8192]);
    fs.forget(file.ino, 1).unwrap();
    assert_clean(&mut fs);
}

#[test]
fn a_big_directory_splits_into_buckets() {
    let (flash, clock) = fresh();
    let options = FsOptions { node_cache_bytes: 1 << 20, ..FsOptions::default() };
    let (mut fs, _) = Fs::mount(flash, options.clone(), Box::new(clock.clone())).unwrap();
    let count = 5000;
    for index in 0..count {
        let name = format!("file-with-a-longish-name-{index:06}");
        let file = fs.create(1, name.as_bytes(), 0o644, 0, 0).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    for index in (0..count).step_by(7) {
        let name = format!("file-with-a-longish-name-{index:06}");
        fs.lookup(1, name.as_bytes()).unwrap();
    }
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let entries = fs.readdir(1, cookie, 100).unwrap();
        if entries.is_empty() {
            break;
        }
        cookie = entries.last().unwrap().offset;
        names.extend(entries.into_iter().map(|entry| entry.name));
    }
    assert_eq!(names.len(), count + 2);
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, report) = Fs::mount(flash, options, Box::new(clock)).unwrap();
    eprintln!("{report:?}");
    for index in (0..count).step_by(3) {
        let name = format!("file-with-a-longish-name-{index:06}");
        fs.lookup(1, name.as_bytes()).unwrap();
        fs.unlink(1, name.as_bytes()).unwrap();
    }
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(ManualClock::new(0))).unwrap();
    assert_clean(&mut fs);
}

#[test]
fn an_unlinked_open_file_lives_until_forgotten_and_a_crash_does_not_leak_it() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let file = fs.create(1, b"tmp", 0o644, 0, 0).unwrap();
    fs.write(file.ino, 0, &[7; 10_000]).unwrap();
    fs.unlink(1, b"tmp").unwrap();
    assert_eq!(fs.lookup(1, b"tmp").unwrap_err().errno, errno::ENOENT);
    assert_eq!(fs.read(file.ino, 0, 20_000).unwrap(), vec![7; 10_000], "still readable while held");
    fs.write(file.ino, 10_000, &[8; 100]).unwrap();
    assert_clean(&mut fs);
    fs.sync().unwrap();
    // A crash while it is held: the checkpoint listed it; mount frees it.
    let flash = fs.into_device();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    assert_clean(&mut fs);
    assert_eq!(fs.getattr(file.ino).unwrap_err().errno, errno::ENOENT);
    // Forgetting the last reference frees it.
    let again = fs.create(1, b"tmp2", 0o644, 0, 0).unwrap();
    fs.write(again.ino, 0, &[1; 5000]).unwrap();
    fs.unlink(1, b"tmp2").unwrap();
    fs.forget(again.ino, 1).unwrap();
    assert_eq!(fs.getattr(again.ino).unwrap_err().errno, errno::ENOENT);
    assert_clean(&mut fs);
}

#[test]
fn a_removed_directory_keeps_its_number_while_held() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let directory = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap();
    let held = fs.lookup(1, b"d").unwrap();
    assert_eq!(held.ino, directory.ino);
    fs.rmdir(1, b"d").unwrap();
    assert_eq!(fs.getattr(directory.ino).unwrap_err().errno, errno::ENOENT);
    let file = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    assert_ne!(file.ino, directory.ino, "a held number is not handed out again");
    assert_clean(&mut fs);
    fs.forget(directory.ino, 1).unwrap();
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(ManualClock::new(0))).unwrap();
    assert_clean(&mut fs);
}

#[test]
fn bad_blocks_and_failing_programs_are_worked_around() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let faults = wearing(0.05, 40, 0.5, 11);
    let mut fs = faulty(geometry(), faults, &clock);
    let mut expected = std::collections::BTreeMap::new();
    // Enough rounds that zones are used again, and wear: in 30, once a
    // checkpoint wrote each node once (fewer node pages), no zone was
    // erased and no program failed.
    for round in 0..60u32 {
        for index in 0..20u32 {
            let name = format!("f{index}");
            let data: Vec<u8> = (0..(index as usize + 1) * 3000).map(|i| (i as u32 ^ round) as u8).collect();
            let ino = match fs.lookup(1, name.as_bytes()) {
                Ok(attributes) => attributes.ino,
                Err(_) => fs.create(1, name.as_bytes(), 0o644, 0, 0).unwrap().ino,
            };
            fs.setattr(ino, &SetAttributes { size: Some(0), ..SetAttributes::default() }).unwrap();
            fs.write(ino, 0, &data).unwrap();
            fs.forget(ino, 1).unwrap();
            expected.insert(name, data);
        }
        fs.sync().unwrap();
    }
    survives_a_remount(fs, clock, &expected);
}

/// Pages programmed by one 4 KiB write at `offset` into a file that
/// already spans it, made durable by sync.
fn write_cost(fs: &mut Fs<MemoryFlash>, ino: u64, offset: u64) -> u64 {
    fs.sync().unwrap();
    let before = fs.device().counters().pages_programmed;
    fs.write(ino, offset, &[0x5a; 4096]).unwrap();
    fs.sync().unwrap();
    fs.device().counters().pages_programmed - before
}

#[test]
fn a_write_costs_the_same_wherever_it_lands() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let file = fs.create(1, b"big", 0o644, 0, 0).unwrap();
    // Sparse: 12 MiB long (past the inode's roots, so index pages hold its
    // pointers), written at a few places.
    fs.setattr(file.ino, &SetAttributes { size: Some(12 << 20), ..SetAttributes::default() }).unwrap();
    for offset in [0u64, 5 << 20, 11 << 20] {
        fs.write(file.ino, offset, &[1; 4096]).unwrap();
    }
    let costs: Vec<u64> =
        [0u64, 4096, 6 << 20, (12 << 20) - 4096].iter().map(|&offset| write_cost(&mut fs, file.ino, offset)).collect();
    eprintln!("pages programmed per 4 KiB write and sync, by offset: {costs:?}");
    let cheapest = *costs.iter().min().unwrap();
    let dearest = *costs.iter().max().unwrap();
    // The data page, the index pages on its path (the tree's height), the
    // inode record and the checkpoint: never the rest of the file.
    assert!(dearest <= cheapest + 2, "{costs:?}");
    assert!(dearest <= 12, "{costs:?}");
}

#[test]
fn posix_acls_are_refused_so_that_callers_fall_back_to_chmod() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let file = fs.create(1, b"a", 0o700, 0, 0).unwrap().ino;
    let acl = [2, 0, 0, 0, 1, 0, 7, 0, 255, 255, 255, 255];
    let error = fs.setxattr(file, b"system.posix_acl_access", &acl, XattrFlags::default()).unwrap_err();
    assert_eq!(error.errno, errno::EOPNOTSUPP);
    assert!(fs.listxattr(file).unwrap().is_empty());
    fs.setxattr(file, b"user.kept", b"yes", XattrFlags::default()).unwrap();
    assert_eq!(fs.getxattr(file, b"user.kept").unwrap(), b"yes");
    assert_clean(&mut fs);
}

/// The set-ID bits on write follow the caller's rule: `write` clears
/// set-user-ID; `write_with` keeps both (a writer with CAP_FSETID) or
/// clears set-user-ID and, where the group may execute, set-group-ID; and
/// `drop_set_id` clears them by that rule, durably.
#[test]
fn writes_clear_the_set_id_bits_by_the_callers_rule() {
    use flintfs_core::SetIdOnWrite;
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let permissions = |fs: &mut Fs<MemoryFlash>, ino| fs.getattr(ino).unwrap().permissions;
    let file = fs.create(1, b"f", 0o6755, 0, 0).unwrap().ino;
    fs.write_with(file, 0, b"kept", SetIdOnWrite::Keep).unwrap();
    assert_eq!(permissions(&mut fs, file), 0o6755);
    fs.write(file, 0, b"plain").unwrap();
    assert_eq!(permissions(&mut fs, file), 0o2755, "write clears set-user-ID only");
    fs.setattr(file, &SetAttributes { permissions: Some(0o6755), ..SetAttributes::default() }).unwrap();
    fs.write_with(file, 0, b"killed", SetIdOnWrite::ClearBoth).unwrap();
    assert_eq!(permissions(&mut fs, file), 0o755, "group execute: both go");
    let locking = fs.create(1, b"g", 0o6745, 0, 0).unwrap().ino;
    fs.write_with(locking, 0, b"x", SetIdOnWrite::ClearBoth).unwrap();
    assert_eq!(permissions(&mut fs, locking), 0o2745, "without group execute set-group-ID stays");
    let dropped = fs.create(1, b"h", 0o6711, 0, 0).unwrap().ino;
    assert_eq!(fs.drop_set_id(dropped).unwrap().permissions, 0o711);
    let plain = fs.create(1, b"i", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.drop_set_id(plain).unwrap().permissions, 0o644);
    fs.sync().unwrap();
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    assert_eq!(permissions(&mut fs, dropped), 0o711);
    assert_eq!(permissions(&mut fs, file), 0o755);
    assert_clean(&mut fs);
}

/// Long runs of whole blocks on a device whose zones are short of blocks
/// (a tenth bad from the factory) and whose programs fail as it wears.
/// When a run (`DATA_RUN_PAGES_MAX`, 1,024 pages: a zone's worth here) was
/// tried again whole in a fresh zone after a failed program, only a zone
/// with no bad block could take it, and the search took (and wasted until
/// the next checkpoint) every shorter zone on the way: this run then ended
/// in ENOSPC in its sixth round, with 36 MiB live on a device of 144.
#[test]
fn long_runs_of_blocks_survive_short_zones_and_failing_programs() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let geometry = Geometry { block_pages: 64, zone_blocks: 16, zone_count: 40, open_zones_max: 14, ..geometry() };
    let faults = wearing(0.1, 2, 0.001, 23);
    let mut fs = faulty(geometry, faults, &clock);
    let mut expected = Vec::new();
    for round in 0..6u64 {
        expected.clear();
        for index in 0..3u64 {
            let name = format!("f{index}");
            let ino = match fs.lookup(1, name.as_bytes()) {
                Ok(attributes) => attributes.ino,
                Err(_) => fs.create(1, name.as_bytes(), 0o644, 0, 0).unwrap().ino,
            };
            // Noise: every block is a page of a run.
            let data = common::noise(round << 32 | index, 12 << 20);
            fs.write(ino, 0, &data).unwrap_or_else(|error| panic!("round {round}, file {index}: {error}"));
            fs.forget(ino, 1).unwrap();
            expected.push((name, data));
        }
        fs.sync().unwrap_or_else(|error| panic!("round {round}: {error}"));
    }
    assert!(fs.counters().data_runs_placed_one_by_one > 0, "a run's program failed, and its blocks went one by one");
    survives_a_remount(fs, clock, expected.iter().map(|(name, data)| (name, data)));
}

/// Overwrites on a device whose programs fail as it wears (a twentieth of
/// its blocks bad from the factory, endurance 4 erases). A failed program
/// leaves its zone read-only; the cleaner left such zones alone, so each
/// failure kept a zone (4 MiB here) out of use for good: this run ended
/// in ENOSPC at write 3,618, with 26 of the 48 zones read-only and 80 MiB
/// live on 192. Cleaned and reset, a read-only zone comes back less its
/// retired block.
#[test]
fn zones_left_read_only_by_failed_programs_are_cleaned_and_reused() {
    const FILE_BYTES: usize = 40 << 20;
    const WRITE_BYTES: usize = 64 << 10;
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let geometry = Geometry { block_pages: 64, zone_blocks: 16, zone_count: 48, open_zones_max: 14, ..geometry() };
    let mut fs = faulty(geometry, wearing(0.05, 4, 0.0005, 1), &clock);
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    let mut inos = Vec::new();
    for index in 0..2u64 {
        let name = format!("f{index}");
        let data = common::noise(1000 + index, FILE_BYTES);
        let ino = fs.create(1, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &data).unwrap();
        fs.fsync(ino, false).unwrap();
        inos.push(ino);
        expected.push((name, data));
    }
    let mut state = 99u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for write in 0..4_500u64 {
        let file = (next() % 2) as usize;
        let offset = (next() % (FILE_BYTES / WRITE_BYTES) as u64) as usize * WRITE_BYTES;
        let data = common::noise(next(), WRITE_BYTES);
        let done = fs.write(inos[file], offset as u64, &data).and_then(|_| {
            if write % 64 == 63 {
                fs.fsync(inos[file], false)
            } else {
                Ok(())
            }
        });
        if let Err(error) = done {
            let read_only = fs.device().report_zones().iter().filter(|zone| zone.state == ZoneState::ReadOnly).count();
            panic!("write {write}: {error} ({read_only} zones read-only)");
        }
        expected[file].1[offset..offset + WRITE_BYTES].copy_from_slice(&data);
    }
    survives_a_remount(fs, clock, expected.iter().map(|(name, data)| (name, data)));
}

/// A device so full that a new name is refused still gives every other
/// refusal its own errno, as ext4 does (its lookups come before its
/// allocations): `mkdir -p` of a directory that exists succeeds, `mv -n`
/// and `ln` say EEXIST, `rm -f` of a name not there says nothing. Until
/// the engine asked for room after its lookups, each of these said
/// ENOSPC. What the device holds comes through a remount whole.
#[test]
fn a_full_device_gives_each_refusal_its_own_errno_before_enospc() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let small = Geometry { zone_count: 24, ..geometry() };
    let flash =
        MemoryFlash::memory(small, DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() }).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let directory = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap();
    let full = fs.mkdir(1, b"e", 0o755, 0, 0).unwrap();
    fs.create(full.ino, b"inside", 0o644, 0, 0).unwrap();
    let file = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    fs.write(file.ino, 0, b"kept").unwrap();
    fs.setxattr(file.ino, b"user.a", b"1", XattrFlags::default()).unwrap();
    // Noise does not compress, so each block takes its page.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut noise = vec![0u8; 64 << 10];
    let mut filled = 0;
    for index in 0.. {
        for byte in noise.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        let name = format!("fill{index}");
        match fs.create(1, name.as_bytes(), 0o644, 0, 0) {
            Ok(attributes) => match fs.write(attributes.ino, 0, &noise) {
                Ok(_) => filled += 1,
                Err(error) => {
                    assert_eq!(error.errno, errno::ENOSPC, "{error}");
                    break;
                }
            },
            Err(error) => {
                assert_eq!(error.errno, errno::ENOSPC, "{error}");
                break;
            }
        }
        assert!(index < 10_000, "the device never filled");
    }
    assert!(filled > 0);
    // Empty names until not even one more is taken.
    let mut refused = false;
    for index in 0..10_000 {
        if let Err(error) = fs.create(1, format!("empty{index}").as_bytes(), 0o644, 0, 0) {
            assert_eq!(error.errno, errno::ENOSPC, "{error}");
            refused = true;
            break;
        }
    }
    assert!(refused, "a new name was never refused for space");
    let errno_of = |check: u32, result: Result<(), flintfs_core::Error>| match result {
        Ok(()) => panic!("check {check} succeeded on a full device"),
        Err(error) => error.errno,
    };
    assert_eq!(errno_of(1, fs.mkdir(1, b"d", 0o755, 0, 0).map(drop)), errno::EEXIST);
    assert_eq!(errno_of(2, fs.create(1, b"f", 0o644, 0, 0).map(drop)), errno::EEXIST);
    assert_eq!(errno_of(3, fs.symlink(1, b"f", b"target", 0, 0).map(drop)), errno::EEXIST);
    assert_eq!(errno_of(4, fs.mknod(1, b"d", 0o10644, 0, 0, 0).map(drop)), errno::EEXIST);
    assert_eq!(errno_of(5, fs.link(file.ino, 1, b"d").map(drop)), errno::EEXIST);
    assert_eq!(errno_of(6, fs.link(directory.ino, 1, b"g").map(drop)), errno::EPERM);
    let plain = RenameFlags::default();
    assert_eq!(errno_of(7, fs.rename(1, b"missing", 1, b"x", plain)), errno::ENOENT);
    assert_eq!(errno_of(8, fs.rename(1, b"f", 1, b"d", plain)), errno::EISDIR);
    assert_eq!(errno_of(9, fs.rename(1, b"d", 1, b"f", plain)), errno::ENOTDIR);
    assert_eq!(errno_of(10, fs.rename(1, b"d", 1, b"e", plain)), errno::ENOTEMPTY);
    assert_eq!(errno_of(11, fs.rename(1, b"d", directory.ino, b"x", plain)), errno::EINVAL);
    let no_replace = RenameFlags { no_replace: true, exchange: false };
    assert_eq!(errno_of(12, fs.rename(1, b"f", 1, b"e", no_replace)), errno::EEXIST);
    let exchange = RenameFlags { no_replace: false, exchange: true };
    assert_eq!(errno_of(13, fs.rename(1, b"f", 1, b"missing", exchange)), errno::ENOENT);
    // A rename that changes nothing is not refused either.
    fs.rename(1, b"f", 1, b"f", plain).unwrap();
    assert_eq!(errno_of(14, fs.write(directory.ino, 0, b"x").map(drop)), errno::EISDIR);
    let truncate = SetAttributes { size: Some(1), ..SetAttributes::default() };
    assert_eq!(errno_of(15, fs.setattr(directory.ino, &truncate).map(drop)), errno::EISDIR);
    let too_large = SetAttributes { size: Some(u64::MAX), ..SetAttributes::default() };
    assert_eq!(errno_of(16, fs.setattr(file.ino, &too_large).map(drop)), errno::EFBIG);
    assert_eq!(errno_of(17, fs.fallocate(directory.ino, 0, 4096, 0)), errno::EISDIR);
    let create = XattrFlags { create: true, replace: false };
    assert_eq!(errno_of(18, fs.setxattr(file.ino, b"user.a", b"2", create)), errno::EEXIST);
    let replace = XattrFlags { create: false, replace: true };
    assert_eq!(errno_of(19, fs.setxattr(file.ino, b"user.b", b"2", replace)), errno::ENODATA);
    assert_eq!(errno_of(20, fs.removexattr(file.ino, b"user.b")), errno::ENODATA);
    assert_eq!(errno_of(21, fs.unlink(1, b"missing")), errno::ENOENT);
    assert_eq!(errno_of(22, fs.rmdir(1, b"e")), errno::ENOTEMPTY);
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let file = fs.lookup(1, b"f").unwrap();
    assert_eq!(fs.read(file.ino, 0, 100).unwrap(), b"kept");
    assert_eq!(fs.getxattr(file.ino, b"user.a").unwrap(), b"1");
    assert_eq!(fs.lookup(1, format!("fill{}", filled - 1).as_bytes()).unwrap().size, 64 << 10);
    assert_clean(&mut fs);
}

/// A block far past what a file's tree holds grows the tree when it is
/// written, by pages no buffered node leads to: the checkpoint's bound
/// counts them (debug builds assert each checkpoint keeps to its bound).
#[test]
fn a_write_that_grows_the_tree_stays_within_the_checkpoint_bound() {
    let (flash, clock) = fresh();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let file = fs.create(1, b"sparse", 0o644, 0, 0).unwrap();
    fs.write(file.ino, 0, &[7; 100]).unwrap();
    fs.sync().unwrap();
    let far = 16 << 30;
    fs.write(file.ino, far, b"x").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read(file.ino, far - 1, 10).unwrap(), [0, b'x']);
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    assert_eq!(fs.read(file.ino, 0, 100).unwrap(), [7; 100]);
    assert_eq!(fs.read(file.ino, far, 10).unwrap(), b"x");
    assert_clean(&mut fs);
}
