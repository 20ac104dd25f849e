//! The image file backend: one file holds the whole durable state of an
//! emulated device (geometry, pages and OOB, zone write pointers, wear, bad
//! blocks, the fault overlay, persisted NVM, lifetime counters), so a device
//! reopens in another process exactly as it was. Only durable state is
//! written, so killing the process is a power cut. The byte layout is
//! specified in `docs/DEVICE-IMAGE.md`; every decoder here is total.
//!
//! ## A host crash, with one sync a flush
//! The host writes its page cache back in any order, so after a host crash
//! a zone record may be on the disk while pages it counts are not. Every
//! page slot therefore ends with a trailer (its physical index, its zone's
//! generation, the session's epoch and a CRC over the whole slot), and a
//! zone record carries, beside its write pointer, the write pointer its
//! pages were known synced to when it was written. Open checks the slots
//! between the two and lowers the write pointer to the first that does not
//! hold, which leaves a durable prefix of the zone, as a power cut does.
//! A flush is then its pages and records written together and one
//! fdatasync, not a sync of the pages before the records.
//! - The epoch is bumped (and synced) at every open (a look's open bumps
//!   it in its scratch view only, `host_file`). Slots a crash left
//!   past a lowered write pointer are valid for their generation but carry
//!   an older epoch than the record that names them, so they never count.
//! - The checked window is what was written since the last sync, which
//!   [`IMAGE_UNSYNCED_PAGES_MAX`] bounds.
//!
//! ## Host blocks allocated ahead
//! The image is sparse, and an fdatasync that has to allocate the host
//! file system's blocks for the pages it writes also commits that file
//! system's journal: on ext4 that made a flush of one page through a mount
//! cost 367 µs against 261 µs where the blocks had been written before. So
//! after each sync the backend writes zeros into the holes of the next
//! [`IMAGE_ALLOCATE_AHEAD_BYTES`] past the last slot of every zone written
//! since the sync before, once less than half of that is left. Those zeros
//! reach the disk with the next sync, the only one in a stretch of flushes
//! that allocates. Only holes are filled (`SEEK_HOLE`), never a slot that
//! was ever written, so nothing a record can count changes. It is skipped
//! where it gains nothing (copy-on-write and memory file systems), and
//! stops for the session after an error or when the host disk runs low.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::{
    Backend, BlockRecord, DurableCondition, DurableState, Overlay, OverlayRecord, PageFault, ZoneRecord,
    OVERLAY_ENTRIES_MAX, OVERLAY_STORED_PAGES_MAX,
};
use crate::counters::Counters;
use crate::device::{block_map_of, fresh_state, DeviceOptions, FlashEmulator};
use crate::error::{DeviceError, Result};
use crate::geometry::Geometry;
use crate::host_file::HostFile;
use crate::image_writer::IMAGE_ALLOCATE_AHEAD_ROOM_BYTES;

/// First bytes of every device image.
pub const IMAGE_MAGIC: [u8; 8] = *b"FLINTDEV";
/// The layout version this build reads and writes.
pub const IMAGE_FORMAT_VERSION: u32 = 3;
/// Each of the two header copies occupies this many bytes.
pub const HEADER_SLOT_BYTES: u64 = 4096;
/// Bytes of one zone record and of one block record.
pub const ZONE_RECORD_BYTES: u64 = 32;
pub const BLOCK_RECORD_BYTES: u64 = 64;
/// The unit a disk writes whole or not at all: no record straddles one, so
/// a host crash leaves each record old or new, never part of each.
pub const HOST_SECTOR_BYTES: u64 = 512;
const _: () = assert!(HOST_SECTOR_BYTES.is_multiple_of(ZONE_RECORD_BYTES));
const _: () = assert!(HOST_SECTOR_BYTES.is_multiple_of(BLOCK_RECORD_BYTES));
// Tables start on a region boundary, so record `i` sits at `i * size` in
// whole sectors' terms too.
const _: () = assert!(REGION_ALIGNMENT_BYTES.is_multiple_of(HOST_SECTOR_BYTES));
/// Bytes of the trailer that ends each page slot (after the data and OOB).
pub const SLOT_TRAILER_BYTES: u64 = 32;
/// Most pages written since the last sync before the backend syncs on its
/// own (with `host_sync`): what open may have to check after a host crash.
pub const IMAGE_UNSYNCED_PAGES_MAX: u64 = 8192;
const _: () = assert!(IMAGE_UNSYNCED_PAGES_MAX >= PENDING_SLOTS_MAX as u64);
/// How far past a zone's last written page the backend makes sure the
/// image's host blocks exist (written zeros, not holes) after a sync, so
/// the flushes that follow do not allocate (see the module's comment).
pub const IMAGE_ALLOCATE_AHEAD_BYTES: u64 = 1 << 20;
const _: () = assert!(IMAGE_ALLOCATE_AHEAD_ROOM_BYTES >= 16 * IMAGE_ALLOCATE_AHEAD_BYTES);
/// The stretch `allocate_every_hole` fills between progress reports.
const PREALLOCATE_PIECE_BYTES: u64 = 64 << 20;
const _: () = assert!(PREALLOCATE_PIECE_BYTES >= IMAGE_ALLOCATE_AHEAD_BYTES);
const TRAILER_MAGIC: [u8; 4] = *b"FIS3";
const TRAILER_CRC: usize = SLOT_TRAILER_BYTES as usize - 4;
/// Bytes of an overlay entry before any stored page.
pub const OVERLAY_ENTRY_BYTES: u64 = 32;
/// Most page slots the image backend gathers before it writes them in one
/// `pwritev` (see [`ImageBackend::write_page`]).
pub const PENDING_SLOTS_MAX: usize = 64;
const _: () = assert!(PENDING_SLOTS_MAX >= 1);
/// Regions start on this alignment.
const REGION_ALIGNMENT_BYTES: u64 = 4096;

// Header field offsets.
const HEADER_MAGIC: usize = 0;
const HEADER_VERSION: usize = 8;
const HEADER_SLOT_SIZE: usize = 12;
const HEADER_GENERATION: usize = 16;
const HEADER_GEOMETRY: usize = 24;
const HEADER_LAYOUT: usize = 56;
const HEADER_OVERLAY_ACTIVE_SLOT: usize = 112;
const HEADER_OVERLAY_ENTRIES: usize = 116;
const HEADER_OVERLAY_BYTES: usize = 120;
const HEADER_OVERLAY_CRC: usize = 128;
const HEADER_COUNTER_COUNT: usize = 132;
const HEADER_CLOCK: usize = 136;
const HEADER_EPOCH: usize = 144;
const HEADER_COUNTERS: usize = 152;
const HEADER_CRC: usize = HEADER_SLOT_BYTES as usize - 4;

const _: () = assert!(HEADER_COUNTERS + 8 * 64 <= HEADER_CRC, "room for 64 counters");
const _: () = assert!(HEADER_SLOT_BYTES.is_multiple_of(REGION_ALIGNMENT_BYTES));

const OVERLAY_KIND_TORN: u8 = 1;
const OVERLAY_KIND_LOST_WRITE: u8 = 2;
const OVERLAY_KIND_DISTURBED: u8 = 3;
const OVERLAY_KIND_STORED: u8 = 4;
const OVERLAY_KIND_UNREADABLE: u8 = 5;

const BLOCK_FLAG_BAD: u8 = 1;
const BLOCK_FLAG_EXCLUDED: u8 = 2;
const BLOCK_FLAG_INTERRUPTED_ERASE: u8 = 4;
const BLOCK_FLAGS_KNOWN: u8 = BLOCK_FLAG_BAD | BLOCK_FLAG_EXCLUDED | BLOCK_FLAG_INTERRUPTED_ERASE;

/// Where each region of an image starts, all derived from the geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLayout {
    pub zone_table_offset: u64,
    pub block_table_offset: u64,
    pub overlay_slot_offset: u64,
    pub overlay_slot_bytes: u64,
    pub nvm_offset: u64,
    pub page_area_offset: u64,
    pub image_bytes: u64,
}

impl ImageLayout {
    pub fn of(geometry: &Geometry) -> ImageLayout {
        let align = |offset: u64| offset.div_ceil(REGION_ALIGNMENT_BYTES) * REGION_ALIGNMENT_BYTES;
        let media_bytes = u64::from(geometry.page_size_bytes) + u64::from(geometry.oob_size_bytes);
        let slot_bytes = ImageLayout::slot_bytes(geometry);
        let zone_table_offset = 2 * HEADER_SLOT_BYTES;
        let block_table_offset = align(zone_table_offset + u64::from(geometry.zone_count) * ZONE_RECORD_BYTES);
        let overlay_slot_offset = align(block_table_offset + geometry.block_count() * BLOCK_RECORD_BYTES);
        let overlay_slot_bytes =
            align(OVERLAY_ENTRIES_MAX as u64 * OVERLAY_ENTRY_BYTES + OVERLAY_STORED_PAGES_MAX as u64 * media_bytes);
        let nvm_offset = overlay_slot_offset + 2 * overlay_slot_bytes;
        let page_area_offset = align(nvm_offset + geometry.nvm_size_bytes);
        let image_bytes = page_area_offset + geometry.device_pages() * slot_bytes;
        ImageLayout {
            zone_table_offset,
            block_table_offset,
            overlay_slot_offset,
            overlay_slot_bytes,
            nvm_offset,
            page_area_offset,
            image_bytes,
        }
    }

    /// One page slot: the data, the OOB, then the trailer.
    pub fn slot_bytes(geometry: &Geometry) -> u64 {
        u64::from(geometry.page_size_bytes) + u64::from(geometry.oob_size_bytes) + SLOT_TRAILER_BYTES
    }

    fn to_array(self) -> [u64; 7] {
        [
            self.zone_table_offset,
            self.block_table_offset,
            self.overlay_slot_offset,
            self.overlay_slot_bytes,
            self.nvm_offset,
            self.page_area_offset,
            self.image_bytes,
        ]
    }
}

/// The decoded contents of one header copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    pub generation: u64,
    pub geometry: Geometry,
    pub layout: ImageLayout,
    pub overlay_active_slot: u32,
    pub overlay_entries: u32,
    pub overlay_bytes: u64,
    pub overlay_crc: u32,
    pub clock_ns: u64,
    /// Bumped at every open: the session that wrote a slot or a record.
    pub epoch: u32,
    pub counters: Counters,
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

fn put_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

impl ImageHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_SLOT_BYTES as usize];
        bytes[HEADER_MAGIC..HEADER_MAGIC + 8].copy_from_slice(&IMAGE_MAGIC);
        put_u32(&mut bytes, HEADER_VERSION, IMAGE_FORMAT_VERSION);
        put_u32(&mut bytes, HEADER_SLOT_SIZE, HEADER_SLOT_BYTES as u32);
        put_u64(&mut bytes, HEADER_GENERATION, self.generation);
        let geometry = &self.geometry;
        for (index, value) in [
            geometry.page_size_bytes,
            geometry.oob_size_bytes,
            geometry.block_pages,
            geometry.zone_blocks,
            geometry.zone_count,
            geometry.open_zones_max,
        ]
        .into_iter()
        .enumerate()
        {
            put_u32(&mut bytes, HEADER_GEOMETRY + 4 * index, value);
        }
        put_u64(&mut bytes, HEADER_GEOMETRY + 24, geometry.nvm_size_bytes);
        for (index, value) in self.layout.to_array().into_iter().enumerate() {
            put_u64(&mut bytes, HEADER_LAYOUT + 8 * index, value);
        }
        put_u32(&mut bytes, HEADER_OVERLAY_ACTIVE_SLOT, self.overlay_active_slot);
        put_u32(&mut bytes, HEADER_OVERLAY_ENTRIES, self.overlay_entries);
        put_u64(&mut bytes, HEADER_OVERLAY_BYTES, self.overlay_bytes);
        put_u32(&mut bytes, HEADER_OVERLAY_CRC, self.overlay_crc);
        let counters = self.counters.to_array();
        put_u32(&mut bytes, HEADER_COUNTER_COUNT, counters.len() as u32);
        put_u64(&mut bytes, HEADER_CLOCK, self.clock_ns);
        put_u32(&mut bytes, HEADER_EPOCH, self.epoch);
        for (index, value) in counters.into_iter().enumerate() {
            put_u64(&mut bytes, HEADER_COUNTERS + 8 * index, value);
        }
        let crc = crc32c::crc32c(&bytes[..HEADER_CRC]);
        put_u32(&mut bytes, HEADER_CRC, crc);
        bytes
    }

    /// Decodes one header copy; any bytes give a value or a reason.
    pub fn decode(bytes: &[u8]) -> std::result::Result<ImageHeader, String> {
        if bytes.len() < HEADER_SLOT_BYTES as usize {
            return Err(format!("header is {} bytes, expected {}", bytes.len(), HEADER_SLOT_BYTES));
        }
        if bytes[HEADER_MAGIC..HEADER_MAGIC + 8] != IMAGE_MAGIC {
            return Err("not a flintfs device image (bad magic)".into());
        }
        // Another version may place its checksum elsewhere, so a version
        // mismatch is reported whatever the checksum says; a bad checksum
        // then says the version field itself may be the damage.
        let version = u32_at(bytes, HEADER_VERSION);
        let stored_crc = u32_at(bytes, HEADER_CRC);
        let computed_crc = crc32c::crc32c(&bytes[..HEADER_CRC]);
        if version != IMAGE_FORMAT_VERSION {
            let doubt = if stored_crc == computed_crc { "" } else { " (or a corrupted header)" };
            return Err(format!(
                "device image format version {version}{doubt}; this build reads version {IMAGE_FORMAT_VERSION} only"
            ));
        }
        if stored_crc != computed_crc {
            return Err(format!("header checksum {stored_crc:#010x} does not match {computed_crc:#010x}"));
        }
        if u32_at(bytes, HEADER_SLOT_SIZE) != HEADER_SLOT_BYTES as u32 {
            return Err(format!("header slot size {} is not {}", u32_at(bytes, HEADER_SLOT_SIZE), HEADER_SLOT_BYTES));
        }
        let field = |index: usize| u32_at(bytes, HEADER_GEOMETRY + 4 * index);
        let geometry = Geometry {
            page_size_bytes: field(0),
            oob_size_bytes: field(1),
            block_pages: field(2),
            zone_blocks: field(3),
            zone_count: field(4),
            open_zones_max: field(5),
            nvm_size_bytes: u64_at(bytes, HEADER_GEOMETRY + 24),
        };
        geometry.validate().map_err(|error| error.to_string())?;
        let layout = ImageLayout::of(&geometry);
        let stored_layout: Vec<u64> = (0..7).map(|index| u64_at(bytes, HEADER_LAYOUT + 8 * index)).collect();
        if stored_layout != layout.to_array() {
            return Err(format!(
                "region offsets {stored_layout:?} disagree with the geometry's {:?}",
                layout.to_array()
            ));
        }
        if bytes[HEADER_EPOCH + 4..HEADER_COUNTERS].iter().any(|&byte| byte != 0) {
            return Err("reserved header bytes are set".into());
        }
        let counter_count = u32_at(bytes, HEADER_COUNTER_COUNT) as usize;
        if counter_count != Counters::FIELD_NAMES.len() {
            return Err(format!("{counter_count} counters, expected {}", Counters::FIELD_NAMES.len()));
        }
        let values: Vec<u64> = (0..counter_count).map(|index| u64_at(bytes, HEADER_COUNTERS + 8 * index)).collect();
        let counters = Counters::from_array(&values).ok_or("counter count mismatch")?;
        let header = ImageHeader {
            generation: u64_at(bytes, HEADER_GENERATION),
            geometry,
            layout,
            overlay_active_slot: u32_at(bytes, HEADER_OVERLAY_ACTIVE_SLOT),
            overlay_entries: u32_at(bytes, HEADER_OVERLAY_ENTRIES),
            overlay_bytes: u64_at(bytes, HEADER_OVERLAY_BYTES),
            overlay_crc: u32_at(bytes, HEADER_OVERLAY_CRC),
            clock_ns: u64_at(bytes, HEADER_CLOCK),
            epoch: u32_at(bytes, HEADER_EPOCH),
            counters,
        };
        if header.overlay_active_slot > 1 {
            return Err(format!("overlay slot {} is not 0 or 1", header.overlay_active_slot));
        }
        if header.overlay_bytes > layout.overlay_slot_bytes || header.overlay_entries as usize > OVERLAY_ENTRIES_MAX {
            return Err(format!(
                "overlay of {} entries in {} bytes exceeds its slot ({} entries, {} bytes)",
                header.overlay_entries, header.overlay_bytes, OVERLAY_ENTRIES_MAX, layout.overlay_slot_bytes
            ));
        }
        Ok(header)
    }
}

impl ImageLayout {
    /// Where zone `zone`'s record sits in the file.
    pub fn zone_record_offset(&self, zone: u32) -> u64 {
        self.zone_table_offset + u64::from(zone) * ZONE_RECORD_BYTES
    }
}

fn record_crc(index: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), body)
}

/// A zone record as an image stores it: the device's record, and what open
/// needs to find pages a host crash lost (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredZoneRecord {
    pub record: ZoneRecord,
    /// Pages below this were synced to the host's disk before the record
    /// was written; open checks the slots from here to the write pointer.
    pub synced_write_pointer: u32,
    /// The epoch of the session that wrote the record, which every slot
    /// it names past `synced_write_pointer` carries.
    pub epoch: u32,
}

/// Encodes a zone record; the checksum covers the zone number, so a record
/// found in the wrong slot is caught.
pub fn encode_zone_record(zone: u32, stored: &StoredZoneRecord) -> [u8; ZONE_RECORD_BYTES as usize] {
    let record = &stored.record;
    assert!(stored.synced_write_pointer <= record.write_pointer, "zone {zone}: synced past the write pointer");
    let mut bytes = [0u8; ZONE_RECORD_BYTES as usize];
    bytes[0] = record.condition.to_byte();
    put_u32(&mut bytes, 4, record.write_pointer);
    put_u32(&mut bytes, 8, record.capacity_pages);
    put_u32(&mut bytes, 12, record.generation);
    put_u32(&mut bytes, 16, stored.synced_write_pointer);
    put_u32(&mut bytes, 20, stored.epoch);
    let crc = record_crc(u64::from(zone), &bytes[..28]);
    put_u32(&mut bytes, 28, crc);
    bytes
}

/// Decodes a zone record and checks it against the geometry.
pub fn decode_zone_record(
    zone: u32,
    bytes: &[u8],
    geometry: &Geometry,
) -> std::result::Result<StoredZoneRecord, String> {
    if bytes.len() != ZONE_RECORD_BYTES as usize {
        return Err(format!("zone {zone} record is {} bytes, expected {}", bytes.len(), ZONE_RECORD_BYTES));
    }
    if record_crc(u64::from(zone), &bytes[..28]) != u32_at(bytes, 28) {
        return Err(format!("zone {zone} record checksum mismatch"));
    }
    let condition =
        DurableCondition::from_byte(bytes[0]).ok_or(format!("zone {zone} condition {} unknown", bytes[0]))?;
    let record = ZoneRecord {
        condition,
        write_pointer: u32_at(bytes, 4),
        capacity_pages: u32_at(bytes, 8),
        generation: u32_at(bytes, 12),
    };
    let synced_write_pointer = u32_at(bytes, 16);
    if synced_write_pointer > record.write_pointer || bytes[24..28].iter().any(|&byte| byte != 0) {
        return Err(format!(
            "zone {zone}: synced write pointer {synced_write_pointer} past the write pointer {}, or reserved bytes set",
            record.write_pointer
        ));
    }
    if u64::from(record.capacity_pages) > geometry.zone_pages()
        || !record.capacity_pages.is_multiple_of(geometry.block_pages)
        || record.write_pointer > record.capacity_pages
    {
        return Err(format!(
            "zone {zone}: write pointer {} and capacity {} do not fit a zone of {} pages",
            record.write_pointer,
            record.capacity_pages,
            geometry.zone_pages()
        ));
    }
    let consistent = match condition {
        DurableCondition::Empty => record.write_pointer == 0 && record.capacity_pages > 0,
        DurableCondition::Offline => record.capacity_pages == 0,
        DurableCondition::Closed => record.write_pointer > 0 && record.write_pointer < record.capacity_pages,
        DurableCondition::Full | DurableCondition::ReadOnly => record.capacity_pages > 0,
    };
    if !consistent {
        return Err(format!(
            "zone {zone}: condition {condition:?} contradicts write pointer {} and capacity {}",
            record.write_pointer, record.capacity_pages
        ));
    }
    Ok(StoredZoneRecord { record, synced_write_pointer, epoch: u32_at(bytes, 20) })
}

/// The trailer of the slot at `physical`, written in `epoch` while its zone
/// was at `generation`, but for its CRC (the last four bytes, zero here),
/// which the writer fills in ([`slot_crc`]). The CRC covers the data and
/// OOB too, so a slot the host wrote back in part does not count.
fn slot_trailer_without_crc(physical: u64, generation: u32, epoch: u32) -> [u8; SLOT_TRAILER_BYTES as usize] {
    let mut trailer = [0u8; SLOT_TRAILER_BYTES as usize];
    trailer[0..4].copy_from_slice(&TRAILER_MAGIC);
    put_u32(&mut trailer, 4, generation);
    put_u64(&mut trailer, 8, physical);
    put_u32(&mut trailer, 16, epoch);
    trailer
}

/// Whether a whole slot (data, OOB, trailer) is the one written at
/// `physical` in `epoch` while its zone was at `generation`.
pub fn slot_is_valid(slot: &[u8], page_size_bytes: usize, physical: u64, generation: u32, epoch: u32) -> bool {
    let Some(trailer_start) = slot.len().checked_sub(SLOT_TRAILER_BYTES as usize) else {
        return false;
    };
    if page_size_bytes > trailer_start {
        return false;
    }
    let trailer = &slot[trailer_start..];
    let expected = slot_trailer_without_crc(physical, generation, epoch);
    trailer[..TRAILER_CRC] == expected[..TRAILER_CRC] && u32_at(trailer, TRAILER_CRC) == slot_crc(slot)
}

const BLOCK_RECORD_CRC: usize = BLOCK_RECORD_BYTES as usize - 4;

pub fn encode_block_record(block: u64, record: &BlockRecord) -> [u8; BLOCK_RECORD_BYTES as usize] {
    let mut bytes = [0u8; BLOCK_RECORD_BYTES as usize];
    put_u32(&mut bytes, 0, record.erase_count);
    put_u32(&mut bytes, 4, record.reads_since_erase);
    put_u64(&mut bytes, 8, record.programmed_at_ns);
    put_u64(&mut bytes, 16, record.interrupted_erase_seed.unwrap_or(0));
    put_u32(&mut bytes, 24, record.zone_generation);
    let mut flags = 0;
    if record.bad {
        flags |= BLOCK_FLAG_BAD;
    }
    if record.excluded {
        flags |= BLOCK_FLAG_EXCLUDED;
    }
    if record.interrupted_erase_seed.is_some() {
        flags |= BLOCK_FLAG_INTERRUPTED_ERASE;
    }
    bytes[28] = flags;
    let crc = record_crc(block, &bytes[..BLOCK_RECORD_CRC]);
    put_u32(&mut bytes, BLOCK_RECORD_CRC, crc);
    bytes
}

pub fn decode_block_record(block: u64, bytes: &[u8]) -> std::result::Result<BlockRecord, String> {
    if bytes.len() != BLOCK_RECORD_BYTES as usize {
        return Err(format!("block {block} record is {} bytes, expected {}", bytes.len(), BLOCK_RECORD_BYTES));
    }
    if record_crc(block, &bytes[..BLOCK_RECORD_CRC]) != u32_at(bytes, BLOCK_RECORD_CRC) {
        return Err(format!("block {block} record checksum mismatch"));
    }
    let flags = bytes[28];
    if flags & !BLOCK_FLAGS_KNOWN != 0 {
        return Err(format!("block {block} has unknown flags {flags:#04x}"));
    }
    if bytes[29..BLOCK_RECORD_CRC].iter().any(|&byte| byte != 0) {
        return Err(format!("block {block} record has reserved bytes set"));
    }
    Ok(BlockRecord {
        erase_count: u32_at(bytes, 0),
        reads_since_erase: u32_at(bytes, 4),
        programmed_at_ns: u64_at(bytes, 8),
        interrupted_erase_seed: (flags & BLOCK_FLAG_INTERRUPTED_ERASE != 0).then(|| u64_at(bytes, 16)),
        zone_generation: u32_at(bytes, 24),
        bad: flags & BLOCK_FLAG_BAD != 0,
        excluded: flags & BLOCK_FLAG_EXCLUDED != 0,
    })
}

pub fn encode_overlay(overlay: &Overlay, generation_of: &dyn Fn(u64) -> u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (physical, fault) in overlay {
        let mut entry = [0u8; OVERLAY_ENTRY_BYTES as usize];
        put_u64(&mut entry, 0, *physical);
        let (kind, rate_ppm, seed) = match fault {
            PageFault::Torn { seed } => (OVERLAY_KIND_TORN, 0, *seed),
            PageFault::LostWrite => (OVERLAY_KIND_LOST_WRITE, 0, 0),
            PageFault::Disturbed { seed, rate_ppm } => (OVERLAY_KIND_DISTURBED, *rate_ppm, *seed),
            PageFault::Stored { .. } => (OVERLAY_KIND_STORED, 0, 0),
            PageFault::Unreadable => (OVERLAY_KIND_UNREADABLE, 0, 0),
        };
        entry[8] = kind;
        put_u32(&mut entry, 12, rate_ppm);
        put_u64(&mut entry, 16, seed);
        put_u32(&mut entry, 24, generation_of(*physical));
        bytes.extend_from_slice(&entry);
        if let PageFault::Stored { media } = fault {
            bytes.extend_from_slice(media);
        }
    }
    bytes
}

pub fn decode_overlay(
    bytes: &[u8],
    entries: u32,
    geometry: &Geometry,
) -> std::result::Result<Vec<OverlayRecord>, String> {
    let slot_bytes = geometry.page_size_bytes as usize + geometry.oob_size_bytes as usize;
    let mut overlay = Vec::new();
    let mut offset = 0usize;
    let mut stored = 0usize;
    let mut previous = None;
    for index in 0..entries {
        let entry = bytes
            .get(offset..offset.saturating_add(OVERLAY_ENTRY_BYTES as usize))
            .ok_or(format!("overlay entry {index} runs past the overlay's {} bytes", bytes.len()))?;
        offset += OVERLAY_ENTRY_BYTES as usize;
        let physical = u64_at(entry, 0);
        if physical >= geometry.device_pages() {
            return Err(format!("overlay entry {index} names page slot {physical}, past the device"));
        }
        if previous.is_some_and(|previous| physical <= previous) {
            return Err(format!("overlay entry {index} is out of order"));
        }
        previous = Some(physical);
        let (rate_ppm, seed) = (u32_at(entry, 12), u64_at(entry, 16));
        let fault = match entry[8] {
            OVERLAY_KIND_TORN => PageFault::Torn { seed },
            OVERLAY_KIND_LOST_WRITE => PageFault::LostWrite,
            OVERLAY_KIND_UNREADABLE => PageFault::Unreadable,
            OVERLAY_KIND_DISTURBED if rate_ppm <= 1_000_000 => PageFault::Disturbed { seed, rate_ppm },
            OVERLAY_KIND_STORED => {
                stored += 1;
                if stored > OVERLAY_STORED_PAGES_MAX {
                    return Err(format!("more than {OVERLAY_STORED_PAGES_MAX} stored overlay pages"));
                }
                let media = bytes
                    .get(offset..offset.saturating_add(slot_bytes))
                    .ok_or(format!("overlay entry {index}'s page runs past the overlay"))?;
                offset += slot_bytes;
                PageFault::Stored { media: media.into() }
            }
            kind => return Err(format!("overlay entry {index} has unknown kind {kind} or rate {rate_ppm}")),
        };
        overlay.push(OverlayRecord { physical, generation: u32_at(entry, 24), fault });
    }
    if offset != bytes.len() {
        return Err(format!("overlay has {} trailing bytes", bytes.len() - offset));
    }
    Ok(overlay)
}

pub use crate::image_writer::HostWriteObserver;
use crate::image_writer::{slot_crc, Command, Failure, ImageWriter};

/// Durable state in an image file.
pub struct ImageBackend {
    path: PathBuf,
    /// The file, and the queue of writes and syncs on their way to it
    /// (`image_writer`: in order, off this thread, every queued write
    /// readable).
    writer: ImageWriter,
    header: ImageHeader,
    slot_bytes: u64,
    /// Sync between an overlay and the header that points at it, keep
    /// each zone's synced write pointer, and sync after
    /// [`IMAGE_UNSYNCED_PAGES_MAX`] pages.
    host_sync: bool,
    /// Page slots written by `write_page` and not yet in the file: one
    /// stretch of consecutive slots, from file offset `pending_offset`.
    pending: Vec<u8>,
    pending_offset: u64,
    /// Per zone: the generation slots are written with (the last zone
    /// record's), the pages written in it (the device writes a zone's
    /// pages in order, so this is its durable write pointer), and the
    /// pages known synced (those written at the last sync).
    zone_generations: Vec<u32>,
    written_pages: Vec<u32>,
    synced_write_pointers: Vec<u32>,
    /// Pages written since the last sync.
    unsynced_pages: u64,
    /// Zones whose last record was written with its synced write pointer
    /// below its write pointer, and that record: each sync writes them
    /// again with the new synced write pointer, so open checks only what
    /// was written since about the last sync, not every zone a long run
    /// of writes without a flush filled.
    floors_behind: BTreeMap<u32, ZoneRecord>,
    /// Per zone, for allocating ahead ([`IMAGE_ALLOCATE_AHEAD_BYTES`]): the
    /// file offset up to which this session knows the zone's slots have
    /// host blocks (no holes), and the offset just past the last slot
    /// written in the zone's current life (0 before any). Pages go through
    /// the zone's block map, so a zone with an excluded block has its slots
    /// further on than its write pointer says.
    allocated_through: Vec<u64>,
    written_ends: Vec<u64>,
    /// Whether to allocate ahead: not on a host file system where it gains
    /// nothing (nor after it failed once or the host disk ran low, which
    /// the writer says).
    allocates_ahead: bool,
    /// Slots open checked for a host crash's losses, and zones whose write
    /// pointer it lowered for them.
    slots_checked_at_open: u64,
    zones_lowered_at_open: u32,
}

/// The device on an image file.
pub type ImageFlash = FlashEmulator<ImageBackend>;

impl ImageBackend {
    fn io(&self, operation: &'static str) -> impl FnOnce(std::io::Error) -> DeviceError + '_ {
        move |source| DeviceError::Io { path: self.path.display().to_string(), operation, source }
    }

    fn failed(&self) -> impl FnOnce(Failure) -> DeviceError + '_ {
        move |Failure { operation, source }| DeviceError::Io {
            path: self.path.display().to_string(),
            operation,
            source,
        }
    }

    /// An fdatasync failed: what the host's cache holds is then unknown
    /// (the kernel may have dropped the pages it could not write), so
    /// nothing more is written or synced until the image is opened again.
    fn refuse_after_failed_sync(&self) -> Result<()> {
        if self.writer.sync_failed() {
            return Err(DeviceError::Io {
                path: self.path.display().to_string(),
                operation: "write after a failed fdatasync (open the image again)",
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }

    /// Every write to the file goes through here, after the gathered
    /// slots (the order `Backend` promises a killed process), and into the
    /// writer's queue, where an observer sees it when it runs.
    fn write_at(&mut self, bytes: &[u8], offset: u64, operation: &'static str) -> Result<()> {
        self.write_pending()?;
        let mut buffer = self.writer.spare_buffer();
        buffer.extend_from_slice(bytes);
        self.writer
            .push(Command::Write { offset, bytes: Arc::new(buffer), operation, crc_per_slot_bytes: None })
            .map_err(self.failed())
    }

    /// Writes `header` as the next generation; only once it is written does
    /// it become the backend's header.
    fn write_header(&mut self, mut header: ImageHeader) -> Result<()> {
        header.generation = self.header.generation + 1;
        let bytes = header.encode();
        assert_eq!(ImageHeader::decode(&bytes).as_ref(), Ok(&header), "header must read back as written");
        let offset = (header.generation % 2) * HEADER_SLOT_BYTES;
        self.write_at(&bytes, offset, "write header")?;
        self.header = header;
        Ok(())
    }

    /// What a zone record is stored as now: without `host_sync` nothing is
    /// synced, and the host's page cache is trusted with every page.
    fn stored_record(&self, zone: u32, record: &ZoneRecord) -> StoredZoneRecord {
        let synced_write_pointer = if self.host_sync {
            self.synced_write_pointers[zone as usize].min(record.write_pointer)
        } else {
            record.write_pointer
        };
        StoredZoneRecord { record: *record, synced_write_pointer, epoch: self.header.epoch }
    }

    /// The zone's next life: no page of it written or synced yet.
    fn begin_generation(&mut self, zone: u32, generation: u32) {
        let index = zone as usize;
        self.zone_generations[index] = generation;
        self.written_pages[index] = 0;
        self.synced_write_pointers[index] = 0;
        self.written_ends[index] = 0;
        self.floors_behind.remove(&zone);
    }

    /// Lets `observer` see every write and sync from now on (tests of what
    /// a host crash leaves).
    pub fn observe_host_writes(&mut self, observer: Box<dyn HostWriteObserver>) {
        self.writer.observe(observer);
    }

    /// Slots the last open read to find pages a host crash lost.
    pub fn slots_checked_at_open(&self) -> u64 {
        self.slots_checked_at_open
    }

    /// Whether the backend still allocates host blocks ahead of its writes
    /// ([`IMAGE_ALLOCATE_AHEAD_BYTES`]).
    pub fn allocates_ahead(&self) -> bool {
        self.allocates_ahead && self.writer.allocates_ahead()
    }

    /// Zones whose write pointer the last open lowered past lost pages.
    pub fn zones_lowered_at_open(&self) -> u32 {
        self.zones_lowered_at_open
    }

    fn page_offset(&self, physical: u64) -> u64 {
        self.header.layout.page_area_offset + physical * self.slot_bytes
    }

    /// The gathered copy of a page slot, if it is one. Reads are served
    /// from it, so a write that keeps failing (a full host disk) leaves
    /// every page readable. Its trailer's CRC is still zero (the writer
    /// fills it in): only its data and OOB are read.
    fn pending_slot(&self, physical: u64) -> Option<&[u8]> {
        let start = self.page_offset(physical).checked_sub(self.pending_offset)? as usize;
        let slot_bytes = self.slot_bytes as usize;
        (start + slot_bytes <= self.pending.len()).then(|| &self.pending[start..start + slot_bytes])
    }

    /// Makes sure the image has host blocks (zeros where it had holes) for
    /// [`IMAGE_ALLOCATE_AHEAD_BYTES`] past the zone's last written slot,
    /// when less than half of that is left: queued, to run after the sync
    /// before it. Best effort: a hole left here only costs a later sync an
    /// allocation. An error, or a host disk with less than
    /// [`IMAGE_ALLOCATE_AHEAD_ROOM_BYTES`] free, stops it for the session
    /// (the writer's `FillHoles`): zeros must not be what fills the host's
    /// disk (a file system that finds no room only at write-back would
    /// fail the next fdatasync).
    fn allocate_ahead(&mut self, zone: u32) -> Result<()> {
        let written_end = self.written_ends[zone as usize];
        if !self.allocates_ahead() || written_end == 0 {
            return Ok(());
        }
        let zone_pages = self.header.geometry.zone_pages();
        let zone_end = self.page_offset((u64::from(zone) + 1) * zone_pages);
        let target = zone_end.min(written_end + IMAGE_ALLOCATE_AHEAD_BYTES);
        let known = self.allocated_through[zone as usize].max(written_end);
        if known >= zone_end.min(written_end + IMAGE_ALLOCATE_AHEAD_BYTES / 2) {
            return Ok(());
        }
        self.writer.push(Command::FillHoles { start: known, end: target }).map_err(self.failed())?;
        self.allocated_through[zone as usize] = target;
        Ok(())
    }

    /// Writes the gathered slots. Every method that writes calls this
    /// first, so the file sees pages before any record that makes them
    /// durable (the order `Backend` promises a killed process). On an
    /// error the slots stay gathered, to be tried again: nothing that
    /// claims them durable has been written yet.
    fn write_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.refuse_after_failed_sync()?;
        let bytes = std::mem::replace(&mut self.pending, self.writer.spare_buffer());
        let command = Command::Write {
            offset: self.pending_offset,
            bytes: Arc::new(bytes),
            operation: "write page",
            crc_per_slot_bytes: Some(self.slot_bytes as usize),
        };
        match self.writer.try_push(command) {
            Ok(()) => Ok(()),
            // Not queued: the slots stay gathered, to be tried again.
            Err((failure, command)) => {
                if let Command::Write { bytes, .. } = command {
                    self.pending = Arc::try_unwrap(bytes).unwrap_or_else(|shared| shared.as_ref().clone());
                }
                Err(self.failed()(failure))
            }
        }
    }

    /// Writes zeros into every hole of the image and syncs them, calling
    /// `progress` with the bytes done and the total: no later write then
    /// allocates the host's blocks (which ext4 commits within the next
    /// fdatasync) or the host's page-cache pages (a first write into the
    /// file's page cache ran at 0.6 to 1.0 GB/s here, an overwrite at 2.2:
    /// the writer thread's whole cost in large_rand_write over FUSE). What
    /// `mkfs --preallocate` does, as a disk has every block from the start.
    /// Written bytes are left alone, so it is safe at any point in the
    /// image's life. Refused, writing nothing, when the host has too little
    /// room for the holes.
    fn allocate_every_hole(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        self.write_pending()?;
        self.refuse_after_failed_sync()?;
        let total = self.header.layout.image_bytes;
        let allocated = self.writer.allocated_bytes().map_err(self.io("stat"))?;
        let needed = total.saturating_sub(allocated);
        if let Some(free) = self.writer.host_free_bytes() {
            if free < needed.saturating_add(IMAGE_ALLOCATE_AHEAD_ROOM_BYTES) {
                return Err(image_error(
                    &self.path,
                    format!(
                        "preallocating needs {needed} bytes and {IMAGE_ALLOCATE_AHEAD_ROOM_BYTES} to spare; the host has {free} free"
                    ),
                ));
            }
        }
        let mut start = 0;
        while start < total {
            let end = total.min(start + PREALLOCATE_PIECE_BYTES);
            self.writer.fill_holes_now(start, end).map_err(self.failed())?;
            start = end;
            progress(start, total);
        }
        self.writer.push(Command::Sync).map_err(self.failed())?;
        self.settle()
    }

    /// Reads from the file as it will be once every queued write ran.
    fn read_at(&self, buffer: &mut [u8], offset: u64, operation: &'static str) -> Result<()> {
        self.writer.read_exact_at(buffer, offset).map_err(self.io(operation))
    }

    /// The geometry an image was made with, without opening it as a device
    /// (and without taking its lock).
    pub fn read_geometry(path: &Path) -> Result<Geometry> {
        let file = File::open(path).map_err(|source| DeviceError::Io {
            path: path.display().to_string(),
            operation: "open",
            source,
        })?;
        Ok(read_headers(path, &file)?[0].geometry)
    }
}

fn image_error(path: &Path, reason: impl Into<String>) -> DeviceError {
    DeviceError::Image { path: path.display().to_string(), reason: reason.into() }
}

/// Both header copies that decode, newest first; an error when none does.
fn read_headers(path: &Path, file: &File) -> Result<Vec<ImageHeader>> {
    let length = file
        .metadata()
        .map_err(|source| DeviceError::Io { path: path.display().to_string(), operation: "stat", source })?
        .len();
    if length < 2 * HEADER_SLOT_BYTES {
        return Err(image_error(
            path,
            format!("truncated: {length} bytes, a device image has at least {}", 2 * HEADER_SLOT_BYTES),
        ));
    }
    let mut candidates = Vec::new();
    let mut reasons = Vec::new();
    for slot in 0..2 {
        let mut bytes = vec![0u8; HEADER_SLOT_BYTES as usize];
        file.read_exact_at(&mut bytes, slot * HEADER_SLOT_BYTES).map_err(|source| DeviceError::Io {
            path: path.display().to_string(),
            operation: "read header",
            source,
        })?;
        match ImageHeader::decode(&bytes) {
            Ok(header) => candidates.push(header),
            Err(reason) => reasons.push(format!("header copy {slot}: {reason}")),
        }
    }
    if candidates.is_empty() {
        return Err(image_error(path, reasons.join("; ")));
    }
    candidates.sort_by_key(|header| std::cmp::Reverse(header.generation));
    let newest = &candidates[0];
    if length < newest.layout.image_bytes {
        return Err(image_error(
            path,
            format!("truncated: {length} bytes, its geometry needs {}", newest.layout.image_bytes),
        ));
    }
    Ok(candidates)
}

/// Whether writing zeros ahead gives the host file system's blocks to the
/// writes that follow: not where every write allocates anew (btrfs,
/// bcachefs and ZFS copy on write) or where there is no disk and no journal
/// (tmpfs, ramfs).
fn host_allocates_in_place(file: &File) -> bool {
    // Their statfs magic numbers (linux/magic.h; ZFS's own).
    const BTRFS_MAGIC: u32 = 0x9123_683E;
    const BCACHEFS_MAGIC: u32 = 0xCA45_1A4E;
    const ZFS_MAGIC: u32 = 0x2FC1_2FC1;
    const TMPFS_MAGIC: u32 = 0x0102_1994;
    const RAMFS_MAGIC: u32 = 0x8584_58F6;
    const COPY_ON_WRITE_OR_MEMORY: [u32; 5] = [BTRFS_MAGIC, BCACHEFS_MAGIC, ZFS_MAGIC, TMPFS_MAGIC, RAMFS_MAGIC];
    // SAFETY: an all-zero statfs is a valid value, filled in by fstatfs.
    let mut status: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a descriptor this backend owns, into `status`.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut status) } != 0 {
        return false;
    }
    // The magic is 32 bits wide; `f_type`'s own type is wider on some
    // targets and signed on others, so compare the low 32 bits.
    !COPY_ON_WRITE_OR_MEMORY.contains(&(status.f_type as u32))
}

impl FlashEmulator<ImageBackend> {
    /// Creates a new image file for a fresh device; refuses a path that
    /// already exists. The file is sparse: untouched pages take no space.
    pub fn create_image(path: impl AsRef<Path>, geometry: Geometry, options: DeviceOptions) -> Result<ImageFlash> {
        let path = path.as_ref();
        geometry.validate()?;
        options.validate()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|source| DeviceError::Io { path: path.display().to_string(), operation: "create", source })?;
        lock(path, &file)?;
        let layout = ImageLayout::of(&geometry);
        file.set_len(layout.image_bytes).map_err(|source| DeviceError::Io {
            path: path.display().to_string(),
            operation: "size",
            source,
        })?;
        let state = fresh_state(&geometry, &options.faults);
        let allocates_ahead = host_allocates_in_place(&file);
        let mut backend = ImageBackend {
            path: path.to_path_buf(),
            writer: ImageWriter::new(HostFile::through(file)),
            header: ImageHeader {
                generation: 0,
                geometry,
                layout,
                overlay_active_slot: 0,
                overlay_entries: 0,
                overlay_bytes: 0,
                overlay_crc: crc32c::crc32c(&[]),
                clock_ns: 0,
                epoch: 0,
                counters: Counters::default(),
            },
            slot_bytes: ImageLayout::slot_bytes(&geometry),
            host_sync: options.host_sync,
            pending: Vec::new(),
            pending_offset: 0,
            zone_generations: state.zones.iter().map(|record| record.generation).collect(),
            written_pages: vec![0; geometry.zone_count as usize],
            synced_write_pointers: vec![0; geometry.zone_count as usize],
            unsynced_pages: 0,
            floors_behind: BTreeMap::new(),
            allocated_through: vec![0; geometry.zone_count as usize],
            written_ends: vec![0; geometry.zone_count as usize],
            allocates_ahead,
            slots_checked_at_open: 0,
            zones_lowered_at_open: 0,
        };
        let zone_table: Vec<u8> = state
            .zones
            .iter()
            .enumerate()
            .flat_map(|(zone, record)| encode_zone_record(zone as u32, &backend.stored_record(zone as u32, record)))
            .collect();
        backend.write_at(&zone_table, layout.zone_table_offset, "write zone table")?;
        let block_table: Vec<u8> = state
            .blocks
            .iter()
            .enumerate()
            .flat_map(|(block, record)| encode_block_record(block as u64, record))
            .collect();
        backend.write_at(&block_table, layout.block_table_offset, "write block table")?;
        // Both header copies, so neither slot holds garbage.
        backend.write_header(backend.header.clone())?;
        backend.write_header(backend.header.clone())?;
        if options.host_sync {
            backend.sync()?;
        }
        backend.settle()?;
        backend.writer.run_in_background().map_err(backend.io("start the image's writer thread"))?;
        FlashEmulator::from_parts(geometry, options, backend, state)
    }

    /// Opens an existing image. Refuses a corrupted, truncated, foreign or
    /// other-version image with a message saying why, and an image another
    /// process has open.
    pub fn open_image(path: impl AsRef<Path>, options: DeviceOptions) -> Result<ImageFlash> {
        ImageFlash::open_image_with(path.as_ref(), options, false)
    }

    /// [`ImageFlash::open_image`] for a check that must leave the image as
    /// it found it: the file is opened read-only, and every write the
    /// device (or an engine mounted on it) makes lands in a scratch view in
    /// memory instead (see `host_file`). The device behaves as on a real
    /// open, a host crash's losses found and a recovery run included, so
    /// what a check sees is what a mount would see.
    pub fn open_image_to_look(path: impl AsRef<Path>, options: DeviceOptions) -> Result<ImageFlash> {
        ImageFlash::open_image_with(path.as_ref(), options, true)
    }

    fn open_image_with(path: &Path, options: DeviceOptions, scratch: bool) -> Result<ImageFlash> {
        options.validate()?;
        let file = OpenOptions::new().read(true).write(!scratch).open(path).map_err(|source| DeviceError::Io {
            path: path.display().to_string(),
            operation: "open",
            source,
        })?;
        lock_as(path, &file, scratch)?;
        let headers = read_headers(path, &file)?;
        let geometry = headers[0].geometry;
        let layout = headers[0].layout;
        if headers.iter().any(|header| header.geometry != geometry) {
            return Err(image_error(path, "the two header copies disagree on the geometry"));
        }
        let read = |offset: u64, length: u64, what: &'static str| -> Result<Vec<u8>> {
            let mut bytes = vec![0u8; length as usize];
            file.read_exact_at(&mut bytes, offset).map_err(|source| DeviceError::Io {
                path: path.display().to_string(),
                operation: what,
                source,
            })?;
            Ok(bytes)
        };
        let block_table =
            read(layout.block_table_offset, geometry.block_count() * BLOCK_RECORD_BYTES, "read block table")?;
        let mut blocks = block_table
            .chunks_exact(BLOCK_RECORD_BYTES as usize)
            .enumerate()
            .map(|(block, bytes)| decode_block_record(block as u64, bytes))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|reason| image_error(path, reason))?;
        let zone_table =
            read(layout.zone_table_offset, u64::from(geometry.zone_count) * ZONE_RECORD_BYTES, "read zone table")?;
        let mut zones = Vec::with_capacity(geometry.zone_count as usize);
        let epoch = headers[0]
            .epoch
            .checked_add(1)
            .ok_or_else(|| image_error(path, "opened 4,294,967,295 times: no epoch left"))?;
        // Zones whose record open writes again (every zone it checked,
        // lowered or not, so that no window is checked again at the next
        // open), and blocks whose record it completes; both are written
        // before open returns.
        let mut rewritten = Vec::new();
        let mut completed_blocks = Vec::new();
        let mut slots_checked_at_open = 0;
        let mut zones_lowered_at_open = 0;
        for (zone, bytes) in zone_table.chunks_exact(ZONE_RECORD_BYTES as usize).enumerate() {
            let stored =
                decode_zone_record(zone as u32, bytes, &geometry).map_err(|reason| image_error(path, reason))?;
            let mut record = stored.record;
            let first = zone as u64 * u64::from(geometry.zone_blocks);
            let block_range = first as usize..(first + u64::from(geometry.zone_blocks)) as usize;
            let next_generation = record.generation.wrapping_add(1);
            let of_reset = |block: &BlockRecord| block.zone_generation == next_generation;
            let before_reset = |block: &BlockRecord| block.zone_generation == record.generation;
            if blocks[block_range.clone()].iter().any(of_reset)
                && blocks[block_range.clone()].iter().all(|block| of_reset(block) || before_reset(block))
            {
                // A reset writes the zone's block records, then its zone
                // record: a process killed between the two leaves all its
                // blocks a generation ahead, and a host crash some of them
                // (each record is whole: none straddles a sector). The
                // reset had begun, so it completes: the blocks behind take
                // the erase it gave the others.
                for (index, block) in blocks[block_range.clone()].iter_mut().enumerate() {
                    if before_reset(block) {
                        *block = block.after_reset(next_generation);
                        completed_blocks.push(first + index as u64);
                    }
                }
                let capacity_pages = block_map_of(&geometry, &blocks, zone as u32).len() as u32 * geometry.block_pages;
                record = ZoneRecord {
                    condition: if capacity_pages == 0 { DurableCondition::Offline } else { DurableCondition::Empty },
                    write_pointer: 0,
                    capacity_pages,
                    generation: next_generation,
                };
                rewritten.push(zone as u32);
            } else if !blocks[block_range.clone()].iter().all(before_reset) {
                return Err(image_error(
                    path,
                    format!(
                        "zone {zone}: its blocks' reset generations disagree with the zone's {}",
                        record.generation
                    ),
                ));
            } else if block_map_of(&geometry, &blocks, zone as u32).len() as u32 * geometry.block_pages
                != record.capacity_pages
            {
                return Err(image_error(
                    path,
                    format!(
                        "zone {zone}: capacity {} disagrees with its {} mapped blocks",
                        record.capacity_pages,
                        block_map_of(&geometry, &blocks, zone as u32).len()
                    ),
                ));
            } else if stored.synced_write_pointer < record.write_pointer {
                // Pages past the synced write pointer may not have reached
                // the disk before a host crash: the zone keeps the prefix
                // whose slots hold.
                let block_map = block_map_of(&geometry, &blocks, zone as u32);
                let mut slot = vec![0u8; ImageLayout::slot_bytes(&geometry) as usize];
                let mut page = stored.synced_write_pointer;
                while page < record.write_pointer {
                    let block = first + u64::from(block_map[(page / geometry.block_pages) as usize]);
                    let physical = block * u64::from(geometry.block_pages) + u64::from(page % geometry.block_pages);
                    let offset = layout.page_area_offset + physical * slot.len() as u64;
                    file.read_exact_at(&mut slot, offset).map_err(|source| DeviceError::Io {
                        path: path.display().to_string(),
                        operation: "check page slot",
                        source,
                    })?;
                    slots_checked_at_open += 1;
                    let page_size = geometry.page_size_bytes as usize;
                    if !slot_is_valid(&slot, page_size, physical, record.generation, stored.epoch) {
                        break;
                    }
                    page += 1;
                }
                if page < record.write_pointer {
                    // A finished zone (full below its capacity) and a
                    // read-only one stay so, whatever pages they lose, as
                    // at a power cut.
                    let finished = matches!(record.condition, DurableCondition::Full)
                        && record.write_pointer < record.capacity_pages;
                    record.condition = match record.condition {
                        DurableCondition::ReadOnly => DurableCondition::ReadOnly,
                        _ if finished => DurableCondition::Full,
                        _ if page == 0 => DurableCondition::Empty,
                        _ => DurableCondition::Closed,
                    };
                    record.write_pointer = page;
                    zones_lowered_at_open += 1;
                }
                rewritten.push(zone as u32);
            }
            zones.push(record);
        }
        let header = headers.into_iter().next().expect("at least one valid header");
        let (header_counters, clock_ns) = (header.counters, header.clock_ns);
        let overlay_offset =
            layout.overlay_slot_offset + u64::from(header.overlay_active_slot) * layout.overlay_slot_bytes;
        let overlay_bytes = read(overlay_offset, header.overlay_bytes, "read overlay")?;
        if crc32c::crc32c(&overlay_bytes) != header.overlay_crc {
            return Err(image_error(path, "fault overlay checksum mismatch"));
        }
        let records = decode_overlay(&overlay_bytes, header.overlay_entries, &geometry)
            .map_err(|reason| image_error(path, reason))?;
        // The overlay is written after the zone records of a reset, so it
        // may still hold faults of a zone's previous generation: those pages
        // were erased. A generation ahead of its zone is damage.
        let mut overlay = Overlay::new();
        for record in records {
            let zone = (record.physical / geometry.zone_pages()) as usize;
            let generation = zones[zone].generation;
            let ahead = record.generation.wrapping_sub(generation);
            if ahead == 0 {
                overlay.insert(record.physical, record.fault);
            } else if ahead <= u32::MAX / 2 {
                return Err(image_error(
                    path,
                    format!(
                        "fault overlay entry for page slot {} has generation {}, ahead of its zone's {generation}",
                        record.physical, record.generation
                    ),
                ));
            }
        }
        let nvm = read(layout.nvm_offset, geometry.nvm_size_bytes, "read NVM")?;
        let write_pointers: Vec<u32> = zones.iter().map(|record| record.write_pointer).collect();
        // A scratch view allocates nothing ahead: its writes never reach
        // the host's file system.
        let allocates_ahead = !scratch && host_allocates_in_place(&file);
        let mut backend = ImageBackend {
            path: path.to_path_buf(),
            writer: ImageWriter::new(if scratch { HostFile::scratch(file) } else { HostFile::through(file) }),
            slot_bytes: ImageLayout::slot_bytes(&geometry),
            header,
            host_sync: options.host_sync,
            pending: Vec::new(),
            pending_offset: 0,
            zone_generations: zones.iter().map(|record| record.generation).collect(),
            written_pages: write_pointers.clone(),
            synced_write_pointers: write_pointers,
            unsynced_pages: 0,
            floors_behind: BTreeMap::new(),
            allocated_through: vec![0; geometry.zone_count as usize],
            written_ends: vec![0; geometry.zone_count as usize],
            allocates_ahead,
            slots_checked_at_open,
            zones_lowered_at_open,
        };
        // A new epoch before anything is written in it, and the zones it
        // checked recorded as they are now. With
        // `host_sync`, one sync makes both, and every page the zones count
        // (a killed process leaves them in the host's cache only), durable.
        for &block in &completed_blocks {
            let offset = layout.block_table_offset + block * BLOCK_RECORD_BYTES;
            backend.write_at(&encode_block_record(block, &blocks[block as usize]), offset, "write block record")?;
        }
        if !completed_blocks.is_empty() && options.host_sync {
            // As at a reset: the blocks on the disk before the zone record.
            backend.sync()?;
        }
        for &zone in &rewritten {
            let stored = StoredZoneRecord {
                record: zones[zone as usize],
                synced_write_pointer: zones[zone as usize].write_pointer,
                epoch,
            };
            let offset = layout.zone_record_offset(zone);
            backend.write_at(&encode_zone_record(zone, &stored), offset, "write zone record")?;
        }
        backend.write_header(ImageHeader { epoch, ..backend.header.clone() })?;
        // Even without `host_sync`: the epoch must be on the disk before any
        // slot of this session is, or a host crash could hand it out again
        // to a later session, whose records would then count this one's
        // stale slots.
        backend.sync()?;
        // Open wrote and synced by itself, in order; from here on a command
        // returns before it has run (not in a scratch view).
        backend.settle()?;
        backend.writer.run_in_background().map_err(backend.io("start the image's writer thread"))?;
        let state = DurableState { zones, blocks, overlay, counters: header_counters, clock_ns, nvm };
        FlashEmulator::from_parts(geometry, options, backend, state)
    }
}

impl FlashEmulator<ImageBackend> {
    /// Lets `observer` see every write the image's file gets and every
    /// sync that returns, from now on.
    pub fn observe_host_writes(&mut self, observer: Box<dyn HostWriteObserver>) {
        self.backend_mut().observe_host_writes(observer);
    }

    /// Slots open read to find pages a host crash lost.
    pub fn slots_checked_at_open(&self) -> u64 {
        self.backend().slots_checked_at_open()
    }

    /// Whether the image still allocates host blocks ahead of its writes:
    /// not on a copy-on-write or memory file system, nor after an error or
    /// with the host disk low.
    pub fn allocates_ahead(&self) -> bool {
        self.backend().allocates_ahead()
    }

    /// Zones whose write pointer open lowered past pages a host crash lost.
    pub fn zones_lowered_at_open(&self) -> u32 {
        self.backend().zones_lowered_at_open()
    }

    /// [`ImageBackend::allocate_every_hole`]: zeros into every hole of the
    /// image, synced (`mkfs --preallocate`).
    pub fn allocate_every_hole(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        self.backend_mut().allocate_every_hole(progress)
    }
}

/// One process at a time: a second opener gets a clear error instead of two
/// emulators silently overwriting each other's state.
fn lock(path: &Path, file: &File) -> Result<()> {
    lock_as(path, file, false)
}

/// The image's lock, `shared` for a look (several may run at once, never
/// beside a mount or a repair, which take it exclusively).
fn lock_as(path: &Path, file: &File, shared: bool) -> Result<()> {
    let locked = if shared { file.try_lock_shared() } else { file.try_lock() };
    locked.map_err(|error| match error {
        std::fs::TryLockError::WouldBlock => image_error(path, "in use by another process"),
        std::fs::TryLockError::Error(source) => {
            DeviceError::Io { path: path.display().to_string(), operation: "lock", source }
        }
    })
}

impl Drop for ImageBackend {
    /// Slots still gathered go to the file, best effort: no record claims
    /// them yet, so a process killed before this loses nothing it promised.
    fn drop(&mut self) {
        let _ = self.write_pending();
        let _ = self.writer.settle();
    }
}

impl Backend for ImageBackend {
    fn read_page(&mut self, physical: u64, data: &mut [u8], oob: &mut [u8]) -> Result<()> {
        if let Some(slot) = self.pending_slot(physical) {
            data.copy_from_slice(&slot[..data.len()]);
            oob.copy_from_slice(&slot[data.len()..data.len() + oob.len()]);
            return Ok(());
        }
        let offset = self.page_offset(physical);
        self.read_at(data, offset, "read page")?;
        self.read_at(oob, offset + data.len() as u64, "read page OOB")
    }

    fn read_oob(&mut self, physical: u64, oob: &mut [u8]) -> Result<()> {
        if let Some(slot) = self.pending_slot(physical) {
            let start = self.header.geometry.page_size_bytes as usize;
            oob.copy_from_slice(&slot[start..start + oob.len()]);
            return Ok(());
        }
        let offset = self.page_offset(physical) + u64::from(self.header.geometry.page_size_bytes);
        self.read_at(oob, offset, "read OOB")
    }

    /// Gathers the slot with the ones before it when it follows them in
    /// the file (a run of pages drained from the write buffer), so a run
    /// costs one system call, not one a page: that was a quarter of the
    /// mount daemon's request handling while copying a tree onto it.
    fn write_page(&mut self, physical: u64, data: &[u8], oob: &[u8]) -> Result<()> {
        assert_eq!(
            (data.len() + oob.len()) as u64 + SLOT_TRAILER_BYTES,
            self.slot_bytes,
            "a page slot is its data, OOB and trailer"
        );
        // Before the slot is gathered, so a failed sync leaves nothing
        // gathered twice when the device tries the page again.
        if self.host_sync && self.unsynced_pages >= IMAGE_UNSYNCED_PAGES_MAX {
            self.sync()?;
        }
        let zone = (physical / self.header.geometry.zone_pages()) as usize;
        let trailer = slot_trailer_without_crc(physical, self.zone_generations[zone], self.header.epoch);
        let offset = self.page_offset(physical);
        let follows = offset == self.pending_offset + self.pending.len() as u64;
        if !self.pending.is_empty()
            && (!follows
                || self.pending.len() + self.slot_bytes as usize > PENDING_SLOTS_MAX * self.slot_bytes as usize)
        {
            self.write_pending()?;
        }
        if self.pending.is_empty() {
            self.pending_offset = offset;
        }
        self.pending.extend_from_slice(data);
        self.pending.extend_from_slice(oob);
        self.pending.extend_from_slice(&trailer);
        self.written_pages[zone] += 1;
        self.written_ends[zone] = self.written_ends[zone].max(offset + self.slot_bytes);
        self.unsynced_pages += 1;
        Ok(())
    }

    fn write_nvm(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        let position = self.header.layout.nvm_offset + offset;
        self.write_at(bytes, position, "write NVM")
    }

    fn write_zone_record(&mut self, zone: u32, record: &ZoneRecord) -> Result<()> {
        self.write_pending()?;
        let index = zone as usize;
        if record.generation != self.zone_generations[index] {
            // A reset whose block records did not come through here first
            // (none does today): its record comes before any page of the
            // new life.
            assert_eq!(record.write_pointer, 0, "zone {zone}: a new generation starts empty");
            self.begin_generation(zone, record.generation);
        }
        assert_eq!(
            record.write_pointer, self.written_pages[index],
            "zone {zone}: a record's write pointer is the pages written"
        );
        let stored = self.stored_record(zone, record);
        if stored.synced_write_pointer < record.write_pointer {
            self.floors_behind.insert(zone, *record);
        } else {
            self.floors_behind.remove(&zone);
        }
        let offset = self.header.layout.zone_record_offset(zone);
        self.write_at(&encode_zone_record(zone, &stored), offset, "write zone record")
    }

    fn finds_lost_pages_at_open(&self) -> bool {
        true
    }

    fn write_block_records(&mut self, first_block: u64, records: &[BlockRecord]) -> Result<()> {
        self.write_pending()?;
        let offset = self.header.layout.block_table_offset + first_block * BLOCK_RECORD_BYTES;
        let bytes: Vec<u8> = records
            .iter()
            .enumerate()
            .flat_map(|(index, record)| encode_block_record(first_block + index as u64, record))
            .collect();
        self.write_at(&bytes, offset, "write block records")?;
        // A reset's block records carry the zone's next generation, and
        // once written the reset has happened (open completes it): pages
        // from here on belong to the new life, even if the sync and the
        // zone record that follow fail and wait for a later commit.
        let zone_blocks = u64::from(self.header.geometry.zone_blocks);
        for (index, record) in records.iter().enumerate() {
            let zone = ((first_block + index as u64) / zone_blocks) as u32;
            if record.zone_generation != self.zone_generations[zone as usize] {
                self.begin_generation(zone, record.zone_generation);
            }
        }
        Ok(())
    }

    fn write_overlay(&mut self, overlay: &Overlay, generation_of: &dyn Fn(u64) -> u32) -> Result<()> {
        self.write_pending()?;
        // Into the inactive slot, then a header that points at it: a process
        // killed in between leaves the old overlay in force.
        let bytes = encode_overlay(overlay, generation_of);
        assert!(bytes.len() as u64 <= self.header.layout.overlay_slot_bytes, "overlay exceeds its slot");
        let slot = 1 - self.header.overlay_active_slot;
        let offset = self.header.layout.overlay_slot_offset + u64::from(slot) * self.header.layout.overlay_slot_bytes;
        self.write_at(&bytes, offset, "write overlay")?;
        if self.host_sync {
            self.sync()?;
        }
        let header = ImageHeader {
            overlay_active_slot: slot,
            overlay_entries: overlay.len() as u32,
            overlay_bytes: bytes.len() as u64,
            overlay_crc: crc32c::crc32c(&bytes),
            ..self.header.clone()
        };
        self.write_header(header)?;
        if self.host_sync {
            self.sync()?;
        }
        Ok(())
    }

    fn write_summary(&mut self, counters: &Counters, clock_ns: u64) -> Result<()> {
        self.write_pending()?;
        let header = ImageHeader { counters: *counters, clock_ns, ..self.header.clone() };
        self.write_header(header)
    }

    /// Queues an fdatasync: nothing queued after it is written before it
    /// has returned, so the pages before it are on the disk before any
    /// record written after it names them. Returns before it has run;
    /// [`Backend::settle`] waits.
    fn sync(&mut self) -> Result<()> {
        self.write_pending()?;
        self.refuse_after_failed_sync()?;
        self.writer.push(Command::Sync).map_err(self.failed())?;
        // Only where allocating ahead is on: a sync is on every fsync's
        // path, and the list walks every zone.
        let written_since: Vec<u32> = if self.allocates_ahead() {
            (0..self.written_pages.len() as u32)
                .filter(|&zone| self.written_pages[zone as usize] != self.synced_write_pointers[zone as usize])
                .collect()
        } else {
            Vec::new()
        };
        // Synced once the sync queued above has run, which is before any
        // record written from here on reaches the file.
        self.synced_write_pointers.copy_from_slice(&self.written_pages);
        self.unsynced_pages = 0;
        // Durable at the next sync; until then (or if a write fails here)
        // the record on the disk has the lower synced write pointer, which
        // only makes open check more slots.
        while let Some((zone, record)) = self.floors_behind.pop_first() {
            let offset = self.header.layout.zone_record_offset(zone);
            let bytes = encode_zone_record(zone, &self.stored_record(zone, &record));
            if self.write_at(&bytes, offset, "write zone record").is_err() {
                self.floors_behind.insert(zone, record);
                break;
            }
        }
        for zone in written_since {
            if self.allocate_ahead(zone).is_err() {
                break;
            }
        }
        Ok(())
    }

    fn settle(&mut self) -> Result<()> {
        self.write_pending()?;
        self.writer.settle().map_err(self.failed())
    }

    fn unsettled(&self) -> bool {
        !self.pending.is_empty() || self.writer.unsettled()
    }

    fn start(&mut self) {
        // Best effort: an error here is the queue's, which the next wait
        // reports.
        if self.write_pending().is_ok() {
            self.writer.start();
        }
    }
}
