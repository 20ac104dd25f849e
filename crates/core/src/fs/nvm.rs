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
    decode_nvm_frame_header, encode_nvm_frame, nvm_commit_word, nvm_frame_bytes, LogBatch, Node, NvmHeader,
    NvmHeaderState, Pointer, NVM_COMMIT_BYTES, NVM_FRAME_HEADER_BYTES, NVM_HEADER_BYTES, NVM_SIZE_BYTES_MIN,
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
    /// version is refused.
    pub fn open<D: FlashDevice>(device: &mut D, uuid: [u8; 16], barrier: bool) -> Result<Option<NvmLog>> {
        let nvm_size_bytes = device.geometry().nvm_size_bytes;
        if nvm_size_bytes == 0 {
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
                if !matches!(state, NvmHeaderState::Blank) {
                    tracing::warn!("the NVM header is not this volume's ({state:?}): starting the NVM log afresh");
                }
                let header = NvmHeader::for_region(uuid, nvm_size_bytes);
                // The ring first: frames an earlier volume left there must
                // not be read as this one's (their commit words name the
                // other UUID too, but a volume made again with the same
                // UUID would match).
                let zeros = vec![0u8; NVM_CLEAR_CHUNK_BYTES];
                let (start, end) = (header.log_offset, header.log_offset + header.log_bytes);
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

/// Smallest slot a parked node takes in NVM.
pub const NVM_PARK_SLOT_BYTES_MIN: u64 = 256;
/// Nodes a checkpoint brings back from NVM at a time to write home.
pub const NVM_UNPARK_BATCH_NODES: usize = 4096;

/// Dirty node pages parked in NVM (FSMAC's hot metadata in NVM): a dirty
/// node the cache evicts goes here instead of to flash, and comes back
/// when it is next used; a checkpoint writes every parked node home.
///
/// Nothing here is durable state: the log (in NVM, persisted) and the
/// flash checkpoint say everything a crash must keep, exactly as when an
/// evicted node went to flash between checkpoints, so parked bytes are
/// written without a persist and never read at mount. A node that finds no
/// room goes to flash through the ordinary write-back.
#[derive(Debug)]
pub(crate) struct NvmNodes {
    /// The park area: `[start, end)` of the region, after the log ring.
    start: u64,
    end: u64,
    /// The next never-used offset.
    bump: u64,
    /// Freed slots by size, oldest first (reused in turn, which spreads
    /// the writes over them).
    free: BTreeMap<u64, VecDeque<u64>>,
    entries: BTreeMap<NodeKey, Parked>,
    /// Estimate of the pages writing every parked node home takes: one per
    /// node page, and file inodes by the bytes their pack records take.
    node_pages: u64,
    file_bytes: u64,
}

#[derive(Debug)]
struct Parked {
    offset: u64,
    slot_bytes: u64,
    used_bytes: u32,
    /// The bytes' CRC, kept in memory: NVM damage is found, not decoded.
    crc: u32,
    home: Pointer,
}

fn crc32c_of(bytes: &[u8]) -> u32 {
    flintfs_format::nvm_crc(bytes)
}

impl NvmNodes {
    /// The park area after the header's log ring; `None` if no room is left
    /// for a page.
    pub fn after(header: &NvmHeader, nvm_size_bytes: u64, page_size: usize) -> Option<NvmNodes> {
        let start = (header.log_offset + header.log_bytes).next_multiple_of(8);
        (nvm_size_bytes.saturating_sub(start) >= page_size as u64).then(|| NvmNodes {
            start,
            end: nvm_size_bytes,
            bump: start,
            free: BTreeMap::new(),
            entries: BTreeMap::new(),
            node_pages: 0,
            file_bytes: 0,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: NodeKey) -> bool {
        self.entries.contains_key(&key)
    }

    pub fn any_in(&self, range: std::ops::RangeInclusive<NodeKey>) -> bool {
        self.entries.range(range).next().is_some()
    }

    /// The first `count` parked keys, children first.
    pub fn first_keys(&self, count: usize) -> Vec<NodeKey> {
        self.entries.keys().take(count).copied().collect()
    }

    /// Pages writing every parked node home would take, about.
    pub fn pages_estimate(&self, page_size: usize) -> u64 {
        let room = (page_size - flintfs_format::NODE_HEADER_BYTES) as u64;
        self.node_pages + self.file_bytes.div_ceil(room)
    }

    /// Parks a node; false when there is no room (or NVM refused it).
    pub fn park<D: FlashDevice>(&mut self, device: &mut D, key: NodeKey, cached: &Cached, page_size: usize) -> bool {
        debug_assert!(!self.entries.contains_key(&key), "{key:?} is parked twice");
        let Some((page, used)) = cached.node.encode_unchecked(page_size) else { return false };
        let slot_bytes = u64::from(used).next_power_of_two().max(NVM_PARK_SLOT_BYTES_MIN);
        // Fresh space first, then freed slots oldest first: every word of
        // the area takes a write before any takes a second (wear).
        let offset = if self.bump + slot_bytes <= self.end {
            self.bump += slot_bytes;
            self.bump - slot_bytes
        } else {
            match self.free.get_mut(&slot_bytes).and_then(VecDeque::pop_front) {
                Some(offset) => offset,
                None => return false,
            }
        };
        if device.nvm_write(offset, &page[..used as usize]).is_err() {
            self.free.entry(slot_bytes).or_default().push_back(offset);
            return false;
        }
        self.count(&cached.node, 1);
        let crc = crc32c_of(&page[..used as usize]);
        self.entries.insert(key, Parked { offset, slot_bytes, used_bytes: used, crc, home: cached.home });
        true
    }

    /// Takes a parked node back, if it is parked.
    /// A parked node's home on flash, without bringing it back.
    pub fn home_of(&self, key: NodeKey) -> Option<Pointer> {
        self.entries.get(&key).map(|parked| parked.home)
    }

    /// Takes a parked node back, if it is parked. A node whose bytes do
    /// not read back whole stays parked and the error says so: nothing
    /// falls back to its older copy on flash.
    pub fn unpark<D: FlashDevice>(&mut self, device: &mut D, key: NodeKey, page_size: usize) -> Result<Option<Cached>> {
        let Some(parked) = self.entries.get(&key) else { return Ok(None) };
        let mut page = vec![0u8; page_size];
        device.nvm_read(parked.offset, &mut page[..parked.used_bytes as usize])?;
        if crc32c_of(&page[..parked.used_bytes as usize]) != parked.crc {
            return Err(Error::corrupt(format!("{key:?} parked in NVM at {}: CRC mismatch", parked.offset)));
        }
        let node =
            Node::decode_unchecked(&page).map_err(|error| Error::corrupt(format!("{key:?} parked in NVM: {error}")))?;
        let parked = self.entries.remove(&key).expect("found above");
        self.free.entry(parked.slot_bytes).or_default().push_back(parked.offset);
        self.count(&node, -1);
        if self.entries.is_empty() {
            // Nothing parked (after a checkpoint): the whole area is fresh
            // again, whatever sizes its slots had.
            self.bump = self.start;
            self.free.clear();
        }
        Ok(Some(Cached { node, home: parked.home }))
    }

    fn count(&mut self, node: &Node, sign: i64) {
        let apply = |total: &mut u64, amount: u64| {
            *total = if sign > 0 { *total + amount } else { total.saturating_sub(amount) };
        };
        if matches!(node, Node::File { .. }) {
            apply(&mut self.file_bytes, flintfs_format::inode_record_bytes(node) as u64);
        } else {
            apply(&mut self.node_pages, 1);
        }
    }
}
