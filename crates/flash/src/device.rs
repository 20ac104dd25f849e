//! [`FlashEmulator`]: the volatile half of the device (write buffer, open
//! zones, unpersisted NVM words), the device rules, fault injection and
//! power cuts, over any [`Backend`] that holds the durable half.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_distr::{Binomial, Distribution};
use rand_pcg::Pcg64Mcg;

use crate::backend::{
    Backend, BlockRecord, DurableCondition, DurableState, MemoryBackend, Overlay, PageFault, ZoneRecord,
    OVERLAY_ENTRIES_MAX, OVERLAY_STORED_PAGES_MAX,
};
use crate::counters::Counters;
use crate::error::{DeviceError, Result};
use crate::faults::FaultConfig;
use crate::geometry::{Geometry, PageAddress, NVM_WORD_BYTES};
use crate::timing::{Clock, TimingConfig};
use crate::{FlashDevice, PageState, ZoneReport, ZoneState};

/// Pages the device's volatile write buffer holds by default (4 MiB of 4 KiB
/// pages, the order of an SSD controller's DRAM buffer share per namespace).
pub const WRITE_BUFFER_PAGES_DEFAULT: u32 = 1024;
/// Pages the write buffer drains on its own before their records are
/// written, together (`FlashEmulator::record_drained`): as many as the
/// image backend gathers into one write of slots.
pub const DRAINED_RECORDS_LAG_PAGES: usize = 64;
const _: () = assert!(DRAINED_RECORDS_LAG_PAGES <= WRITE_BUFFER_PAGES_DEFAULT as usize);
/// Largest write buffer accepted.
pub const WRITE_BUFFER_PAGES_MAX: u32 = 1 << 16;
const _: () = assert!(WRITE_BUFFER_PAGES_DEFAULT <= WRITE_BUFFER_PAGES_MAX);

/// Salt that separates the factory bad block draw from the runtime stream.
const FACTORY_BAD_BLOCK_SALT: u64 = 0xBAD_B10C;
/// Seeds the stored share of the bit errors, apart from every other draw.
const STORED_BIT_ERROR_SALT: u64 = 0x5701_2ED0_B175;

/// How the emulator behaves; nothing here is stored in an image.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceOptions {
    pub faults: FaultConfig,
    pub timing: TimingConfig,
    /// Accepted pages held volatile before the device makes the oldest
    /// durable on its own (a real controller drains its buffer too).
    pub write_buffer_pages: u32,
    /// Image backend: make each flush survive a host crash (fdatasync).
    pub host_sync: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            faults: FaultConfig::none(0),
            timing: TimingConfig::default(),
            write_buffer_pages: WRITE_BUFFER_PAGES_DEFAULT,
            host_sync: false,
        }
    }
}

impl DeviceOptions {
    pub fn validate(&self) -> Result<()> {
        self.faults.validate()?;
        self.timing.validate()?;
        if self.write_buffer_pages == 0 || self.write_buffer_pages > WRITE_BUFFER_PAGES_MAX {
            return Err(DeviceError::Geometry {
                field: "write_buffer_pages",
                reason: format!("{} is outside 1..={}", self.write_buffer_pages, WRITE_BUFFER_PAGES_MAX),
            });
        }
        Ok(())
    }
}

/// What one zone went through in a power cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneCut {
    pub zone: u32,
    /// The write pointer that was durable before the cut (flushed or drained).
    pub durable_before: u32,
    /// The write pointer the host had been told of.
    pub accepted: u32,
    /// The write pointer after power-up.
    pub durable_after: u32,
}

/// What a power cut kept, dropped and damaged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PowerCutReport {
    pub seed: u64,
    /// Zones that had unflushed pages.
    pub zones: Vec<ZoneCut>,
    pub torn_pages: Vec<PageAddress>,
    pub paired_page_corruptions: Vec<PageAddress>,
    /// A zone whose reset was in flight and was left half-erased.
    pub interrupted_erase: Option<u32>,
    pub nvm_words_kept: u64,
    pub nvm_words_dropped: u64,
    /// A backend error met while applying the cut (an image on a full host
    /// disk). The cut still took effect in the emulator.
    pub backend_error: Option<String>,
}

#[derive(Clone, Debug)]
struct Zone {
    state: ZoneState,
    write_pointer: u32,
    durable: ZoneRecord,
    /// Finished (ZNS finish) below capacity: full whatever a power cut
    /// drops, because a finish is durable when it returns.
    finished: bool,
    /// Offsets (within the zone) of the blocks that hold its pages, in order.
    block_map: Vec<u32>,
}

#[derive(Clone)]
struct BufferedPage {
    physical: u64,
    zone: u32,
    page: u32,
    /// Data then OOB; `None` where the backend took them at the program
    /// (`Backend::stage_page`) and its slot holds them.
    bytes: Option<Box<[u8]>>,
    programmed_ns: u64,
}

/// FIFO of accepted, not yet durable pages. A page address is in it at most
/// once: a zone's entries are removed when it is reset.
///
/// It also keeps a few byte buffers of pages gone to the medium, to take
/// again for the next programs, so that a page programmed allocates
/// nothing (a buffer per program, freed at its drain, was an allocation
/// per page any workload wrote). At most [`FREE_PAGE_BUFFERS_MAX`] of
/// them: enough for the pages an fsync or a steady stream drains at a
/// time, without holding the whole buffer's worth after a flush.
struct WriteBuffer {
    entries: VecDeque<BufferedPage>,
    by_physical: HashMap<u64, u64>,
    front_sequence: u64,
    /// Buffers of drained pages, each of one page's data and OOB bytes.
    free_page_buffers: Vec<Box<[u8]>>,
}

/// Buffers of drained pages the write buffer keeps for the next programs
/// (about 270 KiB of 4 KiB pages).
const FREE_PAGE_BUFFERS_MAX: usize = 64;
const _: () = assert!(FREE_PAGE_BUFFERS_MAX as u64 <= WRITE_BUFFER_PAGES_MAX as u64);

impl Clone for WriteBuffer {
    /// The pages buffered, not the free buffers: a copy (a crash test's
    /// prepared device, cloned for every run) starts without them.
    fn clone(&self) -> WriteBuffer {
        WriteBuffer {
            entries: self.entries.clone(),
            by_physical: self.by_physical.clone(),
            front_sequence: self.front_sequence,
            free_page_buffers: Vec::new(),
        }
    }
}

impl WriteBuffer {
    fn new() -> WriteBuffer {
        WriteBuffer {
            entries: VecDeque::new(),
            by_physical: HashMap::new(),
            front_sequence: 0,
            free_page_buffers: Vec::new(),
        }
    }

    /// `data` then `oob` in a free buffer of that size, or a new one.
    fn page_bytes(&mut self, data: &[u8], oob: &[u8]) -> Box<[u8]> {
        let length = data.len() + oob.len();
        match self.free_page_buffers.pop() {
            Some(mut bytes) if bytes.len() == length => {
                bytes[..data.len()].copy_from_slice(data);
                bytes[data.len()..].copy_from_slice(oob);
                bytes
            }
            _ => {
                let mut bytes = Vec::with_capacity(length);
                bytes.extend_from_slice(data);
                bytes.extend_from_slice(oob);
                bytes.into_boxed_slice()
            }
        }
    }

    /// Keeps the buffer of a page gone to the medium, while there are
    /// fewer than [`FREE_PAGE_BUFFERS_MAX`].
    fn recycle(&mut self, bytes: Box<[u8]>) {
        if self.free_page_buffers.len() < FREE_PAGE_BUFFERS_MAX {
            self.free_page_buffers.push(bytes);
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn get(&self, physical: u64) -> Option<&BufferedPage> {
        let sequence = *self.by_physical.get(&physical)?;
        self.entries.get((sequence - self.front_sequence) as usize)
    }

    fn push(&mut self, page: BufferedPage) {
        let sequence = self.front_sequence + self.entries.len() as u64;
        let previous = self.by_physical.insert(page.physical, sequence);
        assert!(previous.is_none(), "page slot {} buffered twice", page.physical);
        self.entries.push_back(page);
    }

    fn pop_front(&mut self) -> Option<BufferedPage> {
        let page = self.entries.pop_front()?;
        self.by_physical.remove(&page.physical);
        self.front_sequence += 1;
        Some(page)
    }

    /// Puts back an entry just taken by `pop_front`.
    fn push_front(&mut self, page: BufferedPage) {
        self.front_sequence -= 1;
        let previous = self.by_physical.insert(page.physical, self.front_sequence);
        assert!(previous.is_none(), "page slot {} buffered twice", page.physical);
        self.entries.push_front(page);
    }

    /// Removes every entry, oldest first.
    fn take_all(&mut self) -> Vec<BufferedPage> {
        self.by_physical.clear();
        self.front_sequence += self.entries.len() as u64;
        self.entries.drain(..).collect()
    }

    /// Removes the entries of one zone, keeping the others in order.
    fn discard_zone(&mut self, zone: u32) {
        if !self.entries.iter().any(|page| page.zone == zone) {
            return;
        }
        let kept: Vec<BufferedPage> = self.take_all().into_iter().filter(|page| page.zone != zone).collect();
        for page in kept {
            self.push(page);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Power {
    On,
    /// A scheduled cut fired: every operation fails until `power_on`.
    Off,
}

/// What a scheduled power cut interrupts.
#[derive(Clone, Copy, Debug)]
enum InFlight {
    Nothing,
    Reset { zone: u32 },
}

/// The emulated flash device. See the crate documentation for the rules,
/// the durability model and the fault model. A memory device clones (a
/// prepared state, reused by many power-cut runs); an image device does not.
#[derive(Clone)]
pub struct FlashEmulator<B: Backend> {
    geometry: Geometry,
    options: DeviceOptions,
    backend: B,
    zones: Vec<Zone>,
    blocks: Vec<BlockRecord>,
    overlay: Overlay,
    buffer: WriteBuffer,
    nvm_live: Vec<u8>,
    nvm_durable: Vec<u8>,
    nvm_dirty_words: WordSet,
    /// Writes each 8-byte NVM word has taken since this device was opened
    /// (wear: phase-change memory endures about 1e8 writes a cell). Empty
    /// until the first NVM write.
    nvm_word_writes: Vec<u32>,
    rng: Pcg64Mcg,
    clock: Clock,
    lifetime: Counters,
    baseline: Counters,
    dirty_zones: BTreeSet<u32>,
    dirty_blocks: BTreeSet<u64>,
    /// Pages the write buffer drained on its own whose records are not
    /// written yet: (zone, block), at most [`DRAINED_RECORDS_LAG_PAGES`]
    /// while the backend takes its writes (a failing one leaves them here
    /// for the next attempt).
    drained_unrecorded: Vec<(u32, u64)>,
    drained_unrecorded_pages: usize,
    overlay_dirty: bool,
    /// A flush that only ordered ([`FlashDevice::flush_ordered`]) left the
    /// backend with writes and syncs still to run: a flush waits for them.
    owes_settle: bool,
    power: Power,
    mutating_operations: u64,
    scheduled_cut: Option<(u64, u64)>,
    last_power_cut: Option<PowerCutReport>,
}

/// The device on host memory.
pub type MemoryFlash = FlashEmulator<MemoryBackend>;

impl<B: Backend> FlashEmulator<B> {
    /// A fresh, erased device over a caller's backend (a test double, or a
    /// store of another kind). The backend must read back what it is given.
    pub fn with_backend(geometry: Geometry, options: DeviceOptions, backend: B) -> Result<Self> {
        geometry.validate()?;
        options.validate()?;
        let state = fresh_state(&geometry, &options.faults);
        FlashEmulator::from_parts(geometry, options, backend, state)
    }
}

impl FlashEmulator<MemoryBackend> {
    /// A fresh, erased device in memory.
    pub fn memory(geometry: Geometry, options: DeviceOptions) -> Result<MemoryFlash> {
        geometry.validate()?;
        options.validate()?;
        let state = fresh_state(&geometry, &options.faults);
        FlashEmulator::from_parts(geometry, options, MemoryBackend::new(geometry), state)
    }

    /// Allocates and touches the memory behind every page now
    /// ([`MemoryBackend::prefault`]): the bench does so before it measures
    /// the host time of a workload, which should not include the page
    /// faults of the emulator's memory. The device's contents and counters
    /// are unchanged; its resident memory becomes its whole size.
    pub fn prefault_memory(&mut self) {
        self.backend.prefault();
    }
}

/// The durable state of a device fresh from the factory: every block erased
/// once, a seeded fraction of them bad.
pub(crate) fn fresh_state(geometry: &Geometry, faults: &FaultConfig) -> DurableState {
    let mut rng = Pcg64Mcg::seed_from_u64(faults.seed ^ FACTORY_BAD_BLOCK_SALT);
    let mut blocks = vec![BlockRecord::default(); geometry.block_count() as usize];
    if faults.factory_bad_block_fraction > 0.0 {
        for block in &mut blocks {
            if rng.random_bool(faults.factory_bad_block_fraction) {
                block.bad = true;
                block.excluded = true;
            }
        }
    }
    let zones = (0..geometry.zone_count)
        .map(|zone| {
            let first = u64::from(zone) * u64::from(geometry.zone_blocks);
            let good = (first..first + u64::from(geometry.zone_blocks))
                .filter(|&block| !blocks[block as usize].excluded)
                .count() as u32;
            let capacity_pages = good * geometry.block_pages;
            ZoneRecord {
                condition: if capacity_pages == 0 { DurableCondition::Offline } else { DurableCondition::Empty },
                write_pointer: 0,
                capacity_pages,
                generation: 0,
            }
        })
        .collect();
    DurableState {
        zones,
        blocks,
        overlay: Overlay::new(),
        counters: Counters::default(),
        clock_ns: 0,
        nvm: vec![0; geometry.nvm_size_bytes as usize],
    }
}

/// Adds to a counter without overflow: an image may come with counters near
/// the top of the range.
fn bump(counter: &mut u64, amount: u64) {
    *counter = counter.saturating_add(amount);
}

/// A generator for a fault's garbage, reproducible from its seed and page.
fn fault_rng(seed: u64, physical: u64, part: u64) -> Pcg64Mcg {
    Pcg64Mcg::seed_from_u64(
        seed ^ physical.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ part.wrapping_mul(0xD1B5_4A32_D192_ED03),
    )
}

/// Flips bits of `bytes` at `rate`, drawing positions from `rng`; returns
/// how many were flipped.
fn flip_bits(bytes: &mut [u8], rate: f64, rng: &mut Pcg64Mcg) -> u64 {
    let bits = bytes.len() as u64 * 8;
    if rate <= 0.0 || bits == 0 {
        return 0;
    }
    let flips = match Binomial::new(bits, rate.min(1.0)) {
        Ok(distribution) => distribution.sample(rng),
        Err(_) => 0,
    };
    // Distinct positions: a bit drawn twice would flip back and the count
    // would lie.
    for bit in rand::seq::index::sample(rng, bits as usize, flips as usize) {
        bytes[bit / 8] ^= 1 << (bit % 8);
    }
    flips
}

impl<B: Backend> FlashEmulator<B> {
    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    pub(crate) fn from_parts(
        geometry: Geometry,
        options: DeviceOptions,
        backend: B,
        state: DurableState,
    ) -> Result<Self> {
        assert_eq!(state.zones.len(), geometry.zone_count as usize);
        assert_eq!(state.blocks.len() as u64, geometry.block_count());
        assert_eq!(state.nvm.len() as u64, geometry.nvm_size_bytes);
        let mut zones = Vec::with_capacity(state.zones.len());
        for (zone_index, record) in state.zones.iter().enumerate() {
            let block_map = block_map_of(&geometry, &state.blocks, zone_index as u32);
            assert_eq!(
                block_map.len() as u32 * geometry.block_pages,
                record.capacity_pages,
                "zone {zone_index}: capacity disagrees with its blocks"
            );
            assert!(record.write_pointer <= record.capacity_pages);
            zones.push(Zone {
                state: live_state_after_power_up(record),
                write_pointer: record.write_pointer,
                durable: *record,
                finished: record.condition == DurableCondition::Full && record.write_pointer < record.capacity_pages,
                block_map,
            });
        }
        Ok(FlashEmulator {
            // The seed mixed with the image's lifetime activity: reproducible,
            // yet a reopened image does not replay the faults of its last open.
            rng: Pcg64Mcg::seed_from_u64(
                options.faults.seed
                    ^ state.counters.pages_programmed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ state.counters.pages_read.rotate_left(21)
                    ^ state.counters.erases.rotate_left(42),
            ),
            clock: Clock::new(options.timing, state.clock_ns),
            geometry,
            backend,
            zones,
            blocks: state.blocks,
            overlay: state.overlay,
            buffer: WriteBuffer::new(),
            nvm_live: state.nvm.clone(),
            nvm_durable: state.nvm,
            nvm_dirty_words: WordSet::default(),
            nvm_word_writes: Vec::new(),
            lifetime: state.counters,
            baseline: state.counters,
            dirty_zones: BTreeSet::new(),
            dirty_blocks: BTreeSet::new(),
            drained_unrecorded: Vec::new(),
            drained_unrecorded_pages: 0,
            overlay_dirty: false,
            owes_settle: false,
            power: Power::On,
            mutating_operations: 0,
            scheduled_cut: None,
            last_power_cut: None,
            options,
        })
    }

    pub fn options(&self) -> &DeviceOptions {
        &self.options
    }

    /// Replaces the injected faults from here on (a device that ages, or
    /// one whose faults start after it was formatted). The random stream
    /// goes on from where it is, so a run stays a function of its seeds.
    pub fn set_faults(&mut self, faults: FaultConfig) -> Result<()> {
        faults.validate()?;
        self.options.faults = faults;
        Ok(())
    }

    /// Counters since the device was created (for an image: across every
    /// process that opened it).
    pub fn lifetime_counters(&self) -> Counters {
        let mut counters = self.lifetime;
        counters.device_time_ns = self.clock.now_ns();
        counters
    }

    /// Wear and health of every erase block, in physical order.
    pub fn blocks(&self) -> &[BlockRecord] {
        &self.blocks
    }

    /// The fault overlay: pages whose medium differs from what was
    /// programmed.
    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// Pages currently held in the volatile write buffer.
    pub fn buffered_pages(&self) -> usize {
        self.buffer.len()
    }

    /// Writes each 8-byte NVM word has taken since this device was opened,
    /// by word (saturating); empty before any NVM write.
    pub fn nvm_word_writes(&self) -> &[u32] {
        &self.nvm_word_writes
    }

    /// The most writes any 8-byte NVM word has taken since this device was
    /// opened, and which word (by byte offset). `None` before any NVM write.
    pub fn nvm_hottest_word(&self) -> Option<(u64, u64)> {
        let (word, writes) = self.nvm_word_writes.iter().enumerate().max_by_key(|(_, writes)| **writes)?;
        Some((word as u64 * NVM_WORD_BYTES, u64::from(*writes)))
    }

    /// Mutating operations (program, reset, finish, flush, NVM write and
    /// persist) issued so far by this process; a scheduled power cut names
    /// one of these by index. An operation counts once its arguments are
    /// well-formed (address in range, buffers the right size), whether the
    /// device then accepts it or refuses it.
    pub fn mutating_operations(&self) -> u64 {
        self.mutating_operations
    }

    /// The durable write pointer of a zone: pages below it survive a power
    /// cut now.
    pub fn durable_write_pointer(&self, zone: u32) -> Result<u32> {
        self.geometry.check_zone(zone)?;
        Ok(self.zones[zone as usize].durable.write_pointer)
    }

    /// Arms a power cut that fires during the mutating operation with index
    /// `operation` (see [`FlashEmulator::mutating_operations`]). That
    /// operation fails with [`DeviceError::PowerLost`], as does every later
    /// one until [`FlashEmulator::power_on`].
    pub fn schedule_power_cut(&mut self, operation: u64, seed: u64) -> Result<()> {
        if operation < self.mutating_operations {
            return Err(DeviceError::OutOfRange {
                what: format!("a power cut at operation {operation}"),
                limit: format!("{} operations have already been issued", self.mutating_operations),
            });
        }
        self.scheduled_cut = Some((operation, seed));
        Ok(())
    }

    /// Forgets a scheduled cut that has not fired.
    pub fn cancel_power_cut(&mut self) {
        self.scheduled_cut = None;
    }

    /// True while a fired scheduled cut keeps the device off.
    pub fn is_powered_off(&self) -> bool {
        self.power == Power::Off
    }

    /// Powers the device back on after a scheduled cut; returns its report.
    pub fn power_on(&mut self) -> Option<PowerCutReport> {
        self.power = Power::On;
        self.last_power_cut.take()
    }

    /// Cuts power now, between operations: per zone, a random durable point
    /// between the last durable page and the last accepted one; possibly a
    /// torn page at that point (and a corrupted paired page); each
    /// unpersisted NVM word kept or dropped. The device then behaves as
    /// freshly powered up.
    pub fn power_cut(&mut self, seed: u64) -> Result<PowerCutReport> {
        let (report, outcome) = self.cut(seed, InFlight::Nothing);
        outcome.map(|()| report)
    }

    /// The pristine contents of a page (what was programmed), bypassing
    /// faults and counters; `None` for a page that reads erased.
    pub fn pristine_page(&mut self, address: PageAddress) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let Some(physical) = self.readable_physical(address)? else {
            return Ok(None);
        };
        let (data, oob) = self.pristine(physical)?;
        Ok(Some((data, oob)))
    }

    /// What a read of the page returns, without the transient bit flips of
    /// a read and without counting: for a durable page the medium (pristine
    /// plus the fault overlay), for a buffered page the buffer. `None` for a
    /// page that reads erased.
    pub fn media_page(&mut self, address: PageAddress) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let Some(physical) = self.readable_physical(address)? else { return Ok(None) };
        let (mut data, mut oob) = self.pristine(physical)?;
        if self.buffer.get(physical).is_none() {
            self.apply_media_faults(physical, &mut data, &mut oob);
        }
        Ok(Some((data, oob)))
    }

    /// Damages a programmed page as the medium would, for tests and the
    /// fault atlas: the fault goes into the overlay (the pristine data
    /// stays) and is persisted with it. A page still in the write buffer is
    /// made durable first. Returns false for a page that reads erased, or
    /// when the overlay is full.
    pub fn inject_page_fault(&mut self, address: PageAddress, fault: PageFault) -> Result<bool> {
        self.check_powered("inject a fault")?;
        let Some(physical) = self.readable_physical(address)? else { return Ok(false) };
        if self.buffer.get(physical).is_some() {
            self.flush()?;
        }
        if !self.record_fault(physical, fault) {
            return Ok(false);
        }
        self.persist_overlay()?;
        Ok(true)
    }

    /// The host lets go of the device: the summary (lifetime counters
    /// and clock) is written even if nothing was programmed since the
    /// last flush, so reads and their device time are not lost from an
    /// image's totals. A device without power has nothing to write.
    pub fn close(mut self) -> Result<()> {
        match self.power {
            Power::On => self.commit_metadata().and_then(|()| self.backend.settle()),
            Power::Off => Ok(()),
        }
    }

    fn check_powered(&self, operation: &'static str) -> Result<()> {
        match self.power {
            Power::On => Ok(()),
            Power::Off => Err(DeviceError::PowerLost { operation }),
        }
    }

    /// Counts a mutating operation; true when a scheduled cut fires in it.
    fn count_operation(&mut self) -> bool {
        let index = self.mutating_operations;
        self.mutating_operations += 1;
        matches!(self.scheduled_cut, Some((operation, _)) if operation == index)
    }

    /// Fires the scheduled cut after the operation in flight was accepted.
    /// The device is off afterwards whatever the backend said; a backend
    /// error goes into the report.
    fn fire_scheduled_cut(&mut self, operation: &'static str, in_flight: InFlight) -> DeviceError {
        let (_, seed) = self.scheduled_cut.expect("a scheduled cut fires only when armed");
        let (mut report, outcome) = self.cut(seed, in_flight);
        self.scheduled_cut = None;
        report.backend_error = outcome.err().map(|error| error.to_string());
        self.last_power_cut = Some(report);
        self.power = Power::Off;
        DeviceError::PowerLost { operation }
    }

    /// The error for an operation the zone's state refuses; when a scheduled
    /// cut fires in that operation, the cut instead.
    fn refuse_in_state(&mut self, zone: u32, operation: &'static str, cut_now: bool) -> DeviceError {
        if cut_now {
            return self.fire_scheduled_cut(operation, InFlight::Nothing);
        }
        let entry = &self.zones[zone as usize];
        DeviceError::ZoneState { zone, state: entry.state.name(), operation, write_pointer: entry.write_pointer }
    }

    /// A coin for what an interrupted operation did, drawn from the
    /// scheduled cut's own seed so the runtime fault stream is untouched.
    fn coin_for_interrupted_operation(&self) -> bool {
        let (_, seed) = self.scheduled_cut.expect("only while a cut is armed");
        Pcg64Mcg::seed_from_u64(seed ^ 0xF1_2157).random_bool(0.5)
    }

    fn block_id(&self, zone: u32, block_offset: u32) -> u64 {
        u64::from(zone) * u64::from(self.geometry.zone_blocks) + u64::from(block_offset)
    }

    /// Block and physical page index of a page within its zone's capacity.
    fn locate(&self, address: PageAddress) -> (u64, u64) {
        let zone = &self.zones[address.zone as usize];
        let block_offset = zone.block_map[(address.page / self.geometry.block_pages) as usize];
        let block = self.block_id(address.zone, block_offset);
        let physical =
            block * u64::from(self.geometry.block_pages) + u64::from(address.page % self.geometry.block_pages);
        (block, physical)
    }

    fn check_buffer(what: &'static str, expected: u32, actual: usize) -> Result<()> {
        if actual != expected as usize {
            return Err(DeviceError::BufferLength { what, expected: expected as usize, actual });
        }
        Ok(())
    }

    /// The physical slot of a page that holds programmed data, `None` when
    /// it reads erased (at or past the write pointer).
    fn readable_physical(&self, address: PageAddress) -> Result<Option<u64>> {
        self.geometry.check_address(address)?;
        let zone = &self.zones[address.zone as usize];
        if zone.state == ZoneState::Offline {
            return Err(DeviceError::ZoneState {
                zone: address.zone,
                state: zone.state.name(),
                operation: "read",
                write_pointer: zone.write_pointer,
            });
        }
        if address.page >= zone.write_pointer {
            return Ok(None);
        }
        Ok(Some(self.locate(address).1))
    }

    fn pristine(&mut self, physical: u64) -> Result<(Vec<u8>, Vec<u8>)> {
        let page = self.geometry.page_size_bytes as usize;
        let mut data = vec![0; page];
        let mut oob = vec![0; self.geometry.oob_size_bytes as usize];
        match self.buffer.get(physical).and_then(|buffered| buffered.bytes.as_deref()) {
            Some(bytes) => {
                data.copy_from_slice(&bytes[..page]);
                oob.copy_from_slice(&bytes[page..]);
            }
            // Durable, or buffered with its bytes in the backend's slot.
            _ => self.backend.read_page(physical, &mut data, &mut oob)?,
        }
        Ok((data, oob))
    }

    fn has_media_fault(&self, block: u64, physical: u64) -> bool {
        self.overlay.contains_key(&physical) || self.blocks[block as usize].interrupted_erase_seed.is_some()
    }

    /// Turns pristine contents into what the medium holds at `physical`.
    fn apply_media_faults(&self, physical: u64, data: &mut [u8], oob: &mut [u8]) {
        match self.overlay.get(&physical) {
            None => {}
            Some(PageFault::Torn { seed }) => {
                // A bit that should have been programmed to 0 made it only
                // where the mask is 1: media = pristine | !mask.
                for (part, bytes) in [(0, &mut *data), (1, &mut *oob)] {
                    let mut rng = fault_rng(*seed, physical, part);
                    for byte in bytes.iter_mut() {
                        *byte |= !rng.random::<u8>();
                    }
                }
            }
            Some(PageFault::LostWrite) => {
                data.fill(0xFF);
                oob.fill(0xFF);
            }
            Some(PageFault::Disturbed { seed, rate_ppm }) => {
                let rate = f64::from(*rate_ppm) / 1e6;
                flip_bits(data, rate, &mut fault_rng(*seed, physical, 0));
                flip_bits(oob, rate, &mut fault_rng(*seed, physical, 1));
            }
            Some(PageFault::Stored { media }) => {
                data.copy_from_slice(&media[..data.len()]);
                oob.copy_from_slice(&media[data.len()..]);
            }
            // A read never returns its bytes (read_common fails first); what
            // the cells hold is left as programmed for anything else.
            Some(PageFault::Unreadable) => {}
        }
        let block = physical / u64::from(self.geometry.block_pages);
        if let Some(seed) = self.blocks[block as usize].interrupted_erase_seed {
            // A half-done erase pulls bits towards 1: media |= mask.
            for (part, bytes) in [(2, &mut *data), (3, &mut *oob)] {
                let mut rng = fault_rng(seed, physical, part);
                for byte in bytes.iter_mut() {
                    *byte |= rng.random::<u8>();
                }
            }
        }
    }

    /// The raw bit error rate of a block right now.
    fn raw_bit_error_rate(&self, block: u64) -> f64 {
        let record = &self.blocks[block as usize];
        let mut rate = match &self.options.faults.bit_errors {
            Some(model) => model.rate(
                record.erase_count,
                self.options.faults.endurance_cycles,
                self.clock.now_ns().saturating_sub(record.programmed_at_ns),
                record.reads_since_erase,
            ),
            None => 0.0,
        };
        if record.interrupted_erase_seed.is_some() {
            rate += self.options.faults.interrupted_erase_bit_error_rate;
        }
        rate.min(crate::faults::RAW_BIT_ERROR_RATE_MAX)
    }

    /// Shared by full and OOB-only reads: fills what was asked for with what
    /// the medium returns, injecting faults.
    fn read_common(&mut self, address: PageAddress, data: Option<&mut [u8]>, oob: &mut [u8]) -> Result<PageState> {
        let full = data.is_some();
        self.check_powered(if full { "read" } else { "read OOB" })?;
        let page = self.geometry.page_size_bytes as usize;
        let Some(physical) = self.readable_physical(address)? else {
            // At or past the write pointer: the device answers from its zone
            // state without sensing the cells.
            if let Some(data) = data {
                data.fill(0xFF);
            }
            oob.fill(0xFF);
            self.count_read(full);
            self.clock.read_buffered(if full { page + oob.len() } else { oob.len() } as u64);
            return Ok(PageState::Erased);
        };
        let (block, _) = self.locate(address);
        let bytes = if full { page + oob.len() } else { oob.len() } as u64;
        self.count_read(full);
        // A page still in the write buffer is served from the controller's
        // DRAM: no medium, so no medium faults, no read disturb.
        if let Some(entry) = self.buffer.get(physical) {
            match (&entry.bytes, data) {
                (Some(bytes), data) => {
                    if let Some(data) = data {
                        data.copy_from_slice(&bytes[..page]);
                    }
                    oob.copy_from_slice(&bytes[page..]);
                }
                // Staged in the backend's slot at its program.
                (None, Some(data)) => self.backend.read_page(physical, data, oob)?,
                (None, None) => self.backend.read_oob(physical, oob)?,
            }
            self.clock.read_buffered(bytes);
            return Ok(PageState::Programmed);
        }
        let mut scratch_data;
        let data_target: &mut [u8] = match data {
            Some(data) => data,
            None => {
                scratch_data = Vec::new();
                &mut scratch_data
            }
        };
        if matches!(self.overlay.get(&physical), Some(PageFault::Unreadable)) {
            self.clock.read(block, bytes);
            return Err(DeviceError::ReadFailed { address, block });
        }
        if self.has_media_fault(block, physical) {
            let (mut whole_data, mut whole_oob) = self.pristine(physical)?;
            self.apply_media_faults(physical, &mut whole_data, &mut whole_oob);
            if full {
                data_target.copy_from_slice(&whole_data);
            }
            oob.copy_from_slice(&whole_oob);
        } else if full {
            self.backend.read_page(physical, data_target, oob)?;
        } else {
            self.backend.read_oob(physical, oob)?;
        }
        self.clock.read(block, bytes);
        let record = &mut self.blocks[block as usize];
        record.reads_since_erase = record.reads_since_erase.saturating_add(1);
        self.dirty_blocks.insert(block);
        // Whole-page failure, then bit flips.
        let faults = &self.options.faults;
        if faults.read_failure_probability > 0.0 && self.rng.random_bool(faults.read_failure_probability) {
            bump(&mut self.lifetime.read_failures_injected, 1);
            return Err(DeviceError::ReadFailed { address, block });
        }
        let rate = self.raw_bit_error_rate(block);
        if rate > 0.0 {
            // The stored share is drawn from the page and its block's erase
            // count alone, so every read of this program meets the same bits
            // (charge that has leaked); the rest is fresh noise per read.
            let stored_rate = rate * self.options.faults.stored_bit_error_fraction;
            let noise_rate = rate - stored_rate;
            let mut flips = 0;
            if stored_rate > 0.0 {
                let seed = self.options.faults.seed
                    ^ STORED_BIT_ERROR_SALT
                    ^ u64::from(self.blocks[block as usize].erase_count).rotate_left(40);
                if full {
                    flips += flip_bits(data_target, stored_rate, &mut fault_rng(seed, physical, 0));
                }
                flips += flip_bits(oob, stored_rate, &mut fault_rng(seed, physical, 1));
            }
            if noise_rate > 0.0 {
                if full {
                    flips += flip_bits(data_target, noise_rate, &mut self.rng);
                }
                flips += flip_bits(oob, noise_rate, &mut self.rng);
            }
            bump(&mut self.lifetime.bit_flips_injected, flips);
        }
        Ok(PageState::Programmed)
    }

    fn count_read(&mut self, full: bool) {
        bump(if full { &mut self.lifetime.pages_read } else { &mut self.lifetime.oob_reads }, 1);
    }

    /// Makes the oldest buffered page durable. A drain the device does on its
    /// own (`record_now`) also records what it changed (overlay, block,
    /// then the zone record that makes the page durable) once
    /// [`DRAINED_RECORDS_LAG_PAGES`] pages have drained so, so a killed
    /// process keeps a prefix of what an in-process power cut would keep;
    /// with `host_sync` on a backend that cannot find lost pages the
    /// records wait for the next flush (below).
    fn drain_one(&mut self, record_now: bool) -> Result<()> {
        let entry = self.buffer.pop_front().expect("drain of an empty write buffer");
        self.clock.wait_until(entry.programmed_ns);
        if let Err(error) = self.make_durable(&entry) {
            // Not durable after all: it stays buffered, and the prefix rule
            // still holds for the next attempt.
            self.buffer.push_front(entry);
            return Err(error);
        }
        // Recorded with the next [`DRAINED_RECORDS_LAG_PAGES`] drained
        // pages (`record_drained`), so a killed process keeps a prefix of
        // what a power cut would: never less than a flush made durable,
        // which is all the engine trusts. Records behind every page cut the
        // image's runs of slots into a write a page, and the host file
        // system zeroed a partly written block at each one (half of a FUSE
        // daemon's time in a large sequential write). Not with `host_sync`
        // on a backend that cannot find lost pages: the host may write a
        // record back before the page it names, and a host crash would then
        // leave a durable record ahead of its page. The records wait for
        // the next flush, which syncs the pages first; until then a killed
        // process or a crash loses the pages, down to the last flushed
        // write pointer.
        if record_now && (!self.options.host_sync || self.backend.finds_lost_pages_at_open()) {
            let block = entry.physical / u64::from(self.geometry.block_pages);
            if self.drained_unrecorded.last() != Some(&(entry.zone, block)) {
                self.drained_unrecorded.push((entry.zone, block));
            }
            self.drained_unrecorded_pages += 1;
            if self.drained_unrecorded_pages >= DRAINED_RECORDS_LAG_PAGES {
                self.record_drained()?;
            }
        }
        if let Some(bytes) = entry.bytes {
            self.buffer.recycle(bytes);
        }
        Ok(())
    }

    /// Writes the records of the pages drained on their own since the last
    /// ones: the overlay (if changed), then each one's block record (if
    /// changed) and zone record, after the pages (the backend writes the
    /// slots it gathered before any record).
    fn record_drained(&mut self) -> Result<()> {
        if self.drained_unrecorded.is_empty() {
            return Ok(());
        }
        if self.overlay_dirty {
            self.persist_overlay()?;
        }
        // Every block record before any zone record: a zone record makes
        // its pages durable, and with them what their blocks' records say.
        for index in 0..self.drained_unrecorded.len() {
            let (_, block) = self.drained_unrecorded[index];
            if self.dirty_blocks.contains(&block) {
                self.backend.write_block_records(block, std::slice::from_ref(&self.blocks[block as usize]))?;
                self.dirty_blocks.remove(&block);
            }
        }
        for index in 0..self.drained_unrecorded.len() {
            let (zone, _) = self.drained_unrecorded[index];
            // A zone no longer dirty had its record written since.
            if self.dirty_zones.contains(&zone) {
                let record = self.zones[zone as usize].durable;
                self.backend.write_zone_record(zone, &record)?;
                self.dirty_zones.remove(&zone);
            }
        }
        self.drained_unrecorded.clear();
        self.drained_unrecorded_pages = 0;
        Ok(())
    }

    /// A buffered page's data then OOB: its own, or read back from the
    /// backend's slot where it was staged (only the rare paths that need
    /// the bytes at the drain, a misdirected write or a fault on the slot,
    /// pay the copy).
    fn entry_bytes<'a>(&mut self, entry: &'a BufferedPage) -> Result<std::borrow::Cow<'a, [u8]>> {
        if let Some(bytes) = &entry.bytes {
            return Ok(std::borrow::Cow::Borrowed(bytes));
        }
        let page = self.geometry.page_size_bytes as usize;
        let mut bytes = vec![0u8; page + self.geometry.oob_size_bytes as usize];
        let (data, oob) = bytes.split_at_mut(page);
        self.backend.read_page(entry.physical, data, oob)?;
        Ok(std::borrow::Cow::Owned(bytes))
    }

    /// Programs a buffered page into the medium. Medium faults happen here,
    /// when the cells are programmed: a misdirected landing, and bits that
    /// an earlier misdirected write over-programmed into this slot. Every
    /// fallible step comes before the first change, so an error leaves the
    /// device as it was.
    fn make_durable(&mut self, entry: &BufferedPage) -> Result<()> {
        let page = self.geometry.page_size_bytes as usize;
        assert_eq!(
            self.zones[entry.zone as usize].durable.write_pointer, entry.page,
            "zone {}: durability must be a prefix",
            entry.zone
        );
        let misdirected_probability = self.options.faults.misdirected_write_probability;
        let landing = if misdirected_probability > 0.0 && self.rng.random_bool(misdirected_probability) {
            let bytes = self.entry_bytes(entry)?;
            self.plan_misdirect(entry.physical, &bytes)?
        } else {
            None
        };
        // The bytes a fault stored in the slot combines with, read before
        // the overlay changes.
        let stored_over = if matches!(self.overlay.get(&entry.physical), Some(PageFault::Stored { .. })) {
            Some(self.entry_bytes(entry)?)
        } else {
            None
        };
        if let Some(bytes) = &entry.bytes {
            self.backend.write_page(entry.physical, &bytes[..page], &bytes[page..])?;
        }
        match self.overlay.remove(&entry.physical) {
            Some(PageFault::Stored { media }) => {
                let bytes = stored_over.expect("read above");
                let combined: Box<[u8]> = media.iter().zip(bytes.iter()).map(|(medium, byte)| medium & byte).collect();
                self.overlay.insert(entry.physical, PageFault::Stored { media: combined });
                self.overlay_dirty = true;
            }
            Some(_) => self.overlay_dirty = true,
            None => {}
        }
        if let Some((victim, media)) = landing {
            bump(&mut self.lifetime.misdirected_writes_injected, 1);
            self.record_fault(entry.physical, PageFault::LostWrite);
            self.record_fault(victim, PageFault::Stored { media });
        }
        let zone = &mut self.zones[entry.zone as usize];
        zone.durable.write_pointer = entry.page + 1;
        zone.durable.condition = durable_condition_of(zone);
        self.dirty_zones.insert(entry.zone);
        Ok(())
    }

    /// A flush up to the backend: every accepted program and its records
    /// handed to it, with syncs between them, in the order that keeps an
    /// image consistent at a host crash. In the emulator's model the pages
    /// are durable from here on; an image's writes may still be queued.
    fn flush_in_order(&mut self) -> Result<()> {
        self.check_powered("flush")?;
        if self.count_operation() {
            return Err(self.fire_scheduled_cut("flush", InFlight::Nothing));
        }
        while self.buffer.len() > 0 {
            self.drain_one(false)?;
        }
        // `commit_metadata` syncs the pages before their records.
        self.clock.flush();
        bump(&mut self.lifetime.flushes, 1);
        self.commit_metadata()
    }

    fn sync_host(&mut self) -> Result<()> {
        if self.options.host_sync {
            self.backend.sync()?;
        }
        Ok(())
    }

    /// Writes the overlay, each entry tagged with its zone's generation.
    fn persist_overlay(&mut self) -> Result<()> {
        let zone_pages = self.geometry.zone_pages();
        let zones = &self.zones;
        let generation_of = |physical: u64| zones[(physical / zone_pages) as usize].durable.generation;
        self.backend.write_overlay(&self.overlay, &generation_of)?;
        self.overlay_dirty = false;
        Ok(())
    }

    /// Writes every dirty record: the overlay first (zone records below make
    /// faulted pages durable), then zones, blocks, the summary, and syncs. A
    /// record leaves the dirty set only once written.
    fn commit_metadata(&mut self) -> Result<()> {
        // Pages before the records that make them durable, even across a
        // host crash: a flush's, and with `host_sync` those drained on
        // their own since the last one, whose records waited for this. A
        // backend that finds lost pages at open needs only the sync below.
        if (!self.dirty_zones.is_empty() || !self.dirty_blocks.is_empty()) && !self.backend.finds_lost_pages_at_open() {
            self.sync_host()?;
        }
        if self.overlay_dirty {
            self.persist_overlay()?;
        }
        let zones: Vec<u32> = self.dirty_zones.iter().copied().collect();
        for zone in zones {
            let zone_entry = &mut self.zones[zone as usize];
            zone_entry.durable.condition = durable_condition_of(zone_entry);
            let record = zone_entry.durable;
            self.backend.write_zone_record(zone, &record)?;
            self.dirty_zones.remove(&zone);
        }
        let blocks: Vec<u64> = self.dirty_blocks.iter().copied().collect();
        for block in blocks {
            self.backend.write_block_records(block, std::slice::from_ref(&self.blocks[block as usize]))?;
            self.dirty_blocks.remove(&block);
        }
        // Every dirty record is written: those of pages drained on their
        // own among them.
        self.drained_unrecorded.clear();
        self.drained_unrecorded_pages = 0;
        let counters = self.lifetime_counters();
        self.backend.write_summary(&counters, self.clock.now_ns())?;
        self.sync_host()
    }

    /// Records a page fault unless the overlay is full.
    fn record_fault(&mut self, physical: u64, fault: PageFault) -> bool {
        let stored = self.overlay.values().filter(|fault| matches!(fault, PageFault::Stored { .. })).count();
        let replaces = self.overlay.contains_key(&physical);
        let full = !replaces && self.overlay.len() >= OVERLAY_ENTRIES_MAX
            || matches!(fault, PageFault::Stored { .. })
                && !matches!(self.overlay.get(&physical), Some(PageFault::Stored { .. }))
                && stored >= OVERLAY_STORED_PAGES_MAX;
        if full {
            bump(&mut self.lifetime.faults_suppressed, 1);
            return false;
        }
        self.overlay.insert(physical, fault);
        self.overlay_dirty = true;
        true
    }

    fn open_zone_count(&self) -> u32 {
        self.zones.iter().filter(|zone| zone.state == ZoneState::Open).count() as u32
    }

    /// Where a misdirected program lands and what the victim's cells will
    /// hold: the data ANDed over their contents. `None` when it lands where
    /// it was meant to, or on a dead zone. Reads, never changes.
    fn plan_misdirect(&mut self, physical: u64, bytes: &[u8]) -> Result<Option<(u64, Box<[u8]>)>> {
        let zone = self.rng.random_range(0..self.geometry.zone_count);
        let capacity = self.zones[zone as usize].durable.capacity_pages;
        if capacity == 0 {
            return Ok(None);
        }
        let victim_address = PageAddress::new(zone, self.rng.random_range(0..capacity));
        let (_, victim) = self.locate(victim_address);
        if victim == physical {
            return Ok(None);
        }
        // What the victim's cells hold now: durable contents with their
        // faults, an earlier misdirected landing, or erased.
        let durable = victim_address.page < self.zones[zone as usize].durable.write_pointer;
        let mut media = if durable {
            let page = self.geometry.page_size_bytes as usize;
            let mut data = vec![0; page];
            let mut oob = vec![0; self.geometry.oob_size_bytes as usize];
            self.backend.read_page(victim, &mut data, &mut oob)?;
            self.apply_media_faults(victim, &mut data, &mut oob);
            [data, oob].concat()
        } else {
            match self.overlay.get(&victim) {
                Some(PageFault::Stored { media }) => media.to_vec(),
                _ => vec![0xFF; bytes.len()],
            }
        };
        for (medium, byte) in media.iter_mut().zip(bytes) {
            *medium &= byte;
        }
        Ok(Some((victim, media.into_boxed_slice())))
    }

    /// The checks and effects of a program, apart from power-cut handling.
    fn accept_program(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        let zone = &self.zones[address.zone as usize];
        let (state, write_pointer, capacity_pages) = (zone.state, zone.write_pointer, zone.durable.capacity_pages);
        match state {
            ZoneState::ReadOnly | ZoneState::Offline => {
                return Err(DeviceError::ZoneState {
                    zone: address.zone,
                    state: state.name(),
                    operation: "program",
                    write_pointer,
                })
            }
            ZoneState::Full => return Err(DeviceError::ZoneFull { address, write_pointer, capacity_pages }),
            _ => {}
        }
        if address.page >= capacity_pages {
            return Err(DeviceError::ZoneFull { address, write_pointer, capacity_pages });
        }
        if address.page != write_pointer {
            return Err(DeviceError::NotAtWritePointer { address, write_pointer });
        }
        if matches!(state, ZoneState::Empty | ZoneState::Closed) {
            let open_zones = self.open_zone_count();
            if open_zones >= self.geometry.open_zones_max {
                return Err(DeviceError::TooManyOpenZones {
                    address,
                    open_zones,
                    open_zones_max: self.geometry.open_zones_max,
                });
            }
        }
        // Room in the write buffer first: an error from here on means the
        // program was not accepted.
        while self.buffer.len() >= self.options.write_buffer_pages as usize {
            self.drain_one(true)?;
        }
        let (block, physical) = self.locate(address);
        let failure_probability = self.options.faults.wear_failure_probability(
            self.options.faults.program_failure_probability_at_endurance,
            self.blocks[block as usize].erase_count,
        );
        if failure_probability > 0.0 && self.rng.random_bool(failure_probability) {
            let record = &mut self.blocks[block as usize];
            record.bad = true;
            let erase_count = record.erase_count;
            let zone_entry = &mut self.zones[address.zone as usize];
            zone_entry.state = ZoneState::ReadOnly;
            zone_entry.durable.condition = durable_condition_of(zone_entry);
            let zone_record = zone_entry.durable;
            bump(&mut self.lifetime.program_failures_injected, 1);
            // Recorded at once, so a grown bad block survives a killed
            // process; marked dirty first, so a failed write is retried at
            // the next commit.
            self.dirty_blocks.insert(block);
            self.dirty_zones.insert(address.zone);
            // Pages first: the record's write pointer may name drained
            // pages that no flush has synced to the host yet.
            // The drained pages' own records before this zone record,
            // which counts those pages too.
            let recorded = self
                .record_drained()
                .and_then(|()| self.sync_host())
                .and_then(|()| {
                    self.backend.write_block_records(block, std::slice::from_ref(&self.blocks[block as usize]))
                })
                .and_then(|()| self.backend.write_zone_record(address.zone, &zone_record));
            if recorded.is_ok() {
                self.dirty_blocks.remove(&block);
                self.dirty_zones.remove(&address.zone);
            }
            return Err(DeviceError::ProgramFailed { address, block, erase_count });
        }
        let bytes =
            if self.backend.stage_page(physical, data, oob)? { None } else { Some(self.buffer.page_bytes(data, oob)) };
        let page_bytes = (data.len() + oob.len()) as u64;
        // Programs reach a block in page order, so its first page starts the
        // retention clock.
        if address.page.is_multiple_of(self.geometry.block_pages) {
            self.blocks[block as usize].programmed_at_ns = self.clock.now_ns();
            self.dirty_blocks.insert(block);
        }
        let programmed_ns = self.clock.program(block, page_bytes);
        self.buffer.push(BufferedPage { physical, zone: address.zone, page: address.page, bytes, programmed_ns });
        let zone = &mut self.zones[address.zone as usize];
        zone.write_pointer += 1;
        zone.state = if zone.write_pointer == capacity_pages { ZoneState::Full } else { ZoneState::Open };
        self.dirty_zones.insert(address.zone);
        bump(&mut self.lifetime.pages_programmed, 1);
        bump(&mut self.lifetime.data_bytes_programmed, data.len() as u64);
        bump(&mut self.lifetime.oob_bytes_programmed, oob.len() as u64);
        Ok(())
    }

    /// The power cut itself. A backend error part way (an image on a full
    /// host disk) does not leave the device half cut: every zone still comes
    /// back at its durable write pointer, and the first error is returned.
    fn cut(&mut self, seed: u64, in_flight: InFlight) -> (PowerCutReport, Result<()>) {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut report = PowerCutReport { seed, ..PowerCutReport::default() };
        let mut first_error: Option<DeviceError> = None;
        let tear_probability = self.options.faults.torn_operation_probability;
        // The erase in flight happened, did not, or was interrupted.
        if let InFlight::Reset { zone } = in_flight {
            if rng.random_bool(self.options.faults.interrupted_erase_probability) {
                self.interrupt_erase(zone, &mut rng);
                report.interrupted_erase = Some(zone);
            } else if rng.random_bool(0.5) {
                // It completed before power went. An injected erase failure
                // has marked its block bad all the same; the host never saw
                // the command complete, so its error value goes nowhere.
                match self.erase_zone_now(zone) {
                    Ok(()) | Err(DeviceError::EraseFailed { .. }) => {}
                    Err(error) => {
                        first_error.get_or_insert(error);
                    }
                }
            }
        }
        // Per zone, a durable prefix of the buffered pages.
        let mut by_zone: BTreeMap<u32, Vec<BufferedPage>> = BTreeMap::new();
        for entry in self.buffer.take_all() {
            by_zone.entry(entry.zone).or_default().push(entry);
        }
        for (zone, pages) in by_zone {
            let durable_before = self.zones[zone as usize].durable.write_pointer;
            let accepted = self.zones[zone as usize].write_pointer;
            let keep = rng.random_range(0..=pages.len());
            let tear = rng.random_bool(tear_probability);
            let fault_seed: u64 = rng.random();
            let mut kept_all = true;
            for entry in &pages[..keep] {
                if let Err(error) = self.make_durable(entry) {
                    first_error.get_or_insert(error);
                    kept_all = false;
                    break;
                }
            }
            if let Some(torn) = pages.get(keep).filter(|_| tear && kept_all) {
                match self.make_durable(torn) {
                    Ok(()) => self.tear(zone, torn, fault_seed, &mut report),
                    Err(error) => {
                        first_error.get_or_insert(error);
                    }
                }
            }
            let zone_entry = &mut self.zones[zone as usize];
            zone_entry.write_pointer = zone_entry.durable.write_pointer;
            report.zones.push(ZoneCut {
                zone,
                durable_before,
                accepted,
                durable_after: zone_entry.durable.write_pointer,
            });
        }
        // NVM: each unpersisted 8-byte word is kept or dropped.
        for word in std::mem::take(&mut self.nvm_dirty_words).words() {
            let range = (word * NVM_WORD_BYTES) as usize..((word + 1) * NVM_WORD_BYTES) as usize;
            let keep = rng.random_bool(0.5);
            let kept = keep && {
                let written = self.backend.write_nvm(range.start as u64, &self.nvm_live[range.clone()]);
                written.map_err(|error| first_error.get_or_insert(error)).is_ok()
            };
            if kept {
                let live = &self.nvm_live[range.clone()];
                self.nvm_durable[range].copy_from_slice(live);
                report.nvm_words_kept += 1;
            } else {
                self.nvm_live[range.clone()].copy_from_slice(&self.nvm_durable[range]);
                report.nvm_words_dropped += 1;
            }
        }
        // Power-up: open zones come back closed, nothing is in flight.
        for (index, zone) in self.zones.iter_mut().enumerate() {
            zone.write_pointer = zone.durable.write_pointer;
            zone.durable.condition = durable_condition_of(zone);
            zone.state = live_state_after_power_up(&zone.durable);
            self.dirty_zones.insert(index as u32);
        }
        self.clock.power_up();
        bump(&mut self.lifetime.power_cuts, 1);
        if let Err(error) = self.commit_metadata() {
            first_error.get_or_insert(error);
        }
        (report, first_error.map_or(Ok(()), Err))
    }

    /// Leaves a just-durable page half programmed, and with MLC pairing,
    /// damages the earlier page that shares its cells.
    fn tear(&mut self, zone: u32, torn: &BufferedPage, seed: u64, report: &mut PowerCutReport) {
        let address = PageAddress::new(zone, torn.page);
        if self.record_fault(torn.physical, PageFault::Torn { seed }) {
            bump(&mut self.lifetime.torn_pages, 1);
            report.torn_pages.push(address);
        }
        let distance = self.options.faults.paired_page_distance;
        if distance > 0 && torn.page % self.geometry.block_pages >= distance {
            let paired = PageAddress::new(zone, torn.page - distance);
            let (_, physical) = self.locate(paired);
            let rate_ppm = (self.options.faults.paired_page_bit_error_rate * 1e6) as u32;
            let paired_seed = seed.rotate_left(17) ^ 0x5041_4952;
            if !self.overlay.contains_key(&physical)
                && self.record_fault(physical, PageFault::Disturbed { seed: paired_seed, rate_ppm })
            {
                bump(&mut self.lifetime.paired_page_corruptions, 1);
                report.paired_page_corruptions.push(paired);
            }
        }
    }

    /// A power cut in the middle of a reset: the zone's good blocks are
    /// half-erased. Its pages keep their write pointer but read back with
    /// bits pulled towards 1, and the blocks carry an added error rate until
    /// erased completely.
    fn interrupt_erase(&mut self, zone: u32, rng: &mut Pcg64Mcg) {
        for offset in 0..self.geometry.zone_blocks {
            let block = self.block_id(zone, offset);
            let record = &mut self.blocks[block as usize];
            if record.bad {
                continue;
            }
            record.erase_count = record.erase_count.saturating_add(1);
            record.interrupted_erase_seed = Some(rng.random());
            self.dirty_blocks.insert(block);
        }
        bump(&mut self.lifetime.interrupted_erases, 1);
        let zone_entry = &mut self.zones[zone as usize];
        zone_entry.write_pointer = zone_entry.durable.write_pointer;
    }

    /// Erases a zone's good blocks, retiring the bad ones, and makes the
    /// reset durable at once (zone resets are not buffered). The new block
    /// and zone records are worked out aside and written (blocks, then the
    /// zone, each carrying the next generation) before anything in memory
    /// changes, so a failed write leaves the device as it was on disk.
    fn erase_zone_now(&mut self, zone: u32) -> Result<()> {
        let first_block = self.block_id(zone, 0) as usize;
        let zone_blocks = first_block..first_block + self.geometry.zone_blocks as usize;
        let generation = self.zones[zone as usize].durable.generation.wrapping_add(1);
        let mut blocks = self.blocks[zone_blocks.clone()].to_vec();
        let mut failed = None;
        let mut erased = Vec::new();
        for (offset, record) in blocks.iter_mut().enumerate() {
            let block = (first_block + offset) as u64;
            // From the erase count before this erase.
            let failure_probability = self.options.faults.wear_failure_probability(
                self.options.faults.erase_failure_probability_at_endurance,
                record.erase_count,
            );
            *record = record.after_reset(generation);
            if record.bad {
                continue;
            }
            erased.push(block);
            if failure_probability > 0.0 && self.rng.random_bool(failure_probability) {
                record.bad = true;
                record.excluded = true;
                failed.get_or_insert((block, record.erase_count));
            }
        }
        let capacity_pages = blocks.iter().filter(|record| !record.excluded).count() as u32 * self.geometry.block_pages;
        let condition = if capacity_pages == 0 { DurableCondition::Offline } else { DurableCondition::Empty };
        let zone_record = ZoneRecord { condition, write_pointer: 0, capacity_pages, generation };
        self.backend.write_block_records(first_block as u64, &blocks)?;
        // From here the reset is durable: on open, blocks a generation ahead
        // of their zone record mean a completed reset.
        self.blocks[zone_blocks.clone()].copy_from_slice(&blocks);
        for block in zone_blocks {
            self.dirty_blocks.remove(&(block as u64));
        }
        bump(&mut self.lifetime.erases, erased.len() as u64);
        bump(&mut self.lifetime.zone_resets, 1);
        if failed.is_some() {
            bump(&mut self.lifetime.erase_failures_injected, 1);
        }
        self.clock.erase(erased.into_iter());
        let zone_pages = self.geometry.zone_pages();
        let first_page = u64::from(zone) * zone_pages;
        let stale: Vec<u64> =
            self.overlay.range(first_page..first_page + zone_pages).map(|(physical, _)| *physical).collect();
        for physical in stale {
            // Left in the persisted overlay until its next write; their old
            // generation drops them on open.
            self.overlay.remove(&physical);
            self.overlay_dirty = true;
        }
        let block_map = block_map_of(&self.geometry, &self.blocks, zone);
        let zone_entry = &mut self.zones[zone as usize];
        zone_entry.block_map = block_map;
        zone_entry.write_pointer = 0;
        zone_entry.finished = false;
        zone_entry.state = if capacity_pages == 0 { ZoneState::Offline } else { ZoneState::Empty };
        zone_entry.durable = zone_record;
        self.dirty_zones.insert(zone);
        // The block records reach the host's disk before the zone record:
        // a zone record a generation ahead of its blocks is an image open
        // refuses, and the host writes back in any order. After the
        // memory is the reset's, so a failed sync leaves the zone record
        // dirty for the next commit, as a failed write does.
        self.sync_host()?;
        // The backend keeps the old slot bytes: slots at or past the write
        // pointer read as erased whatever they hold.
        self.backend.write_zone_record(zone, &zone_record)?;
        self.dirty_zones.remove(&zone);
        self.sync_host()?;
        if let Some((block, erase_count)) = failed {
            return Err(DeviceError::EraseFailed { zone, block, erase_count, capacity_pages });
        }
        Ok(())
    }
}

/// The offsets (within the zone) of the blocks that hold a zone's pages,
/// in order: those not excluded.
pub(crate) fn block_map_of(geometry: &Geometry, blocks: &[BlockRecord], zone: u32) -> Vec<u32> {
    let first = u64::from(zone) * u64::from(geometry.zone_blocks);
    (0..geometry.zone_blocks).filter(|&offset| !blocks[(first + u64::from(offset)) as usize].excluded).collect()
}

fn durable_condition_of(zone: &Zone) -> DurableCondition {
    match zone.state {
        ZoneState::ReadOnly => DurableCondition::ReadOnly,
        ZoneState::Offline => DurableCondition::Offline,
        _ if zone.finished => DurableCondition::Full,
        _ if zone.durable.write_pointer == 0 => DurableCondition::Empty,
        _ if zone.durable.write_pointer == zone.durable.capacity_pages => DurableCondition::Full,
        _ => DurableCondition::Closed,
    }
}

fn live_state_after_power_up(record: &ZoneRecord) -> ZoneState {
    match record.condition {
        DurableCondition::Empty => ZoneState::Empty,
        DurableCondition::Closed => ZoneState::Closed,
        DurableCondition::Full => ZoneState::Full,
        DurableCondition::ReadOnly => ZoneState::ReadOnly,
        DurableCondition::Offline => ZoneState::Offline,
    }
}

impl<B: Backend> FlashDevice for FlashEmulator<B> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn die_count(&self) -> u32 {
        self.clock.die_count()
    }

    fn die_of(&self, address: PageAddress) -> Option<u32> {
        let zone = self.zones.get(address.zone as usize)?;
        let block_offset = *zone.block_map.get((address.page / self.geometry.block_pages) as usize)?;
        Some(self.clock.die_of_block(self.block_id(address.zone, block_offset)))
    }

    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        Self::check_buffer("page data", self.geometry.page_size_bytes, data.len())?;
        Self::check_buffer("page OOB", self.geometry.oob_size_bytes, oob.len())?;
        self.read_common(address, Some(data), oob)
    }

    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState> {
        Self::check_buffer("page OOB", self.geometry.oob_size_bytes, oob.len())?;
        self.read_common(address, None, oob)
    }

    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        self.check_powered("program")?;
        self.geometry.check_address(address)?;
        Self::check_buffer("page data", self.geometry.page_size_bytes, data.len())?;
        Self::check_buffer("page OOB", self.geometry.oob_size_bytes, oob.len())?;
        let cut_now = self.count_operation();
        let result = self.accept_program(address, data, oob);
        if cut_now {
            return Err(self.fire_scheduled_cut("program", InFlight::Nothing));
        }
        result
    }

    fn reset_zone(&mut self, zone: u32) -> Result<()> {
        self.check_powered("reset")?;
        self.geometry.check_zone(zone)?;
        let cut_now = self.count_operation();
        let entry = &self.zones[zone as usize];
        if entry.state == ZoneState::Offline {
            return Err(self.refuse_in_state(zone, "reset", cut_now));
        }
        // Buffered pages of the zone are moot: it is being erased.
        self.buffer.discard_zone(zone);
        let entry = &mut self.zones[zone as usize];
        entry.write_pointer = entry.durable.write_pointer;
        if cut_now {
            return Err(self.fire_scheduled_cut("reset", InFlight::Reset { zone }));
        }
        self.erase_zone_now(zone)
    }

    fn finish_zone(&mut self, zone: u32) -> Result<()> {
        self.check_powered("finish")?;
        self.geometry.check_zone(zone)?;
        let cut_now = self.count_operation();
        let entry = &self.zones[zone as usize];
        if matches!(entry.state, ZoneState::ReadOnly | ZoneState::Offline) {
            return Err(self.refuse_in_state(zone, "finish", cut_now));
        }
        // A cut during the finish: it took effect or it did not.
        if cut_now && self.coin_for_interrupted_operation() {
            return Err(self.fire_scheduled_cut("finish", InFlight::Nothing));
        }
        let entry = &mut self.zones[zone as usize];
        entry.state = ZoneState::Full;
        // Full whatever a later cut drops: a finish is durable on return.
        entry.finished = true;
        entry.durable.condition = durable_condition_of(entry);
        let record = entry.durable;
        self.dirty_zones.insert(zone);
        // Pages first, as at a flush: the record's write pointer may name
        // drained pages the host does not have yet.
        // The records of pages drained on their own first: the zone record
        // counts them, and so must come after their blocks' records.
        let written = self
            .record_drained()
            .and_then(|()| self.sync_host())
            .and_then(|()| self.backend.write_zone_record(zone, &record));
        if written.is_ok() {
            self.dirty_zones.remove(&zone);
        }
        if cut_now {
            return Err(self.fire_scheduled_cut("finish", InFlight::Nothing));
        }
        written?;
        self.sync_host()
    }

    fn retire_block(&mut self, address: PageAddress) -> Result<bool> {
        self.check_powered("retire a block")?;
        self.geometry.check_address(address)?;
        let (block, _) = self.locate(address);
        let record = &mut self.blocks[block as usize];
        if !record.bad {
            record.bad = true;
            self.dirty_blocks.insert(block);
            let recorded = self.backend.write_block_records(block, std::slice::from_ref(&self.blocks[block as usize]));
            if recorded.is_ok() {
                self.dirty_blocks.remove(&block);
            }
            recorded?;
        }
        Ok(true)
    }

    fn report_zone(&self, zone: u32) -> Result<ZoneReport> {
        self.geometry.check_zone(zone)?;
        let entry = &self.zones[zone as usize];
        let first = u64::from(zone) * u64::from(self.geometry.zone_blocks);
        let blocks = &self.blocks[first as usize..(first + u64::from(self.geometry.zone_blocks)) as usize];
        // One pass over the zone's blocks: the engine asks for a report at
        // every page it programs into a zone with parity.
        let (erase_count_max, bad_blocks) = blocks
            .iter()
            .fold((0, 0u32), |(erases, bad), block| (erases.max(block.erase_count), bad + u32::from(block.bad)));
        Ok(ZoneReport {
            zone,
            state: entry.state,
            write_pointer: entry.write_pointer,
            capacity_pages: entry.durable.capacity_pages,
            erase_count_max,
            bad_blocks,
        })
    }

    fn report_zones(&self) -> Vec<ZoneReport> {
        (0..self.geometry.zone_count).map(|zone| self.report_zone(zone).expect("zone in range")).collect()
    }

    fn flush(&mut self) -> Result<()> {
        let nothing_since = self.buffer.len() == 0
            && self.dirty_zones.is_empty()
            && self.dirty_blocks.is_empty()
            && !self.overlay_dirty;
        if self.owes_settle && nothing_since && self.backend.unsettled() {
            // The flush that only ordered queued everything up to here, its
            // records' sync last: waiting for it is all this flush owes.
            // (Its summary's counters lag by this flush, as any summary
            // does until the next.)
            self.check_powered("flush")?;
            if self.count_operation() {
                return Err(self.fire_scheduled_cut("flush", InFlight::Nothing));
            }
            self.clock.flush();
            bump(&mut self.lifetime.flushes, 1);
        } else {
            self.flush_in_order()?;
        }
        // Durable: every write and sync the backend queued has run.
        self.backend.settle()?;
        self.owes_settle = false;
        Ok(())
    }

    fn flush_ordered(&mut self) -> Result<()> {
        self.flush_in_order()?;
        self.backend.start();
        self.owes_settle = true;
        Ok(())
    }

    fn flush_owed(&self) -> bool {
        self.owes_settle && self.backend.unsettled()
    }

    fn nvm_read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.check_powered("NVM read")?;
        self.geometry.check_nvm_range(offset, buffer.len() as u64)?;
        buffer.copy_from_slice(&self.nvm_live[offset as usize..offset as usize + buffer.len()]);
        self.clock.nvm_access(buffer.len() as u64);
        Ok(())
    }

    fn nvm_write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_powered("NVM write")?;
        self.geometry.check_nvm_range(offset, data.len() as u64)?;
        let cut_now = self.count_operation();
        self.nvm_live[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        if !data.is_empty() {
            let end = offset + data.len() as u64;
            let words = self.geometry.nvm_size_bytes / NVM_WORD_BYTES;
            self.nvm_dirty_words.insert(offset / NVM_WORD_BYTES, end.div_ceil(NVM_WORD_BYTES), words);
            if self.nvm_word_writes.is_empty() {
                self.nvm_word_writes = vec![0; (self.geometry.nvm_size_bytes / NVM_WORD_BYTES) as usize];
            }
            for word in offset / NVM_WORD_BYTES..end.div_ceil(NVM_WORD_BYTES) {
                let writes = &mut self.nvm_word_writes[word as usize];
                *writes = writes.saturating_add(1);
            }
        }
        bump(&mut self.lifetime.nvm_bytes_written, data.len() as u64);
        self.clock.nvm_access(data.len() as u64);
        if cut_now {
            return Err(self.fire_scheduled_cut("NVM write", InFlight::Nothing));
        }
        Ok(())
    }

    fn nvm_persist(&mut self, offset: u64, length: u64) -> Result<()> {
        self.check_powered("NVM persist")?;
        self.geometry.check_nvm_range(offset, length)?;
        if self.count_operation() {
            return Err(self.fire_scheduled_cut("NVM persist", InFlight::Nothing));
        }
        if length > 0 {
            // Persist contiguous runs of dirty words with one backend write.
            let (first, end) = (offset / NVM_WORD_BYTES, (offset + length).div_ceil(NVM_WORD_BYTES));
            for (start, end) in self.nvm_dirty_words.runs(first, end) {
                let range = (start * NVM_WORD_BYTES) as usize..(end * NVM_WORD_BYTES) as usize;
                self.backend.write_nvm(range.start as u64, &self.nvm_live[range.clone()])?;
                self.nvm_durable[range.clone()].copy_from_slice(&self.nvm_live[range]);
                self.nvm_dirty_words.remove(start, end);
            }
        }
        bump(&mut self.lifetime.nvm_persists, 1);
        self.clock.nvm_persist();
        self.sync_host()?;
        // A persist is a promise, as a flush is.
        self.backend.settle()
    }

    fn counters(&self) -> Counters {
        self.lifetime_counters().since(&self.baseline)
    }

    fn reset_counters(&mut self) {
        self.baseline = self.lifetime_counters();
    }

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn advance_time(&mut self, duration_ns: u64) {
        self.clock.advance(duration_ns);
    }
}

/// A set of NVM word numbers, one bit each: the words written and not yet
/// persisted. A bit a word, not a tree node: an NVM write marks hundreds of
/// words at once, and a persist clears runs of them.
#[derive(Clone, Debug, Default)]
struct WordSet {
    bits: Vec<u64>,
    count: usize,
}

impl WordSet {
    /// Marks words `first..end` of a region of `words_total` words.
    fn insert(&mut self, first: u64, end: u64, words_total: u64) {
        if self.bits.is_empty() {
            self.bits = vec![0; words_total.div_ceil(64) as usize];
        }
        for word in first..end {
            let (index, bit) = ((word / 64) as usize, word % 64);
            if self.bits[index] >> bit & 1 == 0 {
                self.bits[index] |= 1 << bit;
                self.count += 1;
            }
        }
    }

    /// Unmarks words `first..end`.
    fn remove(&mut self, first: u64, end: u64) {
        for word in first..end {
            let (index, bit) = ((word / 64) as usize, word % 64);
            if self.bits.get(index).is_some_and(|bits| bits >> bit & 1 == 1) {
                self.bits[index] &= !(1 << bit);
                self.count -= 1;
            }
        }
    }

    /// The runs of marked words within `first..end`, in order.
    fn runs(&self, first: u64, end: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        if self.count == 0 {
            return runs;
        }
        let end = end.min(self.bits.len() as u64 * 64);
        let mut word = first;
        while word < end {
            let bits = self.bits[(word / 64) as usize] >> (word % 64);
            if bits == 0 {
                word = (word / 64 + 1) * 64;
                continue;
            }
            word += u64::from(bits.trailing_zeros());
            if word >= end {
                break;
            }
            match runs.last_mut() {
                Some(run) if run.1 == word => run.1 += 1,
                _ => runs.push((word, word + 1)),
            }
            word += 1;
        }
        runs
    }

    /// Every marked word, in order.
    fn words(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs(0, u64::MAX).into_iter().flat_map(|(start, end)| start..end)
    }
}

#[cfg(test)]
mod word_set_tests {
    use super::WordSet;

    #[test]
    fn runs_are_the_marked_words_in_order_and_removal_clears_them() {
        let mut set = WordSet::default();
        set.insert(3, 5, 1000);
        set.insert(60, 70, 1000);
        set.insert(64, 66, 1000);
        set.insert(999, 1000, 1000);
        assert_eq!(set.count, 2 + 10 + 1);
        assert_eq!(set.runs(0, 1000), vec![(3, 5), (60, 70), (999, 1000)]);
        assert_eq!(set.runs(4, 62), vec![(4, 5), (60, 62)]);
        set.remove(61, 65);
        assert_eq!(set.runs(0, 1000), vec![(3, 5), (60, 61), (65, 70), (999, 1000)]);
        assert_eq!(set.words().collect::<Vec<_>>(), [3, 4, 60, 65, 66, 67, 68, 69, 999]);
        set.remove(0, 1000);
        assert_eq!((set.count, set.runs(0, 1000)), (0, vec![]));
    }
}

#[cfg(test)]
mod write_buffer_tests {
    use super::{BufferedPage, WriteBuffer, FREE_PAGE_BUFFERS_MAX};

    fn page(physical: u64, bytes: Box<[u8]>) -> BufferedPage {
        BufferedPage { physical, zone: 0, page: physical as u32, bytes: Some(bytes), programmed_ns: 0 }
    }

    #[test]
    fn a_recycled_page_buffer_holds_the_next_page_only_and_free_buffers_are_bounded() {
        let mut buffer = WriteBuffer::new();
        let first = buffer.page_bytes(&[7u8; 32], &[8u8; 8]);
        buffer.push(page(0, first));
        let drained = buffer.pop_front().expect("buffered");
        let drained = drained.bytes.expect("buffered bytes");
        let address = drained.as_ptr();
        buffer.recycle(drained);
        let second = buffer.page_bytes(&[1u8; 32], &[2u8; 8]);
        assert_eq!(second.as_ptr(), address, "the free buffer was taken");
        assert!(second[..32].iter().all(|&byte| byte == 1) && second[32..].iter().all(|&byte| byte == 2));
        // A free buffer of another size is not used for a page.
        buffer.recycle(second);
        let other = buffer.page_bytes(&[3u8; 16], &[4u8; 4]);
        assert_eq!(other.len(), 20);
        assert!(other[..16].iter().all(|&byte| byte == 3) && other[16..].iter().all(|&byte| byte == 4));
        // At most the bound is kept, and a copy keeps none.
        for _ in 0..FREE_PAGE_BUFFERS_MAX + 10 {
            buffer.recycle(vec![0u8; 20].into_boxed_slice());
        }
        assert_eq!(buffer.free_page_buffers.len(), FREE_PAGE_BUFFERS_MAX);
        buffer.push(page(1, other));
        let copy = buffer.clone();
        assert_eq!((copy.len(), copy.free_page_buffers.len()), (1, 0));
    }
}
