//! Checkpoints of the whole file system: buffered data first, then every
//! dirty node, children before what points at them (index pages by level,
//! then file inodes, then the nodes found by slot, then the map pages,
//! then the map directory pages), then the checkpoint record with the
//! map's roots. The record is
//! programmed only after everything it refers to was flushed.

use flintfs_flash::FlashDevice;
use flintfs_format::{Pointer, TreeRoots};

use super::nodes::NodeKey;
use super::Fs;
use crate::error::Result;

impl<D: FlashDevice> Fs<D> {
    /// Makes everything durable with a checkpoint. Skipped when nothing
    /// changed since the last one.
    pub fn checkpoint(&mut self) -> Result<()> {
        if !self.changed
            && self.dirty_blocks.is_empty()
            && self.pending.is_empty()
            && self.nodes.dirty_count() == 0
            && self.parked.as_ref().is_none_or(|parked| parked.is_empty())
        {
            return Ok(());
        }
        let allowed = std::mem::replace(&mut self.volume.reserve_allowed, true);
        // Everything goes home to flash: nothing is parked in NVM meanwhile.
        let paused = std::mem::replace(&mut self.parking_paused, true);
        let result = self.checkpoint_now();
        self.parking_paused = paused;
        self.volume.reserve_allowed = allowed;
        result
    }

    fn checkpoint_now(&mut self) -> Result<()> {
        self.flush_data(None)?;
        self.drain()?;
        // Every dirty node goes through the same ordered write-back as an
        // eviction; write-backs dirty their parents, so until none is left.
        loop {
            while self.nodes.dirty_count() > 0 || !self.pending.is_empty() {
                for (key, cached) in self.nodes.take_dirty() {
                    self.pending.insert(key, cached);
                }
                self.drain()?;
            }
            // The nodes parked in NVM, a batch at a time, children first
            // (writing one dirties what points at it, which comes later).
            let keys = self
                .parked
                .as_ref()
                .map(|parked| parked.first_keys(super::nvm::NVM_UNPARK_BATCH_NODES))
                .unwrap_or_default();
            if keys.is_empty() {
                break;
            }
            for key in keys {
                self.unpark(key)?;
            }
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
            orphans: self
                .known
                .iter()
                .filter(|(_, known)| known.orphan)
                .map(|(&ino, _)| ino)
                .take(flintfs_format::orphans_max(self.page_size))
                .collect(),
        };
        self.volume.write_checkpoint()?;
        self.log_truncated();
        self.counters.checkpoints += 1;
        self.mark_checkpointed();
        self.scanned_victims_checkpointed();
        self.prune_known();
        Ok(())
    }

    /// Forgets files nobody holds and nothing in memory needs.
    pub(crate) fn prune_known(&mut self) {
        let candidates: Vec<u64> =
            self.known.iter().filter(|(_, known)| known.lookups == 0 && !known.orphan).map(|(&ino, _)| ino).collect();
        for ino in candidates {
            if !self.file_has_state(ino) {
                self.known.remove(&ino);
            }
        }
    }

    /// Whether a file has anything in memory that is not on flash.
    pub(crate) fn file_has_state(&self, ino: u64) -> bool {
        if self.dirty_blocks.range((ino, 0)..=(ino, u64::MAX)).next().is_some() {
            return true;
        }
        let parked = |key: NodeKey| self.parked.as_ref().is_some_and(|parked| parked.contains(key));
        let dirty = |key: NodeKey| {
            self.pending.contains_key(&key) || self.nodes.dirty(key).is_some_and(|d| d.any()) || parked(key)
        };
        if dirty(NodeKey::File(ino)) {
            return true;
        }
        if let Some(super::Known { location: super::Location::Slot(slot), .. }) = self.known.get(&ino) {
            if dirty(NodeKey::Slot(*slot)) {
                return true;
            }
        }
        (0..flintfs_format::INDEX_HEIGHT_MAX).any(|level| {
            let range = NodeKey::Index { level, ino, number: 0 }..=NodeKey::Index { level, ino, number: u64::MAX };
            self.nodes.any_key_in(range.clone(), |&key| dirty(key))
                || self.pending.range(range.clone()).next().is_some()
                || self.parked.as_ref().is_some_and(|parked| parked.any_in(range))
        })
    }
}
