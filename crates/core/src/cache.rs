//! The volatile tree's page cache: metadata pages fetched on demand and kept
//! under a byte bound, least recently used first out. Each page carries the
//! two dirty flags of ReconFS: *persistence-dirty* (its change needs a log
//! record before the next fsync returns) and *checkpoint-dirty* (its home
//! copy on flash is stale until the next checkpoint writes it). A dirty page
//! pushed out by the bound is handed back to the caller, which writes it
//! home (write-back on eviction); the cache itself does no I/O, so it can
//! never lose a dirty page silently.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A cached page's two dirty flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    pub persistence: bool,
    pub checkpoint: bool,
}

impl Dirty {
    pub const CLEAN: Dirty = Dirty { persistence: false, checkpoint: false };
    pub const BOTH: Dirty = Dirty { persistence: true, checkpoint: true };

    pub fn any(self) -> bool {
        self.persistence || self.checkpoint
    }
}

/// A page pushed out of the cache while dirty: the caller must write it.
#[derive(Debug, PartialEq, Eq)]
pub struct Evicted<K, V> {
    pub key: K,
    pub value: V,
    pub dirty: Dirty,
}

/// No slot: the end of the recency list.
const NONE: u32 = u32::MAX;

struct Slot<K, V> {
    key: K,
    value: V,
    bytes: usize,
    dirty: Dirty,
    /// Neighbours in the recency list (toward older, toward newer).
    older: u32,
    newer: u32,
}

/// A byte-bounded LRU cache of metadata pages.
///
/// A lookup is the hot path of every operation, so it costs one hash probe
/// and four link updates: entries live in a slab, indexed by a hash map, and
/// the recency order is a list threaded through the slab. (A B-tree for the
/// recency order cost two tree updates per lookup: 46% of webserver's host
/// time.) What the cache hands out is still deterministic: victims come in
/// recency order, and dirty lists in key order, from the sorted set of keys
/// a cache keeps when it is made with [`PageCache::new_ordered`] (ranges of
/// keys need it) or from a sort.
pub struct PageCache<K: Ord + Copy + Hash, V> {
    capacity_bytes: usize,
    used_bytes: usize,
    slots: Vec<Option<Slot<K, V>>>,
    /// Slots free for reuse.
    free: Vec<u32>,
    index: HashMap<K, u32, BuildHasherDefault<KeyHasher>>,
    /// The keys in order, for caches asked about ranges.
    ordered: Option<BTreeSet<K>>,
    /// The least and the most recently used slot.
    oldest: u32,
    newest: u32,
    /// Entries with either dirty flag set.
    dirty_entries: usize,
    /// Times an entry's dirty flags went from none to some or back, a
    /// dirty entry left, or an entry was taken to be changed: says whether
    /// the dirty entries are the ones, as they were, that a bound was
    /// counted for.
    dirty_changes: u64,
}

/// FxHash's multiply-and-rotate over the key's words: keys are the engine's
/// own (node keys, flash addresses), so no one can choose them to collide,
/// and a fixed hash keeps runs reproducible.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        // The table picks a bucket from the low bits, and the low bits of a
        // product depend only on the low bits of the key (a page pointer's
        // page within its zone): rotate the well-mixed high bits down, as
        // rustc-hash does.
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(SEED);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

impl<K: Ord + Copy + Hash + std::fmt::Debug, V> PageCache<K, V> {
    /// What an entry takes besides the heap its value owns: its slab slot
    /// (key, value, links, flags), the hash index's key and position and
    /// control byte, and the ordered set's key, counted twice for the
    /// B-tree's half-full nodes and their links.
    pub const ENTRY_BYTES: usize =
        std::mem::size_of::<Option<Slot<K, V>>>() + std::mem::size_of::<(K, u32)>() + 1 + 2 * std::mem::size_of::<K>();

    pub fn new(capacity_bytes: usize) -> PageCache<K, V> {
        assert!(capacity_bytes > 0, "a cache needs room for something");
        PageCache {
            capacity_bytes,
            used_bytes: 0,
            slots: Vec::new(),
            free: Vec::new(),
            index: HashMap::default(),
            ordered: None,
            oldest: NONE,
            newest: NONE,
            dirty_entries: 0,
            dirty_changes: 0,
        }
    }

    /// A cache that also keeps its keys in order, for [`PageCache::any_key_in`].
    pub fn new_ordered(capacity_bytes: usize) -> PageCache<K, V> {
        PageCache { ordered: Some(BTreeSet::new()), ..PageCache::new(capacity_bytes) }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Entries with either dirty flag set.
    pub fn dirty_count(&self) -> usize {
        self.dirty_entries
    }

    /// Changes to which entries are dirty, ever (see `dirty_changes`).
    pub fn dirty_changes(&self) -> u64 {
        self.dirty_changes
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn slot(&self, at: u32) -> &Slot<K, V> {
        self.slots[at as usize].as_ref().expect("a listed slot is full")
    }

    fn slot_mut(&mut self, at: u32) -> &mut Slot<K, V> {
        self.slots[at as usize].as_mut().expect("a listed slot is full")
    }

    /// Takes a slot out of the recency list.
    fn unlink(&mut self, at: u32) {
        let (older, newer) = {
            let slot = self.slot(at);
            (slot.older, slot.newer)
        };
        match older {
            NONE => self.oldest = newer,
            older => self.slot_mut(older).newer = newer,
        }
        match newer {
            NONE => self.newest = older,
            newer => self.slot_mut(newer).older = older,
        }
    }

    /// Puts a slot at the recent end of the list.
    fn link_newest(&mut self, at: u32) {
        let previous = self.newest;
        {
            let slot = self.slot_mut(at);
            slot.older = previous;
            slot.newer = NONE;
        }
        match previous {
            NONE => self.oldest = at,
            previous => self.slot_mut(previous).newer = at,
        }
        self.newest = at;
    }

    fn touch(&mut self, at: u32) {
        if self.newest != at {
            self.unlink(at);
            self.link_newest(at);
        }
    }

    /// Looks a page up and makes it the most recent.
    pub fn get(&mut self, key: K) -> Option<&V> {
        let at = *self.index.get(&key)?;
        self.touch(at);
        Some(&self.slot(at).value)
    }

    /// Looks a page up to change it: it becomes the most recent and dirty
    /// both ways.
    pub fn get_mut(&mut self, key: K) -> Option<&mut V> {
        let at = *self.index.get(&key)?;
        self.touch(at);
        let slot = self.slots[at as usize].as_mut().expect("an indexed slot is full");
        // Changed in place, a dirty node's record may grow.
        self.dirty_changes += 1;
        if !slot.dirty.any() {
            self.dirty_entries += 1;
        }
        slot.dirty = Dirty::BOTH;
        Some(&mut slot.value)
    }

    fn find(&self, key: K) -> Option<&Slot<K, V>> {
        self.index.get(&key).map(|&at| self.slot(at))
    }

    /// Looks a page up without changing the recency order.
    pub fn peek(&self, key: K) -> Option<&V> {
        self.find(key).map(|slot| &slot.value)
    }

    /// Whether a page is cached, without changing the recency order.
    pub fn contains(&self, key: K) -> bool {
        self.index.contains_key(&key)
    }

    pub fn dirty(&self, key: K) -> Option<Dirty> {
        self.find(key).map(|slot| slot.dirty)
    }

    /// Caches a page of `bytes` bytes (replacing any cached copy, whose
    /// dirty flags carry over) and returns the dirty pages pushed out to make
    /// room, least recent first. Clean pages pushed out are dropped: their
    /// home copy is current.
    pub fn insert(&mut self, key: K, value: V, bytes: usize, dirty: Dirty) -> Vec<Evicted<K, V>> {
        assert!(bytes <= self.capacity_bytes, "a {bytes}-byte page cannot fit a {}-byte cache", self.capacity_bytes);
        let mut dirty = dirty;
        if let Some(old) = self.remove_slot(key) {
            dirty.persistence |= old.dirty.persistence;
            dirty.checkpoint |= old.dirty.checkpoint;
        }
        let evicted = self.make_room(bytes);
        if dirty.any() {
            self.dirty_entries += 1;
            self.dirty_changes += 1;
        }
        let slot = Slot { key, value, bytes, dirty, older: NONE, newer: NONE };
        let at = match self.free.pop() {
            Some(at) => {
                self.slots[at as usize] = Some(slot);
                at
            }
            None => {
                assert!(self.slots.len() < NONE as usize, "a cache of 2^32 pages");
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        self.link_newest(at);
        self.index.insert(key, at);
        if let Some(ordered) = &mut self.ordered {
            ordered.insert(key);
        }
        self.used_bytes += bytes;
        debug_assert!(self.used_bytes <= self.capacity_bytes);
        evicted
    }

    /// Pushes out the least recent pages until `more_bytes` fit under the
    /// bound; returns the dirty ones, least recent first.
    fn make_room(&mut self, more_bytes: usize) -> Vec<Evicted<K, V>> {
        let mut evicted = Vec::new();
        while self.used_bytes + more_bytes > self.capacity_bytes {
            assert_ne!(self.oldest, NONE, "over the bound means something is cached");
            let victim = self.slot(self.oldest).key;
            let slot = self.remove_slot(victim).expect("the oldest slot is indexed");
            if slot.dirty.any() {
                evicted.push(Evicted { key: victim, value: slot.value, dirty: slot.dirty });
            }
        }
        evicted
    }

    /// Charges a cached page `bytes` from now on (what it holds changed
    /// size in place), pushing out the least recent others if it no longer
    /// fits; returns the dirty ones, least recent first. The page itself
    /// stays, and becomes the most recent.
    pub fn recharge(&mut self, key: K, bytes: usize) -> Vec<Evicted<K, V>> {
        assert!(bytes <= self.capacity_bytes, "a {bytes}-byte page cannot fit a {}-byte cache", self.capacity_bytes);
        let Some(&at) = self.index.get(&key) else { return Vec::new() };
        self.touch(at);
        if self.slot(at).bytes == bytes {
            // Every modify of a page-sized node lands here.
            return Vec::new();
        }
        // Charged nothing while room is made: the page is the most recent,
        // so it would go last, and only were nothing else left, which the
        // bound rules out; even then the count could not go below zero.
        let slot = self.slot_mut(at);
        let was = std::mem::replace(&mut slot.bytes, 0);
        self.used_bytes -= was;
        let evicted = self.make_room(bytes);
        let at = *self.index.get(&key).expect("a recharged page stays cached");
        self.slot_mut(at).bytes = bytes;
        self.used_bytes += bytes;
        debug_assert!(self.used_bytes <= self.capacity_bytes);
        evicted
    }

    fn remove_slot(&mut self, key: K) -> Option<Slot<K, V>> {
        let at = self.index.remove(&key)?;
        self.unlink(at);
        let slot = self.slots[at as usize].take().expect("an indexed slot is full");
        self.free.push(at);
        if let Some(ordered) = &mut self.ordered {
            ordered.remove(&key);
        }
        self.used_bytes -= slot.bytes;
        if slot.dirty.any() {
            self.dirty_entries -= 1;
            self.dirty_changes += 1;
        }
        Some(slot)
    }

    /// Lets the least recent page go and returns it, if it is clean (a
    /// dirty one stays, for its write-back): what the next insert would
    /// drop, taken early, so that its buffer can be reused.
    pub fn pop_oldest_clean(&mut self) -> Option<(K, V)> {
        if self.oldest == NONE || self.slot(self.oldest).dirty.any() {
            return None;
        }
        let key = self.slot(self.oldest).key;
        self.remove_slot(key).map(|slot| (key, slot.value))
    }

    /// Takes a page out (deleted, say), returning it with its flags.
    pub fn remove(&mut self, key: K) -> Option<(V, Dirty)> {
        self.remove_slot(key).map(|slot| (slot.value, slot.dirty))
    }

    /// Clears a dirty flag once what it stands for is durable.
    pub fn clear_dirty(&mut self, key: K, cleared: Dirty) {
        if let Some(&at) = self.index.get(&key) {
            let slot = self.slots[at as usize].as_mut().expect("an indexed slot is full");
            let was = slot.dirty.any();
            slot.dirty.persistence &= !cleared.persistence;
            slot.dirty.checkpoint &= !cleared.checkpoint;
            if was && !slot.dirty.any() {
                self.dirty_entries -= 1;
                self.dirty_changes += 1;
            }
        }
    }

    /// The keys whose flags `wanted` accepts, in key order.
    fn keys_where(&self, wanted: impl Fn(Dirty) -> bool) -> Vec<K> {
        let mut keys: Vec<K> =
            self.slots.iter().flatten().filter(|slot| wanted(slot.dirty)).map(|slot| slot.key).collect();
        keys.sort_unstable();
        keys
    }

    /// Takes every dirty page out, in key order.
    pub fn take_dirty(&mut self) -> Vec<(K, V)> {
        let keys = self.keys_where(Dirty::any);
        keys.into_iter().map(|key| (key, self.remove_slot(key).expect("listed").value)).collect()
    }

    /// Takes out up to `count` dirty pages that `wanted` accepts, least
    /// recently used first.
    pub fn take_dirty_where(&mut self, count: usize, wanted: impl Fn(&K, &V) -> bool) -> Vec<(K, V)> {
        let mut keys = Vec::new();
        let mut at = self.oldest;
        while at != NONE && keys.len() < count {
            let slot = self.slot(at);
            if slot.dirty.any() && wanted(&slot.key, &slot.value) {
                keys.push(slot.key);
            }
            at = slot.newer;
        }
        keys.into_iter().map(|key| (key, self.remove_slot(key).expect("listed").value)).collect()
    }

    /// Whether any key in `range`, whatever its flags, satisfies `wanted`,
    /// asked in key order. Only a cache made with [`PageCache::new_ordered`]
    /// answers.
    pub fn any_key_in(&self, range: impl std::ops::RangeBounds<K>, wanted: impl FnMut(&K) -> bool) -> bool {
        let ordered = self.ordered.as_ref().expect("any_key_in needs a cache made with new_ordered");
        ordered.range(range).any(wanted)
    }

    /// The greatest key in `range`, whatever its flags. Only a cache made
    /// with [`PageCache::new_ordered`] answers.
    pub fn last_key_in(&self, range: impl std::ops::RangeBounds<K>) -> Option<&K> {
        let ordered = self.ordered.as_ref().expect("last_key_in needs a cache made with new_ordered");
        ordered.range(range).next_back()
    }

    /// Sets both dirty flags of a cached page without touching its value.
    pub fn mark_dirty(&mut self, key: K) {
        if let Some(&at) = self.index.get(&key) {
            let slot = self.slots[at as usize].as_mut().expect("an indexed slot is full");
            if !slot.dirty.any() {
                self.dirty_entries += 1;
                self.dirty_changes += 1;
            }
            slot.dirty = Dirty::BOTH;
        }
    }

    /// Keys of the pages with the given flag set, in key order.
    pub fn dirty_keys(&self, flag: Dirty) -> Vec<K> {
        self.keys_where(|dirty| (flag.persistence && dirty.persistence) || (flag.checkpoint && dirty.checkpoint))
    }
}
