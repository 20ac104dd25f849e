//! Checkpoints of the whole file system: buffered data first, then every
//! dirty node, children before what points at them (index pages by level,
//! then file inodes, then the nodes found by slot, then the map pages,
//! then the map directory pages), then the checkpoint record with the
//! map's roots. The record is
//! programmed only after everything it refers to was flushed.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;

use flintfs_flash::FlashDevice;
use flintfs_format::{Pointer, TreeRoots};

use super::nodes::NodeKey;
use super::Fs;
use crate::cache::{Dirty, KeyHasher};
use crate::error::Result;

/// A set of the engine's own numbers, with the cache's fixed hash.
type KeySet<T> = HashSet<T, BuildHasherDefault<KeyHasher>>;

impl<D: FlashDevice> Fs<D> {
    /// Makes everything durable with a checkpoint. Skipped when nothing
    /// changed since the last one (but for the flush a checkpoint that only
    /// ordered left owing).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.checkpoint_now_or_skip()?;
        if self.volume.device.unflushed() && !self.options.read_only {
            self.volume.device.flush()?;
        }
        Ok(())
    }

    /// A checkpoint no caller waits on (one an operation takes for room, or
    /// the cleaner's): the same record, in the same order, but its flushes
    /// only order, so on an image the host's syncs run behind it rather
    /// than inside the operation. Durable at the next fsync, sync or
    /// unmount, each of which flushes; a killed process or a crashed host
    /// before then finds the file system as it was at an earlier moment.
    pub(crate) fn checkpoint_ordered(&mut self) -> Result<()> {
        let ordered = std::mem::replace(&mut self.volume.checkpoint_ordered, true);
        let result = self.checkpoint_now_or_skip();
        self.volume.checkpoint_ordered = ordered;
        result
    }

    fn checkpoint_now_or_skip(&mut self) -> Result<()> {
        // Read-only, nothing is written back (`drain` holds it all), so a
        // checkpoint could never finish: `Fs::sync` is what succeeds.
        self.refuse_if_read_only("a checkpoint")?;
        let kept_waiting =
            self.kept.as_ref().is_some_and(|kept| kept.has_uncommitted() || (self.write_home_all && !kept.is_empty()));
        if !self.changed
            && self.dirty_blocks.is_empty()
            && self.pending.is_empty()
            && self.nodes.dirty_count() == 0
            && !kept_waiting
        {
            return Ok(());
        }
        let allowed = std::mem::replace(&mut self.volume.reserve_allowed, true);
        let result = if self.write_home_all { self.write_home() } else { self.checkpoint_now() };
        self.volume.reserve_allowed = allowed;
        result
    }

    /// Writes every node kept in NVM home to flash, then checkpoints: the
    /// flash alone is then the file system. One checkpoint for all of
    /// them, so that a directory page pointing at many of them is written
    /// once, not once per batch.
    fn write_home(&mut self) -> Result<()> {
        let paused = std::mem::replace(&mut self.parking_paused, true);
        let result = self.checkpoint_now();
        self.parking_paused = paused;
        result
    }

    fn checkpoint_now(&mut self) -> Result<()> {
        // The space checks' bound on what this checkpoint writes
        // (`checkpoint_fits`), held to what it does write: a checkpoint that
        // writes more may find no zone on a full device. Not where NVM
        // sends nodes home, which are counted apart: a checkpoint that
        // starts with nodes kept, or sends some home on the way (a node
        // parked in it and sent home dirties a parent it may have written).
        #[cfg(debug_assertions)]
        let bound = self.kept.as_ref().is_none_or(|kept| kept.is_empty()).then(|| {
            let map_pages = super::nodes::map_page_count(self.slot_count, self.page_size);
            (
                self.buffered_node_pages_bound() + map_pages + self.map_directory.len() as u64,
                self.counters.node_pages_written,
                self.counters.nodes_sent_home,
            )
        });
        let result = self.write_checkpoint();
        #[cfg(debug_assertions)]
        if let (Ok(()), Some((bound, before, sent_home))) = (&result, bound) {
            let written = self.counters.node_pages_written - before;
            let sent_home = self.counters.nodes_sent_home > sent_home;
            debug_assert!(
                sent_home || written <= bound,
                "a checkpoint wrote {written} node pages, past its bound of {bound}"
            );
        }
        result
    }

    fn write_checkpoint(&mut self) -> Result<()> {
        // The blocks first: their pointers dirty index pages and inodes,
        // which the drain below writes with the rest (a drain of what was
        // pending before it would write a parent, then its child, then the
        // parent again).
        self.flush_data(None)?;
        let mut cold_sent = false;
        // Every dirty node goes through the same ordered write-back as an
        // eviction, in one drain that takes the parents the write-backs
        // dirty as it goes: each node is written once, after what is below
        // it, as the space checks count (`checkpoint_fits`).
        // With NVM, a node its slots settle may leave a parent dirty after
        // the drain ends: another drain, until none is left.
        loop {
            loop {
                let takes_dirty = std::mem::replace(&mut self.drain_takes_dirty, true);
                let drained = self.drain();
                self.drain_takes_dirty = takes_dirty;
                drained?;
                if self.nodes.dirty_count() == 0 && self.pending.is_empty() {
                    break;
                }
            }
            if self.parking_paused {
                // A write-home: the nodes kept in NVM, a batch at a time,
                // children first (writing one dirties what points at it,
                // which comes later or is dirty in memory already).
                let keys = self
                    .kept
                    .as_ref()
                    .map(|kept| kept.first_keys(super::nvm::NVM_WRITE_HOME_BATCH_NODES))
                    .unwrap_or_default();
                if keys.is_empty() {
                    break;
                }
                let mut taken = 0;
                for key in keys {
                    if let Some(cached) = self.take(key) {
                        self.pending.insert(key, cached);
                        taken += 1;
                    }
                }
                if taken == 0 {
                    // A node that does not read back stays in NVM (`take`):
                    // say so rather than go round again.
                    let left = self.kept.as_ref().map_or(0, |kept| kept.len());
                    return Err(crate::error::Error::corrupt(format!(
                        "{left} node pages kept in NVM could not be written home to flash"
                    )));
                }
                continue;
            }
            // NVM past its high-water mark: its coldest nodes go home to
            // flash, a bounded batch per checkpoint.
            let over = self.kept.as_ref().is_some_and(|kept| kept.over_high_water());
            if !over || cold_sent {
                break;
            }
            cold_sent = true;
            let zone_pages = self.volume.device.geometry().zone_pages();
            let keys = self
                .kept
                .as_ref()
                .map(|kept| kept.coldest_keys(super::nvm::nvm_send_home_batch_nodes(zone_pages), None, |_| false))
                .unwrap_or_default();
            self.send_home(keys);
        }
        // What NVM keeps for this checkpoint is durable before the record
        // that commits it is programmed.
        if let Some(kept) = self.kept.as_mut() {
            kept.persist(&mut self.volume.device)?;
        }
        debug_assert_eq!(self.nodes.dirty_count(), 0, "a checkpoint leaves no dirty node");
        // The root's page, as the map has it now that everything is
        // written: mount reads it to prove the tree is there.
        let root = if self.slot_count > super::ROOT_SLOT {
            self.locate(NodeKey::Slot(super::ROOT_SLOT))?
        } else {
            Pointer::NULL
        };
        self.volume.checkpoint.tree = TreeRoots {
            slot_count: self.slot_count,
            free_slot_head: self.free_slot_head,
            version_next: self.version_next,
            map_directory: self.map_directory.clone(),
            root,
            orphans: self.orphans().into_iter().take(flintfs_format::orphans_max(self.page_size)).collect(),
            nvm_nodes: self.kept.as_ref().map_or(0, |kept| kept.len() as u32),
        };
        self.volume.write_checkpoint()?;
        let number = self.volume.checkpoint.number;
        if let Some(kept) = self.kept.as_mut() {
            kept.committed(number);
        }
        // Every node sent to flash was written; what is left names nodes
        // gone since.
        self.to_flash.clear();
        self.log_truncated();
        // A checkpoint that only ordered leaves a flush owed: the next
        // fsync commits (and flushes) even with no record of its own.
        self.log.unflushed = self.volume.device.unflushed();
        self.counters.checkpoints += 1;
        self.checkpoint_just_taken = true;
        self.mark_checkpointed();
        self.scanned_victims_checkpointed();
        self.prune_known();
        Ok(())
    }

    /// Forgets files nobody holds and nothing in memory needs (after a
    /// checkpoint: all of them, the batch of files let go included).
    pub(crate) fn prune_known(&mut self) {
        let candidates: Vec<u64> =
            self.known.iter().filter(|(_, known)| known.lookups == 0 && !known.orphan).map(|(&ino, _)| ino).collect();
        self.forgotten.clear();
        self.drop_without_state(candidates);
    }

    /// Forgets the files let go since the last prune that nobody holds
    /// again and that have nothing in memory.
    pub(crate) fn prune_forgotten(&mut self) {
        let forgotten = std::mem::take(&mut self.forgotten);
        self.drop_without_state(forgotten);
    }

    /// Drops from `known` each of `candidates` that nobody holds, is no
    /// orphan and has nothing in memory, as [`Fs::file_has_state`] would
    /// tell for each, from one pass over the dirty blocks, the pending
    /// nodes and the dirty cached ones. In any order: each is dropped or
    /// kept on its own, and nothing is programmed.
    fn drop_without_state(&mut self, candidates: Vec<u64>) {
        if candidates.is_empty() {
            return;
        }
        let mut files: KeySet<u64> = self.dirty_blocks.keys().map(|&(ino, _)| ino).collect();
        let mut slots: KeySet<u32> = KeySet::default();
        let mut note = |key: &NodeKey| match *key {
            NodeKey::File(ino) | NodeKey::Index { ino, .. } => {
                files.insert(ino);
            }
            NodeKey::Slot(slot) => {
                slots.insert(slot);
            }
            NodeKey::Map(_) | NodeKey::MapDirectory(_) => {}
        };
        self.pending.keys().for_each(&mut note);
        self.nodes.dirty_keys(Dirty::BOTH).iter().for_each(&mut note);
        for ino in candidates {
            let Some(known) = self.known.get(&ino) else { continue };
            let slot_dirty = matches!(known.location, super::Location::Slot(slot) if slots.contains(&slot));
            if known.lookups == 0 && !known.orphan && !files.contains(&ino) && !slot_dirty {
                debug_assert!(!self.file_has_state(ino), "inode {ino} let go with state in memory");
                self.known.remove(&ino);
            }
        }
    }

    /// Whether a file has anything in memory that is not on flash.
    pub(crate) fn file_has_state(&self, ino: u64) -> bool {
        if self.dirty_blocks.range((ino, 0)..=(ino, u64::MAX)).next().is_some() {
            return true;
        }
        let dirty = |key: NodeKey| self.pending.contains_key(&key) || self.nodes.dirty(key).is_some_and(|d| d.any());
        if dirty(NodeKey::File(ino)) {
            return true;
        }
        if let Some(super::Known { location: super::Location::Slot(slot), .. }) = self.known.get(&ino) {
            if dirty(NodeKey::Slot(*slot)) {
                return true;
            }
        }
        // Index keys sort first, by level: the last one below the files'
        // keys names the highest level anything is cached or pending at,
        // and no level above it needs a look (forget asks this for every
        // file and directory it lets go, and eight levels of two range
        // lookups each were 15% of webserver's host time in process).
        let index_level = |key: Option<&NodeKey>| match key {
            Some(NodeKey::Index { level, .. }) => Some(*level),
            _ => None,
        };
        let files = ..NodeKey::File(0);
        let top = index_level(self.nodes.last_key_in(files))
            .max(index_level(self.pending.range(files).next_back().map(|(key, _)| key)));
        let Some(top) = top else { return false };
        debug_assert!(top < flintfs_format::INDEX_HEIGHT_MAX);
        (0..=top).any(|level| {
            let range = NodeKey::Index { level, ino, number: 0 }..=NodeKey::Index { level, ino, number: u64::MAX };
            self.nodes.any_key_in(range.clone(), |&key| dirty(key)) || self.pending.range(range).next().is_some()
        })
    }
}
