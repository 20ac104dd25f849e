//! The metadata log in NVM (FSMAC): a metadata fsync persists a few NVM
//! words and programs no flash page; a power cut keeps every fsynced
//! operation; the ring filling up writes home with a checkpoint; a clean
//! unmount leaves the flash complete without the NVM; and without the
//! persist barrier a cut can lose what fsync promised.

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions};
use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash};

mod common;

fn geometry(nvm_size_bytes: u64) -> Geometry {
    common::geometry(64, nvm_size_bytes)
}

fn format(nvm_size_bytes: u64) -> (MemoryFlash, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(
        geometry(nvm_size_bytes),
        DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() },
    )
    .unwrap();
    (Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap(), clock)
}

fn mount(flash: MemoryFlash, clock: &ManualClock, options: FsOptions) -> Fs<MemoryFlash> {
    Fs::mount(flash, options, Box::new(clock.clone())).unwrap().0
}

/// The power goes, and comes back.
fn cut(fs: Fs<MemoryFlash>, seed: u64) -> MemoryFlash {
    let mut flash = fs.into_device();
    flash.power_cut(seed).unwrap();
    flash.power_on();
    flash
}

fn assert_clean(fs: &mut Fs<MemoryFlash>) {
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

/// A block that does not compress away, so the buffer fills.
fn text_block(seed: u64) -> Vec<u8> {
    common::noise(seed, 4096)
}

fn name(index: usize) -> Vec<u8> {
    format!("file-{index:05}").into_bytes()
}

/// Creates `count` files in the root, each followed by an fsync, checking
/// that no fsync programs a flash page. Returns their inode numbers.
fn create_and_fsync(fs: &mut Fs<MemoryFlash>, count: usize, first: usize) -> Vec<u64> {
    let mut inodes = Vec::new();
    for index in first..first + count {
        let ino = fs.create(1, &name(index), 0o644, 0, 0).unwrap().ino;
        let checkpoints = fs.counters().checkpoints;
        let before = fs.device().counters().pages_programmed;
        fs.fsync(ino, false).unwrap();
        if fs.counters().checkpoints == checkpoints {
            let programmed = fs.device().counters().pages_programmed - before;
            assert_eq!(programmed, 0, "file {index}: the fsync programmed {programmed} flash pages");
        }
        inodes.push(ino);
    }
    inodes
}

fn assert_present(fs: &mut Fs<MemoryFlash>, count: usize) {
    for index in 0..count {
        assert!(fs.lookup(1, &name(index)).is_ok(), "{:?} is gone", String::from_utf8_lossy(&name(index)));
    }
}

#[test]
fn a_metadata_fsync_programs_no_flash_page_and_a_cut_keeps_it() {
    let (flash, clock) = format(1 << 20);
    let mut fs = mount(flash, &clock, FsOptions::default());
    let pages_before = fs.device().counters().pages_programmed;
    let persists_before = fs.device().counters().nvm_persists;
    let moves_before = fs.protection_counters().nvm_wear_moves;
    create_and_fsync(&mut fs, 300, 0);
    assert_eq!(fs.counters().checkpoints, 0, "the ring held every record");
    assert_eq!(fs.counters().log_pages_written, 0);
    assert_eq!(fs.counters().nvm_log_batches_written, 300);
    assert_eq!(fs.device().counters().pages_programmed, pages_before, "no flash page at all");
    // Each move of the wear levelling's gap persists its line and its ring word.
    let moves = fs.protection_counters().nvm_wear_moves - moves_before;
    assert!(moves > 0, "300 frames moved the gap");
    let persists = fs.device().counters().nvm_persists - persists_before;
    assert_eq!(persists - 2 * moves, 600, "a frame and its commit word each");
    let flash = cut(fs, 11);
    let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).expect("recovery");
    let recovery = report.recovery.expect("the NVM log asks for recovery");
    assert_eq!(recovery.batches, 300, "{}", recovery.end);
    assert_eq!(recovery.log_pages_read, 0);
    assert_present(&mut fs, 300);
    assert_clean(&mut fs);
    // Recovery ended with a checkpoint: the next epoch starts afresh.
    create_and_fsync(&mut fs, 10, 300);
    let flash = cut(fs, 12);
    let mut fs = mount(flash, &clock, FsOptions::default());
    assert_present(&mut fs, 310);
    assert_clean(&mut fs);
}

#[test]
fn after_a_clean_unmount_the_flash_alone_holds_everything() {
    let (flash, clock) = format(1 << 20);
    let mut fs = mount(flash, &clock, FsOptions::default());
    create_and_fsync(&mut fs, 100, 0);
    let file = fs.lookup(1, &name(7)).unwrap().ino;
    fs.write(file, 0, b"written home").unwrap();
    fs.fsync(file, false).unwrap();
    let mut flash = fs.unmount().unwrap();
    // The NVM is cleared, as a replaced or wiped module would be.
    let size = flash.geometry().nvm_size_bytes;
    flash.nvm_write(0, &vec![0u8; size as usize]).unwrap();
    flash.nvm_persist(0, size).unwrap();
    let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    assert!(report.recovery.is_none(), "a clean unmount leaves nothing to replay");
    assert_present(&mut fs, 100);
    assert_eq!(fs.read(file, 0, 64).unwrap(), b"written home");
    assert_clean(&mut fs);
    // The mount wrote a fresh header: the log works again.
    create_and_fsync(&mut fs, 5, 100);
    let flash = cut(fs, 5);
    let mut fs = mount(flash, &clock, FsOptions::default());
    assert_present(&mut fs, 105);
}

/// `nvm_keep`: a clean unmount leaves the node pages in NVM. The next
/// mount and a walk of every file read no node page from flash (FSMAC's
/// faster next mount); the flash alone is then not the file system, so a
/// mount with the NVM wiped is refused by name, and nothing is lost.
/// Unmounted again without `nvm_keep`, everything goes home and the flash
/// alone holds it.
#[test]
fn nvm_keep_leaves_the_nodes_in_nvm_for_the_next_mount() {
    let (flash, clock) = format(4 << 20);
    let keep = FsOptions { nvm_keep: true, ..FsOptions::default() };
    let mut fs = mount(flash, &clock, keep.clone());
    create_and_fsync(&mut fs, 300, 0);
    let directory = fs.mkdir(1, b"sub", 0o755, 0, 0).unwrap().ino;
    let file = fs.create(directory, b"data", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, &text_block(3)).unwrap();
    let flash = fs.unmount().unwrap();
    let walk = |fs: &mut Fs<MemoryFlash>| {
        assert_present(fs, 300);
        for index in 0..300 {
            let ino = fs.lookup(1, &name(index)).unwrap().ino;
            assert_eq!(fs.getattr(ino).unwrap().size, 0);
        }
        let sub = fs.lookup(1, b"sub").unwrap().ino;
        let data = fs.lookup(sub, b"data").unwrap().ino;
        assert_eq!(fs.read(data, 0, 4096).unwrap(), text_block(3));
    };
    // Kept: the mount and the walk read no node page from flash.
    let (mut fs, report) = Fs::mount(flash, keep.clone(), Box::new(clock.clone())).unwrap();
    assert!(report.recovery.is_none());
    walk(&mut fs);
    assert_eq!(fs.counters().node_pages_read, 0, "every node came from NVM");
    assert!(fs.counters().nodes_unparked > 300, "{} nodes read from NVM", fs.counters().nodes_unparked);
    assert_clean(&mut fs);
    let mut flash = fs.unmount().unwrap();
    // Without its NVM the image is refused, and says why.
    let size = flash.geometry().nvm_size_bytes;
    let mut saved = vec![0u8; size as usize];
    flash.nvm_read(0, &mut saved).unwrap();
    flash.nvm_write(0, &vec![0u8; size as usize]).unwrap();
    flash.nvm_persist(0, size).unwrap();
    let refused = match Fs::mount(&mut flash, FsOptions::default(), Box::new(clock.clone())) {
        Ok(_) => panic!("a kept image mounted without its NVM"),
        Err(error) => error,
    };
    assert!(refused.message.contains("nvm_keep"), "{}", refused.message);
    // The NVM back (a module moved with its flash): all there. An unmount
    // without nvm_keep sends every node home, and the flash alone holds it.
    flash.nvm_write(0, &saved).unwrap();
    flash.nvm_persist(0, size).unwrap();
    let mut fs = mount(flash, &clock, FsOptions::default());
    walk(&mut fs);
    let before_home = fs.device().counters().pages_programmed;
    let mut flash = fs.unmount().unwrap();
    assert!(flash.counters().pages_programmed > before_home, "the unmount wrote the nodes home");
    flash.nvm_write(0, &vec![0u8; size as usize]).unwrap();
    flash.nvm_persist(0, size).unwrap();
    let mut fs = mount(flash, &clock, FsOptions::default());
    walk(&mut fs);
    assert!(fs.counters().node_pages_read > 0, "the nodes came from flash this time");
    assert_clean(&mut fs);
}

/// Hostile slots: an image unmounted with `nvm_keep`, its slot area hit by
/// noise or by single flipped bytes, mounts and reads or is refused with an
/// error, never a panic, and never reads a damaged node as good.
#[test]
fn damaged_nvm_slots_give_errors_not_panics() {
    let (flash, clock) = format(1 << 20);
    let keep = FsOptions { nvm_keep: true, ..FsOptions::default() };
    let mut fs = mount(flash, &clock, keep.clone());
    create_and_fsync(&mut fs, 100, 0);
    let mut flash = fs.unmount().unwrap();
    let mut header_bytes = vec![0u8; flintfs_format::NVM_HEADER_BYTES];
    common::nvm(&mut flash).nvm_read(0, &mut header_bytes).unwrap();
    let flintfs_format::NvmHeaderState::Valid(header) =
        flintfs_format::NvmHeader::decode(&header_bytes, common::nvm(&mut flash).geometry().nvm_size_bytes)
    else {
        panic!("the NVM header")
    };
    let area = header.slots_offset();
    let size = common::nvm(&mut flash).geometry().nvm_size_bytes;
    let mut pristine = vec![0u8; (size - area) as usize];
    common::nvm(&mut flash).nvm_read(area, &mut pristine).unwrap();
    let mut outcomes = [0usize; 2];
    for trial in 0..200u64 {
        let mut damaged = pristine.clone();
        if trial == 0 {
            for (at, byte) in damaged.iter_mut().enumerate() {
                *byte = (at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u8;
            }
        } else {
            // One byte of the first slots' prefixes, words, headers or data.
            let at = (trial.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (24 << 10)) as usize;
            damaged[at] ^= 1 << (trial % 8);
        }
        common::nvm(&mut flash).nvm_write(area, &damaged).unwrap();
        common::nvm(&mut flash).nvm_persist(area, damaged.len() as u64).unwrap();
        match Fs::mount(&mut flash, keep.clone(), Box::new(clock.clone())) {
            Ok((mut fs, _)) => {
                outcomes[0] += 1;
                for index in 0..100 {
                    let _ = fs.lookup(1, &name(index));
                }
                let _ = fs.check();
            }
            Err(_) => outcomes[1] += 1,
        }
        common::nvm(&mut flash).nvm_write(area, &pristine).unwrap();
        common::nvm(&mut flash).nvm_persist(area, pristine.len() as u64).unwrap();
    }
    eprintln!("mounted {}, refused {}", outcomes[0], outcomes[1]);
    assert!(outcomes[1] > 0, "no damage was noticed");
    // Undamaged, it is all there.
    let mut fs = mount(flash, &clock, keep);
    assert_present(&mut fs, 100);
    assert_clean(&mut fs);
}

#[test]
fn a_full_ring_writes_home_with_a_checkpoint_and_nothing_fails() {
    let (flash, clock) = format(flintfs_format::NVM_SIZE_BYTES_MIN);
    let mut fs = mount(flash, &clock, FsOptions::default());
    let count = 2_000;
    create_and_fsync(&mut fs, count, 0);
    assert!(fs.counters().checkpoints >= 2, "{} checkpoints", fs.counters().checkpoints);
    assert_eq!(fs.counters().log_pages_written, 0, "every batch went to NVM");
    for seed in 0..4 {
        let flash = cut(fs, seed);
        fs = mount(flash, &clock, FsOptions::default());
        assert_present(&mut fs, count);
    }
    assert_clean(&mut fs);
}

/// The barrier is what keeps a committed frame whole: without it the
/// commit word can outlive words of its frame, and recovery then ends the
/// log before records whose fsync returned.
#[test]
fn without_the_persist_barrier_a_cut_loses_fsynced_files() {
    let mut lost_without = 0;
    for seed in 0..8 {
        for barrier in [true, false] {
            let (flash, clock) = format(1 << 20);
            let options = FsOptions { nvm_barrier: barrier, ..FsOptions::default() };
            let mut fs = mount(flash, &clock, options);
            create_and_fsync(&mut fs, 40, 0);
            let flash = cut(fs, seed);
            let mut fs = mount(flash, &clock, FsOptions::default());
            let missing = (0..40).filter(|&index| fs.lookup(1, &name(index)).is_err()).count();
            if barrier {
                assert_eq!(missing, 0, "seed {seed}: with the barrier every fsynced file stays");
            } else {
                lost_without += missing;
            }
            assert_clean(&mut fs);
        }
    }
    assert!(lost_without > 0, "skipping the barrier never lost a file: the test shows nothing");
}

#[test]
fn nvm_of_another_format_version_is_refused_by_name() {
    let (mut flash, clock) = format(1 << 20);
    let mut header = vec![0u8; flintfs_format::NVM_HEADER_BYTES];
    common::nvm(&mut flash).nvm_read(0, &mut header).unwrap();
    header[8..10].copy_from_slice(&(flintfs_format::FORMAT_VERSION - 1).to_le_bytes());
    common::nvm(&mut flash).nvm_write(0, &header).unwrap();
    common::nvm(&mut flash).nvm_persist(0, header.len() as u64).unwrap();
    let error = Fs::mount(flash, FsOptions::default(), Box::new(clock)).err().expect("refused");
    assert!(error.message.contains("NVM holds flintfs format version"), "{}", error.message);
}

#[test]
fn an_nvm_region_too_small_for_the_log_is_refused() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(
        geometry(flintfs_format::NVM_SIZE_BYTES_MIN / 2),
        DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() },
    )
    .unwrap();
    let error = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock)).err().expect("refused");
    assert!(error.message.contains("NVM region"), "{}", error.message);
}

/// A symlink whose target takes blocks, renamed before any checkpoint: the
/// rename once logged an inode state for it (only a regular file has one),
/// which the decoder refuses, so recovery ended the log there and lost
/// every fsync after it. Found by the crashtest with NVM, whose rare
/// checkpoints leave the log long.
#[test]
fn a_symlink_with_a_long_target_renamed_before_a_checkpoint_recovers() {
    for nvm_size_bytes in [0, 1 << 20] {
        let (flash, clock) = format(nvm_size_bytes);
        let mut fs = mount(flash, &clock, FsOptions::smallest(4096));
        let target = vec![b't'; 4096];
        fs.symlink(1, b"link", &target, 0, 0).unwrap();
        // Its blocks go to flash: the buffer (16 blocks) overflows.
        let holder = fs.create(1, b"holder", 0o644, 0, 0).unwrap().ino;
        for round in 0..64u64 {
            fs.write(holder, round * 4096, &text_block(round)).unwrap();
        }
        fs.fsync(holder, false).unwrap();
        fs.rename(1, b"link", 1, b"renamed", flintfs_core::RenameFlags::default()).unwrap();
        let after = fs.create(1, b"after", 0o644, 0, 0).unwrap().ino;
        fs.fsync(after, false).unwrap();
        let flash = cut(fs, 3);
        let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
        let recovery = report.recovery.expect("recovered");
        assert!(recovery.records_failed.is_empty(), "NVM {nvm_size_bytes}: {:?}", recovery.records_failed);
        let renamed = fs.lookup(1, b"renamed").unwrap().ino;
        assert_eq!(fs.readlink(renamed).unwrap(), target);
        assert!(fs.lookup(1, b"after").is_ok(), "NVM {nvm_size_bytes}: the fsync after the rename is kept");
        assert_clean(&mut fs);
    }
}

/// Dirty nodes the cache evicts are kept in NVM, not written to flash:
/// with a 16-page cache, 2,000 creates with fsync program no flash page
/// until unmount writes everything home. A cut keeps every file (NVM's
/// nodes as the last checkpoint committed them, and the log), and a clean
/// unmount leaves a tree fsck finds whole.
#[test]
fn evicted_nodes_park_in_nvm_and_go_home_at_the_checkpoint() {
    let (flash, clock) = format(8 << 20);
    let mut fs = mount(flash, &clock, FsOptions::smallest(4096));
    let before = fs.device().counters().pages_programmed;
    create_and_fsync(&mut fs, 2_000, 0);
    assert_eq!(fs.counters().checkpoints, 0);
    assert_eq!(fs.device().counters().pages_programmed, before, "every eviction kept in NVM");
    assert!(fs.counters().nodes_parked > 100, "{} kept", fs.counters().nodes_parked);
    assert!(fs.counters().nodes_unparked > 100, "{} read back", fs.counters().nodes_unparked);
    assert_clean(&mut fs);
    let mut crashed = mount(cut(fs, 9), &clock, FsOptions::smallest(4096));
    assert_present(&mut crashed, 2_000);
    assert_clean(&mut crashed);
    // (Recovery leaves zone parity owed, which the first flush pays.)
    for index in 2_000..2_500 {
        let ino = crashed.create(1, &name(index), 0o644, 0, 0).unwrap().ino;
        crashed.fsync(ino, false).unwrap();
    }
    let flash = crashed.unmount().unwrap();
    let mut fs = mount(flash, &clock, FsOptions::smallest(4096));
    assert_present(&mut fs, 2_500);
    assert_clean(&mut fs);
}

/// A park area too small for what is evicted sends the rest to flash
/// through the ordinary write-back: nothing fails.
#[test]
fn a_full_park_area_writes_to_flash_instead() {
    let (flash, clock) = format(64 << 10);
    let mut fs = mount(flash, &clock, FsOptions::smallest(4096));
    create_and_fsync_unchecked(&mut fs, 3_000, 0);
    assert!(fs.counters().nodes_parked > 0);
    assert!(fs.counters().node_pages_written > 0, "what found no room went to flash");
    // A checkpoint brings every node home and gives the whole area back,
    // whatever sizes its slots had: parking goes on.
    fs.sync().unwrap();
    let parked = fs.counters().nodes_parked;
    create_and_fsync_unchecked(&mut fs, 200, 3_000);
    assert!(fs.counters().nodes_parked > parked, "nothing parked after the checkpoint");
    let mut fs = mount(cut(fs, 4), &clock, FsOptions::smallest(4096));
    assert_present(&mut fs, 3_200);
    assert_clean(&mut fs);
}

fn create_and_fsync_unchecked(fs: &mut Fs<MemoryFlash>, count: usize, first: usize) {
    for index in first..first + count {
        let ino = fs.create(1, &name(index), 0o644, 0, 0).unwrap().ino;
        fs.fsync(ino, false).unwrap();
    }
}

/// A device formatted again keeps nothing of its earlier NVM log: a file
/// fsynced before the second format is not replayed into the new volume
/// (same UUID, same epochs), nor is one of another volume's.
#[test]
fn a_new_volume_replays_nothing_an_earlier_one_left_in_nvm() {
    for uuid in [[7u8; 16], [8u8; 16]] {
        let (flash, clock) = format(1 << 20);
        let mut fs = mount(flash, &clock, FsOptions::default());
        create_and_fsync(&mut fs, 5, 0);
        let flash = cut(fs, 1);
        let flash = Fs::format(flash, &MkfsOptions::new(uuid, 0), Box::new(clock.clone())).unwrap();
        let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
        assert!(report.recovery.is_none(), "uuid {uuid:?}: a fresh volume has nothing to recover");
        assert!(fs.lookup(1, &name(0)).is_err(), "uuid {uuid:?}: the earlier volume's file came back");
        assert_clean(&mut fs);
    }
}

/// Hostile NVM: noise over the whole ring (and then over the header too)
/// gives a mount that replays nothing and loses nothing the flash holds,
/// never a panic.
#[test]
fn noise_in_nvm_is_never_replayed_and_never_panics() {
    let (flash, clock) = format(1 << 20);
    let mut fs = mount(flash, &clock, FsOptions::default());
    create_and_fsync(&mut fs, 20, 0);
    let mut flash = fs.unmount().unwrap();
    let size = common::nvm(&mut flash).geometry().nvm_size_bytes as usize;
    for header_too in [false, true] {
        let first = if header_too { 0 } else { flintfs_format::NVM_LOG_OFFSET_BYTES as usize };
        let noise: Vec<u8> = (first..size).map(|at| (at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u8).collect();
        common::nvm(&mut flash).nvm_write(first as u64, &noise).unwrap();
        common::nvm(&mut flash).nvm_persist(first as u64, noise.len() as u64).unwrap();
        let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
        assert!(report.recovery.is_none(), "noise was taken for a log");
        assert_present(&mut fs, 20);
        assert_clean(&mut fs);
        create_and_fsync(&mut fs, 5, 20 + usize::from(header_too) * 5);
        flash = cut(fs, 2);
        let mut fs = mount(flash, &clock, FsOptions::default());
        assert_present(&mut fs, 25 + usize::from(header_too) * 5);
        flash = fs.unmount().unwrap();
    }
}

/// A flash filled to ENOSPC, data then names, with nodes kept in NVM: the
/// unmount succeeds and the next mount finds every file, with a clean
/// checker. (The unmount that failed, writing home nodes it had taken out
/// of NVM to a flash with no zone left, was found on the testkit's tiny
/// devices, `power_cuts_on_a_full_device_recover_as_promised` with NVM;
/// this larger shape's reserve still takes them home.)
#[test]
fn a_full_flash_with_nodes_in_nvm_unmounts_and_mounts_whole() {
    let (flash, clock) = format(4 << 20);
    let mut fs = mount(flash, &clock, FsOptions::default());
    create_and_fsync(&mut fs, 300, 0);
    let big = fs.create(1, b"big", 0o644, 0, 0).unwrap().ino;
    let mut blocks = 0u64;
    loop {
        match fs.write(big, blocks * 4096, &text_block(blocks)) {
            Ok(_) => blocks += 1,
            Err(error) if error.errno == flintfs_core::errno::ENOSPC => break,
            Err(error) => panic!("block {blocks}: {error}"),
        }
        if blocks.is_multiple_of(64) {
            if let Err(error) = fs.fsync(big, false) {
                assert_eq!(error.errno, flintfs_core::errno::ENOSPC, "{error}");
                break;
            }
        }
    }
    assert!(blocks > 100, "only {blocks} blocks before the device filled");
    // Then metadata, which NVM takes while the flash cannot: names until
    // they are refused too.
    let mut more = 300;
    while more < 1200 {
        match fs.create(1, &name(more), 0o644, 0, 0) {
            Ok(attributes) => {
                fs.fsync(attributes.ino, false).unwrap_or_else(|error| panic!("{error}"));
                more += 1;
            }
            Err(error) if error.errno == flintfs_core::errno::ENOSPC => break,
            Err(error) => panic!("file {more}: {error}"),
        }
    }
    eprintln!("{blocks} blocks, {} files, {} nodes parked", more, fs.counters().nodes_parked);
    let kept = fs.counters().nodes_parked;
    assert!(kept > 0, "no node was kept in NVM, so the test tests nothing");
    let flash = fs.unmount().unwrap_or_else(|error| panic!("a full flash failed its unmount: {error}"));
    let mut fs = mount(flash, &clock, FsOptions::default());
    assert_present(&mut fs, more);
    assert!(fs.lookup(1, b"big").is_ok());
    assert_clean(&mut fs);
}
