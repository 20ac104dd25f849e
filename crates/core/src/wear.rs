//! Start-gap wear levelling of the NVM region, under every NVM structure
//! (`flintfs_format::NvmWearLayout` has the scheme and its arithmetic).
//!
//! The engine's structures rotate their own hot words where they can (the
//! log ring's start moves with the epoch, a node moves to another slot
//! after a few writes, stripe records go round their area), but some words
//! stay hotter than the rest: a slot's header copy and selection word take
//! every write of the slot, while its sub-blocks take only the ones that
//! change them, and the slots of one size take most writes. This layer
//! moves every line of the region over every physical line in the course
//! of the device's life, so no physical word stays under a hot logical
//! one.
//!
//! Persist ordering holds for the engine: a move copies a line's current
//! bytes into the gap and persists them before the ring word that makes
//! the move count, so after a cut the line reads either from its old place
//! (the move not counted: what was persisted there) or from the new one
//! (what the line held when it moved, which includes every persisted
//! word). So after a cut a word reads as its last persisted value or as
//! any value written to it since, as on memory behind a write-back cache;
//! without moves the emulator gives only the last persisted or the last
//! written. The engine never relies on a write being lost
//! (`docs/SEMANTICS.md`, "Persist ordering in NVM", rule 8).

use flintfs_flash::{DeviceError, FlashDevice, Result};
use flintfs_format::{
    decode_nvm_wear_record, encode_nvm_wear_record, NvmWearLayout, NVM_WEAR_LINE_BYTES, NVM_WEAR_MOVES_MAX,
    NVM_WEAR_WORD_WRITES_PER_MOVE,
};

/// Ring words read at a time when the ring is scanned.
const RING_READ_WORDS: usize = 4096;

/// The levelling's state for one device.
#[derive(Debug)]
pub(crate) struct NvmWear {
    /// `None` when the device has no NVM region or one too small to level:
    /// the engine then sees the physical region as it is.
    layout: Option<NvmWearLayout>,
    /// Moves done, read from the ring at the first NVM access.
    moves: Option<u64>,
    /// Word writes since the last move (each 8-byte word a write touches).
    writes_since_move: u64,
    /// Moves made since this layer was opened (a counter for reports).
    moves_made: u64,
    /// Why the layer is out of use: a move failed part way, so the moves
    /// in memory and on NVM may differ and no line may be trusted.
    failed: Option<String>,
}

impl NvmWear {
    pub fn new(physical_bytes: u64) -> NvmWear {
        NvmWear {
            layout: NvmWearLayout::for_region(physical_bytes),
            moves: None,
            writes_since_move: 0,
            moves_made: 0,
            failed: None,
        }
    }

    /// Bytes of NVM the engine sees in a physical region of
    /// `physical_bytes`.
    pub fn logical_bytes(&self, physical_bytes: u64) -> u64 {
        self.layout.map_or(physical_bytes, |layout| layout.logical_bytes())
    }

    /// Gap moves made since the layer was opened.
    pub fn moves_made(&self) -> u64 {
        self.moves_made
    }

    /// Moves done on this region, reading the ring the first time: the
    /// largest move number a ring word records where it belongs; 0 for a
    /// blank ring.
    fn moves<D: FlashDevice>(&mut self, device: &mut D, layout: NvmWearLayout) -> Result<u64> {
        if let Some(why) = &self.failed {
            return Err(DeviceError::Image {
                path: "NVM region".into(),
                reason: format!("wear levelling is out of use: {why}"),
            });
        }
        if let Some(moves) = self.moves {
            return Ok(moves);
        }
        let mut newest = 0;
        let mut bytes = vec![0u8; RING_READ_WORDS * 8];
        let mut index = 0;
        while index < layout.ring_records {
            let words = (layout.ring_records - index).min(RING_READ_WORDS as u64) as usize;
            device.nvm_read(index * 8, &mut bytes[..words * 8])?;
            for (offset, word) in bytes[..words * 8].chunks_exact(8).enumerate() {
                let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                if let Some(moves) = decode_nvm_wear_record(word, index + offset as u64, layout.ring_records) {
                    newest = newest.max(moves);
                }
            }
            index += words as u64;
        }
        if newest >= NVM_WEAR_MOVES_MAX {
            tracing::warn!(
                "the NVM wear ring records the last move a record can name: the lines stay where they are from \
                 now on (a region written past its life, or a damaged ring)"
            );
        }
        // Where this layer starts counting toward the next move, from the
        // moves done: a deterministic phase that differs from one opening
        // to the next, so a device opened often for a few writes each time
        // still moves its gap, at the same rate on average.
        self.writes_since_move = newest.wrapping_mul(0x9E37_79B9_7F4A_7C15) % NVM_WEAR_WORD_WRITES_PER_MOVE;
        self.moves = Some(newest);
        Ok(newest)
    }

    /// Calls `visit(physical offset, buffer start, length)` for each run of
    /// the logical range `[offset, offset + length)` that is contiguous on
    /// the device, in order (a run at a time, not a line at a time).
    fn for_each_run<D: FlashDevice>(
        &mut self,
        device: &mut D,
        offset: u64,
        length: u64,
        mut visit: impl FnMut(&mut D, u64, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let Some(layout) = self.layout else { return visit(device, offset, 0, length as usize) };
        let logical_bytes = layout.logical_bytes();
        if offset.checked_add(length).is_none_or(|end| end > logical_bytes) {
            return Err(DeviceError::OutOfRange {
                what: format!("NVM bytes {offset}..+{length}"),
                limit: format!("the levelled region has {logical_bytes} bytes"),
            });
        }
        if length == 0 {
            return visit(device, offset, 0, 0);
        }
        let moves = self.moves(device, layout)?;
        let mut done = 0u64;
        while done < length {
            let at = offset + done;
            let line = at / NVM_WEAR_LINE_BYTES;
            let within = at % NVM_WEAR_LINE_BYTES;
            let lines_wanted = (within + length - done).div_ceil(NVM_WEAR_LINE_BYTES);
            let (physical, lines) = layout.physical_run(moves, line, lines_wanted);
            let chunk = (lines * NVM_WEAR_LINE_BYTES - within).min(length - done);
            visit(device, physical + within, done as usize, chunk as usize)?;
            done += chunk;
        }
        Ok(())
    }

    pub fn read<D: FlashDevice>(&mut self, device: &mut D, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.for_each_run(device, offset, buffer.len() as u64, |device, physical, start, length| {
            device.nvm_read(physical, &mut buffer[start..start + length])
        })
    }

    /// Writes `data`, then moves the gap if enough words were written
    /// since the last move.
    pub fn write<D: FlashDevice>(&mut self, device: &mut D, offset: u64, data: &[u8]) -> Result<()> {
        self.for_each_run(device, offset, data.len() as u64, |device, physical, start, length| {
            device.nvm_write(physical, &data[start..start + length])
        })?;
        let Some(layout) = self.layout else { return Ok(()) };
        if !data.is_empty() {
            let first = offset / 8;
            let end = (offset + data.len() as u64).div_ceil(8);
            self.writes_since_move += end - first;
        }
        while self.writes_since_move >= NVM_WEAR_WORD_WRITES_PER_MOVE {
            self.writes_since_move -= NVM_WEAR_WORD_WRITES_PER_MOVE;
            if let Err(error) = self.move_gap(device, layout) {
                self.failed.get_or_insert_with(|| format!("a move of the gap failed: {error}"));
                return Err(error);
            }
        }
        Ok(())
    }

    pub fn persist<D: FlashDevice>(&mut self, device: &mut D, offset: u64, length: u64) -> Result<()> {
        self.for_each_run(device, offset, length, |device, physical, _, length| {
            device.nvm_persist(physical, length as u64)
        })
    }

    /// One move: the line below the gap (or the last, with the gap at the
    /// first line) is copied into the gap and persisted, then the ring
    /// word of the move is written and persisted.
    fn move_gap<D: FlashDevice>(&mut self, device: &mut D, layout: NvmWearLayout) -> Result<()> {
        let moves = self.moves(device, layout)?;
        if moves >= NVM_WEAR_MOVES_MAX {
            // Past any device's life (`NVM_WEAR_MOVES_MAX`): the lines stay.
            return Ok(());
        }
        let (from, to) = layout.move_after(moves);
        let mut line = [0u8; NVM_WEAR_LINE_BYTES as usize];
        device.nvm_read(from, &mut line)?;
        device.nvm_write(to, &line)?;
        device.nvm_persist(to, NVM_WEAR_LINE_BYTES)?;
        let next = moves + 1;
        let record = layout.record_offset(next);
        let word = encode_nvm_wear_record(next);
        // The word a mount will take for this move, where it goes.
        debug_assert_eq!(decode_nvm_wear_record(word, record / 8, layout.ring_records), Some(next));
        device.nvm_write(record, &word.to_le_bytes())?;
        device.nvm_persist(record, 8)?;
        self.moves = Some(next);
        self.moves_made += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flintfs_flash::{DeviceOptions, Geometry, MemoryFlash};

    fn device(nvm_size_bytes: u64) -> MemoryFlash {
        let geometry = Geometry {
            page_size_bytes: 4096,
            oob_size_bytes: 128,
            block_pages: 4,
            zone_blocks: 2,
            zone_count: 4,
            open_zones_max: 4,
            nvm_size_bytes,
        };
        MemoryFlash::memory(geometry, DeviceOptions::default()).unwrap()
    }

    /// Logical contents survive any number of moves, through reopening
    /// (the ring read again), and one hot logical word's writes spread
    /// over many physical words.
    #[test]
    fn contents_survive_moves_and_a_hot_word_spreads() {
        let size = 64 << 10;
        let mut flash = device(size);
        let mut wear = NvmWear::new(size);
        let logical = wear.logical_bytes(size);
        let pattern: Vec<u8> = (0..logical).map(|byte| (byte * 7 % 251) as u8).collect();
        wear.write(&mut flash, 0, &pattern).unwrap();
        wear.persist(&mut flash, 0, logical).unwrap();
        // Hammer one word, well past a whole cycle of the gap.
        let layout = NvmWearLayout::for_region(size).unwrap();
        let hot_writes = 4 * (layout.lines + 1) * NVM_WEAR_WORD_WRITES_PER_MOVE;
        for round in 0..hot_writes {
            wear.write(&mut flash, 8, &round.to_le_bytes()).unwrap();
        }
        wear.persist(&mut flash, 8, 8).unwrap();
        let mut expected = pattern.clone();
        expected[8..16].copy_from_slice(&(hot_writes - 1).to_le_bytes());
        let mut back = vec![0u8; logical as usize];
        wear.read(&mut flash, 0, &mut back).unwrap();
        assert!(wear.moves_made() >= 4 * (layout.lines + 1), "{} moves", wear.moves_made());
        assert!(back == expected, "contents after {} moves", wear.moves_made());
        let mut again = NvmWear::new(size);
        again.read(&mut flash, 0, &mut back).unwrap();
        assert!(back == expected, "contents read through a reopened layer");
        let (_, hottest) = flash.nvm_hottest_word().unwrap();
        assert!(
            hottest * 3 < hot_writes,
            "the hot word's {hot_writes} writes stayed on one physical word: {hottest} there"
        );
    }

    /// What the bench projects (`add_levelled_wear` in the bench: a
    /// physical word ends at the average, over the lines, of the logical
    /// writes at its offset in a line) holds once every line has passed
    /// every physical line: a skewed load, a fifth of its writes on ten
    /// hot words at one offset (as slot selection words are), the rest on
    /// random words, leaves no physical word far above that projection
    /// after one pass, and far below the hottest logical word.
    #[test]
    fn after_a_pass_every_physical_word_is_near_its_offset_average() {
        let size = 16_640;
        let layout = NvmWearLayout::for_region(size).unwrap();
        let words_per_line = (NVM_WEAR_LINE_BYTES / 8) as usize;
        let mut flash = device(size);
        let mut wear = NvmWear::new(size);
        let logical_words = (layout.lines as usize) * words_per_line;
        let mut logical = vec![0u64; logical_words];
        let hot: Vec<usize> =
            (0..10).map(|number| (number * 25 % layout.lines as usize) * words_per_line + 1).collect();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let pass = layout.lines * (layout.lines + 1);
        while wear.moves_made() < pass {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let word = if state.is_multiple_of(5) {
                hot[(state >> 8) as usize % hot.len()]
            } else {
                (state >> 8) as usize % logical_words
            };
            logical[word] += 1;
            wear.write(&mut flash, word as u64 * 8, &state.to_le_bytes()).unwrap();
        }
        let projection = (0..words_per_line)
            .map(|offset| (offset..logical_words).step_by(words_per_line).map(|word| logical[word]).sum::<u64>())
            .max()
            .unwrap() as f64
            / layout.lines as f64;
        let physical = flash.nvm_word_writes();
        let ring_words = layout.ring_records as usize;
        let levelled_max = physical[ring_words..ring_words + (layout.lines as usize + 1) * words_per_line]
            .iter()
            .copied()
            .max()
            .unwrap();
        let logical_max = *logical.iter().max().unwrap();
        assert!(
            f64::from(levelled_max) < 1.25 * projection,
            "hottest physical word {levelled_max} against the projection {projection:.0}"
        );
        assert!(
            u64::from(levelled_max) * 10 < logical_max,
            "hottest physical word {levelled_max} against the hottest logical {logical_max}"
        );
    }

    /// A power cut at every device operation of a run of writes, persists
    /// and moves, among them the move with the gap at the first line and
    /// the ring's wrap: after each, every word reads as its last persisted
    /// value or as one written to it since, never older, never anything
    /// else; and so it does through a reopened layer.
    #[test]
    fn a_cut_anywhere_in_a_move_keeps_every_persisted_word() {
        let size = 20 << 10;
        let layout = NvmWearLayout::for_region(size).unwrap();
        let words = layout.logical_bytes() / 8;
        // The moves recorded before the run: the second move of the run is
        // the one with the gap at the first line.
        let seeded = (layout.lines - 1) + (layout.lines + 1) * 3;
        let rounds = (layout.ring_records + 3) * NVM_WEAR_WORD_WRITES_PER_MOVE / 8;
        let run = |cut: Option<u64>| {
            let mut flash = device(size);
            flash.nvm_write(layout.record_offset(seeded), &encode_nvm_wear_record(seeded).to_le_bytes()).unwrap();
            flash.nvm_persist(0, layout.ring_bytes()).unwrap();
            if let Some(cut) = cut {
                flash.schedule_power_cut(flash.mutating_operations() + cut, 0x5EED ^ cut).unwrap();
            }
            let mut wear = NvmWear::new(size);
            let mut persisted = vec![0u64; words as usize];
            let mut since: Vec<Vec<u64>> = vec![Vec::new(); words as usize];
            let mut finished = true;
            for round in 1..=rounds {
                let first = (round * 37) % (words - 8);
                let values: Vec<u64> = (0..8).map(|word| round * 8 + word).collect();
                for (word, value) in values.iter().enumerate() {
                    since[first as usize + word].push(*value);
                }
                let bytes: Vec<u8> = values.iter().flat_map(|value| value.to_le_bytes()).collect();
                let mut outcome = wear.write(&mut flash, first * 8, &bytes);
                if outcome.is_ok() && round % 3 == 0 {
                    outcome = wear.persist(&mut flash, first * 8, 64);
                    if outcome.is_ok() {
                        for word in first..first + 8 {
                            persisted[word as usize] = *since[word as usize].last().unwrap();
                            since[word as usize].clear();
                        }
                    }
                }
                if outcome.is_err() {
                    finished = false;
                    break;
                }
            }
            (flash, wear.moves_made(), persisted, since, finished)
        };
        let (_, moves, _, _, finished) = run(None);
        assert!(finished);
        assert!(moves >= layout.ring_records + 2, "{moves} moves: the gap at the first line and the ring's wrap");
        let mut cut = 0;
        loop {
            let (mut flash, _, persisted, since, finished) = run(Some(cut));
            if finished {
                break;
            }
            flash.power_on();
            let mut back = vec![0u8; layout.logical_bytes() as usize];
            NvmWear::new(size).read(&mut flash, 0, &mut back).unwrap();
            for (word, bytes) in back.chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(bytes.try_into().unwrap());
                assert!(
                    value == persisted[word] || since[word].contains(&value),
                    "cut at operation {cut} (seed {}): word {word} reads {value}, persisted {}",
                    0x5EED ^ cut,
                    persisted[word]
                );
            }
            cut += 1;
        }
        assert!(cut > rounds, "the run took {cut} operations");
    }
}
