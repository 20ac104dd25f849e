//! Sparse files as ext4 keeps them: `st_blocks` counts what a file really
//! uses, SEEK_DATA and SEEK_HOLE find its holes, and a sparse file may be
//! larger than the device. Each is checked before and after the buffered
//! blocks reach flash, across a remount, and against fsck.

use flintfs_core::{errno, Fs, FsOptions, ManualClock, MkfsOptions, SetAttributes};
use flintfs_flash::{DeviceOptions, FaultConfig, Geometry, MemoryFlash};

const PAGE_BYTES: u64 = 4096;
const SECTORS_PER_BLOCK: u64 = PAGE_BYTES / 512;

fn geometry() -> Geometry {
    Geometry {
        page_size_bytes: PAGE_BYTES as u32,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks: 4,
        zone_count: 64,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

fn mounted() -> (Fs<MemoryFlash>, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash =
        MemoryFlash::memory(geometry(), DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() })
            .unwrap();
    // Uncompressed: the counts here are of whole blocks (a block of one
    // byte repeated would compress to a chunk; tests/compression.rs counts
    // those).
    let mkfs = MkfsOptions { compression: flintfs_format::Compression::None, ..MkfsOptions::new([7; 16], 0) };
    let flash = Fs::format(flash, &mkfs, Box::new(clock.clone())).unwrap();
    let (fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    (fs, clock)
}

fn remount(fs: Fs<MemoryFlash>, clock: &ManualClock) -> Fs<MemoryFlash> {
    let flash = fs.unmount().unwrap();
    Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap().0
}

fn assert_clean(fs: &mut Fs<MemoryFlash>) {
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

fn truncate(fs: &mut Fs<MemoryFlash>, ino: u64, size: u64) {
    fs.setattr(ino, &SetAttributes { size: Some(size), ..SetAttributes::default() }).unwrap();
}

#[test]
fn st_blocks_counts_the_blocks_written_not_the_size() {
    let (mut fs, clock) = mounted();
    let file = fs.create(1, b"sparse", 0o644, 0, 0).unwrap();
    assert_eq!(file.blocks, 0, "a new file uses nothing");
    // 100 MiB with one block written in the middle: du says 4 KiB.
    truncate(&mut fs, file.ino, 100 << 20);
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, 0);
    fs.write(file.ino, 50 << 20, &[7u8; PAGE_BYTES as usize]).unwrap();
    let buffered = fs.getattr(file.ino).unwrap();
    assert_eq!((buffered.size, buffered.blocks), (100 << 20, SECTORS_PER_BLOCK), "a buffered block counts");
    fs.sync().unwrap();
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, SECTORS_PER_BLOCK, "and counts once on flash");
    // An overwrite of a stored block is no new block, buffered or not.
    fs.write(file.ino, 50 << 20, &[8u8; 100]).unwrap();
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, SECTORS_PER_BLOCK);
    // Ten blocks more, one of them half written.
    for block in 0..10u64 {
        fs.write(file.ino, block * 3 * PAGE_BYTES, &[block as u8 + 1; 2048]).unwrap();
    }
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, 11 * SECTORS_PER_BLOCK);
    assert_clean(&mut fs);
    let mut fs = remount(fs, &clock);
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, 11 * SECTORS_PER_BLOCK, "the count is on flash");
    // Cutting the file frees what is past the new end.
    truncate(&mut fs, file.ino, 10 * PAGE_BYTES);
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, 4 * SECTORS_PER_BLOCK, "blocks 0, 3, 6 and 9 are left");
    truncate(&mut fs, file.ino, 0);
    assert_eq!(fs.getattr(file.ino).unwrap().blocks, 0);
    assert_clean(&mut fs);
    // Inline data and directories.
    let small = fs.create(1, b"small", 0o644, 0, 0).unwrap();
    fs.write(small.ino, 0, b"hello").unwrap();
    assert_eq!(fs.getattr(small.ino).unwrap().blocks, 1, "five inline bytes use one sector of the inode page");
    let directory = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap();
    assert_eq!(directory.blocks, SECTORS_PER_BLOCK, "a directory uses its page");
}

#[test]
fn seek_data_and_seek_hole_find_the_holes() {
    let (mut fs, clock) = mounted();
    let file = fs.create(1, b"holes", 0o644, 0, 0).unwrap();
    let ino = file.ino;
    let block = PAGE_BYTES;
    // Data in blocks 2, 3 and 1000; a hole after them up to 8 GiB (twice
    // the device and more).
    fs.write(ino, 2 * block, &[1u8; 2 * PAGE_BYTES as usize]).unwrap();
    fs.write(ino, 1000 * block + 10, b"far").unwrap();
    let size = 8u64 << 30;
    truncate(&mut fs, ino, size);
    for flushed in [false, true] {
        if flushed {
            fs.sync().unwrap();
        }
        let data = |fs: &mut Fs<MemoryFlash>, offset| fs.seek_data_or_hole(ino, offset, true);
        let hole = |fs: &mut Fs<MemoryFlash>, offset| fs.seek_data_or_hole(ino, offset, false);
        assert_eq!(data(&mut fs, 0).unwrap(), 2 * block, "flushed: {flushed}");
        assert_eq!(data(&mut fs, 2 * block + 5).unwrap(), 2 * block + 5, "inside data, the offset itself");
        assert_eq!(hole(&mut fs, 0).unwrap(), 0);
        assert_eq!(hole(&mut fs, 2 * block).unwrap(), 4 * block);
        assert_eq!(data(&mut fs, 4 * block).unwrap(), 1000 * block);
        assert_eq!(hole(&mut fs, 1000 * block).unwrap(), 1001 * block);
        assert_eq!(data(&mut fs, 1001 * block).unwrap_err().errno, errno::ENXIO, "only a hole follows");
        assert_eq!(hole(&mut fs, size - 1).unwrap(), size - 1);
        assert_eq!(data(&mut fs, size).unwrap_err().errno, errno::ENXIO, "at the end");
        assert_eq!(hole(&mut fs, size).unwrap_err().errno, errno::ENXIO);
    }
    // A file with no hole: its only hole is its end.
    let full = fs.create(1, b"full", 0o644, 0, 0).unwrap();
    fs.write(full.ino, 0, &vec![3u8; 5 * PAGE_BYTES as usize + 7]).unwrap();
    assert_eq!(fs.seek_data_or_hole(full.ino, 0, false).unwrap(), 5 * block + 7);
    let inline = fs.create(1, b"inline", 0o644, 0, 0).unwrap();
    fs.write(inline.ino, 0, b"abc").unwrap();
    assert_eq!(fs.seek_data_or_hole(inline.ino, 1, true).unwrap(), 1);
    assert_eq!(fs.seek_data_or_hole(inline.ino, 1, false).unwrap(), 3);
    assert_eq!(fs.seek_data_or_hole(1, 0, true).unwrap_err().errno, errno::EINVAL, "a directory");
    let mut fs = remount(fs, &clock);
    assert_eq!(fs.seek_data_or_hole(ino, 4 * block, true).unwrap(), 1000 * block, "after a remount");
    assert_clean(&mut fs);
}

#[test]
fn a_sparse_file_may_be_larger_than_the_device() {
    let (mut fs, clock) = mounted();
    let device_bytes = u64::from(geometry().zone_count) * 4 * 16 * PAGE_BYTES;
    let file = fs.create(1, b"huge", 0o644, 0, 0).unwrap();
    // 3 GiB on a 16 MiB device, as pjdfstest's "> 2 GB" file, and a
    // write at its far end.
    let size = (3u64 << 30) + 5;
    assert!(size > 100 * device_bytes);
    truncate(&mut fs, file.ino, size);
    fs.write(file.ino, size - 5, b"tail!").unwrap();
    assert_eq!(fs.read(file.ino, size - 5, 5).unwrap(), b"tail!");
    assert_eq!(fs.read(file.ino, 1 << 30, 4).unwrap(), [0; 4], "the hole reads as zeros");
    let attributes = fs.getattr(file.ino).unwrap();
    assert_eq!((attributes.size, attributes.blocks), (size, SECTORS_PER_BLOCK));
    let mut fs = remount(fs, &clock);
    assert_eq!(fs.read(file.ino, size - 5, 5).unwrap(), b"tail!");
    assert_clean(&mut fs);
    // The largest file is 2^32 - 1 blocks; past it is EFBIG, as before.
    let largest = flintfs_format::FILE_BLOCKS_MAX * PAGE_BYTES;
    truncate(&mut fs, file.ino, largest);
    let past = fs.setattr(file.ino, &SetAttributes { size: Some(largest + 1), ..SetAttributes::default() });
    assert_eq!(past.unwrap_err().errno, errno::EFBIG);
    assert_eq!(fs.write(file.ino, largest, b"x").unwrap_err().errno, errno::EFBIG);
    assert_clean(&mut fs);
}

/// `st_blocks` while a file is appended, overwritten in place and past
/// holes, cut and grown, and flushed, with a stat after every step: the
/// engine keeps a memo of its buffered blocks that the index does not
/// point at yet (a stat used to walk them all), and each step below is one
/// that can move it. The expected count is the blocks written and not cut
/// since; debug builds also check the memo against a fresh walk.
#[test]
fn st_blocks_stays_exact_between_stats_as_the_buffer_changes() {
    for seed in [1u64, 2, 3] {
        let (mut fs, _clock) = mounted();
        let ino = fs.create(1, b"log", 0o644, 0, 0).unwrap().ino;
        // Past inline from the start: the model counts whole blocks.
        fs.write(ino, 0, &[1u8; PAGE_BYTES as usize]).unwrap();
        let mut written = std::collections::BTreeSet::from([0u64]);
        let mut size = PAGE_BYTES;
        let mut state = seed;
        let mut next = |bound: u64| {
            // xorshift64*: the steps are the seed's alone.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
        };
        for step in 0..600 {
            let what = next(100);
            match what {
                // Appends of whole blocks, as a log grows.
                0..=39 => {
                    let blocks = 1 + next(4);
                    let at = size.div_ceil(PAGE_BYTES) * PAGE_BYTES;
                    fs.write(ino, at, &vec![step as u8; (blocks * PAGE_BYTES) as usize]).unwrap();
                    written.extend(at / PAGE_BYTES..at / PAGE_BYTES + blocks);
                    size = at + blocks * PAGE_BYTES;
                }
                // A partial write within the file, over blocks or holes
                // (the size stays a whole number of blocks: a short last
                // block is stored as a chunk, which the count here would
                // have to model).
                40..=59 => {
                    let at = next(size);
                    let length = 1 + next((2 * PAGE_BYTES).min(size - at));
                    fs.write(ino, at, &vec![step as u8; length as usize]).unwrap();
                    written.extend(at / PAGE_BYTES..(at + length).div_ceil(PAGE_BYTES));
                }
                // A whole block in place, over a block or a hole.
                60..=74 => {
                    let block = next(size.div_ceil(PAGE_BYTES) + 4);
                    fs.write(ino, block * PAGE_BYTES, &[step as u8; PAGE_BYTES as usize]).unwrap();
                    written.insert(block);
                    size = size.max((block + 1) * PAGE_BYTES);
                }
                // Cut (keeping block 0) or grown with a hole.
                75..=84 => {
                    let new_size = PAGE_BYTES * (1 + next(size / PAGE_BYTES + 16));
                    truncate(&mut fs, ino, new_size);
                    written.retain(|&block| block < new_size.div_ceil(PAGE_BYTES));
                    size = new_size;
                }
                85..=91 => fs.fsync(ino, false).unwrap(),
                92..=95 => fs.sync().unwrap(),
                _ => {
                    // Only stats: a second one reads the memo.
                }
            }
            let attributes = fs.getattr(ino).unwrap();
            assert_eq!(attributes.size, size, "seed {seed}, step {step} ({what})");
            assert_eq!(
                attributes.blocks,
                written.len() as u64 * SECTORS_PER_BLOCK,
                "seed {seed}, step {step} ({what}): st_blocks against the blocks written"
            );
        }
        assert_clean(&mut fs);
    }
}

/// Deterministic bytes that differ from block to block.
fn pattern(length: u64) -> Vec<u8> {
    (0..length).map(|at| (at.wrapping_mul(2_654_435_761) >> 13) as u8 | 1).collect()
}

/// The bytes `offset..offset + length` of `expected` (as far as it goes)
/// set to zero: what a punched or zeroed range reads as.
fn zeroed(expected: &mut [u8], offset: u64, length: u64) {
    let end = (offset + length).min(expected.len() as u64) as usize;
    let start = (offset as usize).min(end);
    expected[start..end].fill(0);
}

const PUNCH: u32 = flintfs_core::FALLOC_FL_PUNCH_HOLE | flintfs_core::FALLOC_FL_KEEP_SIZE;

/// FALLOC_FL_PUNCH_HOLE frees the whole blocks of its range (st_blocks
/// falls by them, SEEK_HOLE finds them), zeroes the bytes at its edges,
/// keeps the size, and holds across a remount; a range that runs to the
/// end of the file frees the last block too. The file's index has pages
/// of 512 pointers under its roots: the walk frees the one wholly inside
/// the range and keeps the two at its edges.
#[test]
fn a_punched_hole_reads_as_zeros_and_gives_its_blocks_back() {
    let (mut fs, clock) = mounted();
    let file = fs.create(1, b"punched", 0o644, 0, 0).unwrap().ino;
    let size = 1500 * PAGE_BYTES + 777;
    let mut expected = pattern(size);
    fs.write(file, 0, &expected).unwrap();
    fs.sync().unwrap();
    // The last block's 777 bytes are a chunk on flash, not a page.
    let blocks_before = fs.getattr(file).unwrap().blocks;
    assert!(blocks_before > 1500 * SECTORS_PER_BLOCK && blocks_before < 1501 * SECTORS_PER_BLOCK);
    // Some blocks of the first range written again: the punch frees their
    // buffers and their copies on flash. The second range is punched in
    // blocks read back from flash.
    for (round, (offset, length)) in
        [(10 * PAGE_BYTES + 100, 1200 * PAGE_BYTES), (2 * PAGE_BYTES - 5, 10)].iter().enumerate()
    {
        if round == 0 {
            fs.write(file, 600 * PAGE_BYTES, &expected[600 * PAGE_BYTES as usize..900 * PAGE_BYTES as usize]).unwrap();
        } else {
            fs.sync().unwrap();
        }
        fs.fallocate(file, *offset, *length, PUNCH).unwrap();
        zeroed(&mut expected, *offset, *length);
        assert_eq!(fs.getattr(file).unwrap().size, size, "round {round}: KEEP_SIZE keeps it");
        assert!(fs.read(file, 0, size + 1).unwrap() == expected, "round {round}: the range reads as zeros");
    }
    // Blocks 11..1210 were whole inside the first range; the second range
    // lay inside block 1 and 2's edges.
    assert_eq!(fs.getattr(file).unwrap().blocks, blocks_before - 1199 * SECTORS_PER_BLOCK);
    assert_eq!(fs.seek_data_or_hole(file, 0, false).unwrap(), 11 * PAGE_BYTES, "the first hole");
    assert_eq!(fs.seek_data_or_hole(file, 11 * PAGE_BYTES, true).unwrap(), 1210 * PAGE_BYTES, "data after it");
    // To the end of the file: the partial last block goes too.
    fs.fallocate(file, 1490 * PAGE_BYTES, 1 << 40, PUNCH).unwrap();
    zeroed(&mut expected, 1490 * PAGE_BYTES, 1 << 40);
    let blocks_after = fs.getattr(file).unwrap().blocks;
    assert_eq!(blocks_after, 291 * SECTORS_PER_BLOCK, "blocks 0..11 and 1210..1490 are left");
    assert_clean(&mut fs);
    let mut fs = remount(fs, &clock);
    assert_eq!(fs.getattr(file).unwrap().size, size);
    assert!(fs.read(file, 0, size + 1).unwrap() == expected, "after a remount");
    assert_eq!(fs.getattr(file).unwrap().blocks, blocks_after);
    // A punched block written again is data again.
    fs.write(file, 500 * PAGE_BYTES, &[9u8; 10]).unwrap();
    expected[500 * PAGE_BYTES as usize..500 * PAGE_BYTES as usize + 10].fill(9);
    assert!(fs.read(file, 0, size + 1).unwrap() == expected);
    assert_clean(&mut fs);
}

/// FALLOC_FL_ZERO_RANGE reads as zeros like a punch; without KEEP_SIZE it
/// grows the file to the range's end. Modes flintfs does not take, and
/// PUNCH_HOLE without KEEP_SIZE (as Linux), are refused with EOPNOTSUPP;
/// a directory gives EISDIR, a zero length EINVAL and a range past the
/// largest file EFBIG.
#[test]
fn zero_range_grows_the_file_and_other_modes_are_refused() {
    let (mut fs, clock) = mounted();
    let file = fs.create(1, b"zeroed", 0o644, 0, 0).unwrap().ino;
    let mut expected = pattern(20 * PAGE_BYTES);
    fs.write(file, 0, &expected).unwrap();
    fs.fallocate(file, 3 * PAGE_BYTES + 1, 2 * PAGE_BYTES, flintfs_core::FALLOC_FL_ZERO_RANGE).unwrap();
    zeroed(&mut expected, 3 * PAGE_BYTES + 1, 2 * PAGE_BYTES);
    fs.fallocate(file, 19 * PAGE_BYTES, 3 * PAGE_BYTES, flintfs_core::FALLOC_FL_ZERO_RANGE).unwrap();
    expected.truncate(19 * PAGE_BYTES as usize);
    expected.resize(22 * PAGE_BYTES as usize, 0);
    assert_eq!(fs.getattr(file).unwrap().size, 22 * PAGE_BYTES, "grown to the range's end");
    assert!(fs.read(file, 0, 1 << 20).unwrap() == expected);
    for mode in [flintfs_core::FALLOC_FL_PUNCH_HOLE, 0x08, 0x20, 0x40] {
        let error = fs.fallocate(file, 0, PAGE_BYTES, mode).unwrap_err();
        assert_eq!(error.errno, errno::EOPNOTSUPP, "mode {mode:#x}");
    }
    assert_eq!(fs.fallocate(1, 0, PAGE_BYTES, PUNCH).unwrap_err().errno, errno::EISDIR);
    // vfs_fallocate's order: a zero length is EINVAL whatever the mode, and
    // a range past the largest file EFBIG in every mode, changing nothing.
    assert_eq!(fs.fallocate(file, 0, 0, 0x40).unwrap_err().errno, errno::EINVAL);
    let beyond = u64::MAX / 2;
    for mode in [PUNCH, flintfs_core::FALLOC_FL_ZERO_RANGE, flintfs_core::FALLOC_FL_ZERO_RANGE | 1, 0, 1] {
        assert_eq!(fs.fallocate(file, beyond, PAGE_BYTES, mode).unwrap_err().errno, errno::EFBIG, "mode {mode:#x}");
    }
    assert_eq!(fs.getattr(file).unwrap().size, 22 * PAGE_BYTES);
    let mut fs = remount(fs, &clock);
    assert!(fs.read(file, 0, 1 << 20).unwrap() == expected, "after a remount");
    assert_clean(&mut fs);
}

/// A punch is logged: a persistence point after it (here an fsync of
/// another file) keeps it through a power cut, and recovery replays it
/// over the blocks the checkpoint still points at.
#[test]
fn a_punch_before_a_persistence_point_survives_a_power_cut() {
    let (mut fs, clock) = mounted();
    let file = fs.create(1, b"kept", 0o644, 0, 0).unwrap().ino;
    let other = fs.create(1, b"other", 0o644, 0, 0).unwrap().ino;
    let mut expected = pattern(64 * PAGE_BYTES);
    fs.write(file, 0, &expected).unwrap();
    fs.sync().unwrap();
    fs.fallocate(file, 5 * PAGE_BYTES + 3, 40 * PAGE_BYTES, PUNCH).unwrap();
    zeroed(&mut expected, 5 * PAGE_BYTES + 3, 40 * PAGE_BYTES);
    fs.write(other, 0, b"x").unwrap();
    fs.fsync(other, false).unwrap();
    let mut flash = fs.into_device();
    flash.power_cut(11).unwrap();
    flash.power_on();
    let (mut fs, report) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).expect("recovery");
    assert!(report.recovery.is_some(), "the mount recovered");
    assert!(fs.read(file, 0, 1 << 20).unwrap() == expected, "the punch was replayed");
    assert_clean(&mut fs);
}
