//! The cost model's counters. One macro lists the fields once, so that the
//! struct, its field-by-field arithmetic and its persisted order in the image
//! can never disagree.

macro_rules! counters {
    ($( $(#[$doc:meta])* $field:ident ),* $(,)?) => {
        /// Device activity. Read and reset through [`crate::FlashDevice`];
        /// an image keeps lifetime totals across processes.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[$doc])* pub $field: u64, )*
        }

        impl Counters {
            /// Field names in their persisted order.
            pub const FIELD_NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Values in the persisted order.
            pub fn to_array(&self) -> Vec<u64> {
                vec![$(self.$field),*]
            }

            /// Inverse of [`Counters::to_array`]; `None` on a length mismatch.
            pub fn from_array(values: &[u64]) -> Option<Counters> {
                let mut iterator = values.iter().copied();
                let counters = Counters { $( $field: iterator.next()?, )* };
                iterator.next().is_none().then_some(counters)
            }

            /// `self - earlier`, field by field (saturating).
            pub fn since(&self, earlier: &Counters) -> Counters {
                Counters { $( $field: self.$field.saturating_sub(earlier.$field), )* }
            }

            /// `self + later`, field by field (saturating): lifetime totals
            /// from those at a mount and the counts since.
            pub fn plus(&self, later: &Counters) -> Counters {
                Counters { $( $field: self.$field.saturating_add(later.$field), )* }
            }

            /// Name and value pairs, for printing.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }
        }
    };
}

counters! {
    /// Full page reads (data and OOB) that reached the medium or the buffer.
    pages_read,
    /// Reads of the spare area only.
    oob_reads,
    /// Pages programmed.
    pages_programmed,
    /// Data bytes programmed.
    data_bytes_programmed,
    /// Spare-area bytes programmed.
    oob_bytes_programmed,
    /// Erase-block erases.
    erases,
    /// Zone resets (each erases the zone's good blocks).
    zone_resets,
    /// Flush commands.
    flushes,
    /// NVM bytes written.
    nvm_bytes_written,
    /// NVM persist barriers.
    nvm_persists,
    /// Simulated device time elapsed, in nanoseconds.
    device_time_ns,
    /// Bits flipped on read by the bit error model.
    bit_flips_injected,
    /// Page reads failed outright.
    read_failures_injected,
    /// Programs failed (each grew a bad block).
    program_failures_injected,
    /// Erases failed (each grew a bad block).
    erase_failures_injected,
    /// Programs that landed at the wrong page.
    misdirected_writes_injected,
    /// Pages left half-programmed by a power cut.
    torn_pages,
    /// Erases interrupted by a power cut.
    interrupted_erases,
    /// Earlier pages corrupted by a torn program of their paired page.
    paired_page_corruptions,
    /// Power cuts.
    power_cuts,
    /// Faults that could not be recorded because the fault overlay was full.
    faults_suppressed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_round_trip_and_difference() {
        let later = Counters { pages_read: 10, erases: 3, device_time_ns: 500, ..Counters::default() };
        let earlier = Counters { pages_read: 4, erases: 3, device_time_ns: 100, ..Counters::default() };
        assert_eq!(Counters::from_array(&later.to_array()), Some(later));
        assert_eq!(Counters::from_array(&later.to_array()[1..]), None);
        let difference = later.since(&earlier);
        assert_eq!(difference.pages_read, 6);
        assert_eq!(difference.erases, 0);
        assert_eq!(difference.device_time_ns, 400);
        assert_eq!(Counters::FIELD_NAMES.len(), later.to_array().len());
    }
}
