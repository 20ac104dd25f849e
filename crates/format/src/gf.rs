//! GF(2^16) arithmetic and the 64-bit algebraic page signature (RCFFS 3.2,
//! after Schwarz and Miller's algebraic signatures).
//!
//! The field is the one `reed-solomon-simd` (Leopard-RS) computes in: the
//! polynomial `x^16 + x^5 + x^3 + x^2 + 1` (0x1002D) with elements written
//! in its Cantor basis. Using the same field, and reading a page as 16-bit
//! symbols in the same byte layout (each 64-byte chunk holds 32 symbols, low
//! bytes in its first half and high bytes in its second), is what makes the
//! signature commute with the erasure code: if parity `P = f(D_0..D_n)`,
//! then `sig(P) = f(sig(D_0)..sig(D_n))`. The tables are built here, the
//! same way, and a property test holds the homomorphism against the crate.
//!
//! The signature is four symbols `sig_j(D) = sum_p D_p * a^((j + 1) * p)`,
//! `j = 0..4`, over the symbols `D_p` of the page, for a primitive `a`. Four
//! consecutive powers make it a Reed-Solomon syndrome: any change to at most
//! four symbols is always detected, and a random change escapes with
//! probability 2^-64.

use std::sync::OnceLock;

/// Field bits.
pub const FIELD_BITS: usize = 16;
/// Elements in the field.
pub const FIELD_ORDER: usize = 1 << FIELD_BITS;
/// The multiplicative group's order: logarithms are taken modulo this.
pub const FIELD_MODULUS: u32 = (FIELD_ORDER - 1) as u32;
/// `x^16 + x^5 + x^3 + x^2 + 1`, Leopard-RS's choice.
const FIELD_POLYNOMIAL: usize = 0x1002D;
/// Leopard-RS's Cantor basis: element `i` of the representation is the sum
/// of the basis vectors whose bits are set in `i`.
const CANTOR_BASIS: [u16; FIELD_BITS] = [
    0x0001, 0xACCA, 0x3C0E, 0x163E, 0xC582, 0xED2E, 0x914C, 0x4012, 0x6C98, 0x10D8, 0x6A72, 0xB900, 0xFDB8, 0xFB34,
    0xFF38, 0x991E,
];
/// Bytes the erasure code and the signature read as one group of symbols.
pub const SYMBOL_CHUNK_BYTES: usize = 64;
/// Symbols in one chunk.
const CHUNK_SYMBOLS: usize = SYMBOL_CHUNK_BYTES / 2;
/// Symbols in a signature.
pub const SIGNATURE_SYMBOLS: usize = 4;
/// Bytes of a signature on flash.
pub const SIGNATURE_BYTES: usize = SIGNATURE_SYMBOLS * 2;
/// Longest input, in symbols, for which distinct positions get distinct
/// powers of the signature's base, so a change of up to four symbols is
/// always detected.
pub const SIGNATURE_SYMBOLS_MAX: usize = FIELD_MODULUS as usize;

const _: () = assert!(SIGNATURE_BYTES == 8, "the OOB layout reserves 8 bytes for the signature");

struct Tables {
    /// `exp[log]`: the element with that logarithm; `exp[FIELD_MODULUS] == exp[0]`.
    exp: Vec<u16>,
    /// `log[element]`; `log[0]` is unused.
    log: Vec<u16>,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        // The same construction as Leopard-RS: logarithms of the polynomial
        // basis from its LFSR, then re-expressed in the Cantor basis.
        let mut exp = vec![0u16; FIELD_ORDER];
        let mut log = vec![0u16; FIELD_ORDER];
        let mut state = 1usize;
        for index in 0..FIELD_MODULUS {
            exp[state] = index as u16;
            state <<= 1;
            if state >= FIELD_ORDER {
                state ^= FIELD_POLYNOMIAL;
            }
        }
        exp[0] = FIELD_MODULUS as u16;
        log[0] = 0;
        for (bit, basis) in CANTOR_BASIS.iter().enumerate() {
            let width = 1usize << bit;
            for index in 0..width {
                log[index + width] = log[index] ^ basis;
            }
        }
        for index in 0..FIELD_ORDER {
            log[index] = exp[log[index] as usize];
        }
        for index in 0..FIELD_ORDER {
            exp[log[index] as usize] = index as u16;
        }
        exp[FIELD_MODULUS as usize] = exp[0];
        Tables { exp, log }
    })
}

/// `a * b` in the field.
pub fn mul(a: u16, b: u16) -> u16 {
    if a == 0 || b == 0 {
        return 0;
    }
    let tables = tables();
    tables.exp[add_logs(tables.log[a as usize], tables.log[b as usize]) as usize]
}

/// The multiplicative inverse; `None` for zero.
pub fn inverse(a: u16) -> Option<u16> {
    if a == 0 {
        return None;
    }
    let tables = tables();
    let log = u32::from(tables.log[a as usize]);
    Some(tables.exp[((FIELD_MODULUS - log) % FIELD_MODULUS) as usize])
}

/// The element `a^power` for the field's primitive element `a`.
pub fn power_of_generator(power: u32) -> u16 {
    tables().exp[(power % FIELD_MODULUS) as usize]
}

fn add_logs(x: u16, y: u16) -> u16 {
    let sum = u32::from(x) + u32::from(y);
    (sum % FIELD_MODULUS) as u16
}

/// `destination ^= factor * source`, symbol by symbol, in the chunk layout.
/// Both lengths must be equal and a multiple of [`SYMBOL_CHUNK_BYTES`].
pub fn multiply_add(destination: &mut [u8], source: &[u8], factor: u16) {
    assert_eq!(destination.len(), source.len(), "multiply_add over slices of different lengths");
    assert_eq!(source.len() % SYMBOL_CHUNK_BYTES, 0, "multiply_add over a partial chunk");
    if factor == 0 {
        return;
    }
    if factor == 1 {
        for (out, byte) in destination.iter_mut().zip(source) {
            *out ^= byte;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2.
        unsafe { multiply_add_lanes(destination, source, factor) };
        return;
    }
    multiply_add_scalar(destination, source, factor);
}

/// [`multiply_add`] a symbol at a time through the log and exp tables.
fn multiply_add_scalar(destination: &mut [u8], source: &[u8], factor: u16) {
    let tables = tables();
    let factor_log = tables.log[factor as usize];
    for (out_chunk, in_chunk) in
        destination.chunks_exact_mut(SYMBOL_CHUNK_BYTES).zip(source.chunks_exact(SYMBOL_CHUNK_BYTES))
    {
        for index in 0..CHUNK_SYMBOLS {
            let symbol = u16::from(in_chunk[index]) | u16::from(in_chunk[index + CHUNK_SYMBOLS]) << 8;
            if symbol == 0 {
                continue;
            }
            let product = tables.exp[add_logs(tables.log[symbol as usize], factor_log) as usize];
            out_chunk[index] ^= product as u8;
            out_chunk[index + CHUNK_SYMBOLS] ^= (product >> 8) as u8;
        }
    }
}

/// [`multiply_add`] 32 symbols at a time (AVX2), as [`signature_lanes`]
/// multiplies ([`times_constant`]). The factor's [`nibble_table`] is made
/// per call (64 products, against 2,048 a 4 KiB page). The zone parity's rows multiply every page they take: the
/// scalar rule was 2.6% of a random write's host time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn multiply_add_lanes(destination: &mut [u8], source: &[u8], factor: u16) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm256_xor_si256};
    let table = nibble_registers(&nibble_table(factor));
    // SAFETY (every load and store): 32 bytes inside a 64-byte chunk of
    // `source` or `destination`.
    for (out_chunk, in_chunk) in
        destination.chunks_exact_mut(SYMBOL_CHUNK_BYTES).zip(source.chunks_exact(SYMBOL_CHUNK_BYTES))
    {
        let (low, high) = unsafe {
            (
                _mm256_loadu_si256(in_chunk.as_ptr().cast::<__m256i>()),
                _mm256_loadu_si256(in_chunk.as_ptr().add(CHUNK_SYMBOLS).cast::<__m256i>()),
            )
        };
        let (product_low, product_high) = times_constant(low, high, &table);
        unsafe {
            let out_low = out_chunk.as_mut_ptr().cast::<__m256i>();
            let out_high = out_chunk.as_mut_ptr().add(CHUNK_SYMBOLS).cast::<__m256i>();
            _mm256_storeu_si256(out_low, _mm256_xor_si256(_mm256_loadu_si256(out_low), product_low));
            _mm256_storeu_si256(out_high, _mm256_xor_si256(_mm256_loadu_si256(out_high), product_high));
        }
    }
}

/// The signature of `bytes`, read as symbols in the chunk layout. A length
/// that is not a multiple of [`SYMBOL_CHUNK_BYTES`] reads as if padded with
/// zeros to one, which adds nothing.
pub fn signature(bytes: &[u8]) -> [u16; SIGNATURE_SYMBOLS] {
    let whole = bytes.len() - bytes.len() % SYMBOL_CHUNK_BYTES;
    signature_of_parts(&bytes[..whole], &bytes[whole..])
}

/// The [`signature`] of `head` followed by `tail`, without joining them:
/// a page's signature covers its data and then its header, and a copy of
/// the page to put them side by side was an allocation and 4 KiB of
/// copying at every page sealed. `head` is whole chunks, so `tail` starts
/// a chunk of its own.
pub fn signature_of_parts(head: &[u8], tail: &[u8]) -> [u16; SIGNATURE_SYMBOLS] {
    assert!(head.len().is_multiple_of(SYMBOL_CHUNK_BYTES), "the head of a signature is whole chunks");
    assert!(
        (head.len() + tail.len()).div_ceil(2) <= SIGNATURE_SYMBOLS_MAX,
        "signature over more symbols than the field can place"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2.
        return unsafe { signature_lanes(head, tail) };
    }
    signature_scalar(head, tail)
}

/// Chunk `index` of `head` followed by `tail` (`head` whole chunks), in
/// `padded` with zeros after it when it is the tail's short last one.
fn chunk_of_parts<'a>(
    head: &'a [u8],
    tail: &'a [u8],
    index: usize,
    padded: &'a mut [u8; SYMBOL_CHUNK_BYTES],
) -> &'a [u8] {
    let start = index * SYMBOL_CHUNK_BYTES;
    if start < head.len() {
        return &head[start..start + SYMBOL_CHUNK_BYTES];
    }
    let start = start - head.len();
    let chunk = &tail[start..tail.len().min(start + SYMBOL_CHUNK_BYTES)];
    if chunk.len() == SYMBOL_CHUNK_BYTES {
        return chunk;
    }
    padded[..chunk.len()].copy_from_slice(chunk);
    padded[chunk.len()..].fill(0);
    padded
}

/// [`signature_of_parts`] a symbol at a time, on any processor.
fn signature_scalar(head: &[u8], tail: &[u8]) -> [u16; SIGNATURE_SYMBOLS] {
    let mut result = [0u16; SIGNATURE_SYMBOLS];
    let chunk_count = (head.len() + tail.len()).div_ceil(SYMBOL_CHUNK_BYTES);
    for chunk_index in (0..chunk_count).rev() {
        let mut padded = [0u8; SYMBOL_CHUNK_BYTES];
        let chunk = chunk_of_parts(head, tail, chunk_index, &mut padded);
        let chunk: &[u8; SYMBOL_CHUNK_BYTES] = chunk.try_into().expect("a chunk is 64 bytes");
        horner_chunk(chunk, &mut result, 0..SIGNATURE_SYMBOLS);
    }
    result
}

/// One chunk of Horner's rule, from its last symbol down, for the powers
/// in `powers`: `acc = acc * b^32 + sum_l D_l * b^l`.
fn horner_chunk(
    padded: &[u8; SYMBOL_CHUNK_BYTES],
    result: &mut [u16; SIGNATURE_SYMBOLS],
    powers: std::ops::Range<usize>,
) {
    let tables = shift_tables();
    // One accumulator per power b = a^(j+1), taking HORNER_STEP symbols
    // at a time:
    //   acc = acc * b^4 + s[i+3] * b^3 + s[i+2] * b^2 + s[i+1] * b + s[i].
    // Multiplying by a constant is linear over GF(2), so each product is
    // two lookups in small tables (one per byte) that stay in the L1 cache;
    // the products of the four symbols do not wait on the accumulator, so
    // the chain through it is one step in four (the single-symbol rule made
    // every lookup wait on the one before).
    let symbol = |index: usize| u16::from(padded[index]) | u16::from(padded[index + CHUNK_SYMBOLS]) << 8;
    for group in (0..CHUNK_SYMBOLS / HORNER_STEP).rev() {
        let first = group * HORNER_STEP;
        let symbols = [symbol(first), symbol(first + 1), symbol(first + 2), symbol(first + 3)];
        for power in powers.clone() {
            let [by_1, by_2, by_3, by_4] = &tables[power];
            let times = |table: &[[u16; 256]; 2], value: u16| {
                table[0][(value & 0xFF) as usize] ^ table[1][(value >> 8) as usize]
            };
            result[power] = times(by_4, result[power])
                ^ times(by_3, symbols[3])
                ^ times(by_2, symbols[2])
                ^ times(by_1, symbols[1])
                ^ symbols[0];
        }
    }
}

/// 32 symbols (their low bytes, their high bytes) times a constant, from
/// the constant's [`nibble_registers`]: the XOR of four `vpshufb` lookups
/// for each output byte.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn times_constant(
    low: std::arch::x86_64::__m256i,
    high: std::arch::x86_64::__m256i,
    tables: &[std::arch::x86_64::__m256i; 8],
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::{
        _mm256_and_si256, _mm256_set1_epi8, _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_xor_si256,
    };
    let nibble = _mm256_set1_epi8(0x0F);
    let nibbles = [
        _mm256_and_si256(low, nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(low), nibble),
        _mm256_and_si256(high, nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(high), nibble),
    ];
    let times = |tables: &[std::arch::x86_64::__m256i]| {
        _mm256_xor_si256(
            _mm256_xor_si256(_mm256_shuffle_epi8(tables[0], nibbles[0]), _mm256_shuffle_epi8(tables[1], nibbles[1])),
            _mm256_xor_si256(_mm256_shuffle_epi8(tables[2], nibbles[2]), _mm256_shuffle_epi8(tables[3], nibbles[3])),
        )
    };
    (times(&tables[..4]), times(&tables[4..]))
}

/// [`signature`] a chunk at a time, 32 symbols side by side (AVX2).
///
/// Position `p = 32 c + l` (chunk c, lane l), so the signature is
/// `sum_l b^l * A_l` with `A_l = sum_c D_(c,l) * (b^32)^c`: 32 Horner
/// chains that all multiply by the one constant `b^32`, from the last
/// chunk down. A chunk's low bytes and high bytes are exactly two 32-byte
/// vectors. Multiplying by a constant is linear over GF(2), so a product is
/// the XOR of four nibble lookups (`vpshufb` on 16-entry tables, one per
/// nibble of the symbol, a low and a high output byte each): eight shuffles
/// for 32 symbols, where the scalar rule takes 64 table lookups. The 32
/// lanes are folded into the signature at the end by the scalar rule.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn signature_lanes(head: &[u8], tail: &[u8]) -> [u16; SIGNATURE_SYMBOLS] {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_setzero_si256, _mm256_storeu_si256, _mm256_xor_si256};
    let tables = nibble_tables();
    let constants: [[__m256i; 8]; SIGNATURE_SYMBOLS] = std::array::from_fn(|power| nibble_registers(&tables[power]));
    let mut low = [_mm256_setzero_si256(); SIGNATURE_SYMBOLS];
    let mut high = [_mm256_setzero_si256(); SIGNATURE_SYMBOLS];
    let chunk_count = (head.len() + tail.len()).div_ceil(SYMBOL_CHUNK_BYTES);
    let mut padded = [0u8; SYMBOL_CHUNK_BYTES];
    for chunk_index in (0..chunk_count).rev() {
        let chunk = chunk_of_parts(head, tail, chunk_index, &mut padded);
        // SAFETY: a chunk is 64 readable bytes.
        let (data_low, data_high) = unsafe {
            (
                _mm256_loadu_si256(chunk.as_ptr().cast::<__m256i>()),
                _mm256_loadu_si256(chunk.as_ptr().add(CHUNK_SYMBOLS).cast::<__m256i>()),
            )
        };
        for power in 0..SIGNATURE_SYMBOLS {
            let (product_low, product_high) = times_constant(low[power], high[power], &constants[power]);
            low[power] = _mm256_xor_si256(product_low, data_low);
            high[power] = _mm256_xor_si256(product_high, data_high);
        }
    }
    let mut result = [0u16; SIGNATURE_SYMBOLS];
    for power in 0..SIGNATURE_SYMBOLS {
        let mut lanes = [0u8; SYMBOL_CHUNK_BYTES];
        // SAFETY: 64 writable bytes.
        unsafe {
            _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), low[power]);
            _mm256_storeu_si256(lanes.as_mut_ptr().add(CHUNK_SYMBOLS).cast::<__m256i>(), high[power]);
        }
        horner_chunk(&lanes, &mut result, power..power + 1);
    }
    result
}

/// For each power `b = a^(j + 1)`, the product of `b^32` with each nibble
/// value at each of a symbol's four nibble places: the low output bytes
/// (places 0..4), then the high ones.
#[cfg(target_arch = "x86_64")]
fn nibble_tables() -> &'static [[[u8; 16]; 8]; SIGNATURE_SYMBOLS] {
    static NIBBLES: OnceLock<[[[u8; 16]; 8]; SIGNATURE_SYMBOLS]> = OnceLock::new();
    NIBBLES.get_or_init(|| {
        std::array::from_fn(|power| nibble_table(power_of_generator((power as u32 + 1) * CHUNK_SYMBOLS as u32)))
    })
}

/// The product of `constant` with each nibble value at each of a symbol's
/// four nibble places: the low output bytes (places 0..4), then the high
/// ones. Multiplying by a constant is linear over GF(2), so a symbol's
/// product is the XOR of its four nibbles' entries.
#[cfg(target_arch = "x86_64")]
fn nibble_table(constant: u16) -> [[u8; 16]; 8] {
    let mut tables = [[0u8; 16]; 8];
    for place in 0..4 {
        for value in 0..16u16 {
            let product = mul(value << (4 * place), constant);
            tables[place][value as usize] = product as u8;
            tables[4 + place][value as usize] = (product >> 8) as u8;
        }
    }
    tables
}

/// A [`nibble_table`] in vector registers, each 16-entry table twice
/// (`vpshufb` looks up within each 128-bit half).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn nibble_registers(tables: &[[u8; 16]; 8]) -> [std::arch::x86_64::__m256i; 8] {
    std::array::from_fn(|index| {
        let mut doubled = [0u8; 32];
        doubled[..16].copy_from_slice(&tables[index]);
        doubled[16..].copy_from_slice(&tables[index]);
        // SAFETY: 32 readable bytes.
        unsafe { std::arch::x86_64::_mm256_loadu_si256(doubled.as_ptr().cast()) }
    })
}

/// Symbols each step of [`signature`]'s Horner rule takes.
const HORNER_STEP: usize = 4;
const _: () = assert!(CHUNK_SYMBOLS.is_multiple_of(HORNER_STEP), "a chunk is whole steps");

/// For each power `b = a^(j + 1)` of the base, and each of `b^1` to
/// `b^4`: the products of that constant with every low byte and every high
/// byte of an element (16 KiB in all).
type ShiftTables = [[[[u16; 256]; 2]; HORNER_STEP]; SIGNATURE_SYMBOLS];

fn shift_tables() -> &'static ShiftTables {
    static SHIFT: OnceLock<Box<ShiftTables>> = OnceLock::new();
    SHIFT.get_or_init(|| {
        let mut out = Box::new([[[[0u16; 256]; 2]; HORNER_STEP]; SIGNATURE_SYMBOLS]);
        for (power, tables) in out.iter_mut().enumerate() {
            let base = power_of_generator(power as u32 + 1);
            let mut constant = 1u16;
            for table in tables.iter_mut() {
                constant = mul(constant, base);
                for byte in 0..256u16 {
                    table[0][byte as usize] = mul(byte, constant);
                    table[1][byte as usize] = mul(byte << 8, constant);
                }
            }
        }
        out
    })
}

/// The signature as it is kept on flash: four little-endian symbols.
pub fn signature_bytes(bytes: &[u8]) -> [u8; SIGNATURE_BYTES] {
    encode_signature(&signature(bytes))
}

/// Four symbols as eight little-endian bytes.
pub fn encode_signature(symbols: &[u16; SIGNATURE_SYMBOLS]) -> [u8; SIGNATURE_BYTES] {
    let mut out = [0u8; SIGNATURE_BYTES];
    for (index, symbol) in symbols.iter().enumerate() {
        out[index * 2..index * 2 + 2].copy_from_slice(&symbol.to_le_bytes());
    }
    out
}

/// Eight bytes back to four symbols.
pub fn decode_signature(bytes: &[u8; SIGNATURE_BYTES]) -> [u16; SIGNATURE_SYMBOLS] {
    let mut out = [0u16; SIGNATURE_SYMBOLS];
    for (index, symbol) in out.iter_mut().enumerate() {
        *symbol = u16::from_le_bytes([bytes[index * 2], bytes[index * 2 + 1]]);
    }
    out
}

/// The signature a combination `sum_i factor_i * D_i` must have, from the
/// signatures of the `D_i`: the homomorphism the quick scan checks.
pub fn combine_signatures(terms: &[(u16, [u16; SIGNATURE_SYMBOLS])]) -> [u16; SIGNATURE_SYMBOLS] {
    let mut out = [0u16; SIGNATURE_SYMBOLS];
    for (factor, symbols) in terms {
        for (accumulator, symbol) in out.iter_mut().zip(symbols) {
            *accumulator ^= mul(*factor, *symbol);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// The lane rule's products are the log and exp tables' products, for
    /// factors at both ends of the field and between.
    #[test]
    fn the_lane_multiply_add_agrees_with_the_symbol_rule() {
        let mut state = 0x2F0F_1E3D_5A69_7788u64;
        for length in [0, 64, 128, 4096 + 128] {
            for factor in [2u16, 3, 0x8000, 0xFFFF, 0x1234] {
                let source: Vec<u8> = (0..length).map(|_| crate::test_noise(&mut state) as u8).collect();
                let start: Vec<u8> = (0..length).map(|_| crate::test_noise(&mut state) as u8).collect();
                let mut expected = start.clone();
                super::multiply_add_scalar(&mut expected, &source, factor);
                let mut out = start.clone();
                super::multiply_add(&mut out, &source, factor);
                assert_eq!(out, expected, "{length} bytes, factor {factor:#x}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    let mut lanes = start.clone();
                    // SAFETY: the processor has AVX2.
                    unsafe { super::multiply_add_lanes(&mut lanes, &source, factor) };
                    assert_eq!(lanes, expected, "{length} bytes, factor {factor:#x}");
                }
            }
        }
    }

    /// The signature of a head and a tail is the definition's over the two
    /// joined, on both rules, for heads of whole chunks and tails short,
    /// exact and longer than a chunk.
    #[test]
    fn a_signature_of_parts_is_the_signature_of_the_parts_joined() {
        // The definition, symbol by symbol: position p = 32 c + l holds
        // the symbol of chunk c's bytes l (low) and l + 32 (high), and
        // signature symbol j is the sum of s_p * (a^(j + 1))^p.
        let defined = |bytes: &[u8]| {
            let mut result = [0u16; super::SIGNATURE_SYMBOLS];
            for (chunk_index, chunk) in bytes.chunks(super::SYMBOL_CHUNK_BYTES).enumerate() {
                let mut padded = [0u8; super::SYMBOL_CHUNK_BYTES];
                padded[..chunk.len()].copy_from_slice(chunk);
                for lane in 0..super::CHUNK_SYMBOLS {
                    let symbol = u16::from(padded[lane]) | u16::from(padded[lane + super::CHUNK_SYMBOLS]) << 8;
                    let position = (chunk_index * super::CHUNK_SYMBOLS + lane) as u32;
                    for (power, out) in result.iter_mut().enumerate() {
                        let exponent =
                            (u64::from(power as u32 + 1) * u64::from(position)) % u64::from(super::FIELD_MODULUS);
                        *out ^= super::mul(symbol, super::power_of_generator(exponent as u32));
                    }
                }
            }
            result
        };
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for (head_chunks, tail_length) in [(0, 0), (0, 24), (1, 0), (1, 72), (64, 72), (64, 130), (2, 64)] {
            let head: Vec<u8> =
                (0..head_chunks * super::SYMBOL_CHUNK_BYTES).map(|_| crate::test_noise(&mut state) as u8).collect();
            let tail: Vec<u8> = (0..tail_length).map(|_| crate::test_noise(&mut state) as u8).collect();
            let joined = [head.as_slice(), tail.as_slice()].concat();
            let expected = defined(&joined);
            assert_eq!(super::signature(&joined), expected, "{head_chunks} chunks and {tail_length} bytes joined");
            assert_eq!(
                super::signature_of_parts(&head, &tail),
                expected,
                "{head_chunks} chunks, then {tail_length} bytes"
            );
            assert_eq!(super::signature_scalar(&head, &tail), expected, "{head_chunks} chunks, {tail_length} bytes");
        }
    }

    /// The chunk-wide rule gives the symbol-wide rule's signature, for
    /// whole chunks, a partial last one, and nothing.
    #[test]
    fn the_lane_signature_agrees_with_the_symbol_signature() {
        let mut state = 0x853C_49E6_748F_EA9Bu64;
        for length in [0, 1, 2, 63, 64, 65, 130, 4096, 4168, 16384 + 72] {
            let bytes: Vec<u8> = (0..length).map(|_| crate::test_noise(&mut state) as u8).collect();
            let whole = length - length % super::SYMBOL_CHUNK_BYTES;
            let expected = super::signature_scalar(&bytes[..whole], &bytes[whole..]);
            assert_eq!(super::signature(&bytes), expected, "{length} bytes");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the processor has AVX2.
                assert_eq!(
                    unsafe { super::signature_lanes(&bytes[..whole], &bytes[whole..]) },
                    expected,
                    "{length} bytes"
                );
            }
        }
    }
}
