//! Runs a workload on the engine and on the [`Model`] side by side, and
//! power-cut runs: a cut at a chosen device operation, then a remount that
//! must find exactly the state of the last completed checkpoint (or, for a
//! cut inside a checkpoint, the one it was writing), with a clean checker.
//!
//! Every failure message starts with the seed that reproduces it.

use std::collections::BTreeMap;

use flintfs_core::{errno, Fs, FsOptions, ManualClock, MkfsOptions, RenameFlags, SetAttributes, XattrFlags};
use flintfs_flash::{DeviceOptions, FaultConfig, Geometry, MemoryFlash};
use flintfs_format::FileType;

use crate::model::{write_pattern, Generator, Kind, Model, Operation, Outcome, Path, Snapshot, SnapshotEntry};

/// The engine under test, with its clock.
pub struct Subject {
    pub fs: Option<Fs<MemoryFlash>>,
    pub clock: ManualClock,
    pub options: FsOptions,
    /// References taken while resolving paths, let go after the operation
    /// (as the kernel does).
    held: Vec<u64>,
    /// The engine's counters of the mounts before this one, summed.
    pub counters_earlier: flintfs_core::FsCounters,
}

/// A device and a file system on it for a workload.
#[derive(Clone, Debug)]
pub struct Setup {
    pub geometry: Geometry,
    pub options: FsOptions,
    pub unindexed_segments: u32,
    /// Nanoseconds the clock moves per operation (checkpoint timer).
    pub step_ns: i64,
    /// The device's faults; each run seeds them with its own seed.
    pub faults: FaultConfig,
}

impl Setup {
    /// A small device of small pages: buckets split, chains form, zones
    /// fill, and the checker can read everything after every step.
    pub fn small() -> Setup {
        Setup {
            geometry: Geometry {
                page_size_bytes: 512,
                oob_size_bytes: 128,
                block_pages: 8,
                zone_blocks: 4,
                zone_count: 96,
                open_zones_max: 8,
                nvm_size_bytes: 0,
            },
            options: FsOptions { checkpoint_interval_ns: 50_000_000, ..FsOptions::smallest(512) },
            unindexed_segments: 4,
            step_ns: 1_000_000,
            faults: FaultConfig::none(0),
        }
    }

    /// [`Setup::small`] on flash that fails: a twentieth of its blocks
    /// bad from the factory, and one program in 1,000 failing whatever the
    /// wear. Each failed program retires its block and leaves its zone
    /// read-only, so runs of data blocks go one by one, heads move on, and
    /// the cleaner empties read-only zones for a reset to take back.
    pub fn small_failing() -> Setup {
        let faults = FaultConfig {
            factory_bad_block_fraction: 0.05,
            program_failure_probability_at_endurance: 0.001,
            failure_growth_exponent: 0.0,
            ..FaultConfig::none(0)
        };
        Setup { faults, ..Setup::small() }
    }

    pub fn device(&self, seed: u64) -> MemoryFlash {
        let options = DeviceOptions { faults: FaultConfig { seed, ..self.faults.clone() }, ..DeviceOptions::default() };
        MemoryFlash::memory(self.geometry, options).expect("a valid geometry")
    }

    /// A formatted device and a clock.
    pub fn formatted(&self, seed: u64) -> (MemoryFlash, ManualClock) {
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&seed.to_le_bytes());
        let mkfs = MkfsOptions { unindexed_segments: self.unindexed_segments, ..MkfsOptions::new(uuid, 0) };
        let flash = Fs::format(self.device(seed), &mkfs, Box::new(clock.clone())).expect("format");
        (flash, clock)
    }
}

fn kind_of(file_type: FileType) -> Kind {
    match file_type {
        FileType::Directory => Kind::Directory,
        FileType::Symlink => Kind::Symlink,
        FileType::Fifo => Kind::Fifo,
        _ => Kind::Regular,
    }
}

/// Runs one operation on `fs`, every one but a remount (which needs the
/// engine owned), resolving paths as the kernel does; the references the
/// lookups took are left in `held` for the caller to let go.
pub(crate) fn apply_on(fs: &mut Fs<MemoryFlash>, held: &mut Vec<u64>, operation: &Operation) -> Result<Outcome, i32> {
    let code = |error: flintfs_core::Error| error.errno;
    match operation {
        Operation::Create { directory, name } => {
            let parent = resolve_directory(fs, held, directory)?;
            let attributes = fs.create(parent, name, 0o644, 0, 0).map_err(code)?;
            fs.forget(attributes.ino, 1).map_err(code)?;
        }
        Operation::Mkfifo { directory, name } => {
            let parent = resolve_directory(fs, held, directory)?;
            let attributes = fs.mknod(parent, name, 0o010644, 0, 0, 0).map_err(code)?;
            fs.forget(attributes.ino, 1).map_err(code)?;
        }
        Operation::Symlink { directory, name, target } => {
            let parent = resolve_directory(fs, held, directory)?;
            let attributes = fs.symlink(parent, name, target, 0, 0).map_err(code)?;
            fs.forget(attributes.ino, 1).map_err(code)?;
        }
        Operation::Mkdir { directory, name } => {
            let parent = resolve_directory(fs, held, directory)?;
            let attributes = fs.mkdir(parent, name, 0o755, 0, 0).map_err(code)?;
            fs.forget(attributes.ino, 1).map_err(code)?;
        }
        Operation::Write { path, offset, length, fill } => {
            let ino = resolve(fs, held, path)?;
            fs.write(ino, *offset, &write_pattern(*offset, *length, *fill)).map_err(code)?;
        }
        Operation::Truncate { path, size } => {
            let ino = resolve(fs, held, path)?;
            let changes = SetAttributes { size: Some(*size), ..SetAttributes::default() };
            fs.setattr(ino, &changes).map_err(code)?;
        }
        Operation::PunchHole { path, offset, length } => {
            let ino = resolve(fs, held, path)?;
            let mode = flintfs_core::FALLOC_FL_PUNCH_HOLE | flintfs_core::FALLOC_FL_KEEP_SIZE;
            fs.fallocate(ino, *offset, *length, mode).map_err(code)?;
        }
        Operation::ZeroRange { path, offset, length, keep_size } => {
            let ino = resolve(fs, held, path)?;
            let keep = if *keep_size { flintfs_core::FALLOC_FL_KEEP_SIZE } else { 0 };
            fs.fallocate(ino, *offset, *length, flintfs_core::FALLOC_FL_ZERO_RANGE | keep).map_err(code)?;
        }
        Operation::Read { path, offset, length } => {
            let ino = resolve(fs, held, path)?;
            return Ok(Outcome::Data(fs.read(ino, *offset, *length).map_err(code)?));
        }
        Operation::Unlink { directory, name } => {
            let parent = resolve_directory(fs, held, directory)?;
            fs.unlink(parent, name).map_err(code)?;
        }
        Operation::Rmdir { directory, name } => {
            let parent = resolve_directory(fs, held, directory)?;
            fs.rmdir(parent, name).map_err(code)?;
        }
        Operation::Rename { directory, name, new_directory, new_name, no_replace, exchange } => {
            let parent = resolve_directory(fs, held, directory)?;
            let new_parent = resolve_directory(fs, held, new_directory)?;
            let flags = RenameFlags { no_replace: *no_replace, exchange: *exchange };
            fs.rename(parent, name, new_parent, new_name, flags).map_err(code)?;
        }
        Operation::Link { path, directory, name } => {
            let ino = resolve(fs, held, path)?;
            let parent = resolve_directory(fs, held, directory)?;
            let attributes = fs.link(ino, parent, name).map_err(code)?;
            fs.forget(attributes.ino, 1).map_err(code)?;
        }
        Operation::SetXattr { path, name, value } => {
            let ino = resolve(fs, held, path)?;
            fs.setxattr(ino, name, value, XattrFlags::default()).map_err(code)?;
        }
        Operation::RemoveXattr { path, name } => {
            let ino = resolve(fs, held, path)?;
            fs.removexattr(ino, name).map_err(code)?;
        }
        Operation::Chmod { path, permissions } => {
            let ino = resolve(fs, held, path)?;
            let changes = SetAttributes { permissions: Some(*permissions), ..SetAttributes::default() };
            fs.setattr(ino, &changes).map_err(code)?;
        }
        Operation::Readdir { directory } => {
            let ino = resolve_directory(fs, held, directory)?;
            let mut names = list(fs, ino).map_err(code)?;
            names.sort();
            return Ok(Outcome::Names(names));
        }
        Operation::Fsync { path, data_only } => {
            let ino = resolve(fs, held, path)?;
            fs.fsync(ino, *data_only).map_err(code)?;
        }
        Operation::Sync => fs.sync().map_err(code)?,
        Operation::Remount => unreachable!("a remount needs the engine owned"),
    }
    Ok(Outcome::Done)
}

/// The inode at `path`; each lookup's reference goes into `held`.
pub(crate) fn resolve(fs: &mut Fs<MemoryFlash>, held: &mut Vec<u64>, path: &[Vec<u8>]) -> Result<u64, i32> {
    let mut ino = 1;
    for name in path {
        let attributes = fs.lookup(ino, name).map_err(|error| error.errno)?;
        held.push(attributes.ino);
        ino = attributes.ino;
    }
    Ok(ino)
}

fn resolve_directory(fs: &mut Fs<MemoryFlash>, held: &mut Vec<u64>, path: &[Vec<u8>]) -> Result<u64, i32> {
    let ino = resolve(fs, held, path)?;
    let attributes = fs.getattr(ino).map_err(|error| error.errno)?;
    if attributes.file_type != FileType::Directory {
        return Err(errno::ENOTDIR);
    }
    Ok(ino)
}

/// A directory's entries (not "." and ".."), a few at a time as a kernel
/// would ask.
fn list(fs: &mut Fs<MemoryFlash>, ino: u64) -> flintfs_core::Result<Vec<(Vec<u8>, Kind)>> {
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let entries = fs.readdir(ino, cookie, 3)?;
        let Some(last) = entries.last() else { break };
        cookie = last.offset;
        for entry in entries {
            if entry.name != b"." && entry.name != b".." {
                names.push((entry.name, kind_of(entry.file_type)));
            }
        }
    }
    Ok(names)
}

impl Subject {
    pub fn mount(flash: MemoryFlash, clock: ManualClock, options: FsOptions) -> Result<Subject, String> {
        let (fs, _) = Fs::mount(flash, options.clone(), Box::new(clock.clone())).map_err(|error| error.to_string())?;
        Ok(Subject { fs: Some(fs), clock, options, held: Vec::new(), counters_earlier: Default::default() })
    }

    /// A subject over a file system already mounted (a recovery).
    pub fn from_fs(fs: Fs<MemoryFlash>, clock: ManualClock, options: FsOptions) -> Subject {
        Subject { fs: Some(fs), clock, options, held: Vec::new(), counters_earlier: Default::default() }
    }

    pub fn fs(&mut self) -> &mut Fs<MemoryFlash> {
        self.fs.as_mut().expect("mounted")
    }

    /// Runs one operation on the engine.
    pub fn apply(&mut self, operation: &Operation) -> Outcome {
        let step = self.clock.clone();
        step.advance(1);
        let outcome = match self.apply_inner(operation) {
            Ok(outcome) => outcome,
            Err(code) => Outcome::Error(code),
        };
        let held = std::mem::take(&mut self.held);
        if let Some(fs) = self.fs.as_mut() {
            for ino in held {
                if fs.forget(ino, 1).is_err() {
                    return Outcome::Error(errno::EIO);
                }
            }
        }
        outcome
    }

    fn apply_inner(&mut self, operation: &Operation) -> Result<Outcome, i32> {
        let code = |error: flintfs_core::Error| error.errno;
        match operation {
            Operation::Remount => {
                for ino in std::mem::take(&mut self.held) {
                    self.fs().forget(ino, 1).map_err(code)?;
                }
                self.fs().shut_down().map_err(code)?;
                let counters = self.fs().counters().clone();
                self.counters_earlier.checkpoints += counters.checkpoints;
                self.counters_earlier.chunks_compressed += counters.chunks_compressed;
                self.counters_earlier.compression_attempts += counters.compression_attempts;
                self.counters_earlier.index_records_written += counters.index_records_written;
                self.counters_earlier.blocks_embedded += counters.blocks_embedded;
                self.counters_earlier.nvm_log_full_checkpoints += counters.nvm_log_full_checkpoints;
                self.counters_earlier.nodes_parked += counters.nodes_parked;
                self.counters_earlier.nodes_sent_home += counters.nodes_sent_home;
                self.counters_earlier.nvm_log_batches_written += counters.nvm_log_batches_written;
                let flash = self.fs.take().expect("mounted").into_device();
                let (fs, _) = Fs::mount(flash, self.options.clone(), Box::new(self.clock.clone())).map_err(code)?;
                self.fs = Some(fs);
            }
            _ => {
                let fs = self.fs.as_mut().expect("mounted");
                return apply_on(fs, &mut self.held, operation);
            }
        }
        Ok(Outcome::Done)
    }

    /// The whole tree as the engine shows it.
    pub fn snapshot(&mut self) -> Result<Snapshot, String> {
        let mut out = BTreeMap::new();
        let mut held = Vec::new();
        let mut stack: Vec<(Path, u64)> = vec![(Vec::new(), 1)];
        while let Some((path, ino)) = stack.pop() {
            let fs = self.fs();
            let attributes = fs.getattr(ino).map_err(|error| format!("{path:?}: {error}"))?;
            let kind = kind_of(attributes.file_type);
            let data = match kind {
                Kind::Regular => fs.read(ino, 0, attributes.size + 1).map_err(|error| format!("{path:?}: {error}"))?,
                Kind::Symlink => fs.readlink(ino).map_err(|error| format!("{path:?}: {error}"))?,
                _ => Vec::new(),
            };
            let mut xattrs = BTreeMap::new();
            for name in fs.listxattr(ino).map_err(|error| error.to_string())? {
                let value = fs.getxattr(ino, &name).map_err(|error| error.to_string())?;
                xattrs.insert(name, value);
            }
            if kind == Kind::Directory {
                for (name, _) in list(self.fs(), ino).map_err(|error| format!("{path:?}: {error}"))? {
                    let child = self.fs().lookup(ino, &name).map_err(|error| format!("{path:?}/{name:?}: {error}"))?;
                    held.push(child.ino);
                    let mut child_path = path.clone();
                    child_path.push(name);
                    stack.push((child_path, child.ino));
                }
            }
            let permissions = (kind != Kind::Directory).then_some(attributes.permissions & 0o7777);
            out.insert(path, SnapshotEntry { kind, data, nlink: attributes.nlink, xattrs, permissions });
        }
        for ino in held {
            self.fs().forget(ino, 1).map_err(|error| error.to_string())?;
        }
        Ok(Snapshot(out))
    }

    /// The checker's findings, if any.
    pub fn check(&mut self) -> Result<(), String> {
        let report = self.fs().check().map_err(|error| error.to_string())?;
        if report.is_clean() {
            Ok(())
        } else {
            Err(format!("the checker found: {:#?}", report.findings))
        }
    }
}

/// The device operation of cut `cut` of `cuts` spread over a run of
/// `device_operations`, offset by the seed so seeds cut at different
/// places.
pub fn spread_cut(device_operations: u64, cut: u64, cuts: u64, seed: u64) -> u64 {
    (device_operations * cut / (cuts + 1) + seed * 7) % device_operations.max(1)
}

/// How a model run went.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub operations: u64,
    pub errors_expected: u64,
    /// Checkpoints over the whole run, every mount's.
    pub checkpoints: u64,
    /// Zones the cleaner cleaned in the last mount of the run.
    pub zones_cleaned: u64,
    /// Blocks stored as compressed chunks, and blocks a codec was tried
    /// on, over the whole run.
    pub chunks_compressed: u64,
    pub compression_attempts: u64,
    /// Index pages written as pack records, over the whole run.
    pub index_records_written: u64,
    /// Small blocks fsync carried in its log record, over the whole run.
    pub blocks_embedded: u64,
    /// Log batches written to NVM, and dirty nodes parked there, over the
    /// whole run (with NVM).
    pub nvm_log_batches_written: u64,
    pub nodes_parked: u64,
    /// Programs the device failed, over its whole life.
    pub program_failures: u64,
    /// Operations refused with ENOSPC that the model took
    /// ([`run_model_to_full`]).
    pub refused_for_space: u64,
}

/// Runs `operations` generated operations from `seed` on the engine and
/// the model, comparing every result, checking every `check_every` steps
/// and comparing whole trees at every remount.
pub fn run_model(setup: &Setup, seed: u64, operations: u64, check_every: u64) -> Result<RunReport, String> {
    run_model_with(setup, seed, operations, check_every, false)
}

/// [`run_model`] on a device the workload fills: an operation that
/// changes something may be refused with ENOSPC where the model (which
/// has no size) took it, and must then have changed
/// nothing (the model goes back to its state before, and every read and
/// remount after is compared with that). A read (`Read`, `Readdir`) is
/// never refused for space, nor an `Fsync`, a `Sync`, a remount or the
/// checker: what the engine took, it must be able to make durable and
/// unmount. Every answer besides is the model's, a refusal for another
/// reason (EEXIST, ENOENT, ENOTEMPTY, ...) too: a full device finds those
/// before it asks for space.
pub fn run_model_to_full(setup: &Setup, seed: u64, operations: u64, check_every: u64) -> Result<RunReport, String> {
    run_model_with(setup, seed, operations, check_every, true)
}

fn run_model_with(
    setup: &Setup,
    seed: u64,
    operations: u64,
    check_every: u64,
    space_may_run_out: bool,
) -> Result<RunReport, String> {
    let check = |subject: &mut Subject| subject.check();
    let fail = |step: u64, what: String| format!("seed {seed}, operation {step}: {what}");
    let (flash, clock) = setup.formatted(seed);
    let mut subject = Subject::mount(flash, clock, setup.options.clone()).map_err(|error| fail(0, error))?;
    let mut model = Model::for_page_size(setup.geometry.page_size_bytes as usize);
    // Filling a device takes writes of more pages than the usual run's.
    let mut generator =
        Generator::new(seed, u64::from(setup.geometry.page_size_bytes) * write_pages_max(space_may_run_out));
    let mut report = RunReport::default();
    for step in 0..operations {
        let operation = generator.next(&model);
        subject.clock.advance(setup.step_ns);
        let before = space_may_run_out.then(|| model.clone());
        let mut expected = model.apply(&operation);
        let actual = subject.apply(&operation);
        if let Some(before) = before {
            // Only where the model took the operation: a name that is
            // there (EEXIST), one that is not (ENOENT), a directory not
            // empty, a wrong type, are found before any space is asked
            // for, on a full device as on an empty one, as in the kernel's
            // file systems, whose lookups come before their allocations.
            if refused_for_space(&operation, &expected, &actual) {
                // Refused for want of space: nothing may have changed.
                model = before;
                expected = actual.clone();
                report.refused_for_space += 1;
            }
        }
        if actual != expected {
            let fs = subject.fs();
            let space = format!(
                "statfs {:?}, free zones {}, cleaner {:?}, usage {:?}",
                fs.statfs().ok(),
                fs.free_zones(),
                fs.cleaner_counters(),
                fs.usage_by_role()
            );
            let shown = format!("{operation:?}");
            let shown = if shown.len() > 400 { format!("{}...", &shown[..400]) } else { shown };
            return Err(fail(step, format!("{shown}: the engine gave {actual:?}, the model {expected:?}; {space}")));
        }
        report.operations += 1;
        if matches!(expected, Outcome::Error(_)) {
            report.errors_expected += 1;
        }
        if check_every > 0 && step % check_every == 0 {
            check(&mut subject).map_err(|findings| fail(step, format!("after {operation:?}: {findings}")))?;
        }
        if operation == Operation::Remount {
            let snapshot = subject.snapshot().map_err(|error| fail(step, error))?;
            if snapshot != model.snapshot() {
                return Err(fail(step, describe_difference(&model.snapshot(), &snapshot)));
            }
        }
    }
    check(&mut subject).map_err(|findings| fail(operations, findings))?;
    let snapshot = subject.snapshot().map_err(|error| fail(operations, error))?;
    if snapshot != model.snapshot() {
        return Err(fail(operations, describe_difference(&model.snapshot(), &snapshot)));
    }
    report.zones_cleaned = subject.fs().cleaner_counters().zones_cleaned;
    let (now, earlier) = (subject.fs().counters().clone(), &subject.counters_earlier);
    report.checkpoints = earlier.checkpoints + now.checkpoints;
    report.chunks_compressed = earlier.chunks_compressed + now.chunks_compressed;
    report.compression_attempts = earlier.compression_attempts + now.compression_attempts;
    report.index_records_written = earlier.index_records_written + now.index_records_written;
    report.blocks_embedded = earlier.blocks_embedded + now.blocks_embedded;
    report.nvm_log_batches_written = earlier.nvm_log_batches_written + now.nvm_log_batches_written;
    report.nodes_parked = earlier.nodes_parked + now.nodes_parked;
    report.program_failures = subject.fs().device().lifetime_counters().program_failures_injected;
    Ok(report)
}

/// The first paths where two trees differ.
pub fn describe_difference(expected: &Snapshot, actual: &Snapshot) -> String {
    let mut lines = Vec::new();
    for (path, entry) in &expected.0 {
        match actual.0.get(path) {
            None => lines.push(format!("{path:?} is missing")),
            Some(found) if found != entry => lines.push(format!(
                "{path:?} differs: expected {:?} {} bytes nlink {} xattrs {}, found {:?} {} bytes nlink {} xattrs {}",
                entry.kind,
                entry.data.len(),
                entry.nlink,
                entry.xattrs.len(),
                found.kind,
                found.data.len(),
                found.nlink,
                found.xattrs.len()
            )),
            _ => {}
        }
    }
    for path in actual.0.keys() {
        if !expected.0.contains_key(path) {
            lines.push(format!("{path:?} should not exist"));
        }
    }
    lines.truncate(8);
    format!("the trees differ: {}", lines.join("; "))
}

/// What a power-cut run found.
#[derive(Clone, Debug, Default)]
pub struct CutReport {
    /// Device operations the workload took without a cut.
    pub device_operations: u64,
    /// Whether the cut fired before the workload ended.
    pub fired: bool,
    /// Programs the device failed in the workload without a cut.
    pub program_failures: u64,
    /// Operations refused with ENOSPC that the model took
    /// ([`run_power_cut_to_full`]), and the device operation (counted from
    /// mount) at which the first was refused.
    pub refused_for_space: u64,
    pub first_refusal_device_operation: Option<u64>,
}

/// Runs `operations` operations from `seed` with a power cut at device
/// operation `cut_at` (counted from mount), then remounts and requires
/// what `docs/SEMANTICS.md` promises (crashtest's oracle: nothing durable
/// lost, no bytes never written, the namespace one state since the last
/// persistence point), a clean checker, and a file system that keeps
/// working.
pub fn run_power_cut(setup: &Setup, seed: u64, operations: u64, cut_at: u64) -> Result<CutReport, String> {
    run_power_cut_with(setup, seed, operations, cut_at, false)
}

/// [`run_power_cut`] on a device the workload fills, with the writes of
/// [`run_model_to_full`]: an operation that changes something may be
/// refused with ENOSPC where the model took it, and must then have
/// changed nothing, before the cut and in the operations after recovery.
/// The cuts that matter fall after [`CutReport::first_refusal_device_operation`]:
/// in the checkpoints a full device takes on its reserve, the cleaning
/// it does for room, and the refusals.
pub fn run_power_cut_to_full(setup: &Setup, seed: u64, operations: u64, cut_at: u64) -> Result<CutReport, String> {
    run_power_cut_with(setup, seed, operations, cut_at, true)
}

fn run_power_cut_with(
    setup: &Setup,
    seed: u64,
    operations: u64,
    cut_at: u64,
    space_may_run_out: bool,
) -> Result<CutReport, String> {
    let fail = |what: String| format!("seed {seed}, cut at device operation {cut_at}: {what}");
    let (flash, clock) = setup.formatted(seed);
    let mut subject = Subject::mount(flash, clock.clone(), setup.options.clone()).map_err(fail)?;
    let start = subject.fs().device().mutating_operations();
    subject
        .fs
        .as_mut()
        .expect("mounted")
        .volume_mut()
        .device_mut()
        .schedule_power_cut(start + cut_at, seed)
        .map_err(|error| fail(error.to_string()))?;
    let mut model = Model::for_page_size(setup.geometry.page_size_bytes as usize);
    let start_model = model.clone();
    let mut applied: Vec<Operation> = Vec::new();
    let mut returned = false;
    let mut generator =
        Generator::new(seed, u64::from(setup.geometry.page_size_bytes) * write_pages_max(space_may_run_out));
    let mut report = CutReport::default();
    for step in 0..operations {
        let operation = generator.next(&model);
        subject.clock.advance(setup.step_ns);
        let before = space_may_run_out.then(|| model.clone());
        let expected = model.apply(&operation);
        let actual = subject.apply(&operation);
        applied.push(operation.clone());
        let powered_off = subject.fs.as_ref().is_none_or(|fs| fs.device().is_powered_off());
        if powered_off {
            // The cut fell in this operation.
            returned = actual == Outcome::Done;
            report.fired = true;
            break;
        }
        if let Some(before) = before {
            if refused_for_space(&operation, &expected, &actual) {
                // Nothing changed: the model goes back, and the operation
                // is not one the recovered state may have taken.
                model = before;
                applied.pop();
                report.refused_for_space += 1;
                report
                    .first_refusal_device_operation
                    .get_or_insert(subject.fs().device().mutating_operations() - start);
                continue;
            }
        }
        if actual != expected {
            return Err(fail(format!("operation {step} {operation:?}: engine {actual:?}, model {expected:?}")));
        }
    }
    if !report.fired {
        report.device_operations = subject.fs().device().mutating_operations() - start;
        report.program_failures = subject.fs().device().lifetime_counters().program_failures_injected;
        if space_may_run_out {
            // What the refusals left is the model's, as a model run's end
            // checks.
            subject.check().map_err(fail)?;
            let snapshot = subject.snapshot().map_err(fail)?;
            if snapshot != model.snapshot() {
                return Err(fail(describe_difference(&model.snapshot(), &snapshot)));
            }
        }
        return Ok(report);
    }
    let flash = match subject.fs.take() {
        Some(fs) => fs.into_device(),
        None => return Err(fail("the file system was lost in a remount that the cut broke".into())),
    };
    recover_after_cut_with(setup, seed, flash, clock, &start_model, &applied, returned, space_may_run_out)
        .map_err(fail)?;
    Ok(report)
}

/// What a read-only mount of the device as a cut left it shows: the tree
/// a read-write recovery will (compared by the caller), with its log
/// replayed in memory. The mount must pass the checker, answer EROFS to a
/// create and to a write, take a sync, and unmount, all without one device
/// operation that changes anything (a program, reset, finish, flush or
/// NVM write) and without retiring a block. `None` where the cut left a
/// zone finish that only a read-write mount completes, which the
/// read-only mount refuses with EROFS (the caller then requires the
/// read-write recovery to finish a zone).
pub(crate) fn read_only_view(
    setup: &Setup,
    flash: &MemoryFlash,
    clock: &ManualClock,
) -> Result<Option<Snapshot>, String> {
    let options = FsOptions { read_only: true, ..setup.options.clone() };
    let before = flash.mutating_operations();
    // A clock of its own, at the same time: the recovery that follows
    // runs at the times it ran at before this look was taken.
    let clock = ManualClock::new(flintfs_core::Clock::now_ns(clock));
    let fs = match Fs::mount(flash.clone(), options.clone(), Box::new(clock.clone())) {
        Ok((fs, _)) => fs,
        Err(error)
            if error.errno == errno::EROFS
                && error.message.contains(flintfs_core::protect::FINISH_CUT_SHORT_REFUSAL) =>
        {
            return Ok(None)
        }
        Err(error) => return Err(format!("a read-only mount after the cut: {error}")),
    };
    let mut subject = Subject::from_fs(fs, clock.clone(), options);
    let fail = |what: String| format!("a read-only mount after the cut: {what}");
    subject.check().map_err(fail)?;
    let snapshot = subject.snapshot().map_err(fail)?;
    let mut probes = vec![Operation::Create { directory: Vec::new(), name: b"read-only probe".to_vec() }];
    if let Some((path, _)) = snapshot.0.iter().find(|(_, entry)| entry.kind == Kind::Regular) {
        probes.push(Operation::Write { path: path.clone(), offset: 0, length: 1, fill: 0x5a });
    }
    probes.push(Operation::Sync);
    for probe in probes {
        let expected = if probe == Operation::Sync { Outcome::Done } else { Outcome::Error(errno::EROFS) };
        let actual = subject.apply(&probe);
        if actual != expected {
            return Err(fail(format!("{probe:?} answered {actual:?}, not {expected:?}")));
        }
    }
    if subject.snapshot().map_err(fail)? != snapshot {
        return Err(fail("the refused changes changed the tree".into()));
    }
    let retired = subject.fs().protection_counters().blocks_retired;
    if retired != 0 {
        return Err(fail(format!("{retired} blocks retired")));
    }
    let flash = subject.fs.take().expect("mounted").unmount().map_err(|error| fail(error.to_string()))?;
    let changes = flash.mutating_operations() - before;
    if changes != 0 {
        return Err(fail(format!("{changes} device operations changed the device")));
    }
    Ok(Some(snapshot))
}

/// What [`run_to_read_only_failure`] found: the operation at which the
/// device stopped taking checkpoints, and what a read-only mount showed.
#[derive(Clone, Debug)]
pub struct ReadOnlyRescue {
    /// Operations that returned before the one refused with EROFS.
    pub operations_before: usize,
    /// The refused operation.
    pub refused: String,
    /// Whether the read-only mount replayed a log (the stop was unclean).
    pub replayed: bool,
    /// Whether a read-write mount of the device as it was left failed
    /// (its recovery ends with a checkpoint, which a read-only mount does
    /// not take).
    pub read_write_mount_failed: bool,
    /// Files, directories and links the read-only mount showed.
    pub entries: usize,
}

/// A run on a device the workload fills (as [`run_power_cut_to_full`],
/// without a cut) until an operation answers EROFS where the model did
/// not: the fixed checkpoint zones of small failing flash wear out, and a
/// checkpoint record finds no zone. The engine is then dropped as a
/// killed daemon's would be, and a read-only mount of the device must show
/// a tree `docs/SEMANTICS.md` allows after a power cut at that operation
/// (nothing that an fsync or a sync made durable lost), pass the checker,
/// and write nothing. `Ok(None)` when the run ended without an EROFS.
pub fn run_to_read_only_failure(setup: &Setup, seed: u64, operations: u64) -> Result<Option<ReadOnlyRescue>, String> {
    let fail = |what: String| format!("seed {seed}: {what}");
    let (flash, clock) = setup.formatted(seed);
    let mut subject = Subject::mount(flash, clock.clone(), setup.options.clone()).map_err(fail)?;
    let mut model = Model::for_page_size(setup.geometry.page_size_bytes as usize);
    let start_model = model.clone();
    let mut applied: Vec<Operation> = Vec::new();
    let mut generator = Generator::new(seed, u64::from(setup.geometry.page_size_bytes) * write_pages_max(true));
    let mut refused = None;
    for step in 0..operations {
        let operation = generator.next(&model);
        subject.clock.advance(setup.step_ns);
        let before = model.clone();
        let expected = model.apply(&operation);
        let actual = subject.apply(&operation);
        applied.push(operation.clone());
        if refused_for_space(&operation, &expected, &actual) {
            model = before;
            applied.pop();
            continue;
        }
        if actual == Outcome::Error(errno::EROFS) && expected != actual {
            refused = Some(format!("operation {step} {operation:?}"));
            break;
        }
        if actual != expected {
            return Err(fail(format!("operation {step} {operation:?}: engine {actual:?}, model {expected:?}")));
        }
    }
    let Some(refused) = refused else { return Ok(None) };
    // A remount's mount half may have been the refusal: the engine is gone.
    let Some(fs) = subject.fs.take() else {
        return Err(fail(format!("{refused} lost the engine with the device")));
    };
    let flash = fs.into_device();
    // A read-write mount, on a copy: its recovery's checkpoint may find no
    // zone. Where it works, its tree is the one the read-only mount must
    // show.
    let read_write = match Fs::mount(
        flash.clone(),
        setup.options.clone(),
        Box::new(ManualClock::new(flintfs_core::Clock::now_ns(&clock))),
    ) {
        Ok((fs, _)) => {
            let mut recovered = Subject::from_fs(fs, clock.clone(), setup.options.clone());
            Some(recovered.snapshot().map_err(fail)?)
        }
        Err(_) => None,
    };
    let read_write_mount_failed = read_write.is_none();
    let options = FsOptions { read_only: true, ..setup.options.clone() };
    let before = flash.mutating_operations();
    let (fs, mount_report) = Fs::mount(flash, options.clone(), Box::new(clock.clone()))
        .map_err(|error| fail(format!("after {refused}, a read-only mount: {error}")))?;
    let mut rescued = Subject::from_fs(fs, clock, options);
    rescued.check().map_err(|error| fail(format!("after {refused}, the read-only mount: {error}")))?;
    let snapshot = rescued.snapshot().map_err(fail)?;
    let completed = applied.len() - 1;
    crate::crashtest::judge_recovery(&start_model, applied, completed, false, &snapshot)
        .map_err(|error| fail(format!("after {refused}, the read-only mount: {error}")))?;
    if let Some(read_write) = read_write {
        if read_write != snapshot {
            return Err(fail(format!(
                "after {refused}, the read-only mount showed another tree than a read-write recovery: {}",
                describe_difference(&read_write, &snapshot)
            )));
        }
    }
    let retired = rescued.fs().protection_counters().blocks_retired;
    if retired != 0 {
        return Err(fail(format!("the read-only mount retired {retired} blocks")));
    }
    let flash = rescued.fs.take().expect("mounted").unmount().map_err(|error| fail(error.to_string()))?;
    if flash.mutating_operations() != before {
        return Err(fail(format!(
            "the read-only mount changed the device: {} operations",
            flash.mutating_operations() - before
        )));
    }
    Ok(Some(ReadOnlyRescue {
        operations_before: completed,
        refused,
        replayed: mount_report.recovery.is_some(),
        read_write_mount_failed,
        entries: snapshot.0.len(),
    }))
}

/// Pages a generated write takes at most: more on a run that must fill
/// its device.
fn write_pages_max(space_may_run_out: bool) -> u64 {
    if space_may_run_out {
        48
    } else {
        6
    }
}

/// Whether `actual` is a refusal for space of an operation the model took
/// (`expected`): only an operation that changes something, and only where
/// the model found no other error first (a full device finds EEXIST,
/// ENOENT, ENOTEMPTY and the like before it asks for space).
fn refused_for_space(operation: &Operation, expected: &Outcome, actual: &Outcome) -> bool {
    let changes = !matches!(
        operation,
        Operation::Read { .. }
            | Operation::Readdir { .. }
            | Operation::Fsync { .. }
            | Operation::Remount
            | Operation::Sync
    );
    changes && *actual == Outcome::Error(errno::ENOSPC) && !matches!(expected, Outcome::Error(_))
}

/// After a cut that fell in the last of `applied` (which `returned`, or
/// did not): power comes back, and the file system must be one of the
/// states it may have made durable, pass the checker, and keep working
/// (operations generated over the state whose namespace was recovered
/// return what the model returns; reads apart, as a file may hold older
/// data than that state's, as allowed).
pub(crate) fn recover_after_cut(
    setup: &Setup,
    seed: u64,
    flash: MemoryFlash,
    clock: ManualClock,
    start_model: &Model,
    applied: &[Operation],
    returned: bool,
) -> Result<(), String> {
    recover_after_cut_with(setup, seed, flash, clock, start_model, applied, returned, false)
}

/// [`recover_after_cut`], where the operations after recovery may be
/// refused for space when `space_may_run_out`.
#[allow(clippy::too_many_arguments)]
fn recover_after_cut_with(
    setup: &Setup,
    seed: u64,
    mut flash: MemoryFlash,
    clock: ManualClock,
    start_model: &Model,
    applied: &[Operation],
    returned: bool,
    space_may_run_out: bool,
) -> Result<(), String> {
    flash.power_on();
    let read_only = read_only_view(setup, &flash, &clock)?;
    let (fs, report) =
        Fs::mount(flash, setup.options.clone(), Box::new(clock.clone())).map_err(|error| error.to_string())?;
    if read_only.is_none() && report.zones_finished_after_cut == 0 {
        return Err("the read-only mount was refused for a finish cut short, and recovery finished none".into());
    }
    let mut recovered = Subject::from_fs(fs, clock, setup.options.clone());
    recovered.check()?;
    let snapshot = recovered.snapshot()?;
    if let Some(read_only) = read_only {
        if read_only != snapshot {
            return Err(format!(
                "a read-only mount showed another tree than recovery: {}",
                describe_difference(&snapshot, &read_only)
            ));
        }
    }
    let completed = applied.len() - 1;
    let state = crate::crashtest::judge_recovery(start_model, applied.to_vec(), completed, returned, &snapshot)
        .map_err(|error| format!("after recovery, {error}"))?;
    let mut model = start_model.clone();
    for operation in &applied[..state] {
        model.apply(operation);
    }
    let mut generator = Generator::new(seed ^ 0x5eed, u64::from(setup.geometry.page_size_bytes) * 6);
    for step in 0..20 {
        let operation = generator.next(&model);
        // On a device that may be full, the tree before each operation: a
        // refusal must leave it as it was, byte for byte.
        let tree = |recovered: &mut Subject| {
            recovered.snapshot().map_err(|error| format!("after recovery, operation {step} {operation:?}: {error}"))
        };
        let before = if space_may_run_out { Some((model.clone(), tree(&mut recovered)?)) } else { None };
        let expected = model.apply(&operation);
        let actual = recovered.apply(&operation);
        if let Some((model_before, tree_before)) = before {
            if refused_for_space(&operation, &expected, &actual) {
                model = model_before;
                if tree(&mut recovered)? != tree_before {
                    return Err(format!(
                        "after recovery, operation {step} {operation:?} was refused for space but changed the tree"
                    ));
                }
                continue;
            }
        }
        if !matches!(operation, Operation::Read { .. }) && actual != expected {
            return Err(format!(
                "after recovery, operation {step} {operation:?}: engine {actual:?}, model {expected:?}"
            ));
        }
    }
    recovered.check()
}
