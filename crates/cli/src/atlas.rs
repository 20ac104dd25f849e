//! `flintfs atlas`: what each protection level does against each of the
//! emulator's fault modes, measured.
//!
//! Every cell of the table is one run on a fresh emulated device of the
//! default shape (4 KiB pages, 128-byte OOB, 64-page blocks, 16-block
//! zones): mkfs at the level's parity, a known tree written, unmounted,
//! the fault applied (drawn by the fault model during the run, or injected
//! into the fault overlay after it), mounted again at the level's
//! correction, and every file read back and compared. A file that reads
//! back different bytes is **silent** corruption; one that fails is
//! detected (EIO). Pages damaged, corrected and repaired come from the
//! device's and the protection layer's counters. All of it is seeded.

use std::process::ExitCode;

use clap::Args;
use flintfs_core::{Correction, Fs, FsOptions, ManualClock, MkfsOptions, ProtectionCounters};
use flintfs_flash::{
    BitErrorModel, DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash, PageAddress, PageFault, ZoneState,
};
use flintfs_format::SUPERBLOCK_ZONES;

use crate::Outcome;

#[derive(Args)]
pub struct AtlasArguments {
    /// A smaller tree and device (seconds rather than minutes).
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub json: bool,
    /// Seeds every fault and every file's contents.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Instead of the table: fill a device of this size with files, then
    /// read all of them back this many times (`--passes`), remounting
    /// between passes, at the end-of-life bit error rate of the `mlc-eol`
    /// preset, with the default protection.
    #[arg(long, value_name = "SIZE", value_parser = crate::image::parse_size)]
    pub soak: Option<u64>,
    #[arg(long, default_value_t = 10)]
    pub passes: u32,
}

/// A protection level: the layout mkfs writes and the layers reads use.
struct Level {
    name: &'static str,
    block_parity_pages: u32,
    zone_parity_blocks: u32,
    correction: Correction,
}

const LEVELS: [Level; 5] = [
    Level { name: "none", block_parity_pages: 0, zone_parity_blocks: 0, correction: Correction::NONE },
    Level { name: "ecc", block_parity_pages: 0, zone_parity_blocks: 0, correction: Correction::ECC_ONLY },
    Level { name: "block k=1", block_parity_pages: 1, zone_parity_blocks: 0, correction: Correction::ALL },
    Level { name: "block k=2", block_parity_pages: 2, zone_parity_blocks: 0, correction: Correction::ALL },
    Level { name: "k=1 + zone rs", block_parity_pages: 1, zone_parity_blocks: 1, correction: Correction::ALL },
];

/// How a fault reaches the device.
#[derive(Clone, Copy)]
enum Fault {
    /// Bit flips on every read at this raw bit error rate.
    BitErrors(f64),
    /// Bit errors at this raw rate that every read of a page meets in the
    /// same bits (retention loss: a second read does not cure them).
    StoredBitErrors(f64),
    /// One page of each written block fails every read.
    Unreadable,
    /// Programs fail (and grow bad blocks) on a worn device.
    ProgramFailure,
    Misdirected(f64),
    /// One page of each written block disturbed at this rate (parts per
    /// million): what a torn program does to its MLC paired page.
    PairedPage(u32),
    /// One page of each written block left half programmed.
    Torn,
    /// Every page of one block in each full zone destroyed.
    BlockLost,
}

struct Mode {
    name: &'static str,
    fault: Fault,
}

fn modes() -> Vec<Mode> {
    let model = BitErrorModel::mlc();
    let year_ns = 365 * 24 * 3600 * 1_000_000_000u64;
    vec![
        Mode { name: "bit flips, fresh", fault: Fault::BitErrors(model.rate(0, 3000, 0, 0)) },
        Mode { name: "bit flips, mid-life", fault: Fault::BitErrors(model.rate(1500, 3000, year_ns / 2, 0)) },
        Mode { name: "bit flips, end of life", fault: Fault::BitErrors(model.rate(3000, 3000, year_ns, 0)) },
        Mode {
            name: "stored bit errors, end of life",
            fault: Fault::StoredBitErrors(model.rate(3000, 3000, year_ns, 0)),
        },
        Mode { name: "whole-page read failure", fault: Fault::Unreadable },
        Mode { name: "program failure", fault: Fault::ProgramFailure },
        Mode { name: "misdirected write", fault: Fault::Misdirected(2e-3) },
        Mode { name: "MLC paired-page corruption", fault: Fault::PairedPage(10_000) },
        Mode { name: "torn page (power cut)", fault: Fault::Torn },
        Mode { name: "erase block lost", fault: Fault::BlockLost },
    ]
}

/// One measured cell.
#[derive(Clone, Debug, Default)]
struct Row {
    mode: &'static str,
    level: &'static str,
    raw_bit_error_rate: f64,
    /// What the fault model injected: bits flipped, reads failed, programs
    /// failed or misdirected, or pages damaged by hand.
    injected: u64,
    pages_damaged: u64,
    bits_flipped: u64,
    pages_corrected: u64,
    pages_repaired: u64,
    pages_read_again: u64,
    files: u64,
    files_eio: u64,
    files_silent: u64,
    pages_unrepairable: u64,
    repair_device_time_ns: u64,
    mount_failed: bool,
}

fn geometry(quick: bool) -> Geometry {
    Geometry { zone_count: if quick { 28 } else { 64 }, ..Geometry::default() }
}

/// `length` bytes drawn from `seed` and the file's index: every file's
/// contents, known again when it is read back.
fn seeded_bytes(seed: u64, index: u32, length: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut bytes = vec![0u8; length];
    rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .fill_bytes(&mut bytes);
    bytes
}

fn contents(seed: u64, index: u32, quick: bool) -> Vec<u8> {
    let length = if quick { (index as usize % 9 + 1) * 7000 } else { (index as usize % 17 + 1) * 9000 };
    seeded_bytes(seed, index, length)
}

fn file_count(quick: bool) -> u32 {
    if quick {
        240
    } else {
        1200
    }
}

const FILES_PER_DIRECTORY: u32 = 60;

fn faults_for(fault: Fault, seed: u64) -> FaultConfig {
    let mut faults = FaultConfig::none(seed);
    match fault {
        Fault::BitErrors(rate) => faults.bit_errors = Some(BitErrorModel::flat(rate)),
        Fault::ProgramFailure => {
            // One program in five hundred fails whatever the wear (a growth
            // exponent of zero): a device far past its endurance, so that
            // failures are seen in one run.
            faults.program_failure_probability_at_endurance = 0.002;
            faults.failure_growth_exponent = 0.0;
        }
        Fault::Misdirected(probability) => faults.misdirected_write_probability = probability,
        Fault::StoredBitErrors(rate) => {
            faults.bit_errors = Some(BitErrorModel::flat(rate));
            faults.stored_bit_error_fraction = 1.0;
        }
        Fault::Unreadable | Fault::PairedPage(_) | Fault::Torn | Fault::BlockLost => {}
    }
    faults
}

fn run(mode: &Mode, level: &Level, seed: u64, quick: bool) -> Outcome<Row> {
    let mut row = Row { mode: mode.name, level: level.name, ..Row::default() };
    if let Fault::BitErrors(rate) | Fault::StoredBitErrors(rate) = mode.fault {
        row.raw_bit_error_rate = rate;
    }
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    // The faults start once the image is made: a device that fails its
    // programs is one a user has been writing to for years.
    let device = MemoryFlash::memory(geometry(quick), DeviceOptions::default())?;
    let options = MkfsOptions {
        block_parity_pages: level.block_parity_pages,
        segment_parity_blocks: level.zone_parity_blocks,
        ..MkfsOptions::new([9; 16], 0)
    };
    let mut device = Fs::format(device, &options, Box::new(clock.clone())).map_err(|error| error.message)?;
    device.set_faults(faults_for(mode.fault, seed))?;
    let (mut fs, _) =
        Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).map_err(|error| error.message)?;
    let files = file_count(quick);
    let mut directory = 0;
    for index in 0..files {
        if index % FILES_PER_DIRECTORY == 0 {
            directory = fs.mkdir(1, format!("d{}", index / FILES_PER_DIRECTORY).as_bytes(), 0o755, 0, 0)?.ino;
        }
        let file = fs.create(directory, format!("f{index}").as_bytes(), 0o644, 0, 0)?;
        fs.write(file.ino, 0, &contents(seed, index, quick))?;
        fs.forget(file.ino, 1)?;
    }
    let mut device = fs.unmount()?;
    let before = device.counters();
    row.pages_damaged = inject(&mut device, mode.fault, seed)?;
    let options = FsOptions { correction: level.correction, ..FsOptions::default() };
    let (mut fs, _) = match Fs::mount(device, options, Box::new(clock)) {
        Ok(mounted) => mounted,
        Err(_) => {
            row.mount_failed = true;
            row.files = u64::from(files);
            row.files_eio = u64::from(files);
            return Ok(row);
        }
    };
    for index in 0..files {
        row.files += 1;
        let directory = format!("d{}", index / FILES_PER_DIRECTORY);
        let read = fs
            .lookup(1, directory.as_bytes())
            .and_then(|directory| fs.lookup(directory.ino, format!("f{index}").as_bytes()))
            .and_then(|file| fs.read(file.ino, 0, 1 << 24));
        match read {
            Ok(bytes) if bytes == contents(seed, index, quick) => {}
            Ok(_) => row.files_silent += 1,
            Err(_) => row.files_eio += 1,
        }
    }
    let counters: ProtectionCounters = fs.protection_counters();
    let device_counters = fs.device().counters().since(&before);
    row.bits_flipped = device_counters.bit_flips_injected;
    row.pages_corrected = counters.pages_corrected_ecc;
    row.pages_repaired = counters.pages_repaired();
    row.pages_unrepairable = counters.pages_unrepairable;
    row.pages_read_again = counters.pages_read_again;
    row.repair_device_time_ns = counters.repair_device_time_ns;
    let lifetime = fs.device().lifetime_counters();
    row.injected = match mode.fault {
        Fault::BitErrors(_) | Fault::StoredBitErrors(_) => device_counters.bit_flips_injected,
        Fault::ProgramFailure => lifetime.program_failures_injected,
        Fault::Misdirected(_) => lifetime.misdirected_writes_injected,
        Fault::Unreadable | Fault::PairedPage(_) | Fault::Torn | Fault::BlockLost => row.pages_damaged,
    };
    if !matches!(mode.fault, Fault::Unreadable | Fault::PairedPage(_) | Fault::Torn | Fault::BlockLost) {
        // Drawn by the model as the run went: the page reads that met
        // damage (a program failure is met at write time, and moved on).
        row.pages_damaged =
            row.pages_corrected + row.pages_repaired + counters.pages_unrepairable + counters.pages_read_again;
    }
    Ok(row)
}

/// Applies an injected fault to a device holding the tree; returns the
/// pages it damaged.
fn inject(device: &mut MemoryFlash, fault: Fault, seed: u64) -> Outcome<u64> {
    let geometry = device.geometry();
    let mut damaged = 0;
    let reports = device.report_zones();
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    match fault {
        Fault::Unreadable | Fault::PairedPage(_) | Fault::Torn => {
            for report in &reports {
                if SUPERBLOCK_ZONES.contains(&report.zone) || report.write_pointer == 0 {
                    continue;
                }
                for block in 0..report.write_pointer.div_ceil(geometry.block_pages) {
                    let start = block * geometry.block_pages;
                    let end = (start + geometry.block_pages).min(report.write_pointer);
                    let page = start + (next() % u64::from(end - start)) as u32;
                    let injected = match fault {
                        Fault::PairedPage(rate_ppm) => PageFault::Disturbed { seed: next(), rate_ppm },
                        Fault::Unreadable => PageFault::Unreadable,
                        _ => PageFault::Torn { seed: next() },
                    };
                    if device.inject_page_fault(PageAddress::new(report.zone, page), injected)? {
                        damaged += 1;
                    }
                }
            }
        }
        Fault::BlockLost => {
            for report in &reports {
                let full = report.state == ZoneState::Full && report.write_pointer == report.capacity_pages;
                if SUPERBLOCK_ZONES.contains(&report.zone) || !full {
                    continue;
                }
                let block = (next() % u64::from(report.capacity_pages / geometry.block_pages)) as u32;
                for page in block * geometry.block_pages..(block + 1) * geometry.block_pages {
                    let destroyed = PageFault::Disturbed { seed: next(), rate_ppm: 100_000 };
                    if device.inject_page_fault(PageAddress::new(report.zone, page), destroyed)? {
                        damaged += 1;
                    }
                }
            }
        }
        _ => {}
    }
    Ok(damaged)
}

/// What a 3.4e-4 raw bit error rate does to the default ECC alone: the
/// chance that a page has more errors than it corrects (Poisson), and the
/// OOB a layout of the same shape needs for one failure in 10^9 reads.
fn ecc_analysis(rate: f64) -> String {
    let geometry = Geometry::default();
    let Some(layout) = flintfs_format::protection::EccLayout::for_geometry(
        geometry.page_size_bytes as usize,
        geometry.oob_size_bytes as usize,
    ) else {
        return "the default OOB holds no ECC".to_string();
    };
    let page_failure = |codewords: usize, correctable: u32| {
        let bits =
            (layout.stream_bytes as f64 * 8.0 + f64::from(correctable) * 16.0 * codewords as f64) / codewords as f64;
        let mean = bits * rate;
        // P(X > t) for X ~ Poisson(mean), summed from the low side.
        let mut term = (-mean).exp();
        let mut at_most = term;
        for count in 1..=correctable {
            term *= mean / f64::from(count);
            at_most += term;
        }
        let codeword: f64 = (1.0 - at_most).max(0.0);
        1.0 - (1.0 - codeword).powi(codewords as i32)
    };
    let failure = page_failure(layout.codewords, layout.correctable_bits());
    let needed = (1..=64u32).find(|&correctable| page_failure(layout.codewords, correctable) < 1e-9);
    format!(
        "ECC on the default page: {} codeword(s) of t = {} over GF(2^{}) in {} OOB bytes; at {rate:.1e} raw a page \
         has more errors than that in {:.1e} of its reads (Poisson); one in 10^9 needs t = {} ({} OOB bytes)",
        layout.codewords,
        layout.correctable_bits(),
        layout.field_bits(),
        layout.oob_bytes(),
        failure,
        needed.map_or("more than 64".to_string(), |t| t.to_string()),
        needed.map_or("-".to_string(), |t| (72 + (t as usize * 16).div_ceil(8) * layout.codewords).to_string()),
    )
}

/// The end-of-life soak: `size` bytes of files read `passes` times.
fn soak(arguments: &AtlasArguments, size: u64) -> Outcome<ExitCode> {
    let default = Geometry::default();
    let zone_bytes =
        u64::from(default.page_size_bytes) * u64::from(default.block_pages) * u64::from(default.zone_blocks);
    let geometry = Geometry { zone_count: u32::try_from(size / zone_bytes).unwrap_or(u32::MAX), ..Geometry::default() };
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let device = MemoryFlash::memory(geometry, DeviceOptions::default())?;
    let device =
        Fs::format(device, &MkfsOptions::new([9; 16], 0), Box::new(clock.clone())).map_err(|error| error.message)?;
    let (mut fs, _) =
        Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).map_err(|error| error.message)?;
    // Files of 1 MiB until nine tenths of the free space is used.
    const FILE_BYTES: u64 = 1 << 20;
    let statfs = fs.statfs()?;
    let files = (statfs.blocks_available * u64::from(statfs.block_size) / 10 * 9 / FILE_BYTES) as u32;
    let bar = indicatif::ProgressBar::new(u64::from(files) * u64::from(arguments.passes + 1));
    let contents = |index: u32| seeded_bytes(arguments.seed, index, FILE_BYTES as usize);
    let mut directory = 0;
    for index in 0..files {
        if index % FILES_PER_DIRECTORY == 0 {
            directory = fs.mkdir(1, format!("d{}", index / FILES_PER_DIRECTORY).as_bytes(), 0o755, 0, 0)?.ino;
        }
        let file = fs.create(directory, format!("f{index}").as_bytes(), 0o644, 0, 0)?;
        fs.write(file.ino, 0, &contents(index))?;
        fs.forget(file.ino, 1)?;
        bar.inc(1);
    }
    let mut device = fs.unmount()?;
    let faults = FaultConfig::named("mlc-eol", arguments.seed).expect("a preset");
    let rate = faults.bit_errors.map_or(0.0, |model| model.fresh_rate);
    device.set_faults(faults)?;
    let mut totals = ProtectionCounters::default();
    let (mut bits_flipped, mut pages_read, mut silent, mut eio) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..arguments.passes {
        let before = device.counters();
        let (mut fs, _) =
            Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).map_err(|error| error.message)?;
        for index in 0..files {
            let directory = format!("d{}", index / FILES_PER_DIRECTORY);
            let read = fs
                .lookup(1, directory.as_bytes())
                .and_then(|directory| fs.lookup(directory.ino, format!("f{index}").as_bytes()))
                .and_then(|file| fs.read(file.ino, 0, FILE_BYTES));
            match read {
                Ok(bytes) if bytes == contents(index) => {}
                Ok(_) => silent += 1,
                Err(_) => eio += 1,
            }
            bar.inc(1);
        }
        let counters = fs.protection_counters();
        totals.pages_corrected_ecc += counters.pages_corrected_ecc;
        totals.bits_corrected_ecc += counters.bits_corrected_ecc;
        totals.pages_read_again += counters.pages_read_again;
        totals.pages_repaired_block_parity += counters.pages_repaired_block_parity;
        totals.pages_repaired_zone_parity += counters.pages_repaired_zone_parity;
        totals.pages_unrepairable += counters.pages_unrepairable;
        totals.pages_worn += counters.pages_worn;
        totals.blocks_retired += counters.blocks_retired;
        device = fs.unmount()?;
        let spent = device.counters().since(&before);
        bits_flipped += spent.bit_flips_injected;
        pages_read += spent.pages_read;
    }
    bar.finish_and_clear();
    let value = serde_json::json!({
        "device_bytes": geometry.device_size_bytes(),
        "files": files,
        "file_bytes": FILE_BYTES,
        "passes": arguments.passes,
        "raw_bit_error_rate": rate,
        "pages_read": pages_read,
        "bits_flipped": bits_flipped,
        "pages_corrected_ecc": totals.pages_corrected_ecc,
        "bits_corrected_ecc": totals.bits_corrected_ecc,
        "pages_read_again": totals.pages_read_again,
        "pages_repaired_block_parity": totals.pages_repaired_block_parity,
        "pages_repaired_zone_parity": totals.pages_repaired_zone_parity,
        "pages_unrepairable": totals.pages_unrepairable,
        // Pages whose correction neared the code's bound, and the blocks
        // they retired (their data moves when the cleaner next runs).
        "pages_worn": totals.pages_worn,
        "blocks_retired": totals.blocks_retired,
        "files_eio": eio,
        "files_silent": silent,
    });
    if arguments.json {
        println!("{value}");
    } else {
        println!(
            "end-of-life soak, seed {}: {} files of 1 MiB on {} MiB of emulated flash, read {} times (mlc-eol: {rate:.1e} raw, \
             nine tenths of it stored), default protection",
            arguments.seed,
            files,
            geometry.device_size_bytes() >> 20,
            arguments.passes
        );
        for (name, value) in value.as_object().expect("an object") {
            println!("  {name:<28} {value}");
        }
        println!("  {}", ecc_analysis(rate));
    }
    Ok(if silent == 0 && eio == 0 && totals.pages_unrepairable == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

pub fn atlas(arguments: AtlasArguments) -> Outcome<ExitCode> {
    if let Some(size) = arguments.soak {
        return soak(&arguments, size);
    }
    let modes = modes();
    let mut rows = Vec::new();
    let bar = indicatif::ProgressBar::new((modes.len() * LEVELS.len()) as u64);
    for mode in &modes {
        for level in &LEVELS {
            bar.set_message(format!("{} / {}", mode.name, level.name));
            let row = run(mode, level, arguments.seed, arguments.quick)
                .map_err(|failure| format!("{} / {}: {}", mode.name, level.name, failure.0))?;
            rows.push(row);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let silent: u64 = rows.iter().map(|row| row.files_silent).sum();
    if arguments.json {
        let value: Vec<serde_json::Value> = rows
            .iter()
            .map(|row| {
                serde_json::json!({
                    "mode": row.mode,
                    "level": row.level,
                    "raw_bit_error_rate": row.raw_bit_error_rate,
                    "injected": row.injected,
                    "pages_damaged": row.pages_damaged,
                    "bits_flipped": row.bits_flipped,
                    "pages_corrected": row.pages_corrected,
                    "pages_repaired": row.pages_repaired,
                    "pages_unrepairable": row.pages_unrepairable,
                    "pages_read_again": row.pages_read_again,
                    "files": row.files,
                    "files_eio": row.files_eio,
                    "files_silent": row.files_silent,
                    "mount_failed": row.mount_failed,
                    "repair_device_time_ns": row.repair_device_time_ns,
                    "repair_device_time_per_page_ns": row.repair_device_time_ns.checked_div(row.pages_repaired),
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "seed": arguments.seed, "quick": arguments.quick, "rows": value }));
    } else {
        println!(
            "fault atlas, seed {}, {} files on {} MiB of emulated flash (4 KiB pages, 128 B OOB, 64-page blocks, 16-block zones)",
            arguments.seed,
            file_count(arguments.quick),
            geometry(arguments.quick).device_size_bytes() >> 20
        );
        println!(
            "{:<31} {:<14} {:>9} {:>8} {:>8} {:>9} {:>9} {:>7} {:>6} {:>5} {:>6} {:>9}",
            "fault",
            "protection",
            "injected",
            "damaged",
            "re-read",
            "corrected",
            "repaired",
            "unrep.",
            "files",
            "EIO",
            "silent",
            "ms/repair"
        );
        for row in &rows {
            let per_repair = row
                .repair_device_time_ns
                .checked_div(row.pages_repaired)
                .map_or("-".to_string(), |ns| format!("{:.1}", ns as f64 / 1e6));
            println!(
                "{:<31} {:<14} {:>9} {:>8} {:>8} {:>9} {:>9} {:>7} {:>6} {:>5} {:>6} {:>9}{}",
                row.mode,
                row.level,
                row.injected,
                row.pages_damaged,
                row.pages_read_again,
                row.pages_corrected,
                row.pages_repaired,
                row.pages_unrepairable,
                row.files,
                row.files_eio,
                row.files_silent,
                per_repair,
                if row.mount_failed { "  (mount failed)" } else { "" }
            );
        }
        println!(
            "RCFFS (EMSOFT'09, 5.3): every damaged page repaired whatever its bit count; 24.7 ms to repair from \
             block parity, 57 ms from segment parity"
        );
        let rate = BitErrorModel::mlc().rate(3000, 3000, 365 * 24 * 3600 * 1_000_000_000, 0);
        println!("{}", ecc_analysis(rate));
    }
    // The defaults' promise: one damaged page in every erase block, and a
    // whole erase block lost, are repaired.
    let default_level = LEVELS[LEVELS.len() - 1].name;
    let promised =
        ["whole-page read failure", "MLC paired-page corruption", "torn page (power cut)", "erase block lost"];
    let broken: Vec<String> = rows
        .iter()
        .filter(|row| row.level == default_level && promised.contains(&row.mode))
        .filter(|row| row.pages_unrepairable > 0 || row.files_eio > 0 || row.mount_failed)
        .map(|row| format!("{}: {} unrepairable, {} files EIO", row.mode, row.pages_unrepairable, row.files_eio))
        .collect();
    if silent > 0 {
        eprintln!("flintfs atlas: {silent} reads returned wrong bytes");
    }
    for line in &broken {
        eprintln!("flintfs atlas: with the default protection ({default_level}), {line}");
    }
    Ok(if silent == 0 && broken.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
