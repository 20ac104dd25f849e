//! Log heads and zone allocation. Each role (hot data, cold data, node
//! pages, metadata log) appends to its own open zone. A head that fills its
//! zone moves to the next zone of the unindexed list the last checkpoint
//! declared (ReconFS's unindexed zone, RCFFS's next-k segments), so
//! recovery only ever has to scan those. When the list runs out, a
//! checkpoint declares a new one.

use flintfs_flash::{FlashDevice, PageAddress, ZoneState};
use flintfs_format::{InvertedIndex, LogHead, PageHeader, PageKind, ZoneRole, FIRST_DYNAMIC_ZONE};

use crate::error::{errno, Error, Result};
use crate::volume::{read_verified_into, Volume, RESERVE_ZONES};

/// What to put in a page besides its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageMeta {
    pub kind: PageKind,
    pub end_of_record: bool,
    pub inverted: InvertedIndex,
    pub length: u32,
    pub count: u32,
}

impl PageMeta {
    pub fn new(kind: PageKind, length: u32) -> PageMeta {
        PageMeta { kind, end_of_record: false, inverted: InvertedIndex::default(), length, count: 0 }
    }

    pub fn with_count(self, count: u32) -> PageMeta {
        PageMeta { count, ..self }
    }
}

/// Times a run is tried in fresh zones after a page of it fails to program.
pub const PROGRAM_ATTEMPTS: u32 = 4;

impl<D: FlashDevice> Volume<D> {
    /// Programs one page at `role`'s head and returns where it went.
    pub fn append(&mut self, role: ZoneRole, meta: PageMeta, data: &[u8]) -> Result<PageAddress> {
        Ok(self.append_run(role, &[(meta, data)])?[0])
    }

    /// Programs pages consecutively in one zone of `role`'s head (a
    /// multi-page record must not straddle zones) and returns where each went.
    pub fn append_run(&mut self, role: ZoneRole, pages: &[(PageMeta, &[u8])]) -> Result<Vec<PageAddress>> {
        self.append_run_tried(role, pages, PROGRAM_ATTEMPTS)
    }

    /// Programs pages that stand alone (whole data blocks, each named by
    /// its own inverted index) consecutively in the zone of `role`'s head,
    /// and returns where each went. Unlike [`Volume::append_run`], a failed
    /// program is not tried again whole in a fresh zone: only a zone with
    /// as much room could take it, and a long run's search would pass
    /// over (and use up until the next checkpoint) every zone that retired
    /// blocks have shortened. The error comes back instead, and the caller
    /// places the pages one by one.
    pub fn append_run_once(&mut self, role: ZoneRole, pages: &[(PageMeta, &[u8])]) -> Result<Vec<PageAddress>> {
        self.append_run_tried(role, pages, 1)
    }

    /// [`Volume::append_run`], with the run tried in at most `attempts`
    /// zones.
    fn append_run_tried(
        &mut self,
        role: ZoneRole,
        pages: &[(PageMeta, &[u8])],
        attempts: u32,
    ) -> Result<Vec<PageAddress>> {
        self.append_pages_tried(role, pages.len() as u32, attempts, |_| {
            pages.iter().map(|(meta, data)| (*meta, std::borrow::Cow::Borrowed(*data))).collect()
        })
    }

    /// Programs `needed` pages consecutively in one zone of `role`'s head,
    /// built by `build` from the sequence number the first will carry (a
    /// record's header names it), and returns where each went.
    pub fn append_pages<'a>(
        &mut self,
        role: ZoneRole,
        needed: u32,
        build: impl FnMut(u64) -> Vec<(PageMeta, std::borrow::Cow<'a, [u8]>)>,
    ) -> Result<Vec<PageAddress>> {
        self.append_pages_tried(role, needed, PROGRAM_ATTEMPTS, build)
    }

    /// [`Volume::append_pages`], with the run tried in at most `attempts`
    /// zones.
    fn append_pages_tried<'a>(
        &mut self,
        role: ZoneRole,
        needed: u32,
        attempts: u32,
        mut build: impl FnMut(u64) -> Vec<(PageMeta, std::borrow::Cow<'a, [u8]>)>,
    ) -> Result<Vec<PageAddress>> {
        debug_assert!((1..=PROGRAM_ATTEMPTS).contains(&attempts));
        if !role.is_log_head() {
            return Err(Error::invalid(format!("{role:?} has no log head")));
        }
        if needed == 0 {
            return Ok(Vec::new());
        }
        let geometry = self.device.geometry();
        if u64::from(needed) > geometry.zone_pages() {
            return Err(Error::invalid(format!("{needed} pages cannot fit in one zone of {}", geometry.zone_pages())));
        }
        // A page that fails to program retires its block (the device grows
        // a bad block); the run starts again in a fresh zone, a bounded
        // number of times.
        let mut attempt = 0;
        'run: loop {
            attempt += 1;
            let head = self.head_with_room(role, needed)?;
            let generation = self.checkpoint.zones[head.zone as usize].generation;
            let pages = build(self.checkpoint.sequence_next);
            for (meta, data) in &pages {
                if pages.len() != needed as usize
                    || data.len() != geometry.page_size_bytes as usize
                    || meta.length as usize > data.len()
                    || (meta.kind != PageKind::DataBlock && meta.inverted != InvertedIndex::default())
                    || (meta.end_of_record && !meta.kind.is_record())
                {
                    return Err(Error::invalid(format!(
                        "a page that cannot be written: {meta:?}, {} bytes, {} of {needed} pages",
                        data.len(),
                        pages.len()
                    )));
                }
            }
            // Every page's header and sealed OOB first (the whole run at
            // once, so sealing can use both cores), then the programs in
            // order. Page `index` takes sequence `first + index`: the
            // sequence each would take were they made one by one.
            let first = self.checkpoint.sequence_next;
            let headers: Vec<PageHeader> = pages
                .iter()
                .enumerate()
                .map(|(index, (meta, _))| PageHeader {
                    kind: meta.kind,
                    end_of_record: meta.end_of_record,
                    zone_generation: generation,
                    sequence: first + index as u64,
                    zone: head.zone,
                    page: head.write_pointer + index as u32,
                    inverted: meta.inverted,
                    length: meta.length,
                    count: meta.count,
                })
                .collect();
            let mut sealed: Vec<(&[u8], Vec<u8>)> =
                pages.iter().map(|(_, data)| (data.as_ref(), vec![0u8; geometry.oob_size_bytes as usize])).collect();
            self.device.seal_pages(&mut sealed, &headers);
            let mut addresses = Vec::with_capacity(pages.len());
            for (header, (data, oob)) in headers.iter().zip(&sealed) {
                let address = PageAddress::new(header.zone, header.page);
                debug_assert_eq!(header.sequence, self.checkpoint.sequence_next);
                // The sequence is spent whether or not the program succeeds:
                // a page that reached the medium must never share it.
                self.checkpoint.sequence_next += 1;
                self.set_head_write_pointer(role, address.page + 1);
                match self.device.program_sealed(address, data, oob) {
                    Ok(()) => {}
                    Err(error @ flintfs_flash::DeviceError::ProgramFailed { .. }) => {
                        // Counted where every program is, the protection
                        // layer (`Protected::programs_failed`).
                        if attempt < attempts {
                            continue 'run;
                        }
                        return Err(error.into());
                    }
                    // A parity page that failed to program after an earlier
                    // page of this run left the zone read-only: the run
                    // starts again in a fresh zone, as after a failed
                    // program of its own, and with no attempt left ends as
                    // one (EIO, a failure of the medium).
                    Err(error)
                        if self
                            .device
                            .report_zone(address.zone)
                            .is_ok_and(|report| report.state == ZoneState::ReadOnly) =>
                    {
                        if attempt < attempts {
                            continue 'run;
                        }
                        // EIO as a failed program's, without the damage
                        // mark: nothing stored is lost.
                        return Err(Error::new(errno::EIO, format!("a zone went read-only under a run: {error}")));
                    }
                    Err(error) => return Err(error.into()),
                }
                self.checkpoint.zones[head.zone as usize].last_sequence = header.sequence;
                addresses.push(address);
            }
            return Ok(addresses);
        }
    }

    /// Fills each log head's erase block to its end with filler pages, so
    /// that its parity goes to flash (unmount does this: a block's pages
    /// have the ECC alone until its parity is written). Returns the pages
    /// it wrote. A head whose zone cannot take them in place is left as it
    /// is, and so is one whose padding a failed program stopped (its zone
    /// read-only, the block's pages with their ECC alone).
    pub fn pad_heads_to_block_ends(&mut self) -> Result<u64> {
        let geometry = self.device.geometry();
        let slots = geometry.block_pages;
        let mut written = 0;
        for head in self.checkpoint.heads.clone() {
            let filled = head.write_pointer % slots;
            if filled == 0 {
                continue;
            }
            let needed = slots - filled;
            if self.head_room_pages(&head)? < needed {
                continue;
            }
            let empty = vec![0u8; geometry.page_size_bytes as usize];
            let pages: Vec<(PageMeta, &[u8])> =
                (0..needed).map(|_| (PageMeta::new(PageKind::Filler, 0), empty.as_slice())).collect();
            // One attempt: a program that fails leaves the zone read-only,
            // its block retired, and the head moves on at its next write,
            // as after any failed program. Padding a fresh zone instead
            // bought nothing and took a zone outside any checkpoint, where
            // the reserve is not allowed: on a full device the unmount
            // then failed for space (the full-device cut sweep on failing
            // flash, seed 425).
            match self.append_run_once(head.role, &pages) {
                Ok(_) => written += u64::from(needed),
                Err(error) => {
                    let report = match self.device.report_zone(head.zone) {
                        Ok(report) if report.state == ZoneState::ReadOnly => report,
                        _ => return Err(error),
                    };
                    // The head stays where the zone's write pointer
                    // stopped, at the failed page: the checkpoint then
                    // records it where mount finds it (one past, mount
                    // counted a page lost from the medium).
                    written += u64::from(report.write_pointer.saturating_sub(head.write_pointer));
                    self.set_head_write_pointer(head.role, report.write_pointer);
                    tracing::debug!(zone = head.zone, "padding stopped by a failed program: {error}");
                }
            }
        }
        Ok(written)
    }

    /// Reads a page this volume wrote and checks it: kind, address and the
    /// zone's current generation.
    pub fn read_page(&mut self, address: PageAddress) -> Result<(PageHeader, Vec<u8>)> {
        self.read_page_into(address, Vec::new())
    }

    /// [`Volume::read_page`] into `buffer`, a page's buffer to reuse.
    pub(crate) fn read_page_into(&mut self, address: PageAddress, buffer: Vec<u8>) -> Result<(PageHeader, Vec<u8>)> {
        let generation = self
            .checkpoint
            .zones
            .get(address.zone as usize)
            .ok_or_else(|| Error::corrupt(format!("{address} is past the device")))?
            .generation;
        let mut pages_read = 0;
        read_verified_into(&mut self.device, address, Some(generation), &mut pages_read, buffer)
    }

    fn set_head_write_pointer(&mut self, role: ZoneRole, write_pointer: u32) {
        let head = self.checkpoint.heads.iter_mut().find(|head| head.role == role).expect("head is open");
        head.write_pointer = write_pointer;
    }

    /// The head of `role`, moved to a fresh zone first if its zone cannot
    /// take `needed` more pages.
    fn head_with_room(&mut self, role: ZoneRole, needed: u32) -> Result<LogHead> {
        loop {
            let current = self.checkpoint.heads.iter().find(|head| head.role == role).copied();
            if let Some(head) = current {
                if self.head_room_pages(&head)? >= needed {
                    return Ok(head);
                }
            }
            self.replace_head(role, current)?;
            // Loops again: a zone shrunk by bad blocks may still be too small.
        }
    }

    /// Moves `role`'s head to a new zone and finishes the one it was in, so
    /// that zone can be cleaned: the scrub does this to a head's zone that
    /// holds damage, which refreshing would otherwise never reach while
    /// the head stays. If no zone can be taken, the head stays.
    pub(crate) fn move_head_on(&mut self, role: ZoneRole) -> Result<()> {
        match self.checkpoint.heads.iter().find(|head| head.role == role).copied() {
            Some(head) => self.replace_head(role, Some(head)),
            None => Ok(()),
        }
    }

    /// Gives `role` a new head zone and finishes `current`'s. The new zone
    /// is taken first: if there is none, the head stays where it was.
    fn replace_head(&mut self, role: ZoneRole, current: Option<LogHead>) -> Result<()> {
        let zone = self.take_unindexed_zone(role)?;
        if let Some(head) = current {
            // The old zone is done: finish it so it stops counting as open.
            if matches!(self.device.report_zone(head.zone)?.state, ZoneState::Open | ZoneState::Closed) {
                self.device.finish_zone(head.zone)?;
            }
        }
        self.checkpoint.heads.retain(|other| other.role != role);
        self.checkpoint.heads.push(LogHead { role, zone, write_pointer: 0 });
        Ok(())
    }

    /// Free, usable zones no head is in, least worn first, leaving
    /// [`RESERVE_ZONES`] of them for the cleaner.
    fn allocatable_zones(&self, checkpoint: &flintfs_format::Checkpoint) -> Vec<u32> {
        let mut candidates: Vec<(u32, u32)> = Vec::new();
        for report in self.device.report_zones() {
            let usage = &checkpoint.zones[report.zone as usize];
            let in_head = checkpoint.heads.iter().any(|head| head.zone == report.zone);
            if report.zone >= FIRST_DYNAMIC_ZONE
                && usage.role == ZoneRole::Free
                && !in_head
                && report.state != ZoneState::Offline
                // A zone its reset would leave with no page (every block
                // retired, or too few left for its parity) is no zone: it
                // was counted free, and could stand for the margin kept
                // for a failed program.
                && self.device.capacity_after_reset(&report) > 0
            {
                candidates.push((report.erase_count_max, report.zone));
            }
        }
        candidates.sort();
        let reserve = if self.reserve_allowed { 0 } else { RESERVE_ZONES as usize };
        let usable = candidates.len().saturating_sub(reserve);
        candidates.into_iter().take(usable).map(|(_, zone)| zone).collect()
    }

    /// The next zone of the declared unindexed list, reset and given its
    /// role. The engine takes a checkpoint between operations before the
    /// list can run out; if one operation still outruns it, the zone comes
    /// from the free zones directly (counted in `undeclared_zones_taken`):
    /// nothing durable refers to a free zone, so this costs only what a
    /// crash before the next checkpoint loses anyway.
    fn take_unindexed_zone(&mut self, role: ZoneRole) -> Result<u32> {
        // The zone taken is written from now on: what `erase_ahead` found
        // erased no longer holds, whatever the list is declared as next.
        self.erased_ahead.clear();
        let zone = if self.unindexed_used < self.checkpoint.unindexed.len() {
            // Of the declared zones left, an erased one if there is one
            // (a reset here is 3 ms inside whatever operation filled the
            // head: after a checkpoint that freed victims, the log's first
            // fsync), and of those the one that starts farthest from the
            // dies the other heads program next: an fsync programs the
            // data head and the log head together, and two programs on one
            // die take twice as long. The list is a set to recovery (it
            // finds each zone's use from the zone's first page), so taking
            // one out of turn is safe.
            let left = &self.checkpoint.unindexed[self.unindexed_used..];
            let mut erased = Vec::with_capacity(left.len());
            for (index, &zone) in left.iter().enumerate() {
                if !self.zone_holds_pages(zone)? {
                    erased.push(index);
                }
            }
            let chosen = if erased.is_empty() {
                self.die_farthest_from_heads(role, left)
            } else {
                let candidates: Vec<u32> = erased.iter().map(|&index| left[index]).collect();
                erased[self.die_farthest_from_heads(role, &candidates)]
            };
            self.checkpoint.unindexed.swap(self.unindexed_used, self.unindexed_used + chosen);
            let zone = self.checkpoint.unindexed[self.unindexed_used];
            self.unindexed_used += 1;
            zone
        } else {
            let taken: Vec<u32> = self.checkpoint.unindexed[..self.unindexed_used].to_vec();
            let zone = self
                .allocatable_zones(&self.checkpoint)
                .into_iter()
                .find(|zone| !taken.contains(zone) && !self.checkpoint.unindexed.contains(zone))
                .ok_or_else(|| Error::new(errno::ENOSPC, "no free zone left to allocate"))?;
            self.undeclared_zones_taken += 1;
            zone
        };
        if self.zone_holds_pages(zone)? {
            // Pages written after the last checkpoint that a crash orphaned,
            // or a zone the file system no longer references: erased, one
            // generation on.
            self.device.reset_zone(zone)?;
        }
        // Every new use of a zone is a new generation, and the zone is empty
        // when it starts, so a page left from an earlier use can never pass
        // for one of this use.
        let usage = &mut self.checkpoint.zones[zone as usize];
        usage.generation = usage.generation.wrapping_add(1);
        usage.role = role;
        self.set_valid_bytes(zone, 0);
        Ok(zone)
    }

    /// Erases one declared zone that heads have not taken yet and that
    /// still holds an earlier use's pages; returns whether it did. Called
    /// at an operation's start, when the last flush has left the dies
    /// idle: a reset at take time waited behind whatever the other heads
    /// had just queued on those dies (a checkpoint's node pages: 38 ms
    /// more on the slowest write of near_full_80). The declaration is
    /// durable, so nothing references the zone, and recovery reads an
    /// empty declared zone as one no head took.
    pub fn erase_ahead(&mut self) -> Result<bool> {
        let left = &self.checkpoint.unindexed[self.unindexed_used..];
        if !left.is_empty() && self.erased_ahead == left {
            // Every one was erased when last asked, and no zone was taken
            // since (a take forgets the answer). A report per zone per
            // operation was 4% of delete's host time in process. Were one
            // written anyway, the take resets it (`take_unindexed_zone`).
            return Ok(false);
        }
        self.erased_ahead.clear();
        for index in self.unindexed_used..self.checkpoint.unindexed.len() {
            let zone = self.checkpoint.unindexed[index];
            if self.zone_holds_pages(zone)? {
                self.device.reset_zone(zone)?;
                return Ok(true);
            }
        }
        self.erased_ahead.extend_from_slice(&self.checkpoint.unindexed[self.unindexed_used..]);
        Ok(false)
    }

    /// Whether `zone` must be reset before a head writes it: it holds
    /// pages of an earlier use, or is not in the erased state.
    fn zone_holds_pages(&self, zone: u32) -> Result<bool> {
        let report = self.device.report_zone(zone)?;
        Ok(report.write_pointer > 0 || report.state != ZoneState::Empty)
    }

    /// The index in `candidates` of the zone whose first page's die is
    /// farthest from the next page of every head but `role`'s.
    fn die_farthest_from_heads(&self, role: ZoneRole, candidates: &[u32]) -> usize {
        let busy: Vec<u32> = self
            .checkpoint
            .heads
            .iter()
            .filter(|head| head.role != role)
            .filter_map(|head| self.device.die_of(PageAddress::new(head.zone, head.write_pointer)))
            .collect();
        let starts: Vec<Option<u32>> =
            candidates.iter().map(|&zone| self.device.die_of(PageAddress::new(zone, 0))).collect();
        farthest_die(self.device.die_count(), &busy, &starts)
    }

    /// Free zones allocation can hand out (the reserve apart, unless
    /// allowed).
    pub fn allocatable_zone_count(&self) -> usize {
        let taken = &self.checkpoint.unindexed[..self.unindexed_used];
        self.allocatable_zones(&self.checkpoint).into_iter().filter(|zone| !taken.contains(zone)).count()
    }

    /// The capacity in pages of each zone allocation can hand out (the
    /// reserve apart, unless allowed), smallest first.
    pub fn allocatable_capacities(&self) -> Vec<u64> {
        let taken = &self.checkpoint.unindexed[..self.unindexed_used];
        let reports = self.device.report_zones();
        let mut capacities: Vec<u64> = self
            .allocatable_zones(&self.checkpoint)
            .into_iter()
            .filter(|zone| !taken.contains(zone))
            .map(|zone| u64::from(self.device.capacity_after_reset(&reports[zone as usize])))
            .collect();
        capacities.sort_unstable();
        capacities
    }

    /// Zones that hold nothing referenced and are in no head: the next
    /// checkpoint frees them. A log zone the log has moved on from counts:
    /// the checkpoint truncates the log, and with two zones of log before
    /// a checkpoint (`LOG_ZONES_PER_CHECKPOINT`) up to two wait for one.
    pub fn releasable_zones(&self) -> usize {
        self.checkpoint
            .zones
            .iter()
            .enumerate()
            .filter(|(zone, usage)| {
                *zone as u32 >= FIRST_DYNAMIC_ZONE
                    && matches!(usage.role, ZoneRole::HotData | ZoneRole::ColdData | ZoneRole::Node | ZoneRole::Log)
                    && usage.valid_bytes == 0
                    && !self.checkpoint.heads.iter().any(|head| head.zone == *zone as u32)
            })
            .count()
    }

    /// Zones still to be taken from the declared unindexed list.
    pub fn unindexed_remaining(&self) -> usize {
        self.checkpoint.unindexed.len().saturating_sub(self.unindexed_used)
    }

    /// Pages `role`'s head can still program in its current zone
    /// ([`Volume::head_room_pages`]). Counted from the capacity alone, the
    /// room of a head left on a read-only zone sized the next run of data
    /// blocks to a zone that is gone, and only a zone as roomy could take
    /// it.
    pub fn head_free_pages(&self, role: ZoneRole) -> u64 {
        let Some(head) = self.checkpoint.heads.iter().find(|head| head.role == role) else { return 0 };
        u64::from(self.head_room_pages(head).unwrap_or(0))
    }

    /// Pages `head` can still append in its zone. A head appends only to a
    /// zone that takes programs at the head's own write pointer: after a
    /// crash its zone may have been finished (durably), and a failed
    /// program leaves it read-only with the head one page past the
    /// failure. Such a zone has no room.
    fn head_room_pages(&self, head: &LogHead) -> Result<u32> {
        let report = self.device.report_zone(head.zone)?;
        let writable = matches!(report.state, ZoneState::Empty | ZoneState::Open | ZoneState::Closed);
        if !writable || report.write_pointer != head.write_pointer {
            return Ok(0);
        }
        Ok(report.capacity_pages.saturating_sub(head.write_pointer))
    }

    /// Free zones a head could still be given (declared or not), and their
    /// pages.
    pub fn allocatable_pages(&self) -> u64 {
        let taken: Vec<u32> = self.checkpoint.unindexed[..self.unindexed_used].to_vec();
        let reports = self.device.report_zones();
        self.allocatable_zones(&self.checkpoint)
            .into_iter()
            .filter(|zone| !taken.contains(zone))
            .map(|zone| u64::from(self.device.capacity_after_reset(&reports[zone as usize])))
            .sum()
    }

    /// Adds (or with a negative `bytes`, takes away) referenced bytes in
    /// `zone`: the segment usage the cleaner chooses by.
    /// The table comes from flash, so it may be damaged: the sum saturates
    /// rather than panic, and the checker reports any disagreement with
    /// what the tree references.
    pub fn account(&mut self, zone: u32, bytes: i64) {
        // A pointer from a damaged page may name a zone past the device;
        // it references nothing there to count.
        let Some(usage) = self.checkpoint.zones.get(zone as usize) else { return };
        let valid_bytes = if bytes >= 0 {
            usage.valid_bytes.saturating_add(bytes as u64)
        } else {
            usage.valid_bytes.saturating_sub(bytes.unsigned_abs())
        };
        self.set_valid_bytes(zone, valid_bytes);
    }

    /// Declares the next unindexed list: up to k allocatable zones, never
    /// the cleaner's reserve (whatever the current operation may use),
    /// least worn first; at unmount, empty zones before those that hold
    /// pages of an earlier use (see `declare_empty_first`).
    pub(crate) fn declare_unindexed(&mut self, checkpoint: &mut flintfs_format::Checkpoint) -> Result<()> {
        let k = self.superblock.unindexed_segments as usize;
        let allowed = std::mem::replace(&mut self.reserve_allowed, false);
        let mut zones = self.allocatable_zones(checkpoint);
        self.reserve_allowed = allowed;
        if self.declare_empty_first {
            let mut keyed = Vec::with_capacity(zones.len());
            for zone in zones {
                keyed.push((self.device.report_zone(zone)?.write_pointer > 0, zone));
            }
            // A stable sort: least worn first within each group.
            keyed.sort_by_key(|&(holds_pages, _)| holds_pages);
            zones = keyed.into_iter().map(|(_, zone)| zone).collect();
        }
        checkpoint.unindexed = zones.into_iter().take(k).collect();
        Ok(())
    }
}

/// Of `candidates` (each a die, or `None` where the device does not say),
/// the index of the one farthest around the ring of `dies` from the
/// nearest of `busy`; the first on a tie, so the declared order (least
/// worn first) decides when the dies do not.
fn farthest_die(dies: u32, busy: &[u32], candidates: &[Option<u32>]) -> usize {
    if dies <= 1 || busy.is_empty() {
        return 0;
    }
    let distance = |die: u32| {
        busy.iter()
            .map(|&other| {
                let apart = die.abs_diff(other) % dies;
                apart.min(dies - apart)
            })
            .min()
            .unwrap_or(0)
    };
    let mut best: (usize, Option<u32>) = (0, None);
    for (index, die) in candidates.iter().enumerate() {
        let Some(die) = *die else { continue };
        let apart = distance(die);
        if best.1.is_none_or(|best_apart| apart > best_apart) {
            best = (index, Some(apart));
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::farthest_die;

    #[test]
    fn the_zone_starting_farthest_from_every_busy_die_is_chosen() {
        // 32 dies, the data head on die 3: a zone starting on die 19 is
        // half the ring away, one on die 0 three dies away.
        assert_eq!(farthest_die(32, &[3], &[Some(0), Some(16), Some(19), Some(4)]), 2);
        // Distance wraps around the ring: die 31 is two from die 1.
        assert_eq!(farthest_die(32, &[1], &[Some(31), Some(5)]), 1);
        // The nearest busy die counts: 8 is 8 from 0 and 8 from 16; 24
        // is 8 from 16 and 8 from 0; 12 is only 4 from 16.
        assert_eq!(farthest_die(32, &[0, 16], &[Some(12), Some(8), Some(24)]), 1);
    }

    #[test]
    fn ties_and_silent_devices_keep_the_declared_order() {
        // Equal distances: the first, the least worn.
        assert_eq!(farthest_die(32, &[0], &[Some(16), Some(16)]), 0);
        // One die, no other head, or no die known: the first.
        assert_eq!(farthest_die(1, &[0], &[Some(0), Some(0)]), 0);
        assert_eq!(farthest_die(32, &[], &[Some(0), Some(16)]), 0);
        assert_eq!(farthest_die(32, &[0], &[None, None]), 0);
        // A candidate the device says nothing of is passed over.
        assert_eq!(farthest_die(32, &[0], &[None, Some(2)]), 1);
    }
}
