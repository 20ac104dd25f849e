//! `flintfs-bench` as scripts call it: a row per target with the fields
//! tools read, and refusals of bad input. Timings are printed by the
//! runs, never asserted.

use std::path::Path;
use std::process::{Command, Output};

const FLINTFS_BENCH: &str = env!("CARGO_BIN_EXE_flintfs-bench");

fn bench(arguments: &[&str]) -> Output {
    Command::new(FLINTFS_BENCH).args(arguments).output().expect("run flintfs-bench")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(arguments: &[&str]) -> String {
    let output = bench(arguments);
    assert!(
        output.status.success(),
        "flintfs-bench {arguments:?} failed: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

fn refused(arguments: &[&str], expected: &str) {
    let output = bench(arguments);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "flintfs-bench {arguments:?} succeeded");
    assert!(!stderr.contains("panicked"), "flintfs-bench {arguments:?} panicked: {stderr}");
    assert!(stderr.contains(expected), "flintfs-bench {arguments:?}: {stderr:?} does not say {expected:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "more than one line: {stderr:?}");
}

fn fuse_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("skipped: FUSE mounts need /dev/fuse and root (have /dev/fuse: {fuse}, root: {root})");
    }
    root && fuse
}

#[test]
fn a_row_per_target_with_the_fields_tools_read() {
    if !fuse_available() {
        return;
    }
    // The FUSE target mounts with the flintfs binary beside this one,
    // which `cargo test --workspace` builds.
    let flintfs = Path::new(FLINTFS_BENCH).with_file_name("flintfs");
    assert!(flintfs.is_file(), "no {} (cargo build -p flintfs-cli)", flintfs.display());
    let rows: serde_json::Value =
        serde_json::from_str(ok(&["create_fsync", "--quick", "--json"]).trim()).expect("JSON rows");
    let rows = rows.as_array().expect("an array of rows");
    let targets: Vec<&str> = rows.iter().filter_map(|row| row["target"].as_str()).collect();
    // FUSE over io_uring runs where the kernel has it (Linux 6.14 and later).
    let uring = Path::new("/sys/module/fuse/parameters/enable_uring").exists();
    let mut expected = vec!["flintfs", "flintfs-ordered", "flintfs-fuse"];
    expected.extend(uring.then_some("flintfs-uring"));
    expected.extend(["flintfs-nvm", "flintfs-nvm-fuse", "flintfs-block"]);
    assert_eq!(targets, expected, "{rows:?}");
    // Each FUSE row says which transport carried it, and it is the one its
    // target names.
    for (target, transport) in [("flintfs-fuse", "/dev/fuse"), ("flintfs-uring", "io_uring")] {
        if let Some(row) = rows.iter().find(|row| row["target"] == target) {
            assert_eq!(row["fuse_transport"], transport, "{row}");
        }
    }
    // The NVM targets say what NVM took, and their fsyncs no log page.
    for row in rows.iter().filter(|row| row["target"].as_str().is_some_and(|target| target.contains("nvm"))) {
        assert!(row["nvm_bytes_per_op"].as_f64().is_some_and(|bytes| bytes > 0.0), "{row}");
        assert!(row["nvm_persists_per_op"].as_f64().is_some_and(|persists| persists >= 1.0), "{row}");
    }
    let nvm = rows.iter().find(|row| row["target"] == "flintfs-nvm").expect("an NVM row");
    assert_eq!(nvm["log_pages_programmed"], 0, "{nvm}");
    assert!(nvm["nvm_hottest_word_writes_per_million_ops"].as_f64().is_some(), "{nvm}");
    // Levelled, no word ends hotter than the hottest this short run saw,
    // nor below the region's average.
    let levelled = nvm["nvm_levelled_hottest_word_writes_per_million_ops"].as_f64().expect("levelled wear");
    let mean = nvm["nvm_region_mean_word_writes_per_million_ops"].as_f64().expect("mean wear");
    let hottest = nvm["nvm_hottest_word_writes_per_million_ops"].as_f64().expect("hottest word");
    assert!(mean > 0.0 && mean <= levelled && levelled <= hottest, "{nvm}");
    for row in rows {
        for field in [
            "workload",
            "target",
            "ops",
            "ops_per_s",
            "bytes_per_op",
            "pages_programmed",
            "erases",
            "device_time_ns_per_op",
            "mount_pages_read",
            "peak_rss_bytes",
        ] {
            assert!(row.get(field).is_some(), "a row lacks {field}: {row}");
        }
        assert_eq!(row["ops"], 2000, "{row}");
        assert!(row["bytes_per_op"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["ops_per_s"].as_f64().unwrap() > 0.0, "{row}");
    }
}

#[test]
fn filebench_rows_time_the_sync_after_the_loop() {
    // The loop's rate leaves out what a target still buffers at its end;
    // the timed sync after it says what making that durable cost.
    let row: serde_json::Value =
        serde_json::from_str(ok(&["fileserver", "--quick", "--target", "flintfs", "--json"]).trim())
            .expect("a JSON row");
    let sync = row["sync_after_seconds"].as_f64().expect("the sync's seconds");
    let with_sync = row["ops_per_s_with_sync"].as_f64().expect("the rate with the sync");
    let rate = row["ops_per_s"].as_f64().expect("the loop's rate");
    assert!(sync >= 0.0, "{row}");
    assert!(with_sync > 0.0 && with_sync <= rate, "{row}");
}

#[test]
fn bad_input_gets_one_clear_line() {
    refused(&["sideways", "--quick"], "unknown workload");
    refused(&["delete", "--quick", "--peers", "ntfs"], "unknown peer");
    refused(&["delete", "--seed", "many"], "invalid value");
}

#[test]
fn the_fuse_floor_is_sent_the_requests_flintfs_fuse_is() {
    if !fuse_available() {
        return;
    }
    // The floor is a daemon that does no work; it measures what flintfs
    // over FUSE could make of a workload only if the kernel sends it the
    // same requests, which meeting the kernel as flintfs does is for.
    let row = |target: &str| -> serde_json::Value {
        serde_json::from_str(ok(&["delete", "--quick", "--target", target, "--json"]).trim()).expect("a JSON row")
    };
    let floor = row("fuse-floor");
    let fuse = row("flintfs-fuse");
    assert_eq!(floor["ops"], fuse["ops"], "{floor} {fuse}");
    assert!(floor["ops_per_s"].as_f64().is_some_and(|ops| ops > 0.0), "{floor}");
    let requests = |row: &serde_json::Value| row["fuse_requests_per_op"].as_f64().expect("requests per operation");
    // An unlink of a name not cached is a LOOKUP, the UNLINK and the
    // SETATTR of the ctime the kernel keeps (docs/BENCHMARKS.md).
    assert!((requests(&floor) - requests(&fuse)).abs() < 0.01, "{floor} {fuse}");
    assert!(requests(&floor) >= 2.0, "{floor}");
}
