//! The model and power-cut runs with the engine shared by several threads
//! (`SharedFs`), each operation run by the thread a seeded schedule picks
//! (see `flintfs_testkit::threads`): every result compared with the
//! model's, the checker and the whole tree at the end, and power cuts
//! judged by crashtest's oracle. A failure prints its seed.
//!
//! CI runs a short version; a longer one is
//! `FLINTFS_THREADS_SEEDS=20 FLINTFS_THREADS_OPERATIONS=5000 FLINTFS_THREADS_CUTS=40 cargo test --release -p flintfs-testkit --test threads`.

use flintfs_testkit::from_env;
use flintfs_testkit::runner::{spread_cut, Setup};
use flintfs_testkit::threads::run_model_threads;

#[test]
fn random_workloads_from_several_threads_match_the_model() {
    let seeds = from_env("FLINTFS_THREADS_SEEDS", 3);
    let operations = from_env("FLINTFS_THREADS_OPERATIONS", 1500);
    let setup = Setup::small();
    for seed in 1..=seeds {
        for threads in [2, 4, 8] {
            let report = run_model_threads(&setup, seed, threads, operations, 1, None)
                .unwrap_or_else(|failure| panic!("{failure}"));
            assert_eq!(report.operations, operations, "seed {seed}: every operation ran");
            assert!(!report.fired, "seed {seed}, {threads} threads: no cut was asked for, yet one fired");
            assert!(
                report.operations_by_thread.iter().all(|&ran| ran > 0),
                "seed {seed}: every thread ran operations: {:?}",
                report.operations_by_thread
            );
            assert!(report.commits > 0, "seed {seed}, {threads} threads: no fsync went through group commit");
            eprintln!(
                "seed {seed}, {threads} threads: {} operations ({:?} by thread), {} commits",
                report.operations, report.operations_by_thread, report.commits
            );
        }
    }
}

/// The same seed gives the same run: the same calls in the same order
/// from the same threads, so the same device operations.
#[test]
fn a_threaded_run_is_the_same_for_the_same_seed() {
    let setup = Setup::small();
    let first = run_model_threads(&setup, 7, 4, 400, 0, None).unwrap_or_else(|failure| panic!("{failure}"));
    let second = run_model_threads(&setup, 7, 4, 400, 0, None).unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(first.device_operations, second.device_operations);
    assert_eq!(first.operations_by_thread, second.operations_by_thread);
    assert_eq!(first.commits, second.commits);
}

#[test]
fn power_cuts_with_several_threads_recover_as_promised() {
    let seeds = from_env("FLINTFS_THREADS_CUT_SEEDS", 3);
    let operations = from_env("FLINTFS_THREADS_CUT_OPERATIONS", 600);
    let cuts = from_env("FLINTFS_THREADS_CUTS", 24);
    let setup = Setup::small();
    for seed in 200..200 + seeds {
        let threads = 2 + (seed % 3) as usize * 2;
        let total =
            run_model_threads(&setup, seed, threads, operations, 0, None).unwrap_or_else(|failure| panic!("{failure}"));
        let mut fired = 0;
        for cut in 1..=cuts {
            let cut_at = spread_cut(total.device_operations, cut, cuts, seed);
            let report = run_model_threads(&setup, seed, threads, operations, 0, Some(cut_at))
                .unwrap_or_else(|failure| panic!("{failure}"));
            fired += u64::from(report.fired);
        }
        assert_eq!(fired, cuts, "seed {seed}: every cut fell inside the run");
        eprintln!("seed {seed}, {threads} threads: {} device operations, {cuts} cuts", total.device_operations);
    }
}

/// A short run cut at every device operation, from three threads.
#[test]
fn a_power_cut_at_every_device_operation_of_a_threaded_run_recovers_as_promised() {
    let seeds = from_env("FLINTFS_THREADS_SWEEP_SEEDS", 1);
    let operations = from_env("FLINTFS_THREADS_SWEEP_OPERATIONS", 150);
    let setup = Setup::small();
    for seed in 300..300 + seeds {
        let total =
            run_model_threads(&setup, seed, 3, operations, 0, None).unwrap_or_else(|failure| panic!("{failure}"));
        for cut_at in 0..total.device_operations {
            let report = run_model_threads(&setup, seed, 3, operations, 0, Some(cut_at))
                .unwrap_or_else(|failure| panic!("{failure}"));
            assert!(report.fired, "seed {seed}: the cut at {cut_at} fell inside the run");
        }
        eprintln!("seed {seed}: a cut at each of {} device operations, three threads", total.device_operations);
    }
}
