//! Device rules and the durability model.

mod common;

use common::*;
use flintfs_flash::{DeviceError, FaultConfig, FlashDevice, Geometry, MemoryFlash, PageAddress, PageState, ZoneState};

#[test]
fn never_written_page_reads_erased_and_says_so() {
    let mut device = memory(small_geometry(), FaultConfig::none(1));
    let (state, data, oob) = read(&mut device, 0, 0);
    assert_eq!(state, PageState::Erased);
    assert!(data.iter().all(|&byte| byte == 0xFF) && oob.iter().all(|&byte| byte == 0xFF));
    program(&mut device, 0, 0, 1);
    let (state, _, _) = read(&mut device, 0, 1);
    assert_eq!(state, PageState::Erased, "a page past the write pointer reads erased");
    let mut oob = vec![0; 64];
    assert_eq!(device.read_oob(PageAddress::new(0, 5), &mut oob).unwrap(), PageState::Erased);
}

#[test]
fn a_prefaulted_device_reads_and_writes_as_a_fresh_one() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    device.prefault_memory();
    // Memory touched, not written: every page still reads erased.
    let (state, data, oob) = read(&mut device, 3, 0);
    assert_eq!(state, PageState::Erased);
    assert!(data.iter().all(|&byte| byte == 0xFF) && oob.iter().all(|&byte| byte == 0xFF));
    program(&mut device, 3, 0, 7);
    device.flush().unwrap();
    let (state, data, _) = read(&mut device, 3, 0);
    assert_eq!(state, PageState::Programmed);
    assert_eq!(data, page_bytes(&geometry, PageAddress::new(3, 0), 7).0);
    let (state, _, _) = read(&mut device, 3, 1);
    assert_eq!(state, PageState::Erased, "a page past the write pointer reads erased");
    assert_eq!(device.counters().pages_programmed, 1, "prefaulting programmed nothing");
}

#[test]
fn programs_go_strictly_in_order_and_errors_name_zone_page_and_write_pointer() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    program(&mut device, 2, 0, 1);
    let (data, oob) = page_bytes(&geometry, PageAddress::new(2, 3), 1);
    let error = device.program_page(PageAddress::new(2, 3), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::NotAtWritePointer { write_pointer: 1, .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("zone 2") && message.contains("page 3") && message.contains("page 1"), "{message}");
    // Rewriting a page already programmed is out of order too.
    let error = device.program_page(PageAddress::new(2, 0), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::NotAtWritePointer { write_pointer: 1, .. }), "{error:?}");
    assert_eq!(error.errno(), flintfs_flash::errno::EINVAL);
}

#[test]
fn a_full_zone_takes_no_program() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    let zone_pages = geometry.zone_pages() as u32;
    for page in 0..zone_pages {
        program(&mut device, 1, page, 3);
    }
    assert_eq!(device.report_zone(1).unwrap().state, ZoneState::Full);
    let (data, oob) = page_bytes(&geometry, PageAddress::new(1, zone_pages), 3);
    let error = device.program_page(PageAddress::new(1, zone_pages), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::OutOfRange { .. }), "page past the zone: {error:?}");
    let error = device.program_page(PageAddress::new(1, zone_pages - 1), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::ZoneFull { capacity_pages: 8, .. }), "{error:?}");
    // A finished zone is full as well.
    program(&mut device, 0, 0, 1);
    device.finish_zone(0).unwrap();
    let error = device.program_page(PageAddress::new(0, 1), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::ZoneFull { .. }), "{error:?}");
}

#[test]
fn opening_more_zones_than_the_maximum_is_refused() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    for zone in 0..geometry.open_zones_max {
        program(&mut device, zone, 0, 1);
    }
    let (data, oob) = page_bytes(&geometry, PageAddress::new(3, 0), 1);
    let error = device.program_page(PageAddress::new(3, 0), &data, &oob).unwrap_err();
    assert!(
        matches!(
            error,
            DeviceError::TooManyOpenZones {
                address: PageAddress { zone: 3, page: 0 },
                open_zones: 3,
                open_zones_max: 3
            }
        ),
        "{error:?}"
    );
    // Finishing a zone closes it for the count; a full zone is not open.
    device.finish_zone(0).unwrap();
    device.program_page(PageAddress::new(3, 0), &data, &oob).unwrap();
    // Filling a zone also frees its slot.
    for page in 1..geometry.zone_pages() as u32 {
        program(&mut device, 3, page, 1);
    }
    program(&mut device, 4, 0, 1);
}

#[test]
fn bad_buffers_and_addresses_get_errors_not_panics() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    let mut short = vec![0; 100];
    let mut oob = vec![0; 64];
    assert!(matches!(
        device.read_page(PageAddress::new(0, 0), &mut short, &mut oob),
        Err(DeviceError::BufferLength { expected: 512, actual: 100, .. })
    ));
    assert!(matches!(
        device.program_page(PageAddress::new(0, 0), &vec![0; 512], &[0; 3]),
        Err(DeviceError::BufferLength { .. })
    ));
    let mut data = vec![0; 512];
    assert!(matches!(
        device.read_page(PageAddress::new(99, 0), &mut data, &mut oob),
        Err(DeviceError::OutOfRange { .. })
    ));
    assert!(matches!(device.reset_zone(6), Err(DeviceError::OutOfRange { .. })));
    assert!(matches!(device.finish_zone(u32::MAX), Err(DeviceError::OutOfRange { .. })));
    assert!(device.report_zone(6).is_err());
    assert!(matches!(device.nvm_write(250, &[0; 8]), Err(DeviceError::OutOfRange { .. })));
    assert!(matches!(device.nvm_persist(u64::MAX, 8), Err(DeviceError::OutOfRange { .. })));
    let mut nvm = [0; 8];
    assert!(device.nvm_read(256, &mut nvm).is_err());
    // Nothing above changed the device.
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 0);
    let bad = Geometry { page_size_bytes: 1000, ..geometry };
    assert!(matches!(MemoryFlash::memory(bad, options(FaultConfig::none(0))), Err(DeviceError::Geometry { .. })));
}

#[test]
fn reset_erases_the_zone_and_counts_wear() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    for page in 0..5 {
        program(&mut device, 0, page, 1);
    }
    device.flush().unwrap();
    device.reset_zone(0).unwrap();
    let report = device.report_zone(0).unwrap();
    assert_eq!((report.state, report.write_pointer, report.erase_count_max), (ZoneState::Empty, 0, 1));
    assert_eq!(read(&mut device, 0, 0).0, PageState::Erased);
    let counters = device.counters();
    assert_eq!((counters.erases, counters.zone_resets), (2, 1), "both blocks of the zone erased once");
    // A zone reset while its pages sit in the write buffer loses them.
    program(&mut device, 0, 0, 2);
    device.reset_zone(0).unwrap();
    device.flush().unwrap();
    assert_eq!(read(&mut device, 0, 0).0, PageState::Erased);
}

#[test]
fn programmed_pages_read_back_from_buffer_and_from_durable_store() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(1));
    program(&mut device, 0, 0, 7);
    let expected = page_bytes(&geometry, PageAddress::new(0, 0), 7);
    let (state, data, oob) = read(&mut device, 0, 0);
    assert_eq!((state, (data, oob)), (PageState::Programmed, expected.clone()));
    assert_eq!(device.buffered_pages(), 1);
    // The memory backend holds a buffered page in its slot (one copy a
    // program): an OOB read of it, and its pristine bytes, come from there.
    let mut oob_only = vec![0; 64];
    device.read_oob(PageAddress::new(0, 0), &mut oob_only).unwrap();
    assert_eq!(oob_only, expected.1);
    assert_eq!(device.pristine_page(PageAddress::new(0, 0)).unwrap(), Some(expected.clone()));
    device.flush().unwrap();
    assert_eq!(device.buffered_pages(), 0);
    let (_, data, oob) = read(&mut device, 0, 0);
    assert_eq!((data, oob.clone()), expected.clone());
    let mut oob_only = vec![0; 64];
    device.read_oob(PageAddress::new(0, 0), &mut oob_only).unwrap();
    assert_eq!(oob_only, expected.1);
    let counters = device.counters();
    assert_eq!((counters.pages_read, counters.oob_reads, counters.pages_programmed), (2, 2, 1));
    assert_eq!((counters.data_bytes_programmed, counters.oob_bytes_programmed, counters.flushes), (512, 64, 1));
    device.reset_counters();
    assert_eq!(device.counters().pages_read, 0);
    assert_eq!(device.lifetime_counters().pages_read, 2);
}

#[test]
fn flush_makes_everything_durable() {
    let geometry = small_geometry();
    for seed in 0..50 {
        let mut device = memory(geometry, FaultConfig::none(seed));
        for zone in 0..3 {
            for page in 0..5 {
                program(&mut device, zone, page, 1);
            }
        }
        device.nvm_write(0, &[9; 64]).unwrap();
        device.nvm_persist(0, 64).unwrap();
        device.flush().unwrap();
        let report = device.power_cut(seed).unwrap();
        assert!(report.torn_pages.is_empty() && report.zones.is_empty(), "seed {seed}: {report:?}");
        for zone in 0..3 {
            assert_eq!(device.report_zone(zone).unwrap().write_pointer, 5, "seed {seed}");
            for page in 0..5 {
                let (_, data, oob) = read(&mut device, zone, page);
                assert_eq!((data, oob), page_bytes(&geometry, PageAddress::new(zone, page), 1), "seed {seed}");
            }
        }
        let mut nvm = [0; 64];
        device.nvm_read(0, &mut nvm).unwrap();
        assert_eq!(nvm, [9; 64], "seed {seed}");
    }
}

#[test]
fn power_cut_keeps_a_prefix_per_zone_between_durable_and_accepted() {
    let geometry = small_geometry();
    let mut prefixes_seen = std::collections::BTreeSet::new();
    let mut torn_seen = 0;
    for seed in 0..200 {
        let mut device = memory(geometry, FaultConfig::none(seed));
        for page in 0..3 {
            program(&mut device, 0, page, 1);
            program(&mut device, 1, page, 1);
        }
        device.flush().unwrap();
        for page in 3..8 {
            program(&mut device, 0, page, 2);
        }
        program(&mut device, 1, 3, 2);
        let report = device.power_cut(seed).unwrap();
        for cut in &report.zones {
            let zone_report = device.report_zone(cut.zone).unwrap();
            assert_eq!(zone_report.write_pointer, cut.durable_after, "seed {seed}");
            assert_eq!(device.durable_write_pointer(cut.zone).unwrap(), cut.durable_after);
            assert_eq!(cut.durable_before, 3, "seed {seed}");
            assert!(cut.durable_after >= cut.durable_before && cut.durable_after <= cut.accepted, "seed {seed}");
            assert_ne!(zone_report.state, ZoneState::Open, "no zone is open after power-up");
            if cut.zone == 0 {
                prefixes_seen.insert(cut.durable_after);
            }
            // Every page below the write pointer holds what was programmed
            // (pristine), and reads back so unless it is the torn one.
            for page in 0..cut.durable_after {
                let address = PageAddress::new(cut.zone, page);
                let tag = if page < 3 { 1 } else { 2 };
                let expected = page_bytes(&geometry, address, tag);
                let (data, oob) = device.pristine_page(address).unwrap().expect("below the write pointer");
                assert_eq!((data, oob), expected.clone(), "seed {seed} {address}");
                let (_, data, oob) = read(&mut device, cut.zone, page);
                if report.torn_pages.contains(&address) {
                    assert_eq!(page + 1, cut.durable_after, "only the last durable page can be torn");
                    assert_ne!((data, oob), expected, "a torn page reads back damaged");
                    torn_seen += 1;
                } else {
                    assert_eq!((data, oob), expected, "seed {seed} {address}");
                }
            }
            for page in cut.durable_after..8 {
                assert_eq!(read(&mut device, cut.zone, page).0, PageState::Erased);
            }
        }
        // The device is usable again: the next program goes at the durable
        // write pointer.
        let write_pointer = device.report_zone(0).unwrap().write_pointer;
        if write_pointer < 8 {
            program(&mut device, 0, write_pointer, 3);
        }
    }
    assert_eq!(prefixes_seen.len(), 6, "every prefix 3..=8 occurs over 200 seeds: {prefixes_seen:?}");
    assert!(torn_seen > 10, "torn pages occur: {torn_seen}");
}

#[test]
fn the_same_cut_seed_gives_the_same_outcome() {
    let geometry = small_geometry();
    let run = |seed: u64| {
        let mut device = memory(geometry, FaultConfig::none(0));
        for zone in 0..3 {
            for page in 0..6 {
                program(&mut device, zone, page, 1);
            }
        }
        device.nvm_write(0, &[1; 256]).unwrap();
        let report = device.power_cut(seed).unwrap();
        let mut nvm = vec![0; 256];
        device.nvm_read(0, &mut nvm).unwrap();
        (report, nvm, device.report_zones())
    };
    assert_eq!(run(42), run(42));
    assert!((0..20).any(|seed| run(seed) != run(42)), "different seeds differ");
}

#[test]
fn the_write_buffer_is_bounded_and_drains_oldest_first() {
    let geometry = small_geometry();
    let mut device = MemoryFlash::memory(
        geometry,
        flintfs_flash::DeviceOptions { write_buffer_pages: 4, ..options(FaultConfig::none(0)) },
    )
    .unwrap();
    for page in 0..8 {
        program(&mut device, 0, page, 1);
    }
    assert_eq!(device.buffered_pages(), 4);
    assert_eq!(device.durable_write_pointer(0).unwrap(), 4);
    let report = device.power_cut(3).unwrap();
    assert!(device.report_zone(0).unwrap().write_pointer >= 4, "{report:?}");
}

#[test]
fn nvm_words_are_kept_or_dropped_whole() {
    let geometry = small_geometry();
    let mut kept_and_dropped = (0, 0);
    for seed in 0..40 {
        let mut device = memory(geometry, FaultConfig::none(0));
        device.nvm_write(0, &[0x11; 256]).unwrap();
        device.nvm_persist(0, 256).unwrap();
        device.nvm_write(8, &[0x22; 64]).unwrap();
        device.nvm_persist(8, 16).unwrap(); // words 1 and 2 durable
        let report = device.power_cut(seed).unwrap();
        assert_eq!(report.nvm_words_kept + report.nvm_words_dropped, 6, "words 3..9 were unpersisted");
        kept_and_dropped.0 += report.nvm_words_kept;
        kept_and_dropped.1 += report.nvm_words_dropped;
        let mut nvm = vec![0; 256];
        device.nvm_read(0, &mut nvm).unwrap();
        assert_eq!(&nvm[..8], &[0x11; 8]);
        assert_eq!(&nvm[8..24], &[0x22; 16], "persisted words survive");
        for word in nvm[24..72].chunks(8) {
            assert!(word == [0x11; 8] || word == [0x22; 8], "seed {seed}: a word is never torn: {word:?}");
        }
        assert_eq!(&nvm[72..], &[0x11; 184][..]);
    }
    assert!(kept_and_dropped.0 > 0 && kept_and_dropped.1 > 0, "{kept_and_dropped:?}");
}

#[test]
fn a_scheduled_cut_fires_in_the_named_operation_and_keeps_the_device_off() {
    let geometry = small_geometry();
    let workload = |device: &mut MemoryFlash| -> flintfs_flash::Result<()> {
        for page in 0..4 {
            let (data, oob) = page_bytes(&geometry, PageAddress::new(0, page), 1);
            device.program_page(PageAddress::new(0, page), &data, &oob)?;
        }
        device.flush()?;
        device.reset_zone(0)?;
        let (data, oob) = page_bytes(&geometry, PageAddress::new(0, 0), 2);
        device.program_page(PageAddress::new(0, 0), &data, &oob)?;
        device.nvm_write(0, &[5; 16])?;
        device.nvm_persist(0, 16)?;
        device.flush()
    };
    let mut probe = memory(geometry, FaultConfig::none(0));
    workload(&mut probe).unwrap();
    let operations = probe.mutating_operations();
    assert_eq!(operations, 10);
    for operation in 0..operations {
        for seed in 0..8 {
            let faults = FaultConfig { interrupted_erase_probability: 0.5, ..FaultConfig::none(0) };
            let mut device = memory(geometry, faults);
            device.schedule_power_cut(operation, seed).unwrap();
            let error = workload(&mut device).unwrap_err();
            assert!(matches!(error, DeviceError::PowerLost { .. }), "op {operation}: {error:?}");
            assert!(device.is_powered_off());
            assert!(matches!(device.flush(), Err(DeviceError::PowerLost { .. })));
            let mut data = vec![0; 512];
            let mut oob = vec![0; 64];
            assert!(device.read_page(PageAddress::new(0, 0), &mut data, &mut oob).is_err());
            let report = device.power_on().expect("a report of the cut");
            let zone = device.report_zone(0).unwrap();
            // Before the first flush returns, any prefix; once it returned,
            // all four pages unless the reset happened (fully or half).
            if operation >= 5 && report.interrupted_erase.is_none() && zone.erase_count_max == 0 {
                assert_eq!(zone.write_pointer, 4, "op {operation} seed {seed}");
            }
            if let Some(erased) = report.interrupted_erase {
                assert_eq!((operation, erased), (5, 0));
                assert_eq!(zone.erase_count_max, 1, "an interrupted erase still wears the block");
                assert!(device.blocks()[0].interrupted_erase_seed.is_some());
                let (state, data, _) = read(&mut device, 0, 0);
                assert_eq!(state, PageState::Programmed);
                assert_ne!(data, page_bytes(&geometry, PageAddress::new(0, 0), 1).0, "half-erased garbage");
                // A complete erase makes the block whole again.
                device.reset_zone(0).unwrap();
                assert!(device.blocks()[0].interrupted_erase_seed.is_none());
            }
        }
    }
}

#[test]
fn dies_follow_erase_blocks_round_robin_and_two_programs_on_one_die_queue() {
    let geometry = Geometry::default();
    let device = MemoryFlash::memory(geometry, flintfs_flash::DeviceOptions::default()).unwrap();
    let dies = device.die_count();
    assert_eq!(dies, 32, "8 channels of 4 dies");
    // A zone's blocks sit on consecutive dies; a block's pages on one.
    let block = |zone: u32, block: u32| PageAddress::new(zone, block * geometry.block_pages);
    assert_eq!(device.die_of(block(0, 0)), Some(0));
    assert_eq!(device.die_of(PageAddress::new(0, geometry.block_pages - 1)), Some(0));
    assert_eq!(device.die_of(block(0, 1)), Some(1));
    assert_eq!(device.die_of(block(1, 0)), Some(geometry.zone_blocks % dies));
    assert_eq!(device.die_of(PageAddress::new(0, geometry.zone_pages() as u32)), None);
    assert_eq!(device.die_of(PageAddress::new(geometry.zone_count, 0)), None);
    // The reason the engine asks: two pages and a flush take about one
    // program on two dies, and two programs on one.
    let program_and_flush = |second: PageAddress| {
        let mut device = MemoryFlash::memory(geometry, flintfs_flash::DeviceOptions::default()).unwrap();
        let page = vec![0u8; geometry.page_size_bytes as usize];
        let oob = vec![0u8; geometry.oob_size_bytes as usize];
        let started = device.now_ns();
        device.program_page(PageAddress::new(0, 0), &page, &oob).unwrap();
        device.program_page(second, &page, &oob).unwrap();
        device.flush().unwrap();
        device.now_ns() - started
    };
    let apart = program_and_flush(PageAddress::new(1, 0));
    let together = program_and_flush(PageAddress::new(0, 1));
    assert!(together > apart + 500_000, "one die {together} ns, two dies {apart} ns");
}
