//! The one error type of the engine: an errno and a message that says what
//! was wrong and where. The FUSE adapter and the CLI only map it.

use flintfs_flash::DeviceError;
use flintfs_format::DecodeError;

pub type Result<T> = std::result::Result<T, Error>;

/// POSIX error numbers (Linux values) the engine returns: the device's,
/// and those of the namespace.
pub mod errno {
    pub use flintfs_flash::errno::{EBUSY, EINVAL, EIO, ENOSPC, EROFS};
    pub const ENOENT: i32 = 2;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOTEMPTY: i32 = 39;
    pub const EPERM: i32 = 1;
    pub const E2BIG: i32 = 7;
    pub const ENODEV: i32 = 19;
    pub const EFBIG: i32 = 27;
    pub const ERANGE: i32 = 34;
    pub const ENODATA: i32 = 61;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ENXIO: i32 = 6;
    pub const ESPIPE: i32 = 29;
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub errno: i32,
    pub message: String,
    /// The error is damage on the medium (a page nothing brings back, or
    /// bytes that do not decode), not a device that stopped answering: a
    /// walk over many pages may leave the damaged one out and go on.
    damage: bool,
}

impl Error {
    pub fn new(errno: i32, message: impl Into<String>) -> Error {
        Error { errno, message: message.into(), damage: false }
    }

    /// Damage or an unreadable image: the caller gets EIO and the reason.
    pub fn corrupt(message: impl Into<String>) -> Error {
        Error { damage: true, ..Error::new(errno::EIO, message) }
    }

    /// Whether this is damage on the medium (see the field).
    pub fn is_damage(&self) -> bool {
        self.damage
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(errno::EINVAL, message)
    }
}

impl From<DeviceError> for Error {
    fn from(error: DeviceError) -> Error {
        Error { damage: error.is_media_failure(), ..Error::new(error.errno(), format!("device: {error}")) }
    }
}

impl From<DecodeError> for Error {
    fn from(error: DecodeError) -> Error {
        Error::corrupt(error.to_string())
    }
}
