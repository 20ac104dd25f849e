//! Device geometry, page addresses and the limits that bound them.

use crate::error::{DeviceError, Result};

/// Smallest page the emulator accepts. Below this the OOB-to-data ratio and
/// the file system's chunk headers stop making sense.
pub const PAGE_SIZE_BYTES_MIN: u32 = 512;
/// Largest page the emulator accepts (the largest NAND pages on the market are
/// 16 KiB; 64 KiB leaves room for multi-plane pages).
pub const PAGE_SIZE_BYTES_MAX: u32 = 64 * 1024;
/// The spare area must hold what the file system keeps there: page kind,
/// sequence number, a 64-bit signature, a write generation and a checksum.
/// The file system asserts at compile time that its OOB layout fits in this.
pub const OOB_SIZE_BYTES_MIN: u32 = 64;
/// Spare areas above a quarter of the page are not a NAND geometry.
pub const OOB_SIZE_BYTES_MAX: u32 = PAGE_SIZE_BYTES_MAX / 4;
/// A zone may not be larger than this many pages, so a page index within a
/// zone always fits in a `u32` with room to spare.
pub const ZONE_PAGES_MAX: u64 = 1 << 24;
/// The whole device may not be larger than this many pages, so a flat page
/// index fits comfortably in a `u64` and tables stay allocatable.
pub const DEVICE_PAGES_MAX: u64 = 1 << 32;
/// Most zones, and most erase blocks, a device may have: the emulator keeps
/// a record per zone and per block in host memory (about 40 bytes each).
pub const ZONE_COUNT_MAX: u32 = 1 << 20;
pub const BLOCK_COUNT_MAX: u64 = 1 << 22;
/// Upper bound on the NVM region: it is held in host memory.
pub const NVM_SIZE_BYTES_MAX: u64 = 1 << 32;
/// NVM persistence is 8-byte atomic, so the region is made of 8-byte words.
pub const NVM_WORD_BYTES: u64 = 8;

const _: () = assert!(PAGE_SIZE_BYTES_MIN.is_power_of_two());
const _: () = assert!(PAGE_SIZE_BYTES_MAX.is_power_of_two());
const _: () = assert!(OOB_SIZE_BYTES_MIN <= OOB_SIZE_BYTES_MAX);
// The smallest page can carry the smallest spare area within the rule that
// OOB is at most a quarter of the page.
const _: () = assert!(OOB_SIZE_BYTES_MIN <= PAGE_SIZE_BYTES_MIN / 4);
const _: () = assert!(ZONE_COUNT_MAX as u64 <= BLOCK_COUNT_MAX);
const _: () = assert!(ZONE_PAGES_MAX <= u32::MAX as u64);
const _: () = assert!(ZONE_PAGES_MAX <= DEVICE_PAGES_MAX);

/// The shape of the emulated device. Raw NAND is the case `zone_blocks == 1`:
/// every erase block is its own zone with its own write pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Bytes of data in one page (a power of two).
    pub page_size_bytes: u32,
    /// Bytes of spare area (OOB) beside each page.
    pub oob_size_bytes: u32,
    /// Pages in one erase block.
    pub block_pages: u32,
    /// Erase blocks in one zone.
    pub zone_blocks: u32,
    /// Zones on the device.
    pub zone_count: u32,
    /// Zones that may be open (programmed but not full) at once, as on a
    /// ZNS device.
    pub open_zones_max: u32,
    /// Bytes of byte-addressable NVM beside the flash (0 = none). A multiple
    /// of 8: NVM is persisted in 8-byte atomic words.
    pub nvm_size_bytes: u64,
}

impl Default for Geometry {
    /// 4 KiB pages, 128 OOB bytes, 64 pages per block, 16 blocks per zone,
    /// 14 open zones, no NVM; 64 zones (256 MiB) unless a size is chosen.
    fn default() -> Self {
        Geometry {
            page_size_bytes: 4096,
            oob_size_bytes: 128,
            block_pages: 64,
            zone_blocks: 16,
            zone_count: 64,
            open_zones_max: 14,
            nvm_size_bytes: 0,
        }
    }
}

impl Geometry {
    /// The default shape with as many zones as fit in `size_bytes` (rounded
    /// down). The result still has to pass [`Geometry::validate`].
    pub fn with_size_bytes(size_bytes: u64) -> Geometry {
        let mut geometry = Geometry::default();
        let zone_bytes = geometry.zone_size_bytes();
        geometry.zone_count = u32::try_from(size_bytes / zone_bytes).unwrap_or(u32::MAX);
        geometry
    }

    /// Checks every rule on the shape, naming the field that breaks one.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(DeviceError::Geometry { field, reason });
        if !self.page_size_bytes.is_power_of_two()
            || !(PAGE_SIZE_BYTES_MIN..=PAGE_SIZE_BYTES_MAX).contains(&self.page_size_bytes)
        {
            return bad(
                "page_size_bytes",
                format!(
                    "{} is not a power of two between {} and {}",
                    self.page_size_bytes, PAGE_SIZE_BYTES_MIN, PAGE_SIZE_BYTES_MAX
                ),
            );
        }
        if !(OOB_SIZE_BYTES_MIN..=OOB_SIZE_BYTES_MAX).contains(&self.oob_size_bytes) {
            return bad(
                "oob_size_bytes",
                format!(
                    "{} is outside {}..={} (the file system needs at least {} spare bytes per page)",
                    self.oob_size_bytes, OOB_SIZE_BYTES_MIN, OOB_SIZE_BYTES_MAX, OOB_SIZE_BYTES_MIN
                ),
            );
        }
        if self.oob_size_bytes > self.page_size_bytes / 4 {
            return bad(
                "oob_size_bytes",
                format!("{} is more than a quarter of the {}-byte page", self.oob_size_bytes, self.page_size_bytes),
            );
        }
        if self.block_pages == 0 {
            return bad("block_pages", "an erase block needs at least one page".into());
        }
        if self.zone_blocks == 0 {
            return bad("zone_blocks", "a zone needs at least one erase block".into());
        }
        if self.zone_count == 0 {
            return bad("zone_count", "the device needs at least one zone".into());
        }
        if self.open_zones_max == 0 {
            return bad("open_zones_max", "at least one zone must be allowed open".into());
        }
        if self.zone_count > ZONE_COUNT_MAX {
            return bad("zone_count", format!("{} zones is more than the {} allowed", self.zone_count, ZONE_COUNT_MAX));
        }
        if self.zone_pages() > ZONE_PAGES_MAX {
            return bad(
                "zone_blocks",
                format!("a zone of {} pages is more than the {} allowed", self.zone_pages(), ZONE_PAGES_MAX),
            );
        }
        if self.block_count() > BLOCK_COUNT_MAX {
            return bad(
                "zone_count",
                format!("{} erase blocks is more than the {} allowed", self.block_count(), BLOCK_COUNT_MAX),
            );
        }
        if self.device_pages() > DEVICE_PAGES_MAX {
            return bad(
                "zone_count",
                format!("a device of {} pages is more than the {} allowed", self.device_pages(), DEVICE_PAGES_MAX),
            );
        }
        if !self.nvm_size_bytes.is_multiple_of(NVM_WORD_BYTES) || self.nvm_size_bytes > NVM_SIZE_BYTES_MAX {
            return bad(
                "nvm_size_bytes",
                format!("{} is not a multiple of {} up to {}", self.nvm_size_bytes, NVM_WORD_BYTES, NVM_SIZE_BYTES_MAX),
            );
        }
        Ok(())
    }

    /// Pages in one zone, counting every block (good or bad).
    pub fn zone_pages(&self) -> u64 {
        u64::from(self.block_pages) * u64::from(self.zone_blocks)
    }

    /// Bytes of data in one zone, counting every block.
    pub fn zone_size_bytes(&self) -> u64 {
        self.zone_pages() * u64::from(self.page_size_bytes)
    }

    /// Erase blocks on the device.
    pub fn block_count(&self) -> u64 {
        u64::from(self.zone_blocks) * u64::from(self.zone_count)
    }

    /// Pages on the device.
    pub fn device_pages(&self) -> u64 {
        self.zone_pages() * u64::from(self.zone_count)
    }

    /// Bytes of data on the device (spare area excluded).
    pub fn device_size_bytes(&self) -> u64 {
        self.device_pages() * u64::from(self.page_size_bytes)
    }

    /// True for raw NAND: one erase block per zone.
    pub fn is_raw_nand(&self) -> bool {
        self.zone_blocks == 1
    }

    /// Errors unless `zone` exists.
    pub fn check_zone(&self, zone: u32) -> Result<()> {
        if zone >= self.zone_count {
            return Err(DeviceError::OutOfRange {
                what: format!("zone {zone}"),
                limit: format!("the device has {} zones", self.zone_count),
            });
        }
        Ok(())
    }

    /// Errors unless `address` names a page slot of the device (whether or
    /// not the zone's current capacity reaches it is the device's question).
    pub fn check_address(&self, address: PageAddress) -> Result<()> {
        self.check_zone(address.zone)?;
        if u64::from(address.page) >= self.zone_pages() {
            return Err(DeviceError::OutOfRange {
                what: format!("page {} of zone {}", address.page, address.zone),
                limit: format!("a zone has {} pages", self.zone_pages()),
            });
        }
        Ok(())
    }

    /// Errors unless `[offset, offset + length)` lies inside the NVM region.
    pub fn check_nvm_range(&self, offset: u64, length: u64) -> Result<()> {
        let end = offset.checked_add(length);
        if end.is_none_or(|end| end > self.nvm_size_bytes) {
            return Err(DeviceError::OutOfRange {
                what: format!("NVM bytes {offset}..{offset}+{length}"),
                limit: format!("the NVM region has {} bytes", self.nvm_size_bytes),
            });
        }
        Ok(())
    }
}

/// A page slot: a zone and a page index counted from the start of the zone.
/// Within a zone, pages are numbered over the zone's good blocks only, so
/// page `p` lives in the `p / block_pages`-th good block (see
/// [`crate::ZoneReport::capacity_pages`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageAddress {
    pub zone: u32,
    pub page: u32,
}

impl PageAddress {
    pub fn new(zone: u32, page: u32) -> PageAddress {
        PageAddress { zone, page }
    }
}

impl std::fmt::Display for PageAddress {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "zone {} page {}", self.zone, self.page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_geometry_is_valid_and_matches_the_issue() {
        let geometry = Geometry::default();
        geometry.validate().unwrap();
        assert_eq!(geometry.page_size_bytes, 4096);
        assert_eq!(geometry.oob_size_bytes, 128);
        assert_eq!(geometry.block_pages, 64);
        assert_eq!(geometry.zone_blocks, 16);
        assert_eq!(geometry.open_zones_max, 14);
        assert_eq!(geometry.nvm_size_bytes, 0);
        assert_eq!(geometry.zone_size_bytes(), 4 << 20);
    }

    #[test]
    fn every_bad_geometry_names_its_field() {
        type Mutation = Box<dyn Fn(&mut Geometry)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("page_size_bytes", Box::new(|g| g.page_size_bytes = 3000)),
            ("page_size_bytes", Box::new(|g| g.page_size_bytes = 256)),
            ("page_size_bytes", Box::new(|g| g.page_size_bytes = 1 << 17)),
            ("oob_size_bytes", Box::new(|g| g.oob_size_bytes = 16)),
            (
                "oob_size_bytes",
                Box::new(|g| {
                    g.page_size_bytes = 512;
                    g.oob_size_bytes = 256
                }),
            ),
            ("block_pages", Box::new(|g| g.block_pages = 0)),
            ("zone_blocks", Box::new(|g| g.zone_blocks = 0)),
            ("zone_count", Box::new(|g| g.zone_count = 0)),
            ("open_zones_max", Box::new(|g| g.open_zones_max = 0)),
            ("nvm_size_bytes", Box::new(|g| g.nvm_size_bytes = 12)),
            ("zone_blocks", Box::new(|g| g.zone_blocks = 1 << 20)),
            ("zone_count", Box::new(|g| g.zone_count = u32::MAX)),
        ];
        for (expected_field, mutate) in cases {
            let mut geometry = Geometry::default();
            mutate(&mut geometry);
            match geometry.validate() {
                Err(DeviceError::Geometry { field, reason }) => {
                    assert_eq!(field, expected_field, "{reason}");
                    assert!(!reason.is_empty());
                }
                other => panic!("{expected_field}: expected a geometry error, got {other:?}"),
            }
        }
    }

    #[test]
    fn addresses_outside_the_device_are_refused() {
        let geometry = Geometry { zone_count: 4, ..Geometry::default() };
        assert!(geometry.check_address(PageAddress::new(3, 1023)).is_ok());
        assert!(geometry.check_address(PageAddress::new(4, 0)).is_err());
        assert!(geometry.check_address(PageAddress::new(0, 1024)).is_err());
        let with_nvm = Geometry { nvm_size_bytes: 4096, ..geometry };
        assert!(with_nvm.check_nvm_range(4088, 8).is_ok());
        assert!(with_nvm.check_nvm_range(4090, 8).is_err());
        assert!(with_nvm.check_nvm_range(u64::MAX, 2).is_err());
    }
}
