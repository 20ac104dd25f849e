//! The metadata persistence log (ReconFS sections 3.2 to 3.4, OPRW).
//!
//! Every operation that changes the namespace or an inode's attributes
//! appends a logical record to an in-memory batch as it completes. fsync
//! writes the file's buffered blocks, adds the file's state (attributes,
//! inline bytes, the addresses of the blocks written since it was last
//! logged) and programs the batch as one log record, with no wait between
//! the data and the record, then issues one flush. Nothing else is
//! written: the node pages the operations dirtied stay in the cache until
//! the next checkpoint, which truncates the log.
//!
//! Because a batch carries every record since the previous one, in order,
//! what a crash leaves is the checkpoint plus a prefix of the operations
//! (up to the last batch whose record is whole), plus the data the inode
//! states name. Recovery replays the records through the same operations
//! on the checkpoint's tree, with the time, the version counter and the
//! inode numbers they chose, so it makes the same choices again.
//!
//! The write-pointer check (OPRW): a record is programmed without waiting
//! for its data, so after a cut it may be durable while its data is not.
//! Recovery discards the first inode state that names a page at or past
//! its zone's durable write pointer (or outside what was written since the
//! checkpoint), and every record after it: OPRW's skip list drops the later
//! records of the same inode, and here, because fsync flushes before it
//! returns, every later record belongs to an fsync that never returned, so
//! dropping them all loses nothing promised and keeps the tree a prefix of
//! the operations. Pages in the erase block just below the write pointer
//! may be torn (or, on MLC, damaged by their torn pair): those are read
//! back and checked before they count. A record that fails to replay ends
//! the log the same way.

use std::collections::{BTreeMap, BTreeSet};

use flintfs_flash::{FlashDevice, PageAddress};
use flintfs_format::{
    split_record, FileContent, FileType, LogBatch, LogOperation, LogRecord, Node, PageKind, RecordAssembler,
    RecordKind, ZoneRole,
};

use super::ops::{RenameFlags, XattrFlags};
use super::Fs;
use crate::allocator::PageMeta;
use crate::error::{errno, Error, Result};

/// Pages of one log record at most; a batch that would take more is made
/// durable by a checkpoint instead (index pages are then the cheaper way
/// to say where many blocks went).
pub const LOG_RECORD_PAGES_MAX: u64 = 16;
/// Bytes of buffered records at which they are programmed without waiting
/// for an fsync (no flush: they are durable with the next one).
pub const LOG_BUFFER_BYTES_MAX: usize = 32 << 10;
/// Blocks written and not yet logged, over all files, at which the next
/// operation takes a checkpoint: it bounds the memory that remembers them.
pub const LOG_PENDING_BLOCKS_MAX: usize = 1 << 16;
/// Log zones written since the checkpoint at which the next operation
/// takes one (ReconFS's threshold); the idle thread takes it at half.
/// Two, not one: an fsync writes a log page, so with one zone a stream of
/// fsyncs took a checkpoint every 945 of them, and that checkpoint's write
/// waited 40 ms or more for its nodes on one die (near_full_90's p99.9);
/// with two, half as many, and fewer nodes written in all (create_fsync:
/// 42,795 node pages, not 62,379). Recovery replays up to two zones'
/// worth of log pages (about 1,890 at the default geometry) and one
/// operation's more, over up to three zones.
pub const LOG_ZONES_PER_CHECKPOINT: u64 = 2;

const _: () = assert!(LOG_BUFFER_BYTES_MAX as u64 <= 4096 * LOG_RECORD_PAGES_MAX / 2);
const _: () = assert!(LOG_PENDING_BLOCKS_MAX <= flintfs_format::LOG_BLOCKS_PER_RECORD_MAX);

/// How fsync orders data and its record, chosen at mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsyncMode {
    /// Data and record together, one flush; recovery checks every address
    /// against its zone's write pointer (OPRW).
    #[default]
    WpCheck,
    /// Data, a flush, then the record and a second flush (F2FS strict):
    /// for comparison.
    Ordered,
    /// As `WpCheck`, but recovery trusts every address. For tests only:
    /// it shows what the check is for.
    Unchecked,
}

/// The log's state in memory.
#[derive(Debug, Default)]
pub(crate) struct LogState {
    /// Records since the last batch was programmed, encoded as a batch
    /// holds them, and how many.
    pub records: Vec<u8>,
    pub record_count: u32,
    /// The next batch's number in this epoch.
    pub batch_next: u64,
    /// Log pages programmed since the checkpoint.
    pub pages_written: u64,
    /// A batch was programmed and no flush has followed.
    pub unflushed: bool,
    /// Files written since they were last logged, with the blocks whose
    /// address changed.
    pub written: BTreeMap<u64, BTreeSet<u64>>,
    pub written_blocks: usize,
    /// The time and version counter the current operation runs with.
    pub operation_now: Option<i64>,
    pub operation_version: u64,
    /// Recovery is replaying records: nothing is logged, nothing
    /// checkpoints.
    pub replaying: bool,
    /// Buffered records could not be programmed: the next operation takes
    /// a checkpoint.
    pub checkpoint_wanted: bool,
    /// Buffered blocks whose chunk a logged inode state carries, with the
    /// file's version then: a later fsync that finds the same chunk (the
    /// same bytes, the same version) carries it again for nothing, and
    /// skips it. Forgotten when the block goes to flash, when any other
    /// record names the file, and when the log is truncated; bounded by
    /// [`CARRIED_BLOCKS_MAX`].
    pub carried: BTreeMap<(u64, u64), (u64, flintfs_format::EmbeddedBlock)>,
    /// The log in NVM, when the device has NVM: batches go there instead
    /// of to flash log pages.
    pub nvm: Option<super::nvm::NvmLog>,
}

/// Blocks remembered as carried by the log; past it the memory starts over,
/// which costs only carrying some again.
pub const CARRIED_BLOCKS_MAX: usize = 4096;

/// What recovery did with the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub batches: u64,
    pub records_replayed: u64,
    /// Inode states whose data had not reached the media.
    pub records_discarded: u64,
    /// Records after those that named the same inodes.
    pub records_skipped: u64,
    /// Records that failed to replay (damage), with why.
    pub records_failed: Vec<String>,
    /// Log pages read.
    pub log_pages_read: u64,
    /// NVM log bytes read.
    pub nvm_bytes_read: u64,
    /// Where and why the log ended.
    pub end: String,
}

/// A zone's pages written since the checkpoint: `[first, end)`, `end` the
/// durable write pointer at mount.
type WrittenSince = BTreeMap<u32, (u32, u32)>;

impl<D: FlashDevice> Fs<D> {
    /// Appends a record of the operation that is completing.
    pub(crate) fn log(&mut self, operation: LogOperation) {
        if self.log.replaying {
            return;
        }
        if !matches!(operation, LogOperation::InodeState { .. }) {
            // A record that names a file may change what its buffered
            // blocks mean (a truncate, an unlink): what the log carries of
            // them is carried again by the next inode state.
            for ino in operation.inodes() {
                self.forget_carried(ino);
            }
        }
        let record = LogRecord {
            version_next: self.log.operation_version,
            now_ns: self.log.operation_now.unwrap_or_else(|| self.clock.now_ns()),
            operation,
        };
        record.encode_into(&mut self.log.records);
        self.log.record_count += 1;
    }

    /// Forgets what the log carries of a file's buffered blocks.
    fn forget_carried(&mut self, ino: u64) {
        let carried: Vec<(u64, u64)> =
            self.log.carried.range((ino, 0)..=(ino, u64::MAX)).map(|(&key, _)| key).collect();
        for key in carried {
            self.log.carried.remove(&key);
        }
    }

    /// The NVM log's ring: bytes the current epoch's frames take, and its
    /// size. `None` without NVM.
    pub fn nvm_log_usage(&self) -> Option<(u64, u64)> {
        self.log.nvm.as_ref().map(|nvm| (nvm.used_bytes(), nvm.log_bytes()))
    }

    /// Notes a block whose address changed.
    pub(crate) fn log_note_block(&mut self, ino: u64, block: u64) {
        self.log.carried.remove(&(ino, block));
        if self.log.written.entry(ino).or_default().insert(block) {
            self.log.written_blocks += 1;
        }
    }

    /// Notes a file written (its size and times changed).
    pub(crate) fn log_note_write(&mut self, ino: u64) {
        self.log.written.entry(ino).or_default();
    }

    /// Forgets what a deleted file had pending.
    pub(crate) fn log_forget_file(&mut self, ino: u64) {
        if let Some(blocks) = self.log.written.remove(&ino) {
            self.log.written_blocks -= blocks.len();
        }
    }

    /// A checkpoint was written: the log starts over in its epoch.
    pub(crate) fn log_truncated(&mut self) {
        self.log.records.clear();
        self.log.record_count = 0;
        self.log.batch_next = 0;
        self.log.pages_written = 0;
        self.log.unflushed = false;
        self.log.written.clear();
        self.log.written_blocks = 0;
        self.log.checkpoint_wanted = false;
        self.log.carried.clear();
        let epoch = self.volume.checkpoint.number;
        if let Some(nvm) = self.log.nvm.as_mut() {
            if nvm.wants_checkpoint(1) {
                self.counters.nvm_log_full_checkpoints += 1;
            }
            nvm.truncated(epoch);
        }
    }

    /// Whether the log has grown to where a checkpoint should truncate it.
    pub(crate) fn log_wants_checkpoint(&self, fraction: u64) -> bool {
        let zone_pages = self.volume.device.geometry().zone_pages();
        self.log.pages_written * fraction >= LOG_ZONES_PER_CHECKPOINT * zone_pages
            || self.log.written_blocks >= LOG_PENDING_BLOCKS_MAX
            || self.log.checkpoint_wanted
            || self.log.records.len() >= LOG_BUFFER_BYTES_MAX * 2
            || self.log.nvm.as_ref().is_some_and(|nvm| nvm.wants_checkpoint(fraction))
    }

    /// Programs the buffered records as one log record when they pass
    /// their bound (no flush: the next fsync's covers them).
    pub(crate) fn log_spill(&mut self) -> Result<()> {
        // Half the largest record, so the fsync that follows has room for
        // its inode state.
        let bound = LOG_BUFFER_BYTES_MAX.min(LOG_RECORD_PAGES_MAX as usize / 2 * self.page_size);
        if self.log.records.len() >= bound && !self.log.replaying && self.log_write_batch().is_err() {
            // No zone took it (or it grew past a record): a checkpoint
            // makes it durable instead, before the next operation.
            self.log.checkpoint_wanted = true;
        }
        Ok(())
    }

    /// Programs the buffered records as the next batch. A batch that no
    /// zone could take leaves them buffered and says so.
    fn log_write_batch(&mut self) -> Result<()> {
        if self.log.record_count == 0 {
            return Ok(());
        }
        let payload = LogBatch::encode_encoded(
            self.volume.checkpoint.number,
            self.log.batch_next,
            self.log.record_count,
            &self.log.records,
        );
        let pages = (flintfs_format::RECORD_HEADER_BYTES + payload.len()).div_ceil(self.page_size) as u64;
        if pages > LOG_RECORD_PAGES_MAX {
            // The records stay buffered.
            return Err(Error::invalid(format!("a log batch of {pages} pages")));
        }
        // On an error the records stay buffered.
        if let Some(nvm) = self.log.nvm.as_mut() {
            // The batch is durable when this returns: persisted, then
            // committed by its persisted commit word.
            nvm.append(&mut self.volume.device, self.volume.checkpoint.number, self.log.batch_next, &payload)?;
            self.counters.nvm_log_batches_written += 1;
            self.counters.nvm_log_bytes_written += flintfs_format::nvm_frame_bytes(payload.len());
        } else {
            let page_size = self.page_size;
            self.volume.append_pages(ZoneRole::Log, pages as u32, |first_sequence| {
                split_record(RecordKind::Log, &payload, first_sequence, page_size)
                    .into_iter()
                    .map(|page| {
                        let meta = PageMeta {
                            kind: PageKind::Log,
                            end_of_record: page.end_of_record,
                            inverted: Default::default(),
                            length: page.length,
                            count: page.index,
                        };
                        (meta, std::borrow::Cow::Owned(page.data))
                    })
                    .collect()
            })?;
            self.log.pages_written += pages;
            self.counters.log_pages_written += pages;
        }
        self.log.batch_next += 1;
        self.counters.log_batches_written += 1;
        self.log.unflushed = true;
        self.log.records.clear();
        self.log.record_count = 0;
        Ok(())
    }

    /// fsync and fdatasync through the log: the file's blocks, its state
    /// and every buffered record, then one flush. Falls back to a
    /// checkpoint when the log cannot say it (a zone taken outside the
    /// declared list, which recovery would not scan; a batch too big).
    pub(crate) fn fsync_logged(&mut self, ino: u64) -> Result<()> {
        if self.fsync_prepare(ino)? {
            self.fsync_commit()?;
        }
        Ok(())
    }

    /// The first half of fsync: the file's blocks and its state go into
    /// the buffered records, as every other operation's do. Returns whether
    /// a commit ([`Fs::fsync_commit`]) is still owed; not when nothing is
    /// buffered or unflushed, or when a checkpoint made everything durable
    /// already. Several prepared fsyncs share one commit (group commit):
    /// it programs every buffered record as one batch.
    pub fn fsync_prepare(&mut self, ino: u64) -> Result<bool> {
        let inode = self.inode(ino)?;
        if self.options.read_only {
            // Read-only: nothing changed, and what recovery replayed is in
            // the log already.
            return Ok(false);
        }
        self.begin(0)?;
        let regular = inode.file_type() == Some(FileType::Regular);
        // The file's small blocks ride in the record itself, as the chunks
        // they would be (DESIGN.md's "small writes may ride inside the
        // record"): up to half a page of them, so the record stays one
        // page where it would have been one, and no packed page is
        // programmed for them. They stay buffered and go home with the
        // next checkpoint.
        let mut embedding = super::data::Embedding { bytes_max: self.page_size / 2, ..Default::default() };
        if regular {
            let written = self.flush_data_with(Some(ino), Some(&mut embedding)).and_then(|()| self.drain());
            if let Err(error) = written {
                if error.errno != errno::ENOSPC {
                    return Err(error);
                }
                // No room outside the reserve for the file's write-back:
                // the checkpoint may use the reserve, and every change was
                // admitted only while a checkpoint of all that is buffered
                // fitted it (`room_to_change`), so a full device still
                // makes the file durable.
                self.changed = true;
                self.checkpoint()?;
                return Ok(false);
            }
        }
        if self.volume.undeclared_zones_taken > 0 {
            self.checkpoint()?;
            return Ok(false);
        }
        if regular && (self.log.written.contains_key(&ino) || !embedding.blocks.is_empty()) {
            self.log.operation_version = self.version_next;
            let current = self.inode(ino)?.current;
            let carried: Vec<((u64, u64), (u64, flintfs_format::EmbeddedBlock))> =
                embedding.blocks.iter().map(|block| ((ino, block.block), (current, block.clone()))).collect();
            // The record first: only a record that is logged may be
            // remembered as carrying the blocks (a state that fails to
            // build leaves nothing a retried fsync would skip).
            let state = self.inode_state(ino, embedding.blocks)?;
            self.log(state);
            if self.log.carried.len() + carried.len() > CARRIED_BLOCKS_MAX {
                self.log.carried.clear();
            }
            self.log.carried.extend(carried);
            self.log_forget_file(ino);
        }
        if self.options.fsync_mode == FsyncMode::Ordered && self.log.record_count > 0 {
            // Strict ordering: the data is durable before its record is
            // even issued. Here, in the same lock hold as the prepare, so
            // no other thread's spill can program the record first.
            self.volume.device.flush()?;
        }
        Ok(self.log.record_count > 0 || self.log.unflushed)
    }

    /// The second half of fsync: every buffered record as one batch, then
    /// one flush; everything prepared before is durable when it returns.
    /// Falls back to a checkpoint when the log cannot say it. With nothing
    /// buffered or unflushed (a commit shared with an earlier fsync's
    /// leader, say) it does nothing.
    pub fn fsync_commit(&mut self) -> Result<()> {
        if self.log.record_count == 0 && !self.log.unflushed {
            return Ok(());
        }
        if self.options.fsync_mode == FsyncMode::Ordered && self.log.record_count > 0 && self.volume.device.unflushed()
        {
            // Data programmed since the prepare's flush (another thread's
            // operations) is durable before the record too.
            self.volume.device.flush()?;
        }
        if self.log_write_batch().is_err() || self.volume.undeclared_zones_taken > 0 {
            self.changed = true;
            return self.checkpoint();
        }
        // With the log in NVM the record is durable already: a flush is
        // owed only to data pages programmed since the last one.
        if self.options.barrier && (self.log.nvm.is_none() || self.volume.device.unflushed()) {
            self.volume.device.flush()?;
        }
        self.log.unflushed = false;
        Ok(())
    }

    /// Logs a file's writes before a record that names it: its blocks go
    /// out and its inode state goes in ahead of the record, so a replay
    /// never applies a rename, a link or a truncate to the file as it was
    /// before writes that came first (the tree stays a prefix of the
    /// operations, data included).
    pub(crate) fn log_pending_state(&mut self, ino: u64) -> Result<()> {
        if self.log.replaying || !self.log.written.contains_key(&ino) {
            return Ok(());
        }
        if self.inode(ino)?.file_type() != Some(FileType::Regular) {
            // A symlink's target blocks: its create record carries the
            // target, and replay writes them again. An inode state is only
            // a regular file's (the decoder refuses any other), so one
            // here would end the log at recovery.
            self.log_forget_file(ino);
            return Ok(());
        }
        self.flush_data(Some(ino))?;
        let state = self.inode_state(ino, Vec::new())?;
        self.log(state);
        self.log_forget_file(ino);
        Ok(())
    }

    /// A regular file's inode state record, carrying `embedded`.
    fn inode_state(&mut self, ino: u64, embedded: Vec<flintfs_format::EmbeddedBlock>) -> Result<LogOperation> {
        let key = self.file_key(ino)?;
        let Node::File { inode, content, .. } = self.node(key)? else {
            return Err(Error::corrupt(format!("inode {ino} is not a file")));
        };
        let inline = match content {
            FileContent::Inline(bytes) => Some(bytes),
            FileContent::Index { .. } => None,
        };
        let mut blocks = Vec::new();
        if inline.is_none() {
            let pending: Vec<u64> =
                self.log.written.get(&ino).map(|set| set.iter().copied().collect()).unwrap_or_default();
            for block in pending {
                let pointer = self.block_pointer(ino, block)?;
                if !pointer.is_null() {
                    blocks.push((block, pointer));
                }
            }
        }
        Ok(LogOperation::InodeState {
            ino,
            born: inode.born,
            current: inode.current,
            mode: inode.mode,
            uid: inode.uid,
            gid: inode.gid,
            size: inode.size,
            atime_ns: inode.atime_ns,
            mtime_ns: inode.mtime_ns,
            ctime_ns: inode.ctime_ns,
            inline,
            blocks,
            embedded,
        })
    }

    /// Reads the log of the loaded checkpoint's epoch from the pages
    /// written since it: the batches in order, up to the first torn,
    /// damaged, foreign or missing one.
    fn read_log(&mut self, written: &WrittenSince, report: &mut RecoveryReport) -> Vec<LogBatch> {
        let epoch = self.volume.checkpoint.number;
        if let Some(nvm) = self.log.nvm.as_mut() {
            // With NVM every batch of the epoch went there.
            let read = nvm.read_epoch(&mut self.volume.device, epoch);
            report.nvm_bytes_read = read.bytes_read;
            report.batches = read.batches.len() as u64;
            report.end = read.end;
            return read.batches;
        }
        // Each range's first page says whether the zone is the log's.
        let mut ranges: Vec<(u64, u32, u32, u32)> = Vec::new();
        for (&zone, &(first, end)) in written {
            if first >= end {
                continue;
            }
            let address = PageAddress::new(zone, first);
            if let Ok((header, _)) = self.volume.read_page(address) {
                report.log_pages_read += 1;
                if header.kind == PageKind::Log {
                    ranges.push((header.sequence, zone, first, end));
                }
            }
        }
        ranges.sort_unstable();
        // A range ends at the first page that fails its checks or a record
        // cut short: a cut's torn tail, or the start of a batch whose page
        // failed to program (its block retired; the batch went again in the
        // next zone). Reading goes on in the next range, and the batch
        // numbers say whether anything between is missing: a batch out of
        // turn ends the log, one of another epoch (pages of an earlier use
        // of the zone) is passed over.
        let mut batches = Vec::new();
        let mut end = format!("the log ends after {} ranges", ranges.len());
        'ranges: for (_, zone, first, last) in ranges {
            let mut assembler = RecordAssembler::new(RecordKind::Log);
            for page in first..last {
                let address = PageAddress::new(zone, page);
                report.log_pages_read += 1;
                let (header, data) = match self.volume.read_page(address) {
                    Ok(read) => read,
                    Err(error) => {
                        end = format!("the log stops at {address}: {}", error.message);
                        continue 'ranges;
                    }
                };
                let record = match assembler.push(&header, &data) {
                    Ok(Some((_, payload))) => payload,
                    Ok(None) => continue,
                    Err(error) => {
                        end = format!("the log stops at {address}: {error}");
                        continue 'ranges;
                    }
                };
                let batch = match LogBatch::decode(&record) {
                    Ok(batch) => batch,
                    Err(error) => {
                        end = format!("the log stops at {address}: {error}");
                        continue 'ranges;
                    }
                };
                if batch.epoch != epoch {
                    end = format!("zone {zone} holds a batch of epoch {}, not {epoch}: passed over", batch.epoch);
                    continue 'ranges;
                }
                if batch.batch != batches.len() as u64 {
                    end = format!(
                        "the log stops at {address}: batch {} where batch {} was due",
                        batch.batch,
                        batches.len()
                    );
                    break 'ranges;
                }
                batches.push(batch);
            }
            if assembler.in_record() {
                end = format!("the log stops in zone {zone}: its last record is cut short");
            }
        }
        report.batches = batches.len() as u64;
        report.end = end;
        batches
    }

    /// Whether an inode state's data reached the media: every address in
    /// what was written since the checkpoint and below its zone's durable
    /// write pointer, and a page in the erase block just below it (where a
    /// cut can tear a page, and damage its MLC pair) read back whole.
    fn data_durable(&mut self, operation: &LogOperation, written: &WrittenSince) -> bool {
        let LogOperation::InodeState { ino, born, blocks, .. } = operation else { return true };
        for &(block, pointer) in blocks {
            let Some(&(first, end)) = written.get(&pointer.zone()) else { return false };
            if pointer.page() < first || pointer.page() >= end {
                return false;
            }
            // A cut can tear the last page, and on MLC damage the earlier
            // page that shares its cells, in the same erase block: every
            // page there is read back.
            let block_pages = self.volume.device.geometry().block_pages;
            let in_last_block = pointer.page() / block_pages == (end - 1) / block_pages;
            if in_last_block && self.read_block(*ino, *born, block, pointer).is_err() {
                return false;
            }
        }
        true
    }

    /// Replays the log on the loaded checkpoint's tree.
    pub(crate) fn replay_log(&mut self, written: &WrittenSince) -> RecoveryReport {
        let mut report = RecoveryReport::default();
        let batches = self.read_log(written, &mut report);
        let check = self.options.fsync_mode != FsyncMode::Unchecked;
        let mut skipped: BTreeSet<u64> = BTreeSet::new();
        let mut discarded = false;
        self.log.replaying = true;
        for batch in batches {
            for record in batch.records {
                let inodes = record.operation.inodes();
                // Past a discarded record everything is skipped, not only
                // what names its inodes: an fsync flushes before it
                // returns, so every record after one whose data did not
                // reach the media belongs to an fsync that never returned,
                // and replaying some of them would leave a tree no
                // sequence of the operations gives.
                if discarded || inodes.iter().any(|ino| skipped.contains(ino)) {
                    report.records_skipped += 1;
                    skipped.extend(inodes);
                    continue;
                }
                if check && !self.data_durable(&record.operation, written) {
                    report.records_discarded += 1;
                    skipped.extend(inodes);
                    discarded = true;
                    continue;
                }
                match self.replay_record(&record) {
                    Ok(()) => report.records_replayed += 1,
                    Err(error) => {
                        // Damage, or a bug: whatever follows may depend on
                        // it, so the tree stays the prefix before it.
                        report.records_failed.push(format!("{:?}: {error}", record.operation));
                        skipped.extend(inodes);
                        discarded = true;
                    }
                }
            }
        }
        self.log.replaying = false;
        self.log.operation_now = None;
        report
    }

    /// Runs one record's operation again, as it first ran.
    fn replay_record(&mut self, record: &LogRecord) -> Result<()> {
        self.version_next = self.version_next.max(record.version_next);
        self.log.operation_now = Some(record.now_ns);
        let held: Vec<u64> = match &record.operation {
            LogOperation::Unlink { ino, held: true, .. } | LogOperation::Rmdir { ino, held: true, .. } => vec![*ino],
            LogOperation::Rename { replaced, replaced_held: true, .. } => vec![*replaced],
            _ => Vec::new(),
        };
        for &ino in &held {
            self.hold_for_replay(ino)?;
        }
        let result = self.replay_operation(&record.operation);
        // Nobody holds anything during recovery: what the original held is
        // an orphan now, freed at the end unless a record frees it first.
        for known in self.known.values_mut() {
            known.lookups = 0;
        }
        result
    }

    fn hold_for_replay(&mut self, ino: u64) -> Result<()> {
        self.remember_count(ino, 1)
    }

    fn replay_operation(&mut self, operation: &LogOperation) -> Result<()> {
        match operation {
            LogOperation::Create { parent, ino, file_type, permissions, uid, gid, rdev, name, content } => {
                let attributes = match file_type {
                    FileType::Directory => self.mkdir(*parent, name, *permissions, *uid, *gid)?,
                    FileType::Symlink => self.symlink(*parent, name, content, *uid, *gid)?,
                    _ => self.mknod(*parent, name, file_type.mode_bits() | permissions, *rdev, *uid, *gid)?,
                };
                if attributes.ino != *ino {
                    return Err(Error::corrupt(format!("created as inode {}, logged as {ino}", attributes.ino)));
                }
            }
            LogOperation::Link { ino, new_parent, new_name } => {
                self.link(*ino, *new_parent, new_name)?;
            }
            LogOperation::Unlink { parent, ino, name, .. } => {
                self.expect_entry(*parent, name, *ino)?;
                self.unlink(*parent, name)?;
            }
            LogOperation::Rmdir { parent, ino, name, .. } => {
                self.expect_entry(*parent, name, *ino)?;
                self.rmdir(*parent, name)?;
            }
            LogOperation::Rename { parent, new_parent, ino, no_replace, exchange, name, new_name, .. } => {
                self.expect_entry(*parent, name, *ino)?;
                let flags = RenameFlags { no_replace: *no_replace, exchange: *exchange };
                self.rename(*parent, name, *new_parent, new_name, flags)?;
            }
            LogOperation::SetAttributes { ino, changes } => {
                self.setattr(*ino, changes)?;
            }
            LogOperation::SetXattr { ino, create, replace, name, value } => {
                self.setxattr(*ino, name, value, XattrFlags { create: *create, replace: *replace })?;
            }
            LogOperation::RemoveXattr { ino, name } => self.removexattr(*ino, name)?,
            LogOperation::Fallocate { ino, offset, length, mode } => self.fallocate(*ino, *offset, *length, *mode)?,
            LogOperation::Delete { ino } => {
                if !self.known.get(ino).is_some_and(|known| known.orphan) {
                    return Err(Error::corrupt(format!("inode {ino} is deleted, but it is no orphan")));
                }
                self.mutate(0, |fs| fs.delete_orphan(*ino))?;
            }
            LogOperation::InodeState { .. } => self.apply_inode_state(operation)?,
        }
        Ok(())
    }

    /// Sets a file to the state an inode state record gives it.
    fn apply_inode_state(&mut self, operation: &LogOperation) -> Result<()> {
        let LogOperation::InodeState {
            ino,
            born,
            current,
            mode,
            uid,
            gid,
            size,
            atime_ns,
            mtime_ns,
            ctime_ns,
            inline,
            blocks,
            embedded,
        } = operation.clone()
        else {
            unreachable!("called for inode states")
        };
        self.mutate(0, |fs| {
            let key = fs.file_key(ino)?;
            let Node::File { inode, content, .. } = fs.node(key)? else {
                return Err(Error::corrupt(format!("inode {ino} is not a file")));
            };
            if inode.born != born {
                return Err(Error::corrupt(format!("inode {ino} is born {}, the record says {born}", inode.born)));
            }
            match (inline, content) {
                (Some(bytes), FileContent::Inline(_)) => {
                    if bytes.len() > flintfs_format::inline_bytes_max(fs.page_size) {
                        return Err(Error::corrupt(format!("{} inline bytes for inode {ino}", bytes.len())));
                    }
                    fs.modify(key, |node| {
                        let Node::File { content, .. } = node else { unreachable!() };
                        *content = FileContent::Inline(bytes);
                    })?;
                }
                (Some(_), FileContent::Index { .. }) => {
                    return Err(Error::corrupt(format!("inode {ino} holds blocks, the record inline bytes")));
                }
                (None, content) => {
                    if let FileContent::Inline(_) = content {
                        fs.inline_to_blocks(ino)?;
                    }
                    if inode.size > size {
                        fs.free_blocks_from(ino, size.div_ceil(fs.block_bytes()))?;
                    }
                    for (block, pointer) in blocks {
                        fs.dirty_blocks.remove(&(ino, block));
                        let old = fs.set_block_pointer(ino, block, pointer)?;
                        fs.release(old);
                        let bytes = fs.pointer_bytes(pointer) as i64;
                        fs.volume.account(pointer.zone(), bytes);
                    }
                    // The blocks the record carried, newer than any address
                    // above: buffered again, written home by the checkpoint
                    // that ends the recovery. A payload that does not give
                    // its length is damage, refused like a bad chunk.
                    let block_bytes = fs.block_bytes() as usize;
                    for carried in embedded {
                        let start = carried.block.checked_mul(block_bytes as u64);
                        if start.is_none_or(|start| start >= size) || carried.logical_length as usize > block_bytes {
                            return Err(Error::corrupt(format!(
                                "inode {ino} block {}: {} logical bytes in a block of {block_bytes}, or past the \
                                 size {size}",
                                carried.block, carried.logical_length
                            )));
                        }
                        let bytes = flintfs_format::decompress(
                            carried.compression,
                            &carried.payload,
                            carried.logical_length as usize,
                        )
                        .map_err(|error| Error::corrupt(format!("inode {ino} block {}: {error}", carried.block)))?;
                        let mut buffer = vec![0u8; block_bytes];
                        buffer[..bytes.len()].copy_from_slice(&bytes);
                        fs.dirty_blocks.insert((ino, carried.block), buffer);
                    }
                }
            }
            fs.modify(key, |node| {
                let Node::File { inode, .. } = node else { unreachable!() };
                inode.current = current;
                inode.mode = mode;
                inode.uid = uid;
                inode.gid = gid;
                inode.size = size;
                inode.atime_ns = atime_ns;
                inode.mtime_ns = mtime_ns;
                inode.ctime_ns = ctime_ns;
            })?;
            Ok(())
        })
    }

    /// Errors unless `name` in `parent` is `ino`: a record must find the
    /// tree as it was when it was logged.
    fn expect_entry(&mut self, parent: u64, name: &[u8], ino: u64) -> Result<()> {
        match self.directory_read_entry(parent, name, |entry| entry.ino)? {
            Some(found) if found == ino => Ok(()),
            Some(found) => Err(Error::corrupt(format!(
                "{:?} in {parent} is inode {found}, the record says {ino}",
                super::directory::name_text(name),
            ))),
            None => Err(Error::corrupt(format!("no {:?} in {parent}", super::directory::name_text(name)))),
        }
    }
}
