//! What each protection level costs (RCFFS's table 2, with parity on and
//! off): the `protection_*` workloads. Each writes one large file through
//! the engine on the emulated device at one level, syncs, mounts again and
//! reads it back, and reports the space the level takes from the device,
//! the pages it programs per data page, and the write and read throughput
//! in device time (the emulator's cost model) and host time (the CPU the
//! seal, the ECC and the parity cost here).

use std::time::Instant;

use flintfs_core::{Fs, FsOptions, ManualClock, MkfsOptions};
use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash};
use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Value};

use crate::{Failure, Outcome};

/// (workload, what it is, OOB bytes, k, r, NVM bytes).
pub const LEVELS: [(&str, &str, u32, u32, u32, u64); 6] = [
    ("protection_none", "none: header and signature only (72-byte OOB, no ECC)", 72, 0, 0, 0),
    ("protection_ecc", "ECC only", 128, 0, 0, 0),
    ("protection_k1", "ECC, block parity k = 1", 128, 1, 0, 0),
    ("protection_k2", "ECC, block parity k = 2", 128, 2, 0, 0),
    ("protection_k1_rs", "ECC, k = 1, zone RS r = 1 (the default)", 128, 1, 1, 0),
    ("protection_k1_rs_nvm", "the default, with 64 MiB of NVM (open stripes' parity there)", 128, 1, 1, 64 << 20),
];

fn engine(error: flintfs_core::Error) -> Failure {
    Failure(error.message)
}

pub fn run(workload: &str, quick: bool, seed: u64) -> Outcome<Value> {
    let Some(&(_, description, oob, block_parity, zone_parity, nvm_size_bytes)) =
        LEVELS.iter().find(|level| level.0 == workload)
    else {
        return Err(Failure(format!("no protection level {workload}")));
    };
    let file_bytes: u64 = if quick { 16 << 20 } else { 128 << 20 };
    let geometry = Geometry {
        oob_size_bytes: oob,
        zone_count: if quick { 32 } else { 128 },
        nvm_size_bytes,
        ..Geometry::default()
    };
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let device = MemoryFlash::memory(geometry, DeviceOptions::default())?;
    let options = MkfsOptions {
        block_parity_pages: block_parity,
        segment_parity_blocks: zone_parity,
        ..MkfsOptions::new([5; 16], 0)
    };
    let device = Fs::format(device, &options, Box::new(clock.clone())).map_err(engine)?;
    let (mut fs, _) = Fs::mount(device, FsOptions::default(), Box::new(clock.clone())).map_err(engine)?;
    let statfs = fs.statfs().map_err(engine)?;
    let usable_bytes = statfs.blocks * u64::from(statfs.block_size);
    let mut chunk = vec![0u8; 1 << 20];
    Pcg64Mcg::seed_from_u64(seed).fill_bytes(&mut chunk);
    let before = fs.device().counters();
    let host = Instant::now();
    let file = fs.create(1, b"large", 0o644, 0, 0).map_err(engine)?;
    for offset in (0..file_bytes).step_by(chunk.len()) {
        fs.write(file.ino, offset, &chunk).map_err(engine)?;
    }
    fs.fsync(file.ino, false).map_err(engine)?;
    let write_host_s = host.elapsed().as_secs_f64();
    let written = fs.device().counters().since(&before);
    fs.forget(file.ino, 1).map_err(engine)?;
    // The open-stripe window under small synchronous writes too (a mail
    // spool's shape): files of 1 to 3 blocks in 8 directories, an fsync
    // every tenth, so log, node and data heads all have blocks open.
    let small_files = if quick { 500 } else { 4000 };
    let directories: Vec<u64> = (0..8)
        .map(|index| fs.mkdir(1, format!("d{index}").as_bytes(), 0o755, 0, 0).map(|attributes| attributes.ino))
        .collect::<Result<_, _>>()
        .map_err(engine)?;
    for index in 0..small_files {
        let directory = directories[index % directories.len()];
        let small = fs.create(directory, format!("f{index}").as_bytes(), 0o644, 0, 0).map_err(engine)?;
        let length = 4096 * (1 + index % 3) - 100;
        fs.write(small.ino, 0, &chunk[index * 97 % 4096..][..length]).map_err(engine)?;
        if index % 10 == 9 {
            fs.fsync(small.ino, false).map_err(engine)?;
        }
        fs.forget(small.ino, 1).map_err(engine)?;
    }
    let protection = fs.protection_counters();
    let (unprotected_pages_max, unprotected_durable_pages_max) =
        (protection.unprotected_pages_max, protection.unprotected_durable_pages_max);
    let stripe_records_written = protection.stripe_records_written;
    let unprotected_pages_bound = fs.volume().unprotected_pages_bound();
    let device = fs.unmount().map_err(engine)?;
    let (mut fs, _) = Fs::mount(device, FsOptions::default(), Box::new(clock)).map_err(engine)?;
    let before = fs.device().counters();
    let host = Instant::now();
    let file = fs.lookup(1, b"large").map_err(engine)?;
    for offset in (0..file_bytes).step_by(chunk.len()) {
        let read = fs.read(file.ino, offset, chunk.len() as u64).map_err(engine)?;
        if read != chunk {
            return Err(Failure(format!("{workload}: the file read back differs at {offset}")));
        }
    }
    let read_host_s = host.elapsed().as_secs_f64();
    let read = fs.device().counters().since(&before);
    let data_pages = file_bytes / u64::from(geometry.page_size_bytes);
    let megabytes = file_bytes as f64 / 1e6;
    let per_second = |seconds: f64| if seconds > 0.0 { megabytes / seconds } else { 0.0 };
    Ok(json!({
        "workload": workload,
        "target": "flintfs",
        "level": description,
        "file_bytes": file_bytes,
        "device_bytes": geometry.device_size_bytes(),
        "usable_bytes": usable_bytes,
        // The data bytes of the device the file system can use (the report
        // sets them against the level without parity).
        "usable_fraction": usable_bytes as f64 / geometry.device_size_bytes() as f64,
        "pages_programmed_per_data_page": written.pages_programmed as f64 / data_pages as f64,
        "write_mb_per_s_device": per_second(written.device_time_ns as f64 / 1e9),
        "read_mb_per_s_device": per_second(read.device_time_ns as f64 / 1e9),
        "write_mb_per_s_host": per_second(write_host_s),
        "read_mb_per_s_host": per_second(read_host_s),
        "small_files": small_files,
        // The most data pages programmed but not yet under a parity page on
        // flash, over the whole run, and the bound the layout sets (null:
        // no block parity, so every page of a zone being written waits).
        "unprotected_pages_max": unprotected_pages_max,
        "unprotected_pages_bound": unprotected_pages_bound,
        // The most pages a flush had made durable with neither parity on
        // flash nor a stripe record in NVM: what a power cut would leave
        // with the ECC alone.
        "unprotected_durable_pages_max": unprotected_durable_pages_max,
        "stripe_records_written": stripe_records_written,
        "nvm_size_bytes": nvm_size_bytes,
    }))
}

/// The cost table, in Markdown, from the rows of the `protection_*`
/// workloads (none when there are none).
pub fn table(rows: &[Value]) -> Option<String> {
    let rows: Vec<&Value> = rows
        .iter()
        .filter(|row| row["workload"].as_str().is_some_and(|name| name.starts_with("protection_")))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let none = rows.iter().find(|row| row["workload"] == "protection_none").copied();
    let relative = |row: &Value, field: &str| -> String {
        match none.and_then(|none| none[field].as_f64()).filter(|value| *value > 0.0) {
            Some(base) => format!("{:.2}x", row[field].as_f64().unwrap_or(0.0) / base),
            None => "-".to_string(),
        }
    };
    let mut out = String::from(
        "| protection | space for files (against none) | pages programmed per data page | write MB/s (device) | \
         read MB/s (device) | write MB/s (host CPU) | read MB/s (host CPU) | most pages under the ECC alone (bound) \
         | of them durable, under no parity on flash or in NVM |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &rows {
        out.push_str(&format!(
            "| {} | {:.1}% ({}) | {:.3} | {:.1} ({}) | {:.1} ({}) | {:.1} ({}) | {:.1} ({}) | {} | {} |\n",
            row["level"].as_str().unwrap_or("?"),
            row["usable_fraction"].as_f64().unwrap_or(0.0) * 100.0,
            relative(row, "usable_fraction"),
            row["pages_programmed_per_data_page"].as_f64().unwrap_or(0.0),
            row["write_mb_per_s_device"].as_f64().unwrap_or(0.0),
            relative(row, "write_mb_per_s_device"),
            row["read_mb_per_s_device"].as_f64().unwrap_or(0.0),
            relative(row, "read_mb_per_s_device"),
            row["write_mb_per_s_host"].as_f64().unwrap_or(0.0),
            relative(row, "write_mb_per_s_host"),
            row["read_mb_per_s_host"].as_f64().unwrap_or(0.0),
            relative(row, "read_mb_per_s_host"),
            match row["unprotected_pages_bound"].as_u64() {
                Some(bound) => format!("{} ({bound})", row["unprotected_pages_max"].as_u64().unwrap_or(0)),
                None => "every page of a zone being written".to_string(),
            },
            match row["unprotected_pages_bound"].as_u64() {
                Some(_) => row["unprotected_durable_pages_max"].as_u64().unwrap_or(0).to_string(),
                None => "-".to_string(),
            },
        ));
    }
    out.push_str(
        "\nSpace for files is the device's data bytes less the parity pages and the file system's own reserve \
         (the same at every level; large on the quick device); the OOB is not counted, so the ECC costs no space \
         here, only OOB bytes a device has anyway. Host CPU is this machine's, one core, in process: sealing \
         (signature and BCH parity) and, on read, the CRC check. RCFFS (EMSOFT'09, table 2) reports its parity's \
         cost on the same axes. The last column is the open-stripe window: the most data pages that were \
         programmed and acknowledged but not yet covered by a parity page on flash, over the large file and then \
         small files with an fsync every tenth, beside the bound the layout sets (docs/SEMANTICS.md). The next is \
         the part of it a flush had made durable with no parity on flash and no stripe record in NVM, which a \
         power cut would leave with the ECC alone: with NVM each flush persists the open stripes' running parity \
         (docs/FORMAT.md, \"Open stripes in NVM\").\n",
    );
    Some(out)
}
