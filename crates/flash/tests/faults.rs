//! Every fault mode: what it does, that the pristine data stays apart, and
//! that the same seed gives the same faults.

mod common;

use common::*;
use flintfs_flash::{
    BitErrorModel, CellType, Counters, DeviceError, FaultConfig, FlashDevice, Geometry, MemoryFlash, PageAddress,
    PageFault, PageState, ZoneState,
};

fn fill_and_flush(device: &mut MemoryFlash, zones: u32, pages: u32) {
    for zone in 0..zones {
        for page in 0..pages {
            program(device, zone, page, 1);
        }
        device.flush().unwrap();
        device.finish_zone(zone).unwrap();
    }
}

fn noisy(seed: u64) -> FaultConfig {
    FaultConfig {
        bit_errors: Some(BitErrorModel { fresh_rate: 1e-4, ..BitErrorModel::mlc() }),
        read_failure_probability: 0.05,
        program_failure_probability_at_endurance: 0.2,
        erase_failure_probability_at_endurance: 0.2,
        endurance_cycles: 2,
        failure_growth_exponent: 1.0,
        misdirected_write_probability: 0.05,
        factory_bad_block_fraction: 0.1,
        ..FaultConfig::none(seed)
    }
}

/// Runs a fixed workload and returns everything observable.
fn observe(seed: u64) -> (Vec<String>, Counters) {
    let geometry = Geometry { zone_count: 12, open_zones_max: 12, ..small_geometry() };
    let mut device = MemoryFlash::memory(geometry, options(noisy(seed))).unwrap();
    let mut log = Vec::new();
    for round in 0..6u8 {
        for zone in 0..geometry.zone_count {
            let write_pointer = match device.report_zone(zone) {
                Ok(report) if report.state != ZoneState::Offline => report.write_pointer,
                _ => continue,
            };
            let address = PageAddress::new(zone, write_pointer);
            let (data, oob) = page_bytes(&geometry, address, round);
            log.push(format!("{address} program {:?}", device.program_page(address, &data, &oob).err()));
            let mut read_data = vec![0; 512];
            let mut read_oob = vec![0; 64];
            let result = device.read_page(PageAddress::new(zone, 0), &mut read_data, &mut read_oob);
            log.push(format!("{zone} read {:?} {:x}", result.map_err(|error| error.to_string()), crc32(&read_data)));
            if round % 3 == 2 {
                log.push(format!("{zone} reset {:?}", device.reset_zone(zone).err().map(|error| error.to_string())));
            }
        }
        log.push(format!("flush {:?}", device.flush().err()));
    }
    (log, device.counters())
}

fn crc32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0u32, |hash, &byte| hash.rotate_left(5) ^ u32::from(byte))
}

#[test]
fn the_same_seed_gives_the_same_faults() {
    let (first_log, first_counters) = observe(7);
    let (second_log, second_counters) = observe(7);
    assert_eq!(first_log, second_log);
    assert_eq!(first_counters, second_counters);
    // And the workload really met faults of every runtime kind.
    assert!(first_counters.bit_flips_injected > 0, "{first_counters:?}");
    assert!(first_counters.read_failures_injected > 0, "{first_counters:?}");
    assert!(first_counters.misdirected_writes_injected > 0, "{first_counters:?}");
    assert!(first_counters.program_failures_injected + first_counters.erase_failures_injected > 0);
    let (other_log, _) = observe(8);
    assert_ne!(first_log, other_log, "another seed gives other faults");
}

#[test]
fn bit_flips_are_transient_and_follow_the_rate() {
    let geometry = small_geometry();
    let rate = 1e-3;
    let faults = FaultConfig {
        bit_errors: Some(BitErrorModel {
            fresh_rate: rate,
            wear_rate_at_endurance: 0.0,
            read_disturb_rate_per_read: 0.0,
            ..BitErrorModel::mlc()
        }),
        ..FaultConfig::none(3)
    };
    let mut device = memory(geometry, faults);
    fill_and_flush(&mut device, 1, 8);
    let expected = page_bytes(&geometry, PageAddress::new(0, 0), 1);
    let reads = 2000u64;
    let mut flipped_bits = 0u64;
    for _ in 0..reads {
        let (_, data, oob) = read(&mut device, 0, 0);
        flipped_bits += data
            .iter()
            .chain(&oob)
            .zip(expected.0.iter().chain(&expected.1))
            .map(|(got, want)| u64::from((got ^ want).count_ones()))
            .sum::<u64>();
    }
    let bits = reads * (512 + 64) * 8;
    let observed = flipped_bits as f64 / bits as f64;
    assert!((observed - rate).abs() < rate * 0.1, "observed rate {observed}, configured {rate}");
    assert_eq!(device.counters().bit_flips_injected, flipped_bits);
    // The pristine data and the medium are untouched: flips happen on read.
    let pristine = device.pristine_page(PageAddress::new(0, 0)).unwrap().unwrap();
    assert_eq!(pristine, expected);
    assert_eq!(device.media_page(PageAddress::new(0, 0)).unwrap().unwrap(), expected);
}

#[test]
fn wear_retention_and_read_disturb_raise_the_error_rate() {
    let geometry = small_geometry();
    let faults = FaultConfig { endurance_cycles: 20, ..FaultConfig::preset(CellType::Mlc, 5) };
    let faults = FaultConfig { factory_bad_block_fraction: 0.0, paired_page_distance: 0, ..faults };
    let model = faults.bit_errors.unwrap();
    let flips_over = |device: &mut MemoryFlash, reads: u32| {
        let before = device.counters().bit_flips_injected;
        for _ in 0..reads {
            let mut data = vec![0; 512];
            let mut oob = vec![0; 64];
            let _ = device.read_page(PageAddress::new(0, 0), &mut data, &mut oob);
        }
        device.counters().bit_flips_injected - before
    };
    // Fresh: about 1e-8 per bit, nothing in a few thousand reads.
    let mut device = memory(geometry, faults.clone());
    fill_and_flush(&mut device, 1, 8);
    assert_eq!(flips_over(&mut device, 2_000), 0);
    // Worn to endurance and aged two years: the model's rate is far higher.
    let mut worn = memory(geometry, faults.clone());
    for _ in 0..20 {
        worn.reset_zone(0).unwrap();
    }
    fill_and_flush(&mut worn, 1, 8);
    worn.advance_time(2 * 365 * 24 * 3600 * 1_000_000_000);
    let worn_flips = flips_over(&mut worn, 2_000);
    let two_years = 2 * 365 * 24 * 3600 * 1_000_000_000u64;
    let expected_rate = model.rate(20, 20, two_years, 1_000);
    let expected_flips = expected_rate * 2_000.0 * 576.0 * 8.0;
    assert!(
        worn_flips as f64 > expected_flips * 0.5 && (worn_flips as f64) < expected_flips * 1.5,
        "worn flips {worn_flips}, expected about {expected_flips}"
    );
    assert!(worn.blocks()[0].reads_since_erase >= 2_000, "read disturb counts reads");
    // Read disturb alone: many reads raise the rate of the same block.
    let disturbed =
        FaultConfig { bit_errors: Some(BitErrorModel { read_disturb_rate_per_read: 1e-7, ..model }), ..faults.clone() };
    let mut device = memory(geometry, disturbed);
    fill_and_flush(&mut device, 1, 8);
    let early = flips_over(&mut device, 1_000);
    flips_over(&mut device, 50_000);
    let late = flips_over(&mut device, 1_000);
    assert!(late > early * 5 + 5, "read disturb: early {early}, late {late}");
    // An erase clears the read count.
    device.reset_zone(0).unwrap();
    assert_eq!(device.blocks()[0].reads_since_erase, 0);
}

#[test]
fn whole_page_read_failures_name_the_page() {
    let geometry = small_geometry();
    let faults = FaultConfig { read_failure_probability: 1.0, ..FaultConfig::none(1) };
    let mut device = memory(geometry, faults);
    program(&mut device, 1, 0, 1);
    // Served from the write buffer: no medium read, no failure.
    assert_eq!(read(&mut device, 1, 0).0, PageState::Programmed);
    device.flush().unwrap();
    let mut data = vec![0; 512];
    let mut oob = vec![0; 64];
    let error = device.read_page(PageAddress::new(1, 0), &mut data, &mut oob).unwrap_err();
    assert!(matches!(error, DeviceError::ReadFailed { address: PageAddress { zone: 1, page: 0 }, .. }));
    assert!(error.is_media_failure() && error.to_string().contains("zone 1 page 0"));
    assert_eq!(error.errno(), flintfs_flash::errno::EIO);
    assert!(device.read_oob(PageAddress::new(1, 0), &mut oob).is_err());
    assert_eq!(device.counters().read_failures_injected, 2);
    // Erased pages are not sensed and cannot fail.
    assert_eq!(read(&mut device, 1, 5).0, PageState::Erased);
}

#[test]
fn a_program_failure_grows_a_bad_block_and_retires_it_at_reset() {
    let geometry = small_geometry();
    let faults = FaultConfig {
        program_failure_probability_at_endurance: 1.0,
        failure_growth_exponent: 0.0,
        ..FaultConfig::none(1)
    };
    let mut device = memory(geometry, faults);
    let (data, oob) = page_bytes(&geometry, PageAddress::new(0, 0), 1);
    let error = device.program_page(PageAddress::new(0, 0), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::ProgramFailed { block: 0, .. }), "{error:?}");
    let report = device.report_zone(0).unwrap();
    assert_eq!((report.state, report.bad_blocks, report.write_pointer), (ZoneState::ReadOnly, 1, 0));
    let error = device.program_page(PageAddress::new(0, 0), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::ZoneState { zone: 0, state: "read-only", .. }), "{error:?}");
    device.reset_zone(0).unwrap();
    let report = device.report_zone(0).unwrap();
    assert_eq!((report.state, report.capacity_pages), (ZoneState::Empty, 4), "one of two blocks retired");
    assert!(device.blocks()[0].excluded && device.blocks()[0].bad);
}

#[test]
fn a_program_failure_keeps_earlier_pages_readable() {
    let geometry = small_geometry();
    let faults = |seed| FaultConfig {
        program_failure_probability_at_endurance: 0.3,
        failure_growth_exponent: 0.0,
        ..FaultConfig::none(seed)
    };
    for seed in 0..100 {
        let mut device = memory(geometry, faults(seed));
        let mut written = 0;
        let failure = loop {
            let address = PageAddress::new(0, written);
            let (data, oob) = page_bytes(&geometry, address, 1);
            match device.program_page(address, &data, &oob) {
                Ok(()) if written + 1 < 8 => written += 1,
                Ok(()) => break None,
                Err(error) => break Some(error),
            }
        };
        let Some(error) = failure else { continue };
        if written < 2 {
            continue;
        }
        assert!(matches!(error, DeviceError::ProgramFailed { .. }), "{error:?}");
        assert_eq!(device.report_zone(0).unwrap().state, ZoneState::ReadOnly);
        device.flush().unwrap();
        for page in 0..written {
            let (state, data, oob) = read(&mut device, 0, page);
            assert_eq!(state, PageState::Programmed);
            assert_eq!((data, oob), page_bytes(&geometry, PageAddress::new(0, page), 1), "seed {seed} page {page}");
        }
        assert_eq!(read(&mut device, 0, written).0, PageState::Erased, "the failed page was not written");
        return;
    }
    panic!("no seed in 0..100 failed after two good programs");
}

#[test]
fn erase_failures_retire_blocks_and_raw_nand_zones_go_offline() {
    let raw_nand = Geometry { zone_blocks: 1, zone_count: 4, ..small_geometry() };
    assert!(raw_nand.is_raw_nand());
    let faults = FaultConfig {
        erase_failure_probability_at_endurance: 1.0,
        failure_growth_exponent: 0.0,
        ..FaultConfig::none(1)
    };
    let mut device = memory(raw_nand, faults.clone());
    program(&mut device, 2, 0, 1);
    let error = device.reset_zone(2).unwrap_err();
    assert!(matches!(error, DeviceError::EraseFailed { zone: 2, block: 2, capacity_pages: 0, .. }), "{error:?}");
    assert_eq!(device.report_zone(2).unwrap().state, ZoneState::Offline);
    let mut data = vec![0; 512];
    let mut oob = vec![0; 64];
    assert!(matches!(
        device.read_page(PageAddress::new(2, 0), &mut data, &mut oob),
        Err(DeviceError::ZoneState { state: "offline", .. })
    ));
    assert!(device.reset_zone(2).is_err());
    // On a zoned device the zone survives with less capacity.
    let mut zoned = memory(small_geometry(), faults);
    let error = zoned.reset_zone(1).unwrap_err();
    assert!(matches!(error, DeviceError::EraseFailed { capacity_pages: 0, .. }), "both blocks fail: {error:?}");
}

#[test]
fn misdirected_writes_lose_the_page_and_damage_a_victim() {
    let geometry = small_geometry();
    let faults = FaultConfig { misdirected_write_probability: 1.0, ..FaultConfig::none(11) };
    let mut device = memory(geometry, faults);
    program(&mut device, 0, 0, 1);
    device.flush().unwrap();
    // The addressed page: programmed as far as the device's state goes, but
    // the medium holds nothing.
    let (state, data, oob) = read(&mut device, 0, 0);
    assert_eq!(state, PageState::Programmed);
    assert!(data.iter().chain(&oob).all(|&byte| byte == 0xFF), "a lost write reads erased");
    assert_eq!(
        device.pristine_page(PageAddress::new(0, 0)).unwrap().unwrap(),
        page_bytes(&geometry, PageAddress::new(0, 0), 1)
    );
    assert_eq!(device.overlay().get(&0), Some(&PageFault::LostWrite));
    let stored: Vec<_> =
        device.overlay().iter().filter(|(_, fault)| matches!(fault, PageFault::Stored { .. })).collect();
    assert_eq!(stored.len(), 1, "one victim page over-programmed");
    assert_eq!(device.counters().misdirected_writes_injected, 1);
}

#[test]
fn over_programmed_victims_and_the_landing_page_combine_by_and() {
    let geometry = small_geometry();
    // Find a seed whose first misdirected write lands in zone 3, which is
    // then programmed at the victim page.
    for seed in 0..500 {
        let faults = FaultConfig { misdirected_write_probability: 1.0, ..FaultConfig::none(seed) };
        let mut device = memory(geometry, faults);
        program(&mut device, 0, 0, 1);
        device.flush().unwrap(); // the landing happens when the page reaches the medium
        let Some((&victim, _)) = device.overlay().iter().find(|(_, fault)| matches!(fault, PageFault::Stored { .. }))
        else {
            continue;
        };
        if victim != 3 * geometry.zone_pages() {
            continue;
        }
        let PageFault::Stored { media } = device.overlay()[&victim].clone() else { unreachable!() };
        let (data, oob) = page_bytes(&geometry, PageAddress::new(0, 0), 1);
        assert_eq!(&media[..512], &data[..], "landing on an erased page stores the data as is");
        assert_eq!(&media[512..], &oob[..]);
        return;
    }
    panic!("no seed in 0..500 landed on zone 3 page 0");
}

#[test]
fn a_torn_program_corrupts_its_mlc_paired_page_even_when_flushed() {
    let geometry = small_geometry();
    let faults = FaultConfig { paired_page_distance: 2, torn_operation_probability: 1.0, ..FaultConfig::none(0) };
    let mut seen = 0;
    for seed in 0..64 {
        let mut device = memory(geometry, faults.clone());
        for page in 0..2 {
            program(&mut device, 0, page, 1);
        }
        device.flush().unwrap();
        for page in 2..4 {
            program(&mut device, 0, page, 2);
        }
        let report = device.power_cut(seed).unwrap();
        let Some(torn) = report.torn_pages.first().copied() else { continue };
        assert_eq!(report.paired_page_corruptions, vec![PageAddress::new(0, torn.page - 2)], "seed {seed}");
        let paired = PageAddress::new(0, torn.page - 2);
        let media = device.media_page(paired).unwrap().unwrap();
        let pristine = device.pristine_page(paired).unwrap().unwrap();
        assert_ne!(media, pristine, "seed {seed}: the paired page is damaged");
        if paired.page < 2 {
            seen += 1; // it had been flushed before the cut
        }
        assert!(device.counters().paired_page_corruptions >= 1);
    }
    assert!(seen > 0, "some cut damaged a flushed paired page");
}

#[test]
fn factory_bad_blocks_are_seeded_and_lower_capacity() {
    let geometry = Geometry { zone_count: 64, ..small_geometry() };
    let faults = FaultConfig { factory_bad_block_fraction: 0.3, ..FaultConfig::none(21) };
    let first = memory(geometry, faults.clone()).report_zones();
    let second = memory(geometry, faults).report_zones();
    assert_eq!(first, second);
    let bad: u32 = first.iter().map(|zone| zone.bad_blocks).sum();
    assert!(bad > 20 && bad < 60, "about 30% of 128 blocks: {bad}");
    for zone in &first {
        assert_eq!(zone.capacity_pages, (2 - zone.bad_blocks) * geometry.block_pages);
        assert_eq!(zone.state == ZoneState::Offline, zone.capacity_pages == 0);
    }
    // A zone with a bad first block still numbers its pages from 0, over the
    // good block.
    let zone = first.iter().find(|zone| zone.bad_blocks == 1).expect("some zone has one bad block").zone;
    let mut device = memory(geometry, FaultConfig { factory_bad_block_fraction: 0.3, ..FaultConfig::none(21) });
    for page in 0..4 {
        program(&mut device, zone, page, 1);
    }
    device.flush().unwrap();
    assert_eq!(device.report_zone(zone).unwrap().state, ZoneState::Full);
    assert_eq!(read(&mut device, zone, 3).1, page_bytes(&geometry, PageAddress::new(zone, 3), 1).0);
}

#[test]
fn presets_are_valid_and_faults_are_off_by_default() {
    for cell in [CellType::Slc, CellType::Emlc, CellType::Mlc] {
        let preset = FaultConfig::preset(cell, 1);
        preset.validate().unwrap();
        assert_eq!(preset.endurance_cycles, cell.endurance_cycles());
    }
    let default = FaultConfig::default();
    assert!(default.bit_errors.is_none());
    assert_eq!(default.read_failure_probability, 0.0);
    assert_eq!(default.misdirected_write_probability, 0.0);
    assert_eq!(default.factory_bad_block_fraction, 0.0);
    // A long workload on the default device injects nothing.
    let mut device = memory(small_geometry(), default);
    for round in 0..20 {
        for page in 0..8 {
            program(&mut device, 0, page, round);
        }
        device.flush().unwrap();
        for page in 0..8 {
            assert_eq!(read(&mut device, 0, page).1, page_bytes(&small_geometry(), PageAddress::new(0, page), round).0);
        }
        device.reset_zone(0).unwrap();
    }
    let counters = device.counters();
    assert_eq!(
        counters.bit_flips_injected
            + counters.read_failures_injected
            + counters.program_failures_injected
            + counters.erase_failures_injected
            + counters.misdirected_writes_injected,
        0
    );
}
