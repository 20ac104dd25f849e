//! Fill, delete, refill at full size: issue 3's bar.
//!
//! `cargo run --release -p flintfs-testkit --example fill -- [SIZE_MIB] [CYCLES] [SEED]`
//! (defaults: 1024 MiB, 20 cycles, seed 1).
//!
//! Writes files of 1 to 256 blocks until the device is 95% full (of what
//! statfs reports), deletes half at random, and starts again, checking
//! every byte it samples and everything after a final remount; the checker
//! runs after every cycle. Prints the configuration and the figures:
//! ENOSPC before 95%, the cleaner's write amplification, max/mean erase
//! count, and the p99 and maximum simulated device time of 4 KiB-block
//! writes at 90% full and over.

use flintfs_core::FsOptions;
use flintfs_flash::Geometry;
use flintfs_testkit::fill::{run_fill, FillSetup};

fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let size_mib: u64 = arguments.get(1).and_then(|value| value.parse().ok()).unwrap_or(1024);
    let cycles: u32 = arguments.get(2).and_then(|value| value.parse().ok()).unwrap_or(20);
    let seed: u64 = arguments.get(3).and_then(|value| value.parse().ok()).unwrap_or(1);
    let geometry = Geometry::with_size_bytes(size_mib << 20);
    let setup = FillSetup {
        geometry,
        options: FsOptions::default(),
        cycles,
        fill_per_mille: 950,
        file_blocks_max: 256,
        check: true,
        seed,
    };
    println!(
        "configuration: {size_mib} MiB device ({} zones of {} pages of {} bytes, {} pages per block), {cycles} \
         cycles to 95% full then half deleted, files of 1 to {} blocks, seed {seed}, default caches",
        geometry.zone_count,
        geometry.zone_pages(),
        geometry.page_size_bytes,
        geometry.block_pages,
        setup.file_blocks_max
    );
    let started = std::time::Instant::now();
    match run_fill(&setup) {
        Ok(report) => {
            println!(
                "cycles: {}, files written: {}, bytes written: {}",
                report.cycles, report.files_written, report.bytes_written
            );
            println!("ENOSPC before 95%: {}", report.early_enospc);
            println!(
                "cleaner: {} zones cleaned, write amplification {:.3} (bytes moved per byte written)",
                report.zones_cleaned, report.cleaner_write_amplification
            );
            println!(
                "wear: max erase count {}, mean {:.2}, max/mean {:.3}",
                report.erase_count_max,
                report.erase_count_mean,
                f64::from(report.erase_count_max) / report.erase_count_mean.max(1e-9)
            );
            println!(
                "4 KiB write calls at >= 90% full ({} samples): p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms simulated \
                 device time",
                report.latency_samples_at_90,
                report.latency_p99_ns_at_90 as f64 / 1e6,
                report.latency_p999_ns_at_90 as f64 / 1e6,
                report.latency_max_ns_at_90 as f64 / 1e6
            );
            println!("host time: {:.1} s", started.elapsed().as_secs_f64());
        }
        Err(failure) => {
            eprintln!("FAILED: {failure}");
            std::process::exit(1);
        }
    }
}
