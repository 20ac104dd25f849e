//! The volatile tree's page cache: metadata pages fetched on demand and kept
//! under a byte bound, least recently used first out. Each page carries the
//! two dirty flags of ReconFS: *persistence-dirty* (its change needs a log
//! record before the next fsync returns) and *checkpoint-dirty* (its home
//! copy on flash is stale until the next checkpoint writes it). A dirty page
//! pushed out by the bound is handed back to the caller, which writes it
//! home (write-back on eviction); the cache itself does no I/O, so it can
//! never lose a dirty page silently.

use std::collections::BTreeMap;

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

struct Entry<V> {
    value: V,
    bytes: usize,
    dirty: Dirty,
    /// Position in the recency order (higher = more recent).
    tick: u64,
}

/// A byte-bounded LRU cache of metadata pages. Keys order iteration, so
/// what it hands out (dirty lists, victims) is deterministic.
pub struct PageCache<K: Ord + Copy, V> {
    capacity_bytes: usize,
    used_bytes: usize,
    entries: BTreeMap<K, Entry<V>>,
    recency: BTreeMap<u64, K>,
    tick: u64,
    /// Entries with either dirty flag set.
    dirty_entries: usize,
}

impl<K: Ord + Copy + std::fmt::Debug, V> PageCache<K, V> {
    pub fn new(capacity_bytes: usize) -> PageCache<K, V> {
        assert!(capacity_bytes > 0, "a cache needs room for something");
        PageCache {
            capacity_bytes,
            used_bytes: 0,
            entries: BTreeMap::new(),
            recency: BTreeMap::new(),
            tick: 0,
            dirty_entries: 0,
        }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries with either dirty flag set.
    pub fn dirty_count(&self) -> usize {
        self.dirty_entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn touch(&mut self, key: K) {
        self.tick += 1;
        let entry = self.entries.get_mut(&key).expect("touched entry exists");
        self.recency.remove(&entry.tick);
        entry.tick = self.tick;
        self.recency.insert(self.tick, key);
    }

    /// Looks a page up and makes it the most recent.
    pub fn get(&mut self, key: K) -> Option<&V> {
        if !self.entries.contains_key(&key) {
            return None;
        }
        self.touch(key);
        self.entries.get(&key).map(|entry| &entry.value)
    }

    /// Looks a page up to change it: it becomes the most recent and dirty
    /// both ways.
    pub fn get_mut(&mut self, key: K) -> Option<&mut V> {
        if !self.entries.contains_key(&key) {
            return None;
        }
        self.touch(key);
        let entry = self.entries.get_mut(&key).expect("present");
        if !entry.dirty.any() {
            self.dirty_entries += 1;
        }
        entry.dirty = Dirty::BOTH;
        Some(&mut entry.value)
    }

    /// Looks a page up without changing the recency order.
    pub fn peek(&self, key: K) -> Option<&V> {
        self.entries.get(&key).map(|entry| &entry.value)
    }

    /// Whether a page is cached, without changing the recency order.
    pub fn contains(&self, key: K) -> bool {
        self.entries.contains_key(&key)
    }

    pub fn dirty(&self, key: K) -> Option<Dirty> {
        self.entries.get(&key).map(|entry| entry.dirty)
    }

    /// Caches a page of `bytes` bytes (replacing any cached copy, whose
    /// dirty flags carry over) and returns the dirty pages pushed out to make
    /// room, least recent first. Clean pages pushed out are dropped: their
    /// home copy is current.
    pub fn insert(&mut self, key: K, value: V, bytes: usize, dirty: Dirty) -> Vec<Evicted<K, V>> {
        assert!(bytes <= self.capacity_bytes, "a {bytes}-byte page cannot fit a {}-byte cache", self.capacity_bytes);
        let mut dirty = dirty;
        if let Some(old) = self.remove_entry(key) {
            dirty.persistence |= old.dirty.persistence;
            dirty.checkpoint |= old.dirty.checkpoint;
        }
        let mut evicted = Vec::new();
        while self.used_bytes + bytes > self.capacity_bytes {
            let (_, victim) = self.recency.pop_first().expect("over the bound means something is cached");
            let entry = self.entries.remove(&victim).expect("recency and entries agree");
            self.used_bytes -= entry.bytes;
            if entry.dirty.any() {
                self.dirty_entries -= 1;
                evicted.push(Evicted { key: victim, value: entry.value, dirty: entry.dirty });
            }
        }
        self.tick += 1;
        if dirty.any() {
            self.dirty_entries += 1;
        }
        self.entries.insert(key, Entry { value, bytes, dirty, tick: self.tick });
        self.recency.insert(self.tick, key);
        self.used_bytes += bytes;
        debug_assert!(self.used_bytes <= self.capacity_bytes);
        evicted
    }

    fn remove_entry(&mut self, key: K) -> Option<Entry<V>> {
        let entry = self.entries.remove(&key)?;
        self.recency.remove(&entry.tick);
        self.used_bytes -= entry.bytes;
        if entry.dirty.any() {
            self.dirty_entries -= 1;
        }
        Some(entry)
    }

    /// Takes a page out (deleted, say), returning it with its flags.
    pub fn remove(&mut self, key: K) -> Option<(V, Dirty)> {
        self.remove_entry(key).map(|entry| (entry.value, entry.dirty))
    }

    /// Clears a dirty flag once what it stands for is durable.
    pub fn clear_dirty(&mut self, key: K, cleared: Dirty) {
        if let Some(entry) = self.entries.get_mut(&key) {
            let was = entry.dirty.any();
            entry.dirty.persistence &= !cleared.persistence;
            entry.dirty.checkpoint &= !cleared.checkpoint;
            if was && !entry.dirty.any() {
                self.dirty_entries -= 1;
            }
        }
    }

    /// Takes every dirty page out, in key order.
    pub fn take_dirty(&mut self) -> Vec<(K, V)> {
        let keys: Vec<K> = self.entries.iter().filter(|(_, entry)| entry.dirty.any()).map(|(key, _)| *key).collect();
        keys.into_iter().map(|key| (key, self.remove_entry(key).expect("listed").value)).collect()
    }

    /// Takes out up to `count` dirty pages that `wanted` accepts, least
    /// recently used first.
    pub fn take_dirty_where(&mut self, count: usize, wanted: impl Fn(&K, &V) -> bool) -> Vec<(K, V)> {
        let keys: Vec<K> = self
            .recency
            .values()
            .filter(|key| {
                let entry = &self.entries[*key];
                entry.dirty.any() && wanted(key, &entry.value)
            })
            .take(count)
            .copied()
            .collect();
        keys.into_iter().map(|key| (key, self.remove_entry(key).expect("listed").value)).collect()
    }

    /// Keys in `range`, in key order, whatever their flags.
    pub fn keys_in(&self, range: impl std::ops::RangeBounds<K>) -> Vec<K> {
        self.entries.range(range).map(|(key, _)| *key).collect()
    }

    /// Sets both dirty flags of a cached page without touching its value.
    pub fn mark_dirty(&mut self, key: K) {
        if let Some(entry) = self.entries.get_mut(&key) {
            if !entry.dirty.any() {
                self.dirty_entries += 1;
            }
            entry.dirty = Dirty::BOTH;
        }
    }

    /// Keys of the pages with the given flag set, in key order.
    pub fn dirty_keys(&self, flag: Dirty) -> Vec<K> {
        self.entries
            .iter()
            .filter(|(_, entry)| {
                (flag.persistence && entry.dirty.persistence) || (flag.checkpoint && entry.dirty.checkpoint)
            })
            .map(|(key, _)| *key)
            .collect()
    }
}
