//! The model and power-cut runs with the engine shared by several OS
//! threads through [`SharedFs`], deterministically.
//!
//! The operations are the single-threaded runs' (the same generator over
//! the same model), but each is run by the thread a seeded schedule picks:
//! a thread waits for its turn, runs its operation (path lookups, the
//! call, the references let go, as the kernel's requests would) and hands
//! the turn on. So every run of a seed makes the same calls in the same
//! order from the same threads, and a failure names the seed, the
//! operation and the thread. fsync goes through `SharedFs::fsync` (its
//! prepare and commit halves and the group-commit protocol), everything
//! else through `SharedFs::run`.
//!
//! Turns are whole operations, so the engine sees the calls of several
//! threads interleaved but never two at once (it is one mutex, and an
//! fsync's halves are not split by another thread here): each commit
//! carries the one fsync that led it. The finer
//! interleavings of group commit, with other fsyncs prepared between a
//! leader's prepare and its commit, are `crates/core/tests/group_commit.rs`'s.
//!
//! A remount needs the engine owned, which no one thread has: the runs
//! here take a sync in its place.

use std::sync::{Condvar, Mutex};

use flintfs_core::{errno, Fs, SharedFs};
use flintfs_flash::MemoryFlash;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use crate::model::{Generator, Model, Operation, Outcome};
use crate::runner::{apply_on, describe_difference, recover_after_cut, resolve, Setup, Subject};

/// Most threads a run takes: the schedule is a thread index per operation.
pub const THREADS_MAX: usize = 16;

/// How a threaded run went.
#[derive(Clone, Debug, Default)]
pub struct ThreadsReport {
    /// Operations run, and how many each thread ran.
    pub operations: u64,
    pub operations_by_thread: Vec<u64>,
    /// Commits group commit led, and fsyncs it made durable.
    pub commits: u64,
    /// Device operations the run took, from the mount (for choosing cuts).
    pub device_operations: u64,
    /// Whether a scheduled power cut fired.
    pub fired: bool,
}

/// Whose turn it is, and what the operations returned.
struct Turns {
    next: usize,
    /// Set when the power went, or the checker found something: no more
    /// turns.
    stopped: bool,
    /// What the checker found (or a failure or panic), after which
    /// operation, on which thread.
    findings: Option<(usize, usize, String)>,
    outcomes: Vec<Option<Outcome>>,
}

/// Runs `operations` operations from `seed` on the engine shared by
/// `threads` threads, one at a time in a seeded order, every result
/// compared with the model's, and the checker run every `check_every`
/// operations (0: never) by the thread that ran it. With `cut_at`, a power
/// cut at that device operation (counted from the mount), then the
/// recovery judged as `run_power_cut` judges it. Without, the checker and
/// the whole tree at the end.
pub fn run_model_threads(
    setup: &Setup,
    seed: u64,
    threads: usize,
    operations: u64,
    check_every: u64,
    cut_at: Option<u64>,
) -> Result<ThreadsReport, String> {
    assert!((1..=THREADS_MAX).contains(&threads), "1 to {THREADS_MAX} threads");
    let fail = |what: String| match cut_at {
        Some(cut_at) => format!("seed {seed}, {threads} threads, cut at device operation {cut_at}: {what}"),
        None => format!("seed {seed}, {threads} threads: {what}"),
    };
    let (flash, clock) = setup.formatted(seed);
    let (mut fs, _) =
        Fs::mount(flash, setup.options.clone(), Box::new(clock.clone())).map_err(|error| fail(error.to_string()))?;
    let start = fs.device().mutating_operations();
    if let Some(cut_at) = cut_at {
        fs.volume_mut()
            .device_mut()
            .schedule_power_cut(start + cut_at, seed)
            .map_err(|error| fail(error.to_string()))?;
    }
    // The whole plan first: the model does not depend on the engine.
    let mut model = Model::for_page_size(setup.geometry.page_size_bytes as usize);
    let start_model = model.clone();
    let mut generator = Generator::new(seed, u64::from(setup.geometry.page_size_bytes) * 6);
    let mut schedule = Pcg64::seed_from_u64(seed ^ 0x7423_ad5e);
    let mut plan: Vec<(Operation, Outcome, usize)> = Vec::new();
    for _ in 0..operations {
        let operation = match generator.next(&model) {
            Operation::Remount => Operation::Sync,
            operation => operation,
        };
        let expected = model.apply(&operation);
        plan.push((operation, expected, schedule.random_range(0..threads)));
    }
    let shared = SharedFs::new(fs, None);
    let turns = Mutex::new(Turns { next: 0, stopped: false, findings: None, outcomes: vec![None; plan.len()] });
    let turned = Condvar::new();
    std::thread::scope(|scope| {
        for me in 0..threads {
            let (shared, turns, turned, plan, clock) = (&shared, &turns, &turned, &plan, &clock);
            scope.spawn(move || loop {
                let index = {
                    let mut state = turns.lock().expect("no thread panics holding the turns");
                    while !state.stopped && state.next < plan.len() && plan[state.next].2 != me {
                        state = turned.wait(state).expect("no thread panics holding the turns");
                    }
                    if state.stopped || state.next >= plan.len() {
                        return;
                    }
                    state.next
                };
                // A panic in the turn (an engine assertion) ends the run
                // with the seed, instead of leaving every other thread
                // waiting for a turn that never passes.
                let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // As the single-threaded run moves it: a step, and a
                    // nanosecond for the operation.
                    clock.advance(setup.step_ns);
                    clock.advance(1);
                    let outcome = run_shared(shared, &plan[index].0);
                    let powered_off = shared.run(|fs| Ok(fs.device().is_powered_off()))?;
                    // The checker, in the same turn, on the state this
                    // thread left (a cut leaves nothing to check until
                    // recovery).
                    let findings = if !powered_off && check_every > 0 && (index as u64).is_multiple_of(check_every) {
                        match shared.run(|fs| fs.check()) {
                            Ok(report) if report.is_clean() => None,
                            Ok(report) => Some(format!("{:#?}", report.findings)),
                            Err(error) => Some(error.to_string()),
                        }
                    } else {
                        None
                    };
                    Ok::<_, flintfs_core::Error>((outcome, powered_off, findings))
                }));
                let (outcome, powered_off, findings) = match turn {
                    Ok(Ok(done)) => done,
                    Ok(Err(error)) => (Outcome::Error(error.errno), false, Some(format!("the engine failed: {error}"))),
                    Err(panic) => {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                            .unwrap_or_default();
                        (Outcome::Error(errno::EIO), false, Some(format!("panicked: {message}")))
                    }
                };
                let mut state = turns.lock().expect("no thread panics holding the turns");
                state.outcomes[index] = Some(outcome);
                state.next += 1;
                state.stopped = powered_off || findings.is_some();
                if let Some(findings) = findings {
                    state.findings = Some((index, me, findings));
                }
                drop(state);
                turned.notify_all();
            });
        }
    });
    let turns = turns.into_inner().map_err(|_| fail("a thread panicked".into()))?;
    if let Some((index, thread, findings)) = &turns.findings {
        return Err(fail(format!("after operation {index} {:?} on thread {thread}: {findings}", plan[*index].0)));
    }
    let ran = turns.outcomes.iter().take_while(|outcome| outcome.is_some()).count();
    let mut report =
        ThreadsReport { operations: ran as u64, operations_by_thread: vec![0; threads], ..ThreadsReport::default() };
    for (_, _, thread) in &plan[..ran] {
        report.operations_by_thread[*thread] += 1;
    }
    let counters = shared.group_commit_counters().map_err(|error| fail(error.to_string()))?;
    report.commits = counters.commits;
    let fs = shared.into_inner().map_err(|error| fail(error.to_string()))?;
    report.fired = fs.device().is_powered_off();
    // Every operation before the one the cut fell in (all of them without
    // a cut) returned what the model did.
    let compared = if report.fired { ran.saturating_sub(1) } else { ran };
    for (index, ((operation, expected, thread), outcome)) in plan.iter().zip(&turns.outcomes).take(compared).enumerate()
    {
        let actual = outcome.as_ref().expect("ran");
        if actual != expected {
            return Err(fail(format!(
                "operation {index} {operation:?} on thread {thread}: engine {actual:?}, model {expected:?}"
            )));
        }
    }
    if report.fired {
        let returned = turns.outcomes[ran - 1] == Some(Outcome::Done);
        let applied: Vec<Operation> = plan[..ran].iter().map(|(operation, _, _)| operation.clone()).collect();
        recover_after_cut(setup, seed, fs.into_device(), clock, &start_model, &applied, returned).map_err(fail)?;
        return Ok(report);
    }
    report.device_operations = fs.device().mutating_operations() - start;
    let mut subject = Subject::from_fs(fs, clock, setup.options.clone());
    subject.check().map_err(fail)?;
    let snapshot = subject.snapshot().map_err(fail)?;
    if snapshot != model.snapshot() {
        return Err(fail(describe_difference(&model.snapshot(), &snapshot)));
    }
    Ok(report)
}

/// One operation through the shared engine, as `Subject::apply` runs it
/// on an owned one: fsync by group commit, the rest as one call.
fn run_shared(shared: &SharedFs<MemoryFlash>, operation: &Operation) -> Outcome {
    let mut held = Vec::new();
    let outcome = match operation {
        Operation::Fsync { path, data_only } => match shared.run(|fs| Ok(resolve(fs, &mut held, path))) {
            Ok(Ok(ino)) => match shared.fsync(ino, *data_only) {
                Ok(()) => Outcome::Done,
                Err(error) => Outcome::Error(error.errno),
            },
            Ok(Err(code)) => Outcome::Error(code),
            Err(error) => Outcome::Error(error.errno),
        },
        operation => match shared.run(|fs| Ok(apply_on(fs, &mut held, operation))) {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(code)) => Outcome::Error(code),
            Err(error) => Outcome::Error(error.errno),
        },
    };
    // The references the lookups took, let go as the kernel would.
    let forgotten = shared.run(|fs| {
        for ino in held {
            fs.forget(ino, 1)?;
        }
        Ok(())
    });
    match forgotten {
        Ok(()) => outcome,
        Err(_) => Outcome::Error(errno::EIO),
    }
}
