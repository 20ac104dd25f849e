//! The page protection's algebra: the GF(2^16) field, the signature's
//! homomorphism with XOR and with `reed-solomon-simd`'s parity, the erasure
//! code's accumulate-and-rebuild, and the BCH code against published
//! generators and its own decoding bound.

use flintfs_format::bch::Bch;
use flintfs_format::erasure::{unit_bytes, ErasureCode};
use flintfs_format::gf::{self, combine_signatures, signature, SYMBOL_CHUNK_BYTES};
use flintfs_format::protection::{self, EccLayout, PROTECTED_OOB_BYTES};
use proptest::prelude::*;

fn bytes_of(len: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_field_is_a_field(a in any::<u16>(), b in any::<u16>(), c in any::<u16>()) {
        prop_assert_eq!(gf::mul(a, b), gf::mul(b, a));
        prop_assert_eq!(gf::mul(gf::mul(a, b), c), gf::mul(a, gf::mul(b, c)));
        prop_assert_eq!(gf::mul(a, b ^ c), gf::mul(a, b) ^ gf::mul(a, c));
        prop_assert_eq!(gf::mul(a, 1), a);
        if a != 0 {
            prop_assert_eq!(gf::mul(a, gf::inverse(a).unwrap()), 1);
        }
    }

    #[test]
    fn the_signature_is_its_definition(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        // sig_j(D) = sum_p D_p * a^((j + 1) * p), symbol p being byte p % 32
        // (low) and byte p % 32 + 32 (high) of chunk p / 32, zero padded.
        let mut padded = bytes.clone();
        padded.resize(bytes.len().div_ceil(SYMBOL_CHUNK_BYTES) * SYMBOL_CHUNK_BYTES, 0);
        let mut expected = [0u16; 4];
        for (chunk_index, chunk) in padded.chunks(SYMBOL_CHUNK_BYTES).enumerate() {
            for index in 0..SYMBOL_CHUNK_BYTES / 2 {
                let symbol = u16::from(chunk[index]) | u16::from(chunk[index + SYMBOL_CHUNK_BYTES / 2]) << 8;
                let position = (chunk_index * SYMBOL_CHUNK_BYTES / 2 + index) as u32;
                for (power, sum) in expected.iter_mut().enumerate() {
                    let exponent = ((power as u64 + 1) * u64::from(position) % u64::from(gf::FIELD_MODULUS)) as u32;
                    *sum ^= gf::mul(symbol, gf::power_of_generator(exponent));
                }
            }
        }
        prop_assert_eq!(signature(&bytes), expected);
    }

    #[test]
    fn the_signature_commutes_with_xor(a in bytes_of(4160), b in bytes_of(4160)) {
        let xored: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x ^ y).collect();
        let expected: Vec<u16> = signature(&a).iter().zip(signature(&b)).map(|(x, y)| x ^ y).collect();
        prop_assert_eq!(signature(&xored).to_vec(), expected);
    }

    #[test]
    fn the_signature_commutes_with_scaling(a in bytes_of(640), factor in any::<u16>()) {
        let mut scaled = vec![0u8; a.len()];
        gf::multiply_add(&mut scaled, &a, factor);
        let expected = combine_signatures(&[(factor, signature(&a))]);
        prop_assert_eq!(signature(&scaled), expected);
    }

    /// The homomorphism against the crate itself: the signatures of its
    /// recovery shards are its encoding of the originals' signatures.
    #[test]
    fn the_signature_commutes_with_reed_solomon_simd(
        data_count in 2usize..20,
        parity_count in 2usize..5,
        seed in any::<u64>(),
    ) {
        let shard_bytes = 640;
        let originals: Vec<Vec<u8>> = (0..data_count)
            .map(|index| pseudo_random_bytes(seed ^ index as u64, shard_bytes))
            .collect();
        let recovery = reed_solomon_simd::encode(data_count, parity_count, &originals).unwrap();
        // Each original's signature as a shard of its own (zero padded):
        // the code is linear symbol by symbol, so its parity is the
        // recovery shards' signatures if the homomorphism holds.
        let signature_shards: Vec<Vec<u8>> = originals
            .iter()
            .map(|shard| {
                let mut out = vec![0u8; SYMBOL_CHUNK_BYTES];
                for (index, symbol) in signature(shard).iter().enumerate() {
                    out[index] = *symbol as u8;
                    out[index + SYMBOL_CHUNK_BYTES / 2] = (*symbol >> 8) as u8;
                }
                out
            })
            .collect();
        let signature_parity = reed_solomon_simd::encode(data_count, parity_count, &signature_shards).unwrap();
        let code = ErasureCode::new(data_count, parity_count).unwrap();
        for (row, shard) in recovery.iter().enumerate() {
            let expected: Vec<u16> = (0..4)
                .map(|index| u16::from(signature_parity[row][index]) | u16::from(signature_parity[row][index + 32]) << 8)
                .collect();
            prop_assert_eq!(signature(shard).to_vec(), expected);
            let terms: Vec<(u16, [u16; 4])> =
                originals.iter().enumerate().map(|(index, shard)| (code.coefficient(row, index), signature(shard))).collect();
            prop_assert_eq!(signature(shard), combine_signatures(&terms));
        }
        // The running parity, accumulated unit by unit, is the crate's.
        let views: Vec<&[u8]> = originals.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(code.encode(&views), recovery);
    }

    #[test]
    fn lost_units_are_rebuilt(
        data_count in 1usize..40,
        parity_count in 1usize..4,
        seed in any::<u64>(),
        lose in proptest::collection::vec(any::<usize>(), 0..4),
    ) {
        let code = ErasureCode::new(data_count, parity_count).unwrap();
        let unit = unit_bytes(512);
        let data: Vec<Vec<u8>> = (0..data_count).map(|index| pseudo_random_bytes(seed.wrapping_add(index as u64), unit)).collect();
        let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = code.encode(&views);
        let whole: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
        let mut units: Vec<Option<Vec<u8>>> = whole.iter().cloned().map(Some).collect();
        let mut lost = std::collections::BTreeSet::new();
        for index in lose.into_iter().take(parity_count) {
            lost.insert(index % units.len());
        }
        for &index in &lost {
            units[index] = None;
        }
        code.reconstruct(&mut units).unwrap();
        for (index, unit) in units.iter().enumerate() {
            prop_assert_eq!(unit.as_ref().unwrap(), &whole[index], "unit {} after losing {:?}", index, lost);
        }
    }

    /// Any change to at most four symbols changes the signature (its four
    /// symbols are a Reed-Solomon syndrome of distance five).
    #[test]
    fn small_changes_are_always_detected(
        page in bytes_of(4160),
        changes in proptest::collection::vec((0usize..2080, 1u16..=u16::MAX), 1..=4),
    ) {
        let mut changed = page.clone();
        let mut positions = std::collections::BTreeMap::new();
        for (position, delta) in changes {
            positions.insert(position, delta);
        }
        for (position, delta) in positions {
            let (chunk, index) = (position / 32, position % 32);
            changed[chunk * 64 + index] ^= delta as u8;
            changed[chunk * 64 + index + 32] ^= (delta >> 8) as u8;
        }
        prop_assert_ne!(signature(&page), signature(&changed));
    }

    #[test]
    fn bch_corrects_up_to_t_errors(
        message in bytes_of(1042),
        flips in proptest::collection::btree_set(0usize..(1042 * 8 + 112), 0..=8),
    ) {
        let code = Bch::new(14, 8, 1042).unwrap();
        prop_assert_eq!(code.parity_bytes(), 14);
        let mut parity = vec![0u8; 14];
        code.encode(&message, &mut parity);
        let (mut received, mut received_parity) = (message.clone(), parity.clone());
        for &bit in &flips {
            if bit < 1042 * 8 {
                received[bit / 8] ^= 0x80 >> (bit % 8);
            } else {
                let bit = bit - 1042 * 8;
                received_parity[bit / 8] ^= 0x80 >> (bit % 8);
            }
        }
        prop_assert_eq!(code.correct(&mut received, &mut received_parity), Some(flips.len() as u32));
        prop_assert_eq!(received, message);
        prop_assert_eq!(received_parity, parity);
    }

    /// Past the bound the decoder either says so or miscorrects into some
    /// codeword; it never panics, and the page signature catches the rest.
    #[test]
    fn bch_past_its_bound_reports_or_the_signature_catches_it(
        data in bytes_of(4096),
        flips in proptest::collection::btree_set(0usize..4096 * 8, 29..80),
    ) {
        let layout = EccLayout::for_geometry(4096, 128).unwrap();
        let mut oob = vec![0u8; 128];
        oob[..64].copy_from_slice(&pseudo_random_bytes(7, 64));
        protection::seal(&data, &mut oob, Some(&layout));
        let (mut damaged, mut damaged_oob) = (data.clone(), oob.clone());
        for &bit in &flips {
            damaged[bit / 8] ^= 0x80 >> (bit % 8);
        }
        let correction = protection::correct(&mut damaged, &mut damaged_oob, &layout);
        if correction.codewords_uncorrectable == 0 {
            prop_assert!(damaged != data || damaged_oob != oob, "29 or more errors cannot be corrected exactly by t = 28");
            prop_assert!(!protection::signature_matches(&damaged, &damaged_oob));
        }
    }

    #[test]
    fn a_sealed_page_corrects_t_errors_per_codeword(
        data in bytes_of(4096),
        header in bytes_of(64),
        flips in proptest::collection::vec(proptest::collection::btree_set(0usize..((4096 + 72) * 8), 0..=28), 1),
    ) {
        let layout = EccLayout::for_geometry(4096, 128).unwrap();
        let mut oob = vec![0u8; 128];
        oob[..64].copy_from_slice(&header);
        protection::seal(&data, &mut oob, Some(&layout));
        prop_assert!(protection::signature_matches(&data, &oob));
        let mut stream: Vec<u8> = data.iter().chain(&oob[..PROTECTED_OOB_BYTES]).copied().collect();
        let mut total = 0;
        for (codeword, bits) in flips.iter().enumerate() {
            for &bit in bits {
                let bit = codeword * (4096 + 72) * 8 + bit;
                stream[bit / 8] ^= 0x80 >> (bit % 8);
                total += 1;
            }
        }
        let mut damaged = stream[..4096].to_vec();
        let mut damaged_oob = oob.clone();
        damaged_oob[..PROTECTED_OOB_BYTES].copy_from_slice(&stream[4096..]);
        let correction = protection::correct(&mut damaged, &mut damaged_oob, &layout);
        prop_assert_eq!(correction.codewords_uncorrectable, 0);
        prop_assert_eq!(correction.bits_corrected, total);
        prop_assert_eq!(damaged, data);
        prop_assert_eq!(damaged_oob, oob);
    }
}

/// Generator polynomials from Lin and Costello's table of primitive BCH
/// codes (Appendix C, octal), with the primitive polynomials it uses,
/// which are those of Linux's `lib/bch.c`.
#[test]
fn bch_generators_match_the_published_table() {
    let published: [(u32, u32, u64); 6] = [
        (4, 2, 0o721),     // (15, 7)
        (4, 3, 0o2467),    // (15, 5)
        (5, 2, 0o3551),    // (31, 21)
        (5, 3, 0o107657),  // (31, 16)
        (6, 2, 0o12471),   // (63, 51)
        (6, 3, 0o1701317), // (63, 45)
    ];
    for (field_bits, correctable, octal) in published {
        let generator = Bch::generator_for(field_bits, correctable).unwrap();
        let value = generator.iter().enumerate().fold(0u64, |value, (degree, &bit)| value | (u64::from(bit) << degree));
        assert_eq!(value, octal, "g(x) for m = {field_bits}, t = {correctable}");
    }
}

#[test]
fn the_default_geometry_gets_one_codeword_of_28_bits() {
    let layout = EccLayout::for_geometry(4096, 128).unwrap();
    assert_eq!((layout.codewords, layout.correctable_bits(), layout.field_bits()), (1, 28, 16));
    assert_eq!(layout.oob_bytes(), 56);
    // 8 KiB pages are too long for one codeword of GF(2^16).
    let large = EccLayout::for_geometry(8192, 256).unwrap();
    assert_eq!((large.codewords, large.correctable_bits(), large.field_bits()), (2, 32, 16));
    // The rest of FORMAT.md's table.
    let two = EccLayout::for_geometry(2048, 96).unwrap();
    assert_eq!((two.codewords, two.correctable_bits(), two.field_bits(), two.oob_bytes()), (1, 12, 15, 24));
    let tiny = EccLayout::for_geometry(512, 128).unwrap();
    assert_eq!((tiny.codewords, tiny.correctable_bits(), tiny.field_bits()), (1, 32, 13));
    assert!(EccLayout::for_geometry(4096, 72).is_none(), "no room past the signature");
    assert!(EccLayout::for_geometry(512, 64).is_none(), "no room for the signature");
    let small = EccLayout::for_geometry(512, 128).unwrap();
    assert!(small.correctable_bits() >= 8, "512-byte pages with a 128-byte OOB: t = {}", small.correctable_bits());
}

#[test]
fn unit_sizes_are_whole_chunks() {
    assert_eq!(unit_bytes(4096), 4224);
    assert_eq!(unit_bytes(512), 640);
}

fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
