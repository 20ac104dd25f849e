//! The protected page: what the OOB holds after the page header, and how a
//! page is sealed before it is programmed and checked and corrected after
//! it is read.
//!
//! ```text
//! OOB: [0, 64)   page header (its CRC-32C binds header and data)
//!      [64, 72)  signature: GF(2^16), four symbols, over data ++ header
//!      [72, ..)  ECC: BCH parity over the stream data ++ OOB[0, 72), in as
//!                few codewords as GF(2^16) allows (one for pages up to
//!                8 KiB less the parity), codewords back to back
//! ```
//!
//! The ECC's shape is a function of the page and OOB sizes alone
//! ([`EccLayout::for_geometry`]), so any page, the superblock included, can
//! be corrected before anything else is known.

use std::sync::Arc;

use crate::bch::{Bch, CORRECTABLE_BITS_MAX, FIELD_BITS_MAX, FIELD_BITS_MIN};
use crate::gf::{self, SIGNATURE_BYTES, SYMBOL_CHUNK_BYTES};
use crate::PAGE_HEADER_BYTES;

/// Where the signature sits in the OOB.
pub const SIGNATURE_OFFSET: usize = PAGE_HEADER_BYTES;
/// Where the ECC starts in the OOB; also the bytes of OOB the signature,
/// the ECC and the parity cover.
pub const PROTECTED_OOB_BYTES: usize = SIGNATURE_OFFSET + SIGNATURE_BYTES;
/// The spare area a file system needs: the header and the signature. ECC
/// takes whatever is left.
pub const OOB_BYTES_MIN: usize = PROTECTED_OOB_BYTES;
/// Below this many parity bytes per codeword the ECC is not worth its
/// decoding: the layout keeps none.
pub const ECC_PARITY_BYTES_MIN: usize = 2;

const _: () = assert!(SIGNATURE_OFFSET == 64 && PROTECTED_OOB_BYTES == 72);
/// A codeword is worn ([`EccLayout::worn_bits`]) when the code has less
/// than this fraction of its reach (1/8) left unused.
pub const WORN_MARGIN_FRACTION: u32 = 8;
const _: () = assert!(WORN_MARGIN_FRACTION >= 2, "a worn page must still be one the code corrects");

/// The shape of the per-page ECC on a geometry.
#[derive(Clone, Debug)]
pub struct EccLayout {
    /// Codewords per page.
    pub codewords: usize,
    /// Bytes of the protected stream (`page + 72`).
    pub stream_bytes: usize,
    /// Message bytes of every codeword but the last, which takes the rest.
    pub codeword_message_bytes: usize,
    /// OOB bytes of parity per codeword.
    pub codeword_parity_bytes: usize,
    /// The codes: one for the full codewords, one for the shorter last one.
    codes: Vec<Arc<Bch>>,
}

impl EccLayout {
    /// The ECC this page and OOB size hold, or `None` when the OOB has no
    /// room for one after the header and signature.
    pub fn for_geometry(page_size_bytes: usize, oob_size_bytes: usize) -> Option<EccLayout> {
        if oob_size_bytes < OOB_BYTES_MIN {
            return None;
        }
        let stream_bytes = page_size_bytes + PROTECTED_OOB_BYTES;
        // As few codewords as the largest field allows: one long codeword
        // corrects far more than the same parity split into sectors, since
        // errors pool (at 3.4e-4 raw, a 4 KiB page with 56 parity bytes
        // fails about once in 10^5 reads as one codeword of t = 28, once
        // in 10^2 as four of t = 8). The cost is decoding time, spent only
        // on a page whose CRC failed.
        let budget_bytes = oob_size_bytes - PROTECTED_OOB_BYTES;
        let length_max_bits = (1usize << FIELD_BITS_MAX) - 1;
        let codewords = (1..=stream_bytes)
            .find(|&count| stream_bytes.div_ceil(count) * 8 + budget_bytes / count * 8 <= length_max_bits)?;
        let codeword_parity_bytes = budget_bytes / codewords;
        if codeword_parity_bytes < ECC_PARITY_BYTES_MIN {
            return None;
        }
        let codeword_message_bytes = stream_bytes.div_ceil(codewords);
        let last_message_bytes = stream_bytes - codeword_message_bytes * (codewords - 1);
        let parity_bits_budget = codeword_parity_bytes as u32 * 8;
        let message_bits = codeword_message_bytes as u32 * 8;
        // The smallest field whose code length holds the message and the
        // parity budget, then as many corrected bits as the budget pays for.
        let field_bits =
            (FIELD_BITS_MIN..=FIELD_BITS_MAX).find(|&m| (1u32 << m) > message_bits + parity_bits_budget)?;
        let mut correctable = (parity_bits_budget / field_bits).min(CORRECTABLE_BITS_MAX);
        // A generator can come out shorter than m*t; it never comes out
        // longer, but a code must still fit the bytes: step down if not.
        loop {
            if correctable == 0 {
                return None;
            }
            let full = Bch::new(field_bits, correctable, codeword_message_bytes);
            let last = Bch::new(field_bits, correctable, last_message_bytes);
            match (full, last) {
                (Ok(full), Ok(last))
                    if full.parity_bytes() <= codeword_parity_bytes && last.parity_bytes() <= codeword_parity_bytes =>
                {
                    let full = Arc::new(full);
                    let last = Arc::new(last);
                    let mut codes = vec![full; codewords - 1];
                    codes.push(last);
                    return Some(EccLayout {
                        codewords,
                        stream_bytes,
                        codeword_message_bytes,
                        codeword_parity_bytes,
                        codes,
                    });
                }
                _ => correctable -= 1,
            }
        }
    }

    /// Bit errors each codeword corrects.
    pub fn correctable_bits(&self) -> u32 {
        self.codes[0].correctable_bits()
    }

    /// Bits corrected in one codeword at or past which the page is worn:
    /// the code has less than an eighth of its reach left, so a little more
    /// retention loses it, and its data should move (read reclaim). With the
    /// default t = 28 that is 25 bits; at the end-of-life raw rate (3.4e-4,
    /// about 11 flipped bits a page on average) one page in about 3,000
    /// gets there.
    pub fn worn_bits(&self) -> u32 {
        let correctable = self.correctable_bits();
        correctable - correctable / WORN_MARGIN_FRACTION
    }

    /// The field the codes use, GF(2^m).
    pub fn field_bits(&self) -> u32 {
        self.codes[0].field_bits()
    }

    /// OOB bytes the ECC uses.
    pub fn oob_bytes(&self) -> usize {
        self.codewords * self.codeword_parity_bytes
    }

    fn message_range(&self, codeword: usize) -> std::ops::Range<usize> {
        let start = codeword * self.codeword_message_bytes;
        start..(start + self.codeword_message_bytes).min(self.stream_bytes)
    }

    fn parity_range(&self, codeword: usize) -> std::ops::Range<usize> {
        let start = PROTECTED_OOB_BYTES + codeword * self.codeword_parity_bytes;
        start..start + self.codes[codeword].parity_bytes()
    }
}

thread_local! {
    /// [`seal`]'s stream: one page's data and protected OOB bytes, so at
    /// most the largest page (64 KiB) and its 72 bytes, per thread.
    static SEAL_STREAM: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The protected stream of a page, `data ++ OOB[0, 72)`.
fn stream(data: &[u8], oob: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + PROTECTED_OOB_BYTES);
    stream_into(data, oob, &mut out);
    out
}

/// [`stream`] into `out`, whatever it held.
fn stream_into(data: &[u8], oob: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(data);
    out.extend_from_slice(&oob[..PROTECTED_OOB_BYTES]);
}

/// The signature of a page, over its data and its header.
pub fn page_signature(data: &[u8], oob: &[u8]) -> [u8; SIGNATURE_BYTES] {
    // The data is a whole number of symbol chunks (pages are powers of two
    // of at least 512 bytes), so the header starts a chunk of its own, as
    // it does in the erasure code's unit.
    debug_assert_eq!(data.len() % SYMBOL_CHUNK_BYTES, 0);
    gf::encode_signature(&gf::signature_of_parts(data, &oob[..PAGE_HEADER_BYTES]))
}

/// Whether the signature in the OOB matches the page.
pub fn signature_matches(data: &[u8], oob: &[u8]) -> bool {
    page_signature(data, oob)[..] == oob[SIGNATURE_OFFSET..PROTECTED_OOB_BYTES]
}

/// Fills the OOB past the header: the signature, then the ECC (if the
/// layout has one), then zeros.
pub fn seal(data: &[u8], oob: &mut [u8], ecc: Option<&EccLayout>) {
    assert!(oob.len() >= OOB_BYTES_MIN, "an OOB of {} bytes cannot hold the header and signature", oob.len());
    let signature = page_signature(data, oob);
    oob[SIGNATURE_OFFSET..PROTECTED_OOB_BYTES].copy_from_slice(&signature);
    oob[PROTECTED_OOB_BYTES..].fill(0);
    if let Some(layout) = ecc {
        assert_eq!(layout.stream_bytes, data.len() + PROTECTED_OOB_BYTES, "an ECC layout for another page size");
        // The codewords run over the data and then the protected OOB bytes,
        // side by side in a buffer this thread keeps: a new one at every
        // page sealed was an allocation per page written.
        SEAL_STREAM.with_borrow_mut(|stream| {
            stream_into(data, oob, stream);
            for (index, code) in layout.codes.iter().enumerate() {
                let range = layout.parity_range(index);
                code.encode(&stream[layout.message_range(index)], &mut oob[range]);
            }
        });
    }
    debug_assert!(signature_matches(data, oob));
}

/// What [`correct`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Correction {
    /// Bits the ECC flipped back.
    pub bits_corrected: u32,
    /// Codewords with more errors than the ECC corrects.
    pub codewords_uncorrectable: u32,
    /// The most bits corrected in one codeword: how close the page came to
    /// the code's bound, which is what wear shows first.
    pub codeword_bits_max: u32,
}

/// Runs the ECC over a page read from flash, correcting data and OOB in
/// place. The caller still checks the header and the signature: a
/// codeword with more errors than `t` may be miscorrected.
pub fn correct(data: &mut [u8], oob: &mut [u8], layout: &EccLayout) -> Correction {
    assert_eq!(layout.stream_bytes, data.len() + PROTECTED_OOB_BYTES, "an ECC layout for another page size");
    let mut stream = stream(data, oob);
    let mut result = Correction::default();
    for (index, code) in layout.codes.iter().enumerate() {
        let parity_range = layout.parity_range(index);
        let message_range = layout.message_range(index);
        match code.correct(&mut stream[message_range], &mut oob[parity_range]) {
            Some(bits) => {
                result.bits_corrected += bits;
                result.codeword_bits_max = result.codeword_bits_max.max(bits);
            }
            None => result.codewords_uncorrectable += 1,
        }
    }
    if result.bits_corrected > 0 {
        data.copy_from_slice(&stream[..data.len()]);
        oob[..PROTECTED_OOB_BYTES].copy_from_slice(&stream[data.len()..]);
    }
    result
}
