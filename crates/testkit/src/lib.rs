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
