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
//! - each zone keeps at least the pages it had when a flush or a reset
//!   last returned, and no more than it had accepted;
//! - every page it keeps reads back as written, in the zone's current life
//!   (a page of an earlier life or an earlier session never counts);
//! - a finished zone stays full.
//!
//! The run then goes on with the crashed image, so later crashes meet slots
//! an earlier crash left past a lowered write pointer. A failure names its
//! seed; `FLINTFS_HOST_CRASH_SEEDS` and `FLINTFS_HOST_CRASH_STEPS` make the
//! run longer.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::*;
use flintfs_flash::{
    DeviceOptions, FaultConfig, FlashDevice, Geometry, HostWriteObserver, ImageFlash, PageAddress, PageState,
    ZoneState, IMAGE_UNSYNCED_PAGES_MAX,
};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// What the host's disk can tear a write into.
const SECTOR_BYTES: u64 = 512;

#[derive(Default)]
struct Journal {
    /// The file as the disk holds it after the last sync that returned.
    synced: Vec<u8>,
    /// Writes since, in order.
    writes: Vec<(u64, Vec<u8>)>,
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
        let mut image = self.synced.clone();
        for (offset, bytes) in &self.writes {
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
fn open_watched(path: &Path) -> (ImageFlash, Arc<Mutex<Journal>>) {
    let mut device = ImageFlash::open_image(path, host_options()).expect("open");
    let journal = Arc::new(Mutex::new(Journal { synced: std::fs::read(path).unwrap(), writes: Vec::new() }));
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

    /// One step of the workload.
    fn step(&mut self, device: &mut ImageFlash, rng: &mut Pcg64Mcg) {
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
        if std::env::var("HC_DEBUG").is_ok() {
            eprintln!("roll {roll} wp {:?}", reports.iter().map(|r| (r.write_pointer, r.state)).collect::<Vec<_>>());
        }
        if roll < 65 && !writable.is_empty() {
            let zone = writable[rng.random_range(0..writable.len())];
            let page = reports[zone as usize].write_pointer;
            let tag = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            program(device, zone, page, tag);
            self.zones[zone as usize].tags.push(tag);
        } else if roll < 77 {
            device.flush().unwrap_or_else(|error| panic!("seed {}: flush: {error}", self.seed));
            for model in &mut self.zones {
                model.promised = model.tags.len() as u32;
            }
        } else if roll < 82 {
            let used: Vec<u32> =
                reports.iter().filter(|report| report.write_pointer > 0).map(|report| report.zone).collect();
            if let Some(&zone) = used.get(rng.random_range(0..used.len().max(1))) {
                device.reset_zone(zone).unwrap_or_else(|error| panic!("seed {}: reset: {error}", self.seed));
                self.zones[zone as usize] = ZoneModel::default();
            }
        } else if roll < 85 {
            let open_zones: Vec<u32> = reports
                .iter()
                .filter(|report| report.state == ZoneState::Open && report.write_pointer > 0)
                .map(|report| report.zone)
                .collect();
            if let Some(&zone) = open_zones.get(rng.random_range(0..open_zones.len().max(1))) {
                device.finish_zone(zone).unwrap_or_else(|error| panic!("seed {}: finish: {error}", self.seed));
                // Full from now on, whatever a crash drops; its buffered
                // pages wait for a flush, as at a power cut.
                self.zones[zone as usize].finished = true;
            }
        } else {
            let used: Vec<u32> =
                reports.iter().filter(|report| report.write_pointer > 0).map(|report| report.zone).collect();
            if let Some(&zone) = used.get(rng.random_range(0..used.len().max(1))) {
                let page = rng.random_range(0..reports[zone as usize].write_pointer);
                self.check_page(device, zone, page, "in session");
            }
        }
    }

    /// Holds a freshly crashed and opened device to the promises, then
    /// takes what it kept as the new state.
    fn check_after_crash(&mut self, device: &mut ImageFlash, crash: u32) {
        let context = format!("after crash {crash}");
        for report in device.report_zones() {
            let zone = report.zone;
            let model = &self.zones[zone as usize];
            let kept = report.write_pointer;
            assert!(
                kept >= model.promised && kept as usize <= model.tags.len(),
                "seed {}: {context}: zone {zone} kept {kept} pages, promised {} of {} accepted",
                self.seed,
                model.promised,
                model.tags.len()
            );
            if model.finished {
                assert_eq!(report.state, ZoneState::Full, "seed {}: {context}: zone {zone} was finished", self.seed);
            }
            for page in 0..kept {
                self.check_page(device, zone, page, &context);
            }
            let model = &mut self.zones[zone as usize];
            model.tags.truncate(kept as usize);
            model.promised = kept;
        }
    }
}

fn crash_into(journal: &Mutex<Journal>, rng: &mut Pcg64Mcg, directory: &Path, crash: u32) -> PathBuf {
    let image = journal.lock().unwrap().crash_image(rng);
    let path = directory.join(format!("crash-{crash}.img"));
    std::fs::write(&path, image).unwrap();
    path
}

fn run_seed(seed: u64, steps: u32) {
    let directory = tempfile::tempdir().unwrap();
    let geometry = crash_geometry();
    let mut path = directory.path().join("device.img");
    drop(ImageFlash::create_image(&path, geometry, host_options()).unwrap());
    let (mut device, mut journal) = open_watched(&path);
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut run = Run { seed, geometry, zones: vec![ZoneModel::default(); geometry.zone_count as usize], next_tag: 0 };
    let mut crashes = 0;
    for step in 0..steps {
        run.step(&mut device, &mut rng);
        if rng.random_range(0..40) == 0 || step + 1 == steps {
            crashes += 1;
            let crashed = crash_into(&journal, &mut rng, directory.path(), crashes);
            // The process goes with the host; what it still held is lost.
            drop(device);
            std::fs::remove_file(&path).unwrap();
            path = crashed;
            (device, journal) = open_watched(&path);
            run.check_after_crash(&mut device, crashes);
        }
    }
}

#[test]
fn a_host_crash_keeps_what_was_promised() {
    let seeds: u64 = std::env::var("FLINTFS_HOST_CRASH_SEEDS").ok().and_then(|value| value.parse().ok()).unwrap_or(64);
    let steps: u32 = std::env::var("FLINTFS_HOST_CRASH_STEPS").ok().and_then(|value| value.parse().ok()).unwrap_or(400);
    for seed in 0..seeds {
        run_seed(seed, steps);
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
    // Killed without a flush: the host keeps every write it took.
    drop(device);
    let device = ImageFlash::open_image(&path, host_options()).unwrap();
    let checked = device.slots_checked_at_open();
    assert!(checked > 0 && checked <= IMAGE_UNSYNCED_PAGES_MAX, "checked {checked} slots at open");
    let kept: u64 = device.report_zones().iter().map(|report| u64::from(report.write_pointer)).sum();
    assert!(kept + 3 >= u64::from(geometry.zone_count - 1) * u64::from(zone_pages), "kept {kept} pages");
}
