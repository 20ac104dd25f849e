//! Host time of the per-page ECC: one BCH encode of a default page's
//! protected stream (4 KiB of data and 72 bytes of OOB, GF(2^16), t = 28),
//! on whichever encoder this processor runs (512-bit carry-less, the same
//! step on 256-bit halves, 128-bit carry-less, or tables).
//!
//! `cargo run --release -p flintfs-format --example bch_speed`

use flintfs_format::bch::Bch;
use flintfs_format::protection::EccLayout;

const ROUNDS: u32 = 200_000;

fn main() {
    let layout = EccLayout::for_geometry(4096, 128).expect("the default geometry has an ECC");
    let code = Bch::new(layout.field_bits(), layout.correctable_bits(), layout.codeword_message_bytes)
        .expect("the layout's code");
    let message: Vec<u8> = (0..layout.codeword_message_bytes).map(|index| (index * 7 + 3) as u8).collect();
    let mut parity = vec![0u8; code.parity_bytes()];
    let start = std::time::Instant::now();
    for _ in 0..ROUNDS {
        code.encode(std::hint::black_box(&message), &mut parity);
        std::hint::black_box(&parity);
    }
    let nanoseconds = start.elapsed().as_nanos() as f64 / f64::from(ROUNDS);
    println!(
        "BCH encode of {} bytes (GF(2^{}), t = {}, {} codeword): {nanoseconds:.0} ns, {:.2} GB/s",
        message.len(),
        layout.field_bits(),
        layout.correctable_bits(),
        layout.codewords,
        message.len() as f64 / nanoseconds
    );
}
