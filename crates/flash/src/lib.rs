//! # flintfs-flash: emulated raw NAND and zoned flash
//!
//! The only layer of flintfs that touches storage. The file system is generic
//! over [`FlashDevice`]; [`FlashEmulator`] implements it over a memory
//! backend ([`MemoryFlash`]) or an image file that persists across processes
//! ([`ImageFlash`]).
//!
//! ## The device
//! A device is `zone_count` zones of `zone_blocks` erase blocks of
//! `block_pages` pages, each page `page_size_bytes` of data plus
//! `oob_size_bytes` of spare area. Raw NAND is the case of one block per
//! zone. Pages of a zone are programmed strictly in order at the zone's write
//! pointer; a zone is erased whole by a reset. At most `open_zones_max` zones
//! are open (partly written) at once. Reading at or past the write pointer
//! returns the erased state (all `0xFF`) and says so ([`PageState::Erased`]).
//! Optionally a byte-addressable NVM region sits beside the flash.
//!
//! ## Durability model
//! - A program is accepted into a volatile write buffer and is readable at
//!   once, served from the controller's DRAM (no medium faults, no read
//!   disturb). Within a zone durability is a prefix: the durable write
//!   pointer. Across zones pages become durable in any order.
//! - `flush` makes every accepted program durable. The buffer holds at most
//!   `write_buffer_pages`; past that the device makes its oldest page durable
//!   on its own, as a real controller drains its buffer. Medium faults of a
//!   program (a misdirected landing, over-programmed bits) happen when the
//!   page reaches the medium.
//! - Zone resets and finishes are durable when they return, and so is a
//!   grown bad block.
//! - NVM writes land in a volatile view; `nvm_persist` makes the 8-byte words
//!   of a range durable.
//! - A power cut picks, per zone, a durable point uniformly between the
//!   durable write pointer and the accepted one. With probability
//!   `torn_operation_probability` the first page past that point is left
//!   *torn*: half-programmed, counted below the write pointer (a scan of raw
//!   NAND finds it not erased), with garbage contents that the file system
//!   must detect. Every unpersisted NVM word is kept or dropped with
//!   probability one half. Afterwards zone reports show the durable write
//!   pointers, open zones come back closed, and the device is freshly powered
//!   up. A cut can be immediate ([`FlashEmulator::power_cut`]) or scheduled
//!   to fire during the Nth mutating operation
//!   ([`FlashEmulator::schedule_power_cut`]), whether the device accepts or
//!   refuses that operation; a cut during a reset can interrupt the erase.
//! - For the image backend only durable state reaches the file, so killing
//!   the process is a power cut that keeps a prefix of every zone, tearing
//!   nothing: every flushed page, and of the pages the write buffer drained
//!   on its own since, those whose records were written (their records go
//!   [`DRAINED_RECORDS_LAG_PAGES`] pages at a time). An in-process cut
//!   keeps every drained page. Each zone
//!   reset carries a generation in the image, so a process killed between
//!   a reset's writes reopens to a completed reset, and faults recorded
//!   before the reset are dropped with the pages they belonged to.
//!
//! ## Fault model
//! Every fault below is off in [`FaultConfig::none`] (the default) and drawn
//! from one seeded generator in operation order, so the same seed and the
//! same operations give the same faults. A reopened image seeds that
//! generator from the seed mixed with its recorded lifetime counters, so it
//! does not replay the faults of an earlier open that flushed (a process
//! killed before its first flush recorded no counters, and is replayed). Faults never touch the pristine
//! data: what was programmed stays in the backend, and what the medium really
//! holds is the pristine data seen through a *fault overlay*
//! ([`FlashEmulator::pristine_page`] against [`FlashEmulator::media_page`]).
//! Transient bit flips on read are not stored at all. The device has no ECC:
//! like RCFFS, detection and correction are the file system's job.
//!
//! - **Wear.** Each block counts its program/erase cycles. Rated endurance is
//!   100K cycles for SLC, 10K for eMLC and 3K for MLC ([`CellType`]), the
//!   usual datasheet classes.
//! - **Raw bit errors.** Bits flip on read at a raw bit error rate (RBER)
//!   `fresh + wear_at_endurance * (pe/endurance)^2 * (1 + 9 * age_years)
//!   + 1e-10 * reads_since_erase` ([`BitErrorModel`]). It is calibrated to two
//!   points: about 1e-8 for a fresh block, and 3.4e-4 for 3x-nm MLC at 3K P/E
//!   after one year of retention, the order reported by flash
//!   characterisation studies (Mielke et al., IRPS 2008; Cai et al., DATE
//!   2012, where retention errors dominate at end of life). How the
//!   end-of-life figure splits between wear and retention (a tenfold growth
//!   over a year), the quadratic growth with wear, and the read-disturb
//!   coefficient (after Cai et al., DSN 2015, where RBER grows roughly
//!   linearly with reads since erase) are this crate's assumptions, not
//!   measurements. Retention age is simulated time since the block's first
//!   program; [`FlashDevice::advance_time`] ages the device.
//! - **Whole-page read failures.** A read fails outright (uncorrectable) with
//!   `read_failure_probability` (presets: 1e-7, an assumption).
//! - **Program and erase failures** grow bad blocks with probability
//!   `p_at_endurance * (pe/endurance)^4` (presets: 1e-5 per program and 1e-4
//!   per erase at rated endurance; failures are rare before rated endurance
//!   and climb steeply after it, as Grupp et al., MICRO 2009, observed). A
//!   failed program leaves its zone read-only; the block is retired at the
//!   zone's next reset, which lowers the zone's capacity. A failed erase
//!   retires the block at once; a zone with no good block left is offline.
//! - **Factory bad blocks**: a seeded fraction of blocks is bad from the
//!   start (presets: 2%, the scale of the valid-block minimum in NAND
//!   datasheets and ONFI).
//! - **Misdirected writes.** With `misdirected_write_probability` a program
//!   lands on another page when it reaches the medium: from then on the
//!   device reports the addressed page programmed but it returns all-`0xFF`
//!   bytes, and the victim page is over-programmed (bitwise AND, since
//!   programming only clears bits). Such writes are reported in the storage stack by
//!   Bairavasundaram et al. and Krioukov et al. (FAST 2008), and as "flying
//!   writes" of SSDs under power faults by Zheng et al. (FAST 2013). Off in
//!   the presets; tests turn them on.
//! - **Torn programs.** A power cut may leave the page being programmed
//!   half-programmed (see the durability model).
//! - **MLC paired pages.** In MLC, page `p` of a block shares cells with page
//!   `p - paired_page_distance`. A power cut that tears page `p` also
//!   corrupts the earlier page (bits flipped at `paired_page_bit_error_rate`,
//!   1%), even if it was flushed long before (Grupp et al., MICRO 2009; Zheng
//!   et al., FAST 2013). Presets use a distance of 4 for MLC and eMLC.
//! - **Interrupted erase.** A power cut during a zone reset leaves it half
//!   done with `interrupted_erase_probability` (presets: 0.5; otherwise the
//!   reset completed or never started, evenly): the zone keeps its write
//!   pointer, its pages read back with bits pulled towards 1, and its blocks
//!   carry an added RBER (`interrupted_erase_bit_error_rate`, 1e-3) until a
//!   complete erase.
//!
//! ## Cost model
//! [`Counters`] count pages read, OOB-only reads, pages programmed, data and
//! OOB bytes programmed, erases, zone resets, flushes, NVM bytes written,
//! persists and every injected fault; they can be read and reset. A timing
//! model ([`TimingConfig`]) accumulates simulated device time over channels x
//! dies: 50 us read, 600 us program, 3 ms erase and 400 MB/s channel
//! transfers by default.

mod backend;
mod block;
mod counters;
mod device;
mod error;
mod faults;
mod geometry;
mod host_file;
mod image;
mod image_writer;
mod timing;

pub use backend::{
    Backend, BlockRecord, DurableCondition, DurableState, MemoryBackend, Overlay, OverlayRecord, PageFault, ZoneRecord,
    OVERLAY_ENTRIES_MAX, OVERLAY_STORED_PAGES_MAX,
};
pub use block::{
    block_device_size, decode_block_header, BlockCreate, BlockFlash, BlockHeader, BlockLayout, BLOCK_FORMAT_VERSION,
    BLOCK_HEADER_BYTES, BLOCK_MAGIC, BLOCK_PENDING_SLOTS_MAX, BLOCK_TRAILER_BYTES, BLOCK_ZONE_RECORD_BYTES,
};
pub use counters::Counters;
pub use device::{
    DeviceOptions, FlashEmulator, MemoryFlash, PowerCutReport, ZoneCut, DRAINED_RECORDS_LAG_PAGES,
    WRITE_BUFFER_PAGES_DEFAULT, WRITE_BUFFER_PAGES_MAX,
};
pub use error::{errno, DeviceError, Result};
pub use faults::{BitErrorModel, CellType, FaultConfig, FAULT_PRESETS, RAW_BIT_ERROR_RATE_MAX};
pub use geometry::{
    Geometry, PageAddress, BLOCK_COUNT_MAX, DEVICE_PAGES_MAX, NVM_SIZE_BYTES_MAX, NVM_WORD_BYTES, OOB_SIZE_BYTES_MAX,
    OOB_SIZE_BYTES_MIN, PAGE_SIZE_BYTES_MAX, PAGE_SIZE_BYTES_MIN, ZONE_COUNT_MAX, ZONE_PAGES_MAX,
};
pub use host_file::{SCRATCH_BYTES_MAX, SCRATCH_CHUNK_BYTES};
pub use image::{
    decode_block_record, decode_overlay, decode_zone_record, encode_block_record, encode_overlay, encode_zone_record,
    slot_is_valid, HostWriteObserver, ImageBackend, ImageFlash, ImageHeader, ImageLayout, StoredZoneRecord,
    BLOCK_RECORD_BYTES, HEADER_SLOT_BYTES, HOST_SECTOR_BYTES, IMAGE_ALLOCATE_AHEAD_BYTES, IMAGE_FORMAT_VERSION,
    IMAGE_MAGIC, IMAGE_UNSYNCED_PAGES_MAX, PENDING_SLOTS_MAX, SLOT_TRAILER_BYTES, ZONE_RECORD_BYTES,
};
pub use image_writer::{IMAGE_ALLOCATE_AHEAD_ROOM_BYTES, IMAGE_QUEUED_BYTES_MAX, IMAGE_WRITER_START_BYTES};
pub use timing::{TimingConfig, CHANNELS_MAX, DIES_PER_CHANNEL_MAX};

/// What a read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// The page is at or past its zone's write pointer: all `0xFF`.
    Erased,
    /// The page was programmed; its bytes are what the medium returned.
    Programmed,
}

/// A zone's state, as on a ZNS device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZoneState {
    /// Erased, write pointer at zero.
    Empty,
    /// Partly written and counted against `open_zones_max`.
    Open,
    /// Partly written, not open (after a power cycle); a program reopens it.
    Closed,
    /// No more programs until a reset: written to capacity or finished.
    Full,
    /// A program failed in it: readable, not writable until reset.
    ReadOnly,
    /// No good blocks left: neither readable nor writable.
    Offline,
}

impl ZoneState {
    pub fn name(self) -> &'static str {
        match self {
            ZoneState::Empty => "empty",
            ZoneState::Open => "open",
            ZoneState::Closed => "closed",
            ZoneState::Full => "full",
            ZoneState::ReadOnly => "read-only",
            ZoneState::Offline => "offline",
        }
    }
}

/// One zone as the device reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneReport {
    pub zone: u32,
    pub state: ZoneState,
    /// The next page to program; pages below it hold data.
    pub write_pointer: u32,
    /// Pages the zone holds: its good blocks times `block_pages`. Less than
    /// the zone size when blocks have been retired.
    pub capacity_pages: u32,
    /// Highest program/erase count of the zone's blocks.
    pub erase_count_max: u32,
    /// Blocks of the zone that have failed.
    pub bad_blocks: u32,
}

/// The device interface the file system is generic over.
///
/// Reads take `&mut self`: they count, age the medium (read disturb) and draw
/// from the fault generator.
pub trait FlashDevice {
    fn geometry(&self) -> Geometry;

    /// Reads a page's data and spare area. `data` must be `page_size_bytes`
    /// long and `oob` `oob_size_bytes`.
    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState>;

    /// Reads only the spare area (cheaper: no data transfer).
    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState>;

    /// Programs the page at `address`, which must be its zone's write
    /// pointer. Opens the zone if it was empty or closed.
    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()>;

    /// Erases every good block of the zone; its write pointer returns to 0.
    fn reset_zone(&mut self, zone: u32) -> Result<()>;

    /// Closes a zone for programs without filling it (ZNS finish).
    fn finish_zone(&mut self, zone: u32) -> Result<()>;

    fn report_zone(&self, zone: u32) -> Result<ZoneReport>;

    fn report_zones(&self) -> Vec<ZoneReport>;

    /// Makes every accepted program durable.
    fn flush(&mut self) -> Result<()>;

    /// A flush that may return before it is durable on the host: every
    /// accepted program is durable against a power cut in the device's
    /// model, as after [`FlashDevice::flush`], but a killed process or a
    /// crashed host may leave the device as it was at an earlier moment
    /// (never a later state with an earlier write missing). For what only
    /// needs order (a checkpoint no caller waits on); what is promised to
    /// a caller takes a [`FlashDevice::flush`] after it.
    fn flush_ordered(&mut self) -> Result<()> {
        self.flush()
    }

    /// Whether a [`FlashDevice::flush_ordered`] left work that only a
    /// [`FlashDevice::flush`] waits for: a caller owed durability must
    /// flush even with nothing new programmed. Never on a device whose
    /// ordered flush is a flush.
    fn flush_owed(&self) -> bool {
        false
    }

    fn nvm_read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()>;

    fn nvm_write(&mut self, offset: u64, data: &[u8]) -> Result<()>;

    /// Makes the NVM words overlapping `[offset, offset + length)` durable.
    fn nvm_persist(&mut self, offset: u64, length: u64) -> Result<()>;

    /// Counters since the last [`FlashDevice::reset_counters`].
    fn counters(&self) -> Counters;

    fn reset_counters(&mut self);

    /// Simulated device time, in nanoseconds.
    fn now_ns(&self) -> u64;

    /// Lets simulated time pass while the device is idle.
    fn advance_time(&mut self, duration_ns: u64);

    /// How many dies work in parallel (raw NAND's LUNs; a device that does
    /// not say has one). Programs to one die queue behind each other.
    fn die_count(&self) -> u32 {
        1
    }

    /// Retires the erase block holding the page at `address`: it keeps its
    /// data until the zone is next reset, which leaves it out (the zone
    /// shrinks, as with a grown bad block). Returns false when this device
    /// cannot retire blocks on request.
    fn retire_block(&mut self, _address: PageAddress) -> Result<bool> {
        Ok(false)
    }

    /// The die that holds the page at `address`, where the device says;
    /// `None` for a page outside its zone's capacity.
    fn die_of(&self, _address: PageAddress) -> Option<u32> {
        Some(0)
    }
}

/// A device borrowed for a while (mkfs wraps the caller's device in the
/// file system's protection layer without taking it).
impl<T: FlashDevice + ?Sized> FlashDevice for &mut T {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }

    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        (**self).read_page(address, data, oob)
    }

    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState> {
        (**self).read_oob(address, oob)
    }

    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        (**self).program_page(address, data, oob)
    }

    fn reset_zone(&mut self, zone: u32) -> Result<()> {
        (**self).reset_zone(zone)
    }

    fn finish_zone(&mut self, zone: u32) -> Result<()> {
        (**self).finish_zone(zone)
    }

    fn report_zone(&self, zone: u32) -> Result<ZoneReport> {
        (**self).report_zone(zone)
    }

    fn report_zones(&self) -> Vec<ZoneReport> {
        (**self).report_zones()
    }

    fn flush(&mut self) -> Result<()> {
        (**self).flush()
    }

    fn flush_ordered(&mut self) -> Result<()> {
        (**self).flush_ordered()
    }

    fn flush_owed(&self) -> bool {
        (**self).flush_owed()
    }

    fn nvm_read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        (**self).nvm_read(offset, buffer)
    }

    fn nvm_write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        (**self).nvm_write(offset, data)
    }

    fn nvm_persist(&mut self, offset: u64, length: u64) -> Result<()> {
        (**self).nvm_persist(offset, length)
    }

    fn counters(&self) -> Counters {
        (**self).counters()
    }

    fn reset_counters(&mut self) {
        (**self).reset_counters()
    }

    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn advance_time(&mut self, duration_ns: u64) {
        (**self).advance_time(duration_ns)
    }

    fn die_count(&self) -> u32 {
        (**self).die_count()
    }

    fn die_of(&self, address: PageAddress) -> Option<u32> {
        (**self).die_of(address)
    }

    fn retire_block(&mut self, address: PageAddress) -> Result<bool> {
        (**self).retire_block(address)
    }
}
