//! The cleaner under fill, delete and refill: no ENOSPC before the target
//! fill, every byte back, a clean checker after every cycle, and wear
//! spread evenly. The full-size run (1 GiB, 20 cycles) is the example
//! `cargo run --release -p flintfs-testkit --example fill`.

use flintfs_core::FsOptions;
use flintfs_flash::Geometry;
use flintfs_testkit::fill::{run_fill, FillSetup};

#[test]
fn fill_delete_refill_on_a_small_device() {
    let geometry = Geometry {
        page_size_bytes: 4096,
        oob_size_bytes: 64,
        block_pages: 16,
        zone_blocks: 2,
        zone_count: 48,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    };
    let setup = FillSetup {
        geometry,
        options: FsOptions::smallest(4096),
        cycles: 8,
        fill_per_mille: 950,
        file_blocks_max: 12,
        check: true,
        seed: 7,
    };
    let report = run_fill(&setup).unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("{report:#?}");
    assert_eq!(report.early_enospc, 0, "no ENOSPC before {} per mille", setup.fill_per_mille);
    assert!(report.zones_cleaned > 0, "the cleaner ran");
    assert!(report.erase_count_max as f64 <= 1.5 * report.erase_count_mean.max(1.0), "{report:?}");
}
