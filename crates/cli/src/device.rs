//! The device a command works on: an emulator image (`flintfs mkfs`'s
//! default) or the block backend (`--backend block`: a block device or a
//! regular file, no emulation). A path says which it is by its first
//! bytes.

use std::path::Path;
use std::time::{Duration, Instant};

use flintfs_flash::{
    BlockFlash, Counters, DeviceError, DeviceOptions, FlashDevice, Geometry, ImageFlash, PageAddress, PageState,
    PowerCutReport, Result, ZoneReport,
};

use crate::{fail, Outcome};

/// How often a command looks again for a device another process holds.
const DEVICE_WAIT_STEP: Duration = Duration::from_millis(50);

/// An opened device of either backend.
// A process holds one device for its whole life: boxing the larger variant
// would save nothing that matters and add an indirection to every I/O.
#[allow(clippy::large_enum_variant)]
pub enum Device {
    Image(ImageFlash),
    Block(BlockFlash),
}

/// Runs `$body` on whichever device `$self` holds, bound to `$device`.
macro_rules! each {
    ($self:expr, $device:ident => $body:expr) => {
        match $self {
            Device::Image($device) => $body,
            Device::Block($device) => $body,
        }
    };
}

impl Device {
    /// Writes what is pending and lets go of the device.
    pub fn close(self) -> Result<()> {
        each!(self, device => device.close())
    }

    /// Cuts the emulated power. The block backend has no emulated power:
    /// stopping its daemon dead (kill -9) is its crash.
    pub fn power_cut(&mut self, seed: u64) -> std::result::Result<PowerCutReport, String> {
        match self {
            Device::Image(device) => device.power_cut(seed).map_err(|error| error.to_string()),
            Device::Block(_) => {
                Err("the block backend has no emulated power to cut: kill -9 the daemon to crash it".into())
            }
        }
    }

    /// The device's counters over its whole life.
    pub fn lifetime_counters(&self) -> Counters {
        each!(self, device => device.lifetime_counters())
    }

    pub fn backend_name(&self) -> &'static str {
        match self {
            Device::Image(_) => "emulator",
            Device::Block(_) => "block",
        }
    }
}

/// Opens the device at `path`, waiting up to `wait` for another process
/// (a daemon finishing its unmount) to let go of it. Says clearly when the
/// path is missing, of the wrong kind, or not flintfs.
pub fn open_device(path: &Path, wait: Duration) -> Outcome<Device> {
    open_device_with(path, wait, None, true)
}

/// [`open_device`] for a command that only looks (fsck without
/// `--repair`, inspect, stat): an image is opened under a scratch view
/// (`ImageFlash::open_image_to_look`), so the device, and an engine
/// mounted on it with its recovery, run as on a real open while nothing
/// they write reaches the file; the block backend likewise
/// (`BlockFlash::open_to_look`).
pub fn open_device_to_look(path: &Path, wait: Duration) -> Outcome<Device> {
    open_device_to_look_with(path, wait, None)
}

/// [`open_device_to_look`] with faults injected (the emulator only): a
/// read-only mount's device (`-o ro`), so the file, or the block device,
/// is opened for reading alone and the device's own records (its open's
/// epoch, its counters, each block's reads) go to the scratch view.
pub fn open_device_to_look_with(
    path: &Path,
    wait: Duration,
    faults: Option<flintfs_flash::FaultConfig>,
) -> Outcome<Device> {
    open_device_for(path, wait, faults, true, Access::Look)
}

/// [`open_device`], with faults injected (the emulator only) and, for an
/// image, whether each flush reaches the host's disk (`host_sync`: on
/// everywhere but a mount with `-o nohost_sync`). Without it a flush stays
/// in the host's page cache: it survives the daemon killed, not the host
/// crashing, and an fsync on the mount would return before the disk has
/// the data, unlike an fsync on ext4. A block device always syncs.
pub fn open_device_with(
    path: &Path,
    wait: Duration,
    faults: Option<flintfs_flash::FaultConfig>,
    host_sync: bool,
) -> Outcome<Device> {
    open_device_for(path, wait, faults, host_sync, Access::Use)
}

/// What a command does with the device it opens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Mounts, repairs, formats: writes reach the device.
    Use,
    /// Only looks: writes go to a scratch view (see `open_device_to_look`).
    Look,
}

fn open_device_for(
    path: &Path,
    wait: Duration,
    faults: Option<flintfs_flash::FaultConfig>,
    host_sync: bool,
    access: Access,
) -> Outcome<Device> {
    use std::os::unix::fs::FileTypeExt;
    let metadata = std::fs::metadata(path).map_err(|error| format!("{}: {error}", path.display()))?;
    if !metadata.is_file() && !metadata.file_type().is_block_device() {
        fail!("{}: not an image file or a block device", path.display());
    }
    let block = BlockFlash::probe(path);
    if block && faults.is_some() {
        fail!("{}: faults are injected by the emulator; a block device has its own", path.display());
    }
    let options = DeviceOptions { faults: faults.unwrap_or_default(), host_sync, ..DeviceOptions::default() };
    let start = Instant::now();
    loop {
        let opened = match (block, access == Access::Look) {
            (true, true) => BlockFlash::open_to_look(path).map(Device::Block),
            (true, false) => BlockFlash::open(path).map(Device::Block),
            (false, true) => ImageFlash::open_image_to_look(path, options.clone()).map(Device::Image),
            (false, false) => ImageFlash::open_image(path, options.clone()).map(Device::Image),
        };
        match opened {
            Ok(device) => return Ok(device),
            Err(DeviceError::Image { reason, .. }) if reason.contains("in use") && start.elapsed() < wait => {
                std::thread::sleep(DEVICE_WAIT_STEP);
            }
            Err(DeviceError::Image { reason, .. }) if reason.contains("in use") => {
                fail!("{}: in use by another process (mounted?)", path.display())
            }
            Err(error) => fail!("{error}"),
        }
    }
}

impl FlashDevice for Device {
    fn geometry(&self) -> Geometry {
        each!(self, device => device.geometry())
    }

    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        each!(self, device => device.read_page(address, data, oob))
    }

    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState> {
        each!(self, device => device.read_oob(address, oob))
    }

    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        each!(self, device => device.program_page(address, data, oob))
    }

    fn reset_zone(&mut self, zone: u32) -> Result<()> {
        each!(self, device => device.reset_zone(zone))
    }

    fn finish_zone(&mut self, zone: u32) -> Result<()> {
        each!(self, device => device.finish_zone(zone))
    }

    fn report_zone(&self, zone: u32) -> Result<ZoneReport> {
        each!(self, device => device.report_zone(zone))
    }

    fn report_zones(&self) -> Vec<ZoneReport> {
        each!(self, device => device.report_zones())
    }

    fn flush(&mut self) -> Result<()> {
        each!(self, device => device.flush())
    }

    fn flush_ordered(&mut self) -> Result<()> {
        each!(self, device => device.flush_ordered())
    }

    fn flush_owed(&self) -> bool {
        each!(self, device => device.flush_owed())
    }

    fn nvm_read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        each!(self, device => device.nvm_read(offset, buffer))
    }

    fn nvm_write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        each!(self, device => device.nvm_write(offset, data))
    }

    fn nvm_persist(&mut self, offset: u64, length: u64) -> Result<()> {
        each!(self, device => device.nvm_persist(offset, length))
    }

    fn counters(&self) -> Counters {
        each!(self, device => device.counters())
    }

    fn reset_counters(&mut self) {
        each!(self, device => device.reset_counters())
    }

    fn now_ns(&self) -> u64 {
        each!(self, device => device.now_ns())
    }

    fn advance_time(&mut self, duration_ns: u64) {
        each!(self, device => device.advance_time(duration_ns))
    }

    fn die_count(&self) -> u32 {
        each!(self, device => device.die_count())
    }

    fn die_of(&self, address: PageAddress) -> Option<u32> {
        each!(self, device => device.die_of(address))
    }

    fn retire_block(&mut self, address: PageAddress) -> flintfs_flash::Result<bool> {
        each!(self, device => device.retire_block(address))
    }
}
