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

/// The signature of `bytes`, read as symbols in the chunk layout. A length
/// that is not a multiple of [`SYMBOL_CHUNK_BYTES`] reads as if padded with
/// zeros to one, which adds nothing.
pub fn signature(bytes: &[u8]) -> [u16; SIGNATURE_SYMBOLS] {
    assert!(bytes.len().div_ceil(2) <= SIGNATURE_SYMBOLS_MAX, "signature over more symbols than the field can place");
    let tables = shift_tables();
    let mut result = [0u16; SIGNATURE_SYMBOLS];
    // Horner's rule from the last symbol down, one accumulator per power
    // b = a^(j+1), taking HORNER_STEP symbols at a time:
    //   acc = acc * b^4 + s[i+3] * b^3 + s[i+2] * b^2 + s[i+1] * b + s[i].
    // Multiplying by a constant is linear over GF(2), so each product is
    // two lookups in small tables (one per byte) that stay in the L1 cache;
    // the products of the four symbols do not wait on the accumulator, so
    // the chain through it is one step in four (the single-symbol rule made
    // every lookup wait on the one before).
    let chunk_count = bytes.len().div_ceil(SYMBOL_CHUNK_BYTES);
    for chunk_index in (0..chunk_count).rev() {
        let start = chunk_index * SYMBOL_CHUNK_BYTES;
        let chunk = &bytes[start..bytes.len().min(start + SYMBOL_CHUNK_BYTES)];
        let mut padded = [0u8; SYMBOL_CHUNK_BYTES];
        padded[..chunk.len()].copy_from_slice(chunk);
        let symbol = |index: usize| u16::from(padded[index]) | u16::from(padded[index + CHUNK_SYMBOLS]) << 8;
        for group in (0..CHUNK_SYMBOLS / HORNER_STEP).rev() {
            let first = group * HORNER_STEP;
            let symbols = [symbol(first), symbol(first + 1), symbol(first + 2), symbol(first + 3)];
            for (power, accumulator) in result.iter_mut().enumerate() {
                let [by_1, by_2, by_3, by_4] = &tables[power];
                let times = |table: &[[u16; 256]; 2], value: u16| {
                    table[0][(value & 0xFF) as usize] ^ table[1][(value >> 8) as usize]
                };
                *accumulator = times(by_4, *accumulator)
                    ^ times(by_3, symbols[3])
                    ^ times(by_2, symbols[2])
                    ^ times(by_1, symbols[1])
                    ^ symbols[0];
            }
        }
    }
    result
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
