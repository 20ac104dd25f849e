//! `threads_N` (issue 19): N threads on one in-process engine, shared
//! with group commit (`flintfs_core::SharedFs`), with the emulator paced;
//! and the same work from N threads through std::fs in a mount (flintfs
//! over FUSE, the kernel peers), in real time ([`run_in_directory`]).
//!
//! - **Writers:** N threads, each creating 4 KiB files in its own
//!   directory with an fsync after each: how many log pages an fsync
//!   costs when N of them are in flight at once (group commit shares one
//!   batch and one flush among those prepared while a commit runs).
//! - **Readers:** then N threads reading random 4 KiB files of one shared
//!   tree, larger than the read cache, after a remount (the writers'
//!   work gone from the caches): how reads scale
//!   with threads. The reads are a fixed number split among the threads,
//!   so the cache's share of them does not grow with N.
//!
//! **Pacing.** The memory emulator answers in no host time, so fsyncs
//! would never overlap and nothing would wait long enough to batch. Here
//! each engine call waits out the device time it cost (the emulator's
//! simulated clock) in a sleep, after it has let the engine go, as a
//! real device would keep the caller waiting. Every figure of this
//! workload is paced. The engine is still one mutex: host-CPU work of two
//! threads never overlaps, their device waits do. The emulator's clock is
//! one timeline: two threads' requests to the same die do not wait for
//! each other in wall time (with 32 dies and random reads, about one pair
//! in 32 would), so the device is a little more parallel here than it is.

use std::time::{Duration, Instant};

use flintfs_core::{Fs, FsOptions, MkfsOptions, SharedFs};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Value};

use crate::bench::{data, engine_error, Files, Phase, Size, APPEND_BYTES};
use crate::{fail, Failure, Outcome};

/// Thread counts of the `threads_N` workloads.
pub const THREAD_COUNTS: [usize; 4] = [1, 2, 4, 8];
/// Directories of the shared tree the readers read.
const TREE_DIRECTORIES: usize = 16;

/// The workloads' names.
pub fn names() -> Vec<String> {
    THREAD_COUNTS.iter().map(|count| format!("threads_{count}")).collect()
}

/// Files each writer creates (the same per thread at every N), and the
/// reads all readers make together (the same at every N, split evenly,
/// so the read cache finds as many as N grows).
fn work(size: Size) -> (usize, usize) {
    if size.quick {
        (150, 1_600)
    } else {
        (1_000, 16_000)
    }
}

/// Files of the shared tree, 4 KiB of noise each (a page each): two and
/// four times the read cache's default, so most reads reach the device.
fn tree_files(size: Size) -> usize {
    if size.quick {
        2_048
    } else {
        4_096
    }
}

/// Below this, a wait is not slept at all, and a longer one is slept
/// short by this much: a sleep on this machine overshoots by tens of
/// microseconds, near a read's whole device time.
const SLEEP_MARGIN: Duration = Duration::from_micros(80);

/// Waits out `nanoseconds` of device time: a sleep for most of it, then
/// yields until the moment (a yield lets another thread run, so the
/// waiting costs the others no core).
fn pace(nanoseconds: u64) {
    let wait = Duration::from_nanos(nanoseconds);
    let until = Instant::now() + wait;
    if wait > SLEEP_MARGIN {
        std::thread::sleep(wait - SLEEP_MARGIN);
    }
    while Instant::now() < until {
        std::thread::yield_now();
    }
}

fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and touches only
    // this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64);
    }
}

/// Runs `work` on `threads` threads at once, each given its number and
/// its own generator (`seed` mixed with the number by `spread`, so
/// writers and readers draw apart); the wall seconds they took together.
fn on_threads(
    threads: usize,
    seed: u64,
    spread: fn(u64, usize) -> u64,
    work: impl Fn(usize, &mut Pcg64Mcg) -> Outcome + Sync,
) -> Outcome<f64> {
    let started = Instant::now();
    let results: Vec<Outcome> = std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    fine_timer_slack();
                    work(thread, &mut Pcg64Mcg::seed_from_u64(spread(seed, thread)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or_else(|_| fail!("a thread of {threads} panicked")))
            .collect()
    });
    results.into_iter().collect::<Outcome<Vec<()>>>()?;
    Ok(started.elapsed().as_secs_f64())
}

fn writer_seed(seed: u64, writer: usize) -> u64 {
    seed ^ (writer as u64 + 1).wrapping_mul(0x9E37_79B9)
}

fn reader_seed(seed: u64, reader: usize) -> u64 {
    seed ^ (reader as u64 + 101).wrapping_mul(0x85EB_CA6B)
}

/// A tree file's 4 KiB: noise, a page each.
fn noise(random: &mut Pcg64Mcg) -> Vec<u8> {
    let mut bytes = vec![0u8; APPEND_BYTES];
    random.fill(&mut bytes[..]);
    bytes
}

fn thread_count(workload: &str) -> Outcome<usize> {
    workload
        .strip_prefix("threads_")
        .and_then(|count| count.parse().ok())
        .filter(|count| (1..=64).contains(count))
        .ok_or_else(|| Failure(format!("bad workload {workload}: threads_N with N from 1 to 64")))
}

/// The same work in a mounted directory (flintfs over FUSE, or a kernel
/// peer on a loop device), through std::fs from N threads, in real time:
/// no pacing, the mount's own device. Each writer's fsync is fsync(2).
pub(crate) fn run_in_directory(
    workload: &str,
    root: &std::path::Path,
    files: &mut dyn Files,
    size: Size,
    seed: u64,
    phase: &mut Phase,
) -> Outcome<u64> {
    let threads = thread_count(workload)?;
    let (files_per_writer, reads_total) = work(size);
    let reads_per_reader = reads_total / threads;
    let tree_count = tree_files(size);
    let mut random = Pcg64Mcg::seed_from_u64(seed);
    let path_of = |index: usize| root.join(format!("tree/d{:02}/f{index:05}", index % TREE_DIRECTORIES));
    files.mkdir("tree")?;
    for directory in 0..TREE_DIRECTORIES {
        files.mkdir(&format!("tree/d{directory:02}"))?;
    }
    for index in 0..tree_count {
        std::fs::write(path_of(index), noise(&mut random))?;
    }
    for writer in 0..threads {
        files.mkdir(&format!("w{writer:02}"))?;
    }
    files.sync_all()?;
    phase.begin(files)?;
    let write_seconds = on_threads(threads, seed, writer_seed, |writer, random| {
        use std::io::Write;
        for index in 0..files_per_writer {
            let path = root.join(format!("w{writer:02}/f{index:05}"));
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
            file.write_all(&data(random, APPEND_BYTES))?;
            file.sync_all()?;
        }
        Ok(())
    })?;
    // Cold for the readers, as in process.
    files.remount()?;
    let read_seconds = on_threads(threads, seed, reader_seed, |_, random| {
        for _ in 0..reads_per_reader {
            let path = path_of(random.random_range(0..tree_count));
            let read = std::fs::read(&path)?;
            if read.len() != APPEND_BYTES {
                fail!("read {} bytes of {}, not {APPEND_BYTES}", read.len(), path.display());
            }
        }
        Ok(())
    })?;
    phase.end();
    let fsyncs = (threads * files_per_writer) as u64;
    let reads = (reads_per_reader * threads) as u64;
    phase.seconds = write_seconds + read_seconds;
    for (name, value) in [
        ("paced", json!(false)),
        ("threads", json!(threads)),
        ("fsyncs", json!(fsyncs)),
        ("fsyncs_per_s", json!(fsyncs as f64 / write_seconds.max(1e-9))),
        ("reads", json!(reads)),
        ("reads_per_s", json!(reads as f64 / read_seconds.max(1e-9))),
        ("tree_files", json!(tree_count)),
    ] {
        phase.fields.push((name.to_string(), value));
    }
    Ok(fsyncs + reads)
}

/// A clean unmount and a mount, the engine shared and paced.
fn remount(fs: Fs<MemoryFlash>, clock: &flintfs_core::ManualClock) -> Outcome<SharedFs<MemoryFlash>> {
    let device = fs.unmount().map_err(engine_error)?;
    let (fs, _) = Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).map_err(engine_error)?;
    Ok(SharedFs::new(fs, Some(Box::new(pace))))
}

pub fn run(workload: &str, size: Size, seed: u64) -> Outcome<Value> {
    let threads = thread_count(workload)?;
    let (files_per_writer, reads_total) = work(size);
    let reads_per_reader = reads_total / threads;
    let geometry = Geometry::with_size_bytes(crate::bench::device_bytes(size, workload));
    let device = crate::bench::bench_device(geometry, DeviceOptions::default())?;
    let clock = flintfs_core::ManualClock::new(1_700_000_000_000_000_000);
    let device = Fs::format(device, &MkfsOptions::new([9; 16], 0), Box::new(clock.clone())).map_err(engine_error)?;
    let (mut fs, _) = Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).map_err(engine_error)?;

    // The shared tree, and each writer's directory; then a remount, so
    // the readers start cold.
    let mut random = Pcg64Mcg::seed_from_u64(seed);
    let tree = fs.mkdir(flintfs_core::ROOT_INO, b"tree", 0o755, 0, 0).map_err(engine_error)?.ino;
    let mut directories = Vec::new();
    for directory in 0..TREE_DIRECTORIES {
        let ino = fs.mkdir(tree, format!("d{directory:02}").as_bytes(), 0o755, 0, 0).map_err(engine_error)?.ino;
        directories.push(ino);
    }
    let files = tree_files(size);
    for index in 0..files {
        let parent = directories[index % TREE_DIRECTORIES];
        let ino = fs.create(parent, format!("f{index:05}").as_bytes(), 0o644, 0, 0).map_err(engine_error)?.ino;
        fs.write(ino, 0, &noise(&mut random)).map_err(engine_error)?;
        fs.forget(ino, 1).map_err(engine_error)?;
    }
    let mut writer_directories = Vec::new();
    for writer in 0..threads {
        let ino = fs.mkdir(flintfs_core::ROOT_INO, format!("w{writer:02}").as_bytes(), 0o755, 0, 0);
        writer_directories.push(ino.map_err(engine_error)?.ino);
    }
    let shared = remount(fs, &clock)?;

    // Writers.
    let counters = |shared: &SharedFs<MemoryFlash>| {
        shared.run(|fs| Ok((fs.counters().clone(), fs.device().counters()))).map_err(engine_error)
    };
    let (engine_before, device_before) = counters(&shared)?;
    let write_seconds = on_threads(threads, seed, writer_seed, |writer, random| {
        let directory = writer_directories[writer];
        for index in 0..files_per_writer {
            let name = format!("f{index:05}");
            let ino = shared.run(|fs| fs.create(directory, name.as_bytes(), 0o644, 0, 0)).map_err(engine_error)?.ino;
            let block = data(random, APPEND_BYTES);
            shared.run(|fs| fs.write(ino, 0, &block)).map_err(engine_error)?;
            shared.fsync(ino, false).map_err(engine_error)?;
            shared.run(|fs| fs.forget(ino, 1)).map_err(engine_error)?;
        }
        Ok(())
    })?;
    let (engine_after, device_after) = counters(&shared)?;
    let log_pages = engine_after.log_pages_written - engine_before.log_pages_written;
    let checkpoints = engine_after.checkpoints - engine_before.checkpoints;
    let group = shared.group_commit_counters().map_err(engine_error)?;
    let fsyncs = (threads * files_per_writer) as u64;

    // A remount, so the readers start cold whatever the writers left in
    // the caches.
    let shared = remount(shared.into_inner().map_err(engine_error)?, &clock)?;

    // Readers.
    let read_seconds = on_threads(threads, seed, reader_seed, |_, random| {
        for _ in 0..reads_per_reader {
            let index = random.random_range(0..files);
            let parent = directories[index % TREE_DIRECTORIES];
            let name = format!("f{index:05}");
            let read = shared
                .run(|fs| {
                    let ino = fs.lookup(parent, name.as_bytes())?.ino;
                    let read = fs.read(ino, 0, APPEND_BYTES as u64);
                    fs.forget(ino, 1)?;
                    read
                })
                .map_err(engine_error)?;
            if read.len() != APPEND_BYTES {
                fail!("read {} bytes of {name}, not {APPEND_BYTES}", read.len());
            }
        }
        Ok(())
    })?;
    let reads = (threads * reads_per_reader) as u64;
    let fs = shared.into_inner().map_err(engine_error)?;
    let read_cache_hits = fs.counters().read_cache_hits;
    fs.unmount().map_err(engine_error)?;

    let ops = fsyncs + reads;
    let pages = device_after.pages_programmed - device_before.pages_programmed;
    let bytes = device_after.data_bytes_programmed + device_after.oob_bytes_programmed
        - device_before.data_bytes_programmed
        - device_before.oob_bytes_programmed;
    // The row's rate and bytes are over both phases' operations; the
    // fields after them are each phase's own.
    Ok(json!({
        "workload": workload,
        "target": "flintfs",
        "ops": ops,
        "ops_per_s": ops as f64 / (write_seconds + read_seconds).max(1e-9),
        "bytes_per_op": bytes as f64 / ops.max(1) as f64,
        "bytes_per_fsync": bytes as f64 / fsyncs.max(1) as f64,
        "checkpoints_during_writes": checkpoints,
        "pages_programmed": pages,
        "erases": device_after.erases - device_before.erases,
        "paced": true,
        "threads": threads,
        "fsyncs": fsyncs,
        "fsyncs_per_s": fsyncs as f64 / write_seconds.max(1e-9),
        "log_pages_programmed": log_pages,
        "log_pages_per_fsync": log_pages as f64 / fsyncs.max(1) as f64,
        "commits": group.commits,
        "fsyncs_carried": group.fsyncs_carried,
        "reads": reads,
        "reads_per_s": reads as f64 / read_seconds.max(1e-9),
        "read_cache_hits": read_cache_hits,
        "tree_files": files,
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::bench::Size;

    fn number(row: &Value, field: &str) -> f64 {
        row[field].as_f64().unwrap_or_else(|| panic!("{} has no number {field}: {row}", row["workload"]))
    }

    /// Four writers share commits (paced, so commits are in flight while
    /// others prepare), and every read returned a whole file.
    #[test]
    fn writers_share_commits_and_readers_read_the_tree() {
        let row = match super::run("threads_4", Size::of(true), 7) {
            Ok(row) => row,
            Err(error) => panic!("threads_4 (seed 7): {}", error.0),
        };
        assert_eq!(number(&row, "fsyncs"), 600.0);
        assert!(number(&row, "commits") < number(&row, "fsyncs"), "{row}");
        assert!(number(&row, "log_pages_per_fsync") < 1.0, "{row}");
        assert_eq!(number(&row, "reads"), 1600.0);
        assert!(number(&row, "reads_per_s") > 0.0);
    }

    #[test]
    fn a_bad_thread_count_is_refused() {
        for name in ["threads_0", "threads_x", "threads_65"] {
            assert!(super::run(name, Size::of(true), 7).is_err(), "{name}");
        }
    }
}
