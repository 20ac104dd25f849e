//! `mount`, the mount daemon, and the commands that talk to a live mount
//! (`stat`, `powercut`) over its control socket.
//!
//! A background `mount` starts this same binary in the foreground with
//! `--notify`, waits for its "ready" line (or its error), and returns. The
//! daemon holds the image's lock for as long as it runs, so a second mount
//! of the same image is refused, and a mount right after `umount` waits
//! (up to [`IMAGE_WAIT`]) for the old daemon to finish its checkpoint.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use flintfs_core::{FsOptions, FsyncMode};
use flintfs_flash::{Counters, FlashDevice};

use crate::device::{open_device, open_device_to_look, open_device_with, Device};
use flintfs_fuse::{FlintFuse, Shared};

use crate::image::{mount_fs, parse_size, IMAGE_WAIT};
use crate::{fail, runtime_directory, Failure, Outcome};

/// How often the daemon looks for idle time, and how long without a
/// request counts as idle.
const IDLE_PERIOD: Duration = Duration::from_millis(500);
/// How long `powercut` waits for the daemon to be gone.
const DAEMON_EXIT_WAIT: Duration = Duration::from_secs(30);
const READY_LINE: &str = "ready";
/// How long either end of the control socket waits for the other.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Args)]
pub struct MountArguments {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Stay in the foreground.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Options: node_cache=SIZE, data_buffer=SIZE, read_cache=SIZE,
    /// checkpoint_interval=SECONDS, scrub_rate=PAGES (pages a second the
    /// idle-time scrub reads; 0 turns it off), compress=none|lz4|zstd|zstd:LEVEL
    /// (how file blocks are compressed; the image's default, lz4 unless
    /// mkfs --compress said otherwise; a file's user.flintfs.compress
    /// xattr overrides it), faults=PRESET|FILE (aging
    /// flash from the emulator: see mkfs --faults), fault_seed=N,
    /// fsync=wp-check|ordered|unchecked,
    /// nobarrier, nvm_keep (a clean unmount leaves the node pages kept in
    /// NVM there, for the next mount; without it they go home to flash),
    /// readahead=SIZE (the kernel's readahead window for the mount, 4M
    /// unless given, root only; 0 turns readahead off),
    /// nohost_sync (an image's flushes stay in the host's page cache: an
    /// fsync survives the daemon killed, not the host crashing),
    /// allow_other (the default for root), private or
    /// noallow_other (only the mounting user; mount(8) keeps `private` for
    /// itself, so fstab says noallow_other), ro (the engine writes nothing
    /// either: an unclean stop's log is replayed in memory), the kernel's rw, nosuid, suid, nodev, dev,
    /// noexec, exec, noatime, atime, sync, async, dirsync; fstab's
    /// defaults, auto, noauto, nofail, user, users, nouser, _netdev, x-*
    /// and comment=* are accepted and left to mount(8) and systemd.
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// (internal) Print a ready line on stdout once mounted.
    #[arg(long, hide = true)]
    pub notify: bool,
}

/// What `-o` chose.
struct MountOptions {
    fs: FsOptions,
    /// `faults=`: the emulator injects these while mounted.
    faults: Option<String>,
    fault_seed: u64,
    /// Whether users other than the one who mounted may use the mount.
    /// Root mounts a system file system: every user reaches it, as on
    /// ext4, and the kernel checks each one's permissions
    /// (`default_permissions`, always on). A user's own mount stays
    /// private, as FUSE wants unless /etc/fuse.conf says
    /// `user_allow_other`. `-o private` keeps a root mount to root.
    allow_other: bool,
    /// The kernel's own flags, from [`flintfs_fuse::KERNEL_FLAGS`].
    kernel_flags: Vec<String>,
    /// The kernel's writeback cache: on unless `nowriteback_cache`.
    writeback_cache: bool,
    /// FUSE's io_uring transport (flintfs_fuse::ring): by default, used
    /// when the kernel offers it (the fuse module's `enable_uring` on);
    /// `io_uring` turns that switch on first, `noio_uring` stays on
    /// /dev/fuse.
    io_uring: Option<bool>,
    /// An image's flushes reach the host's disk (fdatasync), so an fsync
    /// on the mount survives the host crashing as it would on ext4: on
    /// unless `nohost_sync`, which leaves them in the host's page cache
    /// (safe against a killed daemon only).
    host_sync: bool,
    /// The kernel's readahead window for the mount
    /// ([`flintfs_fuse::set_readahead`]).
    readahead_bytes: u64,
}

/// Options of fstab and mount(8) that mean something to them (or to
/// systemd), not to the file system: accepted, so that an fstab line
/// mounts, and ignored.
pub fn is_mount_program_option(name: &str) -> bool {
    matches!(
        name,
        "defaults" | "auto" | "noauto" | "nofail" | "user" | "users" | "nouser" | "owner" | "group" | "_netdev"
    ) || name.starts_with("x-")
        || name == "comment"
}

/// The fuse module offers io_uring only with its `enable_uring` parameter
/// on (off by default in Linux 6.18). `-o io_uring` asks for it, so root
/// turns it on, and says so; for anyone else the mount says it is off
/// and serves `/dev/fuse`.
fn enable_uring() {
    const PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";
    match std::fs::read_to_string(PARAMETER) {
        Ok(value) if value.trim() == "N" => match std::fs::write(PARAMETER, "Y") {
            Ok(()) => tracing::info!("-o io_uring: turned on {PARAMETER}"),
            Err(error) => tracing::warn!("-o io_uring: {PARAMETER} stays off ({error})"),
        },
        Ok(_) => {}
        Err(error) => tracing::warn!("-o io_uring: this kernel has no {PARAMETER} ({error})"),
    }
}

fn parse_options(options: &[String]) -> Outcome<MountOptions> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut parsed = MountOptions {
        fs: FsOptions::default(),
        faults: None,
        fault_seed: crate::faults::FAULT_SEED_DEFAULT,
        allow_other: root,
        kernel_flags: Vec::new(),
        writeback_cache: true,
        io_uring: None,
        host_sync: true,
        readahead_bytes: flintfs_fuse::READAHEAD_BYTES_DEFAULT,
    };
    for option in options.iter().filter(|option| !option.is_empty()) {
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option.as_str(), None),
        };
        let size = |value: Option<&str>| -> Outcome<usize> {
            let value = value.ok_or_else(|| Failure(format!("option {name} needs a size: {name}=SIZE")))?;
            let bytes = parse_size(value).map_err(|reason| Failure(format!("option {name}: {reason}")))?;
            usize::try_from(bytes).map_err(|_| Failure(format!("option {name}: {value} is too large")))
        };
        match name {
            "node_cache" => parsed.fs.node_cache_bytes = size(value)?,
            "data_buffer" => parsed.fs.data_buffer_bytes = size(value)?,
            "read_cache" => parsed.fs.read_cache_bytes = size(value)?,
            "readahead" => {
                let bytes = size(value)? as u64;
                let given = value.unwrap_or("");
                if bytes > flintfs_fuse::READAHEAD_BYTES_MAX {
                    fail!("option readahead={given}: at most {} MiB", flintfs_fuse::READAHEAD_BYTES_MAX >> 20);
                }
                // The kernel counts whole pages: a smaller window would be
                // none, which only 0 may ask for.
                if bytes != 0 && bytes < flintfs_fuse::READAHEAD_BYTES_MIN {
                    fail!("option readahead={given}: 0 (off) or at least 4K (a bare number is bytes)");
                }
                parsed.readahead_bytes = bytes;
            }
            "faults" => {
                let spec = value.ok_or_else(|| Failure("option faults needs a preset or a TOML file".to_string()))?;
                // Checked now, so a bad name fails the mount command itself.
                crate::faults::parse_faults(spec, parsed.fault_seed)?;
                parsed.faults = Some(spec.to_string());
            }
            "fault_seed" => {
                parsed.fault_seed = value
                    .and_then(|value| value.parse().ok())
                    .ok_or_else(|| Failure("option fault_seed needs a whole number".to_string()))?;
            }
            "scrub_rate" => {
                parsed.fs.scrub_pages_per_second = value
                    .and_then(|value| value.parse().ok())
                    .ok_or_else(|| Failure("option scrub_rate needs whole pages a second (0: no idle scrub)".to_string()))?;
            }
            "compress" => {
                let choice = flintfs_format::CompressionChoice::parse(value.unwrap_or(""))
                    .map_err(|reason| Failure(format!("option {reason}")))?;
                parsed.fs.compression = Some(choice);
            }
            "checkpoint_interval" => {
                let seconds: u64 = value
                    .and_then(|value| value.parse().ok())
                    .ok_or_else(|| Failure("option checkpoint_interval needs whole seconds".to_string()))?;
                parsed.fs.checkpoint_interval_ns = seconds.saturating_mul(1_000_000_000);
            }
            "allow_other" if value.is_none() => parsed.allow_other = true,
            // mount(8) takes `private` for itself (a propagation flag)
            // and never passes it on: through mount(8) and fstab, say
            // `noallow_other`.
            "private" | "noallow_other" if value.is_none() => parsed.allow_other = false,
            flag if value.is_none() && flintfs_fuse::KERNEL_FLAGS.contains(&flag) => {
                // `ro` at mount makes the engine read-only too: it writes
                // nothing, not even recovery's checkpoint (a device that can
                // no longer take one still mounts, to copy files off). A
                // later `remount,ro` or `remount,rw` is the kernel's alone:
                // an engine mounted read-only answers EROFS to every
                // change whatever the kernel's flag says.
                match flag {
                    "ro" => parsed.fs.read_only = true,
                    "rw" => parsed.fs.read_only = false,
                    _ => {}
                }
                parsed.kernel_flags.push(flag.to_string())
            }
            program if is_mount_program_option(program) => {}
            "fsync" => {
                parsed.fs.fsync_mode = match value {
                    Some("wp-check") => FsyncMode::WpCheck,
                    Some("ordered") => FsyncMode::Ordered,
                    // Recovery that trusts every address: it exists to
                    // show what the check is for, never for data.
                    Some("unchecked") => FsyncMode::Unchecked,
                    _ => fail!("option fsync={}: wp-check, ordered or unchecked", value.unwrap_or("")),
                }
            }
            // For devices whose write buffer survives power loss: fsync
            // issues no flush.
            "nobarrier" if value.is_none() => parsed.fs.barrier = false,
            // Leave the node pages kept in NVM there at unmount: the next
            // mount reads them from NVM, and the image needs its NVM.
            "nvm_keep" if value.is_none() => parsed.fs.nvm_keep = true,
            "nonvm_keep" if value.is_none() => parsed.fs.nvm_keep = false,
            // The kernel's writeback cache (on by default: flintfs_fuse's
            // account says what it changes, and how ENOSPC still stops a
            // writer).
            "writeback_cache" if value.is_none() => parsed.writeback_cache = true,
            "nowriteback_cache" if value.is_none() => parsed.writeback_cache = false,
            // FUSE over io_uring (Linux 6.14+): a request is answered on
            // its caller's CPU.
            "io_uring" if value.is_none() => parsed.io_uring = Some(true),
            "noio_uring" if value.is_none() => parsed.io_uring = Some(false),
            // An image's flushes to the host's disk: see `host_sync`.
            "host_sync" if value.is_none() => parsed.host_sync = true,
            "nohost_sync" if value.is_none() => parsed.host_sync = false,
            _ => fail!(
                "unknown mount option {option:?} (known: node_cache=SIZE, data_buffer=SIZE, read_cache=SIZE, \
                 checkpoint_interval=SECONDS, readahead=SIZE, scrub_rate=PAGES, compress=none|lz4|zstd[:LEVEL], faults=PRESET|FILE, fault_seed=N, fsync=wp-check|ordered|unchecked, nobarrier, nvm_keep, nowriteback_cache, io_uring, nohost_sync, allow_other, private, \
                 noallow_other, and the kernel's {})",
                flintfs_fuse::KERNEL_FLAGS.join(", ")
            ),
        }
    }
    Ok(parsed)
}

/// Mount points the kernel has, with their file system types.
fn mounts() -> Vec<(PathBuf, String)> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|field| *field == "-")?;
            let mount_point = unescape_mount_path(fields.get(4)?);
            let kind = fields.get(separator + 1)?;
            let source = unescape_mount_path(fields.get(separator + 2)?);
            Some((PathBuf::from(mount_point), format!("{kind} {source}")))
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` escapes.
fn unescape_mount_path(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escape = bytes.get(index + 1..index + 4).filter(|_| bytes[index] == b'\\');
        match escape.and_then(|digits| u8::from_str_radix(std::str::from_utf8(digits).ok()?, 8).ok()) {
            Some(value) => {
                out.push(value);
                index += 4;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The source a mount shows in the mount table. Commas would split
/// fusermount3's option list, so they become underscores.
fn fs_name(image: &Path) -> String {
    format!("flintfs:{}", image.display()).replace(',', "_")
}

fn is_flintfs_mount(path: &Path) -> bool {
    // The kernel's FUSE mount has no subtype without fusermount's help; the
    // source names flintfs instead.
    mounts().iter().any(|(mount_point, kind)| {
        mount_point == path && (kind.starts_with("fuse flintfs:") || kind.starts_with("fuse.flintfs "))
    })
}

/// The control socket of the mount at `mountpoint` (canonical path).
fn socket_path(directory: &Path, mountpoint: &Path) -> PathBuf {
    // FNV-1a of the path: a short, fixed-length name for any path.
    let hash = mountpoint
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    directory.join(format!("{hash:016x}.sock"))
}

/// A live flintfs mount's control socket, or a clear refusal.
fn connect(mountpoint: &Path) -> Outcome<UnixStream> {
    let canonical = std::fs::canonicalize(mountpoint).map_err(|error| format!("{}: {error}", mountpoint.display()))?;
    if !is_flintfs_mount(&canonical) {
        fail!("{}: not a flintfs mount", mountpoint.display());
    }
    UnixStream::connect(socket_path(&runtime_directory()?, &canonical))
        .map_err(|error| Failure(format!("{}: its daemon does not answer: {error}", mountpoint.display())))
}

/// Sends one command line and reads the one-line answer.
fn ask(mountpoint: &Path, command: &str) -> Outcome<String> {
    ask_within(mountpoint, command, Some(CONTROL_TIMEOUT))
}

/// [`ask`] with a timeout of its own (`None`: wait as long as it takes, as
/// a scrub of a large device does).
fn ask_within(mountpoint: &Path, command: &str, timeout: Option<Duration>) -> Outcome<String> {
    let mut stream = connect(mountpoint)?;
    stream.set_read_timeout(timeout)?;
    writeln!(stream, "{command}")?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    let answer = answer.trim_end().to_string();
    if let Some(reason) = answer.strip_prefix("error ") {
        fail!("{}: {reason}", mountpoint.display());
    }
    Ok(answer)
}

/// Whether `mount -o` knows `option` (its value checked too).
pub fn is_known_option(option: &str) -> bool {
    parse_options(&[option.to_string()]).is_ok()
}

/// Refuses what can be refused before starting anything: the options, the
/// mount point, and an image that is not there.
pub fn check_mount(arguments: &MountArguments) -> Outcome {
    parse_options(&arguments.options)?;
    check_mountpoint(&arguments.mountpoint)?;
    let metadata =
        std::fs::metadata(&arguments.image).map_err(|error| format!("{}: {error}", arguments.image.display()))?;
    if !metadata.is_file() && !std::os::unix::fs::FileTypeExt::is_block_device(&metadata.file_type()) {
        fail!("{}: not an image file or a block device", arguments.image.display());
    }
    Ok(())
}

pub fn mount(arguments: MountArguments) -> Outcome<ExitCode> {
    check_mount(&arguments)?;
    if arguments.foreground {
        return run_daemon(arguments);
    }
    let executable = std::env::current_exe()?;
    let mut command = std::process::Command::new(executable);
    command.arg("mount").arg(&arguments.image).arg(&arguments.mountpoint).arg("-f").arg("--notify");
    if !arguments.options.is_empty() {
        command.arg("-o").arg(arguments.options.join(","));
    }
    // Its own process group, so a terminal's ^C to the shell that ran
    // `mount` does not stop the file system.
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = command.spawn().map_err(|error| format!("starting the mount daemon: {error}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim_end() == READY_LINE {
        return Ok(ExitCode::SUCCESS);
    }
    let output = child.wait_with_output()?;
    let message = String::from_utf8_lossy(&output.stderr);
    let message = message.trim().trim_start_matches("flintfs: ");
    fail!("{}", if message.is_empty() { "the mount daemon stopped before mounting" } else { message })
}

/// The longest a mount waits for the previous daemon of its mount point
/// to finish its unmount and exit.
const PREVIOUS_DAEMON_WAIT_MAX: Duration = Duration::from_secs(120);

/// Waits while a daemon still listens on `socket` (see `run_daemon`).
fn wait_for_previous_daemon(socket: &Path) {
    let started = Instant::now();
    let mut said = false;
    while UnixStream::connect(socket).is_ok() {
        if started.elapsed() > PREVIOUS_DAEMON_WAIT_MAX {
            tracing::warn!("the previous daemon of this mount point still runs; mounting anyway");
            return;
        }
        if !said {
            tracing::info!("waiting for the previous daemon of this mount point to finish its unmount");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The control socket this daemon bound, known by its inode: a daemon
/// that outlives its mount (finishing its unmount checkpoint) must not
/// remove the socket a new daemon for the same mount point has bound in
/// the meantime, or `flintfs stat`, `sync` and `powercut` lose the new
/// mount.
struct OwnSocket {
    path: PathBuf,
    inode: Option<u64>,
}

impl OwnSocket {
    fn of(path: &Path) -> OwnSocket {
        OwnSocket { path: path.to_path_buf(), inode: std::fs::symlink_metadata(path).ok().map(|found| found.ino()) }
    }

    fn remove(&self) {
        let now = std::fs::symlink_metadata(&self.path).ok().map(|found| found.ino());
        if now.is_some() && now == self.inode {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn check_mountpoint(mountpoint: &Path) -> Outcome {
    let metadata = std::fs::metadata(mountpoint).map_err(|error| format!("{}: {error}", mountpoint.display()))?;
    if !metadata.is_dir() {
        fail!("{}: the mount point is not a directory", mountpoint.display());
    }
    let canonical = std::fs::canonicalize(mountpoint)?;
    if mounts().iter().any(|(mount_point, _)| *mount_point == canonical) {
        fail!("{}: already a mount point", mountpoint.display());
    }
    if std::fs::read_dir(mountpoint)?.next().is_some() {
        fail!("{}: the mount point is not empty", mountpoint.display());
    }
    Ok(())
}

/// The daemon: mounts, serves until unmounted or cut, and exits.
fn run_daemon(arguments: MountArguments) -> Outcome<ExitCode> {
    let options = parse_options(&arguments.options)?;
    let canonical = std::fs::canonicalize(&arguments.mountpoint)?;
    // Mounted now: refuse at once. Locked but not mounted is a daemon
    // finishing its unmount: wait for it (`open_image`).
    let image = std::fs::canonicalize(&arguments.image).unwrap_or_else(|_| arguments.image.clone());
    let source = fs_name(&image);
    if let Some((mount_point, _)) =
        mounts().into_iter().find(|(_, kind)| kind.split_once(' ').is_some_and(|(_, found)| found == source))
    {
        fail!("{}: in use: mounted at {}", arguments.image.display(), mount_point.display());
    }
    let faults = match &options.faults {
        Some(spec) => Some(crate::faults::parse_faults(spec, options.fault_seed)?),
        None => None,
    };
    // Read-only, nothing reaches the image or the block device, the
    // device's own records included: a write-protected one mounts too.
    let device = if options.fs.read_only {
        crate::device::open_device_to_look_with(&arguments.image, IMAGE_WAIT, faults)?
    } else {
        open_device_with(&arguments.image, IMAGE_WAIT, faults, options.host_sync)?
    };
    let baseline = device.counters();
    let (fs, report) = mount_fs(device, options.fs)?;
    let shared = Shared::new(fs);
    let (filesystem, unmounted) = FlintFuse::new(shared.clone());
    let filesystem =
        filesystem.with_writeback_cache(options.writeback_cache).with_io_uring(options.io_uring != Some(false));
    if options.io_uring == Some(true) {
        enable_uring();
    }

    let directory = runtime_directory()?;
    let socket = socket_path(&directory, &canonical);
    // Nothing can be mounted at this mount point now (checked above), so a
    // socket for it is a killed daemon's, or one still finishing its
    // unmount checkpoint after the kernel let go. The latter's FUSE
    // session, as it ends, unmounts the mount point by its path (fuser's
    // Mount, on drop): a mount made here before it exits would be
    // unmounted under its new daemon. So wait while the socket answers
    // (its process lives), then take its place.
    wait_for_previous_daemon(&socket);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|error| format!("{}: {error}", socket.display()))?;
    let socket_bound = OwnSocket::of(&socket);

    // A parent gone before "ready" must not kill the daemon with SIGPIPE:
    // the mount is up by then, and needs its daemon.
    // SAFETY: setting a signal's disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    install_stop_handlers();

    let name = fs_name(&image);
    let session = flintfs_fuse::spawn(filesystem, &canonical, &name, options.allow_other, &options.kernel_flags)
        .map_err(|error| format!("{}: FUSE mount failed: {error}", arguments.mountpoint.display()))?;
    // The mount serves now, so the stat that finds its device is answered.
    // A window the kernel keeps at its default costs speed, not data: the
    // mount carries on, and says so once its log is the log file.
    let readahead = flintfs_fuse::set_readahead(&canonical, options.readahead_bytes);

    let cut = Arc::new(AtomicBool::new(false));
    let mount_pages_read = report.pages_read;
    {
        let (shared, cut) = (shared.clone(), cut.clone());
        std::thread::Builder::new()
            .name("flintfs-control".into())
            .spawn(move || serve_control(listener, shared, cut, baseline, mount_pages_read))?;
    }
    {
        let shared = shared.clone();
        std::thread::Builder::new().name("flintfs-idle".into()).spawn(move || idle_loop(shared))?;
    }

    if arguments.notify {
        // The parent may be gone: the mount stands either way.
        let _ = writeln!(std::io::stdout(), "{READY_LINE}").and_then(|()| std::io::stdout().flush());
        detach_output(&socket)?;
    }
    tracing::info!("mounted {} on {} ({} pages read)", name, canonical.display(), report.pages_read);
    if let Err(error) = readahead {
        tracing::warn!("readahead stays at the kernel's default: {error}");
    }

    while !session.guard.is_finished() && !cut.load(Ordering::SeqCst) && !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if cut.load(Ordering::SeqCst) || STOP.load(Ordering::SeqCst) {
        // A power cut left nothing to save; a stop signal saves first.
        // Then the mount is detached lazily (a busy mount point must not
        // keep it, or this daemon, alive) and the process exits, which
        // closes /dev/fuse and fails whatever the kernel still asks.
        let mut code = ExitCode::SUCCESS;
        if STOP.load(Ordering::SeqCst) {
            if let Some(fs) = shared.take() {
                match fs
                    .unmount()
                    .map_err(|error| error.message)
                    .and_then(|device| device.close().map_err(|error| flintfs_core::Error::from(error).message))
                {
                    Ok(()) => {}
                    Err(message) => {
                        tracing::error!("unmount on a stop signal failed: {message}");
                        code = ExitCode::FAILURE;
                    }
                }
            }
        }
        socket_bound.remove();
        detach(&canonical);
        tracing::info!("stopped by {}", if cut.load(Ordering::SeqCst) { "a power cut" } else { "a signal" });
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
    let ended = session.join();
    socket_bound.remove();
    if let Err(error) = ended {
        tracing::warn!("the FUSE session ended with: {error}");
    }
    // The session calls destroy (the unmount checkpoint) as it ends; an
    // engine it did not reach is unmounted here.
    let outcome = unmounted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    let outcome = match outcome {
        Some(outcome) => outcome,
        None => match shared.take() {
            Some(fs) => fs.unmount(),
            None => fail!("the engine stopped after an internal error (a worker panicked): no unmount checkpoint"),
        },
    };
    match outcome {
        Ok(device) => {
            if let Err(error) = device.close() {
                fail!("unmount: closing the image: {error}");
            }
            tracing::info!("unmounted cleanly");
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => fail!("unmount: {}", error.message),
    }
}

/// After "ready", the daemon's output goes to a log beside its socket:
/// the terminal (or pipe) that started it may be gone.
fn detach_output(socket: &Path) -> Outcome {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let log = socket.with_extension("log");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log)
        .map_err(|error| format!("{}: {error}", log.display()))?;
    // SAFETY: dup2 onto the standard descriptors; `file` stays open while
    // the call runs and the duplicates outlive it by design.
    let failed = unsafe { libc::dup2(file.as_raw_fd(), 1) < 0 || libc::dup2(file.as_raw_fd(), 2) < 0 };
    if failed {
        fail!("redirecting output to {}: {}", log.display(), std::io::Error::last_os_error());
    }
    Ok(())
}

/// Set by SIGTERM, SIGINT and SIGHUP: unmount with a checkpoint and exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_signal: libc::c_int) {
    // Only an atomic store: all a signal handler may safely do here.
    STOP.store(true, Ordering::SeqCst);
}

fn install_stop_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(signal, on_stop_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Detaches the mount at `mountpoint` lazily: as root with umount2, else
/// with fusermount3 -uz.
fn detach(mountpoint: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else { return };
    // SAFETY: a valid C string; umount2 only reads it.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return;
    }
    let _ = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn counters_json(counters: &Counters, mount_pages_read: Option<u64>) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    for (name, value) in counters.fields() {
        object.insert(name.to_string(), value.into());
    }
    if let Some(pages) = mount_pages_read {
        object.insert("mount_pages_read".into(), pages.into());
    }
    serde_json::Value::Object(object)
}

fn serve_control(
    listener: UnixListener,
    shared: Arc<Shared<Device>>,
    cut: Arc<AtomicBool>,
    baseline: Counters,
    mount_pages_read: u64,
) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        // One stalled client must not block the next.
        let _ = stream.set_read_timeout(Some(CONTROL_TIMEOUT));
        let _ = stream.set_write_timeout(Some(CONTROL_TIMEOUT));
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut cutting = false;
        let answer = match words.as_slice() {
            ["stat"] => {
                match shared.with(|fs| (fs.device().counters(), fs.protection_counters(), fs.counters().clone())) {
                    Some((counters, protection, engine)) => {
                        let mut value = counters_json(&counters.since(&baseline), Some(mount_pages_read));
                        for (name, count) in protection_fields(&protection) {
                            value[name] = count.into();
                        }
                        value["pages_scrubbed_in_background"] = engine.pages_scrubbed_in_background.into();
                        value["scrub_passes_finished"] = engine.scrub_passes_finished.into();
                        // Node write-backs and reads served by NVM's slots.
                        value["nodes_parked"] = engine.nodes_parked.into();
                        value["nodes_unparked"] = engine.nodes_unparked.into();
                        value["pid"] = std::process::id().into();
                        // Round trips: FORGETs are one-way, and batched.
                        value["fuse_requests"] = shared.round_trips().into();
                        value["fuse_ring_requests"] = shared.ring_requests().into();
                        value.to_string()
                    }
                    None => "error the file system is stopping".to_string(),
                }
            }
            ["scrub", mode @ ..] if mode.is_empty() || mode == ["quick"] => {
                match shared.with(|fs| fs.scrub(!mode.is_empty())) {
                    None => "error the file system is stopping".to_string(),
                    Some(Ok(report)) => scrub_json(&report).to_string(),
                    Some(Err(error)) => format!("error scrub: {}", error.message),
                }
            }
            ["sync"] => match shared.with(|fs| fs.sync()) {
                None => "error the file system is stopping".to_string(),
                Some(Ok(())) => "synced".to_string(),
                Some(Err(error)) => format!("error sync: {}", error.message),
            },
            ["powercut", seed] => match seed.parse::<u64>() {
                Err(_) => "error the seed is not a number".to_string(),
                Ok(seed) => match shared.take() {
                    None => "error the file system is stopping".to_string(),
                    Some(fs) => {
                        // No checkpoint: the engine's buffers are lost, and
                        // the device keeps what its durability model says.
                        let mut device = fs.into_device();
                        let result = device.power_cut(seed);
                        drop(device);
                        let result = result.map_err(|reason| reason.to_string());
                        cutting = true;
                        match result {
                            Ok(report) => format!(
                                "cut {} {} zones lost buffered pages, {} pages torn, {} paired pages damaged, \
                                 {} NVM words dropped",
                                std::process::id(),
                                report.zones.iter().filter(|zone| zone.durable_after < zone.accepted).count(),
                                report.torn_pages.len(),
                                report.paired_page_corruptions.len(),
                                report.nvm_words_dropped
                            ),
                            Err(error) => format!("error the power cut failed: {error}"),
                        }
                    }
                },
            },
            _ => format!("error unknown command {:?}", line.trim()),
        };
        // The answer goes out before the main thread may exit.
        let _ = writeln!(stream, "{answer}").and_then(|()| stream.flush());
        if cutting {
            cut.store(true, Ordering::SeqCst);
            return;
        }
    }
}

/// Background work when no request has come for a while: the timer's
/// checkpoint and cleaning.
fn idle_loop(shared: Arc<Shared<Device>>) {
    let mut seen = shared.requests();
    loop {
        std::thread::sleep(IDLE_PERIOD);
        let now = shared.requests();
        if now != seen {
            seen = now;
            continue;
        }
        match shared.with(|fs| fs.idle()) {
            None => return,
            Some(Err(error)) => tracing::warn!("idle work: {}", error.message),
            Some(Ok(_)) => {}
        }
    }
}

#[derive(Args)]
pub struct StatArguments {
    /// An image file, or the mount point of a live mount.
    pub target: PathBuf,
    #[arg(long)]
    pub json: bool,
}

pub fn stat(arguments: StatArguments) -> Outcome<ExitCode> {
    let value = if std::fs::metadata(&arguments.target).map(|metadata| metadata.is_dir()).unwrap_or(false) {
        let answer = ask(&arguments.target, "stat")?;
        serde_json::from_str::<serde_json::Value>(&answer).map_err(|error| format!("the daemon's answer: {error}"))?
    } else {
        let device = open_device_to_look(&arguments.target, IMAGE_WAIT)?;
        counters_json(&device.lifetime_counters(), None)
    };
    if arguments.json {
        println!("{value}");
    } else if let serde_json::Value::Object(fields) = value {
        for (name, value) in fields {
            println!("{name:<28} {value}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The protection layer's counters, by the names `stat --json` gives them.
pub fn protection_fields(counters: &flintfs_core::ProtectionCounters) -> [(&'static str, u64); 16] {
    [
        ("pages_corrected_ecc", counters.pages_corrected_ecc),
        ("bits_corrected_ecc", counters.bits_corrected_ecc),
        ("pages_repaired_block_parity", counters.pages_repaired_block_parity),
        ("pages_repaired_zone_parity", counters.pages_repaired_zone_parity),
        ("pages_repaired_open_stripe", counters.pages_repaired_open_stripe),
        ("pages_unrepairable", counters.pages_unrepairable),
        ("repair_device_time_ns", counters.repair_device_time_ns),
        ("parity_pages_programmed", counters.parity_pages_programmed),
        ("stripe_rebuild_pages_read", counters.stripe_rebuild_pages_read),
        ("unprotected_pages_max", counters.unprotected_pages_max),
        ("unprotected_durable_pages_max", counters.unprotected_durable_pages_max),
        ("stripe_records_written", counters.stripe_records_written),
        ("blocks_retired", counters.blocks_retired),
        ("pages_worn", counters.pages_worn),
        ("pages_read_again", counters.pages_read_again),
        ("nvm_wear_moves", counters.nvm_wear_moves),
    ]
}

pub fn scrub_json(report: &flintfs_core::ScrubReport) -> serde_json::Value {
    serde_json::json!({
        "quick": report.quick,
        "zones_scanned": report.zones_scanned,
        "pages_checked": report.pages_checked,
        "pages_corrected": report.pages_corrected,
        "pages_repaired": report.pages_repaired,
        "pages_unrepairable": report.pages_unrepairable,
        "unrepairable": report.unrepairable,
        "parity_pages_checked": report.parity_pages_checked,
        "parity_pages_bad": report.parity_pages_bad,
        "stripes_checked": report.stripes_checked,
        "stripes_inconsistent": report.stripes_inconsistent,
        "oob_reads": report.oob_reads,
        "zones_refreshed": report.zones_refreshed,
        "pages_worn": report.pages_worn,
        "blocks_retired": report.blocks_retired,
    })
}

#[derive(Args)]
pub struct ScrubArguments {
    /// An image file, or the mount point of a live mount.
    pub target: PathBuf,
    /// Check each stripe's parity signatures from the OOBs alone, reading
    /// no data (RCFFS's quick scan).
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub json: bool,
}

/// `flintfs scrub IMAGE|MOUNTPOINT`: reads every page as a user read would
/// and repairs what it can (or, with --quick, checks the stripes). Exits 1
/// when a page could not be brought back, or (quick) a stripe does not
/// check.
pub fn scrub(arguments: ScrubArguments) -> Outcome<ExitCode> {
    let value = if std::fs::metadata(&arguments.target).map(|metadata| metadata.is_dir()).unwrap_or(false) {
        let command = if arguments.quick { "scrub quick" } else { "scrub" };
        let answer = ask_within(&arguments.target, command, None)?;
        serde_json::from_str::<serde_json::Value>(&answer).map_err(|error| format!("the daemon's answer: {error}"))?
    } else {
        let device = open_device(&arguments.target, IMAGE_WAIT)?;
        let (mut fs, _) = crate::image::mount_fs(device, FsOptions::default())?;
        let report = fs.scrub(arguments.quick).map_err(|error| format!("scrub: {}", error.message))?;
        // Unmounted cleanly: what the scrub moved is recorded.
        fs.unmount().map_err(|error| format!("unmount: {}", error.message))?.close()?;
        scrub_json(&report)
    };
    if arguments.json {
        println!("{value}");
    } else if let serde_json::Value::Object(fields) = &value {
        for (name, field) in fields {
            println!("{name:<24} {field}");
        }
    }
    let failed = value["pages_unrepairable"].as_u64().unwrap_or(0) > 0
        || value["stripes_inconsistent"].as_u64().unwrap_or(0) > 0;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

#[derive(Args)]
pub struct SyncArguments {
    /// The mount point of a live flintfs mount.
    pub mountpoint: PathBuf,
}

/// `flintfs sync MOUNTPOINT`: a checkpoint of everything the mount holds.
/// The kernel sends no request for sync(2) or syncfs(2) to a FUSE file
/// system (FUSE_SYNCFS is for virtiofs only), so this is the command that
/// does; so does fsync of the mount's root directory.
pub fn sync(arguments: SyncArguments) -> Outcome<ExitCode> {
    // syncfs(2) first: it does not reach the daemon, but it makes the
    // kernel write back the pages its writeback cache holds, so the
    // checkpoint covers every write that returned.
    let root = std::fs::File::open(&arguments.mountpoint)
        .map_err(|error| format!("{}: {error}", arguments.mountpoint.display()))?;
    // SAFETY: syncfs takes any open descriptor, which `root` keeps open.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)) } != 0 {
        fail!("{}: syncfs: {}", arguments.mountpoint.display(), std::io::Error::last_os_error());
    }
    ask(&arguments.mountpoint, "sync")?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct PowercutArguments {
    /// The mount point of a live flintfs mount.
    pub mountpoint: PathBuf,
    /// Seeds which buffered writes survive.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn powercut(arguments: PowercutArguments) -> Outcome<ExitCode> {
    let answer = ask(&arguments.mountpoint, &format!("powercut {}", arguments.seed))?;
    let mut words = answer.split_whitespace();
    let (Some("cut"), Some(pid)) = (words.next(), words.next().and_then(|pid| pid.parse::<u32>().ok())) else {
        fail!("unexpected answer from the daemon: {answer}");
    };
    // Done when the daemon is gone: the mount point is released and the
    // image free for the next mount.
    let start = Instant::now();
    while process_alive(pid) {
        if start.elapsed() > DAEMON_EXIT_WAIT {
            fail!("the daemon (pid {pid}) has not exited after {} s", DAEMON_EXIT_WAIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("power cut (seed {}): {}", arguments.seed, answer.splitn(3, ' ').nth(2).unwrap_or(""));
    Ok(ExitCode::SUCCESS)
}

/// Whether `pid` runs (a zombie nobody reaped has stopped running).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(options: &[&str]) -> Outcome<MountOptions> {
        parse_options(&options.iter().map(|option| option.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn readahead_is_the_default_zero_or_a_size_of_whole_pages_within_the_limit() {
        assert_eq!(parsed(&[]).unwrap().readahead_bytes, flintfs_fuse::READAHEAD_BYTES_DEFAULT);
        assert_eq!(parsed(&["readahead=0"]).unwrap().readahead_bytes, 0);
        assert_eq!(parsed(&["readahead=4K"]).unwrap().readahead_bytes, 4096);
        assert_eq!(parsed(&["readahead=64M"]).unwrap().readahead_bytes, 64 << 20);
        for (option, says) in [
            ("readahead", "needs a size"),
            ("readahead=512", "at least 4K"),
            ("readahead=65M", "at most 64 MiB"),
            ("readahead=fast", "option readahead"),
        ] {
            match parsed(&[option]) {
                Err(Failure(message)) => assert!(message.contains(says), "{option}: {message}"),
                Ok(_) => panic!("{option} was taken"),
            }
        }
    }

    #[test]
    fn an_image_mount_syncs_to_the_host_unless_told_not_to() {
        assert!(parsed(&[]).unwrap().host_sync);
        assert!(parsed(&["host_sync"]).unwrap().host_sync);
        assert!(!parsed(&["nohost_sync"]).unwrap().host_sync);
        assert!(parsed(&["nohost_sync=1"]).is_err());
        // The choice reaches the image the mount opens.
        let directory = std::env::temp_dir().join(format!("flintfs-host-sync-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let image = directory.join("image");
        let geometry = flintfs_flash::Geometry::with_size_bytes(16 << 20);
        drop(
            flintfs_flash::ImageFlash::create_image(&image, geometry, flintfs_flash::DeviceOptions::default()).unwrap(),
        );
        for host_sync in [true, false] {
            match open_device_with(&image, IMAGE_WAIT, None, host_sync).unwrap() {
                Device::Image(device) => assert_eq!(device.options().host_sync, host_sync),
                Device::Block(_) => panic!("an image opened as a block device"),
            }
        }
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
