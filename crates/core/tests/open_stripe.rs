//! The open stripe: the pages of an erase block still being written have
//! no parity on flash yet. While the volume is mounted their running
//! parity in memory rebuilds a page the ECC cannot; with NVM, every flush
//! also persists it as a stripe record, so after a power cut a page of a
//! block left part written is rebuilt from NVM. Without NVM (or with the
//! records wiped) the same damage is past repair: that is the window the
//! records close.

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions, ProtectionCounters};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash, PageAddress, ZoneState};
use flintfs_format::{NvmHeader, NvmHeaderState, NVM_HEADER_BYTES, SUPERBLOCK_ZONES};

mod common;
use common::{contents, destroyed};

fn geometry(nvm_size_bytes: u64) -> Geometry {
    common::geometry(48, nvm_size_bytes)
}

const NVM_BYTES: u64 = 1 << 20;
const FILES: u32 = 60;

/// Files created, written and fsynced one by one, then the power cut:
/// every file is durable, and every head's block is left part written.
fn written_then_cut(nvm_size_bytes: u64, clock: &ManualClock) -> MemoryFlash {
    let flash = MemoryFlash::memory(geometry(nvm_size_bytes), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    for index in 0..FILES {
        let file = fs.create(1, format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(file.ino, 0, &contents(index)).unwrap();
        fs.fsync(file.ino, false).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    let counters = fs.protection_counters();
    if nvm_size_bytes > 0 {
        assert!(counters.stripe_records_written > 0, "{counters:?}");
        assert_eq!(counters.unprotected_durable_pages_max, 0, "every durable page is under parity: {counters:?}");
    } else {
        assert!(counters.unprotected_durable_pages_max > 0, "{counters:?}");
    }
    let mut flash = fs.into_device();
    flash.power_cut(3).unwrap();
    flash
}

/// One page destroyed in every erase block left part written with at
/// least two data pages (a page alone in its block has nothing to be
/// rebuilt from but its parity); returns how many.
fn destroy_a_page_of_each_open_block(flash: &mut MemoryFlash) -> u32 {
    let block_pages = flash.geometry().block_pages;
    let mut destroyed_pages = 0;
    for report in flash.report_zones() {
        let offset = report.write_pointer % block_pages;
        if SUPERBLOCK_ZONES.contains(&report.zone)
            || !matches!(report.state, ZoneState::Open | ZoneState::Closed)
            || !(2..block_pages - 1).contains(&offset)
        {
            continue;
        }
        let page = report.write_pointer - offset + (report.zone % offset);
        assert!(flash.inject_page_fault(PageAddress::new(report.zone, page), destroyed(u64::from(page))).unwrap());
        destroyed_pages += 1;
    }
    destroyed_pages
}

/// Mounts and reads every file back: the counters if all of it came back
/// whole, else what failed.
fn read_back(flash: MemoryFlash, clock: ManualClock) -> Result<ProtectionCounters, String> {
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).map_err(|error| error.to_string())?;
    for index in 0..FILES {
        let file = fs.lookup(1, format!("f{index}").as_bytes()).map_err(|error| format!("f{index}: {error}"))?;
        let read = fs.read(file.ino, 0, 1 << 20).map_err(|error| format!("f{index}: {error}"))?;
        assert!(read == contents(index), "f{index} read back different bytes");
    }
    let report = fs.check().map_err(|error| error.to_string())?;
    if !report.is_clean() {
        return Err(format!("{:#?}", report.findings));
    }
    Ok(fs.protection_counters())
}

#[test]
fn a_page_of_a_block_left_part_written_is_rebuilt_from_its_record_in_nvm() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let mut flash = written_then_cut(NVM_BYTES, &clock);
    let damaged = destroy_a_page_of_each_open_block(&mut flash);
    assert!(damaged >= 2, "the heads and the checkpoint zone have blocks part written: {damaged}");
    let counters = read_back(flash, clock).unwrap();
    eprintln!("{damaged} pages destroyed; {counters:?}");
    assert!(counters.pages_repaired_open_stripe > 0, "{counters:?}");
    assert_eq!(counters.pages_unrepairable, 0, "{counters:?}");
}

#[test]
fn without_the_records_the_same_damage_is_past_repair() {
    for wipe in [false, true] {
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let mut flash = written_then_cut(if wipe { NVM_BYTES } else { 0 }, &clock);
        if wipe {
            // The stripe area zeroed, the rest of NVM (the log) kept.
            let mut bytes = vec![0u8; NVM_HEADER_BYTES];
            common::nvm(&mut flash).nvm_read(0, &mut bytes).unwrap();
            let NvmHeaderState::Valid(header) =
                NvmHeader::decode(&bytes, common::nvm(&mut flash.clone()).geometry().nvm_size_bytes)
            else {
                panic!("the NVM header")
            };
            let area = header.slots_offset() - header.stripe_offset();
            assert!(area > 0);
            common::nvm(&mut flash).nvm_write(header.stripe_offset(), &vec![0u8; area as usize]).unwrap();
            common::nvm(&mut flash).nvm_persist(header.stripe_offset(), area).unwrap();
        }
        let damaged = destroy_a_page_of_each_open_block(&mut flash);
        assert!(damaged >= 2, "{damaged}");
        match read_back(flash, clock) {
            Ok(counters) => {
                assert!(counters.pages_unrepairable > 0, "wipe {wipe}: nothing was lost: {counters:?}");
                assert_eq!(counters.pages_repaired_open_stripe, 0, "{counters:?}");
            }
            Err(lost) => eprintln!("wipe {wipe}: {lost}"),
        }
    }
}

#[test]
fn while_mounted_the_running_parity_in_memory_rebuilds_a_page() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(0), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let options = FsOptions { read_cache_bytes: 1 << 16, ..FsOptions::default() };
    let (mut fs, _) = Fs::mount(flash, options, Box::new(clock)).unwrap();
    let mut inos = Vec::new();
    for index in 0..FILES {
        let file = fs.create(1, format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(file.ino, 0, &contents(index)).unwrap();
        fs.fsync(file.ino, false).unwrap();
        inos.push(file.ino);
    }
    let damaged = destroy_a_page_of_each_open_block(fs.volume_mut().device_mut());
    assert!(damaged >= 2, "{damaged}");
    for (index, &ino) in inos.iter().enumerate() {
        let read = fs.read(ino, 0, 1 << 20).unwrap_or_else(|error| panic!("f{index}: {error}"));
        assert!(read == contents(index as u32), "f{index} read back different bytes");
    }
    let counters = fs.protection_counters();
    eprintln!("{damaged} pages destroyed; {counters:?}");
    assert!(counters.pages_repaired_open_stripe > 0, "{counters:?}");
    assert_eq!(counters.pages_unrepairable, 0, "{counters:?}");
}

/// Appends of two pages and an fsync, file by file, with a power cut
/// scheduled at device operation `cut_at` (NVM writes and persists count):
/// the device, the clock, and how many fsyncs returned before the cut.
fn appends_cut_at(cut_at: Option<u64>, files: u32) -> (MemoryFlash, ManualClock, u32) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(NVM_BYTES), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    if let Some(cut_at) = cut_at {
        let start = fs.device().mutating_operations();
        fs.volume_mut().device_mut().schedule_power_cut(start + cut_at, cut_at).unwrap();
    }
    let mut synced = 0;
    for index in 0..files {
        let done = (|| {
            let file = fs.create(1, format!("f{index}").as_bytes(), 0o644, 0, 0)?;
            fs.write(file.ino, 0, &contents(index * 5 + 1))?;
            fs.fsync(file.ino, false)?;
            fs.forget(file.ino, 1)
        })();
        if done.is_err() || fs.device().is_powered_off() {
            break;
        }
        synced += 1;
    }
    let mut flash = fs.into_device();
    if cut_at.is_none() {
        flash.power_cut(0).unwrap();
    }
    flash.power_on();
    (flash, clock, synced)
}

/// A power cut at every device operation of a run of fsynced appends,
/// stripe records' NVM writes and persists among them; after each, a page
/// of every block left part written is destroyed. Every file whose fsync
/// returned reads back whole (a record in force covers each of its pages
/// on an open block), and no read returns wrong bytes.
#[test]
fn after_a_cut_at_any_operation_every_fsynced_page_is_under_a_record() {
    const FILES: u32 = 10;
    let total = {
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let flash = MemoryFlash::memory(geometry(NVM_BYTES), DeviceOptions::default()).unwrap();
        let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
        let start = flash.mutating_operations();
        let (flash, _, synced) = appends_cut_at(None, FILES);
        assert_eq!(synced, FILES);
        flash.mutating_operations() - start
    };
    let mut repaired = 0;
    for cut_at in 0..total {
        let (mut flash, clock, synced) = appends_cut_at(Some(cut_at), FILES);
        destroy_a_page_of_each_open_block(&mut flash);
        let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock))
            .unwrap_or_else(|error| panic!("cut at {cut_at}: {error}"));
        for index in 0..FILES {
            let Ok(file) = fs.lookup(1, format!("f{index}").as_bytes()) else {
                assert!(index >= synced, "cut at {cut_at}: f{index} was fsynced and is gone");
                continue;
            };
            match fs.read(file.ino, 0, 1 << 20) {
                Ok(read) if read == contents(index * 5 + 1) => {}
                Ok(read) if index >= synced && read.iter().all(|&byte| byte == 0) => {}
                Ok(_) => panic!("cut at {cut_at}: f{index} read back different bytes"),
                Err(error) => assert!(index >= synced, "cut at {cut_at}: f{index} was fsynced: {error}"),
            }
        }
        repaired += fs.protection_counters().pages_repaired_open_stripe;
    }
    eprintln!("{total} cuts, {repaired} pages rebuilt from records");
    assert!(repaired > total / 2, "{repaired} pages rebuilt over {total} cuts");
}

/// Hostile bytes in the stripe area: noise, and real records with one
/// byte flipped. A mount reads past all of it (a record that does not
/// check is no record), never panics, and every file reads back.
#[test]
fn noise_in_the_stripe_area_is_no_record_and_no_panic() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = written_then_cut(NVM_BYTES, &clock);
    let mut bytes = vec![0u8; NVM_HEADER_BYTES];
    let mut probe = flash.clone();
    common::nvm(&mut probe).nvm_read(0, &mut bytes).unwrap();
    let NvmHeaderState::Valid(header) =
        NvmHeader::decode(&bytes, common::nvm(&mut flash.clone()).geometry().nvm_size_bytes)
    else {
        panic!("the NVM header")
    };
    let (start, length) = (header.stripe_offset(), header.slots_offset() - header.stripe_offset());
    let mut pristine = vec![0u8; length as usize];
    common::nvm(&mut probe).nvm_read(start, &mut pristine).unwrap();
    for trial in 0..24u64 {
        let mut flash = flash.clone();
        let mut damaged = pristine.clone();
        if trial == 0 {
            for (at, byte) in damaged.iter_mut().enumerate() {
                *byte = (at as u64 ^ 0x5A).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) as u8;
            }
        } else {
            // A byte of each record written so far, header or units.
            let record = u64::from(header.stripe_record_bytes);
            for slot in 0..u64::from(header.stripe_records) {
                let at = (slot * record + (trial * 977 + slot * 131) % record) as usize;
                damaged[at] ^= 1 << (trial % 8);
            }
        }
        common::nvm(&mut flash).nvm_write(start, &damaged).unwrap();
        common::nvm(&mut flash).nvm_persist(start, length).unwrap();
        let counters = read_back(flash, clock.clone()).unwrap_or_else(|error| panic!("trial {trial}: {error}"));
        assert_eq!(counters.pages_unrepairable, 0, "trial {trial}: {counters:?}");
    }
}
