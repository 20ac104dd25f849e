//! Wear levelling of the NVM region (version 11): start-gap.
//!
//! Phase-change memory endures about 1e8 writes a cell, and the structures
//! above (the log ring's head, a slot's header copy and selection word, a
//! directory page's changed sub-block) write some words far more often than
//! others. So the region the engine sees (its *logical* region) is not laid
//! on the physical one fixed: it is cut into 64-byte lines, and one physical
//! line more than there are logical ones is kept free, the *gap*. Every
//! [`NVM_WEAR_WORD_WRITES_PER_MOVE`] word writes the gap moves down by one
//! line (the line below it is copied into it); once it has reached the
//! first line it wraps to the last, and every logical line has then moved
//! up by one. Over a device's life every logical line passes over every
//! physical line, so every physical word ends near the average of the
//! words at its offset in a line, whatever the structures above do
//! (Qureshi et al., "Enhancing Lifetime and Security of PCM-Based Main
//! Memory with Start-Gap Wear Leveling", MICRO 2009).
//!
//! The state is one number: the moves done so far. Each move, once its line
//! is copied and persisted, writes its number into a ring of 8-byte words at
//! the region's start ([`encode_nvm_wear_record`]) and persists it; a mount
//! takes the largest number found. Until that word is written the move
//! counts as undone, its copy in the gap unused; once written, a cut may
//! keep or drop it, and once persisted the move is done. Both outcomes are
//! sound, since the copy was persisted first. The ring has a word per 32
//! lines of the region, so each of its words is written half as often as
//! the region's average word.

/// Bytes of a line: what moves, and the device's cost unit.
pub const NVM_WEAR_LINE_BYTES: u64 = 64;
/// Word writes (8-byte words, each counted once per write that touches
/// it) between two moves of the gap: one line copy and two persists per
/// 512 words written, under 2% more writes. Over a life of 1e8 writes a
/// word, a region of N lines takes 1e8 x 8 N / 512 = 1.6e6 N moves, so
/// every line moves by 1.6 million lines: past every physical line of a 64
/// MiB region (about a million) more than once.
pub const NVM_WEAR_WORD_WRITES_PER_MOVE: u64 = 512;
/// Ring words, at least.
pub const NVM_WEAR_RING_RECORDS_MIN: u64 = 8;
/// Moves a record can name: 48 bits, 2.8e14. A region of N lines takes
/// about 1.6e6 N moves over its life, so any region up to 10 GiB stays
/// under it; once a count reaches it the lines stay where they are.
pub const NVM_WEAR_MOVES_MAX: u64 = (1 << 48) - 1;
const NVM_WEAR_CHECK_SALT: u64 = 0x5741_4552_4C45_5645;

const _: () = assert!(NVM_WEAR_LINE_BYTES.is_multiple_of(8));
const _: () = assert!((NVM_WEAR_RING_RECORDS_MIN * 8).is_multiple_of(NVM_WEAR_LINE_BYTES));
const _: () = assert!(NVM_WEAR_WORD_WRITES_PER_MOVE >= NVM_WEAR_LINE_BYTES / 8);

/// Where the ring and the levelled lines of a region are, and how many
/// logical lines the engine sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmWearLayout {
    /// 8-byte words of the ring, a multiple of 8 (whole lines).
    pub ring_records: u64,
    /// Logical lines: the physical lines after the ring, less the gap.
    pub lines: u64,
}

impl NvmWearLayout {
    /// The layout of a physical region of `nvm_size_bytes`; `None` when,
    /// levelled, it would not hold [`crate::NVM_SIZE_BYTES_MIN`].
    pub fn for_region(nvm_size_bytes: u64) -> Option<NvmWearLayout> {
        let physical_lines = nvm_size_bytes / NVM_WEAR_LINE_BYTES;
        // A ring word per 32 lines: the ring takes moves / R writes a word,
        // the region's average word 512 moves / (8 lines), twice as many.
        let ring_records = (16 * physical_lines).div_ceil(NVM_WEAR_WORD_WRITES_PER_MOVE).max(NVM_WEAR_RING_RECORDS_MIN);
        let ring_records = ring_records.next_multiple_of(NVM_WEAR_LINE_BYTES / 8);
        let ring_lines = ring_records * 8 / NVM_WEAR_LINE_BYTES;
        let levelled = physical_lines.checked_sub(ring_lines)?;
        let layout = NvmWearLayout { ring_records, lines: levelled.checked_sub(1)? };
        // A region whose levelled lines would not hold the log's minimum
        // is used as it is, unlevelled (regions this small are for tests).
        (layout.logical_bytes() >= crate::NVM_SIZE_BYTES_MIN).then_some(layout)
    }

    /// Bytes of the ring at the region's start.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_records * 8
    }

    /// Bytes of the logical region the engine sees.
    pub fn logical_bytes(&self) -> u64 {
        self.lines * NVM_WEAR_LINE_BYTES
    }

    /// The gap's physical line (counted from the ring's end) after `moves`
    /// moves, and how far every logical line has moved up.
    fn gap_and_start(&self, moves: u64) -> (u64, u64) {
        let cycle = self.lines + 1;
        (self.lines - moves % cycle, (moves / cycle) % self.lines)
    }

    /// The physical byte offset of logical line `line` after `moves` moves.
    pub fn physical_line_offset(&self, moves: u64, line: u64) -> u64 {
        self.physical_run(moves, line, 1).0
    }

    /// Where logical line `line` is after `moves` moves, and how many lines
    /// from it on (at most `lines_wanted`) follow it contiguously on the
    /// device: a run ends where the next line would fall past the gap or
    /// wrap to the first line.
    pub fn physical_run(&self, moves: u64, line: u64, lines_wanted: u64) -> (u64, u64) {
        assert!(line < self.lines, "logical line {line} of {}", self.lines);
        let (gap, start) = self.gap_and_start(moves);
        let unshifted = (line + start) % self.lines;
        let (physical, contiguous) =
            if unshifted < gap { (unshifted, gap - unshifted) } else { (unshifted + 1, self.lines - unshifted) };
        (self.ring_bytes() + physical * NVM_WEAR_LINE_BYTES, contiguous.min(lines_wanted).min(self.lines - line))
    }

    /// The physical byte offsets the move after `moves` copies from and
    /// to: the line below the gap into the gap, or, with the gap at the
    /// first line, the last line into it.
    pub fn move_after(&self, moves: u64) -> (u64, u64) {
        let (gap, _) = self.gap_and_start(moves);
        let (from, to) = if gap > 0 { (gap - 1, gap) } else { (self.lines, 0) };
        (self.ring_bytes() + from * NVM_WEAR_LINE_BYTES, self.ring_bytes() + to * NVM_WEAR_LINE_BYTES)
    }

    /// The ring word that records move number `moves` (at least 1).
    pub fn record_offset(&self, moves: u64) -> u64 {
        (moves % self.ring_records) * 8
    }
}

fn check_of(moves: u64) -> u64 {
    crate::nvm::mix64(moves ^ NVM_WEAR_CHECK_SALT) >> 48
}

/// The ring word recording that `moves` moves are done: the number in the
/// low 48 bits, a 16-bit check of it above. Never zero.
pub fn encode_nvm_wear_record(moves: u64) -> u64 {
    assert!((1..=NVM_WEAR_MOVES_MAX).contains(&moves), "wear move {moves}");
    moves | check_of(moves) << 48
}

/// The moves a ring word at ring index `index` records, if it is one: its
/// check matches and it sits where its number puts it. Total over any word.
pub fn decode_nvm_wear_record(word: u64, index: u64, ring_records: u64) -> Option<u64> {
    let moves = word & NVM_WEAR_MOVES_MAX;
    (moves >= 1 && word >> 48 == check_of(moves) && ring_records > 0 && moves % ring_records == index).then_some(moves)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapping_is_a_bijection_and_each_move_copies_the_line_that_moves() {
        for size in [20_480u64, 65_536, 1 << 20] {
            let layout = NvmWearLayout::for_region(size).unwrap();
            assert!(layout.ring_bytes() + (layout.lines + 1) * NVM_WEAR_LINE_BYTES <= size);
            // Through two whole cycles of the gap on a small region, and
            // spot moves on the larger ones.
            let moves_checked = if size == 20_480 { 2 * (layout.lines + 1) + 3 } else { 300 };
            for moves in 0..moves_checked {
                let before: Vec<u64> = (0..layout.lines).map(|line| layout.physical_line_offset(moves, line)).collect();
                let after: Vec<u64> =
                    (0..layout.lines).map(|line| layout.physical_line_offset(moves + 1, line)).collect();
                let mut sorted = before.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len() as u64, layout.lines, "a bijection at {moves} moves");
                let (from, to) = layout.move_after(moves);
                let changed: Vec<usize> = (0..before.len()).filter(|&line| before[line] != after[line]).collect();
                assert_eq!(changed.len(), 1, "one line moves at move {moves}");
                assert_eq!((before[changed[0]], after[changed[0]]), (from, to), "move {moves}");
                assert!(!before.contains(&to) && !after.contains(&from), "the gap at move {moves}");
                for line in (0..layout.lines).step_by(7) {
                    let (at, run) = layout.physical_run(moves, line, u64::MAX);
                    assert!(run >= 1 && line + run <= layout.lines);
                    for step in 0..run {
                        assert_eq!(before[(line + step) as usize], at + step * NVM_WEAR_LINE_BYTES, "move {moves}");
                    }
                    if line + run < layout.lines {
                        assert_ne!(before[(line + run) as usize], at + run * NVM_WEAR_LINE_BYTES, "a run ends short");
                    }
                }
            }
        }
        assert_eq!(NvmWearLayout::for_region(crate::NVM_SIZE_BYTES_MIN), None, "the smallest region is not levelled");
    }

    #[test]
    fn a_record_is_found_only_where_it_belongs_and_noise_is_none() {
        let layout = NvmWearLayout::for_region(1 << 20).unwrap();
        for moves in [1u64, 2, 7, layout.ring_records, 123_456_789, NVM_WEAR_MOVES_MAX] {
            let word = encode_nvm_wear_record(moves);
            assert_ne!(word, 0);
            let index = layout.record_offset(moves) / 8;
            assert_eq!(decode_nvm_wear_record(word, index, layout.ring_records), Some(moves));
            assert_eq!(decode_nvm_wear_record(word, (index + 1) % layout.ring_records, layout.ring_records), None);
            assert_eq!(decode_nvm_wear_record(word ^ 1 << 50, index, layout.ring_records), None);
        }
        assert_eq!(decode_nvm_wear_record(0, 0, layout.ring_records), None);
        assert_eq!(decode_nvm_wear_record(u64::MAX, 0, 0), None);
    }
}
