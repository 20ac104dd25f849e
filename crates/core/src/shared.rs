//! One engine shared by several threads, with group commit.
//!
//! The engine is still one [`Fs`] behind one mutex: two threads never run
//! engine work at once (issue 19's split into parts with their own locks
//! is not done). What this layer adds is that a thread does not hold the
//! engine while it waits for the device, and that concurrent fsyncs share
//! one log batch and one flush:
//!
//! - **Device waits outside the lock.** The emulator answers at once and
//!   keeps simulated time. With a pacer (the bench's, which sleeps), each
//!   call waits out the device time it cost after it has let the engine
//!   go, as a file system that issues its I/O and sleeps on it does.
//!   Another thread's engine work, or its own device wait, overlaps it.
//! - **Group commit.** fsync is two halves ([`Fs`]'s prepare and commit).
//!   The prepare puts the file's blocks and state into the buffered
//!   records, as any operation's go, and is numbered with the commit it
//!   will be part of (its epoch). The first thread to find no commit in
//!   flight leads: it commits every buffered record as one batch with one
//!   flush, lets the engine go and waits out the device time. fsyncs
//!   prepared meanwhile wait for it, and the first of them leads the next
//!   commit, which carries all of theirs.
//!
//! Durability is the single-threaded engine's: every commit is a whole
//! batch and flush done under the lock, so an fsync returns only after a
//! commit that began after its prepare has finished. A leader's failure
//! leaves its records buffered (the engine's rule) and its epoch not
//! durable: a follower then leads a new commit, which carries them.
//!
//! The core reads no clock: the pacer is the caller's, and without one
//! nothing waits (commits then never overlap, and each fsync leads its
//! own).

use std::sync::{Condvar, Mutex, MutexGuard};

use flintfs_flash::FlashDevice;

use crate::error::{Error, Result};
use crate::fs::Fs;

/// How long a waiting fsync sleeps before it looks again without being
/// woken (only a thread that panicked holding the engine leaves it so: a
/// leader's panicking pacer still ends its commit).
const WAIT_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Waits out simulated device time, in nanoseconds. Called with the
/// engine let go.
pub type Pacer = Box<dyn Fn(u64) + Send + Sync>;

/// What group commit did since the engine was shared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupCommitCounters {
    /// fsyncs that needed a commit.
    pub fsyncs: u64,
    /// Commits led (each one log batch and one flush at most).
    pub commits: u64,
    /// fsyncs that a commit led by another thread made durable.
    pub fsyncs_carried: u64,
}

/// The group-commit protocol on its own, apart from threads and locks, so
/// that a test can drive it through seeded interleavings with power cuts
/// between any two steps. Every call is made with the engine locked.
///
/// An fsync prepared while epoch `e` is open waits until `e` is durable.
/// A leader takes the open epoch and commits every buffered record in the
/// same lock hold, so its commit carries every fsync prepared in that
/// epoch or an earlier one: an earlier commit that failed left its records
/// buffered, or programmed but not flushed (the log's `unflushed`), and
/// this commit's batch or flush covers them. When it finishes well, every
/// epoch up to its own is durable.
#[derive(Clone, Debug, Default)]
pub struct GroupCommit {
    /// The epoch fsyncs prepared now belong to: the next commit's.
    epoch_open: u64,
    /// Every fsync of an epoch below this is durable.
    epoch_durable: u64,
    /// The epoch of the commit in flight, if one is.
    leading: Option<u64>,
    counters: GroupCommitCounters,
}

impl GroupCommit {
    /// An fsync was prepared and owes a commit: the epoch it waits for.
    pub fn prepared(&mut self) -> u64 {
        self.counters.fsyncs += 1;
        self.epoch_open
    }

    /// Whether an fsync prepared in `epoch` is durable.
    pub fn durable(&self, epoch: u64) -> bool {
        self.epoch_durable > epoch
    }

    /// Takes the lead when no commit is in flight: the epoch the caller
    /// must now commit (with [`Fs::fsync_commit`], in the same lock hold).
    pub fn lead(&mut self) -> Option<u64> {
        if self.leading.is_some() {
            return None;
        }
        let epoch = self.epoch_open;
        self.epoch_open += 1;
        self.leading = Some(epoch);
        self.counters.commits += 1;
        Some(epoch)
    }

    /// The commit of `epoch` is over: durable if it succeeded.
    pub fn finished(&mut self, epoch: u64, succeeded: bool) {
        assert_eq!(self.leading, Some(epoch), "only the commit in flight finishes");
        self.leading = None;
        if succeeded {
            self.epoch_durable = self.epoch_durable.max(epoch + 1);
        }
    }

    /// The epoch of the commit in flight, if one is.
    pub fn in_flight(&self) -> Option<u64> {
        self.leading
    }

    /// An fsync found its epoch made durable by another's commit.
    pub fn carried(&mut self) {
        self.counters.fsyncs_carried += 1;
    }

    pub fn counters(&self) -> &GroupCommitCounters {
        &self.counters
    }
}

struct Inner<D: FlashDevice> {
    fs: Fs<D>,
    group: GroupCommit,
}

/// An engine several threads use at once. See the module's notes.
pub struct SharedFs<D: FlashDevice> {
    inner: Mutex<Inner<D>>,
    committed: Condvar,
    pacer: Option<Pacer>,
}

impl<D: FlashDevice> SharedFs<D> {
    /// Shares `fs`; `pacer`, when given, waits out each call's device time.
    pub fn new(fs: Fs<D>, pacer: Option<Pacer>) -> SharedFs<D> {
        SharedFs { inner: Mutex::new(Inner { fs, group: GroupCommit::default() }), committed: Condvar::new(), pacer }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner<D>>> {
        // A thread that panicked inside the engine may have left it half
        // changed: nothing more is done with it.
        self.inner.lock().map_err(|_| poisoned())
    }

    fn pace(&self, device_ns: u64) {
        if let Some(pacer) = &self.pacer {
            if device_ns > 0 {
                pacer(device_ns);
            }
        }
    }

    /// Runs one engine call, then waits out its device time with the
    /// engine let go.
    pub fn run<R>(&self, call: impl FnOnce(&mut Fs<D>) -> Result<R>) -> Result<R> {
        let mut guard = self.lock()?;
        let (result, spent) = timed(&mut guard.fs, call);
        drop(guard);
        self.pace(spent);
        result
    }

    /// fsync with group commit: returns once a commit that carries this
    /// file's blocks and state (and every operation before) is durable.
    /// An fsync that owes no commit (everything before it was programmed
    /// and flushed already) still waits for a commit in flight to end, so
    /// no fsync returns while the commit that made it durable is running.
    pub fn fsync(&self, ino: u64, datasync: bool) -> Result<()> {
        if ino == crate::volume::ROOT_INO {
            // The root's fsync is a sync: a checkpoint, not a log commit.
            self.run(|fs| fs.fsync(ino, datasync))?;
            return self.wait_for_commit_in_flight();
        }
        let mut guard = self.lock()?;
        let inner = &mut *guard;
        let (owed, spent) = timed(&mut inner.fs, |fs| fs.fsync_prepare(ino));
        let epoch = matches!(owed, Ok(true)).then(|| inner.group.prepared());
        drop(guard);
        self.pace(spent);
        owed?;
        let Some(epoch) = epoch else { return self.wait_for_commit_in_flight() };
        let mut guard = self.lock()?;
        loop {
            let inner = &mut *guard;
            if inner.group.durable(epoch) {
                inner.group.carried();
                return Ok(());
            }
            if let Some(leading) = inner.group.lead() {
                // Everything buffered so far, this fsync's included, goes
                // in one batch; fsyncs prepared from now on wait for the
                // next commit.
                let (result, spent) = timed(&mut inner.fs, Fs::fsync_commit);
                drop(guard);
                // A pacer that panics must still end the commit, or every
                // waiter would wait for it for ever.
                let paced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.pace(spent)));
                let succeeded = result.is_ok() && paced.is_ok();
                let relocked = self.lock().map(|mut guard| guard.group.finished(leading, succeeded));
                // Waiters wake either way: on a poisoned engine they find
                // out when they take the lock again.
                self.committed.notify_all();
                if let Err(panic) = paced {
                    std::panic::resume_unwind(panic);
                }
                relocked?;
                return result;
            }
            guard = self.wait(guard)?;
        }
    }

    /// Returns once no commit that was in flight at the call is.
    fn wait_for_commit_in_flight(&self) -> Result<()> {
        let mut guard = self.lock()?;
        let Some(in_flight) = guard.group.in_flight() else { return Ok(()) };
        while guard.group.in_flight() == Some(in_flight) {
            guard = self.wait(guard)?;
        }
        Ok(())
    }

    /// A bounded wait for a commit to end: a thread that panicked holding
    /// the engine wakes no one, and the waiters must find the poison.
    fn wait<'a>(&self, guard: MutexGuard<'a, Inner<D>>) -> Result<MutexGuard<'a, Inner<D>>> {
        Ok(self.committed.wait_timeout(guard, WAIT_RECHECK).map_err(|_| poisoned())?.0)
    }

    /// What group commit did so far.
    pub fn group_commit_counters(&self) -> Result<GroupCommitCounters> {
        Ok(self.lock()?.group.counters().clone())
    }

    /// The engine back, for an unmount: every other thread must be done.
    pub fn into_inner(self) -> Result<Fs<D>> {
        Ok(self.inner.into_inner().map_err(|_| poisoned())?.fs)
    }
}

/// `call` on the engine, and the device time it cost.
fn timed<D: FlashDevice, R>(fs: &mut Fs<D>, call: impl FnOnce(&mut Fs<D>) -> R) -> (R, u64) {
    let before = fs.device().now_ns();
    let result = call(fs);
    (result, fs.device().now_ns().saturating_sub(before))
}

fn poisoned() -> Error {
    Error::new(crate::errno::EIO, "a thread panicked inside the shared engine")
}
