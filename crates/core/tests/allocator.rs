//! Log heads and zone allocation: pages land at their role's head, records
//! never straddle zones, the unindexed list is renewed by a checkpoint, a
//! full device says ENOSPC, and sequence numbers stay strictly increasing
//! across power cuts.

use std::collections::BTreeSet;

use flintfs_core::{errno, mkfs, MkfsOptions, PageMeta, Volume};
use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash, PageAddress};
use flintfs_format::{PageKind, ZoneRole};

fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: 512,
        oob_size_bytes: 128,
        block_pages: 4,
        zone_blocks: 2,
        zone_count: 16,
        open_zones_max: 6,
        nvm_size_bytes: 0,
    }
}

/// The allocator's own rules on exact zone capacities: parity would take a
/// quarter of these 4-page blocks (its layout is tested on its own).
fn mkfs_options() -> MkfsOptions {
    MkfsOptions {
        unindexed_segments: 3,
        block_parity_pages: 0,
        segment_parity_blocks: 0,
        ..MkfsOptions::new([2; 16], 0)
    }
}

fn mounted(geometry: Geometry, faults: FaultConfig) -> Volume<MemoryFlash> {
    let mut flash = MemoryFlash::memory(geometry, DeviceOptions { faults, ..DeviceOptions::default() }).unwrap();
    mkfs(&mut flash, &mkfs_options()).unwrap();
    Volume::mount(flash).unwrap().0
}

fn node_page(tag: u64) -> Vec<u8> {
    let mut data = vec![0u8; 512];
    data[..8].copy_from_slice(&tag.to_le_bytes());
    data
}

/// A page of the kind each role's zones hold.
fn meta_for(role: ZoneRole) -> PageMeta {
    let kind = match role {
        ZoneRole::HotData | ZoneRole::ColdData => PageKind::DataBlock,
        ZoneRole::Log => PageKind::Log,
        _ => PageKind::Node,
    };
    PageMeta::new(kind, 8)
}

fn meta() -> PageMeta {
    meta_for(ZoneRole::Node)
}

/// Appends as the engine does: every page written is referenced, so a
/// checkpoint never frees its zone.
trait Counted {
    fn append_counted(&mut self, role: ZoneRole, meta: PageMeta, data: &[u8]) -> flintfs_core::Result<PageAddress>;
    fn append_run_counted(
        &mut self,
        role: ZoneRole,
        pages: &[(PageMeta, &[u8])],
    ) -> flintfs_core::Result<Vec<PageAddress>>;
}

impl<D: flintfs_flash::FlashDevice> Counted for Volume<D> {
    fn append_counted(&mut self, role: ZoneRole, meta: PageMeta, data: &[u8]) -> flintfs_core::Result<PageAddress> {
        Ok(self.append_run_counted(role, &[(meta, data)])?[0])
    }

    fn append_run_counted(
        &mut self,
        role: ZoneRole,
        pages: &[(PageMeta, &[u8])],
    ) -> flintfs_core::Result<Vec<PageAddress>> {
        let addresses = self.append_run(role, pages)?;
        for (address, (_, data)) in addresses.iter().zip(pages) {
            self.account(address.zone, data.len() as i64);
        }
        Ok(addresses)
    }
}

#[test]
fn pages_go_to_their_roles_head_and_read_back_verified() {
    let mut volume = mounted(geometry(), FaultConfig::none(0));
    let mut written = Vec::new();
    for tag in 0..20u64 {
        let role = if tag % 2 == 0 { ZoneRole::Node } else { ZoneRole::HotData };
        let address = volume.append_counted(role, meta_for(role), &node_page(tag)).unwrap();
        written.push((role, address, tag));
    }
    let node_zones: BTreeSet<u32> =
        written.iter().filter(|(role, _, _)| *role == ZoneRole::Node).map(|(_, address, _)| address.zone).collect();
    let data_zones: BTreeSet<u32> =
        written.iter().filter(|(role, _, _)| *role == ZoneRole::HotData).map(|(_, address, _)| address.zone).collect();
    assert!(node_zones.is_disjoint(&data_zones), "roles never share a zone");
    assert_eq!(node_zones.len(), 2, "ten pages fill one 8-page zone and start another");
    for (role, address, tag) in &written {
        let (header, data) = volume.read_page(*address).unwrap();
        assert_eq!(data, node_page(*tag));
        assert_eq!(volume.checkpoint().zones[address.zone as usize].role, *role);
        assert_eq!(header.zone_generation, volume.checkpoint().zones[address.zone as usize].generation);
    }
}

#[test]
fn a_run_of_pages_never_straddles_zones() {
    let mut volume = mounted(geometry(), FaultConfig::none(0));
    for tag in 0..5u64 {
        volume.append_counted(ZoneRole::Log, meta_for(ZoneRole::Log), &node_page(tag)).unwrap();
    }
    let pages: Vec<Vec<u8>> = (0..4u64).map(node_page).collect();
    let run: Vec<(PageMeta, &[u8])> = pages.iter().map(|page| (meta_for(ZoneRole::Log), page.as_slice())).collect();
    let addresses = volume.append_run_counted(ZoneRole::Log, &run).unwrap();
    assert!(addresses.windows(2).all(|pair| pair[0].zone == pair[1].zone && pair[0].page + 1 == pair[1].page));
    assert_eq!(addresses[0].page, 0, "the run did not fit after 5 pages of an 8-page zone, so it opened a new one");
}

#[test]
fn running_out_of_unindexed_zones_takes_free_zones_and_a_full_device_says_enospc() {
    let mut volume = mounted(geometry(), FaultConfig::none(0));
    let first = volume.checkpoint().number;
    let mut error = None;
    for tag in 0..10_000u64 {
        if let Err(failure) = volume.append_counted(ZoneRole::HotData, meta_for(ZoneRole::HotData), &node_page(tag)) {
            error = Some(failure);
            break;
        }
    }
    assert_eq!(volume.checkpoint().number, first, "the engine, not the allocator, decides when to checkpoint");
    let error = error.expect("a device without a cleaner fills up");
    assert_eq!(error.errno, errno::ENOSPC, "{error}");
    // What was written is still readable after a clean remount.
    volume.write_checkpoint().unwrap();
    let (mut remounted, _) = Volume::mount(volume.into_device()).unwrap();
    let head = remounted.checkpoint().heads.iter().find(|head| head.role == ZoneRole::HotData).copied().unwrap();
    let (header, _) = remounted.read_page(PageAddress::new(head.zone, head.write_pointer - 1)).unwrap();
    assert_eq!(header.kind, PageKind::DataBlock);
}

/// Every page that verifies in its zone's current generation: its sequence
/// and where it is.
fn valid_sequences(volume: &mut Volume<MemoryFlash>) -> Vec<(u64, PageAddress)> {
    let mut sequences = Vec::new();
    for report in volume.device().report_zones() {
        if volume.checkpoint().zones[report.zone as usize].role == ZoneRole::Free {
            continue;
        }
        for page in 0..report.write_pointer {
            if let Ok((header, _)) = volume.read_page(PageAddress::new(report.zone, page)) {
                sequences.push((header.sequence, PageAddress::new(report.zone, page)));
            }
        }
    }
    sequences
}

/// Appends to every role, single pages and runs of three, with a checkpoint
/// now and then; returns the last checkpoint known complete and, if an
/// error stopped the workload, the one that may have been in flight (taken
/// explicitly or by an append that ran out of unindexed zones).
fn busy_workload(volume: &mut Volume<MemoryFlash>) -> (u64, Option<u64>) {
    let roles = [ZoneRole::HotData, ZoneRole::ColdData, ZoneRole::Node, ZoneRole::Log];
    let pages: Vec<Vec<u8>> = (0..3u64).map(node_page).collect();
    for step in 0..36u64 {
        let completed = volume.checkpoint().number;
        let role = roles[step as usize % 4];
        let run: Vec<(PageMeta, &[u8])> = pages.iter().map(|page| (meta_for(role), page.as_slice())).collect();
        let written = if step % 5 == 4 {
            volume.append_run_counted(role, &run).map(|_| ())
        } else {
            volume.append_counted(role, meta_for(role), &node_page(step)).map(|_| ())
        };
        let checkpointed =
            written.and_then(|()| if step % 11 == 10 { volume.write_checkpoint().map(|_| ()) } else { Ok(()) });
        if checkpointed.is_err() {
            return (completed.max(volume.checkpoint().number), Some(volume.checkpoint().number + 1));
        }
    }
    (volume.checkpoint().number, None)
}

#[test]
fn every_role_works_within_the_open_zone_limit() {
    let mut volume = mounted(geometry(), FaultConfig::none(0));
    assert_eq!(geometry().open_zones_max, flintfs_core::OPEN_ZONES_NEEDED);
    let (_, stopped) = busy_workload(&mut volume);
    assert_eq!(stopped, None);
    let roles: std::collections::HashSet<ZoneRole> = volume.checkpoint().heads.iter().map(|head| head.role).collect();
    assert_eq!(roles.len(), 4);
    let check = volume.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.findings);
    assert!(check.pages_checked > 36);
    let too_few = Geometry { open_zones_max: flintfs_core::OPEN_ZONES_NEEDED - 1, ..geometry() };
    let mut flash = MemoryFlash::memory(too_few, DeviceOptions::default()).unwrap();
    let error = mkfs(&mut flash, &MkfsOptions { unindexed_segments: 3, ..MkfsOptions::new([2; 16], 0) }).unwrap_err();
    assert!(error.message.contains("open zones"), "{error}");
}

#[test]
fn a_power_cut_anywhere_keeps_checkpoints_sequences_and_heads_sound() {
    let geometry = geometry();
    let mut probe = mounted(geometry, FaultConfig::none(0));
    let start = probe.device().mutating_operations();
    busy_workload(&mut probe);
    let operations = probe.device().mutating_operations() - start;
    assert!(operations > 60, "{operations} device operations");
    let mut in_flight_survived = 0;
    for operation in 0..operations {
        for seed in 0..3 {
            let faults = FaultConfig { interrupted_erase_probability: 0.5, ..FaultConfig::none(seed) };
            let mut volume = mounted(geometry, faults);
            let at = volume.device().mutating_operations() + operation;
            volume.device_mut().schedule_power_cut(at, seed).unwrap();
            let (completed, in_flight) = busy_workload(&mut volume);
            let context = format!("cut at operation {operation}, seed {seed}");
            let mut flash = volume.into_device();
            assert!(flash.is_powered_off(), "{context}: the cut fired");
            flash.power_on().unwrap();
            let (mut volume, report) = Volume::mount(flash).unwrap_or_else(|error| panic!("{context}: {error}"));
            assert_eq!(report.head_pages_missing, 0, "{context}: a checkpoint outran its data: {report:?}");
            let number = volume.checkpoint().number;
            if Some(number) == in_flight {
                in_flight_survived += 1;
            } else {
                assert_eq!(number, completed, "{context}: {report:?}");
            }
            // Every role can append again, and no valid page shares a
            // sequence number with another.
            for role in [ZoneRole::HotData, ZoneRole::ColdData, ZoneRole::Node, ZoneRole::Log] {
                volume
                    .append_counted(role, meta_for(role), &node_page(7))
                    .unwrap_or_else(|error| panic!("{context}: {role:?}: {error}"));
            }
            let mut sequences = valid_sequences(&mut volume);
            sequences.sort();
            let reused: Vec<_> = sequences.windows(2).filter(|pair| pair[0].0 == pair[1].0).collect();
            assert!(reused.is_empty(), "{context}: sequence numbers reused: {reused:?}");
            let check = volume.check().unwrap();
            assert!(check.is_clean(), "{context}: {:?}", check.findings);
        }
    }
    assert!(in_flight_survived > 0);
}

#[test]
fn the_checker_finds_a_lost_write_and_a_page_of_the_wrong_kind() {
    // Every program misdirected: pages read back erased where they should
    // not, and victims are over-programmed.
    let faults = FaultConfig { misdirected_write_probability: 1.0, ..FaultConfig::none(3) };
    let mut volume = mounted(geometry(), FaultConfig::none(0));
    for tag in 0..3u64 {
        volume.append_counted(ZoneRole::Node, meta(), &node_page(tag)).unwrap();
    }
    volume.device_mut().flush().unwrap();
    assert!(volume.check().unwrap().is_clean());
    // A Log page in the Node zone.
    volume.append_counted(ZoneRole::Node, meta_for(ZoneRole::Log), &node_page(9)).unwrap();
    let findings = volume.check().unwrap().findings;
    assert!(findings.iter().any(|finding| finding.contains("a Log page in a Node zone")), "{findings:?}");
    // A device whose writes go astray, after a clean start: format and
    // mount cleanly, then reopen the image with every write misdirected.
    let directory = std::env::temp_dir().join(format!("flintfs-check-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("astray.img");
    let _ = std::fs::remove_file(&path);
    let mut flash = flintfs_flash::ImageFlash::create_image(&path, geometry(), DeviceOptions::default()).unwrap();
    mkfs(&mut flash, &mkfs_options()).unwrap();
    drop(flash);
    let astray = DeviceOptions { faults, ..DeviceOptions::default() };
    let flash = flintfs_flash::ImageFlash::open_image(&path, astray).unwrap();
    let (mut volume, _) = Volume::mount(flash).unwrap();
    for tag in 0..3u64 {
        volume.append_counted(ZoneRole::Node, meta(), &node_page(tag)).unwrap();
    }
    volume.device_mut().flush().unwrap();
    let report = volume.check().unwrap();
    assert!(
        report.findings.iter().any(|finding| finding.contains("checksum") || finding.contains("erased")),
        "misdirected writes went unnoticed: {:?}",
        report.findings
    );
    drop(volume);
    std::fs::remove_dir_all(&directory).unwrap();
}
