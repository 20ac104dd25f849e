//! Scrub: the consistency checker RCFFS runs in idle time (section 3.2).
//!
//! - The full scrub reads every page a zone holds as a user read would,
//!   through the protection layer, so every page the ECC or parity brings
//!   back is counted and its zone queued for moving; it then reads every
//!   parity page, so damage to parity is found before parity is needed.
//!   Zones queued for moving are cleaned at the end: their live data is
//!   rewritten elsewhere through the cleaner's ordinary path (read
//!   reclaim), and the zones are reset, leaving out blocks retired.
//! - The quick scrub reads OOBs only and checks each stripe's parity
//!   signatures against its pages' (RCFFS's quick scan): torn or damaged
//!   stripes show, bit flips in data do not.

use flintfs_flash::{FlashDevice, PageAddress, PageState};
use flintfs_format::{PageHeader, ZoneRole};

use super::Fs;
use crate::error::Result;

/// Unrepairable pages a report names one by one; past this it counts.
pub const SCRUB_NAMED_PAGES_MAX: usize = 64;
/// Most pages one idle step of the background scrub reads, however long
/// the mount was idle: an operation that arrives waits for at most this.
pub const SCRUB_PAGES_PER_STEP_MAX: u64 = 128;

/// Where the background scrub is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScrubCursor {
    pub zone: u32,
    pub page: u32,
    /// The engine's clock when the scrub's budget was last drawn.
    pub last_ns: i64,
}

/// What a scrub checked and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub quick: bool,
    pub zones_scanned: u64,
    /// Pages read as a user read would (full mode).
    pub pages_checked: u64,
    /// Of those, pages the ECC corrected.
    pub pages_corrected: u64,
    /// Of those, pages rebuilt from block or zone parity.
    pub pages_repaired: u64,
    /// Of those, pages nothing could bring back.
    pub pages_unrepairable: u64,
    /// The first [`SCRUB_NAMED_PAGES_MAX`] of them, with the reason.
    pub unrepairable: Vec<String>,
    pub parity_pages_checked: u64,
    pub parity_pages_bad: u64,
    /// Stripes checked by signature (quick mode).
    pub stripes_checked: u64,
    pub stripes_inconsistent: u64,
    /// OOB reads the quick scan took.
    pub oob_reads: u64,
    /// Zones whose live data moved because of what the scrub found.
    pub zones_refreshed: u64,
    /// Of the pages checked, those whose ECC correction reached the worn
    /// mark (`EccLayout::worn_bits`): each moves its zone's data.
    pub pages_worn: u64,
    /// Erase blocks retired during the scrub: their corrected reads needed
    /// half the ECC's reach on average, or two of their pages parity.
    pub blocks_retired: u64,
}

impl<D: FlashDevice> Fs<D> {
    /// The scrub that runs in idle time: reads the pages its rate allows
    /// since it last ran (at most [`SCRUB_PAGES_PER_STEP_MAX`]) as a user
    /// read would, going on from where it stopped, zone by zone, and checks
    /// each zone's parity pages as it leaves it. What it meets is
    /// corrected or repaired and its zone queued for moving, as on any
    /// read. Returns the pages it read.
    pub fn scrub_in_background(&mut self) -> Result<u64> {
        let rate = u64::from(self.options.scrub_pages_per_second);
        if rate == 0 || self.options.read_only {
            return Ok(0);
        }
        let now = self.clock.now_ns();
        let elapsed_ns = u64::try_from(now.saturating_sub(self.scrub_cursor.last_ns)).unwrap_or(0);
        let due = (u128::from(elapsed_ns) * u128::from(rate) / 1_000_000_000) as u64;
        if due == 0 {
            return Ok(0);
        }
        self.scrub_cursor.last_ns = now;
        let budget = due.min(SCRUB_PAGES_PER_STEP_MAX);
        let geometry = self.volume.device.geometry();
        let mut data = vec![0u8; geometry.page_size_bytes as usize];
        let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
        let mut read = 0;
        // Each zone is visited at most once a step, so a device with
        // nothing written ends the step.
        for _ in 0..=geometry.zone_count {
            let zone = self.scrub_cursor.zone;
            let in_use = self.volume.checkpoint.zones[zone as usize].role != ZoneRole::Free;
            let write_pointer = if in_use { self.volume.device.report_zone(zone)?.write_pointer } else { 0 };
            while self.scrub_cursor.page < write_pointer && read < budget {
                let address = PageAddress::new(zone, self.scrub_cursor.page);
                self.scrub_cursor.page += 1;
                read += 1;
                let failure = match self.volume.device.read_page(address, &mut data, &mut oob) {
                    Ok(PageState::Erased) => Some("erased below the write pointer".to_string()),
                    Ok(PageState::Programmed) => PageHeader::decode(&oob, &data).err().map(|error| error.to_string()),
                    Err(error) if error.is_media_failure() => Some(error.to_string()),
                    Err(error) => return Err(error.into()),
                };
                if let Some(reason) = failure {
                    tracing::warn!(
                        zone,
                        page = address.page,
                        "the background scrub met a page nothing brings back: {reason}"
                    );
                }
            }
            if read >= budget {
                break;
            }
            if write_pointer > 0 {
                self.volume.device.check_parity_pages(zone)?;
            }
            self.scrub_cursor.page = 0;
            self.scrub_cursor.zone = (zone + 1) % geometry.zone_count;
            if self.scrub_cursor.zone == 0 {
                self.counters.scrub_passes_finished += 1;
            }
        }
        self.counters.pages_scrubbed_in_background += read;
        Ok(read)
    }

    /// Scrubs every zone that holds pages (see the module's account).
    pub fn scrub(&mut self, quick: bool) -> Result<ScrubReport> {
        self.refuse_if_read_only("a scrub, which repairs what it finds")?;
        // What is buffered goes to flash first, so the scrub sees it.
        self.sync()?;
        let before = self.volume.protection_counters();
        let mut report = ScrubReport { quick, ..ScrubReport::default() };
        let zone_count = self.volume.device.geometry().zone_count;
        for zone in 0..zone_count {
            if self.volume.checkpoint.zones[zone as usize].role == ZoneRole::Free {
                continue;
            }
            let zone_report = self.volume.device.report_zone(zone)?;
            if zone_report.write_pointer == 0 {
                continue;
            }
            report.zones_scanned += 1;
            if quick {
                let scan = self.volume.device.quick_scan(zone)?;
                report.stripes_checked += scan.stripes_checked;
                report.stripes_inconsistent += scan.stripes_inconsistent;
                report.oob_reads += scan.oob_reads;
                continue;
            }
            let geometry = self.volume.device.geometry();
            let mut data = vec![0u8; geometry.page_size_bytes as usize];
            let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
            for page in 0..zone_report.write_pointer {
                let address = PageAddress::new(zone, page);
                report.pages_checked += 1;
                let failure = match self.volume.device.read_page(address, &mut data, &mut oob) {
                    Ok(PageState::Erased) => Some("erased below the write pointer".to_string()),
                    Ok(PageState::Programmed) => PageHeader::decode(&oob, &data).err().map(|error| error.to_string()),
                    Err(error) => Some(error.to_string()),
                };
                if let Some(reason) = failure {
                    report.pages_unrepairable += 1;
                    if report.unrepairable.len() < SCRUB_NAMED_PAGES_MAX {
                        report.unrepairable.push(format!("{address}: {reason}"));
                    }
                }
            }
            let (checked, bad) = self.volume.device.check_parity_pages(zone)?;
            report.parity_pages_checked += checked;
            report.parity_pages_bad += bad;
        }
        let after = self.volume.protection_counters();
        report.pages_corrected = after.pages_corrected_ecc - before.pages_corrected_ecc;
        report.pages_repaired = after.pages_repaired() - before.pages_repaired();
        if !quick {
            report.zones_refreshed = self.refresh_zones()?;
        }
        report.pages_worn = after.pages_worn - before.pages_worn;
        report.blocks_retired = self.volume.protection_counters().blocks_retired - before.blocks_retired;
        Ok(report)
    }
}
