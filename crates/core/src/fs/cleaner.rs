//! The cleaner. It picks a victim zone by cost-benefit (Rosenblum and
//! Ousterhout's LFS: free space gained times age, over the cost of reading
//! the zone and writing what is live), reads every page, and decides
//! liveness from each page's own inverted index against the current tree:
//! a data block or chunk is live when its file's index points at it, a node
//! when what locates it (the map, an entry, a parent index page) does. Live
//! data moves to the cold data head (hot and cold apart); live nodes are
//! marked dirty and move through the ordinary write-back. A checkpoint then
//! records the moves; only then is the zone, which nothing references any
//! more, released, declared and reset.
//!
//! The segment usage table is the safety net: a zone is released only
//! when its valid bytes reach zero, and the checker holds those counts to
//! what the tree references. A liveness mistake can leave a zone
//! uncleaned, never free a page still in use.
//!
//! Two victim choices. The background cleaner (an idle file system)
//! chooses by cost-benefit, which leaves young zones to empty themselves.
//! The foreground cleaner, run because free zones are short, chooses the
//! emptiest zone (greedy, as F2FS's foreground cleaning does): it must give
//! back the most space for what it moves now, and an old, nearly full zone
//! that cost-benefit prefers can give back less than the checkpoint that
//! follows the move consumes.
//!
//! The foreground cleaner works in steps, not whole zones (issue 19: a
//! whole zone inside one write was 855 ms of device time at 90% full).
//! Below the step water mark, each operation reads a bounded stretch of
//! its victim and moves what is live there, so the cost of cleaning is
//! spread over the operations that make it necessary. The moves are safe
//! across operations for the reason a whole zone's are: each one points
//! its file at the new copy, and nothing frees the victim before a
//! checkpoint finds it empty. A victim every page of which was read waits
//! for a checkpoint, which the next operation takes when space is short.
//! Only when the steps fell behind (the low water mark) does an operation
//! clean whole zones.
//!
//! Static wear levelling: when the spread of erase counts passes
//! [`WEAR_SPREAD_MAX`], the least worn zone holding data is cleaned
//! whatever its score, so its cold data moves and the zone goes back into
//! allocation, which takes the least worn free zone first.

use std::collections::BTreeMap;

use flintfs_flash::{FlashDevice, PageAddress, ZoneState};
use flintfs_format::{
    decode_inode_pack, is_inode_pack, parse_packed, ChunkKind, Compression, InvertedIndex, Node, PackedPage, PageKind,
    Pointer, ZoneRole, CHUNK_HEADER_BYTES, CHUNK_UNIT_BYTES, FIRST_DYNAMIC_ZONE,
};

use super::nodes::NodeKey;
use super::Fs;
use crate::allocator::PageMeta;
use crate::error::{errno, Result};

/// Free zones below which operations clean first (in the foreground), on
/// top of the zones the next checkpoint needs for what is buffered.
pub const CLEAN_LOW_WATER_ZONES: usize = 3;
/// Free zones below which an idle file system cleans (in the background),
/// on top of the zones the next checkpoint needs for what is buffered.
pub const CLEAN_IDLE_WATER_ZONES: usize = 6;
const _: () = assert!(CLEAN_LOW_WATER_ZONES < CLEAN_IDLE_WATER_ZONES);

/// The state [`Fs::zone_scan`]'s hint was taken in: when any of it moves,
/// the free zones or the wear spread may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ZoneScanKey {
    checkpoint_number: u64,
    unindexed_used: usize,
    undeclared_zones_taken: u64,
    erases: u64,
    zone_resets: u64,
    failures: u64,
    zones_stuck: usize,
    /// The protection layer's own count of resets, which no counter reset
    /// clears.
    resets_issued: u64,
    pub(crate) reserve_allowed: bool,
}

/// How the cleaner chooses a victim when it cleans for space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VictimChoice {
    /// Free space gained times age, over the cost (LFS): in the background.
    CostBenefit,
    /// The fewest valid bytes: in the foreground, when space is short.
    Greedy,
}
/// Zones one operation cleans at most before it gives up with ENOSPC: the
/// bound on a foreground stall. Also the batch the foreground cleaner
/// takes when free zones run low: every batch ends with a checkpoint,
/// which writes every dirty node, and moving an inode dirties the
/// directory page whose entry points at it, so a batch of one zone can
/// write back more than the zone gives (a million small files over a
/// hundred directories did, until ENOSPC at 5% full).
pub const CLEAN_ZONES_PER_OPERATION_MAX: usize = 4;
/// Dynamic zones of the device for each zone of runway the cleaning
/// steps start with above the low water mark: a dense stretch of a victim
/// gives back little for what it moves, and the steps must outlast it
/// before whole zones have to be cleaned. Each zone of runway also keeps
/// a zone free that would otherwise hold garbage, so victims are denser
/// and the cleaner moves more: at 90% full on 128 zones, a runway of 7
/// zones programmed 26% more pages than one of 5.
pub const CLEAN_STEP_RUNWAY_DYNAMIC_ZONES: usize = 32;
/// The least runway, however small the device: with 2, 36 zones of 256
/// pages fell behind right after a dense fill (the test
/// `the_foreground_cleaner_works_in_bounded_steps`).
pub const CLEAN_STEP_RUNWAY_ZONES_MIN: usize = 3;
/// Pages one foreground cleaning step gives back (pages read less pages
/// moved) while free zones are one short of the step water mark; `n`
/// short, n² times this, so steps that fall behind catch up fast. About
/// what a write and its fsync consume (a data page and a log page), so
/// steps keep pace with the operations that take them. What that costs
/// depends on the victim: at two thirds live, 4 pages moved, which go to
/// the cold data head one erase block (one die) at a time, so the fsync
/// that follows waits for them in turn: 2.4 ms at the default 600 us
/// program. A denser victim gives back less than this in the moves a
/// step may make ([`CLEAN_MOVES_PER_STEP_MAX`], however short free zones
/// are). Small steps, taken by most operations, keep the latency even:
/// what cleaning costs is spread, not paid by a few.
pub const CLEAN_GAIN_PER_STEP_PAGES: u64 = 2;
/// Victim pages one step reads at most: the host waits for each read, 40
/// are about 2.4 ms at the default 50 us read and 400 MB/s channel.
pub const CLEAN_READS_PER_STEP_MAX: u32 = 40;
/// Most pages a step moves, however far behind: 3 ms of die time. A write
/// and its fsync are two operations, two steps, whose moves queue on the
/// cold head's die: 6 ms, under the 10 ms p99.9 of issue 19. (At 24 moves
/// a step, near_full_90's p99 was 16.3 ms of device time, set by writes
/// whose two steps moved 48 pages; at 5, 6.1 ms.) Over victims more than
/// about three quarters live, two steps of five moves give back less than
/// a write and its fsync take, and the steps fall behind to whole-zone
/// cleaning inside an operation; near_full at 50 to 95% full and the test
/// `the_foreground_cleaner_works_in_bounded_steps` never did. Letting the
/// moves grow as the zones short grow took near_full_90's p99.9 from 8.6
/// to 18 ms, and doubling them at the low water mark alone to 12 ms.
pub const CLEAN_MOVES_PER_STEP_MAX: u64 = 5;
const _: () = assert!(
    CLEAN_GAIN_PER_STEP_PAGES > 0
        && CLEAN_MOVES_PER_STEP_MAX <= CLEAN_READS_PER_STEP_MAX as u64
        && CLEAN_GAIN_PER_STEP_PAGES < CLEAN_READS_PER_STEP_MAX as u64
);

/// Live whole blocks read and held before they are moved, at most (a
/// page each); a step moves fewer.
const CLEAN_MOVE_BATCH_BLOCKS_MAX: usize = 16;
const _: () = assert!(CLEAN_MOVES_PER_STEP_MAX as usize <= CLEAN_MOVE_BATCH_BLOCKS_MAX);

/// A live whole block a cleaning step read, to be moved once the step's
/// reads are done.
struct BlockToMove {
    ino: u64,
    block: u64,
    /// Where it is now: what its index points at.
    here: Pointer,
    length: u32,
    version: u64,
    data: Vec<u8>,
}

/// What one step may do: stop at `moves_max` pages moved or
/// `gain_pages` given back, whichever comes first.
#[derive(Clone, Copy, Debug)]
struct StepBudget {
    moves_max: u64,
    gain_pages: u64,
}

/// The foreground cleaner's state between operations: the victim it is
/// part way through, and the victims it has emptied since the last
/// checkpoint, which that checkpoint frees.
#[derive(Debug, Default)]
pub(crate) struct IncrementalCleaner {
    victim: Option<Victim>,
    /// Zones, each with the generation it was emptied in.
    scanned: Vec<(u32, u32)>,
}

/// A victim part way through: the pages before `next_page` were read and
/// their live contents moved.
#[derive(Clone, Copy, Debug)]
struct Victim {
    zone: u32,
    /// The zone's use when the victim was chosen: a zone freed and taken
    /// again since is another zone.
    generation: u32,
    next_page: u32,
    write_pointer: u32,
}

/// Victims the steps have emptied before a checkpoint is taken to free
/// them, while free zones are at the low water mark (below it, whatever
/// there is). Each checkpoint writes every dirty node, hundreds at
/// near_full_90, into one erase block after another, and the write that
/// takes it waits for a whole block on one die (38 ms and more). Freed
/// three at a time, near_full_90 takes 13 checkpoints for its victims
/// and 7 for its log (two zones, `LOG_ZONES_PER_CHECKPOINT`) in 21,558
/// writes: fewer than 0.1% of them wait for one. (One at a time and one
/// log zone, 39; two at a time, 29 with seeds 2 and 3.)
pub const CLEAN_RELEASE_VICTIMS_MIN: usize = 3;

/// Zones kept free, beyond what the buffered work and the victim's moves
/// need, before the cleaner takes another victim into a batch.
const CLEAN_HEADROOM_ZONES: usize = 1;
/// Zones of the reserve the cleaner leaves to the operations that free
/// space (unlink, rmdir, a truncate that shrinks), which only check that
/// the whole reserve holds them (`room_to_change`), and to the checkpoint
/// that gives their space back: the cleaner stops before its own
/// checkpoint would need them. Without it,
/// cleanings that stopped part way, each freeing nothing, used the whole
/// reserve, and the next unlink's nodes then found no page.
pub const CLEAN_RESERVE_KEPT_ZONES: usize = 1;
const _: () = assert!(CLEAN_RESERVE_KEPT_ZONES > 0 && CLEAN_RESERVE_KEPT_ZONES < crate::volume::RESERVE_ZONES as usize);
const _: () = assert!(CLEAN_HEADROOM_ZONES <= CLEAN_LOW_WATER_ZONES);
/// Spread of erase counts (most worn zone minus least worn) past which
/// static wear levelling moves cold data.
pub const WEAR_SPREAD_MAX: u32 = 16;
/// A victim fuller than this (valid bytes per thousand of capacity) gains
/// too little to be worth cleaning.
const VICTIM_FULLNESS_MAX_PER_MILLE: u64 = 970;

/// What the cleaner has done since mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanerCounters {
    pub zones_cleaned: u64,
    pub zones_for_wear: u64,
    pub pages_read: u64,
    pub data_pages_moved: u64,
    pub chunks_moved: u64,
    pub nodes_moved: u64,
    /// Bytes the cleaner wrote (data it moved); with what the host wrote,
    /// the cleaner's write amplification.
    pub bytes_moved: u64,
    /// Bounded foreground steps taken (see `Fs::clean_if_low`), and the
    /// times an operation had to clean whole zones because the steps fell
    /// behind: what bounds an operation's latency, and what breaks it.
    pub steps: u64,
    pub whole_zone_cleanings_for_space: u64,
    /// Checkpoints an operation took instead, when free zones were short
    /// only by what was buffered (see `Fs::clean_if_low`).
    pub checkpoints_for_buffered: u64,
    /// Checkpoints operations took to free the victims the steps emptied
    /// (`release_wanted`): each a write that waits for every dirty node.
    /// Of those, the ones taken with free zones at the low water mark, and
    /// the victims those freed ([`CLEAN_RELEASE_VICTIMS_MIN`] each or more).
    pub checkpoints_to_release: u64,
    pub releases_at_low_water: u64,
    pub victims_released_at_low_water: u64,
    /// Victims still holding referenced bytes after cleaning: a liveness
    /// decision the accounting disagreed with. Never chosen again this
    /// mount; always zero unless something is wrong.
    pub zones_stuck: u64,
    /// Times the cleaner stopped before a page because the checkpoint
    /// that ends its cleaning would no longer have fitted the zones left:
    /// only on a device nearly full, where the operations that need space
    /// are then refused it.
    pub stops_for_checkpoint_room: u64,
}

impl<D: FlashDevice> Fs<D> {
    /// Free zones allocation can still hand out (the cleaner's reserve
    /// apart).
    pub fn free_zones(&self) -> usize {
        self.volume.allocatable_zone_count()
    }

    /// The zone the cleaner would take next, and whether for wear. Wear
    /// levelling is left out when cleaning for space (`wear_allowed`
    /// false): moving a zone of cold data frees nothing net.
    /// Zones in `taken` are already in this batch: their moves are still
    /// buffered, so their counts have not dropped yet.
    fn choose_victim(&self, wear_allowed: bool, choice: VictimChoice, taken: &[u32]) -> Option<(u32, bool)> {
        let reports = self.volume.device.report_zones();
        let checkpoint = &self.volume.checkpoint;
        let page_size = self.page_size as u64;
        let candidates: Vec<_> = reports
            .iter()
            .filter(|report| {
                let usage = &checkpoint.zones[report.zone as usize];
                report.zone >= FIRST_DYNAMIC_ZONE
                    && matches!(usage.role, ZoneRole::HotData | ZoneRole::ColdData | ZoneRole::Node)
                    && !checkpoint.heads.iter().any(|head| head.zone == report.zone)
                    // Read-only too: a failed program leaves its zone so,
                    // and a reset (once its data has moved) takes it back,
                    // less the retired block. Left out, every failed
                    // program kept a zone out of use for good.
                    && matches!(
                        report.state,
                        ZoneState::Full | ZoneState::Closed | ZoneState::Open | ZoneState::ReadOnly
                    )
                    && report.capacity_pages > 0
                    && usage.valid_bytes > 0
                    && !self.cleaner_stuck.contains(&report.zone)
                    && !taken.contains(&report.zone)
            })
            .collect();
        // Read reclaim first: a zone where a page needed parity (or whose
        // parity is bad) moves whatever its fullness, but not when space is
        // short: moving a full zone gives nothing back.
        let refresh = self.volume.device.refresh_wanted();
        if let Some(report) = candidates.iter().find(|report| refresh.contains(&report.zone)) {
            if matches!(choice, VictimChoice::CostBenefit) {
                return Some((report.zone, false));
            }
        }
        // Wear first: the least worn zone holding data, when the spread is
        // past its bound.
        // Only zones allocation hands out: the checkpoint and superblock
        // zones wear on their own schedule, and levelling cannot help them.
        let most_worn = reports
            .iter()
            .filter(|report| {
                report.zone >= FIRST_DYNAMIC_ZONE && report.capacity_pages > 0 && report.state != ZoneState::Offline
            })
            .map(|report| report.erase_count_max)
            .max()
            .unwrap_or(0);
        if let Some(coldest) = candidates.iter().min_by_key(|report| (report.erase_count_max, report.zone)) {
            if wear_allowed && most_worn.saturating_sub(coldest.erase_count_max) > WEAR_SPREAD_MAX {
                return Some((coldest.zone, true));
            }
        }
        let sequence_now = checkpoint.sequence_next;
        candidates
            .iter()
            .filter_map(|report| {
                let usage = &checkpoint.zones[report.zone as usize];
                let capacity = u64::from(report.capacity_pages) * page_size;
                // The table comes from flash: a count past the zone is
                // damage, and such a zone is no victim.
                let valid = usage.valid_bytes;
                if valid > capacity
                    || valid.saturating_mul(1000) > capacity.saturating_mul(VICTIM_FULLNESS_MAX_PER_MILLE)
                    || capacity - valid < page_size
                {
                    return None;
                }
                // Cost-benefit: (1 - u) * age / (1 + u), with u in
                // thousandths to stay in integers. Greedy: the free bytes.
                let used = (valid.saturating_mul(1000) / capacity.max(1)).min(1000);
                let score = match choice {
                    VictimChoice::CostBenefit => {
                        let age = sequence_now.saturating_sub(usage.last_sequence) + 1;
                        u128::from(1000 - used) * u128::from(age) / u128::from(1000 + used)
                    }
                    VictimChoice::Greedy => u128::from(capacity - valid),
                };
                Some((score, std::cmp::Reverse(report.zone)))
            })
            .max()
            .map(|(_, std::cmp::Reverse(zone))| (zone, false))
    }

    /// Cleans up to `zones` zones for space, choosing by cost-benefit (the
    /// background cleaner's choice); returns how many it cleaned. Ends with
    /// a checkpoint, after which the cleaned zones are free.
    pub fn clean(&mut self, zones: usize) -> Result<usize> {
        self.refuse_if_read_only("cleaning")?;
        self.clean_with(zones, false, VictimChoice::CostBenefit)
    }

    /// Cleans up to `zones` zones because space is short now: the emptiest
    /// first.
    pub(crate) fn clean_for_space(&mut self, zones: usize) -> Result<usize> {
        self.clean_with(zones, false, VictimChoice::Greedy)
    }

    fn clean_with(&mut self, zones: usize, wear_allowed: bool, choice: VictimChoice) -> Result<usize> {
        let reserve = self.volume.reserve_allowed;
        self.volume.reserve_allowed = true;
        let result = self.clean_zones(zones, wear_allowed, choice);
        self.volume.reserve_allowed = reserve;
        result
    }

    fn clean_zones(&mut self, zones: usize, wear_allowed: bool, choice: VictimChoice) -> Result<usize> {
        // Whole zones take over from the steps: the victim part way
        // through may be taken whole (what was moved is no longer live
        // there), and the victims already emptied wait for the checkpoint
        // this batch ends with.
        self.incremental.victim = None;
        let mut cleaned = Vec::new();
        let mut partial = false;
        for _ in 0..zones {
            let taken: Vec<u32> =
                cleaned.iter().copied().chain(self.incremental.scanned.iter().map(|&(zone, _)| zone)).collect();
            let Some((victim, for_wear)) = self.choose_victim(wear_allowed, choice, &taken) else { break };
            // What moves is buffered until the checkpoint that ends the
            // batch, and only that checkpoint frees the victims: take
            // another only while the checkpoint, with what this one
            // moves, still fits. (The first goes ahead: its moves check
            // the checkpoint's room page by page.)
            if !cleaned.is_empty()
                && self.free_zones() < self.buffered_zones() + self.move_cost_zones(victim) + CLEAN_HEADROOM_ZONES
            {
                break;
            }
            let moved = self.move_live(victim);
            if let Ok(false) = moved {
                // Stopped part way: what moved is written by the
                // checkpoint below, and the victim stays until a later
                // cleaning finds the room to finish it.
                partial = true;
                break;
            }
            if let Err(error) = moved {
                // Never picked again this mount: one bad zone must not stop
                // every operation that needs cleaning. Running out of room
                // says nothing about the zone.
                if error.errno != errno::ENOSPC {
                    self.cleaner_stuck.insert(victim);
                    self.cleaner.zones_stuck += 1;
                }
                if cleaned.is_empty() {
                    return Err(error);
                }
                break;
            }
            cleaned.push(victim);
            self.cleaner.zones_cleaned += 1;
            if for_wear {
                self.cleaner.zones_for_wear += 1;
            }
        }
        if cleaned.is_empty() {
            // Only when it moved something: stopped at its first page, a
            // checkpoint would write an empty record each time a refused
            // write asked for cleaning.
            if partial && self.has_buffered_work() {
                self.changed = true;
                self.checkpoint_ordered()?;
            }
            return Ok(0);
        }
        // The moves become durable, and the victims, which nothing
        // references any more, are released by this checkpoint.
        self.changed = true;
        self.checkpoint_ordered()?;
        for zone in &cleaned {
            if self.volume.checkpoint.zones[*zone as usize].valid_bytes > 0 {
                self.cleaner.zones_stuck += 1;
                self.cleaner_stuck.insert(*zone);
            }
        }
        Ok(cleaned.len())
    }

    /// Moves the live data out of every zone the protection layer asked
    /// to (read reclaim) that the cleaner can take, and returns how many
    /// moved. Their resets leave out the blocks retired.
    pub fn refresh_zones(&mut self) -> Result<u64> {
        self.refuse_if_read_only("moving damaged zones' data")?;
        let mut refreshed = 0;
        // A head's zone is never cleaned while the head is in it: one that
        // holds damage has its head moved on first, as when it fills.
        let refresh = self.volume.device.refresh_wanted();
        let damaged_heads: Vec<ZoneRole> = self
            .volume
            .checkpoint
            .heads
            .iter()
            .filter(|head| refresh.contains(&head.zone))
            .map(|head| head.role)
            .collect();
        for role in damaged_heads {
            self.volume.move_head_on(role)?;
        }
        loop {
            let wanted = self.refresh_candidates();
            if wanted == 0 {
                return Ok(refreshed);
            }
            let cleaned = self.clean(wanted)?;
            if cleaned == 0 {
                return Ok(refreshed);
            }
            refreshed += cleaned as u64;
        }
    }

    /// Zones asked to be refreshed that the cleaner could take now.
    fn refresh_candidates(&self) -> usize {
        let refresh = self.volume.device.refresh_wanted();
        refresh
            .iter()
            .filter(|&&zone| {
                let usage = &self.volume.checkpoint.zones[zone as usize];
                zone >= FIRST_DYNAMIC_ZONE
                    && matches!(usage.role, ZoneRole::HotData | ZoneRole::ColdData | ZoneRole::Node)
                    && usage.valid_bytes > 0
                    && !self.volume.checkpoint.heads.iter().any(|head| head.zone == zone)
                    && !self.cleaner_stuck.contains(&zone)
            })
            .count()
    }

    /// Background work while nothing else runs: the timer's checkpoint if
    /// one is due (so buffered work does not wait for the next operation),
    /// else cleaning, a zone when free zones run low or, with room to
    /// spare, a zone of cold data when the wear spread is past its bound.
    /// Returns whether it did anything.
    pub fn idle(&mut self) -> Result<bool> {
        if self.options.read_only {
            // Checkpoints, cleaning and scrub repairs all write.
            return Ok(false);
        }
        // The log's checkpoint starts here, in the background, at half its
        // threshold: an operation meets it at the whole only when the
        // mount was never idle.
        // One refused for space goes on to the cleaning below, which is
        // what may make room.
        if (self.checkpoint_due() || self.log_wants_checkpoint(2)) && self.optional_checkpoint()? {
            return Ok(true);
        }
        let (free, wear) = self.zone_scan();
        let buffered = self.buffered_zones();
        if free < CLEAN_LOW_WATER_ZONES + buffered {
            return Ok(self.clean_for_space(CLEAN_ZONES_PER_OPERATION_MAX)? > 0);
        }
        // Read reclaim: a zone with a rebuilt page moves while idle.
        if self.refresh_candidates() > 0 {
            return Ok(self.clean(1)? > 0);
        }
        if free < CLEAN_IDLE_WATER_ZONES + buffered {
            return Ok(self.clean(1)? > 0);
        }
        if self.wear_confirmed(wear) && self.clean_with(1, true, VictimChoice::CostBenefit)? > 0 {
            return Ok(true);
        }
        // Nothing else to do: scrub a little (RCFFS's idle-time checker).
        Ok(self.scrub_in_background()? > 0)
    }

    /// Foreground cleaning before an operation. Below the step water
    /// mark (the idle one and a runway), one bounded step: at most
    /// [`CLEAN_READS_PER_STEP_MAX`] pages of the emptiest zone read and
    /// [`CLEAN_MOVES_PER_STEP_MAX`] moved, stopping once it has given back
    /// [`CLEAN_GAIN_PER_STEP_PAGES`] times the square of the zones short,
    /// so no operation stalls for a whole zone; a victim once started is
    /// stepped through to its end. Below the low water mark only because
    /// of what is buffered (counted at its bound), a checkpoint first, and
    /// no step with it (not right after a checkpoint, when little is
    /// buffered). Only when the steps fell behind, below the low water
    /// mark without what is buffered, or still below it after that
    /// checkpoint (or with it refused for space, or right after one),
    /// whole zones (the emptiest first). With room to
    /// spare, a zone of cold data when the wear spread is past its bound
    /// (rare: each one narrows the spread). No step when `step_allowed`
    /// is false: the operation has just reset a zone (`erase_ahead`), 3 ms
    /// on each of its dies, and a step's moves would queue behind that
    /// (13 ms for a write and its fsync at near_full_90); the next
    /// operation steps, a larger step if it must. Nor when
    /// `after_checkpoint` (the operation before took a checkpoint, tens of
    /// milliseconds that a program's write and fsync wait for together)
    /// and free zones are not short of the step water mark (the step
    /// would only go on with a victim already started): short, the steps
    /// cannot skip one (skipping them whenever one zone short let the
    /// 256-page zones of `the_foreground_cleaner_works_in_bounded_steps`
    /// fall to whole-zone cleaning).
    pub(crate) fn clean_if_low(&mut self, step_allowed: bool, after_checkpoint: bool) -> Result<()> {
        // Best effort: an operation that cannot be helped by cleaning (an
        // unlink, say) must not fail because cleaning did. What needs the
        // space finds out in `reserve_space`.
        let (mut free, wear) = self.zone_scan();
        let mut buffered = self.buffered_zones();
        let short_only_by_buffered = free < CLEAN_LOW_WATER_ZONES + buffered && free >= CLEAN_LOW_WATER_ZONES;
        if short_only_by_buffered && !after_checkpoint && self.has_buffered_work() {
            // What is buffered, counted at its bound, is all that puts free
            // zones under the mark: a checkpoint writes it out (often in
            // fewer pages). Cleaning whole zones would end in that same
            // checkpoint after moving zones' worth of pages, and one
            // operation should carry one such wait, not both. Not after a
            // checkpoint (little is buffered then), nor under the mark
            // without what is buffered, where only cleaning gives back.
            self.changed = true;
            match self.checkpoint_ordered() {
                Ok(()) => {
                    self.cleaner.checkpoints_for_buffered += 1;
                    (free, _) = self.zone_scan();
                    buffered = self.buffered_zones();
                    if free >= CLEAN_LOW_WATER_ZONES + buffered {
                        return Ok(());
                    }
                }
                // No room for it: cleaning may make some, below.
                Err(error) if error.errno == errno::ENOSPC => {}
                // Best effort, as cleaning is: the operation goes on, and
                // what needs the checkpoint meets the error itself.
                Err(_) => return Ok(()),
            }
        }
        if free < CLEAN_LOW_WATER_ZONES + buffered {
            self.cleaner.whole_zone_cleanings_for_space += 1;
            let _ = self.clean_for_space(CLEAN_ZONES_PER_OPERATION_MAX);
        } else if !step_allowed {
            // The zone reset this operation did is its share of the
            // background work: no step, and no wear levelling on top.
        } else if free + self.incremental.scanned.len() < self.step_water_zones() + buffered
            || self.incremental.victim.is_some()
        {
            // Victims already emptied count as free: the checkpoint that
            // frees them comes before space runs out (`release_wanted`).
            // The further under the step water mark, the larger the step,
            // so the steps catch up before whole zones must be cleaned.
            let free = free + self.incremental.scanned.len();
            if after_checkpoint && free >= self.step_water_zones() + buffered {
                return Ok(());
            }
            let short = (self.step_water_zones() + buffered).saturating_sub(free).max(1) as u64;
            let reserve = std::mem::replace(&mut self.volume.reserve_allowed, true);
            let budget = StepBudget {
                moves_max: CLEAN_MOVES_PER_STEP_MAX,
                gain_pages: CLEAN_GAIN_PER_STEP_PAGES * short * short,
            };
            let _ = self.clean_step(budget);
            self.volume.reserve_allowed = reserve;
        } else if self.wear_confirmed(wear) {
            let _ = self.clean_with(1, true, VictimChoice::CostBenefit);
        }
        Ok(())
    }

    /// Free zones under which operations take cleaning steps, what is
    /// buffered apart.
    fn step_water_zones(&self) -> usize {
        let dynamic = (self.volume.device.geometry().zone_count as usize).saturating_sub(FIRST_DYNAMIC_ZONE as usize);
        CLEAN_LOW_WATER_ZONES + (dynamic / CLEAN_STEP_RUNWAY_DYNAMIC_ZONES).max(CLEAN_STEP_RUNWAY_ZONES_MIN)
    }

    /// Whether victims the steps emptied should be freed now: they wait
    /// for whatever checkpoint comes next, unless free zones are at the
    /// low water mark with [`CLEAN_RELEASE_VICTIMS_MIN`] victims emptied,
    /// or below it with any. A checkpoint writes every dirty node, so one
    /// per victim would cost more than small victims give back, and each
    /// is a write that waits tens of milliseconds.
    pub(crate) fn release_wanted(&mut self) -> bool {
        if self.incremental.scanned.is_empty() {
            return false;
        }
        let (free, _) = self.zone_scan();
        let low = CLEAN_LOW_WATER_ZONES + self.buffered_zones();
        free < low || (free == low && self.incremental.scanned.len() >= CLEAN_RELEASE_VICTIMS_MIN)
    }

    /// Counts a checkpoint `release_wanted` asked for, before it is taken.
    pub(crate) fn count_release(&mut self) {
        let (free, _) = self.zone_scan();
        self.cleaner.checkpoints_to_release += 1;
        if free == CLEAN_LOW_WATER_ZONES + self.buffered_zones() {
            self.cleaner.releases_at_low_water += 1;
            self.cleaner.victims_released_at_low_water += self.incremental.scanned.len() as u64;
        }
    }

    /// One bounded step of the foreground cleaner (see `clean_if_low`),
    /// within `budget`: its moves, and what it gives back.
    fn clean_step(&mut self, budget: StepBudget) -> Result<()> {
        self.cleaner.steps += 1;
        let victim = match self.incremental.victim.take() {
            Some(victim) if self.volume.checkpoint.zones[victim.zone as usize].generation != victim.generation => {
                // Emptied by the host's own overwrites, freed by a
                // checkpoint and taken again since: another zone now.
                return Ok(());
            }
            Some(victim) if self.volume.checkpoint.zones[victim.zone as usize].valid_bytes == 0 => {
                // Emptied by the host's own overwrites since the last
                // step: nothing left to read.
                self.victim_scanned(victim.zone);
                return Ok(());
            }
            Some(victim) => victim,
            None => {
                let scanned: Vec<u32> = self.incremental.scanned.iter().map(|&(zone, _)| zone).collect();
                let Some((zone, _)) = self.choose_victim(false, VictimChoice::Greedy, &scanned) else {
                    return Ok(());
                };
                Victim {
                    zone,
                    generation: self.volume.checkpoint.zones[zone as usize].generation,
                    next_page: 0,
                    write_pointer: self.volume.device.report_zone(zone)?.write_pointer,
                }
            }
        };
        let end = victim.write_pointer.min(victim.next_page.saturating_add(CLEAN_READS_PER_STEP_MAX));
        match self.move_live_pages(victim.zone, victim.next_page, end, budget) {
            Ok(next_page) if next_page >= victim.write_pointer => self.victim_scanned(victim.zone),
            Ok(next_page) => self.incremental.victim = Some(Victim { next_page, ..victim }),
            Err(error) => {
                // As in `clean_zones`: never picked again this mount,
                // unless it only ran out of room.
                if error.errno != errno::ENOSPC {
                    self.cleaner_stuck.insert(victim.zone);
                    self.cleaner.zones_stuck += 1;
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// A victim every page of which the steps have read: the next
    /// checkpoint frees it.
    fn victim_scanned(&mut self, zone: u32) {
        let generation = self.volume.checkpoint.zones[zone as usize].generation;
        self.incremental.scanned.push((zone, generation));
        self.cleaner.zones_cleaned += 1;
        self.changed = true;
    }

    /// After a checkpoint: the victims the steps emptied are free now,
    /// unless something in them is still referenced (a liveness decision
    /// the accounting disagreed with, as `clean_zones` checks).
    /// The victim part way through is done with when the host's own
    /// overwrites emptied it and this checkpoint freed it: the zone may be
    /// taken again before the next step.
    pub(crate) fn scanned_victims_checkpointed(&mut self) {
        if let Some(victim) = self.incremental.victim {
            let usage = &self.volume.checkpoint.zones[victim.zone as usize];
            if usage.role == ZoneRole::Free || usage.generation != victim.generation {
                self.incremental.victim = None;
                self.cleaner.zones_cleaned += 1;
            }
        }
        for (zone, generation) in std::mem::take(&mut self.incremental.scanned) {
            let usage = &self.volume.checkpoint.zones[zone as usize];
            if usage.generation == generation && usage.valid_bytes > 0 {
                self.cleaner.zones_stuck += 1;
                self.cleaner_stuck.insert(zone);
            }
        }
    }

    /// Whether the wear spread still calls for a zone of cold data, when
    /// the hint says so: the zone it found may have emptied since, and
    /// cleaning for wear with none would clean for space instead.
    fn wear_confirmed(&self, hint: bool) -> bool {
        hint && self.wear_victim_now()
    }

    /// Whether the wear spread calls for a zone of cold data now.
    fn wear_victim_now(&self) -> bool {
        self.choose_victim(true, VictimChoice::CostBenefit, &[]).is_some_and(|(_, for_wear)| for_wear)
    }

    /// The free zones and whether the wear spread calls for a zone of cold
    /// data, from the last scan while nothing that changes them happened
    /// since. Both change only when a zone is taken, reset, released (at
    /// a checkpoint), found bad or given up on; an operation between those
    /// need not read every zone's report again. A hint, never a decision:
    /// what cleans re-chooses, and `checkpoint_fits` keeps its own list
    /// of capacities under the same key.
    fn zone_scan(&mut self) -> (usize, bool) {
        let key = self.zone_scan_key();
        // One hint for each side of the reserve: operations that free space
        // (unlink) may use it and those that fill it may not, and a workload
        // that alternates them must not count every zone at each turn.
        let slot = usize::from(key.reserve_allowed);
        if let Some((cached, free, wear)) = self.zone_scan_hint[slot] {
            if cached == key {
                return (free, wear);
            }
        }
        let free = self.free_zones();
        let wear = self.wear_victim_now();
        self.zone_scan_hint[slot] = Some((key, free, wear));
        (free, wear)
    }

    /// The state that the free zones, their capacities and the wear spread
    /// follow from.
    pub(crate) fn zone_scan_key(&self) -> ZoneScanKey {
        let counters = self.volume.device().counters();
        ZoneScanKey {
            checkpoint_number: self.volume.checkpoint.number,
            unindexed_used: self.volume.unindexed_used,
            undeclared_zones_taken: self.volume.undeclared_zones_taken,
            erases: counters.erases,
            zone_resets: counters.zone_resets,
            failures: counters.program_failures_injected + counters.erase_failures_injected,
            zones_stuck: self.cleaner_stuck.len(),
            resets_issued: self.volume.device.resets_issued(),
            reserve_allowed: self.volume.reserve_allowed,
        }
    }

    /// Zones moving `zone`'s live contents fills directly: its valid bytes,
    /// rewritten densely. A victim is at most 97% valid, so this is one
    /// zone unless its count is damaged: the check keeps a zone of room
    /// per victim. Not counted: the index or directory page each moved
    /// block or inode dirties, which the checkpoint writes (the next
    /// victim's check sees them in `buffered_zones`). How many distinct
    /// pages that is depends on the tree; counting one a record, the
    /// bound, stops batches at one zone, the case that ran out of space
    /// (the test `many_small_files_over_many_directories...`).
    fn move_cost_zones(&self, zone: u32) -> usize {
        let usage = &self.volume.checkpoint.zones[zone as usize];
        let pages = usage.valid_bytes.div_ceil(self.page_size as u64);
        let zone_pages = self.volume.device.geometry().zone_pages().max(1);
        pages.div_ceil(zone_pages) as usize
    }

    /// Zones the next checkpoint may fill with what is buffered now (dirty
    /// nodes and data blocks). Cleaning ends with a checkpoint, so it must
    /// start while they are still free: a cleaner that waits until the
    /// free zones are fewer than these can no longer finish.
    fn buffered_zones(&self) -> usize {
        let zone_pages = self.volume.device.geometry().zone_pages().max(1);
        // What `pages_past_heads` counts, with nothing more wanted (each
        // node once: the space checks, `checkpoint_fits`, count it with its
        // parent; these water marks were tuned on this count).
        let (data_pages, node_pages) = self.pages_past_heads(0, 0);
        (data_pages.div_ceil(zone_pages) + node_pages.div_ceil(zone_pages)) as usize
    }

    /// Moves everything live out of `zone`; false when it stopped part
    /// way for the checkpoint's room (see `move_live_pages`).
    fn move_live(&mut self, zone: u32) -> Result<bool> {
        let write_pointer = self.volume.device.report_zone(zone)?.write_pointer;
        let next =
            self.move_live_pages(zone, 0, write_pointer, StepBudget { moves_max: u64::MAX, gain_pages: u64::MAX })?;
        Ok(next >= write_pointer)
    }

    /// Moves what is live out of `zone`'s pages from `first` on, up to
    /// `end` or until `moves_max` pages were moved or kept, whichever
    /// comes first; returns the page after the last one read.
    fn move_live_pages(&mut self, zone: u32, first: u32, end: u32, budget: StepBudget) -> Result<u32> {
        let mut packer = PackedPage::new(self.page_size);
        let mut packed: Vec<super::data::PackedChunk> = Vec::new();
        let moves_before = self.cleaner_moves();
        // Live whole blocks are moved after the step's reads, not between
        // them: the cold head's current block is on one die, and a victim
        // page on that die waited behind every move programmed before it
        // (five moves, 3 ms of a step that costs 0.3).
        let mut blocks: Vec<BlockToMove> = Vec::new();
        let mut next = first;
        loop {
            let moves = self.cleaner_moves() - moves_before + blocks.len() as u64;
            let gained = u64::from(next - first).saturating_sub(moves);
            if next >= end || moves >= budget.moves_max || gained >= budget.gain_pages {
                break;
            }
            let page = next;
            next += 1;
            let address = PageAddress::new(zone, page);
            self.cleaner.pages_read += 1;
            // A page that does not verify is garbage or already lost: if
            // something references it, the checker says so; moving it
            // would not help.
            let Ok((header, data)) = self.volume.read_page(address) else { continue };
            // The checkpoint that ends this cleaning writes every node the
            // moves dirty, and only it frees the victim: move this page
            // only while that checkpoint, with what is moved and waiting
            // and what this page may dirty, still fits the zones left, the
            // reserve's included. Checked a page at a time, not a victim:
            // a page of small chunks dirties a node for each file in it
            // (a data zone half valid dirtied 39 nodes on a device of 21
            // zones of 21 pages), and a victim left part way is only one
            // not freed yet; its next step, or the next cleaning, goes on.
            // (Counted twice each below, with a parent: a pack's inodes
            // go back into at most two pack pages, and each has one
            // parent, so half of them and one.)
            let items = match header.kind {
                PageKind::PackedData => header.count as usize,
                PageKind::Node if is_inode_pack(&data) => {
                    decode_inode_pack(&data).map_or(0, |records| records.len().div_ceil(2) + 1)
                }
                _ => 1,
            } as u64;
            let waiting = (blocks.len() + packed.len()) as u64;
            let cold = if header.kind == PageKind::Node { waiting } else { waiting + items + 1 };
            if !self.checkpoint_fits(0, waiting + items, cold, CLEAN_RESERVE_KEPT_ZONES, false) {
                self.cleaner.stops_for_checkpoint_room += 1;
                next = page;
                break;
            }
            let here = Pointer::page_at(zone, page);
            match header.kind {
                PageKind::DataBlock => {
                    let InvertedIndex { ino, offset, version } = header.inverted;
                    let block = offset / self.block_bytes();
                    if self.block_is_live(ino, version, block, here)? {
                        blocks.push(BlockToMove { ino, block, here, length: header.length, version, data });
                        if blocks.len() == CLEAN_MOVE_BATCH_BLOCKS_MAX {
                            // A whole-zone cleaning reads far more than a
                            // step: the batch stays small.
                            self.move_blocks(std::mem::take(&mut blocks))?;
                        }
                    }
                }
                PageKind::PackedData => {
                    let Ok(chunks) = parse_packed(&data, header.length, header.count) else { continue };
                    for (index, (chunk, range)) in chunks.into_iter().enumerate() {
                        let block = chunk.offset / self.block_bytes();
                        let units = (CHUNK_HEADER_BYTES + range.len()).div_ceil(CHUNK_UNIT_BYTES as usize) as u32;
                        // A chunk no pointer can name is referenced by
                        // nothing; one longer than a block is damage (a
                        // read refuses it too), left where it is.
                        if index + 1 > Pointer::CHUNKS_MAX as usize
                            || units > Pointer::CHUNK_UNITS_MAX
                            || chunk.logical_length as usize > self.page_size
                        {
                            continue;
                        }
                        let pointer = Pointer::new(zone, page, index as u32 + 1, units);
                        if chunk.kind != ChunkKind::FileData
                            || !self.block_is_live(chunk.ino, chunk.version, block, pointer)?
                        {
                            continue;
                        }
                        // A compressed chunk moves as it is, compressed;
                        // its block is decompressed only for the buffer
                        // that goes back to the file if the move fails.
                        let payload = &data[range];
                        let mut buffer = vec![0u8; self.page_size];
                        if chunk.compression == Compression::None {
                            buffer[..payload.len()].copy_from_slice(payload);
                        } else {
                            let Ok(logical) =
                                flintfs_format::decompress(chunk.compression, payload, chunk.logical_length as usize)
                            else {
                                continue;
                            };
                            buffer[..logical.len()].copy_from_slice(&logical);
                        }
                        if packer.count() == Pointer::CHUNKS_MAX || !packer.push(&chunk, payload) {
                            let full = std::mem::replace(&mut packer, PackedPage::new(self.page_size));
                            self.program_packed(full, &mut packed, ZoneRole::ColdData)?;
                            assert!(packer.push(&chunk, payload), "a chunk that fit a page fits an empty one");
                        }
                        packed.push(super::data::PackedChunk { ino: chunk.ino, block, units, buffer });
                        self.cleaner.chunks_moved += 1;
                        self.cleaner.bytes_moved += u64::from(units) * u64::from(CHUNK_UNIT_BYTES);
                    }
                }
                PageKind::Node => self.keep_live_nodes(zone, page, &data)?,
                _ => {}
            }
        }
        self.move_blocks(blocks)?;
        if packer.count() > 0 {
            self.program_packed(packer, &mut packed, ZoneRole::ColdData)?;
        }
        Ok(next)
    }

    /// Pages the cleaner has moved or marked for moving so far: what its
    /// foreground steps are bounded by.
    fn cleaner_moves(&self) -> u64 {
        // Chunks count by the pages their bytes fill: a page of small or
        // compressed chunks costs one program, like a whole block.
        let chunk_bytes = self.cleaner.bytes_moved - self.cleaner.data_pages_moved * self.page_size as u64;
        self.cleaner.data_pages_moved + self.cleaner.nodes_moved + chunk_bytes.div_ceil(self.page_size as u64)
    }

    /// Whether block `block` of `ino` (of version `version`) is at `here`.
    /// A block buffered in memory counts as not live here: the checkpoint
    /// that ends the cleaning writes the buffer, which replaces it.
    fn block_is_live(&mut self, ino: u64, version: u64, block: u64, here: Pointer) -> Result<bool> {
        if self.dirty_blocks.contains_key(&(ino, block)) {
            return Ok(false);
        }
        let key = match self.file_key(ino) {
            Ok(key) => key,
            Err(error) if error.errno == errno::ENOENT || error.errno == errno::ENOTDIR => return Ok(false),
            Err(error) => return Err(error),
        };
        match self.node(key)? {
            Node::File { inode, .. } if inode.ino == ino && version >= inode.born => {}
            _ => return Ok(false),
        }
        Ok(self.block_pointer(ino, block)? == here)
    }

    /// Moves the live blocks a step read, each still where it was read
    /// unless something since moved it (nothing in a step does: checked
    /// all the same, since a move releases the page it moves from).
    fn move_blocks(&mut self, blocks: Vec<BlockToMove>) -> Result<()> {
        for moved in blocks {
            if self.block_is_live(moved.ino, moved.version, moved.block, moved.here)? {
                self.move_block(moved)?;
            }
        }
        Ok(())
    }

    /// Moves a live data block to the cold data head.
    fn move_block(&mut self, moved: BlockToMove) -> Result<()> {
        let BlockToMove { ino, block, here, length, version, data } = moved;
        let meta = PageMeta {
            kind: PageKind::DataBlock,
            end_of_record: false,
            inverted: InvertedIndex { ino, offset: block * self.block_bytes(), version },
            length,
            count: 0,
        };
        let address = self.volume.append(ZoneRole::ColdData, meta, &data)?;
        let new = Pointer::page_at(address.zone, address.page);
        self.volume.account(address.zone, self.page_size as i64);
        let old = match self.set_block_pointer(ino, block, new) {
            Ok(old) => old,
            Err(error) => {
                self.release(new);
                return Err(error);
            }
        };
        debug_assert_eq!(old, here, "a live block is where its index says");
        self.release(old);
        self.cleaner.data_pages_moved += 1;
        self.cleaner.bytes_moved += self.page_size as u64;
        Ok(())
    }

    /// Marks every live node of a node page dirty, so write-back moves it.
    fn keep_live_nodes(&mut self, zone: u32, page: u32, data: &[u8]) -> Result<()> {
        let here = Pointer::page_at(zone, page);
        if is_inode_pack(data) {
            let Ok(records) = decode_inode_pack(data) else { return Ok(()) };
            for (index, record) in records.iter().enumerate() {
                let units = flintfs_format::inode_record_bytes(record).div_ceil(CHUNK_UNIT_BYTES as usize) as u32;
                let pointer = Pointer::new(zone, page, index as u32 + 1, units);
                let key = match record {
                    Node::File { inode, .. } => match self.file_key(inode.ino) {
                        Ok(key) => key,
                        Err(error) if error.errno == errno::ENOENT || error.errno == errno::ENOTDIR => continue,
                        Err(error) => return Err(error),
                    },
                    Node::Index { .. } => match self.index_key_if_alive(record)? {
                        Some(key) => key,
                        None => continue,
                    },
                    _ => continue,
                };
                if self.home_of(key)? == pointer {
                    self.keep(key)?;
                }
            }
            return Ok(());
        }
        let Ok(node) = Node::decode(data) else { return Ok(()) };
        let key = match &node {
            Node::Map { number, .. } => NodeKey::Map(*number as u32),
            Node::MapDirectory { number, .. } => NodeKey::MapDirectory(*number as u32),
            Node::Directory { slot, .. } | Node::Bucket { slot, .. } | Node::Table { slot, .. } => NodeKey::Slot(*slot),
            Node::File { slot, .. } => NodeKey::Slot(*slot),
            Node::Index { .. } => match self.index_key_if_alive(&node)? {
                Some(key) => key,
                None => return Ok(()),
            },
        };
        if self.home_of(key)? == here {
            self.keep(key)?;
        }
        Ok(())
    }

    /// The key of an index page whose file lives in the life the page was
    /// written in; none for a page of a file gone or of an earlier life.
    fn index_key_if_alive(&mut self, index: &Node) -> Result<Option<NodeKey>> {
        let Node::Index { ino, level, number, version, .. } = index else { return Ok(None) };
        match self.file_key(*ino).and_then(|key| self.node(key)) {
            Ok(Node::File { inode, .. }) if inode.ino == *ino && *version >= inode.born => {}
            _ => return Ok(None),
        }
        Ok(Some(NodeKey::Index { level: *level, ino: *ino, number: *number }))
    }

    /// Where a node's current copy is, from memory or what locates it.
    fn home_of(&mut self, key: NodeKey) -> Result<Pointer> {
        if let Some(cached) = self.nodes.peek(key).or_else(|| self.pending.get(&key)) {
            return Ok(cached.home);
        }
        // Kept in NVM: its flash copy is still its home.
        if let Some(home) = self.kept.as_ref().and_then(|kept| kept.home_of(key)) {
            return Ok(home);
        }
        // Whatever cannot be located (a locator, a free slot, a file gone)
        // locates nothing here.
        Ok(self.locate(key).unwrap_or(Pointer::NULL))
    }

    /// Marks a live node dirty: the next write-back moves it.
    fn keep(&mut self, key: NodeKey) -> Result<()> {
        self.ensure(key)?;
        // To flash: kept in NVM instead, its home here would stay.
        self.to_flash.insert(key);
        self.mark_node_dirty(key);
        self.changed = true;
        self.cleaner.nodes_moved += 1;
        Ok(())
    }

    /// The cleaner's counters.
    pub fn cleaner_counters(&self) -> &CleanerCounters {
        &self.cleaner
    }

    /// Erase counts of the dynamic zones: the most and the mean.
    pub fn wear(&self) -> (u32, f64) {
        let counts: Vec<u32> = self
            .volume
            .device()
            .report_zones()
            .iter()
            .filter(|report| report.zone >= FIRST_DYNAMIC_ZONE)
            .map(|report| report.erase_count_max)
            .collect();
        let most = counts.iter().copied().max().unwrap_or(0);
        let mean = counts.iter().map(|&count| f64::from(count)).sum::<f64>() / counts.len().max(1) as f64;
        (most, mean)
    }

    /// Valid bytes per zone role, for reports.
    pub fn usage_by_role(&self) -> BTreeMap<String, u64> {
        let mut usage = BTreeMap::new();
        for zone in &self.volume.checkpoint.zones {
            *usage.entry(format!("{:?}", zone.role)).or_insert(0) += zone.valid_bytes;
        }
        usage
    }
}
