//! Hostile images: a checkpoint record with a valid frame (page headers,
//! record header, checksums) but any payload at all, so that what is
//! explored is what mount does with content that passes every checksum.
//! Mount either refuses it with an error or mounts something the checker,
//! appends and the next checkpoint can live with; never a panic. Used by
//! the property test in `tests/hostile.rs` and the libFuzzer target
//! `fuzz/fuzz_targets/mount.rs`.

use flintfs_core::{mkfs, MkfsOptions, PageMeta, Volume};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash, PageAddress};
use flintfs_format::{split_record, InvertedIndex, PageHeader, PageKind, RecordKind, ZoneRole, PAGE_HEADER_BYTES};

/// A small device: 16 zones of 16 pages of 512 bytes.
pub fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: 512,
        oob_size_bytes: 64,
        block_pages: 4,
        zone_blocks: 4,
        zone_count: 16,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

/// A formatted device with a well-framed checkpoint record carrying
/// `payload` in checkpoint zone 3, newer than anything mkfs wrote.
pub fn hostile_device(payload: &[u8]) -> MemoryFlash {
    let geometry = geometry();
    let mut flash = MemoryFlash::memory(geometry, DeviceOptions::default()).unwrap();
    mkfs(&mut flash, &MkfsOptions { unindexed_segments: 3, ..MkfsOptions::new([1; 16], 0) }).unwrap();
    let capacity = flash.report_zone(3).unwrap().capacity_pages as usize;
    let page_size = geometry.page_size_bytes as usize;
    let payload = &payload[..payload.len().min(capacity * page_size - 64)];
    let first_sequence = 1000;
    for page in split_record(RecordKind::Checkpoint, payload, first_sequence, page_size) {
        let header = PageHeader {
            kind: PageKind::Checkpoint,
            end_of_record: page.end_of_record,
            zone_generation: 0,
            sequence: first_sequence + u64::from(page.index),
            zone: 3,
            page: page.index,
            inverted: InvertedIndex::default(),
            length: page.length,
            count: page.index,
        };
        let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
        oob[..PAGE_HEADER_BYTES].copy_from_slice(&header.encode(&page.data));
        flash.program_page(PageAddress::new(3, page.index), &page.data, &oob).unwrap();
    }
    flash.flush().unwrap();
    flash
}

/// Mounts and exercises a hostile device; panics only on a bug.
pub fn exercise(flash: MemoryFlash) {
    let Ok((mut volume, _)) = Volume::mount(flash) else { return };
    let _ = volume.check();
    let page = vec![7u8; 512];
    for role in [ZoneRole::HotData, ZoneRole::Node, ZoneRole::Log, ZoneRole::ColdData] {
        let kind = match role {
            ZoneRole::HotData | ZoneRole::ColdData => PageKind::DataBlock,
            ZoneRole::Log => PageKind::Log,
            _ => PageKind::Node,
        };
        if volume.append(role, PageMeta::new(kind, 8), &page).is_err() {
            break;
        }
    }
    if volume.write_checkpoint().is_ok() {
        let flash = volume.into_device();
        if let Ok((mut volume, _)) = Volume::mount(flash) {
            let _ = volume.check();
        }
    }
}

/// A valid checkpoint payload to mutate: the one mkfs wrote, renumbered.
pub fn valid_payload() -> Vec<u8> {
    let flash = hostile_device(&[]);
    let (volume, _) = Volume::mount(flash).unwrap();
    let mut checkpoint = volume.checkpoint().clone();
    checkpoint.number = 9;
    checkpoint.sequence_next = 2000;
    checkpoint.encode()
}
