//! Node pages: the namespace and the file indexes (page kind 6). Every node
//! page starts with a node header that is the node's inverted index (which
//! inode it belongs to, where in that inode's structure, and the inode's
//! `born` version), so a node page can be told apart and reconnected
//! without any pointer to it. The page header's CRC covers the whole page.
//!
//! The structures follow DFFS: a directory's inode and its hashed entries
//! share one page; a big directory keeps its entries in bucket pages found
//! through an extendible hash table; directories, buckets, table pages and
//! files with more than one link are located through the paged map, and
//! files with one link are located physically from their entry.

use crate::codec::{Reader, Writer};
use crate::DecodeError;

/// Smallest page a node is decoded from (the device's smallest page).
pub const NODE_PAGE_BYTES_MIN: usize = 512;
/// Bytes of the node header at the start of a node page's data.
pub const NODE_HEADER_BYTES: usize = 32;
/// Bytes of the fixed part of an inode.
pub const INODE_FIXED_BYTES: usize = 104;
/// Longest name in a directory.
pub const NAME_BYTES_MAX: usize = 255;
/// Bytes of a directory entry before its name.
pub const ENTRY_FIXED_BYTES: usize = 26;
/// Root pointers of a file index held in the file inode.
pub const INDEX_ROOTS: usize = 16;
/// Bytes of a file's index in its inode: height, flags, padding, the count
/// of blocks stored, the 16-byte units they take on flash, the roots.
pub const INDEX_IN_INODE_BYTES: usize = 16 + 8 * INDEX_ROOTS;
/// The index's flag for a file whose blocks did not compress: writes stop
/// trying until the file is cut to nothing or its codec is set again.
const INDEX_FLAG_INCOMPRESSIBLE: u8 = 1;
/// Most blocks a file may hold or address: its count of stored blocks is a
/// u32, and its size is at most this many blocks (16 TiB of 4 KiB pages,
/// as ext4's limit with 4 KiB blocks).
pub const FILE_BLOCKS_MAX: u64 = u32::MAX as u64;
/// Bytes of the directory part's header in a directory page.
pub const DIRECTORY_HEADER_BYTES: usize = 16;
/// Bytes of a bucket's header.
pub const BUCKET_HEADER_BYTES: usize = 16;
/// Bytes of the count header of table, map and index pages.
pub const ARRAY_HEADER_BYTES: usize = 8;
/// "No slot": the end of an overflow chain or of the free-slot list.
pub const SLOT_NONE: u32 = u32::MAX;
/// Deepest an extendible hash table goes (a bound on its size).
pub const GLOBAL_DEPTH_MAX: u8 = 24;
/// Tallest a file index grows.
pub const INDEX_HEIGHT_MAX: u8 = 8;
/// Longest xattr name.
pub const XATTR_NAME_BYTES_MAX: usize = 255;

const INODE_FLAG_INLINE: u32 = 1;

const _: () = assert!(ENTRY_FIXED_BYTES + NAME_BYTES_MAX < 512 - NODE_HEADER_BYTES - BUCKET_HEADER_BYTES);
const _: () = assert!(NODE_HEADER_BYTES + INODE_FIXED_BYTES + INDEX_IN_INODE_BYTES < 512);

/// Bytes a page of `page_size_bytes` gives the xattrs of one inode: a
/// quarter of the page, so an inode always keeps room for its other parts.
pub const fn xattr_bytes_max(page_size_bytes: usize) -> usize {
    let quarter = page_size_bytes / 4;
    if quarter < XATTR_BYTES_CAP {
        quarter
    } else {
        XATTR_BYTES_CAP
    }
}

/// Most xattr bytes of one inode, whatever the page size.
pub const XATTR_BYTES_CAP: usize = 4096;
/// Most inline bytes of one file, whatever the page size: an inode record
/// stays below 32 KiB, which keeps a record pointer's top bit clear.
pub const INLINE_BYTES_CAP: usize = 8192;
const _: () =
    assert!(INODE_RECORD_HEADER_BYTES + INODE_FIXED_BYTES + XATTR_BYTES_CAP + INLINE_BYTES_CAP < (1 << 11) * 16);

/// Bytes of inline file data an inode holds in a page of this size.
pub const fn inline_bytes_max(page_size_bytes: usize) -> usize {
    let room = page_size_bytes
        - NODE_HEADER_BYTES
        - INODE_RECORD_HEADER_BYTES
        - INODE_FIXED_BYTES
        - xattr_bytes_max(page_size_bytes);
    if room < INLINE_BYTES_CAP {
        room
    } else {
        INLINE_BYTES_CAP
    }
}

/// Bytes of entries or table slots a directory page holds inline.
pub const fn directory_area_bytes(page_size_bytes: usize) -> usize {
    page_size_bytes - NODE_HEADER_BYTES - INODE_FIXED_BYTES - xattr_bytes_max(page_size_bytes) - DIRECTORY_HEADER_BYTES
}

/// Bytes of entries a bucket page holds.
pub const fn bucket_area_bytes(page_size_bytes: usize) -> usize {
    page_size_bytes - NODE_HEADER_BYTES - BUCKET_HEADER_BYTES
}

/// Elements (u32 slots, or u64 pointers) an array page holds.
pub const fn array_capacity(page_size_bytes: usize, element_bytes: usize) -> usize {
    (page_size_bytes - NODE_HEADER_BYTES - ARRAY_HEADER_BYTES) / element_bytes
}

/// Blocks a file index of the greatest height covers on the smallest page.
const fn index_blocks_at_height_max() -> u128 {
    let fanout = array_capacity(NODE_PAGE_BYTES_MIN, 8) as u128;
    let mut blocks = INDEX_ROOTS as u128;
    let mut level = 0;
    while level < INDEX_HEIGHT_MAX {
        blocks *= fanout;
        level += 1;
    }
    blocks
}
// Every block of the largest file has a place in the index, on any page size.
const _: () = assert!(index_blocks_at_height_max() > FILE_BLOCKS_MAX as u128);

/// A directory name's hash: 63 bits of FNV-1a over the name, keyed with the
/// file system's seed and finished with the SplitMix64 mixer. Part of the
/// format: buckets and readdir order depend on it.
pub fn name_hash(seed: u64, name: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &byte in name {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (hash ^ (hash >> 31)) >> 1
}

/// Where a page or a chunk is: zone, page in the zone, and for a chunk of a
/// packed page its index (from 1) and its size in 16-byte units (header and
/// payload, rounded up), so freeing it needs no read. Zero is "nowhere" (a
/// hole): zone 0, page 0 is a superblock, never a data or node page.
///
/// Bits 0..24 page, 24..44 zone, 44..52 chunk index, 52..64 chunk units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pointer(pub u64);

/// The granule of a chunk's size in a pointer.
pub const CHUNK_UNIT_BYTES: u32 = 16;

impl Pointer {
    pub const NULL: Pointer = Pointer(0);
    /// Most zones a pointer can name.
    pub const ZONES_MAX: u32 = 1 << 20;
    /// Most pages per zone a pointer can name.
    pub const ZONE_PAGES_MAX: u32 = 1 << 24;
    /// Most chunks a packed page can hold and a pointer can name.
    pub const CHUNKS_MAX: u32 = 255;
    /// Largest chunk size, in units, a pointer can hold.
    pub const CHUNK_UNITS_MAX: u32 = (1 << 12) - 1;

    /// A whole page.
    pub fn page_at(zone: u32, page: u32) -> Pointer {
        Pointer::new(zone, page, 0, 0)
    }

    pub fn new(zone: u32, page: u32, chunk: u32, units: u32) -> Pointer {
        assert!(
            zone < Pointer::ZONES_MAX
                && page < Pointer::ZONE_PAGES_MAX
                && chunk <= Pointer::CHUNKS_MAX
                && units <= Pointer::CHUNK_UNITS_MAX
                && (chunk == 0) == (units == 0),
            "pointer fields out of range: zone {zone} page {page} chunk {chunk} units {units}"
        );
        let pointer =
            Pointer(u64::from(units) << 52 | u64::from(chunk) << 44 | u64::from(zone) << 24 | u64::from(page));
        assert!(!pointer.is_null(), "zone 0 page 0 is never pointed at");
        pointer
    }

    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    pub fn zone(self) -> u32 {
        ((self.0 >> 24) & 0xf_ffff) as u32
    }

    pub fn page(self) -> u32 {
        (self.0 & 0xff_ffff) as u32
    }

    /// 0 for a whole page; n for the n-th chunk (from 1) of a packed page.
    pub fn chunk(self) -> u32 {
        ((self.0 >> 44) & 0xff) as u32
    }

    /// A chunk's size in [`CHUNK_UNIT_BYTES`] units; 0 for a whole page.
    pub fn chunk_units(self) -> u32 {
        (self.0 >> 52) as u32
    }

    /// The same page, without the chunk.
    pub fn whole_page(self) -> Pointer {
        Pointer(self.0 & ((1 << 44) - 1))
    }

    /// Checks a decoded pointer: its chunk fields agree, and its zone is
    /// below `zone_count`.
    pub fn validate(self, zone_count: u32) -> Result<(), String> {
        if self.is_null() {
            return Ok(());
        }
        if (self.chunk() == 0) != (self.chunk_units() == 0) || self.zone() >= zone_count {
            return Err(format!("pointer {:#x} is malformed or past the {zone_count} zones", self.0));
        }
        Ok(())
    }
}

impl std::fmt::Display for Pointer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_null() {
            return write!(formatter, "null");
        }
        write!(formatter, "zone {} page {}", self.zone(), self.page())?;
        if self.chunk() > 0 {
            write!(formatter, " chunk {}", self.chunk())?;
        }
        Ok(())
    }
}

/// Where an entry's inode lives: physically (a file with one link) or
/// through the map (a directory, or a file with more than one link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Physical(Pointer),
    Slot(u32),
}

/// Tags a slot target. A physical target is a record pointer whose chunk
/// units stay below 2^11 (an inode record is smaller than 32 KiB), so its
/// top bit is clear.
const TARGET_SLOT_TAG: u64 = 1 << 63;

impl Target {
    fn encode(self) -> u64 {
        match self {
            Target::Physical(pointer) => {
                assert_eq!(pointer.0 & TARGET_SLOT_TAG, 0, "an inode record pointer never sets the top bit");
                pointer.0
            }
            Target::Slot(slot) => TARGET_SLOT_TAG | u64::from(slot),
        }
    }

    fn decode(value: u64, in_memory: bool) -> Result<Target, String> {
        if in_memory && value == 0 {
            // An entry of a file not yet written, in a node parked in NVM.
            return Ok(Target::Physical(Pointer::NULL));
        }
        if value & TARGET_SLOT_TAG != 0 {
            let slot = value & !TARGET_SLOT_TAG;
            if slot >= u64::from(SLOT_NONE) {
                return Err(format!("slot {slot} out of range"));
            }
            Ok(Target::Slot(slot as u32))
        } else {
            // A file not yet written has no home: it is found by its entry
            // only once it is, so a null target is damage. An inode is a
            // record of an inode pack: a chunk pointer.
            if value == 0 || Pointer(value).chunk() == 0 {
                return Err("an entry points nowhere, or at a whole page".into());
            }
            Ok(Target::Physical(Pointer(value)))
        }
    }
}

/// The type of a file, as a directory entry and the mode record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl FileType {
    pub fn to_byte(self) -> u8 {
        match self {
            FileType::Regular => 1,
            FileType::Directory => 2,
            FileType::Symlink => 3,
            FileType::Fifo => 4,
            FileType::CharDevice => 5,
            FileType::BlockDevice => 6,
            FileType::Socket => 7,
        }
    }

    pub fn from_byte(byte: u8) -> Option<FileType> {
        Some(match byte {
            1 => FileType::Regular,
            2 => FileType::Directory,
            3 => FileType::Symlink,
            4 => FileType::Fifo,
            5 => FileType::CharDevice,
            6 => FileType::BlockDevice,
            7 => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of `st_mode`.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => 0o100000,
            FileType::Directory => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::Fifo => 0o010000,
            FileType::CharDevice => 0o020000,
            FileType::BlockDevice => 0o060000,
            FileType::Socket => 0o140000,
        }
    }

    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & 0o170000 {
            0o100000 => FileType::Regular,
            0o040000 => FileType::Directory,
            0o120000 => FileType::Symlink,
            0o010000 => FileType::Fifo,
            0o020000 => FileType::CharDevice,
            0o060000 => FileType::BlockDevice,
            0o140000 => FileType::Socket,
            _ => return None,
        })
    }
}

/// Checks a name for a directory entry.
pub fn validate_name(name: &[u8]) -> Result<(), String> {
    if name.is_empty() {
        return Err("an empty name".into());
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(format!("a name of {} bytes, at most {NAME_BYTES_MAX}", name.len()));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err("a name with '/' or NUL".into());
    }
    if name == b"." || name == b".." {
        return Err("'.' and '..' are not stored".into());
    }
    Ok(())
}

/// A directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// [`name_hash`] of the name.
    pub hash: u64,
    pub ino: u64,
    pub target: Target,
    pub file_type: FileType,
    pub name: Vec<u8>,
}

impl Entry {
    pub fn encoded_bytes(&self) -> usize {
        ENTRY_FIXED_BYTES + self.name.len()
    }

    fn encode(&self, writer: &mut Writer) {
        writer
            .u64(self.hash)
            .u64(self.ino)
            .u64(self.target.encode())
            .u8(self.file_type.to_byte())
            .u8(self.name.len() as u8)
            .bytes(&self.name);
    }

    fn decode(reader: &mut Reader, in_memory: bool) -> Result<Entry, DecodeError> {
        let hash = reader.u64()?;
        let ino = reader.u64()?;
        let target =
            Target::decode(reader.u64()?, in_memory).map_err(|reason| reader.error(format!("entry: {reason}")))?;
        let type_byte = reader.u8()?;
        let file_type =
            FileType::from_byte(type_byte).ok_or_else(|| reader.error(format!("entry of unknown type {type_byte}")))?;
        let length = reader.u8()? as usize;
        let name = reader.take(length)?.to_vec();
        validate_name(&name).map_err(|reason| reader.error(format!("entry: {reason}")))?;
        if hash >> 63 != 0 {
            return Err(reader.error("an entry hash with the top bit set"));
        }
        if ino == 0 {
            return Err(reader.error("an entry for inode 0"));
        }
        Ok(Entry { hash, ino, target, file_type, name })
    }
}

/// The attributes every inode has, and its xattrs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Inode {
    pub ino: u64,
    /// The version the inode was created with: chunks and nodes of an
    /// older version belong to an earlier life of the number.
    pub born: u64,
    /// Raised when data is cut off (truncate) or the inode is deleted.
    pub current: u64,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub rdev: u32,
    /// A directory's parent; for a file with one link, the directory of
    /// that link; 0 for a file located through the map.
    pub parent: u64,
    /// For a file with one link, the hash of its name in `parent`, so the
    /// entry can be found when the inode moves.
    pub name_hash: u64,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Inode {
    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }

    pub fn xattr_encoded_bytes(xattrs: &[(Vec<u8>, Vec<u8>)]) -> usize {
        xattrs.iter().map(|(name, value)| 3 + name.len() + value.len()).sum()
    }

    fn encode(&self, writer: &mut Writer, inline: bool) {
        writer
            .u64(self.ino)
            .u64(self.born)
            .u64(self.current)
            .u32(self.mode)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.nlink)
            .u64(self.size)
            .u64(self.atime_ns as u64)
            .u64(self.mtime_ns as u64)
            .u64(self.ctime_ns as u64)
            .u32(self.rdev)
            .u32(if inline { INODE_FLAG_INLINE } else { 0 })
            .u64(self.parent)
            .u64(self.name_hash)
            .u32(Inode::xattr_encoded_bytes(&self.xattrs) as u32)
            .zeros(4);
        for (name, value) in &self.xattrs {
            writer.u8(name.len() as u8).u16(value.len() as u16).bytes(name).bytes(value);
        }
    }

    /// Decodes an inode; returns it with its inline flag.
    fn decode(reader: &mut Reader, page_size_bytes: usize) -> Result<(Inode, bool), DecodeError> {
        let ino = reader.u64()?;
        let born = reader.u64()?;
        let current = reader.u64()?;
        let mode = reader.u32()?;
        let uid = reader.u32()?;
        let gid = reader.u32()?;
        let nlink = reader.u32()?;
        let size = reader.u64()?;
        let atime_ns = reader.u64()? as i64;
        let mtime_ns = reader.u64()? as i64;
        let ctime_ns = reader.u64()? as i64;
        let rdev = reader.u32()?;
        let flags = reader.u32()?;
        let parent = reader.u64()?;
        let name_hash = reader.u64()?;
        let xattr_bytes = reader.u32()? as usize;
        reader.zeros(4)?;
        if flags & !INODE_FLAG_INLINE != 0 {
            return Err(reader.error(format!("unknown inode flags {flags:#x}")));
        }
        if ino == 0 {
            return Err(reader.error("inode number 0"));
        }
        if FileType::from_mode(mode).is_none() {
            return Err(reader.error(format!("mode {mode:#o} has no file type")));
        }
        if current < born {
            return Err(reader.error(format!("current version {current} is older than born {born}")));
        }
        if xattr_bytes > xattr_bytes_max(page_size_bytes) {
            return Err(
                reader.error(format!("{xattr_bytes} bytes of xattrs, at most {}", xattr_bytes_max(page_size_bytes)))
            );
        }
        let area = reader.take(xattr_bytes)?;
        let mut xattr_reader = Reader::new("xattrs", area);
        let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        while xattr_reader.position() < area.len() {
            let name_length = xattr_reader.u8()? as usize;
            let value_length = xattr_reader.u16()? as usize;
            let name = xattr_reader.take(name_length)?.to_vec();
            let value = xattr_reader.take(value_length)?.to_vec();
            if name.is_empty() || name.contains(&0) {
                return Err(xattr_reader.error("an xattr name that is empty or holds NUL"));
            }
            if xattrs.last().is_some_and(|(last, _)| *last >= name) {
                return Err(xattr_reader.error("xattrs out of order or repeated"));
            }
            xattrs.push((name, value));
        }
        let inode = Inode {
            ino,
            born,
            current,
            mode,
            uid,
            gid,
            nlink,
            size,
            atime_ns,
            mtime_ns,
            ctime_ns,
            rdev,
            parent,
            name_hash,
            xattrs,
        };
        Ok((inode, flags & INODE_FLAG_INLINE != 0))
    }
}

/// What a file's data is held in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileContent {
    /// The whole file, in the inode (small files and symlinks).
    Inline(Vec<u8>),
    /// A radix tree of block pointers: with height 0 the roots point at
    /// blocks; with height h they point at index pages of level h - 1.
    /// `blocks_stored` counts the non-null block pointers, and
    /// `units_stored` the 16-byte units of flash they name (a whole page,
    /// or a chunk's size: what `st_blocks` reports), both kept as pointers
    /// are set and cleared. `incompressible`: the file's blocks stopped
    /// compressing, so writes no longer try.
    Index { height: u8, incompressible: bool, blocks_stored: u32, units_stored: u64, roots: [Pointer; INDEX_ROOTS] },
}

/// How a directory holds its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectoryContent {
    /// All entries in the directory page, sorted by hash.
    Inline(Vec<Entry>),
    /// An extendible hash table of `2^global_depth` bucket slots, indexed by
    /// the top bits of the hash. `direct` holds them when they fit in the
    /// page; otherwise `direct` holds the slots of table pages, each of
    /// which holds a run of bucket slots.
    Hashed { global_depth: u8, slots: Vec<u32> },
}

/// A node page's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Directory {
        slot: u32,
        inode: Inode,
        entry_count: u64,
        content: DirectoryContent,
    },
    Bucket {
        directory: u64,
        slot: u32,
        local_depth: u8,
        next: u32,
        entries: Vec<Entry>,
    },
    Table {
        directory: u64,
        slot: u32,
        slots: Vec<u32>,
    },
    Map {
        number: u64,
        entries: Vec<u64>,
    },
    /// The map's second level: where map pages `number × E` to
    /// `(number + 1) × E − 1` are (E pointers a page).
    MapDirectory {
        number: u64,
        pointers: Vec<Pointer>,
    },
    File {
        slot: u32,
        inode: Inode,
        content: FileContent,
    },
    Index {
        ino: u64,
        version: u64,
        level: u8,
        number: u64,
        pointers: Vec<Pointer>,
    },
}

/// Node kinds, as the node header records them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Directory = 1,
    Bucket = 2,
    Table = 3,
    Map = 4,
    File = 5,
    Index = 6,
    MapDirectory = 8,
}

impl Node {
    pub fn kind(&self) -> NodeKind {
        match self {
            Node::Directory { .. } => NodeKind::Directory,
            Node::Bucket { .. } => NodeKind::Bucket,
            Node::Table { .. } => NodeKind::Table,
            Node::Map { .. } => NodeKind::Map,
            Node::MapDirectory { .. } => NodeKind::MapDirectory,
            Node::File { .. } => NodeKind::File,
            Node::Index { .. } => NodeKind::Index,
        }
    }

    /// The node header's owner, position and version: its inverted index.
    fn identity(&self) -> (u64, u64, u64) {
        match self {
            Node::Directory { slot, inode, .. } => (inode.ino, u64::from(*slot), inode.born),
            Node::Bucket { directory, slot, .. } | Node::Table { directory, slot, .. } => {
                (*directory, u64::from(*slot), 0)
            }
            Node::Map { number, .. } | Node::MapDirectory { number, .. } => (0, *number, 0),
            Node::File { slot, inode, .. } => (inode.ino, u64::from(*slot), inode.born),
            Node::Index { ino, version, level, number, .. } => (*ino, u64::from(*level) << 56 | number, *version),
        }
    }

    /// Bytes the node's body takes when encoded.
    pub fn body_bytes(&self) -> usize {
        match self {
            Node::Directory { inode, content, .. } => {
                INODE_FIXED_BYTES
                    + Inode::xattr_encoded_bytes(&inode.xattrs)
                    + DIRECTORY_HEADER_BYTES
                    + match content {
                        DirectoryContent::Inline(entries) => entries.iter().map(Entry::encoded_bytes).sum(),
                        DirectoryContent::Hashed { slots, .. } => 4 * slots.len(),
                    }
            }
            Node::Bucket { entries, .. } => {
                BUCKET_HEADER_BYTES + entries.iter().map(Entry::encoded_bytes).sum::<usize>()
            }
            Node::Table { slots, .. } => ARRAY_HEADER_BYTES + 4 * slots.len(),
            Node::Map { entries, .. } => ARRAY_HEADER_BYTES + 8 * entries.len(),
            Node::Index { pointers, .. } | Node::MapDirectory { pointers, .. } => {
                ARRAY_HEADER_BYTES + 8 * pointers.len()
            }
            Node::File { inode, content, .. } => {
                INODE_FIXED_BYTES
                    + Inode::xattr_encoded_bytes(&inode.xattrs)
                    + match content {
                        FileContent::Inline(data) => data.len(),
                        FileContent::Index { .. } => INDEX_IN_INODE_BYTES,
                    }
            }
        }
    }

    /// Checks what the encoding relies on, for a page of `page_size_bytes`.
    pub fn validate(&self, page_size_bytes: usize) -> Result<(), String> {
        self.validate_with(page_size_bytes, false)
    }

    /// [`Node::validate`], with `in_memory` allowing the one thing a node
    /// in memory (or in NVM) may hold and flash may not: an entry of a file
    /// never written, whose target is null.
    pub fn validate_with(&self, page_size_bytes: usize, in_memory: bool) -> Result<(), String> {
        let body = self.body_bytes();
        if NODE_HEADER_BYTES + body > page_size_bytes {
            return Err(format!("{:?} node of {body} bytes does not fit a {page_size_bytes}-byte page", self.kind()));
        }
        let check_entries = |entries: &[Entry]| -> Result<(), String> {
            for entry in entries {
                validate_name(&entry.name)?;
                if entry.hash >> 63 != 0 || entry.ino == 0 {
                    return Err("an entry with a bad hash or inode 0".into());
                }
                match entry.target {
                    Target::Physical(pointer) if in_memory && pointer.is_null() => {}
                    Target::Physical(pointer) if pointer.chunk() == 0 => {
                        return Err("an entry points nowhere, or at a whole page".into());
                    }
                    Target::Slot(SLOT_NONE) => return Err("an entry names the no-slot value".into()),
                    _ => {}
                }
            }
            if entries.windows(2).any(|pair| pair[0].hash > pair[1].hash) {
                return Err("entries out of hash order".into());
            }
            Ok(())
        };
        let check_inode = |inode: &Inode| -> Result<(), String> {
            if inode.ino == 0 || inode.file_type().is_none() || inode.current < inode.born {
                return Err(format!("inode {} is malformed", inode.ino));
            }
            if Inode::xattr_encoded_bytes(&inode.xattrs) > xattr_bytes_max(page_size_bytes) {
                return Err("xattrs over their bound".into());
            }
            if inode.xattrs.iter().any(|(name, value)| {
                name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX || name.contains(&0) || value.len() > 0xffff
            }) {
                return Err("a malformed xattr".into());
            }
            if inode.xattrs.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
                return Err("xattrs out of order".into());
            }
            Ok(())
        };
        match self {
            Node::Directory { inode, content, entry_count, .. } => {
                check_inode(inode)?;
                if inode.file_type() != Some(FileType::Directory) {
                    return Err("a directory page whose inode is not a directory".into());
                }
                match content {
                    DirectoryContent::Inline(entries) => {
                        check_entries(entries)?;
                        if *entry_count != entries.len() as u64 {
                            return Err("an inline directory's count disagrees with its entries".into());
                        }
                    }
                    DirectoryContent::Hashed { global_depth, slots } => {
                        if *global_depth > GLOBAL_DEPTH_MAX || slots.is_empty() {
                            return Err(format!("hash table of depth {global_depth} with {} slots", slots.len()));
                        }
                        let direct = directory_area_bytes(page_size_bytes) / 4;
                        let table_slots = 1usize << global_depth;
                        let expected = if table_slots <= direct {
                            table_slots
                        } else {
                            table_slots.div_ceil(array_capacity(page_size_bytes, 4))
                        };
                        if slots.len() != expected {
                            return Err(format!("depth {global_depth} needs {expected} slots, not {}", slots.len()));
                        }
                    }
                }
            }
            Node::Bucket { entries, local_depth, .. } => {
                check_entries(entries)?;
                if *local_depth > GLOBAL_DEPTH_MAX {
                    return Err(format!("bucket of depth {local_depth}"));
                }
            }
            Node::Table { slots, .. } => {
                if slots.len() > array_capacity(page_size_bytes, 4) {
                    return Err("table page over capacity".into());
                }
            }
            Node::Map { entries, .. } => {
                if entries.len() != array_capacity(page_size_bytes, 8) {
                    return Err("map page of the wrong size".into());
                }
            }
            Node::MapDirectory { pointers, .. } => {
                if pointers.len() != array_capacity(page_size_bytes, 8) {
                    return Err("map directory page of the wrong size".into());
                }
                if pointers.iter().any(|pointer| !pointer.is_null() && pointer.chunk() != 0) {
                    return Err("a map directory pointer that is not a whole page".into());
                }
            }
            Node::Index { pointers, level, number, .. } => {
                if pointers.len() != array_capacity(page_size_bytes, 8)
                    || *level >= INDEX_HEIGHT_MAX
                    || *number >> 56 != 0
                {
                    return Err("index page of the wrong size or level".into());
                }
            }
            Node::File { inode, content, .. } => {
                check_inode(inode)?;
                if inode.file_type() == Some(FileType::Directory) {
                    return Err("a file page for a directory".into());
                }
                match content {
                    FileContent::Inline(data) => {
                        if data.len() as u64 != inode.size || data.len() > inline_bytes_max(page_size_bytes) {
                            return Err("inline data disagrees with the size or is over its bound".into());
                        }
                    }
                    FileContent::Index { height, .. } => {
                        if *height > INDEX_HEIGHT_MAX {
                            return Err(format!("index of height {height}"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The page data for this node, padded to `page_size_bytes`; returns it
    /// with the bytes in use.
    pub fn encode(&self, page_size_bytes: usize) -> (Vec<u8>, u32) {
        if let Err(reason) = self.validate(page_size_bytes) {
            panic!("refusing to encode an invalid node: {reason}");
        }
        let encoded = self.encode_unchecked(page_size_bytes).expect("a valid node fits its page");
        debug_assert_eq!(Node::decode(&encoded.0).as_ref(), Ok(self));
        encoded
    }

    /// As [`Node::encode`], for a node in memory that may not be whole
    /// yet (an entry of a file never written points nowhere): what the NVM
    /// park holds, never what flash does. `None` if it does not fit.
    pub fn encode_unchecked(&self, page_size_bytes: usize) -> Option<(Vec<u8>, u32)> {
        let body = self.body_bytes();
        if NODE_HEADER_BYTES + body > page_size_bytes {
            return None;
        }
        let (owner, position, version) = self.identity();
        let mut writer = Writer::with_capacity(page_size_bytes);
        writer.u8(self.kind() as u8).zeros(3).u32(body as u32).u64(owner).u64(position).u64(version);
        match self {
            Node::Directory { inode, entry_count, content, .. } => {
                inode.encode(&mut writer, false);
                let (mode, depth, count) = match content {
                    DirectoryContent::Inline(entries) => (0u8, 0u8, entries.len()),
                    DirectoryContent::Hashed { global_depth, slots } => (1, *global_depth, slots.len()),
                };
                writer.u8(mode).u8(depth).zeros(2).u32(count as u32).u64(*entry_count);
                match content {
                    DirectoryContent::Inline(entries) => entries.iter().for_each(|entry| entry.encode(&mut writer)),
                    DirectoryContent::Hashed { slots, .. } => slots.iter().for_each(|slot| {
                        writer.u32(*slot);
                    }),
                }
            }
            Node::Bucket { local_depth, next, entries, .. } => {
                writer.u8(*local_depth).zeros(3).u32(entries.len() as u32).u32(*next).zeros(4);
                entries.iter().for_each(|entry| entry.encode(&mut writer));
            }
            Node::Table { slots, .. } => {
                writer.u32(slots.len() as u32).zeros(4);
                slots.iter().for_each(|slot| {
                    writer.u32(*slot);
                });
            }
            Node::Map { entries, .. } => {
                writer.u32(entries.len() as u32).zeros(4);
                entries.iter().for_each(|entry| {
                    writer.u64(*entry);
                });
            }
            Node::Index { pointers, .. } | Node::MapDirectory { pointers, .. } => {
                writer.u32(pointers.len() as u32).zeros(4);
                pointers.iter().for_each(|pointer| {
                    writer.u64(pointer.0);
                });
            }
            Node::File { inode, content, .. } => encode_file_body(inode, content, &mut writer),
        }
        assert_eq!(writer.len(), NODE_HEADER_BYTES + body, "a node's size is what body_bytes says");
        let used = writer.len() as u32;
        let mut bytes = writer.finish();
        bytes.resize(page_size_bytes, 0);
        Some((bytes, used))
    }

    /// Decodes a node page's data (the whole page).
    pub fn decode(page: &[u8]) -> Result<Node, DecodeError> {
        let node = Node::decode_with(page, false)?;
        node.validate(page.len()).map_err(|reason| DecodeError { structure: "node", reason })?;
        Ok(node)
    }

    /// As [`Node::decode`], without the rule a node in memory may break
    /// for a while (see [`Node::encode_unchecked`]): every other rule is
    /// checked. Total all the same.
    pub fn decode_unchecked(page: &[u8]) -> Result<Node, DecodeError> {
        let node = Node::decode_with(page, true)?;
        node.validate_with(page.len(), true).map_err(|reason| DecodeError { structure: "node", reason })?;
        Ok(node)
    }

    fn decode_with(page: &[u8], in_memory: bool) -> Result<Node, DecodeError> {
        let page_size_bytes = page.len();
        let RawNodeHeader { kind, owner, position, version, body } = RawNodeHeader::decode("node", page)?;
        let mut reader = Reader::new("node", body);
        let body = body.len();
        let slot_of = |reader: &Reader, position: u64| {
            u32::try_from(position)
                .ok()
                .filter(|&slot| slot != SLOT_NONE)
                .ok_or_else(|| reader.error(format!("slot {position} out of range")))
        };
        let node = match kind {
            1 => {
                let slot = slot_of(&reader, position)?;
                let (inode, inline) = Inode::decode(&mut reader, page_size_bytes)?;
                if inline {
                    return Err(reader.error("a directory's inode flagged inline"));
                }
                let mode = reader.u8()?;
                let global_depth = reader.u8()?;
                reader.zeros(2)?;
                let count = reader.u32()? as usize;
                let entry_count = reader.u64()?;
                let content = match mode {
                    0 => {
                        if global_depth != 0 {
                            return Err(reader.error("an inline directory with a table depth"));
                        }
                        let mut entries = Vec::new();
                        for _ in 0..count {
                            entries.push(Entry::decode(&mut reader, in_memory)?);
                        }
                        DirectoryContent::Inline(entries)
                    }
                    1 => {
                        if count > body / 4 {
                            return Err(reader.error(format!("{count} table slots cannot fit")));
                        }
                        let mut slots = Vec::with_capacity(count);
                        for _ in 0..count {
                            slots.push(reader.u32()?);
                        }
                        DirectoryContent::Hashed { global_depth, slots }
                    }
                    _ => return Err(reader.error(format!("unknown directory mode {mode}"))),
                };
                if (owner, version) != (inode.ino, inode.born) {
                    return Err(reader.error("the node header disagrees with the directory's inode"));
                }
                Node::Directory { slot, inode, entry_count, content }
            }
            2 => {
                let slot = slot_of(&reader, position)?;
                if version != 0 {
                    return Err(reader.error("a bucket with a version"));
                }
                let local_depth = reader.u8()?;
                reader.zeros(3)?;
                let count = reader.u32()? as usize;
                let next = reader.u32()?;
                reader.zeros(4)?;
                let mut entries = Vec::new();
                for _ in 0..count {
                    entries.push(Entry::decode(&mut reader, in_memory)?);
                }
                Node::Bucket { directory: owner, slot, local_depth, next, entries }
            }
            3 | 4 | 6 | 8 => {
                let count = reader.u32()? as usize;
                reader.zeros(4)?;
                let element = if kind == 3 { 4 } else { 8 };
                if count.checked_mul(element) != body.checked_sub(ARRAY_HEADER_BYTES) {
                    return Err(reader.error(format!("{count} elements do not make a body of {body} bytes")));
                }
                match kind {
                    3 => {
                        let slot = slot_of(&reader, position)?;
                        if version != 0 {
                            return Err(reader.error("a table page with a version"));
                        }
                        let mut slots = Vec::with_capacity(count);
                        for _ in 0..count {
                            slots.push(reader.u32()?);
                        }
                        Node::Table { directory: owner, slot, slots }
                    }
                    4 => {
                        if owner != 0 || version != 0 {
                            return Err(reader.error("a map page with an owner or a version"));
                        }
                        let mut entries = Vec::with_capacity(count);
                        for _ in 0..count {
                            entries.push(reader.u64()?);
                        }
                        Node::Map { number: position, entries }
                    }
                    8 => {
                        if owner != 0 || version != 0 {
                            return Err(reader.error("a map directory page with an owner or a version"));
                        }
                        let mut pointers = Vec::with_capacity(count);
                        for _ in 0..count {
                            pointers.push(Pointer(reader.u64()?));
                        }
                        Node::MapDirectory { number: position, pointers }
                    }
                    _ => {
                        let mut pointers = Vec::with_capacity(count);
                        for _ in 0..count {
                            pointers.push(Pointer(reader.u64()?));
                        }
                        Node::Index {
                            ino: owner,
                            version,
                            level: (position >> 56) as u8,
                            number: position & ((1 << 56) - 1),
                            pointers,
                        }
                    }
                }
            }
            5 => {
                let slot =
                    u32::try_from(position).map_err(|_| reader.error(format!("slot {position} out of range")))?;
                let node = decode_file_body(&mut reader, slot, page_size_bytes)?;
                let Node::File { inode, .. } = &node else { unreachable!() };
                if (owner, version) != (inode.ino, inode.born) {
                    return Err(reader.error("the node header disagrees with the file's inode"));
                }
                node
            }
            _ => return Err(reader.error(format!("unknown node kind {kind}"))),
        };
        if reader.position() != body {
            return Err(reader.error(format!("{} bytes of the body are left over", body - reader.position())));
        }
        Ok(node)
    }
}

fn encode_file_body(inode: &Inode, content: &FileContent, writer: &mut Writer) {
    inode.encode(writer, matches!(content, FileContent::Inline(_)));
    match content {
        FileContent::Inline(data) => {
            writer.bytes(data);
        }
        FileContent::Index { height, incompressible, blocks_stored, units_stored, roots } => {
            let flags = if *incompressible { INDEX_FLAG_INCOMPRESSIBLE } else { 0 };
            writer.u8(*height).u8(flags).zeros(2).u32(*blocks_stored).u64(*units_stored);
            roots.iter().for_each(|root| {
                writer.u64(root.0);
            });
        }
    }
}

fn decode_file_body(reader: &mut Reader, slot: u32, page_size_bytes: usize) -> Result<Node, DecodeError> {
    let (inode, inline) = Inode::decode(reader, page_size_bytes)?;
    let content = if inline {
        let length = usize::try_from(inode.size).unwrap_or(usize::MAX);
        FileContent::Inline(reader.take(length)?.to_vec())
    } else {
        let height = reader.u8()?;
        let flags = reader.u8()?;
        reader.zeros(2)?;
        let blocks_stored = reader.u32()?;
        let units_stored = reader.u64()?;
        if flags & !INDEX_FLAG_INCOMPRESSIBLE != 0 {
            return Err(reader.error(format!("unknown index flags {flags:#x}")));
        }
        let mut roots = [Pointer::NULL; INDEX_ROOTS];
        for root in &mut roots {
            *root = Pointer(reader.u64()?);
        }
        let incompressible = flags & INDEX_FLAG_INCOMPRESSIBLE != 0;
        FileContent::Index { height, incompressible, blocks_stored, units_stored, roots }
    };
    Ok(Node::File { slot, inode, content })
}

/// The node header every node page starts with, checked for what every
/// kind shares: the page is big enough, the reserved bytes and everything
/// after the body are zero.
struct RawNodeHeader<'a> {
    kind: u8,
    owner: u64,
    position: u64,
    version: u64,
    body: &'a [u8],
}

impl<'a> RawNodeHeader<'a> {
    fn decode(structure: &'static str, page: &'a [u8]) -> Result<RawNodeHeader<'a>, DecodeError> {
        let page_size_bytes = page.len();
        let mut reader = Reader::new(structure, page);
        if page_size_bytes < NODE_PAGE_BYTES_MIN {
            return Err(
                reader.error(format!("a {page_size_bytes}-byte page; node pages are at least {NODE_PAGE_BYTES_MIN}"))
            );
        }
        let kind = reader.u8()?;
        reader.zeros(3)?;
        let body = reader.u32()? as usize;
        let owner = reader.u64()?;
        let position = reader.u64()?;
        let version = reader.u64()?;
        if body > page_size_bytes - NODE_HEADER_BYTES {
            return Err(reader.error(format!("a body of {body} bytes is past the page")));
        }
        if !crate::codec::all_zero(&page[NODE_HEADER_BYTES + body..]) {
            return Err(reader.error("bytes after the body are not zero"));
        }
        Ok(RawNodeHeader { kind, owner, position, version, body: &page[NODE_HEADER_BYTES..NODE_HEADER_BYTES + body] })
    }
}

/// Bytes of an inode record's header in an inode pack.
pub const INODE_RECORD_HEADER_BYTES: usize = 8;
/// Node kind of an inode pack page.
const INODE_PACK_KIND: u8 = 7;

/// Bytes a file inode takes in an inode pack.
pub fn inode_record_bytes(file: &Node) -> usize {
    match file {
        Node::Index { pointers, .. } => INODE_RECORD_HEADER_BYTES + index_record_body_bytes(pointers),
        _ => INODE_RECORD_HEADER_BYTES + file.body_bytes(),
    }
}

/// The slot field of a pack record that holds an index page, not a file.
pub const INDEX_RECORD_SLOT: u32 = 0xFFFF_FFFE;
/// Bytes of an index record's body before its pointers.
pub const INDEX_RECORD_FIXED_BYTES: usize = 32;
const _: () = assert!(INDEX_RECORD_SLOT != SLOT_NONE);

/// Pointers an index record keeps: up to the last that is not null (the
/// rest are null, and read back so).
fn index_record_pointers(pointers: &[Pointer]) -> usize {
    pointers.iter().rposition(|pointer| !pointer.is_null()).map_or(0, |last| last + 1)
}

fn index_record_body_bytes(pointers: &[Pointer]) -> usize {
    INDEX_RECORD_FIXED_BYTES + 8 * index_record_pointers(pointers)
}

/// Whether an index page goes into a pack as a record rather than a page
/// of its own: when its record (its pointers up to the last one set) takes
/// at most half a pack's room. An index page of a file of up to about 250
/// blocks then costs its pointers, not a page.
pub fn index_fits_record(index: &Node, page_size_bytes: usize) -> bool {
    matches!(index, Node::Index { .. }) && inode_record_bytes(index) <= (page_size_bytes - NODE_HEADER_BYTES) / 2
}

/// File inodes packed into one node page (node kind 7), so a file costs its
/// inode's bytes, not a page: each record is its body's length, its slot
/// (or [`SLOT_NONE`]), and the body of a file node. Returns the page data,
/// the bytes in use, and each record's size in [`CHUNK_UNIT_BYTES`] units
/// (record `i` is chunk `i + 1` of the page for a [`Pointer`]).
pub fn encode_inode_pack(files: &[Node], page_size_bytes: usize) -> (Vec<u8>, u32, Vec<u32>) {
    assert!(!files.is_empty() && files.len() <= Pointer::CHUNKS_MAX as usize, "{} records in a pack", files.len());
    let body: usize = files.iter().map(inode_record_bytes).sum();
    assert!(NODE_HEADER_BYTES + body <= page_size_bytes, "an inode pack of {body} bytes does not fit the page");
    let mut writer = Writer::with_capacity(page_size_bytes);
    writer.u8(INODE_PACK_KIND).zeros(3).u32(body as u32).u64(0).u64(files.len() as u64).u64(0);
    let mut units = Vec::with_capacity(files.len());
    for file in files {
        if let Err(reason) = file.validate(page_size_bytes) {
            panic!("refusing to pack an invalid node: {reason}");
        }
        match file {
            Node::File { slot, inode, content } => {
                writer.u32(file.body_bytes() as u32).u32(*slot);
                encode_file_body(inode, content, &mut writer);
            }
            Node::Index { ino, version, level, number, pointers } => {
                let kept = index_record_pointers(pointers);
                writer
                    .u32(index_record_body_bytes(pointers) as u32)
                    .u32(INDEX_RECORD_SLOT)
                    .u64(*ino)
                    .u64(*version)
                    .u8(*level)
                    .zeros(3)
                    .u32(kept as u32)
                    .u64(*number);
                for pointer in &pointers[..kept] {
                    writer.u64(pointer.0);
                }
            }
            _ => panic!("only file inodes and index pages are packed"),
        }
        units.push(inode_record_bytes(file).div_ceil(CHUNK_UNIT_BYTES as usize) as u32);
    }
    let used = writer.len() as u32;
    let mut bytes = writer.finish();
    bytes.resize(page_size_bytes, 0);
    debug_assert_eq!(decode_inode_pack(&bytes).as_deref(), Ok(files));
    (bytes, used, units)
}

/// Decodes an inode pack page (the whole page).
pub fn decode_inode_pack(page: &[u8]) -> Result<Vec<Node>, DecodeError> {
    let mut files = Vec::new();
    walk_inode_pack(page, |_, slot, record| {
        files.push(decode_inode_record(record, slot, page.len())?);
        Ok(())
    })?;
    Ok(files)
}

/// Decodes record `index` (from 0) of an inode pack page, or `None` when
/// the pack has fewer records. The page's framing is checked whole (its
/// header, every record's length, nothing after the last), but only the
/// record asked for is decoded: a read of one file's inode decoded all of
/// its pack's, a third of an unlink's host time. The others are decoded,
/// and checked, when they are read.
pub fn decode_inode_pack_record(page: &[u8], index: usize) -> Result<Option<Node>, DecodeError> {
    let mut found = None;
    walk_inode_pack(page, |position, slot, record| {
        if position == index {
            found = Some(decode_inode_record(record, slot, page.len())?);
        }
        Ok(())
    })?;
    Ok(found)
}

/// Checks an inode pack page's header and framing, and hands each record
/// (its position, slot field and bytes) to `visit`.
fn walk_inode_pack<'a>(
    page: &'a [u8],
    mut visit: impl FnMut(usize, u32, &'a [u8]) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let RawNodeHeader { kind, owner, position: count, version, body } = RawNodeHeader::decode("inode pack", page)?;
    let mut reader = Reader::new("inode pack", body);
    if kind != INODE_PACK_KIND {
        return Err(reader.error(format!("node kind {kind}, not an inode pack")));
    }
    if owner != 0 || version != 0 || count == 0 || count > u64::from(Pointer::CHUNKS_MAX) {
        return Err(reader.error(format!("{count} records, owner {owner}, version {version}")));
    }
    for position in 0..count as usize {
        let length = reader.u32()? as usize;
        let slot = reader.u32()?;
        let record = reader.take(length)?;
        visit(position, slot, record)?;
    }
    if reader.position() != body.len() {
        return Err(reader.error("bytes after the last record"));
    }
    Ok(())
}

/// One inode pack record: a file's inode or an index page, whole.
fn decode_inode_record(record: &[u8], slot: u32, page_size_bytes: usize) -> Result<Node, DecodeError> {
    let mut record_reader = Reader::new("inode record", record);
    let file = if slot == INDEX_RECORD_SLOT {
        decode_index_record(&mut record_reader, page_size_bytes)?
    } else {
        decode_file_body(&mut record_reader, slot, page_size_bytes)?
    };
    if record_reader.position() != record.len() {
        return Err(record_reader.error("an inode record with bytes left over"));
    }
    file.validate(page_size_bytes).map_err(|reason| DecodeError { structure: "inode record", reason })?;
    Ok(file)
}

/// An index page kept as a pack record: its identity, then its pointers up
/// to the last one set (the rest null).
fn decode_index_record(reader: &mut Reader, page_size_bytes: usize) -> Result<Node, DecodeError> {
    let ino = reader.u64()?;
    let version = reader.u64()?;
    let level = reader.u8()?;
    reader.zeros(3)?;
    let kept = reader.u32()? as usize;
    let number = reader.u64()?;
    let capacity = array_capacity(page_size_bytes, 8);
    if kept > capacity {
        return Err(reader.error(format!("{kept} index pointers, at most {capacity}")));
    }
    let mut pointers = vec![Pointer::NULL; capacity];
    for pointer in &mut pointers[..kept] {
        *pointer = Pointer(reader.u64()?);
    }
    // Canonical: the last pointer kept is set, so the record re-encodes to
    // the same bytes.
    if kept > 0 && pointers[kept - 1].is_null() {
        return Err(reader.error("an index record that keeps a null last pointer"));
    }
    Ok(Node::Index { ino, version, level, number, pointers })
}

/// Whether a node page holds an inode pack rather than a single node.
pub fn is_inode_pack(page: &[u8]) -> bool {
    page.first() == Some(&INODE_PACK_KIND)
}
