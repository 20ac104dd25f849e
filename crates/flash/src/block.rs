//! # The block backend: flintfs on a real block device or a regular file
//!
//! [`BlockFlash`] is a [`FlashDevice`] with no emulation: no fault overlay,
//! no simulated write buffer, no simulated time. Pages are slots of the
//! device, read and written with direct I/O (`O_DIRECT`) where the device
//! allows it; `flush` is `fdatasync`, which the kernel turns into the
//! device's cache flush. Device time is the real time its I/O took.
//! Programs of consecutive slots of one zone are gathered and written
//! together, up to [`BLOCK_PENDING_SLOTS_MAX`], before any flush.
//!
//! ## Layout (`docs/BLOCK-DEVICE.md` has every field)
//! Two header copies, two copies of the zone table, then the zones: zone
//! `z`, page `p` is slot `z * zone_pages + p`. A slot is the page's data,
//! then its spare area padded to whole sectors, which ends with the slot
//! trailer. The spare area sits beside the data in the same write:
//! - a page and its header reach the device in the same write, with no
//!   second I/O and no sector shared between pages;
//! - the cost is the padding: 384 bytes per 4 KiB page on 512-byte
//!   sectors (a slot of 4608 bytes, 8.3% of the device).
//!
//! ## Write pointers without hardware
//! A block device has no write pointer, so the device finds each zone's
//! durable prefix at open from the slots' own trailers:
//! - a trailer is valid when its magic, zone, page and zone generation
//!   match, and its CRC (over the format's nonce, the spare area and the
//!   trailer) holds;
//! - a zone's write pointer is its first slot without a valid trailer, or
//!   whose epoch is below the slot's before it (or not below this
//!   session's, which no slot written before the open can have).
//!
//! The epoch is the header's, raised (and synced, both copies) at every
//! open (a look's open raises it in its scratch view only). A crash can
//! leave whole slots past the first that did not land; open ends the
//! prefix before them, and the session writes over the
//! prefix's end with a higher epoch. A later open then stops at the first
//! old slot left past what the session wrote: a slot that did not count
//! once never counts again.
//!
//! A reset raises the zone's generation in the zone table before it
//! returns, so stale slots of the zone's last life stop counting. A zone's
//! first program since its reset marks it in use, and a zone written to
//! capacity (or finished) is marked full, in the table, by the next flush
//! before it returns (a finish at once). Open reads no slot of a full zone
//! or of one not in use, so it scans only the zones the file system had
//! open, their written pages and one more (at most `open_zones_max`, the
//! same bound recovery keeps to its unindexed zones).
//!
//! ## What a crash keeps
//! - A slot that reached the device whole counts, if every slot before it
//!   in its zone counts.
//! - A slot whose trailer landed but whose data did not (a torn write) is
//!   below the write pointer with garbage data, as a torn page of the
//!   emulator's model. The file system detects it by its own CRCs.
//! - The zone table is written copy A, then fdatasync, then copy B, then
//!   fdatasync. A torn sector can therefore only damage one copy, and the
//!   other still holds every zone's last durable record.
//! - A reset that did not return may or may not have happened.
//! - Killing the process loses nothing a flush made durable (programs
//!   still gathered are a suffix of their zone, as a drive's cache is).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::host_file::HostFile;
use crate::{Counters, DeviceError, FlashDevice, Geometry, PageAddress, PageState, Result, ZoneReport, ZoneState};

/// The first bytes of a block-backend device.
pub const BLOCK_MAGIC: [u8; 8] = *b"FLNTBLK\0";
/// The block layout's version; a device of another is refused by name.
pub const BLOCK_FORMAT_VERSION: u32 = 2;
/// Bytes of one header copy (two copies open the device).
pub const BLOCK_HEADER_BYTES: u64 = 4096;
/// Bytes of one zone's record in the zone table.
pub const BLOCK_ZONE_RECORD_BYTES: usize = 32;
/// Bytes of the trailer that ends every slot's spare area.
pub const BLOCK_TRAILER_BYTES: usize = 32;
/// Bytes of the summary: the lifetime counters, written at close.
pub const BLOCK_SUMMARY_BYTES: u64 = 4096;
/// Memory alignment of I/O buffers: what direct I/O asks on any device.
const BUFFER_ALIGNMENT_BYTES: usize = 4096;
/// Most slots a program gathers before they go to the device in one write:
/// consecutive slots of one zone, held as a device's write cache holds
/// them (a flush writes them first; a read of one is served from here).
pub const BLOCK_PENDING_SLOTS_MAX: usize = 64;
/// The sector a regular file is aligned to (a block device says its own).
const FILE_SECTOR_BYTES: u32 = 512;
/// The largest sector a device may have.
const SECTOR_BYTES_MAX: u32 = 4096;
const TRAILER_MAGIC: [u8; 4] = *b"FPG1";
/// In a zone record: the zone is not marked full.
const NOT_FULL: u32 = u32::MAX;
/// Bytes of the header that the CRC covers.
const HEADER_FIELDS_BYTES: usize = 52;

const _: () = assert!(BLOCK_ZONE_RECORD_BYTES * 16 == FILE_SECTOR_BYTES as usize);
const _: () = assert!((BLOCK_HEADER_BYTES as usize).is_multiple_of(BUFFER_ALIGNMENT_BYTES));
const _: () = assert!(SECTOR_BYTES_MAX as usize <= BUFFER_ALIGNMENT_BYTES);
const _: () = assert!(HEADER_FIELDS_BYTES + 4 <= BLOCK_HEADER_BYTES as usize);
// The summary holds a count, every counter and a CRC.
const _: () = assert!(8 + 8 * Counters::FIELD_NAMES.len() + 4 <= BLOCK_SUMMARY_BYTES as usize);

/// Where things are on a block-backend device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// The device's logical sector: slots and table writes are whole
    /// sectors, as direct I/O needs.
    pub sector_bytes: u32,
    /// A page's spare area with its trailer, rounded up to whole sectors.
    pub spare_area_bytes: u32,
    /// One slot: the page's data, then its spare area.
    pub slot_bytes: u64,
    /// Bytes of one zone-table copy (whole 4 KiB blocks).
    pub table_bytes: u64,
    /// Where copy A of the zone table starts; copy B follows it.
    pub table_offset: u64,
    /// Where the lifetime counters are written at close.
    pub summary_offset: u64,
    /// Where zone 0's first slot starts.
    pub data_offset: u64,
}

impl BlockLayout {
    pub fn of(geometry: &Geometry, sector_bytes: u32) -> BlockLayout {
        let sector = u64::from(sector_bytes);
        let spare = (u64::from(geometry.oob_size_bytes) + BLOCK_TRAILER_BYTES as u64).div_ceil(sector) * sector;
        let table_bytes = (u64::from(geometry.zone_count) * BLOCK_ZONE_RECORD_BYTES as u64)
            .div_ceil(BLOCK_HEADER_BYTES)
            * BLOCK_HEADER_BYTES;
        let table_offset = 2 * BLOCK_HEADER_BYTES;
        BlockLayout {
            sector_bytes,
            spare_area_bytes: spare as u32,
            slot_bytes: u64::from(geometry.page_size_bytes) + spare,
            table_bytes,
            table_offset,
            summary_offset: table_offset + 2 * table_bytes,
            data_offset: table_offset + 2 * table_bytes + BLOCK_SUMMARY_BYTES,
        }
    }

    /// Bytes a device of `geometry` needs.
    pub fn device_bytes(&self, geometry: &Geometry) -> u64 {
        self.data_offset + geometry.device_pages() * self.slot_bytes
    }

    /// How many zones fit in `bytes` with this layout's slot (the table's
    /// own size depends on the count, so it is found from above).
    pub fn zones_fitting(geometry: &Geometry, sector_bytes: u32, bytes: u64) -> u32 {
        let mut trial = *geometry;
        let slot = BlockLayout::of(geometry, sector_bytes).slot_bytes;
        let mut zones = (bytes / (geometry.zone_pages() * slot)).min(u64::from(crate::ZONE_COUNT_MAX)) as u32;
        while zones > 0 {
            trial.zone_count = zones;
            if BlockLayout::of(&trial, sector_bytes).device_bytes(&trial) <= bytes {
                return zones;
            }
            zones -= 1;
        }
        0
    }

    fn slot_offset(&self, geometry: &Geometry, address: PageAddress) -> u64 {
        self.data_offset + (u64::from(address.zone) * geometry.zone_pages() + u64::from(address.page)) * self.slot_bytes
    }
}

/// A buffer aligned for direct I/O.
struct AlignedBuffer {
    pointer: *mut u8,
    length: usize,
}

impl AlignedBuffer {
    fn zeroed(length: usize) -> AlignedBuffer {
        let layout =
            std::alloc::Layout::from_size_align(length.max(1), BUFFER_ALIGNMENT_BYTES).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        if pointer.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuffer { pointer, length }
    }
}

impl std::ops::Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `pointer` holds `length` initialised bytes for as long as
        // the buffer lives.
        unsafe { std::slice::from_raw_parts(self.pointer, self.length) }
    }
}

impl std::ops::DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.length) }
    }
}

// SAFETY: the buffer owns its allocation alone; nothing else points into
// it, so it may move to another thread as a Vec may.
unsafe impl Send for AlignedBuffer {}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.length.max(1), BUFFER_ALIGNMENT_BYTES).expect("as made");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.pointer, layout) }
    }
}

/// One zone as the device keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Zone {
    generation: u64,
    erase_count: u32,
    write_pointer: u32,
    /// Marked full (written to capacity, or finished): no more programs.
    full: bool,
    /// Programmed since its last reset: open scans it unless it is full.
    in_use: bool,
    /// Programmed since the device opened and not full.
    open: bool,
}

/// The block backend. See the module documentation.
pub struct BlockFlash {
    path: PathBuf,
    file: HostFile,
    direct: bool,
    geometry: Geometry,
    layout: BlockLayout,
    nonce: u64,
    /// This session's: every slot it writes carries it.
    epoch: u32,
    zones: Vec<Zone>,
    /// Zones whose record changed (first used, or full) and is still to be
    /// written: at the next flush, before it returns.
    unwritten_records: BTreeSet<u32>,
    counters: Counters,
    /// Lifetime counters as the last close left them, and those the file
    /// system reset since this open: the device's whole life is these
    /// plus `counters`.
    lifetime_before: Counters,
    /// Real time spent in I/O since the device opened (the counters' copy
    /// can be reset; this one only grows).
    busy_ns: u64,
    idle_ns: u64,
    /// Pages read at open to find the write pointers.
    pub open_pages_read: u64,
    /// Programmed slots not yet written: `pending_slots` consecutive slots
    /// of `pending_zone` from `pending_first_page`, in `pending` (made at
    /// the first program, [`BLOCK_PENDING_SLOTS_MAX`] slots long).
    pending: Option<AlignedBuffer>,
    pending_zone: u32,
    pending_first_page: u32,
    pending_slots: usize,
}

/// The facts `BlockFlash::create` needs beyond the geometry's page shape.
#[derive(Clone, Copy, Debug)]
pub struct BlockCreate {
    /// Bytes to use: a regular file is made this long; `None` takes the
    /// device's or the file's own size.
    pub size_bytes: Option<u64>,
    /// Binds every slot to this format: a slot from an earlier format of
    /// the same device never counts. Random at mkfs.
    pub nonce: u64,
}

fn io_error<'a>(path: &'a Path, operation: &'static str) -> impl FnOnce(std::io::Error) -> DeviceError + 'a {
    move |source| DeviceError::Io { path: path.display().to_string(), operation, source }
}

fn refused(path: &Path, reason: impl Into<String>) -> DeviceError {
    DeviceError::Image { path: path.display().to_string(), reason: reason.into() }
}

/// The logical sector and byte size of a block device.
fn block_device_facts(file: &File) -> std::io::Result<(u32, u64)> {
    // Linux's BLKSSZGET and BLKGETSIZE64.
    const BLKSSZGET: libc::c_ulong = 0x1268;
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut sector: libc::c_int = 0;
    let mut bytes: u64 = 0;
    // SAFETY: both ioctls write one integer of the given type through the
    // pointer, which is valid for that write.
    let failed = unsafe {
        libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut sector) < 0
            || libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes) < 0
    };
    if failed {
        return Err(std::io::Error::last_os_error());
    }
    Ok((sector as u32, bytes))
}

/// Opens the device or file, taking it for this process alone. `to_look`:
/// read-only and through the page cache (a scratch view copies chunks at
/// any offset, which direct I/O would refuse).
fn open_file(path: &Path, create: bool, to_look: bool) -> Result<(File, bool, bool)> {
    let metadata = std::fs::metadata(path);
    let is_block = metadata.as_ref().is_ok_and(|metadata| metadata.file_type().is_block_device());
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(!to_look);
    if create && !is_block {
        options.create(true);
    }
    // O_EXCL on a block device: the kernel refuses one that is mounted or
    // held by another exclusive opener.
    let exclusive = if is_block { libc::O_EXCL } else { 0 };
    let direct_flag = if to_look { 0 } else { libc::O_DIRECT };
    let direct = options.clone().custom_flags(direct_flag | exclusive).open(path);
    let (file, direct) = match direct {
        Ok(file) => (file, !to_look),
        // tmpfs and some others have no direct I/O: use the page cache,
        // and fdatasync still makes writes durable.
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
            (options.custom_flags(exclusive).open(path).map_err(io_error(path, "open"))?, false)
        }
        Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {
            return Err(refused(path, "in use: mounted, or held by another program"));
        }
        Err(error) => return Err(io_error(path, "open")(error)),
    };
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(refused(path, "in use by another process (mounted?)"));
    }
    Ok((file, direct, is_block))
}

fn encode_header(geometry: &Geometry, sector_bytes: u32, nonce: u64, epoch: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; BLOCK_HEADER_BYTES as usize];
    bytes[0..8].copy_from_slice(&BLOCK_MAGIC);
    let fields = [
        BLOCK_FORMAT_VERSION,
        geometry.page_size_bytes,
        geometry.oob_size_bytes,
        geometry.block_pages,
        geometry.zone_blocks,
        geometry.zone_count,
        geometry.open_zones_max,
        sector_bytes,
    ];
    for (index, field) in fields.iter().enumerate() {
        bytes[8 + 4 * index..12 + 4 * index].copy_from_slice(&field.to_le_bytes());
    }
    bytes[40..48].copy_from_slice(&nonce.to_le_bytes());
    bytes[48..52].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..HEADER_FIELDS_BYTES]);
    bytes[HEADER_FIELDS_BYTES..HEADER_FIELDS_BYTES + 4].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// A decoded header copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub geometry: Geometry,
    pub sector_bytes: u32,
    pub nonce: u64,
    /// The session that last opened the device (0: the one that made it).
    pub epoch: u32,
}

/// Decodes a header copy, or says why not.
pub fn decode_block_header(bytes: &[u8]) -> std::result::Result<BlockHeader, String> {
    let Some(fields) = bytes.get(..HEADER_FIELDS_BYTES + 4) else {
        return Err(format!("a header of {} bytes is too short", bytes.len()));
    };
    if fields[0..8] != BLOCK_MAGIC {
        return Err("not a flintfs block device (no FLNTBLK magic)".into());
    }
    let word = |index: usize| u32::from_le_bytes(fields[8 + 4 * index..12 + 4 * index].try_into().expect("4 bytes"));
    // The version first, whatever the CRC says: version 1 keeps its CRC
    // elsewhere. A CRC that fails too says the version may be the damage.
    let crc = u32::from_le_bytes(fields[HEADER_FIELDS_BYTES..HEADER_FIELDS_BYTES + 4].try_into().expect("4 bytes"));
    let crc_holds = crc == crc32c::crc32c(&fields[..HEADER_FIELDS_BYTES]);
    // Version 1's CRC covers bytes 0..48 and sits at 48.
    let version_1_crc_holds =
        u32::from_le_bytes(fields[48..52].try_into().expect("4 bytes")) == crc32c::crc32c(&fields[..48]);
    if word(0) != BLOCK_FORMAT_VERSION {
        let intact = crc_holds || (word(0) == 1 && version_1_crc_holds);
        let doubt = if intact { "" } else { " (or a damaged header)" };
        return Err(format!(
            "block layout version {}{doubt}; this build reads version {BLOCK_FORMAT_VERSION}",
            word(0)
        ));
    }
    if !crc_holds {
        return Err("the header's CRC does not match".into());
    }
    let geometry = Geometry {
        page_size_bytes: word(1),
        oob_size_bytes: word(2),
        block_pages: word(3),
        zone_blocks: word(4),
        zone_count: word(5),
        open_zones_max: word(6),
        nvm_size_bytes: 0,
    };
    geometry.validate().map_err(|error| error.to_string())?;
    let sector_bytes = word(7);
    if !sector_bytes.is_power_of_two() || !(FILE_SECTOR_BYTES..=SECTOR_BYTES_MAX).contains(&sector_bytes) {
        return Err(format!("a sector of {sector_bytes} bytes"));
    }
    let nonce = u64::from_le_bytes(fields[40..48].try_into().expect("8 bytes"));
    let epoch = u32::from_le_bytes(fields[48..52].try_into().expect("4 bytes"));
    Ok(BlockHeader { geometry, sector_bytes, nonce, epoch })
}

fn encode_zone_record(zone: u32, record: &Zone) -> [u8; BLOCK_ZONE_RECORD_BYTES] {
    let mut bytes = [0u8; BLOCK_ZONE_RECORD_BYTES];
    bytes[0..8].copy_from_slice(&record.generation.to_le_bytes());
    bytes[8..12].copy_from_slice(&record.erase_count.to_le_bytes());
    let full = if record.full { record.write_pointer } else { NOT_FULL };
    bytes[12..16].copy_from_slice(&full.to_le_bytes());
    bytes[16] = u8::from(record.in_use);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&zone.to_le_bytes()), &bytes[..28]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// A zone's record as the table holds it.
struct ZoneRecordFields {
    generation: u64,
    erase_count: u32,
    /// The full mark's write pointer.
    full: Option<u32>,
    in_use: bool,
}

/// A zone record, or `None` when it is damaged or belongs to another zone.
fn decode_zone_record(zone: u32, bytes: &[u8]) -> Option<ZoneRecordFields> {
    let bytes: &[u8; BLOCK_ZONE_RECORD_BYTES] = bytes.try_into().ok()?;
    let crc = u32::from_le_bytes(bytes[28..32].try_into().ok()?);
    if crc != crc32c::crc32c_append(crc32c::crc32c(&zone.to_le_bytes()), &bytes[..28])
        || bytes[16] > 1
        || bytes[17..28] != [0; 11]
    {
        return None;
    }
    let full = u32::from_le_bytes(bytes[12..16].try_into().ok()?);
    Some(ZoneRecordFields {
        generation: u64::from_le_bytes(bytes[0..8].try_into().ok()?),
        erase_count: u32::from_le_bytes(bytes[8..12].try_into().ok()?),
        full: (full != NOT_FULL).then_some(full),
        in_use: bytes[16] == 1,
    })
}

/// The sector size and usable bytes of `path` as [`BlockFlash::create`]
/// would see them (a regular file that does not exist yet has none).
pub fn block_device_size(path: &Path) -> Result<(u32, u64)> {
    let metadata = std::fs::metadata(path).map_err(io_error(path, "stat"))?;
    if metadata.file_type().is_block_device() {
        let file = File::open(path).map_err(io_error(path, "open"))?;
        return block_device_facts(&file).map_err(io_error(path, "reading the device's size"));
    }
    Ok((FILE_SECTOR_BYTES, metadata.len()))
}

impl BlockFlash {
    fn assemble(
        path: &Path,
        file: HostFile,
        direct: bool,
        layout: BlockLayout,
        geometry: Geometry,
        nonce: u64,
        epoch: u32,
    ) -> BlockFlash {
        BlockFlash {
            path: path.to_path_buf(),
            file,
            direct,
            geometry,
            layout,
            nonce,
            epoch,
            zones: Vec::new(),
            unwritten_records: BTreeSet::new(),
            counters: Counters::default(),
            lifetime_before: Counters::default(),
            busy_ns: 0,
            idle_ns: 0,
            open_pages_read: 0,
            pending: None,
            pending_zone: 0,
            pending_first_page: 0,
            pending_slots: 0,
        }
    }

    /// Writes the gathered slots in one write. On an error they stay
    /// gathered, to be tried again: nothing that makes them durable (a
    /// flush, a zone marked full) has happened yet.
    fn write_pending(&mut self) -> Result<()> {
        if self.pending_slots == 0 {
            return Ok(());
        }
        let offset =
            self.layout.slot_offset(&self.geometry, PageAddress::new(self.pending_zone, self.pending_first_page));
        let length = self.pending_slots * self.layout.slot_bytes as usize;
        let buffer = self.pending.take().expect("slots gathered in the buffer");
        let written = self.timed(|device| device.file.write_all_at(&buffer[..length], offset));
        self.pending = Some(buffer);
        written.map_err(io_error(&self.path, "writing pages"))?;
        self.pending_slots = 0;
        Ok(())
    }

    /// The gathered slot of `address`, if it is one.
    fn pending_slot(&self, address: PageAddress) -> Option<&[u8]> {
        let index = address.page.checked_sub(self.pending_first_page)? as usize;
        if address.zone != self.pending_zone || index >= self.pending_slots {
            return None;
        }
        let slot_bytes = self.layout.slot_bytes as usize;
        self.pending.as_deref().map(|buffer| &buffer[index * slot_bytes..(index + 1) * slot_bytes])
    }

    /// Whether `path` starts with a block-backend header. Copy A only:
    /// open rewrites it, but a crash leaves its first sector old or new,
    /// and both hold the magic; a device whose first sector another tool
    /// wrote since (mkswap writes only the first 4 KiB) is not taken for
    /// flintfs on the strength of a copy B left behind, and overwritten.
    pub fn probe(path: &Path) -> bool {
        let mut bytes = vec![0u8; BLOCK_MAGIC.len()];
        File::open(path).and_then(|file| file.read_exact_at(&mut bytes, 0)).is_ok() && bytes == BLOCK_MAGIC
    }

    /// Lays a fresh device out on `path`: a block device, or a regular file
    /// (made if missing). The zone count is what fits; the rest of
    /// `geometry` is used as given.
    pub fn create(path: impl AsRef<Path>, geometry: Geometry, create: BlockCreate) -> Result<BlockFlash> {
        let path = path.as_ref();
        let (file, direct, is_block) = open_file(path, true, false)?;
        let (sector_bytes, available) = if is_block {
            let (sector, bytes) = block_device_facts(&file).map_err(io_error(path, "reading the device's size"))?;
            (sector, create.size_bytes.map_or(bytes, |wanted| wanted.min(bytes)))
        } else {
            let length = file.metadata().map_err(io_error(path, "stat"))?.len();
            (FILE_SECTOR_BYTES, create.size_bytes.unwrap_or(length))
        };
        if !sector_bytes.is_power_of_two() || !(FILE_SECTOR_BYTES..=SECTOR_BYTES_MAX).contains(&sector_bytes) {
            return Err(refused(path, format!("a logical sector of {sector_bytes} bytes is not supported")));
        }
        let mut geometry = Geometry { nvm_size_bytes: 0, ..geometry };
        geometry.zone_count = BlockLayout::zones_fitting(&geometry, sector_bytes, available);
        geometry.validate()?;
        let layout = BlockLayout::of(&geometry, sector_bytes);
        if !is_block {
            file.set_len(layout.device_bytes(&geometry)).map_err(io_error(path, "sizing the file"))?;
        }
        let zones =
            vec![
                Zone { generation: 1, erase_count: 0, write_pointer: 0, full: false, in_use: false, open: false };
                geometry.zone_count as usize
            ];
        let mut device = BlockFlash::assemble(path, HostFile::through(file), direct, layout, geometry, create.nonce, 0);
        device.zones = zones;
        // Tables first, header last: a device is not one until its header
        // is there.
        for copy in 0..2 {
            let table = device.encode_table();
            device.write_at(layout.table_offset + copy * layout.table_bytes, &table, "writing the zone table")?;
            device.sync()?;
        }
        let header = encode_header(&geometry, sector_bytes, create.nonce, 0);
        for copy in 0..2 {
            device.write_at(copy * BLOCK_HEADER_BYTES, &header, "writing the header")?;
        }
        device.sync()?;
        device.counters = Counters::default();
        Ok(device)
    }

    /// Opens a device laid out by [`BlockFlash::create`], finding each
    /// zone's write pointer from its slots' trailers.
    pub fn open(path: impl AsRef<Path>) -> Result<BlockFlash> {
        BlockFlash::open_with(path.as_ref(), false)
    }

    /// [`BlockFlash::open`] for a check that must leave the device as it
    /// found it: opened read-only, every write (the new epoch, what a
    /// mount on it writes) lands in a scratch view in memory (see
    /// `host_file`), and the device behaves as on a real open.
    pub fn open_to_look(path: impl AsRef<Path>) -> Result<BlockFlash> {
        BlockFlash::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, to_look: bool) -> Result<BlockFlash> {
        let (file, direct, _) = open_file(path, false, to_look)?;
        let mut header = AlignedBuffer::zeroed(BLOCK_HEADER_BYTES as usize);
        let mut copies = Vec::new();
        let mut reasons = Vec::new();
        for copy in 0..2 {
            if let Err(error) = file.read_exact_at(&mut header, copy * BLOCK_HEADER_BYTES) {
                reasons.push(format!("reading the header: {error}"));
                continue;
            }
            match decode_block_header(&header) {
                Ok(decoded) => copies.push(decoded),
                Err(reason) => reasons.push(reason),
            }
        }
        // The copy of the higher epoch: open writes copy A, then copy B.
        let Some(found) = copies.iter().copied().max_by_key(|copy| copy.epoch) else {
            return Err(refused(path, reasons.first().cloned().unwrap_or_default()));
        };
        if copies.iter().any(|copy| {
            (copy.geometry, copy.sector_bytes, copy.nonce) != (found.geometry, found.sector_bytes, found.nonce)
        }) {
            return Err(refused(
                path,
                "the two header copies disagree on the geometry or the format's nonce (an interrupted mkfs?)",
            ));
        }
        let BlockHeader { geometry, sector_bytes, nonce, epoch } = found;
        let epoch = epoch.checked_add(1).ok_or_else(|| refused(path, "opened 4,294,967,295 times: no epoch left"))?;
        let layout = BlockLayout::of(&geometry, sector_bytes);
        let length = if std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device()) {
            block_device_facts(&file).map_err(io_error(path, "reading the device's size"))?.1
        } else {
            file.metadata().map_err(io_error(path, "stat"))?.len()
        };
        if length < layout.device_bytes(&geometry) {
            return Err(refused(
                path,
                format!("truncated: {length} bytes, the layout needs {}", layout.device_bytes(&geometry)),
            ));
        }
        let file = if to_look { HostFile::scratch(file) } else { HostFile::through(file) };
        let mut device = BlockFlash::assemble(path, file, direct, layout, geometry, nonce, epoch);
        // The new epoch on the device, both copies, before any slot of this
        // session can be: otherwise a crash could give it to a later
        // session too, whose prefix would then take this one's old slots.
        let header = encode_header(&geometry, sector_bytes, nonce, epoch);
        for copy in 0..2 {
            device.write_at(copy * BLOCK_HEADER_BYTES, &header, "writing the header")?;
            device.sync()?;
        }
        device.counters = Counters::default();
        device.load_zones()?;
        device.lifetime_before = device.read_summary();
        Ok(device)
    }

    /// Reads both table copies (for each zone, the valid record of the
    /// higher generation wins), then scans the zones not marked full.
    fn load_zones(&mut self) -> Result<()> {
        let mut copies = Vec::new();
        for copy in 0..2 {
            let mut table = AlignedBuffer::zeroed(self.layout.table_bytes as usize);
            let offset = self.layout.table_offset + copy * self.layout.table_bytes;
            self.file.read_exact_at(&mut table, offset).map_err(io_error(&self.path, "reading the zone table"))?;
            copies.push(table);
        }
        let zone_pages = self.geometry.zone_pages() as u32;
        for zone in 0..self.geometry.zone_count {
            let at = zone as usize * BLOCK_ZONE_RECORD_BYTES..(zone as usize + 1) * BLOCK_ZONE_RECORD_BYTES;
            let record = copies
                .iter()
                .filter_map(|copy| decode_zone_record(zone, &copy[at.clone()]))
                .max_by_key(|record| record.generation)
                .ok_or_else(|| refused(&self.path, format!("zone {zone}: both zone-table records are damaged")))?;
            if record.full.is_some_and(|pointer| pointer > zone_pages) {
                return Err(refused(&self.path, format!("zone {zone}: a full mark past the zone's end")));
            }
            self.zones.push(Zone {
                generation: record.generation,
                erase_count: record.erase_count,
                write_pointer: record.full.unwrap_or(0),
                full: record.full.is_some(),
                in_use: record.in_use || record.full.is_some(),
                open: false,
            });
        }
        for zone in 0..self.geometry.zone_count {
            // A full zone has its mark; a zone not used since its reset is
            // empty: neither is read.
            let state = self.zones[zone as usize];
            if state.full || !state.in_use {
                continue;
            }
            let mut page = 0;
            let mut epoch_before = 0;
            while page < zone_pages {
                match self.slot_epoch(PageAddress::new(zone, page))? {
                    Some(epoch) if epoch >= epoch_before && epoch < self.epoch => epoch_before = epoch,
                    _ => break,
                }
                page += 1;
            }
            self.open_pages_read += u64::from(page) + u64::from(page < zone_pages);
            let state = &mut self.zones[zone as usize];
            state.write_pointer = page;
            if page == zone_pages {
                state.full = true;
                self.unwritten_records.insert(zone);
            }
        }
        Ok(())
    }

    /// The epoch of the session that programmed a slot in the zone's
    /// current life, or `None` when its trailer says it was not.
    fn slot_epoch(&mut self, address: PageAddress) -> Result<Option<u32>> {
        let mut spare = AlignedBuffer::zeroed(self.layout.spare_area_bytes as usize);
        let offset = self.layout.slot_offset(&self.geometry, address) + u64::from(self.geometry.page_size_bytes);
        self.timed(|device| device.file.read_exact_at(&mut spare, offset)).map_err(io_error(&self.path, "scanning"))?;
        let oob_bytes = self.geometry.oob_size_bytes as usize;
        let trailer = &spare[spare.len() - BLOCK_TRAILER_BYTES..];
        let epoch = u32::from_le_bytes(trailer[24..28].try_into().expect("4 bytes"));
        Ok((trailer == self.trailer(address, &spare[..oob_bytes], epoch)).then_some(epoch))
    }

    fn trailer(&self, address: PageAddress, oob: &[u8], epoch: u32) -> [u8; BLOCK_TRAILER_BYTES] {
        let mut trailer = [0u8; BLOCK_TRAILER_BYTES];
        trailer[0..4].copy_from_slice(&TRAILER_MAGIC);
        trailer[4..8].copy_from_slice(&address.zone.to_le_bytes());
        trailer[8..12].copy_from_slice(&address.page.to_le_bytes());
        trailer[12..16].copy_from_slice(&(oob.len() as u32).to_le_bytes());
        trailer[16..24].copy_from_slice(&self.zones[address.zone as usize].generation.to_le_bytes());
        trailer[24..28].copy_from_slice(&epoch.to_le_bytes());
        let crc = crc32c::crc32c_append(
            crc32c::crc32c_append(crc32c::crc32c(&self.nonce.to_le_bytes()), oob),
            &trailer[..28],
        );
        trailer[28..32].copy_from_slice(&crc.to_le_bytes());
        trailer
    }

    fn encode_table(&self) -> Vec<u8> {
        let mut table = vec![0u8; self.layout.table_bytes as usize];
        for (zone, record) in self.zones.iter().enumerate() {
            let at = zone * BLOCK_ZONE_RECORD_BYTES;
            table[at..at + BLOCK_ZONE_RECORD_BYTES].copy_from_slice(&encode_zone_record(zone as u32, record));
        }
        table
    }

    /// Writes the table sectors that hold `zones`' records: copy A, a
    /// flush, copy B, a flush. A torn sector damages one copy at most.
    fn write_records(&mut self, zones: &BTreeSet<u32>) -> Result<()> {
        // A sector of the table holds 16 zones' records, all written from
        // memory: one of them may be marked full (or in use) with pages
        // still gathered, so those go to the device first.
        self.write_pending()?;
        let sector = self.layout.sector_bytes as usize;
        let table = self.encode_table();
        let sectors: BTreeSet<usize> =
            zones.iter().map(|&zone| zone as usize * BLOCK_ZONE_RECORD_BYTES / sector).collect();
        for copy in 0..2 {
            for &index in &sectors {
                let offset = self.layout.table_offset + copy * self.layout.table_bytes + (index * sector) as u64;
                let bytes = table[index * sector..(index + 1) * sector].to_vec();
                self.write_at(offset, &bytes, "writing the zone table")?;
            }
            self.sync()?;
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8], operation: &'static str) -> Result<()> {
        let mut buffer = AlignedBuffer::zeroed(bytes.len());
        buffer.copy_from_slice(bytes);
        self.timed(|device| device.file.write_all_at(&buffer, offset)).map_err(io_error(&self.path, operation))
    }

    fn sync(&mut self) -> Result<()> {
        self.counters.flushes += 1;
        self.timed(|device| device.file.sync_data()).map_err(io_error(&self.path, "fdatasync"))
    }

    /// Runs one I/O and counts its real time as device time.
    fn timed<R>(&mut self, io: impl FnOnce(&mut BlockFlash) -> R) -> R {
        let start = Instant::now();
        let result = io(self);
        let elapsed = start.elapsed().as_nanos() as u64;
        self.counters.device_time_ns += elapsed;
        self.busy_ns += elapsed;
        result
    }

    fn check_address(&self, address: PageAddress) -> Result<()> {
        self.geometry.check_zone(address.zone)?;
        if u64::from(address.page) >= self.geometry.zone_pages() {
            return Err(DeviceError::OutOfRange {
                what: format!("page {address}"),
                limit: format!("a zone has {} pages", self.geometry.zone_pages()),
            });
        }
        Ok(())
    }

    fn check_buffer(what: &'static str, expected: u32, actual: usize) -> Result<()> {
        if actual != expected as usize {
            return Err(DeviceError::BufferLength { what, expected: expected as usize, actual });
        }
        Ok(())
    }

    /// Whether the device is read and written with direct I/O.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn layout(&self) -> BlockLayout {
        self.layout
    }

    /// Writes what is pending, flushes, and records the lifetime
    /// counters: the clean way to let go.
    pub fn close(mut self) -> Result<()> {
        self.flush()?;
        let lifetime = self.lifetime_counters();
        let values = lifetime.to_array();
        let mut summary = vec![0u8; BLOCK_SUMMARY_BYTES as usize];
        summary[0..8].copy_from_slice(&(values.len() as u64).to_le_bytes());
        for (index, value) in values.iter().enumerate() {
            summary[8 + 8 * index..16 + 8 * index].copy_from_slice(&value.to_le_bytes());
        }
        let end = 8 + 8 * values.len();
        let crc = crc32c::crc32c(&summary[..end]);
        summary[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        self.write_at(self.layout.summary_offset, &summary, "writing the summary")?;
        self.sync()
    }

    /// The device's counters over its whole life: those the last close
    /// recorded, and this open's. A device killed before its close loses
    /// the counts since its last close, never data.
    pub fn lifetime_counters(&self) -> Counters {
        self.lifetime_before.plus(&self.counters)
    }

    /// The summary's counters, or none when it was never written or is
    /// damaged (then the lifetime counts start again).
    fn read_summary(&mut self) -> Counters {
        let mut summary = AlignedBuffer::zeroed(BLOCK_SUMMARY_BYTES as usize);
        if self.file.read_exact_at(&mut summary, self.layout.summary_offset).is_err() {
            return Counters::default();
        }
        let count = u64::from_le_bytes(summary[0..8].try_into().expect("8 bytes")) as usize;
        if count != Counters::FIELD_NAMES.len() {
            return Counters::default();
        }
        let end = 8 + 8 * count;
        let crc = u32::from_le_bytes(summary[end..end + 4].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&summary[..end]) {
            return Counters::default();
        }
        let values: Vec<u64> = (0..count)
            .map(|index| u64::from_le_bytes(summary[8 + 8 * index..16 + 8 * index].try_into().expect("8 bytes")))
            .collect();
        Counters::from_array(&values).unwrap_or_default()
    }
}

impl Drop for BlockFlash {
    /// Gathered slots go to the device, best effort, as a drive's cache
    /// drains when the host lets go of it; a killed process loses them,
    /// which no flush had promised.
    fn drop(&mut self) {
        let _ = self.write_pending();
    }
}

impl FlashDevice for BlockFlash {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        self.check_address(address)?;
        BlockFlash::check_buffer("a page's data", self.geometry.page_size_bytes, data.len())?;
        BlockFlash::check_buffer("a page's spare area", self.geometry.oob_size_bytes, oob.len())?;
        self.counters.pages_read += 1;
        if address.page >= self.zones[address.zone as usize].write_pointer {
            data.fill(0xFF);
            oob.fill(0xFF);
            return Ok(PageState::Erased);
        }
        let page_bytes = data.len();
        if let Some(slot) = self.pending_slot(address) {
            data.copy_from_slice(&slot[..page_bytes]);
            oob.copy_from_slice(&slot[page_bytes..page_bytes + oob.len()]);
            return Ok(PageState::Programmed);
        }
        let mut slot = AlignedBuffer::zeroed(self.layout.slot_bytes as usize);
        let offset = self.layout.slot_offset(&self.geometry, address);
        self.timed(|device| device.file.read_exact_at(&mut slot, offset))
            .map_err(io_error(&self.path, "reading a page"))?;
        data.copy_from_slice(&slot[..page_bytes]);
        oob.copy_from_slice(&slot[page_bytes..page_bytes + oob.len()]);
        Ok(PageState::Programmed)
    }

    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState> {
        self.check_address(address)?;
        BlockFlash::check_buffer("a page's spare area", self.geometry.oob_size_bytes, oob.len())?;
        self.counters.oob_reads += 1;
        if address.page >= self.zones[address.zone as usize].write_pointer {
            oob.fill(0xFF);
            return Ok(PageState::Erased);
        }
        if let Some(slot) = self.pending_slot(address) {
            let page_bytes = self.geometry.page_size_bytes as usize;
            oob.copy_from_slice(&slot[page_bytes..page_bytes + oob.len()]);
            return Ok(PageState::Programmed);
        }
        let mut spare = AlignedBuffer::zeroed(self.layout.spare_area_bytes as usize);
        let offset = self.layout.slot_offset(&self.geometry, address) + u64::from(self.geometry.page_size_bytes);
        self.timed(|device| device.file.read_exact_at(&mut spare, offset))
            .map_err(io_error(&self.path, "reading a spare area"))?;
        oob.copy_from_slice(&spare[..oob.len()]);
        Ok(PageState::Programmed)
    }

    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        self.check_address(address)?;
        BlockFlash::check_buffer("a page's data", self.geometry.page_size_bytes, data.len())?;
        BlockFlash::check_buffer("a page's spare area", self.geometry.oob_size_bytes, oob.len())?;
        let zone = self.zones[address.zone as usize];
        let zone_pages = self.geometry.zone_pages() as u32;
        if zone.full {
            return Err(DeviceError::ZoneFull {
                address,
                write_pointer: zone.write_pointer,
                capacity_pages: zone_pages,
            });
        }
        if address.page != zone.write_pointer {
            return Err(DeviceError::NotAtWritePointer { address, write_pointer: zone.write_pointer });
        }
        if !zone.open {
            let open_zones = self.zones.iter().filter(|zone| zone.open).count() as u32;
            if open_zones >= self.geometry.open_zones_max {
                return Err(DeviceError::TooManyOpenZones {
                    address,
                    open_zones,
                    open_zones_max: self.geometry.open_zones_max,
                });
            }
        }
        // Gathered with the slots before it when it follows them in its
        // zone: a run of pages is one write, not one a page.
        let follows = self.pending_zone == address.zone
            && address.page == self.pending_first_page + self.pending_slots as u32
            && self.pending_slots < BLOCK_PENDING_SLOTS_MAX;
        if self.pending_slots > 0 && !follows {
            self.write_pending()?;
        }
        if self.pending_slots == 0 {
            (self.pending_zone, self.pending_first_page) = (address.zone, address.page);
        }
        let slot_bytes = self.layout.slot_bytes as usize;
        let trailer = self.trailer(address, oob, self.epoch);
        let buffer = self.pending.get_or_insert_with(|| AlignedBuffer::zeroed(BLOCK_PENDING_SLOTS_MAX * slot_bytes));
        let slot = &mut buffer[self.pending_slots * slot_bytes..(self.pending_slots + 1) * slot_bytes];
        let page_bytes = data.len();
        slot[..page_bytes].copy_from_slice(data);
        slot[page_bytes..page_bytes + oob.len()].copy_from_slice(oob);
        // The padding between the spare area and the trailer: zeros, as a
        // fresh slot's were.
        slot[page_bytes + oob.len()..slot_bytes - BLOCK_TRAILER_BYTES].fill(0);
        slot[slot_bytes - BLOCK_TRAILER_BYTES..].copy_from_slice(&trailer);
        self.pending_slots += 1;
        self.counters.pages_programmed += 1;
        self.counters.data_bytes_programmed += page_bytes as u64;
        self.counters.oob_bytes_programmed += oob.len() as u64;
        let state = &mut self.zones[address.zone as usize];
        state.write_pointer += 1;
        state.open = true;
        if !state.in_use {
            // The next flush marks it used, so open will scan it.
            state.in_use = true;
            self.unwritten_records.insert(address.zone);
        }
        if state.write_pointer == zone_pages {
            state.full = true;
            state.open = false;
            self.unwritten_records.insert(address.zone);
        }
        Ok(())
    }

    fn reset_zone(&mut self, zone: u32) -> Result<()> {
        self.geometry.check_zone(zone)?;
        if self.pending_zone == zone {
            // Pages of the zone being erased are moot.
            self.pending_slots = 0;
        }
        let state = &mut self.zones[zone as usize];
        state.generation += 1;
        state.erase_count = state.erase_count.saturating_add(1);
        state.write_pointer = 0;
        state.full = false;
        state.in_use = false;
        state.open = false;
        self.unwritten_records.remove(&zone);
        self.write_records(&BTreeSet::from([zone]))?;
        self.counters.erases += u64::from(self.geometry.zone_blocks);
        self.counters.zone_resets += 1;
        // The old pages are garbage now: let a file's storage or an SSD
        // have them back. Nothing depends on it.
        let start = self.layout.slot_offset(&self.geometry, PageAddress::new(zone, 0));
        let length = self.geometry.zone_pages() * self.layout.slot_bytes;
        self.file.punch_hole(start, length);
        Ok(())
    }

    fn finish_zone(&mut self, zone: u32) -> Result<()> {
        self.geometry.check_zone(zone)?;
        let state = &mut self.zones[zone as usize];
        if state.full {
            return Ok(());
        }
        state.full = true;
        state.open = false;
        self.unwritten_records.remove(&zone);
        self.write_records(&BTreeSet::from([zone]))
    }

    fn report_zone(&self, zone: u32) -> Result<ZoneReport> {
        self.geometry.check_zone(zone)?;
        let state = self.zones[zone as usize];
        Ok(ZoneReport {
            zone,
            state: if state.full {
                ZoneState::Full
            } else if state.open {
                ZoneState::Open
            } else if state.write_pointer == 0 {
                ZoneState::Empty
            } else {
                ZoneState::Closed
            },
            write_pointer: state.write_pointer,
            capacity_pages: self.geometry.zone_pages() as u32,
            erase_count_max: state.erase_count,
            bad_blocks: 0,
        })
    }

    fn report_zones(&self) -> Vec<ZoneReport> {
        (0..self.geometry.zone_count).map(|zone| self.report_zone(zone).expect("zones of the device")).collect()
    }

    fn flush(&mut self) -> Result<()> {
        self.write_pending()?;
        self.sync()?;
        if !self.unwritten_records.is_empty() {
            let zones = std::mem::take(&mut self.unwritten_records);
            if let Err(error) = self.write_records(&zones) {
                self.unwritten_records = zones;
                return Err(error);
            }
        }
        Ok(())
    }

    fn nvm_read(&mut self, offset: u64, _buffer: &mut [u8]) -> Result<()> {
        Err(DeviceError::OutOfRange { what: format!("NVM offset {offset}"), limit: "a block device has no NVM".into() })
    }

    fn nvm_write(&mut self, offset: u64, _data: &[u8]) -> Result<()> {
        Err(DeviceError::OutOfRange { what: format!("NVM offset {offset}"), limit: "a block device has no NVM".into() })
    }

    fn nvm_persist(&mut self, offset: u64, _length: u64) -> Result<()> {
        Err(DeviceError::OutOfRange { what: format!("NVM offset {offset}"), limit: "a block device has no NVM".into() })
    }

    fn counters(&self) -> Counters {
        self.counters
    }

    fn reset_counters(&mut self) {
        self.lifetime_before = self.lifetime_before.plus(&self.counters);
        self.counters = Counters::default();
    }

    /// The real time the device's I/O has taken, plus idle time let pass.
    fn now_ns(&self) -> u64 {
        self.busy_ns + self.idle_ns
    }

    fn advance_time(&mut self, duration_ns: u64) {
        self.idle_ns = self.idle_ns.saturating_add(duration_ns);
    }
}
