//! # flintfs-core: the engine
//!
//! The file system over any [`flintfs_flash::FlashDevice`], with a plain Rust
//! API and no knowledge of FUSE. Time and randomness are inputs; the engine
//! reads no clock.
//!
//! What is here so far is the durable frame: [`mkfs`], a clean
//! [`Volume::mount`] from the newest valid checkpoint, and checkpoints
//! written into two alternating zones. The namespace, data path, metadata
//! log and recovery build on it.

mod allocator;
mod cache;
mod check;
mod error;
mod fs;
mod helper;
pub mod protect;
mod shared;
mod volume;
mod wear;

pub use allocator::PageMeta;
pub use cache::{Dirty, Evicted, PageCache};
pub use check::CheckReport;
pub use error::{errno, Error, Result};
pub use fs::{
    Attributes, CleanerCounters, Clock, DirectoryEntry, Fs, FsCounters, FsOptions, FsyncMode, ManualClock,
    RecoveryReport, RenameFlags, ScrubReport, SetAttributes, SetIdOnWrite, StatFs, XattrFlags, CACHE_PAGES_MIN,
    CLEAN_GAIN_PER_STEP_PAGES, CLEAN_IDLE_WATER_ZONES, CLEAN_LOW_WATER_ZONES, CLEAN_MOVES_PER_STEP_MAX,
    CLEAN_READS_PER_STEP_MAX, CLEAN_RELEASE_VICTIMS_MIN, CLEAN_STEP_RUNWAY_DYNAMIC_ZONES, CLEAN_STEP_RUNWAY_ZONES_MIN,
    CLEAN_ZONES_PER_OPERATION_MAX, COMPRESSED_SIXTEENTHS_MAX, COMPRESSION_BYTES_MIN, COMPRESSION_STREAKS_MAX,
    COMPRESSION_XATTR, FALLOCATE_MODES, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE,
    FORGOTTEN_BATCH_FILES, INCOMPRESSIBLE_AFTER_BLOCKS, INCOMPRESSIBLE_PROBE_BLOCKS, LOG_BUFFER_BYTES_MAX,
    LOG_PENDING_BLOCKS_MAX, LOG_RECORD_PAGES_MAX, LOG_ZONES_PER_CHECKPOINT, NVM_LOG_CHECKPOINT_QUARTERS,
    SCRUB_NAMED_PAGES_MAX, SCRUB_PAGES_PER_SECOND_DEFAULT, SCRUB_PAGES_PER_STEP_MAX, WEAR_SPREAD_MAX,
};
pub use protect::{Correction, ProtectionCounters};
pub use shared::{GroupCommit, GroupCommitCounters, Pacer, SharedFs};
pub use volume::{
    mkfs, slots_max, zones_min, MkfsOptions, MountReport, Volume, LOG_HEAD_ROLES, OPEN_ZONES_NEEDED, RESERVE_ZONES,
    ROOT_INO, UNINDEXED_SEGMENTS_DEFAULT,
};
