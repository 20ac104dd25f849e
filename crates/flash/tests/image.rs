//! The image backend: reopens identical in another process, a killed
//! process is a power cut, and bad images are refused with clear errors,
//! never a panic.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use flintfs_flash::{
    decode_block_record, decode_overlay, decode_zone_record, BlockRecord, Counters, DeviceError, DeviceOptions,
    FaultConfig, FlashDevice, Geometry, ImageBackend, ImageFlash, ImageHeader, ImageLayout, Overlay, PageAddress,
    ZoneReport, DRAINED_RECORDS_LAG_PAGES, HEADER_SLOT_BYTES, IMAGE_ALLOCATE_AHEAD_BYTES,
};
use proptest::prelude::*;

fn image_options(faults: FaultConfig) -> DeviceOptions {
    DeviceOptions { write_buffer_pages: 3, host_sync: true, ..options(faults) }
}

type PageContents = (Vec<u8>, Vec<u8>);

/// Everything observable about a device, for "reopens identical".
#[derive(Debug, PartialEq)]
struct Snapshot {
    zones: Vec<ZoneReport>,
    blocks: Vec<BlockRecord>,
    overlay: Overlay,
    counters: Counters,
    now_ns: u64,
    nvm: Vec<u8>,
    /// Address, pristine contents and media contents of every page slot.
    pages: Vec<(PageAddress, Option<PageContents>, Option<PageContents>)>,
}

fn snapshot(device: &mut ImageFlash) -> Snapshot {
    let geometry = device.geometry();
    let zones = device.report_zones();
    let mut pages = Vec::new();
    for zone in &zones {
        if zone.state == flintfs_flash::ZoneState::Offline {
            continue;
        }
        for page in 0..zone.capacity_pages {
            let address = PageAddress::new(zone.zone, page);
            pages.push((address, device.pristine_page(address).unwrap(), device.media_page(address).unwrap()));
        }
    }
    let mut nvm = vec![0; geometry.nvm_size_bytes as usize];
    device.nvm_read(0, &mut nvm).unwrap();
    Snapshot {
        zones,
        blocks: device.blocks().to_vec(),
        overlay: device.overlay().clone(),
        counters: device.lifetime_counters(),
        now_ns: device.now_ns(),
        nvm,
        pages,
    }
}

fn faulty(seed: u64) -> FaultConfig {
    FaultConfig {
        factory_bad_block_fraction: 0.15,
        misdirected_write_probability: 0.1,
        paired_page_distance: 1,
        torn_operation_probability: 1.0,
        ..FaultConfig::none(seed)
    }
}

#[test]
fn an_image_reopens_identical() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let geometry = small_geometry();
    let mut device = ImageFlash::create_image(&path, geometry, image_options(faulty(4))).unwrap();
    for round in 0..3u8 {
        for zone in 0..geometry.zone_count {
            let report = device.report_zone(zone).unwrap();
            use flintfs_flash::ZoneState;
            if !matches!(report.state, ZoneState::Empty | ZoneState::Closed | ZoneState::Open) {
                continue;
            }
            for page in report.write_pointer..report.write_pointer.saturating_add(3).min(report.capacity_pages) {
                let address = PageAddress::new(zone, page);
                let (data, oob) = page_bytes(&geometry, address, round);
                device.program_page(address, &data, &oob).unwrap();
            }
            if round == 1 && zone % 2 == 0 {
                device.reset_zone(zone).unwrap();
            }
            let _ = device.finish_zone(zone);
        }
        device.nvm_write(u64::from(round) * 16, &[round + 1; 24]).unwrap();
        device.nvm_persist(0, 128).unwrap();
        if round == 1 {
            // Unflushed pages and a cut: torn and paired-page damage enter
            // the overlay.
            for zone in 0..geometry.zone_count {
                let report = device.report_zone(zone).unwrap();
                if report.state == flintfs_flash::ZoneState::Closed || report.state == flintfs_flash::ZoneState::Empty {
                    let address = PageAddress::new(zone, report.write_pointer);
                    let (data, oob) = page_bytes(&geometry, address, 9);
                    let _ = device.program_page(address, &data, &oob);
                }
            }
            device.power_cut(77).unwrap();
        }
        device.advance_time(1_000_000_000);
        device.flush().unwrap();
    }
    let counters = device.lifetime_counters();
    assert!(counters.misdirected_writes_injected > 0, "{counters:?}");
    assert!(!device.overlay().is_empty());
    assert!(device.blocks().iter().any(|block| block.bad), "factory bad blocks present");
    let before = snapshot(&mut device);
    drop(device);
    let mut reopened = ImageFlash::open_image(&path, image_options(faulty(4))).unwrap();
    let after = snapshot(&mut reopened);
    assert_eq!(before.zones, after.zones);
    assert_eq!(before.blocks, after.blocks);
    assert_eq!(before.overlay, after.overlay);
    assert_eq!(before.counters, after.counters);
    assert_eq!(before.now_ns, after.now_ns);
    assert_eq!(before.nvm, after.nvm);
    assert_eq!(before.pages, after.pages);
    assert_eq!(ImageBackend::read_geometry(&path).unwrap(), geometry);
}

/// A page the write buffer drains on its own survives the process once
/// its records are written: with the next [`DRAINED_RECORDS_LAG_PAGES`]
/// drained pages' or at the next flush. Until then a killed process keeps
/// the flushed prefix and what was recorded, a shorter prefix than an
/// in-process power cut keeps, and never less than a flush promised. With
/// `host_sync` too: a record may reach the host's disk before its page,
/// but open checks the slots past the synced write pointer
/// (`host_crash.rs`).
#[test]
fn unflushed_writes_are_gone_after_drop_and_drained_ones_stay_once_recorded() {
    for host_sync in [false, true] {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("device.img");
        let geometry = small_geometry();
        let options = DeviceOptions { host_sync, ..image_options(FaultConfig::none(0)) };
        let mut device = ImageFlash::create_image(&path, geometry, options.clone()).unwrap();
        for page in 0..4 {
            program(&mut device, 0, page, 1);
        }
        device.flush().unwrap();
        for page in 4..8 {
            program(&mut device, 0, page, 2); // the 3-page buffer drains page 4 on its own
        }
        assert_eq!(device.durable_write_pointer(0).unwrap(), 5);
        drop(device);
        let mut device = ImageFlash::open_image(&path, options.clone()).unwrap();
        let report = device.report_zone(0).unwrap();
        let kept = 4;
        assert_eq!(report.write_pointer, kept, "host_sync {host_sync}: the flushed prefix; page 4 not recorded yet");
        assert_eq!(report.state, flintfs_flash::ZoneState::Closed);
        assert_eq!(read(&mut device, 0, kept).0, flintfs_flash::PageState::Erased);
        assert_eq!(read(&mut device, 0, 3).1, page_bytes(&geometry, PageAddress::new(0, 3), 1).0);
        // The slot of a dropped page is programmed over cleanly.
        program(&mut device, 0, kept, 3);
        device.flush().unwrap();
        assert_eq!(read(&mut device, 0, kept).1, page_bytes(&geometry, PageAddress::new(0, kept), 3).0);
        drop(device);
        let mut device = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
        assert_eq!(device.report_zone(0).unwrap().write_pointer, kept + 1, "host_sync {host_sync}: flushed");
        assert_eq!(read(&mut device, 0, kept).1, page_bytes(&geometry, PageAddress::new(0, kept), 3).0);

        // Enough drained pages for their records: they survive the process.
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("device.img");
        let geometry = Geometry { block_pages: 64, zone_blocks: 4, zone_count: 4, ..small_geometry() };
        let mut device = ImageFlash::create_image(&path, geometry, options.clone()).unwrap();
        let drained = DRAINED_RECORDS_LAG_PAGES as u32;
        for page in 0..drained + 3 {
            program(&mut device, 1, page, 4);
        }
        assert_eq!(device.durable_write_pointer(1).unwrap(), drained);
        drop(device);
        let mut device = ImageFlash::open_image(&path, options).unwrap();
        assert_eq!(device.report_zone(1).unwrap().write_pointer, drained, "host_sync {host_sync}: recorded");
        for page in 0..drained {
            assert_eq!(read(&mut device, 1, page).1, page_bytes(&geometry, PageAddress::new(1, page), 4).0);
        }
    }
}

/// The image backend gathers runs of consecutive slots into one write
/// (`PENDING_SLOTS_MAX` at most): a stretch broken by another zone's page,
/// one longer than the limit, and reads of drained pages between programs
/// all read back as programmed, in the session and after a reopen.
#[test]
fn gathered_page_writes_read_back_in_session_and_after_reopen() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let geometry = Geometry { block_pages: 64, zone_blocks: 4, zone_count: 4, ..small_geometry() };
    let zone_pages = geometry.block_pages * geometry.zone_blocks;
    assert!(zone_pages as usize > 2 * flintfs_flash::PENDING_SLOTS_MAX, "a run longer than one gathered write");
    // A write buffer deep enough that one flush drains stretches longer
    // than a gathered write, broken where the zones take turns.
    let options = DeviceOptions { write_buffer_pages: 200, ..image_options(FaultConfig::none(0)) };
    let mut device = ImageFlash::create_image(&path, geometry, options.clone()).unwrap();
    for page in 0..zone_pages {
        program(&mut device, 2, page, 7);
        // Zones 0 and 1 take turns, so their stretches break at every page.
        if page < 100 {
            program(&mut device, page % 2, page / 2, 5);
        }
        if page % 97 == 0 {
            device.flush().unwrap();
            assert_eq!(read(&mut device, 2, page).1, page_bytes(&geometry, PageAddress::new(2, page), 7).0);
        }
    }
    device.flush().unwrap();
    let check = |device: &mut ImageFlash| {
        for page in 0..zone_pages {
            let (_, data, oob) = read(device, 2, page);
            assert_eq!((data, oob), page_bytes(&geometry, PageAddress::new(2, page), 7), "zone 2 page {page}");
        }
        for page in 0..50 {
            for zone in 0..2 {
                let (_, data, oob) = read(device, zone, page);
                assert_eq!(
                    (data, oob),
                    page_bytes(&geometry, PageAddress::new(zone, page), 5),
                    "zone {zone} page {page}"
                );
            }
        }
    };
    check(&mut device);
    drop(device);
    let mut device = ImageFlash::open_image(&path, options).unwrap();
    assert_eq!(device.report_zone(2).unwrap().write_pointer, zone_pages);
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 50);
    check(&mut device);
}

const CHILD_ENVIRONMENT: &str = "FLINTFS_FLASH_KILL_CHILD_IMAGE";

/// Run only as the child of `killing_the_process_is_a_power_cut`: writes,
/// flushes, writes more and dies without warning.
#[test]
#[ignore = "child process of killing_the_process_is_a_power_cut"]
fn child_writes_then_aborts() {
    let path = std::env::var(CHILD_ENVIRONMENT).expect("run by the parent test");
    let mut device = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
    for page in 0..5 {
        program(&mut device, 1, page, 1);
    }
    device.nvm_write(0, &[0xAB; 16]).unwrap();
    device.nvm_persist(0, 8).unwrap();
    device.flush().unwrap();
    for page in 5..8 {
        program(&mut device, 1, page, 2);
    }
    device.nvm_write(8, &[0xCD; 8]).unwrap();
    std::process::abort();
}

#[test]
fn killing_the_process_is_a_power_cut() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let geometry = small_geometry();
    drop(ImageFlash::create_image(&path, geometry, image_options(FaultConfig::none(0))).unwrap());
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writes_then_aborts", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENVIRONMENT, &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child dies by abort");
    let mut device = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
    let report = device.report_zone(1).unwrap();
    assert_eq!(report.write_pointer, 5, "the flushed prefix survives, nothing after it");
    for page in 0..5 {
        assert_eq!(read(&mut device, 1, page).1, page_bytes(&geometry, PageAddress::new(1, page), 1).0);
    }
    let mut nvm = vec![0; 24];
    device.nvm_read(0, &mut nvm).unwrap();
    assert_eq!(&nvm[..8], &[0xAB; 8], "the persisted word survives");
    assert_eq!(&nvm[8..], &[0; 16], "unpersisted words are lost");
    assert_eq!(device.lifetime_counters().pages_programmed, 5, "counters as of the last flush");
}

#[test]
fn an_image_in_use_or_existing_is_refused() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let device = ImageFlash::create_image(&path, small_geometry(), image_options(FaultConfig::none(0))).unwrap();
    let error = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).err().unwrap();
    assert!(error.to_string().contains("in use by another process"), "{error}");
    drop(device);
    let error = ImageFlash::create_image(&path, small_geometry(), image_options(FaultConfig::none(0))).err().unwrap();
    assert!(matches!(error, DeviceError::Io { operation: "create", .. }), "{error}");
    ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
}

fn fresh_image(directory: &Path) -> std::path::PathBuf {
    let path = directory.join("device.img");
    let mut device = ImageFlash::create_image(&path, small_geometry(), image_options(FaultConfig::none(0))).unwrap();
    for page in 0..3 {
        program(&mut device, 0, page, 1);
    }
    device.flush().unwrap();
    path
}

fn open_error(path: &Path) -> String {
    match ImageFlash::open_image(path, image_options(FaultConfig::none(0))) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(error) => error.to_string(),
    }
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[test]
fn bad_images_get_clear_errors() {
    let directory = tempfile::tempdir().unwrap();
    // Nonexistent.
    let missing = open_error(&directory.path().join("missing.img"));
    assert!(missing.contains("missing.img") && missing.contains("open"), "{missing}");
    // Foreign: a file of other bytes.
    let foreign = directory.path().join("foreign.img");
    std::fs::write(&foreign, vec![0x5A; 64 * 1024]).unwrap();
    assert!(open_error(&foreign).contains("not a flintfs device image"), "{}", open_error(&foreign));
    // Too short to hold a header.
    let tiny = directory.path().join("tiny.img");
    std::fs::write(&tiny, b"FLINTDEV").unwrap();
    assert!(open_error(&tiny).contains("truncated"), "{}", open_error(&tiny));
    // Truncated page area.
    let path = fresh_image(directory.path());
    let length = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(length - 1).unwrap();
    let message = open_error(&path);
    assert!(message.contains("truncated") && message.contains(&length.to_string()), "{message}");
    std::fs::remove_file(&path).unwrap();
    // Another format version in both header copies.
    let path = fresh_image(directory.path());
    patch(&path, 8, &2u32.to_le_bytes());
    patch(&path, HEADER_SLOT_BYTES + 8, &2u32.to_le_bytes());
    let message = open_error(&path);
    assert!(message.contains("version 2") && message.contains("reads version 3"), "{message}");
    std::fs::remove_file(&path).unwrap();
    // A corrupted zone record.
    let path = fresh_image(directory.path());
    let layout = ImageLayout::of(&small_geometry());
    patch(&path, layout.zone_table_offset + 4, &[7]);
    assert!(open_error(&path).contains("zone 0 record checksum mismatch"), "{}", open_error(&path));
    std::fs::remove_file(&path).unwrap();
    // A corrupted block record.
    let path = fresh_image(directory.path());
    patch(&path, layout.block_table_offset + 64 * 3, &[1, 2, 3]);
    assert!(open_error(&path).contains("block 3 record"), "{}", open_error(&path));
}

#[test]
fn one_damaged_header_copy_falls_back_to_the_other() {
    let directory = tempfile::tempdir().unwrap();
    let path = fresh_image(directory.path());
    patch(&path, 100, &[0xEE; 8]); // copy 0
    let mut device = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 3);
    device.flush().unwrap(); // rewrites a copy
    drop(device);
    patch(&path, 100, &[0xEE; 8]);
    patch(&path, HEADER_SLOT_BYTES + 100, &[0xEE; 8]);
    let message = open_error(&path);
    assert!(message.contains("header copy 0") && message.contains("header copy 1"), "{message}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Decoders are total: any bytes give a value or an error.
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000), index in any::<u32>(), entries in 0u32..40) {
        let geometry = small_geometry();
        let _ = ImageHeader::decode(&bytes);
        let _ = decode_zone_record(index, &bytes[..bytes.len().min(32)], &geometry);
        let _ = decode_block_record(u64::from(index), &bytes[..bytes.len().min(64)]);
        let _ = decode_overlay(&bytes, entries, &geometry);
    }

    /// A valid header with random fields changed decodes or is refused.
    #[test]
    fn mutated_headers_never_panic(offset in 0usize..4096, value in any::<u64>()) {
        let geometry = Geometry { nvm_size_bytes: 64, ..small_geometry() };
        let header = ImageHeader {
            generation: 3,
            geometry,
            layout: ImageLayout::of(&geometry),
            overlay_active_slot: 0,
            overlay_entries: 0,
            overlay_bytes: 0,
            overlay_crc: 0,
            clock_ns: 0,
            epoch: 7,
            counters: Counters::default(),
        };
        let mut bytes = header.encode();
        let end = (offset + 8).min(bytes.len());
        bytes[offset..end].copy_from_slice(&value.to_le_bytes()[..end - offset]);
        // With the checksum recomputed, field checks are what must hold.
        let crc = crc32c::crc32c(&bytes[..4092]);
        bytes[4092..].copy_from_slice(&crc.to_le_bytes());
        let _ = ImageHeader::decode(&bytes);
    }
}

/// Corrupting any metadata byte of a real image gives an error at open or a
/// device that still answers every call; never a panic.
#[test]
fn corrupted_image_metadata_never_panics() {
    let directory = tempfile::tempdir().unwrap();
    let pristine = fresh_image(directory.path());
    let original = std::fs::read(&pristine).unwrap();
    let layout = ImageLayout::of(&small_geometry());
    let metadata_end = layout.overlay_slot_offset as usize + 64;
    let corrupt = directory.path().join("corrupt.img");
    let mut refused = 0;
    for (case, offset) in (0..metadata_end).step_by(7).enumerate() {
        let mut bytes = original.clone();
        bytes[offset] ^= 1 << (case % 8);
        std::fs::write(&corrupt, &bytes).unwrap();
        match ImageFlash::open_image(&corrupt, image_options(FaultConfig::none(0))) {
            Err(_) => refused += 1,
            Ok(mut device) => {
                for zone in device.report_zones() {
                    for page in 0..zone.capacity_pages.min(8) {
                        let mut data = vec![0; 512];
                        let mut oob = vec![0; 64];
                        let _ = device.read_page(PageAddress::new(zone.zone, page), &mut data, &mut oob);
                    }
                }
                let _ = device.flush();
            }
        }
    }
    assert!(refused > 0);
}

/// Where the file system under the test directory says the next hole at
/// or after `offset` is (`None` if it cannot say).
fn next_hole(file: &std::fs::File, offset: u64) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a descriptor the test owns; reads are positioned.
    let found = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, libc::SEEK_HOLE) };
    u64::try_from(found).ok()
}

/// Programs `pages` of `zone` with `page_bytes(seed)`, and gives back what
/// each page holds, to be read back after a reopen.
fn program_pages(
    device: &mut ImageFlash,
    geometry: &Geometry,
    zone: u32,
    pages: std::ops::Range<u32>,
    seed: u8,
) -> Vec<(PageAddress, Vec<u8>)> {
    pages
        .map(|page| {
            let address = PageAddress::new(zone, page);
            let (data, oob) = page_bytes(geometry, address, seed);
            device.program_page(address, &data, &oob).unwrap();
            (address, data)
        })
        .collect()
}

#[test]
fn a_sync_allocates_host_blocks_ahead_of_the_written_pages_and_nowhere_else() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    // Zones of 4 MiB of slots: more than IMAGE_ALLOCATE_AHEAD_BYTES.
    let geometry = Geometry { zone_count: 4, zone_blocks: 16, block_pages: 64, ..Geometry::default() };
    let layout = ImageLayout::of(&geometry);
    let slot_bytes = ImageLayout::slot_bytes(&geometry);
    let zone_bytes = geometry.zone_pages() * slot_bytes;
    assert!(zone_bytes > 2 * IMAGE_ALLOCATE_AHEAD_BYTES);
    let zone_start = |zone: u64| layout.page_area_offset + zone * zone_bytes;
    let mut device = ImageFlash::create_image(&path, geometry, image_options(FaultConfig::none(0))).unwrap();
    let probe = std::fs::File::open(&path).unwrap();
    if !device.allocates_ahead() {
        // A copy-on-write or memory file system under the test directory
        // (btrfs, tmpfs): nothing to allocate ahead, and nothing written.
        let programmed = PageAddress::new(1, 0);
        let (data, oob) = page_bytes(&geometry, programmed, 7);
        device.program_page(programmed, &data, &oob).unwrap();
        device.flush().unwrap();
        if next_hole(&probe, zone_start(1)) == Some(zone_start(1)) {
            panic!("zone 1's first slot is a hole after a flush");
        }
        eprintln!("SKIPPED: {} is on a file system it does not allocate ahead on", directory.path().display());
        return;
    }
    if next_hole(&probe, zone_start(2)) != Some(zone_start(2)) {
        // ext4, xfs and tmpfs report holes; say loudly where the check
        // could not run.
        assert!(
            std::env::var_os("FLINTFS_REQUIRE_HOLES").is_none(),
            "the file system under {} does not report holes",
            directory.path().display()
        );
        eprintln!("SKIPPED: the file system under {} does not report holes", directory.path().display());
        return;
    }
    let mut written = program_pages(&mut device, &geometry, 1, 0..3, 7);
    device.flush().unwrap();
    let written_end = zone_start(1) + 3 * slot_bytes;
    let hole = next_hole(&probe, zone_start(1)).unwrap();
    assert!(
        hole >= written_end + IMAGE_ALLOCATE_AHEAD_BYTES,
        "zone 1 has a hole at {hole}, within {IMAGE_ALLOCATE_AHEAD_BYTES} bytes of its last page's end {written_end}"
    );
    assert!(hole < zone_start(2), "only the next {IMAGE_ALLOCATE_AHEAD_BYTES} bytes are allocated, not zone 1's rest");
    for zone in [0, 2, 3] {
        assert_eq!(next_hole(&probe, zone_start(zone)), Some(zone_start(zone)), "unwritten zone {zone} stays a hole");
    }
    // Once the pages pass half the stretch, the next sync allocates further.
    let pages_in_half = (IMAGE_ALLOCATE_AHEAD_BYTES / 2).div_ceil(slot_bytes) as u32;
    written.extend(program_pages(&mut device, &geometry, 1, 3..3 + pages_in_half + 1, 7));
    device.flush().unwrap();
    let written_end = zone_start(1) + u64::from(3 + pages_in_half + 1) * slot_bytes;
    assert!(next_hole(&probe, zone_start(1)).unwrap() >= written_end + IMAGE_ALLOCATE_AHEAD_BYTES);
    // The zeros changed nothing a record counts.
    drop(device);
    let mut reopened = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
    assert_eq!(reopened.report_zone(1).unwrap().write_pointer, 3 + pages_in_half + 1);
    for (address, data) in written {
        assert_eq!(read(&mut reopened, address.zone, address.page).1, data, "page {address:?}");
    }
}

#[test]
fn preallocating_fills_every_hole_and_changes_nothing_written() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let geometry = Geometry { zone_count: 4, zone_blocks: 4, block_pages: 16, ..Geometry::default() };
    let mut device = ImageFlash::create_image(&path, geometry, image_options(FaultConfig::none(0))).unwrap();
    let probe = std::fs::File::open(&path).unwrap();
    let length = probe.metadata().unwrap().len();
    let mut written = program_pages(&mut device, &geometry, 2, 0..5, 11);
    device.flush().unwrap();
    let mut reports = Vec::new();
    device
        .allocate_every_hole(&mut |done, total| {
            assert!(done <= total, "{done} of {total}");
            reports.push(done);
        })
        .unwrap();
    assert_eq!(reports.last().copied(), Some(length), "the last report is the whole image");
    assert!(reports.windows(2).all(|pair| pair[0] < pair[1]), "progress only rises: {reports:?}");
    match next_hole(&probe, 0) {
        // Where the host reports holes, none is left (the end of the file
        // is the implicit hole SEEK_HOLE always finds).
        Some(hole) => assert_eq!(hole, length, "a hole at {hole} of {length}"),
        None => eprintln!("SKIPPED the hole check: the host file system does not report holes"),
    }
    assert_eq!(probe.metadata().unwrap().len(), length, "the image keeps its size");
    // Pages written after it go on as before, and all of it reopens.
    written.extend(program_pages(&mut device, &geometry, 2, 5..6, 11));
    device.flush().unwrap();
    drop(device);
    let mut reopened = ImageFlash::open_image(&path, image_options(FaultConfig::none(0))).unwrap();
    assert_eq!(reopened.report_zone(2).unwrap().write_pointer, 6);
    for zone in [0, 1, 3] {
        assert_eq!(reopened.report_zone(zone).unwrap().write_pointer, 0, "zone {zone} is still empty");
    }
    for (address, data) in written {
        assert_eq!(read(&mut reopened, address.zone, address.page).1, data, "page {address:?}");
    }
}
