//! Faults on a user's own image: `mkfs --faults SPEC` and
//! `mount -o faults=SPEC`. SPEC is a preset's name (`flintfs_flash::FAULT_PRESETS`)
//! or the path of a small TOML file:
//!
//! ```toml
//! preset = "mlc-fresh"          # what the rest changes (default "none")
//! raw_bit_error_rate = 2e-4     # a flat rate, whatever the wear
//! stored_bit_error_fraction = 0.5
//! misdirected_write_probability = 1e-5
//! ```
//!
//! Every field of the emulator's fault model can be set by its name; an
//! unknown name is refused, naming it. The image keeps no faults: mkfs's
//! apply while it formats (factory bad blocks are drawn then, once), and a
//! mount's while it is mounted. One seed (`fault_seed`, default 1) drives
//! them all.

use flintfs_flash::{BitErrorModel, FaultConfig, FAULT_PRESETS};
use serde::Deserialize;

use crate::{Failure, Outcome};

/// The seed of a user's faults unless `fault_seed` says otherwise.
pub const FAULT_SEED_DEFAULT: u64 = 1;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomFaults {
    preset: Option<String>,
    seed: Option<u64>,
    raw_bit_error_rate: Option<f64>,
    bit_errors: Option<CustomBitErrors>,
    stored_bit_error_fraction: Option<f64>,
    endurance_cycles: Option<u32>,
    read_failure_probability: Option<f64>,
    program_failure_probability_at_endurance: Option<f64>,
    erase_failure_probability_at_endurance: Option<f64>,
    failure_growth_exponent: Option<f64>,
    misdirected_write_probability: Option<f64>,
    paired_page_distance: Option<u32>,
    paired_page_bit_error_rate: Option<f64>,
    factory_bad_block_fraction: Option<f64>,
    torn_operation_probability: Option<f64>,
    interrupted_erase_probability: Option<f64>,
    interrupted_erase_bit_error_rate: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomBitErrors {
    fresh_rate: f64,
    wear_rate_at_endurance: f64,
    wear_exponent: f64,
    retention_growth_per_year: f64,
    read_disturb_rate_per_read: f64,
}

fn preset(name: &str, seed: u64) -> Outcome<FaultConfig> {
    FaultConfig::named(name, seed).ok_or_else(|| {
        let names: Vec<&str> = FAULT_PRESETS.iter().map(|(name, _)| *name).collect();
        Failure(format!("unknown fault preset {name:?} (known: {}; or the path of a TOML file)", names.join(", ")))
    })
}

/// The faults SPEC names, seeded with `seed`.
pub fn parse_faults(spec: &str, seed: u64) -> Outcome<FaultConfig> {
    let path = std::path::Path::new(spec);
    let faults = if spec.ends_with(".toml") || path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|error| format!("faults file {spec}: {error}"))?;
        let custom: CustomFaults = toml::from_str(&text).map_err(|error| format!("faults file {spec}: {error}"))?;
        let seed = custom.seed.unwrap_or(seed);
        let mut faults = preset(custom.preset.as_deref().unwrap_or("none"), seed)?;
        if let Some(rate) = custom.raw_bit_error_rate {
            faults.bit_errors = Some(BitErrorModel::flat(rate));
        }
        if let Some(model) = custom.bit_errors {
            faults.bit_errors = Some(BitErrorModel {
                fresh_rate: model.fresh_rate,
                wear_rate_at_endurance: model.wear_rate_at_endurance,
                wear_exponent: model.wear_exponent,
                retention_growth_per_year: model.retention_growth_per_year,
                read_disturb_rate_per_read: model.read_disturb_rate_per_read,
            });
        }
        let set = |target: &mut f64, value: Option<f64>| {
            if let Some(value) = value {
                *target = value;
            }
        };
        set(&mut faults.stored_bit_error_fraction, custom.stored_bit_error_fraction);
        set(&mut faults.read_failure_probability, custom.read_failure_probability);
        set(&mut faults.program_failure_probability_at_endurance, custom.program_failure_probability_at_endurance);
        set(&mut faults.erase_failure_probability_at_endurance, custom.erase_failure_probability_at_endurance);
        set(&mut faults.failure_growth_exponent, custom.failure_growth_exponent);
        set(&mut faults.misdirected_write_probability, custom.misdirected_write_probability);
        set(&mut faults.paired_page_bit_error_rate, custom.paired_page_bit_error_rate);
        set(&mut faults.factory_bad_block_fraction, custom.factory_bad_block_fraction);
        set(&mut faults.torn_operation_probability, custom.torn_operation_probability);
        set(&mut faults.interrupted_erase_probability, custom.interrupted_erase_probability);
        set(&mut faults.interrupted_erase_bit_error_rate, custom.interrupted_erase_bit_error_rate);
        if let Some(cycles) = custom.endurance_cycles {
            faults.endurance_cycles = cycles;
        }
        if let Some(distance) = custom.paired_page_distance {
            faults.paired_page_distance = distance;
        }
        faults
    } else {
        preset(spec, seed)?
    };
    faults.validate().map_err(|error| format!("faults {spec}: {error}"))?;
    Ok(faults)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_and_validates() {
        for (name, _) in FAULT_PRESETS {
            parse_faults(name, 7).unwrap();
        }
        assert!(parse_faults("mlc-old", 7).unwrap_err().0.contains("known: none, slc-fresh"));
    }

    #[test]
    fn a_toml_file_changes_a_preset_and_refuses_what_it_does_not_know() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("worn.toml");
        std::fs::write(&path, "preset = \"mlc-eol\"\nmisdirected_write_probability = 1e-3\nseed = 9\n").unwrap();
        let faults = parse_faults(path.to_str().unwrap(), 1).unwrap();
        assert_eq!(faults.misdirected_write_probability, 1e-3);
        assert_eq!(faults.seed, 9);
        assert_eq!(
            faults.stored_bit_error_fraction,
            FaultConfig::named("mlc-eol", 9).unwrap().stored_bit_error_fraction
        );
        std::fs::write(&path, "misdirected_writes = 1\n").unwrap();
        assert!(parse_faults(path.to_str().unwrap(), 1).unwrap_err().0.contains("misdirected_writes"));
        std::fs::write(&path, "read_failure_probability = 2.0\n").unwrap();
        assert!(parse_faults(path.to_str().unwrap(), 1).unwrap_err().0.contains("read_failure_probability"));
    }
}
