//! The device's error type. Every variant names what was wrong (zone, page,
//! write pointer, field) and maps to an errno, so the file system's single
//! error type can carry it up unchanged.

use crate::geometry::PageAddress;

pub type Result<T> = std::result::Result<T, DeviceError>;

/// POSIX error numbers the device reports through (Linux values).
pub mod errno {
    pub const EIO: i32 = 5;
    pub const EBUSY: i32 = 16;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("bad geometry: {field}: {reason}")]
    Geometry { field: &'static str, reason: String },

    #[error("{what} is outside the device: {limit}")]
    OutOfRange { what: String, limit: String },

    #[error("buffer for {what} is {actual} bytes, the device needs exactly {expected}")]
    BufferLength { what: &'static str, expected: usize, actual: usize },

    #[error("program at {address} refused: zone {} write pointer is at page {write_pointer}; pages of a zone are programmed strictly in order", address.zone)]
    NotAtWritePointer { address: PageAddress, write_pointer: u32 },

    #[error("program at {address} refused: zone {} is full (write pointer {write_pointer}, capacity {capacity_pages} pages)", address.zone)]
    ZoneFull { address: PageAddress, write_pointer: u32, capacity_pages: u32 },

    #[error("zone {zone} is {state}: {operation} refused (write pointer {write_pointer})")]
    ZoneState { zone: u32, state: &'static str, operation: &'static str, write_pointer: u32 },

    #[error("program at {address} refused: zone {} would open, but {open_zones} zones are open and the device allows {open_zones_max}", address.zone)]
    TooManyOpenZones { address: PageAddress, open_zones: u32, open_zones_max: u32 },

    #[error("read of {address} failed: the page is uncorrectable (injected read failure, block {block})")]
    ReadFailed { address: PageAddress, block: u64 },

    #[error("program of {address} failed: block {block} went bad (erase count {erase_count}); zone {} is now read-only", address.zone)]
    ProgramFailed { address: PageAddress, block: u64, erase_count: u32 },

    #[error("reset of zone {zone} failed: block {block} went bad while erasing (erase count {erase_count}); the zone's capacity is now {capacity_pages} pages")]
    EraseFailed { zone: u32, block: u64, erase_count: u32, capacity_pages: u32 },

    #[error("power was cut during {operation}: the device is off until it is powered on")]
    PowerLost { operation: &'static str },

    #[error("{operation} refused: the file system is mounted read-only")]
    ReadOnly { operation: &'static str },

    #[error("image {path}: {reason}")]
    Image { path: String, reason: String },

    #[error("image {path}: {operation}: {source}")]
    Io { path: String, operation: &'static str, source: std::io::Error },
}

impl DeviceError {
    /// The errno this error carries up through the file system.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Geometry { .. }
            | DeviceError::OutOfRange { .. }
            | DeviceError::BufferLength { .. }
            | DeviceError::NotAtWritePointer { .. } => errno::EINVAL,
            DeviceError::ZoneFull { .. } => errno::ENOSPC,
            DeviceError::ZoneState { .. } | DeviceError::ReadOnly { .. } => errno::EROFS,
            DeviceError::TooManyOpenZones { .. } => errno::EBUSY,
            DeviceError::ReadFailed { .. }
            | DeviceError::ProgramFailed { .. }
            | DeviceError::EraseFailed { .. }
            | DeviceError::PowerLost { .. }
            | DeviceError::Image { .. }
            | DeviceError::Io { .. } => errno::EIO,
        }
    }

    /// True for failures of the medium (as opposed to misuse of the device),
    /// which a file system is expected to survive.
    pub fn is_media_failure(&self) -> bool {
        matches!(
            self,
            DeviceError::ReadFailed { .. } | DeviceError::ProgramFailed { .. } | DeviceError::EraseFailed { .. }
        )
    }
}
