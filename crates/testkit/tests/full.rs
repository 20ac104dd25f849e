//! A device filled to ENOSPC by one large file, written the way the FUSE
//! mount writes (128 KiB requests): the unlink that follows must work, and
//! writing works again after it. (Found on a real mount: pages free in the
//! data head were counted as room for nodes, so data took the last zones
//! and a checkpoint's flush then took the unlink reserve.)

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions, ROOT_INO};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash};

fn full_then_unlink(geometry: Geometry, request_bytes: usize) {
    let device = MemoryFlash::memory(geometry, DeviceOptions::default()).expect("device");
    let clock = ManualClock::new(1_000_000_000);
    let device = Fs::format(device, &MkfsOptions::new([7; 16], 1), Box::new(clock.clone())).expect("format");
    let (mut fs, _) = Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).expect("mount");
    let file = fs.create(ROOT_INO, b"fill", 0o644, 0, 0).expect("create").ino;
    // Bytes that do not compress: the capacity statfs promises is of raw
    // blocks, so ENOSPC is checked against it with data that takes it.
    let mut state = 0x5a5a_u64;
    let chunk: Vec<u8> = (0..request_bytes)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect();
    let mut offset = 0u64;
    let error = loop {
        match fs.write(file, offset, &chunk) {
            Ok(written) => offset += written as u64,
            Err(error) => break error,
        }
        clock.advance(1_000_000);
    };
    assert_eq!(error.errno, flintfs_core::errno::ENOSPC, "{error:?}");
    let statfs = fs.statfs().expect("statfs");
    eprintln!(
        "{} bytes written of {} before ENOSPC; statfs {} blocks, {} free; cleaner {:?}",
        offset,
        geometry.device_size_bytes(),
        statfs.blocks,
        statfs.blocks_free,
        fs.cleaner_counters()
    );
    // ENOSPC comes at the size statfs promised, not before, not after.
    assert!(
        statfs.blocks_free * 100 <= statfs.blocks * 5,
        "ENOSPC with {} of {} blocks free",
        statfs.blocks_free,
        statfs.blocks
    );
    assert!(offset / 4096 <= statfs.blocks, "more written than statfs said fits");
    fs.forget(file, 1).expect("forget");
    fs.unlink(ROOT_INO, b"fill").unwrap_or_else(|error| panic!("unlink on a full device: {error:?}"));
    let again = fs.create(ROOT_INO, b"again", 0o644, 0, 0).expect("create after unlink").ino;
    // Most of what the unlink gave back, straight away: the zones it
    // emptied come back at the checkpoint the write asks for.
    let again_bytes = offset * 3 / 4;
    let mut position = 0;
    while position < again_bytes {
        position += fs.write(again, position, &chunk).expect("write after unlink") as u64;
    }
    fs.sync().expect("sync");
    let report = fs.check().expect("check");
    assert!(report.is_clean(), "{:?}", report.findings);
    let device = fs.unmount().expect("unmount");
    assert!(device.counters().pages_programmed > 0);
}

#[test]
fn a_device_filled_by_large_writes_still_unlinks() {
    full_then_unlink(Geometry::with_size_bytes(96 << 20), 128 << 10);
}

#[test]
fn a_device_filled_by_one_megabyte_writes_still_unlinks() {
    full_then_unlink(Geometry::with_size_bytes(96 << 20), 1 << 20);
}
