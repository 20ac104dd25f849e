//! Arbitrary bytes through every device-image decoder, and as a whole image
//! file opened as a device: an error or a working device, never a panic.
#![no_main]

use flintfs_flash::{
    decode_block_record, decode_overlay, decode_zone_record, DeviceOptions, FlashDevice, Geometry, ImageFlash,
    ImageHeader, PageAddress,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let geometry = Geometry {
        page_size_bytes: 512,
        oob_size_bytes: 64,
        block_pages: 4,
        zone_blocks: 2,
        zone_count: 4,
        open_zones_max: 2,
        nvm_size_bytes: 64,
    };
    let _ = ImageHeader::decode(bytes);
    if bytes.len() >= 36 {
        let index = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        let _ = decode_zone_record(index, &bytes[4..36], &geometry);
        let _ = decode_block_record(u64::from(index), &bytes[4..bytes.len().min(68)]);
        let _ = decode_overlay(&bytes[4..], index % 64, &geometry);
    }
    // As a file: the first bytes replace the start of a valid image, so the
    // fuzzer explores past the magic and the checksums it cannot forge.
    thread_local! {
        static TEMPLATE: (tempfile::TempDir, Vec<u8>) = {
            let directory = tempfile::tempdir().unwrap();
            let path = directory.path().join("template.img");
            let geometry = Geometry { page_size_bytes: 512, oob_size_bytes: 64, block_pages: 4, zone_blocks: 2, zone_count: 4, open_zones_max: 2, nvm_size_bytes: 64 };
            let mut device = ImageFlash::create_image(&path, geometry, DeviceOptions::default()).unwrap();
            device.program_page(PageAddress::new(0, 0), &[1; 512], &[2; 64]).unwrap();
            device.flush().unwrap();
            drop(device);
            let image = std::fs::read(&path).unwrap();
            (directory, image)
        };
    }
    TEMPLATE.with(|(directory, template)| {
        let mut image = template.clone();
        // Bytes 0..4 pick an offset into the metadata; the rest overwrite it.
        if bytes.len() < 4 {
            return;
        }
        let metadata_bytes = flintfs_flash::ImageLayout::of(&geometry).page_area_offset as usize;
        let offset = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize % metadata_bytes;
        let patch = &bytes[4..];
        let end = (offset + patch.len()).min(image.len());
        image[offset..end].copy_from_slice(&patch[..end - offset]);
        let path = directory.path().join("case.img");
        std::fs::write(&path, &image).unwrap();
        if let Ok(mut device) = ImageFlash::open_image(&path, DeviceOptions::default()) {
            for zone in device.report_zones() {
                for page in 0..zone.capacity_pages {
                    let mut data = [0u8; 512];
                    let mut oob = [0u8; 64];
                    let _ = device.read_page(PageAddress::new(zone.zone, page), &mut data, &mut oob);
                }
            }
            let _ = device.flush();
        }
    });
});
