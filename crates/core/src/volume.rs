//! The durable frame of a file system: mkfs, a clean mount from the newest
//! valid checkpoint, and writing checkpoints into two alternating zones.
//! Everything the engine keeps across a clean unmount goes through here.

use flintfs_flash::{FlashDevice, PageAddress, PageState, ZoneState, OOB_SIZE_BYTES_MIN};
use flintfs_format::{
    split_record, Checkpoint, Compression, DeviceShape, InvertedIndex, PageHeader, PageKind, RecordAssembler,
    RecordKind, Superblock, TreeRoots, ZoneRole, ZoneUsage, CHECKPOINT_ZONES, FIRST_DYNAMIC_ZONE, PAGE_HEADER_BYTES,
    RECORD_HEADER_BYTES, SUPERBLOCK_BYTES, SUPERBLOCK_ZONES,
};

use crate::error::{errno, Error, Result};
use crate::protect::{oob_fits, ParityLayout, Protected, ProtectionCounters};

const _: () = assert!(PAGE_HEADER_BYTES as u32 <= OOB_SIZE_BYTES_MIN, "the page header fits every device's OOB");

/// The roles that get a log head of their own (DESIGN: hot data, cold data,
/// node pages, metadata log).
pub const LOG_HEAD_ROLES: [ZoneRole; 4] = [ZoneRole::HotData, ZoneRole::ColdData, ZoneRole::Node, ZoneRole::Log];
/// Zones kept free so the cleaner always has somewhere to move live data.
pub const RESERVE_ZONES: u32 = 2;
/// Zones every space check keeps free on top of what the buffered work,
/// the operation and their checkpoint need (`Fs::checkpoint_fits`), for
/// failed programs. A failed program ends its zone's use (read-only until
/// the cleaner empties it) and its head goes on in a fresh zone, so each
/// failure between an operation's admission and the checkpoint that makes
/// it durable takes up to a zone that admission did not count. Without the
/// margin, a failure on a device filled to its last zone left no zone for
/// any checkpoint, and every change, unlink and fsync included, answered
/// ENOSPC until a remount (the full-device cut sweep on failing flash, seed
/// 405). One zone bounds one such failure; more than one in that window is
/// beyond the bound (docs/SEMANTICS.md).
pub const PROGRAM_FAILURE_MARGIN_ZONES: u32 = 1;
/// Open zones the layout needs at once: every log head, the checkpoint zone
/// being appended to, and the other one while a checkpoint switches zones.
pub const OPEN_ZONES_NEEDED: u32 = LOG_HEAD_ROLES.len() as u32 + 2;
/// The default k (unindexed segments per checkpoint).
pub const UNINDEXED_SEGMENTS_DEFAULT: u32 = 8;
/// Inode number of the root directory; allocation starts after it.
pub const ROOT_INO: u64 = 1;

/// Zones a file system with `unindexed_segments` needs at least.
pub fn zones_min(unindexed_segments: u32) -> u32 {
    // The margin too: without it, the smallest device admitted no change
    // past what the heads' zones hold.
    FIRST_DYNAMIC_ZONE + LOG_HEAD_ROLES.len() as u32 + unindexed_segments + RESERVE_ZONES + PROGRAM_FAILURE_MARGIN_ZONES
}

/// Choices made once, at mkfs. Time and randomness come from the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkfsOptions {
    pub unindexed_segments: u32,
    pub uuid: [u8; 16],
    pub created_ns: u64,
    /// k: parity pages at the end of each erase block (1 is XOR, more is
    /// Reed-Solomon); [`PARITY_DEFAULT`] picks the geometry's default.
    pub block_parity_pages: u32,
    /// r: Reed-Solomon parity blocks at the end of each zone;
    /// [`PARITY_DEFAULT`] picks the geometry's default.
    pub segment_parity_blocks: u32,
    pub compression: Compression,
}

impl MkfsOptions {
    /// Defaults for a device, with `uuid` and `created_ns` from the caller.
    pub fn new(uuid: [u8; 16], created_ns: u64) -> MkfsOptions {
        MkfsOptions {
            unindexed_segments: UNINDEXED_SEGMENTS_DEFAULT,
            uuid,
            created_ns,
            block_parity_pages: PARITY_DEFAULT,
            segment_parity_blocks: PARITY_DEFAULT,
            // Mounts compress with lz4 unless told otherwise: it costs
            // little host time and gives back what compresses.
            compression: Compression::Lz4,
        }
    }

    /// The parity layout these options give on `geometry`.
    pub fn parity_for(&self, geometry: &flintfs_flash::Geometry) -> ParityLayout {
        let block_parity_pages = if self.block_parity_pages == PARITY_DEFAULT {
            if geometry.block_pages >= BLOCK_PARITY_MIN_BLOCK_PAGES {
                BLOCK_PARITY_PAGES_DEFAULT
            } else {
                0
            }
        } else {
            self.block_parity_pages
        };
        let zone_parity_blocks = if self.segment_parity_blocks == PARITY_DEFAULT {
            if geometry.zone_blocks >= ZONE_PARITY_MIN_ZONE_BLOCKS {
                ZONE_PARITY_BLOCKS_DEFAULT
            } else {
                0
            }
        } else {
            self.segment_parity_blocks
        };
        ParityLayout { block_parity_pages, zone_parity_blocks }
    }
}

/// "The default for the geometry" in [`MkfsOptions`]' parity fields.
pub const PARITY_DEFAULT: u32 = u32::MAX;
/// One parity page per erase block (XOR): any one damaged page of a block
/// is rebuilt, whatever its bit count.
pub const BLOCK_PARITY_PAGES_DEFAULT: u32 = 1;
/// Blocks of fewer pages get no block parity by default: a parity page
/// would cost more than a quarter of the block.
pub const BLOCK_PARITY_MIN_BLOCK_PAGES: u32 = 4;
/// One Reed-Solomon block per zone: a block lost whole is rebuilt.
pub const ZONE_PARITY_BLOCKS_DEFAULT: u32 = 1;
/// Zones of fewer blocks get no zone parity by default (raw NAND's
/// one-block zones cannot hold it at all).
pub const ZONE_PARITY_MIN_ZONE_BLOCKS: u32 = 4;

const _: () = assert!(BLOCK_PARITY_PAGES_DEFAULT < BLOCK_PARITY_MIN_BLOCK_PAGES);
const _: () = assert!(ZONE_PARITY_BLOCKS_DEFAULT < ZONE_PARITY_MIN_ZONE_BLOCKS);

/// What a mount read and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountReport {
    /// Full page reads the mount did.
    pub pages_read: u64,
    pub checkpoint_number: u64,
    /// The checkpoint zone the newest valid checkpoint was found in.
    pub checkpoint_zone: u32,
    /// Records passed over because they were torn or failed their checks.
    pub records_rejected: u64,
    /// The newest sequence number found on any valid page the mount read.
    pub sequence_seen: Option<u64>,
    /// Pages the checkpoint's log heads recorded that the device does not
    /// hold. Always zero: a checkpoint is programmed only after everything
    /// before it was flushed. Anything else means the medium lost pages.
    pub head_pages_missing: u64,
    /// Zones whose finish a cut interrupted after their tail parity was
    /// on flash, finished by this mount.
    pub zones_finished_after_cut: u32,
    /// What recovery did, after an unclean stop.
    pub recovery: Option<crate::fs::RecoveryReport>,
}

impl MountReport {
    fn saw(&mut self, header: &PageHeader) {
        self.sequence_seen = Some(self.sequence_seen.map_or(header.sequence, |seen| seen.max(header.sequence)));
    }
}

/// A mounted file system's durable frame over its device.
pub struct Volume<D: FlashDevice> {
    /// The device behind the protection layer, which seals what is
    /// programmed and corrects what is read.
    pub(crate) device: Protected<D>,
    pub(crate) superblock: Superblock,
    /// The live state: the last checkpoint plus what happened since (heads,
    /// sequence, allocations); written as the next checkpoint.
    pub(crate) checkpoint: Checkpoint,
    /// The checkpoint zone that holds the newest checkpoint, where the next
    /// one goes if it fits.
    checkpoint_zone: u32,
    /// How many zones of the declared unindexed list have been taken.
    pub(crate) unindexed_used: usize,
    /// Pages found at mount that were written after the checkpoint (an
    /// unclean stop): `(zone, first page, end page)`. Until recovery
    /// reconnects them they are orphans, and torn ones are expected.
    pub(crate) orphans: Vec<(u32, u32, u32)>,
    /// Zones taken outside the declared list since the last checkpoint.
    pub(crate) undeclared_zones_taken: u64,
    /// The declared zones not yet taken, as `erase_ahead` last found them
    /// all erased: until a zone is taken (which clears this) nothing
    /// writes them, since only a head writes a zone and only after taking
    /// it, so the next operations need not ask the device again while the
    /// list left is this one. Empty when not known.
    pub(crate) erased_ahead: Vec<u32>,
    /// Whether allocation may dip into the cleaner's reserve: set for work
    /// that frees space (unlink, rmdir, checkpoints), so a full device can
    /// still be emptied.
    pub(crate) reserve_allowed: bool,
    /// Set by unmount: the next checkpoint record ends at an erase block's
    /// end (filler pages before it), so its block's parity is on flash.
    pub(crate) align_checkpoint: bool,
    /// Set around a checkpoint no caller waits on (one an operation takes
    /// for room, or the cleaner's): its flushes only order
    /// ([`FlashDevice::flush_ordered`]), and the device is left owing a
    /// flush, which the next fsync or sync pays.
    pub(crate) checkpoint_ordered: bool,
    /// Set by unmount: the next checkpoint declares empty zones before
    /// zones holding pages of an earlier use. Mount reads the first page of
    /// each declared zone that holds pages, to learn whether they were
    /// written since the checkpoint; an empty one costs no read.
    pub(crate) declare_empty_first: bool,
    /// The sum of every zone's valid bytes in `checkpoint`, kept as they
    /// change so that statfs and the capacity check before each write do
    /// not add up every zone (`Volume::valid_bytes_total`).
    /// Wide enough never to overflow, so it stays the exact sum even of a
    /// damaged table's counts.
    valid_bytes_total: u128,
}

/// The exact sum of a usage table's valid bytes.
fn valid_bytes_sum(checkpoint: &Checkpoint) -> u128 {
    checkpoint.zones.iter().map(|usage| u128::from(usage.valid_bytes)).sum()
}

fn shape_of(device: &impl FlashDevice) -> DeviceShape {
    let geometry = device.geometry();
    DeviceShape {
        page_size_bytes: geometry.page_size_bytes,
        oob_size_bytes: geometry.oob_size_bytes,
        block_pages: geometry.block_pages,
        zone_blocks: geometry.zone_blocks,
        zone_count: geometry.zone_count,
        nvm_size_bytes: geometry.nvm_size_bytes,
    }
}

/// Pages a checkpoint record of `zone_count` zones and `unindexed` segments
/// takes, with every log head open.
fn checkpoint_pages(geometry: &flintfs_flash::Geometry, unindexed: u32) -> u64 {
    let page_size = geometry.page_size_bytes as usize;
    let map_pages = crate::fs::map_page_count(slots_max(geometry), page_size);
    let map_directory_pages = crate::fs::map_directory_page_count(map_pages, page_size);
    let payload = Checkpoint::encoded_bytes(
        geometry.zone_count as usize,
        unindexed as usize,
        LOG_HEAD_ROLES.len(),
        map_directory_pages as usize,
        flintfs_format::orphans_max(geometry.page_size_bytes as usize),
    );
    checkpoint_record_page_count(payload, geometry.page_size_bytes) as u64
}

/// Most slots the map holds on this geometry: every node a slot names
/// takes at least an inode record, so the device cannot hold more. It
/// bounds the checkpoint, which carries a pointer per map directory page.
pub fn slots_max(geometry: &flintfs_flash::Geometry) -> u32 {
    let record_bytes_min = (flintfs_format::INODE_RECORD_HEADER_BYTES
        + flintfs_format::INODE_FIXED_BYTES
        + flintfs_format::INDEX_IN_INODE_BYTES) as u64;
    let per_page = u64::from(geometry.page_size_bytes) / record_bytes_min;
    let dynamic_pages = u64::from(geometry.zone_count.saturating_sub(FIRST_DYNAMIC_ZONE)) * geometry.zone_pages();
    (dynamic_pages * per_page).min(u64::from(flintfs_format::SLOT_NONE - 1)) as u32
}

/// Programs one page with its header.
pub(crate) fn program<D: FlashDevice>(
    device: &mut D,
    address: PageAddress,
    header: &PageHeader,
    data: &[u8],
) -> Result<()> {
    let geometry = device.geometry();
    let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
    oob[..PAGE_HEADER_BYTES].copy_from_slice(&header.encode(data));
    device.program_page(address, data, &oob)?;
    Ok(())
}

/// Spare areas up to this many bytes are read onto the stack by
/// [`read_verified`]; a larger one (the emulator accepts up to a quarter
/// of the largest page, and `mkfs --oob-size` any of those) is allocated.
const OOB_ON_STACK_BYTES_MAX: usize = 1024;
// The default geometry's spare area is read on the stack.
const _: () = assert!(OOB_ON_STACK_BYTES_MAX >= 128);

/// Reads a page and checks its header, address and zone generation.
pub(crate) fn read_verified<D: FlashDevice>(
    device: &mut Protected<D>,
    address: PageAddress,
    zone_generation: Option<u32>,
    pages_read: &mut u64,
) -> Result<(PageHeader, Vec<u8>)> {
    read_verified_into(device, address, zone_generation, pages_read, Vec::new())
}

/// [`read_verified`] into `data`, a buffer to reuse (a page's length
/// already costs no zeroing). Whatever it held is overwritten: a read
/// fills the whole page, and the CRC the header is decoded with covers
/// every byte, so a stale byte left by a device that did not would be
/// refused as damage, never returned.
pub(crate) fn read_verified_into<D: FlashDevice>(
    device: &mut Protected<D>,
    address: PageAddress,
    zone_generation: Option<u32>,
    pages_read: &mut u64,
    mut data: Vec<u8>,
) -> Result<(PageHeader, Vec<u8>)> {
    let geometry = device.geometry();
    data.resize(geometry.page_size_bytes as usize, 0);
    // The spare area is only looked at here: on the stack when it fits,
    // so that a page read allocates only its data.
    let mut oob_inline = [0u8; OOB_ON_STACK_BYTES_MAX];
    let mut oob_heap = Vec::new();
    let oob_bytes = geometry.oob_size_bytes as usize;
    let oob: &mut [u8] = if oob_bytes <= OOB_ON_STACK_BYTES_MAX {
        &mut oob_inline[..oob_bytes]
    } else {
        oob_heap.resize(oob_bytes, 0);
        &mut oob_heap
    };
    *pages_read += 1;
    // The protection layer below has already corrected what it could and
    // read again where that helps: what fails here is damage. It hands
    // up the header when it decoded it on the way, so that the page's
    // bytes do not go through the CRC a second time.
    let header = match device.read_page_decoded(address, &mut data, oob) {
        Ok((PageState::Erased, _)) => return Err(Error::corrupt(format!("{address} is erased"))),
        Ok((PageState::Programmed, Some(header))) => header,
        Ok((PageState::Programmed, None)) => {
            PageHeader::decode(oob, &data).map_err(|error| Error::corrupt(format!("{address}: {error}")))?
        }
        Err(error) => return Err(error.into()),
    };
    let generation = zone_generation.unwrap_or(header.zone_generation);
    header
        .check_location(address.zone, address.page, generation)
        .map_err(|error| Error::corrupt(format!("{address}: {error}")))?;
    Ok((header, data))
}

/// Formats `device`: erases every zone that holds anything, writes the
/// superblock to both superblock zones and a first checkpoint. Refuses a
/// device too small for the layout, saying how small is too small.
pub fn mkfs<D: FlashDevice>(device: &mut D, options: &MkfsOptions) -> Result<()> {
    let geometry = device.geometry();
    if !oob_fits(&geometry) {
        return Err(Error::invalid(format!(
            "a {}-byte spare area cannot hold a page's header and signature: flintfs needs at least {} bytes",
            geometry.oob_size_bytes,
            flintfs_format::protection::OOB_BYTES_MIN
        )));
    }
    let parity = options.parity_for(&geometry);
    let mut device = Protected::new(device);
    let device = &mut device;
    let shape = shape_of(device);
    let needed = zones_min(options.unindexed_segments);
    if geometry.zone_count < needed {
        return Err(Error::new(
            errno::ENOSPC,
            format!(
                "device of {} zones ({} KiB) is too small: flintfs with {} unindexed segments needs at least {needed} \
                 zones ({} KiB)",
                geometry.zone_count,
                geometry.device_size_bytes() / 1024,
                options.unindexed_segments,
                u64::from(needed) * geometry.zone_size_bytes() / 1024
            ),
        ));
    }
    let superblock = Superblock {
        shape,
        uuid: options.uuid,
        created_ns: options.created_ns,
        unindexed_segments: options.unindexed_segments,
        block_parity_pages: parity.block_parity_pages,
        segment_parity_blocks: parity.zone_parity_blocks,
        compression: options.compression,
    };
    superblock.validate().map_err(|reason| Error::invalid(format!("mkfs options: {reason}")))?;
    device.set_parity(parity).map_err(|reason| Error::invalid(format!("mkfs options: {reason}")))?;
    if geometry.open_zones_max < OPEN_ZONES_NEEDED {
        return Err(Error::invalid(format!(
            "the device allows {} open zones; flintfs keeps up to {OPEN_ZONES_NEEDED} open (a zone per log head and \
             two checkpoint zones)",
            geometry.open_zones_max
        )));
    }
    let reports = device.report_zones();
    for zone in SUPERBLOCK_ZONES.iter().chain(&CHECKPOINT_ZONES) {
        let capacity = reports[*zone as usize].capacity_pages;
        let record_pages = checkpoint_pages(&geometry, options.unindexed_segments);
        if u64::from(capacity) < 2 * record_pages.max(1) {
            return Err(Error::new(
                errno::ENOSPC,
                format!(
                    "zone {zone} holds {capacity} good pages; its fixed role needs at least {} (bad blocks, or a zone \
                     too small for a checkpoint of {} zones)",
                    2 * record_pages.max(1),
                    geometry.zone_count
                ),
            ));
        }
    }
    for report in &reports {
        if report.state != ZoneState::Offline && (report.write_pointer > 0 || report.state != ZoneState::Empty) {
            device.reset_zone(report.zone)?;
        }
    }
    let mut sequence = 0u64;
    let mut data = vec![0u8; geometry.page_size_bytes as usize];
    data[..SUPERBLOCK_BYTES].copy_from_slice(&superblock.encode());
    for zone in SUPERBLOCK_ZONES {
        let header = PageHeader {
            kind: PageKind::Superblock,
            end_of_record: false,
            zone_generation: 0,
            sequence,
            zone,
            page: 0,
            inverted: InvertedIndex::default(),
            length: SUPERBLOCK_BYTES as u32,
            count: 0,
        };
        program(device, PageAddress::new(zone, 0), &header, &data)?;
        // Never written again: finished, so it does not count as open.
        device.finish_zone(zone)?;
        sequence += 1;
    }
    let mut zones: Vec<ZoneUsage> = (0..geometry.zone_count)
        .map(|_| ZoneUsage { role: ZoneRole::Free, generation: 0, valid_bytes: 0, last_sequence: 0 })
        .collect();
    for zone in SUPERBLOCK_ZONES {
        zones[zone as usize].role = ZoneRole::Superblock;
    }
    for zone in CHECKPOINT_ZONES {
        zones[zone as usize].role = ZoneRole::Checkpoint;
    }
    let unindexed: Vec<u32> = reports
        .iter()
        .filter(|report| report.zone >= FIRST_DYNAMIC_ZONE && report.capacity_pages > 0)
        .map(|report| report.zone)
        .take(options.unindexed_segments as usize)
        .collect();
    if unindexed.len() < options.unindexed_segments as usize {
        return Err(Error::new(errno::ENOSPC, "too few usable zones for the unindexed segments"));
    }
    let mut checkpoint = Checkpoint {
        number: 1,
        sequence_next: sequence,
        ino_next: ROOT_INO + 1,
        zones,
        unindexed,
        heads: Vec::new(),
        tree: TreeRoots::default(),
    };
    // The record's own pages take the next sequence numbers.
    checkpoint.sequence_next +=
        checkpoint_record_page_count(checkpoint.encode().len(), geometry.page_size_bytes) as u64;
    write_checkpoint_record(device, &checkpoint, CHECKPOINT_ZONES[0], 0)?;
    device.flush()?;
    Ok(())
}

/// Programs `checkpoint` as a record at `zone`/`write_pointer`; its
/// `sequence_next` must already count the record's own pages.
fn write_checkpoint_record<D: FlashDevice>(
    device: &mut D,
    checkpoint: &Checkpoint,
    zone: u32,
    write_pointer: u32,
) -> Result<()> {
    let geometry = device.geometry();
    let payload = checkpoint.encode();
    let page_count = checkpoint_record_page_count(payload.len(), geometry.page_size_bytes);
    let first_sequence = checkpoint.sequence_next - page_count as u64;
    let pages = split_record(RecordKind::Checkpoint, &payload, first_sequence, geometry.page_size_bytes as usize);
    assert_eq!(pages.len(), page_count);
    let generation = checkpoint.zones[zone as usize].generation;
    for page in &pages {
        let header = PageHeader {
            kind: PageKind::Checkpoint,
            end_of_record: page.end_of_record,
            zone_generation: generation,
            sequence: first_sequence + u64::from(page.index),
            zone,
            page: write_pointer + page.index,
            inverted: InvertedIndex::default(),
            length: page.length,
            count: page.index,
        };
        program(device, PageAddress::new(zone, write_pointer + page.index), &header, &page.data)?;
    }
    Ok(())
}

fn checkpoint_record_page_count(payload_bytes: usize, page_size_bytes: u32) -> usize {
    (RECORD_HEADER_BYTES + payload_bytes).div_ceil(page_size_bytes as usize)
}

/// The last page at or below `*cursor - 1` of checkpoint zone `zone` that
/// ends a record, walking back over anything torn or damaged; `*cursor`
/// is left at that page.
fn last_record_end<D: FlashDevice>(
    device: &mut Protected<D>,
    zone: u32,
    cursor: &mut u32,
    report: &mut MountReport,
) -> Option<(u32, PageHeader, Vec<u8>)> {
    while *cursor > 0 {
        let end = *cursor - 1;
        *cursor = end;
        let Ok((header, data)) = read_verified(device, PageAddress::new(zone, end), None, &mut report.pages_read)
        else {
            continue;
        };
        report.saw(&header);
        if header.kind == PageKind::Checkpoint && header.end_of_record && header.count <= end {
            return Some((end, header, data));
        }
    }
    None
}

/// The checkpoint whose record ends at page `end` of `zone` (its last
/// page already read), if the record is whole, decodable and
/// self-consistent; otherwise the page it starts at, from where the walk
/// back goes on.
fn record_ending_at<D: FlashDevice>(
    device: &mut Protected<D>,
    zone: u32,
    (end, header, data): (u32, PageHeader, Vec<u8>),
    report: &mut MountReport,
) -> std::result::Result<Checkpoint, u32> {
    let start = end - header.count;
    let mut assembler = RecordAssembler::new(RecordKind::Checkpoint);
    let mut generation = header.zone_generation;
    // The pages before the last one, then the last one, as it was read.
    let before = (start..end).try_for_each(|page| {
        let (page_header, page_data) =
            read_verified(device, PageAddress::new(zone, page), Some(generation), &mut report.pages_read).ok()?;
        generation = page_header.zone_generation;
        assembler.push(&page_header, &page_data).ok().map(|_| ())
    });
    let whole = before.and_then(|()| assembler.push(&header, &data).ok().flatten());
    let checkpoint = whole.and_then(|(_, payload)| Checkpoint::decode(&payload).ok()).filter(|checkpoint| {
        // Self-consistent: its pages carry the generation its own table
        // gives the zone it sits in, and the table covers the device.
        checkpoint.zones.len() == device.geometry().zone_count as usize
            && checkpoint.zones[zone as usize].generation == header.zone_generation
            && checkpoint.zones[zone as usize].role == ZoneRole::Checkpoint
    });
    checkpoint.ok_or_else(|| {
        report.records_rejected += 1;
        start
    })
}

/// The newest whole, self-consistent checkpoint record of the two
/// checkpoint zones, and its zone. Only the last page of each zone is read
/// to choose: sequences rise over every page programmed, so the record
/// whose last page has the higher sequence is the later one (the higher
/// checkpoint number, or of two with one number, the one written after the
/// other was lost to a cut). Only that record is read whole; if it fails,
/// its zone walks back to its previous record and the choice is made
/// again.
fn newest_checkpoint<D: FlashDevice>(
    device: &mut Protected<D>,
    write_pointers: [u32; 2],
    report: &mut MountReport,
) -> Option<(Checkpoint, u32)> {
    let mut cursors = write_pointers;
    let mut ends: [Option<(u32, PageHeader, Vec<u8>)>; 2] = [None, None];
    loop {
        for (index, &zone) in CHECKPOINT_ZONES.iter().enumerate() {
            if ends[index].is_none() {
                ends[index] = last_record_end(device, zone, &mut cursors[index], report);
            }
        }
        let index = (0..ends.len())
            .filter_map(|index| ends[index].as_ref().map(|(_, header, _)| (header.sequence, index)))
            .max()?
            .1;
        let end = ends[index].take().expect("chosen among the zones with a record end");
        match record_ending_at(device, CHECKPOINT_ZONES[index], end, report) {
            Ok(checkpoint) => return Some((checkpoint, CHECKPOINT_ZONES[index])),
            Err(start) => cursors[index] = start,
        }
    }
}

impl<D: FlashDevice> Volume<D> {
    /// Mounts after a clean unmount: reads the superblock, finds the newest
    /// valid checkpoint at the end of the two checkpoint zones, and nothing
    /// whose count grows with the number of files.
    pub fn mount(device: D) -> Result<(Volume<D>, MountReport)> {
        Volume::mount_correcting(device, crate::protect::Correction::ALL)
    }

    /// [`Volume::mount`] with only some correction layers on reads.
    pub fn mount_correcting(device: D, correction: crate::protect::Correction) -> Result<(Volume<D>, MountReport)> {
        Volume::mount_with(device, correction, false)
    }

    /// [`Volume::mount`] with `correction`'s layers, and with `read_only`
    /// every write refused from the first read on (`Protected::set_read_only`):
    /// a zone parity a power cut left owed then stays owed, and a finish a
    /// cut cut short is an EROFS error, not completed.
    pub fn mount_with(
        device: D,
        correction: crate::protect::Correction,
        read_only: bool,
    ) -> Result<(Volume<D>, MountReport)> {
        let geometry = device.geometry();
        if !oob_fits(&geometry) {
            return Err(Error::corrupt(format!(
                "a {}-byte spare area cannot hold a page's header and signature (at least {}): not a flintfs of this \
                 version",
                geometry.oob_size_bytes,
                flintfs_format::protection::OOB_BYTES_MIN
            )));
        }
        let mut device = Protected::new(device);
        device.set_correction(correction);
        if read_only {
            device.set_read_only();
        }
        let mut report = MountReport::default();
        let mut superblock = None;
        let mut reasons = Vec::new();
        for zone in SUPERBLOCK_ZONES {
            match read_verified(&mut device, PageAddress::new(zone, 0), Some(0), &mut report.pages_read) {
                Ok((header, data)) if header.kind == PageKind::Superblock => match Superblock::decode(&data) {
                    Ok(decoded) => {
                        superblock = Some(decoded);
                        break;
                    }
                    Err(error) => reasons.push(format!("zone {zone}: {error}")),
                },
                Ok((header, _)) => reasons.push(format!("zone {zone}: a {:?} page, not a superblock", header.kind)),
                Err(error) => reasons.push(format!("zone {zone}: {error}")),
            }
        }
        let superblock =
            superblock.ok_or_else(|| Error::corrupt(format!("no valid superblock: {}", reasons.join("; "))))?;
        if superblock.shape != shape_of(&device) {
            return Err(Error::invalid(format!(
                "the file system was made for {:?}, the device is {:?}",
                superblock.shape,
                shape_of(&device)
            )));
        }
        // From here on every zone but the superblock's reads through its
        // parity layout.
        device
            .set_parity(ParityLayout {
                block_parity_pages: superblock.block_parity_pages,
                zone_parity_blocks: superblock.segment_parity_blocks,
            })
            .map_err(|reason| Error::corrupt(format!("the superblock's parity layout: {reason}")))?;
        // The open stripes' running parity in NVM, before any zone is
        // read: a page of a block left part written is rebuilt from it.
        device.open_nvm_stripes(superblock.uuid)?;
        // A finish a cut interrupted is completed before any zone is read
        // (see `Protected::complete_interrupted_finishes`).
        report.zones_finished_after_cut = device.complete_interrupted_finishes()?;
        let write_pointers = [
            device.report_zone(CHECKPOINT_ZONES[0])?.write_pointer,
            device.report_zone(CHECKPOINT_ZONES[1])?.write_pointer,
        ];
        let newest = newest_checkpoint(&mut device, write_pointers, &mut report);
        let (mut checkpoint, checkpoint_zone) =
            newest.ok_or_else(|| Error::corrupt("no valid checkpoint in either checkpoint zone"))?;
        report.checkpoint_number = checkpoint.number;
        report.checkpoint_zone = checkpoint_zone;
        // Pages written after this checkpoint (an unclean stop) can only be
        // in the heads' zones past their recorded write pointers, and in the
        // declared unindexed zones. Resume each head at its zone's write
        // pointer, and take sequence numbers past the newest valid page
        // there (walking back over a torn last page), so sequences stay
        // strictly increasing. After a clean unmount nothing was written
        // since, and this reads nothing.
        let mut written_since: Vec<(u32, u32)> =
            checkpoint.heads.iter().map(|head| (head.zone, head.write_pointer)).collect();
        written_since.extend(checkpoint.unindexed.iter().map(|&zone| (zone, 0)));
        let mut orphans = Vec::new();
        let sequence_at_checkpoint = checkpoint.sequence_next;
        for (zone, recorded) in written_since {
            let write_pointer = device.report_zone(zone)?.write_pointer;
            let in_head = checkpoint.heads.iter().any(|head| head.zone == zone);
            if write_pointer > recorded && !in_head {
                // A declared zone is taken (and reset) before it is written,
                // but a zone freed by the checkpoint keeps its old pages
                // until then: only pages numbered after the checkpoint were
                // written since.
                let first = read_verified(&mut device, PageAddress::new(zone, 0), None, &mut report.pages_read);
                if matches!(first, Ok((header, _)) if header.sequence < sequence_at_checkpoint) {
                    continue;
                }
            }
            if write_pointer > recorded {
                orphans.push((zone, recorded, write_pointer));
            }
            if let Some(head) = checkpoint.heads.iter_mut().find(|head| head.zone == zone) {
                report.head_pages_missing += u64::from(head.write_pointer.saturating_sub(write_pointer));
                head.write_pointer = write_pointer;
            }
            for page in (recorded..write_pointer).rev() {
                if let Ok((header, _)) =
                    read_verified(&mut device, PageAddress::new(zone, page), None, &mut report.pages_read)
                {
                    report.saw(&header);
                    break;
                }
            }
        }
        if let Some(seen) = report.sequence_seen {
            checkpoint.sequence_next = checkpoint.sequence_next.max(seen + 1);
        }
        if !orphans.is_empty() {
            // An unclean stop may have written zones outside the declared
            // list (when one operation outran it), which mount does not
            // read. A run programs each zone at most once between two
            // checkpoints (a zone is reset only when taken, and freed only
            // by a checkpoint), so it spent fewer sequences than twice the
            // device's pages: numbering from past that keeps every new page
            // after every page of the crashed run, so none of those can
            // pass for one written since the next checkpoint.
            let device_pages = u64::from(device.geometry().zone_count) * device.geometry().zone_pages();
            checkpoint.sequence_next = checkpoint.sequence_next.max(sequence_at_checkpoint + 2 * device_pages);
        }
        let mut volume = Volume {
            device,
            superblock,
            checkpoint,
            checkpoint_zone,
            unindexed_used: 0,
            orphans,
            undeclared_zones_taken: 0,
            erased_ahead: Vec::new(),
            reserve_allowed: false,
            align_checkpoint: false,
            checkpoint_ordered: false,
            declare_empty_first: false,
            valid_bytes_total: 0,
        };
        volume.recount_valid_bytes();
        Ok((volume, report))
    }

    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// The state as of the last checkpoint written or mounted.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn device(&self) -> &D {
        self.device.inner()
    }

    pub fn device_mut(&mut self) -> &mut D {
        self.device.inner_mut()
    }

    pub fn into_device(self) -> D {
        self.device.into_inner()
    }

    /// What the protection layer corrected and repaired since the mount.
    pub fn protection_counters(&self) -> ProtectionCounters {
        self.device.protection_counters()
    }

    /// Bytes referenced in every zone together: what the usage table sums
    /// to, kept as it changes. Checked against the sum in debug builds.
    pub fn valid_bytes_total(&self) -> u64 {
        debug_assert_eq!(self.valid_bytes_total, valid_bytes_sum(&self.checkpoint), "the running total drifted");
        u64::try_from(self.valid_bytes_total).unwrap_or(u64::MAX)
    }

    /// Sets `zone`'s valid bytes, keeping the total.
    pub(crate) fn set_valid_bytes(&mut self, zone: u32, bytes: u64) {
        let Some(usage) = self.checkpoint.zones.get_mut(zone as usize) else { return };
        let before = std::mem::replace(&mut usage.valid_bytes, bytes);
        self.valid_bytes_total = self.valid_bytes_total - u128::from(before) + u128::from(bytes);
    }

    /// Counts the total afresh, after the table was replaced whole.
    pub(crate) fn recount_valid_bytes(&mut self) {
        self.valid_bytes_total = valid_bytes_sum(&self.checkpoint);
    }

    /// The open-stripe window's bound (`Protected::unprotected_pages_bound`).
    pub fn unprotected_pages_bound(&self) -> Option<u64> {
        self.device.unprotected_pages_bound()
    }

    /// Counts an inode created; returns the count before. The checkpoint
    /// keeps it (`ino_next`) as a lifetime statistic: inode numbers
    /// themselves are slots of the map.
    pub fn count_inode_created(&mut self) -> u64 {
        let count = self.checkpoint.ino_next;
        self.checkpoint.ino_next = count.saturating_add(1);
        count
    }

    /// Writes the current state as the next checkpoint. Everything programmed
    /// before is flushed first, so the record can never be durable ahead of
    /// the pages it describes; then the record, then a flush. When the
    /// current checkpoint zone cannot take the record, the other one is
    /// reset (it holds only older checkpoints) and the record goes there.
    /// The previous checkpoint stays valid until this one is whole and
    /// durable.
    pub fn write_checkpoint(&mut self) -> Result<u64> {
        let geometry = self.device.geometry();
        // Order is all this one owes: the flush after the record makes it
        // durable, and everything before with it.
        self.device.flush_ordered()?;
        let mut next = self.checkpoint.clone();
        next.number += 1;
        // A zone nothing references any more is free from this checkpoint
        // on: only once the record is durable can it be declared, reset and
        // reused, and the previous checkpoint never sees it reused.
        for (zone, usage) in next.zones.iter_mut().enumerate().skip(FIRST_DYNAMIC_ZONE as usize) {
            let in_head = next.heads.iter().any(|head| head.zone == zone as u32);
            if usage.role.is_log_head() && usage.valid_bytes == 0 && !in_head {
                usage.role = ZoneRole::Free;
            }
        }
        self.declare_unindexed(&mut next)?;
        let page_count = checkpoint_record_page_count(next.encode().len(), geometry.page_size_bytes) as u32;
        // A program that fails leaves its zone read-only, with the record
        // (or its fillers) cut short: the record goes again, whole, to the
        // other checkpoint zone, as when this one is full. The previous
        // record stays where it was, whole and durable, until then.
        let mut attempt = 0;
        let zone = loop {
            attempt += 1;
            let mut tried = self.checkpoint_zone;
            match self.place_checkpoint_record(&mut next, page_count, &mut tried) {
                Ok(zone) => break zone,
                Err(error)
                    if attempt < crate::allocator::PROGRAM_ATTEMPTS
                        && self.device.report_zone(tried).is_ok_and(|report| report.state == ZoneState::ReadOnly) =>
                {
                    tracing::warn!(
                        attempt,
                        "a checkpoint record's program failed, so it goes to the other zone: {error}"
                    );
                }
                Err(error) => return Err(error),
            }
        };
        if self.checkpoint_ordered {
            self.device.flush_ordered()?;
        } else {
            self.device.flush()?;
        }
        self.checkpoint = next;
        self.recount_valid_bytes();
        self.checkpoint_zone = zone;
        self.unindexed_used = 0;
        self.undeclared_zones_taken = 0;
        Ok(self.checkpoint.number)
    }

    /// Programs `next` (of `page_count` pages) in the current checkpoint
    /// zone, or, when that zone cannot take it, in the other one, reset
    /// first (it holds only older checkpoints); returns the zone. `tried`
    /// is the zone it programs in, for the caller to look at on an error.
    fn place_checkpoint_record(
        &mut self,
        next: &mut flintfs_format::Checkpoint,
        page_count: u32,
        tried: &mut u32,
    ) -> Result<u32> {
        let geometry = self.device.geometry();
        // Where the record goes comes from the device, not from memory: a
        // failed attempt may have programmed pages.
        let mut zone = self.checkpoint_zone;
        let report = self.device.report_zone(zone)?;
        let writable = matches!(report.state, ZoneState::Empty | ZoneState::Open | ZoneState::Closed);
        let mut write_pointer = report.write_pointer;
        if !writable || write_pointer + page_count > report.capacity_pages {
            if matches!(report.state, ZoneState::Open | ZoneState::Closed) {
                self.device.finish_zone(zone)?;
            }
            zone = if zone == CHECKPOINT_ZONES[0] { CHECKPOINT_ZONES[1] } else { CHECKPOINT_ZONES[0] };
            *tried = zone;
            self.device.reset_zone(zone)?;
            let usage = &mut next.zones[zone as usize];
            usage.generation = usage.generation.wrapping_add(1);
            write_pointer = 0;
        }
        // At unmount the record ends at a block's end, so the block's parity
        // follows it at once: fillers before it take up the difference.
        let slots = geometry.block_pages;
        let capacity = self.device.report_zone(zone)?.capacity_pages;
        if write_pointer + page_count > capacity {
            // Both fixed zones worn past holding one record: no checkpoint
            // can be committed. The newest record stays where it was.
            return Err(Error::new(
                errno::EROFS,
                format!(
                    "no checkpoint zone can take a record of {page_count} pages: zone {zone} holds {capacity} pages \
                     after its reset, and zone {} cannot take it either",
                    self.checkpoint_zone
                ),
            ));
        }
        let fillers = if self.align_checkpoint { (slots - (write_pointer + page_count) % slots) % slots } else { 0 };
        let fillers = if write_pointer + fillers + page_count <= capacity { fillers } else { 0 };
        let generation = next.zones[zone as usize].generation;
        let empty = vec![0u8; geometry.page_size_bytes as usize];
        for index in 0..fillers {
            // Spent before it is programmed, as the record's are below.
            let sequence = next.sequence_next;
            next.sequence_next += 1;
            self.checkpoint.sequence_next = next.sequence_next;
            let header = PageHeader {
                kind: PageKind::Filler,
                end_of_record: false,
                zone_generation: generation,
                sequence,
                zone,
                page: write_pointer + index,
                inverted: InvertedIndex::default(),
                length: 0,
                count: 0,
            };
            program(&mut self.device, PageAddress::new(zone, write_pointer + index), &header, &empty)?;
        }
        let write_pointer = write_pointer + fillers;
        // The record's sequences are spent before it is programmed, so a
        // failure part way never lets a later page reuse one.
        next.sequence_next += u64::from(page_count);
        self.checkpoint.sequence_next = next.sequence_next;
        write_checkpoint_record(&mut self.device, next, zone, write_pointer)?;
        Ok(zone)
    }
}
