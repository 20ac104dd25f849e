//! Hostile checkpoint payloads through mount, the checker, appends and the
//! next checkpoint: errors are fine, panics are bugs.

use flintfs_core::Volume;
use flintfs_testkit::hostile::{
    base_fs_image, exercise, exercise_fs, hostile_device, hostile_fs_device, valid_payload,
};
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// One page of a real file system replaced by edits of itself, signed
    /// again: the engine meets a node, an index or data that passes every
    /// checksum and is still wrong.
    #[test]
    fn a_file_system_with_one_hostile_page_never_panics(
        victim in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        exercise_fs(hostile_fs_device(victim, |data| {
            for (position, byte) in edits {
                let length = data.len();
                data[position % length] = byte;
            }
        }));
    }
}

#[test]
fn every_page_of_the_base_image_zeroed_or_truncated_is_survived() {
    let pages = 400;
    for victim in 0..pages {
        exercise_fs(hostile_fs_device(victim, |data| data.iter_mut().skip(32).for_each(|byte| *byte = 0)));
        exercise_fs(hostile_fs_device(victim, |data| data.truncate(40)));
    }
}

#[test]
fn the_base_image_itself_is_clean() {
    let clock = flintfs_core::ManualClock::new(0);
    let options = flintfs_core::FsOptions::smallest(512);
    let (mut fs, _) = flintfs_core::Fs::mount(base_fs_image(), options, Box::new(clock)).unwrap();
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.findings);
}
