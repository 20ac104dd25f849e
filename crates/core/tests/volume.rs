//! mkfs, clean mount and checkpoints, including a power cut at every device
//! operation of a workload.

use flintfs_core::{errno, mkfs, zones_min, MkfsOptions, Volume};
use flintfs_flash::{DeviceOptions, FaultConfig, Geometry, MemoryFlash};

fn options() -> MkfsOptions {
    MkfsOptions { unindexed_segments: 2, ..MkfsOptions::new([9; 16], 1_700_000_000_000_000_000) }
}

/// Small zones so checkpoint zones fill and alternate quickly.
fn small_geometry() -> Geometry {
    Geometry {
        page_size_bytes: 512,
        oob_size_bytes: 128,
        block_pages: 4,
        zone_blocks: 2,
        zone_count: 14,
        open_zones_max: 6,
        nvm_size_bytes: 0,
    }
}

fn device(geometry: Geometry, faults: FaultConfig) -> MemoryFlash {
    MemoryFlash::memory(geometry, DeviceOptions { faults, ..DeviceOptions::default() }).unwrap()
}

#[test]
fn mkfs_then_mount_reads_a_handful_of_pages() {
    let mut flash = device(Geometry::with_size_bytes(256 << 20), FaultConfig::none(1));
    mkfs(&mut flash, &MkfsOptions::new([1; 16], 0)).unwrap();
    let (volume, report) = Volume::mount(flash).unwrap();
    assert_eq!(report.checkpoint_number, 1);
    assert_eq!(report.pages_read, 2, "the superblock and a one-page checkpoint: {report:?}");
    assert_eq!(volume.superblock().uuid, [1; 16]);
    assert_eq!(volume.checkpoint().zones.len(), 64);
    assert_eq!(volume.checkpoint().unindexed.len(), 8);
}

#[test]
fn a_device_too_small_is_refused_with_the_minimum() {
    let needed = zones_min(2);
    let geometry = Geometry { zone_count: needed - 1, ..small_geometry() };
    let mut flash = device(geometry, FaultConfig::none(1));
    let error = mkfs(&mut flash, &options()).unwrap_err();
    assert_eq!(error.errno, errno::ENOSPC);
    assert!(
        error.message.contains("too small") && error.message.contains(&format!("at least {needed} zones")),
        "{error}"
    );
    let geometry = Geometry { zone_count: needed, ..small_geometry() };
    mkfs(&mut device(geometry, FaultConfig::none(1)), &options()).unwrap();
}

#[test]
fn an_unformatted_device_is_refused_clearly() {
    let flash = device(small_geometry(), FaultConfig::none(1));
    let error = Volume::mount(flash).err().unwrap();
    assert_eq!(error.errno, errno::EIO);
    assert!(error.message.contains("no valid superblock"), "{error}");
}

#[test]
fn checkpoints_alternate_zones_and_the_newest_wins() {
    let mut flash = device(small_geometry(), FaultConfig::none(1));
    mkfs(&mut flash, &options()).unwrap();
    let (mut volume, _) = Volume::mount(flash).unwrap();
    let mut zones_used = std::collections::BTreeSet::new();
    for round in 0..40u64 {
        let ino = volume.count_inode_created();
        let number = volume.write_checkpoint().unwrap();
        let (remounted, report) = Volume::mount(volume.into_device()).unwrap();
        assert_eq!(report.checkpoint_number, number, "round {round}");
        assert_eq!(remounted.checkpoint().ino_next, ino + 1);
        assert!(report.pages_read <= 4, "mount stays cheap: {report:?}");
        zones_used.insert(report.checkpoint_zone);
        volume = remounted;
    }
    assert_eq!(zones_used.len(), 2, "both checkpoint zones were used");
}

/// mkfs, then checkpoints that each allocate an inode, until the workload
/// ends or the device loses power. Returns the last checkpoint whose write
/// returned, and the one in flight when power went.
/// A checkpoint's number and the inode number it would allocate next.
type CheckpointState = (u64, u64);

fn workload(flash: MemoryFlash, checkpoints: u64) -> (MemoryFlash, Option<CheckpointState>, Option<CheckpointState>) {
    let mut flash = flash;
    if let Err(error) = mkfs(&mut flash, &options()) {
        assert!(error.message.contains("power was cut"), "{error}");
        return (flash, None, None);
    }
    let (mut volume, report) = Volume::mount(flash).expect("mount right after mkfs");
    let mut completed = Some((report.checkpoint_number, volume.checkpoint().ino_next));
    for _ in 0..checkpoints {
        volume.count_inode_created();
        let in_flight = (volume.checkpoint().number + 1, volume.checkpoint().ino_next);
        match volume.write_checkpoint() {
            Ok(_) => completed = Some(in_flight),
            Err(error) => {
                assert!(error.message.contains("power was cut"), "{error}");
                return (volume.into_device(), completed, Some(in_flight));
            }
        }
    }
    (volume.into_device(), completed, None)
}

#[test]
fn a_power_cut_at_every_operation_remounts_to_the_last_checkpoint() {
    const CHECKPOINTS: u64 = 24;
    let geometry = small_geometry();
    let faults = FaultConfig { interrupted_erase_probability: 0.5, ..FaultConfig::none(0) };
    let (probe, _, _) = workload(device(geometry, faults.clone()), CHECKPOINTS);
    let operations = probe.mutating_operations();
    assert!(operations > 50, "the workload has {operations} device operations");
    let mut cuts = 0;
    let mut in_flight_survived = 0;
    for operation in 0..operations {
        for seed in 0..4 {
            let mut flash = device(geometry, faults.clone());
            flash.schedule_power_cut(operation, seed).unwrap();
            let (mut flash, completed, in_flight) = workload(flash, CHECKPOINTS);
            assert!(flash.is_powered_off(), "operation {operation}: the cut fired");
            flash.power_on().unwrap();
            cuts += 1;
            let context = format!("cut at operation {operation}, seed {seed}");
            let Some((number, ino_next)) = completed else {
                // mkfs never finished: a mount may find nothing, or (when
                // the cut came at mkfs's last step) the first checkpoint.
                if let Ok((volume, _)) = Volume::mount(flash) {
                    assert_eq!(volume.checkpoint().number, 1, "{context}");
                }
                continue;
            };
            let (volume, report) = Volume::mount(flash).unwrap_or_else(|error| panic!("{context}: {error}"));
            let found = (volume.checkpoint().number, volume.checkpoint().ino_next);
            if Some(found) == in_flight {
                in_flight_survived += 1;
            } else {
                assert_eq!(found, (number, ino_next), "{context}: {report:?}");
            }
            let mut volume = volume;
            let check = volume.check().unwrap();
            assert!(check.is_clean(), "{context}: {:?}", check.findings);
            // The volume goes on working after recovery.
            volume.count_inode_created();
            volume.write_checkpoint().unwrap_or_else(|error| panic!("{context}: checkpoint after remount: {error}"));
        }
    }
    assert!(cuts > 200);
    assert!(in_flight_survived > 0, "some cuts land after the in-flight checkpoint became durable");
}

#[test]
fn an_image_device_survives_a_remount_in_another_open() {
    let directory = std::env::temp_dir().join(format!("flintfs-core-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("volume.img");
    let _ = std::fs::remove_file(&path);
    let mut flash =
        flintfs_flash::ImageFlash::create_image(&path, Geometry::with_size_bytes(128 << 20), DeviceOptions::default())
            .unwrap();
    mkfs(&mut flash, &MkfsOptions::new([3; 16], 5)).unwrap();
    let (mut volume, _) = Volume::mount(flash).unwrap();
    let ino = volume.count_inode_created();
    volume.write_checkpoint().unwrap();
    drop(volume);
    let flash = flintfs_flash::ImageFlash::open_image(&path, DeviceOptions::default()).unwrap();
    let (volume, report) = Volume::mount(flash).unwrap();
    assert_eq!(volume.checkpoint().ino_next, ino + 1);
    assert_eq!(report.checkpoint_number, 2);
    drop(volume);
    std::fs::remove_dir_all(&directory).unwrap();
}
