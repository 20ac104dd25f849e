//! The file system: a POSIX-like engine over a [`Volume`]. It knows nothing
//! of FUSE; the FUSE adapter and embedders call these methods with inode
//! numbers, as the kernel does.
//!
//! The namespace follows DFFS. A directory's inode and its entries share
//! one node page (an extendible hash table of bucket pages once they no
//! longer fit). Directories, buckets, table pages and files with more than
//! one link are located through the paged map by slot; a file with one
//! link is located physically from its entry. Node pages are fetched on
//! demand into a byte-bounded cache and written back when evicted or at a
//! checkpoint; nothing else about the namespace is held in memory.
//!
//! Durability: fsync programs the file's blocks and one record of the
//! metadata log (see [`log`]); sync and unmount take a checkpoint, which
//! truncates the log. After a crash the file system is the last
//! checkpoint with the log replayed on it.
//!
//! Inode numbers are slots plus one (the root is 1). A directory's slot
//! locates its page; a file with one link has a *locator* in its slot (the
//! directory of its entry and its name hash), so it can be found by number
//! (the cleaner does, from an inverted index) without the map following
//! every move of its inode. Numbers are reused; an inode's `born` version
//! tells its lives apart. The engine keeps a table entry for files the
//! caller holds a reference to (from lookup, create, mknod, symlink and
//! link, released by [`Fs::forget`]) or that have state in memory.

mod buffer;
mod check;
mod checkpoint;
mod cleaner;
mod data;
pub use data::COMPRESSION_XATTR;
mod directory;
mod log;
mod nodes;
mod nvm;
mod ops;
mod scrub;

use std::collections::BTreeMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use flintfs_flash::FlashDevice;
use flintfs_format::Pointer;

use crate::cache::{KeyHasher, PageCache};
use crate::error::{errno, Error, Result};
use crate::volume::{MkfsOptions, MountReport, Volume, PROGRAM_FAILURE_MARGIN_ZONES, RESERVE_ZONES};

pub use cleaner::{
    CleanerCounters, CLEAN_GAIN_PER_STEP_PAGES, CLEAN_IDLE_WATER_ZONES, CLEAN_LOW_WATER_ZONES,
    CLEAN_MOVES_PER_STEP_MAX, CLEAN_READS_PER_STEP_MAX, CLEAN_RELEASE_VICTIMS_MIN, CLEAN_STEP_RUNWAY_DYNAMIC_ZONES,
    CLEAN_STEP_RUNWAY_ZONES_MIN, CLEAN_ZONES_PER_OPERATION_MAX, WEAR_SPREAD_MAX,
};
pub use log::{
    FsyncMode, RecoveryReport, LOG_BUFFER_BYTES_MAX, LOG_PENDING_BLOCKS_MAX, LOG_RECORD_PAGES_MAX,
    LOG_ZONES_PER_CHECKPOINT,
};
pub(crate) use nodes::{map_directory_page_count, map_page_count};
pub use nvm::NVM_LOG_CHECKPOINT_QUARTERS;
pub use ops::{
    Attributes, DirectoryEntry, RenameFlags, SetAttributes, SetIdOnWrite, StatFs, XattrFlags, FALLOCATE_MODES,
    FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE,
};
pub use scrub::{ScrubReport, SCRUB_NAMED_PAGES_MAX, SCRUB_PAGES_PER_STEP_MAX};

/// The root directory's slot.
pub const ROOT_SLOT: u32 = 0;
/// Default byte bound of the node cache. A clean file inode counts what
/// it holds in memory; a dirty one, and every other node, at least a
/// page (`nodes::node_charge_bytes`).
pub const NODE_CACHE_BYTES_DEFAULT: usize = 8 << 20;
/// Default byte bound of buffered file data.
pub const DATA_BUFFER_BYTES_DEFAULT: usize = 8 << 20;
/// Default byte bound of the read cache.
pub const READ_CACHE_BYTES_DEFAULT: usize = 4 << 20;
/// Default time between timed checkpoints.
pub const CHECKPOINT_INTERVAL_NS_DEFAULT: u64 = 30_000_000_000;
/// Pages a mount scrubs a second while idle, by default: 1 MiB/s of 4 KiB
/// pages, so a 1 GiB device is read through in about 17 minutes of idle
/// time, and an idle step costs a few milliseconds of device time.
pub const SCRUB_PAGES_PER_SECOND_DEFAULT: u32 = 256;
/// Node pages one operation can dirty besides its data, at most (a rename
/// touching two directories, each splitting a bucket and doubling a table
/// page, two inodes, the map pages of their slots): the margin the space
/// check and the checkpoint trigger keep.
pub const OPERATION_NODE_PAGES_MAX: u64 = 16;
/// Node pages the space checks count for each node page an operation
/// says it will dirty: the page and what points at it. An operation's own
/// count is an estimate; once its nodes are buffered they are counted by
/// [`CHECKPOINT_NODE_CHAIN_PAGES_MAX`], or by the walk that bounds them.
pub const CHECKPOINT_NODE_AMPLIFICATION: u64 = 2;
/// Node pages a checkpoint may write per node dirty or pending when it
/// starts, at most: writing a node dirties what points at it, and that is
/// written too, up a chain of index pages (a tree of at most
/// `INDEX_HEIGHT_MAX` levels), the file's inode, and the directory page
/// that holds its entry (the map pages come on top, counted apart). Once
/// counted as one parent each: an estimate the full model runs held until
/// one (48 zones, seed 7) buffered eight nodes, mostly index pages the
/// cleaner's moves had dirtied, whose checkpoint wrote 20 pages and found
/// no zone for the rest. Near full, the walk over what is buffered
/// (`buffered_node_pages_bound`) counts each chain once, shared parents
/// once.
pub const CHECKPOINT_NODE_CHAIN_PAGES_MAX: u64 = flintfs_format::INDEX_HEIGHT_MAX as u64 + 2;
/// Node pages a checkpoint may write per buffered data block, at most: the
/// chain above the index page that will point at it, and the top pages a
/// tree grown to reach the block needs besides (they hold the old roots,
/// and a block's path need not run through them).
pub const CHECKPOINT_BLOCK_CHAIN_PAGES_MAX: u64 =
    CHECKPOINT_NODE_CHAIN_PAGES_MAX + flintfs_format::INDEX_HEIGHT_MAX as u64;
const _: () = assert!(CHECKPOINT_NODE_CHAIN_PAGES_MAX >= CHECKPOINT_NODE_AMPLIFICATION);
const _: () = assert!(CHECKPOINT_BLOCK_CHAIN_PAGES_MAX >= CHECKPOINT_NODE_CHAIN_PAGES_MAX);
/// Files let go (their last reference forgotten) that wait in `known` to
/// be looked at together: a batch's pass over what is dirty costs about
/// what one file's own lookups did, so this many share it. They cost a
/// `known` entry each meanwhile.
pub const FORGOTTEN_BATCH_FILES: usize = 1024;
/// The most [`FsOptions::forgotten_batch_files`] may be: the entries
/// waiting cost memory the caches' bounds do not count.
pub const FORGOTTEN_BATCH_FILES_MAX: usize = 1 << 16;
const _: () = assert!(FORGOTTEN_BATCH_FILES > 0 && FORGOTTEN_BATCH_FILES <= FORGOTTEN_BATCH_FILES_MAX);
/// Smallest cache bound, in pages: what one operation touches at once.
/// (Nothing holds a cached node across another fetch, so a smaller cache
/// would still be correct; it would only thrash.)
pub const CACHE_PAGES_MIN: usize = 16;
/// Blocks in a row of one file that must fail to compress before the file
/// is marked incompressible and writes stop trying (btrfs gives up on a
/// file at its first incompressible range; a few blocks more keep a file
/// whose header alone is random from losing its compressible body).
pub const INCOMPRESSIBLE_AFTER_BLOCKS: u32 = 16;
/// A file marked incompressible still has one block in this many tried,
/// and is unmarked when it compresses.
pub const INCOMPRESSIBLE_PROBE_BLOCKS: u32 = 64;
const _: () = assert!(INCOMPRESSIBLE_PROBE_BLOCKS > INCOMPRESSIBLE_AFTER_BLOCKS);
/// Files whose run of misses is remembered; past it the runs start over,
/// which costs only attempts.
pub const COMPRESSION_STREAKS_MAX: usize = 4096;
/// A block is stored compressed only when its chunk (header and payload,
/// in 16-byte units) takes at most this many sixteenths of the block's
/// valid bytes: a saving under 1/16 is not worth a decompression at
/// every read.
pub const COMPRESSED_SIXTEENTHS_MAX: usize = 15;
/// Blocks with fewer valid bytes are not worth an attempt.
pub const COMPRESSION_BYTES_MIN: usize = 128;
/// Pages of the largest size the defaults must hold.
const PAGE_SIZE_BYTES_LARGEST: usize = 64 * 1024;

const _: () = assert!(NODE_CACHE_BYTES_DEFAULT >= CACHE_PAGES_MIN * PAGE_SIZE_BYTES_LARGEST);
const _: () = assert!(DATA_BUFFER_BYTES_DEFAULT >= CACHE_PAGES_MIN * PAGE_SIZE_BYTES_LARGEST);
const _: () = assert!(READ_CACHE_BYTES_DEFAULT >= CACHE_PAGES_MIN * PAGE_SIZE_BYTES_LARGEST / 2);

/// Where the engine gets the time. It reads no clock of its own.
pub trait Clock: Send {
    /// Nanoseconds since the Unix epoch.
    fn now_ns(&self) -> i64;
}

/// A clock that moves only when told to: for tests and simulation.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(now_ns: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(now_ns)))
    }

    pub fn set(&self, now_ns: i64) {
        self.0.store(now_ns, Ordering::SeqCst);
    }

    pub fn advance(&self, nanoseconds: i64) {
        self.0.fetch_add(nanoseconds, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Choices made at mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsOptions {
    pub node_cache_bytes: usize,
    pub data_buffer_bytes: usize,
    pub read_cache_bytes: usize,
    /// A checkpoint is taken at the first operation this long after the
    /// last one, if anything changed.
    pub checkpoint_interval_ns: u64,
    pub fsync_mode: FsyncMode,
    /// Whether fsync issues a flush. Off (`nobarrier`) only for devices
    /// whose write buffer survives power loss.
    pub barrier: bool,
    /// Which correction layers reads use. All of them, except to measure
    /// what each one is worth (the fault atlas).
    pub correction: crate::protect::Correction,
    /// Pages read a second by the scrub that runs in idle time (0: none).
    pub scrub_pages_per_second: u32,
    /// How file blocks are compressed (`-o compress=`); `None` takes the
    /// image's default, chosen at mkfs. A file's `user.flintfs.compress`
    /// xattr overrides both.
    pub compression: Option<flintfs_format::CompressionChoice>,
    /// Whether an NVM log frame is persisted before its commit word is
    /// written. Off only in tests, to show the barrier is what keeps a
    /// committed frame whole (as [`FsyncMode::Unchecked`] does for the
    /// write-pointer check).
    pub nvm_barrier: bool,
    /// Whether a clean unmount leaves the node pages kept in NVM there
    /// (`-o nvm_keep`): the next mount reads them from NVM, and the image
    /// then needs its NVM. Off by default: unmount writes every one home,
    /// so the flash alone is the file system (FSMAC's "portable").
    pub nvm_keep: bool,
    /// Files let go that wait to be looked at together
    /// ([`FORGOTTEN_BATCH_FILES`] by default; the model tests take a few,
    /// so that every run checks each batch against the per-file rule).
    pub forgotten_batch_files: usize,
    /// A read-only mount (`-o ro`): the engine writes nothing to the
    /// device, not even at mount. An unclean stop's log is replayed in
    /// memory, not checkpointed; every change answers EROFS; fsync, sync
    /// and unmount have nothing to make durable. For copying the files off
    /// a device that can no longer take a checkpoint, or looking at an
    /// image without changing it (the CLI also opens the device to look,
    /// so that the emulator's own records are not written either).
    pub read_only: bool,
}

impl Default for FsOptions {
    fn default() -> FsOptions {
        FsOptions {
            node_cache_bytes: NODE_CACHE_BYTES_DEFAULT,
            data_buffer_bytes: DATA_BUFFER_BYTES_DEFAULT,
            read_cache_bytes: READ_CACHE_BYTES_DEFAULT,
            checkpoint_interval_ns: CHECKPOINT_INTERVAL_NS_DEFAULT,
            fsync_mode: FsyncMode::WpCheck,
            barrier: true,
            correction: crate::protect::Correction::ALL,
            scrub_pages_per_second: SCRUB_PAGES_PER_SECOND_DEFAULT,
            compression: None,
            nvm_barrier: true,
            nvm_keep: false,
            forgotten_batch_files: FORGOTTEN_BATCH_FILES,
            read_only: false,
        }
    }
}

impl FsOptions {
    /// Small pages, small caches: what the model tests run with, so
    /// every eviction path is taken (dirty nodes count a page each; a
    /// clean inode of 512-byte pages about one). Files let go are looked
    /// at four at a time.
    pub fn smallest(page_size_bytes: u32) -> FsOptions {
        let bytes = CACHE_PAGES_MIN * page_size_bytes as usize;
        FsOptions {
            node_cache_bytes: bytes,
            data_buffer_bytes: bytes,
            read_cache_bytes: bytes,
            forgotten_batch_files: 4,
            ..FsOptions::default()
        }
    }

    fn validate(&self, page_size_bytes: u32) -> Result<()> {
        let minimum = CACHE_PAGES_MIN * page_size_bytes as usize;
        for (name, value) in [
            ("node cache", self.node_cache_bytes),
            ("data buffer", self.data_buffer_bytes),
            ("read cache", self.read_cache_bytes),
        ] {
            if value < minimum {
                return Err(Error::invalid(format!(
                    "the {name} of {value} bytes is below {CACHE_PAGES_MIN} pages ({minimum} bytes)"
                )));
            }
        }
        if !(1..=FORGOTTEN_BATCH_FILES_MAX).contains(&self.forgotten_batch_files) {
            return Err(Error::invalid(format!(
                "a batch of {} files let go is not between 1 and {FORGOTTEN_BATCH_FILES_MAX}",
                self.forgotten_batch_files
            )));
        }
        Ok(())
    }
}

/// Where a file's inode is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// On flash at `home` (null until first written), from its one entry.
    Physical { home: Pointer },
    /// Through the map.
    Slot(u32),
}

/// The files the engine must be able to find, by inode number, with the
/// cache's fixed hash: runs stay reproducible.
pub(crate) type KnownFiles = std::collections::HashMap<u64, Known, BuildHasherDefault<KeyHasher>>;

/// A file the engine must be able to find by inode number.
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub location: Location,
    /// References the caller holds.
    pub lookups: u64,
    /// Unlinked (or, for a directory, removed) while referenced: its slot,
    /// and a file's data, live until the last reference goes, and the
    /// checkpoint lists it so a crash does not leak it.
    pub orphan: bool,
    pub directory: bool,
}

/// What the engine has done since mount, for tests and `stat`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsCounters {
    pub checkpoints: u64,
    pub node_pages_written: u64,
    /// Metadata-log pages and records (batches) programmed.
    pub log_pages_written: u64,
    pub log_batches_written: u64,
    /// Of those batches, the ones written to the NVM log instead of flash,
    /// and the NVM bytes their frames took.
    pub nvm_log_batches_written: u64,
    pub nvm_log_bytes_written: u64,
    /// Checkpoints taken because the NVM log's ring filled (its
    /// write-homes).
    pub nvm_log_full_checkpoints: u64,
    /// Node write-backs kept in NVM instead of programmed to flash, and
    /// node reads served from NVM.
    pub nodes_parked: u64,
    pub nodes_unparked: u64,
    /// Nodes kept in NVM sent home to flash because NVM was past its
    /// high-water mark (the coldest first).
    pub nodes_sent_home: u64,
    /// Unmounts whose nodes kept in NVM stayed there: the flash left could
    /// not take them home.
    pub nvm_write_homes_declined: u64,
    /// Checkpoints taken ahead of need (the timer's, a release's, one for
    /// space, or the idle work's) refused with ENOSPC and skipped: the
    /// operation went on to its own checks, the idle work to cleaning
    /// (`Fs::optional_checkpoint`).
    pub checkpoints_refused_for_space: u64,
    pub node_pages_read: u64,
    pub data_pages_written: u64,
    /// Runs of whole data blocks a failed program sent back to be placed
    /// one by one (`Volume::append_run_once`).
    pub data_runs_placed_one_by_one: u64,
    pub chunks_written: u64,
    /// Blocks stored as compressed chunks, blocks a codec was tried on,
    /// and files marked incompressible.
    pub chunks_compressed: u64,
    /// Index pages written as records in packs rather than pages.
    pub index_records_written: u64,
    /// Small blocks fsync carried in its log record instead of a packed
    /// page.
    pub blocks_embedded: u64,
    pub compression_attempts: u64,
    pub files_marked_incompressible: u64,
    /// Marked files whose probe block compressed.
    pub files_unmarked_incompressible: u64,
    pub data_pages_read: u64,
    pub read_cache_hits: u64,
    /// Filler pages unmount wrote to close the heads' open blocks.
    pub pages_padded_at_unmount: u64,
    /// Pages the idle-time scrub read, and the passes over the whole
    /// device it finished.
    pub pages_scrubbed_in_background: u64,
    pub scrub_passes_finished: u64,
}

/// A mounted flintfs.
pub struct Fs<D: FlashDevice> {
    pub(crate) volume: Volume<D>,
    pub(crate) options: FsOptions,
    clock: Box<dyn Clock>,
    pub(crate) page_size: usize,
    pub(crate) hash_seed: u64,
    /// Decoded node pages with their homes, byte-bounded (each charged by
    /// `nodes::node_charge_bytes`).
    pub(crate) nodes: PageCache<nodes::NodeKey, nodes::Cached>,
    /// Dirty nodes pushed out of the cache during an operation, written
    /// back before it returns (on a read-only mount, held here for the
    /// whole mount). Loads look here before reading flash.
    pub(crate) pending: BTreeMap<nodes::NodeKey, nodes::Cached>,
    /// Node pages kept in NVM, updated in place (only with NVM), and
    /// whether write-backs bypass it (a write-home of every node is under
    /// way).
    pub(crate) kept: Option<nvm::NvmStore>,
    pub(crate) parking_paused: bool,
    /// A checkpoint's drain: every node made dirty joins the write-backs
    /// at once (`Fs::drain`), so that each node is written once, after
    /// everything below it.
    pub(crate) drain_takes_dirty: bool,
    /// The last walk's bound on what a checkpoint writes, and the changes
    /// counted when it was taken (`Fs::checkpoint_fits`).
    pub(crate) walked: Option<(u64, u64)>,
    /// Nodes whose next write-back must go to flash, not NVM: the cleaner
    /// is moving their flash home, or NVM is writing them home.
    pub(crate) to_flash: std::collections::BTreeSet<nodes::NodeKey>,
    /// Set while unmount writes every node kept in NVM home.
    pub(crate) write_home_all: bool,
    /// Files that must stay findable by number. Hashed, not ordered: every
    /// operation looks its file up here (a tree's search was 5% of
    /// webserver's host time); the few walks over it sort what they take.
    pub(crate) known: KnownFiles,
    /// Files let go by their last reference since the last prune, still
    /// in `known` until [`Fs::prune_forgotten`] looks at them together (at
    /// most `options.forgotten_batch_files`).
    pub(crate) forgotten: Vec<u64>,
    /// Buffered file blocks: `(ino, block)` to the whole block.
    pub(crate) dirty_blocks: buffer::DataBuffer,
    /// Verified data pages, by where they are.
    pub(crate) read_cache: PageCache<Pointer, data::CachedPage>,
    /// The map's directory pages (from the checkpoint's tree roots), which
    /// locate its pages, and its allocator.
    pub(crate) map_directory: Vec<Pointer>,
    pub(crate) slot_count: u32,
    pub(crate) free_slot_head: u32,
    pub(crate) version_next: u64,
    /// Anything changed since the last checkpoint.
    pub(crate) changed: bool,
    last_checkpoint_ns: i64,
    /// The last operation took a checkpoint: the next resets no zone
    /// ahead, and takes a cleaning step only if free zones are short
    /// (`begin`).
    pub(crate) checkpoint_just_taken: bool,
    pub(crate) counters: FsCounters,
    pub(crate) cleaner: CleanerCounters,
    /// Victims the cleaner could not empty this mount (see
    /// [`CleanerCounters::zones_stuck`]).
    pub(crate) cleaner_stuck: std::collections::BTreeSet<u32>,
    /// The foreground cleaner's victim part way through, and the victims
    /// it emptied that the next checkpoint frees.
    pub(crate) incremental: cleaner::IncrementalCleaner,
    /// The last zone scan before an operation (see `Fs::zone_scan`).
    pub(crate) zone_scan_hint: [Option<(cleaner::ZoneScanKey, usize, bool)>; 2],
    /// The allocatable zones' capacities, the reserve's included, smallest
    /// first, under the same key (`checkpoint_fits`).
    pub(crate) capacities_hint: Option<(cleaner::ZoneScanKey, Vec<u64>)>,
    /// The dynamic zones' summed capacity, and the resets issued and the
    /// failed programs and retired blocks when it was counted
    /// (`Fs::space_blocks`).
    pub(crate) capacity_hint: std::cell::Cell<Option<((u64, u64), u64)>>,
    pub(crate) log: log::LogState,
    /// The running operation reserved its room at its start: what it
    /// calls may not clean, checkpoint or refuse for space again.
    pub(crate) space_reserved: bool,
    /// Where the idle-time scrub goes on from, and when it last ran.
    pub(crate) scrub_cursor: scrub::ScrubCursor,
    /// The mount's compression: the option, or the image's default.
    pub(crate) compression: flintfs_format::CompressionChoice,
    /// Blocks in a row that did not compress, per file, since its last
    /// block that did: at [`INCOMPRESSIBLE_AFTER_BLOCKS`] the file is
    /// marked incompressible. For a marked file, the blocks skipped since
    /// its last probe ([`INCOMPRESSIBLE_PROBE_BLOCKS`]). Bounded by
    /// [`COMPRESSION_STREAKS_MAX`].
    pub(crate) compression_misses: BTreeMap<u64, u32>,
}

impl<D: FlashDevice> Fs<D> {
    /// Formats `device`: the durable frame, then the root directory, then a
    /// checkpoint. Returns the device, ready to mount.
    pub fn format(device: D, options: &MkfsOptions, clock: Box<dyn Clock>) -> Result<D> {
        let mut device = device;
        crate::volume::mkfs(&mut device, options)?;
        // Through the protection layer, whose wear levelling places the
        // engine's NVM offsets.
        let mut view = crate::protect::Protected::new(&mut device);
        if view.geometry().nvm_size_bytes >= flintfs_format::NVM_HEADER_BYTES as u64 {
            // A new volume starts its NVM afresh: with the header gone,
            // the mount below writes a new one and clears the log ring, so
            // no frame of what the device held before is read as this
            // volume's.
            let blank = [0u8; flintfs_format::NVM_HEADER_BYTES];
            view.nvm_write(0, &blank)?;
            view.nvm_persist(0, blank.len() as u64)?;
        }
        let (volume, _) = Volume::mount(device)?;
        let mut fs = Fs::assemble(volume, FsOptions::default(), clock)?;
        fs.make_root()?;
        // A new image is whole on flash, NVM or not: its nodes go home.
        fs.write_home_all = true;
        fs.checkpoint()?;
        Ok(fs.volume.into_device())
    }

    /// Mounts a formatted device after a clean unmount or a crash; a crash
    /// leaves it at its last checkpoint.
    pub fn mount(device: D, options: FsOptions, clock: Box<dyn Clock>) -> Result<(Fs<D>, MountReport)> {
        options.validate(device.geometry().page_size_bytes)?;
        let (volume, report) = Volume::mount_with(device, options.correction, options.read_only)?;
        if volume.checkpoint.tree.slot_count == 0 {
            return Err(Error::corrupt("the checkpoint has no root directory: the format did not finish"));
        }
        let pages_before = volume.device().counters().pages_read;
        let mut fs = Fs::assemble(volume, options, clock)?;
        // Reading the root proves the tree is there: one page, where the
        // checkpoint says, whatever the number of files. It is the node the
        // map names for slot 0 (the checkpoint wrote it, then the map, then
        // took the pointer), so it is cached as that node; the map pages
        // are read when first needed.
        let root_home = fs.volume.checkpoint.tree.root;
        // A root kept in NVM is newer than its page on flash (if it has
        // one): that one is read instead.
        let cached = match fs.load_kept(nodes::NodeKey::Slot(ROOT_SLOT))? {
            Some(cached) => cached,
            None if root_home.is_null() => return Err(Error::corrupt("the checkpoint names no root directory")),
            None => nodes::Cached { node: fs.read_node(nodes::NodeKey::Slot(ROOT_SLOT), root_home)?, home: root_home },
        };
        match &cached.node {
            flintfs_format::Node::Directory { inode, .. } if inode.ino == crate::volume::ROOT_INO => {}
            _ => return Err(Error::corrupt(format!("the root at {root_home} is not the root directory"))),
        }
        fs.cache_insert(nodes::NodeKey::Slot(ROOT_SLOT), cached, crate::cache::Dirty::CLEAN);
        // Files unlinked while open and directories removed while held, when
        // the last checkpoint was taken: nobody holds them now.
        let orphans = fs.volume.checkpoint.tree.orphans.clone();
        let mut adopted = Vec::new();
        for ino in orphans {
            if fs.adopt_orphan(ino)? {
                adopted.push(ino);
            }
        }
        let mut report = report;
        let epoch = fs.volume.checkpoint.number;
        let nvm_frames = fs.log.nvm.as_ref().is_some_and(|nvm| nvm.has_frames(&mut fs.volume.device, epoch));
        // Pages were written after the checkpoint, or the NVM log holds
        // records of its epoch: an unclean stop.
        let unclean = !fs.volume.orphans.is_empty() || nvm_frames;
        if fs.options.read_only {
            // The log is replayed in memory. Orphans stay as they are:
            // nothing names them, and freeing them is a write.
            if unclean {
                report.recovery = Some(fs.recover_in_memory()?);
            }
        } else if unclean {
            report.recovery = Some(fs.recover()?);
        } else if !adopted.is_empty() {
            for ino in adopted {
                fs.delete_orphan(ino)?;
            }
            // The log that follows must start from a checkpoint that has
            // freed them: replay does not run mount's work again.
            fs.changed = true;
            fs.checkpoint()?;
        }
        report.pages_read += fs.volume.device().counters().pages_read - pages_before;
        Ok((fs, report))
    }

    /// Recovery on a read-only mount: the log replayed into memory as
    /// [`Fs::recover`] replays it, and nothing written. The replayed
    /// changes stay in memory, beyond the caches' bounds if need be:
    /// dirty nodes pending (as many as the crashed run's records dirtied
    /// since its checkpoint, which the log's size bounds only loosely, a
    /// record dirtying a few nodes), and the small blocks records carry
    /// in the data buffer (half a page a record at most). A replay that
    /// needed a write fails the mount, rather than show a tree missing
    /// what an fsync promised.
    fn recover_in_memory(&mut self) -> Result<RecoveryReport> {
        let (written, _) = self.zones_written_since();
        let refused_before = self.volume.device.read_only_refusals();
        let report = self.replay_log(&written);
        let refused = self.volume.device.read_only_refusals() - refused_before;
        if refused > 0 {
            return Err(Error::new(
                errno::EROFS,
                format!(
                    "the log since the last checkpoint cannot be replayed without writing ({refused} writes \
                     refused{}{}): only a read-write mount can recover it",
                    if report.records_failed.is_empty() { "" } else { ": " },
                    report.records_failed.join("; ")
                ),
            ));
        }
        for failure in &report.records_failed {
            tracing::warn!("a log record did not replay: {failure}");
        }
        tracing::info!(
            replayed = report.records_replayed,
            discarded = report.records_discarded,
            nodes_held = self.pending.len(),
            blocks_held = self.dirty_blocks.len(),
            "an unclean stop's log replayed in memory, read-only; {}",
            report.end
        );
        Ok(report)
    }

    /// Recovery after an unclean stop: the zones the crashed run took from
    /// the declared list get back their role and generation (from their
    /// first page), every head moves to a fresh zone (so no zone a record
    /// may point into is written before the log is replayed: its write
    /// pointer stays what the cut left, for a second recovery too), the log
    /// is replayed, orphans are freed, and a checkpoint ends it.
    fn recover(&mut self) -> Result<RecoveryReport> {
        let (written, old_heads) = self.zones_written_since();
        let report = self.replay_log(&written);
        let orphans = self.orphans();
        for ino in orphans {
            self.delete_orphan(ino)?;
        }
        self.changed = true;
        self.checkpoint()?;
        // Zones left part written (the old heads, what the crashed run
        // took) are done now that nothing needs their write pointers.
        for zone in old_heads.into_iter().chain(written.keys().copied()) {
            let in_head = self.volume.checkpoint.heads.iter().any(|head| head.zone == zone);
            let state = self.volume.device.report_zone(zone)?.state;
            if !in_head && matches!(state, flintfs_flash::ZoneState::Open | flintfs_flash::ZoneState::Closed) {
                self.volume.device.finish_zone(zone)?;
            }
        }
        tracing::info!(
            batches = report.batches,
            replayed = report.records_replayed,
            discarded = report.records_discarded,
            skipped = report.records_skipped,
            log_pages_read = report.log_pages_read,
            "recovered after an unclean stop; {}",
            report.end
        );
        for failure in &report.records_failed {
            tracing::warn!("a log record did not replay: {failure}");
        }
        Ok(report)
    }

    /// Recovery's first step, in memory alone: the zones written since the
    /// checkpoint (first and end page of each), the declared zones among
    /// them given back their role and generation, and the heads let go
    /// (returned, to be finished once the log is replayed).
    #[allow(clippy::type_complexity)]
    fn zones_written_since(&mut self) -> (std::collections::BTreeMap<u32, (u32, u32)>, Vec<u32>) {
        let mut written: std::collections::BTreeMap<u32, (u32, u32)> = std::collections::BTreeMap::new();
        for &(zone, first, end) in &self.volume.orphans {
            written.insert(zone, (first, end));
        }
        let declared = self.volume.checkpoint.unindexed.clone();
        let mut used = 0;
        for (position, &zone) in declared.iter().enumerate() {
            if !written.contains_key(&zone) {
                continue;
            }
            used = position + 1;
            let mut pages_read = 0;
            let first = crate::volume::read_verified(
                &mut self.volume.device,
                flintfs_flash::PageAddress::new(zone, 0),
                None,
                &mut pages_read,
            );
            if let Ok((header, _)) = first {
                let role = match header.kind {
                    flintfs_format::PageKind::Log => Some(flintfs_format::ZoneRole::Log),
                    flintfs_format::PageKind::Node => Some(flintfs_format::ZoneRole::Node),
                    flintfs_format::PageKind::DataBlock | flintfs_format::PageKind::PackedData => {
                        Some(flintfs_format::ZoneRole::HotData)
                    }
                    _ => None,
                };
                if let Some(role) = role {
                    let usage = &mut self.volume.checkpoint.zones[zone as usize];
                    usage.role = role;
                    usage.generation = header.zone_generation;
                    self.volume.set_valid_bytes(zone, 0);
                }
            }
        }
        self.volume.unindexed_used = used;
        let old_heads: Vec<u32> = self.volume.checkpoint.heads.iter().map(|head| head.zone).collect();
        self.volume.checkpoint.heads.clear();
        (written, old_heads)
    }

    fn assemble(volume: Volume<D>, options: FsOptions, clock: Box<dyn Clock>) -> Result<Fs<D>> {
        let page_size = volume.device().geometry().page_size_bytes as usize;
        let uuid = volume.superblock().uuid;
        let hash_seed = u64::from_le_bytes(uuid[..8].try_into().expect("8 bytes"));
        let tree = volume.checkpoint.tree.clone();
        let map_pages = nodes::map_page_count(tree.slot_count, page_size);
        if tree.map_directory.len() as u64 != nodes::map_directory_page_count(map_pages, page_size) {
            return Err(Error::corrupt(format!(
                "the checkpoint has {} map directory pages for {} slots ({map_pages} map pages)",
                tree.map_directory.len(),
                tree.slot_count
            )));
        }
        if tree.slot_count > crate::volume::slots_max(&volume.device().geometry()) {
            return Err(Error::corrupt(format!("{} slots, more than the device can hold", tree.slot_count)));
        }
        let now = clock.now_ns();
        let compression = options
            .compression
            .unwrap_or_else(|| flintfs_format::CompressionChoice::of(volume.superblock().compression));
        let mut volume = volume;
        let needed = tree.nvm_nodes;
        let stripe_record_bytes = volume.device.nvm_stripe_record_bytes();
        let nvm = nvm::NvmLog::open(
            &mut volume.device,
            options.read_only,
            uuid,
            options.nvm_barrier,
            needed,
            stripe_record_bytes,
        )?;
        // The open stripes' records, from the header now there (the
        // volume found them at mount if it was there already).
        volume.device.open_nvm_stripes(uuid)?;
        let kept = match &nvm {
            Some(nvm) => nvm::NvmStore::open(
                &mut volume.device,
                nvm.header(),
                page_size,
                volume.checkpoint.number,
                needed,
                options.nvm_barrier,
            )?,
            None => None,
        };
        let data_buffer_blocks = options.data_buffer_bytes / page_size;
        let forgotten_batch_files = options.forgotten_batch_files;
        Ok(Fs {
            nodes: PageCache::new_ordered(options.node_cache_bytes),
            read_cache: PageCache::new(options.read_cache_bytes),
            options,
            clock,
            page_size,
            hash_seed,
            pending: BTreeMap::new(),
            kept,
            parking_paused: false,
            drain_takes_dirty: false,
            walked: None,
            to_flash: std::collections::BTreeSet::new(),
            write_home_all: false,
            known: KnownFiles::default(),
            forgotten: Vec::with_capacity(forgotten_batch_files),
            dirty_blocks: buffer::DataBuffer::new(data_buffer_blocks),
            map_directory: tree.map_directory,
            slot_count: tree.slot_count,
            free_slot_head: tree.free_slot_head,
            version_next: tree.version_next,
            changed: false,
            last_checkpoint_ns: now,
            checkpoint_just_taken: false,
            counters: FsCounters::default(),
            cleaner: CleanerCounters::default(),
            cleaner_stuck: std::collections::BTreeSet::new(),
            incremental: cleaner::IncrementalCleaner::default(),
            zone_scan_hint: [None; 2],
            capacities_hint: None,
            capacity_hint: std::cell::Cell::new(None),
            log: log::LogState { nvm, ..log::LogState::default() },
            space_reserved: false,
            scrub_cursor: scrub::ScrubCursor { zone: 0, page: 0, last_ns: now },
            compression,
            compression_misses: BTreeMap::new(),
            volume,
        })
    }

    /// Unmounts cleanly: frees what only open references kept, takes a
    /// checkpoint, and returns the device.
    pub fn unmount(mut self) -> Result<D> {
        self.shut_down()?;
        Ok(self.volume.into_device())
    }

    /// What unmount does before it lets go of the device: frees files only
    /// references kept, and takes a checkpoint. On an error the file
    /// system is still there (and so is the device).
    pub fn shut_down(&mut self) -> Result<()> {
        if self.options.read_only {
            // Nothing was written, and nothing may be.
            return Ok(());
        }
        let orphans = self.orphans();
        for ino in orphans {
            self.delete_orphan(ino)?;
        }
        // The last checkpoint declares empty zones first, so the next mount
        // reads no zone's first page where it can (`declare_empty_first`).
        self.volume.declare_empty_first = true;
        // Every node kept in NVM goes home, unless `nvm_keep` says to leave
        // them for the next mount. A flash too full to take them keeps them
        // in NVM, as `nvm_keep` would: the checkpoint again, without the
        // write-home, parks back in NVM the nodes it had taken out (all of
        // them, when they fitted one batch: the retry once asked for nodes
        // still kept, and a full device then failed its unmount). Where NVM
        // has no slot of a node's size left, or is past its high-water
        // mark, that checkpoint still sends some home, and the unmount can
        // still fail for space.
        let kept_before = self.kept.as_ref().is_some_and(|kept| !kept.is_empty());
        self.write_home_all = !self.options.nvm_keep;
        let mut result = self.checkpoint();
        let no_room = result.as_ref().is_err_and(|error| error.errno == errno::ENOSPC);
        if no_room && self.write_home_all && self.kept.is_some() {
            if kept_before {
                let error = result.as_ref().err().map(|error| error.message.clone()).unwrap_or_default();
                tracing::warn!("node pages kept in NVM could not all go home to flash ({error}); they stay in NVM");
                self.counters.nvm_write_homes_declined += 1;
            }
            self.write_home_all = false;
            self.to_flash.clear();
            self.changed = true;
            result = self.checkpoint();
        }
        self.write_home_all = false;
        self.volume.declare_empty_first = false;
        result?;
        // Close the open stripes: every head's block filled to its end, so
        // its parity is on flash, then one more checkpoint (recording the
        // heads there) whose record ends at a block's end too. What unmount
        // leaves is protected whole (but a block whose padding a failed
        // program stopped: its zone is read-only, its pages have their ECC,
        // and the cleaner moves them).
        if self.volume.device.parity().block_parity_pages > 0 {
            let padded = self.volume.pad_heads_to_block_ends()?;
            self.counters.pages_padded_at_unmount += padded;
            self.changed = true;
            self.volume.align_checkpoint = true;
            self.volume.declare_empty_first = true;
            let result = self.checkpoint();
            self.volume.align_checkpoint = false;
            self.volume.declare_empty_first = false;
            result?;
        }
        // Zone parity still owed (the checkpoints above may have filled a
        // zone too), paid and durable: a clean mount then writes nothing.
        self.volume.device.pay_owed_zone_parity()?;
        self.volume.device.flush()?;
        Ok(())
    }

    pub fn volume(&self) -> &Volume<D> {
        &self.volume
    }

    pub fn volume_mut(&mut self) -> &mut Volume<D> {
        &mut self.volume
    }

    pub fn device(&self) -> &D {
        self.volume.device()
    }

    /// Gives up the device without a checkpoint (a crash, as far as the
    /// file system is concerned).
    pub fn into_device(self) -> D {
        self.volume.into_device()
    }

    /// The options it was mounted with.
    pub fn options(&self) -> &FsOptions {
        &self.options
    }

    pub fn counters(&self) -> &FsCounters {
        &self.counters
    }

    /// What the protection layer corrected and repaired since the mount.
    pub fn protection_counters(&self) -> crate::ProtectionCounters {
        self.volume.protection_counters()
    }

    /// The number of the last checkpoint written or mounted.
    pub fn checkpoint_number(&self) -> u64 {
        self.volume.checkpoint.number
    }

    /// Bytes held in memory by the caches and buffers, and their bound.
    pub fn memory_bytes(&self) -> (usize, usize) {
        let used = self.nodes.used_bytes()
            + self.read_cache.used_bytes()
            + (self.dirty_blocks.len() + self.dirty_blocks.spare_len()) * self.page_size
            + self.known.capacity() * std::mem::size_of::<(u64, Known)>()
            + self.forgotten.capacity() * std::mem::size_of::<u64>();
        let bound = self.options.node_cache_bytes + self.options.read_cache_bytes + self.options.data_buffer_bytes;
        (used, bound)
    }

    /// The orphans known, in inode order (so that deleting them programs
    /// the same pages in every run).
    pub(crate) fn orphans(&self) -> Vec<u64> {
        let mut orphans: Vec<u64> = self.known.iter().filter(|(_, known)| known.orphan).map(|(&ino, _)| ino).collect();
        orphans.sort_unstable();
        orphans
    }

    /// Files the engine currently keeps findable by number.
    pub fn known_files(&self) -> usize {
        self.known.len()
    }

    /// The time of the operation running: one reading per operation, so
    /// that replaying its record gives every field the same value.
    pub(crate) fn now(&self) -> i64 {
        self.log.operation_now.unwrap_or_else(|| self.clock.now_ns())
    }

    /// EROFS on a read-only mount, for `what`: the guard of every public
    /// call that writes (a change, a checkpoint, cleaning, a scrub).
    pub(crate) fn refuse_if_read_only(&self, what: &str) -> Result<()> {
        if self.options.read_only {
            return Err(Error::new(errno::EROFS, format!("{what}: the file system is mounted read-only")));
        }
        Ok(())
    }

    /// Work done at the start of every operation that changes something:
    /// a timed checkpoint, or one because the declared unindexed zones
    /// could not take what is buffered plus what this operation may write.
    pub(crate) fn begin(&mut self, data_pages: u64) -> Result<()> {
        if self.log.replaying {
            // Recovery takes one checkpoint, at its end: one in between
            // would start a new log before the old one was replayed.
            return Ok(());
        }
        self.refuse_if_read_only("a change")?;
        if self.log_wants_checkpoint(1) {
            // The operation's record needs the log room only a checkpoint
            // makes: without it, the operation cannot start.
            return self.checkpoint_ordered();
        }
        // One refused for space lets the operation go on, the work below
        // included: on a full device the cleaning step is what may make
        // room.
        if self.checkpoint_due() && self.optional_checkpoint()? {
            return Ok(());
        }
        if self.release_wanted() {
            self.count_release();
            if self.optional_checkpoint()? {
                return Ok(());
            }
        }
        // The operation after a checkpoint resets no zone ahead, and takes
        // no cleaning step unless free zones are short (`clean_if_low`;
        // cleaning for wear, rare, still may): a program's write
        // and its fsync are two operations and one wait to it, and a
        // checkpoint is all one such wait should carry (the reset made the
        // slowest write of near_full_90 3 ms slower, the step 1 ms). The
        // next operation does it.
        let after_checkpoint = std::mem::take(&mut self.checkpoint_just_taken);
        let erased = !after_checkpoint && self.volume.erase_ahead()?;
        self.clean_if_low(!erased, after_checkpoint)?;
        // A checkpoint now, too, when what is buffered and one more
        // operation may no longer fit the zones left with the reserve
        // (`room_to_change`): what the operations that free space (unlink,
        // rmdir) left buffered goes out, and the checkpoint gives back the
        // space they freed.
        if self.unindexed_short(data_pages) || !self.checkpoint_fits(data_pages.min(1), 0, 0, 0, true) {
            // Taken or refused, the operation's own checks answer next.
            let _taken = self.optional_checkpoint()?;
        }
        Ok(())
    }

    /// A checkpoint `begin` or the idle work takes ahead of need (the
    /// timer's, a release's, or one for space): one refused for space is
    /// left to the operation's own checks, made after its lookups, so that a change to
    /// a name that is not there says ENOENT, and a write to a directory
    /// EISDIR, on a full device too (docs/SEMANTICS.md), and an operation
    /// that frees space without a check of its own (a file let go at its
    /// last close) still runs. A checkpoint that stops part way has
    /// written some blocks and nodes back, as evictions do, and left the
    /// rest buffered: a state the write-backs leave every day.
    /// Returns whether it was taken.
    pub(crate) fn optional_checkpoint(&mut self) -> Result<bool> {
        match self.checkpoint_ordered() {
            Ok(()) => Ok(true),
            Err(error) if error.errno == errno::ENOSPC => {
                tracing::debug!("a checkpoint ahead of an operation found no room: {}", error.message);
                self.counters.checkpoints_refused_for_space += 1;
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Something changed and the timer's interval has passed.
    pub(crate) fn checkpoint_due(&self) -> bool {
        let interval = i64::try_from(self.options.checkpoint_interval_ns).unwrap_or(i64::MAX);
        self.changed && self.now().saturating_sub(self.last_checkpoint_ns) >= interval
    }

    /// Whether the zones left in the declared list may not hold what is
    /// buffered and `data_pages` more.
    fn unindexed_short(&self, data_pages: u64) -> bool {
        let geometry = self.volume.device.geometry();
        let zone_pages = geometry.zone_pages();
        let dirty_nodes = (self.nodes.dirty_count() + self.pending.len()) as u64;
        let data_need = self.dirty_blocks.len() as u64 + data_pages;
        let node_need = dirty_nodes + OPERATION_NODE_PAGES_MAX;
        let zones_for = |need: u64, free: u64| need.saturating_sub(free).div_ceil(zone_pages);
        let zones_needed = zones_for(data_need, self.volume.head_free_pages(flintfs_format::ZoneRole::HotData))
            + zones_for(node_need, self.volume.head_free_pages(flintfs_format::ZoneRole::Node))
            + if self.log.nvm.is_some() {
                // The log is in NVM: it takes no zone.
                0
            } else {
                zones_for(LOG_RECORD_PAGES_MAX, self.volume.head_free_pages(flintfs_format::ZoneRole::Log))
            };
        zones_needed > self.volume.unindexed_remaining() as u64
    }

    /// Pages the data head and the node head cannot take in the zones they
    /// hold now, were `data_pages` and `node_pages` more written on top of
    /// what is buffered and then checkpointed: the dirty blocks, the dirty
    /// and pending nodes, the map pages, and one operation's worth of node
    /// pages as a margin. Data and nodes go to different heads, so each
    /// role's overflow is its own. The cleaner's thresholds count this.
    pub(crate) fn pages_past_heads(&self, data_pages: u64, node_pages: u64) -> (u64, u64) {
        let dirty_nodes = (self.nodes.dirty_count() + self.pending.len()) as u64;
        self.pages_past_heads_by(data_pages, dirty_nodes, node_pages, 1, OPERATION_NODE_PAGES_MAX)
    }

    /// As [`Fs::pages_past_heads`], with `buffered_pages` counted for what
    /// is dirty or pending (the cleaner's thresholds: one page a node), each
    /// node page wanted counted `amplification` times, and `margin_pages`
    /// of node pages kept for what comes next.
    fn pages_past_heads_by(
        &self,
        data_pages: u64,
        buffered_pages: u64,
        node_pages: u64,
        amplification: u64,
        margin_pages: u64,
    ) -> (u64, u64) {
        let nodes = buffered_pages + node_pages * amplification + margin_pages;
        // The map pages the checkpoint rewrites: every one, unamplified
        // (the cleaner's thresholds); amplified, no more than the nodes
        // whose writing dirties them (a map of 300 pages, counted whole,
        // kept the cleaner from a device with eight zones free).
        let map_pages = nodes::map_page_count(self.slot_count, self.page_size);
        let map_pages = if amplification > 1 { map_pages.min(nodes) } else { map_pages };
        let data_need = (self.dirty_blocks.len() as u64 + data_pages)
            .saturating_sub(self.volume.head_free_pages(flintfs_format::ZoneRole::HotData));
        let node_need = (nodes + map_pages + self.map_directory.len() as u64)
            .saturating_sub(self.volume.head_free_pages(flintfs_format::ZoneRole::Node));
        (data_need, node_need)
    }

    /// Whether the zones allocation may hand out, but for `kept_zones` of
    /// them, hold on top of what is buffered `data_pages` data pages,
    /// `node_pages` node pages (both counted as the space checks count
    /// them, nodes amplified) and `cold_pages` pages for the cold data
    /// head, and then the checkpoint that makes them durable. The zones
    /// kept are the largest, and each role takes whole zones, so each
    /// role's need is met zone by zone, smallest zones first: a zone
    /// shrunk by bad blocks counts for what it holds, and the estimate
    /// errs towards no. With `operation_margin`, room for one more
    /// operation's node pages ([`OPERATION_NODE_PAGES_MAX`]) is kept too,
    /// what an operation admitted now leaves for the next, and
    /// [`PROGRAM_FAILURE_MARGIN_ZONES`] free zones besides, even when the
    /// heads hold everything; the cleaner, which leaves a zone of the
    /// reserve instead, keeps neither. Where the heads hold everything,
    /// `kept_zones` asks for nothing.
    pub(crate) fn checkpoint_fits(
        &mut self,
        data_pages: u64,
        node_pages: u64,
        cold_pages: u64,
        kept_zones: usize,
        operation_margin: bool,
    ) -> bool {
        let margin = if operation_margin { OPERATION_NODE_PAGES_MAX } else { 0 };
        // A buffered block, written, dirties the index page that points
        // at it (or its inode), and may grow its file's tree.
        let dirty_nodes = (self.nodes.dirty_count() + self.pending.len()) as u64;
        let loose = dirty_nodes * CHECKPOINT_NODE_CHAIN_PAGES_MAX
            + self.dirty_blocks.len() as u64 * CHECKPOINT_BLOCK_CHAIN_PAGES_MAX;
        let need = |fs: &Self, buffered: u64| {
            fs.pages_past_heads_by(data_pages, buffered, node_pages, CHECKPOINT_NODE_AMPLIFICATION, margin)
        };
        let (data_need, node_need) = need(self, loose);
        let cold_need = cold_pages.saturating_sub(self.volume.head_free_pages(flintfs_format::ZoneRole::ColdData));
        // Every zone, the reserve's too, and the ones kept left out below.
        // The list is kept while nothing that changes it happens (the zone
        // scan's key), so the common case, before every write, reads none.
        let allowed = std::mem::replace(&mut self.volume.reserve_allowed, true);
        let key = self.zone_scan_key();
        let capacities = match self.capacities_hint.take() {
            Some((cached, capacities)) if cached == key => capacities,
            _ => self.volume.allocatable_capacities(),
        };
        self.volume.reserve_allowed = allowed;
        // New work keeps a zone for a failed program besides; the
        // cleaner's moves, which give zones back, may use it.
        let failure_margin = if operation_margin { PROGRAM_FAILURE_MARGIN_ZONES as usize } else { 0 };
        if data_need == 0 && node_need == 0 && cold_need == 0 {
            // The heads hold it all, and no zone is needed but the margin:
            // the last free zone is kept for a failed program even while
            // the heads have room (a head that fills takes it, and a
            // failure after that found no zone for any checkpoint). The
            // reserve is not asked for here: pages the heads already hold
            // cost no zone, and keeping the reserve would refuse writes
            // that take none.
            let fits = capacities.len() >= failure_margin;
            self.capacities_hint = Some((key, capacities));
            return fits;
        }
        let kept_zones = kept_zones + failure_margin;
        let usable = &capacities[..capacities.len().saturating_sub(kept_zones)];
        let mut fits = zones_cover(usable, &[data_need, node_need, cold_need]);
        if !fits {
            // Near full only: the bound counted a whole chain for each
            // buffered node, where their chains mostly share parents, and a
            // file's inode shares its page with other inodes. Counted node
            // by node, each chain once, a walk over what is buffered; kept,
            // with a whole chain added for each change since (a node made
            // dirty, or changed, a block buffered), until that no longer
            // fits and a walk counts again: every operation near full asks
            // two or three times, a cleaning step before each page, and a
            // walk each time made near_full_90 34 times slower in host time.
            let changes = self.walk_changes();
            let kept = self.walked.map(|(bound, at)| {
                bound.saturating_add(changes.saturating_sub(at).saturating_mul(CHECKPOINT_BLOCK_CHAIN_PAGES_MAX))
            });
            let covered = |fs: &Self, bound: u64| {
                let (data_need, node_need) = need(fs, bound);
                bound < loose && zones_cover(usable, &[data_need, node_need, cold_need])
            };
            fits = kept.is_some_and(|bound| covered(self, bound));
            let walked_now = self.walked.is_some_and(|(_, at)| at == changes);
            if !fits && !walked_now {
                let bound = self.buffered_node_pages_bound();
                self.walked = Some((bound, changes));
                fits = covered(self, bound);
            }
        }
        self.capacities_hint = Some((key, capacities));
        fits
    }

    /// What may have added to the walk's bound since it was counted, as a
    /// count that only grows: the cache's changes to its dirty nodes (one
    /// made dirty, changed, or let go, which is how a node becomes
    /// pending), and the blocks buffered or dropped. What a write-back or
    /// a checkpoint takes away only makes the bound loose.
    fn walk_changes(&self) -> u64 {
        self.nodes.dirty_changes() + self.dirty_blocks.changes()
    }

    /// Node pages a checkpoint may write for what is buffered now: each
    /// dirty or pending node, the index page (or inode) each buffered data
    /// block's writing dirties, and everything their writing dirties in turn
    /// (the chain of index pages above an index page, the file's inode,
    /// the directory page holding a file's entry), each counted once
    /// however many chains share it. File inodes count their record's
    /// share of a pack page (at most half full, since records do not
    /// split, and one more for the last); an index page, or a node not in
    /// memory, counts a page, and a file whose tree height is not in memory
    /// the highest tree. The map pages are counted apart. A walk: only
    /// when a whole chain a node and a block
    /// ([`CHECKPOINT_NODE_CHAIN_PAGES_MAX`], [`CHECKPOINT_BLOCK_CHAIN_PAGES_MAX`])
    /// does not fit.
    pub(crate) fn buffered_node_pages_bound(&self) -> u64 {
        use nodes::NodeKey;
        let room = (self.page_size - flintfs_format::NODE_HEADER_BYTES) as u64;
        let fanout = self.index_fanout();
        type KeySet<K> = std::collections::HashSet<K, BuildHasherDefault<KeyHasher>>;
        type KeyMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<KeyHasher>>;
        let mut closure: KeySet<NodeKey> = KeySet::default();
        let mut stack: Vec<NodeKey> = self.nodes.dirty_keys(crate::cache::Dirty::BOTH);
        stack.extend(self.pending.keys().copied());
        // What is read of a node (a file's tree height, an inode's record)
        // only from the dirty and pending ones, which stay in memory until
        // written: a clean one may be let go, and the bound kept after this
        // walk (`checkpoint_fits`) must not grow with that.
        let buffered: KeySet<NodeKey> = stack.iter().copied().collect();
        // Level 0 whatever the tree: a file with its blocks in the inode
        // counts one page more than it writes. A block past what the tree
        // holds grows it when it is written: the file's tree is counted as
        // high as its last buffered block needs (`grown`), with the new
        // top pages, which hold the old roots, on top of the block's path.
        let mut last = None;
        let mut last_blocks: KeyMap<u64, u64> = KeyMap::default();
        for &(ino, block) in self.dirty_blocks.keys() {
            let leaf = NodeKey::Index { level: 0, ino, number: block / fanout };
            if last != Some(leaf) {
                stack.push(leaf);
                last = Some(leaf);
            }
            // In order: a file's last block comes last.
            last_blocks.insert(ino, block);
        }
        let grown: KeyMap<u64, u8> = last_blocks
            .into_iter()
            .map(|(ino, block)| {
                let mut height = 0;
                while height < flintfs_format::INDEX_HEIGHT_MAX && block >= self.index_capacity_blocks(height) {
                    height += 1;
                }
                (ino, height)
            })
            .collect();
        // Physically located files: each one's entry is in a directory
        // page, which its writing dirties.
        let mut entries_moved: KeySet<u64> = KeySet::default();
        let in_memory = |key: NodeKey| {
            if buffered.contains(&key) {
                self.nodes.peek(key).or_else(|| self.pending.get(&key))
            } else {
                None
            }
        };
        let file_of = |ino: u64| match self.known.get(&ino).map(|known| known.location) {
            Some(Location::Slot(slot)) => NodeKey::Slot(slot),
            _ => NodeKey::File(ino),
        };
        // A buffered file's tree height, or none.
        let height_of = |ino: u64| match in_memory(file_of(ino)).map(|cached| &cached.node) {
            Some(flintfs_format::Node::File { content: flintfs_format::FileContent::Index { height, .. }, .. }) => {
                Some(*height)
            }
            _ => None,
        };
        for (&ino, &needed) in &grown {
            for level in height_of(ino).unwrap_or(0)..needed {
                stack.push(NodeKey::Index { level, ino, number: 0 });
            }
        }
        while let Some(key) = stack.pop() {
            if !closure.insert(key) {
                continue;
            }
            match key {
                NodeKey::Index { level, ino, number } => {
                    let file = file_of(ino);
                    let height = height_of(ino).map_or(flintfs_format::INDEX_HEIGHT_MAX, |height| {
                        height.max(grown.get(&ino).copied().unwrap_or(0))
                    });
                    stack.push(if level + 1 < height {
                        NodeKey::Index { level: level + 1, ino, number: number / fanout }
                    } else {
                        file
                    });
                }
                NodeKey::File(ino) => {
                    entries_moved.insert(ino);
                }
                // Slots point from the map, and map pages and the map
                // directory from the checkpoint: counted apart.
                NodeKey::Slot(_) | NodeKey::Map(_) | NodeKey::MapDirectory(_) => {}
            }
        }
        // The files' packs: their last page may hold a single record.
        let (mut pages, mut record_bytes) = (0u64, 0u64);
        let mut files_packed = false;
        for key in &closure {
            match (key, in_memory(*key)) {
                // An index page counts a page, as one written whole does
                // (its record's size is a scan of its pointers).
                (NodeKey::File(_), Some(cached)) => {
                    record_bytes += flintfs_format::inode_record_bytes(&cached.node) as u64;
                    files_packed = true;
                }
                _ => pages += 1,
            }
        }
        pages + (2 * record_bytes).div_ceil(room) + u64::from(files_packed) + entries_moved.len() as u64
    }

    /// Errors with ENOSPC unless `data_pages` and `node_pages` more can be
    /// written on top of what is buffered, keeping room for the checkpoint
    /// that makes it durable. Data and nodes go to different heads, and a
    /// head takes whole zones, so each role's need is met zone by zone:
    /// pages free in one head are no use to the other. Cleans first, up to
    /// [`CLEAN_ZONES_PER_OPERATION_MAX`] zones, when that may make the
    /// room: a full device says ENOSPC, it never spins.
    pub(crate) fn reserve_space(&mut self, data_pages: u64, node_pages: u64) -> Result<()> {
        if self.log.replaying || self.space_reserved {
            // The operation found the room when it first ran (or reserved
            // it at its start); recovery can neither clean nor checkpoint
            // until the log is replayed.
            return Ok(());
        }
        let mut cleaned = 0;
        let mut released = false;
        let mut checkpointed = false;
        loop {
            // The reserve is left out: an operation that fills space must
            // leave the reserve whole on top of its checkpoint's room, for
            // the unlinks and the cleaner that make space again.
            if self.checkpoint_fits(data_pages, node_pages, 0, RESERVE_ZONES as usize, true) {
                return Ok(());
            }
            // Zones emptied by unlinks and truncates come back at the next
            // checkpoint, without moving anything.
            if !released && self.volume.releasable_zones() > 0 {
                released = true;
                self.changed = true;
                self.checkpoint_ordered()?;
                continue;
            }
            // What is buffered is counted at its bound (each dirty node
            // with a parent): written, it costs what it costs, often much
            // less. Cleaning would end with a checkpoint anyway.
            if !checkpointed && self.has_buffered_work() {
                checkpointed = true;
                self.checkpoint_ordered()?;
                continue;
            }
            // The zones this operation may still clean, in one go: one
            // checkpoint for all of them, whose own pages would otherwise eat
            // what small zones give back.
            let more = if cleaned < CLEAN_ZONES_PER_OPERATION_MAX {
                self.cleaner.whole_zone_cleanings_for_space += 1;
                self.clean_for_space(CLEAN_ZONES_PER_OPERATION_MAX - cleaned).unwrap_or(0)
            } else {
                0
            };
            if more == 0 {
                let dirty_nodes = self.nodes.dirty_count() + self.pending.len();
                return Err(Error::new(
                    errno::ENOSPC,
                    format!(
                        "no space: {data_pages} data and {node_pages} node pages wanted, {} and {dirty_nodes} \
                         buffered, {} pages allocatable",
                        self.dirty_blocks.len(),
                        self.volume.allocatable_pages()
                    ),
                ));
            }
            cleaned += more;
        }
    }

    /// Errors with ENOSPC unless one more operation that changes
    /// something can be recorded: its node pages ([`OPERATION_NODE_PAGES_MAX`]
    /// at most) and a data page if it has any (a truncate's edge block; a
    /// write's own pages are checked as it buffers them), on top of what
    /// is buffered, and the checkpoint that makes them durable, must fit
    /// every zone left, the reserve's included, but the margin kept for a
    /// failed program ([`PROGRAM_FAILURE_MARGIN_ZONES`]). What fills space checks more
    /// ([`Fs::reserve_space`], which leaves the reserve whole); what frees
    /// it (unlink and rmdir after their lookups, a truncate that shrinks)
    /// checks only this, since the reserve is kept for it, and a file let
    /// go after its unlink not even this (`mutate_with`). A device this
    /// full can take nothing:
    /// taking it would leave nodes that no checkpoint, and so no unmount,
    /// could write.
    pub(crate) fn room_to_change(&mut self, data_pages: u64) -> Result<()> {
        if self.log.replaying || self.space_reserved || self.checkpoint_fits(data_pages.min(1), 0, 0, 0, true) {
            return Ok(());
        }
        Err(Error::new(
            errno::ENOSPC,
            "no space: not even the reserve, less the zone kept for a failed program, can take one more change and \
             its checkpoint",
        ))
    }

    /// Whether a checkpoint would write anything besides its record:
    /// dirty or pending nodes, or buffered data blocks.
    pub(crate) fn has_buffered_work(&self) -> bool {
        self.nodes.dirty_count() > 0 || !self.pending.is_empty() || !self.dirty_blocks.is_empty()
    }

    pub(crate) fn mark_checkpointed(&mut self) {
        self.last_checkpoint_ns = self.now();
        self.changed = false;
    }
}

/// Whether `capacities` (pages a zone, smallest first) hold each of
/// `needs` in whole zones of its own, in turn: each role takes whole
/// zones, so pages left in one role's last zone are no use to the next.
fn zones_cover(capacities: &[u64], needs: &[u64]) -> bool {
    let mut remaining = capacities.iter().copied();
    needs.iter().all(|&need| {
        let mut left = need;
        while left > 0 {
            match remaining.next() {
                Some(capacity) => left = left.saturating_sub(capacity),
                None => return false,
            }
        }
        true
    })
}
