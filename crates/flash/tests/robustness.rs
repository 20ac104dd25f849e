//! What the device does when things go wrong around it: a backend that
//! fails, a process killed inside a reset, power cut during a refused
//! operation, hostile clock and configuration values.

mod common;

use std::cell::Cell;
use std::os::unix::fs::FileExt;
use std::rc::Rc;

use common::*;
use flintfs_flash::{
    Backend, BlockRecord, Counters, DeviceError, DeviceOptions, FaultConfig, FlashDevice, FlashEmulator, Geometry,
    ImageFlash, ImageLayout, MemoryBackend, MemoryFlash, Overlay, PageAddress, PageState, Result, TimingConfig,
    ZoneRecord, ZoneState, BLOCK_RECORD_BYTES,
};

/// The memory backend with switches that make page writes or zone record
/// writes fail, and a count of the zone records written.
#[derive(Default)]
struct Switches {
    fail_pages: Cell<bool>,
    fail_zone_records: Cell<bool>,
    zone_records_written: Cell<u32>,
}

struct FlakyBackend {
    inner: MemoryBackend,
    switches: Rc<Switches>,
}

fn flaky(geometry: Geometry) -> (FlakyBackend, Rc<Switches>) {
    let switches = Rc::new(Switches::default());
    (FlakyBackend { inner: MemoryBackend::new(geometry), switches: switches.clone() }, switches)
}

fn io_error(operation: &'static str) -> DeviceError {
    DeviceError::Io { path: "test".into(), operation, source: std::io::Error::from_raw_os_error(5) }
}

impl Backend for FlakyBackend {
    fn read_page(&mut self, physical: u64, data: &mut [u8], oob: &mut [u8]) -> Result<()> {
        self.inner.read_page(physical, data, oob)
    }
    fn read_oob(&mut self, physical: u64, oob: &mut [u8]) -> Result<()> {
        self.inner.read_oob(physical, oob)
    }
    fn write_page(&mut self, physical: u64, data: &[u8], oob: &[u8]) -> Result<()> {
        if self.switches.fail_pages.get() {
            return Err(io_error("write page"));
        }
        self.inner.write_page(physical, data, oob)
    }
    fn write_nvm(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.inner.write_nvm(offset, bytes)
    }
    fn write_zone_record(&mut self, zone: u32, record: &ZoneRecord) -> Result<()> {
        if self.switches.fail_zone_records.get() {
            return Err(io_error("write zone record"));
        }
        self.switches.zone_records_written.set(self.switches.zone_records_written.get() + 1);
        self.inner.write_zone_record(zone, record)
    }
    fn write_block_records(&mut self, first_block: u64, records: &[BlockRecord]) -> Result<()> {
        self.inner.write_block_records(first_block, records)
    }
    fn write_overlay(&mut self, overlay: &Overlay, generation_of: &dyn Fn(u64) -> u32) -> Result<()> {
        self.inner.write_overlay(overlay, generation_of)
    }
    fn write_summary(&mut self, counters: &Counters, clock_ns: u64) -> Result<()> {
        self.inner.write_summary(counters, clock_ns)
    }
    fn sync(&mut self) -> Result<()> {
        self.inner.sync()
    }
}

#[test]
fn a_failed_backend_write_keeps_the_page_buffered_and_the_prefix_intact() {
    let geometry = small_geometry();
    let (backend, switches) = flaky(geometry);
    let failing = &switches.fail_pages;
    let options = DeviceOptions { write_buffer_pages: 2, ..options(FaultConfig::none(0)) };
    let mut device = FlashEmulator::with_backend(geometry, options, backend).unwrap();
    program(&mut device, 0, 0, 1);
    program(&mut device, 0, 1, 1);
    failing.set(true);
    let (data, oob) = page_bytes(&geometry, PageAddress::new(0, 2), 1);
    let error = device.program_page(PageAddress::new(0, 2), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::Io { .. }), "{error:?}");
    assert_eq!(device.report_zone(0).unwrap().write_pointer, 2, "an error means the program was not accepted");
    assert!(device.flush().is_err());
    assert_eq!(device.durable_write_pointer(0).unwrap(), 0, "nothing reached the store");
    assert_eq!(device.buffered_pages(), 2, "the buffer is still bounded");
    failing.set(false);
    device.program_page(PageAddress::new(0, 2), &data, &oob).unwrap();
    device.flush().unwrap();
    assert_eq!(device.durable_write_pointer(0).unwrap(), 3);
    for page in 0..3 {
        assert_eq!(read(&mut device, 0, page).1, page_bytes(&geometry, PageAddress::new(0, page), 1).0);
    }
    // A cut whose backend fails still brings every zone back consistent.
    program(&mut device, 1, 0, 1);
    program(&mut device, 1, 1, 1);
    failing.set(true);
    assert!(device.power_cut(5).is_err());
    let report = device.report_zone(1).unwrap();
    assert_eq!(report.write_pointer, device.durable_write_pointer(1).unwrap());
    failing.set(false);
    program(&mut device, 1, report.write_pointer, 2);
    device.flush().unwrap();
}

#[test]
fn a_process_killed_inside_a_reset_leaves_an_image_that_opens() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let geometry = Geometry { zone_blocks: 4, ..small_geometry() };
    let faults = FaultConfig {
        program_failure_probability_at_endurance: 1.0,
        endurance_cycles: 1,
        failure_growth_exponent: 1.0,
        ..FaultConfig::none(0)
    };
    let options = DeviceOptions { host_sync: false, ..options(faults) };
    let mut device = ImageFlash::create_image(&path, geometry, options.clone()).unwrap();
    device.reset_zone(0).unwrap(); // erase count 1: programs now fail
    let (data, oob) = page_bytes(&geometry, PageAddress::new(0, 0), 1);
    assert!(matches!(device.program_page(PageAddress::new(0, 0), &data, &oob), Err(DeviceError::ProgramFailed { .. })));
    device.flush().unwrap();
    drop(device);
    let before = std::fs::read(&path).unwrap();
    let mut device = ImageFlash::open_image(&path, options.clone()).unwrap();
    assert_eq!(device.report_zone(0).unwrap().state, ZoneState::ReadOnly, "the grown bad block was recorded");
    device.reset_zone(0).unwrap(); // retires the bad block: capacity 16 -> 12
    drop(device);
    let after = std::fs::read(&path).unwrap();
    // The kill points a reset can leave: block records written, zone record
    // not yet; and after a host crash, only some of the block records
    // (here the bad block's and one more). Either way the reset completes.
    let layout = ImageLayout::of(&geometry);
    for written_blocks in [4, 2] {
        let mut killed = before.clone();
        let start = layout.block_table_offset as usize;
        let blocks = start..start + written_blocks * BLOCK_RECORD_BYTES as usize;
        killed[blocks.clone()].copy_from_slice(&after[blocks]);
        std::fs::write(&path, &killed).unwrap();
        for open in 0..2 {
            let mut device = ImageFlash::open_image(&path, options.clone()).unwrap();
            let report = device.report_zone(0).unwrap();
            let found = (report.state, report.write_pointer, report.capacity_pages);
            assert_eq!(found, (ZoneState::Empty, 0, 12), "{written_blocks} block records, open {open}");
            assert_eq!(read(&mut device, 0, 0).0, PageState::Erased);
            let erase_counts: Vec<u32> = device.blocks()[..4].iter().map(|block| block.erase_count).collect();
            assert_eq!(erase_counts, [1, 2, 2, 2], "{written_blocks} block records, open {open}");
        }
    }
}

#[test]
fn a_scheduled_cut_fires_even_when_its_operation_is_refused() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(0));
    device.schedule_power_cut(0, 1).unwrap();
    let (data, oob) = page_bytes(&geometry, PageAddress::new(0, 5), 1);
    let error = device.program_page(PageAddress::new(0, 5), &data, &oob).unwrap_err();
    assert!(matches!(error, DeviceError::PowerLost { .. }), "{error:?}");
    assert!(device.is_powered_off());
    device.power_on().unwrap();
    // A cut in the past is refused rather than never firing.
    assert!(matches!(device.schedule_power_cut(0, 1), Err(DeviceError::OutOfRange { .. })));
    device.schedule_power_cut(device.mutating_operations(), 1).unwrap();
    assert!(matches!(device.finish_zone(0), Err(DeviceError::PowerLost { .. })));
}

#[test]
fn interrupted_erases_are_off_by_default() {
    let geometry = small_geometry();
    for seed in 0..64 {
        let mut device = memory(geometry, FaultConfig::none(seed));
        program(&mut device, 0, 0, 1);
        device.flush().unwrap();
        device.schedule_power_cut(device.mutating_operations(), seed).unwrap();
        assert!(device.reset_zone(0).is_err());
        let report = device.power_on().unwrap();
        assert_eq!(report.interrupted_erase, None, "seed {seed}");
        assert!(device.blocks().iter().all(|block| block.interrupted_erase_seed.is_none()));
    }
}

#[test]
fn hostile_clock_and_configuration_values_get_errors_not_panics() {
    let geometry = small_geometry();
    let mut device = memory(geometry, FaultConfig::none(0));
    program(&mut device, 0, 0, 1);
    device.advance_time(u64::MAX);
    device.flush().unwrap();
    read(&mut device, 0, 0);
    device.nvm_write(0, &[1; 64]).unwrap();
    device.nvm_persist(0, 64).unwrap();
    assert_eq!(device.now_ns(), u64::MAX, "the clock saturates");
    for timing in [
        TimingConfig { channels: 0, ..TimingConfig::default() },
        TimingConfig { dies_per_channel: 1 << 20, ..TimingConfig::default() },
    ] {
        let options = DeviceOptions { timing, ..DeviceOptions::default() };
        assert!(matches!(MemoryFlash::memory(geometry, options), Err(DeviceError::Geometry { .. })));
    }
    let huge = Geometry { block_pages: 1, zone_blocks: 1, zone_count: u32::MAX, ..geometry };
    assert!(matches!(huge.validate(), Err(DeviceError::Geometry { field: "zone_count", .. })));
    let many_blocks = Geometry { block_pages: 1, zone_blocks: 64, zone_count: 1 << 17, ..geometry };
    assert!(many_blocks.validate().is_err(), "more blocks than the emulator keeps records for");
}

#[test]
fn an_image_with_counters_at_the_top_of_their_range_keeps_working() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("device.img");
    let geometry = small_geometry();
    drop(ImageFlash::create_image(&path, geometry, options(FaultConfig::none(0))).unwrap());
    // Rewrite both header copies with every counter and the clock at u64::MAX.
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    for copy in 0..2u64 {
        let mut header = vec![0u8; 4096];
        file.read_exact_at(&mut header, copy * 4096).unwrap();
        // The clock at 136, the 21 counters from 152 (docs/DEVICE-IMAGE.md).
        for offset in std::iter::once(136).chain((152..152 + 8 * 21).step_by(8)) {
            header[offset..offset + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        }
        let crc = crc32c::crc32c(&header[..4092]);
        header[4092..].copy_from_slice(&crc.to_le_bytes());
        file.write_all_at(&header, copy * 4096).unwrap();
    }
    drop(file);
    let mut device = ImageFlash::open_image(&path, options(FaultConfig::none(0))).unwrap();
    program(&mut device, 0, 0, 1);
    device.flush().unwrap();
    read(&mut device, 0, 0);
    assert_eq!(device.lifetime_counters().pages_programmed, u64::MAX);
}

#[test]
fn a_failed_flush_keeps_its_records_dirty_for_the_next() {
    let geometry = small_geometry();
    let (backend, switches) = flaky(geometry);
    let (failing, written) = (&switches.fail_zone_records, &switches.zone_records_written);
    let mut device = FlashEmulator::with_backend(geometry, options(FaultConfig::none(0)), backend).unwrap();
    program(&mut device, 0, 0, 1);
    program(&mut device, 1, 0, 1);
    failing.set(true);
    assert!(device.flush().is_err());
    failing.set(false);
    let before = written.get();
    device.flush().unwrap();
    assert_eq!(written.get() - before, 2, "both zone records are written by the next flush");
    // A finish whose record write fails is retried by the next flush too.
    failing.set(true);
    assert!(device.finish_zone(0).is_err());
    failing.set(false);
    let before = written.get();
    device.flush().unwrap();
    assert_eq!(written.get() - before, 1);
}
