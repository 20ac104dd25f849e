//! Binary BCH codes: the per-sector ECC kept in the OOB.
//!
//! No maintained Rust crate implements binary BCH for NAND, so this is the
//! textbook construction (Lin and Costello, ch. 6), the one Linux's
//! `lib/bch.c` uses:
//! - a narrow-sense primitive code over GF(2^m), shortened to the message
//!   length; the generator is the least common multiple of the minimal
//!   polynomials of `a^1 .. a^2t`, with the primitive polynomials of
//!   `lib/bch.c`;
//! - systematic encoding: the parity is `message(x) * x^r mod g(x)`, with
//!   `r = deg g`, computed a byte at a time from a 256-entry table;
//! - decoding re-encodes the received message; the XOR with the received
//!   parity is the remainder of the received word, whose values at
//!   `a^1 .. a^2t` are the syndromes. Berlekamp-Massey finds the error
//!   locator and a Chien search its roots. A locator whose roots are not
//!   all in the shortened code's positions means more than `t` errors,
//!   reported as uncorrectable.
//!
//! Bits are numbered as in `lib/bch.c`: the first message byte's most
//! significant bit is the codeword's highest-degree coefficient, and the
//! parity bytes follow the message, most significant bit first.

/// Smallest and largest field the codes use: GF(2^4) for the published
/// small codes the tests check, GF(2^16) for one codeword over a whole
/// 4 KiB page and its header (33,344 message bits).
pub const FIELD_BITS_MIN: u32 = 4;
pub const FIELD_BITS_MAX: u32 = 16;
/// Most bit errors one codeword corrects: bounds the locator and the
/// parity register (`16 * 32 = 512` bits).
pub const CORRECTABLE_BITS_MAX: u32 = 32;
/// Words of the parity register.
const REGISTER_WORDS: usize = 8;
/// Message words one step of the 512-bit carry-less loop takes
/// ([`Bch::remainder_wide`]): one product of each of four top words with a
/// 512-bit fold is one instruction for its even words and one for its odd.
const STEP_WORDS: usize = 4;
const STEP_BYTES: usize = STEP_WORDS * 8;
const _: () = assert!(REGISTER_WORDS == 8 && STEP_WORDS == 4, "the wide loop keeps the state in one 512-bit register");

const _: () = assert!((FIELD_BITS_MAX * CORRECTABLE_BITS_MAX) as usize <= REGISTER_WORDS * 64);

/// Primitive polynomials for m = 4..=16, as in Linux's `lib/bch.c`
/// (`prim_poly_tab`, extended below m = 5 with `x^4 + x + 1`).
const PRIMITIVE_POLYNOMIALS: [u32; 13] =
    [0x13, 0x25, 0x43, 0x83, 0x11d, 0x211, 0x409, 0x805, 0x1053, 0x201b, 0x402b, 0x8003, 0x1002d];
const _: () = assert!(PRIMITIVE_POLYNOMIALS.len() as u32 == FIELD_BITS_MAX - FIELD_BITS_MIN + 1);

type Register = [u64; REGISTER_WORDS];

/// Why a BCH code cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BchParametersError(pub String);

/// A binary BCH code for messages of a fixed number of bytes.
#[derive(Clone, Debug)]
pub struct Bch {
    field_bits: u32,
    correctable_bits: u32,
    message_bytes: usize,
    /// `deg g`: parity bits.
    parity_bits: u32,
    /// `n`: message bits plus parity bits, at most `2^m - 1`.
    codeword_bits: u32,
    /// Order of the multiplicative group, `2^m - 1`.
    modulus: u32,
    exp: Vec<u16>,
    log: Vec<u16>,
    /// `g(x)` without its leading term, bit `i` = coefficient of `x^i`.
    generator: Register,
    /// `(v(x) * x^r) mod g(x)` for every byte `v`.
    byte_table: Vec<Register>,
    /// `(v(x) * x^(r + 8i)) mod g(x)` for every byte `v`, at `256 * i + v`,
    /// i = 0..8: eight message bytes a step (empty when `r < 64`).
    word_tables: Vec<Register>,
    /// Barrett's constant for eight bytes a step by carry-less multiplies:
    /// `floor(x^(r + 64) / g(x))` without its leading `x^64` (0 when
    /// `r < 64`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    barrett: u64,
    /// `x^(r' + 64 (STEP_WORDS + k)) mod g'(x)` for k = 0..STEP_WORDS, with
    /// r' the register's width (512 bits) and `g' = g * x^(r' - r)`: what
    /// the carry-less loop folds the state's k-th top word back with.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    folds: [Register; STEP_WORDS],
    /// `x^(r' + 64 k) mod g'(x)`: what the k-th top word left after the
    /// loop is folded back with (k = 0 is unused: Barrett's step takes it).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    reductions: [Register; STEP_WORDS],
    /// `g'(x) - x^r'`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    generator_aligned: Register,
    /// Whether this processor multiplies carry-less (x86-64's PCLMULQDQ):
    /// then eight message bytes cost eight multiplies, not eight 64-byte
    /// table rows. Either way the remainder is the same.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    carryless: bool,
    /// Whether it also multiplies four at once (AVX-512's VPCLMULQDQ): then
    /// 32 message bytes are eight instructions ([`Bch::remainder_wide`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    wide: bool,
    /// Whether, without AVX-512, it multiplies two at once (AVX2's
    /// VPCLMULQDQ, as on AMD's Zen 3 and Intel's client cores since Alder Lake): then the
    /// same 32-byte step is sixteen instructions on 256-bit halves
    /// ([`Bch::remainder_wide_halves`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    wide_halves: bool,
}

fn register_bit(register: &Register, bit: u32) -> bool {
    register[(bit / 64) as usize] >> (bit % 64) & 1 == 1
}

fn register_flip(register: &mut Register, bit: u32) {
    register[(bit / 64) as usize] ^= 1 << (bit % 64);
}

/// `register << shift` (shift < 64), truncated to `bits`.
fn register_shift_left(register: &Register, shift: u32, bits: u32) -> Register {
    let mut out = [0u64; REGISTER_WORDS];
    for index in (0..REGISTER_WORDS).rev() {
        out[index] = register[index] << shift;
        if shift > 0 && index > 0 {
            out[index] |= register[index - 1] >> (64 - shift);
        }
    }
    for (index, word) in out.iter_mut().enumerate() {
        let low = index as u32 * 64;
        if bits <= low {
            *word = 0;
        } else if bits < low + 64 {
            *word &= (1u64 << (bits - low)) - 1;
        }
    }
    out
}

/// Whether [`carryless_multiply`] can run here.
fn carryless_multiply_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("pclmulqdq") && std::arch::is_x86_feature_detected!("ssse3")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`Bch::remainder_wide`] can run here.
fn wide_multiply_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`Bch::remainder_wide_halves`] can run here.
fn wide_halves_multiply_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A message's whole words in blocks of [`STEP_BYTES`], the first led by
/// zero words (which do not change its polynomial) when the words are not
/// a multiple of [`STEP_WORDS`], and the bytes after its last whole word.
/// `first` holds the led block.
fn step_blocks<'a>(message: &'a [u8], first: &'a mut [u8; STEP_BYTES]) -> (impl Iterator<Item = &'a [u8]>, &'a [u8]) {
    let words = message.len() / 8;
    let (body, tail) = message.split_at(words * 8);
    let lead = (STEP_WORDS - words % STEP_WORDS) % STEP_WORDS;
    let rest = if lead == 0 {
        body
    } else {
        let taken = (STEP_WORDS - lead) * 8;
        first[lead * 8..].copy_from_slice(&body[..taken]);
        &body[taken..]
    };
    let first: &'a [u8] = first;
    ((lead > 0).then_some(first).into_iter().chain(rest.chunks_exact(STEP_BYTES)), tail)
}

/// The 127-bit carry-less product of two 64-bit polynomials: (low, high).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq")]
#[inline]
fn carryless_multiply(left: u64, right: u64) -> (u64, u64) {
    use std::arch::x86_64::{_mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_set_epi64x, _mm_unpackhi_epi64};
    let product = _mm_clmulepi64_si128(_mm_set_epi64x(0, left as i64), _mm_set_epi64x(0, right as i64), 0x00);
    (_mm_cvtsi128_si64(product) as u64, _mm_cvtsi128_si64(_mm_unpackhi_epi64(product, product)) as u64)
}

/// `register << shift` for any shift, truncated to the register's width.
fn register_shift_left_any(register: &Register, shift: u32) -> Register {
    let (words, bits) = ((shift / 64) as usize, shift % 64);
    let mut out = [0u64; REGISTER_WORDS];
    for index in words..REGISTER_WORDS {
        out[index] = register[index - words] << bits;
        if bits > 0 && index > words {
            out[index] |= register[index - words - 1] >> (64 - bits);
        }
    }
    out
}

/// `register >> shift` for any shift.
fn register_shift_right_any(register: &Register, shift: u32) -> Register {
    let (words, bits) = ((shift / 64) as usize, shift % 64);
    let mut out = [0u64; REGISTER_WORDS];
    for index in 0..REGISTER_WORDS - words {
        out[index] = register[index + words] >> bits;
        if bits > 0 && index + words + 1 < REGISTER_WORDS {
            out[index] |= register[index + words + 1] << (64 - bits);
        }
    }
    out
}

fn register_xor(left: &mut Register, right: &Register) {
    for (word, other) in left.iter_mut().zip(right) {
        *word ^= other;
    }
}

/// `t_k` times the even (`FIRST = 0x00, SECOND = 0x01`) or the odd
/// (`0x10, 0x11`) words of `folds[k]`, summed over k = 0..4, with
/// `[t0, t1]` and `[t2, t3]` in every 128-bit lane of the pairs: the
/// immediate's bit 0 picks t's word, its bit 4 the fold's
/// ([`Bch::remainder_wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq")]
#[inline]
fn fold_products<const FIRST: i32, const SECOND: i32>(
    low_pair: std::arch::x86_64::__m512i,
    high_pair: std::arch::x86_64::__m512i,
    folds: &[std::arch::x86_64::__m512i; STEP_WORDS],
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::{_mm512_clmulepi64_epi128, _mm512_xor_si512};
    _mm512_xor_si512(
        _mm512_xor_si512(
            _mm512_clmulepi64_epi128::<FIRST>(low_pair, folds[0]),
            _mm512_clmulepi64_epi128::<SECOND>(low_pair, folds[1]),
        ),
        _mm512_xor_si512(
            _mm512_clmulepi64_epi128::<FIRST>(high_pair, folds[2]),
            _mm512_clmulepi64_epi128::<SECOND>(high_pair, folds[3]),
        ),
    )
}

/// [`fold_products`] on one 256-bit half of each fold
/// ([`Bch::remainder_wide_halves`]): `t_k` times the even or odd words of
/// that half, summed over k = 0..4, with `[t0, t1]` and `[t2, t3]` in both
/// 128-bit lanes of the pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq")]
#[inline]
fn half_fold_products<const FIRST: i32, const SECOND: i32>(
    low_pair: std::arch::x86_64::__m256i,
    high_pair: std::arch::x86_64::__m256i,
    folds: &[std::arch::x86_64::__m256i; STEP_WORDS],
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::{_mm256_clmulepi64_epi128, _mm256_xor_si256};
    _mm256_xor_si256(
        _mm256_xor_si256(
            _mm256_clmulepi64_epi128::<FIRST>(low_pair, folds[0]),
            _mm256_clmulepi64_epi128::<SECOND>(low_pair, folds[1]),
        ),
        _mm256_xor_si256(
            _mm256_clmulepi64_epi128::<FIRST>(high_pair, folds[2]),
            _mm256_clmulepi64_epi128::<SECOND>(high_pair, folds[3]),
        ),
    )
}

impl Bch {
    /// The code over GF(2^`field_bits`) correcting `correctable_bits` errors
    /// in a message of `message_bytes`.
    pub fn new(field_bits: u32, correctable_bits: u32, message_bytes: usize) -> Result<Bch, BchParametersError> {
        let error = |reason: String| Err(BchParametersError(reason));
        if !(FIELD_BITS_MIN..=FIELD_BITS_MAX).contains(&field_bits) {
            return error(format!("GF(2^{field_bits}) is outside 2^{FIELD_BITS_MIN}..=2^{FIELD_BITS_MAX}"));
        }
        if correctable_bits == 0 || correctable_bits > CORRECTABLE_BITS_MAX {
            return error(format!("t = {correctable_bits} is outside 1..={CORRECTABLE_BITS_MAX}"));
        }
        let mut code = Bch::field_only(field_bits, correctable_bits, message_bytes);
        let generator = code.generator_polynomial();
        let parity_bits = generator.len() as u32 - 1;
        let message_bits = message_bytes as u64 * 8;
        if message_bits == 0 || message_bits + u64::from(parity_bits) > u64::from(code.modulus) {
            return error(format!(
                "{message_bytes} message bytes and {parity_bits} parity bits do not fit a code of length {}",
                code.modulus
            ));
        }
        if parity_bits < 8 {
            return error(format!("{parity_bits} parity bits: the byte-wise encoder needs at least 8"));
        }
        code.parity_bits = parity_bits;
        code.codeword_bits = message_bits as u32 + parity_bits;
        for (degree, &coefficient) in generator.iter().enumerate().take(parity_bits as usize) {
            if coefficient {
                register_flip(&mut code.generator, degree as u32);
            }
        }
        code.byte_table = (0..256u32).map(|value| code.remainder_of_byte(value as u8)).collect();
        if parity_bits >= 64 {
            let mut tables = Vec::with_capacity(8 * 256);
            for shift in 0..8usize {
                for value in 0..256usize {
                    // v(x) * x^(8 shift) is the message v followed by
                    // `shift` zero bytes.
                    let mut message = vec![0u8; shift + 1];
                    message[0] = value as u8;
                    tables.push(code.remainder_bytewise(&message));
                }
            }
            code.word_tables = tables;
            code.barrett = code.barrett_constant();
            // x^b * x^r mod g is the remainder of the message x^b: a one
            // and b / 8 zero bytes; shifted up by the padding, it is
            // x^(r' + b) mod g'.
            let padding = (REGISTER_WORDS * 64) as u32 - parity_bits;
            let aligned_power = |bits: usize| {
                let mut message = vec![0u8; bits / 8 + 1];
                message[0] = 1;
                register_shift_left_any(&code.remainder_bytewise(&message), padding)
            };
            let folds = std::array::from_fn(|k| aligned_power(64 * (STEP_WORDS + k)));
            let reductions = std::array::from_fn(|k| aligned_power(64 * k));
            (code.folds, code.reductions) = (folds, reductions);
            code.generator_aligned = register_shift_left_any(&code.generator, padding);
            code.carryless = carryless_multiply_available();
            code.wide = code.carryless && wide_multiply_available();
            code.wide_halves = code.carryless && !code.wide && wide_halves_multiply_available();
        }
        Ok(code)
    }

    /// The generator polynomial of the code over GF(2^`field_bits`)
    /// correcting `correctable_bits`, coefficient of `x^i` at index `i`.
    pub fn generator_for(field_bits: u32, correctable_bits: u32) -> Option<Vec<bool>> {
        if !(FIELD_BITS_MIN..=FIELD_BITS_MAX).contains(&field_bits) || correctable_bits > CORRECTABLE_BITS_MAX {
            return None;
        }
        Some(Bch::field_only(field_bits, correctable_bits, 0).generator_polynomial())
    }

    /// The field tables, without a generator or a message length yet.
    fn field_only(field_bits: u32, correctable_bits: u32, message_bytes: usize) -> Bch {
        let modulus = (1u32 << field_bits) - 1;
        let mut exp = vec![0u16; 2 * modulus as usize + 2];
        let mut log = vec![0u16; modulus as usize + 1];
        let polynomial = PRIMITIVE_POLYNOMIALS[(field_bits - FIELD_BITS_MIN) as usize];
        let mut state = 1u32;
        for power in 0..modulus {
            exp[power as usize] = state as u16;
            exp[(power + modulus) as usize] = state as u16;
            log[state as usize] = power as u16;
            state <<= 1;
            if state >> field_bits != 0 {
                state ^= polynomial;
            }
        }
        Bch {
            field_bits,
            correctable_bits,
            message_bytes,
            parity_bits: 0,
            codeword_bits: 0,
            modulus,
            exp,
            log,
            generator: [0; REGISTER_WORDS],
            byte_table: Vec::new(),
            word_tables: Vec::new(),
            barrett: 0,
            folds: [[0; REGISTER_WORDS]; STEP_WORDS],
            reductions: [[0; REGISTER_WORDS]; STEP_WORDS],
            generator_aligned: [0; REGISTER_WORDS],
            carryless: false,
            wide: false,
            wide_halves: false,
        }
    }

    /// The generator polynomial, coefficient of `x^i` at index `i`.
    pub fn generator_polynomial(&self) -> Vec<bool> {
        let mut covered = vec![false; self.modulus as usize];
        let mut generator = vec![true];
        for root in 1..=2 * self.correctable_bits {
            let root = root % self.modulus;
            if covered[root as usize] {
                continue;
            }
            // The cyclotomic coset of `root`; its minimal polynomial is the
            // product of (x - a^j) over the coset, with binary coefficients.
            let mut coset = Vec::new();
            let mut member = root;
            loop {
                covered[member as usize] = true;
                coset.push(member);
                member = member * 2 % self.modulus;
                if member == root {
                    break;
                }
            }
            let mut minimal = vec![1u16];
            for &power in &coset {
                let element = self.exp[power as usize];
                let mut next = vec![0u16; minimal.len() + 1];
                for (degree, &coefficient) in minimal.iter().enumerate() {
                    next[degree + 1] ^= coefficient;
                    next[degree] ^= self.multiply(coefficient, element);
                }
                minimal = next;
            }
            assert!(minimal.iter().all(|&coefficient| coefficient <= 1), "a minimal polynomial is binary");
            let mut product = vec![false; generator.len() + minimal.len() - 1];
            for (left_degree, &left) in generator.iter().enumerate() {
                for (right_degree, &right) in minimal.iter().enumerate() {
                    if left && right == 1 {
                        product[left_degree + right_degree] ^= true;
                    }
                }
            }
            generator = product;
        }
        generator
    }

    fn multiply(&self, left: u16, right: u16) -> u16 {
        if left == 0 || right == 0 {
            return 0;
        }
        self.exp[(u32::from(self.log[left as usize]) + u32::from(self.log[right as usize])) as usize]
    }

    /// `(value(x) * x^r) mod g(x)`, a bit at a time (the table's source).
    fn remainder_of_byte(&self, value: u8) -> Register {
        let mut register = [0u64; REGISTER_WORDS];
        for bit in (0..8).rev() {
            let feedback = (value >> bit & 1 == 1) ^ register_bit(&register, self.parity_bits - 1);
            register = register_shift_left(&register, 1, self.parity_bits);
            if feedback {
                register_xor(&mut register, &self.generator);
            }
        }
        register
    }

    /// Parity bits per codeword.
    pub fn parity_bits(&self) -> u32 {
        self.parity_bits
    }

    /// Bytes the parity takes.
    pub fn parity_bytes(&self) -> usize {
        self.parity_bits.div_ceil(8) as usize
    }

    /// Bit errors per codeword this code corrects.
    pub fn correctable_bits(&self) -> u32 {
        self.correctable_bits
    }

    pub fn message_bytes(&self) -> usize {
        self.message_bytes
    }

    pub fn field_bits(&self) -> u32 {
        self.field_bits
    }

    fn remainder(&self, message: &[u8]) -> Register {
        assert_eq!(message.len(), self.message_bytes, "a BCH message of the wrong length");
        if self.word_tables.is_empty() {
            return self.remainder_bytewise(message);
        }
        #[cfg(target_arch = "x86_64")]
        if self.wide {
            // SAFETY: `wide` is set only where the processor has AVX2,
            // AVX-512F and VPCLMULQDQ (`wide_multiply_available`).
            return unsafe { self.remainder_wide(message) };
        }
        #[cfg(target_arch = "x86_64")]
        if self.wide_halves {
            // SAFETY: `wide_halves` is set only where the processor has
            // AVX2 and VPCLMULQDQ (`wide_halves_multiply_available`), and
            // PCLMULQDQ (it implies `carryless`).
            return unsafe { self.remainder_wide_halves(message) };
        }
        #[cfg(target_arch = "x86_64")]
        if self.carryless {
            // SAFETY: `carryless` is set only where the processor has
            // PCLMULQDQ (`carryless_multiply_available`).
            return unsafe { self.remainder_carryless(message) };
        }
        self.remainder_tables(message)
    }

    /// The remainder eight bytes a step from the word tables.
    fn remainder_tables(&self, message: &[u8]) -> Register {
        let mask = self.register_mask();
        let mut register = [0u64; REGISTER_WORDS];
        let chunks = message.chunks_exact(8);
        let tail = chunks.remainder();
        // The hot loop of every program: eight bytes in, the register
        // shifted by 64 (a word) and masked to r bits, eight table rows out.
        // Every loop runs over the whole register, a fixed width the
        // compiler unrolls: the words past r are zero in the mask and in
        // every row, so they stay zero. (Tried and left: nibble tables that
        // fit the L1 cache, 1.4x slower; two halves side by side, joined by
        // a shift matrix, 4% faster for the complexity.)
        for chunk in chunks {
            let incoming = u64::from_be_bytes(chunk.try_into().expect("eight bytes"));
            let top = self.register_top_word(&register) ^ incoming;
            let mut shifted = [0u64; REGISTER_WORDS];
            for index in 1..REGISTER_WORDS {
                shifted[index] = register[index - 1] & mask[index];
            }
            register = shifted;
            for (shift, byte) in top.to_le_bytes().into_iter().enumerate() {
                let row = &self.word_tables[shift * 256 + byte as usize];
                for index in 0..REGISTER_WORDS {
                    register[index] ^= row[index];
                }
            }
        }
        self.bytewise_from(register, tail)
    }

    /// The remainder eight bytes a step by carry-less multiplies (r >= 64).
    ///
    /// Work modulo `g'(x) = g(x) * x^d`, with `d` padding r to the
    /// register's fixed width (`r'` bits, so the loops unroll): if
    /// `M x^r = Q g + R` then `M x^r' = Q g' + R x^d`, so the remainder comes
    /// out shifted up by `d` and every word lines up. The state S is one
    /// word wider than `r'` and only congruent to `M x^r' mod g'`; a step
    /// multiplies it by `x^64`, folding its top word `t` back as
    /// `t * (x^(r'+64) mod g')`, and adds the incoming word at `x^r'`. The
    /// chain from one step to the next is one multiply, not a table walk.
    /// One Barrett step reduces S at the end ([`Bch::reduce_aligned`]).
    ///
    /// The state lives in four 128-bit registers and a fifth for its top
    /// word, so nothing moves between vector and general registers in the
    /// loop. The products of the top word with the fold's even words land
    /// on register boundaries; those with its odd words land one word up,
    /// as the shifted state does, so they are added to the state before the
    /// shift and move with it (`alignr`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "pclmulqdq,ssse3")]
    unsafe fn remainder_carryless(&self, message: &[u8]) -> Register {
        use std::arch::x86_64::{
            __m128i, _mm_alignr_epi8, _mm_clmulepi64_si128, _mm_cvtsi64_si128, _mm_loadu_si128, _mm_setzero_si128,
            _mm_slli_si128, _mm_srli_si128, _mm_storeu_si128, _mm_xor_si128,
        };
        const LANES: usize = REGISTER_WORDS / 2;
        // SAFETY (the loads and stores): each names 16 bytes in a u64 array.
        // x^(r' + 64) mod g' is the fold of the lowest top word.
        let mut fold = [_mm_setzero_si128(); LANES];
        for (lane, register) in fold.iter_mut().enumerate() {
            *register = unsafe { _mm_loadu_si128(self.reductions[1][2 * lane..].as_ptr().cast::<__m128i>()) };
        }
        let mut state = [_mm_setzero_si128(); LANES];
        let mut top = _mm_setzero_si128();
        let chunks = message.chunks_exact(8);
        let tail = chunks.remainder();
        for chunk in chunks {
            let incoming = u64::from_be_bytes(chunk.try_into().expect("eight bytes"));
            let mut even = [_mm_setzero_si128(); LANES];
            let mut moving = [_mm_setzero_si128(); LANES];
            for lane in 0..LANES {
                even[lane] = _mm_clmulepi64_si128::<0x00>(top, fold[lane]);
                moving[lane] = _mm_xor_si128(state[lane], _mm_clmulepi64_si128::<0x10>(top, fold[lane]));
            }
            top = _mm_xor_si128(_mm_srli_si128::<8>(moving[LANES - 1]), _mm_cvtsi64_si128(incoming as i64));
            state[0] = _mm_xor_si128(even[0], _mm_slli_si128::<8>(moving[0]));
            for lane in 1..LANES {
                state[lane] = _mm_xor_si128(even[lane], _mm_alignr_epi8::<8>(moving[lane], moving[lane - 1]));
            }
        }
        let mut words = [0u64; REGISTER_WORDS + STEP_WORDS];
        for (lane, register) in state.iter().enumerate() {
            unsafe { _mm_storeu_si128(words[2 * lane..].as_mut_ptr().cast::<__m128i>(), *register) };
        }
        let mut top_words = [0u64; 2];
        unsafe { _mm_storeu_si128(top_words.as_mut_ptr().cast::<__m128i>(), top) };
        words[REGISTER_WORDS] = top_words[0];
        // SAFETY: the processor has PCLMULQDQ (this function's features).
        unsafe { self.reduce_aligned(words, tail) }
    }

    /// The remainder 32 bytes a step by 512-bit carry-less multiplies
    /// (VPCLMULQDQ, four 64-bit products an instruction), r >= 64.
    ///
    /// As [`Bch::remainder_carryless`], but a step multiplies the state by
    /// `x^256`: its low four words move up four, and each of its four top
    /// words `t_k` (at `x^(r' + 64k)`) folds back as
    /// `t_k * (x^(r' + 256 + 64k) mod g')`. The four folds are independent,
    /// so a step waits on one multiply for 32 bytes, and each is two
    /// instructions (the fold's even words, its odd words). A message whose
    /// words are not a multiple of four is led by zero words, which do not
    /// change its polynomial.
    ///
    /// One word a step by 128-bit multiplies took 2.1 µs a 4 KiB page on
    /// an AMD EPYC with AVX-512 (an earlier session's machine): it is bound
    /// by the multiplies' throughput, eight for eight bytes, not by their
    /// latency.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,vpclmulqdq")]
    unsafe fn remainder_wide(&self, message: &[u8]) -> Register {
        use std::arch::x86_64::{
            __m256i, __m512i, _mm256_loadu_si256, _mm256_permute4x64_epi64, _mm256_set_epi8, _mm256_shuffle_epi8,
            _mm512_alignr_epi64, _mm512_inserti64x4, _mm512_loadu_si512, _mm512_setzero_si512, _mm512_shuffle_i64x2,
            _mm512_storeu_si512, _mm512_xor_si512,
        };
        // SAFETY (the loads and stores): each names 64 bytes of a register
        // (eight u64) or 32 bytes of a message block of STEP_BYTES.
        let folds: [__m512i; STEP_WORDS] =
            std::array::from_fn(|k| unsafe { _mm512_loadu_si512(self.folds[k].as_ptr().cast()) });
        // Each 16 bytes reversed: big-endian words w0 w1 | w2 w3 become the
        // lanes [w1, w0 | w3, w2] (low lane first).
        #[rustfmt::skip]
        let reverse = _mm256_set_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
        );
        let mut first = [0u8; STEP_BYTES];
        let (blocks, tail) = step_blocks(message, &mut first);
        let zero = _mm512_setzero_si512();
        let mut state = zero;
        // The top words t0..t3 sit in words 4..7 of `high`; its low words
        // are not used.
        let mut high = zero;
        for block in blocks {
            debug_assert_eq!(block.len(), STEP_BYTES);
            // [t0, t1] and [t2, t3] in every 128-bit lane.
            let low_pair = _mm512_shuffle_i64x2::<0b1010_1010>(high, high);
            let high_pair = _mm512_shuffle_i64x2::<0b1111_1111>(high, high);
            let even = fold_products::<0x00, 0x01>(low_pair, high_pair, &folds);
            let odd = fold_products::<0x10, 0x11>(low_pair, high_pair, &folds);
            // The message's words as [w3, w2, w1, w0] in words 4..7.
            let loaded = unsafe { _mm256_loadu_si256(block.as_ptr().cast::<__m256i>()) };
            let incoming = _mm512_inserti64x4::<1>(
                zero,
                _mm256_permute4x64_epi64::<0b0100_1110>(_mm256_shuffle_epi8(loaded, reverse)),
            );
            // The odd products one word up; the last one's high word
            // (word 8) moved to word 4, where t0 is.
            let odd_shifted = _mm512_alignr_epi64::<7>(odd, zero);
            let carry = _mm512_alignr_epi64::<3>(zero, odd);
            high = _mm512_xor_si512(_mm512_xor_si512(state, incoming), carry);
            state = _mm512_xor_si512(_mm512_xor_si512(even, odd_shifted), _mm512_alignr_epi64::<4>(state, zero));
        }
        let mut words = [0u64; REGISTER_WORDS + STEP_WORDS];
        let mut top_words = [0u64; REGISTER_WORDS];
        unsafe {
            _mm512_storeu_si512(words.as_mut_ptr().cast(), state);
            _mm512_storeu_si512(top_words.as_mut_ptr().cast(), high);
        }
        words[REGISTER_WORDS..].copy_from_slice(&top_words[REGISTER_WORDS - STEP_WORDS..]);
        // SAFETY: the processor has PCLMULQDQ (this function's features).
        unsafe { self.reduce_aligned(words, tail) }
    }

    /// [`Bch::remainder_wide`] on a processor with VPCLMULQDQ but not
    /// AVX-512: the 512-bit state is two 256-bit halves, each of the four
    /// folds is two halves too, and a product instruction takes two 64-bit
    /// products, not four. The step is the same: the state's low half
    /// becomes its high half (the move up four words is a renaming), the
    /// folds' even and odd products are added, the odd ones one word up.
    ///
    /// On an AMD EPYC with VPCLMULQDQ on 256-bit registers and no AVX-512
    /// (`bch_speed`), one word a step (`remainder_carryless`) took 4.2 to
    /// 4.5 µs a 4 KiB page and this loop 1.9 to 2.5 µs: the four folds'
    /// products do not wait on each other within a step.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
    unsafe fn remainder_wide_halves(&self, message: &[u8]) -> Register {
        use std::arch::x86_64::{
            __m256i, _mm256_blend_epi32, _mm256_loadu_si256, _mm256_permute4x64_epi64, _mm256_set_epi8,
            _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_storeu_si256, _mm256_xor_si256,
        };
        // SAFETY (the loads and stores): each names 32 bytes of a register
        // (four of its eight u64) or of a message block of STEP_BYTES.
        let low_folds: [__m256i; STEP_WORDS] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_si256(self.folds[k].as_ptr().cast()) });
        let high_folds: [__m256i; STEP_WORDS] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_si256(self.folds[k][STEP_WORDS..].as_ptr().cast()) });
        #[rustfmt::skip]
        let reverse = _mm256_set_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
        );
        let mut first = [0u8; STEP_BYTES];
        let (blocks, tail) = step_blocks(message, &mut first);
        let zero = _mm256_setzero_si256();
        let (mut state_low, mut state_high) = (zero, zero);
        // The top words t0..t3.
        let mut top = zero;
        for block in blocks {
            debug_assert_eq!(block.len(), STEP_BYTES);
            let low_pair = _mm256_permute4x64_epi64::<0b0100_0100>(top);
            let high_pair = _mm256_permute4x64_epi64::<0b1110_1110>(top);
            let even_low = half_fold_products::<0x00, 0x01>(low_pair, high_pair, &low_folds);
            let even_high = half_fold_products::<0x00, 0x01>(low_pair, high_pair, &high_folds);
            let odd_low = half_fold_products::<0x10, 0x11>(low_pair, high_pair, &low_folds);
            let odd_high = half_fold_products::<0x10, 0x11>(low_pair, high_pair, &high_folds);
            // The odd products one word up: [o3, o0, o1, o2] and
            // [o7, o4, o5, o6] rotated, then o3 and o7 moved to where they
            // go (o7, past the state, to t0's place).
            let rotated_low = _mm256_permute4x64_epi64::<0b1001_0011>(odd_low);
            let rotated_high = _mm256_permute4x64_epi64::<0b1001_0011>(odd_high);
            let shifted_low = _mm256_blend_epi32::<0b0000_0011>(rotated_low, zero);
            let shifted_high = _mm256_blend_epi32::<0b0000_0011>(rotated_high, rotated_low);
            let carry = _mm256_blend_epi32::<0b0000_0011>(zero, rotated_high);
            // The message's words as [w3, w2, w1, w0].
            let loaded = unsafe { _mm256_loadu_si256(block.as_ptr().cast::<__m256i>()) };
            let incoming = _mm256_permute4x64_epi64::<0b0100_1110>(_mm256_shuffle_epi8(loaded, reverse));
            top = _mm256_xor_si256(_mm256_xor_si256(state_high, incoming), carry);
            state_high = _mm256_xor_si256(_mm256_xor_si256(even_high, shifted_high), state_low);
            state_low = _mm256_xor_si256(even_low, shifted_low);
        }
        let mut words = [0u64; REGISTER_WORDS + STEP_WORDS];
        unsafe {
            _mm256_storeu_si256(words.as_mut_ptr().cast(), state_low);
            _mm256_storeu_si256(words[STEP_WORDS..].as_mut_ptr().cast(), state_high);
            _mm256_storeu_si256(words[REGISTER_WORDS..].as_mut_ptr().cast(), top);
        }
        // SAFETY: the processor has PCLMULQDQ (this function's features).
        unsafe { self.reduce_aligned(words, tail) }
    }

    /// The remainder from a state congruent to `M x^r' mod g'` whose words
    /// past `r'` are `top`, and the message's last bytes (under a word).
    /// The top words but the lowest fold back by `x^(r' + 64k) mod g'`,
    /// then one Barrett step takes the last: over GF(2) the quotient
    /// `t + high(t * barrett)` is exact.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "pclmulqdq")]
    unsafe fn reduce_aligned(&self, mut words: [u64; REGISTER_WORDS + STEP_WORDS], tail: &[u8]) -> Register {
        for k in (1..STEP_WORDS).rev() {
            let word = std::mem::take(&mut words[REGISTER_WORDS + k]);
            for (index, &constant_word) in self.reductions[k].iter().enumerate() {
                let (low, high) = carryless_multiply(word, constant_word);
                words[index] ^= low;
                words[index + 1] ^= high;
            }
        }
        let top = words[REGISTER_WORDS];
        let quotient = top ^ carryless_multiply(top, self.barrett).1;
        let mut padded = [0u64; REGISTER_WORDS];
        let mut carry = 0u64;
        for index in 0..REGISTER_WORDS {
            let (low, high) = carryless_multiply(quotient, self.generator_aligned[index]);
            padded[index] = words[index] ^ low ^ carry;
            carry = high;
        }
        debug_assert_eq!(top ^ quotient ^ carry, 0, "Barrett's quotient clears the top word");
        let register = register_shift_right_any(&padded, (REGISTER_WORDS * 64) as u32 - self.parity_bits);
        self.bytewise_from(register, tail)
    }

    /// `floor(x^(r + 64) / g(x))` without its `x^64` term: the quotient
    /// bits a bit-serial division of `x^64 * x^r` feeds back, after the
    /// first.
    fn barrett_constant(&self) -> u64 {
        let mut register = [0u64; REGISTER_WORDS];
        let mut quotient = 0u64;
        for step in 0..65 {
            let feedback = (step == 0) ^ register_bit(&register, self.parity_bits - 1);
            register = register_shift_left(&register, 1, self.parity_bits);
            if feedback {
                register_xor(&mut register, &self.generator);
            }
            if step == 0 {
                assert!(feedback, "x^(r+64) / g has a leading x^64");
            } else {
                quotient = quotient << 1 | u64::from(feedback);
            }
        }
        quotient
    }

    /// The r-bit mask of each register word.
    fn register_mask(&self) -> Register {
        let mut mask = [0u64; REGISTER_WORDS];
        for (index, word) in mask.iter_mut().enumerate() {
            let low = index as u32 * 64;
            *word = if self.parity_bits >= low + 64 {
                u64::MAX
            } else if self.parity_bits > low {
                (1u64 << (self.parity_bits - low)) - 1
            } else {
                0
            };
        }
        mask
    }

    /// The remainder a byte at a time, from any number of bytes (the
    /// tables' source, and the whole loop when r < 64).
    fn remainder_bytewise(&self, message: &[u8]) -> Register {
        self.bytewise_from([0u64; REGISTER_WORDS], message)
    }

    fn bytewise_from(&self, mut register: Register, message: &[u8]) -> Register {
        let mask = self.register_mask();
        // Only the words that hold the r bits take part.
        let words = self.parity_bits.div_ceil(64) as usize;
        for &byte in message {
            let top = self.register_top_byte(&register);
            for index in (1..words).rev() {
                register[index] = (register[index] << 8 | register[index - 1] >> 56) & mask[index];
            }
            register[0] = (register[0] << 8) & mask[0];
            let row = &self.byte_table[(top ^ byte) as usize];
            for index in 0..words {
                register[index] ^= row[index];
            }
        }
        register
    }

    /// Register bits r - 64 .. r, bit 0 the lowest (r >= 64).
    fn register_top_word(&self, register: &Register) -> u64 {
        let offset = self.parity_bits - 64;
        let (word, shift) = ((offset / 64) as usize, offset % 64);
        let mut value = register[word] >> shift;
        if shift > 0 {
            value |= register[word + 1] << (64 - shift);
        }
        value
    }

    fn register_top_byte(&self, register: &Register) -> u8 {
        let offset = self.parity_bits - 8;
        let (word, shift) = ((offset / 64) as usize, offset % 64);
        let mut value = register[word] >> shift;
        if shift > 56 {
            value |= register[word + 1] << (64 - shift);
        }
        value as u8
    }

    /// The parity bytes: the register's r bits as one big-endian number,
    /// padded at its low end to whole bytes (stream bit `i` is the
    /// coefficient of `x^(r - 1 - i)`). A byte at a time, not a bit: the
    /// bit loop was 7% of fileserver's host time.
    fn register_to_bytes(&self, register: &Register, out: &mut [u8]) {
        let bytes = self.parity_bytes();
        let padded = register_shift_left_any(register, bytes as u32 * 8 - self.parity_bits);
        for (index, byte) in out[..bytes].iter_mut().enumerate() {
            let low = (bytes - 1 - index) * 8;
            *byte = (padded[low / 64] >> (low % 64)) as u8;
        }
    }

    fn register_from_bytes(&self, bytes: &[u8]) -> Register {
        let count = self.parity_bytes();
        let mut padded = [0u64; REGISTER_WORDS];
        for (index, &byte) in bytes[..count].iter().enumerate() {
            let low = (count - 1 - index) * 8;
            padded[low / 64] |= u64::from(byte) << (low % 64);
        }
        register_shift_right_any(&padded, count as u32 * 8 - self.parity_bits)
    }

    /// Writes the parity of `message` into `parity` ([`Bch::parity_bytes`]).
    pub fn encode(&self, message: &[u8], parity: &mut [u8]) {
        assert_eq!(parity.len(), self.parity_bytes(), "BCH parity of the wrong length");
        let register = self.remainder(message);
        self.register_to_bytes(&register, parity);
    }

    /// Corrects `message` and `parity` in place. Returns the bits corrected
    /// (0 for a clean codeword), or `None` when there are more errors than
    /// the code corrects and it could tell; then nothing was changed. More
    /// than `t` errors can also be miscorrected into another codeword: the
    /// page signature is what catches that.
    pub fn correct(&self, message: &mut [u8], parity: &mut [u8]) -> Option<u32> {
        assert_eq!(parity.len(), self.parity_bytes(), "BCH parity of the wrong length");
        let mut difference = self.remainder(message);
        register_xor(&mut difference, &self.register_from_bytes(parity));
        if difference.iter().all(|&word| word == 0) {
            return Some(0);
        }
        // Syndromes S_1..S_2t: the difference evaluated at a^j.
        let syndrome_count = 2 * self.correctable_bits as usize;
        let mut syndromes = vec![0u16; syndrome_count];
        for degree in 0..self.parity_bits {
            if register_bit(&difference, degree) {
                for (index, syndrome) in syndromes.iter_mut().enumerate() {
                    let power = (index as u64 + 1) * u64::from(degree) % u64::from(self.modulus);
                    *syndrome ^= self.exp[power as usize];
                }
            }
        }
        let locator = self.berlekamp_massey(&syndromes)?;
        let errors = locator.len() as u32 - 1;
        if errors == 0 || errors > self.correctable_bits {
            return None;
        }
        // Chien search over the shortened code's positions: the error at
        // degree d makes the locator vanish at a^-d. Term i is carried as
        // its logarithm, which drops by i at each step (no modulo in the
        // loop: it runs once per bit of the codeword).
        let mut terms: Vec<(u32, u32)> = locator
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, &coefficient)| coefficient != 0)
            .map(|(power, &coefficient)| (u32::from(self.log[coefficient as usize]), power as u32 % self.modulus))
            .collect();
        let constant = locator[0];
        let mut positions = Vec::with_capacity(errors as usize);
        for degree in 0..self.codeword_bits {
            let sum = terms.iter().fold(constant, |sum, &(log, _)| sum ^ self.exp[log as usize]);
            if sum == 0 {
                positions.push(degree);
                if positions.len() as u32 == errors {
                    break;
                }
            }
            for (log, step) in terms.iter_mut() {
                *log = if *log >= *step { *log - *step } else { *log + self.modulus - *step };
            }
        }
        if positions.len() as u32 != errors {
            return None;
        }
        let message_bits = self.message_bytes as u32 * 8;
        for degree in positions {
            if degree >= self.parity_bits {
                let index = self.codeword_bits - 1 - degree;
                assert!(index < message_bits);
                message[(index / 8) as usize] ^= 0x80 >> (index % 8);
            } else {
                let index = self.parity_bits - 1 - degree;
                parity[(index / 8) as usize] ^= 0x80 >> (index % 8);
            }
        }
        Some(errors)
    }

    /// The error locator, lowest degree first, from the syndromes; `None`
    /// when its degree passes `t`.
    fn berlekamp_massey(&self, syndromes: &[u16]) -> Option<Vec<u16>> {
        let mut current = vec![1u16];
        let mut previous = vec![1u16];
        let mut length = 0usize;
        let mut shift = 1usize;
        let mut previous_discrepancy = 1u16;
        for step in 0..syndromes.len() {
            let mut discrepancy = syndromes[step];
            for index in 1..=length.min(current.len() - 1) {
                discrepancy ^= self.multiply(current[index], syndromes[step - index]);
            }
            if discrepancy == 0 {
                shift += 1;
                continue;
            }
            let scale = self.divide(discrepancy, previous_discrepancy);
            let mut next = current.clone();
            if next.len() < previous.len() + shift {
                next.resize(previous.len() + shift, 0);
            }
            for (index, &coefficient) in previous.iter().enumerate() {
                next[index + shift] ^= self.multiply(scale, coefficient);
            }
            if 2 * length <= step {
                length = step + 1 - length;
                previous = current;
                previous_discrepancy = discrepancy;
                shift = 1;
            } else {
                shift += 1;
            }
            current = next;
        }
        while current.len() > 1 && *current.last().expect("non-empty") == 0 {
            current.pop();
        }
        if current.len() - 1 != length || length > self.correctable_bits as usize {
            return None;
        }
        Some(current)
    }

    fn divide(&self, numerator: u16, denominator: u16) -> u16 {
        assert_ne!(denominator, 0, "division by zero in GF(2^m)");
        if numerator == 0 {
            return 0;
        }
        let log = u32::from(self.log[numerator as usize]) + self.modulus - u32::from(self.log[denominator as usize]);
        self.exp[(log % self.modulus) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::Bch;

    /// Eight bytes a step gives the remainder a byte a step gives, for
    /// parity registers of whole and of partial words.
    #[test]
    fn the_word_loop_agrees_with_the_byte_loop() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        // Word counts of every residue modulo the loop's step, fewer words
        // than a step, and no whole word at all.
        for (field_bits, correctable, message_bytes) in [
            (16, 28, 4168),
            (13, 5, 300),
            (15, 12, 2120),
            (14, 8, 1043),
            (14, 8, 1016),
            (15, 12, 2048),
            (13, 5, 20),
            (13, 5, 7),
            (13, 5, 8),
            // t = 32 in GF(2^16): a register of r = 512 bits, no padding.
            (16, 32, 4168),
        ] {
            let code = Bch::new(field_bits, correctable, message_bytes).unwrap();
            assert!(code.parity_bits() >= 64, "m = {field_bits}, t = {correctable}");
            for _ in 0..8 {
                let message: Vec<u8> = (0..message_bytes).map(|_| crate::test_noise(&mut state) as u8).collect();
                let bytewise = code.remainder_bytewise(&message);
                assert_eq!(code.remainder(&message), bytewise, "m = {field_bits}, t = {correctable}");
                assert_eq!(code.remainder_tables(&message), bytewise, "m = {field_bits}, t = {correctable}");
                assert_eq!(code.carryless, super::carryless_multiply_available());
                assert_eq!(code.wide, code.carryless && super::wide_multiply_available());
                assert_eq!(code.wide_halves, code.carryless && !code.wide && super::wide_halves_multiply_available());
                #[cfg(target_arch = "x86_64")]
                if code.carryless {
                    // SAFETY: the processor has PCLMULQDQ.
                    let carryless = unsafe { code.remainder_carryless(&message) };
                    assert_eq!(carryless, bytewise, "m = {field_bits}, t = {correctable}");
                }
                #[cfg(target_arch = "x86_64")]
                if code.wide {
                    // SAFETY: the processor has AVX2, AVX-512F and VPCLMULQDQ.
                    let wide = unsafe { code.remainder_wide(&message) };
                    assert_eq!(wide, bytewise, "m = {field_bits}, t = {correctable}");
                }
                #[cfg(target_arch = "x86_64")]
                if code.carryless && super::wide_halves_multiply_available() {
                    // SAFETY: the processor has AVX2 and VPCLMULQDQ (and so
                    // PCLMULQDQ), whichever loop `remainder` picked.
                    let halves = unsafe { code.remainder_wide_halves(&message) };
                    assert_eq!(halves, bytewise, "m = {field_bits}, t = {correctable}");
                }
            }
        }
    }

    /// The parity bytes are the register's bits in stream order, as the
    /// bit-by-bit rule of `lib/bch.c` lays them out, and read back whole,
    /// for whole and for partial bytes.
    #[test]
    fn parity_bytes_are_the_register_in_stream_order() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for (field_bits, correctable, message_bytes) in [(16, 28, 4168), (13, 5, 300), (15, 12, 2120), (5, 3, 2)] {
            let code = Bch::new(field_bits, correctable, message_bytes).unwrap();
            for _ in 0..16 {
                let mut register = [0u64; super::REGISTER_WORDS];
                for bit in 0..code.parity_bits() {
                    if crate::test_noise(&mut state) & 1 == 1 {
                        super::register_flip(&mut register, bit);
                    }
                }
                let mut expected = vec![0u8; code.parity_bytes()];
                for index in 0..code.parity_bits() {
                    if super::register_bit(&register, code.parity_bits() - 1 - index) {
                        expected[(index / 8) as usize] |= 0x80 >> (index % 8);
                    }
                }
                let mut out = vec![0u8; code.parity_bytes()];
                code.register_to_bytes(&register, &mut out);
                assert_eq!(out, expected, "m = {field_bits}, t = {correctable}");
                assert_eq!(code.register_from_bytes(&out), register, "m = {field_bits}, t = {correctable}");
            }
        }
    }
}
