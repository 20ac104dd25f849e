//! Group commit (issue 19): several writers' fsyncs share one log batch
//! and one flush, and every fsync that returned survives a power cut.
//!
//! Two kinds of run:
//! - **Seeded interleavings.** Logical writers, each a state machine, are
//!   driven in one OS thread by a seeded scheduler through the engine's two
//!   fsync halves and the [`GroupCommit`] protocol `SharedFs` runs, with a
//!   power cut after a seeded step. The same seed gives the same
//!   interleaving, and a failure prints it.
//! - **Threads.** `SharedFs` under real threads with a pacer that sleeps,
//!   so commits are in flight while other fsyncs prepare; the OS
//!   schedules, so only what holds for every interleaving is asserted.

use std::sync::Arc;

use flintfs_core::{Fs, FsOptions, GroupCommit, ManualClock, MkfsOptions, SharedFs};
use flintfs_flash::{DeviceOptions, FaultConfig, Geometry, MemoryFlash};

fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks: 4,
        zone_count: 64,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

fn fresh(fault_seed: u64) -> (MemoryFlash, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(
        geometry(),
        DeviceOptions { faults: FaultConfig::none(fault_seed), ..DeviceOptions::default() },
    )
    .unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    (flash, clock)
}

/// A small deterministic generator (xorshift64*), so the test needs no
/// crate for its schedule.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// A writer's file `index`: its name and its bytes (a few hundred, some
/// compressible, so some ride in the record and some take a page).
fn file(writer: usize, index: usize) -> (Vec<u8>, Vec<u8>) {
    let name = format!("f{index:03}").into_bytes();
    let length = 300 + (writer * 977 + index * 131) % 5000;
    let bytes = (0..length).map(|at| ((at / (1 + index % 7)) as u8) ^ (writer as u8 * 31)).collect();
    (name, bytes)
}

/// One logical writer: creates its files one at a time, each written and
/// fsynced, in its own directory.
#[derive(Clone, Copy, Debug)]
enum Writer {
    /// About to create file `next`.
    Ready {
        next: usize,
    },
    /// File `index` is prepared in `epoch` and waits.
    Waiting {
        index: usize,
        epoch: u64,
    },
    /// Leads the commit of `epoch`, done in the engine (or, `failed`,
    /// given up on before it programmed anything); not yet finished.
    Leading {
        index: usize,
        epoch: u64,
        failed: bool,
    },
    Done,
}

const WRITERS: usize = 4;
const FILES_PER_WRITER: usize = 12;

/// What happened in one interleaving, so the tests can hold the seeds to
/// having reached the cases that matter.
#[derive(Debug, Default)]
struct Seen {
    commits: u64,
    fsyncs: u64,
    carried: u64,
    failed_commits: u64,
    /// Checkpoints taken while some fsync was prepared and not committed.
    checkpoints_between: u64,
}

/// Runs the seeded interleaving until step `cut_at` (or the end), cuts the
/// power, recovers, and checks that every file whose fsync returned is
/// there with its bytes. A leader fails its commit one time in six (it
/// gives up before programming anything, as a commit whose batch no zone
/// took would), and one step in sixteen is a checkpoint. With
/// `cut_at_suspect_return`, the cut also comes at once when an fsync
/// returns as carried while the last commit failed and nothing made its
/// records durable since: a protocol that counts a failed commit as
/// durable loses that fsync there (a later commit would hide it).
fn interleaving(seed: u64, cut_at: u64, cut_at_suspect_return: bool) -> Seen {
    let (flash, clock) = fresh(seed);
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let directories: Vec<u64> =
        (0..WRITERS).map(|writer| fs.mkdir(1, format!("w{writer}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    fs.sync().unwrap();
    let mut group = GroupCommit::default();
    let mut writers = [Writer::Ready { next: 0 }; WRITERS];
    let mut returned: Vec<(usize, usize)> = Vec::new();
    let mut schedule = Schedule(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut seen = Seen::default();
    let mut failed_since_durable = false;
    let mut step = 0u64;
    while step < cut_at {
        let live: Vec<usize> = (0..WRITERS).filter(|&writer| !matches!(writers[writer], Writer::Done)).collect();
        if live.is_empty() {
            break;
        }
        step += 1;
        if schedule.below(16) == 0 {
            if writers.iter().any(|writer| matches!(writer, Writer::Waiting { .. })) {
                seen.checkpoints_between += 1;
            }
            fs.sync().unwrap_or_else(|error| panic!("seed {seed}: checkpoint: {error}"));
            failed_since_durable = false;
            continue;
        }
        let writer = live[schedule.below(live.len() as u64) as usize];
        writers[writer] = match writers[writer] {
            Writer::Ready { next } if next == FILES_PER_WRITER => Writer::Done,
            Writer::Ready { next } => {
                let (name, bytes) = file(writer, next);
                let ino = fs.create(directories[writer], &name, 0o644, 0, 0).unwrap().ino;
                fs.write(ino, 0, &bytes).unwrap();
                let owed = fs.fsync_prepare(ino).unwrap_or_else(|error| panic!("seed {seed}: prepare: {error}"));
                fs.forget(ino, 1).unwrap();
                if owed {
                    Writer::Waiting { index: next, epoch: group.prepared() }
                } else {
                    returned.push((writer, next));
                    Writer::Ready { next: next + 1 }
                }
            }
            Writer::Waiting { index, epoch } if group.durable(epoch) => {
                group.carried();
                returned.push((writer, index));
                if cut_at_suspect_return && failed_since_durable {
                    break;
                }
                Writer::Ready { next: index + 1 }
            }
            Writer::Waiting { index, epoch } => match group.lead() {
                Some(leading) => {
                    assert!(leading >= epoch, "seed {seed}: a leader commits its own epoch or a later one");
                    let failed = schedule.below(6) == 0;
                    if !failed {
                        fs.fsync_commit().unwrap_or_else(|error| panic!("seed {seed}: commit: {error}"));
                    }
                    Writer::Leading { index, epoch: leading, failed }
                }
                // Another writer's commit is in flight: wait for it.
                None => Writer::Waiting { index, epoch },
            },
            Writer::Leading { index, epoch, failed } => {
                group.finished(epoch, !failed);
                failed_since_durable = failed;
                if failed {
                    // Its fsync returned an error: nothing is promised of
                    // the file, and the writer goes on to the next.
                    seen.failed_commits += 1;
                } else {
                    returned.push((writer, index));
                }
                Writer::Ready { next: index + 1 }
            }
            Writer::Done => Writer::Done,
        };
    }
    let counters = group.counters().clone();
    (seen.commits, seen.fsyncs, seen.carried) = (counters.commits, counters.fsyncs, counters.fsyncs_carried);
    let mut flash = fs.into_device();
    flash.power_cut(seed).unwrap();
    flash.power_on();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone()))
        .unwrap_or_else(|error| panic!("seed {seed}, cut after step {step}: recovery: {error}"));
    for &(writer, index) in &returned {
        let (name, bytes) = file(writer, index);
        let found = fs.lookup(directories[writer], &name).unwrap_or_else(|error| {
            panic!("seed {seed}, cut after step {step}: writer {writer} file {index}: {error}")
        });
        let read = fs.read(found.ino, 0, bytes.len() as u64 + 1).unwrap();
        assert!(read == bytes, "seed {seed}, cut after step {step}: writer {writer} file {index} reads back changed");
    }
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "seed {seed}, cut after step {step}: {:#?}", report.findings);
    seen
}

/// Seeded interleavings with a power cut after a seeded step: every fsync
/// that returned is back after recovery, whoever led its commit.
#[test]
fn every_returned_fsync_survives_a_cut_in_seeded_interleavings() {
    let seeds: u64 = std::env::var("FLINTFS_GROUP_COMMIT_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(48);
    let mut total = Seen::default();
    for seed in 1..=seeds {
        let mut schedule = Schedule(seed | 1);
        // Each writer takes about three steps a file.
        let cut_at = 1 + schedule.below((WRITERS * FILES_PER_WRITER * 3) as u64);
        let seen = interleaving(seed, cut_at, false);
        interleaving(seed, u64::MAX, true);
        total.carried += seen.carried;
        total.failed_commits += seen.failed_commits;
        total.checkpoints_between += seen.checkpoints_between;
    }
    // The seeds reach the cases that matter: fsyncs made durable by
    // another's commit, commits that failed (their followers must lead
    // again), and checkpoints between a prepare and its commit.
    assert!(total.carried > 0 && total.failed_commits > 0 && total.checkpoints_between > 0, "{total:?}");
}

/// Run to the end, interleaved writers share commits: fewer commits than
/// fsyncs that owed one, over the seeds together.
#[test]
fn seeded_interleavings_share_commits() {
    let (mut commits, mut fsyncs) = (0, 0);
    for seed in 1..=8 {
        let seen = interleaving(seed, u64::MAX, false);
        // A failed commit's fsyncs may take a second one.
        assert!(seen.commits <= seen.fsyncs + seen.failed_commits, "seed {seed}: {seen:?}");
        commits += seen.commits;
        fsyncs += seen.fsyncs;
    }
    assert!(fsyncs > 0);
    assert!(commits * 4 < fsyncs * 3, "{commits} commits for {fsyncs} fsyncs: too few shared");
}

/// Real threads on `SharedFs`, paced by a sleep so commits are in flight
/// while others prepare: commits were shared, and every file is there
/// after a cut. The cut comes once the threads are done (the device is
/// the engine's until then), so this holds SharedFs's own code to the
/// promise only weakly; the seeded interleavings above hold the protocol.
#[test]
fn threads_share_commits_and_every_fsync_survives_a_cut() {
    const THREADS: usize = 6;
    const FILES: usize = 20;
    let (flash, clock) = fresh(3);
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let directories: Vec<u64> =
        (0..THREADS).map(|writer| fs.mkdir(1, format!("w{writer}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    fs.sync().unwrap();
    // A tenth of the device time, at least 50 us: long enough to overlap.
    let pacer: flintfs_core::Pacer =
        Box::new(|nanoseconds| std::thread::sleep(std::time::Duration::from_nanos((nanoseconds / 10).max(50_000))));
    let shared = Arc::new(SharedFs::new(fs, Some(pacer)));
    let handles: Vec<_> = (0..THREADS)
        .map(|writer| {
            let shared = Arc::clone(&shared);
            let directory = directories[writer];
            std::thread::spawn(move || {
                for index in 0..FILES {
                    let (name, bytes) = file(writer, index);
                    let ino = shared.run(|fs| fs.create(directory, &name, 0o644, 0, 0)).unwrap().ino;
                    shared.run(|fs| fs.write(ino, 0, &bytes)).unwrap();
                    shared.fsync(ino, false).unwrap();
                    shared.run(|fs| fs.forget(ino, 1)).unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("a writer panicked");
    }
    let shared = Arc::into_inner(shared).expect("every thread is done");
    let counters = shared.group_commit_counters().unwrap();
    assert!(counters.commits < counters.fsyncs, "{counters:?}: no commit was shared");
    assert_eq!(counters.commits + counters.fsyncs_carried, counters.fsyncs, "{counters:?}");
    let mut flash = shared.into_inner().unwrap().into_device();
    flash.power_cut(5).unwrap();
    flash.power_on();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    for (writer, &directory) in directories.iter().enumerate() {
        for index in 0..FILES {
            let (name, bytes) = file(writer, index);
            let ino = fs.lookup(directory, &name).unwrap().ino;
            assert!(fs.read(ino, 0, bytes.len() as u64 + 1).unwrap() == bytes, "writer {writer} file {index}");
        }
    }
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}
