//! A checkpoint record with a valid frame and an arbitrary payload, mounted,
//! checked, appended to and checkpointed again: errors are fine, a panic is
//! a bug. The first byte picks between raw bytes and edits of a valid
//! payload, so the fuzzer reaches both decoding and the engine's use of
//! well-formed but hostile checkpoints.
#![no_main]

use flintfs_testkit::hostile::{exercise, hostile_device, valid_payload};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Some((&mode, rest)) = bytes.split_first() else { return };
    let payload = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut payload = valid_payload();
        for edit in rest.chunks_exact(3) {
            let position = u16::from_le_bytes([edit[0], edit[1]]) as usize % payload.len();
            payload[position] = edit[2];
        }
        payload
    };
    exercise(hostile_device(&payload));
});
