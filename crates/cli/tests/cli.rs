//! Every `flintfs` subcommand, called as users call it: the names and JSON
//! fields other tools rely on, the refusals of bad input (one line on
//! stderr, a non-zero exit, no panic), and a live FUSE mount through
//! mount, stat, powercut, recovery, umount and fsck.
//!
//! The mount tests need /dev/fuse and the right to mount (root here);
//! where either is missing they say so and pass without running.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const FLINTFS: &str = env!("CARGO_BIN_EXE_flintfs");

fn flintfs(arguments: &[&str]) -> Output {
    Command::new(FLINTFS).args(arguments).env("FLINTFS_LOG", "warn").output().expect("run flintfs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs and expects success; returns stdout.
fn ok(arguments: &[&str]) -> String {
    let output = flintfs(arguments);
    assert!(output.status.success(), "flintfs {arguments:?} failed: {}{}", text(&output.stdout), text(&output.stderr));
    text(&output.stdout)
}

/// Runs and expects a refusal: non-zero, one line on stderr that contains
/// `expected`, and no panic.
fn refused(arguments: &[&str], expected: &str) {
    let output = flintfs(arguments);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "flintfs {arguments:?} succeeded: {}", text(&output.stdout));
    assert!(!stderr.contains("panicked"), "flintfs {arguments:?} panicked: {stderr}");
    assert!(stderr.contains(expected), "flintfs {arguments:?}: {stderr:?} does not say {expected:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "more than one line: {stderr:?}");
}

fn path_text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// A digest of a file's bytes, read a piece at a time (an image is
/// hundreds of megabytes): equal digests, an unchanged file.
fn digest(path: &str) -> u64 {
    use std::hash::Hasher;
    use std::io::Read;
    let mut file = std::fs::File::open(path).unwrap();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut piece = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut piece).unwrap();
        if read == 0 {
            return hasher.finish();
        }
        hasher.write(&piece[..read]);
    }
}

/// fsck without `--repair`, inspect and stat only look: `image` stays
/// byte for byte as it was, though opening it, and the mount fsck makes
/// (a recovery's replay and checkpoint included), write.
fn looking_leaves(image: &str) {
    let before = digest(image);
    assert_eq!(json(&ok(&["fsck", image, "--json"]))["clean"], true);
    json(&ok(&["inspect", image, "checkpoint", "--json"]));
    json(&ok(&["stat", image, "--json"]));
    assert_eq!(digest(image), before, "looking at {image} changed it");
}

fn json(output: &str) -> serde_json::Value {
    serde_json::from_str(output.trim()).unwrap_or_else(|error| panic!("not JSON ({error}): {output}"))
}

#[test]
fn mkfs_inspect_fsck_and_stat_on_an_image() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let image = directory.path().join("a.img");
    let image = path_text(&image);
    let made = ok(&["mkfs", image, "--size", "128M", "--nvm-size", "64K"]);
    assert!(made.contains("flintfs format"), "{made}");
    refused(&["mkfs", image, "--size", "128M"], "already holds a flintfs image");
    refused(
        &["mkfs", image, "--size", "128M", "--force", "--page-size", "2048", "--oob-size", "64"],
        "cannot hold a page's header and signature",
    );
    ok(&["mkfs", image, "--size", "128M", "--force", "--page-size", "2048", "--oob-size", "96"]);

    let geometry = json(&ok(&["inspect", image, "geometry", "--json"]));
    for field in ["page_size", "oob_size", "block_pages", "zone_blocks", "zone_count", "nvm_size"] {
        assert!(geometry[field].is_u64(), "geometry lacks {field}: {geometry}");
    }
    assert_eq!(geometry["page_size"], 2048);
    assert_eq!(geometry["oob_size"], 96);

    let zones = json(&ok(&["inspect", image, "zones", "--json"]));
    let zones = zones.as_array().expect("a list of zones");
    assert_eq!(zones.len() as u64, geometry["zone_count"].as_u64().unwrap());
    for field in ["zone", "state", "write_pointer", "capacity", "role", "valid_bytes", "erase_count"] {
        assert!(!zones[0][field].is_null(), "zone lacks {field}: {}", zones[0]);
    }
    assert_eq!(zones[0]["role"], "superblock");
    let superblock = json(&ok(&["inspect", image, "superblock", "--json"]));
    assert_eq!(superblock["format_version"], flintfs_format::FORMAT_VERSION);
    let checkpoint = json(&ok(&["inspect", image, "checkpoint", "--json"]));
    assert!(checkpoint["number"].as_u64().unwrap() >= 1, "{checkpoint}");
    let wear = json(&ok(&["inspect", image, "wear", "--json"]));
    assert!(wear["erase_count_max"].is_u64(), "{wear}");
    let page = json(&ok(&["inspect", image, "page", "0:0", "--json"]));
    assert_eq!(page["header"]["kind"], "Superblock", "{page}");
    assert!(ok(&["inspect", image]).contains("checkpoint:"));
    refused(&["inspect", image, "page", "99999:0"], "outside the device");
    refused(&["inspect", image, "page"], "needs an address");

    let fsck = json(&ok(&["fsck", image, "--json"]));
    assert_eq!(fsck["clean"], true, "{fsck}");
    looking_leaves(image);
    // A repair opens the image for real: its new epoch at least is written
    // (a clean, unchanged tree needs no checkpoint; after a cut the
    // recovery's is written, which the live-mount test shows).
    let before = digest(image);
    assert_eq!(json(&ok(&["fsck", image, "--repair", "--json"]))["clean"], true);
    assert_ne!(digest(image), before, "a repair wrote nothing");

    let stat = json(&ok(&["stat", image, "--json"]));
    for field in [
        "pages_read",
        "oob_reads",
        "pages_programmed",
        "data_bytes_programmed",
        "oob_bytes_programmed",
        "erases",
        "flushes",
        "nvm_bytes_written",
        "nvm_persists",
        "device_time_ns",
    ] {
        assert!(stat[field].is_u64(), "stat lacks {field}: {stat}");
    }
    assert!(stat["pages_programmed"].as_u64().unwrap() > 0, "lifetime totals include mkfs: {stat}");
    let crash = json(&ok(&["crashtest", "--mode", "random", "--cuts", "120", "--seed", "3", "--json"]));
    for field in ["workloads", "cuts", "violations"] {
        assert!(crash[field].is_u64(), "crashtest lacks {field}: {crash}");
    }
    assert_eq!(crash["cuts"], 120);
    assert_eq!(crash["violations"], 0, "{crash}");
    assert!(crash["failures"].as_array().is_some_and(Vec::is_empty), "{crash}");
    let ordered = json(&ok(&["crashtest", "--mode", "random", "--cuts", "120", "--fsync", "ordered", "--json"]));
    assert_eq!(ordered["violations"], 0, "{ordered}");
    refused(&["crashtest", "--mode", "sideways"], "invalid value");
    for subcommand in ["mkfs", "mount", "fsck", "inspect", "stat", "powercut", "crashtest", "demo"] {
        assert!(ok(&[subcommand, "--help"]).contains("Usage"), "{subcommand} --help");
    }
}

#[test]
fn mkfs_preallocate_writes_the_whole_image_and_it_checks_clean() {
    use std::os::unix::fs::MetadataExt;
    let directory = tempfile::tempdir().expect("temporary directory");
    let sparse = directory.path().join("sparse.img");
    let full = directory.path().join("full.img");
    ok(&["mkfs", path_text(&sparse), "--size", "96M", "--quiet"]);
    ok(&["mkfs", path_text(&full), "--size", "96M", "--quiet", "--preallocate"]);
    let allocated = |path: &Path| std::fs::metadata(path).unwrap().blocks() * 512;
    let length = std::fs::metadata(&full).unwrap().len();
    assert_eq!(length, std::fs::metadata(&sparse).unwrap().len(), "the same size either way");
    // Copy-on-write hosts may share or compress the zeros; every other
    // one gives the file all of its blocks.
    assert!(allocated(&full) >= length, "{} of {length} bytes allocated", allocated(&full));
    if allocated(&sparse) < length / 2 {
        assert!(allocated(&sparse) < allocated(&full), "the default image stays sparse");
    }
    let fsck = json(&ok(&["fsck", path_text(&full), "--json"]));
    assert_eq!(fsck["clean"], true, "{fsck}");
    // mkfs.flintfs passes it on.
    let helper = directory.path().join("helper.img");
    let output = Command::new(FLINTFS)
        .arg0("mkfs.flintfs")
        .args(["--preallocate", "-q", path_text(&helper), "96M"])
        .output()
        .expect("run mkfs.flintfs");
    assert!(output.status.success(), "{}{}", text(&output.stdout), text(&output.stderr));
    assert!(allocated(&helper) >= length, "mkfs.flintfs --preallocate: {} bytes allocated", allocated(&helper));
}

#[test]
fn the_block_backend_on_a_regular_file() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let device = directory.path().join("disk");
    let device = path_text(&device);
    refused(&["mkfs", device, "--backend", "block"], "give a size");
    refused(&["mkfs", device, "--backend", "block", "--size", "4M"], "flintfs needs at least");
    refused(&["mkfs", device, "--backend", "block", "--size", "96M", "--preallocate"], "for emulator images");
    let made = ok(&["mkfs", device, "--backend", "block", "--size", "96M"]);
    assert!(made.contains("block backend"), "{made}");
    let geometry = json(&ok(&["inspect", device, "geometry", "--json"]));
    assert_eq!(geometry["backend"], "block", "{geometry}");
    let fsck = json(&ok(&["fsck", device, "--json"]));
    assert_eq!(fsck["clean"], true, "{fsck}");
    looking_leaves(device);
    // What holds a file system is refused unless --force, by name.
    refused(&["mkfs", device, "--backend", "block"], "holds a flintfs file system (block backend); --force");
    ok(&["mkfs", device, "--backend", "block", "--force", "--quiet"]);
    let image = directory.path().join("image");
    let image = path_text(&image);
    ok(&["mkfs", image, "--size", "128M"]);
    refused(&["mkfs", image, "--backend", "block"], "holds a flintfs image; --force");
    // An existing file holding nothing is formatted at its own size.
    let empty = directory.path().join("empty");
    std::fs::File::create(&empty).unwrap().set_len(96 << 20).unwrap();
    ok(&["mkfs", path_text(&empty), "--backend", "block"]);
    // Lifetime counters, as an image keeps them: mkfs's checkpoint
    // programmed pages, and its close recorded them (a fsck writes none).
    let lifetime = json(&ok(&["stat", device, "--json"]));
    assert!(lifetime["pages_programmed"].as_u64().unwrap() > 0, "{lifetime}");
    assert!(lifetime["flushes"].as_u64().unwrap() > 0, "{lifetime}");
}

#[test]
fn bad_input_gets_one_clear_line() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let root = directory.path();
    let image = root.join("a.img");
    let image = path_text(&image);
    refused(&["mkfs", image, "--size", "1M"], "flintfs needs at least");
    refused(&["mkfs", image, "--size", "12Q"], "unknown unit");
    refused(&["mkfs", image, "--size", "128M", "--page-size", "3000"], "page_size_bytes");
    let missing = root.join("missing.img");
    refused(&["fsck", path_text(&missing)], "No such file");
    refused(&["fsck", path_text(root)], "not an image file");
    let text_file = root.join("notes.txt");
    std::fs::write(&text_file, b"not an image at all, just some words").unwrap();
    refused(&["fsck", path_text(&text_file)], "image");
    refused(&["mkfs", path_text(&text_file), "--size", "128M"], "already exists");

    // An image of another format version: the header's version field, with
    // its checksum made good, in both header copies.
    ok(&["mkfs", image, "--size", "128M"]);
    let mut bytes = std::fs::read(image).unwrap();
    for slot in [0usize, 4096] {
        bytes[slot + 8..slot + 12].copy_from_slice(&99u32.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[slot..slot + 4092]);
        bytes[slot + 4092..slot + 4096].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(image, &bytes).unwrap();
    refused(&["fsck", image], "format version 99");
    let mountpoint = root.join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    refused(&["mount", image, path_text(&mountpoint)], "format version 99");

    ok(&["mkfs", image, "--size", "128M", "--force"]);
    refused(&["mount", path_text(&missing), path_text(&mountpoint)], "No such file");
    refused(&["mount", image, path_text(&mountpoint), "-o", "colour=blue"], "unknown mount option");
    refused(&["mount", image, path_text(&mountpoint), "-o", "node_cache=lots"], "option node_cache");
    refused(&["mount", image, path_text(&mountpoint), "-o", "fsync=sometimes"], "wp-check, ordered or unchecked");
    refused(&["mount", image, path_text(&mountpoint), "-o", "nobarrier=1"], "unknown mount option");
    refused(&["mount", image, path_text(&mountpoint), "-o", "readahead=1G"], "option readahead=1G: at most 64 MiB");
    refused(&["mount", image, path_text(&text_file)], "not a directory");
    std::fs::write(mountpoint.join("file"), b"x").unwrap();
    refused(&["mount", image, path_text(&mountpoint)], "not empty");
    refused(&["powercut", path_text(root)], "not a flintfs mount");
    refused(&["stat", path_text(root)], "not a flintfs mount");
}

/// Whether FUSE mounts can be made here.
fn fuse_available() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("skipped: FUSE mounts need /dev/fuse and root (have /dev/fuse: {fuse}, root: {root})");
    }
    root && fuse
}

struct Mounted {
    mountpoint: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if table.contains(&format!(" {} ", self.mountpoint.display())) {
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

/// The kernel's readahead window for the mount at `mountpoint`, in KiB,
/// or None where sysfs cannot be written (a container's read-only /sys:
/// the mount keeps the kernel's window, and says so in its log).
fn readahead_kb(mountpoint: &Path) -> Option<u64> {
    let path = flintfs_fuse::readahead_path(mountpoint).expect("stat the mount");
    if std::fs::OpenOptions::new().write(true).open(&path).is_err() {
        eprintln!("readahead not checked: {path} cannot be written here");
        return None;
    }
    Some(std::fs::read_to_string(&path).expect("the mount's read_ahead_kb").trim().parse().expect("a number"))
}

fn umount(mountpoint: &Path) {
    let status = Command::new("umount").arg(mountpoint).status().expect("umount");
    assert!(status.success(), "umount {}", mountpoint.display());
}

#[test]
fn a_live_mount_through_stat_powercut_recovery_and_fsck() {
    if !fuse_available() {
        return;
    }
    let directory = tempfile::tempdir().expect("temporary directory");
    let image = directory.path().join("a.img");
    let image = path_text(&image);
    let mountpoint = directory.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let _guard = Mounted { mountpoint: mountpoint.clone() };
    let mnt = path_text(&mountpoint);
    ok(&["mkfs", image, "--size", "256M"]);
    ok(&["mount", image, mnt, "-o", "node_cache=4M,read_cache=2M,fsync=wp-check,readahead=1M"]);
    if let Some(kb) = readahead_kb(&mountpoint) {
        assert_eq!(kb, 1024, "-o readahead=1M");
    }
    refused(&["mount", image, mnt], "already a mount point");
    let other = directory.path().join("other");
    std::fs::create_dir(&other).unwrap();
    refused(&["mount", image, path_text(&other)], "in use");

    // Durable: written, then fsynced. Volatile: written after.
    let durable = mountpoint.join("durable");
    std::fs::create_dir(&durable).unwrap();
    for index in 0..50 {
        let mut file = std::fs::File::create(durable.join(format!("f{index}"))).unwrap();
        std::io::Write::write_all(&mut file, &vec![index as u8; 1000 + index * 300]).unwrap();
        file.sync_all().unwrap();
    }
    std::fs::File::open(&durable).unwrap().sync_all().unwrap();
    unsafe { libc::sync() };
    std::fs::write(mountpoint.join("volatile"), vec![7u8; 300_000]).unwrap();

    let stat = json(&ok(&["stat", mnt, "--json"]));
    assert!(stat["mount_pages_read"].is_u64(), "{stat}");
    assert!(stat["pages_programmed"].as_u64().unwrap() > 0, "{stat}");
    assert!(stat["flushes"].as_u64().unwrap() > 0, "sync flushed: {stat}");

    let cut = ok(&["powercut", mnt, "--seed", "11"]);
    assert!(cut.contains("power cut"), "{cut}");
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(&format!(" {mnt} ")), "the mount point is released after a power cut");
    // The cut left a log to replay: fsck's mount replays it and takes a
    // checkpoint, in a scratch view; the image waits for its real mount.
    let checkpoint = json(&ok(&["inspect", image, "checkpoint", "--json"]))["number"].as_u64().unwrap();
    looking_leaves(image);
    assert_eq!(json(&ok(&["inspect", image, "checkpoint", "--json"]))["number"], checkpoint);
    // A copy repaired takes the recovery's checkpoint; the image itself
    // waits for its mount, which recovers it below.
    let copy = directory.path().join("copy.img");
    std::fs::copy(image, &copy).unwrap();
    assert_eq!(json(&ok(&["fsck", path_text(&copy), "--repair", "--json"]))["clean"], true);
    let repaired = json(&ok(&["inspect", path_text(&copy), "checkpoint", "--json"]))["number"].as_u64().unwrap();
    assert!(
        repaired > checkpoint,
        "a repair after the cut wrote the recovery's checkpoint: {checkpoint} then {repaired}"
    );
    std::fs::remove_file(&copy).unwrap();

    // Recovery is the next mount.
    ok(&["mount", image, mnt]);
    if let Some(kb) = readahead_kb(&mountpoint) {
        assert_eq!(kb, flintfs_fuse::READAHEAD_BYTES_DEFAULT / 1024, "the default readahead");
    }
    for index in 0..50 {
        let found = std::fs::read(durable.join(format!("f{index}"))).unwrap();
        assert_eq!(found, vec![index as u8; 1000 + index * 300], "synced file f{index} after the cut");
    }
    let stat = json(&ok(&["stat", mnt, "--json"]));
    assert!(stat["mount_pages_read"].as_u64().unwrap() > 0, "{stat}");

    // A mount right after umount returns waits for the old daemon's
    // checkpoint and finds everything.
    std::fs::write(mountpoint.join("last"), b"written just before umount").unwrap();
    umount(&mountpoint);
    let start = Instant::now();
    ok(&["mount", image, mnt]);
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(std::fs::read(mountpoint.join("last")).unwrap(), b"written just before umount");
    umount(&mountpoint);
    let fsck = json(&ok(&["fsck", image, "--json"]));
    assert_eq!(fsck["clean"], true, "{fsck}");
}

#[test]
fn the_demo_runs_the_main_job_and_reports_every_fsynced_file_intact() {
    if !fuse_available() {
        return;
    }
    let out = ok(&["demo", "--files", "300", "--size", "256M", "--seed", "4"]);
    assert!(out.contains("fsynced files intact (promised)"), "{out}");
    assert!(out.contains("bytes programmed / byte"), "{out}");
    assert!(out.contains("fsck:") && out.contains("clean"), "{out}");
    assert!(out.contains("demo finished"), "{out}");
}

#[test]
fn bench_runs_the_flintfs_bench_binary_or_says_how_to_build_it() {
    // cargo builds every binary of the workspace for `cargo test
    // --workspace`; a lone `-p flintfs-cli` run may not have it.
    let beside = Path::new(FLINTFS).with_file_name("flintfs-bench");
    if beside.is_file() {
        let help = ok(&["bench", "--help"]);
        assert!(help.contains("Usage: flintfs-bench"), "{help}");
        refused(&["bench", "sideways", "--quick"], "unknown workload");
    } else {
        refused(&["bench", "create_fsync", "--quick"], "cargo build --release -p flintfs-bench");
    }
}
