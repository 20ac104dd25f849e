//! Host time of the GF(2^16) work each page of a write takes: its 64-bit
//! algebraic signature, and one multiply-add of it into a zone parity row,
//! on whichever rule this processor runs (nibble lookups on 256-bit
//! registers, or tables). An affine rule (GFNI bit matrices on 512-bit
//! registers) was measured with it and not kept: 667 to 689 ns for the
//! signature against 461 on an AMD EPYC.
//!
//! `cargo run --release -p flintfs-format --example gf_speed`

use flintfs_format::gf::{multiply_add, signature};

const ROUNDS: u32 = 200_000;
const PAGE_BYTES: usize = 4096;

fn time(what: &str, mut work: impl FnMut()) {
    let start = std::time::Instant::now();
    for _ in 0..ROUNDS {
        work();
    }
    let nanoseconds = start.elapsed().as_nanos() as f64 / f64::from(ROUNDS);
    println!("{what} of {PAGE_BYTES} bytes: {nanoseconds:.0} ns, {:.2} GB/s", PAGE_BYTES as f64 / nanoseconds);
}

fn main() {
    let page: Vec<u8> = (0..PAGE_BYTES).map(|index| (index * 7 + 3) as u8).collect();
    let mut row = vec![0u8; PAGE_BYTES];
    time("signature", || {
        std::hint::black_box(signature(std::hint::black_box(&page)));
    });
    time("multiply-add", || {
        multiply_add(std::hint::black_box(&mut row), std::hint::black_box(&page), 0x1234);
    });
}
