//! Shared helpers for the device tests.
#![allow(dead_code)]

use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash, PageAddress};

/// A small device: 512-byte pages, 4 pages per block, 2 blocks per zone.
pub fn small_geometry() -> Geometry {
    Geometry {
        page_size_bytes: 512,
        oob_size_bytes: 64,
        block_pages: 4,
        zone_blocks: 2,
        zone_count: 6,
        open_zones_max: 3,
        nvm_size_bytes: 256,
    }
}

pub fn options(faults: FaultConfig) -> DeviceOptions {
    DeviceOptions { faults, ..DeviceOptions::default() }
}

pub fn memory(geometry: Geometry, faults: FaultConfig) -> MemoryFlash {
    MemoryFlash::memory(geometry, options(faults)).expect("valid device")
}

/// Deterministic page contents that differ by address and tag.
pub fn page_bytes(geometry: &Geometry, address: PageAddress, tag: u8) -> (Vec<u8>, Vec<u8>) {
    let seed = (address.zone as usize * 131 + address.page as usize * 17 + tag as usize * 7) as u8;
    let data = (0..geometry.page_size_bytes as usize).map(|index| seed.wrapping_add((index * 31) as u8)).collect();
    let oob = (0..geometry.oob_size_bytes as usize).map(|index| seed ^ (index as u8)).collect();
    (data, oob)
}

pub fn program(device: &mut impl FlashDevice, zone: u32, page: u32, tag: u8) {
    let geometry = device.geometry();
    let address = PageAddress::new(zone, page);
    let (data, oob) = page_bytes(&geometry, address, tag);
    device.program_page(address, &data, &oob).unwrap_or_else(|error| panic!("program {address}: {error}"));
}

pub fn read(device: &mut impl FlashDevice, zone: u32, page: u32) -> (flintfs_flash::PageState, Vec<u8>, Vec<u8>) {
    let geometry = device.geometry();
    let mut data = vec![0; geometry.page_size_bytes as usize];
    let mut oob = vec![0; geometry.oob_size_bytes as usize];
    let state = device.read_page(PageAddress::new(zone, page), &mut data, &mut oob).expect("read");
    (state, data, oob)
}
