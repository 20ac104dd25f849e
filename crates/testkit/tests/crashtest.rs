//! crashtest's three modes, short and seeded, holding the engine to
//! `docs/SEMANTICS.md`. The full runs are `flintfs crashtest --mode
//! bounded` (every workload), `--mode exhaustive --operations 300` and
//! `--mode random --cuts 10000`; these take every `FLINTFS_CRASH_SAMPLE`-th
//! bounded workload (default 20) and smaller counts.

use flintfs_testkit::crashtest::{self, CrashOptions, Mode, Summary};

fn environment(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn assert_no_violations(options: &CrashOptions, summary: &Summary) {
    eprintln!("{}", crashtest::summary_json(options, summary));
    assert!(summary.cuts > 0, "no cut was made");
    assert_eq!(summary.violations, 0, "{}", crashtest::summary_json(options, summary));
}

#[test]
fn bounded_workloads_recover_as_promised() {
    let mut options = CrashOptions::new(Mode::Bounded);
    options.sample = environment("FLINTFS_CRASH_SAMPLE", 20);
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert_eq!(summary.workloads, crashtest::bounded_workloads().len().div_ceil(options.sample as usize) as u64);
    assert_no_violations(&options, &summary);
}

#[test]
fn every_cut_of_a_generated_workload_recovers_as_promised() {
    let mut options = CrashOptions::new(Mode::Exhaustive);
    options.cuts = environment("FLINTFS_CRASH_WORKLOADS", 1);
    options.operations = environment("FLINTFS_CRASH_OPERATIONS", 80);
    options.seed = environment("FLINTFS_CRASH_SEED", 11);
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert_no_violations(&options, &summary);
}

#[test]
fn random_cuts_recover_as_promised() {
    let mut options = CrashOptions::new(Mode::Random);
    options.cuts = environment("FLINTFS_CRASH_CUTS", 400);
    options.seed = environment("FLINTFS_CRASH_SEED", 5);
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert_eq!(summary.workloads, 100, "spread over 100 seeds");
    assert_no_violations(&options, &summary);
}

#[test]
fn ordered_fsync_recovers_as_promised() {
    let mut options = CrashOptions::new(Mode::Random);
    options.cuts = environment("FLINTFS_CRASH_CUTS", 400);
    options.seed = environment("FLINTFS_CRASH_SEED", 5);
    options.fsync = crashtest::FsyncMode::Ordered;
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert_no_violations(&options, &summary);
}

/// The write-pointer check is what makes `wp-check` safe: the same cuts
/// without it recover files that point at pages that never reached the
/// media.
#[test]
fn without_the_write_pointer_check_recovery_trusts_data_that_never_arrived() {
    let mut options = CrashOptions::new(Mode::Random);
    // More cuts than the checked runs: with parity in every block (8-page
    // blocks), fewer cuts land where a pointer outruns its page.
    options.cuts = environment("FLINTFS_CRASH_CUTS", 1500);
    options.seed = environment("FLINTFS_CRASH_SEED", 5);
    options.fsync = crashtest::FsyncMode::Unchecked;
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    eprintln!("{}", crashtest::summary_json(&options, &summary));
    assert!(summary.violations > 0, "unchecked recovery passed {} cuts", summary.cuts);
    // Violations of the data promises (or a file pointing at a page that
    // never reached the medium), not a mount failure.
    assert!(
        summary
            .failures
            .iter()
            .any(|failure| ["never there", "size", "is erased"].iter().any(|symptom| failure.what.contains(symptom))),
        "{}",
        crashtest::summary_json(&options, &summary)
    );
}

/// With NVM (FSMAC: a 64 KiB region, a 15 KiB log ring and the rest for
/// parked nodes): every mode, and in random mode workloads long enough
/// that the ring fills and writes home, with cuts during those write-homes
/// too.
fn nvm_options(mode: Mode) -> CrashOptions {
    let mut options = CrashOptions::new(mode);
    options.nvm_size_bytes = 64 << 10;
    options.seed = environment("FLINTFS_CRASH_SEED", 7);
    options
}

#[test]
fn with_nvm_bounded_workloads_recover_as_promised() {
    let mut options = nvm_options(Mode::Bounded);
    options.sample = environment("FLINTFS_CRASH_SAMPLE", 20);
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert_no_violations(&options, &summary);
}

#[test]
fn with_nvm_every_cut_of_a_generated_workload_recovers_as_promised() {
    let mut options = nvm_options(Mode::Exhaustive);
    options.cuts = environment("FLINTFS_CRASH_WORKLOADS", 1);
    options.operations = environment("FLINTFS_CRASH_OPERATIONS", 80);
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert_no_violations(&options, &summary);
}

#[test]
fn with_nvm_random_cuts_through_full_rings_recover_as_promised() {
    let mut options = nvm_options(Mode::Random);
    options.cuts = environment("FLINTFS_CRASH_CUTS", 200);
    options.operations = 600;
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    assert!(summary.nvm_write_homes >= 10, "the ring filled {} times", summary.nvm_write_homes);
    assert!(summary.nodes_parked >= 100, "{} nodes parked", summary.nodes_parked);
    assert!(summary.nodes_sent_home >= 10, "{} nodes sent home from a full NVM", summary.nodes_sent_home);
    assert_no_violations(&options, &summary);
}

/// The persist barrier is what makes a committed NVM frame whole: the same
/// cuts with the commit word persisted and the frame not lose records
/// whose fsync returned.
#[test]
fn with_nvm_without_the_persist_barrier_recovery_loses_what_fsync_promised() {
    let mut options = nvm_options(Mode::Random);
    options.cuts = environment("FLINTFS_CRASH_CUTS", 400);
    options.nvm_barrier = false;
    let summary = crashtest::run(&options, |_, _| {}).expect("crashtest runs");
    eprintln!("{}", crashtest::summary_json(&options, &summary));
    assert!(summary.violations > 0, "without the barrier recovery passed {} cuts", summary.cuts);
    assert!(
        summary.failures.iter().any(|failure| failure.what.contains("NVM log ends")),
        "{}",
        crashtest::summary_json(&options, &summary)
    );
}
