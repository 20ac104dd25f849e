//! Arbitrary bytes through the block backend's header decoder, and over
//! the start of a valid block-backend device file (its headers, zone
//! tables and first slots) opened as a device: an error or a working
//! device, never a panic.
#![no_main]

use flintfs_flash::{decode_block_header, BlockCreate, BlockFlash, FlashDevice, Geometry, PageAddress};
use libfuzzer_sys::fuzz_target;

const PAGE_BYTES: usize = 512;
const OOB_BYTES: usize = 64;

fuzz_target!(|bytes: &[u8]| {
    let _ = decode_block_header(bytes);
    thread_local! {
        static TEMPLATE: (tempfile::TempDir, Vec<u8>, usize) = {
            let directory = tempfile::tempdir().unwrap();
            let path = directory.path().join("template");
            let geometry = Geometry {
                page_size_bytes: PAGE_BYTES as u32,
                oob_size_bytes: OOB_BYTES as u32,
                block_pages: 4,
                zone_blocks: 2,
                zone_count: 0,
                open_zones_max: 2,
                nvm_size_bytes: 0,
            };
            let create = BlockCreate { size_bytes: Some(16384 + 4 * 8192), nonce: 7 };
            let mut device = BlockFlash::create(&path, geometry, create).unwrap();
            for page in 0..8 {
                device.program_page(PageAddress::new(0, page), &[page as u8; PAGE_BYTES], &[3; OOB_BYTES]).unwrap();
            }
            device.program_page(PageAddress::new(1, 0), &[9; PAGE_BYTES], &[4; OOB_BYTES]).unwrap();
            device.flush().unwrap();
            // The region worth damaging: headers, tables and zone 0's slots.
            let end = (device.layout().data_offset + 8 * device.layout().slot_bytes) as usize;
            drop(device);
            let image = std::fs::read(&path).unwrap();
            (directory, image, end)
        };
    }
    TEMPLATE.with(|(directory, template, end)| {
        // Bytes 0..4 pick an offset; the rest overwrite from there.
        if bytes.len() < 4 {
            return;
        }
        let mut image = template.clone();
        let offset = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize % end;
        let patch = &bytes[4..];
        let stop = (offset + patch.len()).min(image.len());
        image[offset..stop].copy_from_slice(&patch[..stop - offset]);
        let path = directory.path().join("case");
        std::fs::write(&path, &image).unwrap();
        if let Ok(mut device) = BlockFlash::open(&path) {
            for zone in device.report_zones() {
                for page in 0..zone.capacity_pages {
                    let mut data = [0u8; PAGE_BYTES];
                    let mut oob = [0u8; OOB_BYTES];
                    let _ = device.read_page(PageAddress::new(zone.zone, page), &mut data, &mut oob);
                }
                let _ = device.program_page(
                    PageAddress::new(zone.zone, zone.write_pointer),
                    &[1; PAGE_BYTES],
                    &[2; OOB_BYTES],
                );
            }
            let _ = device.flush();
        }
    });
});
