//! # flintfs-testkit
//!
//! Tooling shared by tests, fuzz targets and the `crashtest` command:
//! the reference model and workload generators, power-cut runners and
//! crashtest's oracle, fill/delete/refill, and hostile images.

pub mod crashtest;
pub mod fill;
pub mod hostile;
pub mod model;
pub mod runner;
pub mod threads;

/// A test's size knob from the environment (`FLINTFS_...`), or `default`:
/// CI runs the defaults, and a longer run sets the variables.
pub fn from_env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}
