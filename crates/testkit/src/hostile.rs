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
        oob_size_bytes: 128,
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

/// A device big enough for a small file system with buckets, an index, a
/// multi-link file and inline files, at 512-byte pages.
pub fn fs_geometry() -> Geometry {
    Geometry { zone_count: 42, ..geometry() }
}

/// The file system every hostile image starts from, unmounted cleanly.
pub fn base_fs_image() -> MemoryFlash {
    let clock = flintfs_core::ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(fs_geometry(), DeviceOptions::default()).unwrap();
    let options = MkfsOptions { unindexed_segments: 3, ..MkfsOptions::new([3; 16], 0) };
    let flash = flintfs_core::Fs::format(flash, &options, Box::new(clock.clone())).unwrap();
    let fs_options = flintfs_core::FsOptions::smallest(512);
    let (mut fs, _) = flintfs_core::Fs::mount(flash, fs_options, Box::new(clock)).unwrap();
    let directory = fs.mkdir(1, b"big", 0o755, 0, 0).unwrap().ino;
    for index in 0..40 {
        let file = fs.create(directory, format!("entry-{index:03}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(file, 0, &[index as u8; 20]).unwrap();
        fs.forget(file, 1).unwrap();
    }
    let large = fs.create(1, b"large", 0o644, 0, 0).unwrap().ino;
    // In pieces: one 40,000-byte write asks for its 79 pages at once, which
    // this small a device, with its zones of 9 pages mostly holding node
    // pages until a checkpoint, cannot promise on top of its reserve and
    // the margin for a failed program (`PROGRAM_FAILURE_MARGIN_ZONES`).
    const PIECE_BYTES: usize = 8192;
    let contents: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
    for (index, piece) in contents.chunks(PIECE_BYTES).enumerate() {
        fs.write(large, (index * PIECE_BYTES) as u64, piece).unwrap();
    }
    fs.link(large, directory, b"second-name").unwrap();
    fs.setxattr(large, b"user.x", b"value", flintfs_core::XattrFlags::default()).unwrap();
    let tail = fs.create(1, b"tail", 0o644, 0, 0).unwrap().ino;
    fs.write(tail, 0, &[9; 700]).unwrap();
    fs.symlink(1, b"link", b"big/entry-001", 0, 0).unwrap();
    fs.unmount().unwrap()
}

/// Every programmed page of a device, in zone order: where, data, OOB.
fn programmed_pages(flash: &mut MemoryFlash) -> Vec<(PageAddress, Vec<u8>, Vec<u8>)> {
    let mut pages = Vec::new();
    for report in flash.report_zones() {
        for page in 0..report.write_pointer {
            let address = PageAddress::new(report.zone, page);
            if let Ok(Some((data, oob))) = flash.pristine_page(address) {
                pages.push((address, data, oob));
            }
        }
    }
    pages
}

/// The base image with one page's data replaced by `edit(original)` and
/// its header signed again, so the damage passes every checksum and the
/// engine's own checks are what meet it. `victim` picks the page.
pub fn hostile_fs_device(victim: usize, edit: impl FnOnce(&mut Vec<u8>)) -> MemoryFlash {
    // Built once: fuzzing runs this thousands of times a second.
    static BASE: std::sync::OnceLock<BaseImage> = std::sync::OnceLock::new();
    let base = BASE.get_or_init(|| {
        let mut flash = base_fs_image();
        let pages = programmed_pages(&mut flash);
        let finished = flash
            .report_zones()
            .into_iter()
            .filter(|report| {
                report.state == flintfs_flash::ZoneState::Full && report.write_pointer < report.capacity_pages
            })
            .map(|report| report.zone)
            .collect();
        BaseImage { pages, finished }
    });
    let pages = base.pages.clone();
    let mut flash = MemoryFlash::memory(fs_geometry(), DeviceOptions::default()).unwrap();
    let chosen = victim % pages.len();
    let mut edit = Some(edit);
    for (index, (address, data, oob)) in pages.into_iter().enumerate() {
        let (data, oob) = if index == chosen {
            match PageHeader::decode(&oob, &data) {
                Ok(header) => {
                    let mut data = data;
                    if let Some(edit) = edit.take() {
                        edit(&mut data);
                    }
                    data.resize(fs_geometry().page_size_bytes as usize, 0);
                    let header = PageHeader { length: header.length.min(data.len() as u32), ..header };
                    let mut oob = oob;
                    oob[..PAGE_HEADER_BYTES].copy_from_slice(&header.encode(&data));
                    (data, oob)
                }
                Err(_) => (data, oob),
            }
        } else {
            (data, oob)
        };
        flash.program_page(address, &data, &oob).unwrap();
    }
    for &zone in &base.finished {
        flash.finish_zone(zone).unwrap();
    }
    flash.flush().unwrap();
    flash
}

/// The base image as pages to program again, and the zones to finish.
struct BaseImage {
    pages: Vec<(PageAddress, Vec<u8>, Vec<u8>)>,
    finished: Vec<u32>,
}

/// Mounts a hostile file system and uses all of it: every name, every
/// byte, the checker, changes, a checkpoint and a remount. Errors are
/// fine; a panic or a hang is a bug.
pub fn exercise_fs(flash: MemoryFlash) {
    let clock = flintfs_core::ManualClock::new(1_700_000_000_000_000_000);
    let options = flintfs_core::FsOptions::smallest(512);
    let Ok((mut fs, _)) = flintfs_core::Fs::mount(flash, options.clone(), Box::new(clock.clone())) else { return };
    let _ = fs.check();
    let mut stack = vec![1u64];
    let mut visited = 0;
    while let Some(directory) = stack.pop() {
        visited += 1;
        if visited > 200 {
            break;
        }
        let Ok(entries) = fs.readdir(directory, 0, 1000) else { continue };
        for entry in entries {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let Ok(attributes) = fs.lookup(directory, &entry.name) else { continue };
            match attributes.file_type {
                flintfs_format::FileType::Directory => stack.push(attributes.ino),
                flintfs_format::FileType::Symlink => {
                    let _ = fs.readlink(attributes.ino);
                }
                _ => {
                    let _ = fs.read(attributes.ino, 0, attributes.size.min(1 << 20));
                    let _ = fs.write(attributes.ino, 3, b"changed");
                    let _ = fs.listxattr(attributes.ino);
                }
            }
        }
    }
    let _ = fs.create(1, b"new", 0o644, 0, 0);
    let _ = fs.mkdir(1, b"new-directory", 0o755, 0, 0);
    let _ = fs.unlink(1, b"tail");
    let _ = fs.rename(1, b"large", 1, b"renamed", flintfs_core::RenameFlags::default());
    let _ = fs.statfs();
    if fs.sync().is_ok() {
        let flash = fs.into_device();
        if let Ok((mut fs, _)) = flintfs_core::Fs::mount(flash, options, Box::new(clock)) {
            let _ = fs.check();
        }
    }
}
