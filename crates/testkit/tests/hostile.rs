//! Hostile checkpoint payloads through mount, the checker, appends and the
//! next checkpoint: errors are fine, panics are bugs.

use flintfs_core::Volume;
use flintfs_testkit::hostile::{exercise, hostile_device, valid_payload};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_checkpoint_payloads_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..1200)) {
        exercise(hostile_device(&payload));
    }

    #[test]
    fn mutated_checkpoint_payloads_never_panic(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut payload = valid_payload();
        for (position, byte) in edits {
            let length = payload.len();
            payload[position % length] = byte;
        }
        exercise(hostile_device(&payload));
    }
}

#[test]
fn a_valid_hostile_frame_mounts_and_an_empty_one_is_passed_over() {
    let (volume, report) = Volume::mount(hostile_device(&valid_payload())).unwrap();
    assert_eq!(report.checkpoint_number, 9, "the framed checkpoint is the newest");
    assert_eq!(volume.checkpoint().sequence_next, 2000);
    let (_, report) = Volume::mount(hostile_device(&[])).unwrap();
    assert_eq!(report.checkpoint_number, 1, "an empty payload is not a checkpoint");
    assert_eq!(report.records_rejected, 1);
}
