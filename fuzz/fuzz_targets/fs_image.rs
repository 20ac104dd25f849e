//! A real file system image with one page replaced by arbitrary bytes, or
//! by edits of itself, and signed again so it passes every checksum:
//! mounted, walked (every name, every byte), checked, changed,
//! checkpointed and remounted. Errors are fine; a panic or a hang is a
//! bug. The first two bytes pick the page, the third the mode.
#![no_main]

use flintfs_testkit::hostile::{exercise_fs, hostile_fs_device};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if bytes.len() < 3 {
        return;
    }
    let victim = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
    let mode = bytes[2];
    let rest = &bytes[3..];
    exercise_fs(hostile_fs_device(victim, |data| {
        if mode & 1 == 0 {
            let length = data.len();
            data.clear();
            data.extend_from_slice(&rest[..rest.len().min(length)]);
        } else {
            for edit in rest.chunks_exact(3) {
                let position = u16::from_le_bytes([edit[0], edit[1]]) as usize % data.len();
                data[position] = edit[2];
            }
        }
    }));
});
