//! The littlefs peer: the `littlefs2` crate (littlefs in C) in-process, on
//! the same emulated flash as flintfs, in its raw NAND shape (every 256 KiB
//! erase block its own zone), so its programs, erases and device time come
//! from the same counters and cost model.
//!
//! littlefs writes a block front to back after erasing it; the adapter
//! programs pages at the block's write pointer and, where littlefs skips
//! ahead, programs the skipped pages erased-looking (all ones), as a NAND
//! driver under littlefs must. Reads past the write pointer return ones.

use std::time::Instant;

use flintfs_flash::{DeviceOptions, FlashDevice, Geometry, MemoryFlash, PageAddress};
use littlefs2::consts::{U32, U4096};
use littlefs2::driver::Storage;
use littlefs2::fs::Filesystem;
use littlefs2::io::{Error, Result, SeekFrom};
use littlefs2::path::PathBuf;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Value};

use crate::bench::{Files, Size};
use crate::Outcome;

const PAGE_BYTES: usize = 4096;
const BLOCK_PAGES: usize = 64;
const BLOCK_BYTES: usize = PAGE_BYTES * BLOCK_PAGES;
/// One append, as the other targets write it.
const APPEND_BYTES: usize = 4096;
/// Erase blocks of the quick and the full device (512 MiB and 2 GiB, as
/// flintfs's).
pub const QUICK_BLOCKS: usize = (512 << 20) / BLOCK_BYTES;
pub const FULL_BLOCKS: usize = (2 << 30) / BLOCK_BYTES;

/// The emulated device under littlefs; `BLOCKS` erase blocks.
pub struct LittleStorage<const BLOCKS: usize> {
    device: MemoryFlash,
    oob: Vec<u8>,
}

impl<const BLOCKS: usize> LittleStorage<BLOCKS> {
    pub fn new() -> Outcome<LittleStorage<BLOCKS>> {
        let geometry = Geometry {
            page_size_bytes: PAGE_BYTES as u32,
            block_pages: BLOCK_PAGES as u32,
            zone_blocks: 1,
            zone_count: BLOCKS as u32,
            // Raw NAND: no limit on blocks programmed but not full.
            open_zones_max: BLOCKS as u32,
            ..Geometry::default()
        };
        let oob = vec![0xff; geometry.oob_size_bytes as usize];
        Ok(LittleStorage { device: crate::bench::bench_device(geometry, DeviceOptions::default())?, oob })
    }

    fn address(offset: usize) -> PageAddress {
        PageAddress::new((offset / BLOCK_BYTES) as u32, ((offset % BLOCK_BYTES) / PAGE_BYTES) as u32)
    }
}

impl<const BLOCKS: usize> Storage for LittleStorage<BLOCKS> {
    const READ_SIZE: usize = PAGE_BYTES;
    const WRITE_SIZE: usize = PAGE_BYTES;
    const BLOCK_SIZE: usize = BLOCK_BYTES;
    const BLOCK_COUNT: usize = BLOCKS;
    // Wear levelling on, as littlefs recommends for NAND (100 to 1000).
    const BLOCK_CYCLES: isize = 500;
    type CACHE_SIZE = U4096;
    type LOOKAHEAD_SIZE = U32;

    fn read(&mut self, offset: usize, buffer: &mut [u8]) -> Result<usize> {
        for (index, page) in buffer.chunks_mut(PAGE_BYTES).enumerate() {
            let address = Self::address(offset + index * PAGE_BYTES);
            let written = self.device.report_zone(address.zone).map_err(|_| Error::IO)?.write_pointer;
            if address.page >= written {
                page.fill(0xff);
            } else {
                let mut oob = vec![0u8; self.oob.len()];
                self.device.read_page(address, page, &mut oob).map_err(|_| Error::IO)?;
            }
        }
        Ok(buffer.len())
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<usize> {
        for (index, page) in data.chunks(PAGE_BYTES).enumerate() {
            let address = Self::address(offset + index * PAGE_BYTES);
            let mut pointer = self.device.report_zone(address.zone).map_err(|_| Error::IO)?.write_pointer;
            if address.page < pointer {
                // littlefs never programs a page twice between erases.
                return Err(Error::IO);
            }
            let ones = vec![0xffu8; PAGE_BYTES];
            while pointer < address.page {
                self.device
                    .program_page(PageAddress::new(address.zone, pointer), &ones, &self.oob)
                    .map_err(|_| Error::IO)?;
                pointer += 1;
            }
            self.device.program_page(address, page, &self.oob).map_err(|_| Error::IO)?;
        }
        Ok(data.len())
    }

    fn erase(&mut self, offset: usize, length: usize) -> Result<usize> {
        for block in (offset / BLOCK_BYTES)..(offset + length).div_ceil(BLOCK_BYTES) {
            self.device.reset_zone(block as u32).map_err(|_| Error::IO)?;
        }
        Ok(length)
    }
}

fn path(text: &str) -> PathBuf {
    PathBuf::try_from(text).expect("a valid littlefs path")
}

fn lfs(error: Error) -> crate::Failure {
    crate::Failure(format!("littlefs: error {}", error.code()))
}

/// Runs `workload` on littlefs; the row as the other targets give it.
pub fn run<const BLOCKS: usize>(workload: &str, size: Size, seed: u64) -> Outcome<Value> {
    if crate::bench_staged::is_staged(workload) {
        return run_staged::<BLOCKS>(workload, size, seed);
    }
    let (files, appends, varmail) = (size.files, size.appends, (size.varmail_files, size.varmail_loops));
    let mut storage = LittleStorage::<BLOCKS>::new()?;
    Filesystem::format(&mut storage).map_err(lfs)?;
    // A mount's reads are what littlefs reads to mount.
    let before_mount = storage.device.counters();
    let mut allocation = Filesystem::allocate();
    let mut fs = Filesystem::mount(&mut allocation, &mut storage).map_err(lfs)?;
    let mut at_start = None;
    let mut random = Pcg64Mcg::seed_from_u64(seed);
    let mut block = vec![0u8; APPEND_BYTES];
    let file_path = |index: usize| format!("/d{:03}/f{index:06}", index % 100);
    let seconds;
    let ops: u64 = {
        match workload {
            "create_fsync" | "delete" => {
                for directory in 0..100 {
                    fs.create_dir(&path(&format!("/d{directory:03}"))).map_err(lfs)?;
                }
                if workload == "delete" {
                    for index in 0..files {
                        fs.open_file_with_options_and_then(
                            |o| o.write(true).create(true),
                            &path(&file_path(index)),
                            |_| Ok(()),
                        )
                        .map_err(lfs)?;
                    }
                }
                at_start = Some(device_counters(&mut fs));
                let start = Instant::now();
                for index in 0..files {
                    let at = path(&file_path(index));
                    if workload == "delete" {
                        fs.remove(&at).map_err(lfs)?;
                    } else {
                        fs.open_file_with_options_and_then(|o| o.write(true).create(true), &at, |file| file.sync())
                            .map_err(lfs)?;
                    }
                }
                seconds = start.elapsed().as_secs_f64();
                files as u64
            }
            "append_fsync10" | "append_fsync1000" => {
                let every = if workload == "append_fsync10" { 10 } else { 1000 };
                random.fill(&mut block[APPEND_BYTES / 2..]);
                at_start = Some(device_counters(&mut fs));
                let start = Instant::now();
                fs.open_file_with_options_and_then(
                    |o| o.write(true).create(true),
                    &path("/log"),
                    |file| {
                        for index in 0..appends {
                            file.write(&block)?;
                            if (index + 1) % every == 0 {
                                file.sync()?;
                            }
                        }
                        Ok(())
                    },
                )
                .map_err(lfs)?;
                seconds = start.elapsed().as_secs_f64();
                appends as u64
            }
            "varmail" => {
                let (count, loops) = varmail;
                fs.create_dir(&path("/mail")).map_err(lfs)?;
                let mail = |index: usize| path(&format!("/mail/m{index:06}"));
                let mut message = vec![0u8; 16 << 10];
                let mut live: Vec<usize> = (0..count).collect();
                for &index in &live {
                    random.fill(&mut message[8 << 10..]);
                    fs.write(&mail(index), &message).map_err(lfs)?;
                }
                at_start = Some(device_counters(&mut fs));
                let start = Instant::now();
                let mut scratch = vec![0u8; 64 << 10];
                for next in count..count + loops {
                    let victim = live.swap_remove(random.random_range(0..live.len()));
                    fs.remove(&mail(victim)).map_err(lfs)?;
                    random.fill(&mut message[8 << 10..]);
                    fs.open_file_with_options_and_then(
                        |o| o.write(true).create(true),
                        &mail(next),
                        |file| {
                            file.write(&message)?;
                            file.sync()
                        },
                    )
                    .map_err(lfs)?;
                    live.push(next);
                    let other = live[random.random_range(0..live.len())];
                    random.fill(&mut message[8 << 10..]);
                    fs.open_file_with_options_and_then(
                        |o| o.read(true).write(true),
                        &mail(other),
                        |file| {
                            while file.read(&mut scratch)? > 0 {}
                            file.seek(SeekFrom::End(0))?;
                            file.write(&message)?;
                            file.sync()
                        },
                    )
                    .map_err(lfs)?;
                    let reread = live[random.random_range(0..live.len())];
                    fs.open_file_with_options_and_then(
                        |o| o.read(true),
                        &mail(reread),
                        |file| {
                            while file.read(&mut scratch)? > 0 {}
                            Ok(())
                        },
                    )
                    .map_err(lfs)?;
                }
                seconds = start.elapsed().as_secs_f64();
                loops as u64 * 13
            }
            "large_seq_write" | "large_rand_write" => {
                // One open file, as the other targets keep it.
                let blocks = size.large_file_bytes as usize / APPEND_BYTES;
                random.fill(&mut block[APPEND_BYTES / 2..]);
                let overwrite = workload == "large_rand_write";
                if overwrite {
                    // Allocated first, so the measured phase overwrites.
                    fs.open_file_with_options_and_then(
                        |o| o.write(true).create(true),
                        &path("/large"),
                        |file| {
                            for _ in 0..blocks {
                                file.write(&block)?;
                            }
                            Ok(())
                        },
                    )
                    .map_err(lfs)?;
                }
                at_start = Some(device_counters(&mut fs));
                let start = Instant::now();
                fs.open_file_with_options_and_then(
                    |o| o.write(true).create(true),
                    &path("/large"),
                    |file| {
                        for index in 0..blocks {
                            let at = if overwrite { random.random_range(0..blocks) } else { index };
                            file.seek(SeekFrom::Start((at * APPEND_BYTES) as u32))?;
                            file.write(&block)?;
                        }
                        file.sync()
                    },
                )
                .map_err(lfs)?;
                seconds = start.elapsed().as_secs_f64();
                blocks as u64
            }
            mount if mount.starts_with("mount_") => {
                // The files, then (below) a mount: littlefs's mount cost.
                let mut files = LittleFiles { fs: &mut fs, paths: std::collections::HashMap::new(), next: 0 };
                let count: usize =
                    mount["mount_".len()..].parse().map_err(|_| crate::Failure(format!("bad workload {mount}")))?;
                for directory in 0..100 {
                    files.mkdir(&format!("d{directory:03}"))?;
                }
                for index in 0..count {
                    let handle = files.create(&file_path(index)[1..])?;
                    files.close(handle)?;
                }
                seconds = 0.0;
                1
            }
            _ => {
                // The generic workloads open and close per operation, as
                // their flows do; closing is littlefs's sync.
                let mut files = LittleFiles { fs: &mut fs, paths: std::collections::HashMap::new(), next: 0 };
                let (ops, phase) = crate::bench::timed_workload(workload, &mut files, size, seed);
                seconds = phase.seconds;
                at_start = phase.at_start;
                ops?
            }
        }
    };
    // littlefs keeps no state for an unmount to write: every file was
    // closed, so nothing is left buffered.
    let _ = fs;
    // From the measured phase's start (or the mount, where a workload has
    // none) to the end.
    let programmed = storage.device.counters().since(&at_start.unwrap_or(before_mount));
    let mount_started = Instant::now();
    let mount_reads = {
        let mut allocation = Filesystem::allocate();
        let before = storage.device.counters().pages_read;
        Filesystem::mount(&mut allocation, &mut storage).map_err(lfs)?;
        storage.device.counters().pages_read - before
    };
    // The mount workloads time the mount itself.
    let seconds = if workload.starts_with("mount_") { mount_started.elapsed().as_secs_f64() } else { seconds };
    Ok(row(workload, ops, seconds, &programmed, mount_reads))
}

/// A littlefs row, as the other targets give theirs.
fn row(workload: &str, ops: u64, seconds: f64, programmed: &flintfs_flash::Counters, mount_reads: u64) -> Value {
    json!({
        "workload": workload,
        "target": "littlefs",
        "ops": ops,
        "ops_per_s": ops as f64 / seconds.max(1e-9),
        "bytes_per_op": (programmed.data_bytes_programmed + programmed.oob_bytes_programmed) as f64 / ops.max(1) as f64,
        "pages_programmed": programmed.pages_programmed,
        "erases": programmed.erases,
        "device_time_ns_per_op": programmed.device_time_ns as f64 / ops.max(1) as f64,
        "mount_pages_read": mount_reads,
    })
}

/// A staged workload (see `bench_staged`): its preparation on one mount,
/// its measured half on the next.
fn run_staged<const BLOCKS: usize>(workload: &str, size: Size, seed: u64) -> Outcome<Value> {
    let mut storage = LittleStorage::<BLOCKS>::new()?;
    Filesystem::format(&mut storage).map_err(lfs)?;
    let mut staged = crate::bench_staged::Staged::new(workload, size, seed)?;
    let mut phase = crate::bench::Phase::default();
    {
        let mut allocation = Filesystem::allocate();
        let mut fs = Filesystem::mount(&mut allocation, &mut storage).map_err(lfs)?;
        let mut files = LittleFiles { fs: &mut fs, paths: std::collections::HashMap::new(), next: 0 };
        staged.prepare(&mut files, &mut phase)?;
    }
    let before_mount = storage.device.counters();
    let mut allocation = Filesystem::allocate();
    let mut fs = Filesystem::mount(&mut allocation, &mut storage).map_err(lfs)?;
    let mount_reads = device_counters(&mut fs).pages_read - before_mount.pages_read;
    let ops = {
        let mut files = LittleFiles { fs: &mut fs, paths: std::collections::HashMap::new(), next: 0 };
        staged.measure(&mut files, &mut phase)?
    };
    let _ = fs;
    let programmed = storage.device.counters().since(&phase.at_start.unwrap_or(before_mount));
    let mut value = row(workload, ops, phase.seconds, &programmed, mount_reads);
    crate::bench::add_fields(&mut value, &phase);
    Ok(value)
}

/// The generic workloads' file operations on littlefs, one open and close
/// per operation (littlefs2's files live inside a closure). A write closes
/// its file, which is a littlefs sync: fsync is then free.
struct LittleFiles<'f, 'a, const BLOCKS: usize> {
    fs: &'f mut Filesystem<'a, LittleStorage<BLOCKS>>,
    paths: std::collections::HashMap<u64, PathBuf>,
    next: u64,
}

impl<const BLOCKS: usize> LittleFiles<'_, '_, BLOCKS> {
    fn path_of(&self, handle: u64) -> Outcome<PathBuf> {
        self.paths.get(&handle).cloned().ok_or_else(|| crate::Failure(format!("no open file {handle}")))
    }

    fn keep(&mut self, at: &str) -> u64 {
        self.next += 1;
        self.paths.insert(self.next, path(&format!("/{at}")));
        self.next
    }
}

impl<const BLOCKS: usize> Files for LittleFiles<'_, '_, BLOCKS> {
    fn mkdir(&mut self, at: &str) -> Outcome {
        self.fs.create_dir(&path(&format!("/{at}"))).map_err(lfs)
    }
    fn create(&mut self, at: &str) -> Outcome<u64> {
        self.fs
            .open_file_with_options_and_then(
                |o| o.write(true).create(true).truncate(true),
                &path(&format!("/{at}")),
                |_| Ok(()),
            )
            .map_err(lfs)?;
        Ok(self.keep(at))
    }
    fn open(&mut self, at: &str) -> Outcome<u64> {
        self.fs.open_file_and_then(&path(&format!("/{at}")), |_| Ok(())).map_err(lfs)?;
        Ok(self.keep(at))
    }
    fn write_at(&mut self, handle: u64, offset: u64, data: &[u8]) -> Outcome {
        let at = self.path_of(handle)?;
        self.fs
            .open_file_with_options_and_then(
                |o| o.write(true),
                &at,
                |file| {
                    file.seek(SeekFrom::Start(offset as u32))?;
                    file.write(data).map(|_| ())
                },
            )
            .map_err(lfs)
    }
    fn size(&mut self, handle: u64) -> Outcome<u64> {
        let at = self.path_of(handle)?;
        Ok(self.fs.metadata(&at).map_err(lfs)?.len() as u64)
    }
    fn read_all(&mut self, handle: u64) -> Outcome<usize> {
        let at = self.path_of(handle)?;
        let mut scratch = vec![0u8; 64 << 10];
        self.fs
            .open_file_and_then(&at, |file| {
                let mut total = 0;
                loop {
                    let read = file.read(&mut scratch)?;
                    if read == 0 {
                        return Ok(total);
                    }
                    total += read;
                }
            })
            .map_err(lfs)
    }
    fn fsync(&mut self, _handle: u64) -> Outcome {
        Ok(())
    }
    fn close(&mut self, handle: u64) -> Outcome {
        self.paths.remove(&handle);
        Ok(())
    }
    fn unlink(&mut self, at: &str) -> Outcome {
        self.fs.remove(&path(&format!("/{at}"))).map_err(lfs)
    }
    fn sync_all(&mut self) -> Outcome {
        Ok(())
    }
    fn space(&mut self) -> Outcome<(u64, u64)> {
        let total = self.fs.total_space() as u64;
        let available = self.fs.available_space().map_err(lfs)? as u64;
        Ok((total.saturating_sub(available), total))
    }
    fn read_at(&mut self, handle: u64, offset: u64, length: usize) -> Outcome<usize> {
        let at = self.path_of(handle)?;
        let mut bytes = vec![0u8; length];
        self.fs
            .open_file_and_then(&at, |file| {
                file.seek(SeekFrom::Start(offset as u32))?;
                let mut done = 0;
                while done < length {
                    match file.read(&mut bytes[done..])? {
                        0 => break,
                        read => done += read,
                    }
                }
                Ok(done)
            })
            .map_err(lfs)
    }
    fn device_time_ns(&mut self) -> Option<u64> {
        Some(device_counters(self.fs).device_time_ns)
    }
    /// littlefs allocates nothing: its memory is the mount's buffers (read
    /// and program caches, lookahead) and one open file's, whatever the
    /// number of files.
    fn memory_bytes(&mut self) -> Outcome<Option<u64>> {
        Ok(Some(
            (std::mem::size_of::<littlefs2::fs::Allocation<LittleStorage<BLOCKS>>>()
                + std::mem::size_of::<littlefs2::fs::FileAllocation<LittleStorage<BLOCKS>>>()) as u64,
        ))
    }
    fn counters(&mut self) -> Outcome<Option<flintfs_flash::Counters>> {
        Ok(Some(device_counters(self.fs)))
    }
}

/// The device's counters under a mounted littlefs.
fn device_counters<const BLOCKS: usize>(fs: &mut Filesystem<'_, LittleStorage<BLOCKS>>) -> flintfs_flash::Counters {
    // SAFETY: only the counters are read; littlefs has no call in flight.
    unsafe { fs.borrow_storage_mut() }.device.counters()
}
