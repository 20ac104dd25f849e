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
//!
//! It also keeps the buffers of blocks that went to flash, to take again
//! for the next blocks written: the buffer fills to its bound and is
//! flushed whole, and freeing that many blocks gave the top of the heap
//! back to the kernel, so the next fill faulted every page in again
//! (zeroing each): a tenth of webserver's host time. Spare buffers and
//! buffered blocks together stay within the buffer's bound.

use std::collections::btree_map::{Entry, Range};
use std::collections::{BTreeMap, HashMap};
use std::ops::RangeBounds;

pub(crate) struct DataBuffer {
    blocks: BTreeMap<(u64, u64), Vec<u8>>,
    /// Per file: how many of its buffered blocks its index does not point
    /// at. Only files with a buffered block have an entry, so it is
    /// bounded by the buffer.
    holes: HashMap<u64, u64>,
    /// Buffers of blocks gone to flash (or cut away), empty, each with a
    /// block's capacity, for the next blocks written.
    spare: Vec<Vec<u8>>,
    /// Buffered blocks and spare buffers kept together, at most: the
    /// buffer's bound in blocks.
    blocks_max: usize,
    /// Blocks that came in or went out, ever: with the count, says whether
    /// the buffered blocks are the ones a bound was counted for.
    changes: u64,
}

impl DataBuffer {
    /// An empty buffer that keeps spare buffers while it and they hold at
    /// most `blocks_max` blocks.
    pub(crate) fn new(blocks_max: usize) -> DataBuffer {
        DataBuffer { blocks: BTreeMap::new(), holes: HashMap::new(), spare: Vec::new(), blocks_max, changes: 0 }
    }

    /// Spare buffers kept: memory held besides the buffered blocks.
    pub(crate) fn spare_len(&self) -> usize {
        self.spare.len()
    }

    /// Keeps `buffer`, whose block went to flash or was cut away, for the
    /// next block written, while the bound leaves room; frees it otherwise.
    pub(crate) fn recycle(&mut self, mut buffer: Vec<u8>) {
        if self.blocks.len() + self.spare.len() < self.blocks_max {
            buffer.clear();
            self.spare.push(buffer);
        }
    }

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
        let previous = self.blocks.insert(key, data);
        self.changes += u64::from(previous.is_none());
        self.keep_bound();
        previous
    }

    /// Blocks that came in or went out, ever.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Frees spare buffers while spares and blocks together pass the
    /// bound: a block buffered from elsewhere (a partial write's read-back,
    /// a truncate's last block, replay) takes a spare's place.
    fn keep_bound(&mut self) {
        while self.blocks.len() + self.spare.len() > self.blocks_max && self.spare.pop().is_some() {}
    }

    /// Buffers a block that was not buffered, whose index pointer the
    /// caller knows to be null (`hole`) or not.
    pub(crate) fn insert_new(&mut self, key: (u64, u64), data: Vec<u8>, hole: bool) {
        let previous = self.blocks.insert(key, data);
        assert!(previous.is_none(), "block {key:?} was already buffered");
        self.changes += 1;
        self.keep_bound();
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
                vacant.insert(copy_into_spare(&mut self.spare, data));
                self.changes += 1;
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
        let removed = self.blocks.remove(key);
        self.changes += u64::from(removed.is_some());
        removed
    }

    /// Removes a block whose bytes are no longer wanted (cut away or
    /// written over on flash), keeping its buffer as a spare.
    pub(crate) fn discard(&mut self, key: &(u64, u64)) {
        if let Some(buffer) = self.remove(key) {
            self.recycle(buffer);
        }
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

/// A copy of `data` in one of the `spare` buffers, or in a new one.
fn copy_into_spare(spare: &mut Vec<Vec<u8>>, data: &[u8]) -> Vec<u8> {
    match spare.pop() {
        Some(mut buffer) => {
            buffer.extend_from_slice(data);
            buffer
        }
        None => data.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::DataBuffer;

    #[test]
    fn a_recycled_buffer_takes_the_next_block_with_its_bytes_only() {
        let mut buffer = DataBuffer::new(2);
        buffer.write_whole((1, 0), &[7u8; 64], Some(true));
        let old = buffer.remove(&(1, 0)).expect("buffered");
        let old_address = old.as_ptr();
        buffer.recycle(old);
        assert_eq!(buffer.spare_len(), 1);
        buffer.write_whole((2, 5), &[9u8; 48], Some(true));
        let taken = buffer.get(&(2, 5)).expect("buffered");
        assert_eq!(taken.as_ptr(), old_address, "the spare buffer was taken");
        assert!(taken.len() == 48 && taken.iter().all(|&byte| byte == 9), "only the new block's bytes");
        assert_eq!(buffer.spare_len(), 0);
    }

    #[test]
    fn spare_and_buffered_blocks_stay_within_the_bound() {
        let mut buffer = DataBuffer::new(3);
        for block in 0..3 {
            buffer.write_whole((1, block), &[1u8; 16], None);
        }
        // Full: a buffer given back now is freed, not kept.
        buffer.recycle(vec![0u8; 16]);
        assert_eq!(buffer.spare_len(), 0);
        buffer.discard(&(1, 0));
        buffer.discard(&(1, 1));
        assert_eq!((buffer.len(), buffer.spare_len()), (1, 2));
        buffer.recycle(vec![0u8; 16]);
        assert_eq!((buffer.len(), buffer.spare_len()), (1, 2), "the bound is 3 blocks in all");
        buffer.discard(&(1, 2));
        assert_eq!((buffer.len(), buffer.spare_len()), (0, 3));
        // Blocks buffered from elsewhere take the spares' place.
        buffer.insert_new((2, 0), vec![5u8; 16], true);
        buffer.insert((2, 1), vec![6u8; 16]);
        assert_eq!((buffer.len(), buffer.spare_len()), (2, 1), "spares freed to keep the bound");
    }
}
