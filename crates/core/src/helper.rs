//! The helper thread: one worker kept for the process, which takes the
//! second half of a run's sealing ([`crate::protect::Protected::seal_pages`])
//! or of a flush's compression (`Fs::compress_ahead`) while the calling
//! thread does the first.
//!
//! Why one kept thread, not one a run: starting and joining a thread per
//! run (`std::thread::scope`) cost its `clone3`, its stack's `mmap`, and
//! the scheduler's wake-up, about 25 µs, on the caller's thread. A kept
//! worker costs a wake-up each way (the caller sleeps when it finishes its
//! half first), and waking it from its sleep is not cheap either: about
//! 55 µs on a 2-core virtual machine whose other CPU was idle, which is
//! why short runs are not handed over at all
//! ([`crate::protect::SEAL_PARALLEL_PAGES_MIN`]).
//!
//! Why `in_place_scope`, not `rayon::join`: a `join` from a thread outside
//! the pool hands both halves to the pool and sleeps, which an earlier
//! session measured slower than a thread a run; `in_place_scope` keeps the
//! first half on the caller and lends the second half's borrowed data to
//! the worker safely.
//!
//! The work handed over is a pure function of its inputs (a page's seal, a
//! block's compression), so which thread runs it, or whether one does at
//! all, changes no byte: determinism holds. The second half must never
//! block or take a lock: a caller may be waiting on the worker while
//! holding anything.
//!
//! When the helper is unavailable, the caller runs both halves itself
//! ([`join`]) or is told so ([`try_join`]):
//! - the host refuses the thread (a pids limit, no memory for its stack):
//!   a write does not fail, and a start is tried again after
//!   [`RETRY_AFTER_CALLS`] more calls (a count, not a clock: the engine
//!   reads none);
//! - the process is a `fork` of the one that started it: the child has
//!   no such thread, and waiting on it would never end;
//! - another caller holds it (two engines in one process, tests in
//!   parallel): queueing behind that caller's half would be slower than
//!   doing the work;
//! - the caller is itself a worker of some rayon pool, where waiting would
//!   run that pool's other jobs inside this one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Worker threads kept: the second core's worth. The caller is the first.
const HELPER_THREADS: usize = 1;

/// Calls after a refused start before the next start is tried: a host at
/// its pids limit is not asked for a thread at every run.
pub(crate) const RETRY_AFTER_CALLS: u64 = 1024;

/// The kept worker, once started, and the process that started it
/// (`STARTED` without a lock; `STARTING` serializes the starts, which a
/// refusal leaves to be tried again).
static STARTED: OnceLock<(u32, Arc<rayon::ThreadPool>)> = OnceLock::new();
static STARTING: Mutex<()> = Mutex::new(());
/// Calls left before a start is tried again after a refusal.
static RETRY_IN_CALLS: AtomicU64 = AtomicU64::new(0);
/// Whether a caller has work on the worker now.
static BUSY: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
thread_local! {
    /// Set by a test: this thread is refused the helper, as a host at its
    /// pids limit would refuse to start it.
    static HELPER_REFUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `body` with this thread refused the helper (tests only).
#[cfg(test)]
pub(crate) fn with_helper_refused<R>(body: impl FnOnce() -> R) -> R {
    HELPER_REFUSED.with(|refused| refused.set(true));
    let result = body();
    HELPER_REFUSED.with(|refused| refused.set(false));
    result
}

/// The kept worker, started on first use; `None` when the host refuses
/// it, or in a forked child of the process that started it.
fn helper() -> Option<Arc<rayon::ThreadPool>> {
    #[cfg(test)]
    if HELPER_REFUSED.with(std::cell::Cell::get) {
        return None;
    }
    let ours =
        |(process, pool): &(u32, Arc<rayon::ThreadPool>)| (*process == std::process::id()).then(|| Arc::clone(pool));
    if let Some(started) = STARTED.get() {
        return ours(started);
    }
    let _starting = STARTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(started) = STARTED.get() {
        return ours(started);
    }
    let waiting = RETRY_IN_CALLS.load(Ordering::Relaxed);
    if waiting > 0 {
        RETRY_IN_CALLS.store(waiting - 1, Ordering::Relaxed);
        return None;
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(HELPER_THREADS)
        .thread_name(|_| "flintfs-helper".to_string())
        .build();
    match built {
        Ok(pool) => ours(STARTED.get_or_init(|| (std::process::id(), Arc::new(pool)))),
        Err(error) => {
            tracing::debug!(%error, "no helper thread: this thread does the work alone");
            RETRY_IN_CALLS.store(RETRY_AFTER_CALLS, Ordering::Relaxed);
            None
        }
    }
}

/// Clears [`BUSY`] when the caller's use of the worker ends, a panic
/// included.
struct Busy;

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

/// The worker, claimed for one caller's half, or `None` when it is
/// unavailable (the module notes say when).
fn claim() -> Option<(Arc<rayon::ThreadPool>, Busy)> {
    if rayon::current_thread_index().is_some() {
        return None;
    }
    let pool = helper()?;
    if BUSY.swap(true, Ordering::Acquire) {
        return None;
    }
    Some((pool, Busy))
}

/// Runs `first` on this thread and `second` on the helper at once, and
/// returns both results; or, when the helper is unavailable, runs nothing
/// and gives both back: for work only worth doing ahead on two threads,
/// and the one mechanism [`join`] is built on. A panic in either half is
/// the caller's.
pub(crate) fn try_join<First, Second, FirstResult, SecondResult>(
    first: First,
    second: Second,
) -> Result<(FirstResult, SecondResult), (First, Second)>
where
    First: FnOnce() -> FirstResult,
    Second: FnOnce() -> SecondResult + Send,
    SecondResult: Send,
{
    let Some((pool, _busy)) = claim() else {
        return Err((first, second));
    };
    let mut second_result = None;
    let first_result = pool.in_place_scope(|scope| {
        let second_slot = &mut second_result;
        scope.spawn(move |_| *second_slot = Some(second()));
        first()
    });
    Ok((first_result, second_result.expect("the scope waits for the helper's half")))
}

/// As [`try_join`], but both halves run here, `first` then `second`, when
/// the helper is unavailable.
pub(crate) fn join<First, Second, FirstResult, SecondResult>(
    first: First,
    second: Second,
) -> (FirstResult, SecondResult)
where
    First: FnOnce() -> FirstResult,
    Second: FnOnce() -> SecondResult + Send,
    SecondResult: Send,
{
    try_join(first, second).unwrap_or_else(|(first, second)| (first(), second()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both halves run, whether on two threads or, refused the helper, on
    /// this one, and each result comes back to its side. Where the host
    /// gives the helper, it does take second halves: another test may hold
    /// it for a while, not for ten seconds.
    #[test]
    fn both_halves_run_with_the_helper_and_without_it() {
        let data: Vec<u64> = (0..10_000).collect();
        let (low, high) = data.split_at(4_000);
        let sums = |data: &[u64]| data.iter().sum::<u64>();
        let helper_thread = std::sync::Mutex::new(None);
        let started = std::time::Instant::now();
        let mut on_the_helper = false;
        while !on_the_helper && started.elapsed() < std::time::Duration::from_secs(10) {
            let (first, second) = join(
                || sums(low),
                || {
                    *helper_thread.lock().unwrap() = Some(std::thread::current().id());
                    sums(high)
                },
            );
            assert_eq!((first, second), (low.iter().sum(), high.iter().sum()));
            on_the_helper = *helper_thread.lock().unwrap() != Some(std::thread::current().id());
        }
        if helper().is_some() {
            assert!(on_the_helper, "the helper took no second half in ten seconds");
        }
        let taken = try_join(|| 1, || 2).ok();
        assert!(taken.is_none() || taken == Some((1, 2)), "try_join returns both results or none");
        assert_eq!(with_helper_refused(|| try_join(|| 1, || 2).ok()), None, "refused, try_join runs nothing");
        let (first, second) = with_helper_refused(|| {
            join(
                || sums(low),
                || {
                    *helper_thread.lock().unwrap() = Some(std::thread::current().id());
                    sums(high)
                },
            )
        });
        assert_eq!((first, second), (low.iter().sum(), high.iter().sum()));
        assert_eq!(*helper_thread.lock().unwrap(), Some(std::thread::current().id()), "refused, this thread ran it");
    }
}
