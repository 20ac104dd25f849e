//! Parity across pages: the block parity (k pages per erase block) and the
//! zone parity (r erase blocks per zone), over protected units.
//!
//! A unit is a page's data, its header and its signature (`data ++
//! OOB[0, 72)`) padded with zeros to whole 64-byte symbol chunks. A parity
//! unit is programmed as a page of its own: its first `page` bytes as data,
//! the next 72 as the OOB's header and signature slots (the header slot
//! holds parity, not a header; position tells a parity page apart). The
//! signature slot of a parity page is then the same combination of the
//! data pages' signature slots, which is the signature of the parity page's
//! own data and header slot: [`crate::gf`]'s homomorphism.
//!
//! One parity unit is plain XOR. Two or more are Reed-Solomon codes from
//! `reed-solomon-simd`: its encoder gives the coefficients once (parity
//! `m` is `sum_i c_{m,i} * D_i`, symbol by symbol), the running parity is
//! accumulated page by page with them as pages are programmed, and its
//! decoder rebuilds lost units. A test holds the accumulated parity equal
//! to the crate's own encoding.

use crate::gf::{self, SYMBOL_CHUNK_BYTES};
use crate::protection::PROTECTED_OOB_BYTES;

/// Bytes of a protected unit for a page size.
pub fn unit_bytes(page_size_bytes: usize) -> usize {
    (page_size_bytes + PROTECTED_OOB_BYTES).div_ceil(SYMBOL_CHUNK_BYTES) * SYMBOL_CHUNK_BYTES
}

/// The unit of a page: data, header and signature, zero padded.
pub fn unit_of(data: &[u8], oob: &[u8]) -> Vec<u8> {
    let mut unit = Vec::new();
    unit_into(&mut unit, data, oob);
    unit
}

/// [`unit_of`] into a buffer the caller keeps, so that a page programmed
/// allocates nothing for its parity.
pub fn unit_into(unit: &mut Vec<u8>, data: &[u8], oob: &[u8]) {
    unit.clear();
    unit.resize(unit_bytes(data.len()), 0);
    unit[..data.len()].copy_from_slice(data);
    unit[data.len()..data.len() + PROTECTED_OOB_BYTES].copy_from_slice(&oob[..PROTECTED_OOB_BYTES]);
}

/// Splits a unit back into page data and the OOB's first 72 bytes.
pub fn split_unit(unit: &[u8], page_size_bytes: usize) -> (&[u8], &[u8]) {
    (&unit[..page_size_bytes], &unit[page_size_bytes..page_size_bytes + PROTECTED_OOB_BYTES])
}

/// An erasure code of `parity_count` parity units over `data_count` units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErasureCode {
    data_count: usize,
    parity_count: usize,
    /// `coefficients[m][i]`: parity `m`'s factor for data unit `i`.
    coefficients: Vec<Vec<u16>>,
}

impl ErasureCode {
    pub fn new(data_count: usize, parity_count: usize) -> Result<ErasureCode, String> {
        if data_count == 0 || parity_count == 0 {
            return Err(format!("an erasure code of {data_count} data and {parity_count} parity units"));
        }
        if parity_count == 1 {
            return Ok(ErasureCode { data_count, parity_count, coefficients: vec![vec![1; data_count]] });
        }
        if !reed_solomon_simd::ReedSolomonEncoder::supports(data_count, parity_count) {
            return Err(format!("reed-solomon-simd cannot code {data_count} data and {parity_count} parity units"));
        }
        // Unit `i` holds the symbol 1 at position `i` and zeros elsewhere,
        // so position `i` of parity `m` is c_{m,i}.
        let chunks = data_count.div_ceil(SYMBOL_CHUNK_BYTES / 2);
        let shard_bytes = chunks * SYMBOL_CHUNK_BYTES;
        let originals: Vec<Vec<u8>> = (0..data_count)
            .map(|index| {
                let mut shard = vec![0u8; shard_bytes];
                shard[symbol_low_byte(index)] = 1;
                shard
            })
            .collect();
        let recovery = reed_solomon_simd::encode(data_count, parity_count, &originals)
            .map_err(|error| format!("reed-solomon-simd: {error}"))?;
        let coefficients = recovery
            .iter()
            .map(|shard| {
                (0..data_count)
                    .map(|index| {
                        let low = symbol_low_byte(index);
                        u16::from(shard[low]) | u16::from(shard[low + SYMBOL_CHUNK_BYTES / 2]) << 8
                    })
                    .collect()
            })
            .collect();
        Ok(ErasureCode { data_count, parity_count, coefficients })
    }

    pub fn data_count(&self) -> usize {
        self.data_count
    }

    pub fn parity_count(&self) -> usize {
        self.parity_count
    }

    /// Parity `parity`'s factor for data unit `index`.
    pub fn coefficient(&self, parity: usize, index: usize) -> u16 {
        self.coefficients[parity][index]
    }

    /// Adds data unit `index` into the running parity units.
    pub fn accumulate(&self, parity: &mut [Vec<u8>], index: usize, unit: &[u8]) {
        assert_eq!(parity.len(), self.parity_count, "running parity of the wrong count");
        assert!(index < self.data_count, "data unit {index} of {}", self.data_count);
        for (row, running) in parity.iter_mut().enumerate() {
            gf::multiply_add(running, unit, self.coefficients[row][index]);
        }
    }

    /// The parity of a whole set of data units.
    pub fn encode(&self, data: &[&[u8]]) -> Vec<Vec<u8>> {
        assert_eq!(data.len(), self.data_count);
        let unit_bytes = data.first().map_or(0, |unit| unit.len());
        let mut parity = vec![vec![0u8; unit_bytes]; self.parity_count];
        for (index, unit) in data.iter().enumerate() {
            self.accumulate(&mut parity, index, unit);
        }
        parity
    }

    /// Rebuilds the missing units in place: `units` holds the data units
    /// then the parity units, `None` where lost. Errors when more are lost
    /// than there are parity units.
    pub fn reconstruct(&self, units: &mut [Option<Vec<u8>>]) -> Result<(), String> {
        assert_eq!(units.len(), self.data_count + self.parity_count, "units of the wrong count");
        let missing: Vec<usize> = (0..units.len()).filter(|&index| units[index].is_none()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if missing.len() > self.parity_count {
            return Err(format!("{} units lost, {} parity units", missing.len(), self.parity_count));
        }
        let unit_bytes = units.iter().flatten().next().map(Vec::len).ok_or("every unit is lost")?;
        let missing_data: Vec<usize> = missing.iter().copied().filter(|&index| index < self.data_count).collect();
        if !missing_data.is_empty() {
            if self.parity_count == 1 {
                let mut rebuilt = vec![0u8; unit_bytes];
                for unit in units.iter().flatten() {
                    for (out, byte) in rebuilt.iter_mut().zip(unit) {
                        *out ^= byte;
                    }
                }
                units[missing_data[0]] = Some(rebuilt);
            } else {
                let originals =
                    (0..self.data_count).filter_map(|index| units[index].as_ref().map(|unit| (index, unit.as_slice())));
                let recovery = (0..self.parity_count)
                    .filter_map(|row| units[self.data_count + row].as_ref().map(|unit| (row, unit.as_slice())));
                let restored = reed_solomon_simd::decode(self.data_count, self.parity_count, originals, recovery)
                    .map_err(|error| format!("reed-solomon-simd: {error}"))?;
                for (index, unit) in restored {
                    units[index] = Some(unit);
                }
            }
        }
        // Lost parity units are encoded again from the (now whole) data.
        if missing.iter().any(|&index| index >= self.data_count) {
            let data: Vec<&[u8]> =
                units[..self.data_count].iter().map(|unit| unit.as_deref().expect("rebuilt")).collect();
            let parity = self.encode(&data);
            for (row, unit) in parity.into_iter().enumerate() {
                units[self.data_count + row].get_or_insert(unit);
            }
        }
        Ok(())
    }
}

/// Byte offset of the low byte of symbol `index` in the chunk layout.
fn symbol_low_byte(index: usize) -> usize {
    let per_chunk = SYMBOL_CHUNK_BYTES / 2;
    (index / per_chunk) * SYMBOL_CHUNK_BYTES + index % per_chunk
}
