//! Host throughput of the emulator: 4 KiB page program and read on the
//! memory backend (and the image backend), next to a plain memcpy of the
//! same bytes in the same run. The emulator must never be what limits the
//! file system above it.
//!
//! Run: `cargo bench -p flintfs-flash --bench throughput` (add `-- --quick`
//! for a short run).

use std::hint::black_box;
use std::time::{Duration, Instant};

use flintfs_flash::{DeviceOptions, FlashDevice, FlashEmulator, Geometry, ImageFlash, MemoryFlash, PageAddress};

const ROUNDS: usize = 5;

struct Figure {
    name: &'static str,
    bytes: u64,
    best: Duration,
}

impl Figure {
    fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0) / self.best.as_secs_f64()
    }
}

fn best_of(rounds: usize, mut run: impl FnMut() -> Duration) -> Duration {
    (0..rounds).map(|_| run()).min().expect("at least one round")
}

/// Programs every page of the device zone by zone, flushing each zone.
fn program_all<B: flintfs_flash::Backend>(device: &mut FlashEmulator<B>, data: &[u8], oob: &[u8]) -> Duration {
    let geometry = device.geometry();
    for zone in 0..geometry.zone_count {
        device.reset_zone(zone).unwrap();
    }
    let start = Instant::now();
    for zone in 0..geometry.zone_count {
        for page in 0..geometry.zone_pages() as u32 {
            device.program_page(PageAddress::new(zone, page), data, oob).unwrap();
        }
        device.flush().unwrap();
    }
    start.elapsed()
}

fn read_all<B: flintfs_flash::Backend>(device: &mut FlashEmulator<B>, data: &mut [u8], oob: &mut [u8]) -> Duration {
    let geometry = device.geometry();
    let start = Instant::now();
    for zone in 0..geometry.zone_count {
        for page in 0..geometry.zone_pages() as u32 {
            device.read_page(PageAddress::new(zone, page), data, oob).unwrap();
            black_box(&data[0]);
        }
    }
    start.elapsed()
}

fn main() {
    let quick = std::env::args().any(|argument| argument == "--quick");
    let size_bytes: u64 = if quick { 64 << 20 } else { 256 << 20 };
    let rounds = if quick { 2 } else { ROUNDS };
    let geometry = Geometry::with_size_bytes(size_bytes);
    let page = geometry.page_size_bytes as usize;
    let oob_size = geometry.oob_size_bytes as usize;
    let pages = geometry.device_pages();
    let data: Vec<u8> = (0..page).map(|index| (index * 7) as u8).collect();
    let oob = vec![0x5A; oob_size];
    let data_bytes = pages * page as u64;

    println!("flintfs-flash throughput benchmark");
    println!(
        "  geometry: {} B pages + {} B OOB, {} pages/block, {} blocks/zone, {} zones ({} MiB), faults off",
        geometry.page_size_bytes,
        geometry.oob_size_bytes,
        geometry.block_pages,
        geometry.zone_blocks,
        geometry.zone_count,
        size_bytes >> 20
    );
    println!(
        "  workload: program every page in zone order with a flush per zone, then read every page; best of {rounds} rounds"
    );
    println!("  host: {} cores, profile bench (release)", std::thread::available_parallelism().map_or(0, |n| n.get()));

    let mut figures = Vec::new();

    // memcpy of the same bytes into a device-sized buffer, page by page.
    let mut destination = vec![0u8; (pages as usize) * (page + oob_size)];
    let memcpy_write = best_of(rounds, || {
        let start = Instant::now();
        for slot in destination.chunks_exact_mut(page + oob_size) {
            slot[..page].copy_from_slice(black_box(&data));
            slot[page..].copy_from_slice(black_box(&oob));
        }
        black_box(&destination);
        start.elapsed()
    });
    figures.push(Figure { name: "memcpy 4 KiB into buffer", bytes: data_bytes, best: memcpy_write });
    let mut read_data = vec![0u8; page];
    let mut read_oob = vec![0u8; oob_size];
    let memcpy_read = best_of(rounds, || {
        let start = Instant::now();
        for slot in destination.chunks_exact(page + oob_size) {
            read_data.copy_from_slice(black_box(&slot[..page]));
            read_oob.copy_from_slice(black_box(&slot[page..]));
            black_box(&read_data[0]);
        }
        start.elapsed()
    });
    figures.push(Figure { name: "memcpy 4 KiB out of buffer", bytes: data_bytes, best: memcpy_read });
    drop(destination);

    let mut memory = MemoryFlash::memory(geometry, DeviceOptions::default()).unwrap();
    let program = best_of(rounds, || program_all(&mut memory, &data, &oob));
    figures.push(Figure { name: "memory backend: program 4 KiB", bytes: data_bytes, best: program });
    let read = best_of(rounds, || read_all(&mut memory, &mut read_data, &mut read_oob));
    figures.push(Figure { name: "memory backend: read 4 KiB", bytes: data_bytes, best: read });
    let simulated_ns = {
        memory.reset_counters();
        program_all(&mut memory, &data, &oob);
        memory.counters().device_time_ns
    };
    drop(memory);

    let directory = tempfile_directory();
    let path = directory.join("throughput.img");
    let _ = std::fs::remove_file(&path);
    let mut image = ImageFlash::create_image(&path, geometry, DeviceOptions::default()).unwrap();
    let image_program = best_of(rounds.min(2), || program_all(&mut image, &data, &oob));
    figures.push(Figure { name: "image backend: program 4 KiB", bytes: data_bytes, best: image_program });
    let image_read = best_of(rounds.min(2), || read_all(&mut image, &mut read_data, &mut read_oob));
    figures.push(Figure { name: "image backend: read 4 KiB", bytes: data_bytes, best: image_read });
    drop(image);
    let _ = std::fs::remove_file(&path);

    println!();
    println!("| {:<32} | {:>10} | {:>12} | {:>14} |", "operation", "MiB/s", "ns per page", "vs memcpy");
    println!("|{:-<34}|{:->12}|{:->14}|{:->16}|", "", "", "", "");
    for figure in &figures {
        let baseline =
            if figure.name.contains("read") || figure.name.contains("out of") { memcpy_read } else { memcpy_write };
        println!(
            "| {:<32} | {:>10.0} | {:>12.0} | {:>13.2}x |",
            figure.name,
            figure.mib_per_s(),
            figure.best.as_nanos() as f64 / pages as f64,
            figure.best.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    println!();
    println!(
        "simulated device time for one full program pass: {:.3} s ({:.0} MiB/s of simulated NAND)",
        simulated_ns as f64 / 1e9,
        data_bytes as f64 / (1024.0 * 1024.0) / (simulated_ns as f64 / 1e9)
    );
}

fn tempfile_directory() -> std::path::PathBuf {
    std::env::var_os("FLINTFS_BENCH_DIR").map(Into::into).unwrap_or_else(std::env::temp_dir)
}
