//! Instant mount: after a clean unmount, mount reads the superblock, the
//! last page of each checkpoint zone, the rest of the newest checkpoint
//! and the root, and nothing whose count grows with the number of files; the first write after mount walks nothing either.
//! CI compares 100 files with 20,000; the example `scale` reports 100
//! against 100,000 and 1,000,000.

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash};

/// Pages a clean mount reads, and pages the first create and write read,
/// with `files` files in directories of 5,000.
fn mount_pages(files: u64) -> (u64, u64) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(Geometry::with_size_bytes(256 << 20), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([4; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let mut parent = 1;
    for index in 0..files {
        if index % 5000 == 0 {
            parent = fs.mkdir(1, format!("d{}", index / 5000).as_bytes(), 0o755, 0, 0).unwrap().ino;
        }
        let file = fs.create(parent, format!("file-{index:08}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    let flash = fs.unmount().unwrap();
    let before = flash.counters().pages_read;
    let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let mounted = fs.device().counters().pages_read - before;
    assert_eq!(mounted, report.pages_read, "the mount report counts every page read");
    let before = fs.device().counters().pages_read;
    let file = fs.create(1, b"after-mount", 0o644, 0, 0).unwrap();
    fs.write(file.ino, 0, &[1; 4096]).unwrap();
    let first_write = fs.device().counters().pages_read - before;
    let check = fs.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.findings);
    (mounted, first_write)
}

#[test]
fn a_clean_mount_reads_the_same_pages_for_100_and_20000_files() {
    let (few, few_first_write) = mount_pages(100);
    let (many, many_first_write) = mount_pages(20_000);
    eprintln!(
        "mount pages: {few} with 100 files, {many} with 20,000; first write: {few_first_write} and {many_first_write}"
    );
    assert!(few.abs_diff(many) <= 2, "mount reads {few} pages with 100 files and {many} with 20,000");
    // The superblock, the last page of each checkpoint zone, the rest of
    // the newest record, and the root's page (docs/FORMAT.md): at most 8.
    assert!(many <= 8, "a clean mount reads a handful of pages, not {many}");
    assert!(many_first_write <= 4, "the first write after mount reads {many_first_write} pages");
}
