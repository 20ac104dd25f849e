//! The layout of the byte-addressable NVM region (FSMAC), when the device
//! has one: a header, the metadata log as a ring of frames, the records
//! of the open stripes' running parity, then the node slots.
//!
//! NVM is written in place and made durable with a persist barrier; a
//! power cut keeps or drops each unpersisted 8-byte word on its own. So a
//! frame is written, persisted, and only then committed by its 8-byte
//! commit word, itself persisted: a commit word that matches proves every
//! word of its frame was persisted before it. The commit word is a
//! function of the frame's checksum, its epoch and its number, so a stale
//! word left from an earlier epoch at the same offset matches nothing
//! written since (but by a 2^-64 chance).
//!
//! Each epoch (the number of the checkpoint the log follows) starts its
//! frames at a ring offset that moves with the epoch, so the words at the
//! start of the log are not rewritten by every checkpoint (NVM wear).

use crate::codec::{Reader, Writer};
use crate::{DecodeError, FORMAT_VERSION};

/// "FLNTNVM\0": the header's first eight bytes.
pub const NVM_MAGIC: u64 = u64::from_le_bytes(*b"FLNTNVM\0");
/// Bytes of the header at offset 0.
pub const NVM_HEADER_BYTES: usize = 64;
/// Where the log ring starts: the header's page is left to it alone.
pub const NVM_LOG_OFFSET_BYTES: u64 = 4096;
/// The smallest NVM region flintfs uses: a header and a 12 KiB ring. A
/// batch too big for the ring is made durable by a checkpoint instead, so
/// a small ring costs flash writes, never an error.
pub const NVM_SIZE_BYTES_MIN: u64 = 16 << 10;
/// The log ring takes a quarter of the region, but at least this much (a
/// region of 16 KiB is all ring).
pub const NVM_LOG_BYTES_SMALL: u64 = 12 << 10;
/// A frame's header: the payload's length and CRC-32C.
pub const NVM_FRAME_HEADER_BYTES: u64 = 8;
/// The commit word after each frame's padded payload.
pub const NVM_COMMIT_BYTES: u64 = 8;
/// Epochs start this many bytes apart in the ring.
pub const NVM_EPOCH_STRIDE_BYTES: u64 = 4096;
/// 2^64 divided by the golden ratio: spreads epochs' starts over the ring.
pub const NVM_EPOCH_SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;
/// Mixed into commit words' tags.
const NVM_COMMIT_SALT: u64 = 0x5EA1_C0DE_F1A5_4000;

/// "FLNTSTRP": a stripe record's first eight bytes.
pub const NVM_STRIPE_MAGIC: u64 = u64::from_le_bytes(*b"FLNTSTRP");
/// Bytes of a stripe record's header; its parity units follow.
pub const NVM_STRIPE_HEADER_BYTES: usize = 64;
/// The stripe area takes about this fraction (1/n) of the region past the
/// header's page.
pub const NVM_STRIPE_AREA_FRACTION: u64 = 16;
/// Stripe records an area holds at least: one current record per zone
/// the engine writes at once (six) and room to write the next one
/// without overwriting any of them.
pub const NVM_STRIPE_RECORDS_MIN: u32 = 8;
/// Stripe records an area holds at most: the mount reads every record's
/// header (64 bytes each).
pub const NVM_STRIPE_RECORDS_MAX: u32 = 4096;
/// The largest sequence a stripe record may carry: far past any a volume
/// writes (one a flush), and far from overflow when the next is taken.
pub const NVM_STRIPE_SEQUENCE_MAX: u64 = 1 << 62;

const _: () = assert!(NVM_LOG_OFFSET_BYTES >= NVM_HEADER_BYTES as u64);
const _: () = assert!(NVM_STRIPE_RECORDS_MIN < NVM_STRIPE_RECORDS_MAX);
const _: () = assert!(NVM_STRIPE_HEADER_BYTES.is_multiple_of(64));
const _: () = assert!(NVM_SIZE_BYTES_MIN > NVM_LOG_OFFSET_BYTES + NVM_EPOCH_STRIDE_BYTES);
const _: () = assert!(NVM_LOG_OFFSET_BYTES.is_multiple_of(8) && NVM_EPOCH_STRIDE_BYTES.is_multiple_of(8));

/// The NVM header: which volume the region belongs to and where its log
/// ring is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmHeader {
    /// The volume's UUID (the superblock's): NVM of another volume is not
    /// read as this one's log.
    pub uuid: [u8; 16],
    /// Byte offset of the log ring in the region.
    pub log_offset: u64,
    /// Bytes of the log ring, a multiple of 8.
    pub log_bytes: u64,
    /// Bytes of one stripe record (a header and the block parity's `k`
    /// units), a multiple of 64; 0 when the area holds none.
    pub stripe_record_bytes: u32,
    /// Stripe records in the area, from [`NvmHeader::stripe_offset`].
    pub stripe_records: u32,
}

/// What a header's bytes say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmHeaderState {
    /// Every byte zero: NVM never used, or cleared.
    Blank,
    /// A header of this format.
    Valid(NvmHeader),
    /// A flintfs header of another format version.
    OtherVersion(u16),
    /// Anything else.
    Damaged(DecodeError),
}

impl NvmHeader {
    /// The header for a region of `nvm_size_bytes`, with stripe records
    /// of `stripe_record_bytes` (0: the volume keeps no block parity).
    pub fn for_region(uuid: [u8; 16], nvm_size_bytes: u64, stripe_record_bytes: u32) -> NvmHeader {
        assert!(nvm_size_bytes >= NVM_SIZE_BYTES_MIN, "an NVM region of {nvm_size_bytes} bytes is too small");
        assert!(stripe_record_bytes.is_multiple_of(64), "stripe records of {stripe_record_bytes} bytes");
        // A quarter of the region for the log, a sixteenth for the open
        // stripes' parity, the rest for node pages; a small region is all
        // log.
        let available = nvm_size_bytes - NVM_LOG_OFFSET_BYTES;
        let log_bytes = (available / 4).max(available.min(NVM_LOG_BYTES_SMALL)) / 8 * 8;
        let mut header =
            NvmHeader { uuid, log_offset: NVM_LOG_OFFSET_BYTES, log_bytes, stripe_record_bytes, stripe_records: 0 };
        if stripe_record_bytes > 0 {
            let records = (available / NVM_STRIPE_AREA_FRACTION / u64::from(stripe_record_bytes))
                .clamp(u64::from(NVM_STRIPE_RECORDS_MIN), u64::from(NVM_STRIPE_RECORDS_MAX));
            let after_log = nvm_size_bytes.saturating_sub(header.stripe_offset());
            // The slots keep at least half of what the log leaves: a region
            // too small for both keeps no stripe records, and its open
            // stripes wait for their parity on flash as without NVM.
            if records * u64::from(stripe_record_bytes) <= after_log / 2 {
                header.stripe_records = records as u32;
            }
        }
        if header.stripe_records == 0 {
            header.stripe_record_bytes = 0;
        }
        header
    }

    /// Where the stripe area starts: after the log ring, on a 64-byte line.
    pub fn stripe_offset(&self) -> u64 {
        (self.log_offset + self.log_bytes).next_multiple_of(64)
    }

    /// Where the slot area starts: after the stripe area.
    pub fn slots_offset(&self) -> u64 {
        self.stripe_offset() + u64::from(self.stripe_record_bytes) * u64::from(self.stripe_records)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::with_capacity(NVM_HEADER_BYTES);
        writer.u64(NVM_MAGIC).u16(FORMAT_VERSION).zeros(6).bytes(&self.uuid).u64(self.log_offset).u64(self.log_bytes);
        writer.u32(self.stripe_record_bytes).u32(self.stripe_records).zeros(4);
        let mut bytes = writer.finish();
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(bytes.len(), NVM_HEADER_BYTES);
        bytes
    }

    /// Reads a header; total over any bytes. `nvm_size_bytes` bounds the
    /// ring it may name.
    pub fn decode(bytes: &[u8], nvm_size_bytes: u64) -> NvmHeaderState {
        if bytes.len() >= NVM_HEADER_BYTES && bytes[..NVM_HEADER_BYTES].iter().all(|&byte| byte == 0) {
            return NvmHeaderState::Blank;
        }
        match Self::decode_fields(bytes, nvm_size_bytes) {
            Ok(state) => state,
            Err(error) => NvmHeaderState::Damaged(error),
        }
    }

    fn decode_fields(bytes: &[u8], nvm_size_bytes: u64) -> Result<NvmHeaderState, DecodeError> {
        let mut reader = Reader::new("NVM header", bytes);
        let magic = reader.u64()?;
        if magic != NVM_MAGIC {
            return Err(reader.error(format!("magic {magic:#018x} is not flintfs NVM")));
        }
        let version = reader.u16()?;
        if version != FORMAT_VERSION {
            return Ok(NvmHeaderState::OtherVersion(version));
        }
        reader.zeros(6)?;
        let uuid = reader.array::<16>()?;
        let log_offset = reader.u64()?;
        let log_bytes = reader.u64()?;
        let stripe_record_bytes = reader.u32()?;
        let stripe_records = reader.u32()?;
        reader.zeros(4)?;
        let covered = reader.position();
        let crc = reader.u32()?;
        if crc != crc32c::crc32c(&bytes[..covered]) {
            return Err(reader.error("CRC mismatch"));
        }
        let end = log_offset.checked_add(log_bytes);
        if log_offset < NVM_HEADER_BYTES as u64
            || !log_offset.is_multiple_of(8)
            || !log_bytes.is_multiple_of(8)
            || log_bytes < NVM_EPOCH_STRIDE_BYTES
            || end.is_none_or(|end| end > nvm_size_bytes)
        {
            return Err(reader.error(format!(
                "a log ring of {log_bytes} bytes at {log_offset} does not fit {nvm_size_bytes} bytes of NVM"
            )));
        }
        let header = NvmHeader { uuid, log_offset, log_bytes, stripe_record_bytes, stripe_records };
        let stripe_end = u64::from(stripe_record_bytes)
            .checked_mul(u64::from(stripe_records))
            .and_then(|bytes| header.stripe_offset().checked_add(bytes));
        if !stripe_record_bytes.is_multiple_of(64)
            || (stripe_record_bytes == 0) != (stripe_records == 0)
            || (stripe_records > 0 && (stripe_record_bytes as usize) <= NVM_STRIPE_HEADER_BYTES)
            || stripe_records > NVM_STRIPE_RECORDS_MAX
            || stripe_end.is_none_or(|end| end > nvm_size_bytes)
        {
            return Err(reader.error(format!(
                "{stripe_records} stripe records of {stripe_record_bytes} bytes after the log ring do not fit \
                 {nvm_size_bytes} bytes of NVM"
            )));
        }
        Ok(NvmHeaderState::Valid(header))
    }

    /// Where epoch `epoch`'s first frame starts in the ring (an offset
    /// from `log_offset`).
    pub fn epoch_start(&self, epoch: u64) -> u64 {
        let strides = (self.log_bytes / NVM_EPOCH_STRIDE_BYTES).max(1);
        // Fibonacci hashing: consecutive epochs start about 0.618 of the
        // ring apart, so the few KiB each writes seldom overlap, and no
        // word is rewritten by every checkpoint (wear).
        let fraction = epoch.wrapping_mul(NVM_EPOCH_SPREAD);
        let stride = ((u128::from(fraction) * u128::from(strides)) >> 64) as u64;
        stride * NVM_EPOCH_STRIDE_BYTES
    }
}

/// The CRC-32C a frame header gives its payload.
pub fn nvm_crc(payload: &[u8]) -> u32 {
    crc32c::crc32c(payload)
}

/// Ring bytes a frame of a `payload_bytes` payload takes: its header, the
/// payload padded to 8 bytes, its commit word.
pub fn nvm_frame_bytes(payload_bytes: usize) -> u64 {
    NVM_FRAME_HEADER_BYTES + (payload_bytes as u64).next_multiple_of(8) + NVM_COMMIT_BYTES
}

/// A frame's header and padded payload, as written before its commit word.
pub fn encode_nvm_frame(payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("a log batch is far under 4 GiB");
    let mut writer = Writer::with_capacity(nvm_frame_bytes(payload.len()) as usize);
    writer.u32(length).u32(crc32c::crc32c(payload)).bytes(payload);
    let padded = (payload.len() as u64).next_multiple_of(8) as usize;
    writer.zeros(padded - payload.len());
    writer.finish()
}

/// A frame header's fields: the payload's length and CRC.
pub fn decode_nvm_frame_header(bytes: &[u8]) -> Result<(u32, u32), DecodeError> {
    let mut reader = Reader::new("NVM frame header", bytes);
    Ok((reader.u32()?, reader.u32()?))
}

/// The word that commits frame `batch` of `epoch` of the volume whose
/// UUID is `uuid`, its payload's CRC `crc`: `(crc << 32) | 1 << 31 | tag`,
/// `tag` 31 bits of a hash of the UUID, the epoch and the number. Never
/// zero, so zeroed NVM commits nothing; a word another volume, epoch or
/// frame left at the same offset matches only if both its CRC and its tag
/// do (about 2^-63).
pub fn nvm_commit_word(uuid: &[u8; 16], epoch: u64, batch: u64, crc: u32) -> u64 {
    let uuid_low = u64::from_le_bytes(uuid[..8].try_into().expect("8 bytes"));
    let uuid_high = u64::from_le_bytes(uuid[8..].try_into().expect("8 bytes"));
    let mixed = mix64(mix64(mix64(uuid_low ^ NVM_COMMIT_SALT) ^ uuid_high) ^ epoch) ^ batch;
    let tag = mix64(mixed) & 0x7FFF_FFFF;
    (u64::from(crc) << 32) | 1 << 31 | tag
}

/// splitmix64's finalizer: every input bit moves every output bit.
pub(crate) fn mix64(value: u64) -> u64 {
    let mut value = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

/// Sub-blocks a slot's node is split into: FSMAC's fine-grained
/// versioning. Each sub-block has two copies; an update writes only the
/// sub-blocks that changed, each into the copy the last committed version
/// does not use.
pub const NVM_SLOT_SUBBLOCKS: usize = 8;
/// The bit of a selection that picks the slot header's copy (bits
/// `0..NVM_SLOT_SUBBLOCKS` pick the sub-blocks').
pub const NVM_SLOT_HEADER_BIT: u32 = NVM_SLOT_SUBBLOCKS as u32;
/// Bits of one selection: the sub-blocks and the header.
pub const NVM_SLOT_SELECTION_BITS: u32 = NVM_SLOT_HEADER_BIT + 1;
/// Bits of the generation in a slot word: what is left of 64 after two
/// selections. A checkpoint number at or past `2^46` is refused.
pub const NVM_SLOT_GENERATION_BITS: u32 = 64 - 2 * NVM_SLOT_SELECTION_BITS;
/// Largest generation a slot word holds.
pub const NVM_SLOT_GENERATION_MAX: u64 = (1 << NVM_SLOT_GENERATION_BITS) - 1;
/// Node bytes a slot of class 0 holds; class c holds `256 << c`, up to a
/// page. Small classes keep a file inode's slot small.
pub const NVM_SLOT_CLASS_0_BYTES: usize = 256;
/// Classes a prefix may name (the page size bounds them further).
pub const NVM_SLOT_CLASSES_MAX: usize = 16;
/// "FSLT": the low 32 bits of a slot's prefix word.
pub const NVM_SLOT_MAGIC: u32 = u32::from_le_bytes(*b"FSLT");
/// Where a slot's selection word is, from the slot's start.
pub const NVM_SLOT_WORD_OFFSET: u64 = 8;
/// Where a slot's two header copies are, from the slot's start.
pub const NVM_SLOT_HEADERS_OFFSET: u64 = 64;
/// Bytes of one slot header copy (one NVM line).
pub const NVM_SLOT_HEADER_BYTES: usize = 64;
/// Where a slot's sub-block copies start, from the slot's start.
pub const NVM_SLOT_DATA_OFFSET: u64 = NVM_SLOT_HEADERS_OFFSET + 2 * NVM_SLOT_HEADER_BYTES as u64;

const _: () = assert!(NVM_SLOT_CLASS_0_BYTES.is_multiple_of(NVM_SLOT_SUBBLOCKS));
const _: () = assert!(NVM_SLOT_GENERATION_BITS >= 40);
const _: () = assert!(NVM_SLOT_DATA_OFFSET.is_multiple_of(64));

/// Slot classes for pages of `page_size` bytes: class c holds `256 << c`
/// bytes, and the largest holds a page.
pub fn nvm_slot_classes(page_size: usize) -> usize {
    assert!(page_size.is_power_of_two() && page_size >= NVM_SLOT_CLASS_0_BYTES, "page size {page_size}");
    (page_size / NVM_SLOT_CLASS_0_BYTES).trailing_zeros() as usize + 1
}

/// Node bytes a slot of class `class` holds.
pub fn nvm_slot_data_bytes(class: u8) -> usize {
    NVM_SLOT_CLASS_0_BYTES << class
}

/// Bytes of one sub-block of a slot of class `class`.
pub fn nvm_subblock_bytes(class: u8) -> usize {
    nvm_slot_data_bytes(class) / NVM_SLOT_SUBBLOCKS
}

/// Bytes a slot of class `class` takes: prefix, word, two header copies,
/// and two copies of each sub-block.
pub fn nvm_slot_bytes(class: u8) -> u64 {
    NVM_SLOT_DATA_OFFSET + 2 * nvm_slot_data_bytes(class) as u64
}

/// The prefix word that marks a slot of class `class`.
pub fn nvm_slot_prefix(class: u8) -> u64 {
    assert!((class as usize) < NVM_SLOT_CLASSES_MAX, "slot class {class}");
    u64::from(NVM_SLOT_MAGIC) | u64::from(class) << 32
}

/// A prefix word's class, or `None` when the word marks no slot (the walk
/// of the slots ends there).
pub fn decode_nvm_slot_prefix(word: u64) -> Option<u8> {
    let class = (word >> 32) as u8;
    (word as u32 == NVM_SLOT_MAGIC && word >> 40 == 0 && (class as usize) < NVM_SLOT_CLASSES_MAX).then_some(class)
}

/// A slot's selection word: which copy of each sub-block (and of the
/// header) the last committed version uses, which copy the version
/// written for `generation` uses, and that generation. Any 64 bits decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NvmSlotWord {
    pub committed: u16,
    pub pending: u16,
    pub generation: u64,
}

impl NvmSlotWord {
    const MASK: u64 = (1 << NVM_SLOT_SELECTION_BITS) - 1;

    pub fn encode(self) -> u64 {
        assert!(self.generation <= NVM_SLOT_GENERATION_MAX, "slot generation {}", self.generation);
        assert!(u64::from(self.committed | self.pending) <= Self::MASK);
        u64::from(self.committed)
            | u64::from(self.pending) << NVM_SLOT_SELECTION_BITS
            | self.generation << (2 * NVM_SLOT_SELECTION_BITS)
    }

    pub fn decode(word: u64) -> NvmSlotWord {
        NvmSlotWord {
            committed: (word & Self::MASK) as u16,
            pending: ((word >> NVM_SLOT_SELECTION_BITS) & Self::MASK) as u16,
            generation: word >> (2 * NVM_SLOT_SELECTION_BITS),
        }
    }

    /// The selection in force when checkpoint `committed` is the newest on
    /// flash: the pending one if its generation was committed, else the
    /// committed one.
    pub fn in_force(self, committed: u64) -> u16 {
        if self.generation <= committed {
            self.pending
        } else {
            self.committed
        }
    }
}

/// A node's kind in a slot header.
pub const NVM_SLOT_KIND_EMPTY: u8 = 0;
pub const NVM_SLOT_KIND_INDEX: u8 = 1;
pub const NVM_SLOT_KIND_FILE: u8 = 2;
pub const NVM_SLOT_KIND_SLOT: u8 = 3;
pub const NVM_SLOT_KIND_MAP: u8 = 4;
pub const NVM_SLOT_KIND_MAP_DIRECTORY: u8 = 5;

/// A slot header: which node the slot holds, where its copy on flash is,
/// and its encoded length and CRC. All zero is an empty slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmSlotHeader {
    pub kind: u8,
    pub level: u8,
    pub first: u64,
    pub second: u64,
    pub used_bytes: u32,
    pub home: crate::Pointer,
    pub crc: u32,
}

impl NvmSlotHeader {
    pub fn encode(&self) -> [u8; NVM_SLOT_HEADER_BYTES] {
        assert!(self.kind != NVM_SLOT_KIND_EMPTY && self.kind <= NVM_SLOT_KIND_MAP_DIRECTORY);
        let mut writer = Writer::with_capacity(NVM_SLOT_HEADER_BYTES);
        writer
            .u8(self.kind)
            .u8(self.level)
            .zeros(2)
            .u32(self.used_bytes)
            .u64(self.first)
            .u64(self.second)
            .u64(self.home.0)
            .u32(self.crc)
            .zeros(24);
        let mut bytes = writer.finish();
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let encoded: [u8; NVM_SLOT_HEADER_BYTES] = bytes.try_into().expect("64 bytes");
        debug_assert_eq!(NvmSlotHeader::decode(&encoded, usize::MAX), Ok(Some(*self)));
        encoded
    }

    /// Reads a header copy: `None` for an empty slot (all zero). Total over
    /// any bytes; `page_size` bounds the length it may give.
    pub fn decode(bytes: &[u8], page_size: usize) -> Result<Option<NvmSlotHeader>, DecodeError> {
        if bytes.len() >= NVM_SLOT_HEADER_BYTES && bytes[..NVM_SLOT_HEADER_BYTES].iter().all(|&byte| byte == 0) {
            return Ok(None);
        }
        let mut reader = Reader::new("NVM slot header", bytes);
        let kind = reader.u8()?;
        let level = reader.u8()?;
        reader.zeros(2)?;
        let used_bytes = reader.u32()?;
        let first = reader.u64()?;
        let second = reader.u64()?;
        let home = crate::Pointer(reader.u64()?);
        let crc = reader.u32()?;
        reader.zeros(24)?;
        let covered = reader.position();
        let stored = reader.u32()?;
        if stored != crc32c::crc32c(&bytes[..covered]) {
            return Err(reader.error("CRC mismatch"));
        }
        if kind == NVM_SLOT_KIND_EMPTY || kind > NVM_SLOT_KIND_MAP_DIRECTORY {
            return Err(reader.error(format!("unknown node kind {kind}")));
        }
        if used_bytes == 0 || used_bytes as usize > page_size {
            return Err(reader.error(format!("a node of {used_bytes} bytes")));
        }
        Ok(Some(NvmSlotHeader { kind, level, first, second, used_bytes, home, crc }))
    }
}

/// The header of a stripe record: the running parity of the data pages
/// `0..data_pages` of erase block `block` of `zone` (physical numbers, as
/// the protection layer counts them), `units` parity units of `unit_bytes`
/// each following it. The newest record of a zone by `sequence` whose
/// CRC matches is the one in force. A *tombstone* covers 0 pages of block
/// 0 and has no units: written before a zone's reset, it keeps every
/// record of the zone's earlier use out of force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmStripeHeader {
    pub sequence: u64,
    pub zone: u32,
    pub block: u32,
    pub data_pages: u32,
    pub units: u32,
    pub unit_bytes: u32,
}

impl NvmStripeHeader {
    /// Bytes a record of `units` units of `unit_bytes` takes.
    pub fn record_bytes(units: u32, unit_bytes: u32) -> u64 {
        NVM_STRIPE_HEADER_BYTES as u64 + u64::from(units) * u64::from(unit_bytes)
    }

    /// The header with its CRC, which covers the volume's UUID, the
    /// header's first 60 bytes and the units.
    pub fn encode(&self, uuid: &[u8; 16], units: &[Vec<u8>]) -> [u8; NVM_STRIPE_HEADER_BYTES] {
        // A tombstone (0 pages) has no units.
        let expected = if self.data_pages == 0 { 0 } else { self.units as usize };
        assert_eq!(units.len(), expected, "a stripe record's units");
        assert!(units.iter().all(|unit| unit.len() == self.unit_bytes as usize), "a stripe record's unit size");
        assert!(self.sequence > 0, "a stripe record's sequence: {self:?}");
        assert!(self.sequence <= NVM_STRIPE_SEQUENCE_MAX, "a stripe record's sequence: {self:?}");
        let mut writer = Writer::with_capacity(NVM_STRIPE_HEADER_BYTES);
        writer.u64(NVM_STRIPE_MAGIC).u64(self.sequence).u32(self.zone).u32(self.block).u32(self.data_pages);
        writer.u32(self.units).u32(self.unit_bytes).zeros(24);
        let mut bytes = writer.finish();
        let crc = nvm_stripe_crc(uuid, &bytes, units.iter().map(Vec::as_slice));
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.try_into().expect("64 bytes")
    }

    /// Reads a record header and the CRC it claims; total over any bytes.
    /// `Ok(None)` for bytes that hold no record (zero, or another magic).
    pub fn decode(bytes: &[u8]) -> Result<Option<(NvmStripeHeader, u32)>, DecodeError> {
        let mut reader = Reader::new("NVM stripe record", bytes);
        if reader.u64()? != NVM_STRIPE_MAGIC {
            return Ok(None);
        }
        let header = NvmStripeHeader {
            sequence: reader.u64()?,
            zone: reader.u32()?,
            block: reader.u32()?,
            data_pages: reader.u32()?,
            units: reader.u32()?,
            unit_bytes: reader.u32()?,
        };
        reader.zeros(24)?;
        let crc = reader.u32()?;
        if header.sequence == 0
            || header.sequence > NVM_STRIPE_SEQUENCE_MAX
            || header.units == 0
            || header.unit_bytes == 0
            || (header.data_pages == 0 && header.block != 0)
        {
            return Err(reader.error(format!("a stripe record that covers nothing: {header:?}")));
        }
        Ok(Some((header, crc)))
    }
}

/// A stripe record's CRC-32C: the volume's UUID, the header's first 60
/// bytes, then the units, so a record another volume left matches
/// nothing (but by chance).
pub fn nvm_stripe_crc<'a>(uuid: &[u8; 16], header: &[u8], units: impl Iterator<Item = &'a [u8]>) -> u32 {
    let mut crc = crc32c::crc32c_append(crc32c::crc32c(uuid), &header[..NVM_STRIPE_HEADER_BYTES - 4]);
    for unit in units {
        crc = crc32c::crc32c_append(crc, unit);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_refuses_what_it_is_not() {
        let header = NvmHeader::for_region([7; 16], 1 << 20, 4288);
        assert_eq!(header.stripe_records, NVM_STRIPE_RECORDS_MIN.max(((1 << 20) - 4096) / 16 / 4288));
        assert!(header.slots_offset() > header.stripe_offset() && header.stripe_offset() >= 4096 + header.log_bytes);
        // A region that is all log keeps no stripe records.
        let small = NvmHeader::for_region([7; 16], 16 << 10, 4288);
        assert_eq!((small.stripe_records, small.stripe_record_bytes), (0, 0));
        let bytes = header.encode();
        assert_eq!(NvmHeader::decode(&bytes, 1 << 20), NvmHeaderState::Valid(header.clone()));
        assert_eq!(NvmHeader::decode(&[0; 64], 1 << 20), NvmHeaderState::Blank);
        // A ring past the region.
        assert!(matches!(NvmHeader::decode(&bytes, 1 << 16), NvmHeaderState::Damaged(_)));
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert!(matches!(NvmHeader::decode(&flipped, 1 << 20), NvmHeaderState::Damaged(_)));
        let mut other = bytes;
        other[8..10].copy_from_slice(&(FORMAT_VERSION - 1).to_le_bytes());
        assert_eq!(NvmHeader::decode(&other, 1 << 20), NvmHeaderState::OtherVersion(FORMAT_VERSION - 1));
    }

    #[test]
    fn frames_pad_to_words_and_commit_words_tell_epochs_apart() {
        let frame = encode_nvm_frame(b"hello");
        assert_eq!(frame.len() as u64 + NVM_COMMIT_BYTES, nvm_frame_bytes(5));
        assert_eq!(frame.len() % 8, 0);
        assert_eq!(decode_nvm_frame_header(&frame).unwrap(), (5, crc32c::crc32c(b"hello")));
        let crc = crc32c::crc32c(b"hello");
        let uuid = [7; 16];
        assert_ne!(nvm_commit_word(&uuid, 1, 0, crc), 0);
        assert_ne!(nvm_commit_word(&uuid, 1, 0, crc), nvm_commit_word(&uuid, 2, 0, crc));
        assert_ne!(nvm_commit_word(&uuid, 1, 0, crc), nvm_commit_word(&uuid, 1, 1, crc));
        assert_ne!(nvm_commit_word(&uuid, 1, 0, crc), nvm_commit_word(&[8; 16], 1, 0, crc));
        // The tag is a hash, not a sum: (E, 65536) and (E + 1, 0) differ.
        assert_ne!(nvm_commit_word(&uuid, 5, 65_536, crc), nvm_commit_word(&uuid, 6, 0, crc));
        let header = NvmHeader::for_region([0; 16], 1 << 20, 0);
        assert_ne!(header.epoch_start(1), header.epoch_start(2));
        assert!(header.epoch_start(u64::MAX) < header.log_bytes);
    }

    #[test]
    fn slot_words_prefixes_and_headers_round_trip() {
        let word = NvmSlotWord { committed: 0b1_0000_0101, pending: 0b0_1000_0001, generation: 77 };
        assert_eq!(NvmSlotWord::decode(word.encode()), word);
        assert_eq!(word.in_force(77), word.pending);
        assert_eq!(word.in_force(76), word.committed);
        assert_eq!(NvmSlotWord::decode(0), NvmSlotWord::default());
        for class in 0..NVM_SLOT_CLASSES_MAX as u8 {
            assert_eq!(decode_nvm_slot_prefix(nvm_slot_prefix(class)), Some(class));
        }
        assert_eq!(decode_nvm_slot_prefix(0), None);
        assert_eq!(decode_nvm_slot_prefix(nvm_slot_prefix(1) | 1 << 50), None);
        assert_eq!(nvm_slot_classes(4096), 5);
        assert_eq!(nvm_slot_bytes(4), 192 + 2 * 4096);
        assert_eq!(nvm_slot_bytes(0), 192 + 2 * 256);
        assert_eq!(nvm_subblock_bytes(0), 32);
        let header = NvmSlotHeader {
            kind: NVM_SLOT_KIND_INDEX,
            level: 2,
            first: 9,
            second: 11,
            used_bytes: 300,
            home: crate::Pointer(1234),
            crc: 5,
        };
        let bytes = header.encode();
        assert_eq!(NvmSlotHeader::decode(&bytes, 4096), Ok(Some(header)));
        assert_eq!(NvmSlotHeader::decode(&[0; 64], 4096), Ok(None));
        assert!(NvmSlotHeader::decode(&bytes, 256).is_err(), "longer than a page");
        let mut flipped = bytes;
        flipped[9] ^= 1;
        assert!(NvmSlotHeader::decode(&flipped, 4096).is_err());
    }

    #[test]
    fn stripe_records_round_trip_and_their_crc_names_the_volume() {
        let header = NvmStripeHeader { sequence: 9, zone: 4, block: 2, data_pages: 7, units: 2, unit_bytes: 128 };
        let units = vec![vec![1u8; 128], vec![2u8; 128]];
        let bytes = header.encode(&[5; 16], &units);
        let (decoded, crc) = NvmStripeHeader::decode(&bytes).unwrap().expect("a record");
        assert_eq!(decoded, header);
        let slices = || units.iter().map(Vec::as_slice);
        assert_eq!(crc, nvm_stripe_crc(&[5; 16], &bytes, slices()));
        assert_ne!(crc, nvm_stripe_crc(&[6; 16], &bytes, slices()), "another volume's record");
        assert_eq!(NvmStripeHeader::decode(&[0; 64]), Ok(None));
        assert_eq!(NvmStripeHeader::record_bytes(2, 128), 320);
        let mut empty = bytes;
        empty[24..28].copy_from_slice(&0u32.to_le_bytes());
        assert!(NvmStripeHeader::decode(&empty).is_err(), "no pages covered, but a block named");
        let tombstone = NvmStripeHeader { block: 0, data_pages: 0, ..header };
        let encoded = tombstone.encode(&[5; 16], &[]);
        let (decoded, crc) = NvmStripeHeader::decode(&encoded).unwrap().expect("a tombstone");
        assert_eq!((decoded, crc), (tombstone, nvm_stripe_crc(&[5; 16], &encoded, std::iter::empty())));
        let mut last = bytes;
        last[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(NvmStripeHeader::decode(&last).is_err(), "a sequence with no next");
    }

    proptest::proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128)) {
            let _ = NvmHeader::decode(&bytes, 1 << 20);
            let _ = decode_nvm_frame_header(&bytes);
            let _ = NvmSlotHeader::decode(&bytes, 4096);
            let _ = NvmStripeHeader::decode(&bytes);
            if bytes.len() >= 8 {
                let word = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                let _ = decode_nvm_slot_prefix(word);
                let decoded = NvmSlotWord::decode(word);
                proptest::prop_assert_eq!(decoded.encode(), word);
            }
        }
    }
}
