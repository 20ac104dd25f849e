//! The names other programs call a file system by. mount(8) runs
//! `/sbin/mount.flintfs SPEC DIR [-sfnv] [-o OPTIONS]` for `mount -t flintfs`
//! and fstab lines; mkfs(8) runs `mkfs.flintfs`; fsck(8) runs
//! `fsck.flintfs` and reads its exit code. All three are this same binary
//! under another name (`flintfs install` makes the links); each parses its
//! program's conventions here and hands the work to the ordinary
//! subcommand.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::daemon::MountArguments;
use crate::image::{check_image, parse_size, MkfsArguments};
use crate::{fail, Failure, Outcome};

/// A helper name this binary answers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    Mount,
    Mkfs,
    Fsck,
}

/// The helpers, by the names the system programs look for.
pub const HELPERS: [(&str, Helper); 4] = [
    ("mount.flintfs", Helper::Mount),
    // The kernel lists a mount as fuse.flintfs, and mount(8) looks for
    // this helper for it (a remount, say) before fuse3's mount.fuse.
    ("mount.fuse.flintfs", Helper::Mount),
    ("mkfs.flintfs", Helper::Mkfs),
    ("fsck.flintfs", Helper::Fsck),
];

/// fsck(8)'s exit codes (they are bits; fsck ORs them over file systems).
pub mod fsck_exit {
    pub const CLEAN: u8 = 0;
    pub const CORRECTED: u8 = 1;
    pub const UNCORRECTED: u8 = 4;
    pub const OPERATIONAL_ERROR: u8 = 8;
    pub const USAGE_ERROR: u8 = 16;
}

/// mount(8)'s exit codes for a helper: bad usage, and a failed mount.
const MOUNT_EXIT_USAGE: u8 = 1;
const MOUNT_EXIT_FAILURE: u8 = 32;

/// Which helper `program` (argv[0]) names, if any.
pub fn helper_named(program: &OsStr) -> Option<Helper> {
    let name = Path::new(program).file_name()?;
    HELPERS.iter().find(|(helper, _)| OsStr::new(helper) == name).map(|(_, helper)| *helper)
}

/// Runs a helper on its arguments (argv without argv[0]); errors are one
/// line on stderr, under the helper's own name.
pub fn run_helper(helper: Helper, arguments: Vec<OsString>) -> ExitCode {
    let (name, usage_code, failure_code) = match helper {
        Helper::Mount => ("mount.flintfs", MOUNT_EXIT_USAGE, MOUNT_EXIT_FAILURE),
        Helper::Mkfs => ("mkfs.flintfs", 1, 1),
        Helper::Fsck => ("fsck.flintfs", fsck_exit::USAGE_ERROR, fsck_exit::OPERATIONAL_ERROR),
    };
    let arguments: Vec<String> = match arguments.into_iter().map(OsString::into_string).collect() {
        Ok(arguments) => arguments,
        Err(bad) => {
            eprintln!("{name}: an argument is not UTF-8: {bad:?}");
            return ExitCode::from(usage_code);
        }
    };
    let result = match helper {
        Helper::Mount => mount_helper(&arguments),
        Helper::Mkfs => mkfs_helper(&arguments),
        Helper::Fsck => fsck_helper(&arguments),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Usage(message)) => {
            eprintln!("{name}: {message}");
            ExitCode::from(usage_code)
        }
        Err(Failed(Failure(message))) => {
            eprintln!("{name}: {message}");
            ExitCode::from(failure_code)
        }
    }
}

/// Why a helper stopped: its caller's mistake, or the work's failure.
enum Stop {
    Usage(String),
    Failed(Failure),
}
use Stop::{Failed, Usage};

impl From<Failure> for Stop {
    fn from(failure: Failure) -> Stop {
        Failed(failure)
    }
}

/// Short options in one word (`-fn`) or apart, and an option's value in the
/// same word (`-ofoo`) or the next: getopt's rules, which the system
/// programs' helpers are called with.
struct ShortOptions<'a> {
    arguments: std::slice::Iter<'a, String>,
    cluster: Vec<char>,
    positional: Vec<&'a str>,
}

impl<'a> ShortOptions<'a> {
    fn new(arguments: &'a [String]) -> ShortOptions<'a> {
        ShortOptions { arguments: arguments.iter(), cluster: Vec::new(), positional: Vec::new() }
    }

    /// The next short option letter; positional words are kept aside,
    /// and words from `--` on are all positional. Long options are
    /// returned whole, as `Err(word)`.
    fn next(&mut self) -> Option<Result<char, &'a str>> {
        loop {
            if !self.cluster.is_empty() {
                return Some(Ok(self.cluster.remove(0)));
            }
            let word = self.arguments.next()?;
            if word == "--" {
                self.positional.extend(self.arguments.by_ref().map(String::as_str));
                return None;
            }
            if word.starts_with("--") {
                return Some(Err(word.as_str()));
            }
            match word.strip_prefix('-').filter(|letters| !letters.is_empty()) {
                Some(letters) => self.cluster = letters.chars().collect(),
                None => self.positional.push(word),
            }
        }
    }

    /// The value of the option just returned: the rest of its word, or
    /// the next word.
    fn value(&mut self, option: char) -> Result<String, Stop> {
        if !self.cluster.is_empty() {
            return Ok(self.cluster.drain(..).collect());
        }
        self.arguments.next().cloned().ok_or_else(|| Usage(format!("option -{option} needs a value")))
    }

    /// The next word, for a long option's value.
    fn next_word(&mut self, option: &str) -> Result<String, Stop> {
        self.arguments.next().cloned().ok_or_else(|| Usage(format!("option {option} needs a value")))
    }
}

/// `mount.flintfs SPEC DIR [-sfnv] [-N NAMESPACE] [-o OPTIONS] [-t TYPE]`,
/// as mount(8) calls it: SPEC is the image.
fn mount_helper(arguments: &[String]) -> Result<u8, Stop> {
    let mut options: Vec<String> = Vec::new();
    let (mut sloppy, mut fake, mut verbose) = (false, false, false);
    let mut parser = ShortOptions::new(arguments);
    while let Some(option) = parser.next() {
        match option {
            Ok('o') => options.extend(parser.value('o')?.split(',').map(str::to_string)),
            Ok('s') => sloppy = true,
            Ok('f') => fake = true,
            // No /etc/mtab to write: the kernel's table is the only one.
            Ok('n') => {}
            Ok('v') => verbose = true,
            Ok('t') => {
                let kind = parser.value('t')?;
                if kind != "flintfs" && kind != "fuse.flintfs" {
                    return Err(Usage(format!("type {kind:?} is not flintfs")));
                }
            }
            Ok('N') => return Err(Usage("mounting in another namespace (-N) is not supported".into())),
            Ok(letter) => {
                return Err(Usage(format!(
                    "unknown option -{letter} (usage: mount.flintfs SPEC DIR [-sfnv] [-o OPTIONS])"
                )))
            }
            Err(word) => return Err(Usage(format!("unknown option {word}"))),
        }
    }
    let [image, mountpoint] = parser.positional[..] else {
        return Err(Usage("usage: mount.flintfs SPEC DIR [-sfnv] [-o OPTIONS]".into()));
    };
    if options.iter().any(|option| option == "remount") {
        return remount(mountpoint, &options, fake);
    }
    if sloppy {
        // -s: options this file system does not know are dropped, not
        // refused (mount(8) passes it for NFS-style option lists).
        options.retain(|option| crate::daemon::is_known_option(option));
    }
    let arguments = MountArguments {
        image: PathBuf::from(image),
        mountpoint: PathBuf::from(mountpoint),
        foreground: false,
        options,
        notify: false,
    };
    if fake {
        // -f: everything but the mount itself.
        crate::daemon::check_mount(&arguments)?;
        return Ok(0);
    }
    crate::daemon::mount(arguments)?;
    if verbose {
        println!("mount.flintfs: {image} mounted on {mountpoint}");
    }
    Ok(0)
}

/// `mount -o remount,OPTIONS`: the kernel's flags change on the live
/// mount (ro and rw, nosuid, nodev, noexec, noatime, sync, dirsync); the
/// file system's own options are fixed at mount and refused here.
fn remount(mountpoint: &str, options: &[String], fake: bool) -> Result<u8, Stop> {
    use std::os::unix::ffi::OsStrExt;
    let mut flags: libc::c_ulong = libc::MS_REMOUNT;
    for option in options {
        flags |= match option.as_str() {
            "remount" | "rw" | "suid" | "dev" | "exec" | "atime" | "async" | "relatime" => 0,
            "ro" => libc::MS_RDONLY,
            "nosuid" => libc::MS_NOSUID,
            "nodev" => libc::MS_NODEV,
            "noexec" => libc::MS_NOEXEC,
            "noatime" => libc::MS_NOATIME,
            "sync" => libc::MS_SYNCHRONOUS,
            "dirsync" => libc::MS_DIRSYNC,
            other if crate::daemon::is_mount_program_option(other) => 0,
            // mount(8) passes the mount's options back: the file system's
            // own, unchanged, are fine.
            other
                if crate::daemon::is_known_option(other)
                    || other.starts_with("user_id=")
                    || other.starts_with("group_id=")
                    || other == "default_permissions"
                    || other == "allow_other" =>
            {
                0
            }
            other => return Err(Usage(format!("option {other:?} cannot change on a remount"))),
        };
    }
    if fake {
        return Ok(0);
    }
    let path = std::ffi::CString::new(Path::new(mountpoint).as_os_str().as_bytes())
        .map_err(|_| Usage(format!("{mountpoint:?} holds a NUL byte")))?;
    // SAFETY: a valid C string; the null source, type and data are what a
    // remount passes.
    let result = unsafe { libc::mount(std::ptr::null(), path.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
    if result != 0 {
        return Err(Failed(Failure(format!("remount of {mountpoint}: {}", std::io::Error::last_os_error()))));
    }
    Ok(0)
}

/// `mkfs.flintfs [-f] [-n] [-q] [-V] [--size SIZE] [--page-size ...] DEVICE [SIZE]`.
/// An existing file is formatted in place at its own size unless it holds
/// a file system (flintfs or, by blkid, another), which `-f` overwrites.
fn mkfs_helper(arguments: &[String]) -> Result<u8, Stop> {
    let mut passed: Vec<String> = vec!["mkfs".into()];
    let (mut force, mut dry_run, mut quiet) = (false, false, false);
    let mut size: Option<String> = None;
    let mut parser = ShortOptions::new(arguments);
    while let Some(option) = parser.next() {
        match option {
            Ok('f') => force = true,
            Ok('n') => dry_run = true,
            Ok('q') => quiet = true,
            Ok('V') => {
                println!(
                    "mkfs.flintfs {} (flintfs format {})",
                    env!("CARGO_PKG_VERSION"),
                    flintfs_format::FORMAT_VERSION
                );
                return Ok(0);
            }
            Ok(letter) => {
                return Err(Usage(format!("unknown option -{letter} (see flintfs mkfs --help for the long ones)")))
            }
            Err("--force") => force = true,
            Err("--dry-run") => dry_run = true,
            Err("--quiet") => quiet = true,
            Err("--preallocate") => passed.push("--preallocate".into()),
            Err(word) if word.starts_with("--size") => {
                size = Some(match word.split_once('=') {
                    Some((_, value)) => value.to_string(),
                    None => parser.next_word(word)?,
                })
            }
            // Geometry options (--page-size, --zone-blocks, ...) go to
            // `flintfs mkfs` as they are.
            Err(word) => {
                passed.push(word.to_string());
                if !word.contains('=') {
                    passed.push(parser.next_word(word)?);
                }
            }
        }
    }
    let (device, size_word) = match parser.positional[..] {
        [device] => (device, None),
        [device, size] => (device, Some(size)),
        _ => return Err(Usage("usage: mkfs.flintfs [-f] [-n] [-q] [--size SIZE] DEVICE [SIZE]".into())),
    };
    if let Some(word) = size_word {
        if size.is_some() {
            return Err(Usage("the size is given twice".into()));
        }
        size = Some(word.to_string());
    }
    let path = Path::new(device);
    match std::fs::metadata(path) {
        Ok(metadata) if !metadata.is_file() => {
            return Err(Failed(Failure(format!(
                "{device}: not a regular file (flintfs runs on image files; block devices need the block backend)"
            ))))
        }
        Ok(metadata) => {
            if let Some(holds) = what_it_holds(path) {
                // -n writes nothing, so it may say what it would make.
                if !force && !dry_run {
                    return Err(Failed(Failure(format!("{device}: holds {holds}; -f overwrites it"))));
                }
            }
            if size.is_none() {
                if metadata.len() == 0 {
                    return Err(Usage(format!("{device} is empty: give a size (--size 1G)")));
                }
                size = Some(metadata.len().to_string());
            }
            // The file was named, and checked above: `flintfs mkfs` may
            // replace it.
            passed.push("--force".into());
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(Failed(Failure(format!("{device}: {error}")))),
    }
    let Some(size) = size else { return Err(Usage(format!("{device} does not exist: give a size (--size 1G)"))) };
    parse_size(&size).map_err(|reason| Usage(format!("size: {reason}")))?;
    passed.extend([device.to_string(), "--size".into(), size]);
    if dry_run {
        passed.push("--dry-run".into());
    }
    if quiet {
        passed.push("--quiet".into());
    }
    let parsed = MkfsCommand::try_parse_from(std::iter::once("flintfs".to_string()).chain(passed.into_iter().skip(1)))
        .map_err(|error| {
            Usage(error.to_string().lines().next().unwrap_or("bad arguments").trim_start_matches("error: ").to_string())
        })?;
    crate::image::mkfs(parsed.arguments)?;
    Ok(0)
}

#[derive(clap::Parser)]
struct MkfsCommand {
    #[command(flatten)]
    arguments: MkfsArguments,
}
use clap::Parser as _;

/// What a file holds, if it holds a file system: flintfs, or what blkid
/// finds (ext4, xfs, swap, a partition table...).
pub fn what_it_holds(path: &Path) -> Option<String> {
    if flintfs_flash::ImageBackend::read_geometry(path).is_ok() {
        return Some("a flintfs image".into());
    }
    if flintfs_flash::BlockFlash::probe(path) {
        return Some("a flintfs file system (block backend)".into());
    }
    let output = std::process::Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(path)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| text.lines().find_map(|line| line.strip_prefix(name)).map(str::to_string);
    if let Some(kind) = field("TYPE=") {
        return Some(format!("a {kind} file system"));
    }
    field("PTTYPE=").map(|table| format!("a {table} partition table"))
}

/// How long `fsck.flintfs` waits for a daemon finishing its unmount: fsck
/// at boot must not hang on an image that is mounted.
const FSCK_IMAGE_WAIT: Duration = Duration::from_secs(2);

/// `fsck.flintfs [-n|-y|-a|-p|-r] [-f] [-C FD] [-V] IMAGE` with fsck(8)'s
/// exit codes. Without -y, -a, -p or -r it checks and changes nothing
/// (there is no one to ask).
fn fsck_helper(arguments: &[String]) -> Result<u8, Stop> {
    let mut repair: Option<bool> = None;
    let mut parser = ShortOptions::new(arguments);
    let mut set = |value: bool| -> Result<(), Stop> {
        if repair.is_some_and(|chosen| chosen != value) {
            return Err(Usage("-n cannot go with -y, -a, -p or -r".into()));
        }
        repair = Some(value);
        Ok(())
    };
    while let Some(option) = parser.next() {
        match option {
            Ok('n') => set(false)?,
            Ok('y' | 'a' | 'p' | 'r') => set(true)?,
            // Every check is a full one: -f has nothing more to force.
            Ok('f') => {}
            // fsck(8)'s progress descriptor: no progress is written.
            Ok('C') => {
                parser.value('C')?;
            }
            Ok('V') => {
                println!(
                    "fsck.flintfs {} (flintfs format {})",
                    env!("CARGO_PKG_VERSION"),
                    flintfs_format::FORMAT_VERSION
                );
                return Ok(fsck_exit::CLEAN);
            }
            Ok(letter) => {
                return Err(Usage(format!("unknown option -{letter} (usage: fsck.flintfs [-n|-y|-a|-p] [-f] IMAGE)")))
            }
            Err(word) => return Err(Usage(format!("unknown option {word}"))),
        }
    }
    let [image] = parser.positional[..] else {
        return Err(Usage("usage: fsck.flintfs [-n|-y|-a|-p] [-f] IMAGE".into()));
    };
    let repair = repair.unwrap_or(false);
    let image = Path::new(image);
    let first = check_image(image, false, FSCK_IMAGE_WAIT)?;
    for finding in &first.report.findings {
        println!("{}: {finding}", image.display());
    }
    if first.report.is_clean() {
        println!(
            "{}: clean ({} pages in {} zones checked)",
            image.display(),
            first.report.pages_checked,
            first.report.zones_checked
        );
        return Ok(fsck_exit::CLEAN);
    }
    if !repair {
        println!("{}: {} findings, not repaired (-n)", image.display(), first.report.findings.len());
        return Ok(fsck_exit::UNCORRECTED);
    }
    let second = check_image(image, true, FSCK_IMAGE_WAIT)?;
    if second.report.is_clean() {
        println!("{}: repaired, clean now", image.display());
        return Ok(fsck_exit::CORRECTED);
    }
    for finding in &second.report.findings {
        println!("{}: left after repair: {finding}", image.display());
    }
    Ok(fsck_exit::UNCORRECTED)
}

#[derive(Args)]
pub struct InstallArguments {
    /// Where the `flintfs` command goes (and `flintfs-bench`, when it was
    /// built beside it).
    #[arg(long, default_value = "/usr/local/bin")]
    pub bin_dir: PathBuf,
    /// Where mount.flintfs, mkfs.flintfs and fsck.flintfs go: mount(8)
    /// looks for its helpers in /sbin only.
    #[arg(long, default_value = "/sbin")]
    pub sbin_dir: PathBuf,
}

/// Copies this binary to `bin_dir` and links the helpers in `sbin_dir` to
/// it, replacing what an earlier install left.
pub fn install(arguments: InstallArguments) -> Outcome<ExitCode> {
    let executable = std::env::current_exe()?;
    std::fs::create_dir_all(&arguments.bin_dir).map_err(|error| format!("{}: {error}", arguments.bin_dir.display()))?;
    std::fs::create_dir_all(&arguments.sbin_dir)
        .map_err(|error| format!("{}: {error}", arguments.sbin_dir.display()))?;
    let installed = arguments.bin_dir.join("flintfs");
    copy_executable(&executable, &installed)?;
    let bench = executable.with_file_name("flintfs-bench");
    if bench.is_file() {
        copy_executable(&bench, &arguments.bin_dir.join("flintfs-bench"))?;
    }
    let target = std::fs::canonicalize(&installed)?;
    for (name, _) in HELPERS {
        let link = arguments.sbin_dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(metadata) if metadata.file_type().is_symlink() || metadata.is_file() => std::fs::remove_file(&link)?,
            Ok(_) => fail!("{}: exists and is not a file or a link", link.display()),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&target, &link).map_err(|error| format!("{}: {error}", link.display()))?;
        println!("{} -> {}", link.display(), target.display());
    }
    println!("installed {}", installed.display());
    Ok(ExitCode::SUCCESS)
}

/// Copies through a temporary name and renames, so a running copy of the
/// old binary is never overwritten in place.
fn copy_executable(from: &Path, to: &Path) -> Outcome {
    if std::fs::canonicalize(from).ok() == std::fs::canonicalize(to).ok() {
        return Ok(());
    }
    let temporary = to.with_extension("installing");
    std::fs::copy(from, &temporary).map_err(|error| format!("{}: {error}", temporary.display()))?;
    std::fs::rename(&temporary, to).map_err(|error| format!("{}: {error}", to.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn helpers_are_known_by_their_base_name() {
        assert_eq!(helper_named(OsStr::new("/sbin/mount.flintfs")), Some(Helper::Mount));
        assert_eq!(helper_named(OsStr::new("fsck.flintfs")), Some(Helper::Fsck));
        assert_eq!(helper_named(OsStr::new("/sbin/mount.fuse.flintfs")), Some(Helper::Mount));
        assert_eq!(helper_named(OsStr::new("/usr/sbin/mkfs.flintfs")), Some(Helper::Mkfs));
        assert_eq!(helper_named(OsStr::new("flintfs")), None);
        assert_eq!(helper_named(OsStr::new("mount.flintfs.old")), None);
    }

    #[test]
    fn short_options_follow_getopt() {
        let arguments = words("img -fn -o ro,noatime dir -ofoo --size 1G -- -x");
        let mut parser = ShortOptions::new(&arguments);
        let mut seen = Vec::new();
        while let Some(option) = parser.next() {
            match option {
                Ok('o') => seen.push(format!("o={}", parser.value('o').ok().unwrap())),
                Ok(letter) => seen.push(letter.to_string()),
                Err(word) => seen.push(word.to_string()),
            }
        }
        // A long option's value is its caller's to take (next_word).
        assert_eq!(seen, ["f", "n", "o=ro,noatime", "o=foo", "--size"]);
        assert_eq!(parser.positional, ["img", "dir", "1G", "-x"]);
    }
}
