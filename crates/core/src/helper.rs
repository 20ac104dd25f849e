//! The helper thread: one worker kept for the process, which takes the
//! second half of a run's sealing ([`crate::protect::Protected::seal_pages`])
//! or of a flush's compression (`Fs::compress_ahead`) while the calling
//! thread does the first.
//!
//! Why one kept thread, not one a run: starting and joining a thread per
//! run (`std::thread::scope`) cost its `clone3`, its stack's `mmap`, and
//! the scheduler's wake-up, about 25 µs, on the caller's thread. A kept
//! worker costs a wake-up each way (the caller sleeps when it finishes its
//! half first).
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
//! When the helper is unavailable, the caller runs both halves itself:
//! - the host refuses the thread (a pids limit, no memory for its stack):
//!   a write does not fail, and the next call tries to start it again;
//! - another caller holds it (two engines in one process, tests in
//!   parallel): queueing behind that caller's half would be slower than
//!   doing the work;
//! - the caller is itself a worker of some rayon pool, where waiting would
//!   run that pool's other jobs inside this one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Worker threads kept: the second core's worth. The caller is the first.
const HELPER_THREADS: usize = 1;

/// The kept worker, once started (`STARTED` without a lock; `STARTING`
/// serializes the starts, which a refusal leaves to be tried again).
static STARTED: OnceLock<Arc<rayon::ThreadPool>> = OnceLock::new();
static STARTING: Mutex<()> = Mutex::new(());
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
/// it (tried again at the next call).
fn helper() -> Option<Arc<rayon::ThreadPool>> {
    #[cfg(test)]
    if HELPER_REFUSED.with(std::cell::Cell::get) {
        return None;
    }
    if let Some(pool) = STARTED.get() {
        return Some(Arc::clone(pool));
    }
    let _starting = STARTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(pool) = STARTED.get() {
        return Some(Arc::clone(pool));
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(HELPER_THREADS)
        .thread_name(|_| "flintfs-helper".to_string())
        .build();
    match built {
        Ok(pool) => Some(Arc::clone(STARTED.get_or_init(|| Arc::new(pool)))),
        Err(error) => {
            tracing::debug!(%error, "no helper thread: this thread does the work alone");
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

/// Runs `first` on this thread and `second` on the helper at once, and
/// returns both results; both run here, `first` then `second`, when the
/// helper is unavailable (the module notes say when). A panic in either is
/// the caller's.
pub(crate) fn join<First, Second, FirstResult, SecondResult>(
    first: First,
    second: Second,
) -> (FirstResult, SecondResult)
where
    First: FnOnce() -> FirstResult,
    Second: FnOnce() -> SecondResult + Send,
    SecondResult: Send,
{
    if rayon::current_thread_index().is_some() {
        return (first(), second());
    }
    let Some(pool) = helper() else {
        return (first(), second());
    };
    if BUSY.swap(true, Ordering::Acquire) {
        return (first(), second());
    }
    let _busy = Busy;
    let mut second_result = None;
    let first_result = pool.in_place_scope(|scope| {
        let second_slot = &mut second_result;
        scope.spawn(move |_| *second_slot = Some(second()));
        first()
    });
    (first_result, second_result.expect("the scope waits for the helper's half"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both halves run, whether on two threads or, refused the helper, on
    /// this one, and each result comes back to its side. Where the host
    /// gives the helper, it does take second halves: another test may hold
    /// it at one moment, not at every one of a hundred.
    #[test]
    fn both_halves_run_with_the_helper_and_without_it() {
        let data: Vec<u64> = (0..10_000).collect();
        let (low, high) = data.split_at(4_000);
        let sums = |data: &[u64]| data.iter().sum::<u64>();
        let helper_thread = std::sync::Mutex::new(None);
        let mut on_the_helper = 0;
        for _ in 0..100 {
            let (first, second) = join(
                || sums(low),
                || {
                    *helper_thread.lock().unwrap() = Some(std::thread::current().id());
                    sums(high)
                },
            );
            assert_eq!((first, second), (low.iter().sum(), high.iter().sum()));
            if *helper_thread.lock().unwrap() != Some(std::thread::current().id()) {
                on_the_helper += 1;
            }
        }
        if helper().is_some() {
            assert!(on_the_helper > 0, "the helper took no second half in a hundred");
        }
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
