//! `flintfs bench`: the seeds' workloads on flintfs and its peers in one
//! run, on this machine.
//!
//! Targets:
//! - `flintfs`: the engine in-process on the memory device;
//! - `flintfs-ordered`: the same with `fsync=ordered` (data flushed before
//!   its log record: F2FS strict), to set the write-pointer check against;
//! - `flintfs-fuse`: a FUSE mount of an image file;
//! - `flintfs-block`: a FUSE mount of the block backend on a loop device,
//!   measured exactly as the kernel peers on theirs (root only);
//! - `fuse-floor`: a FUSE mount of a file system that keeps everything in
//!   memory and does no work, met by the kernel as flintfs-fuse is: what
//!   the FUSE path alone allows (`bench_floor`; root only, on the ordinary
//!   workloads of issue 19);
//! - `ext2`, `ext4`, `btrfs`, `xfs`: kernel file systems on loop devices
//!   (root only; skipped with a note otherwise or when mkfs is missing);
//! - `littlefs`: the `littlefs2` crate in-process on the same emulated
//!   flash (`bench_littlefs`).
//!
//! Every (workload, target) runs in a child process of its own, so its peak
//! RSS is its own. Bytes programmed count from after mount to after
//! unmount: for flintfs, data and OOB bytes from the device counters; for a
//! kernel file system, the sectors its loop device wrote, from /sys/block.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use clap::Args;
use flintfs_core::{Fs, FsOptions, FsyncMode, MkfsOptions, ROOT_INO};
use flintfs_flash::{Counters, DeviceOptions, FlashDevice, Geometry, MemoryFlash};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Value};

use crate::{fail, Failure, Outcome};

/// Workloads, in the order `all` runs them.
pub const WORKLOADS: [&str; 15] = [
    "create_fsync",
    "delete",
    "append_fsync1",
    "append_fsync10",
    "append_fsync1000",
    "varmail",
    "fileserver",
    "webproxy",
    "webserver",
    "postmark",
    "large_seq_write",
    "large_rand_write",
    "space_half",
    "space_random",
    "space_usr_share",
];
/// Targets, in the order rows are printed.
pub const TARGETS: [&str; 16] = [
    "flintfs",
    "flintfs-ordered",
    "flintfs-fuse",
    "flintfs-uring",
    "flintfs-nvm",
    "flintfs-nvm-fuse",
    "flintfs-block",
    "flintfs-zstd",
    "flintfs-none",
    "fuse-floor",
    "ext2",
    "ext4",
    "btrfs",
    "btrfs-zstd",
    "xfs",
    "littlefs",
];
/// How many of [`TARGETS`] run without being asked for (flintfs's, and the
/// FUSE floor beside them); the rest are peers.
const FLINTFS_TARGETS: usize = 10;
/// NVM beside the flash for the `flintfs-nvm` targets (FSMAC's metadata
/// accelerator): a small NVDIMM's worth, whose ring holds the log of tens of
/// thousands of metadata fsyncs between write-homes.
pub const BENCH_NVM_BYTES: u64 = 64 << 20;

/// The mount's compression on an in-process target: `flintfs-zstd` and
/// `flintfs-none` measure zstd and no compression beside the default (the
/// image's, lz4).
fn compression_of(target: &str) -> Option<flintfs_format::CompressionChoice> {
    match target {
        "flintfs-zstd" => Some(flintfs_format::CompressionChoice::ZSTD),
        "flintfs-none" => Some(flintfs_format::CompressionChoice::NONE),
        _ => None,
    }
}

/// Whether a target runs a workload without being named: the codec
/// variants and btrfs with compression run where compression is measured
/// (space, and the large-file throughput that issue 17 holds to
/// `compress=none`); every other target runs everywhere it is asked for.
fn runs_by_default(workload: &str, target: &str) -> bool {
    match target {
        "flintfs-zstd" | "flintfs-none" => workload.starts_with("space_") || workload.starts_with("large_"),
        "btrfs-zstd" => workload.starts_with("space_"),
        // The floor is judged beside flintfs-fuse on issue 19's ordinary work.
        "fuse-floor" => crate::bench_report::ISSUE_19_ORDINARY.contains(&workload),
        // NVM holds metadata: measured where fsync and metadata dominate.
        "flintfs-nvm" | "flintfs-nvm-fuse" => !["space_", "large_", "near_full_", "mount_", "ram_", "recover_"]
            .iter()
            .any(|prefix| workload.starts_with(prefix)),
        _ => true,
    }
}
/// Whether `threads_N` runs on a target: in process on flintfs (paced,
/// with group commit), and through std::fs threads in a mount of
/// flintfs over FUSE or of a kernel peer. The other flintfs variants
/// would say nothing new, and littlefs has no threads.
fn threads_run_on(target: &str) -> bool {
    !matches!(
        target,
        "flintfs-ordered" | "flintfs-zstd" | "flintfs-none" | "flintfs-nvm" | "flintfs-nvm-fuse" | "littlefs"
    )
}

/// File counts the memory (`ram_N`) and recovery (`recover_N`) workloads
/// run at.
fn file_counts(quick: bool) -> &'static [usize] {
    if quick {
        &[100, 1_000, 10_000]
    } else {
        &[100, 1_000, 10_000, 100_000]
    }
}

/// File counts the mount workloads (`mount_N`) mount after: up to a
/// million at full size, as issue 6 asks.
fn mount_file_counts(quick: bool) -> &'static [usize] {
    if quick {
        file_counts(quick)
    } else {
        &[100, 1_000, 10_000, 100_000, 1_000_000]
    }
}

/// Inodes an ext2 or ext4 peer is made with for a workload of more files
/// than its default (one inode per 16 KiB: 131,072 on 2 GiB) holds.
fn inodes_needed(workload: &str) -> Option<usize> {
    let count: usize = workload.rsplit_once('_')?.1.parse().ok()?;
    (count > 100_000).then_some(count + count / 10)
}

/// Bytes of one append.
pub(crate) const APPEND_BYTES: usize = 4096;
/// Directories the create workload spreads its files over (ReconFS).
pub(crate) const CREATE_DIRECTORIES: usize = 100;

#[derive(Args)]
pub struct BenchArguments {
    /// A workload (create_fsync, delete, append_fsync1, append_fsync10, append_fsync1000, varmail, fileserver,
    /// webproxy, webserver, postmark, large_seq_write, large_rand_write, space_half, space_random,
    /// space_usr_share, dir_N, near_full_P, large_seq_read,
    /// large_rand_read, large_reread, ram_N, mount_N, recover_N, protection_none, protection_ecc,
    /// protection_k1, protection_k2, protection_k1_rs, protection_k1_rs_nvm, threads_N), `protection`
    /// (those six) or `all`.
    pub workload: String,
    /// The quick sizes (for CI and a first look).
    #[arg(long)]
    pub quick: bool,
    /// Peers beside flintfs and flintfs-fuse: a list of ext2, ext4, btrfs, btrfs-zstd (btrfs mounted with
    /// compress-force=zstd, run on the space workloads unasked), xfs, littlefs.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    #[arg(long)]
    pub json: bool,
    /// Write a report here: README.md (targets judged, rows), rows.json and charts.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Seeds the data written.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Write the report in this directory again from the rows, header and
    /// notes a run left there (the workload argument is then ignored).
    #[arg(long)]
    pub render: Option<PathBuf>,
    /// (internal) Run one workload on one target and print its row.
    #[arg(long, hide = true)]
    pub target: Option<String>,
}

/// Sizes of a workload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Size {
    /// The quick sizes.
    pub quick: bool,
    pub files: usize,
    pub appends: usize,
    pub varmail_files: usize,
    pub varmail_loops: usize,
    /// filebench's fileserver, webproxy and webserver: files, and loops.
    personality_files: [usize; 3],
    personality_loops: usize,
    postmark_transactions: usize,
    pub large_file_bytes: u64,
    device_bytes: u64,
}

impl Size {
    pub(crate) fn of(quick: bool) -> Size {
        if quick {
            Size {
                quick: true,
                files: 2_000,
                appends: 2_000,
                varmail_files: 200,
                varmail_loops: 300,
                personality_files: [500, 1_000, 1_000],
                personality_loops: 300,
                postmark_transactions: 3_000,
                large_file_bytes: 64 << 20,
                device_bytes: 512 << 20,
            }
        } else {
            // The personalities' own file counts (filebench's defaults).
            Size {
                quick: false,
                files: 100_000,
                appends: 100_000,
                varmail_files: 1_000,
                varmail_loops: 5_000,
                personality_files: [10_000, 10_000, 1_000],
                personality_loops: 5_000,
                postmark_transactions: 15_000,
                large_file_bytes: 512 << 20,
                device_bytes: 2 << 30,
            }
        }
    }
}

#[cfg(test)]
impl Size {
    /// Small enough for the unit tests' debug builds.
    pub(crate) fn tiny() -> Size {
        Size {
            quick: true,
            files: 200,
            appends: 200,
            varmail_files: 20,
            varmail_loops: 20,
            personality_files: [20, 20, 20],
            personality_loops: 20,
            postmark_transactions: 100,
            large_file_bytes: 4 << 20,
            device_bytes: 128 << 20,
        }
    }
}

/// What a workload does to files: a handle is an index the target keeps.
pub(crate) trait Files {
    fn mkdir(&mut self, path: &str) -> Outcome;
    fn create(&mut self, path: &str) -> Outcome<u64>;
    fn open(&mut self, path: &str) -> Outcome<u64>;
    fn write_at(&mut self, handle: u64, offset: u64, data: &[u8]) -> Outcome;
    fn size(&mut self, handle: u64) -> Outcome<u64>;
    /// Writes `data` at the end of the file, as filebench's appendfile and
    /// appendfilerand do: a seek to the end and a write, with no stat.
    /// Where a target keeps no file position (the engine, and littlefs
    /// here, which opens by path at every call), its size and a write at
    /// it.
    fn append(&mut self, handle: u64, data: &[u8]) -> Outcome {
        let end = self.size(handle)?;
        self.write_at(handle, end, data)
    }
    /// What stdio does at a stream's first read or write: an fstat, to
    /// size its buffer (PostMark opens with stdio). Only where the
    /// target's own reads and appends make no stat (a mounted target): the
    /// engine's and littlefs's ask for the size already.
    fn stat_for_stdio(&mut self, _handle: u64) -> Outcome {
        Ok(())
    }
    fn read_all(&mut self, handle: u64) -> Outcome<usize>;
    fn fsync(&mut self, handle: u64) -> Outcome;
    fn close(&mut self, handle: u64) -> Outcome;
    fn unlink(&mut self, path: &str) -> Outcome;
    /// Everything durable (outside the phase's time).
    fn sync_all(&mut self) -> Outcome;
    /// Everything this target holds durable, and nothing else the host
    /// has: the sync filebench's loops time apart (`sync_after_seconds`).
    fn sync_mount(&mut self) -> Outcome {
        self.sync_all()
    }
    /// A clean unmount and a mount; the pages the mount read.
    fn remount(&mut self) -> Outcome<u64> {
        fail!("this target cannot remount")
    }
    /// A power cut and the mount that recovers; the pages it read.
    fn crash_remount(&mut self) -> Outcome<u64> {
        fail!("this target cannot cut its device's power")
    }
    /// Bytes used and bytes of capacity (statfs: blocks less free ones,
    /// and blocks).
    fn space(&mut self) -> Outcome<(u64, u64)>;
    /// Reads up to `length` bytes at `offset`; the bytes read.
    fn read_at(&mut self, handle: u64, offset: u64, length: usize) -> Outcome<usize>;
    /// Simulated device time so far, where the device model runs in this
    /// process (cheap enough to ask around every operation).
    fn device_time_ns(&mut self) -> Option<u64> {
        None
    }
    /// The memory the file system holds now; what each target counts is
    /// said where it is implemented and in the report.
    fn memory_bytes(&mut self) -> Outcome<Option<u64>> {
        Ok(None)
    }
    /// The target's device counters now (what it has written so far).
    fn counters(&mut self) -> Outcome<Option<Counters>> {
        Ok(None)
    }
    /// Metadata-log pages the engine has programmed so far.
    fn log_pages(&mut self) -> Option<u64> {
        None
    }
    /// FUSE requests the target's daemons have answered so far.
    fn fuse_requests(&mut self) -> Option<u64> {
        None
    }
    /// The mounted directory, where the target is one (several threads
    /// then work in it through std::fs).
    fn root(&self) -> Option<PathBuf> {
        None
    }
}

/// A directory of a mounted file system, through std::fs.
struct DirectoryFiles {
    root: PathBuf,
    open: HashMap<u64, File>,
    next: u64,
    /// Unmounts and mounts again, returning the pages the mount read.
    remount: Option<Box<dyn FnMut() -> Outcome<u64>>>,
    mount_pages: Option<u64>,
    /// The device's counters now (the daemon's, or the loop device's).
    snapshot: Option<Box<dyn FnMut() -> Outcome<Counters>>>,
    /// FUSE requests answered so far, over every daemon of the run.
    requests: Option<Box<dyn FnMut() -> Option<u64>>>,
    /// The file system's memory now (the daemon's heap, or the kernel's
    /// slab growth since the mount).
    memory: Option<Box<dyn FnMut() -> Outcome<u64>>>,
    /// Reused by `read_all`: [`READ_WHOLE_IO_BYTES`].
    read_buffer: Vec<u8>,
}

/// The I/O size of a whole-file read on a mounted target, as filebench's
/// personalities set it (`iosize=1m`).
const READ_WHOLE_IO_BYTES: usize = 1 << 20;

impl DirectoryFiles {
    fn new(
        root: &Path,
        remount: Box<dyn FnMut() -> Outcome<u64>>,
        snapshot: Box<dyn FnMut() -> Outcome<Counters>>,
    ) -> DirectoryFiles {
        DirectoryFiles {
            root: root.to_path_buf(),
            open: HashMap::new(),
            next: 0,
            remount: Some(remount),
            mount_pages: None,
            snapshot: Some(snapshot),
            requests: None,
            memory: None,
            // Zeroed, so its pages stay untouched until a read fills them:
            // a kernel peer's row reports this process's peak memory, and
            // a read touches only as much as the file holds.
            read_buffer: vec![0; READ_WHOLE_IO_BYTES],
        }
    }

    fn keep(&mut self, file: File) -> u64 {
        self.next += 1;
        self.open.insert(self.next, file);
        self.next
    }

    fn file(&self, handle: u64) -> Outcome<&File> {
        open_file(&self.open, handle)
    }
}

/// The open file a handle names: apart from `DirectoryFiles::file` so that
/// `read_all` can hold it beside its buffer, another field.
fn open_file(open: &HashMap<u64, File>, handle: u64) -> Outcome<&File> {
    open.get(&handle).ok_or_else(|| Failure(format!("no open file {handle}")))
}

impl Files for DirectoryFiles {
    fn root(&self) -> Option<PathBuf> {
        Some(self.root.clone())
    }
    fn mkdir(&mut self, path: &str) -> Outcome {
        Ok(std::fs::create_dir(self.root.join(path))?)
    }
    fn create(&mut self, path: &str) -> Outcome<u64> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(self.root.join(path))?;
        Ok(self.keep(file))
    }
    fn open(&mut self, path: &str) -> Outcome<u64> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(self.root.join(path))?;
        Ok(self.keep(file))
    }
    fn write_at(&mut self, handle: u64, offset: u64, data: &[u8]) -> Outcome {
        Ok(self.file(handle)?.write_all_at(data, offset)?)
    }
    fn size(&mut self, handle: u64) -> Outcome<u64> {
        Ok(self.file(handle)?.metadata()?.len())
    }
    fn append(&mut self, handle: u64, data: &[u8]) -> Outcome {
        // lseek(SEEK_END) and write(2), no fstat. Over FUSE the seek asks
        // the kernel for the size alone, which the writeback cache keeps
        // (it still asks the file system once the attribute timeout has
        // passed). An fstat asks for every basic attribute, which the
        // kernel marks stale more often (the blocks at every close and
        // write-back), and its reply clears the inode's no-privileges mark,
        // so the write after it asks for security.capability too
        // (`docs/BENCHMARKS.md`, "the bench's appends and whole-file reads").
        let mut file = self.file(handle)?;
        file.seek(std::io::SeekFrom::End(0))?;
        Ok(file.write_all(data)?)
    }
    fn stat_for_stdio(&mut self, handle: u64) -> Outcome {
        self.file(handle)?.metadata()?;
        Ok(())
    }
    fn read_all(&mut self, handle: u64) -> Outcome<usize> {
        // As filebench's readwholefile: a seek to the start and reads of
        // its I/O size (1 MiB) until the end, with no stat. std's
        // `read_to_end` makes a statx to size its buffer, and over FUSE
        // that was a GETATTR for most whole-file reads.
        let mut file = open_file(&self.open, handle)?;
        let buffer = &mut self.read_buffer;
        file.seek(std::io::SeekFrom::Start(0))?;
        let mut total_bytes = 0;
        loop {
            match file.read(buffer) {
                Ok(0) => return Ok(total_bytes),
                Ok(bytes) => total_bytes += bytes,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    fn fsync(&mut self, handle: u64) -> Outcome {
        Ok(self.file(handle)?.sync_all()?)
    }
    fn close(&mut self, handle: u64) -> Outcome {
        self.open.remove(&handle);
        Ok(())
    }
    fn unlink(&mut self, path: &str) -> Outcome {
        Ok(std::fs::remove_file(self.root.join(path))?)
    }
    fn sync_all(&mut self) -> Outcome {
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
        // sync(2) does not reach a FUSE file system (the kernel sends
        // FUSE_SYNCFS to virtiofs only); an fsync of the mount's root is
        // flintfs's sync there. Without it, what a workload prepared would
        // still be buffered, and written in the measured part. On a kernel
        // peer it is one more directory fsync after sync(2), which also
        // writes back a FUSE image's pages the host holds (with
        // nohost_sync), so the host does not write them in the phase.
        File::open(&self.root)?.sync_all()?;
        Ok(())
    }
    fn sync_mount(&mut self) -> Outcome {
        // syncfs(2) of this mount alone, not sync(2): the timed sync after
        // filebench's loop must not count whatever else the host has dirty.
        // It writes back the kernel's page cache of a FUSE mount too, but
        // does not reach the daemon; the fsync of the root does.
        let root = File::open(&self.root)?;
        // SAFETY: the descriptor is open for the call's duration.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        root.sync_all()?;
        Ok(())
    }
    fn space(&mut self) -> Outcome<(u64, u64)> {
        let path = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes())?;
        // SAFETY: statvfs only writes the structure it is given.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a valid structure.
        if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
            fail!("statvfs {}: {}", self.root.display(), std::io::Error::last_os_error());
        }
        let fragment = stat.f_frsize as u64;
        Ok(((stat.f_blocks as u64 - stat.f_bfree as u64) * fragment, stat.f_blocks as u64 * fragment))
    }
    fn read_at(&mut self, handle: u64, offset: u64, length: usize) -> Outcome<usize> {
        let mut bytes = vec![0u8; length];
        let file = self.file(handle)?;
        let mut done = 0;
        while done < length {
            match file.read_at(&mut bytes[done..], offset + done as u64)? {
                0 => break,
                read => done += read,
            }
        }
        Ok(done)
    }
    fn memory_bytes(&mut self) -> Outcome<Option<u64>> {
        match self.memory.as_mut() {
            Some(memory) => memory().map(Some),
            None => Ok(None),
        }
    }
    fn remount(&mut self) -> Outcome<u64> {
        self.open.clear();
        let Some(remount) = self.remount.as_mut() else { fail!("this target cannot remount") };
        let pages = remount()?;
        self.mount_pages = Some(pages);
        Ok(pages)
    }
    fn counters(&mut self) -> Outcome<Option<Counters>> {
        match self.snapshot.as_mut() {
            Some(snapshot) => snapshot().map(Some),
            None => Ok(None),
        }
    }
    fn fuse_requests(&mut self) -> Option<u64> {
        self.requests.as_mut().and_then(|requests| requests())
    }
}

/// The engine in-process: paths resolved by lookup, a handle holds its
/// inode's reference until closed, as the kernel would.
struct EngineFiles {
    fs: Option<Fs<MemoryFlash>>,
    /// Pages the last remount read (the mount workloads).
    mount_pages: Option<u64>,
    /// What the last recovery did (the recovery workloads).
    recovery: Option<flintfs_core::RecoveryReport>,
    /// This process's heap just before the last mount: the device and
    /// the bench, without the file system.
    heap_before_mount_bytes: usize,
    /// Log pages the mounts before this one wrote: a remount starts the
    /// engine's counters again, and the phase counts across it.
    log_pages_earlier_mounts: u64,
}

fn heap_live_bytes() -> usize {
    crate::HEAP_LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

fn heap_allocations() -> u64 {
    crate::HEAP_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn engine_error(error: flintfs_core::Error) -> Failure {
    Failure(error.to_string())
}

impl EngineFiles {
    fn fs(&mut self) -> &mut Fs<MemoryFlash> {
        self.fs.as_mut().expect("mounted")
    }

    /// The directory holding `path` and the last name.
    fn parent<'a>(&mut self, path: &'a str) -> Outcome<(u64, &'a str)> {
        let (directory, name) = path.rsplit_once('/').unwrap_or(("", path));
        let mut ino = ROOT_INO;
        for part in directory.split('/').filter(|part| !part.is_empty()) {
            let found = self.fs().lookup(ino, part.as_bytes()).map_err(engine_error)?.ino;
            self.fs().forget(found, 1).map_err(engine_error)?;
            ino = found;
        }
        Ok((ino, name))
    }
}

impl Files for EngineFiles {
    fn mkdir(&mut self, path: &str) -> Outcome {
        let (parent, name) = self.parent(path)?;
        let ino = self.fs().mkdir(parent, name.as_bytes(), 0o755, 0, 0).map_err(engine_error)?.ino;
        self.fs().forget(ino, 1).map_err(engine_error)
    }
    fn create(&mut self, path: &str) -> Outcome<u64> {
        let (parent, name) = self.parent(path)?;
        Ok(self.fs().create(parent, name.as_bytes(), 0o644, 0, 0).map_err(engine_error)?.ino)
    }
    fn open(&mut self, path: &str) -> Outcome<u64> {
        let (parent, name) = self.parent(path)?;
        Ok(self.fs().lookup(parent, name.as_bytes()).map_err(engine_error)?.ino)
    }
    fn write_at(&mut self, handle: u64, offset: u64, data: &[u8]) -> Outcome {
        self.fs().write(handle, offset, data).map_err(engine_error)?;
        Ok(())
    }
    fn size(&mut self, handle: u64) -> Outcome<u64> {
        Ok(self.fs().getattr(handle).map_err(engine_error)?.size)
    }
    fn read_all(&mut self, handle: u64) -> Outcome<usize> {
        let size = self.size(handle)?;
        Ok(self.fs().read(handle, 0, size).map_err(engine_error)?.len())
    }
    fn fsync(&mut self, handle: u64) -> Outcome {
        self.fs().fsync(handle, false).map_err(engine_error)
    }
    fn close(&mut self, handle: u64) -> Outcome {
        self.fs().forget(handle, 1).map_err(engine_error)
    }
    fn unlink(&mut self, path: &str) -> Outcome {
        let (parent, name) = self.parent(path)?;
        self.fs().unlink(parent, name.as_bytes()).map_err(engine_error)
    }
    fn sync_all(&mut self) -> Outcome {
        self.fs().sync().map_err(engine_error)
    }
    fn space(&mut self) -> Outcome<(u64, u64)> {
        let stat = self.fs().statfs().map_err(engine_error)?;
        let block = stat.block_size as u64;
        Ok(((stat.blocks - stat.blocks_free) * block, stat.blocks * block))
    }
    fn read_at(&mut self, handle: u64, offset: u64, length: usize) -> Outcome<usize> {
        Ok(self.fs().read(handle, offset, length as u64).map_err(engine_error)?.len())
    }
    fn device_time_ns(&mut self) -> Option<u64> {
        Some(self.fs().device().counters().device_time_ns)
    }
    /// The heap the engine grew by since its mount (its caches, tables
    /// and buffers): the process's heap less what it was before.
    fn memory_bytes(&mut self) -> Outcome<Option<u64>> {
        Ok(Some(heap_live_bytes().saturating_sub(self.heap_before_mount_bytes) as u64))
    }
    fn counters(&mut self) -> Outcome<Option<Counters>> {
        Ok(Some(self.fs().device().counters()))
    }
    fn log_pages(&mut self) -> Option<u64> {
        Some(self.log_pages_earlier_mounts + self.fs().counters().log_pages_written)
    }
    fn remount(&mut self) -> Outcome<u64> {
        let fs = self.fs.take().expect("mounted");
        self.log_pages_earlier_mounts += fs.counters().log_pages_written;
        // The same options (flintfs-ordered stays ordered).
        let options = fs.options().clone();
        let device = fs.unmount().map_err(engine_error)?;
        let clock = flintfs_core::ManualClock::new(1_700_000_000_000_000_000);
        self.heap_before_mount_bytes = heap_live_bytes();
        let (fs, report) = Fs::mount(device, options, Box::new(clock)).map_err(engine_error)?;
        self.fs = Some(fs);
        self.mount_pages = Some(report.pages_read);
        Ok(report.pages_read)
    }
    fn crash_remount(&mut self) -> Outcome<u64> {
        let fs = self.fs.take().expect("mounted");
        self.log_pages_earlier_mounts += fs.counters().log_pages_written;
        let options = fs.options().clone();
        let mut device = fs.into_device();
        device.power_cut(RECOVERY_CUT_SEED)?;
        let clock = flintfs_core::ManualClock::new(1_700_000_000_000_000_000);
        let (fs, report) = Fs::mount(device, options, Box::new(clock)).map_err(engine_error)?;
        self.fs = Some(fs);
        self.mount_pages = Some(report.pages_read);
        self.recovery = report.recovery;
        Ok(report.pages_read)
    }
}

/// The power cut of the recovery workloads.
const RECOVERY_CUT_SEED: u64 = 4;
/// Files created and fsynced after the last checkpoint in the recovery
/// workloads: what the log holds when the power goes.
const RECOVERY_LOGGED_FILES: usize = 200;
/// The device of the recovery workloads (issue 4: a 1 GiB image).
const RECOVERY_DEVICE_BYTES: u64 = 1 << 30;

/// Data to write: half compressible (runs of a byte), half random, as
/// filebench's `dedupgran`/compression settings produce.
pub(crate) fn data(random: &mut Pcg64Mcg, length: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; length];
    let half = length / 2;
    random.fill(&mut bytes[half..]);
    bytes[..half].fill(random.random());
    bytes
}

/// The files of `mount_N` and `recover_N` (N from the workload's name), in
/// the create workload's directories, made durable.
fn make_files(files: &mut dyn Files, workload: &str, prefix: &str) -> Outcome {
    let count: usize = workload[prefix.len()..].parse().map_err(|_| Failure(format!("bad workload {workload}")))?;
    for directory in 0..CREATE_DIRECTORIES {
        files.mkdir(&format!("d{directory:03}"))?;
    }
    for index in 0..count {
        let handle = files.create(&format!("d{:03}/f{index:06}", index % CREATE_DIRECTORIES))?;
        files.close(handle)?;
    }
    files.sync_all()
}

/// Untimed preparation, then the timed phase; returns the operations the
/// timed phase did.
fn run_workload(name: &str, files: &mut dyn Files, size: Size, seed: u64, phase: &mut Phase) -> Outcome<u64> {
    let mut random = Pcg64Mcg::seed_from_u64(seed);
    let file_path = |index: usize| format!("d{:03}/f{index:06}", index % CREATE_DIRECTORIES);
    if name.starts_with("threads_") {
        let Some(root) = files.root() else {
            fail!("{name} runs in process on flintfs (paced, with group commit) or in a mounted directory")
        };
        return crate::bench_threads::run_in_directory(name, &root, files, size, seed, phase);
    }
    match name {
        "create_fsync" | "delete" => {
            for directory in 0..CREATE_DIRECTORIES {
                files.mkdir(&format!("d{directory:03}"))?;
            }
            if name == "delete" {
                for index in 0..size.files {
                    let handle = files.create(&file_path(index))?;
                    files.close(handle)?;
                }
                files.sync_all()?;
            }
            phase.begin(files)?;
            for index in 0..size.files {
                if name == "delete" {
                    files.unlink(&file_path(index))?;
                } else {
                    let handle = files.create(&file_path(index))?;
                    files.fsync(handle)?;
                    files.close(handle)?;
                }
            }
            phase.end();
            Ok(size.files as u64)
        }
        "append_fsync1" | "append_fsync10" | "append_fsync1000" => {
            let every = match name {
                "append_fsync1" => 1,
                "append_fsync10" => 10,
                _ => 1000,
            };
            let handle = files.create("log")?;
            let block = data(&mut random, APPEND_BYTES);
            phase.begin(files)?;
            for index in 0..size.appends {
                files.write_at(handle, (index * APPEND_BYTES) as u64, &block)?;
                if (index + 1) % every == 0 {
                    files.fsync(handle)?;
                }
            }
            phase.end();
            files.close(handle)?;
            Ok(size.appends as u64)
        }
        "varmail" => {
            // filebench's varmail: one directory of 16 KiB files; each loop
            // deletes one, creates one with an append and fsync, appends to
            // another with fsync, reads two whole. 13 flow operations.
            files.mkdir("mail")?;
            let path = |index: usize| format!("mail/m{index:06}");
            let mut next = size.varmail_files;
            let mut live: Vec<usize> = (0..size.varmail_files).collect();
            for &index in &live {
                let handle = files.create(&path(index))?;
                files.write_at(handle, 0, &data(&mut random, 16 << 10))?;
                files.close(handle)?;
            }
            files.sync_all()?;
            phase.begin(files)?;
            for _ in 0..size.varmail_loops {
                let victim = live.swap_remove(random.random_range(0..live.len()));
                files.unlink(&path(victim))?;
                let handle = files.create(&path(next))?;
                files.write_at(handle, 0, &data(&mut random, 16 << 10))?;
                files.fsync(handle)?;
                files.close(handle)?;
                live.push(next);
                next += 1;
                let other = live[random.random_range(0..live.len())];
                let handle = files.open(&path(other))?;
                files.read_all(handle)?;
                files.append(handle, &data(&mut random, 16 << 10))?;
                files.fsync(handle)?;
                files.close(handle)?;
                let handle = files.open(&path(live[random.random_range(0..live.len())]))?;
                files.read_all(handle)?;
                files.close(handle)?;
            }
            phase.end();
            Ok(size.varmail_loops as u64 * 13)
        }
        "fileserver" | "webproxy" | "webserver" => personality(name, files, size, &mut random, phase),
        recover if recover.starts_with("recover_") => {
            // Mount after a power cut, against the number of files: N files
            // checkpointed, then files created and fsynced into the log, then
            // the cut. One operation, the recovery.
            make_files(files, recover, "recover_")?;
            files.mkdir("logged")?;
            for index in 0..RECOVERY_LOGGED_FILES {
                let handle = files.create(&format!("logged/f{index:06}"))?;
                files.write_at(handle, 0, &data(&mut random, APPEND_BYTES))?;
                files.fsync(handle)?;
                files.close(handle)?;
            }
            phase.begin(files)?;
            files.crash_remount()?;
            phase.end();
            for index in 0..RECOVERY_LOGGED_FILES {
                let handle = files.open(&format!("logged/f{index:06}"))?;
                if files.size(handle)? != APPEND_BYTES as u64 {
                    fail!("logged/f{index:06} lost its fsynced bytes in the recovery");
                }
                files.close(handle)?;
            }
            Ok(1)
        }
        mount if mount.starts_with("mount_") => {
            // Mount after a clean unmount, against the number of files
            // (DFFS's instant mount): one operation, the mount.
            make_files(files, mount, "mount_")?;
            phase.begin(files)?;
            files.remount()?;
            phase.end();
            Ok(1)
        }
        "postmark" => postmark(files, size, &mut random, phase),
        "space_half" | "space_random" | "space_usr_share" => space(name, files, size, &mut random, phase),
        staged if crate::bench_staged::is_staged(staged) => crate::bench_staged::run(staged, files, size, seed, phase),
        "large_seq_write" | "large_rand_write" => {
            // RCFFS's table 2: one file much larger than any cache, written
            // in 4 KiB requests, in order or at random block offsets.
            let blocks = size.large_file_bytes / APPEND_BYTES as u64;
            let handle = files.create("large")?;
            let block = data(&mut random, APPEND_BYTES);
            if name == "large_rand_write" {
                // Allocated first, so the timed phase overwrites.
                for index in 0..blocks {
                    files.write_at(handle, index * APPEND_BYTES as u64, &block)?;
                }
                files.fsync(handle)?;
            }
            phase.begin(files)?;
            for index in 0..blocks {
                let at = if name == "large_rand_write" { random.random_range(0..blocks) } else { index };
                files.write_at(handle, at * APPEND_BYTES as u64, &block)?;
            }
            files.fsync(handle)?;
            phase.end();
            files.close(handle)?;
            Ok(blocks)
        }
        _ => fail!("unknown workload {name:?} (known: {})", WORKLOADS.join(", ")),
    }
}

/// A file of a directory tree `width` wide at each level, as filebench
/// lays out `nfiles` with `meandirwidth`.
fn tree_path(root: &str, index: usize, width: usize) -> (String, String) {
    let directory = format!("{root}/d{:04}", index / width);
    (directory.clone(), format!("{directory}/f{index:06}"))
}

/// filebench's fileserver (10,000 files of 128 KiB, 20 per directory:
/// create, write whole, append 16 KiB, read whole, delete, stat; 11 flow
/// operations a loop), webproxy (10,000 files of 16 KiB in one directory:
/// delete, create, append, then five whole reads; 19) and webserver (1,000
/// files of 16 KiB, 20 per directory: ten whole reads and a 16 KiB append
/// to a log; 31).
fn personality(
    name: &str,
    files: &mut dyn Files,
    size: Size,
    random: &mut Pcg64Mcg,
    phase: &mut Phase,
) -> Outcome<u64> {
    let (count, width, file_bytes) = match name {
        "fileserver" => (size.personality_files[0], 20, 128 << 10),
        "webproxy" => (size.personality_files[1], usize::MAX, 16 << 10),
        _ => (size.personality_files[2], 20, 16 << 10),
    };
    files.mkdir(name)?;
    let mut made = std::collections::BTreeSet::new();
    let mut place = |files: &mut dyn Files, index: usize| -> Outcome<String> {
        let (directory, path) = tree_path(name, index, width.min(count.max(1)));
        if made.insert(directory.clone()) {
            files.mkdir(&directory)?;
        }
        Ok(path)
    };
    for index in 0..count {
        let path = place(files, index)?;
        let handle = files.create(&path)?;
        files.write_at(handle, 0, &data(random, file_bytes))?;
        files.close(handle)?;
    }
    let log = if name == "webserver" { Some(files.create(&format!("{name}/log"))?) } else { None };
    files.sync_all()?;
    let mut live: Vec<usize> = (0..count).collect();
    let mut next = count;
    let append = data(random, 16 << 10);
    let read_whole = |files: &mut dyn Files, path: &str| -> Outcome {
        let handle = files.open(path)?;
        files.read_all(handle)?;
        files.close(handle)
    };
    phase.begin(files)?;
    for _ in 0..size.personality_loops {
        match name {
            "fileserver" => {
                let path = place(files, next)?;
                let handle = files.create(&path)?;
                files.write_at(handle, 0, &data(random, file_bytes))?;
                files.close(handle)?;
                live.push(next);
                next += 1;
                let (_, path) = tree_path(name, live[random.random_range(0..live.len())], width);
                let handle = files.open(&path)?;
                files.append(handle, &append)?;
                files.close(handle)?;
                read_whole(files, &tree_path(name, live[random.random_range(0..live.len())], width).1)?;
                let victim = live.swap_remove(random.random_range(0..live.len()));
                files.unlink(&tree_path(name, victim, width).1)?;
                let handle = files.open(&tree_path(name, live[random.random_range(0..live.len())], width).1)?;
                files.size(handle)?;
                files.close(handle)?;
            }
            "webproxy" => {
                let victim = live.swap_remove(random.random_range(0..live.len()));
                files.unlink(&tree_path(name, victim, width.min(count.max(1))).1)?;
                let path = place(files, next)?;
                let handle = files.create(&path)?;
                files.write_at(handle, 0, &append)?;
                files.close(handle)?;
                live.push(next);
                next += 1;
                for _ in 0..5 {
                    let pick = live[random.random_range(0..live.len())];
                    read_whole(files, &tree_path(name, pick, width.min(count.max(1))).1)?;
                }
            }
            _ => {
                for _ in 0..10 {
                    read_whole(files, &tree_path(name, random.random_range(0..count), width).1)?;
                }
                let log = log.expect("the webserver's log");
                files.append(log, &append)?;
            }
        }
    }
    phase.end();
    if let Some(log) = log {
        files.close(log)?;
    }
    let ops = size.personality_loops as u64
        * match name {
            "fileserver" => 11,
            "webproxy" => 19,
            _ => 31,
        };
    // filebench times the loop alone, and so does the row's rate. A kernel
    // peer's page cache holds what the loop wrote (its dirty limits are
    // gigabytes on a large host) and writes it back after the phase, where
    // flintfs's bounded data buffer programs most of it within the phase.
    // The sync that follows, timed, says what making the loop's writes
    // durable costs each target, beside the row's rate. The row's FUSE
    // requests are the loop's alone, as its seconds are.
    phase.fuse_requests_at_end = files.fuse_requests();
    let synced = Instant::now();
    files.sync_mount()?;
    let sync_seconds = synced.elapsed().as_secs_f64();
    phase.fields.push(("sync_after_seconds".into(), json!(sync_seconds)));
    phase.fields.push(("ops_per_s_with_sync".into(), json!(ops as f64 / (phase.seconds + sync_seconds).max(1e-9))));
    Ok(ops)
}

/// Files of the space workloads' fileserver sets: the fileserver's 128 KiB
/// files, at most this many (256 MiB), so the set fits every peer's device.
const SPACE_FILES_MAX: usize = 2_000;
/// Bytes of `/usr/share` the copy takes, in the order a sorted walk finds
/// its regular files: quick and full.
const SPACE_TREE_BYTES: [u64; 2] = [64 << 20, 256 << 20];
/// The tree the copy workload takes: text, binaries, already-compressed
/// files, as a system's is.
const SPACE_TREE: &str = "/usr/share";

/// RCFFS's space occupied (its table 1): a set of files written and
/// synced, with the space the file system's statfs says it took beside the
/// bytes written. `space_half`: the fileserver set, each file half a byte
/// repeated and half random (the floor is 0.5x); `space_random`: the same
/// files all random (nothing to gain: the cost of trying); `space_usr_share`:
/// a copy of `/usr/share` as it is on this machine. One operation a file.
fn space(name: &str, files: &mut dyn Files, size: Size, random: &mut Pcg64Mcg, phase: &mut Phase) -> Outcome<u64> {
    files.mkdir("space")?;
    let sources: Vec<(String, Option<PathBuf>, u64)> = if name == "space_usr_share" {
        let budget = SPACE_TREE_BYTES[usize::from(!size.quick)];
        let mut found = Vec::new();
        let mut total = 0;
        tree_files(Path::new(SPACE_TREE), &mut found)?;
        found.sort();
        let mut taken = Vec::new();
        for path in found {
            let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
            let relative = path.strip_prefix(SPACE_TREE).expect("under the tree");
            let Some(relative) = relative.to_str() else { continue };
            if total + metadata.len() > budget {
                break;
            }
            total += metadata.len();
            taken.push((relative.to_string(), Some(path.clone()), metadata.len()));
        }
        taken
    } else {
        let count = size.personality_files[0].min(SPACE_FILES_MAX);
        (0..count).map(|index| (format!("d{:02}/f{index:06}", index % 20), None, 128 << 10)).collect()
    };
    let mut made = std::collections::BTreeSet::new();
    files.sync_all()?;
    let (used_before, _) = files.space()?;
    phase.begin(files)?;
    let mut raw_bytes = 0u64;
    for (relative, source, length) in &sources {
        // Each directory on the way, once.
        let mut at = String::from("space");
        for part in relative.split('/').rev().skip(1).collect::<Vec<_>>().into_iter().rev() {
            at = format!("{at}/{part}");
            if made.insert(at.clone()) {
                files.mkdir(&at)?;
            }
        }
        let bytes = match source {
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => bytes,
                Err(_) => continue,
            },
            None if name == "space_half" => data(random, *length as usize),
            None => {
                let mut bytes = vec![0u8; *length as usize];
                random.fill(&mut bytes[..]);
                bytes
            }
        };
        let handle = files.create(&format!("space/{relative}"))?;
        files.write_at(handle, 0, &bytes)?;
        files.close(handle)?;
        raw_bytes += bytes.len() as u64;
    }
    files.sync_all()?;
    phase.end();
    let (used_after, _) = files.space()?;
    let used = used_after.saturating_sub(used_before);
    phase.fields.push(("raw_bytes".into(), json!(raw_bytes)));
    phase.fields.push(("space_used_bytes".into(), json!(used)));
    phase.fields.push(("space_ratio".into(), json!(used as f64 / raw_bytes.max(1) as f64)));
    Ok(sources.len() as u64)
}

/// Every regular file below `directory` (symbolic links are not followed).
fn tree_files(directory: &Path, found: &mut Vec<PathBuf>) -> Outcome {
    let Ok(entries) = std::fs::read_dir(directory) else { return Ok(()) };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            tree_files(&entry.path(), found)?;
        } else if kind.is_file() {
            found.push(entry.path());
        }
    }
    Ok(())
}

/// PostMark (Katcher, 1997) as RCFFS and DFFS ran it: 1000 files of 500 to
/// 10,000 bytes, then transactions that each create or delete a file and
/// read or append to one; then every file deleted. An operation is one
/// half of a transaction.
fn postmark(files: &mut dyn Files, size: Size, random: &mut Pcg64Mcg, phase: &mut Phase) -> Outcome<u64> {
    const FILES: usize = 1000;
    files.mkdir("pm")?;
    let path = |index: usize| format!("pm/p{index:06}");
    let mut live: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut create = |files: &mut dyn Files, random: &mut Pcg64Mcg, live: &mut Vec<usize>| -> Outcome {
        let handle = files.create(&path(next))?;
        let length = random.random_range(500..=10_000);
        files.write_at(handle, 0, &data(random, length))?;
        files.close(handle)?;
        live.push(next);
        next += 1;
        Ok(())
    };
    for _ in 0..FILES {
        create(files, random, &mut live)?;
    }
    phase.begin(files)?;
    for _ in 0..size.postmark_transactions {
        if random.random_bool(0.5) || live.len() < 2 {
            create(files, random, &mut live)?;
        } else {
            let victim = live.swap_remove(random.random_range(0..live.len()));
            files.unlink(&path(victim))?;
        }
        let pick = path(live[random.random_range(0..live.len())]);
        let handle = files.open(&pick)?;
        // PostMark opens with stdio (fopen) by default, and stdio stats the
        // file to size its buffer: a stat, then the reads or the append.
        files.stat_for_stdio(handle)?;
        if random.random_bool(0.5) {
            files.read_all(handle)?;
        } else {
            let length = random.random_range(500..=10_000);
            files.append(handle, &data(random, length))?;
        }
        files.close(handle)?;
    }
    for victim in live.drain(..) {
        files.unlink(&path(victim))?;
    }
    phase.end();
    Ok(size.postmark_transactions as u64 * 2)
}

/// The measured part of a workload: its host time, and the device (or
/// block device) counters when it began, so setup is left out.
#[derive(Default)]
pub(crate) struct Phase {
    started: Option<Instant>,
    pub seconds: f64,
    pub at_start: Option<Counters>,
    /// The engine's log pages written before the measured phase.
    pub log_pages_at_start: Option<u64>,
    /// FUSE requests answered before the measured phase.
    pub fuse_requests_at_start: Option<u64>,
    /// FUSE requests answered by its end, where a workload does untimed
    /// work after it that makes requests (filebench's timed sync).
    pub fuse_requests_at_end: Option<u64>,
    /// A workload's own figures, added to its row.
    pub fields: Vec<(String, Value)>,
    /// This process's heap allocations ([`crate::HEAP_ALLOCATIONS`]) at
    /// the phase's start and, once [`Phase::end`] has run, at its end (a
    /// workload that sums timed pieces itself, as the staged directory
    /// workload does, never calls it, and its row has no count).
    pub heap_allocations_at_start: u64,
    pub heap_allocations_at_end: Option<u64>,
    /// The host's CPU time (all CPUs, in its ticks) and of it the time
    /// the hypervisor stole, at the phase's start.
    cpu_ticks_at_start: Option<CpuTicks>,
}

/// The whole machine's CPU time and the part of it stolen, in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuTicks {
    total: u64,
    steal: u64,
}

/// The first line of /proc/stat ("cpu  user nice system idle iowait irq
/// softirq steal guest guest_nice"); None where it cannot be read. Guest
/// time is counted within user time already, so it is left out.
fn parse_cpu_ticks(stat: &str) -> Option<CpuTicks> {
    let line = stat.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields.take(8).map(|field| field.parse().ok()).collect::<Option<_>>()?;
    (ticks.len() == 8).then(|| CpuTicks { total: ticks.iter().sum(), steal: ticks[7] })
}

fn cpu_ticks() -> Option<CpuTicks> {
    parse_cpu_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Percent of the machine's CPU time the hypervisor took between two
/// readings: on a shared host, the noise under every rate measured then.
fn steal_percent(start: CpuTicks, end: CpuTicks) -> Option<f64> {
    let total = end.total.checked_sub(start.total)?;
    let steal = end.steal.checked_sub(start.steal)?;
    (total > 0).then(|| steal as f64 * 100.0 / total as f64)
}

impl Phase {
    /// Counters first (a FUSE target asks its daemon), then the clock.
    pub(crate) fn begin(&mut self, files: &mut dyn Files) -> Outcome {
        self.at_start = files.counters()?;
        self.log_pages_at_start = files.log_pages();
        self.fuse_requests_at_start = files.fuse_requests();
        self.heap_allocations_at_start = heap_allocations();
        self.cpu_ticks_at_start = cpu_ticks();
        // Recording starts before the clock, and stops after it (`end`), so
        // the writes to perf's FIFO are not timed.
        perf_control("enable");
        self.started = Some(Instant::now());
        Ok(())
    }

    pub(crate) fn end(&mut self) {
        self.heap_allocations_at_end = Some(heap_allocations());
        if let Some(started) = self.started {
            self.seconds = started.elapsed().as_secs_f64();
        }
        if let Some(percent) =
            self.cpu_ticks_at_start.zip(cpu_ticks()).and_then(|(start, end)| steal_percent(start, end))
        {
            self.fields.push(("host_steal_percent".into(), json!(percent)));
        }
        perf_control("disable");
    }
}

/// Runs a workload; its measured phase.
pub(crate) fn timed_workload(workload: &str, files: &mut dyn Files, size: Size, seed: u64) -> (Outcome<u64>, Phase) {
    let mut phase = Phase::default();
    let ops = run_workload(workload, files, size, seed, &mut phase);
    (ops, phase)
}

/// A workload's own figures, into its row.
pub(crate) fn add_fields(value: &mut Value, phase: &Phase) {
    for (name, field) in &phase.fields {
        value[name.as_str()] = field.clone();
    }
}

/// The kernel's slab memory now (dentries, inodes and the file systems'
/// own caches live there), from /proc/meminfo.
fn slab_bytes() -> Outcome<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let line = text.lines().find(|line| line.starts_with("Slab:")).ok_or("/proc/meminfo has no Slab line")?;
    let kib: u64 = line.split_whitespace().nth(1).and_then(|number| number.parse().ok()).ok_or("bad Slab line")?;
    Ok(kib * 1024)
}

/// One row of results.
pub(crate) fn row(workload: &str, target: &str, ops: u64, seconds: f64, programmed: Option<(u64, u64, u64)>) -> Value {
    let (bytes, pages, erases) = programmed.unwrap_or((0, 0, 0));
    json!({
        "workload": workload,
        "target": target,
        "ops": ops,
        "ops_per_s": ops as f64 / seconds.max(1e-9),
        "bytes_per_op": bytes as f64 / ops.max(1) as f64,
        "pages_programmed": programmed.map(|_| pages),
        "erases": programmed.map(|_| erases),
    })
}

/// The device (or loop device) a workload runs on: the recovery
/// workloads' is issue 4's 1 GiB; the near-full workloads fill the quick
/// size's, so that filling it three times stays short at full size too.
pub(crate) fn device_bytes(size: Size, workload: &str) -> u64 {
    if workload.starts_with("recover_") {
        RECOVERY_DEVICE_BYTES
    } else if workload.starts_with("near_full_") {
        NEAR_FULL_DEVICE_BYTES
    } else {
        size.device_bytes
    }
}

/// The device of the near-full workloads (xfs needs 300 MiB at least).
const NEAR_FULL_DEVICE_BYTES: u64 = 512 << 20;

/// An emulated device for an in-process run, its memory touched first
/// (`FlashEmulator::prefault_memory`): the host time measured is then the
/// engine's and the emulator's copies, not the kernel's page faults and
/// zeroing of the emulator's memory at each page's first write, which a
/// real device's host never pays (they were a fifth to a third of
/// fileserver's host time). The configuration line says so.
/// `FLINTFS_BENCH_PAGE_FAULTS=1` leaves the faults in, to measure them.
pub(crate) fn bench_device(geometry: Geometry, options: DeviceOptions) -> Outcome<MemoryFlash> {
    let mut device = MemoryFlash::memory(geometry, options)?;
    if !page_faults_measured() {
        device.prefault_memory();
    }
    Ok(device)
}

/// Profiles the measured phase alone: with `FLINTFS_BENCH_PERF_CONTROL`
/// naming the FIFO of `perf record -D -1 --control fifo:PATH`, the phase's
/// start enables the recording and its end disables it, so a profile
/// leaves out the setup (fileserver's fill is two thirds of its run). A
/// FIFO no one reads would block the run, so perf must hold it open.
/// Never inlined: callgrind's `--dump-before` (README) finds the measured
/// phase by the calls to it.
#[inline(never)]
fn perf_control(command: &str) {
    use std::io::Write;
    if let Some(path) = std::env::var_os("FLINTFS_BENCH_PERF_CONTROL") {
        // Never created: a mistyped path is an error, not a file that
        // quietly profiles nothing.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut fifo| fifo.write_all(format!("{command}\n").as_bytes()));
        if let Err(error) = written {
            eprintln!("FLINTFS_BENCH_PERF_CONTROL {}: {error}", std::path::Path::new(&path).display());
        }
    }
}

fn page_faults_measured() -> bool {
    std::env::var("FLINTFS_BENCH_PAGE_FAULTS").is_ok_and(|value| value == "1")
}

/// The workload on the in-process engine, with fsync in `fsync_mode`.
pub(crate) fn run_engine(workload: &str, target: &str, fsync_mode: FsyncMode, size: Size, seed: u64) -> Outcome<Value> {
    let mut geometry = Geometry::with_size_bytes(device_bytes(size, workload));
    if target == "flintfs-nvm" {
        geometry.nvm_size_bytes = BENCH_NVM_BYTES;
    }
    let options = DeviceOptions::default();
    let timing = options.timing;
    let device = bench_device(geometry, options)?;
    let clock = flintfs_core::ManualClock::new(1_700_000_000_000_000_000);
    let device = Fs::format(device, &MkfsOptions::new([9; 16], 0), Box::new(clock.clone())).map_err(engine_error)?;
    let fs_options = FsOptions { fsync_mode, compression: compression_of(target), ..FsOptions::default() };
    let heap_before_mount_bytes = heap_live_bytes();
    let (fs, mount) = Fs::mount(device, fs_options, Box::new(clock.clone())).map_err(engine_error)?;
    // Each NVM word's writes before the workload (mkfs and the mount),
    // left out of what its rate projects over a device's life.
    let nvm_words_at_mount = fs.device().nvm_word_writes().to_vec();
    let mut files = EngineFiles {
        fs: Some(fs),
        mount_pages: None,
        recovery: None,
        heap_before_mount_bytes,
        log_pages_earlier_mounts: 0,
    };
    let (ops, phase) = timed_workload(workload, &mut files, size, seed);
    let (ops, seconds) = (ops?, phase.seconds);
    // The log pages of the measured phase: what fsync itself programmed,
    // apart from the checkpoints that truncate the log.
    let log_pages = files.log_pages().zip(phase.log_pages_at_start).map(|(now, before)| now - before);
    let fs = files.fs.take().expect("mounted");
    let engine_counters = fs.counters().clone();
    let cleaner_counters = fs.cleaner_counters().clone();
    let device = fs.unmount().map_err(engine_error)?;
    // From the measured phase's start to after the unmount checkpoint.
    let counters = device.counters().since(&phase.at_start.unwrap_or_default());
    let mut value = row(
        workload,
        target,
        ops,
        seconds,
        Some((
            counters.data_bytes_programmed + counters.oob_bytes_programmed,
            counters.pages_programmed,
            counters.erases,
        )),
    );
    add_fields(&mut value, &phase);
    value["device_time_ns_per_op"] = json!(counters.device_time_ns as f64 / ops.max(1) as f64);
    // The engine's, the emulator's and the workload loop's own (the paths
    // it formats) together: the loop's share is the same for every build.
    if let Some(end) = phase.heap_allocations_at_end {
        let allocations = end.saturating_sub(phase.heap_allocations_at_start);
        value["heap_allocations_per_op"] = json!(allocations as f64 / ops.max(1) as f64);
    }
    value["mount_pages_read"] = json!(files.mount_pages.unwrap_or(mount.pages_read));
    // What issue 4's targets are measured against: a page with its spare
    // area, and one program plus one flush of the timing model.
    value["page_bytes"] = json!(geometry.page_size_bytes + geometry.oob_size_bytes);
    value["program_and_flush_ns"] = json!(timing.program_ns + timing.flush_ns);
    value["log_pages_programmed"] = json!(log_pages);
    // Since the last mount, the unmount's checkpoint not included.
    value["checkpoints"] = json!(engine_counters.checkpoints);
    value["node_pages_written"] = json!(engine_counters.node_pages_written);
    // What the cleaner did since the mount: its share of the pages
    // programmed, and whether any operation had to clean whole zones
    // (the steps fell behind: the tail-latency targets' enemy).
    value["cleaner_pages_read"] = json!(cleaner_counters.pages_read);
    value["cleaner_data_pages_moved"] = json!(cleaner_counters.data_pages_moved);
    value["cleaner_chunks_moved"] = json!(cleaner_counters.chunks_moved);
    value["cleaner_nodes_moved"] = json!(cleaner_counters.nodes_moved);
    value["cleaner_steps"] = json!(cleaner_counters.steps);
    value["cleaner_whole_zone_cleanings"] = json!(cleaner_counters.whole_zone_cleanings_for_space);
    value["cleaner_checkpoints_for_buffered"] = json!(cleaner_counters.checkpoints_for_buffered);
    value["cleaner_checkpoints_to_release"] = json!(cleaner_counters.checkpoints_to_release);
    if geometry.nvm_size_bytes > 0 {
        add_nvm_fields(&mut value, &counters, ops, device.nvm_hottest_word(), geometry.nvm_size_bytes);
        add_levelled_wear(&mut value, device.nvm_word_writes(), &nvm_words_at_mount, geometry.nvm_size_bytes, ops);
    }
    if workload.starts_with("append_fsync") {
        // The appended data as flash stores it: a page with its spare area
        // per 4 KiB block, and that page's share of the parity pages (k in
        // each erase block, and the zone's parity blocks).
        let parity = MkfsOptions::new([0; 16], 0).parity_for(&geometry);
        let zone_pages = f64::from(geometry.block_pages * geometry.zone_blocks);
        let data_pages = f64::from(
            (geometry.block_pages - parity.block_parity_pages) * (geometry.zone_blocks - parity.zone_parity_blocks),
        );
        let page_bytes = f64::from(geometry.page_size_bytes + geometry.oob_size_bytes);
        let blocks_per_op = APPEND_BYTES.div_ceil(geometry.page_size_bytes as usize) as f64;
        value["data_floor_bytes_per_op"] = json!(blocks_per_op * page_bytes * zone_pages / data_pages);
    }
    if let Some(recovery) = &files.recovery {
        // Of the pages the recovery read, those of the log (and the first
        // page of each zone written since the checkpoint); the rest are
        // the checkpoint's, the tree's root and what replay looked up.
        value["recovery_log_pages_read"] = json!(recovery.log_pages_read);
        value["recovery_records_replayed"] = json!(recovery.records_replayed);
        value["recovery_unindexed_segments"] = json!(flintfs_core::UNINDEXED_SEGMENTS_DEFAULT);
    }
    Ok(value)
}

/// NVM traffic per operation, and the hottest 8-byte word's writes per
/// million operations beside what phase-change memory endures.
fn add_nvm_fields(value: &mut Value, counters: &Counters, ops: u64, hottest: Option<(u64, u64)>, nvm_bytes: u64) {
    let ops = ops.max(1) as f64;
    value["nvm_size_bytes"] = json!(nvm_bytes);
    value["nvm_bytes_per_op"] = json!(counters.nvm_bytes_written as f64 / ops);
    value["nvm_persists_per_op"] = json!(counters.nvm_persists as f64 / ops);
    if let Some((offset, writes)) = hottest {
        value["nvm_hottest_word_offset"] = json!(offset);
        value["nvm_hottest_word_writes_per_million_ops"] = json!(writes as f64 * 1e6 / ops);
    }
}

/// Where NVM wear ends once the start-gap levelling (`docs/FORMAT.md`, "NVM
/// wear levelling") has moved every logical line past every physical one:
/// a physical word then takes the average, over the levelled lines, of the
/// writes at its offset in a line (a line moves whole, so offsets keep
/// their own averages), and a ring word the ring's average. Measured from
/// this run's writes after the mount, per million operations; and the
/// years to PCM's 1e8 writes a word at this run's rate, nonstop.
fn add_levelled_wear(value: &mut Value, words: &[u32], at_mount: &[u32], nvm_bytes: u64, ops: u64) {
    let Some(layout) = flintfs_format::NvmWearLayout::for_region(nvm_bytes) else { return };
    if words.is_empty() {
        return;
    }
    let delta = |word: usize| u64::from(words[word]) - u64::from(at_mount.get(word).copied().unwrap_or(0));
    let ring_words = layout.ring_records as usize;
    let ring_mean = (0..ring_words).map(delta).sum::<u64>() as f64 / ring_words as f64;
    let words_per_line = (flintfs_format::NVM_WEAR_LINE_BYTES / 8) as usize;
    let lines = layout.lines as usize + 1;
    let offset_mean_max = (0..words_per_line)
        .map(|offset| (0..lines).map(|line| delta(ring_words + line * words_per_line + offset)).sum::<u64>())
        .max()
        .unwrap_or(0) as f64
        / lines as f64;
    let region_mean = (0..ring_words + lines * words_per_line).map(delta).sum::<u64>() as f64
        / (ring_words + lines * words_per_line) as f64;
    let ops = ops.max(1) as f64;
    let levelled = offset_mean_max.max(ring_mean) * 1e6 / ops;
    value["nvm_levelled_hottest_word_writes_per_million_ops"] = json!(levelled);
    value["nvm_region_mean_word_writes_per_million_ops"] = json!(region_mean * 1e6 / ops);
    if let Some(ops_per_s) = value["ops_per_s"].as_f64() {
        if levelled > 0.0 {
            const SECONDS_PER_YEAR: f64 = 365.25 * 24.0 * 3600.0;
            value["nvm_levelled_life_years"] = json!(1e8 / (levelled * 1e-6 * ops_per_s) / SECONDS_PER_YEAR);
        }
    }
}

/// A process's `field` of /proc/PID/status, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Peak resident memory.
fn rss_of(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

/// Resident memory now.
fn resident_of(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The workload on a FUSE mount of an image.
/// Whether the kernel forbids io_uring to this process
/// (`kernel.io_uring_disabled`: 1 allows only a group, 2 nobody).
fn io_uring_forbidden() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").is_ok_and(|value| value.trim() != "0")
}

/// The fuse module's switch for its io_uring transport.
pub(crate) const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// More `-o` options for every FUSE mount of flintfs the bench makes, from
/// `FLINTFS_BENCH_MOUNT_OPTIONS` (for instance `nowriteback_cache`, to
/// measure a default against its alternative on the same machine). The
/// configuration line says when it is set.
fn extra_mount_options() -> Option<String> {
    std::env::var("FLINTFS_BENCH_MOUNT_OPTIONS").ok().filter(|options| !options.is_empty())
}

/// A switch `name` (or `noname`) in the extra mount options: the last of
/// them wins, as the daemon reads them.
fn extra_mount_switch(name: &str) -> Option<bool> {
    let off = format!("no{name}");
    extra_mount_options()?
        .split(',')
        .map(str::trim)
        .rfind(|option| *option == name || *option == off)
        .map(|option| option == name)
}

/// A FUSE run; `flintfs-uring` mounts with `-o io_uring` (which turns the
/// kernel's switch on), and the switch is put back as it was after.
fn run_fuse(workload: &str, target: &str, size: Size, seed: u64, directory: &Path) -> Outcome<Value> {
    let switch_was = std::fs::read_to_string(ENABLE_URING).ok();
    let result = run_fuse_mounted(workload, target, size, seed, directory);
    if let Some(was) = switch_was {
        let _ = std::fs::write(ENABLE_URING, was.trim());
    }
    result
}

fn run_fuse_mounted(workload: &str, target: &str, size: Size, seed: u64, directory: &Path) -> Outcome<Value> {
    let Some(flintfs) = flintfs_binary() else { fail!("{}", NO_FLINTFS_BINARY) };
    let transport: &[&str] = if target == "flintfs-uring" { &["-o", "io_uring"] } else { &["-o", "noio_uring"] };
    let more_options: Vec<String> =
        extra_mount_options().map(|options| vec!["-o".to_string(), options]).unwrap_or_default();
    let image = directory.join("bench.img");
    let mountpoint = directory.join("mnt");
    std::fs::create_dir_all(&mountpoint)?;
    let nvm_bytes = if target == "flintfs-nvm-fuse" { BENCH_NVM_BYTES } else { 0 };
    // Preallocated, as each kernel peer's loop device has its backing file
    // written in full (`write_backing`): otherwise each first write into
    // the sparse image allocates the host's page cache and blocks, at 0.6
    // to 1.0 GB/s against 2.2 for an overwrite, and that was the writer
    // thread's whole cost in large_rand_write (1.8 s of CPU on 1.2 GB of
    // zeros and pages), which a disk's host never pays.
    let status = Command::new(&flintfs)
        .args(["mkfs", &image.to_string_lossy(), "--size", &device_bytes(size, workload).to_string(), "--force"])
        .args(["--nvm-size", &nvm_bytes.to_string(), "--preallocate"])
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        fail!("mkfs for the FUSE run failed");
    }
    let lifetime = Command::new(&flintfs).arg("stat").arg(&image).arg("--json").output()?;
    let before: Value = serde_json::from_slice(&lifetime.stdout)?;
    // Every mount of the run, the first and the remounts, the same way.
    let mount = {
        let (flintfs, image, mountpoint) = (flintfs.clone(), image.clone(), mountpoint.clone());
        move || {
            Command::new(&flintfs)
                .arg("mount")
                .arg(&image)
                .arg(&mountpoint)
                .args(transport)
                .args(&more_options)
                .status()
        }
    };
    if !mount()?.success() {
        fail!("mount for the FUSE run failed");
    }
    let stat = |target: &Path| -> Outcome<Value> {
        let output = Command::new(&flintfs).arg("stat").arg(target).arg("--json").output()?;
        serde_json::from_slice(&output.stdout).map_err(|error| Failure(format!("stat {}: {error}", target.display())))
    };
    // The image's lifetime counters when the running daemon mounted it: a
    // daemon counts from its mount, so a remount moves this on.
    let at_mount = std::rc::Rc::new(std::cell::RefCell::new(counters_of(&before)?));
    // FUSE requests of the daemons before the running one (a remount
    // starts a new daemon, which counts from zero).
    let requests_earlier = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let live_requests = {
        let (flintfs, mountpoint) = (flintfs.clone(), mountpoint.clone());
        move || -> Option<u64> {
            let output = Command::new(&flintfs).arg("stat").arg(&mountpoint).arg("--json").output().ok()?;
            serde_json::from_slice::<Value>(&output.stdout).ok()?["fuse_requests"].as_u64()
        }
    };
    let remount = {
        let (flintfs, image, mountpoint, mount) = (flintfs.clone(), image.clone(), mountpoint.clone(), mount.clone());
        let at_mount = at_mount.clone();
        let (requests_earlier, live_requests) = (requests_earlier.clone(), live_requests.clone());
        move || -> Outcome<u64> {
            requests_earlier.set(requests_earlier.get() + live_requests().unwrap_or(0));
            if !Command::new("umount").arg(&mountpoint).status()?.success() {
                fail!("umount for a remount failed");
            }
            let output = Command::new(&flintfs).arg("stat").arg(&image).arg("--json").output()?;
            *at_mount.borrow_mut() = counters_of(&serde_json::from_slice(&output.stdout)?)?;
            if !mount()?.success() {
                fail!("mount for a remount failed");
            }
            let output = Command::new(&flintfs).arg("stat").arg(&mountpoint).arg("--json").output()?;
            let live: Value = serde_json::from_slice(&output.stdout)?;
            Ok(live["mount_pages_read"].as_u64().unwrap_or(0))
        }
    };
    // The image's lifetime counters now: those at the daemon's mount and
    // the daemon's since.
    let snapshot = {
        let (flintfs, mountpoint) = (flintfs.clone(), mountpoint.clone());
        move || -> Outcome<Counters> {
            let output = Command::new(&flintfs).arg("stat").arg(&mountpoint).arg("--json").output()?;
            let since_mount = counters_of(&serde_json::from_slice(&output.stdout)?)?;
            Ok(at_mount.borrow().plus(&since_mount))
        }
    };
    let mut files = DirectoryFiles::new(&mountpoint, Box::new(remount), Box::new(snapshot));
    // The daemon's resident memory (the engine, the FUSE session's
    // buffers, the program itself).
    files.memory = Some(daemon_memory(&flintfs, &mountpoint));
    files.requests = Some(Box::new({
        let (requests_earlier, live_requests) = (requests_earlier.clone(), live_requests.clone());
        move || Some(requests_earlier.get() + live_requests()?)
    }));
    let (ops, phase) = timed_workload(workload, &mut files, size, seed);
    let seconds = phase.seconds;
    let remounted_pages = files.mount_pages;
    let requests_at_end = phase.fuse_requests_at_end.or_else(|| files.fuse_requests());
    drop(files);
    // The floor: lookups of names that are not there, one request each.
    let floor = fuse_request_floor(&mountpoint, &live_requests);
    let live = stat(&mountpoint)?;
    let rss = live["pid"].as_u64().and_then(|pid| rss_of(pid as u32));
    // The floor's lookups alone cross the ring on an io_uring mount.
    let ring_requests = live["fuse_ring_requests"].as_u64().unwrap_or(0);
    let status = Command::new("umount").arg(&mountpoint).status()?;
    if !status.success() {
        fail!("umount after the FUSE run failed");
    }
    if target == "flintfs-uring" && ring_requests == 0 {
        fail!("-o io_uring, but every request went by /dev/fuse (the kernel refused the ring)");
    }
    let ops = ops?;
    // From the measured phase's start to after the unmount (its
    // checkpoint included): the image's lifetime counters after, less
    // those before the mount and what the mount did before the phase.
    let after = stat(&image)?;
    let number = |value: &Value, name: &str| value[name].as_u64().unwrap_or(0);
    // The image's lifetime counters when the phase began (at the first
    // mount, for a workload that never began one).
    let at_start = match phase.at_start {
        Some(counters) => counters,
        None => counters_of(&before)?,
    };
    let at_start: std::collections::HashMap<&str, u64> = at_start.fields().into_iter().collect();
    let since = |name: &str| number(&after, name).saturating_sub(at_start.get(name).copied().unwrap_or(0));
    let mut value = row(
        workload,
        target,
        ops,
        seconds,
        Some((
            since("data_bytes_programmed") + since("oob_bytes_programmed"),
            since("pages_programmed"),
            since("erases"),
        )),
    );
    value["device_time_ns_per_op"] = json!(since("device_time_ns") as f64 / ops.max(1) as f64);
    if nvm_bytes > 0 {
        value["nvm_size_bytes"] = json!(nvm_bytes);
        value["nvm_bytes_per_op"] = json!(since("nvm_bytes_written") as f64 / ops.max(1) as f64);
        value["nvm_persists_per_op"] = json!(since("nvm_persists") as f64 / ops.max(1) as f64);
    }
    value["mount_pages_read"] = json!(remounted_pages.unwrap_or(number(&live, "mount_pages_read")));
    value["fuse_transport"] = json!(if ring_requests > 0 { "io_uring" } else { "/dev/fuse" });
    value["peak_rss_bytes"] = json!(rss);
    if let (Some(end), Some(start)) = (requests_at_end, phase.fuse_requests_at_start) {
        let per_op = end.saturating_sub(start) as f64 / ops.max(1) as f64;
        value["fuse_requests_per_op"] = json!(per_op);
        if let Some(floor_us) = floor {
            let floor_ops_per_s = 1e6 / (per_op * floor_us).max(1e-9);
            value["fuse_floor_us"] = json!(floor_us);
            value["fuse_floor_ops_per_s"] = json!(floor_ops_per_s);
            value["of_fuse_floor"] = json!(ops as f64 / seconds.max(1e-9) / floor_ops_per_s);
        }
    }
    add_fields(&mut value, &phase);
    Ok(value)
}

/// A workload on [`crate::bench_floor`]'s file system, which does no work:
/// what the FUSE path costs alone. A remount is a new session over the
/// same files, with the kernel's caches of the old one gone.
fn run_floor(workload: &str, target: &str, size: Size, seed: u64, directory: &Path) -> Outcome<Value> {
    use crate::bench_floor::{FloorMount, Tree};
    use std::sync::atomic::{AtomicU64, Ordering};
    let mountpoint = directory.join("mnt");
    std::fs::create_dir_all(&mountpoint)?;
    let requests = std::sync::Arc::new(AtomicU64::new(0));
    // As the FUSE targets beside it are mounted: the last of
    // writeback_cache and nowriteback_cache in the bench's extra options.
    let writeback_cache = extra_mount_switch("writeback_cache").unwrap_or(true);
    let mounted = FloorMount::mount(&mountpoint, Tree::new(), requests.clone(), writeback_cache)
        .map_err(|error| Failure(format!("mounting the FUSE floor: {error}")))?;
    let mounted = std::rc::Rc::new(std::cell::RefCell::new(Some(mounted)));
    let remount = {
        let (mounted, mountpoint) = (mounted.clone(), mountpoint.clone());
        move || -> Outcome<u64> {
            let Some(old) = mounted.borrow_mut().take() else { fail!("the FUSE floor is not mounted") };
            let (tree, requests) = (old.tree.clone(), old.requests.clone());
            old.unmount().map_err(|error| Failure(format!("unmounting the FUSE floor: {error}")))?;
            let new = FloorMount::mount(&mountpoint, tree, requests, writeback_cache)
                .map_err(|error| Failure(format!("mounting the FUSE floor again: {error}")))?;
            *mounted.borrow_mut() = Some(new);
            Ok(0)
        }
    };
    // Nothing is programmed: the files are memory.
    let snapshot = Box::new(|| -> Outcome<Counters> { Ok(Counters::default()) });
    let mut files = DirectoryFiles::new(&mountpoint, Box::new(remount), snapshot);
    files.requests = Some(Box::new({
        let requests = requests.clone();
        move || Some(requests.load(Ordering::Relaxed))
    }));
    let (ops, phase) = timed_workload(workload, &mut files, size, seed);
    let requests_at_end = phase.fuse_requests_at_end.or_else(|| files.fuse_requests());
    drop(files);
    let unmounted = mounted.borrow_mut().take().map_or(Ok(()), FloorMount::unmount);
    let ops = ops?;
    unmounted.map_err(|error| Failure(format!("unmounting the FUSE floor: {error}")))?;
    let mut value = row(workload, target, ops, phase.seconds, None);
    // Nothing is programmed: no bytes an operation to chart beside the rest.
    value["bytes_per_op"] = Value::Null;
    value["fuse_writeback_cache"] = json!(writeback_cache);
    if let (Some(end), Some(start)) = (requests_at_end, phase.fuse_requests_at_start) {
        value["fuse_requests_per_op"] = json!(end.saturating_sub(start) as f64 / ops.max(1) as f64);
    }
    add_fields(&mut value, &phase);
    Ok(value)
}

/// Lookups a FUSE floor measurement times.
const FUSE_FLOOR_LOOKUPS: u64 = 20_000;

/// The round trip of one FUSE request on the mount at `mountpoint`, in
/// microseconds: [`FUSE_FLOOR_LOOKUPS`] lookups of names that are not
/// there (the kernel keeps no negative entry for them, so each is a
/// LOOKUP request, and the engine's answer is a hash and one cached
/// page). `None` unless the daemon saw one request per lookup.
fn fuse_request_floor(mountpoint: &Path, requests: &impl Fn() -> Option<u64>) -> Option<f64> {
    let before = requests()?;
    let started = Instant::now();
    for index in 0..FUSE_FLOOR_LOOKUPS {
        let missing = std::fs::symlink_metadata(mountpoint.join(format!(".floor-{index}")));
        if missing.is_ok() {
            return None;
        }
    }
    let elapsed = started.elapsed();
    let made = requests()? - before;
    (made == FUSE_FLOOR_LOOKUPS).then(|| elapsed.as_secs_f64() * 1e6 / FUSE_FLOOR_LOOKUPS as f64)
}

/// The resident memory of the daemon serving `mountpoint` (the engine, the
/// FUSE session's buffers, the program itself), read through `stat`.
fn daemon_memory(flintfs: &Path, mountpoint: &Path) -> Box<dyn FnMut() -> Outcome<u64>> {
    let (flintfs, mountpoint) = (flintfs.to_path_buf(), mountpoint.to_path_buf());
    Box::new(move || -> Outcome<u64> {
        let output = Command::new(&flintfs).arg("stat").arg(&mountpoint).arg("--json").output()?;
        let live: Value = serde_json::from_slice(&output.stdout)?;
        let pid = live["pid"].as_u64().ok_or_else(|| Failure("stat: no daemon pid".into()))?;
        resident_of(pid as u32).ok_or_else(|| Failure(format!("no VmRSS for the daemon (pid {pid})")))
    })
}

/// Device counters from `stat --json`.
fn counters_of(value: &Value) -> Outcome<Counters> {
    let values: Vec<u64> = Counters::FIELD_NAMES.iter().map(|name| value[*name].as_u64().unwrap_or(0)).collect();
    Counters::from_array(&values).ok_or_else(|| Failure("stat: counters".into()))
}

/// Sectors written and read by a block device (from /sys/block).
fn block_stat(device: &str) -> Outcome<(u64, u64)> {
    let name = device.trim_start_matches("/dev/");
    let text = std::fs::read_to_string(format!("/sys/block/{name}/stat"))?;
    let fields: Vec<u64> = text.split_whitespace().filter_map(|field| field.parse().ok()).collect();
    if fields.len() < 7 {
        fail!("/sys/block/{name}/stat has {} fields", fields.len());
    }
    Ok((fields[6] * 512, fields[2] * 512))
}

fn run_command(program: &str, arguments: &[&str]) -> Outcome<String> {
    let output = Command::new(program).args(arguments).output().map_err(|error| format!("{program}: {error}"))?;
    if !output.status.success() {
        fail!("{program} {}: {}", arguments.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// A loop device's backing file, written in full (zeros) and synced, as a
/// disk has every block: a sparse file makes each sync that writes into a
/// hole allocate the host's blocks and commit the host's journal, which a
/// disk never does. Measured with ext4 on a 1 GiB loop device, a 4 KiB
/// append and fdatasync took 568 to 637 µs on a sparse file and 476 to 574
/// µs on a written one. flintfs's own image allocates ahead of its writes
/// for the same reason (`docs/DEVICE-IMAGE.md`).
fn write_backing(path: &Path, bytes: u64) -> Outcome<()> {
    const PIECE_BYTES: usize = 4 << 20;
    let file = File::create(path)?;
    let zeros = vec![0u8; PIECE_BYTES];
    let mut offset = 0;
    while offset < bytes {
        let length = (bytes - offset).min(PIECE_BYTES as u64) as usize;
        file.write_all_at(&zeros[..length], offset)?;
        offset += length as u64;
    }
    file.sync_all()?;
    Ok(())
}

/// The workload on a kernel file system on a loop device.
fn run_kernel(workload: &str, target: &str, size: Size, seed: u64, directory: &Path) -> Outcome<Value> {
    let backing = directory.join(format!("{target}.img"));
    if let Err(error) = write_backing(&backing, device_bytes(size, workload)) {
        // A full TMPDIR: leave no partial file of up to the device's size.
        let _ = std::fs::remove_file(&backing);
        return Err(error);
    }
    let loop_device = run_command("losetup", &["--find", "--show", &backing.to_string_lossy()])?;
    let result = (|| -> Outcome<Value> {
        let flintfs = flintfs_binary().unwrap_or_else(|| PathBuf::from("flintfs"));
        let flintfs = flintfs.to_string_lossy().into_owned();
        let block_backend = target == "flintfs-block";
        // No discard at mkfs: on a loop device it punches the backing
        // file's blocks out again (write_backing says why they are written).
        let (mkfs, force): (String, &[&str]) = match target {
            // Inode tables and journal zeroed at mkfs, not by ext4lazyinit
            // in the background of the measured phase (its zeroing reaches
            // the loop device as WRITE_ZEROES, which can punch holes).
            "ext2" | "ext4" => {
                (format!("mkfs.{target}"), &["-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"])
            }
            "btrfs" | "btrfs-zstd" => ("mkfs.btrfs".into(), &["-q", "-f", "-K"]),
            "xfs" => ("mkfs.xfs".into(), &["-q", "-f", "-K"]),
            "flintfs-block" => (flintfs.clone(), &["mkfs", "--backend", "block", "--force", "--quiet"]),
            _ => fail!("unknown target {target}"),
        };
        let mut arguments: Vec<&str> = force.to_vec();
        let inodes = inodes_needed(workload).map(|count| count.to_string());
        if let (Some(inodes), "ext2" | "ext4") = (&inodes, target) {
            arguments.extend(["-N", inodes.as_str()]);
        }
        arguments.push(&loop_device);
        run_command(&mkfs, &arguments)?;
        let mountpoint = directory.join(format!("{target}-mnt"));
        std::fs::create_dir_all(&mountpoint)?;
        // flintfs mounts through its own command (a FUSE daemon); the
        // kernel peers through mount(8). Both unmount with umount(8).
        let mount_with = if block_backend {
            vec![flintfs.clone(), "mount".to_string()]
        } else if matches!(target, "btrfs" | "btrfs-zstd") {
            // No discard (btrfs's default since Linux 6.2 is discard=async),
            // which would punch the backing file's blocks out again. With
            // zstd, every extent compressed, as RCFFS compresses every chunk;
            // the level is zstd's default, 3, as flintfs-zstd's.
            let options = if target == "btrfs-zstd" { "compress-force=zstd,nodiscard" } else { "nodiscard" };
            vec!["mount".to_string(), "-o".to_string(), options.to_string()]
        } else {
            vec!["mount".to_string()]
        };
        let mount = move |device: &str, mountpoint: &str| -> Outcome<String> {
            let mut arguments: Vec<&str> = mount_with[1..].iter().map(String::as_str).collect();
            arguments.extend([device, mountpoint]);
            run_command(&mount_with[0], &arguments)
        };
        let (_, read_before) = block_stat(&loop_device)?;
        mount(&loop_device, &mountpoint.to_string_lossy())?;
        let (written_mounted, read_mounted) = block_stat(&loop_device)?;
        // The slab after the last mount: the kernel's memory for the file
        // system is its growth from there.
        let slab_at_mount = std::rc::Rc::new(std::cell::Cell::new(slab_bytes()?));
        let remount = {
            let (device, mountpoint) = (loop_device.clone(), mountpoint.to_string_lossy().into_owned());
            let slab_at_mount = slab_at_mount.clone();
            let mount = mount.clone();
            move || -> Outcome<u64> {
                run_command("umount", &[&mountpoint])?;
                // Cold: nothing of the file system left in the page cache.
                let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
                let (_, before) = block_stat(&device)?;
                mount(&device, &mountpoint)?;
                let (_, after) = block_stat(&device)?;
                slab_at_mount.set(slab_bytes()?);
                Ok((after - before) / 4096)
            }
        };
        let snapshot = {
            let device = loop_device.clone();
            move || -> Outcome<Counters> {
                let (written, read) = block_stat(&device)?;
                Ok(Counters { data_bytes_programmed: written, pages_read: read / 4096, ..Counters::default() })
            }
        };
        let mut files = DirectoryFiles::new(&mountpoint, Box::new(remount), Box::new(snapshot));
        files.memory = Some(if block_backend {
            daemon_memory(Path::new(&flintfs), &mountpoint)
        } else {
            Box::new(move || Ok(slab_bytes()?.saturating_sub(slab_at_mount.get())))
        });
        let (ops, phase) = timed_workload(workload, &mut files, size, seed);
        let seconds = phase.seconds;
        let written_at_start = phase.at_start.map_or(written_mounted, |counters| counters.data_bytes_programmed);
        let remounted_pages = files.mount_pages;
        drop(files);
        // The daemon's peak memory, for flintfs; a kernel peer's is the
        // workload's process (run_one).
        let daemon_rss = if block_backend {
            let output = Command::new(&flintfs).arg("stat").arg(&mountpoint).arg("--json").output()?;
            let live: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
            live["pid"].as_u64().and_then(|pid| rss_of(pid as u32))
        } else {
            None
        };
        run_command("umount", &[&mountpoint.to_string_lossy()])?;
        let ops = ops?;
        let (written_after, _) = block_stat(&loop_device)?;
        // From the measured phase's start to after the unmount.
        let written = written_after.saturating_sub(written_at_start);
        let mut value = row(workload, target, ops, seconds, Some((written, 0, 0)));
        value["pages_programmed"] = json!(written / 4096);
        value["erases"] = Value::Null;
        value["device_time_ns_per_op"] = Value::Null;
        value["mount_pages_read"] = json!(remounted_pages.unwrap_or((read_mounted - read_before) / 4096));
        // What write_backing is for, checked after the run: the share of
        // the backing file that still has its blocks (1 unless something
        // discarded).
        let backing_metadata = std::fs::metadata(&backing)?;
        value["backing_allocated_fraction"] =
            json!((backing_metadata.blocks() * 512) as f64 / backing_metadata.len().max(1) as f64);
        if daemon_rss.is_some() {
            value["peak_rss_bytes"] = json!(daemon_rss);
        }
        add_fields(&mut value, &phase);
        Ok(value)
    })();
    let _ = run_command("losetup", &["-d", &loop_device]);
    let _ = std::fs::remove_file(&backing);
    result
}

/// Runs one (workload, target) in this process and prints its row.
fn run_one(arguments: &BenchArguments, target: &str) -> Outcome<ExitCode> {
    let size = Size::of(arguments.quick);
    let directory = scratch_directory(std::process::id());
    std::fs::create_dir_all(&directory)?;
    let result = match target {
        "flintfs" if arguments.workload.starts_with("protection_") => {
            crate::bench_protection::run(&arguments.workload, arguments.quick, arguments.seed)
        }
        "flintfs" if arguments.workload.starts_with("threads_") => {
            crate::bench_threads::run(&arguments.workload, size, arguments.seed)
        }
        "flintfs" => run_engine(&arguments.workload, target, FsyncMode::WpCheck, size, arguments.seed),
        "flintfs-ordered" => run_engine(&arguments.workload, target, FsyncMode::Ordered, size, arguments.seed),
        "flintfs-zstd" | "flintfs-none" | "flintfs-nvm" => {
            run_engine(&arguments.workload, target, FsyncMode::WpCheck, size, arguments.seed)
        }
        "flintfs-fuse" if arguments.workload == "fuse_transport" => {
            let row = crate::bench_transport::run(arguments.quick, &directory);
            let _ = std::fs::remove_dir_all(&directory);
            row
        }
        "flintfs-fuse" | "flintfs-uring" | "flintfs-nvm-fuse" => {
            run_fuse(&arguments.workload, target, size, arguments.seed, &directory)
        }
        "flintfs-block" => run_kernel(&arguments.workload, target, size, arguments.seed, &directory),
        "fuse-floor" => run_floor(&arguments.workload, target, size, arguments.seed, &directory),
        "littlefs" => {
            // The quick device is also the near-full workloads' (see device_bytes).
            if arguments.quick || arguments.workload.starts_with("near_full_") {
                crate::bench_littlefs::run::<{ crate::bench_littlefs::QUICK_BLOCKS }>(
                    &arguments.workload,
                    size,
                    arguments.seed,
                )
            } else {
                crate::bench_littlefs::run::<{ crate::bench_littlefs::FULL_BLOCKS }>(
                    &arguments.workload,
                    size,
                    arguments.seed,
                )
            }
        }
        _ => run_kernel(&arguments.workload, target, size, arguments.seed, &directory),
    };
    let _ = std::fs::remove_dir_all(&directory);
    let mut value = result?;
    if value.get("peak_rss_bytes").is_none_or(Value::is_null) {
        value["peak_rss_bytes"] = json!(rss_of(std::process::id()));
    }
    println!("{value}");
    Ok(ExitCode::SUCCESS)
}

const NO_FLINTFS_BINARY: &str =
    "no flintfs binary beside flintfs-bench or on the PATH (build it: cargo build --release -p flintfs-cli)";

/// The `flintfs` command the FUSE target mounts with: `FLINTFS_BIN`, else
/// the one beside this binary (a cargo target directory, or an install),
/// else the PATH's.
fn flintfs_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FLINTFS_BIN") {
        return Some(PathBuf::from(path));
    }
    let beside = std::env::current_exe().ok()?.with_file_name("flintfs");
    if beside.is_file() {
        return Some(beside);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|directory| directory.join("flintfs")).find(|path| path.is_file())
}

/// Why a peer cannot run here, if it cannot.
fn unavailable(target: &str) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match target {
        "flintfs" | "flintfs-ordered" | "flintfs-zstd" | "flintfs-none" | "flintfs-nvm" | "littlefs" => None,
        "flintfs-fuse" | "flintfs-uring" | "flintfs-nvm-fuse" if !Path::new("/dev/fuse").exists() => {
            Some("no /dev/fuse".to_string())
        }
        "flintfs-uring" if !Path::new(ENABLE_URING).exists() => {
            Some("no FUSE over io_uring in this kernel".to_string())
        }
        "flintfs-uring" if io_uring_forbidden() => Some("io_uring is disabled (kernel.io_uring_disabled)".to_string()),
        "flintfs-fuse" | "flintfs-uring" | "flintfs-nvm-fuse" => {
            flintfs_binary().is_none().then(|| NO_FLINTFS_BINARY.to_string())
        }
        "flintfs-block" if !root => Some("the block backend on a loop device needs root".to_string()),
        "fuse-floor" if !Path::new("/dev/fuse").exists() => Some("no /dev/fuse".to_string()),
        // Mounted as flintfs is when root mounts: open to every user.
        "fuse-floor" if !root => Some("the FUSE floor mounts as root mounts flintfs (allow_other)".to_string()),
        "fuse-floor" => None,
        "flintfs-block" if !Path::new("/dev/fuse").exists() => Some("no /dev/fuse".to_string()),
        "flintfs-block" => flintfs_binary().is_none().then(|| NO_FLINTFS_BINARY.to_string()),
        _ if !root => Some("kernel file systems on loop devices need root".to_string()),
        _ => {
            let mkfs = format!("mkfs.{}", target.trim_end_matches("-zstd"));
            let found = std::env::var_os("PATH")
                .map(|paths| std::env::split_paths(&paths).any(|directory| directory.join(&mkfs).exists()))
                .unwrap_or(false);
            (!found).then(|| format!("{mkfs} is not installed"))
        }
    }
}

pub fn bench(arguments: BenchArguments) -> Outcome<ExitCode> {
    if let Some(target) = arguments.target.clone() {
        return run_one(&arguments, &target);
    }
    if let Some(directory) = &arguments.render {
        crate::bench_report::render(directory)?;
        eprintln!("bench: report written again in {}", directory.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut known: Vec<String> = WORKLOADS.iter().map(|name| name.to_string()).collect();
    known.extend(crate::bench_staged::names(file_counts(arguments.quick)));
    known.extend(mount_file_counts(arguments.quick).iter().map(|count| format!("mount_{count}")));
    known.extend(file_counts(arguments.quick).iter().map(|count| format!("recover_{count}")));
    known.extend(crate::bench_protection::LEVELS.iter().map(|level| level.0.to_string()));
    known.extend(crate::bench_threads::names());
    known.push("fuse_transport".to_string());
    let workloads: Vec<&str> = if arguments.workload == "all" {
        known.iter().map(String::as_str).collect()
    } else if arguments.workload == "protection" {
        crate::bench_protection::LEVELS.iter().map(|level| level.0).collect()
    } else if known.contains(&arguments.workload) {
        vec![arguments.workload.as_str()]
    } else {
        fail!("unknown workload {:?} (known: {}, protection, all)", arguments.workload, known.join(", "));
    };
    for peer in &arguments.peers {
        if !TARGETS[FLINTFS_TARGETS..].contains(&peer.as_str()) {
            fail!("unknown peer {peer:?} (known: {})", TARGETS[FLINTFS_TARGETS..].join(", "));
        }
    }
    let targets: Vec<&str> = TARGETS
        .iter()
        .copied()
        .filter(|target| {
            TARGETS[..FLINTFS_TARGETS].contains(target)
                || arguments.peers.iter().any(|peer| peer == target)
                || *target == "btrfs-zstd" && workloads.iter().any(|workload| workload.starts_with("space_"))
        })
        .collect();
    let size = Size::of(arguments.quick);
    let configuration = format!(
        "{} sizes ({} files, {} appends of {} B, varmail {} files x {} loops), device {} MiB, seed {}",
        if arguments.quick { "quick" } else { "full" },
        size.files,
        size.appends,
        APPEND_BYTES,
        size.varmail_files,
        size.varmail_loops,
        size.device_bytes >> 20,
        arguments.seed
    );
    let configuration = if page_faults_measured() {
        format!("{configuration}; in-process devices fault their memory in as they are written")
    } else {
        format!("{configuration}; in-process devices have their memory touched before the run (no page faults in it)")
    };
    let configuration = format!("{configuration}; {}", scratch_storage());
    // Root sets the FUSE mounts' readahead (flintfs's may be changed by
    // the mount options that follow; fuse-floor's is the default always);
    // the kernel peers keep their loop devices' own (2,560 KiB here).
    // SAFETY: geteuid has no preconditions.
    let configuration = if unsafe { libc::geteuid() } == 0 {
        format!(
            "{configuration}; FUSE mounts read ahead {} KiB unless the options say, the kernel peers' devices their own",
            flintfs_fuse::READAHEAD_BYTES_DEFAULT >> 10
        )
    } else {
        format!("{configuration}; FUSE mounts keep the kernel's 128 KiB readahead (not root)")
    };
    let configuration = match extra_mount_options() {
        Some(options) => format!("{configuration}, FUSE mounts with -o {options}"),
        None => configuration,
    };
    eprintln!("bench: {configuration}");
    let started = Instant::now();
    let progress = indicatif::ProgressBar::new((workloads.len() * targets.len()) as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("  {msg:<32} [{bar:32}] {pos}/{len} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for workload in &workloads {
        for target in &targets {
            progress.set_message(format!("{workload} on {target}"));
            if workload.starts_with("protection_") && *target != "flintfs"
                || workload.starts_with("threads_") && !threads_run_on(target)
                || *workload == "fuse_transport" && *target != "flintfs-fuse"
            {
                // Measured in process, where the device's time is the cost model's.
                progress.inc(1);
                continue;
            }
            if workload.starts_with("recover_") && !matches!(*target, "flintfs" | "flintfs-ordered") {
                // A power cut needs the emulated device; the peers' is the host's.
                progress.inc(1);
                continue;
            }
            if *target == "flintfs-ordered" && fsync_free(workload) {
                progress.inc(1);
                continue;
            }
            let named = arguments.peers.iter().any(|peer| peer == target);
            if !named && !runs_by_default(workload, target) {
                progress.inc(1);
                continue;
            }
            if let Some(reason) = unavailable(target) {
                notes.push(format!("{target} skipped: {reason}"));
                progress.inc(1);
                continue;
            }
            // A row of a full run taken while the hypervisor stole much of
            // the host's CPU is taken again (a fresh child, device and
            // mount), and the take that lost the least is kept, with the
            // others' rates beside it: which take is kept depends on the
            // steal only, never on the rate. A quick run (CI's) checks that
            // every row can be taken, not a figure to judge: it takes each
            // once.
            let retakes_max = if arguments.quick { 0 } else { STEAL_RETAKES_MAX };
            let mut takes: Vec<Value> = Vec::new();
            while takes.len() <= retakes_max {
                let mut command = Command::new(std::env::current_exe()?);
                command.args([workload, "--target", target, "--seed", &arguments.seed.to_string()]);
                if arguments.quick {
                    command.arg("--quick");
                }
                let failure = match run_child(command, time_limit(arguments.quick, workload, target))? {
                    Child::Finished(text) => match serde_json::from_str::<Value>(text.trim()) {
                        Ok(value) => {
                            takes.push(value);
                            None
                        }
                        Err(_) => Some(format!("failed: {}", text.trim())),
                    },
                    Child::Failed(text) => Some(format!("failed: {}", text.trim())),
                    Child::TimedOut(limit) => {
                        Some(format!("did not finish within {} s and was stopped: no row", limit.as_secs()))
                    }
                };
                if let Some(failure) = failure {
                    notes.push(format!("{workload} on {target} {failure}"));
                    break;
                }
                if takes.last().is_none_or(|row| !stolen_too_much(row)) {
                    break;
                }
            }
            // A retake that failed leaves the takes before it: the row is
            // kept from them, and the failure's note says what happened.
            if let Some((row, note)) = keep_least_stolen(takes) {
                notes.extend(note.map(|note| format!("{workload} on {target}: {note}")));
                rows.push(row);
            }
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    notes.sort();
    notes.dedup();
    notes.push(
        "Peak RSS of the in-process targets (flintfs, littlefs) includes the emulated device's memory; \
         flintfs-fuse's and flintfs-block's are their daemon's (on an image file; on the block backend on a loop \
         device, whose bytes are counted as the kernel peers' are, from the loop device's sectors written); \
         a kernel peer's is only the workload's process."
            .into(),
    );
    // The last of host_sync and nohost_sync wins, as the daemon reads them.
    let host_sync = extra_mount_switch("host_sync").unwrap_or(true);
    notes.push(if host_sync {
        "The FUSE targets' images sync each flush to the host (host_sync, the mount's default), as a kernel \
         peer's fsync reaches its loop device's backing file, both under the configuration line's directory; the \
         in-process targets' emulator is memory and sleeps none of its device time, so their fsyncs cost host \
         time only."
            .into()
    } else {
        "The FUSE targets' images were mounted with nohost_sync: their fsyncs stay in the host's page cache, \
         where a kernel peer's reach its loop device's backing file."
            .into()
    });
    if let Some(directory) = &arguments.report {
        let header = format!(
            "- command: `flintfs bench {} {}--peers {}`\n- configuration: {configuration}\n- machine: {}\n- date: {}\n\
             - run time: {:.0} s\n",
            arguments.workload,
            if arguments.quick { "--quick " } else { "" },
            arguments.peers.join(","),
            machine(),
            today(),
            started.elapsed().as_secs_f64()
        );
        crate::bench_report::write(directory, &rows, &header, &notes)?;
        eprintln!("bench: report in {}", directory.display());
    }
    if arguments.json {
        println!("{}", Value::Array(rows));
        // The rows alone go to stdout, for a program to read; the notes
        // (failures, retakes, rows not to be judged) to stderr, for the
        // one who ran it.
        for note in &notes {
            eprintln!("note: {note}");
        }
    } else {
        print_table(&rows);
        for note in &notes {
            println!("note: {note}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How long one (workload, target) may run: a peer that degrades badly
/// (littlefs rewriting a file's tail on every random write) gets a note
/// instead of stalling the run.
/// A million files take minutes to create through FUSE or the kernel, so
/// that workload gets longer, except on littlefs, whose directory
/// operations grow with the directory.
fn time_limit(quick: bool, workload: &str, target: &str) -> std::time::Duration {
    let seconds = match (quick, workload, target) {
        (true, _, _) => 60,
        (false, "mount_1000000", target) if target != "littlefs" => 1200,
        (false, _, _) => 300,
    };
    std::time::Duration::from_secs(seconds)
}

/// Workloads that never fsync: `flintfs-ordered` (which only changes
/// fsync) would repeat `flintfs`'s row.
fn fsync_free(workload: &str) -> bool {
    ["delete", "mount_", "ram_", "dir_", "large_seq_read", "large_rand_read", "large_reread", "space_"]
        .iter()
        .any(|prefix| workload.starts_with(prefix))
}

/// A row whose measured phase lost more than this share of the machine's
/// CPU time to the hypervisor is taken again: the FUSE metadata rows
/// halved under 8% to 36% steal, with the same requests and pages.
const STEAL_PERCENT_RETAKE: f64 = 5.0;
/// Takes of one row beyond the first, at most (a host stolen from all
/// along would otherwise triple the run for nothing).
const STEAL_RETAKES_MAX: usize = 2;
const _: () = assert!(STEAL_RETAKES_MAX >= 1 && STEAL_RETAKES_MAX <= 4);

/// Whether `row` was taken under more steal than a judged row may be. A
/// row without the figure (a workload that times pieces itself, or a host
/// without /proc/stat) is taken once.
fn stolen_too_much(row: &Value) -> bool {
    row["host_steal_percent"].as_f64().is_some_and(|percent| percent > STEAL_PERCENT_RETAKE)
}

/// Of the takes of one row, the one whose phase lost the least CPU time
/// to steal (the first among equals; a take without the figure ranks
/// last), with `steal_takes` holding every take's rate and steal in the
/// order taken, and a note for the report when there was more than one
/// take. A kept take still over the bound carries `steal_over_bound`, and
/// the report judges nothing by it. None for no takes.
fn keep_least_stolen(takes: Vec<Value>) -> Option<(Value, Option<String>)> {
    let steal = |row: &Value| row["host_steal_percent"].as_f64().unwrap_or(f64::INFINITY);
    let kept = (0..takes.len()).min_by(|&a, &b| steal(&takes[a]).total_cmp(&steal(&takes[b])))?;
    if takes.len() == 1 {
        return takes.into_iter().next().map(|row| (row, None));
    }
    let summary: Vec<Value> = takes
        .iter()
        .map(|row| json!({ "ops_per_s": row["ops_per_s"], "host_steal_percent": row["host_steal_percent"] }))
        .collect();
    let described: Vec<String> = takes
        .iter()
        .enumerate()
        .map(|(index, row)| {
            format!(
                "{}{} ops/s at {}% steal",
                if index == kept { "kept " } else { "" },
                row["ops_per_s"].as_f64().map_or("-".to_string(), |rate| format!("{rate:.0}")),
                row["host_steal_percent"].as_f64().map_or("-".to_string(), |percent| format!("{percent:.1}"))
            )
        })
        .collect();
    let over_bound = stolen_too_much(&takes[kept]);
    let note = if over_bound {
        format!(
            "taken {} times, every take above {STEAL_PERCENT_RETAKE}% steal ({}): not to be judged",
            takes.len(),
            described.join(", ")
        )
    } else {
        format!("taken {} times for the host's CPU steal ({})", takes.len(), described.join(", "))
    };
    let mut row = takes.into_iter().nth(kept)?;
    if let Some(object) = row.as_object_mut() {
        object.insert("steal_takes".into(), Value::Array(summary));
        if over_bound {
            object.insert("steal_over_bound".into(), json!(true));
        }
    }
    Some((row, Some(note)))
}

enum Child {
    Finished(String),
    Failed(String),
    TimedOut(std::time::Duration),
}

/// Runs a child with a time limit (60 s quick, 300 s full); its stderr
/// passes through.
fn run_child(mut command: Command, limit: std::time::Duration) -> Outcome<Child> {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    // The child's stderr passes through, and its last line is kept for the
    // note of a failed run. A daemon the child started may hold the pipe
    // open, so that line is waited for briefly.
    let stderr = child.stderr.take().expect("piped");
    let (errors_sender, errors) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut last = String::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if !line.trim().is_empty() {
                last = line;
            }
        }
        let _ = errors_sender.send(last);
    });
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let text = reader.join().unwrap_or_default();
            if status.success() {
                return Ok(Child::Finished(text));
            }
            let last = errors.recv_timeout(std::time::Duration::from_secs(2)).unwrap_or_default();
            let last = if last.is_empty() { "(no message)".to_string() } else { last };
            return Ok(Child::Failed(format!("{} {last} ({status})", text.trim())));
        }
        if start.elapsed() > limit {
            let pid = child.id();
            let _ = child.kill();
            let _ = child.wait();
            clean_up_after(&scratch_directory(pid));
            return Ok(Child::TimedOut(limit));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Where the FUSE targets' images and the kernel peers' loop backing
/// files live, in words: in memory, they compare host time with the
/// in-process targets' memory emulator; on a disk, every fsync and
/// writeback of theirs also waits for that disk. `TMPDIR` chooses.
fn scratch_storage() -> String {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let directory = std::env::temp_dir();
    let kind = std::ffi::CString::new(directory.as_os_str().as_encoded_bytes()).ok().and_then(|path| {
        // SAFETY: statfs writes only into the zeroed struct it is given;
        // the path is a valid C string.
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statfs(path.as_ptr(), &mut stat) } == 0).then_some(stat.f_type as i64)
    });
    let place = match kind {
        Some(TMPFS_MAGIC) => "in memory (tmpfs)",
        Some(_) => "on a disk's file system (set TMPDIR=/dev/shm to keep them in memory)",
        None => "on a file system statfs cannot name",
    };
    format!(
        "FUSE images (mkfs --preallocate) and loop devices' backing files (written in full) under {} {place}",
        directory.display()
    )
}

/// A child's scratch directory (images, mount points, loop backing files).
fn scratch_directory(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("flintfs-bench-{pid}"))
}

/// What a stopped child leaves: mounts under its scratch directory,
/// loop devices backed there, the directory.
fn clean_up_after(directory: &Path) {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = directory.to_string_lossy().into_owned();
    for line in table.lines() {
        if let Some(mount_point) = line.split(' ').nth(4).filter(|point| point.starts_with(&prefix)) {
            let _ = Command::new("umount").arg("-l").arg(mount_point).status();
        }
    }
    if let Ok(entries) = std::fs::read_dir(directory) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|extension| extension == "img") {
                if let Ok(listing) = run_command("losetup", &["-j", &path.to_string_lossy()]) {
                    for device in listing.lines().filter_map(|line| line.split(':').next()) {
                        let _ = run_command("losetup", &["-d", device]);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(directory);
}

/// The machine, as a line: CPU model and count, memory, kernel.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |model| model.trim().to_string());
    let cores = cpuinfo.lines().filter(|line| line.starts_with("processor")).count();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| text.lines().next().and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or("?".to_string(), |kib| format!("{:.0} GiB", kib as f64 / 1048576.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{model}, {cores} cores, {memory} memory, Linux {}", kernel.trim())
}

/// Today's date (UTC) from the wall clock, as YYYY-MM-DD.
fn today() -> String {
    let days =
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64)
            / 1_000_000_000
            / 86_400) as i64;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn print_table(rows: &[Value]) {
    println!(
        "{:<17} {:<15} {:>8} {:>11} {:>11} {:>9} {:>7} {:>10} {:>6} {:>9} {:>6}",
        "workload", "target", "ops", "ops/s", "bytes/op", "pages", "erases", "dev ns/op", "mount", "rss MiB", "steal%"
    );
    let number = |value: &Value| value.as_f64().map_or("-".to_string(), |number| format!("{number:.0}"));
    for row in rows {
        println!(
            "{:<17} {:<15} {:>8} {:>11} {:>11} {:>9} {:>7} {:>10} {:>6} {:>9} {:>6}",
            row["workload"].as_str().unwrap_or("?"),
            row["target"].as_str().unwrap_or("?"),
            number(&row["ops"]),
            number(&row["ops_per_s"]),
            number(&row["bytes_per_op"]),
            number(&row["pages_programmed"]),
            number(&row["erases"]),
            number(&row["device_time_ns_per_op"]),
            number(&row["mount_pages_read"]),
            row["peak_rss_bytes"].as_f64().map_or("-".to_string(), |bytes| format!("{:.1}", bytes / 1048576.0)),
            // The host's stolen CPU time in the phase: a rate taken with
            // much of it is noise (docs/BENCHMARKS.md, seventeenth).
            row["host_steal_percent"].as_f64().map_or("-".to_string(), |percent| format!("{percent:.1}")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_take_kept_is_the_least_stolen_whatever_its_rate() {
        let take = |rate: f64, steal: Option<f64>| match steal {
            Some(steal) => json!({ "ops_per_s": rate, "host_steal_percent": steal }),
            None => json!({ "ops_per_s": rate }),
        };
        assert!(keep_least_stolen(Vec::new()).is_none());
        let (row, note) = keep_least_stolen(vec![take(10.0, Some(1.0))]).expect("one take");
        assert_eq!(row, take(10.0, Some(1.0)), "one take is kept as it is");
        assert!(note.is_none());
        assert!(stolen_too_much(&take(10.0, Some(STEAL_PERCENT_RETAKE + 0.1))));
        assert!(!stolen_too_much(&take(10.0, Some(STEAL_PERCENT_RETAKE))));
        assert!(!stolen_too_much(&take(10.0, None)), "no figure: taken once");
        // The fastest take had the most steal: the slower, cleaner one is kept.
        let (row, note) =
            keep_least_stolen(vec![take(900.0, Some(30.0)), take(500.0, Some(2.0)), take(700.0, Some(9.0))])
                .expect("three takes");
        assert_eq!(row["ops_per_s"], json!(500.0));
        assert_eq!(row["steal_takes"].as_array().map(Vec::len), Some(3));
        assert_eq!(row["steal_takes"][0]["ops_per_s"], json!(900.0));
        let note = note.expect("a note for retakes");
        assert!(note.contains("taken 3 times") && note.contains("kept 500 ops/s at 2.0% steal"), "{note}");
        assert!(!note.contains("not to be judged"), "{note}");
        // Every take over the bound: the least stolen, flagged.
        let (row, note) =
            keep_least_stolen(vec![take(100.0, Some(20.0)), take(200.0, Some(12.0)), take(300.0, Some(12.0))])
                .expect("three takes");
        assert_eq!(row["ops_per_s"], json!(200.0), "the first among equals");
        assert!(note.expect("a note").contains("not to be judged"));
        assert_eq!(row["steal_over_bound"], json!(true));
        // A take without the figure ranks after every take with one.
        let (row, note) = keep_least_stolen(vec![take(100.0, None), take(200.0, Some(4.0))]).expect("two takes");
        assert_eq!(row["ops_per_s"], json!(200.0));
        assert!(row.get("steal_over_bound").is_none());
        assert!(note.expect("a note").contains("100 ops/s at -% steal"));
    }

    #[test]
    fn steal_is_the_stolen_share_of_all_cpu_time_between_two_readings() {
        let start = parse_cpu_ticks("cpu  100 0 50 800 10 0 0 40 7 0\ncpu0 1 2 3\n").expect("a cpu line");
        assert_eq!(start, CpuTicks { total: 1000, steal: 40 });
        let end = parse_cpu_ticks("cpu  150 0 80 900 10 0 0 100 9 0\n").expect("a cpu line");
        assert_eq!(steal_percent(start, end), Some(60.0 * 100.0 / 240.0));
        assert_eq!(steal_percent(start, start), None, "no time passed");
        assert_eq!(steal_percent(end, start), None, "a counter that went back");
        for bad in ["", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 2 3 4 5 6 7 x", "intr 5"] {
            assert_eq!(parse_cpu_ticks(bad), None, "{bad:?}");
        }
        let now = cpu_ticks().expect("this machine's /proc/stat");
        assert!(now.total >= now.steal);
    }
}
