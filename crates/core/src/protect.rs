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
//! 4. otherwise the damaged bytes are returned as they are, counted as
//!    unrepairable, and the caller's checks refuse them (EIO).

use std::sync::{Arc, Mutex};

use flintfs_flash::{Counters, FlashDevice, Geometry, PageAddress, PageState, Result, ZoneReport};
use flintfs_format::protection::{self, EccLayout, OOB_BYTES_MIN};
use flintfs_format::PageHeader;

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
}

impl<D: FlashDevice> Protected<D> {
    pub fn new(inner: D) -> Protected<D> {
        let geometry = inner.geometry();
        let ecc = ecc_layout(&geometry);
        Protected { inner, ecc, counters: ProtectionCounters::default(), oob_scratch: Vec::new() }
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
        self.counters
    }

    /// The ECC this device's pages carry (`None` when the OOB has no room).
    pub fn ecc(&self) -> Option<&EccLayout> {
        self.ecc.as_deref()
    }

    /// Tries the ECC on a page that failed its CRC; true if it is now
    /// whole by both the CRC and the signature.
    fn correct_with_ecc(&mut self, data: &mut [u8], oob: &mut [u8]) -> bool {
        let Some(layout) = self.ecc.clone() else { return false };
        let correction = protection::correct(data, oob, &layout);
        if correction.bits_corrected == 0 {
            return false;
        }
        if PageHeader::decode(oob, data).is_ok() && protection::signature_matches(data, oob) {
            self.counters.pages_corrected_ecc += 1;
            self.counters.bits_corrected_ecc += u64::from(correction.bits_corrected);
            return true;
        }
        false
    }
}

impl<D: FlashDevice> FlashDevice for Protected<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn read_page(&mut self, address: PageAddress, data: &mut [u8], oob: &mut [u8]) -> Result<PageState> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let state = match self.inner.read_page(address, data, oob) {
                Ok(state) => state,
                Err(error) if error.is_media_failure() && attempt < READ_ATTEMPTS => continue,
                Err(error) => {
                    if error.is_media_failure() {
                        self.counters.pages_unrepairable += 1;
                    }
                    return Err(error);
                }
            };
            if state == PageState::Erased || PageHeader::decode(oob, data).is_ok() || self.correct_with_ecc(data, oob) {
                return Ok(state);
            }
            if attempt >= READ_ATTEMPTS {
                self.counters.pages_unrepairable += 1;
                return Ok(state);
            }
        }
    }

    fn read_oob(&mut self, address: PageAddress, oob: &mut [u8]) -> Result<PageState> {
        self.inner.read_oob(address, oob)
    }

    fn program_page(&mut self, address: PageAddress, data: &[u8], oob: &[u8]) -> Result<()> {
        let mut sealed = std::mem::take(&mut self.oob_scratch);
        sealed.clear();
        sealed.extend_from_slice(oob);
        protection::seal(data, &mut sealed, self.ecc.as_deref());
        let result = self.inner.program_page(address, data, &sealed);
        self.oob_scratch = sealed;
        result
    }

    fn reset_zone(&mut self, zone: u32) -> Result<()> {
        self.inner.reset_zone(zone)
    }

    fn finish_zone(&mut self, zone: u32) -> Result<()> {
        self.inner.finish_zone(zone)
    }

    fn report_zone(&self, zone: u32) -> Result<ZoneReport> {
        self.inner.report_zone(zone)
    }

    fn report_zones(&self) -> Vec<ZoneReport> {
        self.inner.report_zones()
    }

    fn flush(&mut self) -> Result<()> {
        self.inner.flush()
    }

    fn nvm_read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.nvm_read(offset, buffer)
    }

    fn nvm_write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.nvm_write(offset, data)
    }

    fn nvm_persist(&mut self, offset: u64, length: u64) -> Result<()> {
        self.inner.nvm_persist(offset, length)
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
        self.inner.die_of(address)
    }
}
