//! `crashtest`: workloads cut by power loss at chosen device operations,
//! recovered, and held to the promises of `docs/SEMANTICS.md`.
//!
//! Three modes:
//! - **bounded**: every workload of one and of two operations over a small
//!   fixed file set (two directories with two files each, one nested
//!   directory), each operation followed by fsync, fdatasync, sync or
//!   nothing (the last never nothing), as CrashMonkey's ACE enumerates
//!   them; power is cut at every device operation of each workload and
//!   after its end;
//! - **exhaustive**: generated workloads of every operation, cut at every
//!   device operation;
//! - **random**: generated workloads, each cut at seeded random points.
//!
//! The oracle is black-box: the model's state after every operation, the
//! persistence points that returned, and the recovered tree. It does not
//! know how the engine makes things durable, so the same check holds the
//! checkpoint engine and the metadata log to the same contract.
//!
//! One seed drives everything. A failure carries the seed (for bounded
//! mode, the workload's number) and the device operation of the cut.

use std::collections::{BTreeMap, BTreeSet};

use flintfs_flash::MemoryFlash;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use crate::model::{Generator, Kind, Model, Operation, Outcome, Path, Snapshot, SnapshotEntry};
use crate::runner::{Setup, Subject};

/// Bytes compared at a time when a file's blocks are checked against the
/// states allowed (divides every page size the engine supports).
pub const CHECK_BLOCK_BYTES: usize = 512;
/// Operations of a generated workload, by default.
pub const GENERATED_OPERATIONS_DEFAULT: u64 = 60;
/// Seeds a random run spreads its cuts over, at least.
pub const RANDOM_SEEDS_MIN: u64 = 100;
/// Failures kept in a summary (the count of violations goes on).
pub const FAILURES_KEPT_MAX: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Bounded,
    Exhaustive,
    Random,
}

/// How fsync orders data and its log record, and whether recovery checks
/// write pointers: the engine's mount option.
pub use flintfs_core::FsyncMode;

#[derive(Clone, Debug)]
pub struct CrashOptions {
    pub mode: Mode,
    pub seed: u64,
    /// Random mode: cuts in all. Exhaustive mode: workloads.
    pub cuts: u64,
    /// Operations of each generated workload.
    pub operations: u64,
    /// Bounded mode: run every `sample`-th workload (1 runs all).
    pub sample: u64,
    pub fsync: FsyncMode,
    /// The mount's compression; `None` takes the image's default (lz4).
    pub compression: Option<flintfs_format::CompressionChoice>,
    /// Bytes of NVM on the device (0: none): the metadata log goes there.
    pub nvm_size_bytes: u64,
    /// Whether NVM log frames are persisted before their commit words.
    /// Off only to show that the check catches what the barrier prevents.
    pub nvm_barrier: bool,
}

impl CrashOptions {
    pub fn new(mode: Mode) -> CrashOptions {
        CrashOptions {
            mode,
            seed: 1,
            cuts: match mode {
                Mode::Random => 10_000,
                _ => 3,
            },
            operations: GENERATED_OPERATIONS_DEFAULT,
            sample: 1,
            fsync: FsyncMode::WpCheck,
            compression: None,
            nvm_size_bytes: 0,
            nvm_barrier: true,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub seed: u64,
    pub cut: u64,
    pub what: String,
}

#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub workloads: u64,
    pub cuts: u64,
    pub violations: u64,
    pub failures: Vec<Failure>,
    /// Pages the recovery mount read: bucket (a power of two, the bound) to
    /// the number of recoveries.
    pub recovery_pages_read: BTreeMap<u64, u64>,
    /// The most and fewest device operations one workload took.
    pub device_operations_max: u64,
    pub device_operations_min: u64,
    /// Checkpoints the uncut runs took because the NVM log's ring filled:
    /// the cuts fall in and around these write-homes too.
    pub nvm_write_homes: u64,
    /// Dirty nodes the uncut runs parked in NVM.
    pub nodes_parked: u64,
    /// Nodes the uncut runs sent home from a full NVM.
    pub nodes_sent_home: u64,
}

impl Summary {
    fn record(&mut self, seed: u64, cut: u64, result: Result<u64, String>) {
        self.cuts += 1;
        match result {
            Ok(pages) => *self.recovery_pages_read.entry(pages.max(1).next_power_of_two()).or_default() += 1,
            Err(what) => {
                self.violations += 1;
                if self.failures.len() < FAILURES_KEPT_MAX {
                    self.failures.push(Failure { seed, cut, what });
                }
            }
        }
    }
}

/// A workload's operations and what the model says after each: `states[0]`
/// before the first, `states[i + 1]` after operation `i`.
struct Oracle {
    operations: Vec<Operation>,
    states: Vec<Snapshot>,
    /// For each state, the object each path names.
    identities: Vec<BTreeMap<Path, u64>>,
    /// What the model returned for each operation (the engine, uncut,
    /// must return the same).
    outcomes: Vec<Outcome>,
    /// Whether operation `i` is a persistence point that succeeds.
    persists: Vec<bool>,
}

impl Oracle {
    fn new(start: &Model, operations: Vec<Operation>) -> Oracle {
        let mut model = start.clone();
        let mut states = vec![model.snapshot()];
        let mut identities = vec![model.identities()];
        let mut persists = Vec::with_capacity(operations.len());
        let mut outcomes = Vec::with_capacity(operations.len());
        for operation in &operations {
            let outcome = model.apply(operation);
            persists.push(operation.is_durable_point() && outcome == Outcome::Done);
            outcomes.push(outcome);
            states.push(model.snapshot());
            identities.push(model.identities());
        }
        Oracle { operations, states, identities, outcomes, persists }
    }

    /// The states a recovery may show when operations `0..completed`
    /// returned and the power went in operation `completed` (or after the
    /// end): the lowest for the namespace, and the highest. `completed`
    /// counts the interrupted operation when it returned success anyway
    /// (a persistence point that said Done is a promise, cut or not).
    fn bounds(&self, completed: usize) -> (usize, usize) {
        let low = (0..completed).rev().find(|&index| self.persists[index]).map_or(0, |index| index + 1);
        let high = (completed + 1).min(self.states.len() - 1);
        (low, high)
    }

    /// The object `path` named when operation `index` ran.
    fn identity_before(&self, index: usize, path: &Path) -> Option<u64> {
        self.identities[index].get(path).copied()
    }

    /// The lowest state for object `id`'s data: after the last sync,
    /// unmount, or fsync of any of its names among the completed
    /// operations.
    fn data_low(&self, id: u64, completed: usize) -> usize {
        (0..completed)
            .rev()
            .find(|&index| {
                self.persists[index]
                    && match &self.operations[index] {
                        Operation::Fsync { path: synced, .. } => self.identity_before(index, synced) == Some(id),
                        Operation::Sync | Operation::Remount => true,
                        _ => false,
                    }
            })
            .map_or(0, |index| index + 1)
    }

    /// The lowest state for object `id`'s size: its data's bound, or later,
    /// the state after its last truncate, or zeroed range that could grow
    /// it, before the last persistence point (any persistence point keeps
    /// either).
    fn size_low(&self, id: u64, completed: usize, low: usize) -> usize {
        let truncated = (0..low)
            .rev()
            .find(|&index| {
                matches!(&self.operations[index], Operation::Truncate { path: at, .. }
                    | Operation::ZeroRange { path: at, keep_size: false, .. }
                    if self.identity_before(index, at) == Some(id))
            })
            .map_or(0, |index| index + 1);
        self.data_low(id, completed).max(truncated)
    }

    /// Object `id`'s entry in state `index`, under whichever name it has
    /// there.
    fn entry_of(&self, index: usize, id: u64) -> Option<&SnapshotEntry> {
        let path = self.identities[index].iter().find(|(_, &found)| found == id).map(|(path, _)| path)?;
        self.states[index].0.get(path)
    }

    /// Holds a recovered tree to `docs/SEMANTICS.md`. `returned` says
    /// whether the operation the power went in returned success.
    fn judge(&self, recovered: &Snapshot, completed: usize, returned: bool) -> Result<usize, String> {
        // The states run to the one after the operation the power went in,
        // whether or not it returned.
        let high = (completed + 1).min(self.states.len() - 1);
        let completed = if returned && completed < self.operations.len() { completed + 1 } else { completed };
        let (low, _) = self.bounds(completed);
        let shape = |snapshot: &Snapshot| -> Vec<(Path, Kind)> {
            snapshot.0.iter().map(|(path, entry)| (path.clone(), entry.kind)).collect()
        };
        let found = shape(recovered);
        // The states whose namespace the recovered one is. One of them must
        // account for the whole tree: its names say which object each path
        // is, and its metadata is what was recovered.
        let matching: Vec<usize> = (low..=high).filter(|&index| shape(&self.states[index]) == found).collect();
        if matching.is_empty() {
            let kinds = |path: &Path| -> BTreeSet<Option<Kind>> {
                self.states[low..=high].iter().map(|state| state.0.get(path).map(|entry| entry.kind)).collect()
            };
            let mut paths: BTreeSet<&Path> = recovered.0.keys().collect();
            for state in &self.states[low..=high] {
                paths.extend(state.0.keys());
            }
            for path in paths {
                let kind = recovered.0.get(path).map(|entry| entry.kind);
                if !kinds(path).contains(&kind) {
                    return Err(format!(
                        "{} is {:?}; the states since the last persistence point allow {:?}",
                        show(path),
                        kind,
                        kinds(path)
                    ));
                }
            }
            return Err(format!(
                "the recovered namespace is no single state since the last persistence point: {} paths",
                found.len()
            ));
        }
        let mut first_error = None;
        for &state in &matching {
            match self.judge_in(recovered, state, completed, low, high) {
                Ok(()) => return Ok(state),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        Err(first_error.expect("a state was judged"))
    }

    /// The recovered tree as state `state`'s namespace: its xattrs, symlink
    /// targets and link counts are that state's (metadata persists as a
    /// prefix), the names of one file hold the same bytes, and each regular
    /// file holds a size and data it had since what bounds it.
    fn judge_in(
        &self,
        recovered: &Snapshot,
        state: usize,
        completed: usize,
        low: usize,
        high: usize,
    ) -> Result<(), String> {
        let expected_tree = &self.states[state];
        let mut objects: BTreeMap<u64, (&Path, &SnapshotEntry)> = BTreeMap::new();
        for (path, entry) in &recovered.0 {
            let expected = expected_tree.0.get(path).expect("the same namespace");
            if entry.xattrs != expected.xattrs {
                return Err(format!(
                    "{}: xattrs {:?}, where the state its namespace is had {:?}",
                    show(path),
                    entry.xattrs,
                    expected.xattrs
                ));
            }
            match entry.kind {
                Kind::Symlink if entry.data != expected.data => {
                    return Err(format!("{}: a symlink target it did not have then", show(path)));
                }
                Kind::Regular => {
                    if entry.nlink != expected.nlink {
                        return Err(format!("{}: {} links where it had {}", show(path), entry.nlink, expected.nlink));
                    }
                    let id = self.identities[state][path];
                    if let Some((other, first)) = objects.insert(id, (path, entry)) {
                        if first.data != entry.data {
                            return Err(format!("{} and {}, one file, hold different bytes", show(other), show(path)));
                        }
                    }
                    self.judge_file(path, entry, id, completed, low, high, state)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether operation `index` renamed, linked or truncated object `id`:
    /// an operation that names a file carries the writes before it.
    fn names_file(&self, index: usize, id: u64) -> bool {
        if self.outcomes[index] != Outcome::Done {
            return false;
        }
        let joined = |directory: &Path, name: &[u8]| -> Path {
            let mut path = directory.clone();
            path.push(name.to_vec());
            path
        };
        let is = |path: &Path| self.identity_before(index, path) == Some(id);
        match &self.operations[index] {
            Operation::Rename { directory, name, new_directory, new_name, .. } => {
                is(&joined(directory, name)) || is(&joined(new_directory, new_name))
            }
            // A punched hole or a zeroed range is logged after the file's
            // unlogged writes, as a truncate is.
            Operation::Link { path, .. }
            | Operation::Truncate { path, .. }
            | Operation::PunchHole { path, .. }
            | Operation::ZeroRange { path, .. } => is(path),
            _ => false,
        }
    }
}

impl Oracle {
    /// A regular file, object `id`, holds a size and data it had since its
    /// last persistence point, and since the last operation that named it
    /// in state `state`'s past.
    #[allow(clippy::too_many_arguments)]
    fn judge_file(
        &self,
        path: &Path,
        entry: &SnapshotEntry,
        id: u64,
        completed: usize,
        low: usize,
        high: usize,
        state: usize,
    ) -> Result<(), String> {
        let named = (0..state).rev().find(|&index| self.names_file(index, id)).unwrap_or(0);
        let size_low = self.size_low(id, completed, low).min(low).max(named);
        let sizes: BTreeSet<usize> = (size_low..=high)
            .filter_map(|index| self.entry_of(index, id))
            .filter(|allowed| allowed.kind == Kind::Regular)
            .map(|allowed| allowed.data.len())
            .collect();
        if !sizes.contains(&entry.data.len()) {
            return Err(format!(
                "{}: size {} is none of the sizes since its last persistence point, {:?}",
                show(path),
                entry.data.len(),
                sizes
            ));
        }
        let data_low = self.data_low(id, completed).min(low).max(named);
        let versions: Vec<&[u8]> = (data_low..=high)
            .filter_map(|index| self.entry_of(index, id))
            .filter(|allowed| allowed.kind == Kind::Regular)
            .map(|allowed| allowed.data.as_slice())
            .collect();
        check_data(path, &entry.data, &versions)
    }
}

/// Holds a tree recovered after a cut to `docs/SEMANTICS.md`: `operations`
/// ran from `start`, the first `completed` returned, and the power went in
/// the next (`returned`: it said Done all the same) or after the end.
/// Returns the state (operations applied) whose namespace was recovered.
pub fn judge_recovery(
    start: &Model,
    operations: Vec<Operation>,
    completed: usize,
    returned: bool,
    recovered: &Snapshot,
) -> Result<usize, String> {
    Oracle::new(start, operations).judge(recovered, completed, returned)
}

/// A file's size must be one it had, and each block must be that block of
/// one of its versions that reaches that far.
fn check_data(path: &Path, data: &[u8], versions: &[&[u8]]) -> Result<(), String> {
    if !versions.iter().any(|version| version.len() == data.len()) {
        let sizes: BTreeSet<usize> = versions.iter().map(|version| version.len()).collect();
        return Err(format!("{}: size {} is none of the sizes it had, {:?}", show(path), data.len(), sizes));
    }
    for (index, block) in data.chunks(CHECK_BLOCK_BYTES).enumerate() {
        let start = index * CHECK_BLOCK_BYTES;
        // Only a version that holds these bytes counts: zeroes past the end
        // of a shorter one would be bytes never written (the ext4
        // data=writeback failure), unless some version holds them as a hole.
        let matches = versions.iter().any(|version| version.get(start..start + block.len()) == Some(block));
        if !matches {
            return Err(format!(
                "{}: bytes {}..{} were never there (no version since its last persistence point holds them)",
                show(path),
                start,
                start + block.len()
            ));
        }
    }
    Ok(())
}

fn show(path: &Path) -> String {
    let parts: Vec<String> = path.iter().map(|name| String::from_utf8_lossy(name).into_owned()).collect();
    format!("/{}", parts.join("/"))
}

fn path(text: &str) -> Path {
    text.split('/').filter(|part| !part.is_empty()).map(|part| part.as_bytes().to_vec()).collect()
}

/// A prepared device: formatted, the setup applied and synced.
struct Prepared {
    setup: Setup,
    flash: MemoryFlash,
    clock_ns: i64,
    model: Model,
}

impl Prepared {
    fn new(setup: Setup, seed: u64, operations: &[Operation]) -> Result<Prepared, String> {
        let (flash, clock) = setup.formatted(seed);
        let mut subject = Subject::mount(flash, clock.clone(), setup.options.clone())?;
        let mut model = Model::for_page_size(setup.geometry.page_size_bytes as usize);
        for operation in operations.iter().chain([&Operation::Sync]) {
            let expected = model.apply(operation);
            let actual = subject.apply(operation);
            if actual != expected {
                return Err(format!("setup {operation:?}: engine {actual:?}, model {expected:?}"));
            }
        }
        let flash = subject.fs.take().expect("mounted").into_device();
        Ok(Prepared { setup, flash, clock_ns: flintfs_core::Clock::now_ns(&clock), model })
    }

    /// Runs `operations` from the prepared state with the power cut at
    /// device operation `cut` (counted from the first operation; `None`
    /// runs to the end). Returns the device operations taken, or the
    /// recovery's pages read and whether the tree is as promised.
    fn run(
        &self,
        operations: &[Operation],
        cut: Option<u64>,
        seed: u64,
        oracle: &Oracle,
    ) -> Result<CutOutcome, String> {
        let clock = flintfs_core::ManualClock::new(self.clock_ns);
        let mut flash = self.flash.clone();
        let start = flash.mutating_operations();
        if let Some(cut) = cut {
            flash.schedule_power_cut(start + cut, seed).map_err(|error| error.to_string())?;
        }
        let mut subject = Subject::mount(flash, clock.clone(), self.setup.options.clone())?;
        let mut completed = operations.len();
        let mut returned = false;
        for (index, operation) in operations.iter().enumerate() {
            clock.advance(self.setup.step_ns);
            let outcome = subject.apply(operation);
            if subject.fs.as_ref().is_none_or(|fs| fs.device().is_powered_off()) {
                completed = index;
                returned = outcome == Outcome::Done;
                break;
            }
            // Uncut, the engine must do what the model does: an operation
            // it skipped would look like one the crash lost.
            if cut.is_none() && outcome != oracle.outcomes[index] {
                return Err(format!(
                    "operation {index} {operation:?}: engine {outcome:?}, model {:?}",
                    oracle.outcomes[index]
                ));
            }
        }
        // The workload's own device operations, before the snapshot below
        // reads (and, letting go of what it looked up, may write).
        let taken = subject.fs.as_ref().map(|fs| fs.device().mutating_operations() - start);
        let (nvm_write_homes, nodes_parked, nodes_sent_home) = subject.fs.as_ref().map_or((0, 0, 0), |fs| {
            let (now, earlier) = (fs.counters(), &subject.counters_earlier);
            (
                now.nvm_log_full_checkpoints + earlier.nvm_log_full_checkpoints,
                now.nodes_parked + earlier.nodes_parked,
                now.nodes_sent_home + earlier.nodes_sent_home,
            )
        });
        if cut.is_none() && subject.snapshot()? != *oracle.states.last().expect("a state") {
            return Err("uncut, the engine's tree differs from the model's at the end".into());
        }
        let Some(fs) = subject.fs.take() else {
            return Err("the file system was lost in a remount the cut broke".into());
        };
        let mut flash = fs.into_device();
        let taken = taken.unwrap_or(flash.mutating_operations() - start);
        let Some(cut) = cut else {
            return Ok(CutOutcome::Ran { device_operations: taken, nvm_write_homes, nodes_parked, nodes_sent_home });
        };
        if !flash.is_powered_off() && cut < taken {
            return Err(format!(
                "the cut at device operation {cut} of {taken} did not fire: the run is not deterministic"
            ));
        }
        if !flash.is_powered_off() {
            // The cut falls after the workload's last device operation.
            flash.cancel_power_cut();
            flash.power_cut(seed).map_err(|error| error.to_string())?;
        }
        flash.power_on();
        let read_only = crate::runner::read_only_view(&self.setup, &flash, &clock)?;
        let (fs, report) = flintfs_core::Fs::mount(flash, self.setup.options.clone(), Box::new(clock.clone()))
            .map_err(|error| format!("recovery failed: {error}"))?;
        if read_only.is_none() && report.zones_finished_after_cut == 0 {
            return Err("the read-only mount was refused for a finish cut short, and recovery finished none".into());
        }
        let mut recovered = Subject::from_fs(fs, clock, self.setup.options.clone());
        recovered.check()?;
        let snapshot = recovered.snapshot()?;
        if let Some(read_only) = read_only {
            if read_only != snapshot {
                return Err(format!(
                    "a read-only mount showed another tree than recovery: {}",
                    crate::runner::describe_difference(&snapshot, &read_only)
                ));
            }
        }
        if let Err(error) = oracle.judge(&snapshot, completed, returned) {
            // What recovery did says where to look.
            let recovery = report.recovery.map_or(String::new(), |recovery| {
                format!(
                    "; recovery replayed {}, discarded {}, failed {:?}; {}",
                    recovery.records_replayed, recovery.records_discarded, recovery.records_failed, recovery.end
                )
            });
            return Err(format!("{error}{recovery}"));
        }
        // And it keeps working.
        for operation in
            [Operation::Create { directory: Vec::new(), name: b"after-recovery".to_vec() }, Operation::Sync]
        {
            let outcome = recovered.apply(&operation);
            if outcome != Outcome::Done && outcome != Outcome::Error(flintfs_core::errno::EEXIST) {
                return Err(format!("after recovery, {operation:?} gave {outcome:?}"));
            }
        }
        recovered.check()?;
        Ok(CutOutcome::Recovered { pages_read: report.pages_read })
    }
}

enum CutOutcome {
    Ran { device_operations: u64, nvm_write_homes: u64, nodes_parked: u64, nodes_sent_home: u64 },
    Recovered { pages_read: u64 },
}

/// Cuts one workload at `cuts` (device operation numbers), into `summary`.
fn cut_workload(
    prepared: &Prepared,
    operations: Vec<Operation>,
    seed: u64,
    mut cuts: impl FnMut(u64) -> Vec<u64>,
    summary: &mut Summary,
) {
    let oracle = Oracle::new(&prepared.model, operations);
    let total = match prepared.run(&oracle.operations, None, seed, &oracle) {
        Ok(CutOutcome::Ran { device_operations, nvm_write_homes, nodes_parked, nodes_sent_home }) => {
            summary.nvm_write_homes += nvm_write_homes;
            summary.nodes_parked += nodes_parked;
            summary.nodes_sent_home += nodes_sent_home;
            device_operations
        }
        Ok(CutOutcome::Recovered { .. }) => unreachable!("no cut was asked for"),
        Err(what) => {
            summary.record(seed, 0, Err(format!("the workload without a cut: {what}")));
            return;
        }
    };
    summary.workloads += 1;
    summary.device_operations_max = summary.device_operations_max.max(total);
    summary.device_operations_min =
        if summary.workloads == 1 { total } else { summary.device_operations_min.min(total) };
    for cut in cuts(total) {
        let result = prepared.run(&oracle.operations, Some(cut), seed, &oracle).map(|outcome| match outcome {
            CutOutcome::Recovered { pages_read } => pages_read,
            CutOutcome::Ran { .. } => 0,
        });
        summary.record(seed, cut, result.map_err(|what| format!("{what} (workload {:?})", oracle.operations)));
    }
}

/// Cuts `workload`, run from the state `setup_operations` leave (synced),
/// at `cuts` device operations spread evenly over it, and judges each
/// recovery against the model as the other modes do. For workloads built
/// to reach one mechanism (the cleaner, say) that generated ones rarely do.
pub fn cut_given_workload(
    setup: Setup,
    seed: u64,
    setup_operations: &[Operation],
    workload: Vec<Operation>,
    cuts: u64,
) -> Result<Summary, String> {
    let prepared = Prepared::new(setup, seed, setup_operations)?;
    let mut summary = Summary::default();
    cut_workload(
        &prepared,
        workload,
        seed,
        |total| (1..=cuts).map(|cut| total * cut / (cuts + 1)).collect(),
        &mut summary,
    );
    Ok(summary)
}

/// The bounded mode's file set, made before every workload and synced.
fn bounded_setup() -> Vec<Operation> {
    vec![
        Operation::Mkdir { directory: vec![], name: b"A".to_vec() },
        Operation::Mkdir { directory: vec![], name: b"B".to_vec() },
        Operation::Mkdir { directory: path("A"), name: b"C".to_vec() },
        Operation::Create { directory: path("A"), name: b"foo".to_vec() },
        Operation::Write { path: path("A/foo"), offset: 0, length: 8192, fill: 1 },
        Operation::Create { directory: path("B"), name: b"foo".to_vec() },
        Operation::Write { path: path("B/foo"), offset: 0, length: 5000, fill: 2 },
        Operation::SetXattr { path: path("B/foo"), name: b"user.y".to_vec(), value: b"kept".to_vec() },
    ]
}

/// One operation of a bounded workload, and the path its fsync targets
/// (the file it changed, or the directory whose entries it changed).
fn bounded_operations() -> Vec<(Operation, Path)> {
    let rename = |from: &str, to: &str| {
        let (from, to) = (path(from), path(to));
        Operation::Rename {
            directory: from[..from.len() - 1].to_vec(),
            name: from[from.len() - 1].clone(),
            new_directory: to[..to.len() - 1].to_vec(),
            new_name: to[to.len() - 1].clone(),
            no_replace: false,
            exchange: false,
        }
    };
    let create = |at: &str| {
        let at = path(at);
        Operation::Create { directory: at[..at.len() - 1].to_vec(), name: at[at.len() - 1].clone() }
    };
    let unlink = |at: &str| {
        let at = path(at);
        Operation::Unlink { directory: at[..at.len() - 1].to_vec(), name: at[at.len() - 1].clone() }
    };
    let write =
        |at: &str, offset: u64, length: u64, fill: u8| Operation::Write { path: path(at), offset, length, fill };
    vec![
        (create("A/bar"), path("A/bar")),
        (create("B/bar"), path("B/bar")),
        (write("A/foo", 0, 4096, 3), path("A/foo")),
        (write("A/foo", 8192, 5000, 4), path("A/foo")),
        (write("B/foo", 1000, 3000, 5), path("B/foo")),
        (write("A/bar", 0, 700, 6), path("A/bar")),
        (Operation::Truncate { path: path("A/foo"), size: 0 }, path("A/foo")),
        (Operation::Truncate { path: path("B/foo"), size: 20000 }, path("B/foo")),
        (rename("A/foo", "A/bar"), path("A/bar")),
        (rename("A/foo", "B/foo"), path("B/foo")),
        (rename("A/foo", "A/C/foo"), path("A/C/foo")),
        (rename("A/C", "B/C"), path("B/C")),
        (Operation::Link { path: path("A/foo"), directory: path("A"), name: b"bar".to_vec() }, path("A/bar")),
        (Operation::Link { path: path("B/foo"), directory: path("A/C"), name: b"bar".to_vec() }, path("A/C/bar")),
        (unlink("A/foo"), path("A")),
        (unlink("B/foo"), path("B")),
        (Operation::Mkdir { directory: path("B"), name: b"D".to_vec() }, path("B/D")),
        (Operation::Rmdir { directory: path("A"), name: b"C".to_vec() }, path("A")),
        (Operation::Chmod { path: path("A/foo"), permissions: 0o600 }, path("A/foo")),
        (Operation::SetXattr { path: path("A/foo"), name: b"user.x".to_vec(), value: b"v".to_vec() }, path("A/foo")),
        (Operation::RemoveXattr { path: path("B/foo"), name: b"user.y".to_vec() }, path("B/foo")),
        (
            Operation::Symlink { directory: path("A/C"), name: b"link".to_vec(), target: b"../foo".to_vec() },
            path("A/C"),
        ),
    ]
}

/// What follows an operation in a bounded workload.
fn persistence(choice: usize, target: &Path) -> Option<Operation> {
    match choice {
        0 => Some(Operation::Fsync { path: target.clone(), data_only: false }),
        1 => Some(Operation::Fsync { path: target.clone(), data_only: true }),
        2 => Some(Operation::Sync),
        _ => None,
    }
}

/// Every bounded workload, in a fixed order: one operation (its
/// persistence never nothing), then two.
pub fn bounded_workloads() -> Vec<Vec<Operation>> {
    let catalogue = bounded_operations();
    let step = |(operation, target): &(Operation, Path), choice: usize| -> Vec<Operation> {
        std::iter::once(operation.clone()).chain(persistence(choice, target)).collect()
    };
    let mut workloads = Vec::new();
    for last in &catalogue {
        for choice in 0..3 {
            workloads.push(step(last, choice));
        }
    }
    for first in &catalogue {
        for first_choice in 0..4 {
            for last in &catalogue {
                for choice in 0..3 {
                    let mut workload = step(first, first_choice);
                    workload.extend(step(last, choice));
                    workloads.push(workload);
                }
            }
        }
    }
    workloads
}

/// A generated workload of `operations` operations from `seed`.
fn generated_workload(
    start: &Model,
    seed: u64,
    operations: u64,
    page_size: u32,
    checkpoints_rare: bool,
) -> Vec<Operation> {
    let mut model = start.clone();
    let mut generator = Generator::new(seed, u64::from(page_size) * 6);
    generator.checkpoints_rare = checkpoints_rare;
    (0..operations)
        .map(|_| {
            let operation = generator.next(&model);
            model.apply(&operation);
            operation
        })
        .collect()
}

/// Runs a crashtest; `progress` is told each finished workload.
pub fn run(options: &CrashOptions, mut progress: impl FnMut(u64, u64)) -> Result<Summary, String> {
    let mut setup = Setup::small();
    setup.options.fsync_mode = options.fsync;
    setup.options.compression = options.compression;
    setup.geometry.nvm_size_bytes = options.nvm_size_bytes;
    setup.options.nvm_barrier = options.nvm_barrier;
    if options.nvm_size_bytes > 0 {
        // The timer would write home every 50 operations, long before a
        // ring fills: with it far apart, the ring's own write-homes (and
        // cuts during them) happen within a workload.
        setup.options.checkpoint_interval_ns = 60_000_000_000;
        // And more zones declared, so that running out of them (a
        // checkpoint) comes later than the ring filling.
        setup.unindexed_segments = 12;
    }
    let page_size = setup.geometry.page_size_bytes;
    // With NVM, generated workloads checkpoint rarely, so the ring fills.
    let nvm = options.nvm_size_bytes > 0;
    let mut summary = Summary::default();
    match options.mode {
        Mode::Bounded => {
            let prepared = Prepared::new(setup, options.seed, &bounded_setup())?;
            let workloads = bounded_workloads();
            let sample = options.sample.max(1) as usize;
            let total = workloads.len().div_ceil(sample) as u64;
            for (number, workload) in workloads.into_iter().enumerate().step_by(sample) {
                cut_workload(&prepared, workload, number as u64, |total| (0..=total).collect(), &mut summary);
                progress(summary.workloads, total);
            }
        }
        Mode::Exhaustive => {
            let prepared = Prepared::new(setup, options.seed, &[])?;
            for index in 0..options.cuts {
                let seed = options.seed.wrapping_add(index);
                let workload = generated_workload(&prepared.model, seed, options.operations, page_size, nvm);
                cut_workload(&prepared, workload, seed, |total| (0..=total).collect(), &mut summary);
                progress(index + 1, options.cuts);
            }
        }
        Mode::Random => {
            let prepared = Prepared::new(setup, options.seed, &[])?;
            let seeds = options.cuts.clamp(1, RANDOM_SEEDS_MIN);
            for index in 0..seeds {
                let seed = options.seed.wrapping_add(index);
                let cuts_here = options.cuts / seeds + u64::from(index < options.cuts % seeds);
                let workload = generated_workload(&prepared.model, seed, options.operations, page_size, nvm);
                let mut random = Pcg64::seed_from_u64(seed ^ 0xC0FF_EE00);
                let pick =
                    move |total: u64| (0..cuts_here).map(|_| random.random_range(0..=total)).collect::<Vec<u64>>();
                cut_workload(&prepared, workload, seed, pick, &mut summary);
                progress(index + 1, seeds);
            }
        }
    }
    Ok(summary)
}

/// The summary as JSON (no serde in the test kit: the fields are few and
/// fixed). `failures` is a list of `{seed, cut, what}`.
pub fn summary_json(options: &CrashOptions, summary: &Summary) -> String {
    let escape = |text: &str| {
        let mut out = String::with_capacity(text.len() + 2);
        out.push('"');
        for character in text.chars() {
            match character {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                character if (character as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", character as u32)),
                character => out.push(character),
            }
        }
        out.push('"');
        out
    };
    let failures: Vec<String> = summary
        .failures
        .iter()
        .map(|failure| {
            format!("{{\"seed\":{},\"cut\":{},\"what\":{}}}", failure.seed, failure.cut, escape(&failure.what))
        })
        .collect();
    let histogram: Vec<String> =
        summary.recovery_pages_read.iter().map(|(bucket, count)| format!("\"{bucket}\":{count}")).collect();
    format!(
        "{{\"mode\":{},\"fsync\":{},\"nvm_size_bytes\":{},\"nvm_barrier\":{},\"seed\":{},\"workloads\":{},\"cuts\":{},\"violations\":{},\"failures\":[{}],\
         \"recovery_pages_read\":{{{}}},\"device_operations_min\":{},\"device_operations_max\":{},\"nvm_write_homes\":{},\"nodes_parked\":{},\"nodes_sent_home\":{}}}",
        escape(&format!("{:?}", options.mode).to_lowercase()),
        escape(match options.fsync {
            FsyncMode::WpCheck => "wp-check",
            FsyncMode::Ordered => "ordered",
            FsyncMode::Unchecked => "unchecked",
        }),
        options.nvm_size_bytes,
        options.nvm_barrier,
        options.seed,
        summary.workloads,
        summary.cuts,
        summary.violations,
        failures.join(","),
        histogram.join(","),
        summary.device_operations_min,
        summary.device_operations_max,
        summary.nvm_write_homes,
        summary.nodes_parked,
        summary.nodes_sent_home
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounded_space_has_one_and_two_operation_workloads() {
        let workloads = bounded_workloads();
        let operations = bounded_operations().len();
        assert_eq!(workloads.len(), operations * 3 + operations * 4 * operations * 3);
        // The last operation of a workload is always a persistence point.
        for workload in &workloads {
            assert!(workload.last().is_some_and(Operation::is_durable_point), "{workload:?}");
        }
    }

    #[test]
    fn the_oracle_refuses_bytes_never_written() {
        let file = path("f");
        assert!(check_data(&file, &[1, 2, 3], &[&[1, 2, 3], &[]]).is_ok());
        assert!(check_data(&file, &[0; 600], &[&[], &[7; 600]]).is_err(), "a size it had, bytes it never held");
        assert!(check_data(&file, &[9; 10], &[&[1; 10]]).is_err());
        let mut mixed = vec![1u8; 1024];
        mixed[512..].fill(2);
        assert!(check_data(&file, &mixed, &[&[1; 1024], &[2; 1024]]).is_ok(), "blocks from two versions");
    }
}

#[cfg(test)]
mod oracle_tests {
    use super::*;

    fn oracle(operations: Vec<Operation>) -> Oracle {
        Oracle::new(&Model::for_page_size(512), operations)
    }

    #[test]
    fn a_file_fsynced_must_be_there_and_one_not_fsynced_may_be_missing() {
        let create = Operation::Create { directory: vec![], name: b"f".to_vec() };
        let fsynced = oracle(vec![create.clone(), Operation::Fsync { path: path("f"), data_only: false }]);
        let empty = fsynced.states[0].clone();
        assert!(fsynced.judge(&empty, 2, false).is_err(), "lost after its fsync returned");
        assert!(fsynced.judge(&empty, 1, false).is_ok(), "the cut fell in the fsync");
        assert!(fsynced.judge(&fsynced.states[2], 2, false).is_ok());
        let not_synced = oracle(vec![create]);
        assert!(not_synced.judge(&empty, 1, false).is_ok());
        assert!(not_synced.judge(&not_synced.states[1], 1, false).is_ok());
    }

    #[test]
    fn a_rename_is_whole_or_absent_never_neither_name() {
        let setup = vec![
            Operation::Create { directory: vec![], name: b"a".to_vec() },
            Operation::Sync,
            Operation::Rename {
                directory: vec![],
                name: b"a".to_vec(),
                new_directory: vec![],
                new_name: b"b".to_vec(),
                no_replace: false,
                exchange: false,
            },
        ];
        let oracle = oracle(setup);
        assert!(oracle.judge(&oracle.states[2], 3, false).is_ok(), "before the rename");
        assert!(oracle.judge(&oracle.states[3], 3, false).is_ok(), "after it");
        let mut neither = oracle.states[3].clone();
        neither.0.remove(&path("b"));
        assert!(oracle.judge(&neither, 3, false).is_err(), "neither name");
        let mut both = oracle.states[3].clone();
        both.0.insert(path("a"), oracle.states[2].0[&path("a")].clone());
        assert!(oracle.judge(&both, 3, false).is_err(), "both names");
    }

    #[test]
    fn an_interrupted_fsync_that_returned_success_is_a_promise() {
        let operations = vec![
            Operation::Create { directory: vec![], name: b"f".to_vec() },
            Operation::Fsync { path: path("f"), data_only: false },
        ];
        let oracle = oracle(operations);
        let empty = oracle.states[0].clone();
        assert!(oracle.judge(&empty, 1, false).is_ok(), "the fsync did not return");
        assert!(oracle.judge(&empty, 1, true).is_err(), "the fsync returned Done");
    }

    #[test]
    fn a_truncate_before_a_persistence_point_keeps_its_size() {
        let operations = vec![
            Operation::Create { directory: vec![], name: b"f".to_vec() },
            Operation::Write { path: path("f"), offset: 0, length: 1024, fill: 1 },
            Operation::Sync,
            Operation::Truncate { path: path("f"), size: 0 },
            Operation::Create { directory: vec![], name: b"g".to_vec() },
            Operation::Fsync { path: path("g"), data_only: false },
        ];
        let oracle = oracle(operations);
        let mut untruncated = oracle.states[6].clone();
        untruncated.0.insert(path("f"), oracle.states[3].0[&path("f")].clone());
        assert!(oracle.judge(&oracle.states[6], 6, false).is_ok());
        assert!(oracle.judge(&untruncated, 6, false).is_err(), "the truncate was before the fsync of g");
    }

    #[test]
    fn data_after_its_fsync_is_old_or_new_block_by_block_never_other() {
        let operations = vec![
            Operation::Create { directory: vec![], name: b"f".to_vec() },
            Operation::Write { path: path("f"), offset: 0, length: 1024, fill: 1 },
            Operation::Fsync { path: path("f"), data_only: true },
            Operation::Write { path: path("f"), offset: 0, length: 1024, fill: 2 },
        ];
        let oracle = oracle(operations);
        assert!(oracle.judge(&oracle.states[3], 4, false).is_ok(), "the old data");
        assert!(oracle.judge(&oracle.states[4], 4, false).is_ok(), "the new data");
        assert!(oracle.judge(&oracle.states[1], 4, false).is_err(), "empty: older than the fsync");
        let mut garbage = oracle.states[4].clone();
        garbage.0.get_mut(&path("f")).expect("the file").data[700] ^= 0xff;
        assert!(oracle.judge(&garbage, 4, false).is_err(), "a byte never written there");
    }
}
