//! The metadata log in NVM (FSMAC), when the device has NVM.
//!
//! A batch of log records that would take a flash page goes to the NVM
//! ring instead, as a frame: its bytes are written and persisted, then its
//! commit word is written and persisted (`docs/SEMANTICS.md`, "Persist
//! ordering in NVM"). fsync of metadata is then a few NVM words and no
//! flash page. The ring of an epoch fills from a start that moves with the
//! epoch; when it is three quarters full, the next operation takes a
//! checkpoint, which writes everything home to flash and starts a new
//! epoch, so NVM running out never refuses an operation.
//!
//! Recovery reads the frames of the loaded checkpoint's epoch from its
//! start, in order, and stops at the first one whose commit word, CRC,
//! epoch or number does not hold: what follows it was never committed.

use std::collections::{BTreeMap, VecDeque};

use flintfs_flash::FlashDevice;
use flintfs_format::{
    decode_nvm_frame_header, decode_nvm_slot_prefix, encode_nvm_frame, nvm_commit_word, nvm_frame_bytes,
    nvm_slot_bytes, nvm_slot_classes, nvm_slot_data_bytes, nvm_slot_prefix, nvm_subblock_bytes, LogBatch, Node,
    NvmHeader, NvmHeaderState, NvmSlotHeader, NvmSlotWord, Pointer, NVM_COMMIT_BYTES, NVM_FRAME_HEADER_BYTES,
    NVM_HEADER_BYTES, NVM_SIZE_BYTES_MIN, NVM_SLOT_DATA_OFFSET, NVM_SLOT_HEADERS_OFFSET, NVM_SLOT_HEADER_BIT,
    NVM_SLOT_HEADER_BYTES, NVM_SLOT_SUBBLOCKS, NVM_SLOT_WORD_OFFSET,
};

use super::nodes::{Cached, NodeKey};
use crate::error::{Error, Result};

/// Bytes cleared at a time when a ring is started afresh.
const NVM_CLEAR_CHUNK_BYTES: usize = 64 << 10;

/// The fraction of the ring, in quarters, at which a checkpoint is taken.
pub const NVM_LOG_CHECKPOINT_QUARTERS: u64 = 3;
const _: () = assert!(NVM_LOG_CHECKPOINT_QUARTERS < 4);

/// The NVM log's state in memory.
#[derive(Debug)]
pub(crate) struct NvmLog {
    header: NvmHeader,
    /// The epoch whose frames the ring holds from its start, and the ring
    /// bytes they take.
    epoch: u64,
    used_bytes: u64,
    /// Whether a frame is persisted before its commit word is written. Off
    /// only for the test that shows what the barrier is for.
    barrier: bool,
}

/// What reading an epoch's frames found.
pub(crate) struct NvmRead {
    pub batches: Vec<LogBatch>,
    pub bytes_read: u64,
    pub end: String,
}

impl NvmLog {
    /// Opens the NVM log of a device, writing a fresh header where there is
    /// none (new, or cleared after a clean unmount) or it is damaged: the
    /// flash alone then holds the file system at its last checkpoint.
    /// `None` when the device has no NVM. A header of another format
    /// version is refused, and so is a region that is not this volume's
    /// when the checkpoint keeps `needed` nodes in it.
    /// A fresh header makes stripe records of `stripe_record_bytes`
    /// (`Protected::nvm_stripe_record_bytes`). `read_only` writes none:
    /// the mount then runs without the log.
    pub fn open<D: FlashDevice>(
        device: &mut D,
        read_only: bool,
        uuid: [u8; 16],
        barrier: bool,
        needed: u32,
        stripe_record_bytes: u32,
    ) -> Result<Option<NvmLog>> {
        let nvm_size_bytes = device.geometry().nvm_size_bytes;
        let lost = |what: &str| {
            Error::corrupt(format!(
                "the checkpoint keeps {needed} node pages in NVM (unmounted with -o nvm_keep, or cut off by a power \
                 loss), and {what}: the flash alone is not this file system"
            ))
        };
        if nvm_size_bytes == 0 {
            if needed > 0 {
                return Err(lost("the device has no NVM region"));
            }
            return Ok(None);
        }
        if nvm_size_bytes < NVM_SIZE_BYTES_MIN {
            return Err(Error::invalid(format!(
                "an NVM region of {nvm_size_bytes} bytes is under the {NVM_SIZE_BYTES_MIN} flintfs needs for its log"
            )));
        }
        let mut bytes = vec![0u8; NVM_HEADER_BYTES];
        device.nvm_read(0, &mut bytes)?;
        let header = match NvmHeader::decode(&bytes, nvm_size_bytes) {
            NvmHeaderState::Valid(header) if header.uuid == uuid => header,
            NvmHeaderState::OtherVersion(version) => {
                return Err(Error::corrupt(format!(
                    "the NVM holds flintfs format version {version}; this build reads version {}",
                    flintfs_format::FORMAT_VERSION
                )));
            }
            state => {
                if needed > 0 {
                    return Err(lost(&format!("the NVM region holds no header of this volume ({state:?})")));
                }
                if read_only {
                    // A read-only mount writes no fresh header: it runs
                    // without the NVM log, which holds nothing of its own.
                    if !matches!(state, NvmHeaderState::Blank) {
                        tracing::warn!(
                            "the NVM header is not this volume's ({state:?}): read-only, the NVM log is not used"
                        );
                    }
                    return Ok(None);
                }
                if !matches!(state, NvmHeaderState::Blank) {
                    tracing::warn!("the NVM header is not this volume's ({state:?}): starting the NVM log afresh");
                }
                let header = NvmHeader::for_region(uuid, nvm_size_bytes, stripe_record_bytes);
                // The ring and the stripe records first: frames and records
                // an earlier volume left there must not be read as this
                // one's (their commit words and CRCs name the other UUID
                // too, but a volume made again with the same UUID would
                // match).
                let zeros = vec![0u8; NVM_CLEAR_CHUNK_BYTES];
                let (start, end) = (header.log_offset, header.slots_offset());
                let mut at = start;
                while at < end {
                    let length = (end - at).min(NVM_CLEAR_CHUNK_BYTES as u64);
                    device.nvm_write(at, &zeros[..length as usize])?;
                    at += length;
                }
                device.nvm_persist(start, end - start)?;
                let encoded = header.encode();
                device.nvm_write(0, &encoded)?;
                device.nvm_persist(0, encoded.len() as u64)?;
                header
            }
        };
        Ok(Some(NvmLog { header, epoch: u64::MAX, used_bytes: 0, barrier }))
    }

    pub fn header(&self) -> &NvmHeader {
        &self.header
    }

    /// Ring bytes in use by the current epoch.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn log_bytes(&self) -> u64 {
        self.header.log_bytes
    }

    /// Whether the ring has filled to where a checkpoint should write home
    /// (at `fraction` of the usual point: the idle thread takes it at half).
    pub fn wants_checkpoint(&self, fraction: u64) -> bool {
        self.used_bytes * fraction * 4 >= self.header.log_bytes * NVM_LOG_CHECKPOINT_QUARTERS
    }

    /// A checkpoint started `epoch`: its frames start afresh.
    pub fn truncated(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.used_bytes = 0;
    }

    /// Appends batch `batch` of `epoch` as a frame and commits it. Errors
    /// with ENOSPC when the ring has no room for it: a checkpoint must
    /// write home first.
    pub fn append<D: FlashDevice>(&mut self, device: &mut D, epoch: u64, batch: u64, payload: &[u8]) -> Result<()> {
        if epoch != self.epoch {
            self.truncated(epoch);
        }
        let frame_bytes = nvm_frame_bytes(payload.len());
        if self.used_bytes + frame_bytes > self.header.log_bytes {
            return Err(Error::new(
                crate::error::errno::ENOSPC,
                format!("the NVM log has {} of {} bytes free", self.header.log_bytes - self.used_bytes, frame_bytes),
            ));
        }
        let frame = encode_nvm_frame(payload);
        let at = self.header.epoch_start(epoch) + self.used_bytes;
        self.write_ring(device, at, &frame)?;
        if self.barrier {
            self.persist_ring(device, at, frame.len() as u64)?;
        }
        let crc = flintfs_format::nvm_crc(payload);
        let commit_at = at + frame.len() as u64;
        let commit = nvm_commit_word(&self.header.uuid, epoch, batch, crc).to_le_bytes();
        self.write_ring(device, commit_at, &commit)?;
        self.persist_ring(device, commit_at, NVM_COMMIT_BYTES)?;
        self.used_bytes += frame_bytes;
        debug_assert_eq!(frame.len() as u64 + NVM_COMMIT_BYTES, frame_bytes);
        Ok(())
    }

    /// Reads the committed frames of `epoch`, in order, up to the first
    /// that is not (torn, uncommitted, of another epoch, out of turn).
    /// Leaves the log positioned after them, so the epoch could go on.
    pub fn read_epoch<D: FlashDevice>(&mut self, device: &mut D, epoch: u64) -> NvmRead {
        let mut read = NvmRead { batches: Vec::new(), bytes_read: 0, end: String::new() };
        let mut used = 0u64;
        read.end = loop {
            match self.read_frame(device, epoch, read.batches.len() as u64, used, &mut read.bytes_read) {
                Ok((batch, frame_bytes)) => {
                    read.batches.push(batch);
                    used += frame_bytes;
                }
                Err(end) => break end,
            }
        };
        self.epoch = epoch;
        self.used_bytes = used;
        read
    }

    /// Whether `epoch` has a committed first frame: the log must be
    /// replayed.
    pub fn has_frames<D: FlashDevice>(&self, device: &mut D, epoch: u64) -> bool {
        self.read_frame(device, epoch, 0, 0, &mut 0).is_ok()
    }

    /// Reads frame `batch` of `epoch`, `used` ring bytes past the epoch's
    /// start, and the bytes it takes; or why the log ends there. Counts
    /// the bytes it reads into `bytes_read`.
    fn read_frame<D: FlashDevice>(
        &self,
        device: &mut D,
        epoch: u64,
        batch: u64,
        used: u64,
        bytes_read: &mut u64,
    ) -> std::result::Result<(LogBatch, u64), String> {
        let at = self.header.epoch_start(epoch) + used;
        let room = self.header.log_bytes - used;
        if room < NVM_FRAME_HEADER_BYTES + NVM_COMMIT_BYTES {
            return Err(format!("the NVM log fills its ring after {batch} frames"));
        }
        let unreadable = |error: Error| format!("the NVM log could not be read: {error}");
        let mut header = [0u8; NVM_FRAME_HEADER_BYTES as usize];
        self.read_ring(device, at, &mut header).map_err(unreadable)?;
        *bytes_read += header.len() as u64;
        let (length, crc) = decode_nvm_frame_header(&header).map_err(|error| error.to_string())?;
        let frame_bytes = nvm_frame_bytes(length as usize);
        if frame_bytes > room {
            return Err(format!("the NVM log ends at ring offset {at}: a frame of {length} bytes cannot be there"));
        }
        let mut commit = [0u8; NVM_COMMIT_BYTES as usize];
        self.read_ring(device, at + frame_bytes - NVM_COMMIT_BYTES, &mut commit).map_err(unreadable)?;
        *bytes_read += NVM_COMMIT_BYTES;
        if u64::from_le_bytes(commit) != nvm_commit_word(&self.header.uuid, epoch, batch, crc) {
            return Err(format!("the NVM log ends at ring offset {at}: no commit word for batch {batch}"));
        }
        let mut payload = vec![0u8; length as usize];
        self.read_ring(device, at + NVM_FRAME_HEADER_BYTES, &mut payload).map_err(unreadable)?;
        *bytes_read += u64::from(length);
        if flintfs_format::nvm_crc(&payload) != crc {
            return Err(format!("the NVM log ends at ring offset {at}: batch {batch} fails its CRC"));
        }
        match LogBatch::decode(&payload) {
            Ok(decoded) if decoded.epoch == epoch && decoded.batch == batch => Ok((decoded, frame_bytes)),
            Ok(decoded) => Err(format!(
                "the NVM log ends at ring offset {at}: batch {} of epoch {} where batch {batch} of epoch {epoch} \
                 was due",
                decoded.batch, decoded.epoch
            )),
            Err(error) => Err(format!("the NVM log ends at ring offset {at}: {error}")),
        }
    }

    /// The device ranges a ring range covers (it may wrap once).
    fn ranges(&self, at: u64, length: u64) -> [(u64, u64); 2] {
        let ring = self.header.log_bytes;
        let at = at % ring;
        let first = length.min(ring - at);
        [(self.header.log_offset + at, first), (self.header.log_offset, length - first)]
    }

    fn write_ring<D: FlashDevice>(&self, device: &mut D, at: u64, bytes: &[u8]) -> Result<()> {
        let mut done = 0usize;
        for (offset, length) in self.ranges(at, bytes.len() as u64) {
            if length > 0 {
                device.nvm_write(offset, &bytes[done..done + length as usize])?;
                done += length as usize;
            }
        }
        Ok(())
    }

    fn read_ring<D: FlashDevice>(&self, device: &mut D, at: u64, buffer: &mut [u8]) -> Result<()> {
        let mut done = 0usize;
        for (offset, length) in self.ranges(at, buffer.len() as u64) {
            if length > 0 {
                device.nvm_read(offset, &mut buffer[done..done + length as usize])?;
                done += length as usize;
            }
        }
        Ok(())
    }

    fn persist_ring<D: FlashDevice>(&self, device: &mut D, at: u64, length: u64) -> Result<()> {
        for (offset, length) in self.ranges(at, length) {
            if length > 0 {
                device.nvm_persist(offset, length)?;
            }
        }
        Ok(())
    }
}

fn crc32c_of(bytes: &[u8]) -> u32 {
    flintfs_format::nvm_crc(bytes)
}

/// A sub-block's 64-bit hash, kept in memory only (SipHash with std's
/// fixed keys).
fn subblock_hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Nodes a write-home of everything brings from NVM into memory at a time
/// (all in one checkpoint).
pub const NVM_WRITE_HOME_BATCH_NODES: usize = 4096;
/// Nodes a checkpoint sends home from an NVM past its high-water mark: at
/// most half a zone of pages.
pub fn nvm_send_home_batch_nodes(zone_pages: u64) -> usize {
    (zone_pages / 2).max(1) as usize
}
/// The store's fill, in eighths of its area, past which a checkpoint
/// writes its coldest nodes home to flash.
pub const NVM_STORE_HIGH_EIGHTHS: u64 = 7;
/// Node bytes sent home at a time when a node finds no slot of its class:
/// the coldest of that class, about four pages' worth (a few inode packs,
/// or four node pages), so a full NVM costs a batch of programs now and
/// then rather than one at every eviction.
pub const NVM_SEND_HOME_BATCH_BYTES: usize = 16 << 10;
/// Of the slot area, in eighths, at most this much goes to slots of a
/// quarter page or less (file inodes, small index pages): the rest is kept for
/// node pages (directories, buckets, map and index pages), so a crowd of
/// inodes never leaves the hottest pages without a slot. Inodes past it go
/// to flash in packs, twenty-odd to a page.
pub const NVM_SMALL_SLOTS_EIGHTHS: u64 = 4;
const _: () = assert!(NVM_SMALL_SLOTS_EIGHTHS <= 8 && NVM_STORE_HIGH_EIGHTHS <= 8);

/// Writes of one slot for one generation before its node moves to another
/// slot (the oldest freed, or a new one): a node rewritten at every
/// eviction would otherwise wear the words of its slot's header copy
/// (NVM wear: phase-change memory endures about 1e8 writes a cell).
pub const NVM_SLOT_WRITES_PER_GENERATION_MAX: u32 = 4;
/// Writes of one slot, over any generations, after which its node moves
/// on at its next write (to fresh space while there is some, else to the
/// least written free slot): a node written at every checkpoint would
/// otherwise wear its slot's word and header copies.
pub const NVM_SLOT_WRITES_BEFORE_MOVE: u64 = 8;
/// Free slots compared when one is taken: the least written of them wins.
pub const NVM_FREE_SLOTS_LOOKED_AT: usize = 32;
/// Slots a cold swap looks at, from where the last one stopped, for the
/// least written that holds a node: round the area over many swaps, so
/// every slot is looked at in turn, at a bounded cost each.
pub const NVM_SWAP_SLOTS_LOOKED_AT: usize = 256;

/// What [`NvmStore::store`] did with a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    Kept,
    /// No slot of this class is free and no new one fits.
    NoRoom(u8),
    /// It cannot be kept here (it does not encode): flash takes it.
    Refused,
}

/// Node pages kept in NVM, updated in place (FSMAC): the hot metadata's
/// home while the volume is mounted, and across mounts with `nvm_keep`.
///
/// The area after the log ring holds *slots*, one node each, laid back to
/// back from the area's start. A slot is a prefix word naming its size
/// class, a selection word, two copies of a 64-byte header (which node,
/// its home on flash, its length and CRC) and two copies of each of its
/// sub-blocks (`docs/FORMAT.md`, "NVM node slots"). The selection word
/// says which copy of each the version in force uses.
///
/// **Versioning.** A checkpoint's number is the *generation* of what it
/// commits. The first time a slot is written for a generation, each
/// sub-block that changed goes to the copy the committed version does not
/// use; later writes for the same generation overwrite those copies in
/// place. The selection word then holds both selections and the
/// generation, written as one 8-byte word. The flash checkpoint record is
/// the commit: once checkpoint G is the newest on flash, a slot whose word
/// names a generation at most G uses its pending selection, any other its
/// committed one. A cut before the record leaves every committed copy as
/// it was, since nothing for the new generation was written over one.
/// Every slot written for a generation is persisted before its record is
/// programmed (`docs/SEMANTICS.md`, "Persist ordering in NVM").
///
/// **Flash homes stay.** A node kept here that has a copy on flash keeps
/// it where it is, referenced and counted, so no pointer on flash dangles;
/// the copy here is newer. A node never written to flash is kept here
/// with a null home, and what points at it on flash (a map entry, an index
/// pointer, a directory entry) stays null: every lookup asks NVM by key
/// before it follows a pointer, as it asks the cache. Writing a node to
/// flash (write-home, the cleaner moving its home, or no room here)
/// empties its slot, and fills in what points at it.
#[derive(Debug)]
pub(crate) struct NvmStore {
    /// The area: `[start, end)` of the region, after the log ring.
    start: u64,
    end: u64,
    /// Where the next slot is made: the walk of the slots ends here.
    bump: u64,
    page_size: usize,
    /// Slot classes for this page size: the last holds a page.
    classes: usize,
    slots: Vec<NvmSlot>,
    by_key: BTreeMap<NodeKey, usize>,
    /// Empty slots by class, oldest emptied first (wear).
    free: Vec<VecDeque<usize>>,
    /// The generation in force: the newest checkpoint on flash.
    committed: u64,
    /// Slots written since the generation in force, to persist and commit.
    written: Vec<usize>,
    /// Bytes of the slots holding nodes.
    occupied_bytes: u64,
    /// Bytes of the slots made smaller than a page.
    small_bytes: u64,
    /// Why a slot could not be emptied, once one could not: from then on
    /// nothing is read from or written to the slots (an older copy left
    /// there must never be read as current), and the engine gets errors.
    failed: Option<String>,
    /// Whether slots are persisted before the checkpoint that commits
    /// them. Off only for the test that shows what the barrier is for.
    barrier: bool,
    clock: u64,
    /// Where the next cold swap starts looking (`NVM_SWAP_SLOTS_LOOKED_AT`).
    swap_cursor: usize,
}

#[derive(Debug)]
struct NvmSlot {
    offset: u64,
    class: u8,
    /// The selection word as NVM holds it.
    word: NvmSlotWord,
    /// The selection in force at the committed generation, and the one of
    /// the newest version written (equal unless written since).
    committed: u16,
    selection: u16,
    header: Option<NvmSlotHeader>,
    /// A 64-bit hash of each sub-block's copy in force, where known: a
    /// write skips the sub-blocks that did not change (64 bits, so a
    /// changed sub-block is never taken for unchanged by chance over a
    /// device's life; 32 would be, about once in 4e9 writes).
    subblock_hashes: [u64; NVM_SLOT_SUBBLOCKS],
    crcs_known: u16,
    written: bool,
    /// The word above was set back at mount (a generation that never
    /// landed) and is written with the next persist, not at mount.
    word_unwritten: bool,
    used_at: u64,
    /// Writes since the generation changed or the slot was taken.
    writes: u32,
    /// Writes since the mount (wear, as far as this mount knows).
    lifetime_writes: u64,
}

impl NvmSlot {
    /// An empty slot of `class` at `offset`, as `make_slot` leaves it: word
    /// zero, header copy 0 zero.
    fn new(offset: u64, class: u8) -> NvmSlot {
        NvmSlot {
            offset,
            class,
            word: NvmSlotWord::default(),
            committed: 0,
            selection: 0,
            header: None,
            subblock_hashes: [0; NVM_SLOT_SUBBLOCKS],
            crcs_known: 0,
            written: false,
            word_unwritten: false,
            used_at: 0,
            writes: 0,
            lifetime_writes: 0,
        }
    }

    /// Makes copy `copy` of part `bit` the one the newest version uses.
    fn select(&mut self, bit: u32, copy: u16) {
        self.selection = (self.selection & !(1 << bit)) | copy << bit;
    }
}

fn key_fields(key: NodeKey) -> (u8, u8, u64, u64) {
    use flintfs_format::{
        NVM_SLOT_KIND_FILE, NVM_SLOT_KIND_INDEX, NVM_SLOT_KIND_MAP, NVM_SLOT_KIND_MAP_DIRECTORY, NVM_SLOT_KIND_SLOT,
    };
    match key {
        NodeKey::Index { level, ino, number } => (NVM_SLOT_KIND_INDEX, level, ino, number),
        NodeKey::File(ino) => (NVM_SLOT_KIND_FILE, 0, ino, 0),
        NodeKey::Slot(slot) => (NVM_SLOT_KIND_SLOT, 0, u64::from(slot), 0),
        NodeKey::Map(page) => (NVM_SLOT_KIND_MAP, 0, u64::from(page), 0),
        NodeKey::MapDirectory(page) => (NVM_SLOT_KIND_MAP_DIRECTORY, 0, u64::from(page), 0),
    }
}

fn key_of(header: &NvmSlotHeader) -> Option<NodeKey> {
    use flintfs_format::{
        NVM_SLOT_KIND_FILE, NVM_SLOT_KIND_INDEX, NVM_SLOT_KIND_MAP, NVM_SLOT_KIND_MAP_DIRECTORY, NVM_SLOT_KIND_SLOT,
    };
    let small = u32::try_from(header.first).ok();
    let plain = header.level == 0 && header.second == 0;
    Some(match header.kind {
        NVM_SLOT_KIND_INDEX if header.level < flintfs_format::INDEX_HEIGHT_MAX => {
            NodeKey::Index { level: header.level, ino: header.first, number: header.second }
        }
        NVM_SLOT_KIND_FILE if plain => NodeKey::File(header.first),
        NVM_SLOT_KIND_SLOT if plain => NodeKey::Slot(small?),
        NVM_SLOT_KIND_MAP if plain => NodeKey::Map(small?),
        NVM_SLOT_KIND_MAP_DIRECTORY if plain => NodeKey::MapDirectory(small?),
        _ => return None,
    })
}

/// Which copy (0 or 1) of part `bit` a write for the current generation
/// goes to: the one already written for it, else the one the committed
/// version does not use.
fn copy_for(slot: &NvmSlot, bit: u32) -> u16 {
    let mask = 1u16 << bit;
    if (slot.selection ^ slot.committed) & mask != 0 {
        (slot.selection >> bit) & 1
    } else {
        ((slot.committed >> bit) & 1) ^ 1
    }
}

impl NvmStore {
    /// The store in the area after the header's log ring, as checkpoint
    /// `committed` left it, which says it keeps `needed` nodes here. With
    /// none needed, the area starts afresh. `None` when no slot fits.
    pub fn open<D: FlashDevice>(
        device: &mut D,
        header: &NvmHeader,
        page_size: usize,
        committed: u64,
        needed: u32,
        barrier: bool,
    ) -> Result<Option<NvmStore>> {
        let nvm_size_bytes = device.geometry().nvm_size_bytes;
        let start = header.slots_offset();
        let classes = nvm_slot_classes(page_size);
        let largest = nvm_slot_bytes(classes as u8 - 1);
        if nvm_size_bytes.saturating_sub(start) < largest {
            if needed > 0 {
                return Err(Error::corrupt(format!(
                    "the checkpoint keeps {needed} nodes in NVM, and the NVM region has no room for any"
                )));
            }
            return Ok(None);
        }
        if committed >= flintfs_format::NVM_SLOT_GENERATION_MAX {
            return Err(Error::invalid(format!(
                "checkpoint {committed} is past the {} NVM slot generations",
                flintfs_format::NVM_SLOT_GENERATION_MAX
            )));
        }
        let mut store = NvmStore {
            start,
            end: nvm_size_bytes,
            bump: start,
            page_size,
            classes,
            slots: Vec::new(),
            by_key: BTreeMap::new(),
            free: vec![VecDeque::new(); classes],
            committed,
            written: Vec::new(),
            occupied_bytes: 0,
            small_bytes: 0,
            failed: None,
            barrier,
            clock: 0,
            swap_cursor: 0,
        };
        if needed == 0 {
            // Nothing here is the file system's: the slots start afresh
            // from the area's start, and nothing is written until one is
            // made. The first made there ends the walk after it (as every
            // slot made does), so older slots past it are never read; and
            // until a checkpoint keeps a node here, no mount walks at all.
            return Ok(Some(store));
        }
        store.walk(device)?;
        if store.by_key.len() != needed as usize {
            return Err(Error::corrupt(format!(
                "the checkpoint keeps {needed} nodes in NVM, and its slots hold {}",
                store.by_key.len()
            )));
        }
        Ok(Some(store))
    }

    /// Reads every slot from the area's start to the first word that is
    /// no slot's prefix. A slot whose word names a generation past the one
    /// in force was written for a checkpoint that never landed: its word
    /// is set back to the committed selection, so that a later checkpoint
    /// with the same number does not take it up.
    fn walk<D: FlashDevice>(&mut self, device: &mut D) -> Result<()> {
        let mut at = self.start;
        while at + 8 <= self.end {
            let Some(class) = decode_nvm_slot_prefix(self.read_word(device, at)?) else { break };
            if class as usize >= self.classes {
                return Err(Error::corrupt(format!("an NVM slot at {at} is of class {class}, past a page")));
            }
            let bytes = nvm_slot_bytes(class);
            if at + bytes > self.end {
                return Err(Error::corrupt(format!("an NVM slot at {at} runs past the region's end")));
            }
            let mut word = NvmSlotWord::decode(self.read_word(device, at + NVM_SLOT_WORD_OFFSET)?);
            let selection = word.in_force(self.committed);
            // A word naming a generation that never landed is set back to
            // the selection in force: in memory now, on NVM with the next
            // persist, before any checkpoint that could take the same
            // number lands (a mount writes nothing to NVM, and a mount that
            // fails leaves it as it found it).
            let stale = word.generation > self.committed;
            if stale {
                word = NvmSlotWord { committed: selection, pending: selection, generation: self.committed };
            }
            let copy = u64::from((selection >> NVM_SLOT_HEADER_BIT) & 1);
            let mut bytes_read = [0u8; NVM_SLOT_HEADER_BYTES];
            device.nvm_read(at + NVM_SLOT_HEADERS_OFFSET + copy * NVM_SLOT_HEADER_BYTES as u64, &mut bytes_read)?;
            let header = NvmSlotHeader::decode(&bytes_read, self.page_size)
                .map_err(|error| Error::corrupt(format!("the NVM slot at {at}: {error}")))?;
            let index = self.slots.len();
            let key = match &header {
                Some(header) => Some(key_of(header).ok_or_else(|| {
                    Error::corrupt(format!("the NVM slot at {at} names no node ({} {})", header.kind, header.level))
                })?),
                None => None,
            };
            if let Some(header) = &header {
                if header.used_bytes as usize > nvm_slot_data_bytes(class) {
                    return Err(Error::corrupt(format!("the NVM slot at {at} holds more than it has room for")));
                }
            }
            if self.is_small(class) {
                self.small_bytes += bytes;
            }
            self.slots.push(NvmSlot { word, committed: selection, selection, header, ..NvmSlot::new(at, class) });
            if stale {
                let slot = self.slots.last_mut().expect("pushed");
                slot.written = true;
                slot.word_unwritten = true;
                self.written.push(index);
            }
            match key {
                Some(key) => {
                    if self.by_key.insert(key, index).is_some() {
                        return Err(Error::corrupt(format!("{key:?} is in two NVM slots")));
                    }
                    self.count(bytes, 1);
                }
                None => self.free[class as usize].push_back(index),
            }
            at += bytes;
        }
        self.bump = at;
        Ok(())
    }

    fn read_word<D: FlashDevice>(&self, device: &mut D, at: u64) -> Result<u64> {
        let mut bytes = [0u8; 8];
        device.nvm_read(at, &mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn write_word<D: FlashDevice>(&self, device: &mut D, at: u64, word: u64) -> Result<()> {
        device.nvm_write(at, &word.to_le_bytes())?;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// A read-only mount's [`NvmStore::remove`]: the store stops naming
    /// `key`, and writes nothing (the slot keeps its bytes; no slot is
    /// made on a read-only mount, so none is taken again, and the space
    /// counts, which only the choice of slots reads, stay as they were).
    pub(crate) fn forget(&mut self, key: NodeKey) {
        self.by_key.remove(&key);
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether slots were written since the generation in force.
    pub fn has_uncommitted(&self) -> bool {
        !self.written.is_empty()
    }

    pub fn contains(&self, key: NodeKey) -> bool {
        self.by_key.contains_key(&key)
    }

    /// A kept node's home on flash.
    pub fn home_of(&self, key: NodeKey) -> Option<Pointer> {
        let &index = self.by_key.get(&key)?;
        self.slots[index].header.map(|header| header.home)
    }

    /// The first `count` keys, children first.
    pub fn first_keys(&self, count: usize) -> Vec<NodeKey> {
        self.by_key.keys().take(count).copied().collect()
    }

    /// The `count` keys written or read longest ago, of class `class` if
    /// given, and none of `excluded`.
    pub fn coldest_keys(&self, count: usize, class: Option<u8>, excluded: impl Fn(NodeKey) -> bool) -> Vec<NodeKey> {
        let mut keys: Vec<(u64, NodeKey)> = self
            .by_key
            .iter()
            .filter(|(&key, &index)| class.is_none_or(|class| self.slots[index].class == class) && !excluded(key))
            .map(|(&key, &index)| (self.slots[index].used_at, key))
            .collect();
        if keys.len() > count && count > 0 {
            keys.select_nth_unstable(count - 1);
            keys.truncate(count);
        }
        keys.truncate(count);
        keys.into_iter().map(|(_, key)| key).collect()
    }

    /// Nodes of class `class` sent home at a time.
    pub fn send_home_batch(class: u8) -> usize {
        (NVM_SEND_HOME_BATCH_BYTES / nvm_slot_data_bytes(class)).max(1)
    }

    /// Whether the slots in use fill the area past the high-water mark.
    pub fn over_high_water(&self) -> bool {
        self.occupied_bytes * 8 > (self.end - self.start) * NVM_STORE_HIGH_EIGHTHS
    }

    fn count(&mut self, slot_bytes: u64, sign: i64) {
        self.occupied_bytes =
            if sign > 0 { self.occupied_bytes + slot_bytes } else { self.occupied_bytes.saturating_sub(slot_bytes) };
    }

    /// Whether slots of `class` hold at most a quarter page (file inodes,
    /// small index pages): those [`NVM_SMALL_SLOTS_EIGHTHS`] limits.
    fn is_small(&self, class: u8) -> bool {
        (class as usize) + 2 < self.classes
    }

    fn class_for(&self, used: usize) -> Option<u8> {
        (0..self.classes as u8).find(|&class| nvm_slot_data_bytes(class) >= used)
    }

    fn subblock_at(&self, slot: &NvmSlot, subblock: usize, copy: u16) -> u64 {
        let subblock_bytes = nvm_subblock_bytes(slot.class);
        slot.offset + NVM_SLOT_DATA_OFFSET + ((2 * subblock + usize::from(copy)) * subblock_bytes) as u64
    }

    /// Makes a slot of `class` at the end of the ones there are: the word
    /// after it is zeroed and persisted before its prefix is, so the walk
    /// never runs past the last slot into older bytes.
    fn make_slot<D: FlashDevice>(&mut self, device: &mut D, class: u8) -> Result<Option<usize>> {
        let bytes = nvm_slot_bytes(class);
        let small = self.is_small(class);
        if self.bump + bytes > self.end
            || (small && (self.small_bytes + bytes) * 8 > (self.end - self.start) * NVM_SMALL_SLOTS_EIGHTHS)
        {
            return Ok(None);
        }
        if small {
            self.small_bytes += bytes;
        }
        let at = self.bump;
        let next = at + bytes;
        if next + 8 <= self.end {
            self.write_word(device, next, 0)?;
            device.nvm_persist(next, 8)?;
        }
        // An empty slot: selection word zero, header copy 0 zero.
        let zeros = [0u8; NVM_SLOT_HEADERS_OFFSET as usize + NVM_SLOT_HEADER_BYTES];
        device.nvm_write(at + NVM_SLOT_WORD_OFFSET, &zeros[NVM_SLOT_WORD_OFFSET as usize..])?;
        device.nvm_persist(at + NVM_SLOT_WORD_OFFSET, zeros.len() as u64 - NVM_SLOT_WORD_OFFSET)?;
        self.write_word(device, at, nvm_slot_prefix(class))?;
        device.nvm_persist(at, 8)?;
        self.bump = next;
        self.slots.push(NvmSlot::new(at, class));
        Ok(Some(self.slots.len() - 1))
    }

    /// Keeps `node` here as `key`'s newest version, for checkpoint
    /// `generation`, if it has room and the node encodes.
    ///
    /// A write that fails part way (NVM gone, as at a power cut) leaves
    /// slots' selections in memory ahead of their words on NVM: the store
    /// is then out of use for good, as when a slot cannot be emptied, so
    /// nothing later builds on them. The next mount reads the slots as NVM
    /// has them.
    pub fn store<D: FlashDevice>(
        &mut self,
        device: &mut D,
        key: NodeKey,
        node: &Node,
        home: Pointer,
        generation: u64,
    ) -> Result<Keep> {
        let result = self.store_unguarded(device, key, node, home, generation);
        if let (Err(error), None) = (&result, &self.failed) {
            self.failed = Some(format!("{key:?} could not be written to NVM: {}", error.message));
        }
        result
    }

    fn store_unguarded<D: FlashDevice>(
        &mut self,
        device: &mut D,
        key: NodeKey,
        node: &Node,
        home: Pointer,
        generation: u64,
    ) -> Result<Keep> {
        debug_assert!(generation > self.committed);
        self.usable()?;
        let Some((page, used)) = node.encode_unchecked(self.page_size) else { return Ok(Keep::Refused) };
        let Some(class) = self.class_for(used as usize) else { return Ok(Keep::Refused) };
        // A slot at least the node's size is kept (it moves to a smaller
        // one only when it moves for wear).
        let current = self.by_key.get(&key).copied().filter(|&index| self.slots[index].class >= class);
        let index = match current {
            Some(index)
                if self.slots[index].writes < NVM_SLOT_WRITES_PER_GENERATION_MAX
                    && (self.slots[index].lifetime_writes == 0
                        || !self.slots[index].lifetime_writes.is_multiple_of(NVM_SLOT_WRITES_BEFORE_MOVE)) =>
            {
                index
            }
            // Written often: it moves on (wear) to fresh space, else to the
            // least written free slot of its class; with neither, it stays
            // where it is. (Fresh space first spreads the writes widest; the
            // cap on small slots keeps inodes from taking the area.)
            Some(index) => {
                let taken = match self.make_slot(device, class)? {
                    Some(taken) => Some(taken),
                    None => match self.take_free(class) {
                        // With no fresh space the free slots are the ones
                        // hot nodes left: a cold node takes the worn one,
                        // and this node the cold one's.
                        Some(worn) => Some(self.swap_cold_into(device, worn, index, generation)?),
                        None => None,
                    },
                };
                match taken {
                    Some(taken) => {
                        self.vacate(device, index, generation)?;
                        taken
                    }
                    None => index,
                }
            }
            None => {
                // A new slot: fresh space first, then the least written of
                // the oldest freed slots of its class or a larger one, so
                // every slot takes writes before any takes many (wear).
                let taken = match self.make_slot(device, class)? {
                    Some(index) => Some(index),
                    None => (class..self.classes as u8).find_map(|larger| self.take_free(larger)),
                };
                let Some(taken) = taken else { return Ok(Keep::NoRoom(class)) };
                if let Some(old) = self.by_key.get(&key).copied() {
                    self.vacate(device, old, generation)?;
                }
                taken
            }
        };
        self.write_node(device, index, key, &page[..used as usize], home, generation)?;
        Ok(Keep::Kept)
    }

    /// Static wear levelling: once the area has no fresh space, the free
    /// slots are mostly the ones hot nodes moved out of, and hot nodes
    /// moving among them alone would wear those few slots' words (a
    /// 250,000-file create_fsync took its hottest word from 270 to 392
    /// writes per million operations that way). So when the free slot
    /// `worn` is written more than the least written slot of its class that
    /// holds a node (looked for round the area), that cold node moves into
    /// `worn`, where it will rest, and its slot is returned for the hot
    /// node instead. Either way the slot returned is taken. The cold node
    /// keeps its age for `coldest_keys`. Both writes are ordinary writes
    /// for `generation`: the committed versions stay until it lands.
    fn swap_cold_into<D: FlashDevice>(
        &mut self,
        device: &mut D,
        worn: usize,
        hot: usize,
        generation: u64,
    ) -> Result<usize> {
        let class = self.slots[worn].class;
        let count = self.slots.len();
        let mut coldest: Option<usize> = None;
        let mut looked = 0;
        let mut step = 0;
        while looked < NVM_SWAP_SLOTS_LOOKED_AT && step < count {
            let candidate = (self.swap_cursor + step) % count;
            step += 1;
            let slot = &self.slots[candidate];
            if slot.class != class || slot.header.is_none() || candidate == hot {
                continue;
            }
            looked += 1;
            if coldest.is_none_or(|best| slot.lifetime_writes < self.slots[best].lifetime_writes) {
                coldest = Some(candidate);
            }
        }
        self.swap_cursor = (self.swap_cursor + step) % count.max(1);
        let Some(cold) = coldest else { return Ok(worn) };
        if self.slots[cold].lifetime_writes + NVM_SLOT_WRITES_BEFORE_MOVE > self.slots[worn].lifetime_writes {
            return Ok(worn);
        }
        let header = self.slots[cold].header.expect("a slot holding a node");
        let key = key_of(&header).expect("a header this store wrote or checked");
        let used_at = self.slots[cold].used_at;
        // A cold node that does not read back whole stays where it is: the
        // swap is for wear, and its own lookups report the damage.
        let Ok(Some(cached)) = self.load(device, key) else { return Ok(worn) };
        let Some((page, used)) = cached.node.encode_unchecked(self.page_size) else { return Ok(worn) };
        self.vacate(device, cold, generation)?;
        let freed = self.free[class as usize].pop_back();
        debug_assert_eq!(freed, Some(cold), "the slot just vacated is the last freed");
        self.slots[cold].writes = 0;
        self.write_node(device, worn, key, &page[..used as usize], cached.home, generation)?;
        self.slots[worn].used_at = used_at;
        Ok(cold)
    }

    /// Takes the least written of the first few free slots of `class`.
    fn take_free(&mut self, class: u8) -> Option<usize> {
        let free = &mut self.free[class as usize];
        let slots = &self.slots;
        let (position, _) = free
            .iter()
            .take(NVM_FREE_SLOTS_LOOKED_AT)
            .enumerate()
            .min_by_key(|(_, &index)| slots[index].lifetime_writes)?;
        let index = free.remove(position).expect("found above");
        self.slots[index].writes = 0;
        Some(index)
    }

    fn begin(&mut self, index: usize, generation: u64) {
        let slot = &mut self.slots[index];
        if slot.word.generation != generation {
            debug_assert_eq!(slot.selection, slot.committed, "a slot written for an uncommitted generation");
            slot.selection = slot.committed;
            slot.writes = 0;
        }
        slot.writes += 1;
        slot.lifetime_writes += 1;
        if !slot.written {
            slot.written = true;
            self.written.push(index);
        }
    }

    fn finish<D: FlashDevice>(&mut self, device: &mut D, index: usize, generation: u64) -> Result<()> {
        let slot = &mut self.slots[index];
        let word = NvmSlotWord { committed: slot.committed, pending: slot.selection, generation };
        if word != slot.word || slot.word_unwritten {
            device.nvm_write(slot.offset + NVM_SLOT_WORD_OFFSET, &word.encode().to_le_bytes())?;
            slot.word = word;
            slot.word_unwritten = false;
        }
        Ok(())
    }

    fn write_header<D: FlashDevice>(
        &mut self,
        device: &mut D,
        index: usize,
        header: Option<NvmSlotHeader>,
    ) -> Result<()> {
        let slot = &mut self.slots[index];
        if slot.header == header {
            // The copy selected now says it already.
            return Ok(());
        }
        let copy = copy_for(slot, NVM_SLOT_HEADER_BIT);
        let bytes = header.map_or([0u8; NVM_SLOT_HEADER_BYTES], |header| header.encode());
        device.nvm_write(
            slot.offset + NVM_SLOT_HEADERS_OFFSET + u64::from(copy) * NVM_SLOT_HEADER_BYTES as u64,
            &bytes,
        )?;
        slot.select(NVM_SLOT_HEADER_BIT, copy);
        slot.header = header;
        Ok(())
    }

    fn write_node<D: FlashDevice>(
        &mut self,
        device: &mut D,
        index: usize,
        key: NodeKey,
        bytes: &[u8],
        home: Pointer,
        generation: u64,
    ) -> Result<()> {
        self.begin(index, generation);
        let previous = self.slots[index].header;
        let class = self.slots[index].class;
        let slot_bytes = nvm_slot_bytes(class);
        let subblock_bytes = nvm_subblock_bytes(class);
        let mut subblock = vec![0u8; subblock_bytes];
        for (number, chunk) in bytes.chunks(subblock_bytes).enumerate() {
            subblock[..chunk.len()].copy_from_slice(chunk);
            subblock[chunk.len()..].fill(0);
            let hash = subblock_hash(&subblock);
            let slot = &self.slots[index];
            if slot.crcs_known >> number & 1 == 1 && slot.subblock_hashes[number] == hash {
                continue;
            }
            let copy = copy_for(slot, number as u32);
            let at = self.subblock_at(slot, number, copy);
            device.nvm_write(at, &subblock)?;
            let slot = &mut self.slots[index];
            slot.select(number as u32, copy);
            slot.subblock_hashes[number] = hash;
            slot.crcs_known |= 1 << number;
        }
        let (kind, level, first, second) = key_fields(key);
        let header =
            NvmSlotHeader { kind, level, first, second, used_bytes: bytes.len() as u32, home, crc: crc32c_of(bytes) };
        self.write_header(device, index, Some(header))?;
        self.finish(device, index, generation)?;
        if let Some(previous) = previous {
            let old = key_of(&previous).expect("a header this store wrote or checked");
            self.count(slot_bytes, -1);
            if old != key {
                self.by_key.remove(&old);
            }
        }
        self.count(slot_bytes, 1);
        self.by_key.insert(key, index);
        self.clock += 1;
        self.slots[index].used_at = self.clock;
        Ok(())
    }

    /// Empties a slot for `generation`: its committed node stays until the
    /// checkpoint lands.
    fn vacate<D: FlashDevice>(&mut self, device: &mut D, index: usize, generation: u64) -> Result<()> {
        self.begin(index, generation);
        let previous = self.slots[index].header;
        self.write_header(device, index, None)?;
        self.finish(device, index, generation)?;
        if let Some(previous) = previous {
            let old = key_of(&previous).expect("a header this store wrote or checked");
            self.by_key.remove(&old);
            let slot_bytes = nvm_slot_bytes(self.slots[index].class);
            self.count(slot_bytes, -1);
        }
        self.free[self.slots[index].class as usize].push_back(index);
        Ok(())
    }

    /// Stops keeping `key` here (it went to flash, or is gone). A slot
    /// that cannot be emptied fails the store for good.
    pub fn remove<D: FlashDevice>(&mut self, device: &mut D, key: NodeKey, generation: u64) -> Result<()> {
        self.usable()?;
        let Some(&index) = self.by_key.get(&key) else { return Ok(()) };
        let result = self.vacate(device, index, generation);
        if let Err(error) = &result {
            // Out of use from now on, so the older copy left in the slot
            // is never read: the node is gone from the store's memory too.
            self.failed = Some(format!("{key:?} could not be dropped from NVM: {}", error.message));
            self.by_key.remove(&key);
        }
        result
    }

    /// An error once a slot could not be emptied.
    fn usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(Error::corrupt(format!("the NVM slots are out of use: {why}"))),
            None => Ok(()),
        }
    }

    /// Reads `key`'s newest version, with its home on flash. Bytes that do
    /// not read back whole are an error: nothing falls back to the older
    /// copy on flash.
    pub fn load<D: FlashDevice>(&mut self, device: &mut D, key: NodeKey) -> Result<Option<Cached>> {
        // Out of use first: a store that failed part way may have
        // forgotten a node it was moving, which must not read as absent.
        self.usable()?;
        let Some(&index) = self.by_key.get(&key) else { return Ok(None) };
        let header = self.slots[index].header.expect("a slot found by key holds a node");
        let mut page = vec![0u8; self.page_size];
        let used = header.used_bytes as usize;
        let subblock_bytes = nvm_subblock_bytes(self.slots[index].class);
        let subblocks = used.div_ceil(subblock_bytes);
        for number in 0..subblocks {
            let slot = &self.slots[index];
            let copy = (slot.selection >> number) & 1;
            let range = number * subblock_bytes..(number + 1) * subblock_bytes;
            device.nvm_read(self.subblock_at(slot, number, copy), &mut page[range])?;
        }
        if crc32c_of(&page[..used]) != header.crc {
            return Err(Error::corrupt(format!("{key:?} kept in NVM at {}: CRC mismatch", self.slots[index].offset)));
        }
        let node =
            Node::decode_unchecked(&page).map_err(|error| Error::corrupt(format!("{key:?} kept in NVM: {error}")))?;
        self.clock += 1;
        let slot = &mut self.slots[index];
        slot.used_at = self.clock;
        for number in 0..subblocks {
            let range = number * subblock_bytes..(number + 1) * subblock_bytes;
            slot.subblock_hashes[number] = subblock_hash(&page[range]);
            slot.crcs_known |= 1 << number;
        }
        Ok(Some(Cached { node, home: header.home }))
    }

    /// Persists every slot written since the generation in force: what
    /// the checkpoint about to be programmed commits.
    pub fn persist<D: FlashDevice>(&mut self, device: &mut D) -> Result<()> {
        self.usable()?;
        if !self.barrier {
            return Ok(());
        }
        for &index in &self.written {
            let slot = &mut self.slots[index];
            if slot.word_unwritten {
                device.nvm_write(slot.offset + NVM_SLOT_WORD_OFFSET, &slot.word.encode().to_le_bytes())?;
                slot.word_unwritten = false;
            }
            device.nvm_persist(slot.offset, nvm_slot_bytes(slot.class))?;
        }
        Ok(())
    }

    /// Checkpoint `generation` is on flash: what was written for it is in
    /// force.
    pub fn committed(&mut self, generation: u64) {
        for index in std::mem::take(&mut self.written) {
            let slot = &mut self.slots[index];
            // Written for this generation, or a word set back at mount.
            debug_assert!(slot.word.generation == generation || slot.word.committed == slot.word.pending);
            slot.committed = slot.selection;
            slot.written = false;
        }
        self.committed = generation;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flintfs_flash::{DeviceOptions, FaultConfig, Geometry, MemoryFlash};

    const PAGE: usize = 4096;

    fn device() -> MemoryFlash {
        let geometry = Geometry {
            page_size_bytes: PAGE as u32,
            oob_size_bytes: 128,
            block_pages: 16,
            zone_blocks: 4,
            zone_count: 32,
            open_zones_max: 8,
            nvm_size_bytes: 256 << 10,
        };
        MemoryFlash::memory(geometry, DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() })
            .unwrap()
    }

    fn header() -> NvmHeader {
        NvmHeader::for_region([3; 16], 256 << 10, 4288)
    }

    fn open(device: &mut MemoryFlash, committed: u64, needed: u32) -> NvmStore {
        NvmStore::open(device, &header(), PAGE, committed, needed, true).unwrap().expect("room for slots")
    }

    /// A bucket of `count / 6` entries, each naming inode `value`.
    fn map(value: u64, count: usize) -> Node {
        let entries = (0..count / 6)
            .map(|index| flintfs_format::Entry {
                hash: index as u64,
                ino: value,
                target: flintfs_format::Target::Physical(Pointer::NULL),
                file_type: flintfs_format::FileType::Regular,
                name: format!("entry-{index:05}").into_bytes(),
            })
            .collect();
        Node::Bucket { directory: 1, slot: 5, local_depth: 0, next: flintfs_format::SLOT_NONE, entries }
    }

    /// The inode each entry of a kept bucket names.
    fn entries(store: &mut NvmStore, device: &mut MemoryFlash, key: NodeKey) -> Vec<u64> {
        match store.load(device, key).unwrap().expect("kept").node {
            Node::Bucket { entries, .. } => entries.iter().map(|entry| entry.ino).collect(),
            other => panic!("{other:?}"),
        }
    }

    fn cut(device: &mut MemoryFlash, seed: u64) {
        device.power_cut(seed).unwrap();
        device.power_on();
    }

    /// FSMAC's versioning under cuts: what was written for a checkpoint
    /// that never landed is never read, whether or not its words reached
    /// NVM, and the version the last checkpoint committed is read whole.
    #[test]
    fn a_cut_before_the_checkpoint_lands_leaves_the_committed_version() {
        let key = NodeKey::Map(0);
        for seed in 0..32 {
            let mut device = device();
            let mut store = open(&mut device, 5, 0);
            assert_eq!(store.store(&mut device, key, &map(1, 400), Pointer::NULL, 6).unwrap(), Keep::Kept);
            store.persist(&mut device).unwrap();
            store.committed(6);
            // Version 2, never persisted; version 3 persisted, but its
            // checkpoint record never lands.
            assert_eq!(store.store(&mut device, key, &map(2, 400), Pointer::NULL, 7).unwrap(), Keep::Kept);
            if seed % 2 == 1 {
                assert_eq!(store.store(&mut device, key, &map(3, 480), Pointer::NULL, 7).unwrap(), Keep::Kept);
                store.persist(&mut device).unwrap();
            }
            cut(&mut device, seed);
            let mut store = open(&mut device, 6, 1);
            assert_eq!(entries(&mut store, &mut device, key), vec![1; 66], "seed {seed}");
            // The next checkpoint has the same number the lost one had:
            // nothing of the lost version comes back with it.
            assert_eq!(store.store(&mut device, key, &map(4, 100), Pointer::NULL, 7).unwrap(), Keep::Kept);
            store.persist(&mut device).unwrap();
            store.committed(7);
            let mut store = open(&mut device, 7, 1);
            assert_eq!(entries(&mut store, &mut device, key), vec![4; 16], "seed {seed}");
        }
    }

    /// Static wear levelling: with the area full and two slots free, a hot
    /// node rewritten 400 times does not wear those two slots (about 130
    /// writes each, moving among them alone): cold nodes move into the
    /// worn slots, so the writes spread over every slot, and every cold
    /// node still reads back, before and after a cut.
    #[test]
    fn a_hot_node_in_a_full_area_wears_every_slot_a_little() {
        let mut device = device();
        let mut store = open(&mut device, 1, 0);
        let mut cold = Vec::new();
        for number in 1u32.. {
            match store
                .store(&mut device, NodeKey::Map(number), &map(u64::from(number), 480), Pointer::NULL, 2)
                .unwrap()
            {
                Keep::Kept => cold.push(number),
                _ => break,
            }
        }
        assert!(cold.len() > 10, "{} slots", cold.len());
        for number in cold.drain(..2) {
            store.remove(&mut device, NodeKey::Map(number), 2).unwrap();
        }
        store.persist(&mut device).unwrap();
        store.committed(2);
        let hot = NodeKey::Map(0);
        let writes = 400u64;
        for write in 0..writes {
            let generation = 3 + write / 4;
            assert_eq!(store.store(&mut device, hot, &map(write, 480), Pointer::NULL, generation).unwrap(), Keep::Kept);
            if write % 4 == 3 {
                store.persist(&mut device).unwrap();
                store.committed(generation);
            }
        }
        let slots = store.slots.len() as u64;
        let most = store.slots.iter().map(|slot| slot.lifetime_writes).max().unwrap();
        assert!(most <= 2 * writes / slots + 2 * NVM_SLOT_WRITES_BEFORE_MOVE, "{most} writes of one of {slots} slots");
        for &number in &cold {
            assert_eq!(entries(&mut store, &mut device, NodeKey::Map(number)), vec![u64::from(number); 80]);
        }
        cut(&mut device, 3);
        let generation = 3 + (writes - 1) / 4;
        let mut store = open(&mut device, generation, cold.len() as u32 + 1);
        for &number in &cold {
            assert_eq!(entries(&mut store, &mut device, NodeKey::Map(number)), vec![u64::from(number); 80]);
        }
        assert_eq!(entries(&mut store, &mut device, hot), vec![writes - 1; 80]);
    }

    /// A version persisted before its checkpoint landed is the one read.
    #[test]
    fn a_landed_checkpoint_makes_its_version_the_one_read() {
        let key = NodeKey::Slot(9);
        let mut device = device();
        let mut store = open(&mut device, 1, 0);
        assert_eq!(store.store(&mut device, key, &map(7, 300), Pointer::NULL, 2).unwrap(), Keep::Kept);
        store.persist(&mut device).unwrap();
        store.committed(2);
        assert_eq!(store.store(&mut device, key, &map(8, 300), Pointer::NULL, 3).unwrap(), Keep::Kept);
        store.persist(&mut device).unwrap();
        cut(&mut device, 1);
        let mut store = open(&mut device, 3, 1);
        assert_eq!(entries(&mut store, &mut device, key), vec![8; 50]);
    }

    /// Sub-blocks that did not change are not written again: a change to
    /// one entry of a full map page writes one sub-block, the header and
    /// the word, not the page.
    #[test]
    fn a_small_change_writes_its_sub_block_not_the_page() {
        let key = NodeKey::Map(0);
        let mut device = device();
        let mut store = open(&mut device, 1, 0);
        let full = 480;
        assert_eq!(store.store(&mut device, key, &map(5, full), Pointer::NULL, 2).unwrap(), Keep::Kept);
        store.persist(&mut device).unwrap();
        store.committed(2);
        let mut changed = map(5, full);
        if let Node::Bucket { entries, .. } = &mut changed {
            entries.last_mut().expect("entries").ino = 6;
        }
        let before = device.counters().nvm_bytes_written;
        assert_eq!(store.store(&mut device, key, &changed, Pointer::NULL, 3).unwrap(), Keep::Kept);
        let written = device.counters().nvm_bytes_written - before;
        let subblock = nvm_subblock_bytes(4) as u64;
        assert!(written <= subblock + NVM_SLOT_HEADER_BYTES as u64 + 8, "{written} bytes for one entry");
        store.persist(&mut device).unwrap();
        store.committed(3);
        let mut store = open(&mut device, 3, 1);
        let mut expected = vec![5; full / 6];
        *expected.last_mut().expect("entries") = 6;
        assert_eq!(entries(&mut store, &mut device, key), expected);
    }

    /// Hostile NVM whose checksums hold: a slot that names the root
    /// directory but holds a map page is refused when read (an error, as
    /// for a stray pointer on flash), never indexed into.
    #[test]
    fn a_slot_holding_the_wrong_node_is_an_error_not_a_panic() {
        use crate::fs::{Fs, FsOptions};
        let clock = crate::ManualClock::new(1_700_000_000_000_000_000);
        let device = device();
        let device = Fs::format(device, &crate::MkfsOptions::new([3; 16], 0), Box::new(clock.clone())).unwrap();
        let keep = FsOptions { nvm_keep: true, ..FsOptions::default() };
        let (mut fs, _) = Fs::mount(device, keep.clone(), Box::new(clock.clone())).unwrap();
        for index in 0..20 {
            fs.create(1, format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
        }
        let mut device = fs.unmount().unwrap();
        let (committed, kept) = device_checkpoint(&mut device, &clock);
        {
            // The engine's NVM offsets are the wear levelling's logical
            // ones: the store here works through the same layer.
            let mut view = crate::protect::Protected::new(&mut device);
            let header = NvmHeader::for_region([3; 16], view.geometry().nvm_size_bytes, 4288);
            let mut store = NvmStore::open(&mut view, &header, PAGE, committed, kept, true).unwrap().unwrap();
            // The map page's key, holding a bucket: whatever reads the map
            // would index into it as a map. Written for the next checkpoint,
            // then its word made to name the landed one, so it is in force.
            assert_eq!(
                store.store(&mut view, NodeKey::Map(0), &map(1, 60), Pointer::NULL, committed + 1).unwrap(),
                Keep::Kept
            );
            store.persist(&mut view).unwrap();
            let slot = &store.slots[store.by_key[&NodeKey::Map(0)]];
            let word = NvmSlotWord { generation: committed, ..slot.word };
            view.nvm_write(slot.offset + NVM_SLOT_WORD_OFFSET, &word.encode().to_le_bytes()).unwrap();
            view.nvm_persist(slot.offset + NVM_SLOT_WORD_OFFSET, 8).unwrap();
        }
        let (mut fs, _) = Fs::mount(device, keep, Box::new(clock)).unwrap();
        let mut refused = 0;
        for index in 0..20 {
            match fs.lookup(1, format!("f{index}").as_bytes()).and_then(|found| fs.getattr(found.ino)) {
                Ok(_) => {}
                Err(error) => {
                    assert!(error.message.contains("NVM holds"), "{}", error.message);
                    refused += 1;
                }
            }
        }
        let _ = fs.create(1, b"new", 0o644, 0, 0);
        assert!(refused > 0 || fs.check().is_ok_and(|report| !report.is_clean()), "the bucket was read as a map");
    }

    /// The device's newest checkpoint number and the nodes it keeps in NVM.
    fn device_checkpoint(device: &mut MemoryFlash, clock: &crate::ManualClock) -> (u64, u32) {
        let options = crate::fs::FsOptions { nvm_keep: true, ..Default::default() };
        let (fs, _) = crate::fs::Fs::mount(&mut *device, options, Box::new(clock.clone())).unwrap();
        (fs.checkpoint_number(), fs.kept.as_ref().map_or(0, |kept| kept.len() as u32))
    }

    /// A node that grows past its slot's class moves to a bigger slot; an
    /// emptied slot is reused; the count a checkpoint records must match
    /// what the walk finds, else the mount refuses.
    #[test]
    fn nodes_move_between_classes_and_the_count_is_checked() {
        let mut device = device();
        let mut store = open(&mut device, 1, 0);
        assert_eq!(store.store(&mut device, NodeKey::Map(0), &map(1, 10), Pointer::NULL, 2).unwrap(), Keep::Kept);
        assert_eq!(store.store(&mut device, NodeKey::Map(1), &map(2, 10), Pointer::NULL, 2).unwrap(), Keep::Kept);
        store.persist(&mut device).unwrap();
        store.committed(2);
        assert_eq!(store.store(&mut device, NodeKey::Map(0), &map(3, 400), Pointer::NULL, 3).unwrap(), Keep::Kept);
        store.remove(&mut device, NodeKey::Map(1), 3).unwrap();
        assert_eq!(store.store(&mut device, NodeKey::Map(2), &map(4, 10), Pointer::NULL, 3).unwrap(), Keep::Kept);
        store.persist(&mut device).unwrap();
        store.committed(3);
        assert_eq!(store.len(), 2);
        let mut store = open(&mut device, 3, 2);
        assert_eq!(entries(&mut store, &mut device, NodeKey::Map(0)), vec![3; 66]);
        assert_eq!(entries(&mut store, &mut device, NodeKey::Map(2)), vec![4; 1]);
        assert!(!store.contains(NodeKey::Map(1)));
        assert!(NvmStore::open(&mut device, &header(), PAGE, 3, 3, true).is_err(), "3 named, 2 kept");
        // At generation 2 the older set is in force.
        let mut store = open(&mut device, 2, 2);
        assert_eq!(entries(&mut store, &mut device, NodeKey::Map(1)), vec![2; 1]);
    }
}
