//! The layout of the byte-addressable NVM region (FSMAC), when the device
//! has one: a header, then the metadata log as a ring of frames.
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

const _: () = assert!(NVM_LOG_OFFSET_BYTES >= NVM_HEADER_BYTES as u64);
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
    /// The header for a region of `nvm_size_bytes`.
    pub fn for_region(uuid: [u8; 16], nvm_size_bytes: u64) -> NvmHeader {
        assert!(nvm_size_bytes >= NVM_SIZE_BYTES_MIN, "an NVM region of {nvm_size_bytes} bytes is too small");
        // A quarter of the region for the log, the rest for parked node
        // pages; a small region is all log.
        let available = nvm_size_bytes - NVM_LOG_OFFSET_BYTES;
        let log_bytes = (available / 4).max(available.min(NVM_LOG_BYTES_SMALL)) / 8 * 8;
        NvmHeader { uuid, log_offset: NVM_LOG_OFFSET_BYTES, log_bytes }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::with_capacity(NVM_HEADER_BYTES);
        writer.u64(NVM_MAGIC).u16(FORMAT_VERSION).zeros(6).bytes(&self.uuid).u64(self.log_offset).u64(self.log_bytes);
        writer.zeros(12);
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
        reader.zeros(12)?;
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
        Ok(NvmHeaderState::Valid(NvmHeader { uuid, log_offset, log_bytes }))
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
fn mix64(value: u64) -> u64 {
    let mut value = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_refuses_what_it_is_not() {
        let header = NvmHeader::for_region([7; 16], 1 << 20);
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
        let header = NvmHeader::for_region([0; 16], 1 << 20);
        assert_ne!(header.epoch_start(1), header.epoch_start(2));
        assert!(header.epoch_start(u64::MAX) < header.log_bytes);
    }

    proptest::proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128)) {
            let _ = NvmHeader::decode(&bytes, 1 << 20);
            let _ = decode_nvm_frame_header(&bytes);
        }
    }
}
