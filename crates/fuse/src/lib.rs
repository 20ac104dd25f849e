//! # flintfs-fuse: the FUSE adapter
//!
//! Maps kernel requests onto [`flintfs_core::Fs`] and its errors onto
//! errnos. It holds no file system logic: every decision is the core's.
//!
//! ## Threads
//! The session runs [`WORKER_THREADS`] workers (and, over io_uring, one
//! thread per CPU serves that CPU's queue). The core is one state
//! machine behind one mutex, so requests are serialised inside the core;
//! the workers let the kernel keep a request queued while another one is
//! being answered, and let a slow fsync not stall replies being written.
//!
//! ## Transports
//! Requests come on `/dev/fuse`, read by fuser's session, or over io_uring
//! ([`ring`]), where the kernel offers it and the mount asks for it: one
//! queue per CPU, answered on the CPU that made the request. Both
//! transports call the same methods here (the `*_as`, `*_with` and
//! `*_into` helpers, and `call`), so a request is answered alike whichever
//! way it came.
//!
//! ## Kernel caching, and why
//! - **Attribute and entry timeouts** of [`ATTRIBUTE_TTL`] (an hour, as
//!   long as a kernel file system keeps them): the engine is owned by this
//!   daemon, so every change reaches it through this one mount, and the
//!   kernel updates or drops its own caches on the replies (a write drops
//!   the cached size, times and blocks; an unlink or rename the inode's
//!   attributes and the names; a link returns the new count). Nothing
//!   changes behind its back. After `powercut` the engine is gone and
//!   every request fails until the mount is replaced; what the kernel
//!   already holds (names, attributes, pages read before the cut) it may
//!   still answer from until then, as a kernel file system's caches
//!   outlive a yanked disk. The next mount starts with nothing cached.
//! - **No open, no opendir, no flush** (the kernel's zero-message open):
//!   `open`, `opendir` and `flush` answer ENOSYS, after which the kernel
//!   sends none of them, nor `release`. None of them has work to do here
//!   (a file is ready once looked up, and the kernel writes a file's
//!   dirty pages back before the FLUSH it would send, so close has
//!   nothing left to do here). Opening and closing a
//!   file then costs no request, where it cost three. The kernel then
//!   keeps each file's page cache across opens, and caches directory
//!   listings, dropping a listing whenever an entry changes through the
//!   mount: both are never stale, for the reason above. A kernel that
//!   does not offer this (before Linux 4.14 for files, 5.1 for
//!   directories) gets handles that keep the caches instead.
//! - **The kernel's writeback cache** (`-o nowriteback_cache` turns it
//!   off). A write(2) returns once its bytes are in the kernel's page
//!   cache, and the kernel sends them on in requests of up to
//!   [`MAX_WRITE_BYTES`] when it writes back: at fsync and fdatasync
//!   (before the FSYNC request, so the engine's fsync covers them), at
//!   close(2) (the kernel writes a file's dirty pages back before the
//!   FLUSH it then does not send, and close returns a refusal), at
//!   syncfs(2) (`flintfs sync` calls it before its checkpoint), at
//!   unmount, and on its own timer. Small writes then cost a copy, not a
//!   round trip each. `docs/SEMANTICS.md` ("What a mount adds") says
//!   which promises move with it, and why they still hold at every
//!   persistence point a program makes.
//! - **ENOSPC under the writeback cache.** The kernel takes a write into
//!   its cache without asking the file system, so a full device refuses
//!   the write-back, not the write(2). The kernel reports that refusal at
//!   close(2), fsync and fdatasync only: `dd if=/dev/zero` onto a full
//!   mount would never end. So a refusal for want of space is remembered
//!   for the file, and the kernel told to drop the file's cached
//!   attributes (FUSE_NOTIFY_INVAL_INODE, the attributes only). Before its
//!   next write(2) the kernel must then ask for them, with the file's
//!   handle (FUSE_GETATTR_FH), and that GETATTR answers ENOSPC, once:
//!   write(2) fails there as it would on a kernel file system, a little
//!   later (what the kernel held dirty when the refusal came, at most the
//!   mount's dirty limit, 1% of the system's, is lost and reported by
//!   close and fsync too). Without the cache every write(2) is one WRITE
//!   request (the kernel then asks for nothing else: see
//!   FUSE_HANDLE_KILLPRIV_V2 in `init`), and a write that returned is in
//!   the engine.
//! - **Readahead of [`READAHEAD_BYTES_DEFAULT`]** (`-o readahead=SIZE`).
//!   The kernel offers a FUSE mount 128 KiB at INIT and takes no more
//!   there; a sequential reader then waits for one round trip of at most
//!   128 KiB at a time, and the two workers sit idle between them. The
//!   mount's backing device (`/sys/class/bdi/MAJOR:MINOR`) takes a larger
//!   window from root after the mount ([`set_readahead`]). The kernel
//!   grows the window only for a stream of read(2)s it sees is sequential
//!   (a random 4 KiB read still asks for 4 KiB), and never past a file's
//!   end. A page fault in a mapped file is different: the kernel reads
//!   the whole window around it (up to the file's end) until a hundred
//!   such faults have missed, as on any device, so a program that maps a
//!   large file and touches it at random (a database) reads up to 4 MiB a
//!   fault where it read 128 KiB; `-o readahead=128K` or `madvise(
//!   MADV_RANDOM)` keeps it as it was. What the kernel reads ahead is the
//!   engine's, as any read is, so nothing stale is cached.

pub mod ring;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flintfs_core::{
    Attributes, Clock, DirectoryEntry, Error, Fs, RenameFlags as CoreRenameFlags, SetAttributes, SetIdOnWrite,
    XattrFlags,
};
use flintfs_flash::FlashDevice;
use flintfs_format::FileType as CoreFileType;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

/// How long the kernel may trust attributes and entries it was given
/// (see the module's account of why a long time is safe).
pub const ATTRIBUTE_TTL: Duration = Duration::from_secs(3600);
/// The largest write request asked of the kernel (it also bounds it by
/// its own page limit, 256 pages unless raised).
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// The readahead window a mount asks of the kernel (see the module's
/// account): 1 MiB gave 630-750 MB/s and 4 MiB 600-945 MB/s for `dd bs=4k`
/// of a 1 GiB incompressible file here, against 310-445 at the kernel's
/// 128 KiB; 8 and 16 MiB gave no more.
pub const READAHEAD_BYTES_DEFAULT: u64 = 4 << 20;
/// The smallest window but none: the kernel counts whole pages.
pub const READAHEAD_BYTES_MIN: u64 = 4096;
/// The largest readahead window `-o readahead=` takes: the kernel holds a
/// window's pages in its cache before the reader gets to them.
pub const READAHEAD_BYTES_MAX: u64 = 64 << 20;
const _: () = assert!(READAHEAD_BYTES_MIN <= READAHEAD_BYTES_DEFAULT && READAHEAD_BYTES_DEFAULT <= READAHEAD_BYTES_MAX);
const _: () = assert!(READAHEAD_BYTES_DEFAULT >= MAX_WRITE_BYTES as u64);
/// Session worker threads.
pub const WORKER_THREADS: usize = 2;
/// Entries asked of the core per readdir reply (the reply buffer bounds
/// what is sent; the rest is asked again from the last cookie).
pub const READDIR_BATCH_ENTRIES: usize = 128;

const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;

/// Wall-clock time for a real mount. The core reads no clock of its own;
/// this is the input it is given.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
    }
}

/// The mounted engine, shared between the session's workers and the
/// daemon (which runs idle work and answers `stat` and `powercut`).
pub struct Shared<D: FlashDevice> {
    fs: Mutex<Option<Fs<D>>>,
    requests: AtomicU64,
    /// Of those, FORGETs: messages the kernel sends without waiting for an
    /// answer (and batches), so they cost no round trip.
    forgets: AtomicU64,
    /// Of those, the ones answered over io_uring ([`ring`]).
    ring_requests: AtomicU64,
    /// FORGETs not yet given to the engine, and how many. A FORGET takes
    /// no answer, so the thread that reads it need not contend for the
    /// engine with the one answering the caller's next request (on
    /// another CPU: a lock handed across CPUs is a wakeup there too). The
    /// next request's thread applies them first, under the engine's lock.
    forgets_pending: Mutex<Vec<(u64, u64)>>,
    forgets_pending_count: std::sync::atomic::AtomicUsize,
    /// Files whose write-back the engine refused for want of space, under
    /// the kernel's writeback cache: the next write(2) to each (or fstat)
    /// is told ENOSPC (see [`FlintFuse::write_back_refused`]). At most
    /// [`WRITE_BACKS_REFUSED_MAX`].
    write_backs_refused: Mutex<std::collections::HashSet<u64>>,
    write_backs_refused_count: std::sync::atomic::AtomicUsize,
    /// How the daemon tells the kernel to drop what it caches of a file,
    /// set once the session exists.
    notifier: std::sync::OnceLock<fuser::Notifier>,
}

/// FORGETs held back at most; past this the reading thread applies them.
pub const FORGETS_PENDING_MAX: usize = 1024;
/// ENOSPC refusals logged as warnings: the first, then one in this many.
pub const ENOSPC_WARNING_EVERY: u64 = 1024;
/// ENOSPC refusals since the daemon started (see [`errno_of`]).
static ENOSPC_REFUSALS: AtomicU64 = AtomicU64::new(0);
/// Files remembered at most as having had a write-back refused; past this
/// a refusal is reported by close(2) and fsync only, as before.
pub const WRITE_BACKS_REFUSED_MAX: usize = 4096;

impl<D: FlashDevice> Shared<D> {
    pub fn new(fs: Fs<D>) -> Arc<Shared<D>> {
        Arc::new(Shared {
            fs: Mutex::new(Some(fs)),
            requests: AtomicU64::new(0),
            forgets: AtomicU64::new(0),
            ring_requests: AtomicU64::new(0),
            forgets_pending: Mutex::new(Vec::new()),
            forgets_pending_count: std::sync::atomic::AtomicUsize::new(0),
            write_backs_refused: Mutex::new(std::collections::HashSet::new()),
            write_backs_refused_count: std::sync::atomic::AtomicUsize::new(0),
            notifier: std::sync::OnceLock::new(),
        })
    }

    /// Remembers that a write-back of `ino` was refused with ENOSPC, and
    /// has the kernel drop its cached attributes of it, so that the next
    /// write(2) to it asks for them (FUSE_GETATTR_FH) and is told.
    fn refuse_write_back(&self, ino: u64) {
        {
            let mut refused = self.write_backs_refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if refused.len() >= WRITE_BACKS_REFUSED_MAX && !refused.contains(&ino) {
                return;
            }
            refused.insert(ino);
            self.write_backs_refused_count.store(refused.len(), Ordering::Release);
        }
        if let Some(notifier) = self.notifier.get() {
            // An offset below 0 drops the attributes only, not the pages
            // (whose write-back this very request is): nothing here waits
            // on the kernel. A file the kernel no longer holds is ENOENT,
            // and then there is no writer to tell.
            if let Err(error) = notifier.inval_inode(INodeNo(ino), -1, 0) {
                tracing::debug!("dropping the kernel's attributes of inode {ino}: {error}");
            }
        }
    }

    /// Whether a write-back of `ino` was refused since its writer was last
    /// told, forgetting it: the caller tells the writer now, or there is
    /// no writer left to tell.
    fn take_write_back_refused(&self, ino: u64) -> bool {
        if self.write_backs_refused_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut refused = self.write_backs_refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let found = refused.remove(&ino);
        self.write_backs_refused_count.store(refused.len(), Ordering::Release);
        found
    }

    fn lock(&self) -> MutexGuard<'_, Option<Fs<D>>> {
        // A worker that panicked left the engine in an unknown state; the
        // rest of the mount answers EIO rather than trusting it.
        match self.fs.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                let mut guard = poisoned.into_inner();
                *guard = None;
                guard
            }
        }
    }

    /// Runs `work` on the engine; `None` once it has been taken away.
    pub fn with<R>(&self, work: impl FnOnce(&mut Fs<D>) -> R) -> Option<R> {
        let mut guard = self.lock();
        let fs = guard.as_mut()?;
        self.apply_forgets(fs);
        Some(work(fs))
    }

    /// Holds a FORGET back for the next request (see `forgets_pending`).
    fn forget_later(&self, ino: u64, count: u64) {
        let full = {
            let mut pending = self.forgets_pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            pending.push((ino, count));
            self.forgets_pending_count.store(pending.len(), Ordering::Release);
            pending.len() >= FORGETS_PENDING_MAX
        };
        if full {
            self.with(|_| ());
        }
    }

    /// Gives the engine the FORGETs held back. Lock order: the engine's,
    /// then the pending list's (never the other way round).
    fn apply_forgets(&self, fs: &mut Fs<D>) {
        if self.forgets_pending_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let pending = {
            let mut pending = self.forgets_pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.forgets_pending_count.store(0, Ordering::Release);
            std::mem::take(&mut *pending)
        };
        for (ino, count) in pending {
            // As an answered FORGET's: the kernel has let go either way.
            let _ = fs.forget(ino, count);
        }
    }

    /// Requests seen so far (the daemon runs idle work when this stands
    /// still).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Requests the kernel waited for an answer to (every one but the
    /// FORGETs): the round trips the mount has cost.
    pub fn round_trips(&self) -> u64 {
        self.requests().saturating_sub(self.forgets.load(Ordering::Relaxed))
    }

    /// Requests answered over io_uring: 0 on a mount served on `/dev/fuse`.
    pub fn ring_requests(&self) -> u64 {
        self.ring_requests.load(Ordering::Relaxed)
    }

    /// Takes the engine away: every later request gets EIO.
    /// FORGETs held back are given to the engine first, so an unmount's
    /// checkpoint frees what the kernel let go of.
    pub fn take(&self) -> Option<Fs<D>> {
        let mut guard = self.lock();
        if let Some(fs) = guard.as_mut() {
            self.apply_forgets(fs);
        }
        guard.take()
    }
}

/// The FUSE file system: a [`Shared`] engine and the clock for "now".
pub struct FlintFuse<D: FlashDevice> {
    shared: Arc<Shared<D>>,
    clock: SystemClock,
    /// What unmount did: `Some(Ok)` after a clean checkpoint.
    unmounted: Arc<Mutex<Option<std::result::Result<D, Error>>>>,
    /// Whether the kernel takes ENOSYS from open (and from opendir) as
    /// "open it yourself from now on" (FUSE 7.23 and 7.29, Linux 4.14 and
    /// 5.1). An older kernel would hand the ENOSYS to the program, so then
    /// open answers as before, with a handle.
    no_open: bool,
    no_opendir: bool,
    /// Whether to ask the kernel for its writeback cache.
    writeback_cache: bool,
    /// Whether to offer the io_uring transport, and whether the kernel
    /// took it at INIT.
    io_uring: bool,
    io_uring_taken: Arc<std::sync::atomic::AtomicBool>,
}

impl<D: FlashDevice + 'static> FlintFuse<D> {
    /// The adapter, and where the device lands after a clean unmount.
    #[allow(clippy::type_complexity)]
    pub fn new(shared: Arc<Shared<D>>) -> (FlintFuse<D>, Arc<Mutex<Option<std::result::Result<D, Error>>>>) {
        let unmounted = Arc::new(Mutex::new(None));
        (
            FlintFuse {
                shared,
                clock: SystemClock,
                unmounted: unmounted.clone(),
                no_open: false,
                no_opendir: false,
                writeback_cache: false,
                io_uring: false,
                io_uring_taken: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            },
            unmounted,
        )
    }

    /// Whether to serve requests over io_uring when the kernel offers it
    /// ([`ring`]); `/dev/fuse` otherwise.
    pub fn with_io_uring(mut self, on: bool) -> FlintFuse<D> {
        self.io_uring = on;
        self
    }

    /// Another handle on the same engine, for the io_uring queues (the
    /// session owns this one).
    fn handler(&self) -> FlintFuse<D> {
        FlintFuse {
            shared: self.shared.clone(),
            clock: self.clock,
            unmounted: self.unmounted.clone(),
            no_open: self.no_open,
            no_opendir: self.no_opendir,
            writeback_cache: self.writeback_cache,
            io_uring: self.io_uring,
            io_uring_taken: self.io_uring_taken.clone(),
        }
    }

    /// Whether to ask for the kernel's writeback cache (`flintfs mount`
    /// does unless `-o nowriteback_cache`; see the module's account of
    /// what it changes).
    pub fn with_writeback_cache(mut self, on: bool) -> FlintFuse<D> {
        self.writeback_cache = on;
        self
    }

    fn call<R>(&self, work: impl FnOnce(&mut Fs<D>) -> flintfs_core::Result<R>) -> Result<R, Errno> {
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        match self.shared.with(work) {
            None => Err(Errno::EIO),
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => Err(errno_of(&error)),
        }
    }
}

/// What a getxattr or listxattr answers: the size the caller asked for,
/// or the bytes.
pub(crate) enum XattrAnswer {
    Size(u32),
    Bytes(Vec<u8>),
}

/// A size-0 call asks for the size; bytes that do not fit are ERANGE.
fn xattr_answer(size: u32, result: Result<Vec<u8>, Errno>) -> Result<XattrAnswer, Errno> {
    let bytes = result?;
    if size == 0 {
        Ok(XattrAnswer::Size(bytes.len() as u32))
    } else if bytes.len() <= size as usize {
        Ok(XattrAnswer::Bytes(bytes))
    } else {
        Err(Errno::ERANGE)
    }
}

/// What each request does, apart from how it arrived and how it is
/// answered: the fuser session's methods below and the io_uring transport
/// (`ring`) both call these, so the two cannot drift apart.
impl<D: FlashDevice + Send + 'static> FlintFuse<D> {
    /// With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing the set-ID
    /// bits on chown and truncate to the file system, and says when with
    /// FATTR_KILL_SUIDGID, which fuser does not pass on. Its rule is
    /// followed here instead: a change of owner or group of anything but a
    /// directory clears them, and so does a change of size by a caller
    /// other than root (root standing for CAP_FSETID).
    pub(crate) fn setattr_as(&self, caller_uid: u32, ino: u64, changes: &SetAttributes) -> Result<Attributes, Errno> {
        let drop_set_id = changes.uid.is_some() || changes.gid.is_some() || (changes.size.is_some() && caller_uid != 0);
        self.call(|fs| {
            let attributes = fs.setattr(ino, changes)?;
            if drop_set_id && attributes.file_type != CoreFileType::Directory {
                return fs.drop_set_id(ino);
            }
            Ok(attributes)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mknod_as(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attributes, Errno> {
        let mode = mode & !(umask & 0o7777);
        self.call(|fs| fs.mknod(parent, name, mode, rdev, uid, gid))
    }

    /// mkdir (`directory`) or create: the mode less the umask.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make_as(
        &self,
        directory: bool,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attributes, Errno> {
        let permissions = mode & !umask & 0o7777;
        if directory {
            self.call(|fs| fs.mkdir(parent, name, permissions, uid, gid))
        } else {
            self.call(|fs| fs.create(parent, name, permissions, uid, gid))
        }
    }

    /// `flags` are rename(2)'s RENAME_* bits; others are EINVAL.
    pub(crate) fn rename_with(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        let flags = RenameFlags::from_bits_retain(flags);
        if !known.contains(flags) {
            return Err(Errno::EINVAL);
        }
        let flags = CoreRenameFlags {
            no_replace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        self.call(|fs| fs.rename(parent, name, new_parent, new_name, flags))
    }

    /// The kernel flags a write whose writer lacks CAP_FSETID (with
    /// FUSE_HANDLE_KILLPRIV_V2); an unflagged one keeps the bits.
    /// `write_back` says the kernel is writing back its cache
    /// (FUSE_WRITE_CACHE), not a write(2) that waits for this answer.
    pub(crate) fn write_flagged(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        kill_set_id: bool,
        write_back: bool,
    ) -> Result<u32, Errno> {
        let set_id = if kill_set_id { SetIdOnWrite::ClearBoth } else { SetIdOnWrite::Keep };
        let written = self.call(|fs| fs.write_with(ino, offset, data, set_id)).map(|written| written as u32);
        // A write-back writes what write(2) already took. Its refusal for
        // want of space is remembered until the writer hears of it at its
        // next write (the module's account), even if a later write-back
        // fits: the refused pages are lost, and a writer told only at
        // close(2) would have gone on writing into a full device
        // meanwhile. A write(2) that waits (O_DIRECT, or one the kernel
        // sends through to clear set-ID bits) hears its own ENOSPC.
        if write_back && matches!(&written, Err(errno) if errno.code() == libc::ENOSPC) {
            self.shared.refuse_write_back(ino);
        }
        written
    }

    /// FORGET: the kernel let the inode go (it is held back for the next
    /// request: see `forgets_pending`).
    pub(crate) fn forget_with(&self, ino: u64, count: u64) {
        self.shared.forgets.fetch_add(1, Ordering::Relaxed);
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        // No writer of it is left to tell of a refused write-back.
        self.shared.take_write_back_refused(ino);
        self.shared.forget_later(ino, count);
    }

    /// GETATTR. One made for an open file (FUSE_GETATTR_FH: the kernel
    /// asks so before a write(2) once its attributes were dropped) of
    /// which a write-back was refused for want of space answers ENOSPC,
    /// once: write(2) then fails, and a program writing until the device
    /// is full stops, as it would on a kernel file system.
    pub(crate) fn getattr_for(&self, ino: u64, open_file: bool) -> Result<Attributes, Errno> {
        if open_file && self.shared.take_write_back_refused(ino) {
            return Err(Errno::ENOSPC);
        }
        self.call(|fs| fs.getattr(ino))
    }

    pub(crate) fn setxattr_with(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        position: u32,
    ) -> Result<(), Errno> {
        if position != 0 || flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Errno::EINVAL);
        }
        let flags = XattrFlags { create: flags & XATTR_CREATE != 0, replace: flags & XATTR_REPLACE != 0 };
        self.call(|fs| fs.setxattr(ino, name, value, flags))
    }

    pub(crate) fn getxattr_sized(&self, ino: u64, name: &[u8], size: u32) -> Result<XattrAnswer, Errno> {
        xattr_answer(size, self.call(|fs| fs.getxattr(ino, name)))
    }

    /// The names, each NUL-terminated, as listxattr(2) returns them.
    pub(crate) fn listxattr_sized(&self, ino: u64, size: u32) -> Result<XattrAnswer, Errno> {
        let listed = self.call(|fs| fs.listxattr(ino)).map(|names| {
            names
                .into_iter()
                .flat_map(|mut name| {
                    name.push(0);
                    name
                })
                .collect()
        });
        xattr_answer(size, listed)
    }

    /// SEEK_DATA and SEEK_HOLE (the kernel answers the others itself).
    pub(crate) fn lseek_with(&self, ino: u64, offset: i64, whence: i32) -> Result<i64, Errno> {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Err(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else { return Err(Errno::ENXIO) };
        self.call(|fs| fs.seek_data_or_hole(ino, offset, data)).map(|found| i64::try_from(found).unwrap_or(i64::MAX))
    }

    pub(crate) fn fallocate_with(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        let Ok(mode) = u32::try_from(mode) else { return Err(Errno::EINVAL) };
        self.call(|fs| fs.fallocate(ino, offset, length, mode))
    }

    /// Lists entries from `offset` into `add`, which says when its reply
    /// is full.
    pub(crate) fn readdir_into(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(&DirectoryEntry) -> bool,
    ) -> Result<(), Errno> {
        for entry in self.call(|fs| fs.readdir(ino, offset, READDIR_BATCH_ENTRIES))? {
            if add(&entry) {
                break;
            }
        }
        Ok(())
    }

    /// As [`Self::readdir_into`], with attributes. The core counted a
    /// reference for each entry it listed; the kernel counts only those
    /// that fit in the reply, so the others are given back.
    pub(crate) fn readdirplus_into(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(&DirectoryEntry, &Attributes) -> bool,
    ) -> Result<(), Errno> {
        let entries = self.call(|fs| fs.readdir_plus(ino, offset, READDIR_BATCH_ENTRIES))?;
        let mut unsent = Vec::new();
        let mut full = false;
        for (entry, attributes) in entries {
            let counted = entry.name != b"." && entry.name != b"..";
            full = full || add(&entry, &attributes);
            if full && counted {
                unsent.push(entry.ino);
            }
        }
        if !unsent.is_empty() {
            let _ = self.call(|fs| unsent.iter().try_for_each(|&ino| fs.forget(ino, 1)));
        }
        Ok(())
    }
}

/// The kernel's errno for a core error.
pub fn errno_of(error: &Error) -> Errno {
    if error.errno == flintfs_core::errno::ENOSPC {
        // A full device refuses every write-back the kernel still holds
        // (under the writeback cache, up to the mount's dirty limit at
        // once): the first refusal and every ENOSPC_WARNING_EVERY-th are
        // warnings, with the count, so a fill does not fill the log too.
        let refusals = ENOSPC_REFUSALS.fetch_add(1, Ordering::Relaxed) + 1;
        if refusals == 1 || refusals.is_multiple_of(ENOSPC_WARNING_EVERY) {
            tracing::warn!(errno = error.errno, refusals, "{}", error.message);
        } else {
            tracing::debug!(errno = error.errno, refusals, "{}", error.message);
        }
    } else if error.errno == flintfs_core::errno::EIO {
        tracing::warn!(errno = error.errno, "{}", error.message);
    } else {
        tracing::debug!(errno = error.errno, "{}", error.message);
    }
    if error.errno > 0 {
        Errno::from_i32(error.errno)
    } else {
        Errno::EIO
    }
}

fn time_of(nanoseconds: i64) -> SystemTime {
    if nanoseconds >= 0 {
        UNIX_EPOCH + Duration::from_nanos(nanoseconds as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(nanoseconds.unsigned_abs())
    }
}

fn nanoseconds_of(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

fn kind_of(file_type: CoreFileType) -> FileType {
    match file_type {
        CoreFileType::Regular => FileType::RegularFile,
        CoreFileType::Directory => FileType::Directory,
        CoreFileType::Symlink => FileType::Symlink,
        CoreFileType::Fifo => FileType::NamedPipe,
        CoreFileType::CharDevice => FileType::CharDevice,
        CoreFileType::BlockDevice => FileType::BlockDevice,
        CoreFileType::Socket => FileType::Socket,
    }
}

fn attr_of(attributes: &Attributes) -> FileAttr {
    FileAttr {
        ino: INodeNo(attributes.ino),
        size: attributes.size,
        blocks: attributes.blocks,
        atime: time_of(attributes.atime_ns),
        mtime: time_of(attributes.mtime_ns),
        ctime: time_of(attributes.ctime_ns),
        crtime: time_of(attributes.ctime_ns),
        kind: kind_of(attributes.file_type),
        perm: (attributes.permissions & 0o7777) as u16,
        nlink: attributes.nlink,
        uid: attributes.uid,
        gid: attributes.gid,
        rdev: attributes.rdev,
        blksize: attributes.block_size,
        flags: 0,
    }
}

fn reply_entry(reply: ReplyEntry, result: Result<Attributes, Errno>) {
    match result {
        Ok(attributes) => reply.entry(&ATTRIBUTE_TTL, &attr_of(&attributes), Generation(attributes.generation)),
        Err(errno) => reply.error(errno),
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

fn reply_xattr(reply: ReplyXattr, result: Result<XattrAnswer, Errno>) {
    match result {
        Ok(XattrAnswer::Size(size)) => reply.size(size),
        Ok(XattrAnswer::Bytes(bytes)) => reply.data(&bytes),
        Err(errno) => reply.error(errno),
    }
}

/// Ends a directory listing: the entries added, or the error.
fn reply_listing<R>(listed: Result<(), Errno>, reply: R, ok: fn(R), error: fn(R, Errno)) {
    match listed {
        Ok(()) => ok(reply),
        Err(errno) => error(reply, errno),
    }
}

impl<D: FlashDevice + Send + 'static> Filesystem for FlintFuse<D> {
    /// Asks for readdirplus (names with their attributes in one request,
    /// as `ls -l` wants; the kernel chooses when) where the kernel has it.
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Offered only if the ring can be brought up: once offered, the
        // kernel holds every request until the ring is ready or refused.
        let ring_possible = self.io_uring
            && ring::preflight()
                .inspect_err(|error| tracing::warn!("io_uring unusable here ({error}); /dev/fuse only"))
                .is_ok();
        if ring_possible {
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => self.io_uring_taken.store(true, Ordering::Relaxed),
                Err(unsupported) => {
                    tracing::info!("the kernel offers no {unsupported:?} (fuse.enable_uring off); /dev/fuse only")
                }
            }
        }
        let answer = ask_kernel(config, self.writeback_cache);
        self.no_open = answer.no_open;
        self.no_opendir = answer.no_opendir;
        Ok(())
    }

    /// Unmount: a checkpoint, then the device is handed back to the daemon.
    /// After a power cut the engine is gone and nothing is written.
    fn destroy(&mut self) {
        if let Some(fs) = self.shared.take() {
            let result = fs.unmount();
            if let Err(error) = &result {
                tracing::error!("unmount failed: {}", error.message);
            }
            *self.unmounted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(result);
        }
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(reply, self.call(|fs| fs.lookup(parent.0, name.as_bytes())));
    }

    fn forget(&self, _request: &Request, ino: INodeNo, count: u64) {
        self.forget_with(ino.0, count);
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, handle: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr_for(ino.0, handle.is_some()) {
            Ok(attributes) => reply.attr(&ATTRIBUTE_TTL, &attr_of(&attributes)),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr(
        &self,
        request: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _handle: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let now = self.clock.now_ns();
        let time = |value: Option<TimeOrNow>| {
            value.map(|value| match value {
                TimeOrNow::Now => now,
                TimeOrNow::SpecificTime(time) => nanoseconds_of(time),
            })
        };
        let changes = SetAttributes {
            permissions: mode.map(|mode| mode & 0o7777),
            uid,
            gid,
            size,
            atime_ns: time(atime),
            mtime_ns: time(mtime),
        };
        match self.setattr_as(request.uid(), ino.0, &changes) {
            Ok(attributes) => reply.attr(&ATTRIBUTE_TTL, &attr_of(&attributes)),
            Err(errno) => reply.error(errno),
        }
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        match self.call(|fs| fs.readlink(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(errno) => reply.error(errno),
        }
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(reply, self.mknod_as(parent.0, name.as_bytes(), mode, umask, rdev, request.uid(), request.gid()));
    }

    fn mkdir(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        reply_entry(reply, self.make_as(true, parent.0, name.as_bytes(), mode, umask, request.uid(), request.gid()));
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.call(|fs| fs.unlink(parent.0, name.as_bytes())));
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.call(|fs| fs.rmdir(parent.0, name.as_bytes())));
    }

    fn symlink(&self, request: &Request, parent: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let target = target.as_os_str().as_bytes();
        reply_entry(reply, self.call(|fs| fs.symlink(parent.0, name.as_bytes(), target, request.uid(), request.gid())));
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            self.rename_with(parent.0, name.as_bytes(), new_parent.0, new_name.as_bytes(), flags.bits()),
        );
    }

    fn link(&self, _request: &Request, ino: INodeNo, new_parent: INodeNo, new_name: &OsStr, reply: ReplyEntry) {
        reply_entry(reply, self.call(|fs| fs.link(ino.0, new_parent.0, new_name.as_bytes())));
    }

    /// ENOSYS: the kernel opens files itself from now on, keeping their
    /// page cache (the module's account); on a kernel without that, a
    /// handle that keeps the cache.
    fn open(&self, _request: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        }
    }

    /// ENOSYS: the kernel opens directories itself and caches listings; on
    /// a kernel without that, a handle that caches them.
    fn opendir(&self, _request: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR);
        }
    }

    fn read(
        &self,
        _request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.call(|fs| fs.read(ino.0, offset, u64::from(size))) {
            Ok(bytes) => reply.data(&bytes),
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill_set_id = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let write_back = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        match self.write_flagged(ino.0, offset, data, kill_set_id, write_back) {
            Ok(written) => reply.written(written),
            Err(errno) => reply.error(errno),
        }
    }

    /// close(2): nothing to do. Without the writeback cache writes reach
    /// the engine as they are made; with it, the kernel writes the file's
    /// dirty pages back before it would send this. ENOSYS, so the kernel
    /// sends no more of them.
    fn flush(&self, _request: &Request, _ino: INodeNo, _handle: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn fsync(&self, _request: &Request, ino: INodeNo, _handle: FileHandle, datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.call(|fs| fs.fsync(ino.0, datasync)));
    }

    fn readdir(&self, _request: &Request, ino: INodeNo, _handle: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listed = self.readdir_into(ino.0, offset, |entry| {
            reply.add(INodeNo(entry.ino), entry.offset, kind_of(entry.file_type), OsStr::from_bytes(&entry.name))
        });
        reply_listing(listed, reply, ReplyDirectory::ok, ReplyDirectory::error);
    }

    fn readdirplus(
        &self,
        _request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listed = self.readdirplus_into(ino.0, offset, |entry, attributes| {
            reply.add(
                INodeNo(entry.ino),
                entry.offset,
                OsStr::from_bytes(&entry.name),
                &ATTRIBUTE_TTL,
                &attr_of(attributes),
                Generation(attributes.generation),
            )
        });
        reply_listing(listed, reply, ReplyDirectoryPlus::ok, ReplyDirectoryPlus::error);
    }

    fn fsyncdir(&self, _request: &Request, ino: INodeNo, _handle: FileHandle, datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.call(|fs| fs.fsync(ino.0, datasync)));
    }

    fn statfs(&self, _request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.call(|fs| fs.statfs()) {
            Ok(statfs) => reply.statfs(
                statfs.blocks,
                statfs.blocks_free,
                statfs.blocks_available,
                statfs.files,
                statfs.files_free,
                statfs.block_size,
                statfs.name_max,
                statfs.block_size,
            ),
            Err(errno) => reply.error(errno),
        }
    }

    fn setxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.setxattr_with(ino.0, name.as_bytes(), value, flags, position));
    }

    fn getxattr(&self, _request: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.getxattr_sized(ino.0, name.as_bytes(), size));
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.listxattr_sized(ino.0, size));
    }

    fn removexattr(&self, _request: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.call(|fs| fs.removexattr(ino.0, name.as_bytes())));
    }

    /// Permissions are the kernel's (`default_permissions`); this answers
    /// whether the file is there.
    fn access(&self, _request: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, self.call(|fs| fs.getattr(ino.0).map(|_| ())));
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make_as(false, parent.0, name.as_bytes(), mode, umask, request.uid(), request.gid()) {
            Ok(attributes) => reply.created(
                &ATTRIBUTE_TTL,
                &attr_of(&attributes),
                Generation(attributes.generation),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(errno) => reply.error(errno),
        }
    }

    fn lseek(
        &self,
        _request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.lseek_with(ino.0, offset, whence) {
            Ok(found) => reply.offset(found),
            Err(errno) => reply.error(errno),
        }
    }

    fn fallocate(
        &self,
        _request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fallocate_with(ino.0, offset, length, mode));
    }
}

/// The kernel's own mount flags a flintfs mount passes through, by
/// mount(8)'s names: the kernel enforces them, the engine never sees them.
pub const KERNEL_FLAGS: [&str; 13] =
    ["ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime", "sync", "async", "dirsync"];

/// What the kernel took of [`ask_kernel`]'s asks that changes how a
/// daemon answers.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelAnswer {
    /// ENOSYS from open (and from opendir) means "open it yourself from
    /// now on" (FUSE 7.23 and 7.29, Linux 4.14 and 5.1). An older kernel
    /// would hand the ENOSYS to the program, so then open answers with a
    /// handle.
    pub no_open: bool,
    pub no_opendir: bool,
}

/// The kernel features a flintfs mount asks for at INIT (the module's
/// notes say why each one is safe), apart from the transport: the same for
/// every daemon that should meet the kernel as flintfs does (the bench's
/// `fuse-floor` file system, which does no work of its own, asks the same
/// so that it measures the FUSE path flintfs has).
pub fn ask_kernel(config: &mut KernelConfig, writeback_cache: bool) -> KernelAnswer {
    let wanted = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
    if let Err(unsupported) = config.add_capabilities(wanted) {
        tracing::info!("the kernel lacks {unsupported:?}; plain readdir only");
    }
    // The engine clears the set-ID bits when the kernel says (on write,
    // truncate and chown), so the kernel no longer asks for
    // security.capability before every write to find out: with it, each
    // write(2) cost a GETXATTR request even when the bytes stayed in
    // the kernel's cache.
    if let Err(unsupported) = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2) {
        tracing::info!("the kernel lacks {unsupported:?}; it clears set-ID bits itself");
    }
    if writeback_cache {
        if let Err(unsupported) = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE) {
            tracing::info!("the kernel lacks {unsupported:?}; writes go through to the engine");
        }
    }
    // 1 MiB writes (the kernel's default page limit for a request):
    // written-back appends then cost a request a megabyte.
    let _ = config.set_max_write(MAX_WRITE_BYTES);
    KernelAnswer {
        no_open: config.capabilities().contains(InitFlags::FUSE_NO_OPEN_SUPPORT),
        no_opendir: config.capabilities().contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT),
    }
}

fn kernel_flag(name: &str) -> Option<fuser::MountOption> {
    use fuser::MountOption::*;
    Some(match name {
        "ro" => RO,
        "rw" => RW,
        "nosuid" => NoSuid,
        "suid" => Suid,
        "nodev" => NoDev,
        "dev" => Dev,
        "noexec" => NoExec,
        "exec" => Exec,
        "noatime" => NoAtime,
        "atime" => Atime,
        "sync" => Sync,
        "async" => Async,
        "dirsync" => DirSync,
        _ => return None,
    })
}

/// The session configuration flintfs mounts with. `default_permissions`
/// is always on: the kernel checks modes and owners against the caller, as
/// for a kernel file system, and the engine trusts that it did. That is
/// also what makes `allow_other` safe to give: without it every user could
/// do anything on the mount. `kernel_flags` are names from
/// [`KERNEL_FLAGS`]; others are ignored (the caller checks them).
pub fn config(fs_name: &str, allow_other: bool, kernel_flags: &[String]) -> fuser::Config {
    let mut mount_options = vec![
        fuser::MountOption::FSName(fs_name.to_string()),
        // The kernel's own subtype option (fuser's Subtype reaches only
        // fusermount): the mount table then says fuse.flintfs, and mount(8)
        // remounts it (`-o remount,ro`) with the system call instead of
        // handing it to fuse3's mount.fuse, which cannot.
        fuser::MountOption::CUSTOM("subtype=flintfs".to_string()),
        fuser::MountOption::DefaultPermissions,
    ];
    mount_options.extend(kernel_flags.iter().filter_map(|name| kernel_flag(name)));
    // The ACL is how fuser says `allow_other`.
    let acl = if allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    let mut config = fuser::Config::default();
    config.mount_options = mount_options;
    config.acl = acl;
    config.n_threads = Some(WORKER_THREADS);
    config
}

pub use fuser::BackgroundSession;

/// Sets the kernel's readahead window for the FUSE mount at `mountpoint`
/// (through its backing device in sysfs; root only). Call it once the
/// session serves: finding the device stats the mountpoint, which the
/// kernel may ask the session about. `bytes` is rounded down to whole KiB.
pub fn set_readahead(mountpoint: &Path, bytes: u64) -> std::io::Result<()> {
    let path = readahead_path(mountpoint)?;
    std::fs::write(&path, format!("{}\n", bytes / 1024))
        .map_err(|error| std::io::Error::new(error.kind(), format!("{path}: {error}")))
}

/// The sysfs file holding the readahead window, in KiB, of the mount at
/// `mountpoint` (its backing device's; stats the mountpoint).
pub fn readahead_path(mountpoint: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(mountpoint)?.dev();
    Ok(format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(device), libc::minor(device)))
}

/// Mounts `filesystem` at `mountpoint` and serves it on worker threads
/// until it is unmounted.
///
/// With the io_uring transport asked for and taken at INIT, the ring's
/// queues are registered before the session starts serving: until they
/// are, the kernel holds new requests. If they cannot be, the kernel is
/// back on `/dev/fuse` and the mount carries on there.
pub fn spawn<D: FlashDevice + Send + 'static>(
    filesystem: FlintFuse<D>,
    mountpoint: &Path,
    fs_name: &str,
    allow_other: bool,
    kernel_flags: &[String],
) -> std::io::Result<BackgroundSession> {
    let handler = filesystem.handler();
    let session = fuser::Session::new(filesystem, mountpoint, &config(fs_name, allow_other, kernel_flags))?;
    let _ = handler.shared.notifier.set(session.notifier());
    if handler.io_uring_taken.load(Ordering::Relaxed) {
        use std::os::fd::AsFd;
        match ring::start(handler, session.as_fd()) {
            Ok(ring) => tracing::info!("serving over io_uring: {} queues of {}", ring.queues(), ring::RING_DEPTH),
            Err(error) => {
                tracing::warn!("io_uring did not come up ({error}); serving /dev/fuse");
                // If the kernel did not refuse it itself, it is holding
                // every request for the ring: have it refuse now, or give
                // up the mount rather than leave it hanging.
                if let Err(refused) = ring::refuse(session.as_fd()) {
                    return Err(std::io::Error::other(format!(
                        "io_uring did not come up ({error}) and could not be turned off ({refused})"
                    )));
                }
            }
        }
    }
    session.spawn()
}

#[cfg(test)]
mod tests {
    use flintfs_core::{FsOptions, ManualClock, MkfsOptions, ROOT_INO};
    use flintfs_flash::{DeviceOptions, FaultConfig, Geometry, MemoryFlash};

    use super::*;

    fn shared() -> Arc<Shared<MemoryFlash>> {
        let geometry = Geometry::with_size_bytes(256 << 20);
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let options = DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() };
        let flash = MemoryFlash::memory(geometry, options).unwrap();
        let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
        let (fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
        Shared::new(fs)
    }

    /// An unlinked file the kernel still held: made, unlinked, its inode.
    fn orphan(shared: &Shared<MemoryFlash>) -> u64 {
        let ino = shared.with(|fs| fs.create(ROOT_INO, b"held", 0o644, 0, 0)).unwrap().unwrap().ino;
        shared.with(|fs| fs.unlink(ROOT_INO, b"held")).unwrap().unwrap();
        assert!(shared.with(|fs| fs.getattr(ino)).unwrap().is_ok(), "an orphan the kernel holds is still there");
        ino
    }

    #[test]
    fn a_forget_held_back_reaches_the_engine_before_the_next_request() {
        let shared = shared();
        let ino = orphan(&shared);
        shared.forget_later(ino, 1);
        assert_eq!(shared.forgets_pending_count.load(Ordering::Acquire), 1);
        // The next request's thread applies it first: the orphan is gone.
        assert!(shared.with(|fs| fs.getattr(ino)).unwrap().is_err(), "the held-back FORGET was not applied");
        assert_eq!(shared.forgets_pending_count.load(Ordering::Acquire), 0);
    }

    #[test]
    fn an_unmount_applies_the_forgets_held_back() {
        let shared = shared();
        let ino = orphan(&shared);
        shared.forget_later(ino, 1);
        let mut fs = shared.take().expect("the engine");
        assert!(fs.getattr(ino).is_err(), "take() left a FORGET unapplied");
    }

    /// A device of `size_bytes`, formatted and mounted, behind an adapter
    /// that asks for the kernel's writeback cache.
    fn adapter(size_bytes: u64) -> FlintFuse<MemoryFlash> {
        let geometry = Geometry::with_size_bytes(size_bytes);
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let options = DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() };
        let flash = MemoryFlash::memory(geometry, options).unwrap();
        let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
        let (fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
        FlintFuse::new(Shared::new(fs)).0.with_writeback_cache(true)
    }

    /// Writes noise (which does not compress) to a new file until the
    /// engine refuses a write for want of space, as write-backs of the
    /// kernel's cache (`write_back`) or as write(2)s; the file's inode.
    fn fill(adapter: &FlintFuse<MemoryFlash>, write_back: bool) -> u64 {
        let ino = adapter.make_as(false, ROOT_INO, b"fill", 0o644, 0, 0, 0).unwrap().ino;
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut block = vec![0u8; 256 << 10];
        for offset in (0..).step_by(block.len()) {
            for byte in block.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            match adapter.write_flagged(ino, offset, &block, false, write_back) {
                Ok(_) => assert!(offset < 1 << 30, "a 96 MiB device took a GiB"),
                Err(errno) => {
                    assert_eq!(errno.code(), libc::ENOSPC, "the fill ended in another error");
                    return ino;
                }
            }
        }
        unreachable!()
    }

    #[test]
    fn a_write_back_refused_for_space_fails_the_writers_next_write_once() {
        let adapter = adapter(96 << 20);
        let ino = fill(&adapter, true);
        // A stat by name (no handle) is not the writer: it is answered.
        assert!(adapter.getattr_for(ino, false).is_ok());
        // The GETATTR the kernel makes before the writer's next write(2)
        // carries the handle: ENOSPC, once.
        let told = adapter.getattr_for(ino, true).expect_err("the writer was not told");
        assert_eq!(told.code(), libc::ENOSPC);
        assert!(adapter.getattr_for(ino, true).is_ok(), "told twice");
        // A file whose write-backs all fit is never told.
        let other = adapter.make_as(false, ROOT_INO, b"small", 0o644, 0, 0, 0).unwrap().ino;
        assert!(adapter.getattr_for(other, true).is_ok());
        // A refusal the kernel's FORGET overtakes has no writer to tell.
        assert!(adapter.write_flagged(ino, 1 << 30, &[1; 1 << 20], false, true).is_err());
        let remembered = |ino| adapter.shared.write_backs_refused.lock().unwrap().contains(&ino);
        assert!(remembered(ino));
        adapter.forget_with(ino, 1);
        assert!(!remembered(ino), "a FORGET left the refusal");
    }

    #[test]
    fn a_write_refused_while_its_writer_waits_is_told_at_once_only() {
        // O_DIRECT under the writeback cache (or no cache): write(2)
        // itself was refused, and heard it: nothing to tell later.
        let adapter = adapter(96 << 20);
        let ino = fill(&adapter, false);
        assert!(adapter.getattr_for(ino, true).is_ok());
    }

    #[test]
    fn refusals_remembered_are_bounded() {
        let adapter = adapter(96 << 20);
        for ino in 0..WRITE_BACKS_REFUSED_MAX as u64 + 10 {
            adapter.shared.refuse_write_back(1_000_000 + ino);
        }
        assert_eq!(adapter.shared.write_backs_refused_count.load(Ordering::Acquire), WRITE_BACKS_REFUSED_MAX);
        assert!(!adapter
            .shared
            .write_backs_refused
            .lock()
            .unwrap()
            .contains(&(1_000_000 + WRITE_BACKS_REFUSED_MAX as u64)));
    }

    #[test]
    fn held_back_forgets_are_bounded() {
        let shared = shared();
        for ino in 0..FORGETS_PENDING_MAX as u64 + 10 {
            // Inodes the engine does not know: a FORGET of one is a no-op.
            shared.forget_later(1_000_000 + ino, 1);
            assert!(shared.forgets_pending_count.load(Ordering::Acquire) < FORGETS_PENDING_MAX);
        }
    }
}
