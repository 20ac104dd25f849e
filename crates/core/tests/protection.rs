//! The protection layer under the engine: pages with flipped bits come
//! back whole through the OOB's ECC, and what cannot be corrected is
//! refused, never returned wrong.

use std::collections::{BTreeMap, BTreeSet};

use flintfs_core::{errno, Fs, FsOptions, ManualClock, MkfsOptions, ProtectionCounters};
use flintfs_flash::{
    BitErrorModel, DeviceOptions, FaultConfig, FlashDevice, Geometry, MemoryFlash, PageAddress, PageFault, PageState,
    ZoneState,
};
use flintfs_format::{is_inode_pack, Node, PageHeader, PageKind, SUPERBLOCK_ZONES};

mod common;
use common::{contents, destroyed};

fn geometry() -> Geometry {
    common::geometry(48, 0)
}

/// Writes a tree on a device whose reads flip bits at `rate`, remounts,
/// reads it all back, and returns the protection counters of the reads.
fn round_trip(rate: f64, seed: u64) -> ProtectionCounters {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let faults = FaultConfig { bit_errors: Some(BitErrorModel::flat(rate)), ..FaultConfig::none(seed) };
    let flash = MemoryFlash::memory(geometry(), DeviceOptions { faults, ..DeviceOptions::default() }).unwrap();
    let flash = write_tree(flash, &clock);
    read_back(flash, clock, seed)
}

/// The tree written on a fresh device of the tests' geometry, and its
/// clock.
fn written_tree() -> (MemoryFlash, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(), DeviceOptions::default()).unwrap();
    (write_tree(flash, &clock), clock)
}

fn write_tree(flash: MemoryFlash, clock: &ManualClock) -> MemoryFlash {
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    for directory_index in 0..4u32 {
        let directory = fs.mkdir(1, format!("d{directory_index}").as_bytes(), 0o755, 0, 0).unwrap();
        for index in 0..40u32 {
            let file = fs.create(directory.ino, format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
            fs.write(file.ino, 0, &contents(directory_index * 100 + index)).unwrap();
            fs.forget(file.ino, 1).unwrap();
        }
        fs.forget(directory.ino, 1).unwrap();
    }
    fs.unmount().unwrap()
}

/// Mounts, reads the whole tree back and compares it, checks the file
/// system, and returns what the protection layer did.
fn read_back(flash: MemoryFlash, clock: ManualClock, seed: u64) -> ProtectionCounters {
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    for directory_index in 0..4u32 {
        let directory = fs.lookup(1, format!("d{directory_index}").as_bytes()).unwrap();
        for index in 0..40u32 {
            let file = fs.lookup(directory.ino, format!("f{index}").as_bytes()).unwrap();
            let expected = contents(directory_index * 100 + index);
            let read = fs.read(file.ino, 0, 1 << 20).unwrap_or_else(|error| panic!("seed {seed}: f{index}: {error}"));
            assert!(read == expected, "seed {seed}: d{directory_index}/f{index} read back different bytes");
        }
    }
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "seed {seed}: {:#?}", report.findings);
    fs.protection_counters()
}

#[test]
fn bit_flips_on_every_page_are_corrected_by_the_ecc() {
    // About three flipped bits per 4 KiB page, one per 1 KiB codeword:
    // nearly every read of the medium needs the ECC, and t = 8 covers it
    // (more than eight in a codeword has odds of about 1e-7).
    for seed in [1, 2, 3] {
        let counters = round_trip(1e-4, seed);
        assert!(counters.pages_corrected_ecc > 100, "seed {seed}: {counters:?}");
        assert!(counters.bits_corrected_ecc > 2 * counters.pages_corrected_ecc, "seed {seed}: {counters:?}");
        assert_eq!(counters.pages_unrepairable, 0, "seed {seed}: {counters:?}");
    }
}

#[test]
fn a_clean_medium_needs_no_correction() {
    let counters = round_trip(0.0, 9);
    assert_eq!(counters, ProtectionCounters { ..counters_without_repairs(&counters) });
    assert_eq!(counters.pages_corrected_ecc + counters.pages_unrepairable, 0, "{counters:?}");
}

fn counters_without_repairs(counters: &ProtectionCounters) -> ProtectionCounters {
    ProtectionCounters {
        parity_pages_programmed: counters.parity_pages_programmed,
        stripe_rebuild_pages_read: counters.stripe_rebuild_pages_read,
        unprotected_pages_max: counters.unprotected_pages_max,
        ..ProtectionCounters::default()
    }
}

/// The physical pages of every erase block that has its parity on flash
/// (the open blocks at the log heads have the ECC alone until they fill).
fn protected_blocks(flash: &MemoryFlash) -> Vec<(u32, u32, u32)> {
    let geometry = flash.geometry();
    let mut blocks = Vec::new();
    for report in flash.report_zones() {
        if SUPERBLOCK_ZONES.contains(&report.zone) || report.write_pointer == 0 {
            continue;
        }
        for block in 0..report.write_pointer.div_ceil(geometry.block_pages) {
            let start = block * geometry.block_pages;
            let end = (start + geometry.block_pages).min(report.write_pointer);
            if end == start + geometry.block_pages || report.state == ZoneState::Full {
                blocks.push((report.zone, start, end));
            }
        }
    }
    blocks
}

#[test]
fn one_destroyed_page_in_every_erase_block_is_rebuilt_from_block_parity() {
    let (mut flash, clock) = written_tree();
    let blocks = protected_blocks(&flash);
    assert!(blocks.len() > 20, "{} blocks", blocks.len());
    for (index, &(zone, start, end)) in blocks.iter().enumerate() {
        // Every page of the block in turn, data, node, log, checkpoint and
        // parity pages alike.
        let page = start + index as u32 % (end - start);
        assert!(flash.inject_page_fault(PageAddress::new(zone, page), destroyed(index as u64)).unwrap());
    }
    let counters = read_back(flash, clock, 0);
    eprintln!("{counters:?}");
    assert!(counters.pages_repaired_block_parity > 10, "{counters:?}");
    assert_eq!(counters.pages_unrepairable, 0, "{counters:?}");
}

#[test]
fn an_erase_block_lost_whole_is_rebuilt_from_zone_parity() {
    let (mut flash, clock) = written_tree();
    let geometry = flash.geometry();
    // A zone written full: its zone parity is on flash.
    let full = full_zones(&flash);
    assert!(full.len() >= 2, "zones written full: {full:?}");
    for (index, &zone) in full.iter().enumerate() {
        let block = index as u32 % (geometry.zone_blocks - 1);
        for page in block * geometry.block_pages..(block + 1) * geometry.block_pages {
            assert!(flash.inject_page_fault(PageAddress::new(zone, page), destroyed(u64::from(page))).unwrap());
        }
    }
    let counters = read_back(flash, clock, 0);
    eprintln!("{counters:?}");
    assert!(counters.pages_repaired_zone_parity > 10, "{counters:?}");
    assert_eq!(counters.pages_unrepairable, 0, "{counters:?}");
}

#[test]
fn damage_that_neither_a_block_nor_a_row_undoes_alone_is_solved_by_iterating_over_both() {
    let (mut flash, clock) = written_tree();
    let geometry = flash.geometry();
    let full = full_zones(&flash);
    assert!(!full.is_empty());
    // In every full zone, rows 0 and 1 of block 0 and rows 0 and 2 of block
    // 1: each block has two pages lost (k = 1) and row 0 two blocks (r = 1),
    // so neither block parity nor row 0 (nor row 0 with block parity under
    // it) brings page 0 back; rows 1 and 2 give each block one page back
    // first.
    for (index, &zone) in full.iter().enumerate() {
        for page in [0, 1, geometry.block_pages, geometry.block_pages + 2] {
            let fault = destroyed(u64::from(page) + 1000 * index as u64);
            assert!(flash.inject_page_fault(PageAddress::new(zone, page), fault).unwrap());
        }
    }
    let counters = read_back(flash, clock, 0);
    eprintln!("{counters:?}");
    assert_eq!(counters.pages_unrepairable, 0, "{counters:?}");
    assert!(counters.pages_repaired_zone_parity >= full.len() as u64, "{counters:?}");
}

/// Zones written to their end (so their zone parity is on flash), but for
/// the superblock's.
fn full_zones(flash: &MemoryFlash) -> Vec<u32> {
    flash
        .report_zones()
        .iter()
        .filter(|report| {
            report.state == ZoneState::Full
                && report.write_pointer == report.capacity_pages
                && !SUPERBLOCK_ZONES.contains(&report.zone)
        })
        .map(|report| report.zone)
        .collect()
}

fn damaged_tree() -> (MemoryFlash, ManualClock) {
    let (mut flash, clock) = written_tree();
    for (index, (zone, start, end)) in protected_blocks(&flash).into_iter().enumerate() {
        let page = start + index as u32 % (end - start);
        assert!(flash.inject_page_fault(PageAddress::new(zone, page), destroyed(index as u64)).unwrap());
    }
    (flash, clock)
}

#[test]
fn the_quick_scan_finds_damaged_stripes_from_the_oob_alone() {
    let (flash, clock) = written_tree();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let clean = fs.scrub(true).unwrap();
    assert!(clean.stripes_checked > 20, "{clean:?}");
    assert_eq!(clean.stripes_inconsistent, 0, "{clean:?}");
    assert_eq!(clean.pages_checked, 0, "the quick scan reads no data: {clean:?}");
    drop(fs);

    let (flash, clock) = damaged_tree();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let damaged = fs.scrub(true).unwrap();
    assert!(damaged.stripes_inconsistent > 10, "{damaged:?}");
}

#[test]
fn a_full_scrub_repairs_moves_the_data_and_leaves_nothing_to_repair() {
    let (flash, clock) = damaged_tree();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let first = fs.scrub(false).unwrap();
    eprintln!("{first:?}");
    assert!(first.pages_repaired > 10, "{first:?}");
    assert_eq!(first.pages_unrepairable, 0, "{first:?}");
    assert!(first.zones_refreshed > 0, "{first:?}");
    let report = fs.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
    let second = fs.scrub(false).unwrap();
    eprintln!("{second:?}");
    assert_eq!((second.pages_unrepairable, second.parity_pages_bad), (0, 0), "{second:?}");
    assert!(second.pages_repaired < first.pages_repaired, "{second:?}");
    let flash = fs.unmount().unwrap();
    read_back(flash, clock, 0);
}

#[test]
fn the_idle_scrub_reads_at_its_rate_and_finds_the_damage_in_a_pass() {
    let (flash, clock) = damaged_tree();
    let options = FsOptions { scrub_pages_per_second: 100, ..FsOptions::default() };
    let (mut fs, _) = Fs::mount(flash, options, Box::new(clock.clone())).unwrap();
    assert_eq!(fs.scrub_in_background().unwrap(), 0, "no time has passed");
    clock.advance(1_000_000_000);
    assert_eq!(fs.scrub_in_background().unwrap(), 100, "one second at 100 pages a second");
    clock.advance(3_600_000_000_000);
    assert_eq!(
        fs.scrub_in_background().unwrap(),
        flintfs_core::SCRUB_PAGES_PER_STEP_MAX,
        "an hour idle still reads one step's worth at a time"
    );
    let before = fs.protection_counters();
    let mut steps = 0;
    while fs.counters().scrub_passes_finished == 0 {
        clock.advance(2_000_000_000);
        fs.scrub_in_background().unwrap();
        steps += 1;
        assert!(steps < 10_000, "the scrub never finished a pass");
    }
    let after = fs.protection_counters();
    let repaired = after.pages_repaired_block_parity + after.pages_repaired_zone_parity
        - before.pages_repaired_block_parity
        - before.pages_repaired_zone_parity;
    assert!(repaired > 10, "{after:?}");
    assert_eq!(after.pages_unrepairable, 0, "{after:?}");
}

/// Flips exactly `bits` bits of the page's data, spread over it, as the
/// medium's stored state (what every read of the page then meets).
fn flip_bits(flash: &mut MemoryFlash, address: PageAddress, bits: u32) {
    let (mut data, oob) = flash.pristine_page(address).unwrap().expect("a programmed page");
    let stride = data.len() * 8 / bits as usize;
    for index in 0..bits as usize {
        let bit = index * stride + index % 8;
        data[bit / 8] ^= 1 << (bit % 8);
    }
    let media: Vec<u8> = data.into_iter().chain(oob).collect();
    assert!(flash.inject_page_fault(address, PageFault::Stored { media: media.into_boxed_slice() }).unwrap());
}

#[test]
fn a_page_near_the_ecc_bound_moves_its_zone_and_a_block_past_end_of_life_is_retired() {
    let (mut flash, clock) = written_tree();
    let geometry = flash.geometry();
    let layout = flintfs_format::protection::EccLayout::for_geometry(4096, 128).unwrap();
    let (worn_bits, half) = (layout.worn_bits(), layout.correctable_bits() / 2);
    assert_eq!((worn_bits, half), (25, 14), "t = 28: an eighth of margin, and half its reach");
    // Three zones written full (data zones, which the refresh moves): one
    // page of each at the worn mark. A fourth: every page of one block at
    // half the reach, a block past end of life. A fifth: every page of a
    // block one bit under that, a block merely old.
    let full = full_zones(&flash);
    assert!(full.len() >= 5, "zones written full: {full:?}");
    for &zone in &full[..3] {
        flip_bits(&mut flash, PageAddress::new(zone, geometry.block_pages), worn_bits);
    }
    let (dying, old) = (full[3], full[4]);
    for page in 0..geometry.block_pages {
        flip_bits(&mut flash, PageAddress::new(dying, page), half);
        flip_bits(&mut flash, PageAddress::new(old, page), half - 1);
    }
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let first = fs.scrub(false).unwrap();
    eprintln!("{first:?}");
    assert_eq!(first.pages_worn, 3, "{first:?}");
    assert_eq!(first.pages_unrepairable, 0, "{first:?}");
    assert!(first.zones_refreshed >= 3, "the worn pages' zones move: {first:?}");
    // A block is judged on 64 corrected reads at least; a 16-page block
    // gets 17 a scrub (its parity page too). The fourth scrub retires it.
    let mut retired = first.blocks_retired;
    for _ in 0..3 {
        let report = fs.scrub(false).unwrap();
        eprintln!("{report:?}");
        assert_eq!(report.pages_unrepairable, 0, "{report:?}");
        retired += report.blocks_retired;
    }
    assert_eq!(retired, 1, "only the block past end of life");
    let check = fs.check().unwrap();
    assert!(check.is_clean(), "{:#?}", check.findings);
    let flash = fs.unmount().unwrap();
    let record =
        |zone: u32, page: u32| flash.blocks()[(zone * geometry.zone_blocks + page / geometry.block_pages) as usize];
    assert!(record(dying, 0).bad, "the block past end of life was not retired");
    assert!(!record(old, 0).bad, "a block under half the reach was retired");
    for &zone in &full[..3] {
        assert!(!record(zone, geometry.block_pages).bad, "one worn page retired its block");
    }
    // The tree is whole, read from where the refresh moved it.
    read_back(flash, clock, 0);
}

#[test]
fn the_open_stripe_window_stays_within_its_bound() {
    // Small files with an fsync every third, in four directories: every
    // head has a block open at once, and fsyncs flush them part full.
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let directories: Vec<u64> =
        (0..4).map(|index| fs.mkdir(1, format!("d{index}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    for index in 0..200u32 {
        let file = fs.create(directories[index as usize % 4], format!("f{index}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write(file.ino, 0, &contents(index)).unwrap();
        if index % 3 == 2 {
            fs.fsync(file.ino, false).unwrap();
        }
        fs.forget(file.ino, 1).unwrap();
    }
    let seen = fs.protection_counters().unprotected_pages_max;
    eprintln!("unprotected_pages_max {seen}");
    let bound = fs.volume().unprotected_pages_bound().expect("block parity is on by default");
    // 16-page blocks with k = 1: 15 data slots in each of six zones.
    assert_eq!(bound, 6 * 15);
    assert!(seen > 15, "several heads had pages waiting at once: {seen}");
    assert!(seen <= bound, "{seen} pages without parity on flash, past the bound {bound}");
}

// A directory that loses one bucket page past what protection rebuilds
// (here, an image made without parity): the rest of the directory and the
// rest of the file system keep working, and the checker says exactly what
// is gone.

/// Names in the directory that loses a bucket.
const FILES: u32 = 600;

fn file_name(index: u32) -> Vec<u8> {
    format!("file-{index:04}").into_bytes()
}

fn small_contents(index: u32) -> Vec<u8> {
    (0..200 + index as usize % 300).map(|byte| (byte as u32 * 7 + index) as u8).collect()
}

/// Every version on flash of every bucket of directory `ino`: slot to
/// (sequence, address, names), newest last.
type BucketVersions = BTreeMap<u32, Vec<(u64, PageAddress, Vec<Vec<u8>>)>>;

fn bucket_pages(flash: &mut MemoryFlash, ino: u64) -> BucketVersions {
    let geometry = flash.geometry();
    let mut buckets: BucketVersions = BTreeMap::new();
    let mut data = vec![0u8; geometry.page_size_bytes as usize];
    let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
    for report in flash.report_zones() {
        for page in 0..report.write_pointer {
            let address = PageAddress::new(report.zone, page);
            if flash.read_page(address, &mut data, &mut oob).unwrap() != PageState::Programmed {
                continue;
            }
            let Ok(header) = PageHeader::decode(&oob, &data) else { continue };
            if header.kind != PageKind::Node || is_inode_pack(&data) {
                continue;
            }
            if let Ok(Node::Bucket { directory, slot, entries, .. }) = Node::decode(&data) {
                if directory == ino {
                    let names = entries.into_iter().map(|entry| entry.name).collect();
                    buckets.entry(slot).or_default().push((header.sequence, address, names));
                }
            }
        }
    }
    for versions in buckets.values_mut() {
        versions.sort_by_key(|version| version.0);
    }
    buckets
}

fn list(fs: &mut Fs<MemoryFlash>, ino: u64) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(ino, cookie, 64).unwrap();
        let Some(last) = batch.last() else { return names };
        cookie = last.offset;
        names.extend(batch.into_iter().map(|entry| entry.name).filter(|name| name != b"." && name != b".."));
    }
}

#[test]
fn a_directory_with_a_lost_bucket_lists_and_opens_every_entry_of_the_others() {
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(), DeviceOptions::default()).unwrap();
    // No parity: one lost page is past what protection brings back.
    let mkfs = MkfsOptions { block_parity_pages: 0, segment_parity_blocks: 0, ..MkfsOptions::new([3; 16], 0) };
    let flash = Fs::format(flash, &mkfs, Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let directory = fs.mkdir(1, b"big", 0o755, 0, 0).unwrap().ino;
    for index in 0..FILES {
        let file = fs.create(directory, &file_name(index), 0o644, 0, 0).unwrap();
        fs.write(file.ino, 0, &small_contents(index)).unwrap();
        fs.forget(file.ino, 1).unwrap();
    }
    let mut flash = fs.unmount().unwrap();

    // The newest version of one bucket holding entries is destroyed, and
    // every older one with it, so nothing stale can stand in.
    let buckets = bucket_pages(&mut flash, directory);
    assert!(buckets.len() >= 4, "{FILES} names make a hashed directory: {} buckets", buckets.len());
    let (&slot, versions) = buckets.iter().find(|(_, versions)| !versions.last().unwrap().2.is_empty()).unwrap();
    let lost: BTreeSet<Vec<u8>> = versions.last().unwrap().2.iter().cloned().collect();
    assert!(!lost.is_empty() && lost.len() < FILES as usize / 2, "{} names in bucket slot {slot}", lost.len());
    for (seed, &(_, address, _)) in versions.iter().enumerate() {
        let fault = PageFault::Disturbed { seed: seed as u64, rate_ppm: 100_000 };
        assert!(flash.inject_page_fault(address, fault).unwrap());
    }

    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let directory = fs.lookup(1, b"big").unwrap().ino;
    // Every name outside the lost bucket is listed once, and no other.
    let listed = list(&mut fs, directory);
    let expected: BTreeSet<Vec<u8>> = (0..FILES).map(file_name).filter(|name| !lost.contains(name)).collect();
    assert_eq!(listed.len(), expected.len(), "each surviving name listed once");
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // Each opens and reads back whole.
    for index in (0..FILES).filter(|&index| !lost.contains(&file_name(index))) {
        let file = fs.lookup(directory, &file_name(index)).unwrap();
        assert_eq!(
            fs.read(file.ino, 0, 4096).unwrap(),
            small_contents(index),
            "{}",
            String::from_utf8_lossy(&file_name(index))
        );
    }
    // A lost name answers EIO, not ENOENT: the file system does not know
    // that it is absent.
    let lost_name = lost.iter().next().unwrap();
    assert_eq!(fs.lookup(directory, lost_name).unwrap_err().errno, errno::EIO);
    // The rest of the file system goes on.
    let other = fs.mkdir(1, b"elsewhere", 0o755, 0, 0).unwrap();
    let file = fs.create(other.ino, b"new", 0o644, 0, 0).unwrap();
    fs.write(file.ino, 0, b"still working").unwrap();
    assert_eq!(fs.read(file.ino, 0, 100).unwrap(), b"still working");

    // The checker names the bucket, its hash range, the count lost, and
    // every file that went with it, each once.
    let report = fs.check().unwrap();
    let findings = report.findings.join("\n");
    eprintln!("{findings}");
    assert!(
        report
            .findings
            .iter()
            .any(|finding| finding.contains(&format!("bucket slot {slot}")) && finding.contains("is lost")),
        "{findings}"
    );
    assert!(findings.contains(&format!("{} lost with its unreadable buckets", lost.len())), "{findings}");
    let files_lost = report.findings.iter().filter(|finding| finding.contains("is lost: its entry was in")).count();
    assert_eq!(files_lost, lost.len(), "{findings}");
    assert!(!findings.contains("leaked"), "every unreached slot is explained: {findings}");
}

/// A flush pays as much owed zone parity as fits under the programs it
/// waits for anyway, and a page at least: an append's fsync, two or three
/// pages on their dies, pays a page or two; an fsync after a write that
/// queued a dozen pages on one die pays about as many. Four pages on
/// every fsync were 2.4 ms on the parity's die where the fsync's own
/// pages took 0.6.
#[test]
fn a_flush_pays_the_zone_parity_that_fits_under_its_busiest_die() {
    use flintfs_core::protect::{ZONE_PARITY_PAGES_PER_FLUSH, ZONE_PARITY_PAGES_PER_FLUSH_MIN};
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let page_size_bytes = fs.device().geometry().page_size_bytes as usize;
    let file = fs.create(1, b"log", 0o644, 0, 0).unwrap().ino;
    let mut length = 0u64;
    let mut append = |fs: &mut Fs<MemoryFlash>, blocks: usize, seed: u64| {
        let data = common::noise(seed, blocks * page_size_bytes);
        fs.write(file, length, &data).unwrap();
        length += data.len() as u64;
        fs.fsync(file, false).unwrap();
    };
    // Zone parity paid by `operation`: a zone that owes it takes nothing
    // else, so the write pointers of those that owe move by that much.
    let paid = |fs: &mut Fs<MemoryFlash>, operation: &mut dyn FnMut(&mut Fs<MemoryFlash>)| {
        let owing = zones_owing_parity(fs.device());
        let pointers = |fs: &Fs<MemoryFlash>| -> u32 {
            owing.iter().map(|&zone| fs.device().report_zone(zone).unwrap().write_pointer).sum()
        };
        let before = pointers(fs);
        operation(fs);
        pointers(fs) - before
    };
    let mut seed = 0;
    while zones_owing_parity(fs.device()).is_empty() {
        append(&mut fs, 1, seed);
        seed += 1;
        assert!(seed < 2000, "no zone came to owe its parity");
    }
    for _ in 0..3 {
        let paid_by_append = paid(&mut fs, &mut |fs| append(fs, 1, 10_000));
        assert!(
            (ZONE_PARITY_PAGES_PER_FLUSH_MIN..=2).contains(&paid_by_append),
            "an append's fsync paid {paid_by_append} pages of zone parity"
        );
    }
    // Twelve pages reach at most two erase blocks of the data head, so
    // one die has six queued at least.
    let paid_by_write = paid(&mut fs, &mut |fs| append(fs, 12, 20_000));
    assert!(
        paid_by_write > ZONE_PARITY_PAGES_PER_FLUSH,
        "an fsync waiting for six pages or more on one die paid only {paid_by_write} pages of zone parity"
    );
}

/// Zones owing their zone parity: written full of data, Open, the write
/// pointer inside the parity blocks.
fn zones_owing_parity(flash: &MemoryFlash) -> Vec<u32> {
    let geometry = flash.geometry();
    flash
        .report_zones()
        .iter()
        .filter(|report| {
            matches!(report.state, ZoneState::Open | ZoneState::Closed)
                && !SUPERBLOCK_ZONES.contains(&report.zone)
                && report.write_pointer >= (report.capacity_pages / geometry.block_pages - 1) * geometry.block_pages
        })
        .map(|report| report.zone)
        .collect()
}

/// A zone's parity block goes to flash some pages before each flush, not
/// all at once after its last data block: the fsyncs that follow pay it,
/// none of them more than what fits under its own pages' programs (or
/// `ZONE_PARITY_PAGES_PER_FLUSH`, if that is more). A power cut
/// while a zone still owes some leaves it to the next mount, which pays
/// it from the zone's pages; then a block of that zone lost whole is
/// rebuilt from the zone parity, and every file reads back.
#[test]
fn zone_parity_is_paid_a_few_pages_a_flush_and_after_a_power_cut_by_the_mount() {
    use flintfs_core::protect::ZONE_PARITY_PAGES_PER_FLUSH;
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let flash = MemoryFlash::memory(geometry(), DeviceOptions::default()).unwrap();
    let flash = Fs::format(flash, &MkfsOptions::new([7; 16], 0), Box::new(clock.clone())).unwrap();
    let parity = MkfsOptions::new([7; 16], 0).parity_for(&geometry());
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    let geometry = fs.device().geometry();
    let zone_parity_pages = parity.zone_parity_blocks * geometry.block_pages;
    assert!(zone_parity_pages > 2 * ZONE_PARITY_PAGES_PER_FLUSH, "the tests' shape keeps zone parity");
    let file = fs.create(1, b"log", 0o644, 0, 0).unwrap().ino;
    let mut owed_seen = None;
    let mut index = 0u32;
    let mut written = Vec::new();
    // Appends with fsync until some zone owes its parity, and then until
    // it has paid it all.
    loop {
        let parity_before = fs.protection_counters().parity_pages_programmed;
        let programmed_before = fs.device().counters().pages_programmed;
        let data = contents(index);
        fs.write(file, written.len() as u64, &data).unwrap();
        written.extend_from_slice(&data);
        fs.fsync(file, false).unwrap();
        index += 1;
        // No fsync pays a zone's parity whole: what it programs is the
        // parity of the blocks it finished (an append is at most three
        // blocks here) and what its flushes pay (a checkpoint adds one),
        // each no more than the other pages it programmed, or four.
        let paid = fs.protection_counters().parity_pages_programmed - parity_before;
        let other = fs.device().counters().pages_programmed - programmed_before - paid;
        let block_parity = 3 * u64::from(parity.block_parity_pages);
        let allowed = block_parity + 2 * u64::from(ZONE_PARITY_PAGES_PER_FLUSH).max(other + block_parity);
        assert!(paid <= allowed, "fsync {index} programmed {paid} parity pages and {other} others");
        let owing = zones_owing_parity(fs.device());
        match owed_seen {
            None if !owing.is_empty() => owed_seen = Some(owing[0]),
            Some(zone) if !owing.contains(&zone) => {
                assert_eq!(fs.device().report_zone(zone).unwrap().state, ZoneState::Full, "zone {zone} paid in full");
                break;
            }
            _ => {}
        }
        assert!(index < 2000, "no zone came to owe its parity and pay it");
    }
    // Again until a zone owes, then the power goes.
    loop {
        let data = contents(index);
        fs.write(file, written.len() as u64, &data).unwrap();
        written.extend_from_slice(&data);
        fs.fsync(file, false).unwrap();
        index += 1;
        if !zones_owing_parity(fs.device()).is_empty() {
            break;
        }
        assert!(index < 4000, "no zone came to owe its parity again");
    }
    let owing = zones_owing_parity(fs.device());
    let mut flash = fs.into_device();
    flash.power_cut(5).unwrap();
    let (fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock.clone())).unwrap();
    for zone in &owing {
        assert_eq!(fs.device().report_zone(*zone).unwrap().state, ZoneState::Full, "zone {zone} after the mount");
    }
    let mut flash = fs.unmount().unwrap();
    // A data block of each zone that owed, lost whole.
    for &zone in &owing {
        for page in 0..geometry.block_pages {
            assert!(flash.inject_page_fault(PageAddress::new(zone, page), destroyed(u64::from(page))).unwrap());
        }
    }
    let (mut fs, _) = Fs::mount(flash, FsOptions::default(), Box::new(clock)).unwrap();
    let file = fs.lookup(1, b"log").unwrap().ino;
    let read = fs.read(file, 0, written.len() as u64).unwrap();
    assert!(read == written, "the file reads back as written");
    let counters = fs.protection_counters();
    assert!(counters.pages_repaired_zone_parity > 0, "{counters:?}");
    assert_eq!(counters.pages_unrepairable, 0, "{counters:?}");
}
