//! `flintfs demo`: the main job on the embedded default. It makes an image
//! in a temporary place, mounts it with FUSE, copies a generated tree into
//! it, makes it durable with fsync and sync, writes more, cuts the power,
//! mounts again (the recovery), checks that everything made durable is
//! there byte for byte, runs fsck, and prints the device's figures.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::image::parse_size;
use crate::{fail, Outcome};

#[derive(Args)]
pub struct DemoArguments {
    /// Size of the emulated device.
    #[arg(long, value_parser = parse_size, default_value = "512M")]
    pub size: u64,
    /// Files in the generated tree.
    #[arg(long, default_value_t = 2000)]
    pub files: u32,
    /// Drives the generated tree and the power cut.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Where to work (a new temporary directory when left out; removed
    /// at the end unless given).
    #[arg(long)]
    pub directory: Option<PathBuf>,
}

/// The files of the generated tree: path and contents, from the seed.
fn generate_tree(files: u32, seed: u64) -> Vec<(PathBuf, Vec<u8>)> {
    let mut random = Pcg64Mcg::seed_from_u64(seed);
    (0..files)
        .map(|index| {
            let path = PathBuf::from(format!("project/d{:02}/s{}/file{index:05}.dat", index / 100, index % 4));
            let size = match random.random_range(0..100) {
                0..5 => 0,
                5..70 => random.random_range(1..4096),
                70..98 => random.random_range(4096..65536),
                _ => random.random_range(262_144..1_048_576),
            };
            // Half text-like (compressible), half random.
            let bytes = if index.is_multiple_of(2) {
                (0..size).map(|offset| b"flintfs demo line\n"[offset % 18]).collect()
            } else {
                (0..size).map(|_| random.random()).collect()
            };
            (path, bytes)
        })
        .collect()
}

fn flintfs(arguments: &[&str]) -> Outcome<String> {
    let output = Command::new(std::env::current_exe()?).args(arguments).output()?;
    if !output.status.success() {
        fail!("flintfs {}: {}", arguments.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn unmount(mountpoint: &Path) -> Outcome {
    let root = unsafe { libc::geteuid() } == 0;
    let mut command = if root { Command::new("umount") } else { Command::new("fusermount3") };
    if !root {
        command.arg("-u");
    }
    let status = command.arg(mountpoint).status()?;
    if !status.success() {
        fail!("unmounting {} failed", mountpoint.display());
    }
    Ok(())
}

fn bar(length: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(length);
    bar.set_style(
        ProgressStyle::with_template("  {msg:<28} [{bar:32}] {pos}/{len} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message.to_string());
    bar
}

fn write_file(path: &Path, bytes: &[u8], sync: bool) -> Outcome {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|error| format!("{}: {error}", parent.display()))?;
    }
    let mut file = File::create(path).map_err(|error| format!("{}: {error}", path.display()))?;
    file.write_all(bytes).map_err(|error| format!("{}: {error}", path.display()))?;
    if sync {
        file.sync_all().map_err(|error| format!("fsync {}: {error}", path.display()))?;
    }
    Ok(())
}

pub fn demo(arguments: DemoArguments) -> Outcome<ExitCode> {
    let started = Instant::now();
    let (work, keep) = match &arguments.directory {
        Some(directory) => (directory.clone(), true),
        None => (std::env::temp_dir().join(format!("flintfs-demo-{}", std::process::id())), false),
    };
    std::fs::create_dir_all(&work).map_err(|error| format!("{}: {error}", work.display()))?;
    let result = run(&arguments, &work);
    if !keep {
        let mountpoint = work.join("mnt");
        if std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|table| table.contains(&format!(" {} ", mountpoint.display())))
        {
            let _ = unmount(&mountpoint);
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    result?;
    println!("demo finished in {:.1} s", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

fn run(arguments: &DemoArguments, work: &Path) -> Outcome {
    let image = work.join("demo.img");
    let mountpoint = work.join("mnt");
    std::fs::create_dir_all(&mountpoint)?;
    let image_text = image.to_string_lossy().into_owned();
    let mountpoint_text = mountpoint.to_string_lossy().into_owned();
    println!("flintfs demo: seed {}, {} files, in {}", arguments.seed, arguments.files, work.display());

    let size = format!("{}", arguments.size);
    print!("  {}", flintfs(&["mkfs", &image_text, "--size", &size, "--force"])?);
    let geometry: serde_json::Value = serde_json::from_str(&flintfs(&["inspect", &image_text, "geometry", "--json"])?)?;
    flintfs(&["mount", &image_text, &mountpoint_text])?;

    // The tree, copied in; every tenth file fsynced as it is written, and
    // the last. What fsync returned for is promised to survive the cut.
    // (sync(2) is no promise here: the kernel's FUSE_SYNCFS does not reach
    // the daemon through fuser, so it is done, and counted, as fsyncs.)
    let tree = generate_tree(arguments.files, arguments.seed);
    let tree_bytes: u64 = tree.iter().map(|(_, bytes)| bytes.len() as u64).sum();
    let copy = bar(tree.len() as u64, "copy a tree (fsync 1 in 10)");
    let copy_started = Instant::now();
    let fsynced = |index: usize| index.is_multiple_of(10) || index + 1 == tree.len();
    for (index, (path, bytes)) in tree.iter().enumerate() {
        write_file(&mountpoint.join(path), bytes, fsynced(index))?;
        copy.inc(1);
    }
    copy.finish();
    let copy_seconds = copy_started.elapsed().as_secs_f64();
    let before_cut: serde_json::Value = serde_json::from_str(&flintfs(&["stat", &mountpoint_text, "--json"])?)?;

    // More work after the sync, none of it made durable; then the power
    // goes.
    let extra = generate_tree(arguments.files / 4, arguments.seed ^ 0x5eed);
    let volatile = bar(extra.len() as u64, "write more, no fsync");
    for (path, bytes) in &extra {
        write_file(&mountpoint.join("after-sync").join(path), bytes, false)?;
        volatile.inc(1);
    }
    volatile.finish();
    let seed = format!("{}", arguments.seed);
    let cut = flintfs(&["powercut", &mountpoint_text, "--seed", &seed])?;
    println!("  {}", cut.trim());

    // Recovery: the next mount. Everything synced must be there.
    let mount_started = Instant::now();
    flintfs(&["mount", &image_text, &mountpoint_text])?;
    let mount_ms = mount_started.elapsed().as_secs_f64() * 1000.0;
    let after_mount: serde_json::Value = serde_json::from_str(&flintfs(&["stat", &mountpoint_text, "--json"])?)?;
    let verify = bar(tree.len() as u64, "verify after recovery");
    let mut wrong = Vec::new();
    let mut intact = 0;
    for (index, (path, bytes)) in tree.iter().enumerate() {
        match std::fs::read(mountpoint.join(path)) {
            Ok(found) if found == *bytes => intact += 1,
            Ok(_) if fsynced(index) => wrong.push(format!("{} differs", path.display())),
            Err(error) if fsynced(index) => wrong.push(format!("{}: {error}", path.display())),
            _ => {}
        }
        verify.inc(1);
    }
    let promised = (0..tree.len()).filter(|&index| fsynced(index)).count();
    verify.finish();
    let survived = extra
        .iter()
        .filter(|(path, bytes)| {
            std::fs::read(mountpoint.join("after-sync").join(path)).is_ok_and(|found| found == *bytes)
        })
        .count();
    unmount(&mountpoint)?;
    let fsck = Command::new(std::env::current_exe()?).args(["fsck", &image_text]).output()?;
    let fsck_line = String::from_utf8_lossy(&fsck.stdout).lines().last().unwrap_or("").to_string();

    let number = |value: &serde_json::Value, name: &str| value[name].as_u64().unwrap_or(0);
    let page_size = geometry["page_size"].as_u64().unwrap_or(4096);
    println!();
    println!(
        "  device: {} zones x {} blocks x {} pages of {} B + {} B OOB",
        geometry["zone_count"], geometry["zone_blocks"], geometry["block_pages"], page_size, geometry["oob_size"]
    );
    println!("  tree: {} files, {:.1} MiB, copied in {:.2} s", tree.len(), tree_bytes as f64 / 1048576.0, copy_seconds);
    println!("  first mount, up to the cut (device counters since mount):");
    for field in
        ["pages_programmed", "data_bytes_programmed", "oob_bytes_programmed", "erases", "flushes", "pages_read"]
    {
        println!("    {field:<24} {}", number(&before_cut, field));
    }
    let programmed = number(&before_cut, "data_bytes_programmed") + number(&before_cut, "oob_bytes_programmed");
    println!("    {:<24} {:.3}", "bytes programmed / byte", programmed as f64 / tree_bytes.max(1) as f64);
    println!("    {:<24} {:.3} ms", "device time", number(&before_cut, "device_time_ns") as f64 / 1e6);
    println!("  recovery mount: {} pages read, {:.1} ms host time", number(&after_mount, "mount_pages_read"), mount_ms);
    println!(
        "  after the cut: {} of {} fsynced files intact (promised); {} of {} tree files intact; {} of {} files \
         written after the last fsync survived (not promised)",
        promised - wrong.len(),
        promised,
        intact,
        tree.len(),
        survived,
        extra.len()
    );
    println!("  fsck: {fsck_line}");
    if !wrong.is_empty() {
        fail!("{} fsynced files lost or damaged by the power cut, first: {}", wrong.len(), wrong[0]);
    }
    if !fsck.status.success() {
        fail!("fsck found problems: {}", String::from_utf8_lossy(&fsck.stdout).trim());
    }
    Ok(())
}
