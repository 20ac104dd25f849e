//! The protection layer: a [`FlashDevice`] over the raw device that seals
//! every page it programs (signature and ECC in the OOB, `docs/FORMAT.md`
//! "The protected page") and corrects every page it reads before the
//! engine sees it. The engine above reads and writes as before; what the
//! flash flipped is fixed here, cheapest layer first, and counted.
//!
//! The read path:
//! 1. the page header's CRC-32C over header and data (a CPU instruction, so
//!    every read pays it): a page that passes is returned as read;
//! 2. the BCH ECC, per 1 KiB codeword; a corrected page is returned only if
//!    its CRC *and* its 64-bit signature match, so a miscorrection past the
//!    code's bound is caught by two independent checks;
//! 3. a read again, up to [`READ_ATTEMPTS`] in all (flips on read are
//!    transient);
//! 4. the erase block's parity (k pages at the end of each block, RCFFS's
//!    per-block parity): the page is rebuilt from the block's other pages;
//! 5. the zone's Reed-Solomon parity (r erase blocks at the end of each
//!    zone, one parity page per row of pages across the zone's blocks), for
//!    a page whose block cannot rebuild it, as when the block is lost whole;
//! 6. otherwise the damaged bytes are returned as they are, counted as
//!    unrepairable, and the caller's checks refuse them (EIO).
//!
//! A rebuilt page is accepted only when its header's CRC, its signature and
//! its address all match: parity that does not match what it protects (a
//! torn parity page, a block written only in part) can only fail a repair,
//! never return wrong bytes.
//!
//! ## Layout
//! Parity takes fixed places, so the engine above sees a smaller device
//! with dense page numbers: [`Protected::geometry`] reports blocks of
//! `block_pages - k` pages and zones of `zone_blocks - r` blocks, and every
//! logical page maps to a physical one by skipping the parity slots. The
//! superblock zones keep no parity: they keep two copies instead.
//!
//! - The running parity of the block being written lives in memory (the
//!   open stripe) and is programmed right after the block's last data page.
//!   Until then a read that the ECC cannot bring back is rebuilt from the
//!   running parity in memory; and when the device has NVM with a stripe
//!   area, every flush also persists each open stripe that gained pages as
//!   a *stripe record* there, so the pages a flush made durable outlive a
//!   power cut under parity too ([`NvmStripes`], `docs/FORMAT.md` "Open
//!   stripes in NVM"). Without NVM they have the ECC alone until their
//!   block's parity is programmed; see
//!   [`ProtectionCounters::unprotected_pages_max`].
//! - The zone parity is programmed after the last data block's parity,
//!   from running rows kept in memory while the zone fills, some pages
//!   before each flush, what fits under the flush's wait for the busiest
//!   die (`Protected::zone_parity_pages_to_pay`): the zone owes it
//!   until then, and stays open. A clean unmount pays what is owed; a
//!   mount after a cut pays what the cut left owed.
//! - A zone finished before it fills (the engine moves its head on, or
//!   recovery closes what a crash left open) gets its last block's parity
//!   right after that block's data: in a finished zone, the last `k` pages
//!   of a partial block are its parity. Such a zone has no zone parity.
//! - After a mount, the running parity of a zone that was left part
//!   written is rebuilt at the first program there: the block's parity
//!   from the block's pages; the zone parity's rows, which need every
//!   data block, row by row as they are paid, so the first program reads
//!   a block, not the zone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use flintfs_flash::{
    Counters, DeviceError, FlashDevice, Geometry, PageAddress, PageState, Result, ZoneReport, ZoneState,
};
use flintfs_format::erasure::{unit_bytes, unit_into, unit_of, ErasureCode};
use flintfs_format::protection::{self, EccLayout, OOB_BYTES_MIN, PROTECTED_OOB_BYTES, WORN_MARGIN_FRACTION};
use flintfs_format::{
    nvm_stripe_crc, NvmHeader, NvmHeaderState, NvmStripeHeader, NVM_HEADER_BYTES, NVM_SIZE_BYTES_MIN,
    NVM_STRIPE_HEADER_BYTES,
};
use flintfs_format::{PageHeader, FIRST_DYNAMIC_ZONE, SUPERBLOCK_ZONES};

use crate::wear::NvmWear;

/// Pages in a run below which [`Protected::seal_pages`] seals on the
/// calling thread alone: handing half to the helper thread costs a
/// wake-up and a wait, and sealing a page costs about 1.5 to 2.5 µs
/// (4 KiB with the default ECC, header CRC included). The helper sleeps
/// between fsyncs, and waking it from its sleep cost about 55 µs on a
/// 2-core virtual machine: in-process append_fsync10 (a 10-page run at
/// each fsync) took about 96 µs a cycle with 8 here, against 41 µs with
/// 32 and with 64 (both seal that run on one thread). Half a run's
/// sealing outweighs a 55 µs wake-up only past 44 to 73 pages (at 2.5
/// and 1.5 µs a page), hence 64; a large flush's runs (up to
/// `DATA_RUN_PAGES_MAX`) still use both cores. (8 and 32 had measured
/// the same on fileserver, webserver and large_rand_write when each run
/// started a thread of its own, whose cost every run paid alike.)
pub const SEAL_PARALLEL_PAGES_MIN: usize = 64;

/// What the protection layer did, since the volume was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProtectionCounters {
    /// Pages the OOB's ECC brought back.
    pub pages_corrected_ecc: u64,
    /// Bits it flipped back doing so.
    pub bits_corrected_ecc: u64,
    /// Pages rebuilt from their erase block's parity.
    pub pages_repaired_block_parity: u64,
    /// Pages rebuilt from their zone's Reed-Solomon parity.
    pub pages_repaired_zone_parity: u64,
    /// Reads that no layer could bring back (EIO to the reader). A power
    /// cut's torn pages, which recovery reads on purpose, count here too.
    pub pages_unrepairable: u64,
    /// Device time spent on the extra reads of repairs.
    pub repair_device_time_ns: u64,
    /// Parity pages programmed (block and zone parity).
    pub parity_pages_programmed: u64,
    /// Pages read to rebuild an open stripe's running parity after a mount.
    pub stripe_rebuild_pages_read: u64,
    /// The most data pages that were at once programmed but not yet
    /// covered by a parity page on flash (the open stripes' window).
    pub unprotected_pages_max: u64,
    /// The most data pages that a flush had made durable and that were at
    /// once covered neither by a parity page on flash nor by a stripe
    /// record in NVM: what a power cut leaves with the ECC alone. Without
    /// NVM it is the window above, sampled at flushes; with NVM it is 0
    /// unless the stripe area had no free record.
    pub unprotected_durable_pages_max: u64,
    /// Pages of a block still being written rebuilt from its running
    /// parity: the one in memory, or, after a mount, its record in NVM.
    pub pages_repaired_open_stripe: u64,
    /// Stripe records written to NVM (one per open stripe that gained
    /// pages, at each flush).
    pub stripe_records_written: u64,
    /// Erase blocks retired: after [`RETIRE_REPAIRS_PER_BLOCK`] of their
    /// pages needed parity, or when their corrected reads needed half the
    /// ECC's reach on average (`note_correction`).
    pub blocks_retired: u64,
    /// Pages whose ECC correction reached [`EccLayout::worn_bits`] in a
    /// codeword (each moves its zone's data).
    pub pages_worn: u64,
    /// Reads that came back whole only on a later attempt (read retry):
    /// noise that a second sensing did not repeat.
    pub pages_read_again: u64,
    /// Moves of the NVM wear levelling's gap (`crate::wear`): each copies
    /// one 64-byte line and writes one ring word, with a persist each.
    pub nvm_wear_moves: u64,
}

impl ProtectionCounters {
    /// Pages rebuilt from parity of any kind.
    pub fn pages_repaired(&self) -> u64 {
        self.pages_repaired_block_parity + self.pages_repaired_zone_parity + self.pages_repaired_open_stripe
    }
}

/// Distinct pages of one erase block rebuilt from parity, in one mount, after which
/// the block is retired: it keeps its data until its zone is cleaned, and
/// the zone's next reset leaves it out. One rebuilt page is what parity is
/// for; a second in the same block says the block is wearing out.
pub const RETIRE_REPAIRS_PER_BLOCK: u32 = 2;
/// Zones remembered as wanting their data moved (read reclaim) at once.
pub const REFRESH_ZONES_MAX: usize = 256;
/// Rebuilt pages remembered, to count them per block.
pub const REPAIRED_PAGES_MAX: usize = 4096;
/// Erase blocks whose corrected reads are tallied at once.
pub const BLOCK_SAMPLES_MAX: usize = 65536;
/// Retired blocks remembered, to retire and count each once. Past it, no
/// more are retired in this mount (a warning says so): retiring one the
/// set forgot would count it again at every read.
pub const RETIRED_BLOCKS_MAX: usize = BLOCK_SAMPLES_MAX;
/// Corrected reads of a block before its average may retire it. The
/// average is tested after every read, so it must be steady by then: at
/// the end-of-life rate a page's bits spread by about 3.4 around 11, so
/// the mean of 64 reads sits within 0.4 of it, and half the reach (14) is
/// six spreads away. With 8 reads, chance alone retired 1,163 of 4,096
/// blocks in the soak's ten reads of a healthy end-of-life device.
pub const RETIRE_SAMPLE_READS_MIN: u32 = 64;

/// Which layers of correction reads use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Correction {
    /// The OOB's ECC.
    pub ecc: bool,
    /// Block and zone parity.
    pub parity: bool,
}

impl Correction {
    pub const ALL: Correction = Correction { ecc: true, parity: true };
    /// Detection alone: the CRC and the signature, nothing corrected.
    pub const NONE: Correction = Correction { ecc: false, parity: false };
    pub const ECC_ONLY: Correction = Correction { ecc: true, parity: false };
}

/// What a quick scan of a zone's stripes found, from the OOBs alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StripeScan {
    /// Stripes whose parity is on flash and was checked.
    pub stripes_checked: u64,
    /// Stripes whose parity signatures are not the combination of their
    /// pages' signatures (a page or a parity page is damaged or torn).
    pub stripes_inconsistent: u64,
    /// OOB reads it took.
    pub oob_reads: u64,
}

/// Parity pages per erase block and parity blocks per zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParityLayout {
    pub block_parity_pages: u32,
    pub zone_parity_blocks: u32,
}

/// Zones the engine writes at once: one per log head, the checkpoint zone
/// and the zone the cleaner fills.
pub const ZONES_WRITTEN_AT_ONCE_MAX: u64 = flintfs_format::LOG_HEADS_MAX as u64 + 2;
const _: () = assert!(ZONES_WRITTEN_AT_ONCE_MAX as usize <= OPEN_STRIPES_MAX, "every zone written keeps its stripe");

/// Open stripes kept at once: one per zone being written, and a device has
/// at most this many open zones in practice (the engine keeps six). Past
/// it, a stripe is dropped and rebuilt from flash when needed again.
pub const OPEN_STRIPES_MAX: usize = 16;

/// Zone parity pages programmed before a flush, while a zone's zone parity
/// is owed, where the device does not say which die a page is on. A
/// zone's parity blocks go to flash after its last data block, all to one
/// erase block (one die) per parity block: 64 pages at the default shape,
/// 38 ms of program time, which the next flush waited for at once (the
/// p99 of random overwrites at 90% full). Four pages a flush are 2.4 ms
/// of that die's time, spread over the fsyncs that follow; paying by the
/// page programmed instead made an operation that programmed many pay as
/// many. Until it is paid, the zone's pages have their block parity and
/// the ECC, as the open stripe's pages do.
///
/// Where the device says (`FlashDevice::die_of`), a flush pays what fits
/// under the wait it has anyway instead (`zone_parity_pages_to_pay`):
/// seven eighths of the programs the busiest die has queued beyond those
/// on the parity's die, and one page at least. Four pages were 2.4 ms
/// on every fsync while a zone owed (an fsync programs two pages, 0.6 ms
/// on their dies), and on each of a checkpoint's two flushes; a
/// checkpoint's node pages queue a whole block on one die (38 ms), under
/// which 56 of a parity block's 64 pages fit.
pub const ZONE_PARITY_PAGES_PER_FLUSH: u32 = 4;
/// Zone parity pages one flush pays at least while a zone owes it, when
/// the device says which die a page is on: what keeps the parity coming
/// when every flush is short.
pub const ZONE_PARITY_PAGES_PER_FLUSH_MIN: u32 = 1;
/// Of the busiest die's queue, the eighths the zone parity fills: that die
/// started its programs before the parity's first page was transferred
/// and finishes some while the rest are, so parity as long as its whole
/// queue finished last: near_full_90's slowest write paid 64 pages after
/// a checkpoint's 766 node pages, whose last block (64 pages on die 28)
/// had started 0.7 ms of transfers earlier.
pub const ZONE_PARITY_QUEUE_FILL_EIGHTHS: u32 = 7;
const _: () = assert!(ZONE_PARITY_QUEUE_FILL_EIGHTHS > 0 && ZONE_PARITY_QUEUE_FILL_EIGHTHS <= 8);
/// Zones whose zone parity is owed at once, at most: past it, the oldest is
/// paid in full. Each keeps its stripe (the rows) in memory.
pub const ZONES_OWING_PARITY_MAX: usize = 2;
const _: () = assert!(ZONES_WRITTEN_AT_ONCE_MAX as usize + ZONES_OWING_PARITY_MAX <= OPEN_STRIPES_MAX);
const _: () = assert!(ZONE_PARITY_PAGES_PER_FLUSH > 0);
const _: () =
    assert!(ZONE_PARITY_PAGES_PER_FLUSH_MIN > 0 && ZONE_PARITY_PAGES_PER_FLUSH_MIN <= ZONE_PARITY_PAGES_PER_FLUSH);

/// The running parity of the zone being written.
struct Stripe {
    /// The physical block (within the zone) whose parity is running.
    block: u32,
    /// Data pages of that block accumulated.
    data_pages: u32,
    /// `k` running units.
    block_parity: Vec<Vec<u8>>,
    /// Row `j` holds the `r` running units of page `j` across the zone's
    /// blocks, covering every block before `block` whole and `block` up to
    /// `data_pages`; empty without zone parity.
    zone_rows: Vec<Vec<Vec<u8>>>,
    /// Rows that lack the blocks written before this stripe was rebuilt
    /// from flash (empty when none do): each is read whole, across the
    /// zone's data blocks, when its zone parity is paid. Reading them all
    /// at the rebuild made the first program into a zone after a mount
    /// read up to the whole zone (640 pages, 38 ms of device time, in one
    /// write of near_full_90).
    rows_to_read: Vec<bool>,
}

/// Where a repair found the parity it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RepairSource {
    Block,
    Zone,
    OpenStripe,
}

/// A stripe record in force: the running parity of the first `data_pages`
/// data pages of physical erase block `block` of its zone, in record slot
/// `slot` of the stripe area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StripeRecord {
    slot: u32,
    block: u32,
    data_pages: u32,
}

/// The open stripes' running parity in NVM: the stripe area of the NVM
/// header (`docs/FORMAT.md`, "Open stripes in NVM").
///
/// A record is never written over the record in force of any zone: each
/// goes to the next slot, round the area, that no zone's record in force
/// holds, and is persisted whole before it is in force. A power cut while
/// it is written leaves a record whose CRC fails, and the zone's older
/// record still in force. Rotating through the area spreads the writes
/// over its words (NVM wear).
struct NvmStripes {
    uuid: [u8; 16],
    offset: u64,
    record_bytes: u64,
    records: u32,
    sequence_next: u64,
    /// The next slot to try.
    cursor: u32,
    /// The record in force per zone; one of 0 pages is a tombstone.
    current: BTreeMap<u32, StripeRecord>,
    /// Zones that may have a record on NVM (in force or not): a reset of
    /// one of them needs a tombstone.
    recorded: BTreeSet<u32>,
}

impl NvmStripes {
    /// Where record slot `slot` is in the region.
    fn at(&self, slot: u32) -> u64 {
        self.offset + u64::from(slot) * self.record_bytes
    }

    /// The next slot from the cursor that holds no record in force.
    fn free_slot(&self) -> Option<u32> {
        (0..self.records)
            .map(|step| (self.cursor + step) % self.records)
            .find(|slot| self.current.values().all(|record| record.slot != *slot))
    }

    /// The sequence for the next record; past the format's bound (only a
    /// hostile record found at mount gets there) the area goes out of use.
    fn sequence(&self) -> Result<u64> {
        if self.sequence_next > flintfs_format::NVM_STRIPE_SEQUENCE_MAX {
            return Err(DeviceError::OutOfRange {
                what: "a stripe record's sequence".into(),
                limit: flintfs_format::NVM_STRIPE_SEQUENCE_MAX.to_string(),
            });
        }
        Ok(self.sequence_next)
    }
}

/// The shape of one zone under the parity layout.
#[derive(Clone, Copy, Debug)]
struct ZoneShape {
    block_pages: u32,
    parity_pages: u32,
    /// Data pages per block.
    slots: u32,
    good_blocks: u32,
    /// Blocks that hold data (the good ones less the zone parity).
    data_blocks: u32,
    parity_blocks: u32,
}

impl ZoneShape {
    /// The zone's logical capacity: the data pages of its data blocks, what
    /// its report says and what a program may reach.
    fn data_pages(&self) -> u32 {
        self.data_blocks * self.slots
    }
}

/// The ECC layout of a geometry, built once per process for each shape
/// (building a BCH code's tables costs a few milliseconds).
pub fn ecc_layout(geometry: &Geometry) -> Option<Arc<EccLayout>> {
    type Cache = Vec<((u32, u32), Option<Arc<EccLayout>>)>;
    static CACHE: Mutex<Cache> = Mutex::new(Vec::new());
    let key = (geometry.page_size_bytes, geometry.oob_size_bytes);
    let mut cache = CACHE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, layout)) = cache.iter().find(|(shape, _)| *shape == key) {
        return layout.clone();
    }
    let layout =
        EccLayout::for_geometry(geometry.page_size_bytes as usize, geometry.oob_size_bytes as usize).map(Arc::new);
    cache.push((key, layout.clone()));
    layout
}

/// What a read-only mount refuses to do when a power cut interrupted a
/// zone finish (`Protected::complete_interrupted_finishes`): the words its
/// EROFS error carries, which callers may look for.
pub const FINISH_CUT_SHORT_REFUSAL: &str =
    "completing a zone finish a power cut interrupted, which only a read-write mount does,";

/// Whether a geometry's spare area holds what every page needs: the
/// header and the signature.
pub fn oob_fits(geometry: &Geometry) -> bool {
    geometry.oob_size_bytes as usize >= OOB_BYTES_MIN
}

/// How often a page that fails every check is read again before it counts
/// as unrepairable: bit flips on read are transient, as a real controller's
/// read retry finds.
pub const READ_ATTEMPTS: u32 = 3;

/// A device whose pages are sealed on program and corrected on read.
pub struct Protected<D: FlashDevice> {
    inner: D,
    ecc: Option<Arc<EccLayout>>,
    counters: ProtectionCounters,
    /// Reused for sealing, so a program allocates nothing.
    oob_scratch: Vec<u8>,
    parity: ParityLayout,
    stripes: BTreeMap<u32, Stripe>,
    /// Zones whose data blocks are all written and whose zone parity is
    /// still to be programmed, oldest first (`zone_parity_pages_to_pay`).
    owing: std::collections::VecDeque<u32>,
    /// Erasure codes by (data units, parity units).
    codes: BTreeMap<(usize, usize), Arc<ErasureCode>>,
    /// Zones holding a page that needed parity, or a bad parity page: the
    /// cleaner moves their data (read reclaim) when it next runs.
    refresh: BTreeSet<u32>,
    correction: Correction,
    /// Physical pages (zone, page) rebuilt from parity since the mount
    /// (bounded by [`REPAIRED_PAGES_MAX`]).
    repaired_pages: BTreeSet<(u32, u32)>,
    /// Erase blocks (zone, block) retired since the mount, so a block is
    /// counted once however often it is read (bounded by
    /// [`RETIRED_BLOCKS_MAX`]).
    retired_blocks: BTreeSet<(u32, u32)>,
    /// Corrected reads and the bits they needed (most in a codeword), per
    /// erase block (zone, block) since the mount, bounded by
    /// [`BLOCK_SAMPLES_MAX`]: what retirement by bit count judges.
    block_samples: BTreeMap<(u32, u32), (u32, u64)>,
    /// Zone resets asked of the device through this layer since it was
    /// opened (never reset, unlike the device's counters): a zone's
    /// capacity changes only at a reset.
    resets_issued: u64,
    /// Programs that failed through this layer since it was opened, parity
    /// pages' included (never reset): each retires a block, which a zone's
    /// capacity after its reset leaves out.
    programs_failed: u64,
    /// A program, reset or finish was issued since the last flush.
    unflushed: bool,
    /// Pages programmed on each die since the last flush (empty until the
    /// first, or where the device does not say which die a page is on),
    /// and the most on any one. A flush leaves every die idle, and reads
    /// and erases are waited for, so these are the queues the next flush
    /// waits for, in programs: what `zone_parity_pages_to_pay` fits the
    /// zone parity under.
    die_pages_programmed: Vec<u32>,
    die_pages_programmed_max: u32,
    /// The stripe area in NVM, when the device has one for this volume.
    nvm_stripes: Option<NvmStripes>,
    /// Start-gap wear levelling under every NVM structure: the engine's
    /// NVM offsets are logical, and this layer alone sees physical ones.
    nvm_wear: NvmWear,
    /// The unit of the page being programmed, kept between programs so
    /// that the parity's accumulation allocates nothing.
    unit_scratch: Vec<u8>,
    /// A read-only mount: every program, reset, finish and NVM write is
    /// refused here (EROFS), whichever path of the engine asks for it, so
    /// the medium and the NVM are left exactly as the mount found them.
    read_only: bool,
    /// Writes refused for `read_only` since this layer was opened: a
    /// read-only recovery that needed one did not replay all of the log.
    read_only_refusals: u64,
}

impl<D: FlashDevice> Protected<D> {
    pub fn new(inner: D) -> Protected<D> {
        let geometry = inner.geometry();
        let ecc = ecc_layout(&geometry);
        Protected {
            inner,
            ecc,
            counters: ProtectionCounters::default(),
            oob_scratch: Vec::new(),
            parity: ParityLayout::default(),
            stripes: BTreeMap::new(),
            owing: std::collections::VecDeque::new(),
            codes: BTreeMap::new(),
            refresh: BTreeSet::new(),
            repaired_pages: BTreeSet::new(),
            retired_blocks: BTreeSet::new(),
            block_samples: BTreeMap::new(),
            resets_issued: 0,
            programs_failed: 0,
            correction: Correction::ALL,
            unflushed: false,
            die_pages_programmed: Vec::new(),
            die_pages_programmed_max: 0,
            nvm_stripes: None,
            nvm_wear: NvmWear::new(geometry.nvm_size_bytes),
            unit_scratch: Vec::new(),
            read_only: false,
            read_only_refusals: 0,
        }
    }

    /// Refuses every write from now on (a read-only mount): programs,
    /// resets, finishes and NVM writes answer EROFS, and a flush has
    /// nothing to make durable.
    pub fn set_read_only(&mut self) {
        self.read_only = true;
    }

    /// Whether every write is refused ([`Protected::set_read_only`]).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Writes refused because the layer is read-only.
    pub fn read_only_refusals(&self) -> u64 {
        self.read_only_refusals
    }

    /// The guard every write of this layer passes first; it counts what it
    /// refuses, which a read-only recovery checks.
    fn refuse_write_if_read_only(&mut self, operation: &'static str) -> Result<()> {
        if self.read_only {
            self.read_only_refusals += 1;
            return Err(DeviceError::ReadOnly { operation });
        }
        Ok(())
    }

    /// Puts parity in its places from now on (mkfs's choice, from the
    /// superblock). Refuses a layout the geometry cannot hold.
    pub fn set_parity(&mut self, parity: ParityLayout) -> std::result::Result<(), String> {
        let geometry = self.inner.geometry();
        if parity.block_parity_pages >= geometry.block_pages {
            return Err(format!(
                "{} parity pages in a {}-page erase block leave no room for data",
                parity.block_parity_pages, geometry.block_pages
            ));
        }
        if parity.zone_parity_blocks >= geometry.zone_blocks {
            return Err(format!(
                "{} parity blocks in a {}-block zone leave no room for data",
                parity.zone_parity_blocks, geometry.zone_blocks
            ));
        }
        self.parity = parity;
        self.stripes.clear();
        self.nvm_stripes = None;
        Ok(())
    }

    /// Bytes of one stripe record in NVM under this parity layout (its
    /// header and the block parity's units), or 0 with no block parity.
    pub fn nvm_stripe_record_bytes(&self) -> u32 {
        if self.parity.block_parity_pages == 0 {
            return 0;
        }
        let unit = unit_bytes(self.inner.geometry().page_size_bytes as usize) as u32;
        let bytes = NvmStripeHeader::record_bytes(self.parity.block_parity_pages, unit);
        u32::try_from(bytes).unwrap_or(0)
    }

    /// Finds the stripe area of the NVM header of volume `uuid` and the
    /// record in force for each zone there (the newest whose CRC matches),
    /// so a page of a block left part written can be rebuilt from it. A
    /// region without a valid header of this volume, or whose records are
    /// of another shape, keeps no records (the engine writes a fresh header
    /// and calls this again). Reads each record's 64-byte header and the
    /// units of the newest per zone; writes nothing.
    pub fn open_nvm_stripes(&mut self, uuid: [u8; 16]) -> Result<()> {
        let geometry = self.inner.geometry();
        let nvm_size_bytes = self.nvm_wear.logical_bytes(geometry.nvm_size_bytes);
        let record_bytes = self.nvm_stripe_record_bytes();
        if nvm_size_bytes < NVM_SIZE_BYTES_MIN || record_bytes == 0 {
            self.nvm_stripes = None;
            return Ok(());
        }
        let mut bytes = vec![0u8; NVM_HEADER_BYTES];
        self.nvm_wear.read(&mut self.inner, 0, &mut bytes)?;
        let header = match NvmHeader::decode(&bytes, nvm_size_bytes) {
            NvmHeaderState::Valid(header)
                if header.uuid == uuid && header.stripe_records > 0 && header.stripe_record_bytes == record_bytes =>
            {
                header
            }
            _ => {
                self.nvm_stripes = None;
                return Ok(());
            }
        };
        if self.nvm_stripes.as_ref().is_some_and(|area| area.offset == header.stripe_offset()) {
            return Ok(());
        }
        let record_bytes = u64::from(record_bytes);
        let unit = unit_bytes(geometry.page_size_bytes as usize) as u32;
        let slots = geometry.block_pages - self.parity.block_parity_pages;
        let mut area = NvmStripes {
            uuid,
            offset: header.stripe_offset(),
            record_bytes,
            records: header.stripe_records,
            sequence_next: 1,
            cursor: 0,
            current: BTreeMap::new(),
            recorded: BTreeSet::new(),
        };
        let mut candidates: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
        // Writes resume after the newest record seen, so they go on round
        // the area (wear), not from where the records in force happen to be.
        let mut newest: Option<(u64, u32)> = None;
        let mut record_header = [0u8; NVM_STRIPE_HEADER_BYTES];
        for slot in 0..area.records {
            self.nvm_wear.read(&mut self.inner, area.at(slot), &mut record_header)?;
            let Ok(Some((found, _))) = NvmStripeHeader::decode(&record_header) else { continue };
            // Sequences go on past every record seen, whole or not.
            // (The decoder bounds them far below overflow.)
            area.sequence_next = area.sequence_next.max(found.sequence + 1);
            newest = newest.max(Some((found.sequence, slot)));
            area.recorded.insert(found.zone);
            if found.units == self.parity.block_parity_pages
                && found.unit_bytes == unit
                && found.data_pages < slots
                && found.block < geometry.zone_blocks
            {
                candidates.entry(found.zone).or_default().push((found.sequence, slot));
            }
        }
        for (zone, mut found) in candidates {
            found.sort_unstable_by(|a, b| b.cmp(a));
            for (_, slot) in found {
                if let Some((record, _)) = self.read_stripe_record(&area, slot)? {
                    area.current
                        .insert(zone, StripeRecord { slot, block: record.block, data_pages: record.data_pages });
                    break;
                }
            }
        }
        area.cursor = newest.map_or(0, |(_, slot)| (slot + 1) % area.records);
        if area.sequence().is_err() {
            // Only a hostile record gets there: the area stays out of use
            // for this mount, and the open stripes wait for their parity on
            // flash, as without NVM.
            tracing::warn!("the NVM stripe area's records are past their sequence bound: not used in this mount");
            return Ok(());
        }
        tracing::debug!(records = area.current.len(), "open stripes' records found in NVM");
        self.nvm_stripes = Some(area);
        Ok(())
    }

    /// The record in slot `slot` and its units, if its CRC matches.
    fn read_stripe_record(&mut self, area: &NvmStripes, slot: u32) -> Result<Option<(NvmStripeHeader, Vec<Vec<u8>>)>> {
        let mut bytes = vec![0u8; area.record_bytes as usize];
        self.nvm_wear.read(&mut self.inner, area.at(slot), &mut bytes)?;
        let Ok(Some((record, crc))) = NvmStripeHeader::decode(&bytes[..NVM_STRIPE_HEADER_BYTES]) else {
            return Ok(None);
        };
        let unit = record.unit_bytes as usize;
        if NvmStripeHeader::record_bytes(record.units, record.unit_bytes) != area.record_bytes {
            return Ok(None);
        }
        // A tombstone (0 pages) has no units; its CRC covers its header.
        let units: Vec<Vec<u8>> = if record.data_pages == 0 {
            Vec::new()
        } else {
            bytes[NVM_STRIPE_HEADER_BYTES..].chunks_exact(unit).map(<[u8]>::to_vec).collect()
        };
        if nvm_stripe_crc(&area.uuid, &bytes, units.iter().map(Vec::as_slice)) != crc {
            return Ok(None);
        }
        Ok(Some((record, units)))
    }

    /// After a flush: each open stripe that gained pages since its record
    /// (or has none) gets a new one, persisted, so every page the flush
    /// made durable is under parity in NVM before the flush returns.
    /// Records of blocks whose parity is on flash now, or of zones reset
    /// or finished, are let go first (their slots free).
    fn record_open_stripes(&mut self) -> Result<()> {
        let Some(mut area) = self.nvm_stripes.take() else { return Ok(()) };
        let result = self.record_open_stripes_in(&mut area);
        self.nvm_stripes = Some(area);
        result
    }

    fn record_open_stripes_in(&mut self, area: &mut NvmStripes) -> Result<()> {
        let block_pages = self.inner.geometry().block_pages;
        let mut obsolete = Vec::new();
        for (&zone, record) in &area.current {
            // A tombstone stays until the zone's next record replaces it.
            let in_force = record.data_pages == 0
                || match self.stripes.get(&zone) {
                    Some(stripe) => stripe.block == record.block,
                    // A zone a failed program left read-only keeps the record of
                    // its open block: its durable pages have no other parity.
                    None => self.inner.report_zone(zone).is_ok_and(|report| {
                        matches!(report.state, ZoneState::Open | ZoneState::Closed | ZoneState::ReadOnly)
                            && report.write_pointer / block_pages == record.block
                    }),
                };
            if !in_force {
                obsolete.push(zone);
            }
        }
        for zone in obsolete {
            area.current.remove(&zone);
        }
        let slots = block_pages - self.parity.block_parity_pages;
        let wanted: Vec<(u32, u32, u32)> = self
            .stripes
            .iter()
            .filter(|(_, stripe)| stripe.data_pages > 0 && stripe.data_pages < slots)
            .filter(|(zone, stripe)| {
                area.current
                    .get(zone)
                    .is_none_or(|record| (record.block, record.data_pages) != (stripe.block, stripe.data_pages))
            })
            .map(|(&zone, stripe)| (zone, stripe.block, stripe.data_pages))
            .collect();
        for (zone, block, data_pages) in wanted {
            let Some(slot) = area.free_slot() else {
                // Every slot holds a record in force: this stripe waits for
                // its parity on flash, as without NVM.
                continue;
            };
            let units = &self.stripes[&zone].block_parity;
            let header = NvmStripeHeader {
                sequence: area.sequence()?,
                zone,
                block,
                data_pages,
                units: units.len() as u32,
                unit_bytes: units[0].len() as u32,
            };
            let mut bytes = Vec::with_capacity(area.record_bytes as usize);
            bytes.extend_from_slice(&header.encode(&area.uuid, units));
            for unit in units {
                bytes.extend_from_slice(unit);
            }
            assert_eq!(bytes.len() as u64, area.record_bytes, "a stripe record fills its slot");
            self.put_record(area, zone, StripeRecord { slot, block, data_pages }, &bytes)?;
            self.counters.stripe_records_written += 1;
        }
        Ok(())
    }

    /// Writes and persists a record's `bytes` (a whole record, or a
    /// tombstone's header) in its slot, then puts it in force for `zone`.
    fn put_record(&mut self, area: &mut NvmStripes, zone: u32, record: StripeRecord, bytes: &[u8]) -> Result<()> {
        self.refuse_write_if_read_only("an NVM stripe record")?;
        let at = area.at(record.slot);
        self.nvm_wear.write(&mut self.inner, at, bytes)?;
        self.nvm_wear.persist(&mut self.inner, at, bytes.len() as u64)?;
        area.sequence_next += 1;
        area.cursor = (record.slot + 1) % area.records;
        area.current.insert(zone, record);
        area.recorded.insert(zone);
        Ok(())
    }

    /// Before a zone is reset: a *tombstone* (a record of 0 pages, no
    /// units) goes in force for it, persisted, so no record of the zone's
    /// earlier use comes into force after the reset. One would: rebuilt
    /// over a page of the new use that a cut tore, it gives back the old
    /// page whole, which passes every check. The tombstone stays in force
    /// until the zone's next record. With no slot free for it, every
    /// record of the zone is zeroed instead (read from NVM to find them).
    fn forget_stripe_record(&mut self, zone: u32) -> Result<()> {
        let Some(mut area) = self.nvm_stripes.take() else { return Ok(()) };
        let result = self.write_tombstone(&mut area, zone);
        self.nvm_stripes = Some(area);
        result
    }

    fn write_tombstone(&mut self, area: &mut NvmStripes, zone: u32) -> Result<()> {
        // Nothing of the zone on NVM, or a tombstone in force already.
        if !area.recorded.contains(&zone) || area.current.get(&zone).is_some_and(|record| record.data_pages == 0) {
            return Ok(());
        }
        self.refuse_write_if_read_only("an NVM stripe tombstone")?;
        let Some(slot) = area.free_slot() else {
            let mut header = [0u8; NVM_STRIPE_HEADER_BYTES];
            for slot in 0..area.records {
                let at = area.at(slot);
                self.nvm_wear.read(&mut self.inner, at, &mut header)?;
                if matches!(NvmStripeHeader::decode(&header), Ok(Some((found, _))) if found.zone == zone) {
                    self.nvm_wear.write(&mut self.inner, at, &[0u8; 8])?;
                    self.nvm_wear.persist(&mut self.inner, at, 8)?;
                }
            }
            area.current.remove(&zone);
            return Ok(());
        };
        let unit = unit_bytes(self.inner.geometry().page_size_bytes as usize) as u32;
        let header = NvmStripeHeader {
            sequence: area.sequence()?,
            zone,
            block: 0,
            data_pages: 0,
            units: self.parity.block_parity_pages,
            unit_bytes: unit,
        };
        let bytes = header.encode(&area.uuid, &[]);
        self.put_record(area, zone, StripeRecord { slot, block: 0, data_pages: 0 }, &bytes)
    }

    /// Pages a flush made durable that neither parity on flash nor a
    /// stripe record covers, summed over the open stripes.
    fn note_unprotected_durable(&mut self) {
        let open: u64 = self
            .stripes
            .iter()
            .map(|(zone, stripe)| {
                let recorded = self
                    .nvm_stripes
                    .as_ref()
                    .and_then(|area| area.current.get(zone))
                    .filter(|record| record.block == stripe.block)
                    .map_or(0, |record| record.data_pages);
                u64::from(stripe.data_pages.saturating_sub(recorded))
            })
            .sum();
        self.counters.unprotected_durable_pages_max = self.counters.unprotected_durable_pages_max.max(open);
    }

    /// Whether a program, reset or finish was issued since the last flush
    /// (which a flush would make durable).
    pub fn unflushed(&self) -> bool {
        self.unflushed
    }

    pub fn parity(&self) -> ParityLayout {
        self.parity
    }

    /// Turns correction layers off for reads (to measure what each one is
    /// worth); programs still carry everything.
    pub fn set_correction(&mut self, correction: Correction) {
        self.correction = correction;
    }

    /// Zones whose data should move: a page there needed parity, or a
    /// parity page there is bad.
    pub fn refresh_wanted(&self) -> &BTreeSet<u32> {
        &self.refresh
    }

    /// Asks for `zone`'s data to be moved (bounded: past the bound the
    /// request is dropped, and the next repair there asks again).
    pub fn want_refresh(&mut self, zone: u32) {
        if self.refresh.len() < REFRESH_ZONES_MAX {
            self.refresh.insert(zone);
        }
    }

    /// A page of `zone` at physical `page` was rebuilt from parity: its
    /// zone wants moving, and its block is retired at the second.
    fn note_repair(&mut self, zone: u32, page: u32) {
        self.want_refresh(zone);
        if self.repaired_pages.len() >= REPAIRED_PAGES_MAX || !self.repaired_pages.insert((zone, page)) {
            return;
        }
        let block_pages = self.inner.geometry().block_pages;
        let start = page / block_pages * block_pages;
        let in_block = self.repaired_pages.range((zone, start)..(zone, start + block_pages)).count() as u32;
        if in_block == RETIRE_REPAIRS_PER_BLOCK {
            self.retire(zone, page);
        }
    }

    /// The ECC brought back the page of `zone` at physical `page` with at
    /// most `codeword_bits` corrected in a codeword.
    /// - Past the worn mark the zone's data moves while the code can still
    ///   read it (a real controller's read reclaim): rewritten, the bits
    ///   that retention flipped are fresh again.
    /// - The block is retired when its corrected reads need, on average,
    ///   half the code's reach ([`RETIRE_SAMPLE_READS_MIN`] of them at
    ///   least, so chance cannot): its raw error rate is then past the
    ///   end-of-life point the code was sized for (at 3.4e-4 a page
    ///   averages 11 of 28 bits). One
    ///   page at the mark is not enough: at end of life one read in about
    ///   3,000 gets there by chance, and retiring on that would take a
    ///   fifth of the blocks in ten reads of the device (a soak measured
    ///   819 of 4,096).
    fn note_correction(&mut self, zone: u32, page: u32, codeword_bits: u32) {
        // A code too weak to leave a margin (t under the fraction's
        // denominator, where the mark would be t itself) says nothing about
        // wear: one bit past an ordinary flip is already a failure.
        let Some(layout) = self.ecc.as_deref().filter(|layout| layout.correctable_bits() >= WORN_MARGIN_FRACTION)
        else {
            return;
        };
        let (worn, half) = (layout.worn_bits(), layout.correctable_bits() / 2);
        if codeword_bits >= worn {
            self.counters.pages_worn += 1;
            self.want_refresh(zone);
        }
        let block = page / self.inner.geometry().block_pages;
        let tallied = self.block_samples.contains_key(&(zone, block));
        if self.retired_blocks.contains(&(zone, block)) || (!tallied && self.block_samples.len() >= BLOCK_SAMPLES_MAX) {
            return;
        }
        let sample = self.block_samples.entry((zone, block)).or_default();
        sample.0 += 1;
        sample.1 += u64::from(codeword_bits);
        if sample.0 >= RETIRE_SAMPLE_READS_MIN && sample.1 >= u64::from(sample.0) * u64::from(half) {
            self.want_refresh(zone);
            self.retire(zone, page);
        }
    }

    /// Retires the erase block of physical `page` in `zone` (it keeps its
    /// data until the zone's next reset), counting it once.
    /// The superblock and checkpoint zones are never shrunk: they are fixed
    /// places, and their records must keep fitting (their pages are kept
    /// twice over instead).
    fn retire(&mut self, zone: u32, page: u32) {
        // Read-only, the device's bad block table is left as it is: a
        // retirement is recorded on the device, and a read-write mount
        // retires the block when it reads it.
        if zone < FIRST_DYNAMIC_ZONE || self.read_only {
            return;
        }
        let block = page / self.inner.geometry().block_pages;
        if self.retired_blocks.contains(&(zone, block)) {
            return;
        }
        if self.retired_blocks.len() >= RETIRED_BLOCKS_MAX {
            tracing::warn!(zone, block, "{RETIRED_BLOCKS_MAX} blocks retired in this mount; this one is left in use");
            return;
        }
        if self.inner.retire_block(PageAddress::new(zone, page)).unwrap_or(false) {
            self.retired_blocks.insert((zone, block));
            // Its reads need tallying no more.
            self.block_samples.remove(&(zone, block));
            self.counters.blocks_retired += 1;
            tracing::info!(zone, block, "erase block retired");
        }
    }

    /// RCFFS's quick scan of one zone: every stripe whose parity is on
    /// flash is checked by the homomorphism, from OOB reads alone (the
    /// parity pages' signatures against the same combination of their
    /// pages' signatures). It finds torn or damaged stripes, not bit flips
    /// in data that the OOB does not show: the full scrub reads those.
    pub fn quick_scan(&mut self, zone: u32) -> Result<StripeScan> {
        let mut scan = StripeScan::default();
        if !self.parity_zone(zone) {
            return Ok(scan);
        }
        let report = self.inner.report_zone(zone)?;
        let shape = self.shape(report.capacity_pages);
        let oob_bytes = self.inner.geometry().oob_size_bytes as usize;
        let signature_of = |device: &mut Self, page: u32, scan: &mut StripeScan| -> Option<[u16; 4]> {
            let mut oob = vec![0u8; oob_bytes];
            scan.oob_reads += 1;
            match device.inner.read_oob(PageAddress::new(zone, page), &mut oob) {
                Ok(PageState::Programmed) => {
                    let bytes: [u8; 8] = oob[protection::SIGNATURE_OFFSET..PROTECTED_OOB_BYTES].try_into().ok()?;
                    Some(flintfs_format::gf::decode_signature(&bytes))
                }
                _ => None,
            }
        };
        let stripe_matches = |code: &ErasureCode, members: &[Option<[u16; 4]>], parity: &[Option<[u16; 4]>]| {
            parity.iter().enumerate().all(|(row, stored)| {
                let terms: Option<Vec<(u16, [u16; 4])>> = members
                    .iter()
                    .enumerate()
                    .map(|(index, signature)| signature.map(|signature| (code.coefficient(row, index), signature)))
                    .collect();
                matches!((terms, stored), (Some(terms), Some(stored)) if flintfs_format::gf::combine_signatures(&terms) == *stored)
            })
        };
        if let Some(code) = self.block_code(shape) {
            for block in 0..shape.data_blocks {
                let Some((data_count, parity_start)) = self.block_members(block, &report, shape) else { continue };
                let start = block * shape.block_pages;
                let members: Vec<Option<[u16; 4]>> = (0..shape.slots)
                    .map(|row| if row < data_count { signature_of(self, start + row, &mut scan) } else { Some([0; 4]) })
                    .collect();
                let parity: Vec<Option<[u16; 4]>> =
                    (0..shape.parity_pages).map(|index| signature_of(self, parity_start + index, &mut scan)).collect();
                scan.stripes_checked += 1;
                if !stripe_matches(&code, &members, &parity) {
                    scan.stripes_inconsistent += 1;
                }
            }
        }
        if let Some(code) = self.zone_code(shape) {
            if report.write_pointer >= shape.good_blocks * shape.block_pages {
                for row in 0..shape.block_pages {
                    let members: Vec<Option<[u16; 4]>> = (0..shape.data_blocks)
                        .map(|block| signature_of(self, block * shape.block_pages + row, &mut scan))
                        .collect();
                    let parity: Vec<Option<[u16; 4]>> = (0..shape.parity_blocks)
                        .map(|index| {
                            signature_of(self, (shape.data_blocks + index) * shape.block_pages + row, &mut scan)
                        })
                        .collect();
                    scan.stripes_checked += 1;
                    if !stripe_matches(&code, &members, &parity) {
                        scan.stripes_inconsistent += 1;
                    }
                }
            }
        }
        Ok(scan)
    }

    /// Reads every parity page of `zone` whose stripe is on flash and
    /// checks it (ECC, then its signature); returns (checked, bad). A bad
    /// one asks for the zone's data to move, which writes fresh parity.
    pub fn check_parity_pages(&mut self, zone: u32) -> Result<(u64, u64)> {
        let (mut checked, mut bad) = (0, 0);
        if !self.parity_zone(zone) {
            return Ok((0, 0));
        }
        let report = self.inner.report_zone(zone)?;
        let shape = self.shape(report.capacity_pages);
        let mut pages = Vec::new();
        for block in 0..shape.data_blocks {
            if let Some((_, parity_start)) = self.block_members(block, &report, shape) {
                pages.extend(parity_start..parity_start + shape.parity_pages);
            }
        }
        if self.zone_code(shape).is_some() && report.write_pointer >= shape.good_blocks * shape.block_pages {
            pages.extend(shape.data_blocks * shape.block_pages..shape.good_blocks * shape.block_pages);
        }
        for page in pages {
            checked += 1;
            if self.read_unit(PageAddress::new(zone, page), true).is_none() {
                bad += 1;
                self.want_refresh(zone);
            }
        }
        Ok((checked, bad))
    }

    /// The most data pages that can be programmed and acknowledged with
    /// no parity page on flash covering them yet: every data slot but the
    /// last of the block being filled (the last one's program is followed
    /// at once by the block's parity), in each zone written at once.
    /// `None` without block parity: then every page of a zone being
    /// written waits for the zone's parity.
    pub fn unprotected_pages_bound(&self) -> Option<u64> {
        if self.parity.block_parity_pages == 0 {
            return None;
        }
        let slots = self.inner.geometry().block_pages - self.parity.block_parity_pages;
        Some(ZONES_WRITTEN_AT_ONCE_MAX * u64::from(slots))
    }

    /// Zone resets issued through this layer since it was opened: what a
    /// cached sum of zone capacities is keyed by.
    pub fn resets_issued(&self) -> u64 {
        self.resets_issued
    }

    /// Programs that failed through this layer since it was opened.
    pub fn programs_failed(&self) -> u64 {
        self.programs_failed
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    pub fn protection_counters(&self) -> ProtectionCounters {
        ProtectionCounters { nvm_wear_moves: self.nvm_wear.moves_made(), ..self.counters }
    }

    /// The ECC this device's pages carry (`None` when the OOB has no room).
    pub fn ecc(&self) -> Option<&EccLayout> {
        self.ecc.as_deref()
    }

    /// Tries the ECC on a page that failed its CRC; true if it is now
    /// whole by both the CRC and the signature.
    fn correct_with_ecc(&mut self, physical: PageAddress, data: &mut [u8], oob: &mut [u8]) -> bool {
        let Some(layout) = self.ecc.clone().filter(|_| self.correction.ecc) else { return false };
        let correction = protection::correct(data, oob, &layout);
        if correction.bits_corrected == 0 {
            return false;
        }
        if PageHeader::decode(oob, data).is_ok() && protection::signature_matches(data, oob) {
            self.counters.pages_corrected_ecc += 1;
            self.counters.bits_corrected_ecc += u64::from(correction.bits_corrected);
            self.note_correction(physical.zone, physical.page, correction.codeword_bits_max);
            return true;
        }
        false
    }

    fn parity_on(&self) -> bool {
        self.parity.block_parity_pages > 0 || self.parity.zone_parity_blocks > 0
    }

    /// Whether `zone` keeps parity: every zone but the superblock's.
    fn parity_zone(&self, zone: u32) -> bool {
        self.parity_on() && !SUPERBLOCK_ZONES.contains(&zone)
    }

    /// The pages a zone will hold once it is reset and taken, as
    /// [`FlashDevice::report_zone`] reports them here: a reset leaves its
    /// bad blocks out, so a zone whose block went bad since its last reset
    /// (a failed program, which left it read-only) holds a block less than
    /// its report says. What the space checks count a free zone at.
    pub fn capacity_after_reset(&self, report: &ZoneReport) -> u32 {
        let geometry = self.inner.geometry();
        let physical = geometry.zone_blocks.saturating_sub(report.bad_blocks) * geometry.block_pages;
        let logical = if self.parity_zone(report.zone) { self.shape(physical).data_pages() } else { physical };
        logical.min(report.capacity_pages)
    }

    fn shape(&self, capacity_pages: u32) -> ZoneShape {
        let geometry = self.inner.geometry();
        let block_pages = geometry.block_pages;
        let good_blocks = capacity_pages / block_pages;
        ZoneShape {
            block_pages,
            parity_pages: self.parity.block_parity_pages,
            slots: block_pages - self.parity.block_parity_pages,
            good_blocks,
            data_blocks: good_blocks.saturating_sub(self.parity.zone_parity_blocks),
            parity_blocks: self.parity.zone_parity_blocks,
        }
    }

    fn to_physical(&self, address: PageAddress) -> PageAddress {
        if !self.parity_zone(address.zone) {
            return address;
        }
        let geometry = self.inner.geometry();
        let slots = geometry.block_pages - self.parity.block_parity_pages;
        PageAddress::new(address.zone, address.page / slots * geometry.block_pages + address.page % slots)
    }

    /// A zone report in logical pages.
    fn logical_report(&self, report: ZoneReport) -> ZoneReport {
        if !self.parity_zone(report.zone) {
            return report;
        }
        let shape = self.shape(report.capacity_pages);
        let (block, offset) = (report.write_pointer / shape.block_pages, report.write_pointer % shape.block_pages);
        let write_pointer = if block >= shape.data_blocks {
            shape.data_pages()
        } else if report.state == ZoneState::Full && offset > 0 {
            // A zone finished with its last block part written: the last
            // k pages there are that block's parity.
            block * shape.slots + offset.saturating_sub(shape.parity_pages).min(shape.slots)
        } else {
            block * shape.slots + offset.min(shape.slots)
        };
        ZoneReport { write_pointer, capacity_pages: shape.data_pages(), ..report }
    }

    fn code(&mut self, data_count: usize, parity_count: usize) -> Option<Arc<ErasureCode>> {
        if let Some(code) = self.codes.get(&(data_count, parity_count)) {
            return Some(code.clone());
        }
        let code = Arc::new(ErasureCode::new(data_count, parity_count).ok()?);
        self.codes.insert((data_count, parity_count), code.clone());
        Some(code)
    }

    /// Reads a physical page and returns its unit if it checks: a data
    /// page by its header (and its signature, when the ECC changed it), a
    /// parity page by its signature. No parity repair here.
    fn read_unit(&mut self, address: PageAddress, parity_page: bool) -> Option<Vec<u8>> {
        let geometry = self.inner.geometry();
        let mut data = vec![0u8; geometry.page_size_bytes as usize];
        let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
        for _ in 0..READ_ATTEMPTS {
            match self.read_inner(address, &mut data, &mut oob) {
                Ok(PageState::Erased) => return None,
                Ok(PageState::Programmed) => {}
                Err(error) if error.is_media_failure() => continue,
                Err(_) => return None,
            }
            // Parity is only as good as what it is computed from: a page
            // whose signature does not match its bytes (written by some
            // other writer) adds nothing.
            let whole = |data: &[u8], oob: &[u8]| {
                protection::signature_matches(data, oob) && (parity_page || PageHeader::decode(oob, data).is_ok())
            };
            if whole(&data, &oob) {
                return Some(unit_of(&data, &oob));
            }
            if let Some(layout) = self.ecc.clone().filter(|_| self.correction.ecc) {
                let correction = protection::correct(&mut data, &mut oob, &layout);
                if correction.bits_corrected > 0 && whole(&data, &oob) && protection::signature_matches(&data, &oob) {
                    self.counters.pages_corrected_ecc += 1;
                    self.counters.bits_corrected_ecc += u64::from(correction.bits_corrected);
                    self.note_correction(address.zone, address.page, correction.codeword_bits_max);
                    return Some(unit_of(&data, &oob));
                }
            }
        }
        None
    }

    /// Programs a parity unit as a page. A program failure (the block goes
    /// bad, the zone read-only) leaves the stripe without that page and is
    /// not an error of the data write that triggered it.
    fn program_unit(&mut self, address: PageAddress, unit: &[u8]) -> Result<bool> {
        let geometry = self.inner.geometry();
        let page_size = geometry.page_size_bytes as usize;
        let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
        oob[..PROTECTED_OOB_BYTES].copy_from_slice(&unit[page_size..page_size + PROTECTED_OOB_BYTES]);
        let signature: [u8; 8] = oob[protection::SIGNATURE_OFFSET..PROTECTED_OOB_BYTES].try_into().expect("8 bytes");
        protection::seal(&unit[..page_size], &mut oob, self.ecc.as_deref());
        // The homomorphism: the running parity of the signatures is the
        // signature of the running parity.
        debug_assert_eq!(&oob[protection::SIGNATURE_OFFSET..PROTECTED_OOB_BYTES], &signature);
        self.unflushed = true;
        match self.program_inner(address, &unit[..page_size], &oob) {
            Ok(()) => {
                self.counters.parity_pages_programmed += 1;
                Ok(true)
            }
            Err(DeviceError::ProgramFailed { .. }) => {
                self.stripes.remove(&address.zone);
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// The stripe of `zone`, holding the parity of everything below the
    /// physical page `next`, rebuilt from flash if it is not in memory.
    fn stripe_at(&mut self, zone: u32, next: u32, shape: ZoneShape) -> &mut Stripe {
        let (block, offset) = (next / shape.block_pages, next % shape.block_pages);
        let data_pages = offset.min(shape.slots);
        let fresh =
            self.stripes.get(&zone).is_some_and(|stripe| stripe.block == block && stripe.data_pages == data_pages);
        if !fresh {
            if self.stripes.len() >= OPEN_STRIPES_MAX && !self.stripes.contains_key(&zone) {
                let victim = *self.stripes.keys().next().expect("full");
                self.stripes.remove(&victim);
            }
            let unit = unit_bytes(self.inner.geometry().page_size_bytes as usize);
            let mut stripe = Stripe {
                block,
                data_pages: 0,
                block_parity: vec![vec![0u8; unit]; shape.parity_pages as usize],
                zone_rows: Vec::new(),
                rows_to_read: Vec::new(),
            };
            let zone_code = self.zone_code(shape);
            if let Some(code) = &zone_code {
                stripe.zone_rows = vec![vec![vec![0u8; unit]; code.parity_count()]; shape.block_pages as usize];
                if block > 0 {
                    stripe.rows_to_read = vec![true; shape.block_pages as usize];
                }
            }
            let block_code = self.block_code(shape);
            for row in 0..data_pages {
                let page = PageAddress::new(zone, block * shape.block_pages + row);
                self.counters.stripe_rebuild_pages_read += 1;
                // A page the ECC cannot bring back is rebuilt from the
                // block's record in NVM, if there is one: a running parity
                // without it would protect the rest of the block, not it.
                let read = self.read_unit(page, false).or_else(|| {
                    let report = self.inner.report_zone(zone).ok()?;
                    let repaired = self.repair_from_record(zone, page.page, &report)?;
                    self.counters.pages_repaired_open_stripe += 1;
                    self.note_repair(zone, page.page);
                    Some(repaired)
                });
                if let Some(read) = read {
                    if let Some(code) = &block_code {
                        code.accumulate(&mut stripe.block_parity, row as usize, &read);
                    }
                    if let Some(code) = &zone_code {
                        if block < shape.data_blocks {
                            code.accumulate(&mut stripe.zone_rows[row as usize], block as usize, &read);
                        }
                    }
                }
            }
            // Block parity pages already on flash (a cut between them) are
            // rows of the zone parity too.
            if let Some(code) = &zone_code {
                for row in shape.slots..offset.max(shape.slots) {
                    let page = PageAddress::new(zone, block * shape.block_pages + row);
                    self.counters.stripe_rebuild_pages_read += 1;
                    if let Some(read) = self.read_unit(page, true) {
                        if block < shape.data_blocks {
                            code.accumulate(&mut stripe.zone_rows[row as usize], block as usize, &read);
                        }
                    }
                }
            }
            stripe.data_pages = data_pages;
            self.stripes.insert(zone, stripe);
        }
        self.stripes.get_mut(&zone).expect("inserted")
    }

    fn block_code(&mut self, shape: ZoneShape) -> Option<Arc<ErasureCode>> {
        if shape.parity_pages == 0 {
            return None;
        }
        self.code(shape.slots as usize, shape.parity_pages as usize)
    }

    fn zone_code(&mut self, shape: ZoneShape) -> Option<Arc<ErasureCode>> {
        if shape.parity_blocks == 0 || shape.data_blocks == 0 {
            return None;
        }
        self.code(shape.data_blocks as usize, shape.parity_blocks as usize)
    }

    /// Adds a page just programmed at physical `page` to the stripe.
    fn accumulate(&mut self, zone: u32, page: u32, unit: &[u8], shape: ZoneShape) {
        let (block, row) = (page / shape.block_pages, page % shape.block_pages);
        let block_code = self.block_code(shape);
        let zone_code = self.zone_code(shape);
        let Some(stripe) = self.stripes.get_mut(&zone) else { return };
        if row < shape.slots {
            if let Some(code) = &block_code {
                code.accumulate(&mut stripe.block_parity, row as usize, unit);
            }
            stripe.data_pages += 1;
        }
        if let Some(code) = &zone_code {
            if block < shape.data_blocks && !stripe.zone_rows.is_empty() {
                code.accumulate(&mut stripe.zone_rows[row as usize], block as usize, unit);
            }
        }
    }

    /// Programs the parity slots from the zone's write pointer up to
    /// physical page `target`: the rest of a block's parity, then, after
    /// the last data block, the zone parity. Stops at a slot that is not
    /// parity (the device then refuses the program that wanted it).
    fn catch_up(&mut self, zone: u32, target: u32) -> Result<()> {
        loop {
            let report = self.inner.report_zone(zone)?;
            if !matches!(report.state, ZoneState::Empty | ZoneState::Open | ZoneState::Closed) {
                return Ok(());
            }
            let shape = self.shape(report.capacity_pages);
            let next = report.write_pointer;
            if next >= target || next >= shape.good_blocks * shape.block_pages {
                return Ok(());
            }
            let (block, row) = (next / shape.block_pages, next % shape.block_pages);
            if block < shape.data_blocks && row >= shape.slots {
                // Block parity slot `row - slots` of a block whose data is
                // all programmed.
                let first_parity = block * shape.block_pages + shape.slots;
                let stripe = self.stripe_at(zone, first_parity, shape);
                let unit = stripe.block_parity[(row - shape.slots) as usize].clone();
                if !self.program_unit(PageAddress::new(zone, next), &unit)? {
                    return Ok(());
                }
                self.accumulate(zone, next, &unit, shape);
                if row + 1 == shape.block_pages {
                    if let Some(stripe) = self.stripes.get_mut(&zone) {
                        stripe.block = block + 1;
                        stripe.data_pages = 0;
                        for unit in &mut stripe.block_parity {
                            unit.fill(0);
                        }
                    }
                }
            } else if block >= shape.data_blocks && self.zone_code(shape).is_some() {
                let first_zone_parity = shape.data_blocks * shape.block_pages;
                self.stripe_at(zone, first_zone_parity, shape);
                self.read_zone_row(zone, row, shape);
                let parity_index = (block - shape.data_blocks) as usize;
                let Some(unit) = self
                    .stripes
                    .get(&zone)
                    .and_then(|stripe| stripe.zone_rows.get(row as usize))
                    .map(|units| units[parity_index].clone())
                else {
                    return Ok(());
                };
                if !self.program_unit(PageAddress::new(zone, next), &unit)? {
                    return Ok(());
                }
            } else {
                return Ok(());
            }
        }
    }

    /// Row `row` of `zone`'s zone parity read whole from its data blocks,
    /// if the stripe lacks part of it (see `Stripe::rows_to_read`). Every
    /// data block is written by then.
    fn read_zone_row(&mut self, zone: u32, row: u32, shape: ZoneShape) {
        let wanted = self
            .stripes
            .get(&zone)
            .is_some_and(|stripe| stripe.rows_to_read.get(row as usize).copied().unwrap_or(false));
        let Some(code) = self.zone_code(shape).filter(|_| wanted) else { return };
        let unit = unit_bytes(self.inner.geometry().page_size_bytes as usize);
        let mut units = vec![vec![0u8; unit]; code.parity_count()];
        for block in 0..shape.data_blocks {
            let page = PageAddress::new(zone, block * shape.block_pages + row);
            self.counters.stripe_rebuild_pages_read += 1;
            // An unreadable page adds nothing: the parity will not match
            // it, and a repair that uses it fails its checks rather than
            // return wrong bytes.
            if let Some(read) = self.read_unit(page, row >= shape.slots) {
                code.accumulate(&mut units, block as usize, &read);
            }
        }
        if let Some(stripe) = self.stripes.get_mut(&zone) {
            stripe.zone_rows[row as usize] = units;
            stripe.rows_to_read[row as usize] = false;
        }
    }

    /// Pages below the zone's write pointer that hold data without parity
    /// on flash yet, summed over the open stripes.
    fn note_unprotected(&mut self) {
        let open: u64 = self.stripes.values().map(|stripe| u64::from(stripe.data_pages)).sum();
        self.counters.unprotected_pages_max = self.counters.unprotected_pages_max.max(open);
    }

    /// Programs a page whose OOB [`Protected::seal_pages`] (or
    /// `program_page`) sealed: the header's signature and ECC are in place.
    pub fn program_sealed(&mut self, address: PageAddress, data: &[u8], sealed: &[u8]) -> Result<()> {
        self.unflushed = true;
        debug_assert!(protection::signature_matches(data, sealed), "{address} was not sealed");
        if self.parity_zone(address.zone) {
            self.program_protected(address, data, sealed)
        } else {
            self.program_inner(address, data, sealed)
        }
    }

    /// Seals each `(data, oob)` pair in place: its header (whose CRC-32C
    /// covers the data), signature and ECC, the work `program_page` does
    /// first. A run of [`SEAL_PARALLEL_PAGES_MIN`] pages or more is split
    /// with the helper thread (`crate::helper`; sealing is a pure function
    /// of the page, so the bytes are the same either way): the BCH encoder,
    /// the signature and the CRC are most of a large write's host time.
    pub fn seal_pages(&self, pages: &mut [(&[u8], Vec<u8>)], headers: &[PageHeader]) {
        assert_eq!(pages.len(), headers.len(), "a header for every page sealed");
        let ecc = self.ecc.as_deref();
        let seal_all = |pages: &mut [(&[u8], Vec<u8>)], headers: &[PageHeader]| {
            for ((data, oob), header) in pages.iter_mut().zip(headers) {
                oob[..flintfs_format::PAGE_HEADER_BYTES].copy_from_slice(&header.encode(data));
                protection::seal(data, oob, ecc);
            }
        };
        if pages.len() < SEAL_PARALLEL_PAGES_MIN {
            seal_all(pages, headers);
            return;
        }
        let half = pages.len() / 2;
        let (first, second) = pages.split_at_mut(half);
        let (first_headers, second_headers) = headers.split_at(half);
        crate::helper::join(|| seal_all(first, first_headers), || seal_all(second, second_headers));
    }

    fn program_protected(&mut self, address: PageAddress, data: &[u8], sealed: &[u8]) -> Result<()> {
        let physical = self.to_physical(address);
        let report = self.inner.report_zone(address.zone)?;
        let shape = self.shape(report.capacity_pages);
        // Past the logical capacity the physical page is a parity page (or
        // past the zone): a program there would succeed and be lost, as the
        // zone reports no page of it. A checkpoint zone whose blocks all
        // went bad but the parity's took records that way, and the mount
        // found none. Refused before any parity is caught up, so the zone
        // is left as it was.
        let capacity_pages = shape.data_pages();
        if address.page >= capacity_pages {
            let write_pointer = self.logical_report(report).write_pointer;
            return Err(DeviceError::ZoneFull { address, write_pointer, capacity_pages });
        }
        if report.write_pointer < physical.page {
            self.catch_up(address.zone, physical.page)?;
        }
        let in_data = physical.page / shape.block_pages < shape.data_blocks;
        if in_data {
            self.stripe_at(address.zone, physical.page, shape);
        }
        if let Err(error) = self.program_inner(physical, data, sealed) {
            self.stripes.remove(&address.zone);
            return Err(error);
        }
        if !in_data {
            return Ok(());
        }
        let mut unit = std::mem::take(&mut self.unit_scratch);
        unit_into(&mut unit, data, sealed);
        self.accumulate(address.zone, physical.page, &unit, shape);
        self.unit_scratch = unit;
        self.note_unprotected();
        let (block, row) = (physical.page / shape.block_pages, physical.page % shape.block_pages);
        if row + 1 == shape.slots {
            // The block's own parity now; the zone's, after the last data
            // block, a few pages before each flush that follows.
            self.catch_up(address.zone, (block + 1) * shape.block_pages)?;
            if block + 1 == shape.data_blocks && self.zone_code(shape).is_some() {
                self.owing.push_back(address.zone);
                while self.owing.len() > ZONES_OWING_PARITY_MAX {
                    self.pay_zone_parity(u32::MAX)?;
                }
            }
        }
        Ok(())
    }

    /// Programs physical `address` on the device, counting it on its die:
    /// every program of this layer goes through here, so the counts
    /// `zone_parity_pages_to_pay` reads miss none.
    fn program_inner(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        self.refuse_write_if_read_only("a program")?;
        if let Err(error) = self.inner.program_page(address, data, oob) {
            if matches!(error, DeviceError::ProgramFailed { .. }) {
                self.programs_failed += 1;
            }
            return Err(error);
        }
        self.note_programmed(address);
        Ok(())
    }

    /// [`FlashDevice::read_page`], with the page's header when this read
    /// decoded it whole (its CRC checked) on the way: the caller that
    /// needs the header then checks the page's CRC once, not twice. `None`
    /// when the page is erased, or came back only through ECC or parity
    /// (rare: the caller decodes those itself).
    pub(crate) fn read_page_decoded(
        &mut self,
        address: PageAddress,
        data: &mut [u8],
        oob: &mut [u8],
    ) -> Result<(PageState, Option<PageHeader>)> {
        let physical = self.to_physical(address);
        let mut attempt = 0;
        let failure = loop {
            attempt += 1;
            let state = match self.read_inner(physical, data, oob) {
                Ok(state) => state,
                Err(error) if error.is_media_failure() && attempt < READ_ATTEMPTS => continue,
                Err(error) if error.is_media_failure() => break Err(error),
                Err(error) => return Err(error),
            };
            if state == PageState::Erased {
                // Erased below the write pointer is a lost write (a program
                // that landed elsewhere): damage, for parity to rebuild.
                let lost = self.parity_zone(address.zone)
                    && self.inner.report_zone(address.zone).is_ok_and(|zone| physical.page < zone.write_pointer);
                if !lost {
                    return Ok((state, None));
                }
                break Ok(state);
            }
            let decoded = PageHeader::decode(oob, data).ok();
            if decoded.is_some() || self.correct_with_ecc(physical, data, oob) {
                if attempt > 1 {
                    self.counters.pages_read_again += 1;
                }
                return Ok((state, decoded));
            }
            if attempt >= READ_ATTEMPTS {
                break Ok(state);
            }
        };
        if self.parity_zone(address.zone) && self.correction.parity {
            let started_ns = self.inner.now_ns();
            let repaired = self.repair(address.zone, physical.page);
            self.counters.repair_device_time_ns += self.inner.now_ns().saturating_sub(started_ns);
            if let Some((unit, source)) = repaired {
                let page_size = data.len();
                let (rebuilt_data, rebuilt_oob) =
                    (&unit[..page_size], &unit[page_size..page_size + PROTECTED_OOB_BYTES]);
                // The rebuilt page must be the one that was asked for:
                // whole by its CRC and signature, written for this address.
                if self.rebuilt_is(&unit, address.zone, physical.page) {
                    data.copy_from_slice(rebuilt_data);
                    oob.fill(0);
                    oob[..PROTECTED_OOB_BYTES].copy_from_slice(rebuilt_oob);
                    protection::seal(data, oob, self.ecc.as_deref());
                    match source {
                        RepairSource::Block => self.counters.pages_repaired_block_parity += 1,
                        RepairSource::Zone => self.counters.pages_repaired_zone_parity += 1,
                        RepairSource::OpenStripe => self.counters.pages_repaired_open_stripe += 1,
                    }
                    self.note_repair(address.zone, physical.page);
                    return Ok((PageState::Programmed, None));
                }
            }
        }
        self.counters.pages_unrepairable += 1;
        tracing::debug!(
            zone = address.zone,
            page = address.page,
            physical_page = physical.page,
            parity = self.parity_zone(address.zone),
            "no layer of protection brings the page back"
        );
        failure.map(|state| (state, None))
    }

    /// Reads physical `address` from the device; the host waited for its
    /// die (`note_die_idle`).
    fn read_inner(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        let read = self.inner.read_page(address, data, oob);
        self.note_die_idle(address);
        read
    }

    /// Counts a page programmed at physical `address` on its die.
    fn note_programmed(&mut self, address: PageAddress) {
        let Some(die) = self.inner.die_of(address) else { return };
        if self.die_pages_programmed.is_empty() {
            self.die_pages_programmed = vec![0; self.inner.die_count().max(1) as usize];
        }
        if let Some(count) = self.die_pages_programmed.get_mut(die as usize) {
            *count = count.saturating_add(1);
            self.die_pages_programmed_max = self.die_pages_programmed_max.max(*count);
        }
    }

    /// The host waited for the die of physical `address` (a read from the
    /// medium, or an erase): nothing is queued on it any more. A read the
    /// device served from its write buffer waited for nothing and counts
    /// the same: the parity then pays less than would fit, never more.
    fn note_die_idle(&mut self, address: PageAddress) {
        let Some(die) = self.inner.die_of(address) else { return };
        let Some(count) = self.die_pages_programmed.get_mut(die as usize) else { return };
        let was = std::mem::replace(count, 0);
        if was > 0 && was == self.die_pages_programmed_max {
            self.die_pages_programmed_max = self.die_pages_programmed.iter().copied().max().unwrap_or(0);
        }
    }

    /// The device's flush; every die is idle after it.
    fn flush_inner(&mut self) -> Result<()> {
        self.flush_inner_with(false)
    }

    /// The device's flush, or one that only orders (`ordered`), after
    /// which a flush may still be owed to any caller who waits for
    /// durability (an image's syncs still queued): `unflushed` stays set
    /// then, so an fsync that finds nothing else to write still flushes.
    fn flush_inner_with(&mut self, ordered: bool) -> Result<()> {
        if ordered {
            self.inner.flush_ordered()?;
        } else {
            self.inner.flush()?;
        }
        self.unflushed = ordered && self.inner.flush_owed();
        self.die_pages_programmed.fill(0);
        self.die_pages_programmed_max = 0;
        Ok(())
    }

    /// The flush of [`FlashDevice::flush`], or of
    /// [`FlashDevice::flush_ordered`] (`ordered`).
    fn flush_with(&mut self, ordered: bool) -> Result<()> {
        if self.read_only {
            // Nothing was written: nothing to make durable.
            return Ok(());
        }
        let pages = self.zone_parity_pages_to_pay()?;
        self.pay_zone_parity(pages)?;
        self.flush_inner_with(ordered)?;
        // The pages are durable now; their running parity goes to NVM
        // before the flush returns (and so before any fsync does). NVM that
        // fails to take it does not undo a flush that made the pages
        // durable (a caller told otherwise would take a checkpoint that
        // landed for one that did not): the stripes wait for their parity
        // on flash from then on, as without NVM, and the window counts it.
        if let Err(error) = self.record_open_stripes() {
            tracing::warn!(
                "the open stripes' parity could not be written to NVM ({error}): blocks being written wait for their \
                 parity on flash, as without NVM"
            );
            self.nvm_stripes = None;
        }
        self.note_unprotected_durable();
        Ok(())
    }

    /// How many zone parity pages the flush about to be issued pays: seven
    /// eighths (`ZONE_PARITY_QUEUE_FILL_EIGHTHS`) of what the busiest die
    /// has queued beyond the die the parity goes to, and
    /// [`ZONE_PARITY_PAGES_PER_FLUSH_MIN`] at least
    /// (`ZONE_PARITY_PAGES_PER_FLUSH` where the device does not say which
    /// die a page is on).
    fn zone_parity_pages_to_pay(&self) -> Result<u32> {
        let Some(&zone) = self.owing.front() else { return Ok(0) };
        let report = self.inner.report_zone(zone)?;
        let Some(die) = self.inner.die_of(PageAddress::new(zone, report.write_pointer)) else {
            return Ok(ZONE_PARITY_PAGES_PER_FLUSH);
        };
        let queued = self.die_pages_programmed.get(die as usize).copied().unwrap_or(0);
        let fits =
            self.die_pages_programmed_max.saturating_sub(queued).saturating_mul(ZONE_PARITY_QUEUE_FILL_EIGHTHS) / 8;
        Ok(fits.max(ZONE_PARITY_PAGES_PER_FLUSH_MIN))
    }

    /// Programs up to `pages` of the oldest owed zone parity; a zone paid
    /// in full (or no longer writable) owes nothing more.
    fn pay_zone_parity(&mut self, pages: u32) -> Result<()> {
        let Some(&zone) = self.owing.front() else { return Ok(()) };
        let report = self.inner.report_zone(zone)?;
        let end = self.shape(report.capacity_pages).good_blocks * self.inner.geometry().block_pages;
        if matches!(report.state, ZoneState::Open | ZoneState::Closed) && report.write_pointer < end {
            self.catch_up(zone, report.write_pointer.saturating_add(pages).min(end))?;
        }
        let report = self.inner.report_zone(zone)?;
        if !matches!(report.state, ZoneState::Open | ZoneState::Closed) || report.write_pointer >= end {
            self.owing.pop_front();
            self.stripes.remove(&zone);
        }
        Ok(())
    }

    /// Programs every zone parity still owed: before a clean unmount lets
    /// go of the device, so what it leaves is protected whole.
    pub fn pay_owed_zone_parity(&mut self) -> Result<()> {
        while !self.owing.is_empty() {
            self.pay_zone_parity(u32::MAX)?;
        }
        Ok(())
    }

    /// After an unclean stop: a zone whose finish was cut short after its
    /// tail parity (the k pages right after a partial block's data) went
    /// to flash, but before the finish did, is finished now. Unfinished, it
    /// would be read with that parity taken for data pages, and an XOR of
    /// an odd number of pages passes every check a page has (the CRC and
    /// the signature are both linear). Reads the partial block of each
    /// zone left open part way through a block (the heads after a cut);
    /// returns the zones it finished.
    pub fn complete_interrupted_finishes(&mut self) -> Result<u32> {
        if !self.parity_on() || self.parity.block_parity_pages == 0 {
            return Ok(0);
        }
        let mut finished = 0;
        for report in self.inner.report_zones() {
            if !self.parity_zone(report.zone) || !matches!(report.state, ZoneState::Open | ZoneState::Closed) {
                continue;
            }
            let shape = self.shape(report.capacity_pages);
            let (block, row) = (report.write_pointer / shape.block_pages, report.write_pointer % shape.block_pages);
            if block >= shape.data_blocks && self.zone_code(shape).is_some() {
                // Its data all written, its zone parity owed when the
                // power went: paid now, from the rows rebuilt by reading
                // the zone, so no zone is left open part paid. Read-only,
                // it stays owed: its data pages are all below the write
                // pointer and read as they are, and a read-write mount
                // pays it.
                if self.read_only {
                    continue;
                }
                tracing::info!(zone = report.zone, "zone parity a power cut left owed is programmed");
                self.catch_up(report.zone, shape.good_blocks * shape.block_pages)?;
                self.stripes.remove(&report.zone);
                finished += 1;
                continue;
            }
            if block >= shape.data_blocks || row < 2 {
                continue;
            }
            let Some(code) = self.block_code(shape) else { continue };
            let start = block * shape.block_pages;
            let unit_size = unit_bytes(self.inner.geometry().page_size_bytes as usize);
            // j of the k parity pages made it before the cut.
            for written in (1..=shape.parity_pages.min(row - 1)).rev() {
                let data_rows = row - written;
                if data_rows >= shape.slots {
                    continue;
                }
                let units: Option<Vec<Vec<u8>>> = (0..data_rows)
                    .map(|index| self.read_unit(PageAddress::new(report.zone, start + index), false))
                    .collect();
                let Some(mut units) = units else { continue };
                units.resize(shape.slots as usize, vec![0u8; unit_size]);
                let expected = code.encode(&units.iter().map(Vec::as_slice).collect::<Vec<_>>());
                let tail = (0..written).all(|index| {
                    self.read_unit(PageAddress::new(report.zone, start + data_rows + index), true).as_ref()
                        == Some(&expected[index as usize])
                });
                if tail {
                    if self.read_only {
                        tracing::warn!(
                            zone = report.zone,
                            "a finish a power cut cut short: a read-only mount cannot complete it"
                        );
                    }
                    self.refuse_write_if_read_only(FINISH_CUT_SHORT_REFUSAL)?;
                    tracing::info!(zone = report.zone, "a finish cut short by a power cut is completed");
                    self.inner.finish_zone(report.zone)?;
                    finished += 1;
                    break;
                }
            }
        }
        Ok(finished)
    }

    /// Before a zone is finished: the parity its written pages are owed.
    fn finish_protected(&mut self, zone: u32) -> Result<()> {
        let report = self.inner.report_zone(zone)?;
        if !matches!(report.state, ZoneState::Open | ZoneState::Closed) {
            self.stripes.remove(&zone);
            return Ok(());
        }
        let shape = self.shape(report.capacity_pages);
        let (block, row) = (report.write_pointer / shape.block_pages, report.write_pointer % shape.block_pages);
        if block < shape.data_blocks && row >= shape.slots {
            let end = if block + 1 == shape.data_blocks && self.zone_code(shape).is_some() {
                shape.good_blocks * shape.block_pages
            } else {
                (block + 1) * shape.block_pages
            };
            self.catch_up(zone, end)?;
        } else if block >= shape.data_blocks {
            self.catch_up(zone, shape.good_blocks * shape.block_pages)?;
        } else if row > 0 && shape.parity_pages > 0 {
            // A partial block: its parity goes right after its data.
            let stripe = self.stripe_at(zone, report.write_pointer, shape);
            let units = stripe.block_parity.clone();
            for (index, unit) in units.iter().enumerate() {
                if !self.program_unit(PageAddress::new(zone, report.write_pointer + index as u32), unit)? {
                    break;
                }
            }
            // Durable before the finish is: a finished zone is read with its
            // last k pages taken for parity, and a finish outlives a cut
            // that drops pages still in the device's buffer.
            self.flush_inner()?;
        }
        self.stripes.remove(&zone);
        Ok(())
    }

    /// Rebuilds the data page at physical `page` of `zone` from parity.
    fn repair(&mut self, zone: u32, page: u32) -> Option<(Vec<u8>, RepairSource)> {
        let report = self.inner.report_zone(zone).ok()?;
        if page >= report.write_pointer {
            return None;
        }
        if let Some(unit) = self.repair_from_block(zone, page, &report) {
            return Some((unit, RepairSource::Block));
        }
        if let Some(unit) = self.repair_from_open_stripe(zone, page, &report) {
            return Some((unit, RepairSource::OpenStripe));
        }
        if let Some(unit) = self.repair_from_zone(zone, page, &report) {
            return Some((unit, RepairSource::Zone));
        }
        self.repair_iteratively(zone, page, &report).map(|unit| (unit, RepairSource::Zone))
    }

    /// A page of a block still being written, from the block's running
    /// parity: the stripe in memory if it is this block's, else (or if
    /// that does not give the page) the block's record in NVM. The slots
    /// after the pages a running parity covers count as zeros, as in a
    /// zone finished early.
    fn repair_from_open_stripe(&mut self, zone: u32, page: u32, report: &ZoneReport) -> Option<Vec<u8>> {
        let shape = self.shape(report.capacity_pages);
        let (block, row) = (page / shape.block_pages, page % shape.block_pages);
        if row >= shape.slots || block >= shape.data_blocks {
            return None;
        }
        let in_memory = self
            .stripes
            .get(&zone)
            .filter(|stripe| stripe.block == block && stripe.data_pages > row)
            .map(|stripe| (stripe.data_pages, stripe.block_parity.clone()));
        if let Some((data_count, parity)) = in_memory {
            let parity = parity.into_iter().map(Some).collect();
            let rebuilt = self.rebuild_in_block(zone, block, row, data_count, parity, shape);
            if let Some(unit) = rebuilt.filter(|unit| self.rebuilt_is(unit, zone, page)) {
                return Some(unit);
            }
        }
        self.repair_from_record(zone, page, report)
    }

    /// A page of a block still being written, from the block's record in
    /// NVM, checked to be the page asked for.
    fn repair_from_record(&mut self, zone: u32, page: u32, report: &ZoneReport) -> Option<Vec<u8>> {
        let shape = self.shape(report.capacity_pages);
        let (block, row) = (page / shape.block_pages, page % shape.block_pages);
        let area = self.nvm_stripes.take()?;
        let record = area.current.get(&zone).copied().filter(|record| record.block == block);
        let read = record.map(|record| self.read_stripe_record(&area, record.slot));
        self.nvm_stripes = Some(area);
        let (header, units) = read?.ok()??;
        let unit = unit_bytes(self.inner.geometry().page_size_bytes as usize);
        if header.zone != zone
            || header.block != block
            || row >= header.data_pages
            || report.write_pointer / shape.block_pages != block
            || block * shape.block_pages + header.data_pages > report.write_pointer
            || units.len() != shape.parity_pages as usize
            || units.iter().any(|found| found.len() != unit)
        {
            return None;
        }
        let parity = units.into_iter().map(Some).collect();
        self.rebuild_in_block(zone, block, row, header.data_pages, parity, shape)
            .filter(|rebuilt| self.rebuilt_is(rebuilt, zone, page))
    }

    /// Whether a rebuilt unit is the data page at physical `page` of
    /// `zone`: whole by its header's CRC and its signature, and written for
    /// this address. A running parity that does not cover what is on flash
    /// now (a stripe rebuilt without a page it could not read, a record of
    /// the zone before a reset) gives bytes that fail this, never a page.
    fn rebuilt_is(&self, unit: &[u8], zone: u32, page: u32) -> bool {
        let page_size = self.inner.geometry().page_size_bytes as usize;
        let (data, oob) = (&unit[..page_size], &unit[page_size..page_size + PROTECTED_OOB_BYTES]);
        let slots = self.inner.geometry().block_pages - self.parity.block_parity_pages;
        let logical = page / self.inner.geometry().block_pages * slots + page % self.inner.geometry().block_pages;
        PageHeader::decode(oob, data).is_ok_and(|header| (header.zone, header.page) == (zone, logical))
            && protection::signature_matches(data, oob)
    }

    /// The last resort, for damage that neither one block's parity nor one
    /// row of the zone's can undo alone: the zone is a product code (block
    /// parity down each block, zone parity across each row, both linear, so
    /// the zone parity blocks' last rows are the block parity of their own
    /// rows too). Reads the whole zone, then solves every block with at most
    /// k unknown pages and every row with at most r, over and over, until
    /// the page asked for is known or nothing more can be solved.
    fn repair_iteratively(&mut self, zone: u32, page: u32, report: &ZoneReport) -> Option<Vec<u8>> {
        let shape = self.shape(report.capacity_pages);
        let zone_code = self.zone_code(shape)?;
        let block_code = self.block_code(shape)?;
        if report.write_pointer < shape.good_blocks * shape.block_pages {
            return None;
        }
        let (rows, blocks) = (shape.block_pages as usize, shape.good_blocks as usize);
        let mut cells: Vec<Option<Vec<u8>>> = Vec::with_capacity(rows * blocks);
        for block in 0..shape.good_blocks {
            for row in 0..shape.block_pages {
                let address = PageAddress::new(zone, block * shape.block_pages + row);
                cells.push(if block * shape.block_pages + row == page {
                    None
                } else {
                    self.read_unit(address, row >= shape.slots || block >= shape.data_blocks)
                });
            }
        }
        let target = page as usize;
        loop {
            let mut progress = false;
            for block in 0..blocks {
                let column = &mut cells[block * rows..(block + 1) * rows];
                let missing = column.iter().filter(|cell| cell.is_none()).count();
                if missing == 0 || missing > shape.parity_pages as usize {
                    continue;
                }
                let mut units = column.to_vec();
                if block_code.reconstruct(&mut units).is_ok() {
                    column.clone_from_slice(&units);
                    progress = true;
                }
            }
            for row in 0..rows {
                let missing = (0..blocks).filter(|block| cells[block * rows + row].is_none()).count();
                if missing == 0 || missing > shape.parity_blocks as usize {
                    continue;
                }
                let mut units: Vec<Option<Vec<u8>>> =
                    (0..blocks).map(|block| cells[block * rows + row].clone()).collect();
                if zone_code.reconstruct(&mut units).is_ok() {
                    for (block, unit) in units.into_iter().enumerate() {
                        cells[block * rows + row] = unit;
                    }
                    progress = true;
                }
            }
            if cells[target].is_some() {
                return cells[target].take();
            }
            if !progress {
                return None;
            }
        }
    }

    /// The data slots written in `block` and where its parity is, if the
    /// block has parity on flash.
    fn block_members(&self, block: u32, report: &ZoneReport, shape: ZoneShape) -> Option<(u32, u32)> {
        if shape.parity_pages == 0 || block >= shape.data_blocks {
            return None;
        }
        let start = block * shape.block_pages;
        if report.write_pointer >= start + shape.block_pages {
            return Some((shape.slots, start + shape.slots));
        }
        let offset = report.write_pointer.checked_sub(start)?;
        if report.state == ZoneState::Full && offset > shape.parity_pages {
            let data = offset - shape.parity_pages;
            return Some((data, start + data));
        }
        None
    }

    fn repair_from_block(&mut self, zone: u32, page: u32, report: &ZoneReport) -> Option<Vec<u8>> {
        let shape = self.shape(report.capacity_pages);
        let block = page / shape.block_pages;
        let (data_count, parity_start) = self.block_members(block, report, shape)?;
        let target = page % shape.block_pages;
        if target >= data_count {
            return None;
        }
        let parity: Vec<Option<Vec<u8>>> = (0..shape.parity_pages)
            .map(|index| self.read_unit(PageAddress::new(zone, parity_start + index), true))
            .collect();
        self.rebuild_in_block(zone, block, target, data_count, parity, shape)
    }

    /// Row `target` of `block` from the block's other `data_count` data
    /// pages and its `parity` units (`None`: unreadable).
    fn rebuild_in_block(
        &mut self,
        zone: u32,
        block: u32,
        target: u32,
        data_count: u32,
        parity: Vec<Option<Vec<u8>>>,
        shape: ZoneShape,
    ) -> Option<Vec<u8>> {
        let code = self.block_code(shape)?;
        let unit = unit_bytes(self.inner.geometry().page_size_bytes as usize);
        let start = block * shape.block_pages;
        let mut units: Vec<Option<Vec<u8>>> = Vec::with_capacity((shape.slots + shape.parity_pages) as usize);
        for row in 0..shape.slots {
            units.push(if row == target {
                None
            } else if row < data_count {
                self.read_unit(PageAddress::new(zone, start + row), false)
            } else {
                // Slots never written (in a zone finished early, or past a
                // running parity's pages) count as zeros.
                Some(vec![0u8; unit])
            });
        }
        units.extend(parity);
        code.reconstruct(&mut units).ok()?;
        units[target as usize].take()
    }

    fn repair_from_zone(&mut self, zone: u32, page: u32, report: &ZoneReport) -> Option<Vec<u8>> {
        let shape = self.shape(report.capacity_pages);
        let code = self.zone_code(shape)?;
        if report.write_pointer < shape.good_blocks * shape.block_pages {
            return None;
        }
        let (target, row) = (page / shape.block_pages, page % shape.block_pages);
        let mut units: Vec<Option<Vec<u8>>> = Vec::with_capacity((shape.data_blocks + shape.parity_blocks) as usize);
        for block in 0..shape.data_blocks {
            if block == target {
                units.push(None);
                continue;
            }
            let address = block * shape.block_pages + row;
            let mut read = self.read_unit(PageAddress::new(zone, address), row >= shape.slots);
            if read.is_none() && row < shape.slots {
                read = self.repair_from_block(zone, address, report);
            }
            units.push(read);
        }
        for parity in 0..shape.parity_blocks {
            let address = (shape.data_blocks + parity) * shape.block_pages + row;
            units.push(self.read_unit(PageAddress::new(zone, address), true));
        }
        code.reconstruct(&mut units).ok()?;
        units[target as usize].take()
    }
}

impl<D: FlashDevice> FlashDevice for Protected<D> {
    /// The device the engine sees: blocks and zones without their parity.
    fn geometry(&self) -> Geometry {
        let mut geometry = self.inner.geometry();
        if self.parity_on() {
            geometry.block_pages -= self.parity.block_parity_pages;
            geometry.zone_blocks -= self.parity.zone_parity_blocks;
        }
        geometry.nvm_size_bytes = self.nvm_wear.logical_bytes(geometry.nvm_size_bytes);
        geometry
    }

    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        self.read_page_decoded(address, data, oob).map(|(state, _)| state)
    }

    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState> {
        let physical = self.to_physical(address);
        let read = self.inner.read_oob(physical, oob);
        self.note_die_idle(physical);
        read
    }

    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        let mut sealed = std::mem::take(&mut self.oob_scratch);
        sealed.clear();
        sealed.extend_from_slice(oob);
        protection::seal(data, &mut sealed, self.ecc.as_deref());
        let result = self.program_sealed(address, data, &sealed);
        self.oob_scratch = sealed;
        result
    }

    fn reset_zone(&mut self, zone: u32) -> Result<()> {
        self.refuse_write_if_read_only("a zone reset")?;
        self.unflushed = true;
        self.owing.retain(|&owing| owing != zone);
        self.stripes.remove(&zone);
        self.forget_stripe_record(zone)?;
        self.refresh.remove(&zone);
        self.repaired_pages.retain(|(repaired_zone, _)| *repaired_zone != zone);
        // The reset leaves retired blocks out, so the zone's block numbers
        // name other blocks from now on.
        self.retired_blocks.retain(|(retired_zone, _)| *retired_zone != zone);
        self.block_samples.retain(|(sampled_zone, _), _| *sampled_zone != zone);
        self.resets_issued += 1;
        // The host waits for the erase of every block of the zone.
        let geometry = self.inner.geometry();
        for block in 0..geometry.zone_blocks {
            self.note_die_idle(PageAddress::new(zone, block * geometry.block_pages));
        }
        match self.inner.reset_zone(zone) {
            // The reset is done and durable, a block the smaller: the zone
            // reports its new capacity (none, and it is offline, which no
            // head takes). An operation that met it did nothing wrong, and
            // an fsync that did once answered EIO for it (the mount test
            // on failing flash, fio).
            Err(DeviceError::EraseFailed { zone, block, erase_count, capacity_pages }) => {
                tracing::warn!(
                    zone,
                    block,
                    erase_count,
                    capacity_pages,
                    "a block went bad while its zone was erased; the zone is reset without it"
                );
                Ok(())
            }
            result => result,
        }
    }

    fn finish_zone(&mut self, zone: u32) -> Result<()> {
        self.refuse_write_if_read_only("a zone finish")?;
        self.unflushed = true;
        // A zone owing its zone parity is full to the engine already, and
        // fills up (and so finishes) as the parity is paid: finishing it
        // now would pay all of it at once.
        if self.owing.contains(&zone) {
            return Ok(());
        }
        if self.parity_zone(zone) {
            self.finish_protected(zone)?;
            // A parity page that failed to program left the zone read-only:
            // it cannot be finished, and need not be.
            if self.inner.report_zone(zone)?.state == ZoneState::ReadOnly {
                return Ok(());
            }
        }
        self.inner.finish_zone(zone)
    }

    fn report_zone(&self, zone: u32) -> Result<ZoneReport> {
        Ok(self.logical_report(self.inner.report_zone(zone)?))
    }

    fn report_zones(&self) -> Vec<ZoneReport> {
        self.inner.report_zones().into_iter().map(|report| self.logical_report(report)).collect()
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_with(false)
    }

    fn flush_ordered(&mut self) -> Result<()> {
        self.flush_with(true)
    }

    fn flush_owed(&self) -> bool {
        self.inner.flush_owed()
    }

    fn nvm_read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.nvm_wear.read(&mut self.inner, offset, buffer)
    }

    fn nvm_write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.refuse_write_if_read_only("an NVM write")?;
        self.nvm_wear.write(&mut self.inner, offset, data)
    }

    fn nvm_persist(&mut self, offset: u64, length: u64) -> Result<()> {
        self.refuse_write_if_read_only("an NVM persist")?;
        self.nvm_wear.persist(&mut self.inner, offset, length)
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }

    fn reset_counters(&mut self) {
        self.inner.reset_counters()
    }

    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }

    fn advance_time(&mut self, duration_ns: u64) {
        self.inner.advance_time(duration_ns)
    }

    fn die_count(&self) -> u32 {
        self.inner.die_count()
    }

    fn die_of(&self, address: PageAddress) -> Option<u32> {
        self.inner.die_of(self.to_physical(address))
    }

    fn retire_block(&mut self, address: PageAddress) -> Result<bool> {
        self.refuse_write_if_read_only("a block retirement")?;
        let physical = self.to_physical(address);
        self.inner.retire_block(physical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flintfs_flash::{DeviceOptions, MemoryFlash};
    use flintfs_format::{InvertedIndex, PageKind};

    const UUID: [u8; 16] = [9; 16];
    const ZONE: u32 = 5;

    /// A device with NVM, its header written as a volume's would be, and
    /// block parity k = 1.
    fn device() -> Protected<MemoryFlash> {
        let geometry = Geometry {
            page_size_bytes: 4096,
            oob_size_bytes: 128,
            block_pages: 16,
            zone_blocks: 4,
            zone_count: 16,
            open_zones_max: 8,
            nvm_size_bytes: 1 << 20,
        };
        let mut device = Protected::new(MemoryFlash::memory(geometry, DeviceOptions::default()).unwrap());
        device.set_parity(ParityLayout { block_parity_pages: 1, zone_parity_blocks: 0 }).unwrap();
        let header =
            NvmHeader::for_region(UUID, device.geometry().nvm_size_bytes, device.nvm_stripe_record_bytes()).encode();
        device.nvm_write(0, &header).unwrap();
        device.nvm_persist(0, header.len() as u64).unwrap();
        device.open_nvm_stripes(UUID).unwrap();
        device
    }

    fn program(device: &mut Protected<MemoryFlash>, page: u32, generation: u32) {
        let data = vec![page as u8 ^ generation as u8; 4096];
        let header = PageHeader {
            kind: PageKind::DataBlock,
            end_of_record: false,
            zone_generation: generation,
            sequence: u64::from(generation) * 100 + u64::from(page) + 1,
            zone: ZONE,
            page,
            inverted: InvertedIndex::default(),
            length: 4096,
            count: 0,
        };
        crate::volume::program(device, PageAddress::new(ZONE, page), &header, &data).unwrap();
    }

    /// A clean page's read hands up the header it decoded, the one a
    /// decode of its own would give, so `read_verified` checks the page's
    /// CRC once. A page that came back only through ECC hands up none, and
    /// `read_verified` decodes the corrected page itself.
    #[test]
    fn a_read_hands_up_the_header_it_decoded_and_none_for_a_corrected_page() {
        let mut device = device();
        program(&mut device, 0, 1);
        program(&mut device, 1, 1);
        let geometry = device.geometry();
        let (mut data, mut oob) = (vec![0u8; 4096], vec![0u8; geometry.oob_size_bytes as usize]);
        let (state, header) = device.read_page_decoded(PageAddress::new(ZONE, 0), &mut data, &mut oob).unwrap();
        assert_eq!(state, PageState::Programmed);
        let header = header.expect("a clean page's header is handed up");
        assert_eq!(header, PageHeader::decode(&oob, &data).unwrap());
        assert_eq!((header.zone, header.page, header.sequence), (ZONE, 0, 101));

        let address = PageAddress::new(ZONE, 1);
        let (mut media, media_oob) = device.inner_mut().pristine_page(address).unwrap().expect("programmed");
        media[100] ^= 0x10;
        let media: Vec<u8> = media.into_iter().chain(media_oob).collect();
        assert!(device
            .inner_mut()
            .inject_page_fault(address, flintfs_flash::PageFault::Stored { media: media.into_boxed_slice() })
            .unwrap());
        let (state, header) = device.read_page_decoded(address, &mut data, &mut oob).unwrap();
        assert_eq!((state, header), (PageState::Programmed, None), "corrected by ECC: no header handed up");
        // `program` fills page 1 of generation 1 with 1 ^ 1.
        assert_eq!(data, vec![0u8; 4096], "the flipped bit is corrected");
        let mut pages_read = 0;
        let (header, data) = crate::volume::read_verified(&mut device, address, Some(1), &mut pages_read).unwrap();
        assert_eq!((header.page, header.sequence, pages_read), (1, 102, 1));
        assert_eq!(data, vec![0u8; 4096]);
    }

    /// A zone whose retired blocks leave only its parity's holds no page,
    /// and a program there is refused: it once landed on a parity page,
    /// reported success, and the zone showed no page of it (a checkpoint
    /// record lost that way, and the next mount found no checkpoint).
    #[test]
    fn a_program_past_a_zones_logical_capacity_is_refused() {
        let geometry = Geometry {
            page_size_bytes: 4096,
            oob_size_bytes: 128,
            block_pages: 16,
            zone_blocks: 2,
            zone_count: 16,
            open_zones_max: 8,
            nvm_size_bytes: 0,
        };
        let failing = flintfs_flash::FaultConfig {
            program_failure_probability_at_endurance: 1.0,
            failure_growth_exponent: 0.0,
            ..flintfs_flash::FaultConfig::none(3)
        };
        let options = DeviceOptions { faults: failing, ..DeviceOptions::default() };
        let mut device = Protected::new(MemoryFlash::memory(geometry, options).unwrap());
        device.set_parity(ParityLayout { block_parity_pages: 1, zone_parity_blocks: 1 }).unwrap();
        let capacity_pages = device.report_zone(ZONE).unwrap().capacity_pages;
        assert_eq!(capacity_pages, 15, "one data block of 16 pages, one a parity page");
        let header = |page: u32| PageHeader {
            kind: PageKind::DataBlock,
            end_of_record: false,
            zone_generation: 1,
            sequence: u64::from(page) + 1,
            zone: ZONE,
            page,
            inverted: InvertedIndex::default(),
            length: 4096,
            count: 0,
        };
        let data = vec![5u8; 4096];
        let failed = crate::volume::program(&mut device, PageAddress::new(ZONE, 0), &header(0), &data);
        assert!(failed.is_err(), "every program fails: {failed:?}");
        device.inner_mut().set_faults(flintfs_flash::FaultConfig::none(3)).unwrap();
        device.reset_zone(ZONE).unwrap();
        let report = device.report_zone(ZONE).unwrap();
        assert_eq!((report.capacity_pages, report.write_pointer), (0, 0), "only the parity's block is left");
        let refused = crate::volume::program(&mut device, PageAddress::new(ZONE, 0), &header(0), &data);
        let error = refused.expect_err("a program past the zone's logical capacity");
        assert_eq!(error.errno, crate::error::errno::ENOSPC, "{error}");
        assert_eq!(device.report_zone(ZONE).unwrap().write_pointer, 0);
    }

    /// A run long enough to be sealed on two threads comes out byte for
    /// byte as each page sealed alone: the halves are the same pure
    /// function of their pages, whichever thread (or, when the helper
    /// cannot be had, this one) seals them.
    #[test]
    fn a_run_sealed_on_two_threads_is_sealed_as_page_by_page() {
        seal_a_run_as_page_by_page();
    }

    /// A host that refuses the helper thread: the caller seals both halves,
    /// and the run is sealed the same.
    #[test]
    fn a_run_refused_its_helper_thread_is_sealed_as_page_by_page() {
        crate::helper::with_helper_refused(seal_a_run_as_page_by_page);
    }

    fn seal_a_run_as_page_by_page() {
        let device = device();
        let pages = SEAL_PARALLEL_PAGES_MIN * 2 + 1;
        let data: Vec<Vec<u8>> = (0..pages).map(|page| vec![(page * 37 + 11) as u8; 4096]).collect();
        let headers: Vec<PageHeader> = (0..pages as u32)
            .map(|page| PageHeader {
                kind: PageKind::DataBlock,
                end_of_record: false,
                zone_generation: 3,
                sequence: 300 + u64::from(page),
                zone: ZONE,
                page,
                inverted: InvertedIndex::default(),
                length: 4096,
                count: 0,
            })
            .collect();
        let mut run: Vec<(&[u8], Vec<u8>)> = data.iter().map(|page| (page.as_slice(), vec![0u8; 128])).collect();
        device.seal_pages(&mut run, &headers);
        for (page, ((bytes, oob), header)) in run.iter().zip(&headers).enumerate() {
            let mut alone = vec![0u8; 128];
            alone[..flintfs_format::PAGE_HEADER_BYTES].copy_from_slice(&header.encode(bytes));
            protection::seal(bytes, &mut alone, device.ecc.as_deref());
            assert_eq!(oob, &alone, "page {page} of the run");
            assert!(protection::signature_matches(bytes, oob), "page {page} carries its signature");
        }
    }

    /// What a fresh mount of the device's NVM finds in force: per zone,
    /// the pages its record covers (0: a tombstone).
    fn in_force(device: Protected<MemoryFlash>) -> Vec<(u32, u32)> {
        let mut again = Protected::new(device.into_inner());
        again.set_parity(ParityLayout { block_parity_pages: 1, zone_parity_blocks: 0 }).unwrap();
        again.open_nvm_stripes(UUID).unwrap();
        let area = again.nvm_stripes.as_ref().expect("a stripe area");
        area.current.iter().map(|(&zone, record)| (zone, record.data_pages)).collect()
    }

    fn copy(device: &Protected<MemoryFlash>) -> Protected<MemoryFlash> {
        Protected::new(device.inner().clone())
    }

    /// A record whose sequence is the format's last (hostile: no volume
    /// gets there) leaves the area out of use for the mount: no record or
    /// tombstone is written past the bound, and a reset goes on.
    #[test]
    fn a_record_at_the_sequence_bound_puts_the_area_out_of_use() {
        let mut device = device();
        program(&mut device, 0, 1);
        device.flush().unwrap();
        let area = device.nvm_stripes.as_ref().expect("a stripe area");
        let (at, record_bytes) = (area.at(area.current[&ZONE].slot), area.record_bytes);
        let mut bytes = vec![0u8; record_bytes as usize];
        device.nvm_read(at, &mut bytes).unwrap();
        let (mut header, _) = NvmStripeHeader::decode(&bytes[..NVM_STRIPE_HEADER_BYTES]).unwrap().unwrap();
        header.sequence = flintfs_format::NVM_STRIPE_SEQUENCE_MAX;
        let units: Vec<Vec<u8>> =
            bytes[NVM_STRIPE_HEADER_BYTES..].chunks(header.unit_bytes as usize).map(<[u8]>::to_vec).collect();
        device.nvm_write(at, &header.encode(&UUID, &units)).unwrap();
        device.nvm_persist(at, NVM_STRIPE_HEADER_BYTES as u64).unwrap();
        let mut again = copy(&device);
        again.set_parity(ParityLayout { block_parity_pages: 1, zone_parity_blocks: 0 }).unwrap();
        again.open_nvm_stripes(UUID).unwrap();
        assert!(again.nvm_stripes.is_none(), "the area is out of use");
        program(&mut again, 1, 1);
        again.flush().unwrap();
        again.reset_zone(ZONE).unwrap();
        assert_eq!(again.protection_counters().stripe_records_written, 0);
    }

    /// A zone's reset puts a tombstone in force for it: a record of its
    /// earlier use, rebuilt over a page of its new use that a cut tore,
    /// would give back the old page whole. So too when the zone's last
    /// record had gone out of force (its block's parity reached flash)
    /// but is still on NVM, where a mount would find it newest.
    #[test]
    fn a_reset_zone_keeps_no_record_of_its_earlier_use_in_force() {
        let mut device = device();
        for page in 0..3 {
            program(&mut device, page, 1);
            device.flush().unwrap();
        }
        assert_eq!(device.protection_counters().stripe_records_written, 3);
        assert_eq!(in_force(copy(&device)), vec![(ZONE, 3)], "the record is there before the reset");
        device.reset_zone(ZONE).unwrap();
        assert_eq!(in_force(copy(&device)), vec![(ZONE, 0)], "a tombstone after the reset");
        // A whole block: its parity reaches flash and its record goes out
        // of force, but stays on NVM; the reset still leaves a tombstone.
        for page in 0..15 {
            program(&mut device, page, 2);
            device.flush().unwrap();
        }
        assert!(!device.nvm_stripes.as_ref().unwrap().current.contains_key(&ZONE), "the block's parity is on flash");
        device.reset_zone(ZONE).unwrap();
        assert_eq!(in_force(device), vec![(ZONE, 0)], "a tombstone after the second reset");
    }
}
