//! # flintfs-testkit
//!
//! Tooling shared by tests, fuzz targets and (later) the `crashtest`
//! command: harnesses that build hostile images, and, as the engine grows,
//! the reference model, workload generators and power-cut runners.

pub mod fill;
pub mod hostile;
pub mod model;
pub mod runner;
