//! The helper thread: one worker kept for the process, which takes the
//! second half of a run's sealing ([`crate::protect::Protected::seal_pages`])
//! or of a flush's compression (`Fs::compress_ahead`) while the calling
//! thread does the first.
//!
//! Why one kept thread, not one a run: starting and joining a thread per
//! run (`std::thread::scope`) cost its `clone3`, its stack's `mmap` and
//! `munmap`, and the scheduler's wake-up, about 25 µs, on the caller's
//! thread. A profile of fileserver in process put 5% of all samples in
//! the kernel's `clone3` and `munmap` alone. A kept worker costs a wake-up.
//!
//! The work handed over is a pure function of its inputs (a page's seal, a
//! block's compression), so which thread runs it, or whether one does at
//! all, changes no byte: determinism holds. The worker is `rayon`'s (a
//! pool of one), which lends borrowed data to another thread safely
//! (`in_place_scope`).
//!
//! A host that refuses the thread (a pids limit, no memory for its stack)
//! does not fail a write: the caller runs both halves, and the next call
//! tries to start the worker again.

use std::sync::{Arc, Mutex};

/// Worker threads kept: the second core's worth. The caller is the first.
const HELPER_THREADS: usize = 1;

/// The kept worker, once started.
static HELPER: Mutex<Option<Arc<rayon::ThreadPool>>> = Mutex::new(None);

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
    let mut helper = HELPER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if helper.is_none() {
        let built = rayon::ThreadPoolBuilder::new()
            .num_threads(HELPER_THREADS)
            .thread_name(|_| "flintfs-helper".to_string())
            .build();
        match built {
            Ok(pool) => *helper = Some(Arc::new(pool)),
            Err(error) => {
                tracing::debug!(%error, "no helper thread: this thread does the work alone");
                return None;
            }
        }
    }
    helper.clone()
}

/// Runs `first` on this thread and `second` on the helper at once, and
/// returns both results; both run here, `first` then `second`, when the
/// helper cannot be had. A panic in either is the caller's.
pub(crate) fn join<First, Second, FirstResult, SecondResult>(
    first: First,
    second: Second,
) -> (FirstResult, SecondResult)
where
    First: FnOnce() -> FirstResult,
    Second: FnOnce() -> SecondResult + Send,
    SecondResult: Send,
{
    let Some(pool) = helper() else {
        return (first(), second());
    };
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
    /// this one, and each result comes back to its side.
    #[test]
    fn both_halves_run_with_the_helper_and_without_it() {
        let data: Vec<u64> = (0..10_000).collect();
        let (low, high) = data.split_at(4_000);
        let sums = |data: &[u64]| data.iter().sum::<u64>();
        let helper_thread = std::sync::Mutex::new(None);
        let (first, second) = join(
            || sums(low),
            || {
                *helper_thread.lock().unwrap() = Some(std::thread::current().id());
                sums(high)
            },
        );
        assert_eq!((first, second), (low.iter().sum(), high.iter().sum()));
        assert_ne!(*helper_thread.lock().unwrap(), Some(std::thread::current().id()), "the helper ran the second half");
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
