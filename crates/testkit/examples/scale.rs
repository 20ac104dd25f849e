//! Instant mount and RAM against the number of files.
//!
//! `cargo run --release -p flintfs-testkit --example scale -- FILES [FILES_PER_DIRECTORY]`
//!
//! Formats an image-file device (so the device's bytes live in the host's
//! page cache, not in this process), creates FILES empty files spread over
//! directories through the engine's API (holding no references, as a
//! kernel under memory pressure would not), unmounts, and mounts again.
//! Prints the pages the mount read, and resident memory (peak and now)
//! beside the configured cache bound.

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, ImageFlash};

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let files: u64 = arguments.get(1).and_then(|value| value.parse().ok()).unwrap_or(100_000);
    let per_directory: u64 = arguments.get(2).and_then(|value| value.parse().ok()).unwrap_or(10_000);
    let directory = tempfile_directory();
    let path = directory.join("scale.img");
    let geometry = Geometry::with_size_bytes(2 << 30);
    let options = FsOptions::default();
    println!(
        "configuration: {files} files, {per_directory} per directory, device {} MiB of {}-byte pages, node cache {} \
         KiB, data buffer {} KiB, read cache {} KiB",
        geometry.device_size_bytes() >> 20,
        geometry.page_size_bytes,
        options.node_cache_bytes >> 10,
        options.data_buffer_bytes >> 10,
        options.read_cache_bytes >> 10
    );
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = ImageFlash::create_image(&path, geometry, DeviceOptions::default()).expect("image");
    let flash = Fs::format(flash, &MkfsOptions::new([8; 16], 0), Box::new(clock.clone())).expect("format");
    let rss_start = status_kib("VmRSS:");
    let (mut fs, _) = Fs::mount(flash, options.clone(), Box::new(clock.clone())).expect("mount");
    let started = std::time::Instant::now();
    let mut parent = 1;
    for index in 0..files {
        if index % per_directory == 0 {
            parent = fs.mkdir(1, format!("d{}", index / per_directory).as_bytes(), 0o755, 0, 0).expect("mkdir").ino;
        }
        let file = fs.create(parent, format!("file-{index:08}").as_bytes(), 0o644, 0, 0).expect("create");
        fs.forget(file.ino, 1).expect("forget");
    }
    let (memory_used, memory_bound) = fs.memory_bytes();
    let known = fs.known_files();
    let flash = fs.unmount().expect("unmount");
    let create_seconds = started.elapsed().as_secs_f64();
    let rss_peak = status_kib("VmHWM:");
    let pages_before = flash.counters().pages_read;
    let mount_started = std::time::Instant::now();
    let (mut fs, report) = Fs::mount(flash, options, Box::new(clock)).expect("remount");
    let mount_ms = mount_started.elapsed().as_secs_f64() * 1000.0;
    let mount_pages = fs.device().counters().pages_read - pages_before;
    // The first write after mount: allocation state comes from the
    // checkpoint, so it walks nothing.
    let pages_before = fs.device().counters().pages_read;
    let file = fs.create(1, b"after-mount", 0o644, 0, 0).expect("create after mount");
    fs.write(file.ino, 0, &[1; 4096]).expect("write after mount");
    let first_write_pages = fs.device().counters().pages_read - pages_before;
    // Names looked up cold (right after mount): page reads per lookup, for
    // directories of `per_directory` entries.
    let mut lookup_pages = Vec::new();
    for sample in 0..10u64 {
        let index = (sample * 7_919_993 + 12_345) % files.max(1);
        let before = fs.device().counters().pages_read;
        let directory = fs.lookup(1, format!("d{}", index / per_directory).as_bytes()).expect("directory");
        let after_directory = fs.device().counters().pages_read;
        let file = fs.lookup(directory.ino, format!("file-{index:08}").as_bytes()).expect("lookup");
        let after = fs.device().counters().pages_read;
        fs.forget(file.ino, 1).expect("forget");
        fs.forget(directory.ino, 1).expect("forget");
        lookup_pages.push((after_directory - before, after - after_directory));
    }
    println!("created {files} files in {create_seconds:.1} s");
    println!(
        "cold lookups of 10 names in directories of {per_directory} entries, page reads (directory, then name): {lookup_pages:?}"
    );
    println!(
        "clean mount: {mount_pages} pages read ({} by the volume's own count), {mount_ms:.2} ms host time",
        report.pages_read
    );
    println!("first create and 4 KiB write after mount: {first_write_pages} pages read");
    println!(
        "memory: resident at start {} KiB, peak {} KiB (growth {} KiB); engine caches and tables {} KiB of a {} KiB \
         bound; {known} files remembered at the end",
        rss_start,
        rss_peak,
        rss_peak.saturating_sub(rss_start),
        memory_used >> 10,
        memory_bound >> 10
    );
    drop(fs);
    let _ = std::fs::remove_dir_all(&directory);
}

fn tempfile_directory() -> std::path::PathBuf {
    let directory = std::env::temp_dir().join(format!("flintfs-scale-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temporary directory");
    directory
}
