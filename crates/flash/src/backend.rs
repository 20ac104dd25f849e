//! Backends hold the *durable* state of the device: pages that have left
//! the write buffer, NVM words that were persisted, zone and block records,
//! the fault overlay and the lifetime counters. The volatile part (the write
//! buffer, unpersisted NVM words, open zones) lives in
//! [`crate::FlashEmulator`], which is the same for every backend.
//!
//! Pages are addressed by their physical index:
//! `(zone * zone_blocks + block_in_zone) * block_pages + page_in_block`.

use std::collections::BTreeMap;

use crate::counters::Counters;
use crate::error::Result;
use crate::geometry::Geometry;

/// A zone's state as it survives power loss. An open zone comes back closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurableCondition {
    Empty,
    Closed,
    Full,
    ReadOnly,
    Offline,
}

impl DurableCondition {
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            DurableCondition::Empty => 0,
            DurableCondition::Closed => 1,
            DurableCondition::Full => 2,
            DurableCondition::ReadOnly => 3,
            DurableCondition::Offline => 4,
        }
    }

    pub(crate) fn from_byte(byte: u8) -> Option<DurableCondition> {
        Some(match byte {
            0 => DurableCondition::Empty,
            1 => DurableCondition::Closed,
            2 => DurableCondition::Full,
            3 => DurableCondition::ReadOnly,
            4 => DurableCondition::Offline,
            _ => return None,
        })
    }
}

/// The durable part of a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneRecord {
    pub condition: DurableCondition,
    /// Pages below this are durable.
    pub write_pointer: u32,
    /// Pages the zone holds: its good blocks (at its last reset) times
    /// `block_pages`.
    pub capacity_pages: u32,
    /// How many times the zone has been reset. A reset writes its blocks'
    /// records (with the new generation) before its zone record, and fault
    /// overlay entries carry the generation they belong to, so a reset cut
    /// between two writes is recognised and stale faults are dropped.
    pub generation: u32,
}

/// Wear and health of one erase block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockRecord {
    pub erase_count: u32,
    /// Reads since the last erase, for read disturb (saturating).
    pub reads_since_erase: u32,
    /// Simulated time of the first program since the last erase, for
    /// retention age.
    pub programmed_at_ns: u64,
    /// Set when a power cut interrupted this block's erase: its pages read
    /// back partially erased and it has an added bit error rate until it is
    /// erased completely. The seed reproduces the garbage.
    pub interrupted_erase_seed: Option<u64>,
    /// The block has failed (factory, program or erase) and is retired at
    /// the zone's next reset.
    pub bad: bool,
    /// The block is not part of its zone's current page numbering (it was
    /// bad at the zone's last reset).
    pub excluded: bool,
    /// The generation of the zone reset (or creation) that last wrote this
    /// record as part of its zone (see [`ZoneRecord::generation`]).
    pub zone_generation: u32,
}

impl BlockRecord {
    /// The record a zone reset of `generation` leaves: a bad block is
    /// excluded from the zone's numbering and not erased; a good one is
    /// erased (one more cycle, read and retention counts cleared). The
    /// device's reset and an image open completing a reset cut short both
    /// take it from here.
    pub fn after_reset(&self, generation: u32) -> BlockRecord {
        let mut record = BlockRecord { zone_generation: generation, ..*self };
        if record.bad {
            record.excluded = true;
        } else {
            record.erase_count = record.erase_count.saturating_add(1);
            record.reads_since_erase = 0;
            record.programmed_at_ns = 0;
            record.interrupted_erase_seed = None;
        }
        record
    }
}

/// What the medium really holds at a page, where it differs from what was
/// programmed there. The pristine data stays in the backend untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageFault {
    /// A power cut interrupted the program: each bit that should have gone
    /// from 1 to 0 did so with probability one half.
    Torn { seed: u64 },
    /// The program went to another page: this one still reads erased.
    LostWrite,
    /// The page was disturbed (paired-page corruption): bits flipped at
    /// `rate_ppm` parts per million.
    Disturbed { seed: u64, rate_ppm: u32 },
    /// The medium holds exactly these bytes (data then OOB): the result of a
    /// misdirected write over-programming this page.
    Stored { media: Box<[u8]> },
    /// The cells no longer sense: every read of the page fails (a whole-page
    /// read failure that a retry does not cure).
    Unreadable,
}

/// The fault overlay: physical page index to what the medium really holds.
pub type Overlay = BTreeMap<u64, PageFault>;

/// One persisted overlay entry: the fault and the generation of its zone
/// when it was recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlayRecord {
    pub physical: u64,
    pub generation: u32,
    pub fault: PageFault,
}

/// Most overlay entries of any kind; a fault past this is counted in
/// `faults_suppressed` instead of being recorded.
pub const OVERLAY_ENTRIES_MAX: usize = 16_384;
/// Most overlay entries that carry a whole page of bytes.
pub const OVERLAY_STORED_PAGES_MAX: usize = 64;
const _: () = assert!(OVERLAY_STORED_PAGES_MAX <= OVERLAY_ENTRIES_MAX);

/// Everything a backend holds durably, as loaded when a device opens.
#[derive(Clone, Debug)]
pub struct DurableState {
    pub zones: Vec<ZoneRecord>,
    pub blocks: Vec<BlockRecord>,
    pub overlay: Overlay,
    pub counters: Counters,
    pub clock_ns: u64,
    pub nvm: Vec<u8>,
}

/// Where durable state goes. Methods are called in an order that keeps the
/// backend consistent if the process dies between any two of them: pages
/// before the zone records that make them durable, a zone record with a
/// write pointer of zero before any page of a freshly reset zone.
pub trait Backend {
    /// Reads the pristine data and OOB of a durable page slot. Only slots
    /// written since their zone's last reset may be asked for: what any
    /// other holds is unspecified (the memory backend's are zeros or an
    /// earlier pass's bytes, not 0xFF).
    fn read_page(&mut self, physical: u64, data: &mut [u8], oob: &mut [u8]) -> Result<()>;
    /// Reads the pristine OOB of a durable page slot.
    fn read_oob(&mut self, physical: u64, oob: &mut [u8]) -> Result<()>;
    /// Stores a page slot durably.
    fn write_page(&mut self, physical: u64, data: &[u8], oob: &[u8]) -> Result<()>;
    /// Takes a page's bytes at its program, before it is durable, where the
    /// backend can keep them in the slot itself: true if it did. The
    /// emulator then keeps no copy in its write buffer, reads the buffered
    /// page from the slot, and does not write it again when it becomes
    /// durable. Safe only where a slot at or past the durable write pointer
    /// is never read as durable: a power cut that drops the page lowers
    /// the pointer below it, and what the slot holds is then unspecified,
    /// as after any reset. A backend whose slots persist (an image) must
    /// not: a killed process would leave bytes the records do not name. A
    /// wrapper that intercepts `write_page` (to fail it, say) must not
    /// forward this either: a staged page never reaches `write_page`.
    fn stage_page(&mut self, _physical: u64, _data: &[u8], _oob: &[u8]) -> Result<bool> {
        Ok(false)
    }
    /// Stores persisted NVM bytes.
    fn write_nvm(&mut self, offset: u64, bytes: &[u8]) -> Result<()>;
    fn write_zone_record(&mut self, zone: u32, record: &ZoneRecord) -> Result<()>;
    /// Records of consecutive blocks starting at `first_block`, in one
    /// write where the backend can (a zone's blocks change together).
    fn write_block_records(&mut self, first_block: u64, records: &[BlockRecord]) -> Result<()>;
    /// The whole overlay; `generation_of` gives the current generation of
    /// the zone holding a physical page.
    fn write_overlay(&mut self, overlay: &Overlay, generation_of: &dyn Fn(u64) -> u32) -> Result<()>;
    /// Lifetime counters and the simulated clock.
    fn write_summary(&mut self, counters: &Counters, clock_ns: u64) -> Result<()>;
    /// Makes everything written so far survive a host crash before
    /// anything written after it does, where the backend can (the memory
    /// backend cannot and need not). It may return before it has: a
    /// backend that runs its writes and syncs in order off the caller's
    /// thread (the image's) only queues it, and [`Backend::settle`] waits.
    fn sync(&mut self) -> Result<()>;
    /// Returns once every write and sync asked for so far has been done:
    /// what a killed process keeps then is all of it. A backend that does
    /// each as it is asked has nothing to wait for.
    fn settle(&mut self) -> Result<()> {
        Ok(())
    }
    /// Lets what is queued start without waiting for it (after a flush
    /// that only orders).
    fn start(&mut self) {}
    /// Whether a write or sync asked for has not been done yet (what
    /// [`Backend::settle`] would wait for).
    fn unsettled(&self) -> bool {
        false
    }
    /// Whether open finds the pages a zone record counts that a host crash
    /// lost (and lowers the write pointer to them), so a record need not
    /// wait for a sync of its pages: a flush is then one sync, not two.
    fn finds_lost_pages_at_open(&self) -> bool {
        false
    }
}

/// Pages in host memory, allocated a zone at a time on first use, so an
/// unused device costs almost nothing. A reset keeps the allocation: slots
/// at or past the write pointer are never read, and reusing the memory
/// spares a page fault per page on the zone's next pass.
#[derive(Clone)]
pub struct MemoryBackend {
    geometry: Geometry,
    slot_bytes: usize,
    zone_slots: Vec<Option<Box<[u8]>>>,
}

impl MemoryBackend {
    pub fn new(geometry: Geometry) -> MemoryBackend {
        MemoryBackend {
            geometry,
            slot_bytes: (geometry.page_size_bytes + geometry.oob_size_bytes) as usize,
            zone_slots: (0..geometry.zone_count).map(|_| None).collect(),
        }
    }

    /// Allocates every zone's slots and touches each page of them now, so
    /// that the kernel's page fault and zeroing of a page, which the
    /// emulator otherwise pays at the first write of each slot, fall here
    /// rather than in what runs after (a real device's flash is there
    /// before it is written; its host pays no fault for it).
    pub fn prefault(&mut self) {
        const TOUCH_STRIDE_BYTES: usize = 4096;
        let zone_bytes = self.geometry.zone_pages() as usize * self.slot_bytes;
        for slots in self.zone_slots.iter_mut() {
            let slots = slots.get_or_insert_with(|| zone_memory(zone_bytes));
            for offset in (0..slots.len()).step_by(TOUCH_STRIDE_BYTES) {
                // Volatile: a store of the zero the allocator already gave
                // may otherwise be dropped, and with it the fault.
                // SAFETY: `offset` is within the slice; u8 has no invalid
                // values and no alignment.
                unsafe { std::ptr::write_volatile(slots.as_mut_ptr().add(offset), 0) };
            }
        }
    }

    fn locate(&self, physical: u64) -> (usize, usize) {
        let zone_pages = self.geometry.zone_pages();
        let zone = (physical / zone_pages) as usize;
        let offset = (physical % zone_pages) as usize * self.slot_bytes;
        (zone, offset)
    }
}

/// A zone's slots, allocated zeroed: the kernel hands out zero pages as
/// they are first written, so nothing fills them up front. (An erased
/// 0xFF fill touched all 4 MiB of a zone at its first program; without it
/// fileserver in-process runs about 10% faster.) Slots are never read at
/// or past the write pointer, so what an unwritten one holds is never
/// seen. (Marking the memory for huge pages was tried and was slower.)
fn zone_memory(bytes: usize) -> Box<[u8]> {
    vec![0u8; bytes].into_boxed_slice()
}

impl Backend for MemoryBackend {
    fn read_page(&mut self, physical: u64, data: &mut [u8], oob: &mut [u8]) -> Result<()> {
        let (zone, offset) = self.locate(physical);
        match &self.zone_slots[zone] {
            Some(slots) => {
                let page = data.len();
                data.copy_from_slice(&slots[offset..offset + page]);
                oob.copy_from_slice(&slots[offset + page..offset + page + oob.len()]);
            }
            None => {
                data.fill(0xFF);
                oob.fill(0xFF);
            }
        }
        Ok(())
    }

    fn read_oob(&mut self, physical: u64, oob: &mut [u8]) -> Result<()> {
        let (zone, offset) = self.locate(physical);
        let page = self.geometry.page_size_bytes as usize;
        match &self.zone_slots[zone] {
            Some(slots) => oob.copy_from_slice(&slots[offset + page..offset + page + oob.len()]),
            None => oob.fill(0xFF),
        }
        Ok(())
    }

    fn write_page(&mut self, physical: u64, data: &[u8], oob: &[u8]) -> Result<()> {
        let (zone, offset) = self.locate(physical);
        let zone_bytes = self.geometry.zone_pages() as usize * self.slot_bytes;
        let slots = self.zone_slots[zone].get_or_insert_with(|| zone_memory(zone_bytes));
        slots[offset..offset + data.len()].copy_from_slice(data);
        slots[offset + data.len()..offset + data.len() + oob.len()].copy_from_slice(oob);
        Ok(())
    }

    fn stage_page(&mut self, physical: u64, data: &[u8], oob: &[u8]) -> Result<bool> {
        // One copy a program: into the slot, where the write buffer's own
        // copy and a second one at the drain were two (about 5% of
        // fileserver's host time in process).
        self.write_page(physical, data, oob)?;
        Ok(true)
    }

    fn write_nvm(&mut self, _offset: u64, _bytes: &[u8]) -> Result<()> {
        // The emulator keeps the durable NVM image itself; memory has no
        // second copy to update.
        Ok(())
    }

    fn write_zone_record(&mut self, _zone: u32, _record: &ZoneRecord) -> Result<()> {
        Ok(())
    }

    fn write_block_records(&mut self, _first_block: u64, _records: &[BlockRecord]) -> Result<()> {
        Ok(())
    }

    fn write_overlay(&mut self, _overlay: &Overlay, _generation_of: &dyn Fn(u64) -> u32) -> Result<()> {
        Ok(())
    }

    fn write_summary(&mut self, _counters: &Counters, _clock_ns: u64) -> Result<()> {
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
}
