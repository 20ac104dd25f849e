//! The superblock: what the file system is and how the device is laid out.
//! Written by mkfs at page 0 of both superblock zones and never rewritten.

use crate::chunk::Compression;
use crate::codec::{Reader, Writer};
use crate::{DecodeError, FORMAT_VERSION};

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"FLINTFS\0";
/// Bytes of the encoded superblock at the start of its page (the rest of
/// the page is zero).
pub const SUPERBLOCK_BYTES: usize = 128;
const SUPERBLOCK_CRC: usize = SUPERBLOCK_BYTES - 4;

/// Zones with fixed roles in this format version: two superblock copies, two
/// alternating checkpoint zones; every zone from [`FIRST_DYNAMIC_ZONE`] on
/// is allocated to a log head as needed.
pub const SUPERBLOCK_ZONES: [u32; 2] = [0, 1];
pub const CHECKPOINT_ZONES: [u32; 2] = [2, 3];
pub const FIRST_DYNAMIC_ZONE: u32 = 4;
const _: () = assert!(SUPERBLOCK_ZONES[1] < CHECKPOINT_ZONES[0] && CHECKPOINT_ZONES[1] < FIRST_DYNAMIC_ZONE);

/// The device the file system was made for, as the device reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceShape {
    pub page_size_bytes: u32,
    pub oob_size_bytes: u32,
    pub block_pages: u32,
    pub zone_blocks: u32,
    pub zone_count: u32,
    pub nvm_size_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub shape: DeviceShape,
    /// Identifies this file system; chosen by mkfs from its randomness input.
    pub uuid: [u8; 16],
    /// When mkfs ran, from its clock input (ns since the Unix epoch).
    pub created_ns: u64,
    /// k: segments the checkpoint pre-declares for allocation (the unindexed
    /// zone); recovery scans only these.
    pub unindexed_segments: u32,
    /// Parity pages per erase block (RCFFS), for new segments.
    pub block_parity_pages: u32,
    /// Reed-Solomon parity blocks per segment (RCFFS), for new segments.
    pub segment_parity_blocks: u32,
    /// Compression of new chunks unless a mount or file says otherwise.
    pub compression: Compression,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        if let Err(reason) = self.validate() {
            panic!("refusing to encode an invalid superblock: {reason}");
        }
        let mut writer = Writer::with_capacity(SUPERBLOCK_BYTES);
        let shape = &self.shape;
        writer
            .bytes(&SUPERBLOCK_MAGIC)
            .u16(FORMAT_VERSION)
            .u16(SUPERBLOCK_BYTES as u16)
            .u32(shape.page_size_bytes)
            .u32(shape.oob_size_bytes)
            .u32(shape.block_pages)
            .u32(shape.zone_blocks)
            .u32(shape.zone_count)
            .u64(shape.nvm_size_bytes)
            .bytes(&self.uuid)
            .u64(self.created_ns)
            .u32(SUPERBLOCK_ZONES[0])
            .u32(SUPERBLOCK_ZONES[1])
            .u32(CHECKPOINT_ZONES[0])
            .u32(CHECKPOINT_ZONES[1])
            .u32(FIRST_DYNAMIC_ZONE)
            .u32(self.unindexed_segments)
            .u32(self.block_parity_pages)
            .u32(self.segment_parity_blocks)
            .u8(self.compression.to_byte());
        let used = writer.len();
        writer.zeros(SUPERBLOCK_CRC - used);
        let mut bytes = [0u8; SUPERBLOCK_BYTES];
        bytes[..SUPERBLOCK_CRC].copy_from_slice(&writer.finish());
        let crc = crc32c::crc32c(&bytes[..SUPERBLOCK_CRC]);
        bytes[SUPERBLOCK_CRC..].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(Superblock::decode(&bytes).as_ref(), Ok(self));
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Superblock, DecodeError> {
        let mut reader = Reader::new("superblock", bytes);
        if reader.array::<8>()? != SUPERBLOCK_MAGIC {
            return Err(reader.error("not a flintfs file system (bad magic)"));
        }
        let version = reader.u16()?;
        if version != FORMAT_VERSION {
            return Err(reader
                .error(format!("flintfs format version {version}; this build reads version {FORMAT_VERSION} only")));
        }
        let size = reader.u16()?;
        if size as usize != SUPERBLOCK_BYTES {
            return Err(reader.error(format!("size {size}, expected {SUPERBLOCK_BYTES}")));
        }
        let shape = DeviceShape {
            page_size_bytes: reader.u32()?,
            oob_size_bytes: reader.u32()?,
            block_pages: reader.u32()?,
            zone_blocks: reader.u32()?,
            zone_count: reader.u32()?,
            nvm_size_bytes: reader.u64()?,
        };
        let uuid = reader.array::<16>()?;
        let created_ns = reader.u64()?;
        let layout = [reader.u32()?, reader.u32()?, reader.u32()?, reader.u32()?, reader.u32()?];
        let unindexed_segments = reader.u32()?;
        let block_parity_pages = reader.u32()?;
        let segment_parity_blocks = reader.u32()?;
        let compression_byte = reader.u8()?;
        reader.zeros(SUPERBLOCK_CRC - reader.position())?;
        let stored_crc = reader.u32()?;
        let computed_crc = crc32c::crc32c(&bytes[..SUPERBLOCK_CRC]);
        if stored_crc != computed_crc {
            return Err(reader.error(format!("checksum {stored_crc:#010x} does not match {computed_crc:#010x}")));
        }
        let compression = Compression::from_byte(compression_byte)
            .ok_or_else(|| reader.error(format!("unknown compression {compression_byte}")))?;
        let expected_layout =
            [SUPERBLOCK_ZONES[0], SUPERBLOCK_ZONES[1], CHECKPOINT_ZONES[0], CHECKPOINT_ZONES[1], FIRST_DYNAMIC_ZONE];
        if layout != expected_layout {
            return Err(
                reader.error(format!("zone layout {layout:?} is not version {FORMAT_VERSION}'s {expected_layout:?}"))
            );
        }
        let superblock = Superblock {
            shape,
            uuid,
            created_ns,
            unindexed_segments,
            block_parity_pages,
            segment_parity_blocks,
            compression,
        };
        superblock.validate().map_err(|reason| reader.error(reason))?;
        Ok(superblock)
    }

    /// The rules a superblock must keep; mkfs checks them before writing
    /// and every mount after reading.
    pub fn validate(&self) -> Result<(), String> {
        let shape = &self.shape;
        if shape.zone_count <= FIRST_DYNAMIC_ZONE {
            return Err(format!("{} zones leave none for data", shape.zone_count));
        }
        if self.unindexed_segments == 0 || self.unindexed_segments >= shape.zone_count - FIRST_DYNAMIC_ZONE {
            return Err(format!(
                "{} unindexed segments out of {} dynamic zones",
                self.unindexed_segments,
                shape.zone_count - FIRST_DYNAMIC_ZONE
            ));
        }
        if self.block_parity_pages >= shape.block_pages {
            return Err(format!("{} parity pages in a {}-page block", self.block_parity_pages, shape.block_pages));
        }
        if self.segment_parity_blocks >= shape.zone_blocks {
            return Err(format!(
                "{} parity blocks in a {}-block segment",
                self.segment_parity_blocks, shape.zone_blocks
            ));
        }
        Ok(())
    }
}
