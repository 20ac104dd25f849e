//! The cleaner under fill, delete and refill: no ENOSPC before the target
//! fill, every byte back, a clean checker after every cycle, and wear
//! spread evenly. The full-size run (1 GiB, 20 cycles) is the example
//! `cargo run --release -p flintfs-testkit --example fill`.

use flintfs_core::FsOptions;
use flintfs_flash::Geometry;
use flintfs_testkit::fill::{run_fill, FillSetup};

/// 4 KiB pages in 16-page blocks: zones of `zone_blocks` blocks, small
/// enough that the cleaner runs within a test's time.
fn small_geometry(zone_blocks: u32, zone_count: u32) -> Geometry {
    Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks,
        zone_count,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

/// A fresh engine with the default options on a fault-free emulated
/// device of `geometry`, its clock stopped.
fn fresh_engine(geometry: Geometry, seed: u64) -> flintfs_core::Fs<flintfs_flash::MemoryFlash> {
    use flintfs_core::{Fs, ManualClock, MkfsOptions};
    use flintfs_flash::{DeviceOptions, FaultConfig, MemoryFlash};
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash =
        MemoryFlash::memory(geometry, DeviceOptions { faults: FaultConfig::none(seed), ..DeviceOptions::default() })
            .unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([9; 16], seed), Box::new(clock.clone())).unwrap();
    Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap().0
}

#[test]
fn fill_delete_refill_on_a_small_device() {
    let setup = FillSetup {
        geometry: small_geometry(2, 48),
        options: FsOptions::smallest(4096),
        cycles: 12,
        fill_per_mille: 950,
        file_blocks_max: 12,
        check: true,
        seed: 7,
    };
    let report = run_fill(&setup).unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("{report:#?}");
    assert_eq!(report.early_enospc, 0, "no ENOSPC before {} per mille", setup.fill_per_mille);
    assert!(report.zones_cleaned > 0, "the cleaner ran");
    assert!(report.erase_count_max as f64 <= 1.5 * report.erase_count_mean.max(1.0), "{report:?}");
}

/// Many small files created round-robin over many directories, as the
/// benchmark's million-file mount does: inodes never die, so every node
/// zone keeps some live records, and moving each one dirties the directory
/// page whose entry points at it. The cleaner must still gain more than
/// the checkpoint ending each batch writes. (When the foreground cleaner
/// ended every zone with a checkpoint, and a batch could take one zone
/// several times over, this ran out of space at 3,662 files, the device a
/// few per cent full.)
#[test]
fn many_small_files_over_many_directories_never_run_out_of_space() {
    use flintfs_core::{Fs, ManualClock, MkfsOptions};
    use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, MemoryFlash};
    let geometry = small_geometry(4, 64);
    let seed = 11;
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash =
        MemoryFlash::memory(geometry, DeviceOptions { faults: FaultConfig::none(seed), ..DeviceOptions::default() })
            .unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([9; 16], seed), Box::new(clock.clone())).unwrap();
    // A node cache of two zones, as the default's 8 MiB is on 4 MiB zones:
    // the checkpoint ending a batch can write more than a zone gives.
    let zone_bytes = (geometry.block_pages * geometry.zone_blocks * geometry.page_size_bytes) as usize;
    let options = FsOptions { node_cache_bytes: 2 * zone_bytes, ..FsOptions::smallest(4096) };
    let (mut fs, _) = Fs::mount(flash, options, Box::new(clock.clone())).unwrap();
    let directory_count = 100;
    let directories: Vec<u64> = (0..directory_count)
        .map(|index| fs.mkdir(1, format!("d{index:03}").as_bytes(), 0o755, 0, 0).unwrap().ino)
        .collect();
    let capacity_pages = u64::from(geometry.zone_count) * u64::from(geometry.block_pages * geometry.zone_blocks);
    let mut index = 0u64;
    // Until the file system has programmed three devices' worth: the
    // cleaner has turned every zone over several times.
    while fs.device().counters().pages_programmed < 6 * capacity_pages {
        let directory = directories[(index % directory_count) as usize];
        let file = fs
            .create(directory, format!("f{index:07}").as_bytes(), 0o644, 0, 0)
            .unwrap_or_else(|error| panic!("seed {seed}: create {index}: {error}; {:?}", fs.cleaner_counters()));
        fs.forget(file.ino, 1).unwrap();
        index += 1;
    }
    let cleaner = fs.cleaner_counters().clone();
    eprintln!("{index} files, {:?}", cleaner);
    assert!(cleaner.zones_cleaned > 0, "the cleaner ran");
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:#?}", report.findings);
    // Every file is still named where it was created.
    for (position, directory) in directories.iter().enumerate() {
        let mut names = 0u64;
        let mut cookie = 0;
        loop {
            let entries = fs.readdir(*directory, cookie, 256).unwrap();
            let Some(last) = entries.last() else { break };
            cookie = last.offset;
            names += entries.iter().filter(|entry| entry.name != b"." && entry.name != b"..").count() as u64;
        }
        let expected = (index + directory_count - 1 - position as u64) / directory_count;
        assert_eq!(names, expected, "seed {seed}: directory {position}");
    }
    for sample in (0..index).step_by(97) {
        let directory = directories[(sample % directory_count) as usize];
        fs.lookup(directory, format!("f{sample:07}").as_bytes())
            .unwrap_or_else(|error| panic!("seed {seed}: f{sample:07}: {error}"));
    }
}

/// Power cuts while the foreground cleaner moves a batch of zones: it
/// moves inodes and dirties directory pages that only the batch's closing
/// checkpoint makes durable, so a cut anywhere in between must leave the
/// old checkpoint's tree whole (the victims are not reset before that
/// checkpoint frees them) and every fsynced file there.
#[test]
fn power_cuts_while_the_cleaner_moves_a_batch_recover_as_promised() {
    use flintfs_testkit::crashtest::cut_given_workload;
    use flintfs_testkit::model::Operation;
    use flintfs_testkit::runner::{Setup, Subject};
    let seed = 23;
    let setup = Setup::small();
    let directories = 20;
    let directory = |index: usize| vec![format!("d{:02}", index % directories).into_bytes()];
    let create =
        |index: usize| Operation::Create { directory: directory(index), name: format!("f{index:05}").into_bytes() };
    let setup_operations: Vec<Operation> = (0..directories)
        .map(|index| Operation::Mkdir { directory: Vec::new(), name: format!("d{index:02}").into_bytes() })
        .chain((0..FILLED).map(create))
        .collect();
    // The measured part: more creates round-robin, each directory fsynced
    // every so often, over the point where the cleaner starts.
    let workload: Vec<Operation> = (FILLED..FILLED + MORE)
        .flat_map(|index| {
            let mut operations = vec![create(index)];
            if index % 7 == 0 {
                operations.push(Operation::Fsync { path: directory(index), data_only: false });
            }
            operations
        })
        .collect();
    // The workload must reach the cleaner, or the cuts prove nothing.
    let (flash, clock) = setup.formatted(seed);
    let mut subject = Subject::mount(flash, clock, setup.options.clone()).unwrap();
    for operation in &setup_operations {
        subject.apply(operation);
    }
    let before = subject.fs().cleaner_counters().zones_cleaned;
    for operation in &workload {
        subject.apply(operation);
    }
    let cleaned = subject.fs().cleaner_counters().zones_cleaned - before;
    assert!(cleaned >= 2, "seed {seed}: the workload cleaned {cleaned} zones; the cuts would miss the cleaner");
    let summary = cut_given_workload(setup, seed, &setup_operations, workload, CUTS).unwrap();
    eprintln!("seed {seed}: {cleaned} zones cleaned by the uncut workload; {summary:?}");
    assert_eq!(summary.cuts, CUTS, "seed {seed}");
    assert_eq!(summary.violations, 0, "seed {seed}: {:?}", summary.failures);
}

/// Files made before the measured workload, and in it, for the test above.
const FILLED: usize = 600;
const MORE: usize = 300;
/// Cuts spread over the measured workload.
const CUTS: u64 = 10;

/// Overwrites with fsync at random in a file system about 88% full, long
/// enough that the foreground cleaner turns most zones over: it cleans in
/// bounded steps, so no operation reads more than a step's pages of a
/// victim or moves more than a step's pages, it never falls behind far
/// enough to clean whole zones inside an operation, and every block reads
/// back as last written. Seeds 5, 10 and 19 each once cleaned a whole zone
/// inside an operation (19 after 2026-11-29's checkpoint that writes each
/// node once; 5 and 10 before it), short of free zones only by the nodes
/// buffered (194 with four zones free): an operation now takes a
/// checkpoint instead, which seed 19 needs once. `FLINTFS_CLEANER_SEEDS`
/// (a count) runs seeds 1 to that count instead: 40 pass.
#[test]
fn the_foreground_cleaner_works_in_bounded_steps() {
    let asked = std::env::var("FLINTFS_CLEANER_SEEDS").ok();
    let seeds: Vec<u64> = match &asked {
        Some(count) => (1..=count.parse::<u64>().expect("FLINTFS_CLEANER_SEEDS is a count")).collect(),
        None => vec![5, 10, 19, 20],
    };
    let mut checkpoints_for_buffered = 0;
    for seed in seeds {
        checkpoints_for_buffered += foreground_steps(seed).checkpoints_for_buffered;
    }
    // Seed 19 takes that path; seeds asked for may not.
    assert!(
        asked.is_some() || checkpoints_for_buffered > 0,
        "no run was short only by what it buffered, so that path went unchecked"
    );
}

/// One run of `the_foreground_cleaner_works_in_bounded_steps`; returns the
/// cleaner's counters.
fn foreground_steps(seed: u64) -> flintfs_core::CleanerCounters {
    use flintfs_core::{Fs, CLEAN_MOVES_PER_STEP_MAX, CLEAN_READS_PER_STEP_MAX, CLEAN_RELEASE_VICTIMS_MIN};
    use flintfs_flash::{FlashDevice, MemoryFlash};
    use rand::{Rng, SeedableRng};
    const FILE_BLOCKS: u64 = 32;
    const BLOCK_BYTES: usize = 4096;
    // Zones of 256 pages and the default caches: the shape the steps are
    // tuned for (the default device's zones are four times larger).
    let geometry = Geometry { block_pages: 64, ..small_geometry(4, 40) };
    let mut fs = fresh_engine(geometry, seed);
    // Half zeros, half noise: each block compresses to a chunk of a little
    // over half a page, so the steps move packed, compressed chunks.
    let block = |file: usize, index: u64, version: u32| -> Vec<u8> {
        let mut bytes = vec![0u8; BLOCK_BYTES];
        let mut noise = rand_pcg::Pcg64Mcg::seed_from_u64((file as u64) << 40 | index << 8 | u64::from(version));
        noise.fill(&mut bytes[BLOCK_BYTES / 2..]);
        bytes[..4].copy_from_slice(&(file as u32).to_le_bytes());
        bytes[4..12].copy_from_slice(&index.to_le_bytes());
        bytes[12..16].copy_from_slice(&version.to_le_bytes());
        bytes
    };
    // Fill with whole files to about 88% of what statfs offers.
    let mut files: Vec<(u64, Vec<u32>)> = Vec::new();
    loop {
        let statfs = fs.statfs().unwrap();
        let used = statfs.blocks - statfs.blocks_free;
        if used * 1000 >= statfs.blocks * 880 {
            break;
        }
        let ino = fs.create(1, format!("f{:04}", files.len()).as_bytes(), 0o644, 0, 0).unwrap().ino;
        for index in 0..FILE_BLOCKS {
            fs.write(ino, index * BLOCK_BYTES as u64, &block(files.len(), index, 0)).unwrap();
        }
        files.push((ino, vec![0; FILE_BLOCKS as usize]));
    }
    fs.sync().unwrap();
    let capacity_pages = u64::from(geometry.zone_count) * u64::from(geometry.block_pages * geometry.zone_blocks);
    let programmed_before = fs.device().counters().pages_programmed;
    let mut random = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    let mut writes = 0u64;
    let mut operations_that_reset = 0u64;
    while fs.device().counters().pages_programmed - programmed_before < 3 * capacity_pages {
        let file = random.random_range(0..files.len());
        let index = random.random_range(0..FILE_BLOCKS);
        let (ino, versions) = &mut files[file];
        versions[index as usize] += 1;
        let before = fs.cleaner_counters().clone();
        // An operation that resets a zone ahead of its use (3 ms on each
        // of the zone's dies) takes no step on top of it.
        let mut step_unless_reset = |fs: &mut Fs<MemoryFlash>, operation: &mut dyn FnMut(&mut Fs<MemoryFlash>)| {
            let (resets, steps, checkpoints) =
                (fs.device().counters().zone_resets, fs.cleaner_counters().steps, fs.counters().checkpoints);
            operation(fs);
            let reset = fs.device().counters().zone_resets > resets && fs.counters().checkpoints == checkpoints;
            assert!(!reset || fs.cleaner_counters().steps == steps, "seed {seed}: write {writes}: a reset and a step");
            operations_that_reset += u64::from(reset);
        };
        step_unless_reset(&mut fs, &mut |fs| {
            fs.write(*ino, index * BLOCK_BYTES as u64, &block(file, index, versions[index as usize]))
                .unwrap_or_else(|error| panic!("seed {seed}: write {writes}: {error}"));
        });
        step_unless_reset(&mut fs, &mut |fs| {
            fs.fsync(*ino, false).unwrap_or_else(|error| panic!("seed {seed}: fsync {writes}: {error}"));
        });
        let after = fs.cleaner_counters();
        // Two operations (the write and the fsync), a step each at most.
        assert!(
            after.pages_read - before.pages_read <= 2 * u64::from(CLEAN_READS_PER_STEP_MAX),
            "seed {seed}: write {writes} read {} victim pages: {after:?}",
            after.pages_read - before.pages_read
        );
        assert!(
            after.data_pages_moved - before.data_pages_moved <= 2 * CLEAN_MOVES_PER_STEP_MAX,
            "seed {seed}: write {writes} moved {} pages",
            after.data_pages_moved - before.data_pages_moved
        );
        writes += 1;
    }
    let cleaner = fs.cleaner_counters().clone();
    eprintln!("{writes} overwrites, {cleaner:?}, {:?}", fs.counters());
    assert!(cleaner.steps > 0 && cleaner.zones_cleaned > 0, "the cleaner ran in steps: {cleaner:?}");
    assert_eq!(cleaner.whole_zone_cleanings_for_space, 0, "seed {seed}: the steps fell behind: {cleaner:?}");
    // This small device has little runway: its victims are all freed
    // below the low water mark (see the test after this one for those
    // freed at it), whatever there is each time, not always one.
    assert!(
        cleaner.victims_released_at_low_water >= CLEAN_RELEASE_VICTIMS_MIN as u64 * cleaner.releases_at_low_water,
        "seed {seed}: {cleaner:?}"
    );
    assert!(cleaner.checkpoints_to_release < cleaner.zones_cleaned, "seed {seed}: {cleaner:?}");
    assert!(operations_that_reset > 0, "seed {seed}: no operation reset a zone ahead, so none was checked");
    assert_eq!(cleaner.zones_stuck, 0, "seed {seed}: {cleaner:?}");
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:#?}", report.findings);
    for (file, (ino, versions)) in files.iter().enumerate() {
        for (index, version) in versions.iter().enumerate() {
            let read = fs.read(*ino, index as u64 * BLOCK_BYTES as u64, BLOCK_BYTES as u64).unwrap();
            assert_eq!(read, block(file, index as u64, *version), "seed {seed}: file {file} block {index}");
        }
    }
    cleaner
}

/// Overwrites with fsync at random in a file system 90% full on the
/// default 512 MiB geometry (zones of 4 MiB, the runway the bench's
/// near_full_90 has): the cleaner's victims are freed three at a time at
/// the low water mark (`CLEAN_RELEASE_VICTIMS_MIN`), not a checkpoint
/// each, and the steps keep up without cleaning whole zones.
#[test]
fn victims_are_freed_in_batches_at_the_low_water_mark() {
    use flintfs_core::CLEAN_RELEASE_VICTIMS_MIN;
    use rand::{Rng, SeedableRng};
    const FILE_BYTES: usize = 256 << 10;
    const BLOCK_BYTES: usize = 4096;
    const WRITES: usize = 12_000;
    let seed = 23;
    let geometry = Geometry::with_size_bytes(512 << 20);
    let mut fs = fresh_engine(geometry, seed);
    let mut random = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    let mut noise = vec![0u8; FILE_BYTES];
    let mut files = Vec::new();
    loop {
        let statfs = fs.statfs().unwrap();
        if (statfs.blocks - statfs.blocks_free) * 10 >= statfs.blocks * 9 {
            break;
        }
        random.fill(&mut noise[..]);
        let ino = fs.create(1, format!("f{:05}", files.len()).as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &noise).unwrap();
        files.push(ino);
        if files.len() % 64 == 0 {
            fs.sync().unwrap();
        }
    }
    fs.sync().unwrap();
    let mut block = vec![0u8; BLOCK_BYTES];
    for write in 0..WRITES {
        let ino = files[random.random_range(0..files.len())];
        let offset = random.random_range(0..(FILE_BYTES / BLOCK_BYTES) as u64) * BLOCK_BYTES as u64;
        random.fill(&mut block[..]);
        fs.write(ino, offset, &block).unwrap_or_else(|error| panic!("seed {seed}: write {write}: {error}"));
        fs.fsync(ino, false).unwrap_or_else(|error| panic!("seed {seed}: fsync {write}: {error}"));
    }
    let cleaner = fs.cleaner_counters().clone();
    eprintln!("{WRITES} overwrites: {cleaner:?}, {} checkpoints", fs.counters().checkpoints);
    assert_eq!(cleaner.whole_zone_cleanings_for_space, 0, "seed {seed}: the steps fell behind: {cleaner:?}");
    assert!(cleaner.releases_at_low_water > 0, "seed {seed}: no release at the low water mark: {cleaner:?}");
    assert!(
        cleaner.victims_released_at_low_water >= CLEAN_RELEASE_VICTIMS_MIN as u64 * cleaner.releases_at_low_water,
        "seed {seed}: {cleaner:?}"
    );
    assert!(cleaner.checkpoints_to_release < cleaner.zones_cleaned, "seed {seed}: {cleaner:?}");
    assert_eq!(cleaner.zones_stuck, 0, "seed {seed}: {cleaner:?}");
}
