//! Property test: random operation sequences against a simple reference
//! model of the device rules and the durability model. After every step the
//! zone reports, the durable write pointers and what reads return must agree
//! with the model; after a power cut the durable prefixes must lie between
//! what was durable and what was accepted, and agree with the write
//! pointers.
//!
//! `PROPTEST_CASES` sets how many sequences run (CI uses the default).

mod common;

use std::collections::{BTreeSet, VecDeque};

use common::*;
use flintfs_flash::{
    DeviceError, DeviceOptions, FaultConfig, FlashDevice, MemoryFlash, PageAddress, PageState, ZoneState,
};
use proptest::prelude::*;

const WRITE_BUFFER_PAGES: u32 = 5;

#[derive(Clone, Debug)]
enum Operation {
    Program { zone: u32, delta: i8, tag: u8 },
    Read { zone: u32, page: u32 },
    ReadOob { zone: u32, page: u32 },
    Reset { zone: u32 },
    Finish { zone: u32 },
    Flush,
    PowerCut { seed: u64 },
    NvmWrite { offset: u64, length: u64, byte: u8 },
    NvmPersist { offset: u64, length: u64 },
}

fn operation() -> impl Strategy<Value = Operation> {
    let zone = 0u32..6;
    prop_oneof![
        12 => (zone.clone(), prop_oneof![8 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], any::<u8>())
            .prop_map(|(zone, delta, tag)| Operation::Program { zone, delta, tag }),
        4 => (zone.clone(), 0u32..8).prop_map(|(zone, page)| Operation::Read { zone, page }),
        2 => (zone.clone(), 0u32..8).prop_map(|(zone, page)| Operation::ReadOob { zone, page }),
        1 => zone.clone().prop_map(|zone| Operation::Reset { zone }),
        1 => zone.prop_map(|zone| Operation::Finish { zone }),
        2 => Just(Operation::Flush),
        1 => any::<u64>().prop_map(|seed| Operation::PowerCut { seed }),
        2 => (0u64..250, 0u64..40, any::<u8>())
            .prop_map(|(offset, length, byte)| Operation::NvmWrite { offset, length: length.min(256 - offset), byte }),
        1 => (0u64..256, 0u64..64).prop_map(|(offset, length)| Operation::NvmPersist { offset, length: length.min(256 - offset) }),
    ]
}

#[derive(Clone, Debug, Default)]
struct ModelZone {
    /// Accepted pages, data and OOB.
    pages: Vec<(Vec<u8>, Vec<u8>)>,
    durable: usize,
    open: bool,
    finished: bool,
    /// Pages left torn by power cuts: their read-back is not checked.
    torn: BTreeSet<usize>,
}

struct Model {
    zones: Vec<ModelZone>,
    capacity_pages: usize,
    zone_pages: u32,
    open_zones_max: usize,
    /// Zones of the accepted, not yet durable pages, oldest first.
    buffer: VecDeque<u32>,
    nvm_live: Vec<u8>,
    nvm_durable: Vec<u8>,
    nvm_dirty: BTreeSet<u64>,
}

impl Model {
    fn state(&self, zone: u32) -> ZoneState {
        let entry = &self.zones[zone as usize];
        if entry.finished || entry.pages.len() == self.capacity_pages {
            ZoneState::Full
        } else if entry.open {
            ZoneState::Open
        } else if entry.pages.is_empty() {
            ZoneState::Empty
        } else {
            ZoneState::Closed
        }
    }

    fn drain_one(&mut self) {
        let zone = self.buffer.pop_front().expect("non-empty buffer");
        self.zones[zone as usize].durable += 1;
    }
}

fn run(operations: Vec<Operation>) -> Result<(), TestCaseError> {
    let geometry = small_geometry();
    let mut device = MemoryFlash::memory(
        geometry,
        DeviceOptions { write_buffer_pages: WRITE_BUFFER_PAGES, ..options(FaultConfig::none(0)) },
    )
    .unwrap();
    let mut model = Model {
        zones: vec![ModelZone::default(); geometry.zone_count as usize],
        capacity_pages: geometry.zone_pages() as usize,
        zone_pages: geometry.zone_pages() as u32,
        open_zones_max: geometry.open_zones_max as usize,
        buffer: VecDeque::new(),
        nvm_live: vec![0; 256],
        nvm_durable: vec![0; 256],
        nvm_dirty: BTreeSet::new(),
    };
    for (step, operation) in operations.into_iter().enumerate() {
        let context = format!("step {step}: {operation:?}");
        match operation {
            Operation::Program { zone, delta, tag } => {
                let write_pointer = model.zones[zone as usize].pages.len() as u32;
                let page = write_pointer.saturating_add_signed(i32::from(delta));
                let address = PageAddress::new(zone, page);
                let (data, oob) = page_bytes(&geometry, address, tag);
                let result = device.program_page(address, &data, &oob);
                let state = model.state(zone);
                let open_count = (0..geometry.zone_count).filter(|&zone| model.state(zone) == ZoneState::Open).count();
                let expected: Result<(), &str> = if page >= model.zone_pages {
                    Err("out of range")
                } else if state == ZoneState::Full || page as usize >= model.capacity_pages {
                    Err("full")
                } else if page != write_pointer {
                    Err("not at write pointer")
                } else if state != ZoneState::Open && open_count >= model.open_zones_max {
                    Err("too many open")
                } else {
                    Ok(())
                };
                match (&result, expected) {
                    (Ok(()), Ok(())) => {
                        let entry = &mut model.zones[zone as usize];
                        entry.pages.push((data, oob));
                        entry.open = entry.pages.len() < model.capacity_pages;
                        model.buffer.push_back(zone);
                        while model.buffer.len() > WRITE_BUFFER_PAGES as usize {
                            model.drain_one();
                        }
                    }
                    (Err(DeviceError::OutOfRange { .. }), Err("out of range"))
                    | (Err(DeviceError::ZoneFull { .. }), Err("full"))
                    | (Err(DeviceError::TooManyOpenZones { .. }), Err("too many open")) => {}
                    (
                        Err(DeviceError::NotAtWritePointer { write_pointer: reported, .. }),
                        Err("not at write pointer"),
                    ) => {
                        prop_assert_eq!(*reported, write_pointer, "{}", context);
                    }
                    (result, expected) => prop_assert!(false, "{}: device {:?}, model {:?}", context, result, expected),
                }
            }
            Operation::Read { zone, page } | Operation::ReadOob { zone, page } => {
                let full = matches!(operation, Operation::Read { .. });
                let mut data = vec![0; 512];
                let mut oob = vec![0; 64];
                let address = PageAddress::new(zone, page);
                let state = if full {
                    device.read_page(address, &mut data, &mut oob)
                } else {
                    device.read_oob(address, &mut oob)
                }
                .unwrap();
                let entry = &model.zones[zone as usize];
                match entry.pages.get(page as usize) {
                    None => {
                        prop_assert_eq!(state, PageState::Erased, "{}", context);
                        prop_assert!(oob.iter().all(|&byte| byte == 0xFF), "{}", context);
                        if full {
                            prop_assert!(data.iter().all(|&byte| byte == 0xFF), "{}", context);
                        }
                    }
                    Some((expected_data, expected_oob)) => {
                        prop_assert_eq!(state, PageState::Programmed, "{}", context);
                        if !entry.torn.contains(&(page as usize)) {
                            prop_assert_eq!(&oob, expected_oob, "{}", context);
                            if full {
                                prop_assert_eq!(&data, expected_data, "{}", context);
                            }
                        }
                    }
                }
            }
            Operation::Reset { zone } => {
                device.reset_zone(zone).unwrap();
                model.buffer.retain(|&buffered| buffered != zone);
                model.zones[zone as usize] = ModelZone::default();
            }
            Operation::Finish { zone } => {
                device.finish_zone(zone).unwrap();
                // A finish is durable on return, even over an unflushed tail.
                let entry = &mut model.zones[zone as usize];
                entry.finished = true;
                entry.open = false;
            }
            Operation::Flush => {
                device.flush().unwrap();
                while !model.buffer.is_empty() {
                    model.drain_one();
                }
            }
            Operation::PowerCut { seed } => {
                let report = device.power_cut(seed).unwrap();
                for (zone, entry) in model.zones.iter_mut().enumerate() {
                    let write_pointer = device.report_zone(zone as u32).unwrap().write_pointer as usize;
                    prop_assert!(
                        entry.durable <= write_pointer && write_pointer <= entry.pages.len(),
                        "{}: zone {} came back at {}, durable {}, accepted {}",
                        context,
                        zone,
                        write_pointer,
                        entry.durable,
                        entry.pages.len()
                    );
                    let reported = report.zones.iter().find(|cut| cut.zone as usize == zone);
                    match reported {
                        Some(cut) => {
                            prop_assert_eq!(cut.durable_before as usize, entry.durable, "{}", context);
                            prop_assert_eq!(cut.accepted as usize, entry.pages.len(), "{}", context);
                            prop_assert_eq!(cut.durable_after as usize, write_pointer, "{}", context);
                        }
                        None => prop_assert_eq!(entry.durable, entry.pages.len(), "{}: zone {}", context, zone),
                    }
                    entry.pages.truncate(write_pointer);
                    entry.torn.retain(|&page| page < write_pointer);
                    entry.durable = write_pointer;
                    entry.open = false;
                    let torn = report.torn_pages.iter().find(|torn| torn.zone as usize == zone);
                    if let Some(torn) = torn {
                        prop_assert_eq!(torn.page as usize + 1, write_pointer, "{}", context);
                        entry.torn.insert(torn.page as usize);
                    }
                }
                model.buffer.clear();
                let mut nvm = vec![0; 256];
                device.nvm_read(0, &mut nvm).unwrap();
                for word in 0..32usize {
                    let range = word * 8..word * 8 + 8;
                    let got = &nvm[range.clone()];
                    if model.nvm_dirty.contains(&(word as u64)) {
                        prop_assert!(
                            got == &model.nvm_live[range.clone()] || got == &model.nvm_durable[range.clone()],
                            "{}: NVM word {} is torn",
                            context,
                            word
                        );
                    } else {
                        prop_assert_eq!(got, &model.nvm_durable[range.clone()], "{}: NVM word {}", context, word);
                    }
                }
                model.nvm_live = nvm.clone();
                model.nvm_durable = nvm;
                model.nvm_dirty.clear();
            }
            Operation::NvmWrite { offset, length, byte } => {
                device.nvm_write(offset, &vec![byte; length as usize]).unwrap();
                model.nvm_live[offset as usize..(offset + length) as usize].fill(byte);
                if length > 0 {
                    model.nvm_dirty.extend(offset / 8..(offset + length).div_ceil(8));
                }
            }
            Operation::NvmPersist { offset, length } => {
                device.nvm_persist(offset, length).unwrap();
                if length > 0 {
                    for word in offset / 8..(offset + length).div_ceil(8) {
                        if model.nvm_dirty.remove(&word) {
                            let range = word as usize * 8..word as usize * 8 + 8;
                            let live = model.nvm_live[range.clone()].to_vec();
                            model.nvm_durable[range].copy_from_slice(&live);
                        }
                    }
                }
            }
        }
        // After every step: states, write pointers and durable prefixes.
        for zone in 0..geometry.zone_count {
            let report = device.report_zone(zone).unwrap();
            let entry = &model.zones[zone as usize];
            prop_assert_eq!(report.write_pointer as usize, entry.pages.len(), "{}: zone {}", context, zone);
            prop_assert_eq!(report.state, model.state(zone), "{}: zone {}", context, zone);
            prop_assert_eq!(
                device.durable_write_pointer(zone).unwrap() as usize,
                entry.durable,
                "{}: durable write pointer of zone {}",
                context,
                zone
            );
        }
        prop_assert_eq!(device.buffered_pages(), model.buffer.len(), "{}", context);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn device_agrees_with_the_reference_model(operations in proptest::collection::vec(operation(), 1..300)) {
        run(operations)?;
    }
}
