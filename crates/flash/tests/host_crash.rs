//! What a host crash leaves of an image, with `host_sync`.
//!
//! The fault model: the host's page cache takes every write the image
//! backend makes, and writes it back to the disk in any order, any part of
//! it, until an fdatasync returns; then all of it is on the disk. A crash
//! keeps the file as it was at the last sync that returned, plus any
//! subset of the 512-byte sectors written since (each kept or not on a coin
//! of the seed), so a page slot, a zone record or a header may be written
//! back in part.
//!
//! The harness sees every write and sync through `observe_host_writes`,
//! keeps the synced file apart from the writes since (pristine, and the
//! overlay a crash draws from), and after a crash opens the result and
//! holds it to what the device promised:
//! - each zone keeps at least the pages it had when a flush last
//!   returned, and no more than it had accepted;
//! - every page it keeps reads back as written, in the zone's current life
//!   (a page of an earlier life or an earlier session never counts);
//! - a zone finished before the last flush stays full.
//!
//! A reset or finish since the last flush may or may not have happened:
//! the image runs its writes and syncs in order behind the device
//! (`image_writer`), so a crash can find the file as it was at any moment
//! after that flush, the reset's records not yet written. The zone then
//! holds its life before the reset, which must keep what was promised of
//! it; the model keeps that life until a flush returns (and flushes before
//! a second reset of the zone, so that one life is ever in doubt).
//!
//! The run then goes on with the crashed image, so later crashes meet slots
//! an earlier crash left past a lowered write pointer. Some fdatasyncs are
//! made to fail: the device must then refuse everything until it is opened
//! again, and what it finds then is what a crash leaves (a reset or finish
//! whose sync failed may or may not have happened). A failure names its
//! seed; `FLINTFS_HOST_CRASH_SEEDS` and `FLINTFS_HOST_CRASH_STEPS` make the
//! run longer, `FLINTFS_HOST_CRASH_FIRST_SEED` starts it elsewhere, and
//! `FLINTFS_HOST_CRASH_TRACE=1` prints each step of a seed.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::*;
use flintfs_flash::{
    DeviceOptions, FaultConfig, FlashDevice, Geometry, HostWriteObserver, ImageFlash, PageAddress, PageState,
    ZoneState, DRAINED_RECORDS_LAG_PAGES, HOST_SECTOR_BYTES, IMAGE_UNSYNCED_PAGES_MAX,
};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

fn trace() -> bool {
    std::env::var_os("FLINTFS_HOST_CRASH_TRACE").is_some()
}

/// What the host's disk can tear a write into.
const SECTOR_BYTES: u64 = HOST_SECTOR_BYTES;
/// One step in this many has its first fdatasync fail.
const FAILED_SYNC_ONE_STEP_IN: u32 = 60;
/// One step in this many ends in a host crash.
const CRASH_ONE_STEP_IN: u32 = 40;
/// Most steps a run takes after a failed fdatasync before the crash.
const STEPS_AFTER_A_FAILED_SYNC_MAX: u32 = 3;

#[derive(Default)]
struct Journal {
    /// The file as the disk holds it after the last sync that returned.
    synced: Vec<u8>,
    /// Writes since, in order.
    writes: Vec<(u64, Vec<u8>)>,
    /// The next fdatasync fails (and what it would have written is then
    /// any subset, as at a crash: the kernel may have written some pages
    /// and dropped the others).
    fail_next_sync: bool,
    failed_syncs: u32,
    /// Draws what a failed fdatasync wrote.
    rng: Option<Pcg64Mcg>,
}

impl Journal {
    fn apply(image: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
        let end = offset as usize + bytes.len();
        if image.len() < end {
            image.resize(end, 0);
        }
        image[offset as usize..end].copy_from_slice(bytes);
    }

    /// The file a crash now could leave: the synced file and, of each
    /// sector written since, the last write or nothing.
    fn crash_image(&self, rng: &mut Pcg64Mcg) -> Vec<u8> {
        Journal::some_of(self.synced.clone(), &self.writes, rng)
    }

    fn some_of(mut image: Vec<u8>, writes: &[(u64, Vec<u8>)], rng: &mut Pcg64Mcg) -> Vec<u8> {
        for (offset, bytes) in writes {
            let mut start = *offset;
            let end = offset + bytes.len() as u64;
            while start < end {
                let sector_end = ((start / SECTOR_BYTES) + 1) * SECTOR_BYTES;
                let piece_end = sector_end.min(end);
                if rng.random_bool(0.5) {
                    let piece = &bytes[(start - offset) as usize..(piece_end - offset) as usize];
                    Journal::apply(&mut image, start, piece);
                }
                start = piece_end;
            }
        }
        image
    }
}

struct Recorder(Arc<Mutex<Journal>>);

impl HostWriteObserver for Recorder {
    fn written(&mut self, offset: u64, bytes: &[u8]) {
        self.0.lock().unwrap().writes.push((offset, bytes.to_vec()));
    }

    fn before_sync(&mut self) -> std::io::Result<()> {
        let mut journal = self.0.lock().unwrap();
        if std::mem::take(&mut journal.fail_next_sync) {
            journal.failed_syncs += 1;
            // The kernel wrote some of the pages and dropped the others
            // (marked clean, never written): a later sync that returns
            // does not bring them back.
            let mut rng = journal.rng.take().expect("a seeded journal");
            let writes = std::mem::take(&mut journal.writes);
            journal.synced = Journal::some_of(std::mem::take(&mut journal.synced), &writes, &mut rng);
            journal.rng = Some(rng);
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    fn synced(&mut self) {
        let mut journal = self.0.lock().unwrap();
        let writes = std::mem::take(&mut journal.writes);
        for (offset, bytes) in writes {
            Journal::apply(&mut journal.synced, offset, &bytes);
        }
    }
}

fn crash_geometry() -> Geometry {
    Geometry { zone_blocks: 4, zone_count: 8, ..small_geometry() }
}

fn host_options() -> DeviceOptions {
    DeviceOptions { write_buffer_pages: 3, host_sync: true, ..options(FaultConfig::none(0)) }
}

/// Opens `path` and watches it: the journal starts from the file as open
/// left it (synced: open ends with a sync).
fn open_watched(path: &Path, seed: u64) -> (ImageFlash, Arc<Mutex<Journal>>) {
    let mut device = ImageFlash::open_image(path, host_options()).expect("open");
    let journal = Arc::new(Mutex::new(Journal {
        synced: std::fs::read(path).unwrap(),
        rng: Some(Pcg64Mcg::seed_from_u64(seed)),
        ..Journal::default()
    }));
    device.observe_host_writes(Box::new(Recorder(journal.clone())));
    (device, journal)
}

/// What the device promised of one zone.
#[derive(Clone, Default)]
struct ZoneModel {
    /// Tags of the pages accepted in the zone's current life.
    tags: Vec<u8>,
    /// Pages a crash must keep.
    promised: u32,
    finished: bool,
    /// A reset since the last flush, or one whose sync failed after the
    /// device took it: the life before it, which a crash may bring back.
    before_doubtful_reset: Option<DoubtfulLife>,
    /// A finish since the last flush, or one whose sync failed: the zone
    /// may or may not stay full.
    finish_in_doubt: bool,
}

/// A zone's life before a reset in doubt.
#[derive(Clone, Debug)]
struct DoubtfulLife {
    tags: Vec<u8>,
    promised: u32,
    finished: bool,
    /// The zone's highest erase count then: a reset that took raised it.
    erase_count_max: u32,
}

/// What a seed's run went through, so that a run that never reached the
/// paths it is for fails instead of passing.
#[derive(Default)]
struct RunStats {
    failed_syncs: u32,
    /// Zones an open found short of the pages their session had accepted,
    /// and of those, the ones whose record counted pages the crash lost.
    zones_cut_short: u32,
    zones_lowered_at_open: u32,
    slots_checked_at_open: u64,
}

struct Run {
    seed: u64,
    geometry: Geometry,
    zones: Vec<ZoneModel>,
    next_tag: u8,
}

impl Run {
    fn check_page(&self, device: &mut ImageFlash, zone: u32, page: u32, context: &str) {
        let (state, data, oob) = read(device, zone, page);
        let expected =
            page_bytes(&self.geometry, PageAddress::new(zone, page), self.zones[zone as usize].tags[page as usize]);
        assert_eq!(state, PageState::Programmed, "seed {}: {context}: zone {zone} page {page} state", self.seed);
        assert!(
            data == expected.0 && oob == expected.1,
            "seed {}: {context}: zone {zone} page {page} differs",
            self.seed
        );
    }

    /// One step of the workload; an error is a failed fdatasync the
    /// journal injected, after which the device refuses everything.
    fn step(&mut self, device: &mut ImageFlash, rng: &mut Pcg64Mcg) -> flintfs_flash::Result<()> {
        let reports = device.report_zones();
        let open = reports.iter().filter(|report| report.state == ZoneState::Open).count() as u32;
        let writable: Vec<u32> = reports
            .iter()
            .filter(|report| match report.state {
                ZoneState::Open => true,
                ZoneState::Empty | ZoneState::Closed => open < self.geometry.open_zones_max,
                _ => false,
            })
            .map(|report| report.zone)
            .collect();
        let roll = rng.random_range(0..100);
        if trace() {
            eprintln!("roll {roll} wp {:?}", reports.iter().map(|r| (r.write_pointer, r.state)).collect::<Vec<_>>());
        }
        if roll < 65 && !writable.is_empty() {
            let zone = writable[rng.random_range(0..writable.len())];
            let page = reports[zone as usize].write_pointer;
            let tag = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            let (data, oob) = page_bytes(&self.geometry, PageAddress::new(zone, page), tag);
            device.program_page(PageAddress::new(zone, page), &data, &oob)?;
            self.zones[zone as usize].tags.push(tag);
            if trace() {
                eprintln!("programmed zone {zone} page {page} tag {tag}");
            }
        } else if roll < 77 {
            self.flush(device)?;
        } else if roll < 82 {
            let used: Vec<u32> =
                reports.iter().filter(|report| report.write_pointer > 0).map(|report| report.zone).collect();
            if let Some(&zone) = used.get(rng.random_range(0..used.len().max(1))) {
                if self.zones[zone as usize].before_doubtful_reset.is_some() {
                    self.flush(device)?;
                }
                let reset = device.reset_zone(zone);
                if trace() {
                    eprintln!("reset zone {zone}: {:?}", reset.as_ref().err());
                }
                if reset.is_ok() || device.report_zone(zone).unwrap().write_pointer == 0 {
                    // Taken, at least in the session.
                    // In doubt until a flush returns (or for good after a
                    // failed sync, after which nothing more reaches the
                    // disk): an earlier doubtful life stays the one a
                    // crash may bring back.
                    let model = std::mem::take(&mut self.zones[zone as usize]);
                    let life = DoubtfulLife {
                        tags: model.tags,
                        promised: model.promised,
                        finished: model.finished && !model.finish_in_doubt,
                        erase_count_max: reports[zone as usize].erase_count_max,
                    };
                    self.zones[zone as usize].before_doubtful_reset = model.before_doubtful_reset.or(Some(life));
                }
                reset?;
            }
        } else if roll < 85 {
            let open_zones: Vec<u32> = reports
                .iter()
                .filter(|report| report.state == ZoneState::Open && report.write_pointer > 0)
                .map(|report| report.zone)
                .collect();
            if let Some(&zone) = open_zones.get(rng.random_range(0..open_zones.len().max(1))) {
                if let Err(error) = device.finish_zone(zone) {
                    self.zones[zone as usize].finish_in_doubt = true;
                    return Err(error);
                }
                // Full once a flush returns, whatever a crash drops then;
                // its buffered pages wait for that flush, as at a power
                // cut.
                self.zones[zone as usize].finished = true;
                self.zones[zone as usize].finish_in_doubt = true;
            }
        } else {
            let used: Vec<u32> =
                reports.iter().filter(|report| report.write_pointer > 0).map(|report| report.zone).collect();
            if let Some(&zone) = used.get(rng.random_range(0..used.len().max(1))) {
                let page = rng.random_range(0..reports[zone as usize].write_pointer);
                self.check_page(device, zone, page, "in session");
            }
        }
        Ok(())
    }

    /// A flush: every page accepted is promised, and every reset and
    /// finish before it has happened.
    fn flush(&mut self, device: &mut ImageFlash) -> flintfs_flash::Result<()> {
        device.flush()?;
        for model in &mut self.zones {
            model.promised = model.tags.len() as u32;
            model.before_doubtful_reset = None;
            model.finish_in_doubt = false;
        }
        Ok(())
    }

    /// Holds a freshly crashed and opened device to the promises, then
    /// takes what it kept as the new state.
    fn check_after_crash(&mut self, device: &mut ImageFlash, crash: u32, stats: &mut RunStats) {
        let context = format!("after crash {crash}");
        stats.slots_checked_at_open += device.slots_checked_at_open();
        stats.zones_lowered_at_open += device.zones_lowered_at_open();
        for report in device.report_zones() {
            let zone = report.zone;
            let kept = report.write_pointer;
            if trace() {
                let model = &self.zones[zone as usize];
                eprintln!(
                    "zone {zone}: kept {kept} {:?}, model tags {:?} promised {} doubtful {:?}",
                    report.state, model.tags, model.promised, model.before_doubtful_reset
                );
            }
            if let Some(life) = self.zones[zone as usize].before_doubtful_reset.take() {
                // A reset that reached the disk raised the erase counts
                // (its block records go before its zone record, and open
                // completes a reset whose block records it finds): the
                // same counts are the old life, raised ones the new, whose
                // pages kept may be any it accepted (drained, unflushed).
                if report.erase_count_max == life.erase_count_max {
                    let DoubtfulLife { tags, promised, finished, .. } = life;
                    self.zones[zone as usize] = ZoneModel { tags, promised, finished, ..ZoneModel::default() };
                }
            }
            let model = &self.zones[zone as usize];
            assert!(
                kept >= model.promised && kept as usize <= model.tags.len(),
                "seed {}: {context}: zone {zone} kept {kept} pages, promised {} of {} accepted",
                self.seed,
                model.promised,
                model.tags.len()
            );
            if model.finished && !model.finish_in_doubt {
                assert_eq!(report.state, ZoneState::Full, "seed {}: {context}: zone {zone} was finished", self.seed);
            }
            for page in 0..kept {
                self.check_page(device, zone, page, &context);
            }
            if (kept as usize) < model.tags.len() {
                stats.zones_cut_short += 1;
            }
            let model = &mut self.zones[zone as usize];
            model.tags.truncate(kept as usize);
            model.promised = kept;
            model.finished = report.state == ZoneState::Full && kept < report.capacity_pages;
            model.finish_in_doubt = false;
        }
    }
}

fn crash_into(journal: &Mutex<Journal>, rng: &mut Pcg64Mcg, directory: &Path, crash: u32) -> PathBuf {
    let image = journal.lock().unwrap().crash_image(rng);
    let path = directory.join(format!("crash-{crash}.img"));
    // Sparse where the image is zeros, as the image it stands for was: the
    // next session then allocates ahead into holes again (a 4 KiB piece of
    // zeros reads the same as a hole).
    const PIECE_BYTES: usize = 4096;
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(image.len() as u64).unwrap();
    for (index, piece) in image.chunks(PIECE_BYTES).enumerate() {
        if piece.iter().any(|&byte| byte != 0) {
            file.write_all_at(piece, (index * PIECE_BYTES) as u64).unwrap();
        }
    }
    path
}

fn run_seed(seed: u64, steps: u32, stats: &mut RunStats) {
    let directory = tempfile::tempdir().unwrap();
    let geometry = crash_geometry();
    let mut path = directory.path().join("device.img");
    drop(ImageFlash::create_image(&path, geometry, host_options()).unwrap());
    let (mut device, mut journal) = open_watched(&path, seed);
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut run = Run { seed, geometry, zones: vec![ZoneModel::default(); geometry.zone_count as usize], next_tag: 0 };
    let mut crashes = 0;
    for step in 0..steps {
        journal.lock().unwrap().fail_next_sync = rng.random_range(0..FAILED_SYNC_ONE_STEP_IN) == 0;
        let failed = run.step(&mut device, &mut rng).is_err();
        if trace() && failed {
            eprintln!("step failed (injected sync failure)");
        }
        if failed {
            assert!(journal.lock().unwrap().failed_syncs > 0, "seed {seed}: an error with no failed sync");
            // Going on after a failed fdatasync must not make anything the
            // disk lost count (the device refuses every write until it is
            // opened again).
            for _ in 0..rng.random_range(0..=STEPS_AFTER_A_FAILED_SYNC_MAX) {
                let _ = run.step(&mut device, &mut rng);
            }
        }
        // After a failed fdatasync the device refuses everything until it
        // is opened again; what reached the disk is then as at a crash.
        if failed || rng.random_range(0..CRASH_ONE_STEP_IN) == 0 || step + 1 == steps {
            crashes += 1;
            if trace() {
                eprintln!("crash {crashes}");
            }
            stats.failed_syncs += journal.lock().unwrap().failed_syncs;
            let crashed = crash_into(&journal, &mut rng, directory.path(), crashes);
            // The process goes with the host; what it still held is lost.
            drop(device);
            std::fs::remove_file(&path).unwrap();
            path = crashed;
            (device, journal) = open_watched(&path, seed.wrapping_add(u64::from(crashes)));
            run.check_after_crash(&mut device, crashes, stats);
        }
    }
}

#[test]
fn a_host_crash_keeps_what_was_promised() {
    let seeds: u64 = std::env::var("FLINTFS_HOST_CRASH_SEEDS").ok().and_then(|value| value.parse().ok()).unwrap_or(64);
    let steps: u32 = std::env::var("FLINTFS_HOST_CRASH_STEPS").ok().and_then(|value| value.parse().ok()).unwrap_or(400);
    let first: u64 =
        std::env::var("FLINTFS_HOST_CRASH_FIRST_SEED").ok().and_then(|value| value.parse().ok()).unwrap_or(0);
    let mut stats = RunStats::default();
    for seed in first..first + seeds {
        run_seed(seed, steps, &mut stats);
    }
    // The paths this is for were taken: else it passes for nothing.
    if seeds >= 8 {
        assert!(stats.failed_syncs > 0, "no fdatasync was made to fail");
        assert!(stats.slots_checked_at_open > 0, "no open checked a slot");
        assert!(stats.zones_cut_short > 0, "no open found a zone short of its accepted pages");
        assert!(stats.zones_lowered_at_open > 0, "no open lowered a write pointer past lost pages");
    }
}

/// Open reads only the slots written since about the last sync, however
/// many zones a long run of writes without a flush filled.
#[test]
fn open_checks_only_what_was_written_since_the_last_sync() {
    let directory = tempfile::tempdir().unwrap();
    let geometry = Geometry { zone_blocks: 32, zone_count: 160, open_zones_max: 4, ..small_geometry() };
    assert!(geometry.device_pages() > 2 * IMAGE_UNSYNCED_PAGES_MAX);
    let path = directory.path().join("device.img");
    let mut device = ImageFlash::create_image(&path, geometry, host_options()).unwrap();
    let zone_pages = geometry.zone_pages() as u32;
    for zone in 0..geometry.zone_count - 1 {
        for page in 0..zone_pages {
            program(&mut device, zone, page, zone as u8);
        }
    }
    // Killed without a flush: the host keeps every write it took, and the
    // records of all but the pages drained since the last ones written
    // (at most DRAINED_RECORDS_LAG_PAGES, besides the write buffer's 3).
    drop(device);
    let device = ImageFlash::open_image(&path, host_options()).unwrap();
    let checked = device.slots_checked_at_open();
    assert!(checked > 0 && checked <= IMAGE_UNSYNCED_PAGES_MAX, "checked {checked} slots at open");
    let kept: u64 = device.report_zones().iter().map(|report| u64::from(report.write_pointer)).sum();
    let accepted = u64::from(geometry.zone_count - 1) * u64::from(zone_pages);
    assert!(kept + 3 + DRAINED_RECORDS_LAG_PAGES as u64 >= accepted, "kept {kept} of {accepted} pages");
}
