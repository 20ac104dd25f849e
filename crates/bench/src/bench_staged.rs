//! The bench's workloads with a mount in the middle: what is measured
//! must start cold, or just after a mount, so each is a preparation, a
//! clean unmount and mount, and the measured part.
//!
//! - `dir_N` (DFFS's metadata micro-benchmark): the latency of create,
//!   open and delete in directories of N files.
//! - `ram_N`: the memory the file system holds after a mount and a walk
//!   that opens and sizes every one of N files.
//! - `near_full_P`: 4 KiB write and fsync latencies (p50, p99, maximum)
//!   with the file system P% full, and the first write after the mount.
//! - `large_seq_read`, `large_rand_read`, `large_reread` (RCFFS's table 2,
//!   with `large_seq_write` and `large_rand_write`): a large file read
//!   cold in order, cold at random, and warm again.
//!
//! The state a workload carries across the mount lives in [`Staged`], so
//! a target that can only mount afresh (littlefs) runs the two halves in
//! two mounts.

use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::json;

use crate::bench::{data, Files, Phase, Size, APPEND_BYTES};
use crate::{fail, Outcome};

/// Files per directory in the `dir_N` workloads (DFFS measured 50 to 200).
pub const DIRECTORY_FILE_COUNTS: [usize; 3] = [50, 100, 200];
/// How full the file system is in the `near_full_P` workloads, percent.
pub const FULLNESS_PERCENTS: [u64; 3] = [50, 80, 90];
/// The files that fill the file system in `near_full_P`.
const FILL_FILE_BYTES: usize = 1 << 20;
/// Fill files written between two looks at how full the file system is
/// (littlefs's look walks the whole file system).
const FILL_FILES_PER_LOOK: usize = 8;
/// A fill never writes more than this many times the device, even if the
/// file system never says it is full enough (compression, a leak).
const FILL_DEVICE_MULTIPLE_MAX: u64 = 4;
/// Most overwrites a `near_full_P` run makes: twice as many 4 KiB writes
/// as the file system has free space for, up to these. On the 512 MiB
/// device of these workloads, the full-size runs at 80% and 90% overwrite
/// more than is free, so a log-structured file system must clean while
/// they run (the row's erases say whether it did).
const NEAR_FULL_WRITES_QUICK: usize = 3_000;
const NEAR_FULL_WRITES_FULL: usize = 30_000;
/// Host time a `near_full_P` run's overwrites may take; a target slower
/// than that (littlefs rewrites a file's tail on every overwrite) stops
/// early, its latencies over the writes it made.
const NEAR_FULL_SECONDS_QUICK: f64 = 20.0;
const NEAR_FULL_SECONDS_FULL: f64 = 60.0;
/// The large file is written in requests of this size when it is only
/// being prepared (its write is measured by `large_seq_write`).
const PREPARE_WRITE_BYTES: usize = 1 << 20;

/// The staged workloads at these sizes.
pub fn names(file_counts: &[usize]) -> Vec<String> {
    let mut names: Vec<String> = DIRECTORY_FILE_COUNTS.iter().map(|count| format!("dir_{count}")).collect();
    names.extend(FULLNESS_PERCENTS.iter().map(|percent| format!("near_full_{percent}")));
    names.extend(["large_seq_read", "large_rand_read", "large_reread"].map(String::from));
    names.extend(file_counts.iter().map(|count| format!("ram_{count}")));
    names
}

pub fn is_staged(name: &str) -> bool {
    ["dir_", "near_full_", "ram_", "large_seq_read", "large_rand_read", "large_reread"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// Runs a staged workload where the target can remount itself.
pub fn run(name: &str, files: &mut dyn Files, size: Size, seed: u64, phase: &mut Phase) -> Outcome<u64> {
    let mut staged = Staged::new(name, size, seed)?;
    staged.prepare(files, phase)?;
    files.remount()?;
    staged.measure(files, phase)
}

enum Kind {
    Directories { files_per_directory: usize, directories: usize },
    Memory { files: usize },
    NearFull { percent: u64, writes_max: usize },
    LargeRead { random: bool, again: bool },
}

/// A staged workload, between its two halves.
pub struct Staged {
    kind: Kind,
    size: Size,
    random: Pcg64Mcg,
    /// Files the preparation made, for the measured half.
    paths: Vec<String>,
    /// Seconds and operations measured before the mount (dir_N's creates).
    seconds_before: f64,
    ops_before: u64,
}

/// Latencies of one kind of operation: host time, and the device time
/// where the device model is in the same process.
#[derive(Default)]
struct Latencies {
    host_ns: Vec<u64>,
    device_ns: Vec<u64>,
}

impl Latencies {
    /// Times `operation`.
    fn time<T>(&mut self, files: &mut dyn Files, operation: impl FnOnce(&mut dyn Files) -> Outcome<T>) -> Outcome<T> {
        let device_before = files.device_time_ns();
        let started = Instant::now();
        let result = operation(files)?;
        self.host_ns.push(started.elapsed().as_nanos() as u64);
        if let (Some(before), Some(after)) = (device_before, files.device_time_ns()) {
            self.device_ns.push(after - before);
        }
        Ok(result)
    }

    fn seconds(&self) -> f64 {
        self.host_ns.iter().sum::<u64>() as f64 / 1e9
    }

    /// The mean in microseconds, of host and of device time.
    fn mean_us(values: &[u64]) -> Option<f64> {
        (!values.is_empty()).then(|| values.iter().sum::<u64>() as f64 / values.len() as f64 / 1e3)
    }

    /// The value at `fraction` of the sorted values (nearest rank), in
    /// microseconds.
    fn percentile_us(values: &[u64], fraction: f64) -> Option<f64> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let rank = ((fraction * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1] as f64 / 1e3)
    }

    /// `name_us` (mean host), `name_device_us` (mean device) fields.
    fn record_means(&self, phase: &mut Phase, name: &str) {
        phase.fields.push((format!("{name}_us"), json!(Self::mean_us(&self.host_ns))));
        phase.fields.push((format!("{name}_device_us"), json!(Self::mean_us(&self.device_ns))));
    }
}

/// Used bytes over capacity, from the target's statfs.
fn fullness(files: &mut dyn Files) -> Outcome<f64> {
    let (used, total) = files.space()?;
    Ok(used as f64 / total.max(1) as f64)
}

impl Staged {
    pub fn new(name: &str, size: Size, seed: u64) -> Outcome<Staged> {
        let number = |prefix: &str| -> Outcome<u64> {
            name[prefix.len()..].parse().map_err(|_| crate::Failure(format!("bad workload {name}")))
        };
        let kind = if name.starts_with("dir_") {
            let files_per_directory = number("dir_")? as usize;
            if files_per_directory == 0 {
                fail!("bad workload {name}: a directory of no files");
            }
            // About 2,000 files a set quick, 10,000 full, whatever the
            // directory size, so every size is timed over as many operations.
            let set_files: usize = if size.quick { 2_000 } else { 10_000 };
            Kind::Directories { files_per_directory, directories: set_files.div_ceil(files_per_directory) }
        } else if name.starts_with("ram_") {
            Kind::Memory { files: number("ram_")? as usize }
        } else if name.starts_with("near_full_") {
            let percent = number("near_full_")?;
            if !(1..=99).contains(&percent) {
                fail!("bad workload {name}: fullness is a percentage below 100");
            }
            Kind::NearFull {
                percent,
                writes_max: if size.quick { NEAR_FULL_WRITES_QUICK } else { NEAR_FULL_WRITES_FULL },
            }
        } else {
            match name {
                "large_seq_read" => Kind::LargeRead { random: false, again: false },
                "large_rand_read" => Kind::LargeRead { random: true, again: false },
                "large_reread" => Kind::LargeRead { random: false, again: true },
                _ => fail!("unknown staged workload {name:?}"),
            }
        };
        Ok(Staged {
            kind,
            size,
            random: Pcg64Mcg::seed_from_u64(seed),
            paths: Vec::new(),
            seconds_before: 0.0,
            ops_before: 0,
        })
    }

    /// Everything before the mount in the middle.
    pub fn prepare(&mut self, files: &mut dyn Files, phase: &mut Phase) -> Outcome {
        match self.kind {
            Kind::Directories { files_per_directory, directories } => {
                // Two sets of directories: one to open in, one to delete in,
                // so that each is cold after the mount.
                for set in ["open", "delete"] {
                    files.mkdir(set)?;
                    for directory in 0..directories {
                        files.mkdir(&format!("{set}/d{directory:04}"))?;
                    }
                }
                let mut creates = Latencies::default();
                phase.begin(files)?;
                for set in ["open", "delete"] {
                    for directory in 0..directories {
                        for index in 0..files_per_directory {
                            let path = format!("{set}/d{directory:04}/f{index:04}");
                            let handle = creates.time(files, |files| files.create(&path))?;
                            files.close(handle)?;
                            self.paths.push(path);
                        }
                    }
                }
                files.sync_all()?;
                creates.record_means(phase, "create");
                self.seconds_before = creates.seconds();
                self.ops_before = creates.host_ns.len() as u64;
            }
            Kind::Memory { files: count } => {
                for directory in 0..crate::bench::CREATE_DIRECTORIES {
                    files.mkdir(&format!("d{directory:03}"))?;
                }
                for index in 0..count {
                    let path = format!("d{:03}/f{index:06}", index % crate::bench::CREATE_DIRECTORIES);
                    let handle = files.create(&path)?;
                    files.close(handle)?;
                    self.paths.push(path);
                }
                files.sync_all()?;
            }
            Kind::NearFull { percent, .. } => {
                files.mkdir("fill")?;
                let (_, total) = files.space()?;
                let wanted = percent as f64 / 100.0;
                let written_max = total * FILL_DEVICE_MULTIPLE_MAX;
                let mut written = 0u64;
                let mut reached = fullness(files)?;
                while reached < wanted {
                    if written >= written_max {
                        fail!(
                            "the file system was {:.1}% full after {} MiB of fill, short of {percent}%",
                            reached * 100.0,
                            written >> 20
                        );
                    }
                    for _ in 0..FILL_FILES_PER_LOOK {
                        let path = format!("fill/f{:06}", self.paths.len());
                        let chunk = data(&mut self.random, FILL_FILE_BYTES);
                        let filled = files.create(&path).and_then(|handle| {
                            files.write_at(handle, 0, &chunk)?;
                            files.close(handle)
                        });
                        if let Err(error) = filled {
                            fail!(
                                "a fill write failed at {:.1}% full by the file system's statfs, short of \
                                 {percent}%: {}",
                                fullness(files)? * 100.0,
                                error.0
                            );
                        }
                        self.paths.push(path);
                        written += FILL_FILE_BYTES as u64;
                    }
                    reached = fullness(files)?;
                    if reached >= wanted {
                        // Buffered data counts at its raw size until it is
                        // written, compressed where the file system
                        // compresses: the fill is judged on what it took.
                        // Each sync here halves what is left to fill, so
                        // there are a few of them.
                        files.sync_all()?;
                        reached = fullness(files)?;
                    }
                }
                if self.paths.is_empty() {
                    fail!("the file system was already {:.1}% full before the fill", reached * 100.0);
                }
                files.sync_all()?;
                phase.fields.push(("full_percent".into(), json!(fullness(files)? * 100.0)));
            }
            Kind::LargeRead { .. } => {
                let (used_before, _) = files.space()?;
                let handle = files.create("large")?;
                let chunk = data(&mut self.random, PREPARE_WRITE_BYTES);
                let mut offset = 0u64;
                while offset < self.size.large_file_bytes {
                    files.write_at(handle, offset, &chunk)?;
                    offset += PREPARE_WRITE_BYTES as u64;
                }
                files.fsync(handle)?;
                files.close(handle)?;
                files.sync_all()?;
                let (used_after, _) = files.space()?;
                // RCFFS's "space occupied": what the file takes on the media.
                phase.fields.push(("space_used_bytes".into(), json!(used_after.saturating_sub(used_before))));
                phase.fields.push(("file_bytes".into(), json!(self.size.large_file_bytes)));
            }
        }
        Ok(())
    }

    /// The measured half, after the mount; the operations it did (with
    /// any measured before the mount).
    pub fn measure(&mut self, files: &mut dyn Files, phase: &mut Phase) -> Outcome<u64> {
        match self.kind {
            Kind::Directories { .. } => {
                let (opened, deleted): (Vec<String>, Vec<String>) =
                    self.paths.iter().cloned().partition(|path| path.starts_with("open/"));
                let mut opens = Latencies::default();
                let mut order: Vec<usize> = (0..opened.len()).collect();
                order.shuffle(&mut self.random);
                for index in order {
                    let handle = opens.time(files, |files| files.open(&opened[index]))?;
                    files.close(handle)?;
                }
                let mut deletes = Latencies::default();
                let mut order: Vec<usize> = (0..deleted.len()).collect();
                order.shuffle(&mut self.random);
                for index in order {
                    deletes.time(files, |files| files.unlink(&deleted[index]))?;
                }
                files.sync_all()?;
                opens.record_means(phase, "open");
                deletes.record_means(phase, "delete");
                // The row's rate is over the three kinds' own time.
                phase.seconds = self.seconds_before + opens.seconds() + deletes.seconds();
                Ok(self.ops_before + (opens.host_ns.len() + deletes.host_ns.len()) as u64)
            }
            Kind::Memory { .. } => {
                phase.begin(files)?;
                for path in &self.paths {
                    let handle = files.open(path)?;
                    files.size(handle)?;
                    files.close(handle)?;
                }
                phase.end();
                phase.fields.push(("memory_bytes".into(), json!(files.memory_bytes()?)));
                Ok(self.paths.len() as u64)
            }
            Kind::NearFull { writes_max, .. } => {
                // Overwrites of 4 KiB at random in the fill, each made
                // durable; the first is the first write after the mount.
                // Each overwrite is like the fill at its place (a repeated
                // byte in a file's first half, noise in the second), so a
                // file system that compresses stays as full as the fill
                // left it: noise over the first half's tiny chunks grew
                // flintfs's live data from 90% to about 98% of the device
                // over a full run, which measured a file system filling up,
                // not one at 90%.
                let mut block = vec![0u8; APPEND_BYTES];
                let blocks_per_file = (FILL_FILE_BYTES / APPEND_BYTES) as u64;
                let (used, total) = files.space()?;
                let free_blocks = total.saturating_sub(used) / APPEND_BYTES as u64;
                let writes = writes_max.min(2 * free_blocks as usize).max(1);
                let seconds_max = if self.size.quick { NEAR_FULL_SECONDS_QUICK } else { NEAR_FULL_SECONDS_FULL };
                let mut latencies = Latencies::default();
                phase.begin(files)?;
                for _ in 0..writes {
                    if latencies.seconds() > seconds_max {
                        break;
                    }
                    let path = &self.paths[self.random.random_range(0..self.paths.len())];
                    let offset = self.random.random_range(0..blocks_per_file) * APPEND_BYTES as u64;
                    if offset < (FILL_FILE_BYTES / 2) as u64 {
                        block.fill(self.random.random());
                    } else {
                        self.random.fill(&mut block[..]);
                    }
                    let handle = files.open(path)?;
                    latencies.time(files, |files| {
                        files.write_at(handle, offset, &block)?;
                        files.fsync(handle)
                    })?;
                    files.close(handle)?;
                }
                phase.end();
                phase.seconds = latencies.seconds();
                phase.fields.push(("writes_planned".into(), json!(writes)));
                files.sync_all()?;
                phase.fields.push(("full_percent_after".into(), json!(fullness(files)? * 100.0)));
                for (name, values) in [("", &latencies.host_ns), ("_device", &latencies.device_ns)] {
                    phase
                        .fields
                        .push((format!("first_write{name}_us"), json!(values.first().map(|ns| *ns as f64 / 1e3))));
                    phase.fields.push((format!("p50{name}_us"), json!(Latencies::percentile_us(values, 0.50))));
                    phase.fields.push((format!("p99{name}_us"), json!(Latencies::percentile_us(values, 0.99))));
                    phase.fields.push((format!("p999{name}_us"), json!(Latencies::percentile_us(values, 0.999))));
                    phase.fields.push((format!("max{name}_us"), json!(Latencies::percentile_us(values, 1.0))));
                }
                Ok(latencies.host_ns.len() as u64)
            }
            Kind::LargeRead { random, again } => {
                let blocks = self.size.large_file_bytes / APPEND_BYTES as u64;
                let handle = files.open("large")?;
                if again {
                    // The first read warms what the file system caches.
                    for index in 0..blocks {
                        files.read_at(handle, index * APPEND_BYTES as u64, APPEND_BYTES)?;
                    }
                }
                // At random: every block once, in a shuffled order, so no
                // read finds what an earlier one brought into a cache.
                let mut order: Vec<u64> = (0..blocks).collect();
                if random {
                    order.shuffle(&mut self.random);
                }
                phase.begin(files)?;
                for at in order {
                    let read = files.read_at(handle, at * APPEND_BYTES as u64, APPEND_BYTES)?;
                    if read != APPEND_BYTES {
                        fail!("read {read} bytes of block {at} of the large file, not {APPEND_BYTES}");
                    }
                }
                phase.end();
                files.close(handle)?;
                Ok(blocks)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use flintfs_core::FsyncMode;
    use serde_json::Value;

    use crate::bench::{run_engine, Size};

    /// One workload at a time: the memory rows read the process's one heap
    /// counter, which another test's allocations on another thread would
    /// move.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn run(workload: &str) -> Value {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match run_engine(workload, "flintfs", FsyncMode::WpCheck, Size::tiny(), 7) {
            Ok(row) => row,
            Err(error) => panic!("{workload} (seed 7): {}", error.0),
        }
    }

    fn number(row: &Value, field: &str) -> f64 {
        row[field].as_f64().unwrap_or_else(|| panic!("{} has no number {field}: {row}", row["workload"]))
    }

    #[test]
    fn directory_operations_are_timed_on_host_and_device() {
        let row = run("dir_50");
        // Two sets of 2,000 files created; then one set opened, the other
        // deleted.
        assert_eq!(number(&row, "ops"), 8000.0);
        for kind in ["create", "open", "delete"] {
            assert!(number(&row, &format!("{kind}_us")) > 0.0);
        }
        // Opens and unlinks after the mount read their directory from flash.
        assert!(number(&row, "open_device_us") > 0.0);
        assert!(number(&row, "delete_device_us") > 0.0);
    }

    #[test]
    fn memory_grows_with_the_files_walked() {
        let few = number(&run("ram_10"), "memory_bytes");
        let many = number(&run("ram_2000"), "memory_bytes");
        assert!(few > 0.0);
        assert!(many > few, "2,000 files held {many} bytes, 10 files {few}");
    }

    #[test]
    fn near_full_fills_to_the_percentage_and_times_every_write() {
        let row = run("near_full_50");
        assert!((50.0..60.0).contains(&number(&row, "full_percent")), "{row}");
        // Twice the free space's blocks, up to the quick size's 3,000; a
        // run that hit the time cap makes fewer.
        let writes = number(&row, "ops");
        assert_eq!(number(&row, "writes_planned"), 3000.0, "{row}");
        assert!(writes > 0.0 && writes <= 3000.0, "{row}");
        let (p50, p99, max) =
            (number(&row, "p50_device_us"), number(&row, "p99_device_us"), number(&row, "max_device_us"));
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{row}");
        assert!(number(&row, "first_write_device_us") > 0.0);
    }

    #[test]
    fn large_reads_read_every_block_and_report_the_space_used() {
        for workload in ["large_seq_read", "large_rand_read", "large_reread"] {
            let row = run(workload);
            assert_eq!(number(&row, "ops"), (4 << 20) as f64 / 4096.0);
            // What the file takes: its bytes (no compression yet) and the
            // pages that index them, not a multiple of that.
            let (space, file) = (number(&row, "space_used_bytes"), number(&row, "file_bytes"));
            assert!(space >= file * 0.4 && space <= file * 1.1, "{row}");
        }
        // Cold reads reach the device.
        assert!(number(&run("large_seq_read"), "device_time_ns_per_op") > 0.0);
    }
}
