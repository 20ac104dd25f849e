//! # FUSE over io_uring
//!
//! A second transport for the same requests (Linux 6.14 and later, with the
//! fuse module's `enable_uring` on). fuser mounts, answers INIT and keeps
//! serving `/dev/fuse`, which still carries FORGET and INTERRUPT; once
//! every CPU's queue has its entries registered here, the kernel hands
//! every other request to the queue of the CPU that made it, and the
//! thread pinned to that CPU answers it. The caller and the daemon then
//! meet on one CPU instead of waking each other across two:
//! `flintfs-bench fuse_transport` measured a round trip of 10.2 to 11.2 µs
//! against 24.5 to 29.3 µs on `/dev/fuse`.
//!
//! What a request does is [`FlintFuse`]'s, shared with the fuser session
//! (its `*_as`, `*_with` and `*_into` methods, and `call`); this module only
//! decodes the kernel's structures (include/uapi/linux/fuse.h) and encodes
//! the answers, field by field. A refused registration leaves the kernel
//! on `/dev/fuse` (it turns the ring off for the connection), so the mount
//! works either way.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::mpsc;
use std::thread::JoinHandle;

use flintfs_core::{Attributes, Clock, DirectoryEntry, SetAttributes};
use flintfs_flash::FlashDevice;
use fuser::Errno;
use io_uring::{opcode, squeue, types, IoUring};

use crate::{kind_of, FlintFuse, XattrAnswer, ATTRIBUTE_TTL, MAX_WRITE_BYTES};

/// Entries each CPU's queue registers: requests one CPU can have in
/// flight before the next waits.
pub const RING_DEPTH: usize = 4;
/// Bytes of payload each entry holds. The kernel refuses an entry smaller
/// than the connection's largest request: its max_write, or max_pages
/// pages (fuser asks for max_write's worth).
const PAYLOAD_BYTES: usize = MAX_WRITE_BYTES as usize;
/// `struct fuse_uring_req_header`: the in/out header, the operation's
/// fixed arguments, the entry's own fields.
const HEADER_BYTES: usize = 288;
const OP_IN_OFFSET: usize = 128;
const ENTRY_OFFSET: usize = 256;
/// `struct fuse_in_header` and `struct fuse_out_header`.
pub const IN_HEADER_BYTES: usize = 40;
pub const OUT_HEADER_BYTES: usize = 16;
const ATTR_BYTES: usize = 88;
const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
const _: () = assert!(ENTRY_OFFSET + 32 == HEADER_BYTES && IN_HEADER_BYTES <= OP_IN_OFFSET);
const _: () = assert!(PAYLOAD_BYTES >= 8192, "the kernel's smallest request buffer");
const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128, "a 128-byte SQE (`len` at byte 24)");
/// Requests whose payload is at most this are copied aside before they are
/// answered; larger ones (write data) are answered aside.
const SMALL_PAYLOAD_BYTES: usize = 4096;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

// Operations (enum fuse_opcode): the ring's, and the bench probe's.
pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const SETXATTR: u32 = 21;
pub const GETXATTR: u32 = 22;
pub const LISTXATTR: u32 = 23;
pub const REMOVEXATTR: u32 = 24;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const ACCESS: u32 = 34;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const CREATE: u32 = 35;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;
pub const READDIRPLUS: u32 = 44;
pub const RENAME2: u32 = 45;
pub const LSEEK: u32 = 46;

// fuse_setattr_in.valid.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
/// fuse_getattr_in.getattr_flags: asked for an open file (fstat, or a
/// write(2) under the writeback cache).
const FUSE_GETATTR_FH: u32 = 1 << 0;
/// fuse_write_in.write_flags: a write-back of the kernel's cache.
const FUSE_WRITE_CACHE: u32 = 1 << 0;
/// fuse_write_in.write_flags: the writer lacks CAP_FSETID.
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// fuse_open_out.open_flags.
const FOPEN_KEEP_CACHE: u32 = 1 << 1;

/// The little-endian field at `at`; 0 past the end (a short header reads
/// as zeros, never a panic).
pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).map_or(0, |field| u32::from_le_bytes(field.try_into().expect("four bytes")))
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).map_or(0, |field| u64::from_le_bytes(field.try_into().expect("eight bytes")))
}

/// `struct fuse_out_header` for a reply of `payload_bytes` after it.
pub fn out_header(error: i32, unique: u64, payload_bytes: usize) -> [u8; OUT_HEADER_BYTES] {
    let mut out = [0u8; OUT_HEADER_BYTES];
    out[0..4].copy_from_slice(&((OUT_HEADER_BYTES + payload_bytes) as u32).to_le_bytes());
    out[4..8].copy_from_slice(&error.to_le_bytes());
    out[8..16].copy_from_slice(&unique.to_le_bytes());
    out
}

/// The NUL-terminated name at the start of `bytes`, and what follows it.
fn name_of(bytes: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let end = bytes.iter().position(|&byte| byte == 0).ok_or(Errno::EINVAL)?;
    Ok((&bytes[..end], &bytes[end + 1..]))
}

/// A reply's bytes, appended field by field (little-endian, as the kernel
/// on this machine reads them).
struct Out<'a> {
    bytes: &'a mut [u8],
    length: usize,
}

impl Out<'_> {
    fn u32(&mut self, value: u32) {
        self.put(&value.to_le_bytes());
    }
    fn u64(&mut self, value: u64) {
        self.put(&value.to_le_bytes());
    }
    fn put(&mut self, value: &[u8]) {
        self.bytes[self.length..self.length + value.len()].copy_from_slice(value);
        self.length += value.len();
    }
    fn room(&self) -> usize {
        self.bytes.len() - self.length
    }

    /// `struct fuse_attr`.
    fn attr(&mut self, attributes: &Attributes) {
        let (atime, atime_ns) = seconds_of(attributes.atime_ns);
        let (mtime, mtime_ns) = seconds_of(attributes.mtime_ns);
        let (ctime, ctime_ns) = seconds_of(attributes.ctime_ns);
        self.u64(attributes.ino);
        self.u64(attributes.size);
        self.u64(attributes.blocks);
        self.u64(atime as u64);
        self.u64(mtime as u64);
        self.u64(ctime as u64);
        self.u32(atime_ns);
        self.u32(mtime_ns);
        self.u32(ctime_ns);
        self.u32(mode_of(attributes));
        self.u32(attributes.nlink);
        self.u32(attributes.uid);
        self.u32(attributes.gid);
        self.u32(attributes.rdev);
        self.u32(attributes.block_size);
        self.u32(0); // flags
    }

    /// `struct fuse_entry_out`: the entry and its attributes, trusted for
    /// [`ATTRIBUTE_TTL`] (the module's account of why).
    fn entry(&mut self, attributes: &Attributes) {
        self.u64(attributes.ino);
        self.u64(attributes.generation);
        self.u64(ATTRIBUTE_TTL.as_secs());
        self.u64(ATTRIBUTE_TTL.as_secs());
        self.u32(0);
        self.u32(0);
        self.attr(attributes);
    }

    /// `struct fuse_dirent`, padded to eight bytes; false when it does not
    /// fit in `limit` bytes of reply.
    fn dirent(&mut self, entry: &DirectoryEntry, limit: usize) -> bool {
        let length = (24 + entry.name.len()).next_multiple_of(8);
        if self.length + length > limit.min(self.bytes.len()) {
            return false;
        }
        let start = self.length;
        self.u64(entry.ino);
        self.u64(entry.offset);
        self.u32(entry.name.len() as u32);
        self.u32(file_type_bits(entry) >> 12);
        self.put(&entry.name);
        let padding = start + length - self.length;
        self.put(&[0u8; 8][..padding]);
        true
    }
}

/// A time in nanoseconds since the epoch as FUSE's seconds and
/// nanoseconds (the nanoseconds never negative).
fn seconds_of(nanoseconds: i64) -> (i64, u32) {
    (nanoseconds.div_euclid(1_000_000_000), nanoseconds.rem_euclid(1_000_000_000) as u32)
}

fn file_type_bits(entry: &DirectoryEntry) -> u32 {
    type_bits(kind_of(entry.file_type))
}

fn type_bits(kind: fuser::FileType) -> u32 {
    use fuser::FileType::*;
    match kind {
        NamedPipe => libc::S_IFIFO,
        CharDevice => libc::S_IFCHR,
        BlockDevice => libc::S_IFBLK,
        Directory => libc::S_IFDIR,
        RegularFile => libc::S_IFREG,
        Symlink => libc::S_IFLNK,
        Socket => libc::S_IFSOCK,
    }
}

fn mode_of(attributes: &Attributes) -> u32 {
    type_bits(kind_of(attributes.file_type)) | (attributes.permissions & 0o7777)
}

/// One request as the ring delivered it.
pub struct Request<'a> {
    pub opcode: u32,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    /// The operation's fixed arguments (`op_in`).
    pub arguments: &'a [u8],
    /// Names and data, `payload_sz` bytes of them.
    pub payload: &'a [u8],
}

impl<D: FlashDevice + Send + 'static> FlintFuse<D> {
    /// Answers `request` into `out` (the entry's payload buffer): the
    /// reply's length, or the errno.
    fn answer(&self, request: &Request, out: &mut [u8]) -> Result<usize, Errno> {
        self.shared.ring_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut out = Out { bytes: out, length: 0 };
        // A queue's thread must outlive a panic: the kernel would hold its
        // CPU's requests for an entry that never comes back. The engine's
        // lock is poisoned by then, and every later request answers EIO
        // (as on /dev/fuse).
        let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.dispatch(request, &mut out)));
        match answered {
            Ok(Ok(())) => Ok(out.length),
            Ok(Err(errno)) => Err(errno),
            Err(_) => Err(Errno::EIO),
        }
    }

    fn dispatch(&self, request: &Request, out: &mut Out) -> Result<(), Errno> {
        let (ino, arguments, payload) = (request.nodeid, request.arguments, request.payload);
        match request.opcode {
            LOOKUP => {
                let (name, _) = name_of(payload)?;
                out.entry(&self.call(|fs| fs.lookup(ino, name))?);
            }
            GETATTR => {
                let open_file = u32_at(arguments, 0) & FUSE_GETATTR_FH != 0;
                let attributes = self.getattr_for(ino, open_file)?;
                attr_out(out, &attributes);
            }
            SETATTR => {
                let valid = u32_at(arguments, 0);
                let now = self.clock.now_ns();
                let time = |set: u32, now_bit: u32, seconds_at: usize, nanoseconds_at: usize| {
                    if valid & now_bit != 0 {
                        Some(now)
                    } else if valid & set != 0 {
                        let seconds = u64_at(arguments, seconds_at) as i64;
                        let nanoseconds = i64::from(u32_at(arguments, nanoseconds_at));
                        Some(seconds.saturating_mul(1_000_000_000).saturating_add(nanoseconds))
                    } else {
                        None
                    }
                };
                let changes = SetAttributes {
                    permissions: (valid & FATTR_MODE != 0).then(|| u32_at(arguments, 68) & 0o7777),
                    uid: (valid & FATTR_UID != 0).then(|| u32_at(arguments, 76)),
                    gid: (valid & FATTR_GID != 0).then(|| u32_at(arguments, 80)),
                    size: (valid & FATTR_SIZE != 0).then(|| u64_at(arguments, 16)),
                    atime_ns: time(FATTR_ATIME, FATTR_ATIME_NOW, 32, 56),
                    mtime_ns: time(FATTR_MTIME, FATTR_MTIME_NOW, 40, 60),
                };
                let attributes = self.setattr_as(request.uid, ino, &changes)?;
                attr_out(out, &attributes);
            }
            READLINK => {
                let target = self.call(|fs| fs.readlink(ino))?;
                fit(out, &target)?;
            }
            SYMLINK => {
                let (name, rest) = name_of(payload)?;
                let (target, _) = name_of(rest)?;
                out.entry(&self.call(|fs| fs.symlink(ino, name, target, request.uid, request.gid))?);
            }
            MKNOD => {
                let (name, _) = name_of(payload)?;
                let (mode, rdev, umask) = (u32_at(arguments, 0), u32_at(arguments, 4), u32_at(arguments, 8));
                out.entry(&self.mknod_as(ino, name, mode, umask, rdev, request.uid, request.gid)?);
            }
            MKDIR => {
                let (name, _) = name_of(payload)?;
                let (mode, umask) = (u32_at(arguments, 0), u32_at(arguments, 4));
                out.entry(&self.make_as(true, ino, name, mode, umask, request.uid, request.gid)?);
            }
            UNLINK => {
                let (name, _) = name_of(payload)?;
                self.call(|fs| fs.unlink(ino, name))?;
            }
            RMDIR => {
                let (name, _) = name_of(payload)?;
                self.call(|fs| fs.rmdir(ino, name))?;
            }
            RENAME | RENAME2 => {
                let (name, rest) = name_of(payload)?;
                let (new_name, _) = name_of(rest)?;
                let flags = if request.opcode == RENAME2 { u32_at(arguments, 8) } else { 0 };
                self.rename_with(ino, name, u64_at(arguments, 0), new_name, flags)?;
            }
            LINK => {
                let (new_name, _) = name_of(payload)?;
                let old = u64_at(arguments, 0);
                out.entry(&self.call(|fs| fs.link(old, ino, new_name))?);
            }
            // The kernel opens files and directories itself once told
            // ENOSYS (every kernel with this transport can), and flush has
            // nothing to do (the module's account).
            OPEN | OPENDIR | FLUSH => return Err(Errno::ENOSYS),
            RELEASE | RELEASEDIR => {}
            READ => {
                let (offset, size) = (u64_at(arguments, 8), u32_at(arguments, 16));
                let bytes = self.call(|fs| fs.read(ino, offset, u64::from(size)))?;
                fit(out, &bytes)?;
            }
            WRITE => {
                let (offset, size) = (u64_at(arguments, 8), u32_at(arguments, 16) as usize);
                let data = payload.get(..size).ok_or(Errno::EINVAL)?;
                let write_flags = u32_at(arguments, 20);
                let kill_set_id = write_flags & FUSE_WRITE_KILL_SUIDGID != 0;
                let write_back = write_flags & FUSE_WRITE_CACHE != 0;
                let written = self.write_flagged(ino, offset, data, kill_set_id, write_back)?;
                out.u32(written);
                out.u32(0);
            }
            STATFS => {
                let statfs = self.call(|fs| fs.statfs())?;
                for value in
                    [statfs.blocks, statfs.blocks_free, statfs.blocks_available, statfs.files, statfs.files_free]
                {
                    out.u64(value);
                }
                for value in [statfs.block_size, statfs.name_max, statfs.block_size, 0, 0, 0, 0, 0, 0, 0] {
                    out.u32(value);
                }
            }
            FSYNC | FSYNCDIR => {
                let datasync = u32_at(arguments, 8) & 1 != 0;
                self.call(|fs| fs.fsync(ino, datasync))?;
            }
            SETXATTR => {
                let (size, flags) = (u32_at(arguments, 0) as usize, u32_at(arguments, 4) as i32);
                let (name, value) = name_of(payload)?;
                let value = value.get(..size).ok_or(Errno::EINVAL)?;
                self.setxattr_with(ino, name, value, flags, 0)?;
            }
            GETXATTR => {
                let (name, _) = name_of(payload)?;
                xattr_out(out, self.getxattr_sized(ino, name, u32_at(arguments, 0))?)?;
            }
            LISTXATTR => xattr_out(out, self.listxattr_sized(ino, u32_at(arguments, 0))?)?,
            REMOVEXATTR => {
                let (name, _) = name_of(payload)?;
                self.call(|fs| fs.removexattr(ino, name))?;
            }
            // Permissions are the kernel's (`default_permissions`): this
            // answers whether the file is there.
            ACCESS => {
                self.call(|fs| fs.getattr(ino))?;
            }
            CREATE => {
                let (name, _) = name_of(payload)?;
                let (mode, umask) = (u32_at(arguments, 4), u32_at(arguments, 8));
                let attributes = self.make_as(false, ino, name, mode, umask, request.uid, request.gid)?;
                out.entry(&attributes);
                out.u64(0); // fh
                out.u32(FOPEN_KEEP_CACHE);
                out.u32(0); // backing_id
            }
            READDIR => {
                let (offset, size) = (u64_at(arguments, 8), u32_at(arguments, 16) as usize);
                self.readdir_into(ino, offset, |entry| !out.dirent(entry, size))?;
            }
            READDIRPLUS => {
                let (offset, size) = (u64_at(arguments, 8), u32_at(arguments, 16) as usize);
                self.readdirplus_into(ino, offset, |entry, attributes| {
                    let length = ENTRY_OUT_BYTES + (24 + entry.name.len()).next_multiple_of(8);
                    if out.length + length > size.min(out.bytes.len()) {
                        return true;
                    }
                    out.entry(attributes);
                    !out.dirent(entry, size)
                })?;
            }
            FALLOCATE => {
                let (offset, length, mode) = (u64_at(arguments, 8), u64_at(arguments, 16), u32_at(arguments, 24));
                self.fallocate_with(ino, offset, length, mode as i32)?;
            }
            LSEEK => {
                let (offset, whence) = (u64_at(arguments, 8) as i64, u32_at(arguments, 16) as i32);
                out.u64(self.lseek_with(ino, offset, whence)? as u64);
            }
            // What flintfs does not implement (locks, ioctl, poll, bmap,
            // copy_file_range, statx, tmpfile): the kernel falls back or
            // stops asking, as it does when fuser answers these.
            _ => return Err(Errno::ENOSYS),
        }
        Ok(())
    }
}

/// `struct fuse_attr_out`.
fn attr_out(out: &mut Out, attributes: &Attributes) {
    out.u64(ATTRIBUTE_TTL.as_secs());
    out.u32(0);
    out.u32(0);
    out.attr(attributes);
}

fn fit(out: &mut Out, bytes: &[u8]) -> Result<(), Errno> {
    if bytes.len() > out.room() {
        return Err(Errno::EIO);
    }
    out.put(bytes);
    Ok(())
}

/// `struct fuse_getxattr_out` for a size, the bytes otherwise.
fn xattr_out(out: &mut Out, answer: XattrAnswer) -> Result<(), Errno> {
    match answer {
        XattrAnswer::Size(size) => {
            out.u32(size);
            out.u32(0);
            Ok(())
        }
        XattrAnswer::Bytes(bytes) => fit(out, &bytes),
    }
}

/// One entry's buffers: the header the kernel fills and answers are
/// written to, the payload, and the iovecs naming them at registration.
struct Entry {
    header: Box<[u8; HEADER_BYTES]>,
    payload: Vec<u8>,
    parts: Box<[libc::iovec; 2]>,
}

// SAFETY: the iovecs point into the entry's own boxes, which move with it.
unsafe impl Send for Entry {}

/// The command area of a ring SQE (`struct fuse_uring_cmd_req`).
fn command(commit_id: u64, queue: u16) -> [u8; 80] {
    let mut area = [0u8; 80];
    area[8..16].copy_from_slice(&commit_id.to_le_bytes());
    area[16..18].copy_from_slice(&queue.to_le_bytes());
    area
}

/// A FUSE ring command. io-uring's builder leaves the SQE's `len` at 0,
/// and REGISTER takes its iovec count there: it is set in the entry's
/// bytes (`len` is the u32 at byte 24 of every SQE).
fn ring_command(
    device: i32,
    operation: u32,
    area: [u8; 80],
    parts: Option<&[libc::iovec; 2]>,
    tag: u64,
) -> squeue::Entry128 {
    let mut builder = opcode::UringCmd80::new(types::Fd(device), operation).cmd(area);
    if let Some(parts) = parts {
        builder = builder.addr(Some(parts.as_ptr() as u64));
    }
    let entry = builder.build().user_data(tag);
    if parts.is_none() {
        return entry;
    }
    // SAFETY: Entry128 is a 128-byte repr(C) SQE; byte 24 is `len`.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&2u32.to_le_bytes());
    // SAFETY: the same bytes, one field changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// One CPU's queue: its ring and registered entries, on a thread pinned to
/// that CPU. The transport alone; what a request means is the caller's
/// (the mount's [`FlintFuse`], or the bench's probe).
pub struct Queue {
    ring: IoUring<squeue::Entry128>,
    entries: Vec<Entry>,
    device: OwnedFd,
    queue: u16,
    /// The request's payload, copied: the answer is written over it.
    scratch: Vec<u8>,
    /// Completions reaped at registration: requests the kernel handed over
    /// as soon as the last queue made the ring ready.
    early: Vec<(u64, i32)>,
    /// Entries the kernel holds. The buffers must outlive every one, so
    /// the queue ends only when none is left.
    held: usize,
}

/// What ends a connection's entries: unmount (ENOTCONN), an abort
/// (ECONNABORTED), the ring's own exit (ECANCELED).
fn connection_ended(result: i32) -> bool {
    matches!(-result, libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED)
}

impl Queue {
    /// Pins the calling thread to CPU `queue` and registers `depth`
    /// entries of `payload_bytes` on `device` (a `/dev/fuse` descriptor of
    /// the connection). Returns the queue with the entries the kernel
    /// took, and its refusal of the others if it refused any (it then
    /// turns the ring off for the connection); an error if it took none.
    pub fn register(
        device: OwnedFd,
        queue: u16,
        depth: usize,
        payload_bytes: usize,
    ) -> std::io::Result<(Queue, Option<std::io::Error>)> {
        // Pinned to its CPU, where its requests come from. A CPU outside
        // the thread's allowed set is refused; it then runs anywhere and
        // only the locality is lost.
        if usize::from(queue) < libc::CPU_SETSIZE as usize {
            // SAFETY: a zeroed CPU set with one bit set, in range, for
            // this thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(usize::from(queue), &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
        let mut ring: IoUring<squeue::Entry128> =
            IoUring::builder().setup_single_issuer().setup_coop_taskrun().build((2 * depth) as u32)?;
        let mut entries: Vec<Entry> = (0..depth)
            .map(|_| {
                let mut header = Box::new([0u8; HEADER_BYTES]);
                let mut payload = vec![0u8; payload_bytes];
                let parts = Box::new([
                    libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_BYTES },
                    libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload_bytes },
                ]);
                Entry { header, payload, parts }
            })
            .collect();
        let raw = device.as_raw_fd();
        for (index, entry) in entries.iter_mut().enumerate() {
            let sqe =
                ring_command(raw, FUSE_IO_URING_CMD_REGISTER, command(0, queue), Some(&entry.parts), index as u64);
            // SAFETY: the entry's buffers live as long as the kernel holds
            // the entry: the queue keeps them until `held` is 0.
            unsafe { ring.submission().push(&sqe) }.map_err(|_| std::io::Error::other("the ring is full"))?;
        }
        ring.submit()?;
        // The kernel takes a REGISTER inline: a refusal is already a
        // completion. A taken entry completes with a request, which can
        // come at once if this queue made the ring ready: those are kept
        // for `serve`, not dropped.
        let mut early = Vec::new();
        let mut refusal = None;
        let mut held = depth;
        for cqe in ring.completion() {
            if cqe.result() < 0 {
                held -= 1;
                refusal.get_or_insert(std::io::Error::from_raw_os_error(-cqe.result()));
            } else {
                early.push((cqe.user_data(), cqe.result()));
            }
        }
        if held == 0 {
            return Err(refusal.unwrap_or_else(|| std::io::Error::other("no ring entry taken")));
        }
        let queue = Queue { ring, entries, device, queue, scratch: vec![0u8; payload_bytes], early, held };
        Ok((queue, refusal))
    }

    /// Answers requests until the connection ends and the kernel holds no
    /// entry of this queue. `answer` writes a reply into the payload
    /// buffer it is given and returns its length, or returns an errno.
    /// Nothing else ends it: a thread that left while the connection
    /// lives would leave its CPU's requests waiting for ever.
    pub fn serve(&mut self, mut answer: impl FnMut(&Request, &mut [u8]) -> Result<usize, Errno>) {
        let device = self.device.as_raw_fd();
        let mut completed = std::mem::take(&mut self.early);
        loop {
            for (tag, result) in completed.drain(..) {
                if result < 0 {
                    // This entry is the kernel's no more.
                    self.held = self.held.saturating_sub(1);
                    if !connection_ended(result) {
                        let error = std::io::Error::from_raw_os_error(-result);
                        tracing::warn!("io_uring queue {}: an entry failed ({error})", self.queue);
                    }
                    if self.held == 0 {
                        return;
                    }
                    continue;
                }
                let Some(entry) = self.entries.get_mut(tag as usize) else {
                    tracing::warn!("io_uring queue {}: a completion for no entry ({tag})", self.queue);
                    continue;
                };
                let header = &entry.header[..];
                let unique = u64_at(header, 8);
                let commit_id = u64_at(header, ENTRY_OFFSET + 8);
                let payload_bytes = (u32_at(header, ENTRY_OFFSET + 16) as usize).min(entry.payload.len());
                let (opcode, nodeid, uid, gid) =
                    (u32_at(header, 4), u64_at(header, 16), u32_at(header, 24), u32_at(header, 28));
                let arguments = &header[OP_IN_OFFSET..ENTRY_OFFSET];
                // The reply goes in the payload buffer the request came in:
                // the smaller of the two is copied aside. A large request
                // (a write's data) gets a small reply, written aside and
                // copied back; a small one (names) is read from a copy.
                let answered = if payload_bytes > SMALL_PAYLOAD_BYTES {
                    let request =
                        Request { opcode, nodeid, uid, gid, arguments, payload: &entry.payload[..payload_bytes] };
                    answer(&request, &mut self.scratch).inspect(|&length| {
                        entry.payload[..length].copy_from_slice(&self.scratch[..length]);
                    })
                } else {
                    self.scratch[..payload_bytes].copy_from_slice(&entry.payload[..payload_bytes]);
                    let request =
                        Request { opcode, nodeid, uid, gid, arguments, payload: &self.scratch[..payload_bytes] };
                    answer(&request, &mut entry.payload)
                };
                let (error, length) = match answered {
                    Ok(length) => (0, length),
                    Err(errno) => (-errno.code(), 0),
                };
                entry.header[..OUT_HEADER_BYTES].copy_from_slice(&out_header(error, unique, length));
                entry.header[ENTRY_OFFSET + 16..ENTRY_OFFSET + 20].copy_from_slice(&(length as u32).to_le_bytes());
                let area = command(commit_id, self.queue);
                let sqe = ring_command(device, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, area, None, tag);
                // SAFETY: as at registration. The submission queue has
                // room: it holds twice the entries, and each entry has at
                // most one command in it.
                if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                    tracing::warn!("io_uring queue {}: no room to commit", self.queue);
                }
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(error) if matches!(error.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(error) => {
                    // Not expected of a live ring; waiting a little keeps a
                    // persistent failure from spinning a CPU.
                    tracing::warn!("io_uring queue {}: {error}", self.queue);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            completed.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        }
    }
}

/// The running queues; their threads end when the connection does.
pub struct Ring {
    threads: Vec<JoinHandle<()>>,
}

impl Ring {
    pub fn queues(&self) -> usize {
        self.threads.len()
    }

    /// Waits for every queue's thread to end (they end with the
    /// connection).
    pub fn join(self) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// How many CPUs the kernel keeps a queue for: every possible one
/// (`num_possible_cpus`), online or not; it routes nothing until each has
/// an entry.
pub fn possible_cpus() -> std::io::Result<usize> {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let unreadable = || std::io::Error::other(format!("unreadable possible CPUs {listed:?}"));
    let mut count = 0;
    for range in listed.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (usize, usize) =
            (first.parse().map_err(|_| unreadable())?, last.parse().map_err(|_| unreadable())?);
        count += last.checked_sub(first).ok_or_else(unreadable)? + 1;
    }
    Ok(count)
}

/// Whether this process can run the transport at all (the CPU list is
/// readable, and io_uring with 128-byte entries is allowed): asked before
/// the mount offers it at INIT, since once offered, the kernel holds every
/// request until the ring is ready or refused.
pub fn preflight() -> std::io::Result<()> {
    possible_cpus()?;
    IoUring::<squeue::Entry128>::builder().build(2).map(drop)
}

/// Makes the kernel give up the ring for this connection, after the daemon
/// failed to bring it up: a REGISTER with no buffers, which it refuses,
/// and a refused REGISTER turns the ring off and releases the requests it
/// held. An error means even that failed.
pub fn refuse(device: BorrowedFd) -> std::io::Result<()> {
    let mut ring = IoUring::<squeue::Entry128>::builder().build(2)?;
    let sqe = ring_command(device.as_raw_fd(), FUSE_IO_URING_CMD_REGISTER, command(0, 0), None, 0);
    // SAFETY: the command names no buffer.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| std::io::Error::other("the ring is full"))?;
    ring.submit_and_wait(1)?;
    let result = ring.completion().next().map(|cqe| cqe.result());
    match result {
        Some(result) if result < 0 => Ok(()),
        other => Err(std::io::Error::other(format!("the kernel took a REGISTER with no buffers ({other:?})"))),
    }
}

/// Starts a thread per possible CPU, each registering its queue on
/// `device` and then answering with `answer`; returns once every queue is
/// registered. An error means a queue did not come up: the kernel's
/// refusal (it then keeps the connection on `/dev/fuse`), or the daemon's
/// own failure (then see [`refuse`]). Queues that came up serve what they
/// took either way.
pub fn spawn_queues<A>(device: BorrowedFd, depth: usize, payload_bytes: usize, answer: A) -> std::io::Result<Ring>
where
    A: Fn(&Request, &mut [u8]) -> Result<usize, Errno> + Send + Sync + 'static,
{
    let cpus = possible_cpus()?;
    let answer = std::sync::Arc::new(answer);
    let (sender, receiver) = mpsc::channel();
    let mut threads = Vec::new();
    for queue in 0..cpus {
        let device = device.try_clone_to_owned()?;
        let (answer, ready) = (answer.clone(), sender.clone());
        threads.push(std::thread::Builder::new().name(format!("flintfs-ring-{queue}")).spawn(move || {
            let registered = Queue::register(device, queue as u16, depth, payload_bytes);
            // Said, then let go: a queue that panics before it says drops
            // its sender, and the wait below ends (Disconnected) rather
            // than waiting for ever on the others' senders.
            let (registered, said) = match registered {
                Ok((registered, refusal)) => (Some(registered), refusal.map_or(Ok(()), Err)),
                Err(error) => (None, Err(error)),
            };
            let _ = ready.send(said);
            drop(ready);
            if let Some(mut registered) = registered {
                registered.serve(|request, out| answer(request, out));
            }
        })?);
    }
    drop(sender);
    for _ in 0..cpus {
        match receiver.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(std::io::Error::other("a ring queue ended before registering")),
        }
    }
    Ok(Ring { threads })
}

/// The mount's queues: [`RING_DEPTH`] entries a CPU, answered by
/// `filesystem`.
pub fn start<D: FlashDevice + Send + 'static>(filesystem: FlintFuse<D>, device: BorrowedFd) -> std::io::Result<Ring> {
    spawn_queues(device, RING_DEPTH, PAYLOAD_BYTES, move |request, out| filesystem.answer(request, out))
}
