//! Node pages in memory: fetched on demand into the byte-bounded cache,
//! written back to the node log when pushed out or at a checkpoint. A node
//! written back moves, so whatever points at it is updated: the map for a
//! slot, the entry for a file with one link, the parent for an index page,
//! the checkpoint for a map page.

use std::collections::BTreeMap;

use flintfs_flash::FlashDevice;
use flintfs_format::{
    array_capacity, DirectoryContent, FileContent, Node, PageKind, Pointer, Target, ZoneRole, SLOT_NONE,
};

use super::nvm::{Keep, NvmStore};
use super::{Fs, Location};
use crate::allocator::PageMeta;
use crate::cache::{Dirty, PageCache};
use crate::error::{errno, Error, Result};

/// Marks a free slot's map entry; the low 32 bits chain to the next free
/// slot.
pub(crate) const MAP_FREE_TAG: u64 = 1 << 63;
/// Marks a locator: the map entry of a file with one link, which is found
/// through its entry, not the map. The low 32 bits are the directory
/// holding that entry, bits 32..62 the top 30 bits of its name hash. It
/// changes when the file is created, renamed or linked, never when its
/// inode moves.
pub(crate) const MAP_LOCATOR_TAG: u64 = 3 << 62;
/// Bits of the name hash a locator keeps.
const LOCATOR_HASH_SHIFT: u32 = 33;

// A node or inode record pointer never has bit 62 or 63 set: an inode
// record is under 16 KiB, so its size in units stays below 2^10.
const _: () = assert!(
    flintfs_format::INODE_RECORD_HEADER_BYTES
        + flintfs_format::INODE_FIXED_BYTES
        + flintfs_format::XATTR_BYTES_CAP
        + flintfs_format::INLINE_BYTES_CAP
        < (1 << 10) * flintfs_format::CHUNK_UNIT_BYTES as usize
);

/// What a slot's map entry says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapEntry {
    /// Allocated; its node has not been written yet.
    Unwritten,
    Free {
        next: u32,
    },
    /// A file with one link, in directory `parent` under a name whose hash
    /// starts with `hash_prefix`.
    Locator {
        parent: u64,
        hash_prefix: u64,
    },
    /// The node's page, or an inode record.
    Home(Pointer),
}

impl MapEntry {
    pub(crate) fn decode(value: u64) -> MapEntry {
        if value == 0 {
            MapEntry::Unwritten
        } else if value & MAP_LOCATOR_TAG == MAP_LOCATOR_TAG {
            let hash_prefix = ((value >> 32) & ((1 << 30) - 1)) << LOCATOR_HASH_SHIFT;
            MapEntry::Locator { parent: value & 0xffff_ffff, hash_prefix }
        } else if value & MAP_FREE_TAG != 0 {
            MapEntry::Free { next: value as u32 }
        } else {
            MapEntry::Home(Pointer(value))
        }
    }

    pub(crate) fn locator(parent: u64, hash: u64) -> u64 {
        debug_assert!(parent <= u64::from(u32::MAX) && hash >> 63 == 0);
        MAP_LOCATOR_TAG | (hash >> LOCATOR_HASH_SHIFT) << 32 | parent
    }
}

/// Slots one map page holds.
pub(crate) fn map_capacity(page_size: usize) -> usize {
    array_capacity(page_size, 8)
}

/// Map page pointers one map directory page holds.
pub(crate) fn map_directory_capacity(page_size: usize) -> usize {
    array_capacity(page_size, 8)
}

/// Map pages that cover `slot_count` slots.
pub(crate) fn map_page_count(slot_count: u32, page_size: usize) -> u64 {
    u64::from(slot_count).div_ceil(map_capacity(page_size) as u64)
}

/// Map directory pages that locate `map_pages` map pages.
pub(crate) fn map_directory_page_count(map_pages: u64, page_size: usize) -> u64 {
    map_pages.div_ceil(map_directory_capacity(page_size) as u64)
}

/// What a cached node is charged against the node cache's bound. A clean
/// file inode is charged what it holds in memory: its cache entry and
/// its inline bytes and xattrs (a few hundred bytes, where its page would
/// be 4 KiB). A dirty one is charged at least a page, because the space
/// checks and the checkpoint trigger count each dirty node as a page to
/// write or more (`unindexed_short`, `pages_past_heads`, two with its
/// parent in `checkpoint_fits`), and the bound on dirty
/// nodes is what keeps that count, and a checkpoint's write-back, where
/// it was. Every other node is a page-sized table or entry list and is
/// charged a page.
pub(crate) fn node_charge_bytes(node: &Node, dirty: bool, page_size: usize) -> usize {
    match node {
        Node::File { inode, content, .. } => {
            let inline = match content {
                FileContent::Inline(data) => data.len(),
                FileContent::Index { .. } => 0,
            };
            let xattrs: usize = inode
                .xattrs
                .iter()
                .map(|(name, value)| std::mem::size_of::<(Vec<u8>, Vec<u8>)>() + name.len() + value.len())
                .sum();
            let held = PageCache::<NodeKey, Cached>::ENTRY_BYTES + inline + xattrs;
            if dirty {
                held.max(page_size)
            } else {
                held
            }
        }
        _ => page_size,
    }
}

/// Pointers one index page holds.
pub(crate) fn index_capacity(page_size: usize) -> usize {
    array_capacity(page_size, 8)
}

/// A node in memory. The order is the order a checkpoint writes them in:
/// children before what points at them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum NodeKey {
    Index { level: u8, ino: u64, number: u64 },
    File(u64),
    Slot(u32),
    Map(u32),
    MapDirectory(u32),
}

#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub node: Node,
    /// Where the node was last written; null if never.
    pub home: Pointer,
}

impl<D: FlashDevice> Fs<D> {
    /// Puts `key` in the cache, from the pending write-backs or from flash.
    pub(crate) fn ensure(&mut self, key: NodeKey) -> Result<()> {
        if self.nodes.get(key).is_some() {
            return Ok(());
        }
        if let Some(cached) = self.pending.remove(&key) {
            self.cache_insert(key, cached, Dirty::BOTH);
            return Ok(());
        }
        // Kept in NVM: newer than its copy on flash, and as durable.
        if let Some(cached) = self.load_kept(key)? {
            self.cache_insert(key, cached, Dirty::CLEAN);
            return Ok(());
        }
        let home = self.locate(key)?;
        if home.is_null() {
            return Err(Error::corrupt(format!("{key:?} has never been written and is not in memory")));
        }
        let node = self.read_node(key, home)?;
        self.cache_insert(key, Cached { node, home }, Dirty::CLEAN);
        Ok(())
    }

    /// Reads a node in place: what the hot paths use, so that a lookup
    /// copies the one entry it wants, not the page.
    pub(crate) fn with_node<R>(&mut self, key: NodeKey, read: impl FnOnce(&Node) -> R) -> Result<R> {
        if let Some(cached) = self.nodes.get(key) {
            return Ok(read(&cached.node));
        }
        self.ensure(key)?;
        Ok(read(&self.nodes.get(key).expect("ensured").node))
    }

    /// A copy of a node.
    pub(crate) fn node(&mut self, key: NodeKey) -> Result<Node> {
        self.ensure(key)?;
        Ok(self.nodes.get(key).expect("ensured").node.clone())
    }

    /// Changes a node in place and marks it dirty. Its charge against the
    /// cache's bound follows (dirty, and what it holds now), which may push
    /// other nodes out to `pending`.
    pub(crate) fn modify<R>(&mut self, key: NodeKey, change: impl FnOnce(&mut Node) -> R) -> Result<R> {
        self.ensure(key)?;
        self.changed = true;
        let cached = self.nodes.get_mut(key).expect("ensured");
        let result = change(&mut cached.node);
        let bytes = node_charge_bytes(&cached.node, true, self.page_size);
        self.recharge(key, bytes);
        Ok(result)
    }

    /// Marks a cached node dirty without changing it (its next write-back
    /// moves it), charged as dirty.
    pub(crate) fn mark_node_dirty(&mut self, key: NodeKey) {
        self.nodes.mark_dirty(key);
        let Some(cached) = self.nodes.peek(key) else { return };
        let bytes = node_charge_bytes(&cached.node, true, self.page_size);
        self.recharge(key, bytes);
    }

    /// Charges a cached node `bytes` from now on; what that pushes out
    /// goes to `pending`.
    fn recharge(&mut self, key: NodeKey, bytes: usize) {
        for victim in self.nodes.recharge(key, bytes) {
            self.pending.insert(victim.key, victim.value);
        }
    }

    /// Adds a node that has never been written.
    pub(crate) fn insert_new(&mut self, key: NodeKey, node: Node) {
        debug_assert!(!self.in_memory(key), "{key:?} already exists");
        self.changed = true;
        self.cache_insert(key, Cached { node, home: Pointer::NULL }, Dirty::BOTH);
    }

    pub(crate) fn cache_insert(&mut self, key: NodeKey, cached: Cached, dirty: Dirty) {
        let bytes = node_charge_bytes(&cached.node, dirty.any(), self.page_size);
        for victim in self.nodes.insert(key, cached, bytes, dirty) {
            self.pending.insert(victim.key, victim.value);
        }
    }

    /// Takes a node out of memory (cache, pending, or kept in NVM), with
    /// its home. A node kept in NVM whose bytes do not read back stays
    /// there (and the checkpoint that needs it fails, rather than write a
    /// tree without it).
    pub(crate) fn take(&mut self, key: NodeKey) -> Option<Cached> {
        let taken = match self.nodes.remove(key).map(|(cached, _)| cached).or_else(|| self.pending.remove(&key)) {
            Some(cached) => Some(cached),
            None => match self.load_kept(key) {
                Ok(found) => found,
                Err(error) => {
                    tracing::error!("{key:?} could not be read from NVM: {}", error.message);
                    return None;
                }
            },
        };
        if taken.is_some() {
            if let Err(error) = self.unkeep(key) {
                tracing::error!("{key:?} could not be dropped from NVM: {}", error.message);
            }
        }
        taken
    }

    /// Whether a node is in memory (kept in NVM counts).
    pub(crate) fn in_memory(&self, key: NodeKey) -> bool {
        self.nodes.contains(key)
            || self.pending.contains_key(&key)
            || self.kept.as_ref().is_some_and(|kept| kept.contains(key))
    }

    /// The checkpoint whose generation NVM writes now belong to: the next.
    pub(crate) fn kept_generation(&self) -> u64 {
        self.volume.checkpoint.number + 1
    }

    /// Reads a node kept in NVM, if it is kept there. A node that is not
    /// the one its key names (hostile or damaged NVM whose checksums hold)
    /// is an error, as for a stray pointer on flash.
    pub(crate) fn load_kept(&mut self, key: NodeKey) -> Result<Option<Cached>> {
        let Some(kept) = self.kept.as_mut() else { return Ok(None) };
        let found = kept.load(&mut self.volume.device, key)?;
        if let Some(cached) = &found {
            if !self.node_is(&cached.node, key) {
                return Err(Error::corrupt(format!("NVM holds {:?} as {key:?}", cached.node.kind())));
            }
            self.counters.nodes_unparked += 1;
        }
        Ok(found)
    }

    /// Stops keeping a node in NVM: it is going to flash, or gone.
    pub(crate) fn unkeep(&mut self, key: NodeKey) -> Result<()> {
        if self.options.read_only {
            // The node is in memory now (dirty, so never dropped), or gone:
            // the store stops naming it, and its slot stays as it was.
            if let Some(kept) = self.kept.as_mut() {
                kept.forget(key);
            }
            return Ok(());
        }
        let generation = self.kept_generation();
        match self.kept.as_mut() {
            Some(kept) => kept.remove(&mut self.volume.device, key, generation),
            None => Ok(()),
        }
    }

    /// Keeps in NVM the pending write-backs that find room there, instead
    /// of programming them: a flash copy stays where it is
    /// (`nvm::NvmStore`). Nodes the cleaner or a write-home sends to flash
    /// go on to flash.
    fn keep_pending(&mut self, refused: &mut std::collections::BTreeSet<NodeKey>) -> Result<()> {
        let generation = self.kept_generation();
        let Some(kept) = self.kept.as_mut() else { return Ok(()) };
        let device = &mut self.volume.device;
        let to_flash = &self.to_flash;
        let mut stored = Vec::new();
        let mut no_room: BTreeMap<u8, Vec<NodeKey>> = BTreeMap::new();
        for (&key, cached) in &self.pending {
            if to_flash.contains(&key) || refused.contains(&key) {
                continue;
            }
            match kept.store(device, key, &cached.node, cached.home, generation)? {
                Keep::Kept => stored.push(key),
                Keep::NoRoom(class) => no_room.entry(class).or_default().push(key),
                Keep::Refused => {
                    refused.insert(key);
                }
            }
        }
        self.counters.nodes_parked += stored.len() as u64;
        for key in stored {
            self.pending.remove(&key);
        }
        if no_room.is_empty() {
            return Ok(());
        }
        // NVM is full for these classes: the coldest nodes of each go home
        // to flash (in this drain, packed where they can be), and the hot
        // ones take their slots.
        for (class, keys) in no_room {
            let batch = NvmStore::send_home_batch(class).max(keys.len());
            let pending = &self.pending;
            let cold = self
                .kept
                .as_ref()
                .map_or_else(Vec::new, |kept| kept.coldest_keys(batch, Some(class), |key| pending.contains_key(&key)));
            self.send_home(cold);
            for key in keys {
                let Some(kept) = self.kept.as_mut() else { break };
                let Some(cached) = self.pending.get(&key) else { continue };
                if kept.store(&mut self.volume.device, key, &cached.node, cached.home, generation)? == Keep::Kept {
                    self.pending.remove(&key);
                    self.counters.nodes_parked += 1;
                } else {
                    refused.insert(key);
                }
            }
        }
        Ok(())
    }

    /// Sends nodes kept in NVM home: out of NVM, into the pending
    /// write-backs, marked for flash.
    pub(crate) fn send_home(&mut self, keys: Vec<NodeKey>) {
        for key in keys {
            if let Some(cached) = self.take(key) {
                self.to_flash.insert(key);
                self.pending.insert(key, cached);
                self.counters.nodes_sent_home += 1;
                // Pending from NVM, which the walk's kept bound did not
                // count (`Fs::checkpoint_fits`): it walks again.
                self.walked = None;
            }
        }
    }

    /// Removes a node for good: out of memory, and its page no longer
    /// counted. `home` is where it is on flash if it is not in memory.
    pub(crate) fn discard(&mut self, key: NodeKey, home: Pointer) {
        // Kept in NVM: dropped there without reading it back (its home is
        // in memory), so a node gone for good never needs NVM to read.
        let kept_home = self.kept.as_ref().and_then(|kept| kept.home_of(key));
        if kept_home.is_some() {
            if let Err(error) = self.unkeep(key) {
                tracing::error!("{key:?} could not be dropped from NVM: {}", error.message);
            }
        }
        let home = self.take(key).map_or(kept_home.unwrap_or(home), |cached| cached.home);
        self.release(home);
        self.changed = true;
    }

    /// Stops counting a page or chunk as referenced.
    pub(crate) fn release(&mut self, pointer: Pointer) {
        if !pointer.is_null() {
            let bytes = self.pointer_bytes(pointer);
            self.volume.account(pointer.zone(), -(bytes as i64));
            self.read_cache.remove(pointer.whole_page());
        }
    }

    /// Bytes a page or chunk takes in its zone.
    pub(crate) fn pointer_bytes(&self, pointer: Pointer) -> u64 {
        if pointer.chunk() == 0 {
            self.page_size as u64
        } else {
            u64::from(pointer.chunk_units()) * u64::from(flintfs_format::CHUNK_UNIT_BYTES)
        }
    }

    /// Where a node's current copy is on flash (null if never written).
    pub(crate) fn locate(&mut self, key: NodeKey) -> Result<Pointer> {
        match key {
            NodeKey::Map(page) => {
                if u64::from(page) >= map_page_count(self.slot_count, self.page_size) {
                    return Err(Error::corrupt(format!("map page {page} is past the map")));
                }
                let (directory, index) = self.map_directory_slot(page);
                self.with_node(NodeKey::MapDirectory(directory), |node| {
                    let Node::MapDirectory { pointers, .. } = node else {
                        unreachable!("map directory keys hold map directories")
                    };
                    pointers[index]
                })
            }
            NodeKey::MapDirectory(number) => self
                .map_directory
                .get(number as usize)
                .copied()
                .ok_or_else(|| Error::corrupt(format!("map directory page {number} is past the map"))),
            NodeKey::Slot(slot) => match MapEntry::decode(self.map_get(slot)?) {
                MapEntry::Home(home) => Ok(home),
                MapEntry::Unwritten => Ok(Pointer::NULL),
                MapEntry::Free { .. } => Err(Error::new(errno::ENOENT, format!("slot {slot} is free"))),
                MapEntry::Locator { .. } => {
                    Err(Error::new(errno::ENOTDIR, format!("slot {slot} holds a file found through its entry")))
                }
            },
            NodeKey::File(ino) => {
                self.file_key(ino)?;
                match self.known.get(&ino).map(|known| known.location) {
                    Some(Location::Physical { home }) => Ok(home),
                    _ => Err(Error::corrupt(format!("inode {ino} is not where its locator says"))),
                }
            }
            NodeKey::Index { level, ino, number } => self.index_pointer_to(ino, level, number),
        }
    }

    /// The map directory page that locates map page `page`, and where in
    /// it.
    fn map_directory_slot(&self, page: u32) -> (u32, usize) {
        let capacity = map_directory_capacity(self.page_size);
        ((page as usize / capacity) as u32, page as usize % capacity)
    }

    pub(crate) fn index_fanout(&self) -> u64 {
        index_capacity(self.page_size) as u64
    }

    /// The pointer to index page `(level, number)` held by its parent.
    fn index_pointer_to(&mut self, ino: u64, level: u8, number: u64) -> Result<Pointer> {
        let file_key = self.file_key(ino)?;
        // Read in place: copies of the inode and the parent were two
        // allocations per index page written back.
        let Some((height, root)) = self.with_node(file_key, |node| match node {
            Node::File { content: FileContent::Index { height, roots, .. }, .. } => {
                Some((*height, roots.get(number as usize).copied().unwrap_or(Pointer::NULL)))
            }
            _ => None,
        })?
        else {
            return Err(Error::corrupt(format!("inode {ino} has no index, yet index page {level}/{number} is wanted")));
        };
        if level + 1 == height {
            return Ok(root);
        }
        if level + 1 > height {
            return Ok(Pointer::NULL);
        }
        let fanout = self.index_fanout();
        let parent = NodeKey::Index { level: level + 1, ino, number: number / fanout };
        if !self.in_memory(parent) && self.index_pointer_to(ino, level + 1, number / fanout)?.is_null() {
            return Ok(Pointer::NULL);
        }
        self.with_node(parent, |node| match node {
            Node::Index { pointers, .. } => pointers[(number % fanout) as usize],
            _ => unreachable!("index keys hold index nodes"),
        })
    }

    /// The cache key of inode `ino`, a directory or a file. A file with one
    /// link is found through its locator: its directory's entry says where
    /// its inode is, and the engine remembers that while it needs it.
    pub(crate) fn file_key(&mut self, ino: u64) -> Result<NodeKey> {
        let missing = || Error::new(errno::ENOENT, format!("inode {ino} does not exist"));
        if ino == 0 || ino > u64::from(self.slot_count) {
            return Err(missing());
        }
        let slot = (ino - 1) as u32;
        if let Some(known) = self.known.get(&ino) {
            if known.orphan && known.directory {
                return Err(Error::new(errno::ENOENT, format!("directory {ino} has been removed")));
            }
            return Ok(match known.location {
                Location::Physical { .. } => NodeKey::File(ino),
                Location::Slot(slot) => NodeKey::Slot(slot),
            });
        }
        if self.in_memory(NodeKey::Slot(slot)) {
            return Ok(NodeKey::Slot(slot));
        }
        match MapEntry::decode(self.map_get(slot)?) {
            MapEntry::Home(_) => Ok(NodeKey::Slot(slot)),
            MapEntry::Unwritten | MapEntry::Free { .. } => Err(missing()),
            MapEntry::Locator { parent, hash_prefix } => {
                if parent == ino {
                    return Err(Error::corrupt(format!("inode {ino}'s locator names itself")));
                }
                let target = self.directory_find_ino(parent, hash_prefix, ino)?.ok_or_else(|| {
                    Error::corrupt(format!("inode {ino}'s locator names directory {parent}, which has no entry for it"))
                })?;
                let location = match target {
                    Target::Physical(home) => Location::Physical { home },
                    Target::Slot(found) if found == slot => Location::Slot(slot),
                    Target::Slot(found) => {
                        return Err(Error::corrupt(format!("inode {ino}'s entry names slot {found}")));
                    }
                };
                self.known.insert(ino, super::Known { location, lookups: 0, orphan: false, directory: false });
                self.file_key(ino)
            }
        }
    }

    /// Reads and checks a node page: the page header, then the node's own
    /// identity against what was asked for, so a pointer to the wrong page
    /// is caught.
    pub(crate) fn read_node(&mut self, key: NodeKey, home: Pointer) -> Result<Node> {
        if home.zone() >= self.volume.device().geometry().zone_count {
            return Err(Error::corrupt(format!("{key:?} points at {home}, past the device")));
        }
        let (header, data) = self.volume.read_page(flintfs_flash::PageAddress::new(home.zone(), home.page()))?;
        self.counters.node_pages_read += 1;
        if header.kind != PageKind::Node {
            return Err(Error::corrupt(format!("{key:?} points at {home}, a {:?} page", header.kind)));
        }
        let node = if home.chunk() == 0 {
            if flintfs_format::is_inode_pack(&data) {
                return Err(Error::corrupt(format!("{key:?} points at the whole of inode pack {home}")));
            }
            Node::decode(&data).map_err(|error| Error::corrupt(format!("{home}: {error}")))?
        } else {
            let index = home.chunk() as usize - 1;
            flintfs_format::decode_inode_pack_record(&data, index)
                .map_err(|error| Error::corrupt(format!("{home}: {error}")))?
                .ok_or_else(|| Error::corrupt(format!("{key:?} points at {home}, past the pack's records")))?
        };
        if !self.node_is(&node, key) {
            return Err(Error::corrupt(format!("{home} holds {:?}, not {key:?}: a stray pointer", node.kind())));
        }
        Ok(node)
    }

    /// Whether `node` is the node `key` names, whole: what every read from
    /// flash or NVM checks before anything indexes into it.
    pub(crate) fn node_is(&self, node: &Node, key: NodeKey) -> bool {
        let map_pages = map_page_count(self.slot_count, self.page_size);
        match (node, key) {
            (Node::Map { number, entries }, NodeKey::Map(page)) => {
                *number == u64::from(page)
                    && u64::from(page) < map_pages
                    && entries.len() == map_capacity(self.page_size)
            }
            (Node::MapDirectory { number, pointers }, NodeKey::MapDirectory(page)) => {
                *number == u64::from(page)
                    && (page as usize) < self.map_directory.len()
                    && pointers.len() == map_directory_capacity(self.page_size)
            }
            (Node::Directory { slot, .. }, NodeKey::Slot(wanted))
            | (Node::Bucket { slot, .. }, NodeKey::Slot(wanted))
            | (Node::Table { slot, .. }, NodeKey::Slot(wanted))
            | (Node::File { slot, .. }, NodeKey::Slot(wanted)) => *slot == wanted && wanted < self.slot_count,
            (Node::File { slot, inode, .. }, NodeKey::File(ino)) => *slot == SLOT_NONE && inode.ino == ino,
            (Node::Index { ino, level, number, .. }, NodeKey::Index { ino: i, level: l, number: n }) => {
                (*ino, *level, *number) == (i, l, n) && node_fits_index(node, self.page_size)
            }
            _ => false,
        }
    }

    /// Reads a slot's map entry.
    pub(crate) fn map_get(&mut self, slot: u32) -> Result<u64> {
        if slot >= self.slot_count {
            return Err(Error::corrupt(format!("slot {slot} is past the {} slots", self.slot_count)));
        }
        let capacity = map_capacity(self.page_size);
        let page = (slot as usize / capacity) as u32;
        self.with_node(NodeKey::Map(page), |node| {
            let Node::Map { entries, .. } = node else { unreachable!("map keys hold maps") };
            entries[slot as usize % capacity]
        })
    }

    /// Sets a slot's map entry.
    pub(crate) fn map_set(&mut self, slot: u32, value: u64) -> Result<()> {
        let capacity = map_capacity(self.page_size);
        let page = (slot as usize / capacity) as u32;
        self.modify(NodeKey::Map(page), |node| {
            let Node::Map { entries, .. } = node else { unreachable!("map keys hold maps") };
            entries[slot as usize % capacity] = value;
        })
    }

    /// A slot for a new logical node: a freed one, or the next.
    pub(crate) fn allocate_slot(&mut self) -> Result<u32> {
        if self.free_slot_head != SLOT_NONE {
            let slot = self.free_slot_head;
            let MapEntry::Free { next } = MapEntry::decode(self.map_get(slot)?) else {
                return Err(Error::corrupt(format!("slot {slot} heads the free list but is in use")));
            };
            if next != SLOT_NONE && next >= self.slot_count {
                return Err(Error::corrupt(format!("free slot {slot} chains to {next}, past the slots")));
            }
            self.free_slot_head = next;
            self.map_set(slot, 0)?;
            return Ok(slot);
        }
        let slot = self.slot_count;
        if slot >= crate::volume::slots_max(&self.volume.device().geometry()) {
            return Err(Error::new(errno::ENOSPC, "every slot of the map is in use"));
        }
        let capacity = map_capacity(self.page_size);
        let page = slot as usize / capacity;
        if (slot as usize).is_multiple_of(capacity) {
            // A new map page, and for every E of them a new directory page
            // to locate them.
            let directory_capacity = map_directory_capacity(self.page_size);
            if page.is_multiple_of(directory_capacity) {
                let number = page / directory_capacity;
                debug_assert_eq!(number, self.map_directory.len());
                self.map_directory.push(Pointer::NULL);
                self.insert_new(
                    NodeKey::MapDirectory(number as u32),
                    Node::MapDirectory { number: number as u64, pointers: vec![Pointer::NULL; directory_capacity] },
                );
            }
            self.insert_new(NodeKey::Map(page as u32), Node::Map { number: page as u64, entries: vec![0; capacity] });
        }
        self.slot_count += 1;
        self.map_set(slot, 0)?;
        Ok(slot)
    }

    /// Gives a slot back; its node must already be discarded.
    pub(crate) fn free_slot(&mut self, slot: u32) -> Result<()> {
        debug_assert!(!self.in_memory(NodeKey::Slot(slot)));
        self.map_set(slot, MAP_FREE_TAG | u64::from(self.free_slot_head))?;
        self.free_slot_head = slot;
        Ok(())
    }

    /// Removes a slot's node and frees the slot.
    pub(crate) fn discard_slot(&mut self, slot: u32) -> Result<()> {
        let home = match MapEntry::decode(self.map_get(slot)?) {
            _ if self.in_memory(NodeKey::Slot(slot)) => Pointer::NULL,
            MapEntry::Home(home) => home,
            _ => Pointer::NULL,
        };
        self.discard(NodeKey::Slot(slot), home);
        self.free_slot(slot)
    }

    /// Programs a node page at the node head and counts it; returns where
    /// it went. The old copy is the caller's to release, once whatever
    /// points at the node points at the new one.
    fn program_node(&mut self, node: &Node) -> Result<Pointer> {
        let (data, used) = node.encode(self.page_size);
        let address = self.volume.append(ZoneRole::Node, PageMeta::new(PageKind::Node, used), &data)?;
        let home = Pointer::page_at(address.zone, address.page);
        self.volume.account(address.zone, self.page_size as i64);
        self.counters.node_pages_written += 1;
        Ok(home)
    }

    /// Points what locates `key` at `home`: the map for a slot, the entry
    /// for a file found physically (unless `skip_entry`), the parent for an
    /// index page, the roots for a map page.
    fn point_at(&mut self, key: NodeKey, node: &Node, home: Pointer, skip_entry: bool) -> Result<()> {
        match key {
            NodeKey::Map(page) => {
                let (directory, index) = self.map_directory_slot(page);
                self.modify(NodeKey::MapDirectory(directory), |node| {
                    let Node::MapDirectory { pointers, .. } = node else {
                        unreachable!("map directory keys hold map directories")
                    };
                    pointers[index] = home;
                })
            }
            NodeKey::MapDirectory(number) => {
                self.map_directory[number as usize] = home;
                Ok(())
            }
            NodeKey::Slot(slot) => self.map_set(slot, home.0),
            NodeKey::File(ino) => {
                let Node::File { inode, .. } = node else { unreachable!("file keys hold files") };
                let orphan = self.known.get(&ino).is_some_and(|known| known.orphan);
                if !orphan && !skip_entry {
                    self.directory_set_target(inode.parent, inode.name_hash, ino, Target::Physical(home))?;
                }
                if let Some(known) = self.known.get_mut(&ino) {
                    known.location = Location::Physical { home };
                }
                Ok(())
            }
            NodeKey::Index { level, ino, number } => {
                let file_key = self.file_key(ino)?;
                let Node::File { content: FileContent::Index { height, .. }, .. } = self.node(file_key)? else {
                    return Err(Error::corrupt(format!("index page of inode {ino}, which has no index")));
                };
                if level + 1 == height {
                    self.modify(file_key, |file| {
                        let Node::File { content: FileContent::Index { roots, .. }, .. } = file else { unreachable!() };
                        roots[number as usize] = home;
                    })
                } else if level + 1 < height {
                    let fanout = self.index_fanout();
                    let parent = NodeKey::Index { level: level + 1, ino, number: number / fanout };
                    self.modify(parent, |parent| {
                        let Node::Index { pointers, .. } = parent else { unreachable!("index keys hold index nodes") };
                        pointers[(number % fanout) as usize] = home;
                    })
                } else {
                    Err(Error::corrupt(format!("index page at level {level} of a tree {height} high")))
                }
            }
        }
    }

    /// After a node was programmed at `home`: points what locates it there,
    /// then releases its old copy and keeps it cached, clean. If the
    /// pointer cannot be updated, the new copy is released instead and the
    /// node goes back to the pending list at its old home, so the counts
    /// and the tree never disagree.
    fn settle(&mut self, key: NodeKey, cached: Cached, home: Pointer, skip_entry: bool) -> Result<()> {
        if let Err(error) = self.point_at(key, &cached.node, home, skip_entry) {
            self.release(home);
            self.pending.insert(key, cached);
            return Err(error);
        }
        self.release(cached.home);
        self.cache_insert(key, Cached { node: cached.node, home }, Dirty::CLEAN);
        // The copy just written is the newest: none is kept in NVM.
        self.to_flash.remove(&key);
        self.unkeep(key)
    }

    /// Writes file inodes, or small index pages, packed into as few node
    /// pages as they need, a page at a time, settling each before the next
    /// page. The nodes must already be out of the cache and the pending
    /// list; on an error, every one not yet settled is pending again.
    /// Returns each settled node's new home.
    pub(crate) fn write_files(&mut self, files: Vec<(NodeKey, Cached)>, skip_entries: bool) -> Result<Vec<Pointer>> {
        let page_size = self.page_size;
        let room = page_size - flintfs_format::NODE_HEADER_BYTES;
        let mut homes = Vec::with_capacity(files.len());
        let mut remaining = files.into_iter().peekable();
        while remaining.peek().is_some() {
            // As many records as fit one page, in order.
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some((_, cached)) = remaining.peek() {
                let record = flintfs_format::inode_record_bytes(&cached.node);
                if batch.len() == Pointer::CHUNKS_MAX as usize || (!batch.is_empty() && bytes + record > room) {
                    break;
                }
                bytes += record;
                batch.push(remaining.next().expect("peeked"));
            }
            let nodes: Vec<Node> = batch.iter().map(|(_, cached)| cached.node.clone()).collect();
            let (data, used, units) = flintfs_format::encode_inode_pack(&nodes, page_size);
            let address = match self.volume.append(ZoneRole::Node, PageMeta::new(PageKind::Node, used), &data) {
                Ok(address) => address,
                Err(error) => {
                    self.pending.extend(batch);
                    self.pending.extend(remaining);
                    return Err(error);
                }
            };
            self.counters.node_pages_written += 1;
            let mut failure = None;
            for (index, ((key, cached), units)) in batch.into_iter().zip(units).enumerate() {
                let home = Pointer::new(address.zone, address.page, index as u32 + 1, units);
                self.volume.account(address.zone, self.pointer_bytes(home) as i64);
                if failure.is_some() {
                    // Nothing points at this copy: it stops counting, and the
                    // node waits at its old home.
                    self.release(home);
                    self.pending.insert(key, cached);
                    continue;
                }
                let file = match &cached.node {
                    Node::File { inode, .. } => Some(inode.ino),
                    Node::Index { .. } => {
                        self.counters.index_records_written += 1;
                        None
                    }
                    _ => unreachable!("only files and index pages are packed"),
                };
                match self.settle(key, cached, home, skip_entries) {
                    Ok(()) => {
                        homes.push(home);
                        // A file nobody holds and with nothing left in memory
                        // is found again through its locator: the table
                        // stays as small as what the caller holds.
                        // (Not while a caller patches entries from it.)
                        if let Some(ino) = file {
                            if !skip_entries
                                && self.known.get(&ino).is_some_and(|known| known.lookups == 0 && !known.orphan)
                                && !self.file_has_state(ino)
                            {
                                self.known.remove(&ino);
                            }
                        }
                    }
                    Err(error) => failure = Some(error),
                }
            }
            if let Some(error) = failure {
                self.pending.extend(remaining);
                return Err(error);
            }
        }
        Ok(homes)
    }

    /// Writes a node back and updates what points at it. The node must
    /// already be out of the cache and the pending list; on an error it is
    /// pending again (with whatever part of the work did land).
    pub(crate) fn write_back(&mut self, key: NodeKey, cached: Cached) -> Result<()> {
        if matches!(cached.node, Node::File { .. }) {
            return self.write_files(vec![(key, cached)], false).map(|_| ());
        }
        let mut cached = cached;
        // Entries of files never written point nowhere yet: write those
        // files first and point the entries at them.
        let unwritten: Vec<u64> = match &cached.node {
            Node::Directory { content: DirectoryContent::Inline(entries), .. } | Node::Bucket { entries, .. } => {
                entries
                    .iter()
                    .filter(|entry| entry.target == Target::Physical(Pointer::NULL))
                    .map(|entry| entry.ino)
                    .collect()
            }
            _ => Vec::new(),
        };
        if !unwritten.is_empty() {
            let files: Vec<(NodeKey, Cached)> = unwritten
                .iter()
                .filter_map(|&ino| self.take(NodeKey::File(ino)).map(|file| (NodeKey::File(ino), file)))
                .collect();
            let written = self.write_files(files, true);
            // Every file that has a home now, whether or not all were
            // written, is pointed at, so a retry never meets a file that is
            // written but not named.
            for &ino in &unwritten {
                let home = match self.known.get(&ino).map(|known| known.location) {
                    Some(Location::Physical { home }) if !home.is_null() => home,
                    _ => self.nodes.peek(NodeKey::File(ino)).map_or(Pointer::NULL, |file| file.home),
                };
                if home.is_null() {
                    continue;
                }
                if let Node::Directory { content: DirectoryContent::Inline(entries), .. }
                | Node::Bucket { entries, .. } = &mut cached.node
                {
                    for entry in entries.iter_mut().filter(|entry| entry.ino == ino) {
                        entry.target = Target::Physical(home);
                    }
                }
            }
            if let Err(error) = written {
                self.pending.insert(key, cached);
                return Err(error);
            }
            let still_null = match &cached.node {
                Node::Directory { content: DirectoryContent::Inline(entries), .. } | Node::Bucket { entries, .. } => {
                    entries.iter().find(|entry| entry.target == Target::Physical(Pointer::NULL)).map(|entry| entry.ino)
                }
                _ => None,
            };
            if let Some(ino) = still_null {
                self.pending.insert(key, cached);
                return Err(Error::corrupt(format!("the entry for inode {ino} names an inode never written")));
            }
        }
        let home = match self.program_node(&cached.node) {
            Ok(home) => home,
            Err(error) => {
                self.pending.insert(key, cached);
                return Err(error);
            }
        };
        self.settle(key, cached, home, false)
    }

    /// Writes back everything pushed out of the cache: index pages first,
    /// lowest level first (each changes its parent), then every file inode
    /// in one batch of packs (each changes its entry or the map), then the
    /// rest in key order (slots, whose write-backs change the map, then map
    /// pages). Whatever a write-back changes stays in `pending` if it is
    /// there, so a parent is never read stale from flash.
    pub(crate) fn drain(&mut self) -> Result<()> {
        if self.options.read_only {
            // What a read-only recovery replayed stays pending in memory.
            return Ok(());
        }
        // Nodes NVM did not take in this drain: flash takes them.
        let mut refused = std::collections::BTreeSet::new();
        loop {
            if self.drain_takes_dirty && self.nodes.dirty_count() > 0 {
                // A parent a write-back dirtied in the cache (it was clean)
                // is written in this pass, at its level, not in the next
                // pass after the nodes above it: a file written before its
                // index page, then again after, then its directory again.
                for (key, cached) in self.nodes.take_dirty() {
                    self.pending.insert(key, cached);
                }
            }
            if !self.parking_paused && self.kept.is_some() {
                // With NVM, a node is written back to its slot there, in
                // place; only what finds no room, or is sent to flash, goes
                // to flash. Again at every step: a write to flash settles
                // its node in the cache, which may push a dirty one out.
                self.keep_pending(&mut refused)?;
            }
            if let Some((&NodeKey::Index { level, .. }, _)) = self.pending.first_key_value() {
                // Every pending index page of the lowest level: those whose
                // pointers take little go into packs as records (an index
                // page of a 128 KiB file then costs 300 bytes, not a
                // page), the rest a page each. Levels go up one at a time,
                // since each write changes the level above.
                let keys: Vec<NodeKey> = self
                    .pending
                    .keys()
                    .take_while(|key| matches!(key, NodeKey::Index { level: at, .. } if *at == level))
                    .copied()
                    .collect();
                let (packed, paged): (Vec<_>, Vec<_>) = keys
                    .into_iter()
                    .map(|key| (key, self.pending.remove(&key).expect("present")))
                    .partition(|(_, cached)| flintfs_format::index_fits_record(&cached.node, self.page_size));
                let mut paged = paged.into_iter();
                while let Some((key, cached)) = paged.next() {
                    if let Err(error) = self.write_back(key, cached) {
                        self.pending.extend(paged);
                        self.pending.extend(packed);
                        return Err(error);
                    }
                }
                if !packed.is_empty() {
                    self.write_files(packed, false)?;
                }
                continue;
            }
            let file_keys: Vec<NodeKey> = self
                .pending
                .iter()
                .filter(|(_, cached)| matches!(cached.node, Node::File { .. }))
                .map(|(key, _)| *key)
                .collect();
            if !file_keys.is_empty() {
                let mut files: Vec<(NodeKey, Cached)> =
                    file_keys.into_iter().map(|key| (key, self.pending.remove(&key).expect("present"))).collect();
                // Fill the pack: the coldest dirty inodes still cached go
                // with the evicted ones, so an inode costs its record, not
                // a page.
                let room = self.page_size - flintfs_format::NODE_HEADER_BYTES;
                let used: usize =
                    files.iter().map(|(_, cached)| flintfs_format::inode_record_bytes(&cached.node)).sum();
                if used < room {
                    let record_estimate = flintfs_format::INODE_RECORD_HEADER_BYTES
                        + flintfs_format::INODE_FIXED_BYTES
                        + flintfs_format::INDEX_IN_INODE_BYTES;
                    let more = (room - used) / record_estimate;
                    files.extend(
                        self.nodes
                            .take_dirty_where(more, |_, cached: &Cached| matches!(cached.node, Node::File { .. })),
                    );
                }
                self.write_files(files, false)?;
                continue;
            }
            match self.pending.pop_first() {
                Some((key, cached)) => self.write_back(key, cached)?,
                None => return Ok(()),
            }
        }
    }
}

fn node_fits_index(node: &Node, page_size: usize) -> bool {
    matches!(node, Node::Index { pointers, .. } if pointers.len() == index_capacity(page_size))
}
