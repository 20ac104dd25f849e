//! The POSIX operations. Each checks its arguments, starts with
//! [`Fs::begin`] (a checkpoint if one is due), changes nodes in the cache,
//! and ends by writing back what the cache pushed out and flushing data
//! past its bound.

use flintfs_flash::FlashDevice;
use flintfs_format::{
    inline_bytes_max, name_hash, validate_name, xattr_bytes_max, DirectoryContent, Entry, FileContent, FileType, Inode,
    LogOperation, Node, Pointer, Target, FIRST_DYNAMIC_ZONE, NAME_BYTES_MAX, SLOT_NONE, XATTR_NAME_BYTES_MAX,
};

use super::directory::name_text;
use super::nodes::MapEntry;
use super::nodes::{Cached, NodeKey};
use super::{Fs, Known, Location, ROOT_SLOT};
use crate::cache::Dirty;
use crate::error::{errno, Error, Result};
use crate::volume::{RESERVE_ZONES, ROOT_INO};

/// What `stat` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub ino: u64,
    pub file_type: FileType,
    /// Permission bits (`0o7777`).
    pub permissions: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte units.
    pub blocks: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub rdev: u32,
    pub block_size: u32,
    /// The inode's `born` version: FUSE's generation number.
    pub generation: u64,
}

/// What a write does to the set-ID bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetIdOnWrite {
    /// Clear set-user-ID ([`Fs::write`]'s rule).
    ClearSetUserId,
    /// Clear set-user-ID, and set-group-ID where the group may execute
    /// (the kernel's rule for a writer without CAP_FSETID).
    ClearBoth,
    /// Leave both (a writer with CAP_FSETID).
    Keep,
}

impl SetIdOnWrite {
    const SET_USER_ID: u32 = 0o4000;
    const SET_GROUP_ID: u32 = 0o2000;
    const GROUP_EXECUTE: u32 = 0o010;

    /// The bits of `mode` this rule clears.
    pub fn cleared_bits(self, mode: u32) -> u32 {
        match self {
            SetIdOnWrite::ClearSetUserId => mode & Self::SET_USER_ID,
            SetIdOnWrite::ClearBoth if mode & Self::GROUP_EXECUTE != 0 => {
                mode & (Self::SET_USER_ID | Self::SET_GROUP_ID)
            }
            SetIdOnWrite::ClearBoth => mode & Self::SET_USER_ID,
            SetIdOnWrite::Keep => 0,
        }
    }
}

/// What `setattr` changes; `None` leaves a field alone (the log's record
/// of it, as it is).
pub use flintfs_format::SetAttributes;

/// One entry of a directory listing. `offset` is the cookie that resumes
/// the listing after this entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryEntry {
    pub ino: u64,
    pub offset: u64,
    pub file_type: FileType,
    pub name: Vec<u8>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST rather than replace (RENAME_NOREPLACE).
    pub no_replace: bool,
    /// Swap the two names, which must both exist (RENAME_EXCHANGE).
    pub exchange: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XattrFlags {
    /// Fail with EEXIST if it exists (XATTR_CREATE).
    pub create: bool,
    /// Fail with ENODATA unless it exists (XATTR_REPLACE).
    pub replace: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// What a new inode starts as.
struct NewInode {
    file_type: FileType,
    permissions: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
}

const COOKIE_DOT: u64 = 1;
const COOKIE_DOT_DOT: u64 = 2;
/// Entry cookies are the name hash plus this.
const COOKIE_BASE: u64 = 3;
/// Longest symlink target (PATH_MAX).
pub const SYMLINK_BYTES_MAX: u64 = 4096;
/// `fallocate` mode bit: do not change the size.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// `fallocate` mode bit: free the range, which reads as zeros after; only
/// with [`FALLOC_FL_KEEP_SIZE`], as Linux has it.
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// `fallocate` mode bit: the range reads as zeros after, and the size
/// grows to cover it unless [`FALLOC_FL_KEEP_SIZE`].
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
/// What zeroing bytes `offset..end` of a file (below its size) does to
/// its blocks: the whole ones freed (`first_whole..end_whole`; the block
/// holding the last byte counts as whole when the range runs to the end
/// of the file, since what lies past the end reads as zeros anyway), and
/// at most two edge blocks, each with the byte range zeroed in it.
struct ZeroPlan {
    offset: u64,
    end: u64,
    first_whole: u64,
    end_whole: u64,
    edges: Vec<(u64, usize, usize)>,
}

impl ZeroPlan {
    fn new(offset: u64, end: u64, size: u64, block_bytes: u64) -> ZeroPlan {
        let mut plan = ZeroPlan { offset, end, first_whole: 0, end_whole: 0, edges: Vec::new() };
        if offset >= end {
            return plan;
        }
        plan.first_whole = offset.div_ceil(block_bytes);
        plan.end_whole = if end == size { end.div_ceil(block_bytes) } else { end / block_bytes };
        let head = offset / block_bytes;
        let tail = (end - 1) / block_bytes;
        for block in if head == tail { vec![head] } else { vec![head, tail] } {
            if (plan.first_whole..plan.end_whole).contains(&block) {
                continue;
            }
            let start = block * block_bytes;
            let from = (offset.max(start) - start) as usize;
            let to = (end.min(start + block_bytes) - start) as usize;
            plan.edges.push((block, from, to));
        }
        plan
    }
}

/// The `fallocate` modes flintfs takes (and its log records may carry).
pub const FALLOCATE_MODES: [u32; 5] = [
    0,
    FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_ZERO_RANGE,
    FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
];

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_BYTES_MAX {
        return Err(Error::new(
            errno::ENAMETOOLONG,
            format!("a name of {} bytes; at most {NAME_BYTES_MAX}", name.len()),
        ));
    }
    validate_name(name).map_err(|reason| {
        let code = if name == b"." || name == b".." { errno::EEXIST } else { errno::EINVAL };
        Error::new(code, reason)
    })
}

/// Logs write-backs and flushes an operation left for later because they
/// failed (`when` says after what). No room is expected on a full device
/// and logged at debug; anything else (a program failing for good, a
/// damaged node) at warn, so that the mount's log shows it before the
/// checkpoint that reports it does.
pub(crate) fn note_work_left(left: Result<()>, when: &str) {
    match left {
        Ok(()) => {}
        Err(error) if error.errno == errno::ENOSPC => {
            tracing::debug!(%error, "no room for a write-back {when}; it stays pending");
        }
        Err(error) => tracing::warn!(%error, "a write-back {when} failed; it stays pending"),
    }
}

impl<D: FlashDevice> Fs<D> {
    /// Runs an operation that changes something: a checkpoint first if one
    /// is due, then the operation, then the write-backs and data flushes it
    /// left. A write-back that fails after the operation succeeded stays
    /// pending for the next one; the operation's own result is returned.
    pub(crate) fn mutate<T>(&mut self, data_pages: u64, operation: impl FnOnce(&mut Fs<D>) -> Result<T>) -> Result<T> {
        self.mutate_with(data_pages, true, operation)
    }

    /// [`Fs::mutate`], asking `room_to_change` first only with `room`:
    /// the operations that free space ask it themselves, after their
    /// lookups (an unlink of a name not there is ENOENT on a full device
    /// too, and `rm -f` says nothing), or not at all (a file let go after
    /// its unlink, whose space must come back on the device that needs
    /// it most).
    pub(crate) fn mutate_with<T>(
        &mut self,
        data_pages: u64,
        room: bool,
        operation: impl FnOnce(&mut Fs<D>) -> Result<T>,
    ) -> Result<T> {
        self.begin(data_pages)?;
        if room {
            self.room_to_change(data_pages)?;
        }
        // One time and the version counter as the operation starts: its
        // log record carries both, and replay runs it with them.
        let replaying = self.log.replaying;
        if !replaying {
            self.log.operation_now = Some(self.clock.now_ns());
        }
        self.log.operation_version = self.version_next;
        let result = operation(self);
        if !replaying {
            self.log.operation_now = None;
        }
        if result.is_ok() {
            self.changed = true;
        }
        if self.options.read_only {
            // A read-only recovery's replay: what it changed stays in
            // memory (see `Fs::recover_in_memory`).
            return result;
        }
        // Whatever fails here stays pending or buffered for the next
        // checkpoint, which reports it.
        let left = self.drain().and_then(|()| {
            if self.dirty_blocks.len() * self.page_size > self.options.data_buffer_bytes {
                self.flush_data(None)?;
                self.drain()?;
            }
            self.log_spill()
        });
        note_work_left(left, "after a change");
        result
    }

    /// Writes back the dirty nodes a read pushed out of the bounded node
    /// cache. A read changes nothing, so a write-back refused here (the
    /// device full, a program failing) is not the read's failure, as a
    /// change's own write-backs are not its (`mutate`): the nodes stay
    /// pending, where every later read finds them. A later write-back
    /// writes them; the next checkpoint (an fsync's, a sync's, the
    /// unmount's) writes them or fails with the reason. Reads make no node
    /// dirty, so what stays pending is bounded by what the changes before
    /// made dirty. (On a full mount, `find` was told ENOSPC by a listing
    /// whose write-back found no room.)
    fn drain_after_read(&mut self) {
        note_work_left(self.drain(), "after a read");
    }

    /// Makes the root directory (format only).
    pub(crate) fn make_root(&mut self) -> Result<()> {
        let slot = self.allocate_slot()?;
        assert_eq!(slot, ROOT_SLOT, "the root takes the first slot");
        let now = self.now();
        let version = self.take_version();
        let inode = Inode {
            ino: ROOT_INO,
            born: version,
            current: version,
            mode: FileType::Directory.mode_bits() | 0o755,
            nlink: 2,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            parent: ROOT_INO,
            ..Inode::default()
        };
        self.insert_new(
            NodeKey::Slot(slot),
            Node::Directory { slot, inode, entry_count: 0, content: DirectoryContent::Inline(Vec::new()) },
        );
        self.drain()
    }

    fn take_version(&mut self) -> u64 {
        let version = self.version_next;
        self.version_next += 1;
        version
    }

    /// The inode of any file or directory.
    pub(crate) fn inode(&mut self, ino: u64) -> Result<Inode> {
        let key = self.file_key(ino)?;
        self.with_node(key, |node| match node {
            Node::File { inode, .. } | Node::Directory { inode, .. } if inode.ino == ino => Ok(inode.clone()),
            _ => Err(Error::new(errno::ENOENT, format!("inode {ino} does not exist"))),
        })?
    }

    /// The contents of `ino` changed: its mtime and ctime are now, which
    /// it returns.
    fn touch(&mut self, ino: u64) -> Result<i64> {
        let now = self.now();
        self.change_inode(ino, |inode| {
            inode.mtime_ns = now;
            inode.ctime_ns = now;
        })?;
        Ok(now)
    }

    /// Changes an inode in place.
    fn change_inode<R>(&mut self, ino: u64, change: impl FnOnce(&mut Inode) -> R) -> Result<R> {
        let key = self.file_key(ino)?;
        self.inode(ino)?;
        self.modify(key, |node| match node {
            Node::Directory { inode, .. } | Node::File { inode, .. } => change(inode),
            _ => unreachable!("inode keys hold inodes"),
        })
    }

    /// A file's attributes, given the 512-byte sectors it uses.
    fn attributes_of(&self, inode: &Inode, sectors: u64) -> Attributes {
        let file_type = inode.file_type().expect("decoded inodes have a type");
        let size = if file_type == FileType::Directory { self.page_size as u64 } else { inode.size };
        Attributes {
            ino: inode.ino,
            file_type,
            permissions: inode.mode & 0o7777,
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            size,
            blocks: sectors,
            atime_ns: inode.atime_ns,
            mtime_ns: inode.mtime_ns,
            ctime_ns: inode.ctime_ns,
            rdev: inode.rdev,
            block_size: self.page_size as u32,
            generation: inode.born,
        }
    }

    /// `st_blocks` counts what a file really uses, as du expects: the
    /// blocks its index points at and the new blocks buffered for it (a
    /// hole uses none); the bytes of inline data; a directory's page.
    pub fn getattr(&mut self, ino: u64) -> Result<Attributes> {
        let key = self.file_key(ino)?;
        let sector_bytes = 512;
        let page_sectors = self.page_size as u64 / sector_bytes;
        // The inode, and its sectors, or the blocks its index stores (the
        // buffered ones are added after).
        let (inode, sectors) = self.with_node(key, |node| match node {
            Node::File { inode, content: FileContent::Index { units_stored, .. }, .. } if inode.ino == ino => {
                Ok((inode.clone(), Err(*units_stored)))
            }
            Node::File { inode, content: FileContent::Inline(data), .. } if inode.ino == ino => {
                Ok((inode.clone(), Ok((data.len() as u64).div_ceil(sector_bytes))))
            }
            Node::Directory { inode, .. } if inode.ino == ino => Ok((inode.clone(), Ok(page_sectors))),
            _ => Err(Error::new(errno::ENOENT, format!("inode {ino} does not exist"))),
        })??;
        let sectors = match sectors {
            Ok(sectors) => sectors,
            Err(units_stored) => self.sectors_used(ino, units_stored)?,
        };
        let attributes = self.attributes_of(&inode, sectors);
        self.drain_after_read();
        Ok(attributes)
    }

    /// Holds one more reference to a file or directory: its number stays
    /// its own until the reference goes. Where it is comes from the state
    /// now (its locator, its slot), never from an entry read earlier: a
    /// write-back in between may have moved it.
    fn remember(&mut self, ino: u64) -> Result<()> {
        self.remember_count(ino, 1)
    }

    /// Registers `ino` in the table (with `add` more references).
    pub(crate) fn remember_count(&mut self, ino: u64, add: u64) -> Result<()> {
        if !self.known.contains_key(&ino) {
            let key = self.file_key(ino)?;
            if !self.known.contains_key(&ino) {
                let NodeKey::Slot(slot) = key else {
                    return Err(Error::corrupt(format!("inode {ino} is found physically but not remembered")));
                };
                let directory = self.with_node(key, |node| matches!(node, Node::Directory { .. }))?;
                self.known.insert(ino, Known { location: Location::Slot(slot), lookups: 0, orphan: false, directory });
            }
        }
        self.known.get_mut(&ino).expect("remembered").lookups += add;
        Ok(())
    }

    /// Registers a listed orphan found at mount (its inode, if a file, is
    /// in the map); false for an entry that is not an orphan (a repeat, or
    /// damage), which is left alone.
    pub(crate) fn adopt_orphan(&mut self, ino: u64) -> Result<bool> {
        if ino == 0 || ino > u64::from(self.slot_count) {
            return Err(Error::corrupt(format!("orphan {ino} is past the slots")));
        }
        let slot = (ino - 1) as u32;
        if self.known.contains_key(&ino) {
            return Ok(false);
        }
        let directory = match MapEntry::decode(self.map_get(slot)?) {
            // Only an unlinked file in the map is an orphan file: the list
            // comes from flash, and a live node must never be freed for it.
            MapEntry::Home(_) => match self.node(NodeKey::Slot(slot)) {
                Ok(Node::File { inode, slot: found, .. }) if found == slot && inode.ino == ino && inode.nlink == 0 => {
                    false
                }
                _ => return Ok(false),
            },
            MapEntry::Unwritten => true,
            _ => return Ok(false),
        };
        self.known.insert(ino, Known { location: Location::Slot(slot), lookups: 0, orphan: true, directory });
        Ok(true)
    }

    /// Frees an orphan nobody holds any more.
    pub(crate) fn delete_orphan(&mut self, ino: u64) -> Result<()> {
        let directory = self.known.get(&ino).is_some_and(|known| known.directory);
        if directory {
            self.free_slot((ino - 1) as u32)?;
        } else {
            self.delete_file(ino)?;
        }
        self.known.remove(&ino);
        self.changed = true;
        Ok(())
    }

    /// Finds `name` in directory `parent` and holds a reference to it.
    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<Attributes> {
        let directory = self.inode(parent)?;
        if directory.file_type() != Some(FileType::Directory) {
            return Err(Error::new(errno::ENOTDIR, format!("inode {parent} is not a directory")));
        }
        // FUSE counts a reference for every entry a lookup returns, "."
        // and ".." too.
        if name == b"." || name == b".." {
            let ino = if name == b"." { parent } else { directory.parent };
            let attributes = self.getattr(ino)?;
            self.remember(ino)?;
            return Ok(attributes);
        }
        if name.len() > NAME_BYTES_MAX {
            return Err(Error::new(errno::ENAMETOOLONG, format!("a name of {} bytes", name.len())));
        }
        let ino = self
            .directory_read_entry(parent, name, |entry| entry.ino)?
            .ok_or_else(|| Error::new(errno::ENOENT, format!("no {:?} in directory {parent}", name_text(name))))?;
        let attributes = self.getattr(ino)?;
        self.remember(ino)?;
        Ok(attributes)
    }

    /// Drops `count` references to a file. A file unlinked while held goes
    /// when the last reference does.
    pub fn forget(&mut self, ino: u64, count: u64) -> Result<()> {
        let Some(known) = self.known.get_mut(&ino) else { return Ok(()) };
        known.lookups = known.lookups.saturating_sub(count);
        if known.lookups > 0 {
            return Ok(());
        }
        if known.orphan {
            self.mutate_with(0, false, |fs| {
                fs.delete_orphan(ino)?;
                fs.log(LogOperation::Delete { ino });
                Ok(())
            })?;
        } else {
            // Let go in batches: whether a file still has state in memory
            // was two lookups in the node cache per index level, at every
            // forget (6% of webserver's host time in process), where a
            // batch's answer is one pass over what is dirty.
            self.forgotten.push(ino);
            if self.forgotten.len() >= self.options.forgotten_batch_files {
                self.prune_forgotten();
            }
        }
        Ok(())
    }

    /// Makes an inode named `name` in `parent`, with `content` (a
    /// symlink's target) written in the same operation, so no checkpoint
    /// can fall between the two.
    fn make_inode(&mut self, parent: u64, name: &[u8], new: NewInode, content: &[u8]) -> Result<Attributes> {
        let NewInode { file_type, permissions, uid, gid, rdev } = new;
        check_name(name)?;
        // Room is asked after the lookups (EEXIST on a full device too).
        self.mutate_with(0, false, |fs| {
            let directory = fs.inode(parent)?;
            if directory.file_type() != Some(FileType::Directory) {
                return Err(Error::new(errno::ENOTDIR, format!("inode {parent} is not a directory")));
            }
            if fs.directory_read_entry(parent, name, |_| ())?.is_some() {
                return Err(Error::new(errno::EEXIST, format!("{:?} exists in directory {parent}", name_text(name))));
            }
            // Nothing read above is used below but the parent's number.
            // The content's room too: once the entry is in, nothing may
            // checkpoint or fail for space before the operation is whole.
            let content_pages = content.len().div_ceil(fs.page_size) as u64;
            fs.check_capacity(content_pages)?;
            fs.reserve_space(content_pages, 4)?;
            let now = fs.now();
            let version = fs.take_version();
            fs.volume.count_inode_created();
            let hash = name_hash(fs.hash_seed, name);
            let mut inode = Inode {
                born: version,
                current: version,
                mode: file_type.mode_bits() | (permissions & 0o7777),
                uid,
                gid,
                nlink: 1,
                atime_ns: now,
                mtime_ns: now,
                ctime_ns: now,
                rdev,
                parent,
                name_hash: hash,
                ..Inode::default()
            };
            let (key, target) = if file_type == FileType::Directory {
                let slot = fs.allocate_slot()?;
                inode.ino = u64::from(slot) + 1;
                inode.nlink = 2;
                inode.name_hash = 0;
                let node = Node::Directory {
                    slot,
                    inode: inode.clone(),
                    entry_count: 0,
                    content: DirectoryContent::Inline(Vec::new()),
                };
                fs.insert_new(NodeKey::Slot(slot), node);
                fs.known.insert(
                    inode.ino,
                    Known { location: Location::Slot(slot), lookups: 1, orphan: false, directory: true },
                );
                (NodeKey::Slot(slot), Target::Slot(slot))
            } else {
                let slot = fs.allocate_slot()?;
                inode.ino = u64::from(slot) + 1;
                fs.map_set(slot, MapEntry::locator(parent, hash))?;
                let node =
                    Node::File { slot: SLOT_NONE, inode: inode.clone(), content: FileContent::Inline(Vec::new()) };
                fs.insert_new(NodeKey::File(inode.ino), node);
                fs.known.insert(
                    inode.ino,
                    Known {
                        location: Location::Physical { home: Pointer::NULL },
                        lookups: 1,
                        orphan: false,
                        directory: false,
                    },
                );
                (NodeKey::File(inode.ino), Target::Physical(Pointer::NULL))
            };
            let entry = Entry { hash, ino: inode.ino, target, file_type, name: name.to_vec() };
            if let Err(error) = fs.directory_insert(parent, entry) {
                fs.take(key);
                fs.known.remove(&inode.ino);
                fs.free_slot((inode.ino - 1) as u32)?;
                return Err(error);
            }
            fs.change_inode(parent, |directory| {
                directory.mtime_ns = now;
                directory.ctime_ns = now;
                if file_type == FileType::Directory {
                    directory.nlink += 1;
                }
            })?;
            if !content.is_empty() {
                fs.space_reserved = true;
                let written = fs.file_write(inode.ino, 0, content);
                fs.space_reserved = false;
                written?;
            }
            fs.log(LogOperation::Create {
                parent,
                ino: inode.ino,
                file_type,
                permissions: permissions & 0o7777,
                uid,
                gid,
                rdev,
                name: name.to_vec(),
                content: content.to_vec(),
            });
            if !content.is_empty() || file_type == FileType::Directory {
                return fs.getattr(inode.ino);
            }
            // A new file, empty: it uses nothing yet.
            Ok(fs.attributes_of(&inode, 0))
        })
    }

    /// Creates a regular file and holds a reference to it.
    pub fn create(&mut self, parent: u64, name: &[u8], permissions: u32, uid: u32, gid: u32) -> Result<Attributes> {
        self.make_inode(parent, name, NewInode { file_type: FileType::Regular, permissions, uid, gid, rdev: 0 }, &[])
    }

    pub fn mkdir(&mut self, parent: u64, name: &[u8], permissions: u32, uid: u32, gid: u32) -> Result<Attributes> {
        self.make_inode(parent, name, NewInode { file_type: FileType::Directory, permissions, uid, gid, rdev: 0 }, &[])
    }

    /// Makes a special file (a FIFO, a device, a socket) or a regular one,
    /// from the type bits of `mode`.
    pub fn mknod(&mut self, parent: u64, name: &[u8], mode: u32, rdev: u32, uid: u32, gid: u32) -> Result<Attributes> {
        let file_type = FileType::from_mode(mode).unwrap_or(FileType::Regular);
        if file_type == FileType::Directory || file_type == FileType::Symlink {
            return Err(Error::invalid("mknod makes neither directories nor symlinks"));
        }
        self.make_inode(parent, name, NewInode { file_type, permissions: mode, uid, gid, rdev }, &[])
    }

    pub fn symlink(&mut self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attributes> {
        if target.is_empty() || target.len() as u64 > SYMLINK_BYTES_MAX || target.contains(&0) {
            return Err(Error::invalid("a symlink target must be 1 to 4096 bytes without NUL"));
        }
        let new = NewInode { file_type: FileType::Symlink, permissions: 0o777, uid, gid, rdev: 0 };
        self.make_inode(parent, name, new, target)
    }

    pub fn readlink(&mut self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.file_type() != Some(FileType::Symlink) {
            return Err(Error::invalid(format!("inode {ino} is not a symlink")));
        }
        if inode.size == 0 || inode.size > SYMLINK_BYTES_MAX {
            return Err(Error::corrupt(format!("symlink {ino} has a target of {} bytes", inode.size)));
        }
        let target = self.file_read(ino, 0, inode.size)?;
        self.drain_after_read();
        Ok(target)
    }

    /// Gives file `ino` a second (or further) name. A file with one link
    /// moves to the map first: its entries then name a slot, not a page.
    pub fn link(&mut self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attributes> {
        check_name(new_name)?;
        self.mutate_with(0, false, |fs| {
            // The refusals first, by reads alone (EEXIST on a full device
            // too); then room, whose making may move the inode.
            let inode = fs.inode(ino)?;
            if inode.file_type() == Some(FileType::Directory) {
                return Err(Error::new(errno::EPERM, "directories cannot be hard-linked"));
            }
            if fs.inode(new_parent)?.file_type() != Some(FileType::Directory) {
                return Err(Error::new(errno::ENOTDIR, format!("inode {new_parent} is not a directory")));
            }
            if fs.directory_read_entry(new_parent, new_name, |_| ())?.is_some() {
                return Err(Error::new(errno::EEXIST, format!("{:?} exists", name_text(new_name))));
            }
            if inode.nlink == 0 {
                return Err(Error::new(errno::ENOENT, format!("inode {ino} has been unlinked")));
            }
            fs.reserve_space(0, 2)?;
            fs.log_pending_state(ino)?;
            let slot = match fs.file_key(ino)? {
                NodeKey::Slot(slot) => slot,
                _ => fs.move_to_map(ino, true)?,
            };
            let now = fs.now();
            let file_type = inode.file_type().expect("typed");
            let entry = Entry {
                hash: name_hash(fs.hash_seed, new_name),
                ino,
                target: Target::Slot(slot),
                file_type,
                name: new_name.to_vec(),
            };
            fs.directory_insert(new_parent, entry)?;
            fs.change_inode(ino, |inode| {
                inode.nlink += 1;
                inode.ctime_ns = now;
            })?;
            fs.change_inode(new_parent, |directory| {
                directory.mtime_ns = now;
                directory.ctime_ns = now;
            })?;
            fs.remember(ino)?;
            fs.log(LogOperation::Link { ino, new_parent, new_name: new_name.to_vec() });
            fs.getattr(ino)
        })
    }

    /// Moves a physically located file into the map; returns its slot.
    fn move_to_map(&mut self, ino: u64, entry_remains: bool) -> Result<u32> {
        self.ensure(NodeKey::File(ino))?;
        let slot = (ino - 1) as u32;
        let mut cached = self.take(NodeKey::File(ino)).expect("ensured");
        let Node::File { slot: node_slot, inode, .. } = &mut cached.node else { unreachable!() };
        let (parent, hash) = (inode.parent, inode.name_hash);
        *node_slot = slot;
        inode.parent = 0;
        inode.name_hash = 0;
        // The old page stops counting when the node is next written.
        self.cache_insert(NodeKey::Slot(slot), Cached { node: cached.node, home: cached.home }, Dirty::BOTH);
        self.known.get_mut(&ino).expect("known").location = Location::Slot(slot);
        // Written when the node is: until then the node is in memory.
        self.map_set(slot, 0)?;
        if entry_remains {
            self.directory_set_target(parent, hash, ino, Target::Slot(slot))?;
        }
        Ok(slot)
    }

    /// Removes a name of a file (not a directory).
    pub fn unlink(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)
            .map_err(|error| if error.errno == errno::EEXIST { Error::invalid(error.message) } else { error })?;
        self.volume.reserve_allowed = true;
        let result = self.mutate_with(0, false, |fs| {
            let (ino, file_type) = fs.entry_with(parent, name, |entry| (entry.ino, entry.file_type))?;
            if file_type == FileType::Directory {
                return Err(Error::new(errno::EISDIR, format!("{:?} is a directory", name_text(name))));
            }
            fs.room_to_change(0)?;
            // Found through its entry: remembered before the entry goes.
            fs.remember_count(ino, 0)?;
            let held = fs.known[&ino].lookups > 0;
            fs.directory_remove(parent, name)?;
            let now = fs.touch(parent)?;
            fs.drop_link(ino, now)?;
            fs.log(LogOperation::Unlink { parent, ino, held, name: name.to_vec() });
            Ok(())
        });
        self.volume.reserve_allowed = false;
        result
    }

    /// The entry `name` in `parent`, which must be a directory.
    fn entry(&mut self, parent: u64, name: &[u8]) -> Result<Entry> {
        self.entry_with(parent, name, Entry::clone)
    }

    /// What `read` takes from the entry `name` in `parent`, which must be a
    /// directory, read in place ([`Fs::directory_read_entry`]).
    fn entry_with<R>(&mut self, parent: u64, name: &[u8], read: impl Fn(&Entry) -> R) -> Result<R> {
        if self.inode(parent)?.file_type() != Some(FileType::Directory) {
            return Err(Error::new(errno::ENOTDIR, format!("inode {parent} is not a directory")));
        }
        self.directory_read_entry(parent, name, read)?
            .ok_or_else(|| Error::new(errno::ENOENT, format!("no {:?} in directory {parent}", name_text(name))))
    }

    /// One link of a file is gone: deletes it if that was the last and
    /// nobody holds it, or keeps it as an orphan until they let go.
    fn drop_link(&mut self, ino: u64, now: i64) -> Result<()> {
        self.remember_count(ino, 0)?;
        let nlink = self.change_inode(ino, |inode| {
            inode.nlink = inode.nlink.saturating_sub(1);
            inode.ctime_ns = now;
            if inode.nlink == 0 {
                inode.parent = 0;
            }
            inode.nlink
        })?;
        if nlink > 0 {
            return Ok(());
        }
        if self.known[&ino].lookups > 0 {
            // Kept for whoever holds it; moved to the map, so the
            // checkpoint's orphan list can find it after a crash.
            if matches!(self.known[&ino].location, Location::Physical { .. }) {
                // Its entry is gone already.
                self.move_to_map(ino, false)?;
            }
            self.known.get_mut(&ino).expect("known").orphan = true;
            return Ok(());
        }
        self.delete_file(ino)?;
        self.known.remove(&ino);
        Ok(())
    }

    /// Frees a file's blocks, index and inode.
    pub(crate) fn delete_file(&mut self, ino: u64) -> Result<()> {
        self.free_blocks_from(ino, 0)?;
        self.log_forget_file(ino);
        let keys: Vec<(u64, u64)> = self.dirty_blocks.range((ino, 0)..=(ino, u64::MAX)).map(|(key, _)| *key).collect();
        for key in keys {
            self.dirty_blocks.discard(&key);
        }
        match self.known.get(&ino).map(|known| known.location) {
            Some(Location::Physical { home }) => {
                self.discard(NodeKey::File(ino), home);
                self.free_slot((ino - 1) as u32)?;
            }
            Some(Location::Slot(slot)) => self.discard_slot(slot)?,
            None => return Err(Error::corrupt(format!("deleting inode {ino}, which is not known"))),
        }
        self.changed = true;
        Ok(())
    }

    pub fn rmdir(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(Error::invalid("rmdir of '.'"));
        }
        if name == b".." {
            return Err(Error::new(errno::ENOTEMPTY, "rmdir of '..'"));
        }
        check_name(name)?;
        self.volume.reserve_allowed = true;
        let result = self.mutate_with(0, false, |fs| {
            let entry = fs.entry(parent, name)?;
            if entry.file_type != FileType::Directory {
                return Err(Error::new(errno::ENOTDIR, format!("{:?} is not a directory", name_text(name))));
            }
            let Node::Directory { entry_count, .. } = fs.directory(entry.ino)? else { unreachable!() };
            if entry_count > 0 {
                return Err(Error::new(errno::ENOTEMPTY, format!("{:?} holds {entry_count} entries", name_text(name))));
            }
            fs.room_to_change(0)?;
            let held = fs.known.get(&entry.ino).is_some_and(|known| known.lookups > 0);
            fs.directory_remove(parent, name)?;
            fs.remove_directory(entry.ino)?;
            let now = fs.now();
            fs.change_inode(parent, |directory| {
                directory.nlink = directory.nlink.saturating_sub(1);
                directory.mtime_ns = now;
                directory.ctime_ns = now;
            })?;
            fs.log(LogOperation::Rmdir { parent, ino: entry.ino, held, name: name.to_vec() });
            Ok(())
        });
        self.volume.reserve_allowed = false;
        result
    }

    /// Frees an empty directory whose entry is already gone. While the
    /// caller holds it, its number (slot) stays taken.
    fn remove_directory(&mut self, ino: u64) -> Result<()> {
        self.directory_release_buckets(ino)?;
        let slot = (ino - 1) as u32;
        if self.known.get(&ino).is_some_and(|known| known.lookups > 0) {
            let home = match MapEntry::decode(self.map_get(slot)?) {
                MapEntry::Home(home) if !self.in_memory(NodeKey::Slot(slot)) => home,
                _ => Pointer::NULL,
            };
            self.discard(NodeKey::Slot(slot), home);
            self.map_set(slot, 0)?;
            self.known.get_mut(&ino).expect("known").orphan = true;
            return Ok(());
        }
        self.known.remove(&ino);
        self.discard_slot(slot)
    }

    /// Whether directory `ino` is `ancestor` or below it.
    fn is_within(&mut self, mut ino: u64, ancestor: u64) -> Result<bool> {
        for _ in 0..=self.slot_count {
            if ino == ancestor {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            ino = self.inode(ino)?.parent;
        }
        Err(Error::corrupt(format!("the directory parents above {ino} loop")))
    }

    pub fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.no_replace && flags.exchange {
            return Err(Error::invalid("RENAME_NOREPLACE and RENAME_EXCHANGE together"));
        }
        for checked in [name, new_name] {
            check_name(checked).map_err(|error| {
                if error.errno == errno::EEXIST {
                    Error::new(errno::EINVAL, error.message)
                } else {
                    error
                }
            })?;
        }
        self.mutate_with(0, false, |fs| {
            // The refusals first, and only reads: a rename that cannot be
            // done gets its own answer (ENOENT, EEXIST, ENOTEMPTY, ...) on a
            // full device too. Then room, whose making may clean and
            // checkpoint, which moves inodes: the names are read again
            // after it, and give the same answer.
            let (source, target, changes) = fs.rename_plan(parent, name, new_parent, new_name, flags)?;
            if !changes {
                // No name changes, but a rename that returns carries the
                // file's writes before it all the same (docs/SEMANTICS.md):
                // its unlogged writes are logged, with room for them.
                for ino in std::iter::once(source.ino).chain(target.map(|target| target.ino)) {
                    if fs.log.written.contains_key(&ino) {
                        fs.room_to_change(0)?;
                    }
                    fs.log_pending_state(ino)?;
                }
                return Ok(());
            }
            fs.reserve_space(0, 4)?;
            let (source, target, _) = fs.rename_plan(parent, name, new_parent, new_name, flags)?;
            fs.log_pending_state(source.ino)?;
            if let Some(target) = &target {
                fs.log_pending_state(target.ino)?;
            }
            if flags.exchange {
                let target = target.expect("an exchange's plan has a target");
                fs.remember_moved(&source)?;
                fs.remember_moved(&target)?;
                fs.directory_remove(parent, name)?;
                fs.directory_remove(new_parent, new_name)?;
                fs.place(new_parent, new_name, &source, parent)?;
                fs.place(parent, name, &target, new_parent)?;
                fs.touch_parents(parent, new_parent)?;
                fs.log(LogOperation::Rename {
                    parent,
                    new_parent,
                    ino: source.ino,
                    replaced: target.ino,
                    replaced_held: false,
                    no_replace: false,
                    exchange: true,
                    name: name.to_vec(),
                    new_name: new_name.to_vec(),
                });
                return Ok(());
            }
            let now = fs.now();
            fs.remember_moved(&source)?;
            if let Some(target) = &target {
                fs.remember_moved(target)?;
            }
            let replaced = target.as_ref().map_or(0, |target| target.ino);
            let replaced_held = fs.known.get(&replaced).is_some_and(|known| known.lookups > 0);
            if let Some(target) = target {
                fs.directory_remove(new_parent, new_name)?;
                if target.file_type == FileType::Directory {
                    fs.remove_directory(target.ino)?;
                    fs.change_inode(new_parent, |directory| directory.nlink = directory.nlink.saturating_sub(1))?;
                } else {
                    fs.drop_link(target.ino, now)?;
                }
            }
            fs.directory_remove(parent, name)?;
            fs.place(new_parent, new_name, &source, parent)?;
            fs.touch_parents(parent, new_parent)?;
            fs.log(LogOperation::Rename {
                parent,
                new_parent,
                ino: source.ino,
                replaced,
                replaced_held,
                no_replace: flags.no_replace,
                exchange: false,
                name: name.to_vec(),
                new_name: new_name.to_vec(),
            });
            Ok(())
        })
    }

    /// What a rename would do, found by reads alone: its source entry, the
    /// entry it replaces or exchanges with, and whether it changes any
    /// name (not a name onto itself, nor onto another name of the same
    /// file); or the error that refuses it.
    fn rename_plan(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(Entry, Option<Entry>, bool)> {
        let source = self.entry(parent, name)?;
        if self.inode(new_parent)?.file_type() != Some(FileType::Directory) {
            return Err(Error::new(errno::ENOTDIR, format!("inode {new_parent} is not a directory")));
        }
        let target = self.directory_lookup(new_parent, new_name)?;
        if source.file_type == FileType::Directory && self.is_within(new_parent, source.ino)? {
            return Err(Error::invalid("a directory cannot move below itself"));
        }
        if flags.exchange {
            let target = target
                .ok_or_else(|| Error::new(errno::ENOENT, format!("no {:?} to exchange with", name_text(new_name))))?;
            if target.file_type == FileType::Directory && self.is_within(parent, target.ino)? {
                return Err(Error::invalid("a directory cannot move below itself"));
            }
            let changes = (parent, name) != (new_parent, new_name);
            return Ok((source, Some(target), changes));
        }
        if (parent, name) == (new_parent, new_name) {
            return Ok((source, target, false));
        }
        if let Some(target) = &target {
            if flags.no_replace {
                return Err(Error::new(errno::EEXIST, format!("{:?} exists", name_text(new_name))));
            }
            if target.ino == source.ino {
                return Ok((source, Some(target.clone()), false));
            }
            match (source.file_type == FileType::Directory, target.file_type == FileType::Directory) {
                (true, false) => {
                    return Err(Error::new(errno::ENOTDIR, format!("{:?} is not a directory", name_text(new_name))))
                }
                (false, true) => {
                    return Err(Error::new(errno::EISDIR, format!("{:?} is a directory", name_text(new_name))))
                }
                (true, true) => {
                    let Node::Directory { entry_count, .. } = self.directory(target.ino)? else { unreachable!() };
                    if entry_count > 0 {
                        return Err(Error::new(errno::ENOTEMPTY, format!("{:?} is not empty", name_text(new_name))));
                    }
                }
                (false, false) => {}
            }
        }
        Ok((source, target, true))
    }

    /// Remembers a file whose entry is about to go (it is found through
    /// that entry until then).
    fn remember_moved(&mut self, entry: &Entry) -> Result<()> {
        if entry.file_type != FileType::Directory {
            self.remember_count(entry.ino, 0)?;
        }
        Ok(())
    }

    /// Enters `entry` (taken out of `from`) as `name` in `directory`, and
    /// updates what the move changes: a directory's parent and the link
    /// counts, a physically located file's parent and name hash.
    fn place(&mut self, directory: u64, name: &[u8], entry: &Entry, from: u64) -> Result<()> {
        let hash = name_hash(self.hash_seed, name);
        let mut target = entry.target;
        if entry.file_type != FileType::Directory {
            // Where the file is now, not what the entry said when read.
            self.remember_count(entry.ino, 0)?;
            target = match self.known[&entry.ino].location {
                Location::Physical { home } => Target::Physical(home),
                Location::Slot(slot) => Target::Slot(slot),
            };
        }
        let moved = Entry { hash, ino: entry.ino, target, file_type: entry.file_type, name: name.to_vec() };
        self.directory_insert(directory, moved)?;
        let now = self.now();
        if entry.file_type == FileType::Directory {
            self.change_inode(entry.ino, |inode| {
                inode.parent = directory;
                inode.ctime_ns = now;
            })?;
            if directory != from {
                self.change_inode(from, |inode| inode.nlink = inode.nlink.saturating_sub(1))?;
                self.change_inode(directory, |inode| inode.nlink += 1)?;
            }
        } else {
            let physical = matches!(self.known[&entry.ino].location, Location::Physical { .. });
            if physical {
                self.map_set((entry.ino - 1) as u32, MapEntry::locator(directory, hash))?;
            }
            self.change_inode(entry.ino, |inode| {
                if physical {
                    inode.parent = directory;
                    inode.name_hash = hash;
                }
                inode.ctime_ns = now;
            })?;
        }
        Ok(())
    }

    fn touch_parents(&mut self, parent: u64, new_parent: u64) -> Result<()> {
        let now = self.now();
        for directory in [parent, new_parent] {
            self.change_inode(directory, |inode| {
                inode.mtime_ns = now;
                inode.ctime_ns = now;
            })?;
        }
        Ok(())
    }

    pub fn read(&mut self, ino: u64, offset: u64, size: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        match inode.file_type() {
            Some(FileType::Directory) => return Err(Error::new(errno::EISDIR, format!("inode {ino} is a directory"))),
            Some(FileType::Regular) => {}
            _ => return Err(Error::invalid(format!("inode {ino} is not a regular file: use readlink for a symlink"))),
        }
        let data = self.file_read(ino, offset, size)?;
        self.drain_after_read();
        Ok(data)
    }

    /// Writes `data` at `offset`. A write clears set-user-ID (POSIX, for a
    /// caller without privilege: this call says nothing of privilege).
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_with(ino, offset, data, SetIdOnWrite::ClearSetUserId)
    }

    /// [`Fs::write`], with what becomes of the set-ID bits chosen by the
    /// caller, which knows the writer's privilege (a FUSE mount: the
    /// kernel says, with FUSE_WRITE_KILL_SUIDGID).
    pub fn write_with(&mut self, ino: u64, offset: u64, data: &[u8], set_id: SetIdOnWrite) -> Result<usize> {
        let pages = (data.len() as u64).div_ceil(self.block_bytes()) + 1;
        self.mutate_with(pages, false, |fs| {
            let inode = fs.inode(ino)?;
            match inode.file_type() {
                Some(FileType::Directory) => {
                    return Err(Error::new(errno::EISDIR, format!("inode {ino} is a directory")))
                }
                Some(FileType::Regular) => {}
                _ => return Err(Error::invalid(format!("inode {ino} is not a regular file"))),
            }
            if offset.checked_add(data.len() as u64).is_none_or(|end| end > fs.file_bytes_max()) {
                return Err(Error::new(errno::EFBIG, "a write past the largest file"));
            }
            // Room after the refusals, which a full device gives too.
            fs.room_to_change(pages)?;
            fs.file_write(ino, offset, data)?;
            fs.log_note_write(ino);
            let now = fs.now();
            fs.change_inode(ino, |inode| {
                inode.mtime_ns = now;
                inode.ctime_ns = now;
                inode.mode &= !set_id.cleared_bits(inode.mode);
            })?;
            Ok(data.len())
        })
    }

    /// Clears set-user-ID, and set-group-ID where the group may execute
    /// (Linux's rule for a change by a caller without CAP_FSETID; without
    /// group execute the bit means mandatory locking, and stays). A file
    /// with neither changes nothing and logs nothing.
    pub fn drop_set_id(&mut self, ino: u64) -> Result<Attributes> {
        let attributes = self.getattr(ino)?;
        let cleared = SetIdOnWrite::ClearBoth.cleared_bits(attributes.permissions);
        if cleared == 0 || attributes.file_type == FileType::Directory {
            return Ok(attributes);
        }
        let changes =
            SetAttributes { permissions: Some(attributes.permissions & !cleared), ..SetAttributes::default() };
        self.setattr(ino, &changes)
    }

    pub fn setattr(&mut self, ino: u64, changes: &SetAttributes) -> Result<Attributes> {
        // A size inside a block rewrites that block, zeroed past the size.
        let edge_pages = u64::from(changes.size.is_some_and(|size| size % self.block_bytes() != 0));
        self.mutate_with(edge_pages, false, |fs| {
            let inode = fs.inode(ino)?;
            // The refusals first, which a full device gives too.
            if let Some(size) = changes.size {
                match inode.file_type() {
                    Some(FileType::Directory) => {
                        return Err(Error::new(errno::EISDIR, format!("inode {ino} is a directory")))
                    }
                    Some(FileType::Regular) => fs.check_file_size(size)?,
                    _ => return Err(Error::invalid(format!("inode {ino} cannot be truncated"))),
                }
            }
            fs.room_to_change(edge_pages)?;
            // The inode and, when it moves, what points at it. A truncate
            // that shrinks gives space back, as an unlink does, and is not
            // refused for it.
            if changes.size.is_none_or(|size| size >= inode.size) {
                fs.reserve_space(0, 2)?;
            }
            if let Some(size) = changes.size {
                fs.log_pending_state(ino)?;
                fs.truncate(ino, size)?;
            }
            let now = fs.now();
            fs.change_inode(ino, |inode| {
                if let Some(permissions) = changes.permissions {
                    inode.mode = (inode.mode & !0o7777) | (permissions & 0o7777);
                }
                if let Some(uid) = changes.uid {
                    inode.uid = uid;
                }
                if let Some(gid) = changes.gid {
                    inode.gid = gid;
                }
                if let Some(atime) = changes.atime_ns {
                    inode.atime_ns = atime;
                }
                if let Some(mtime) = changes.mtime_ns {
                    inode.mtime_ns = mtime;
                } else if changes.size.is_some() {
                    inode.mtime_ns = now;
                }
                inode.ctime_ns = now;
            })?;
            fs.log(LogOperation::SetAttributes { ino, changes: *changes });
            fs.getattr(ino)
        })
    }

    /// The inode fallocate works on, and the end of its range. fallocate
    /// takes regular files; for the rest, the error Linux's `vfs_fallocate`
    /// gives (which a FUSE mount's callers get from the kernel before any
    /// request).
    fn fallocate_target(&mut self, ino: u64, offset: u64, length: u64) -> Result<(Inode, u64)> {
        let inode = self.inode(ino)?;
        match inode.file_type() {
            Some(FileType::Regular) => {}
            Some(FileType::Directory) => return Err(Error::new(errno::EISDIR, format!("inode {ino} is a directory"))),
            Some(FileType::Fifo) => return Err(Error::new(errno::ESPIPE, format!("inode {ino} is a FIFO"))),
            _ => return Err(Error::new(errno::ENODEV, format!("inode {ino} is not a regular file"))),
        }
        let end =
            offset.checked_add(length).ok_or_else(|| Error::new(errno::EFBIG, "fallocate past the largest offset"))?;
        // Whatever the mode, as vfs_fallocate: a range past the largest
        // file is EFBIG even where it would change nothing. Not in replay:
        // a record logged before this check (a punch with KEEP_SIZE past
        // the limit, which changed what lay below it) replays as it ran,
        // and one that grew the file was refused when it ran.
        if !self.log.replaying {
            self.check_file_size(end)?;
        }
        Ok((inode, end))
    }

    /// Brings block `block` of a file into the data buffer, to change part
    /// of it: read back from flash unless it is buffered already. False for
    /// a hole, which holds nothing to change.
    fn buffer_stored_block(&mut self, ino: u64, born: u64, block: u64) -> Result<bool> {
        if self.dirty_blocks.contains_key(&(ino, block)) {
            return Ok(true);
        }
        let pointer = self.block_pointer(ino, block)?;
        if pointer.is_null() {
            return Ok(false);
        }
        let data = self.read_block(ino, born, block, pointer)?;
        self.dirty_blocks.insert((ino, block), data);
        Ok(true)
    }

    /// EFBIG for a size past the largest file.
    fn check_file_size(&self, size: u64) -> Result<()> {
        if size > self.file_bytes_max() {
            return Err(Error::new(
                errno::EFBIG,
                format!("a size of {size} bytes is past the largest file ({} bytes)", self.file_bytes_max()),
            ));
        }
        Ok(())
    }

    /// Sets a regular file's size: shrinking frees what is past it (and
    /// raises its version), growing leaves a hole.
    fn truncate(&mut self, ino: u64, size: u64) -> Result<()> {
        let file_key = self.file_key(ino)?;
        let Node::File { inode, content, .. } = self.node(file_key)? else { unreachable!() };
        self.check_file_size(size)?;
        if size == inode.size {
            return Ok(());
        }
        let block_bytes = self.block_bytes();
        if let FileContent::Inline(_) = content {
            if size as usize <= inline_bytes_max(self.page_size) {
                return self.modify(file_key, |node| {
                    let Node::File { inode, content: FileContent::Inline(data), .. } = node else { unreachable!() };
                    data.resize(size as usize, 0);
                    inode.size = size;
                });
            }
            // Grows past inline: the bytes become block 0.
            self.inline_to_blocks(ino)?;
        }
        let Node::File { inode, .. } = self.node(file_key)? else { unreachable!() };
        if size < inode.size {
            // The new last block is read before anything is freed, so a
            // read that fails leaves the file as it was.
            let within = (size % block_bytes) as usize;
            let last = size / block_bytes;
            let partial = within != 0 && self.buffer_stored_block(ino, inode.born, last)?;
            self.free_blocks_from(ino, size.div_ceil(block_bytes))?;
            if size == 0 {
                self.forget_incompressible(ino)?;
            }
            if partial {
                if let Some(buffer) = self.dirty_blocks.get_mut(&(ino, last)) {
                    buffer[within..].fill(0);
                }
            }
            let version = self.take_version();
            self.modify(file_key, |node| {
                let Node::File { inode, .. } = node else { unreachable!() };
                inode.current = version;
            })?;
        }
        self.modify(file_key, |node| {
            let Node::File { inode, .. } = node else { unreachable!() };
            inode.size = size;
        })
    }

    /// Preallocation. flintfs writes out of place, so there is nothing to
    /// place ahead of time; the default mode checks the space is there and
    /// extends the size, `FALLOC_FL_KEEP_SIZE` only checks.
    /// `FALLOC_FL_PUNCH_HOLE` and `FALLOC_FL_ZERO_RANGE` zero a range
    /// (`zero_range`); the other modes (collapse, insert, unshare) give
    /// EOPNOTSUPP.
    pub fn fallocate(&mut self, ino: u64, offset: u64, length: u64, mode: u32) -> Result<()> {
        // vfs_fallocate's order: the length, then the mode.
        if length == 0 {
            return Err(Error::invalid("fallocate of zero bytes"));
        }
        if !FALLOCATE_MODES.contains(&mode) {
            return Err(Error::new(errno::EOPNOTSUPP, format!("fallocate mode {mode:#x} is not supported")));
        }
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
            return self.zero_range(ino, offset, length, mode);
        }
        self.mutate_with(0, false, |fs| {
            let (inode, end) = fs.fallocate_target(ino, offset, length)?;
            // Room after the refusals, which a full device gives too.
            fs.room_to_change(0)?;
            let block_bytes = fs.block_bytes();
            let new_blocks = end.div_ceil(block_bytes).saturating_sub(inode.size.div_ceil(block_bytes));
            fs.check_capacity(new_blocks)?;
            fs.reserve_space(new_blocks, new_blocks / fs.index_fanout() + 1)?;
            fs.log_pending_state(ino)?;
            if mode & FALLOC_FL_KEEP_SIZE == 0 && end > inode.size {
                fs.truncate(ino, end)?;
                let now = fs.now();
                fs.change_inode(ino, |inode| inode.ctime_ns = now)?;
                fs.log(LogOperation::Fallocate { ino, offset, length, mode });
            }
            Ok(())
        })
    }

    /// `FALLOC_FL_PUNCH_HOLE` and `FALLOC_FL_ZERO_RANGE`: the range reads
    /// as zeros after. Whole blocks inside it are freed (a block that
    /// reaches the end of the file counts as whole: what lies past the end
    /// reads as zeros anyway), and the bytes of the blocks at its edges are
    /// zeroed in the data buffer. flintfs writes out of place, so a zeroed
    /// range holds no space, for either mode. ZERO_RANGE without
    /// KEEP_SIZE then grows the file to cover the range.
    fn zero_range(&mut self, ino: u64, offset: u64, length: u64, mode: u32) -> Result<()> {
        self.mutate_with(0, false, |fs| {
            let (inode, end) = fs.fallocate_target(ino, offset, length)?;
            // Room after the refusals, which a full device gives too.
            fs.room_to_change(0)?;
            let grows = mode & FALLOC_FL_KEEP_SIZE == 0 && end > inode.size;
            if !grows && offset >= inode.size {
                // Nothing below the size to zero: no change, as ext4. The
                // file's unlogged writes are logged all the same, so that
                // a punch carries the writes before it wherever it falls
                // (docs/SEMANTICS.md).
                return fs.log_pending_state(ino);
            }
            let inline = fs.is_inline(ino)?;
            let plan = ZeroPlan::new(offset, end.min(inode.size), inode.size, fs.block_bytes());
            if !inline && !plan.edges.is_empty() {
                // The edge blocks come into the buffer; freeing blocks
                // takes none, so a full volume can still punch whole
                // blocks out to get space back, unless not even the
                // reserve holds the change (`room_to_change`).
                let edges = plan.edges.len() as u64;
                fs.reserve_space(edges, edges)?;
            }
            fs.log_pending_state(ino)?;
            fs.zero_bytes(ino, &plan)?;
            if grows {
                fs.truncate(ino, end)?;
            }
            fs.touch(ino)?;
            fs.log(LogOperation::Fallocate { ino, offset, length, mode });
            Ok(())
        })
    }

    /// Whether a file keeps its bytes inline in its inode.
    fn is_inline(&mut self, ino: u64) -> Result<bool> {
        let file_key = self.file_key(ino)?;
        self.with_node(file_key, |node| matches!(node, Node::File { content: FileContent::Inline(_), .. }))
    }

    /// Makes the bytes of `plan` read as zeros: whole blocks freed, the
    /// edges zeroed in the buffer. The edge blocks are read first, so a
    /// read that fails leaves the file as it was.
    fn zero_bytes(&mut self, ino: u64, plan: &ZeroPlan) -> Result<()> {
        if plan.offset >= plan.end {
            return Ok(());
        }
        let file_key = self.file_key(ino)?;
        let Node::File { inode, content, .. } = self.node(file_key)? else { unreachable!() };
        if let FileContent::Inline(_) = content {
            return self.modify(file_key, |node| {
                let Node::File { content: FileContent::Inline(data), .. } = node else { unreachable!() };
                data[plan.offset as usize..plan.end as usize].fill(0);
            });
        }
        let mut buffered = Vec::new();
        for &(block, from, to) in &plan.edges {
            // A hole already reads as zeros.
            if self.buffer_stored_block(ino, inode.born, block)? {
                buffered.push((block, from, to));
            }
        }
        self.free_blocks_in(ino, plan.first_whole, plan.end_whole)?;
        for (block, from, to) in buffered {
            if let Some(buffer) = self.dirty_blocks.get_mut(&(ino, block)) {
                buffer[from..to].fill(0);
            }
        }
        // Data that was there is gone: what is written after is a newer
        // version, as after a truncate that shrinks.
        let version = self.take_version();
        self.modify(file_key, |node| {
            let Node::File { inode, .. } = node else { unreachable!() };
            inode.current = version;
        })
    }

    /// Makes a file durable, and every operation before: its blocks and
    /// one record of the metadata log, then one flush. fdatasync does the
    /// same (the record is what says where the blocks are). fsync of the
    /// root directory is [`Fs::sync`]: a FUSE mount gets no request for
    /// sync(2) or syncfs(2), and a directory handle on the mount's root is
    /// the one every program can fsync.
    pub fn fsync(&mut self, ino: u64, _datasync: bool) -> Result<()> {
        if ino == ROOT_INO {
            return self.sync();
        }
        self.fsync_logged(ino)
    }

    /// lseek(2)'s SEEK_DATA (`data`) and SEEK_HOLE: the first offset at or
    /// after `offset` that holds data, or that is in a hole (the end of the
    /// file counts as one). ENXIO at or past the end, and for SEEK_DATA
    /// when only a hole follows. Blocks are the unit: a block the index
    /// points at, or one buffered in memory, is data.
    pub fn seek_data_or_hole(&mut self, ino: u64, offset: u64, data: bool) -> Result<u64> {
        let key = self.file_key(ino)?;
        let (size, inline) = match self.node(key)? {
            Node::File { inode, content, .. } if inode.ino == ino => {
                (inode.size, matches!(content, FileContent::Inline(_)))
            }
            Node::Directory { inode, .. } if inode.ino == ino => {
                return Err(Error::new(errno::EINVAL, format!("inode {ino} is a directory")));
            }
            _ => return Err(Error::new(errno::ENOENT, format!("inode {ino} does not exist"))),
        };
        if offset >= size {
            return Err(Error::new(errno::ENXIO, format!("offset {offset} is at or past the end ({size})")));
        }
        if inline {
            return Ok(if data { offset } else { size });
        }
        let block_bytes = self.block_bytes();
        let (from, end) = (offset / block_bytes, size.div_ceil(block_bytes));
        let at = |block: u64| offset.max(block * block_bytes).min(size);
        if data {
            let indexed = self.index_find(ino, from, end, true)?;
            let buffered = self.dirty_blocks.range((ino, from)..(ino, end)).next().map(|(&(_, block), _)| block);
            return match indexed.into_iter().chain(buffered).min() {
                Some(block) => Ok(at(block)),
                None => Err(Error::new(errno::ENXIO, format!("no data from offset {offset} to the end ({size})"))),
            };
        }
        let mut block = from;
        loop {
            match self.index_find(ino, block, end, false)? {
                None => return Ok(size),
                // A hole in the index that buffered data fills is data.
                Some(hole) if self.dirty_blocks.contains_key(&(ino, hole)) => block = hole + 1,
                Some(hole) => return Ok(at(hole)),
            }
        }
    }

    /// Makes everything durable.
    pub fn sync(&mut self) -> Result<()> {
        if self.options.read_only {
            // Nothing changed, and what recovery replayed is in the log.
            return Ok(());
        }
        self.checkpoint()
    }

    /// Entries after `cookie` (0 starts), "." and ".." first; at least
    /// `count` if there are that many.
    pub fn readdir(&mut self, ino: u64, cookie: u64, count: usize) -> Result<Vec<DirectoryEntry>> {
        let Node::Directory { inode, .. } = self.directory(ino)? else { unreachable!() };
        let mut listed = Vec::new();
        if cookie < COOKIE_DOT {
            listed.push(DirectoryEntry {
                ino,
                offset: COOKIE_DOT,
                file_type: FileType::Directory,
                name: b".".to_vec(),
            });
        }
        if cookie < COOKIE_DOT_DOT {
            listed.push(DirectoryEntry {
                ino: inode.parent,
                offset: COOKIE_DOT_DOT,
                file_type: FileType::Directory,
                name: b"..".to_vec(),
            });
        }
        let from_hash = if cookie < COOKIE_BASE { 0 } else { cookie - COOKIE_BASE + 1 };
        if from_hash >> 63 == 0 {
            for entry in self.directory_list(ino, from_hash, count.saturating_sub(listed.len()))? {
                listed.push(DirectoryEntry {
                    ino: entry.ino,
                    offset: entry.hash + COOKIE_BASE,
                    file_type: entry.file_type,
                    name: entry.name,
                });
            }
        }
        self.drain_after_read();
        Ok(listed)
    }

    /// `readdir` with each entry's attributes; holds a reference to each
    /// file listed (not to "." and ".."), as FUSE's readdirplus does.
    pub fn readdir_plus(&mut self, ino: u64, cookie: u64, count: usize) -> Result<Vec<(DirectoryEntry, Attributes)>> {
        let listed = self.readdir(ino, cookie, count)?;
        let mut out = Vec::with_capacity(listed.len());
        for entry in listed {
            let attributes = match self.getattr(entry.ino) {
                Ok(attributes) => attributes,
                // A file whose inode the flash lost is left out, as a lost
                // bucket is: the listing shows the rest (the name alone
                // answers EIO when looked up).
                Err(error) if error.is_damage() => {
                    tracing::error!(directory = ino, file = entry.ino, "an inode is unreadable: {error}");
                    continue;
                }
                Err(error) => {
                    self.forget_listed(&out);
                    return Err(error);
                }
            };
            if entry.name != b"." && entry.name != b".." {
                if let Err(error) = self.remember(entry.ino) {
                    self.forget_listed(&out);
                    return Err(error);
                }
            }
            out.push((entry, attributes));
        }
        Ok(out)
    }

    /// Gives back the references a failed readdirplus took: the kernel
    /// never saw those entries, so it will never forget them.
    fn forget_listed(&mut self, listed: &[(DirectoryEntry, Attributes)]) {
        for (entry, _) in listed.iter().filter(|(entry, _)| entry.name != b"." && entry.name != b"..") {
            let _ = self.forget(entry.ino, 1);
        }
    }

    pub fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX || name.contains(&0) {
            return Err(Error::new(errno::ERANGE, "an xattr name must be 1 to 255 bytes without NUL"));
        }
        if value.len() > xattr_bytes_max(self.page_size) {
            return Err(Error::new(errno::E2BIG, format!("an xattr value of {} bytes", value.len())));
        }
        // The system namespace is the kernel's: POSIX ACLs, which flintfs
        // does not implement. Storing them as plain bytes would let
        // `cp -a` believe it had set a mode it had not; refused, callers
        // fall back to chmod, as on ext4 mounted without ACLs.
        if name.starts_with(b"system.") {
            return Err(Error::new(errno::EOPNOTSUPP, "system xattrs (POSIX ACLs) are not supported"));
        }
        // A file's codec: refused unless it names one, so a typo does not
        // silently leave the mount's codec in force.
        if name == super::data::COMPRESSION_XATTR {
            super::data::parse_compression_xattr(value)?;
        }
        self.mutate_with(0, false, |fs| {
            let mut xattrs = fs.inode(ino)?.xattrs;
            let position = xattrs.binary_search_by(|(existing, _)| existing.as_slice().cmp(name));
            match (position, flags.create, flags.replace) {
                (Ok(_), true, _) => return Err(Error::new(errno::EEXIST, "the xattr exists")),
                (Err(_), _, true) => return Err(Error::new(errno::ENODATA, "no such xattr")),
                (Ok(at), _, _) => xattrs[at].1 = value.to_vec(),
                (Err(at), _, _) => xattrs.insert(at, (name.to_vec(), value.to_vec())),
            }
            if Inode::xattr_encoded_bytes(&xattrs) > xattr_bytes_max(fs.page_size) {
                return Err(Error::new(
                    errno::ENOSPC,
                    format!("the xattrs of an inode are bounded to {} bytes", xattr_bytes_max(fs.page_size)),
                ));
            }
            // Room after the refusals (EEXIST, ENODATA on a full device
            // too). Making it may move the inode, not change its xattrs.
            fs.reserve_space(0, 2)?;
            let now = fs.now();
            fs.change_inode(ino, |inode| {
                inode.xattrs = xattrs;
                inode.ctime_ns = now;
            })?;
            if name == super::data::COMPRESSION_XATTR {
                // A codec named again: the file's blocks are tried afresh.
                fs.forget_incompressible(ino)?;
            }
            fs.log(LogOperation::SetXattr {
                ino,
                create: flags.create,
                replace: flags.replace,
                name: name.to_vec(),
                value: value.to_vec(),
            });
            Ok(())
        })
    }

    pub fn getxattr(&mut self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        self.drain_after_read();
        inode
            .xattrs
            .into_iter()
            .find(|(existing, _)| existing == name)
            .map(|(_, value)| value)
            .ok_or_else(|| Error::new(errno::ENODATA, "no such xattr"))
    }

    pub fn listxattr(&mut self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let inode = self.inode(ino)?;
        self.drain_after_read();
        Ok(inode.xattrs.into_iter().map(|(name, _)| name).collect())
    }

    pub fn removexattr(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        self.mutate_with(0, false, |fs| {
            let mut xattrs = fs.inode(ino)?.xattrs;
            let at = xattrs
                .iter()
                .position(|(existing, _)| existing == name)
                .ok_or_else(|| Error::new(errno::ENODATA, "no such xattr"))?;
            xattrs.remove(at);
            fs.reserve_space(0, 2)?;
            let now = fs.now();
            fs.change_inode(ino, |inode| {
                inode.xattrs = xattrs;
                inode.ctime_ns = now;
            })?;
            fs.log(LogOperation::RemoveXattr { ino, name: name.to_vec() });
            Ok(())
        })
    }

    /// Space as users can have it: the dynamic zones less what the layout
    /// always keeps back (the cleaner's reserve, a partly filled zone per
    /// log head, the free zones below which operations clean first), so a
    /// device filled to what this reports still cleans and never stalls.
    pub fn statfs(&mut self) -> Result<StatFs> {
        let geometry = self.volume.device().geometry();
        let (blocks, used) = self.space_blocks();
        let free = blocks.saturating_sub(used);
        Ok(StatFs {
            block_size: self.page_size as u32,
            blocks,
            blocks_free: free,
            blocks_available: free,
            files: u64::from(crate::volume::slots_max(&geometry)),
            files_free: u64::from(crate::volume::slots_max(&geometry).saturating_sub(self.slot_count)),
            name_max: NAME_BYTES_MAX as u32,
        })
    }

    /// The file system's size in blocks, as statfs says, and the blocks in
    /// use (referenced, or buffered to be written). The size leaves out
    /// what the cleaner, the log heads and the margin for failed programs
    /// keep back, the way F2FS leaves out its overprovisioning: space the
    /// cleaner needs to work in is never promised to files.
    pub(crate) fn space_blocks(&self) -> (u64, u64) {
        let geometry = self.volume.device.geometry();
        let dynamic = self.dynamic_capacity_pages();
        let kept_back_zones = u64::from(RESERVE_ZONES + crate::volume::PROGRAM_FAILURE_MARGIN_ZONES)
            + crate::volume::LOG_HEAD_ROLES.len() as u64
            + super::CLEAN_LOW_WATER_ZONES as u64;
        let blocks = dynamic.saturating_sub(kept_back_zones * geometry.zone_pages());
        let used = self.volume.valid_bytes_total().div_ceil(self.block_bytes()) + self.dirty_blocks.len() as u64;
        (blocks, used)
    }

    /// The pages of every dynamic zone, summed, each at
    /// what it holds after its next reset: a block retired by a failed
    /// program is gone from then on. That changes only when a zone is
    /// reset, a program fails or a block is retired, so the sum is kept
    /// until one of those happens, instead of reading every zone's report
    /// before each write.
    fn dynamic_capacity_pages(&self) -> u64 {
        // Counts this layer keeps and never resets (the device's own
        // counters restart with a benchmark's phase, and a disk has none).
        let key = (
            self.volume.device.resets_issued(),
            self.volume.device.programs_failed() + self.volume.device.protection_counters().blocks_retired,
        );
        if let Some((cached_key, pages)) = self.capacity_hint.get() {
            if cached_key == key {
                return pages;
            }
        }
        let pages = self
            .volume
            .device
            .report_zones()
            .iter()
            .filter(|report| report.zone >= FIRST_DYNAMIC_ZONE)
            .map(|report| u64::from(self.volume.device.capacity_after_reset(report)))
            .sum();
        self.capacity_hint.set(Some((key, pages)));
        pages
    }

    /// ENOSPC when `new_blocks` more blocks of file data would pass the
    /// size statfs reports. Only growth counts: an overwrite replaces
    /// blocks already counted, and the physical check
    /// ([`Fs::reserve_space`]) bounds it.
    pub(crate) fn check_capacity(&self, new_blocks: u64) -> Result<()> {
        if self.log.replaying || self.space_reserved {
            // The operation passed it when it first ran; the space count
            // differs during recovery (what was not logged is not there).
            return Ok(());
        }
        let (blocks, used) = self.space_blocks();
        if new_blocks > 0 && used.saturating_add(new_blocks) > blocks {
            return Err(Error::new(
                errno::ENOSPC,
                format!("the file system is full: {used} of {blocks} blocks used, {new_blocks} more wanted"),
            ));
        }
        Ok(())
    }
}
