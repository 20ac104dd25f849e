//! # flintfs-format: the on-flash format
//!
//! The byte layout of what flintfs programs, specified field by field in
//! `docs/FORMAT.md` (kept in the same commits as this crate). Every
//! structure has a fixed-width little-endian encoding, carries or is
//! covered by a CRC-32C, and decodes through a total decoder: any bytes
//! give a value or a [`DecodeError`], never a panic (a property test and a
//! fuzz target hold it to that).
//!
//! This crate knows nothing of the device or the engine: it turns values
//! into bytes and back, and checks what bytes can check. The engine decides
//! what to write where.

pub mod bch;
mod checkpoint;
mod chunk;
mod codec;
mod compress;
pub mod erasure;
pub mod gf;
mod log;
mod node;
mod nvm;
mod page;
pub mod protection;
mod record;
mod superblock;
mod wear;

/// Noise for the unit tests: xorshift64, deterministic from its state.
#[cfg(test)]
pub(crate) fn test_noise(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub use checkpoint::{
    orphans_max, Checkpoint, LogHead, TreeRoots, ZoneRole, ZoneUsage, CHECKPOINT_FIXED_BYTES, LOG_HEADS_MAX,
    LOG_HEAD_BYTES, ZONE_USAGE_BYTES,
};
pub use chunk::{
    parse_packed, ChunkHeader, ChunkKind, Compression, PackedPage, CHUNK_HEADER_BYTES, CHUNK_LOGICAL_BYTES_MAX,
};
pub use codec::{all_zero, Reader, Writer};
pub use compress::{
    compress, decompress, decompress_into, CompressionChoice, ZSTD_LEVEL_DEFAULT, ZSTD_LEVEL_MAX, ZSTD_LEVEL_MIN,
};
pub use log::{
    EmbeddedBlock, LogBatch, LogOperation, LogRecord, SetAttributes, LOG_BATCH_HEADER_BYTES, LOG_BLOCKS_PER_RECORD_MAX,
    LOG_CONTENT_BYTES_MAX, LOG_EMBEDDED_HEADER_BYTES, LOG_RECORD_HEADER_BYTES,
};
pub use node::{
    array_capacity, bucket_area_bytes, decode_inode_pack, decode_inode_pack_record, directory_area_bytes,
    encode_inode_pack, index_fits_record, inline_bytes_max, inode_record_bytes, is_inode_pack, name_hash,
    validate_name, xattr_bytes_max, DirectoryContent, Entry, FileContent, FileType, Inode, Node, NodeKind, Pointer,
    Target, ARRAY_HEADER_BYTES, BUCKET_HEADER_BYTES, CHUNK_UNIT_BYTES, DIRECTORY_HEADER_BYTES, ENTRY_FIXED_BYTES,
    FILE_BLOCKS_MAX, GLOBAL_DEPTH_MAX, INDEX_HEIGHT_MAX, INDEX_IN_INODE_BYTES, INDEX_RECORD_FIXED_BYTES,
    INDEX_RECORD_SLOT, INDEX_ROOTS, INLINE_BYTES_CAP, INODE_FIXED_BYTES, INODE_RECORD_HEADER_BYTES, NAME_BYTES_MAX,
    NODE_HEADER_BYTES, SLOT_NONE, XATTR_BYTES_CAP, XATTR_NAME_BYTES_MAX,
};
pub use nvm::{
    decode_nvm_frame_header, decode_nvm_slot_prefix, encode_nvm_frame, nvm_commit_word, nvm_crc, nvm_frame_bytes,
    nvm_slot_bytes, nvm_slot_classes, nvm_slot_data_bytes, nvm_slot_prefix, nvm_stripe_crc, nvm_subblock_bytes,
    NvmHeader, NvmHeaderState, NvmSlotHeader, NvmSlotWord, NvmStripeHeader, NVM_COMMIT_BYTES, NVM_EPOCH_STRIDE_BYTES,
    NVM_FRAME_HEADER_BYTES, NVM_HEADER_BYTES, NVM_LOG_BYTES_SMALL, NVM_LOG_OFFSET_BYTES, NVM_MAGIC, NVM_SIZE_BYTES_MIN,
    NVM_SLOT_CLASSES_MAX, NVM_SLOT_DATA_OFFSET, NVM_SLOT_GENERATION_MAX, NVM_SLOT_HEADERS_OFFSET, NVM_SLOT_HEADER_BIT,
    NVM_SLOT_HEADER_BYTES, NVM_SLOT_KIND_FILE, NVM_SLOT_KIND_INDEX, NVM_SLOT_KIND_MAP, NVM_SLOT_KIND_MAP_DIRECTORY,
    NVM_SLOT_KIND_SLOT, NVM_SLOT_SUBBLOCKS, NVM_SLOT_WORD_OFFSET, NVM_STRIPE_HEADER_BYTES, NVM_STRIPE_MAGIC,
    NVM_STRIPE_SEQUENCE_MAX,
};
pub use page::{InvertedIndex, PageHeader, PageKind, PAGE_HEADER_BYTES};
pub use record::{
    split_record, RecordAssembler, RecordHeader, RecordKind, RecordPage, RECORD_HEADER_BYTES, RECORD_PAYLOAD_BYTES_MAX,
};
pub use superblock::{
    DeviceShape, Superblock, CHECKPOINT_ZONES, FIRST_DYNAMIC_ZONE, SUPERBLOCK_BYTES, SUPERBLOCK_MAGIC, SUPERBLOCK_ZONES,
};
pub use wear::{
    decode_nvm_wear_record, encode_nvm_wear_record, NvmWearLayout, NVM_WEAR_LINE_BYTES, NVM_WEAR_MOVES_MAX,
    NVM_WEAR_RING_RECORDS_MIN, NVM_WEAR_WORD_WRITES_PER_MOVE,
};

/// The on-flash format version this build reads and writes. An image of
/// another version is refused with a message naming both.
pub const FORMAT_VERSION: u16 = 12;

/// Why some bytes are not a valid structure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{structure}: {reason}")]
pub struct DecodeError {
    /// Which structure was being decoded.
    pub structure: &'static str,
    pub reason: String,
}
