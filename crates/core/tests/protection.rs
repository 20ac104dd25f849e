//! The protection layer under the engine: pages with flipped bits come
//! back whole through the OOB's ECC, and what cannot be corrected is
//! refused, never returned wrong.

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions};
use flintfs_flash::{BitErrorModel, DeviceOptions, FaultConfig, Geometry, MemoryFlash};

fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks: 4,
        zone_count: 48,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

/// A raw bit error rate that is the same for every block at every age.
fn flat_bit_errors(rate: f64) -> BitErrorModel {
    BitErrorModel {
        fresh_rate: rate,
        wear_rate_at_endurance: 0.0,
        wear_exponent: 1.0,
        retention_growth_per_year: 0.0,
        read_disturb_rate_per_read: 0.0,
    }
}

fn contents(index: u32) -> Vec<u8> {
    (0..(index as usize % 7 + 1) * 5000).map(|byte| (byte as u32 * 31 + index) as u8).collect()
}

/// Writes a tree on a device whose reads flip bits at `rate`, remounts,
/// reads it all back, and returns the protection counters of the reads.
fn round_trip(rate: f64, seed: u64) -> flintfs_core::ProtectionCounters {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let faults = FaultConfig { bit_errors: Some(flat_bit_errors(rate)), ..FaultConfig::none(seed) };
    let flash = MemoryFlash::memory(geometry(), DeviceOptions { faults, ..DeviceOptions::default() }).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    for directory_index in 0..4u32 {
        let directory = fs.mkdir(1, format!("d{directory_index}").as_bytes(), 0o755, 0, 0).unwrap();
        for index in 0..40u32 {
            let file = fs.create(directory.ino, format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
            fs.write(file.ino, 0, &contents(directory_index * 100 + index)).unwrap();
            fs.forget(file.ino, 1).unwrap();
        }
        fs.forget(directory.ino, 1).unwrap();
    }
    let flash = fs.unmount().unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    for directory_index in 0..4u32 {
        let directory = fs.lookup(1, format!("d{directory_index}").as_bytes()).unwrap();
        for index in 0..40u32 {
            let file = fs.lookup(directory.ino, format!("f{index}").as_bytes()).unwrap();
            let expected = contents(directory_index * 100 + index);
            let read = fs.read(file.ino, 0, 1 << 20).unwrap_or_else(|error| panic!("seed {seed}: f{index}: {error}"));
            assert!(read == expected, "seed {seed}: d{directory_index}/f{index} read back different bytes");
        }
    }
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:#?}", report.findings);
    fs.protection_counters()
}

#[test]
fn bit_flips_on_every_page_are_corrected_by_the_ecc() {
    // About three flipped bits per 4 KiB page, one per 1 KiB codeword:
    // nearly every read of the medium needs the ECC, and t = 8 covers it
    // (more than eight in a codeword has odds of about 1e-7).
    for seed in [1, 2, 3] {
        let counters = round_trip(1e-4, seed);
        assert!(counters.pages_corrected_ecc > 100, "seed {seed}: {counters:?}");
        assert!(counters.bits_corrected_ecc > 2 * counters.pages_corrected_ecc, "seed {seed}: {counters:?}");
        assert_eq!(counters.pages_unrepairable, 0, "seed {seed}: {counters:?}");
    }
}

#[test]
fn a_clean_medium_needs_no_correction() {
    let counters = round_trip(0.0, 9);
    assert_eq!(counters, flintfs_core::ProtectionCounters::default());
}
