//! # `fuse-floor`: what the FUSE path allows, with a daemon that does no work
//!
//! Issue 19 asks that where the FUSE request floor makes half of ext4
//! impossible, flintfs over FUSE come within 1.5x of that floor. The
//! `flintfs-fuse` rows carry one estimate of it: the requests a workload
//! made, times the round trip of a LOOKUP that finds nothing. That leaves
//! out everything else the FUSE path costs: the kernel's side of each
//! request beyond the round trip (its page cache under the writeback
//! cache, the pages copied into and out of requests, the GETATTRs a
//! permission check waits for), the daemon's reading and answering of
//! requests of every size, and the wake-ups between the two. On a webserver
//! of 0.006 requests an operation it says a floor of millions of
//! operations a second that no FUSE file system reaches.
//!
//! This file system measures the floor end to end instead: it keeps every
//! file in memory and answers each request with a map lookup, so a
//! workload run on it costs what the FUSE path costs and nothing else. It
//! meets the kernel exactly as flintfs does (`flintfs_fuse::ask_kernel`:
//! the writeback cache, 1 MiB writes, readdirplus, set-ID bits cleared on
//! the kernel's word, no OPEN, OPENDIR or FLUSH; the same mount options,
//! attribute and entry timeouts, and worker threads), so the kernel sends
//! it the same requests for the same workload (its row counts them, to
//! compare). Its ops/s over flintfs-fuse's is then how much of
//! flintfs-fuse's time is the engine's.
//!
//! It is a measuring device, not a file system anyone keeps data on: no
//! xattrs (every GETXATTR is ENODATA, as flintfs answers for a name not
//! set), no hard links, no special files, no limits but memory.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use flintfs_fuse::{ATTRIBUTE_TTL, MAX_WRITE_BYTES};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

const ROOT_INO: u64 = 1;
const BLOCK_BYTES: u32 = 4096;
/// The longest name taken, as flintfs's (and ext4's).
const NAME_BYTES_MAX: usize = 255;
/// A file's largest size: what the bench writes is far below it, and a
/// bound keeps a stray offset from asking for all of memory.
const FILE_BYTES_MAX: u64 = 4 << 30;
const _: () = assert!(FILE_BYTES_MAX >= MAX_WRITE_BYTES as u64);
/// Entries taken for one readdir reply: more than a reply's buffer holds
/// of short names, as flintfs's adapter asks of its engine.
const LISTING_ENTRIES_MAX: usize = flintfs_fuse::READDIR_BATCH_ENTRIES;

/// A directory's names, each with the cookie a listing resumes after: a
/// listing goes on from where the last reply stopped however the
/// directory changed in between (as flintfs's hash cookies do), never
/// skipping a name that stayed or repeating one.
#[derive(Default)]
struct Entries {
    by_name: HashMap<Vec<u8>, (u64, u64)>,
    by_cookie: BTreeMap<u64, (Vec<u8>, u64)>,
    cookie_next: u64,
}

/// The cookies of `.` and `..`; names take the ones after.
const DOT_COOKIES: u64 = 2;

impl Entries {
    fn get(&self, name: &[u8]) -> Option<u64> {
        self.by_name.get(name).map(|(_, ino)| *ino)
    }

    fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    fn insert(&mut self, name: &[u8], ino: u64) {
        let cookie = DOT_COOKIES + 1 + self.cookie_next;
        self.cookie_next += 1;
        let replaced = self.by_name.insert(name.to_vec(), (cookie, ino));
        assert!(replaced.is_none(), "a name is inserted once");
        self.by_cookie.insert(cookie, (name.to_vec(), ino));
    }

    fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let (cookie, ino) = self.by_name.remove(name)?;
        self.by_cookie.remove(&cookie);
        Some(ino)
    }

    /// Names past `offset` (a cookie), with their cookies.
    fn after(&self, offset: u64) -> impl Iterator<Item = (u64, &[u8], u64)> {
        let first = offset.max(DOT_COOKIES) + 1;
        self.by_cookie.range(first..).map(|(cookie, (name, ino))| (*cookie, name.as_slice(), *ino))
    }
}

enum Content {
    Directory(Entries),
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

struct Node {
    attr: FileAttr,
    parent: u64,
    content: Content,
    /// The kernel's references (entries it was given, less FORGETs): an
    /// unlinked node stays until they are gone, as an open file does.
    lookups: u64,
}

/// The files, shared with a remount (a new session over the same tree,
/// with the kernel's caches gone).
pub struct Tree {
    nodes: HashMap<u64, Node>,
    ino_next: u64,
}

impl Tree {
    pub fn new() -> Arc<Mutex<Tree>> {
        let mut nodes = HashMap::new();
        let root = Node {
            attr: attributes(ROOT_INO, FileType::Directory, 0o755, 0, 0),
            parent: ROOT_INO,
            content: Content::Directory(Entries::default()),
            lookups: 0,
        };
        nodes.insert(ROOT_INO, root);
        Arc::new(Mutex::new(Tree { nodes, ino_next: ROOT_INO + 1 }))
    }

    fn node(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn children(&mut self, ino: u64) -> Result<&mut Entries, Errno> {
        match &mut self.node(ino)?.content {
            Content::Directory(children) => Ok(children),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn child(&mut self, parent: u64, name: &[u8]) -> Result<u64, Errno> {
        self.children(parent)?.get(name).ok_or(Errno::ENOENT)
    }

    /// The entry for a name the kernel is given: one reference more.
    fn entry(&mut self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.node(ino)?;
        node.lookups += 1;
        Ok(node.attr)
    }

    fn make(
        &mut self,
        parent: u64,
        name: &[u8],
        kind: FileType,
        permissions: u32,
        request: &Request,
        content: Content,
    ) -> Result<FileAttr, Errno> {
        if name.len() > NAME_BYTES_MAX {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        if self.children(parent)?.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        let ino = self.ino_next;
        self.ino_next += 1;
        let mut attr = attributes(ino, kind, permissions, request.uid(), request.gid());
        if let Content::Symlink(target) = &content {
            attr.size = target.len() as u64;
        }
        self.nodes.insert(ino, Node { attr, parent, content, lookups: 0 });
        self.children(parent)?.insert(name, ino);
        let now = SystemTime::now();
        let directory = self.node(parent)?;
        directory.attr.mtime = now;
        directory.attr.ctime = now;
        if kind == FileType::Directory {
            directory.attr.nlink += 1;
        }
        self.entry(ino)
    }

    /// Takes `name` out of `parent`; the node goes once the kernel lets go.
    fn remove(&mut self, parent: u64, name: &[u8], directory: bool) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        match (&self.node(ino)?.content, directory) {
            (Content::Directory(children), true) if !children.is_empty() => return Err(Errno::ENOTEMPTY),
            (Content::Directory(_), false) => return Err(Errno::EISDIR),
            (Content::File(_) | Content::Symlink(_), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.children(parent)?.remove(name);
        let now = SystemTime::now();
        let folder = self.node(parent)?;
        folder.attr.mtime = now;
        folder.attr.ctime = now;
        if directory {
            folder.attr.nlink -= 1;
        }
        let node = self.node(ino)?;
        node.attr.nlink = 0;
        node.attr.ctime = now;
        self.drop_if_unused(ino);
        Ok(())
    }

    fn drop_if_unused(&mut self, ino: u64) {
        if ino != ROOT_INO && self.nodes.get(&ino).is_some_and(|node| node.attr.nlink == 0 && node.lookups == 0) {
            self.nodes.remove(&ino);
        }
    }

    fn rename(&mut self, parent: u64, name: &[u8], new_parent: u64, new_name: &[u8]) -> Result<(), Errno> {
        // Every check before the first change, so a refusal changes nothing.
        let ino = self.child(parent, name)?;
        if new_name.len() > NAME_BYTES_MAX {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let moving_directory = matches!(self.node(ino)?.content, Content::Directory(_));
        match self.children(new_parent)?.get(new_name) {
            Some(replaced) if replaced == ino => return Ok(()),
            Some(_) => self.remove(new_parent, new_name, moving_directory)?,
            None => {}
        }
        self.children(parent)?.remove(name);
        self.children(new_parent)?.insert(new_name, ino);
        if moving_directory && parent != new_parent {
            self.node(parent)?.attr.nlink -= 1;
            self.node(new_parent)?.attr.nlink += 1;
        }
        let now = SystemTime::now();
        for folder in [parent, new_parent] {
            let folder = self.node(folder)?;
            folder.attr.mtime = now;
            folder.attr.ctime = now;
        }
        let node = self.node(ino)?;
        node.parent = new_parent;
        node.attr.ctime = now;
        Ok(())
    }

    /// A new session: the kernel holds no reference to anything, and what
    /// was unlinked while it held one goes.
    fn forget_all(&mut self) {
        self.nodes.retain(|ino, node| *ino == ROOT_INO || node.attr.nlink > 0);
        for node in self.nodes.values_mut() {
            node.lookups = 0;
        }
    }
}

impl Tree {
    /// A directory's entries from `offset` on (the dots first), each with
    /// its place in the listing and its attributes (the dots' are the
    /// directories they name).
    fn listing(&self, ino: u64, offset: u64) -> Result<Vec<(u64, Vec<u8>, FileAttr)>, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let Content::Directory(entries) = &node.content else { return Err(Errno::ENOTDIR) };
        let dots = [(1, &b"."[..], ino), (DOT_COOKIES, &b".."[..], node.parent)];
        let listed = dots.into_iter().filter(|(cookie, _, _)| *cookie > offset).chain(entries.after(offset));
        // At most what one reply can carry: a directory of many entries
        // is listed in many replies, each from where the last stopped.
        Ok(listed
            .take(LISTING_ENTRIES_MAX)
            .filter_map(|(cookie, name, child)| Some((cookie, name.to_vec(), self.nodes.get(&child)?.attr)))
            .collect())
    }
}

fn attributes(ino: u64, kind: FileType, permissions: u32, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm: (permissions & 0o7777) as u16,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: BLOCK_BYTES,
        flags: 0,
    }
}

fn resize(node: &mut Node, size: u64) -> Result<(), Errno> {
    let Content::File(bytes) = &mut node.content else { return Err(Errno::EISDIR) };
    if size > FILE_BYTES_MAX {
        return Err(Errno::from_i32(libc::EFBIG));
    }
    bytes.resize(size as usize, 0);
    node.attr.size = size;
    node.attr.blocks = size.div_ceil(512);
    Ok(())
}

/// The file system a session serves: the tree, and what it was asked.
pub struct FloorFs {
    tree: Arc<Mutex<Tree>>,
    /// Requests answered (FORGETs, which take none, left out), over every
    /// session of the run.
    requests: Arc<AtomicU64>,
    /// Whether to ask for the kernel's writeback cache, as the flintfs
    /// mounts beside it do (`-o nowriteback_cache` turns both off).
    writeback_cache: bool,
    no_open: bool,
    no_opendir: bool,
}

impl FloorFs {
    pub fn new(tree: Arc<Mutex<Tree>>, requests: Arc<AtomicU64>, writeback_cache: bool) -> FloorFs {
        FloorFs { tree, requests, writeback_cache, no_open: false, no_opendir: false }
    }

    /// The tree, for one request: counted, as flintfs's daemon counts its.
    fn tree(&self) -> MutexGuard<'_, Tree> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn reply_entry(reply: ReplyEntry, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.entry(&ATTRIBUTE_TTL, &attr, Generation(0)),
        Err(errno) => reply.error(errno),
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

fn now_or(value: TimeOrNow) -> SystemTime {
    match value {
        TimeOrNow::Now => SystemTime::now(),
        TimeOrNow::SpecificTime(time) => time,
    }
}

impl Filesystem for FloorFs {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let answer = flintfs_fuse::ask_kernel(config, self.writeback_cache);
        self.no_open = answer.no_open;
        self.no_opendir = answer.no_opendir;
        Ok(())
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut tree = self.tree();
        let found = tree.child(parent.0, name.as_bytes()).and_then(|ino| tree.entry(ino));
        reply_entry(reply, found);
    }

    /// Not counted: a FORGET takes no answer, so it is no round trip (as
    /// flintfs's daemon counts them apart).
    fn forget(&self, _request: &Request, ino: INodeNo, count: u64) {
        let mut tree = self.tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(node) = tree.nodes.get_mut(&ino.0) {
            node.lookups = node.lookups.saturating_sub(count);
        }
        tree.drop_if_unused(ino.0);
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, _handle: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree().node(ino.0) {
            Ok(node) => reply.attr(&ATTRIBUTE_TTL, &node.attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
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
        let mut tree = self.tree();
        let changed = tree.node(ino.0).and_then(|node| {
            if let Some(size) = size {
                resize(node, size)?;
                node.attr.mtime = SystemTime::now();
            }
            if let Some(mode) = mode {
                node.attr.perm = (mode & 0o7777) as u16;
            }
            if uid.is_some() || gid.is_some() {
                // A chown clears the set-ID bits, as the engine does when
                // the kernel leaves that to it (FUSE_HANDLE_KILLPRIV_V2).
                node.attr.perm &= !0o6000;
            }
            node.attr.uid = uid.unwrap_or(node.attr.uid);
            node.attr.gid = gid.unwrap_or(node.attr.gid);
            if let Some(atime) = atime {
                node.attr.atime = now_or(atime);
            }
            if let Some(mtime) = mtime {
                node.attr.mtime = now_or(mtime);
            }
            node.attr.ctime = SystemTime::now();
            Ok(node.attr)
        });
        match changed {
            Ok(attr) => reply.attr(&ATTRIBUTE_TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        match self.tree().node(ino.0).map(|node| &node.content) {
            Ok(Content::Symlink(target)) => reply.data(target),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(errno) => reply.error(errno),
        }
    }

    fn mkdir(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let permissions = mode & !umask;
        let made = self.tree().make(
            parent.0,
            name.as_bytes(),
            FileType::Directory,
            permissions,
            request,
            Content::Directory(Entries::default()),
        );
        reply_entry(reply, made);
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().remove(parent.0, name.as_bytes(), false));
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().remove(parent.0, name.as_bytes(), true));
    }

    fn symlink(&self, request: &Request, parent: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let content = Content::Symlink(target.as_os_str().as_bytes().to_vec());
        let made = self.tree().make(parent.0, name.as_bytes(), FileType::Symlink, 0o777, request, content);
        reply_entry(reply, made);
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
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        reply_empty(reply, self.tree().rename(parent.0, name.as_bytes(), new_parent.0, new_name.as_bytes()));
    }

    /// Not counted, as flintfs's daemon does not count its (it answers
    /// without the engine, and the kernel sends no more after ENOSYS).
    fn open(&self, _request: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        }
    }

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
        match self.tree().node(ino.0).map(|node| &node.content) {
            Ok(Content::File(bytes)) => {
                let start = (offset as usize).min(bytes.len());
                let end = start.saturating_add(size as usize).min(bytes.len());
                reply.data(&bytes[start..end]);
            }
            Ok(_) => reply.error(Errno::EISDIR),
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
        let mut tree = self.tree();
        let written = tree.node(ino.0).and_then(|node| {
            let end = offset.checked_add(data.len() as u64).ok_or(Errno::from_i32(libc::EFBIG))?;
            if end > node.attr.size {
                resize(node, end)?;
            }
            let Content::File(bytes) = &mut node.content else { return Err(Errno::EISDIR) };
            bytes[offset as usize..end as usize].copy_from_slice(data);
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                node.attr.perm &= !0o6000;
            }
            Ok(data.len() as u32)
        });
        match written {
            Ok(count) => reply.written(count),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(&self, _request: &Request, _ino: INodeNo, _handle: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn fsync(&self, _request: &Request, ino: INodeNo, _handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().node(ino.0).map(|_| ()));
    }

    fn readdir(&self, _request: &Request, ino: INodeNo, _handle: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.tree().listing(ino.0, offset) {
            Ok(listing) => {
                for (cookie, name, attr) in listing {
                    if reply.add(attr.ino, cookie, attr.kind, OsStr::from_bytes(&name)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn readdirplus(
        &self,
        _request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut tree = self.tree();
        let listing = match tree.listing(ino.0, offset) {
            Ok(listing) => listing,
            Err(errno) => return reply.error(errno),
        };
        for (cookie, name, attr) in listing {
            if reply.add(attr.ino, cookie, OsStr::from_bytes(&name), &ATTRIBUTE_TTL, &attr, Generation(0)) {
                break;
            }
            // The kernel takes a reference for every entry but the dots.
            if cookie > DOT_COOKIES {
                if let Some(node) = tree.nodes.get_mut(&attr.ino.0) {
                    node.lookups += 1;
                }
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _request: &Request, ino: INodeNo, _handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().node(ino.0).map(|_| ()));
    }

    fn statfs(&self, _request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.tree().nodes.len() as u64;
        let blocks = 1u64 << 30;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            files,
            u64::from(u32::MAX),
            BLOCK_BYTES,
            NAME_BYTES_MAX as u32,
            BLOCK_BYTES,
        );
    }

    fn getxattr(&self, _request: &Request, ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        match self.tree().node(ino.0) {
            Ok(_) => reply.error(Errno::ENODATA),
            Err(errno) => reply.error(errno),
        }
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.tree().node(ino.0) {
            Ok(_) if size == 0 => reply.size(0),
            Ok(_) => reply.data(&[]),
            Err(errno) => reply.error(errno),
        }
    }

    fn access(&self, _request: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().node(ino.0).map(|_| ()));
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
        let made = self.tree().make(
            parent.0,
            name.as_bytes(),
            FileType::RegularFile,
            mode & !umask,
            request,
            Content::File(Vec::new()),
        );
        match made {
            Ok(attr) => {
                reply.created(&ATTRIBUTE_TTL, &attr, Generation(0), FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
            }
            Err(errno) => reply.error(errno),
        }
    }
}

/// A mounted [`FloorFs`]: its session, and the tree and count it shares
/// with the next one (a remount).
pub struct FloorMount {
    session: Option<fuser::BackgroundSession>,
    pub tree: Arc<Mutex<Tree>>,
    pub requests: Arc<AtomicU64>,
}

impl FloorMount {
    /// Mounts `tree` at `mountpoint` as flintfs mounts (the same options
    /// and workers, open to every user, root mounting).
    pub fn mount(
        mountpoint: &Path,
        tree: Arc<Mutex<Tree>>,
        requests: Arc<AtomicU64>,
        writeback_cache: bool,
    ) -> std::io::Result<FloorMount> {
        tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).forget_all();
        let filesystem = FloorFs::new(tree.clone(), requests.clone(), writeback_cache);
        let config = flintfs_fuse::config("fuse-floor", true, &[]);
        let session = fuser::Session::new(filesystem, mountpoint, &config)?.spawn()?;
        // flintfs's readahead window too, so that reads meet the same
        // kernel; where it cannot be set (not root), flintfs's mount keeps
        // the kernel's default as well.
        if let Err(error) = flintfs_fuse::set_readahead(mountpoint, flintfs_fuse::READAHEAD_BYTES_DEFAULT) {
            eprintln!("fuse-floor: readahead stays at the kernel's default: {error}");
        }
        Ok(FloorMount { session: Some(session), tree, requests })
    }

    /// Unmounts and waits for the session's workers to end.
    pub fn unmount(mut self) -> std::io::Result<()> {
        match self.session.take() {
            Some(session) => session.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for FloorMount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn fuse_available() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let fuse = Path::new("/dev/fuse").exists();
        if !(root && fuse) {
            eprintln!("skipped: the FUSE floor mounts need /dev/fuse and root (/dev/fuse: {fuse}, root: {root})");
        }
        root && fuse
    }

    /// The floor is a file system the workloads can trust: what they write
    /// they read back, names come and go as asked, a remount keeps the
    /// files, and every request but a FORGET is counted.
    #[test]
    fn the_floor_keeps_what_is_written_across_a_remount() {
        if !fuse_available() {
            return;
        }
        let scratch = std::env::temp_dir().join(format!("fuse-floor-test-{}", std::process::id()));
        let mountpoint = scratch.join("mnt");
        std::fs::create_dir_all(&mountpoint).unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let mounted = FloorMount::mount(&mountpoint, Tree::new(), requests.clone(), true).unwrap();
        let payload: Vec<u8> = (0..300_000u32).map(|index| (index * 7 % 251) as u8).collect();
        std::fs::create_dir(mountpoint.join("dir")).unwrap();
        let mut file = std::fs::File::create(mountpoint.join("dir/file")).unwrap();
        file.write_all(&payload).unwrap();
        file.sync_all().unwrap();
        drop(file);
        std::fs::write(mountpoint.join("gone"), b"x").unwrap();
        std::fs::rename(mountpoint.join("dir/file"), mountpoint.join("dir/moved")).unwrap();
        std::fs::remove_file(mountpoint.join("gone")).unwrap();
        assert!(std::fs::metadata(mountpoint.join("gone")).is_err());
        assert_eq!(std::fs::remove_dir(mountpoint.join("dir")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
        // A listing resumes where its last reply stopped while names go:
        // removing a directory of many replies' worth as it is listed.
        std::fs::create_dir(mountpoint.join("many")).unwrap();
        for index in 0..600 {
            std::fs::write(mountpoint.join(format!("many/a-long-name-for-file-{index:04}")), b"").unwrap();
        }
        assert_eq!(std::fs::read_dir(mountpoint.join("many")).unwrap().count(), 600);
        std::fs::remove_dir_all(mountpoint.join("many")).unwrap();
        assert!(std::fs::metadata(mountpoint.join("many")).is_err());
        let (tree, counted) = (mounted.tree.clone(), mounted.requests.clone());
        mounted.unmount().unwrap();
        let before_remount = counted.load(Ordering::Relaxed);
        assert!(before_remount > 0, "requests are counted");
        let mounted = FloorMount::mount(&mountpoint, tree, counted.clone(), true).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(mountpoint.join("dir"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["moved"]);
        let mut back = Vec::new();
        std::fs::File::open(mountpoint.join("dir/moved")).unwrap().read_to_end(&mut back).unwrap();
        assert!(back == payload, "the bytes written come back after a remount");
        assert_eq!(std::fs::metadata(mountpoint.join("dir/moved")).unwrap().len(), payload.len() as u64);
        assert!(counted.load(Ordering::Relaxed) > before_remount, "the new session counts on");
        mounted.unmount().unwrap();
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}
