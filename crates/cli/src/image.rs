//! Image files: sizes, `mkfs`, opening an image another process may still
//! be letting go of, and `fsck`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use flintfs_core::{Fs, FsOptions, MkfsOptions};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, ImageBackend, ImageFlash};

use crate::device::{open_device, open_device_to_look, Device};

use crate::{fail, Outcome};

/// How long a command waits for an image that another process (a daemon
/// still writing its unmount checkpoint, say) holds.
pub const IMAGE_WAIT: Duration = Duration::from_secs(30);

/// Parses `4096`, `64K`, `64M`, `1G`, `1GiB`, `2T` (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|character: char| !character.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    let number: u64 = digits.parse().map_err(|_| format!("{text:?} is not a size (say 4096, 64M or 1G)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{text:?} has an unknown unit {unit:?} (use K, M, G or T)")),
    };
    number.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

#[derive(Args)]
pub struct MkfsArguments {
    /// The image file to create.
    pub image: PathBuf,
    /// Device size (K, M, G, T suffixes): whole zones of it are used. The
    /// block backend takes a device's or an existing file's own size.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// emulator (an image file holding emulated flash, with faults and a
    /// power switch) or block (a block device or a regular file, no
    /// emulation: direct I/O, the device's own flush).
    #[arg(long, value_enum, default_value_t = Backend::Emulator)]
    pub backend: Backend,
    /// Bytes of data per page (a power of two).
    #[arg(long, default_value_t = Geometry::default().page_size_bytes)]
    pub page_size: u32,
    /// Spare (OOB) bytes per page.
    #[arg(long, default_value_t = Geometry::default().oob_size_bytes)]
    pub oob_size: u32,
    /// Pages per erase block.
    #[arg(long, default_value_t = Geometry::default().block_pages)]
    pub block_pages: u32,
    /// Erase blocks per zone (1 is raw NAND: every block its own zone).
    #[arg(long, default_value_t = Geometry::default().zone_blocks)]
    pub zone_blocks: u32,
    /// Byte-addressable NVM beside the flash.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub nvm_size: u64,
    /// Overwrite an existing file, even a flintfs image.
    #[arg(long)]
    pub force: bool,
    /// Say what would be made, and write nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Print nothing when it succeeds.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Parity pages at the end of each erase block (1 is XOR, more is
    /// Reed-Solomon); default 1 on blocks of 4 pages or more.
    #[arg(long, value_name = "K")]
    pub block_parity: Option<u32>,
    /// Reed-Solomon parity blocks at the end of each zone; default 1 on
    /// zones of 4 blocks or more.
    #[arg(long, value_name = "R")]
    pub zone_parity: Option<u32>,
    /// How mounts compress file blocks unless -o compress= says otherwise:
    /// none, lz4 or zstd (the level is a mount's or a file's choice).
    #[arg(long, value_name = "CODEC", default_value = "lz4", value_parser = ["none", "lz4", "zstd"])]
    pub compress: String,
    /// Make the image on aging flash: a preset (slc-fresh, mlc-fresh,
    /// mlc-midlife, mlc-eol, read-disturb, bad-blocks, misdirected) or a
    /// TOML file. Factory bad blocks are drawn now, once; the rest applies
    /// while mkfs writes (a mount takes -o faults= for its own).
    #[arg(long, value_name = "PRESET|FILE")]
    pub faults: Option<String>,
    /// The seed of every fault --faults injects.
    #[arg(long, default_value_t = crate::faults::FAULT_SEED_DEFAULT)]
    pub fault_seed: u64,
    /// Write zeros over the whole image now (a disk has every block from
    /// the start): no later write allocates the host's blocks or page
    /// cache. The image is then as large on the host as --size; without
    /// it, the image is sparse and grows as it is written.
    #[arg(long)]
    pub preallocate: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Emulator,
    Block,
}

/// The geometry the arguments ask for, with the zones `size` bytes hold,
/// checked.
fn geometry_of(arguments: &MkfsArguments, size: u64) -> Outcome<Geometry> {
    let mut geometry = Geometry {
        page_size_bytes: arguments.page_size,
        oob_size_bytes: arguments.oob_size,
        block_pages: arguments.block_pages,
        zone_blocks: arguments.zone_blocks,
        nvm_size_bytes: arguments.nvm_size,
        ..Geometry::default()
    };
    let zone_bytes = u64::from(geometry.page_size_bytes)
        .saturating_mul(u64::from(geometry.block_pages))
        .saturating_mul(u64::from(geometry.zone_blocks));
    if zone_bytes == 0 {
        fail!("pages, blocks and zones must all be non-empty");
    }
    geometry.zone_count = match arguments.backend {
        Backend::Emulator => u32::try_from(size / zone_bytes).unwrap_or(u32::MAX),
        Backend::Block => {
            let (sector_bytes, _) = flintfs_flash::block_device_size(&arguments.image).unwrap_or((512, size));
            flintfs_flash::BlockLayout::zones_fitting(&geometry, sector_bytes, size)
        }
    };
    let zones_min = flintfs_core::zones_min(flintfs_core::UNINDEXED_SEGMENTS_DEFAULT);
    if geometry.zone_count < zones_min {
        fail!(
            "a size of {} bytes holds {} zones of {} bytes; flintfs needs at least {} ({} bytes)",
            size,
            geometry.zone_count,
            zone_bytes,
            zones_min,
            u64::from(zones_min) * zone_bytes
        );
    }
    if let Err(error) = geometry.validate() {
        fail!("bad geometry: {error}");
    }
    Ok(geometry)
}

/// 16 random bytes from the host, for the file system's UUID.
fn random_uuid() -> Outcome<[u8; 16]> {
    let mut uuid = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut uuid))
        .map_err(|error| format!("reading /dev/urandom for a UUID: {error}"))?;
    Ok(uuid)
}

pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|since| since.as_nanos() as u64).unwrap_or(0)
}

/// Whether `path` starts like a flintfs image.
fn is_flintfs_image(path: &Path) -> bool {
    ImageBackend::read_geometry(path).is_ok()
}

fn describe(path: &Path, geometry: &Geometry) -> String {
    format!(
        "{}: flintfs format {}, {} zones of {} blocks of {} pages of {} B (+{} B OOB), {} MiB{}",
        path.display(),
        flintfs_format::FORMAT_VERSION,
        geometry.zone_count,
        geometry.zone_blocks,
        geometry.block_pages,
        geometry.page_size_bytes,
        geometry.oob_size_bytes,
        geometry.device_size_bytes() >> 20,
        if geometry.nvm_size_bytes > 0 { format!(", {} B NVM", geometry.nvm_size_bytes) } else { String::new() }
    )
}

pub fn mkfs(arguments: MkfsArguments) -> Outcome<ExitCode> {
    if arguments.backend == Backend::Block {
        return mkfs_block(arguments);
    }
    let Some(size) = arguments.size else { fail!("--size is needed for an emulator image (say --size 1G)") };
    let geometry = geometry_of(&arguments, size)?;
    let path = &arguments.image;
    if arguments.dry_run {
        println!("would make {}", describe(path, &geometry));
        return Ok(ExitCode::SUCCESS);
    }
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.is_file() {
            fail!("{}: exists and is not a regular file", path.display());
        }
        if !arguments.force {
            if is_flintfs_image(path) {
                fail!("{}: already holds a flintfs image; --force overwrites it", path.display());
            }
            fail!("{}: already exists; --force overwrites it", path.display());
        }
        // An image a daemon has mounted is locked: refuse rather than pull
        // it out from under the mount. Only the lock is tried, so a damaged
        // image can still be overwritten.
        let file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
        if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock() {
            fail!("{}: in use by another process (mounted?)", path.display());
        }
        drop(file);
        std::fs::remove_file(path).map_err(|error| format!("{}: removing: {error}", path.display()))?;
    }
    let faults = match &arguments.faults {
        Some(spec) => crate::faults::parse_faults(spec, arguments.fault_seed)?,
        None => flintfs_flash::FaultConfig::none(arguments.fault_seed),
    };
    // Synced to the host: a new image is on the disk when mkfs returns.
    let mut device = ImageFlash::create_image(
        path,
        geometry,
        DeviceOptions { faults, host_sync: true, ..DeviceOptions::default() },
    )?;
    if arguments.preallocate {
        preallocate(&mut device, arguments.quiet).inspect_err(|_| {
            // No image that is neither formatted nor ours to keep.
            let _ = std::fs::remove_file(path);
        })?;
    }
    let options = mkfs_options(&arguments)?;
    let clock = Box::new(flintfs_fuse::SystemClock);
    let device = Fs::format(device, &options, clock).map_err(|error| format!("mkfs: {}", error.message))?;
    drop(device);
    if !arguments.quiet {
        println!("{}", describe(path, &geometry));
    }
    Ok(ExitCode::SUCCESS)
}

/// `mkfs --preallocate`: zeros into every hole of the new image, with a
/// progress bar on a terminal.
fn preallocate(device: &mut ImageFlash, quiet: bool) -> Outcome<()> {
    let bar = if quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(0) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("  preallocating [{bar:32}] {bytes}/{total_bytes} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let outcome = device.allocate_every_hole(&mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    outcome.map_err(|error| format!("mkfs --preallocate: {error}").into())
}

/// The block backend's mkfs: a block device, or a regular file (made, or
/// formatted at its own size). What holds a file system is refused unless
/// --force, naming what it holds, as mkfs.ext4 does; a mounted device is
/// refused by the kernel (an exclusive open).
fn mkfs_block(arguments: MkfsArguments) -> Outcome<ExitCode> {
    use std::os::unix::fs::FileTypeExt;
    if arguments.preallocate {
        // A device has every block already; a regular file under the block
        // backend is written where it is, not gathered into an image.
        fail!("--preallocate is for emulator images; the block backend writes a device's own blocks");
    }
    let path = &arguments.image;
    let existing = std::fs::metadata(path).ok();
    if let Some(metadata) = &existing {
        if !metadata.is_file() && !metadata.file_type().is_block_device() {
            fail!("{}: not a block device or a regular file", path.display());
        }
        if let Some(holds) = crate::conventions::what_it_holds(path) {
            if !arguments.force && !arguments.dry_run {
                fail!("{}: holds {holds}; --force overwrites it", path.display());
            }
        }
    }
    let size = match (&existing, arguments.size) {
        (Some(metadata), size) if metadata.file_type().is_block_device() => {
            let (_, bytes) = flintfs_flash::block_device_size(path)?;
            size.map_or(bytes, |size| size.min(bytes))
        }
        (_, Some(size)) => size,
        (Some(metadata), None) if metadata.len() > 0 => metadata.len(),
        _ => fail!("{}: give a size (--size 1G) for a new or empty file", path.display()),
    };
    let geometry = geometry_of(&arguments, size)?;
    if arguments.dry_run {
        println!("would make {} (block backend)", describe(path, &geometry));
        return Ok(ExitCode::SUCCESS);
    }
    let mut nonce = [0u8; 8];
    nonce.copy_from_slice(&random_uuid()?[..8]);
    let create = flintfs_flash::BlockCreate { size_bytes: Some(size), nonce: u64::from_le_bytes(nonce) };
    let device = flintfs_flash::BlockFlash::create(path, geometry, create)?;
    let made = device.geometry();
    let options = mkfs_options(&arguments)?;
    let clock = Box::new(flintfs_fuse::SystemClock);
    let device = Fs::format(crate::device::Device::Block(device), &options, clock)
        .map_err(|error| format!("mkfs: {}", error.message))?;
    device.close()?;
    if !arguments.quiet {
        println!("{} (block backend)", describe(path, &made));
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine's mkfs options from the command's.
fn mkfs_options(arguments: &MkfsArguments) -> Outcome<MkfsOptions> {
    let mut options = MkfsOptions::new(random_uuid()?, now_ns());
    if let Some(pages) = arguments.block_parity {
        options.block_parity_pages = pages;
    }
    if let Some(blocks) = arguments.zone_parity {
        options.segment_parity_blocks = blocks;
    }
    options.compression = flintfs_format::CompressionChoice::parse(&arguments.compress)
        .map_err(|reason| crate::Failure(format!("mkfs: {reason}")))?
        .codec;
    Ok(options)
}

/// Mounts the file system on an opened device, wording errors for the user.
pub fn mount_fs(device: Device, options: FsOptions) -> Outcome<(Fs<Device>, flintfs_core::MountReport)> {
    Fs::mount(device, options, Box::new(flintfs_fuse::SystemClock))
        .map_err(|error| crate::Failure(format!("mount: {}", error.message)))
}

#[derive(Args)]
pub struct FsckArguments {
    pub image: PathBuf,
    /// Repair what can be: free what crashed unlinks left, release zones
    /// nothing references, and write a fresh checkpoint; then check again.
    #[arg(long)]
    pub repair: bool,
    #[arg(long)]
    pub json: bool,
}

/// What a check of an image found.
pub struct Checked {
    pub report: flintfs_core::CheckReport,
    pub mount: flintfs_core::MountReport,
    pub repaired: bool,
}

/// Mounts an image, repairs it if asked, and checks every invariant.
pub fn check_image(path: &Path, repair: bool, wait: Duration) -> Outcome<Checked> {
    // Without a repair the image is only looked at: the mount's recovery
    // (its replay and checkpoint) and the device's own open run on a
    // scratch view, and the file stays as it was found.
    let mut refused = None;
    let (mut fs, mount) = if repair {
        mount_fs(open_device(path, wait)?, FsOptions::default())?
    } else {
        match Fs::mount(open_device_to_look(path, wait)?, FsOptions::default(), Box::new(flintfs_fuse::SystemClock)) {
            Ok(mounted) => mounted,
            // A mount that cannot write what it must (a recovery's
            // checkpoint on worn checkpoint zones) is itself a finding:
            // the image is then checked through a read-only mount, which
            // needs none, so the check says whether the files are there.
            Err(error) if error.errno == flintfs_core::errno::EROFS => {
                refused = Some(format!(
                    "a read-write mount fails ({}); checked read-only (flintfs mount -o ro reads the files)",
                    error.message
                ));
                let read_only_options = FsOptions { read_only: true, ..FsOptions::default() };
                Fs::mount(open_device_to_look(path, wait)?, read_only_options, Box::new(flintfs_fuse::SystemClock))
                    .map_err(|read_only| {
                        crate::Failure(format!("mount: {}; read-only: {}", error.message, read_only.message))
                    })?
            }
            Err(error) => fail!("mount: {}", error.message),
        }
    };
    if repair {
        // The checkpoint is what repairs: it records the tree as the mount
        // found it, with the orphans freed and unreferenced zones released.
        fs.sync().map_err(|error| format!("repair: {}", error.message))?;
    }
    let mut report = fs.check().map_err(|error| format!("check: {}", error.message))?;
    report.findings.extend(refused);
    // Without a repair, what the mount wrote went to the scratch view,
    // which goes with the device.
    drop(fs.into_device());
    Ok(Checked { report, mount, repaired: repair })
}

pub fn fsck(arguments: FsckArguments) -> Outcome<ExitCode> {
    let Checked { report, mount, repaired } = check_image(&arguments.image, arguments.repair, IMAGE_WAIT)?;
    let clean = report.is_clean();
    if arguments.json {
        let value = serde_json::json!({
            "clean": clean,
            "findings": report.findings,
            "pages_checked": report.pages_checked,
            "zones_checked": report.zones_checked,
            "pages_unverified": report.pages_unverified,
            "checkpoint": mount.checkpoint_number,
            "mount_pages_read": mount.pages_read,
            "repaired": repaired,
        });
        println!("{value}");
    } else {
        for finding in &report.findings {
            println!("finding: {finding}");
        }
        println!(
            "{}: {} ({} pages in {} zones checked, checkpoint {}{})",
            arguments.image.display(),
            if clean { "clean".to_string() } else { format!("{} findings", report.findings.len()) },
            report.pages_checked,
            report.zones_checked,
            mount.checkpoint_number,
            if repaired { ", repaired" } else { "" }
        );
    }
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }
}
