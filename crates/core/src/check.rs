//! The checker: every invariant of what is on flash, checked against the
//! device itself. It grows with the engine. What it covers now is the
//! durable frame: superblocks, checkpoint, segment usage against the
//! device's zones, log heads, and every page of every zone in use.
//! `flintfs fsck` runs it; tests run it after every mount.

use std::collections::BTreeMap;

use flintfs_flash::{FlashDevice, PageAddress, ZoneState};
use flintfs_format::{PageKind, Superblock, ZoneRole, CHECKPOINT_ZONES, SUPERBLOCK_ZONES};

use crate::error::Result;
use crate::volume::{read_verified, Volume};

/// What the checker found. Each finding names where and what.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub findings: Vec<String>,
    /// Pages read and verified.
    pub pages_checked: u64,
    pub zones_checked: u32,
    /// Pages written after the mounted checkpoint by a stop that was not
    /// clean, that do not verify (torn); expected, and not findings.
    pub orphans_damaged: u64,
    /// Pages that do not verify and that nothing references (when the file
    /// system's checker decides what is referenced).
    pub pages_unverified: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Page kinds a zone of each role may hold.
fn kind_fits(role: ZoneRole, kind: PageKind) -> bool {
    if kind == PageKind::Filler {
        // Unmount fills blocks in every zone that is written to.
        return !matches!(role, ZoneRole::Free | ZoneRole::Superblock);
    }
    match role {
        ZoneRole::HotData | ZoneRole::ColdData => matches!(kind, PageKind::DataBlock | PageKind::PackedData),
        ZoneRole::Node => kind == PageKind::Node,
        ZoneRole::Log => kind == PageKind::Log,
        ZoneRole::Checkpoint => kind == PageKind::Checkpoint,
        ZoneRole::Superblock => kind == PageKind::Superblock,
        ZoneRole::Free => false,
    }
}

impl<D: FlashDevice> Volume<D> {
    /// Checks every invariant it knows against the device. Reads every page
    /// of every zone in use: this is fsck, not mount. Every page must
    /// verify, except those a crash orphaned.
    pub fn check(&mut self) -> Result<CheckReport> {
        self.check_frame(true)
    }

    /// The frame's checks. With `every_page_verifies` false, a page that
    /// does not verify is counted, not reported: the file system's own
    /// checker reports exactly the damaged pages something references, and
    /// an unreferenced page is garbage whatever its bytes (a page torn by a
    /// power cut stays in its zone until the zone is cleaned).
    pub(crate) fn check_frame(&mut self, every_page_verifies: bool) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let mut pages_read = 0;
        self.check_superblocks(&mut report, &mut pages_read);
        // The live state is the last checkpoint plus what happened since:
        // zones taken from the unindexed list have their roles now, and only
        // the rest of the list must still be free.
        let mut live = self.checkpoint.clone();
        live.unindexed.drain(..self.unindexed_used.min(live.unindexed.len()));
        if let Err(reason) = live.validate() {
            report.findings.push(format!("checkpoint {} (live): {reason}", self.checkpoint.number));
        }
        let zones = self.device.report_zones();
        if zones.len() != self.checkpoint.zones.len() {
            report.findings.push(format!(
                "the usage table has {} zones, the device {}",
                self.checkpoint.zones.len(),
                zones.len()
            ));
            return Ok(report);
        }
        let mut sequences: BTreeMap<u64, PageAddress> = BTreeMap::new();
        for zone in &zones {
            let usage = self.checkpoint.zones[zone.zone as usize];
            report.zones_checked += 1;
            if let Some(head) = self.checkpoint.heads.iter().find(|head| head.zone == zone.zone) {
                if head.write_pointer != zone.write_pointer {
                    report.findings.push(format!(
                        "zone {}: the {:?} head is at page {}, the device at {}",
                        zone.zone, head.role, head.write_pointer, zone.write_pointer
                    ));
                }
                // A full, finished or read-only head zone is fine: the next
                // append moves the head on. An offline one has lost its pages.
                if zone.state == ZoneState::Offline {
                    report.findings.push(format!("zone {}: the {:?} head is in an offline zone", zone.zone, head.role));
                }
            }
            if SUPERBLOCK_ZONES.contains(&zone.zone) && (zone.write_pointer != 1 || zone.state != ZoneState::Full) {
                report.findings.push(format!(
                    "superblock zone {}: {} pages, {}; it should hold exactly one, finished",
                    zone.zone,
                    zone.write_pointer,
                    zone.state.name()
                ));
            }
            // Free zones may hold pages a crash orphaned; they are erased
            // before their next use, and their contents do not matter.
            if usage.role == ZoneRole::Free || SUPERBLOCK_ZONES.contains(&zone.zone) {
                continue;
            }
            // Checkpoint zones hold torn records after a crash; only the
            // pages that verify are held to the rules.
            let checkpoint_zone = CHECKPOINT_ZONES.contains(&zone.zone);
            for page in 0..zone.write_pointer {
                let address = PageAddress::new(zone.zone, page);
                match read_verified(&mut self.device, address, Some(usage.generation), &mut pages_read) {
                    Ok((header, _)) => {
                        report.pages_checked += 1;
                        if !kind_fits(usage.role, header.kind) {
                            report
                                .findings
                                .push(format!("{address}: a {:?} page in a {:?} zone", header.kind, usage.role));
                        }
                        if header.sequence >= self.checkpoint.sequence_next {
                            report.findings.push(format!(
                                "{address}: sequence {} is not below the next to allocate ({})",
                                header.sequence, self.checkpoint.sequence_next
                            ));
                        }
                        if let Some(other) = sequences.insert(header.sequence, address) {
                            report
                                .findings
                                .push(format!("{address}: sequence {} is also used at {other}", header.sequence));
                        }
                    }
                    Err(_) if checkpoint_zone => {}
                    Err(_)
                        if self.orphans.iter().any(|&(orphan_zone, first, end)| {
                            orphan_zone == zone.zone && (first..end).contains(&page)
                        }) =>
                    {
                        report.orphans_damaged += 1;
                    }
                    Err(_) if !every_page_verifies => report.pages_unverified += 1,
                    Err(error) => report.findings.push(format!("{address}: {error}")),
                }
            }
        }
        Ok(report)
    }

    fn check_superblocks(&mut self, report: &mut CheckReport, pages_read: &mut u64) {
        for zone in SUPERBLOCK_ZONES {
            let address = PageAddress::new(zone, 0);
            match read_verified(&mut self.device, address, Some(0), pages_read) {
                Ok((header, data)) => {
                    report.pages_checked += 1;
                    match Superblock::decode(&data) {
                        Ok(copy) if header.kind == PageKind::Superblock && copy == self.superblock => {}
                        Ok(_) => report.findings.push(format!("{address}: the superblock copy differs")),
                        Err(error) => report.findings.push(format!("{address}: {error}")),
                    }
                }
                Err(error) => report.findings.push(format!("{address}: {error}")),
            }
        }
    }
}
