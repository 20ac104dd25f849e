//! The image backend's writes and syncs, in the order they were asked
//! for, run on a writer thread rather than the caller's.
//!
//! ## Why
//! Over a FUSE mount the daemon's copy of each page into the host's page
//! cache (`pwrite` of the image) was a fifth of its time, and each
//! fdatasync a wait of milliseconds: a 512 MiB sequential write took about
//! 40 of them (a checkpoint flushes twice, a reset syncs twice), at 9 ms
//! each on this machine's disk, all inside the one engine lock. Most of
//! those syncs only order writes (pages before the records that count
//! them); none of them owes the user anything until an fsync returns.
//!
//! ## The contract
//! - Commands run one at a time, in the order queued, by whoever runs
//!   them: the writer thread, or a caller that waits (`settle`) and runs
//!   what is queued itself rather than wake the thread and sleep. So the
//!   file sees writes exactly in the order the backend made them, and no
//!   write queued after a sync starts before that sync has returned: a
//!   sync is a barrier for the host's disk, as it was when it waited.
//! - A process killed with commands queued leaves the file as a prefix of
//!   that order: the state of an earlier moment, as a power cut then
//!   would have left it. Only a wait owes more, and the emulator waits
//!   where the device promises durability (a flush, an NVM persist).
//! - A read sees every queued write: the queue is searched before the file.
//!   The one exception is a queued page slot's trailer CRC, zero until the
//!   writer fills it in as it writes ([`Command::Write`]); only an open
//!   reads trailers, and it reads the file.
//! - A write that fails stays at the queue's front, to be tried again by
//!   the next caller that runs the queue; the next wait reports it. A
//!   failed sync stops everything (the kernel may have dropped pages it
//!   could not write): nothing queued after it is ever written.
//! - The queue is bounded ([`IMAGE_QUEUED_BYTES_MAX`]); a caller past the
//!   bound runs commands itself until it is back under.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::host_file::HostFile;

/// Bytes of writes queued at most; a caller past it runs the queue itself.
pub const IMAGE_QUEUED_BYTES_MAX: usize = 64 << 20;
/// Bytes queued at which the writer thread starts on them unasked (a flush
/// that only orders starts it too; a wait runs the queue itself).
pub const IMAGE_WRITER_START_BYTES: usize = 1 << 20;
const _: () = assert!(IMAGE_WRITER_START_BYTES < IMAGE_QUEUED_BYTES_MAX);
/// Buffers kept for reuse: a new one each time would be fresh memory,
/// whose first touch costs more than the copy into it.
const SPARE_BUFFERS_MAX: usize = 8;
/// Zeros are written in pieces of this many bytes.
const ZERO_PIECE_BYTES: usize = 64 * 1024;
static ZERO_PIECE: [u8; ZERO_PIECE_BYTES] = [0; ZERO_PIECE_BYTES];
/// Free bytes the host file system must have for holes to be filled.
pub const IMAGE_ALLOCATE_AHEAD_ROOM_BYTES: u64 = 64 << 20;
const _: () = assert!(IMAGE_ALLOCATE_AHEAD_ROOM_BYTES >= 16 * ZERO_PIECE_BYTES as u64);

/// Sees every write and sync the backend makes to its file, in the order
/// the file does (tests of what a host crash leaves).
pub trait HostWriteObserver: Send {
    fn written(&mut self, offset: u64, bytes: &[u8]);
    /// Called before each fdatasync: an error stands for the fdatasync
    /// failing (a test of what follows one), and the call is not made.
    fn before_sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    fn synced(&mut self);
}

/// One step of the file's history.
pub(crate) enum Command {
    Write {
        offset: u64,
        bytes: Arc<Vec<u8>>,
        operation: &'static str,
        /// `Some(slot_bytes)`: `bytes` is whole page slots of that size
        /// whose last four bytes, the trailer's CRC, are left to the
        /// writer ([`slot_crc`]): a CRC over every slot was a twelfth of
        /// the mount daemon's time under the engine's lock in
        /// large_seq_write, and the writer thread had time to spare. Until
        /// written, the queued copy holds zeros there; only an open reads
        /// a trailer, and it reads the file.
        crc_per_slot_bytes: Option<usize>,
    },
    Sync,
    /// Zeros into every hole of `[start, end)`, best effort (allocating
    /// the host's blocks ahead of the pages that will go there).
    FillHoles {
        start: u64,
        end: u64,
    },
}

impl Command {
    fn share(&self) -> Command {
        match self {
            Command::Write { offset, bytes, operation, crc_per_slot_bytes } => Command::Write {
                offset: *offset,
                bytes: Arc::clone(bytes),
                operation,
                crc_per_slot_bytes: *crc_per_slot_bytes,
            },
            Command::Sync => Command::Sync,
            Command::FillHoles { start, end } => Command::FillHoles { start: *start, end: *end },
        }
    }

    fn queued_bytes(&self) -> usize {
        match self {
            Command::Write { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }
}

/// What went wrong: the operation and the host's error.
pub(crate) struct Failure {
    pub operation: &'static str,
    pub source: std::io::Error,
}

struct State {
    queue: VecDeque<Command>,
    queued_bytes: usize,
    /// The front command is running (it stays queued, readable, until done).
    busy: bool,
    /// The writer thread may run the queue (until it is empty).
    started: bool,
    /// A write at the front failed; reported once, then tried again.
    write_error: Option<Failure>,
    /// A sync failed: the error, until reported, and for good the refusal.
    sync_failed: bool,
    sync_error: Option<std::io::Error>,
    /// Filling holes failed once, or the host disk ran low: no more.
    allocates_ahead: bool,
    spare: Vec<Vec<u8>>,
    /// Callers waiting for a command to finish (`done`).
    waiting: u32,
    shutdown: bool,
}

impl State {
    fn runnable(&self) -> bool {
        !self.busy && !self.queue.is_empty() && self.write_error.is_none() && !self.sync_failed
    }
}

struct Shared {
    file: HostFile,
    state: Mutex<State>,
    /// The writer thread waits here for `started`. Only what starts it
    /// wakes it: a wake-up a command would cost two context switches, and
    /// an fsync's handful of commands run on its own thread.
    work: Condvar,
    /// Callers wait here for the running command to finish.
    done: Condvar,
    observer: Mutex<Option<Box<dyn HostWriteObserver>>>,
}

/// The image file and the queue of what is to be done to it.
pub(crate) struct ImageWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the state leaves it consistent: every update
    // under the lock is a few assignments that cannot panic half way.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Runs the front command; the caller set `busy`. The lock is let go
    /// for the I/O, so reads and new commands go on meanwhile.
    fn run_front<'a>(&'a self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let command = state.queue.front().expect("a runnable queue has a front").share();
        drop(state);
        let outcome = self.execute(&command);
        let (was_write, was_sync) = (matches!(command, Command::Write { .. }), matches!(command, Command::Sync));
        // Before the pop, which gives the buffer back only if no one else
        // holds it.
        drop(command);
        let mut state = lock(&self.state);
        state.busy = false;
        match outcome {
            Ok(()) => self.pop_front(&mut state),
            // A write stays at the front, to be tried again.
            Err(failure) if was_write => state.write_error = Some(failure),
            Err(failure) if was_sync => {
                state.sync_failed = true;
                state.sync_error = Some(failure.source);
                self.pop_front(&mut state);
            }
            // Filling holes is best effort: it stops for the session.
            Err(_) => {
                state.allocates_ahead = false;
                self.pop_front(&mut state);
            }
        }
        if state.waiting > 0 {
            self.done.notify_all();
        }
        // A caller that made room and went back to its work leaves the
        // rest to the thread, if it was started.
        if state.started && state.runnable() {
            self.work.notify_one();
        }
        state
    }

    fn pop_front(&self, state: &mut State) {
        let done = state.queue.pop_front().expect("the front ran");
        state.queued_bytes -= done.queued_bytes();
        if let Command::Write { bytes, .. } = done {
            if let Ok(mut buffer) = Arc::try_unwrap(bytes) {
                if state.spare.len() < SPARE_BUFFERS_MAX {
                    buffer.clear();
                    state.spare.push(buffer);
                }
            }
        }
    }

    fn execute(&self, command: &Command) -> Result<(), Failure> {
        match command {
            Command::Write { offset, bytes, operation, crc_per_slot_bytes: None } => {
                if let Some(observer) = lock(&self.observer).as_mut() {
                    observer.written(*offset, bytes);
                }
                self.file.write_all_at(bytes, *offset).map_err(|source| Failure { operation, source })
            }
            Command::Write { offset, bytes, operation, crc_per_slot_bytes: Some(slot_bytes) } => {
                assert!(*slot_bytes > 4 && bytes.len().is_multiple_of(*slot_bytes), "whole slots, each with a CRC");
                let crcs: Vec<[u8; 4]> =
                    bytes.chunks_exact(*slot_bytes).map(|slot| slot_crc(slot).to_le_bytes()).collect();
                if let Some(observer) = lock(&self.observer).as_mut() {
                    // As the file will hold them (tests only: a copy).
                    let mut whole = bytes.as_ref().clone();
                    for (slot, crc) in whole.chunks_exact_mut(*slot_bytes).zip(&crcs) {
                        slot[*slot_bytes - 4..].copy_from_slice(crc);
                    }
                    observer.written(*offset, &whole);
                }
                let pieces: Vec<&[u8]> = bytes
                    .chunks_exact(*slot_bytes)
                    .zip(&crcs)
                    .flat_map(|(slot, crc)| [&slot[..*slot_bytes - 4], &crc[..]])
                    .collect();
                self.file.write_pieces_at(&pieces, *offset).map_err(|source| Failure { operation, source })
            }
            Command::Sync => {
                let mut observer = lock(&self.observer);
                let injected = observer.as_mut().map_or(Ok(()), |observer| observer.before_sync());
                injected
                    .and_then(|()| self.file.sync_data())
                    .map_err(|source| Failure { operation: "sync", source })?;
                if let Some(observer) = observer.as_mut() {
                    observer.synced();
                }
                Ok(())
            }
            Command::FillHoles { start, end } => {
                let room =
                    host_free_bytes(self.file.file()).is_some_and(|free| free >= IMAGE_ALLOCATE_AHEAD_ROOM_BYTES);
                if !room {
                    return Err(Failure {
                        operation: "allocate ahead",
                        source: std::io::Error::other("host disk low"),
                    });
                }
                self.fill_holes(*start, *end)
            }
        }
    }

    /// Writes zeros into every hole of the file in `[start, end)`. Written
    /// bytes, data or zeros, are left alone; where the file system cannot
    /// say where its data is, nothing is written and the error returned.
    /// Run in the queue's order, so no page queued for a hole is written
    /// before the zeros, and none is overwritten by them.
    fn fill_holes(&self, start: u64, end: u64) -> Result<(), Failure> {
        let descriptor = self.file.file().as_raw_fd();
        let seek = |position: u64, whence: libc::c_int| -> std::io::Result<u64> {
            let position =
                libc::off_t::try_from(position).map_err(|_| std::io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            // SAFETY: lseek on a descriptor this backend owns; it moves
            // only the file offset, which nothing here uses (every read and
            // write is positioned).
            let found = unsafe { libc::lseek(descriptor, position, whence) };
            u64::try_from(found).map_err(|_| std::io::Error::last_os_error())
        };
        let failed = |operation: &'static str| move |source| Failure { operation, source };
        let mut position = start;
        while position < end {
            let hole = seek(position, libc::SEEK_HOLE).map_err(failed("find a hole"))?;
            if hole >= end {
                return Ok(());
            }
            // ENXIO: no data after the hole, a hole to the end of the file.
            // Any other error must not be taken for a hole.
            let data = match seek(hole, libc::SEEK_DATA) {
                Ok(data) => data.min(end),
                Err(error) if error.raw_os_error() == Some(libc::ENXIO) => end,
                Err(error) => return Err(failed("find data")(error)),
            };
            let mut offset = hole;
            while offset < data {
                let length = (data - offset).min(ZERO_PIECE_BYTES as u64) as usize;
                self.write_zeros(length, offset)?;
                offset += length as u64;
            }
            position = data;
        }
        Ok(())
    }

    fn write_zeros(&self, length: usize, offset: u64) -> Result<(), Failure> {
        if let Some(observer) = lock(&self.observer).as_mut() {
            observer.written(offset, &ZERO_PIECE[..length]);
        }
        self.file
            .write_all_at(&ZERO_PIECE[..length], offset)
            .map_err(|source| Failure { operation: "allocate ahead", source })
    }
}

/// The CRC a page slot's trailer ends with: over the slot's bytes before
/// it (data, OOB and the trailer's other fields).
pub(crate) fn slot_crc(slot: &[u8]) -> u32 {
    crc32c::crc32c(&slot[..slot.len() - 4])
}

/// Bytes an unprivileged writer may still use on the host file system.
pub(crate) fn host_free_bytes(file: &std::fs::File) -> Option<u64> {
    // SAFETY: an all-zero statvfs is a valid value, filled in by fstatvfs.
    let mut status: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs on a descriptor this backend owns, into `status`.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut status) } != 0 {
        return None;
    }
    Some(status.f_bavail.saturating_mul(status.f_frsize))
}

fn writer_thread(shared: Arc<Shared>) {
    let mut state = lock(&shared.state);
    loop {
        if state.shutdown {
            return;
        }
        if state.started && state.runnable() {
            state.busy = true;
            state = shared.run_front(state);
            if state.queue.is_empty() {
                state.started = false;
            }
            continue;
        }
        // Nothing it may run: a caller ran the queue first, or a failure
        // waits to be reported. The next `start`, or the next push past
        // the start mark, asks again.
        if !state.busy {
            state.started = false;
        }
        state = shared.work.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

impl ImageWriter {
    /// Commands on `file` run at once, by the caller, until
    /// [`ImageWriter::run_in_background`].
    pub(crate) fn new(file: HostFile) -> ImageWriter {
        let state = State {
            queue: VecDeque::new(),
            queued_bytes: 0,
            busy: false,
            started: false,
            write_error: None,
            sync_failed: false,
            sync_error: None,
            allocates_ahead: true,
            spare: Vec::new(),
            waiting: 0,
            shutdown: false,
        };
        let shared = Shared {
            file,
            state: Mutex::new(state),
            work: Condvar::new(),
            done: Condvar::new(),
            observer: Mutex::new(None),
        };
        ImageWriter { shared: Arc::new(shared), thread: None }
    }

    /// From now on a writer thread runs queued commands, and a command
    /// returns before it has run. Not for a scratch view, whose writes are
    /// only copies in memory, nor before open is done with the file.
    pub(crate) fn run_in_background(&mut self) -> std::io::Result<()> {
        if self.thread.is_some() || self.shared.file.is_scratch() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let thread =
            std::thread::Builder::new().name("flintfs-image".to_string()).spawn(move || writer_thread(shared))?;
        self.thread = Some(thread);
        Ok(())
    }

    pub(crate) fn observe(&self, observer: Box<dyn HostWriteObserver>) {
        *lock(&self.shared.observer) = Some(observer);
    }

    /// Whether a sync failed: nothing more is written or synced.
    pub(crate) fn sync_failed(&self) -> bool {
        lock(&self.shared.state).sync_failed
    }

    pub(crate) fn allocates_ahead(&self) -> bool {
        lock(&self.shared.state).allocates_ahead
    }

    /// An empty buffer to gather writes in, one a finished write gave
    /// back where there is one.
    pub(crate) fn spare_buffer(&self) -> Vec<u8> {
        lock(&self.shared.state).spare.pop().unwrap_or_default()
    }

    /// Queues `command`; an error means it was not queued (nor run). With
    /// the writer thread, a caller whose command would take the queue past
    /// [`IMAGE_QUEUED_BYTES_MAX`] first runs it until there is room: an
    /// earlier write that fails then is the error, and stays queued, to be
    /// tried again. Without the thread the command runs at once, and one
    /// that fails leaves the queue as it was.
    pub(crate) fn push(&self, command: Command) -> Result<(), Failure> {
        self.try_push(command).map_err(|(failure, _)| failure)
    }

    /// [`ImageWriter::push`], giving the command back when it failed.
    pub(crate) fn try_push(&self, command: Command) -> Result<(), (Failure, Command)> {
        let mut state = lock(&self.shared.state);
        if state.sync_failed {
            return Err((refusal(&mut state), command));
        }
        let bytes = command.queued_bytes();
        if self.thread.is_some() && state.queued_bytes + bytes > IMAGE_QUEUED_BYTES_MAX {
            state = match self.run_until(state, IMAGE_QUEUED_BYTES_MAX.saturating_sub(bytes).max(1)) {
                Ok(state) => state,
                Err(failure) => return Err((failure, command)),
            };
        }
        state.queued_bytes += bytes;
        state.queue.push_back(command);
        if self.thread.is_none() {
            assert_eq!(state.queue.len(), 1, "without the writer thread a command runs as it is queued");
            return match self.run_until(state, 0) {
                Ok(_) => Ok(()),
                Err(failure) => {
                    let mut state = lock(&self.shared.state);
                    let failed = state.queue.pop_front().expect("the failed command is still queued");
                    state.queued_bytes -= failed.queued_bytes();
                    Err((failure, failed))
                }
            };
        }
        if state.queued_bytes >= IMAGE_WRITER_START_BYTES && !state.started {
            state.started = true;
            self.shared.work.notify_one();
        }
        Ok(())
    }

    /// Whether a command is queued or running, or a failure waits to be
    /// reported: what a settle would wait for or report.
    pub(crate) fn unsettled(&self) -> bool {
        let state = lock(&self.shared.state);
        state.busy || !state.queue.is_empty() || state.write_error.is_some() || state.sync_failed
    }

    /// Lets the writer thread start on what is queued, without waiting.
    pub(crate) fn start(&self) {
        let mut state = lock(&self.shared.state);
        if !state.queue.is_empty() {
            state.started = true;
            self.shared.work.notify_one();
        }
    }

    /// Returns once every command queued has run; runs them itself while
    /// the writer thread is not running one.
    pub(crate) fn settle(&self) -> Result<(), Failure> {
        let state = lock(&self.shared.state);
        self.run_until(state, 0).map(drop)
    }

    /// Writes zeros into every hole of `[start, end)` now, on the caller's
    /// thread, once everything queued has run; unlike a queued
    /// [`Command::FillHoles`] an error is the caller's, not a reason to
    /// stop allocating ahead. The owner queues nothing meanwhile (it holds
    /// the backend mutably).
    pub(crate) fn fill_holes_now(&self, start: u64, end: u64) -> Result<(), Failure> {
        self.settle()?;
        self.shared.fill_holes(start, end)
    }

    /// The bytes the host has given the file (`st_blocks`), holes apart.
    pub(crate) fn allocated_bytes(&self) -> std::io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.shared.file.file().metadata()?.blocks().saturating_mul(512))
    }

    /// What the host's file system has free for the file.
    pub(crate) fn host_free_bytes(&self) -> Option<u64> {
        host_free_bytes(self.shared.file.file())
    }

    /// Runs (or waits for) commands until at most `bound` bytes are queued
    /// and, for a bound of 0, nothing is queued or running.
    fn run_until<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        bound: usize,
    ) -> Result<MutexGuard<'a, State>, Failure> {
        loop {
            if let Some(failure) = state.write_error.take() {
                return Err(failure);
            }
            if state.sync_failed {
                return Err(refusal(&mut state));
            }
            let done = if bound == 0 { state.queue.is_empty() && !state.busy } else { state.queued_bytes <= bound };
            if done {
                return Ok(state);
            }
            if state.runnable() {
                state.busy = true;
                state = self.shared.run_front(state);
            } else {
                // Only while the thread runs a command: it signals `done`.
                state.waiting += 1;
                state = self.shared.done.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                state.waiting -= 1;
            }
        }
    }

    /// Reads `buffer.len()` bytes at `offset`, as the file will hold them
    /// once every queued write has run (but a queued slot's trailer CRC,
    /// zero until written: see the module's contract).
    pub(crate) fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset + buffer.len() as u64;
        let state = lock(&self.shared.state);
        let overlaps = |command: &Command| match command {
            Command::Write { offset: start, bytes, .. } => *start < end && offset < *start + bytes.len() as u64,
            _ => false,
        };
        let newest = state.queue.iter().rev().find(|command| overlaps(command));
        match newest {
            // No queued write touches the range: every one that did has
            // run (it leaves the queue only once written), so the file
            // holds it. The owner queues nothing while it reads.
            None => {
                drop(state);
                self.shared.file.read_exact_at(buffer, offset)
            }
            Some(Command::Write { offset: start, bytes, .. })
                if *start <= offset && end <= *start + bytes.len() as u64 =>
            {
                let from = (offset - start) as usize;
                buffer.copy_from_slice(&bytes[from..from + buffer.len()]);
                Ok(())
            }
            // Pieces of several writes: the file, then every queued write
            // over it in order, all under the lock so none finishes (and
            // leaves the queue) between the two.
            Some(_) => {
                self.shared.file.read_exact_at(buffer, offset)?;
                for command in state.queue.iter().filter(|command| overlaps(command)) {
                    if let Command::Write { offset: start, bytes, .. } = command {
                        let from = offset.max(*start);
                        let to = end.min(*start + bytes.len() as u64);
                        buffer[(from - offset) as usize..(to - offset) as usize]
                            .copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
                    }
                }
                Ok(())
            }
        }
    }
}

/// The error of everything after a failed sync: the sync's own, each time
/// (a caller that drops one, `start`, must not hide it from the next).
fn refusal(state: &mut State) -> Failure {
    match &state.sync_error {
        Some(source) => Failure {
            operation: "sync (failed: open the image again)",
            source: match source.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(source.kind(), source.to_string()),
            },
        },
        None => Failure {
            operation: "write after a failed fdatasync (open the image again)",
            source: std::io::Error::from_raw_os_error(libc::EIO),
        },
    }
}

impl Drop for ImageWriter {
    /// What is queued goes to the file, best effort (no record claims
    /// anything after a failure), then the thread ends.
    fn drop(&mut self) {
        let _ = self.settle();
        lock(&self.shared.state).shutdown = true;
        self.shared.work.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
