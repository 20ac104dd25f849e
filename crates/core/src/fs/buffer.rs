//! The data buffer: file blocks written and not yet programmed, by
//! `(ino, block)`, whole blocks each.
//!
//! Beside the blocks it keeps, per file and only when known, how many of
//! the file's buffered blocks its index does not point at yet. `st_blocks`
//! counts those as used (they will be once programmed), and counting them
//! meant walking every buffered block of the file at every stat: for a log
//! being appended (webserver's) that walk was a sixth of the workload.
//!
//! The count is a memo, never the truth: every change that can move it is
//! either applied to it exactly (a new block past the end of the file,
//! where the index points at nothing) or forgets it, and the next stat
//! counts again. Changes that forget it: any other insert or remove here,
//! and any block pointer of the file's index going from null to a page or
//! back ([`DataBuffer::forget_holes`], called by the index). Debug builds
//! check the memo against a fresh count at every stat.

use std::collections::btree_map::{Entry, Range};
use std::collections::{BTreeMap, HashMap};
use std::ops::RangeBounds;

#[derive(Default)]
pub(crate) struct DataBuffer {
    blocks: BTreeMap<(u64, u64), Vec<u8>>,
    /// Per file: how many of its buffered blocks its index does not point
    /// at. Only files with a buffered block have an entry, so it is
    /// bounded by the buffer.
    holes: HashMap<u64, u64>,
}

impl DataBuffer {
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub(crate) fn contains_key(&self, key: &(u64, u64)) -> bool {
        self.blocks.contains_key(key)
    }

    pub(crate) fn get(&self, key: &(u64, u64)) -> Option<&Vec<u8>> {
        self.blocks.get(key)
    }

    /// A buffered block's bytes, to change in place (which keeps the set
    /// of buffered blocks, so the memo stands).
    pub(crate) fn get_mut(&mut self, key: &(u64, u64)) -> Option<&mut Vec<u8>> {
        self.blocks.get_mut(key)
    }

    pub(crate) fn range(&self, range: impl RangeBounds<(u64, u64)>) -> Range<'_, (u64, u64), Vec<u8>> {
        self.blocks.range(range)
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &(u64, u64)> {
        self.blocks.keys()
    }

    /// The blocks buffered for `ino`, ascending.
    pub(crate) fn blocks_of(&self, ino: u64) -> impl Iterator<Item = u64> + '_ {
        self.blocks.range((ino, 0)..=(ino, u64::MAX)).map(|(&(_, block), _)| block)
    }

    /// Buffers a block whose index pointer is not known here: the file's
    /// memo is forgotten.
    pub(crate) fn insert(&mut self, key: (u64, u64), data: Vec<u8>) -> Option<Vec<u8>> {
        self.holes.remove(&key.0);
        self.blocks.insert(key, data)
    }

    /// Buffers a block that was not buffered, whose index pointer the
    /// caller knows to be null (`hole`) or not.
    pub(crate) fn insert_new(&mut self, key: (u64, u64), data: Vec<u8>, hole: bool) {
        let previous = self.blocks.insert(key, data);
        assert!(previous.is_none(), "block {key:?} was already buffered");
        if let Some(holes) = self.holes.get_mut(&key.0) {
            *holes += u64::from(hole);
        }
    }

    /// Writes a whole block: over its buffer if it has one, else as a new
    /// buffer, of a block the index does not point at when `hole`, or
    /// whose pointer is not known when `None`.
    pub(crate) fn write_whole(&mut self, key: (u64, u64), data: &[u8], hole: Option<bool>) {
        match self.blocks.entry(key) {
            Entry::Occupied(mut buffered) => buffered.get_mut().copy_from_slice(data),
            Entry::Vacant(vacant) => {
                vacant.insert(data.to_vec());
                match hole {
                    Some(hole) => {
                        if let Some(holes) = self.holes.get_mut(&key.0) {
                            *holes += u64::from(hole);
                        }
                    }
                    None => {
                        self.holes.remove(&key.0);
                    }
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &(u64, u64)) -> Option<Vec<u8>> {
        self.holes.remove(&key.0);
        self.blocks.remove(key)
    }

    /// The memo for `ino`, if known.
    pub(crate) fn holes(&self, ino: u64) -> Option<u64> {
        self.holes.get(&ino).copied()
    }

    /// Records a fresh count for `ino`; a file with nothing buffered needs
    /// no memo (its count is zero without a walk).
    pub(crate) fn remember_holes(&mut self, ino: u64, holes: u64) {
        if self.blocks_of(ino).next().is_some() {
            self.holes.insert(ino, holes);
        }
    }

    /// The file's index changed whether it points at some block: its memo
    /// no longer stands.
    pub(crate) fn forget_holes(&mut self, ino: u64) {
        self.holes.remove(&ino);
    }
}
