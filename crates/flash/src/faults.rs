//! Fault parameters and the raw bit error rate model. The prose account of
//! the fault model, with the published figures behind these defaults, is at
//! the top of the crate (`lib.rs`).

/// Seconds in a year, for retention ages.
const YEAR_NS: f64 = 365.25 * 24.0 * 3600.0 * 1e9;

/// Upper bound on any probability the model produces: a raw bit error rate
/// of one half is noise, and a failure probability above one is meaningless.
pub const RAW_BIT_ERROR_RATE_MAX: f64 = 0.5;

/// The cell technology a preset models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellType {
    /// Single-level cell: 100K P/E cycles.
    Slc,
    /// Enterprise MLC: 10K P/E cycles.
    Emlc,
    /// Consumer 3x-nm MLC: 3K P/E cycles.
    Mlc,
}

impl CellType {
    /// Rated program/erase endurance.
    pub fn endurance_cycles(self) -> u32 {
        match self {
            CellType::Slc => 100_000,
            CellType::Emlc => 10_000,
            CellType::Mlc => 3_000,
        }
    }
}

/// Raw bit error rate as a function of wear, retention age and reads since
/// the last erase (read disturb):
///
/// `rber = fresh + wear_at_endurance * (pe / endurance)^wear_exponent
///         * (1 + retention_growth_per_year * age_years)
///         + read_disturb_per_read * reads_since_erase`
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BitErrorModel {
    /// Raw bit error rate of a fresh block read right after programming.
    pub fresh_rate: f64,
    /// Wear-out component at rated endurance, zero retention age.
    pub wear_rate_at_endurance: f64,
    /// How steeply the wear component grows with P/E cycles.
    pub wear_exponent: f64,
    /// Multiplier growth of the wear component per year of retention.
    pub retention_growth_per_year: f64,
    /// Added raw bit error rate per read of the block since its last erase.
    pub read_disturb_rate_per_read: f64,
}

impl BitErrorModel {
    /// Calibrated to 3x-nm MLC: about 1e-8 fresh, 3.4e-4 at 3K P/E after one
    /// year of retention.
    pub fn mlc() -> BitErrorModel {
        BitErrorModel {
            fresh_rate: 1e-8,
            // Split of the 3.4e-4 end-of-life figure between wear and
            // retention: retention multiplies the wear component tenfold over
            // a year (retention errors dominate at end of life).
            wear_rate_at_endurance: 3.4e-5 - 1e-9,
            wear_exponent: 2.0,
            retention_growth_per_year: 9.0,
            read_disturb_rate_per_read: 1e-10,
        }
    }

    /// A raw bit error rate that stays where it is, whatever the wear, the
    /// age and the reads (for measuring a code at one rate).
    pub fn flat(rate: f64) -> BitErrorModel {
        BitErrorModel {
            fresh_rate: rate,
            wear_rate_at_endurance: 0.0,
            wear_exponent: 1.0,
            retention_growth_per_year: 0.0,
            read_disturb_rate_per_read: 0.0,
        }
    }

    /// The rate at a given state of a block.
    pub fn rate(&self, erase_count: u32, endurance_cycles: u32, age_ns: u64, reads_since_erase: u32) -> f64 {
        let wear_fraction = f64::from(erase_count) / f64::from(endurance_cycles.max(1));
        let age_years = age_ns as f64 / YEAR_NS;
        let wear = self.wear_rate_at_endurance
            * wear_fraction.powf(self.wear_exponent)
            * (1.0 + self.retention_growth_per_year * age_years);
        let disturb = self.read_disturb_rate_per_read * f64::from(reads_since_erase);
        (self.fresh_rate + wear + disturb).clamp(0.0, RAW_BIT_ERROR_RATE_MAX)
    }
}

/// The names [`FaultConfig::named`] knows, with what each is.
pub const FAULT_PRESETS: [(&str, &str); 8] = [
    ("none", "no injected faults"),
    ("slc-fresh", "SLC from the factory: ~1e-8 raw bit error rate, 2% bad blocks"),
    ("mlc-fresh", "3x-nm MLC from the factory, wearing as it is used"),
    ("mlc-midlife", "MLC at 1.5K of 3K P/E cycles, half a year's retention: ~4.7e-5 raw"),
    ("mlc-eol", "MLC at 3K P/E cycles after a year: 3.4e-4 raw, mostly retention loss"),
    ("read-disturb", "MLC whose reads disturb their block: +1e-8 raw per read since the erase"),
    ("bad-blocks", "5% factory bad blocks; programs (1e-4) and erases (1e-3) fail and grow more"),
    ("misdirected", "one program in 10^4 lands on another page"),
];

/// Every injected fault, all seeded from `seed`. [`FaultConfig::none`] (the
/// default) injects nothing; power cuts are not faults of this kind but an
/// explicit call, and their randomness comes from the seed given to the call.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Drives every runtime fault decision, in operation order.
    pub seed: u64,
    /// Rated endurance: failure probabilities and the wear component of the
    /// bit error rate are scaled by `erase_count / endurance_cycles`.
    pub endurance_cycles: u32,
    /// Bit flips injected on read (never stored: the pristine data stays).
    pub bit_errors: Option<BitErrorModel>,
    /// The share of the bit error rate that every read of a page meets in
    /// the same bits (retention loss, which a re-read does not cure); the
    /// rest is noise drawn afresh on each read. 0 is all noise.
    pub stored_bit_error_fraction: f64,
    /// Probability that one page read fails outright (uncorrectable).
    pub read_failure_probability: f64,
    /// Probability that a program fails and grows a bad block, at rated
    /// endurance; scaled by `(erase_count / endurance)^failure_growth_exponent`.
    pub program_failure_probability_at_endurance: f64,
    /// Same for erases.
    pub erase_failure_probability_at_endurance: f64,
    /// How steeply program and erase failures grow with wear.
    pub failure_growth_exponent: f64,
    /// Probability that a program lands at another page of the device than
    /// the one addressed: the addressed page stays erased and the victim page
    /// is over-programmed (bitwise AND, as NAND programming only clears bits).
    pub misdirected_write_probability: f64,
    /// MLC paired pages: programming page `p` of a block shares cells with
    /// page `p - paired_page_distance`; a power cut that tears page `p` also
    /// corrupts that earlier page, even when it was flushed. 0 = off (SLC).
    pub paired_page_distance: u32,
    /// Bit error rate applied to a paired page corrupted by a torn program.
    pub paired_page_bit_error_rate: f64,
    /// Fraction of blocks marked bad at the factory, chosen at creation.
    pub factory_bad_block_fraction: f64,
    /// On a power cut, probability that the page in flight in a zone (the
    /// first page past the durable point) is left torn rather than cleanly
    /// absent. This is part of the durability model and applies even with
    /// [`FaultConfig::none`].
    pub torn_operation_probability: f64,
    /// Probability that a power cut during a zone reset leaves its blocks
    /// half erased (otherwise the reset completed or never started).
    pub interrupted_erase_probability: f64,
    /// Added raw bit error rate of a block whose erase was interrupted, until
    /// it is erased completely.
    pub interrupted_erase_bit_error_rate: f64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig::none(0)
    }
}

impl FaultConfig {
    /// No injected faults. Power cuts still tear the page in flight with
    /// probability one half (the durability model), but never interrupt an
    /// erase.
    pub fn none(seed: u64) -> FaultConfig {
        FaultConfig {
            seed,
            endurance_cycles: CellType::Mlc.endurance_cycles(),
            bit_errors: None,
            stored_bit_error_fraction: 0.0,
            read_failure_probability: 0.0,
            program_failure_probability_at_endurance: 0.0,
            erase_failure_probability_at_endurance: 0.0,
            failure_growth_exponent: 4.0,
            misdirected_write_probability: 0.0,
            paired_page_distance: 0,
            paired_page_bit_error_rate: 0.01,
            factory_bad_block_fraction: 0.0,
            torn_operation_probability: 0.5,
            interrupted_erase_probability: 0.0,
            interrupted_erase_bit_error_rate: 1e-3,
        }
    }

    /// A realistic device of the given cell type, with the defaults the crate
    /// documentation justifies. Misdirected writes stay off: they are rare
    /// enough in the field that a test turns them on explicitly.
    pub fn preset(cell: CellType, seed: u64) -> FaultConfig {
        let endurance_cycles = cell.endurance_cycles();
        let mut bit_errors = BitErrorModel::mlc();
        if cell != CellType::Mlc {
            // Same fresh floor and end-of-life shape, reached at the cell
            // type's own endurance; SLC ends an order of magnitude lower.
            bit_errors.wear_rate_at_endurance = match cell {
                CellType::Slc => 3.4e-6,
                _ => 3.4e-5,
            };
        }
        FaultConfig {
            seed,
            endurance_cycles,
            bit_errors: Some(bit_errors),
            stored_bit_error_fraction: 0.0,
            read_failure_probability: 1e-7,
            program_failure_probability_at_endurance: 1e-5,
            erase_failure_probability_at_endurance: 1e-4,
            failure_growth_exponent: 4.0,
            misdirected_write_probability: 0.0,
            paired_page_distance: if cell == CellType::Slc { 0 } else { 4 },
            paired_page_bit_error_rate: 0.01,
            factory_bad_block_fraction: 0.02,
            torn_operation_probability: 0.5,
            interrupted_erase_probability: 0.5,
            interrupted_erase_bit_error_rate: 1e-3,
        }
    }

    /// A named point of a device's life, for a user's mount
    /// (`mkfs --faults`, `mount -o faults=`). `None` for an unknown name;
    /// [`FAULT_PRESETS`] lists the names. The wear points are set as
    /// rates rather than left to the blocks' own erase counts, because a
    /// new image's blocks have none: `mlc-eol` is a device at its rated
    /// 3K P/E cycles after a year's retention from the first program.
    pub fn named(name: &str, seed: u64) -> Option<FaultConfig> {
        let mlc = FaultConfig::preset(CellType::Mlc, seed);
        let model = BitErrorModel::mlc();
        let year_ns = 365 * 24 * 3600 * 1_000_000_000u64;
        // Wear that the preset puts the device at: failure probabilities
        // at that wear, with no further growth (exponent 0).
        let worn = |fraction: f64, config: FaultConfig| FaultConfig {
            program_failure_probability_at_endurance: config.program_failure_probability_at_endurance
                * fraction.powf(config.failure_growth_exponent),
            erase_failure_probability_at_endurance: config.erase_failure_probability_at_endurance
                * fraction.powf(config.failure_growth_exponent),
            failure_growth_exponent: 0.0,
            ..config
        };
        Some(match name {
            "none" => FaultConfig::none(seed),
            // SLC as it leaves the factory: ~1e-8 raw, 2% factory bad
            // blocks, no paired pages; wear then grows it as blocks are
            // erased.
            "slc-fresh" => FaultConfig::preset(CellType::Slc, seed),
            "mlc-fresh" => mlc,
            // Half the rated cycles, half a year of retention: ~4.7e-5 raw,
            // half of it stored (retention), half read noise.
            "mlc-midlife" => FaultConfig {
                bit_errors: Some(BitErrorModel::flat(model.rate(1500, 3000, year_ns / 2, 0))),
                stored_bit_error_fraction: 0.5,
                ..worn(0.5, mlc)
            },
            // 3x-nm MLC at 3K P/E after a year: 3.4e-4 raw (Cai et al.,
            // DATE 2012), nine tenths of it retention loss that a re-read
            // meets again.
            "mlc-eol" => FaultConfig {
                bit_errors: Some(BitErrorModel::flat(model.rate(3000, 3000, year_ns, 0))),
                stored_bit_error_fraction: 0.9,
                ..worn(1.0, mlc)
            },
            // Reads disturb their block's neighbours: 1e-8 more raw bit
            // error rate per read of the block since its erase.
            "read-disturb" => {
                FaultConfig { bit_errors: Some(BitErrorModel { read_disturb_rate_per_read: 1e-8, ..model }), ..mlc }
            }
            // 5% of blocks bad from the factory, and blocks going bad under
            // use: one program in 10^4 and one erase in 10^3 fails.
            "bad-blocks" => FaultConfig {
                factory_bad_block_fraction: 0.05,
                program_failure_probability_at_endurance: 1e-4,
                erase_failure_probability_at_endurance: 1e-3,
                failure_growth_exponent: 0.0,
                ..FaultConfig::none(seed)
            },
            // One program in 10^4 lands on another page.
            "misdirected" => FaultConfig { misdirected_write_probability: 1e-4, ..FaultConfig::none(seed) },
            _ => return None,
        })
    }

    /// Probability of a program (or erase) failure at the given wear.
    pub fn wear_failure_probability(&self, at_endurance: f64, erase_count: u32) -> f64 {
        if at_endurance <= 0.0 {
            return 0.0;
        }
        let wear_fraction = f64::from(erase_count) / f64::from(self.endurance_cycles.max(1));
        (at_endurance * wear_fraction.powf(self.failure_growth_exponent)).clamp(0.0, 1.0)
    }

    /// Errors unless every probability is one and every rate is sane.
    pub fn validate(&self) -> crate::Result<()> {
        let probabilities = [
            ("read_failure_probability", self.read_failure_probability),
            ("stored_bit_error_fraction", self.stored_bit_error_fraction),
            ("program_failure_probability_at_endurance", self.program_failure_probability_at_endurance),
            ("erase_failure_probability_at_endurance", self.erase_failure_probability_at_endurance),
            ("misdirected_write_probability", self.misdirected_write_probability),
            ("paired_page_bit_error_rate", self.paired_page_bit_error_rate),
            ("factory_bad_block_fraction", self.factory_bad_block_fraction),
            ("torn_operation_probability", self.torn_operation_probability),
            ("interrupted_erase_probability", self.interrupted_erase_probability),
            ("interrupted_erase_bit_error_rate", self.interrupted_erase_bit_error_rate),
        ];
        for (field, value) in probabilities {
            if !(0.0..=1.0).contains(&value) {
                return Err(crate::DeviceError::Geometry {
                    field,
                    reason: format!("{value} is not a probability in 0..=1"),
                });
            }
        }
        if self.endurance_cycles == 0 {
            return Err(crate::DeviceError::Geometry {
                field: "endurance_cycles",
                reason: "endurance must be at least one cycle".into(),
            });
        }
        if !self.failure_growth_exponent.is_finite() || self.failure_growth_exponent < 0.0 {
            return Err(crate::DeviceError::Geometry {
                field: "failure_growth_exponent",
                reason: format!("{} is not a finite non-negative exponent", self.failure_growth_exponent),
            });
        }
        if let Some(model) = &self.bit_errors {
            let rates = [
                model.fresh_rate,
                model.wear_rate_at_endurance,
                model.wear_exponent,
                model.retention_growth_per_year,
                model.read_disturb_rate_per_read,
            ];
            if rates.iter().any(|rate| !rate.is_finite() || *rate < 0.0) {
                return Err(crate::DeviceError::Geometry {
                    field: "bit_errors",
                    reason: format!("every rate must be finite and non-negative: {model:?}"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlc_bit_error_rate_meets_the_published_points() {
        let model = BitErrorModel::mlc();
        let fresh = model.rate(0, 3_000, 0, 0);
        assert!((fresh - 1e-8).abs() < 1e-12, "fresh rate {fresh}");
        let one_year_ns = YEAR_NS as u64;
        let end_of_life = model.rate(3_000, 3_000, one_year_ns, 0);
        assert!((end_of_life - 3.4e-4).abs() / 3.4e-4 < 0.01, "end of life rate {end_of_life}");
        // Monotone in every argument.
        assert!(model.rate(1_000, 3_000, 0, 0) < model.rate(2_000, 3_000, 0, 0));
        assert!(model.rate(1_000, 3_000, 0, 0) < model.rate(1_000, 3_000, one_year_ns, 0));
        assert!(model.rate(1_000, 3_000, 0, 0) < model.rate(1_000, 3_000, 0, 100_000));
        assert!(model.rate(u32::MAX, 1, u64::MAX, u32::MAX) <= RAW_BIT_ERROR_RATE_MAX);
    }

    #[test]
    fn endurance_matches_cell_types() {
        assert_eq!(CellType::Slc.endurance_cycles(), 100_000);
        assert_eq!(CellType::Emlc.endurance_cycles(), 10_000);
        assert_eq!(CellType::Mlc.endurance_cycles(), 3_000);
    }

    #[test]
    fn failures_grow_with_wear_and_bad_configs_are_refused() {
        let config = FaultConfig::preset(CellType::Mlc, 1);
        config.validate().unwrap();
        let young = config.wear_failure_probability(config.program_failure_probability_at_endurance, 300);
        let old = config.wear_failure_probability(config.program_failure_probability_at_endurance, 3_000);
        assert!(young < old && old <= 1.0);
        let mut bad = FaultConfig::none(0);
        bad.read_failure_probability = 1.5;
        assert!(bad.validate().is_err());
        let mut bad = FaultConfig::none(0);
        bad.bit_errors = Some(BitErrorModel { fresh_rate: f64::NAN, ..BitErrorModel::mlc() });
        assert!(bad.validate().is_err());
    }
}
