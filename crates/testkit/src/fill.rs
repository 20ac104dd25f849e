//! Fill, delete, refill: the workload that makes a log-structured file
//! system clean. Files of seeded sizes are written until the device is
//! nearly full, half of them are deleted at random, and it starts again.
//! Every byte is checked against what was written, and the report carries
//! what the issue asks for: ENOSPC before the target fill, the cleaner's
//! write amplification, wear, and the latency of writes near full in
//! simulated device time.

use std::collections::BTreeMap;

use flintfs_core::{errno, Fs, FsOptions, ManualClock, MkfsOptions};
use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

/// How a run is set up.
#[derive(Clone, Debug)]
pub struct FillSetup {
    pub geometry: Geometry,
    pub options: FsOptions,
    pub cycles: u32,
    /// Fill to this fraction of the space statfs reports, per thousand.
    pub fill_per_mille: u64,
    /// Files are 1 to this many blocks.
    pub file_blocks_max: u64,
    /// Run the checker after every cycle.
    pub check: bool,
    pub seed: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct FillReport {
    pub cycles: u32,
    pub files_written: u64,
    pub bytes_written: u64,
    /// Writes refused with ENOSPC before the fill target.
    pub early_enospc: u64,
    /// Bytes the cleaner moved over bytes the host wrote.
    pub cleaner_write_amplification: f64,
    pub zones_cleaned: u64,
    pub erase_count_max: u32,
    pub erase_count_mean: f64,
    /// Simulated device time of one-block (4 KiB) write calls made at 90%
    /// full and over, in nanoseconds: most are buffered and cost nothing;
    /// the tail is the calls that flush the buffer or clean.
    pub latency_p99_ns_at_90: u64,
    pub latency_p999_ns_at_90: u64,
    pub latency_max_ns_at_90: u64,
    pub latency_samples_at_90: usize,
    pub checker_findings: Vec<String>,
}

fn content(ino_seed: u64, length: usize) -> Vec<u8> {
    let mut random = Pcg64::seed_from_u64(ino_seed);
    (0..length).map(|_| random.random()).collect()
}

/// Runs fill/delete/refill; errors (with the seed) on any wrong byte, any
/// unexpected error, or checker findings.
pub fn run_fill(setup: &FillSetup) -> Result<FillReport, String> {
    let fail = |what: String| format!("seed {}: {what}", setup.seed);
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let device = MemoryFlash::memory(
        setup.geometry,
        DeviceOptions { faults: FaultConfig::none(setup.seed), ..DeviceOptions::default() },
    )
    .map_err(|error| fail(error.to_string()))?;
    let mkfs = MkfsOptions::new([5; 16], 0);
    let device = Fs::format(device, &mkfs, Box::new(clock.clone())).map_err(|error| fail(error.to_string()))?;
    let (mut fs, _) =
        Fs::mount(device, setup.options.clone(), Box::new(clock.clone())).map_err(|error| fail(error.to_string()))?;
    let mut random = Pcg64::seed_from_u64(setup.seed);
    let block = u64::from(setup.geometry.page_size_bytes);
    let mut files: BTreeMap<Vec<u8>, (u64, usize)> = BTreeMap::new();
    let mut report = FillReport::default();
    let mut name_counter = 0u64;
    let mut latencies: Vec<u64> = Vec::new();
    for cycle in 0..setup.cycles {
        // Fill.
        loop {
            let statfs = fs.statfs().map_err(|error| fail(error.to_string()))?;
            let used = statfs.blocks - statfs.blocks_free;
            let target = statfs.blocks * setup.fill_per_mille / 1000;
            if used >= target {
                break;
            }
            let blocks = random.random_range(1..=setup.file_blocks_max).min(target - used);
            let length = (blocks * block) as usize - random.random_range(0..block as usize / 2);
            name_counter += 1;
            let name = format!("f{name_counter}").into_bytes();
            let attributes = match fs.create(1, &name, 0o644, 0, 0) {
                Ok(attributes) => attributes,
                Err(error) if error.errno == errno::ENOSPC => {
                    report.early_enospc += 1;
                    break;
                }
                Err(error) => return Err(fail(format!("cycle {cycle}: create: {error}"))),
            };
            let data = content(name_counter, length);
            let near_full = used * 1000 >= statfs.blocks * 900;
            let mut written = 0;
            let mut refused = false;
            // Near full, one block per call, so each sample is one 4 KiB
            // write as a caller sees it (buffered, or paying for a flush or
            // a clean); otherwise 16 blocks per call.
            let step = if near_full { block as usize } else { block as usize * 16 };
            while written < data.len() {
                let end = (written + step).min(data.len());
                let before = fs.device().counters().device_time_ns;
                match fs.write(attributes.ino, written as u64, &data[written..end]) {
                    Ok(_) => {}
                    Err(error) if error.errno == errno::ENOSPC => {
                        refused = true;
                        break;
                    }
                    Err(error) => return Err(fail(format!("cycle {cycle}: write: {error}"))),
                }
                if near_full {
                    latencies.push(fs.device().counters().device_time_ns - before);
                }
                written = end;
            }
            fs.forget(attributes.ino, 1).map_err(|error| fail(error.to_string()))?;
            if refused {
                report.early_enospc += 1;
                fs.unlink(1, &name).map_err(|error| fail(format!("unlink after ENOSPC: {error}")))?;
                break;
            }
            files.insert(name, (name_counter, length));
            report.files_written += 1;
            report.bytes_written += length as u64;
        }
        // Verify a sample, then delete half at random.
        let names: Vec<Vec<u8>> = files.keys().cloned().collect();
        for name in names.iter().step_by(7) {
            let (seed, length) = files[name];
            let attributes = fs.lookup(1, name).map_err(|error| fail(format!("lookup: {error}")))?;
            let read = fs.read(attributes.ino, 0, length as u64 + 1).map_err(|error| fail(error.to_string()))?;
            fs.forget(attributes.ino, 1).map_err(|error| fail(error.to_string()))?;
            if read != content(seed, length) {
                return Err(fail(format!("cycle {cycle}: {:?} reads back wrong", String::from_utf8_lossy(name))));
            }
        }
        for name in names {
            if random.random_bool(0.5) {
                fs.unlink(1, &name).map_err(|error| fail(format!("cycle {cycle}: unlink: {error}")))?;
                files.remove(&name);
            }
        }
        if setup.check {
            let check = fs.check().map_err(|error| fail(error.to_string()))?;
            if !check.is_clean() {
                report.checker_findings = check.findings;
                return Err(fail(format!("cycle {cycle}: the checker found {:?}", report.checker_findings)));
            }
        }
        report.cycles += 1;
    }
    let cleaner = fs.cleaner_counters().clone();
    report.zones_cleaned = cleaner.zones_cleaned;
    report.cleaner_write_amplification = cleaner.bytes_moved as f64 / report.bytes_written.max(1) as f64;
    let (most, mean) = fs.wear();
    report.erase_count_max = most;
    report.erase_count_mean = mean;
    latencies.sort_unstable();
    report.latency_samples_at_90 = latencies.len();
    if let Some(&max) = latencies.last() {
        report.latency_max_ns_at_90 = max;
        report.latency_p99_ns_at_90 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
        report.latency_p999_ns_at_90 = latencies[(latencies.len() * 999 / 1000).min(latencies.len() - 1)];
    }
    // Everything left reads back after a clean remount.
    let device = fs.unmount().map_err(|error| fail(error.to_string()))?;
    let (mut fs, _) =
        Fs::mount(device, setup.options.clone(), Box::new(clock)).map_err(|error| fail(error.to_string()))?;
    for (name, (seed, length)) in &files {
        let attributes = fs.lookup(1, name).map_err(|error| fail(format!("after remount: {error}")))?;
        let read = fs.read(attributes.ino, 0, *length as u64 + 1).map_err(|error| fail(error.to_string()))?;
        fs.forget(attributes.ino, 1).map_err(|error| fail(error.to_string()))?;
        if read != content(*seed, *length) {
            return Err(fail(format!("after remount, {:?} reads back wrong", String::from_utf8_lossy(name))));
        }
    }
    Ok(report)
}
