//! Log heads and zone allocation. Each role (hot data, cold data, node
//! pages, metadata log) appends to its own open zone. A head that fills its
//! zone moves to the next zone of the unindexed list the last checkpoint
//! declared (ReconFS's unindexed zone, RCFFS's next-k segments), so
//! recovery only ever has to scan those. When the list runs out, a
//! checkpoint declares a new one.

use flintfs_flash::{FlashDevice, PageAddress, ZoneState};
use flintfs_format::{InvertedIndex, LogHead, PageHeader, PageKind, ZoneRole};

use crate::error::{errno, Error, Result};
use crate::volume::{program, read_verified, Volume};

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
}

impl<D: FlashDevice> Volume<D> {
    /// Programs one page at `role`'s head and returns where it went.
    pub fn append(&mut self, role: ZoneRole, meta: PageMeta, data: &[u8]) -> Result<PageAddress> {
        Ok(self.append_run(role, &[(meta, data)])?[0])
    }

    /// Programs pages consecutively in one zone of `role`'s head (a
    /// multi-page record must not straddle zones) and returns where each went.
    pub fn append_run(&mut self, role: ZoneRole, pages: &[(PageMeta, &[u8])]) -> Result<Vec<PageAddress>> {
        assert!(role.is_log_head(), "{role:?} has no log head");
        assert!(!pages.is_empty());
        let needed = pages.len() as u32;
        let head = self.head_with_room(role, needed)?;
        let generation = self.checkpoint.zones[head.zone as usize].generation;
        let mut addresses = Vec::with_capacity(pages.len());
        for (index, (meta, data)) in pages.iter().enumerate() {
            let address = PageAddress::new(head.zone, head.write_pointer + index as u32);
            let header = PageHeader {
                kind: meta.kind,
                end_of_record: meta.end_of_record,
                zone_generation: generation,
                sequence: self.checkpoint.sequence_next,
                zone: address.zone,
                page: address.page,
                inverted: meta.inverted,
                length: meta.length,
                count: meta.count,
            };
            program(&mut self.device, address, &header, data)?;
            self.checkpoint.zones[head.zone as usize].last_sequence = self.checkpoint.sequence_next;
            self.checkpoint.sequence_next += 1;
            self.set_head_write_pointer(role, address.page + 1);
            addresses.push(address);
        }
        Ok(addresses)
    }

    /// Reads a page this volume wrote and checks it: kind, address and the
    /// zone's current generation.
    pub fn read_page(&mut self, address: PageAddress) -> Result<(PageHeader, Vec<u8>)> {
        let generation = self
            .checkpoint
            .zones
            .get(address.zone as usize)
            .ok_or_else(|| Error::corrupt(format!("{address} is past the device")))?
            .generation;
        let mut pages_read = 0;
        read_verified(&mut self.device, address, Some(generation), &mut pages_read)
    }

    fn set_head_write_pointer(&mut self, role: ZoneRole, write_pointer: u32) {
        let head = self.checkpoint.heads.iter_mut().find(|head| head.role == role).expect("head is open");
        head.write_pointer = write_pointer;
    }

    /// The head of `role`, moved to a fresh zone first if its zone cannot
    /// take `needed` more pages.
    fn head_with_room(&mut self, role: ZoneRole, needed: u32) -> Result<LogHead> {
        let current = self.checkpoint.heads.iter().find(|head| head.role == role).copied();
        if let Some(head) = current {
            let capacity = self.device.report_zone(head.zone)?.capacity_pages;
            if head.write_pointer + needed <= capacity {
                return Ok(head);
            }
        }
        // A new zone first: if there is none, the head stays where it was.
        let zone = self.take_unindexed_zone(role)?;
        let capacity = self.device.report_zone(zone)?.capacity_pages;
        if needed > capacity {
            return Err(Error::invalid(format!("{needed} pages cannot fit in zone {zone} of {capacity}")));
        }
        if let Some(head) = current {
            // The old zone is done: finish it so it stops counting as open.
            if self.device.report_zone(head.zone)?.state != ZoneState::Full {
                self.device.finish_zone(head.zone)?;
            }
        }
        let head = LogHead { role, zone, write_pointer: 0 };
        self.checkpoint.heads.retain(|other| other.role != role);
        self.checkpoint.heads.push(head);
        Ok(head)
    }

    /// The next zone of the declared unindexed list, reset and given its
    /// role; a checkpoint first when the list is used up.
    fn take_unindexed_zone(&mut self, role: ZoneRole) -> Result<u32> {
        if self.unindexed_used >= self.checkpoint.unindexed.len() {
            self.write_checkpoint()?;
            if self.checkpoint.unindexed.is_empty() {
                return Err(Error::new(errno::ENOSPC, "no free zone left to allocate"));
            }
        }
        let zone = self.checkpoint.unindexed[self.unindexed_used];
        self.unindexed_used += 1;
        let report = self.device.report_zone(zone)?;
        if report.write_pointer > 0 || report.state != ZoneState::Empty {
            // Pages written after the last checkpoint that a crash orphaned,
            // or a zone freed by the cleaner: erased, one generation on.
            self.device.reset_zone(zone)?;
        }
        // Every new use of a zone is a new generation, so a page left from
        // an earlier use can never pass for one of this use.
        let usage = &mut self.checkpoint.zones[zone as usize];
        usage.generation = usage.generation.wrapping_add(1);
        usage.role = role;
        usage.valid_bytes = 0;
        Ok(zone)
    }

    /// Picks the next unindexed list: free, usable zones, least worn first,
    /// none that a head is in.
    pub(crate) fn declare_unindexed(&self, checkpoint: &mut flintfs_format::Checkpoint) {
        let k = self.superblock.unindexed_segments as usize;
        let mut candidates: Vec<(u32, u32)> = Vec::new();
        for report in self.device.report_zones() {
            let usage = &checkpoint.zones[report.zone as usize];
            let in_head = checkpoint.heads.iter().any(|head| head.zone == report.zone);
            if usage.role == ZoneRole::Free
                && !in_head
                && report.capacity_pages > 0
                && report.state != ZoneState::Offline
            {
                candidates.push((report.erase_count_max, report.zone));
            }
        }
        candidates.sort();
        checkpoint.unindexed = candidates.into_iter().take(k).map(|(_, zone)| zone).collect();
    }
}
