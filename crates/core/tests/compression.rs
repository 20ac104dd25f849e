//! Compressed chunks (RCFFS's packed compression): each codec and the raw
//! fallback, the per-file codec, what `st_blocks` reports, the read of one
//! compression unit, and the cleaner moving chunks without inflating them.

use flintfs_core::{errno, Fs, FsOptions, ManualClock, MkfsOptions, XattrFlags};
use flintfs_flash::{DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash};
use flintfs_format::{Compression, CompressionChoice};

const PAGE_BYTES: usize = 4096;

fn geometry(zone_count: u32) -> Geometry {
    Geometry {
        page_size_bytes: PAGE_BYTES as u32,
        oob_size_bytes: 128,
        block_pages: 16,
        zone_blocks: 4,
        zone_count,
        open_zones_max: 8,
        nvm_size_bytes: 0,
    }
}

fn format(zone_count: u32, codec: Compression) -> (MemoryFlash, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(
        geometry(zone_count),
        DeviceOptions { faults: FaultConfig::none(1), ..DeviceOptions::default() },
    )
    .unwrap();
    let mkfs = MkfsOptions { compression: codec, ..MkfsOptions::new([7; 16], 0) };
    (Fs::format(flash, &mkfs, Box::new(clock.clone())).unwrap(), clock)
}

fn mount(flash: MemoryFlash, clock: &ManualClock, compression: Option<CompressionChoice>) -> Fs<MemoryFlash> {
    Fs::mount(flash, FsOptions { compression, ..FsOptions::default() }, Box::new(clock.clone())).unwrap().0
}

fn assert_clean(fs: &mut Fs<MemoryFlash>) {
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

/// Deterministic bytes that do not compress.
fn random_bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Text-like bytes: numbered lines of words from a small vocabulary, which
/// every codec compresses to well under half a block.
fn text(seed: u64, length: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = ["flash", "page", "zone", "erase", "block", "chunk", "index", "log"];
    let picks = random_bytes(seed, length);
    let mut out = Vec::with_capacity(length + 100);
    let mut line = 0;
    while out.len() < length {
        let word = |at: usize| WORDS[picks[(line * 3 + at) % picks.len()] as usize % WORDS.len()];
        out.extend_from_slice(
            format!("{line:06}: the {} of the {} is written to the {}\n", word(0), word(1), word(2)).as_bytes(),
        );
        line += 1;
    }
    out.truncate(length);
    out
}

/// What the bench's workloads write: the first half of a file one byte
/// repeated, the second half random. Its floor is half the raw size.
fn half_compressible(seed: u64, length: usize) -> Vec<u8> {
    let mut out = random_bytes(seed, length);
    out[..length / 2].fill(seed as u8);
    out
}

/// Each block half one byte, half random: it compresses to a little over
/// half a page, which could not share its page with another like it.
fn half_compressible_blocks(seed: u64, length: usize) -> Vec<u8> {
    let mut out = random_bytes(seed, length);
    for block in out.chunks_mut(PAGE_BYTES) {
        let half = block.len() / 2;
        block[..half].fill(seed as u8);
    }
    out
}

/// Writes `files` files of `bytes` each, syncs, and returns the pages the
/// data took (programs less the device's count before).
fn write_files(fs: &mut Fs<MemoryFlash>, files: u64, bytes: usize, make: fn(u64, usize) -> Vec<u8>) -> Vec<u64> {
    let mut inos = Vec::new();
    for index in 0..files {
        let file = fs.create(1, format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(file.ino, 0, &make(index, bytes)).unwrap();
        inos.push(file.ino);
    }
    fs.sync().unwrap();
    inos
}

fn read_all(fs: &mut Fs<MemoryFlash>, inos: &[u64], bytes: usize, make: fn(u64, usize) -> Vec<u8>) {
    for (index, &ino) in inos.iter().enumerate() {
        assert!(fs.read(ino, 0, bytes as u64 + 10).unwrap() == make(index as u64, bytes), "file {index} reads back");
    }
}

/// Each codec stores text in chunks of under half a block, reads it back
/// after a remount, and `st_blocks` reports the bytes really used; the
/// pages programmed fall with it.
#[test]
fn each_codec_stores_text_compressed_and_reads_it_back() {
    const FILES: u64 = 20;
    const BYTES: usize = 64 * 1024;
    let mut data_pages = Vec::new();
    for choice in [
        CompressionChoice::NONE,
        CompressionChoice::LZ4,
        CompressionChoice::ZSTD,
        CompressionChoice::parse("zstd:9").unwrap(),
    ] {
        let (flash, clock) = format(64, Compression::None);
        let mut fs = mount(flash, &clock, Some(choice));
        let inos = write_files(&mut fs, FILES, BYTES, text);
        let counters = fs.counters().clone();
        let sectors: u64 = inos.iter().map(|&ino| fs.getattr(ino).unwrap().blocks).sum();
        read_all(&mut fs, &inos, BYTES, text);
        assert_clean(&mut fs);
        let flash = fs.unmount().unwrap();
        // A mount with another codec reads what this one wrote.
        let mut fs = mount(flash, &clock, Some(CompressionChoice::NONE));
        read_all(&mut fs, &inos, BYTES, text);
        assert_eq!(inos.iter().map(|&ino| fs.getattr(ino).unwrap().blocks).sum::<u64>(), sectors, "st_blocks on flash");
        assert_clean(&mut fs);
        let raw_sectors = FILES * BYTES as u64 / 512;
        if choice.codec == Compression::None {
            assert_eq!(counters.chunks_compressed, 0);
            assert_eq!(sectors, raw_sectors);
        } else {
            let blocks = FILES * (BYTES / PAGE_BYTES) as u64;
            assert_eq!(counters.chunks_compressed, blocks, "{choice}: every block compressed");
            assert!(sectors * 10 < raw_sectors * 6, "{choice}: st_blocks {sectors} of {raw_sectors} raw");
        }
        data_pages.push((choice, counters.data_pages_written));
    }
    eprintln!("data pages written: {data_pages:?}");
    let raw = data_pages[0].1;
    for &(choice, pages) in &data_pages[1..] {
        assert!(pages * 10 < raw * 6, "{choice}: {pages} data pages against {raw} raw");
    }
}

/// Data that does not shrink is stored raw, as whole pages; after a run of
/// such blocks the file is marked incompressible and writes stop trying,
/// until the file is cut to nothing.
#[test]
fn incompressible_data_is_stored_raw_and_the_file_stops_trying() {
    let (flash, clock) = format(64, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let file = fs.create(1, b"random", 0o644, 0, 0).unwrap().ino;
    let data = random_bytes(3, 64 * PAGE_BYTES);
    fs.write(file, 0, &data).unwrap();
    fs.sync().unwrap();
    let counters = fs.counters().clone();
    assert_eq!(counters.chunks_compressed, 0);
    assert_eq!(counters.files_marked_incompressible, 1);
    let attempts = counters.compression_attempts;
    assert_eq!(attempts, u64::from(flintfs_core::INCOMPRESSIBLE_AFTER_BLOCKS), "tried until marked, then not");
    assert_eq!(fs.getattr(file).unwrap().blocks, (64 * PAGE_BYTES / 512) as u64, "raw blocks, no overhead");
    // More writes: no attempt, even of compressible bytes.
    fs.write(file, 64 * PAGE_BYTES as u64, &vec![0u8; 8 * PAGE_BYTES]).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().compression_attempts, attempts);
    // The mark is on flash.
    let flash = fs.unmount().unwrap();
    let mut fs = mount(flash, &clock, None);
    fs.write(file, 0, &vec![1u8; PAGE_BYTES]).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().compression_attempts, 0, "still marked after a remount");
    assert!(fs.read(file, PAGE_BYTES as u64, 63 * PAGE_BYTES as u64).unwrap() == data[PAGE_BYTES..]);
    // Cut to nothing, the file is tried again.
    fs.setattr(file, &flintfs_core::SetAttributes { size: Some(0), ..Default::default() }).unwrap();
    fs.write(file, 0, &vec![2u8; 4 * PAGE_BYTES]).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().chunks_compressed, 4);
    assert_clean(&mut fs);
}

/// `user.flintfs.compress` sets one file's codec over the mount's, is
/// refused when it names no codec, and clears the incompressible mark.
#[test]
fn the_xattr_sets_a_files_codec() {
    let (flash, clock) = format(64, Compression::None);
    let mut fs = mount(flash, &clock, None);
    let plain = fs.create(1, b"plain", 0o644, 0, 0).unwrap().ino;
    let packed = fs.create(1, b"packed", 0o644, 0, 0).unwrap().ino;
    let error = fs.setxattr(packed, b"user.flintfs.compress", b"gzip", XattrFlags::default()).unwrap_err();
    assert_eq!(error.errno, errno::EINVAL);
    let error = fs.setxattr(packed, b"user.flintfs.compress", b"zstd:99", XattrFlags::default()).unwrap_err();
    assert_eq!(error.errno, errno::EINVAL);
    fs.setxattr(packed, b"user.flintfs.compress", b"zstd:7\n", XattrFlags::default()).unwrap();
    let data = text(1, 16 * PAGE_BYTES);
    fs.write(plain, 0, &data).unwrap();
    fs.write(packed, 0, &data).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().chunks_compressed, 16, "only the file with the xattr");
    assert!(fs.getattr(packed).unwrap().blocks * 2 < fs.getattr(plain).unwrap().blocks);
    assert_eq!(fs.getxattr(packed, b"user.flintfs.compress").unwrap(), b"zstd:7\n");
    // Marked incompressible, then named again: tried again.
    fs.setxattr(plain, b"user.flintfs.compress", b"lz4", XattrFlags::default()).unwrap();
    fs.write(plain, 0, &random_bytes(9, 20 * PAGE_BYTES)).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().files_marked_incompressible, 1);
    fs.setxattr(plain, b"user.flintfs.compress", b"lz4", XattrFlags::default()).unwrap();
    fs.write(plain, 0, &data).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().chunks_compressed, 32);
    assert!(fs.read(plain, 0, data.len() as u64).unwrap() == data);
    assert_clean(&mut fs);
}

/// The bench's half-compressible files take little more than their
/// random half; blocks that would compress to more than half a page are
/// stored raw (such a chunk cannot share its page); and each 4 KiB read of
/// a compressed file reads one page and decompresses one block.
#[test]
fn half_compressible_files_take_half_and_a_random_read_decompresses_one_block() {
    const BLOCKS: usize = 256;
    let (flash, clock) = format(64, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let half = fs.create(1, b"half", 0o644, 0, 0).unwrap().ino;
    fs.write(half, 0, &half_compressible(5, BLOCKS * PAGE_BYTES)).unwrap();
    let halves = fs.create(1, b"halves", 0o644, 0, 0).unwrap().ino;
    fs.write(halves, 0, &half_compressible_blocks(6, 32 * PAGE_BYTES)).unwrap();
    let data = text(7, BLOCKS * PAGE_BYTES);
    let file = fs.create(1, b"text", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, &data).unwrap();
    fs.sync().unwrap();
    let used = fs.getattr(half).unwrap().blocks as f64 * 512.0 / (BLOCKS * PAGE_BYTES) as f64;
    assert!(used < 0.53, "half-compressible data uses {used:.3} of its raw size");
    assert_eq!(fs.getattr(halves).unwrap().blocks, (32 * PAGE_BYTES / 512) as u64, "stored raw");
    let flash = fs.unmount().unwrap();
    let mut fs = mount(flash, &clock, None);
    let pages_before = fs.device().counters().pages_read;
    let mut position = 7u64;
    for _ in 0..64 {
        position = position.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(3_037_000_493) % BLOCKS as u64;
        let offset = position * PAGE_BYTES as u64;
        let before = fs.counters().data_pages_read;
        let read = fs.read(file, offset, PAGE_BYTES as u64).unwrap();
        assert!(read == data[offset as usize..offset as usize + PAGE_BYTES]);
        assert!(fs.counters().data_pages_read - before <= 1, "one page for one block");
    }
    let pages = fs.device().counters().pages_read - pages_before;
    eprintln!("64 random reads read {pages} pages");
    assert_clean(&mut fs);
}

/// Overwrites on a small device make the cleaner move compressed chunks;
/// they move compressed (the space used stays at its compressed size)
/// and read back.
#[test]
fn the_cleaner_moves_compressed_chunks_compressed() {
    let (flash, clock) = format(24, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let files = 12u64;
    let bytes = 32 * PAGE_BYTES;
    let inos = write_files(&mut fs, files, bytes, text);
    // Rewrite one file over and over: its old chunks die beside the other
    // files' live ones, which the cleaner has to move.
    let churn = fs.create(1, b"churn", 0o644, 0, 0).unwrap().ino;
    for round in 0..400u64 {
        fs.write(churn, 0, &text(round, 16 * PAGE_BYTES)).unwrap();
        fs.fsync(churn, false).unwrap();
    }
    let cleaner = fs.cleaner_counters().clone();
    eprintln!("{cleaner:?}");
    assert!(cleaner.chunks_moved > 0, "the cleaner moved chunks");
    read_all(&mut fs, &inos, bytes, text);
    let sectors: u64 = inos.iter().map(|&ino| fs.getattr(ino).unwrap().blocks).sum();
    assert!(sectors * 10 < files * bytes as u64 / 512 * 6, "moved chunks stay compressed: {sectors} sectors");
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let mut fs = mount(flash, &clock, None);
    read_all(&mut fs, &inos, bytes, text);
    assert_clean(&mut fs);
}

/// Files of 128 KiB of noise take their size and little more: the blocks
/// are stored raw, and each file's index page (32 pointers) is a record in
/// a pack, not a page of its own.
#[test]
fn incompressible_files_take_their_size_and_little_more() {
    const FILES: u64 = 64;
    const BYTES: usize = 128 * 1024;
    let (flash, clock) = format(64, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let statfs = fs.statfs().unwrap();
    let used_before = (statfs.blocks - statfs.blocks_free) * u64::from(statfs.block_size);
    let inos = write_files(&mut fs, FILES, BYTES, random_bytes);
    let statfs = fs.statfs().unwrap();
    let used = (statfs.blocks - statfs.blocks_free) * u64::from(statfs.block_size) - used_before;
    let ratio = used as f64 / (FILES * BYTES as u64) as f64;
    eprintln!("{FILES} files of noise use {ratio:.4} of their size");
    assert!(ratio <= 1.02, "{ratio}");
    let flash = fs.unmount().unwrap();
    let mut fs = mount(flash, &clock, None);
    read_all(&mut fs, &inos, BYTES, random_bytes);
    assert_clean(&mut fs);
}

/// An fsync carries the file's small blocks (their chunks) in its log
/// record instead of programming a packed page: the fsync of a 4 KiB
/// append that compresses programs its log page and nothing else, and a
/// power cut right after keeps the bytes (recovery buffers them again and
/// writes them home).
#[test]
fn an_fsync_carries_small_blocks_in_its_record_and_a_cut_keeps_them() {
    let (flash, clock) = format(64, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let file = fs.create(1, b"mail", 0o644, 0, 0).unwrap().ino;
    fs.fsync(file, false).unwrap();
    let mut written = Vec::new();
    for round in 0..6u64 {
        let data = text(round, PAGE_BYTES);
        let before = (fs.counters().clone(), fs.device().counters().pages_programmed);
        fs.write(file, written.len() as u64, &data).unwrap();
        written.extend_from_slice(&data);
        fs.fsync(file, false).unwrap();
        let after = fs.counters();
        assert_eq!(after.data_pages_written, before.0.data_pages_written, "round {round}: no data page");
        assert_eq!(after.log_pages_written - before.0.log_pages_written, 1, "round {round}: one log page");
        assert!(after.blocks_embedded > before.0.blocks_embedded);
        // The log page, and the block parity that page may complete.
        let programmed = fs.device().counters().pages_programmed - before.1;
        assert!(programmed <= 2, "round {round}: {programmed} pages programmed");
    }
    // The power goes before any checkpoint: the blocks are only in the log.
    let mut flash = fs.into_device();
    flash.power_cut(3).unwrap();
    flash.power_on();
    let (mut fs, report) =
        Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).expect("recovery after the cut");
    assert!(report.recovery.is_some(), "the mount recovered");
    assert!(fs.read(file, 0, written.len() as u64 + 1).unwrap() == written, "every fsynced byte is back");
    assert_clean(&mut fs);
    let flash = fs.unmount().unwrap();
    let mut fs = mount(flash, &clock, None);
    assert!(fs.read(file, 0, written.len() as u64 + 1).unwrap() == written, "and written home");
    assert_clean(&mut fs);
}

/// A file marked incompressible still tries one block in
/// `INCOMPRESSIBLE_PROBE_BLOCKS`: when its data turns compressible again,
/// the probe finds it and the file compresses again.
#[test]
fn a_marked_file_whose_data_turns_compressible_compresses_again() {
    use flintfs_core::{INCOMPRESSIBLE_AFTER_BLOCKS, INCOMPRESSIBLE_PROBE_BLOCKS};
    let (flash, clock) = format(64, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let file = fs.create(1, b"mixed", 0o644, 0, 0).unwrap().ino;
    let noise_blocks = INCOMPRESSIBLE_AFTER_BLOCKS as usize;
    let text_blocks = 2 * INCOMPRESSIBLE_PROBE_BLOCKS as usize;
    let mut data = random_bytes(4, noise_blocks * PAGE_BYTES);
    data.extend_from_slice(&text(4, text_blocks * PAGE_BYTES));
    fs.write(file, 0, &data).unwrap();
    fs.sync().unwrap();
    let counters = fs.counters().clone();
    assert_eq!(counters.files_marked_incompressible, 1);
    assert_eq!(counters.files_unmarked_incompressible, 1, "the probe found the text");
    // The text's first blocks went raw until the probe; the rest compressed.
    let compressed = counters.chunks_compressed as usize;
    assert!(compressed >= text_blocks - INCOMPRESSIBLE_PROBE_BLOCKS as usize, "{compressed} blocks compressed");
    assert!(compressed < text_blocks);
    assert!(fs.read(file, 0, data.len() as u64).unwrap() == data);
    assert_clean(&mut fs);
}

/// `st_blocks` counts each buffered block that the index does not point
/// at yet: blocks rewritten in place count once, new ones under an index
/// leaf that exists and under one that does not count too, so the figure
/// is the same before and after the buffer goes to flash.
#[test]
fn st_blocks_counts_buffered_blocks_over_index_leaves() {
    let (flash, clock) = format(128, Compression::None);
    let mut fs = mount(flash, &clock, None);
    let file = fs.create(1, b"log", 0o644, 0, 0).unwrap().ino;
    let block = PAGE_BYTES as u64;
    fs.write(file, 0, &random_bytes(1, 1200 * PAGE_BYTES)).unwrap();
    fs.sync().unwrap();
    let stored = fs.getattr(file).unwrap().blocks;
    assert_eq!(stored, 1200 * block / 512);
    // Rewrites under the first two leaves, and new blocks under the third
    // (which exists) and past it (under leaves not made yet).
    for (first, count, seed) in [(10u64, 11usize, 2u64), (600, 11, 3), (1300, 11, 4), (2000, 6, 5)] {
        fs.write(file, first * block, &random_bytes(seed, count * PAGE_BYTES)).unwrap();
    }
    let buffered = fs.getattr(file).unwrap().blocks;
    assert_eq!(buffered, (1200 + 11 + 6) * block / 512, "rewrites add nothing, new blocks add theirs");
    fs.sync().unwrap();
    assert_eq!(fs.getattr(file).unwrap().blocks, buffered, "the same once on flash");
    assert_clean(&mut fs);
}

/// A file marked incompressible (a repeated-byte head before a noisy
/// tail, as the bench's files are) still compresses a rewrite of a block
/// whose stored copy is a chunk: stored raw, each such rewrite took a
/// page where the block had taken tens of bytes, and near_full_90 grew
/// from 90% to 99% full. The mark stays for the rest of the file.
#[test]
fn a_marked_file_compresses_rewrites_of_its_compressed_blocks() {
    use flintfs_core::INCOMPRESSIBLE_AFTER_BLOCKS;
    let (flash, clock) = format(64, Compression::Lz4);
    let mut fs = mount(flash, &clock, None);
    let file = fs.create(1, b"mixed", 0o644, 0, 0).unwrap().ino;
    let blocks = 4 * INCOMPRESSIBLE_AFTER_BLOCKS as usize;
    let mut data = half_compressible(9, blocks * PAGE_BYTES);
    fs.write(file, 0, &data).unwrap();
    fs.sync().unwrap();
    let before = fs.counters().clone();
    assert_eq!(before.files_marked_incompressible, 1, "the noisy tail marks the file");
    let blocks_stored = fs.getattr(file).unwrap().blocks;
    // Rewrite every block of the head with another repeated byte, one
    // block and one sync at a time, after a remount (the mark is on flash).
    let flash = fs.unmount().unwrap();
    let mut fs = mount(flash, &clock, None);
    let head_blocks = blocks / 2;
    for block in 0..head_blocks {
        let at = block * PAGE_BYTES;
        data[at..at + PAGE_BYTES].fill(0xA5);
        fs.write(file, at as u64, &data[at..at + PAGE_BYTES]).unwrap();
        fs.sync().unwrap();
    }
    let after = fs.counters().clone();
    assert_eq!(after.chunks_compressed, head_blocks as u64, "every rewrite of a compressed block compressed");
    assert_eq!(after.files_unmarked_incompressible, 0, "the mark stays");
    assert_eq!(after.compression_attempts, head_blocks as u64, "the noisy tail was not tried");
    let blocks_now = fs.getattr(file).unwrap().blocks;
    assert!(blocks_now <= blocks_stored, "{blocks_now} 512-byte blocks now, {blocks_stored} before the rewrites");
    // A rewrite of the noisy tail is not tried: the mark holds there.
    let tail = head_blocks * PAGE_BYTES;
    data[tail..tail + PAGE_BYTES].fill(0x5A);
    fs.write(file, tail as u64, &data[tail..tail + PAGE_BYTES]).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.counters().compression_attempts, head_blocks as u64, "a raw block is not retried");
    assert!(fs.read(file, 0, data.len() as u64).unwrap() == data);
    assert_clean(&mut fs);
}
