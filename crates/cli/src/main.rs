//! # `flintfs`: the command
//!
//! One binary. Every subcommand prints errors to stderr as one line and
//! exits non-zero; none panics on bad input. The names and JSON fields are
//! relied on by scripts (issue 5), so they change only with them.

mod atlas;
mod conventions;
mod crashtest;
mod daemon;
mod demo;
mod device;
mod faults;
mod image;
mod inspect;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A failed command: the message, already worded for the user.
#[derive(Debug)]
pub struct Failure(pub String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Failure {
        Failure(error.to_string())
    }
}

pub type Outcome<T = ()> = Result<T, Failure>;

/// Fails with a message built like `format!`.
#[macro_export]
macro_rules! fail {
    ($($argument:tt)*) => { return Err($crate::Failure(format!($($argument)*))) };
}

#[derive(Parser)]
#[command(
    name = "flintfs",
    version,
    about = "flintfs: a file system for raw NAND and zoned flash, on an emulated device"
)]
struct Command {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Create an image file holding an emulated device, and format it.
    Mkfs(image::MkfsArguments),
    /// Mount an image with FUSE (in the background unless -f).
    Mount(daemon::MountArguments),
    /// Check an image's consistency (exit 0 when clean).
    Fsck(image::FsckArguments),
    /// Decode what is on flash.
    Inspect(inspect::InspectArguments),
    /// Device counters: of a live mount since it mounted, or an image's lifetime totals.
    Stat(daemon::StatArguments),
    /// Cut the emulated device's power under a live mount.
    Powercut(daemon::PowercutArguments),
    /// Workloads on flintfs and its peers in one run: runs the flintfs-bench binary
    /// (`cargo build --release -p flintfs-bench`), which has its own --help.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        arguments: Vec<OsString>,
    },
    /// Cut power at every device operation of workloads, recover, and check docs/SEMANTICS.md's promises.
    Crashtest(crashtest::CrashtestArguments),
    /// The main job: make an image, mount it, copy a tree, fsync, cut the power, recover, fsck, print figures.
    Demo(demo::DemoArguments),
    /// Make everything a live mount holds durable (sync(2) does not reach a FUSE mount).
    Sync(daemon::SyncArguments),
    /// Read every page as a user read would and repair it, or check the parity stripes (--quick).
    Scrub(daemon::ScrubArguments),
    /// Each fault mode of the emulator against each protection level, measured: damaged, corrected,
    /// repaired, EIO and silent.
    Atlas(atlas::AtlasArguments),
    /// Put flintfs on the PATH and mount.flintfs, mkfs.flintfs and fsck.flintfs where mount(8),
    /// mkfs(8) and fsck(8) look.
    Install(conventions::InstallArguments),
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`flintfs inspect ... | head`), as
    // command-line tools do, rather than panic on the failed print.
    // SAFETY: restoring a signal's default disposition at startup.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // The atlas loses data on purpose, thousands of pages a run, and counts
    // it in its table: the engine's line per lost page would bury that.
    let atlas = std::env::args_os().nth(1).is_some_and(|action| action == "atlas");
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLINTFS_LOG")
        // fuser warns of every request it answers ENOSYS (a tty ioctl on
        // each open by Python, say): not worth a line each.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(if atlas {
                "warn,fuser=error,flintfs_core=off"
            } else {
                "warn,fuser=error"
            })
        });
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let mut arguments = std::env::args_os();
    if let Some(helper) = arguments.next().as_deref().and_then(conventions::helper_named) {
        return conventions::run_helper(helper, arguments.collect());
    }
    let command = match Command::try_parse() {
        Ok(command) => command,
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            // One line, like every other refusal; `--help` has the rest.
            let rendered = error.to_string();
            let first = rendered.lines().next().unwrap_or("bad arguments");
            eprintln!("flintfs: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let result = match command.action {
        Action::Mkfs(arguments) => image::mkfs(arguments),
        Action::Mount(arguments) => daemon::mount(arguments),
        Action::Fsck(arguments) => image::fsck(arguments),
        Action::Inspect(arguments) => inspect::inspect(arguments),
        Action::Stat(arguments) => daemon::stat(arguments),
        Action::Powercut(arguments) => daemon::powercut(arguments),
        Action::Demo(arguments) => demo::demo(arguments),
        Action::Crashtest(arguments) => crashtest::crashtest(arguments),
        Action::Bench { arguments } => run_bench(arguments),
        Action::Sync(arguments) => daemon::sync(arguments),
        Action::Scrub(arguments) => daemon::scrub(arguments),
        Action::Atlas(arguments) => atlas::atlas(arguments),
        Action::Install(arguments) => conventions::install(arguments),
    };
    match result {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("flintfs: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Where live mounts leave their control sockets and logs: `/run/flintfs`
/// for root, `$XDG_RUNTIME_DIR/flintfs` for a user, else
/// `/tmp/flintfs-UID`; made private (0700) and refused unless the caller
/// owns it, so nobody else can plant a socket or a log link there.
/// `FLINTFS_RUNTIME_DIR` overrides.
pub fn runtime_directory() -> Outcome<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let directory = if let Some(directory) = std::env::var_os("FLINTFS_RUNTIME_DIR") {
        PathBuf::from(directory)
    } else if uid == 0 {
        PathBuf::from("/run/flintfs")
    } else if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(runtime).join("flintfs")
    } else {
        std::env::temp_dir().join(format!("flintfs-{uid}"))
    };
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&directory) {
        Ok(()) => {}
        Err(error) => fail!("{}: {error}", directory.display()),
    }
    let metadata =
        std::fs::symlink_metadata(&directory).map_err(|error| format!("{}: {error}", directory.display()))?;
    if !metadata.is_dir() || metadata.uid() != uid {
        fail!("{}: not a directory of this user's; remove it or set FLINTFS_RUNTIME_DIR", directory.display());
    }
    if metadata.permissions().mode() & 0o022 != 0 {
        fail!("{}: writable by others; make it 0700", directory.display());
    }
    Ok(directory)
}

/// `flintfs bench ...` is `flintfs-bench ...`: the harness and its peers
/// (littlefs is C, the charts a drawing stack) live in their own binary so
/// that this one builds with no C toolchain. It is looked for beside this
/// binary, then on the PATH.
fn run_bench(arguments: Vec<OsString>) -> Outcome<ExitCode> {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe().ok().map(|path| path.with_file_name("flintfs-bench"));
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|directory| directory.join("flintfs-bench")).find(|path| path.is_file())
    });
    let Some(program) = beside.filter(|path| path.is_file()).or(on_path) else {
        fail!(
            "bench needs the flintfs-bench binary beside flintfs or on the PATH: \
             cargo build --release -p flintfs-bench"
        );
    };
    let error = std::process::Command::new(&program).args(arguments).exec();
    fail!("{}: {error}", program.display())
}
