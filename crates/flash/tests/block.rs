//! The block backend on a regular file: write pointers found again from
//! the slots' trailers, resets that make stale slots stop counting, full
//! zones that open without a scan, and damaged or foreign layouts refused.

use std::os::unix::fs::FileExt;

use flintfs_flash::{BlockCreate, BlockFlash, FlashDevice, Geometry, PageAddress, PageState, ZoneState};

fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 128,
        block_pages: 8,
        zone_blocks: 2,
        zone_count: 0,
        open_zones_max: 4,
        nvm_size_bytes: 0,
    }
}

fn page(zone: u32, page: u32) -> (Vec<u8>, Vec<u8>) {
    let data = (0..4096u32).map(|index| (index as u8) ^ (page as u8).wrapping_mul(31) ^ zone as u8).collect();
    let oob = vec![(zone * 100 + page) as u8; 128];
    (data, oob)
}

fn program(device: &mut BlockFlash, zone: u32, pages: std::ops::Range<u32>) {
    for index in pages {
        let (data, oob) = page(zone, index);
        device.program_page(PageAddress::new(zone, index), &data, &oob).unwrap();
    }
}

fn made(path: &std::path::Path) -> BlockFlash {
    BlockFlash::create(path, geometry(), BlockCreate { size_bytes: Some(8 << 20), nonce: 0x5eed }).unwrap()
}

#[test]
fn write_pointers_come_back_from_the_trailers() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let mut device = made(&path);
    let zone_count = device.geometry().zone_count;
    assert!(zone_count >= 8, "8 MiB holds {zone_count} zones of 64 KiB slots");
    program(&mut device, 0, 0..5);
    program(&mut device, 1, 0..16);
    program(&mut device, 2, 0..1);
    device.flush().unwrap();
    device.close().unwrap();

    let mut device = BlockFlash::open(&path).unwrap();
    let pointers: Vec<u32> = device.report_zones().iter().map(|zone| zone.write_pointer).collect();
    assert_eq!(&pointers[..4], [5, 16, 1, 0]);
    assert_eq!(device.report_zone(1).unwrap().state, ZoneState::Full);
    assert_eq!(device.report_zone(0).unwrap().state, ZoneState::Closed);
    // Zone 1 was marked full at the flush, and the zones never used are
    // marked so: open read none of their slots. Zones 0 and 2 cost their
    // pages and one more.
    assert_eq!(device.open_pages_read, 6 + 2);
    let (mut data, mut oob) = (vec![0u8; 4096], vec![0u8; 128]);
    for index in 0..5 {
        assert_eq!(device.read_page(PageAddress::new(0, index), &mut data, &mut oob).unwrap(), PageState::Programmed);
        assert_eq!((data.clone(), oob.clone()), page(0, index));
    }
    assert_eq!(device.read_page(PageAddress::new(0, 5), &mut data, &mut oob).unwrap(), PageState::Erased);
    assert!(data.iter().all(|&byte| byte == 0xFF));
    // Programs go on at the write pointer, and only there.
    assert!(device.program_page(PageAddress::new(0, 7), &data, &oob).is_err());
    program(&mut device, 0, 5..6);
    assert!(device.program_page(PageAddress::new(1, 0), &data, &oob).is_err(), "a full zone takes no program");
}

#[test]
fn a_reset_makes_the_old_slots_stop_counting() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let mut device = made(&path);
    program(&mut device, 3, 0..10);
    device.reset_zone(3).unwrap();
    assert_eq!(device.report_zone(3).unwrap().write_pointer, 0);
    program(&mut device, 3, 0..2);
    device.flush().unwrap();
    drop(device);
    // Slots 2..10 of the zone's last life are still on the file: they do
    // not count, because their generation is the old one.
    let device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.report_zone(3).unwrap().write_pointer, 2);
    assert_eq!(device.report_zone(3).unwrap().erase_count_max, 1);
}

#[test]
fn a_zone_first_used_after_the_last_flush_reads_as_empty() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let mut device = made(&path);
    program(&mut device, 0, 0..3);
    device.flush().unwrap();
    // Zone 4's first pages, never flushed: a crash may drop them, and the
    // zone's in-use mark never reached the table, so open reads it empty.
    program(&mut device, 0, 3..4);
    program(&mut device, 4, 0..2);
    drop(device);
    let mut device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.report_zone(4).unwrap().write_pointer, 0);
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 4, "a used zone is scanned to its end");
    program(&mut device, 4, 0..1);
}

#[test]
fn a_slot_that_did_not_land_ends_the_prefix() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let mut device = made(&path);
    program(&mut device, 0, 0..8);
    device.flush().unwrap();
    let layout = device.layout();
    drop(device);
    // Slot 3's trailer never reached the device (say the write was lost):
    // the zone's durable prefix is three pages, and slots 4..8 are
    // garbage to be written over.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let slot_end = layout.data_offset + 4 * layout.slot_bytes;
    file.write_all_at(&[0u8; 32], slot_end - 32).unwrap();
    drop(file);
    let mut device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 3);
    program(&mut device, 0, 3..4);
    device.flush().unwrap();
    drop(device);
    // Slots 4..8 still hold whole trailers of the zone's generation, from
    // the session before the open that ended the prefix at 3. They must
    // not count now that slot 3 is whole again: the file system never
    // wrote them in this session (and its recovery discarded them).
    let mut device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 4, "stale slots past a lowered write pointer");
    let (mut data, mut oob) = (vec![0u8; 4096], vec![0u8; 128]);
    assert_eq!(device.read_page(PageAddress::new(0, 4), &mut data, &mut oob).unwrap(), PageState::Erased);
}

#[test]
fn damaged_or_foreign_layouts_are_refused_or_survived() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let mut device = made(&path);
    program(&mut device, 0, 0..16);
    device.flush().unwrap();
    let layout = device.layout();
    drop(device);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Header copy A and zone-table copy A damaged: copies B answer. The
    // CLI's probe looks at copy A only (another tool may have written over
    // it), so such a device is opened by name, not recognised.
    file.write_all_at(&[0xAB; 64], 0).unwrap();
    file.write_all_at(&[0xAB; 512], layout.table_offset).unwrap();
    drop(file);
    assert!(!BlockFlash::probe(&path));
    let device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 16);
    drop(device);
    // Open wrote both copies with its epoch: copy A of a higher epoch than
    // a copy B left behind wins.
    let mut header_b = vec![0u8; 4096];
    std::fs::File::open(&path).unwrap().read_exact_at(&mut header_b, 4096).unwrap();
    let epoch_b = flintfs_flash::decode_block_header(&header_b).unwrap().epoch;
    drop(BlockFlash::open(&path).unwrap());
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&header_b, 4096).unwrap();
    drop(file);
    drop(BlockFlash::open(&path).unwrap());
    let mut header_a = vec![0u8; 4096];
    std::fs::File::open(&path).unwrap().read_exact_at(&mut header_a, 0).unwrap();
    assert_eq!(flintfs_flash::decode_block_header(&header_a).unwrap().epoch, epoch_b + 2);
    // Version 1 (no epochs in its slots) in both copies: refused by name.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for copy in 0..2u64 {
        file.write_all_at(&1u32.to_le_bytes(), copy * 4096 + 8).unwrap();
    }
    drop(file);
    let error = BlockFlash::open(&path).err().expect("refused").to_string();
    assert!(error.contains("block layout version 1") && error.contains("reads version 2"), "{error}");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for copy in 0..2u64 {
        file.write_all_at(&2u32.to_le_bytes(), copy * 4096 + 8).unwrap();
    }
    drop(file);
    // Both copies of zone 0's record damaged: refused, with the zone named.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0xAB; 512], layout.table_offset + layout.table_bytes).unwrap();
    drop(file);
    let error = BlockFlash::open(&path).err().expect("refused").to_string();
    assert!(error.contains("zone 0: both zone-table records are damaged"), "{error}");
    // Another version, and a truncated device.
    let other = directory.path().join("other");
    drop(made(&other));
    let file = std::fs::OpenOptions::new().write(true).open(&other).unwrap();
    file.set_len(1 << 20).unwrap();
    drop(file);
    let error = BlockFlash::open(&other).err().expect("refused").to_string();
    assert!(error.contains("truncated"), "{error}");
    assert!(!BlockFlash::probe(&directory.path().join("missing")));
    let text = directory.path().join("text");
    std::fs::write(&text, vec![b'x'; 16384]).unwrap();
    assert!(!BlockFlash::probe(&text));
    let error = BlockFlash::open(&text).err().expect("refused").to_string();
    assert!(error.contains("not a flintfs block device"), "{error}");
}

#[test]
fn lifetime_counters_outlive_a_close() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let mut device = made(&path);
    program(&mut device, 0, 0..5);
    device.reset_counters();
    program(&mut device, 0, 5..7);
    assert_eq!(device.counters().pages_programmed, 2, "counters since the reset");
    assert_eq!(device.lifetime_counters().pages_programmed, 7, "the whole life");
    device.close().unwrap();
    let mut device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.lifetime_counters().pages_programmed, 7);
    program(&mut device, 0, 7..8);
    // Killed without a close: the counts since the last close are lost.
    drop(device);
    let device = BlockFlash::open(&path).unwrap();
    assert_eq!(device.lifetime_counters().pages_programmed, 7);
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 8, "the data is not");
}

#[test]
fn a_second_opener_is_refused() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let device = made(&path);
    let error = BlockFlash::open(&path).err().expect("refused").to_string();
    assert!(error.contains("in use"), "{error}");
    drop(device);
    BlockFlash::open(&path).unwrap();
}

/// Programs are gathered, consecutive slots of one zone at a time, and
/// written in one write: a stretch longer than one gathered write, broken
/// by another zone's pages, read back before and after a flush and a
/// reopen; a reset drops what its zone had gathered; a finish writes it
/// before the zone is marked full.
#[test]
fn gathered_programs_read_back_and_survive_a_flush() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let geometry = Geometry { block_pages: 64, zone_blocks: 2, ..geometry() };
    let zone_pages = (geometry.block_pages * geometry.zone_blocks) as usize;
    assert!(zone_pages > flintfs_flash::BLOCK_PENDING_SLOTS_MAX, "a stretch longer than one gathered write");
    let mut device =
        BlockFlash::create(&path, geometry, BlockCreate { size_bytes: Some(16 << 20), nonce: 0x5eed }).unwrap();
    let read = |device: &mut BlockFlash, zone: u32, index: u32| {
        let (mut data, mut oob) = (vec![0u8; 4096], vec![0u8; 128]);
        assert_eq!(
            device.read_page(PageAddress::new(zone, index), &mut data, &mut oob).unwrap(),
            PageState::Programmed
        );
        let mut spare = vec![0u8; 128];
        device.read_oob(PageAddress::new(zone, index), &mut spare).unwrap();
        assert_eq!(spare, oob, "zone {zone} page {index}: the spare area alone reads as with the page");
        (data, oob)
    };
    for index in 0..100 {
        program(&mut device, 0, index..index + 1);
        if index % 10 == 9 {
            program(&mut device, 1, index / 10..index / 10 + 1);
        }
        // The page just programmed (gathered) and one long written.
        assert_eq!(read(&mut device, 0, index), page(0, index));
        assert_eq!(read(&mut device, 0, index / 2), page(0, index / 2));
    }
    // Zone 2: gathered, then reset; what it gathered is gone.
    program(&mut device, 2, 0..3);
    device.reset_zone(2).unwrap();
    program(&mut device, 2, 0..1);
    // Zone 1 finished with pages still gathered.
    program(&mut device, 1, 10..12);
    device.finish_zone(1).unwrap();
    device.flush().unwrap();
    drop(device);

    let mut device = BlockFlash::open(&path).unwrap();
    let pointers: Vec<u32> = (0..3).map(|zone| device.report_zone(zone).unwrap().write_pointer).collect();
    assert_eq!(pointers, [100, 12, 1]);
    assert_eq!(device.report_zone(1).unwrap().state, ZoneState::Full);
    for index in 0..100 {
        assert_eq!(read(&mut device, 0, index), page(0, index));
    }
    for index in 0..12 {
        assert_eq!(read(&mut device, 1, index), page(1, index));
    }
    assert_eq!(read(&mut device, 2, 0), page(2, 0));
}

/// A reset writes the table sector its zone shares with 15 others, from
/// memory: a neighbour written to its end, its last pages still gathered,
/// is marked full there. Those pages must reach the device first, or a
/// crash leaves a zone the table calls full whose last pages were never
/// written. The crash is the device file copied while the device is open.
#[test]
fn a_reset_never_marks_a_neighbour_full_ahead_of_its_gathered_pages() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device");
    let geometry = Geometry { block_pages: 64, zone_blocks: 2, ..geometry() };
    let zone_pages = geometry.block_pages * geometry.zone_blocks;
    let mut device =
        BlockFlash::create(&path, geometry, BlockCreate { size_bytes: Some(16 << 20), nonce: 0x5eed }).unwrap();
    program(&mut device, 4, 0..2);
    device.flush().unwrap();
    // Zone 3 to its end: full in memory, its last pages gathered.
    program(&mut device, 3, 0..zone_pages);
    assert_eq!(device.report_zone(3).unwrap().state, ZoneState::Full);
    device.reset_zone(4).unwrap();
    let crashed = directory.path().join("crashed");
    std::fs::copy(&path, &crashed).unwrap();
    let mut device = BlockFlash::open(&crashed).unwrap();
    let report = device.report_zone(3).unwrap();
    if report.state == ZoneState::Full {
        for index in 0..zone_pages {
            let (mut data, mut oob) = (vec![0u8; 4096], vec![0u8; 128]);
            device.read_page(PageAddress::new(3, index), &mut data, &mut oob).unwrap();
            assert!((data, oob) == page(3, index), "page {index} of a zone marked full reads wrong");
        }
    }
}
