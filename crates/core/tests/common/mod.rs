//! What several of the core's test files share: the small geometry they
//! run on, file contents that do not compress, and damage past the ECC.
#![allow(dead_code)]

use flintfs_core::protect::Protected;
use flintfs_flash::{Geometry, MemoryFlash, PageFault};

/// 4 KiB pages, 16-page blocks, 4-block zones: small enough that every
/// head has blocks open and zones fill within a test.
pub fn geometry(zone_count: u32, nvm_size_bytes: u64) -> Geometry {
    Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks: 4,
        zone_count,
        open_zones_max: 8,
        nvm_size_bytes,
    }
}

/// A file's bytes: a hash of (index, position), so they do not compress
/// and every block fills its page (the tests place damage by page).
pub fn contents(index: u32) -> Vec<u8> {
    (0..(index as usize % 7 + 1) * 5000)
        .map(|byte| {
            let mut mixed = (u64::from(index) << 32 | byte as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            mixed ^= mixed >> 29;
            (mixed.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 56) as u8
        })
        .collect()
}

/// `length_bytes` of xorshift noise from `seed`: nothing compresses, so
/// every 4 KiB block is a page of its own.
pub fn noise(seed: u64, length_bytes: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Noise that no ECC corrects: a tenth of the page's bits flipped.
pub fn destroyed(seed: u64) -> PageFault {
    PageFault::Disturbed { seed, rate_ppm: 100_000 }
}

/// The NVM region as the engine sees it: its offsets are the wear
/// levelling's logical ones, placed on the device by the protection layer.
pub fn nvm(flash: &mut MemoryFlash) -> Protected<&mut MemoryFlash> {
    Protected::new(flash)
}
