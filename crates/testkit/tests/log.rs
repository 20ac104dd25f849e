//! The metadata log under bad input: a log whose tail is garbage, a record
//! cut short, a record whose frame checks but whose payload does not
//! decode, and a batch of another epoch. Recovery replays up to the last
//! complete record, says where and why it stopped, and never trusts a
//! record whose checksum fails.

use flintfs_core::{Fs, RecoveryReport, ROOT_INO};
use flintfs_flash::{FlashDevice, MemoryFlash, PageAddress, PageState};
use flintfs_format::{
    split_record, InvertedIndex, LogBatch, LogOperation, LogRecord, PageHeader, PageKind, RecordKind, PAGE_HEADER_BYTES,
};
use flintfs_testkit::runner::Setup;

const SEED: u64 = 41;
/// The checkpoint the crashed run's log follows: the format writes number
/// 1 (mkfs) and number 2 (the root), and nothing checkpoints after.
const EPOCH: u64 = 2;

/// Two files created, written and fsynced; then the power goes (nothing
/// checkpointed since the format's checkpoint).
fn crashed_after_two_fsyncs(setup: &Setup) -> MemoryFlash {
    let (flash, clock) = setup.formatted(SEED);
    let (mut fs, _) = Fs::mount(flash, setup.options.clone(), Box::new(clock)).expect("mount");
    for (name, fill) in [(b"a", 1u8), (b"b", 2u8)] {
        let file = fs.create(ROOT_INO, name, 0o644, 0, 0).expect("create");
        fs.write(file.ino, 0, &vec![fill; 700]).expect("write");
        fs.fsync(file.ino, false).expect("fsync");
    }
    let checkpoints = fs.counters().checkpoints;
    assert_eq!(checkpoints, 0, "the fsyncs went to the log, not to checkpoints");
    let mut flash = fs.into_device();
    flash.power_cut(SEED).expect("power cut");
    flash
}

/// A page to program after the log: its data, `length` bytes of it in use,
/// its index in its record, and whether it ends the record.
struct Raw {
    data: Vec<u8>,
    length: u32,
    count: u32,
    end_of_record: bool,
}

fn header_of(flash: &mut MemoryFlash, address: PageAddress) -> Option<PageHeader> {
    let geometry = flash.geometry();
    let mut data = vec![0u8; geometry.page_size_bytes as usize];
    let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
    match flash.read_page(address, &mut data, &mut oob) {
        Ok(PageState::Programmed) => PageHeader::decode(&oob, &data).ok(),
        _ => None,
    }
}

/// Programs pages right after the log of a crashed device, in its zone and
/// numbered after its last page, as a damaged or hostile medium might hold
/// them. `build` gets the first page's sequence and the page size.
fn after_the_log(mut flash: MemoryFlash, build: impl FnOnce(u64, usize) -> Vec<Raw>) -> MemoryFlash {
    let geometry = flash.geometry();
    let (_, zone, write_pointer) = (0..geometry.zone_count)
        .filter_map(|zone| {
            let write_pointer = flash.report_zone(zone).ok()?.write_pointer;
            let first = header_of(&mut flash, PageAddress::new(zone, 0))?;
            (first.kind == PageKind::Log).then_some((first.sequence, zone, write_pointer))
        })
        .max()
        .expect("the crashed run wrote a log zone");
    let last = header_of(&mut flash, PageAddress::new(zone, write_pointer - 1)).expect("the log's last page");
    let pages = build(last.sequence + 1, geometry.page_size_bytes as usize);
    for (index, raw) in pages.into_iter().enumerate() {
        let page = write_pointer + index as u32;
        let header = PageHeader {
            kind: PageKind::Log,
            end_of_record: raw.end_of_record,
            zone_generation: last.zone_generation,
            sequence: last.sequence + 1 + index as u64,
            zone,
            page,
            inverted: InvertedIndex::default(),
            length: raw.length,
            count: raw.count,
        };
        let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
        oob[..PAGE_HEADER_BYTES].copy_from_slice(&header.encode(&raw.data));
        flash.program_page(PageAddress::new(zone, page), &raw.data, &oob).expect("program");
    }
    flash.flush().expect("flush");
    flash
}

/// A whole, well-framed log record of `payload`.
fn framed(payload: &[u8], first_sequence: u64, page_size: usize) -> Vec<Raw> {
    split_record(RecordKind::Log, payload, first_sequence, page_size)
        .into_iter()
        .map(|page| Raw { data: page.data, length: page.length, count: page.index, end_of_record: page.end_of_record })
        .collect()
}

fn recover(setup: &Setup, flash: MemoryFlash) -> (Fs<MemoryFlash>, RecoveryReport) {
    let clock = flintfs_core::ManualClock::new(1_800_000_000_000_000_000);
    let (fs, report) = Fs::mount(flash, setup.options.clone(), Box::new(clock)).expect("recovery mounts");
    (fs, report.recovery.expect("an unclean stop is recovered"))
}

fn assert_both_files(fs: &mut Fs<MemoryFlash>) {
    for (name, fill) in [(b"a", 1u8), (b"b", 2u8)] {
        let file = fs.lookup(ROOT_INO, name).expect("fsynced file is there");
        assert_eq!(fs.read(file.ino, 0, 1000).expect("read"), vec![fill; 700]);
    }
}

#[test]
fn a_clean_log_replays_whole() {
    let setup = Setup::small();
    let (mut fs, report) = recover(&setup, crashed_after_two_fsyncs(&setup));
    assert_eq!(report.records_replayed, 4, "{report:?}");
    assert_eq!((report.records_discarded, report.records_skipped), (0, 0), "{report:?}");
    assert!(report.records_failed.is_empty(), "{report:?}");
    assert_both_files(&mut fs);
}

#[test]
fn garbage_after_the_log_ends_it_there_and_says_why() {
    let setup = Setup::small();
    let flash = after_the_log(crashed_after_two_fsyncs(&setup), |_, page_size| {
        let garbage: Vec<u8> = (0..page_size).map(|index| (index * 7 + 3) as u8).collect();
        vec![Raw { data: garbage, length: page_size as u32, count: 0, end_of_record: true }]
    });
    let (mut fs, report) = recover(&setup, flash);
    assert_eq!(report.records_replayed, 4, "{report:?}");
    assert!(report.end.contains("stops at"), "{report:?}");
    assert_both_files(&mut fs);
}

#[test]
fn a_record_cut_short_is_dropped_whole() {
    let setup = Setup::small();
    let flash = after_the_log(crashed_after_two_fsyncs(&setup), |first_sequence, page_size| {
        // A good next batch, two pages or more; its last page never came.
        let mut pages = framed(&xattr_batch(2, page_size).encode(), first_sequence, page_size);
        assert!(pages.len() >= 2);
        pages.pop();
        pages
    });
    let (mut fs, report) = recover(&setup, flash);
    assert_eq!(report.records_replayed, 4, "{report:?}");
    assert!(report.end.contains("cut short"), "{report:?}");
    assert!(fs.getxattr(ROOT_INO, b"user.logged").is_err(), "nothing of the cut record");
    assert_both_files(&mut fs);
}

/// The next batch of the crashed run's epoch: an xattr set on the root
/// directory, set again until the batch takes more than `page_size` bytes.
fn xattr_batch(batch: u64, page_size: usize) -> LogBatch {
    let record = LogRecord {
        version_next: 0,
        now_ns: 1_700_000_000_000_000_000,
        operation: LogOperation::SetXattr {
            ino: ROOT_INO,
            create: false,
            replace: false,
            name: b"user.logged".to_vec(),
            value: vec![9; 16],
        },
    };
    let mut records = vec![record.clone()];
    while records.iter().map(LogRecord::encoded_bytes).sum::<usize>() <= page_size {
        records.push(record.clone());
    }
    LogBatch { epoch: EPOCH, batch, records }
}

#[test]
fn a_whole_batch_after_the_log_is_replayed() {
    let setup = Setup::small();
    let flash = after_the_log(crashed_after_two_fsyncs(&setup), |first_sequence, page_size| {
        framed(&xattr_batch(2, page_size).encode(), first_sequence, page_size)
    });
    let (mut fs, report) = recover(&setup, flash);
    assert!(report.records_replayed > 4, "{report:?}");
    assert_eq!(fs.getxattr(ROOT_INO, b"user.logged").expect("replayed"), vec![9; 16]);
    assert_both_files(&mut fs);
}

#[test]
fn a_batch_of_another_epoch_is_passed_over() {
    let setup = Setup::small();
    let flash = after_the_log(crashed_after_two_fsyncs(&setup), |first_sequence, page_size| {
        let mut stale = xattr_batch(2, page_size);
        stale.epoch = EPOCH - 1;
        framed(&stale.encode(), first_sequence, page_size)
    });
    let (mut fs, report) = recover(&setup, flash);
    assert_eq!(report.records_replayed, 4, "{report:?}");
    assert!(report.end.contains("passed over"), "{report:?}");
    assert!(fs.getxattr(ROOT_INO, b"user.logged").is_err(), "nothing of the stale batch");
    assert_both_files(&mut fs);
}

#[test]
fn a_record_that_checks_but_does_not_decode_is_not_trusted() {
    let setup = Setup::small();
    let flash = after_the_log(crashed_after_two_fsyncs(&setup), |first_sequence, page_size| {
        framed(&[0xee; 100], first_sequence, page_size)
    });
    let (mut fs, report) = recover(&setup, flash);
    assert_eq!(report.records_replayed, 4, "{report:?}");
    assert!(report.end.contains("log batch"), "the decoder's reason is given: {report:?}");
    assert_both_files(&mut fs);
}

#[test]
fn a_batch_out_of_turn_ends_the_log() {
    let setup = Setup::small();
    let flash = after_the_log(crashed_after_two_fsyncs(&setup), |first_sequence, page_size| {
        // Of the right epoch, but numbered past a gap.
        framed(&LogBatch { epoch: EPOCH, batch: 7, records: Vec::new() }.encode(), first_sequence, page_size)
    });
    let (mut fs, report) = recover(&setup, flash);
    assert_eq!(report.records_replayed, 4, "{report:?}");
    assert!(report.end.contains("batch 7 where batch 2 was due"), "{report:?}");
    assert_both_files(&mut fs);
}

/// A power cut at every device operation of a recovery (its replay's
/// writes, its checkpoint, the zones it finishes), then the next mount:
/// the fsynced files are there, and the checker finds nothing. On an image
/// file, so the device outlives the mount that the cut broke.
#[test]
fn a_power_cut_at_every_device_operation_of_a_recovery_is_recovered_too() {
    use flintfs_flash::{DeviceOptions, FaultConfig, ImageFlash};
    let setup = Setup::small();
    let directory = std::env::temp_dir().join(format!("flintfs-log-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("a scratch directory");
    let base = directory.join("crashed.img");
    let work = directory.join("work.img");
    let options = || DeviceOptions { faults: FaultConfig::none(SEED), ..DeviceOptions::default() };
    let clock = || Box::new(flintfs_core::ManualClock::new(1_800_000_000_000_000_000));
    {
        let device = ImageFlash::create_image(&base, setup.geometry, options()).expect("an image");
        let mkfs = flintfs_core::MkfsOptions {
            unindexed_segments: setup.unindexed_segments,
            ..flintfs_core::MkfsOptions::new([7; 16], 0)
        };
        let device = Fs::format(device, &mkfs, clock()).expect("format");
        let (mut fs, _) = Fs::mount(device, setup.options.clone(), clock()).expect("mount");
        for (name, fill) in [(b"a", 1u8), (b"b", 2u8)] {
            let file = fs.create(ROOT_INO, name, 0o644, 0, 0).expect("create");
            fs.write(file.ino, 0, &vec![fill; 700]).expect("write");
            fs.fsync(file.ino, false).expect("fsync");
        }
        fs.into_device().power_cut(SEED).expect("power cut");
    }
    // How many device operations an uncut recovery takes.
    std::fs::copy(&base, &work).expect("copy");
    let operations = {
        let device = ImageFlash::open_image(&work, options()).expect("open");
        let start = device.mutating_operations();
        let (fs, _) = Fs::mount(device, setup.options.clone(), clock()).expect("recovery");
        fs.device().mutating_operations() - start
    };
    assert!(operations > 0, "recovery writes its checkpoint");
    eprintln!("a cut at each of the {operations} device operations of a recovery");
    for cut in 0..operations {
        std::fs::copy(&base, &work).expect("copy");
        {
            let mut device = ImageFlash::open_image(&work, options()).expect("open");
            let start = device.mutating_operations();
            device.schedule_power_cut(start + cut, SEED + cut).expect("schedule");
            assert!(Fs::mount(device, setup.options.clone(), clock()).is_err(), "cut {cut} of {operations} fired");
        }
        let device = ImageFlash::open_image(&work, options()).expect("open after the cut");
        let (fs, _) = Fs::mount(device, setup.options.clone(), clock())
            .unwrap_or_else(|error| panic!("cut {cut} of {operations}: the next recovery failed: {error}"));
        let mut fs = fs;
        for (name, fill) in [(b"a", 1u8), (b"b", 2u8)] {
            let file = fs.lookup(ROOT_INO, name).unwrap_or_else(|error| panic!("cut {cut}: {error}"));
            assert_eq!(fs.read(file.ino, 0, 1000).expect("read"), vec![fill; 700], "cut {cut}");
        }
        let report = fs.check().expect("check");
        assert!(report.findings.is_empty(), "cut {cut}: {:?}", report.findings);
    }
    let _ = std::fs::remove_dir_all(&directory);
}
