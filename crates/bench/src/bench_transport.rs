//! # `fuse_transport`: the FUSE request floor, by transport
//!
//! Every request a FUSE mount sends costs a round trip between the caller
//! and the daemon. On this machine that round trip, not the engine, bounds
//! the metadata workloads over FUSE (see the report's FUSE floor table).
//! Linux 6.14 added a second transport, FUSE over io_uring: the daemon
//! registers ring entries per CPU, the kernel hands a request to the queue
//! of the CPU that made it, and a daemon thread pinned to that CPU answers
//! it. The caller and the daemon then meet on one CPU instead of waking
//! each other across two; in a virtual machine a cross-CPU wakeup is an
//! interprocessor interrupt and an exit from the halted CPU.
//!
//! fuser (the crate flintfs-fuse is built on) speaks only `/dev/fuse`, so
//! this probe measures the two transports with a file system of its own
//! that does nothing: every LOOKUP is answered ENOENT, the root's GETATTR
//! with a directory. One client thread then stats missing names, one
//! LOOKUP round trip each, as the report's floor does. Both transports are
//! measured in the same run, alternately, on the same kernel:
//! - `/dev/fuse`: [`DEVICE_WORKERS`] threads reading and answering
//!   `/dev/fuse`, as fuser's session does for flintfs;
//! - `io_uring`: one queue per CPU, [`RING_DEPTH`] entries each, each
//!   queue served by a thread pinned to its CPU (the kernel's module
//!   parameter `fuse.enable_uring` is switched on for the run and restored).
//!
//! The probe needs root (it mounts with mount(2)) and a kernel with the
//! io_uring transport; without one the row says so and carries the
//! `/dev/fuse` figure alone.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use flintfs_fuse::ring::{
    self, out_header, u32_at, u64_at, Request, BATCH_FORGET, DESTROY, FORGET, GETATTR, INIT, INTERRUPT,
    IN_HEADER_BYTES, LOOKUP,
};
use fuser::Errno;
use serde_json::{json, Value};

use crate::{fail, Failure, Outcome};

/// Threads answering `/dev/fuse` (fuser's session runs flintfs-fuse's
/// requests on this many).
pub const DEVICE_WORKERS: usize = 2;
/// Ring entries registered per CPU queue: requests one CPU can have in
/// flight before the next waits for an entry.
pub const RING_DEPTH: usize = 4;
/// Lookups one measurement makes (quick, full).
const LOOKUPS: [u64; 2] = [10_000, 40_000];
/// Alternating measurements of each transport; the row keeps the median.
const ROUNDS: usize = 3;

/// The largest write the probe offers, and so the payload each ring entry
/// must hold (the kernel refuses an entry smaller than the connection's
/// largest request).
const MAX_WRITE_BYTES: u32 = 128 << 10;
const PAGE_BYTES: usize = 4096;
/// A `/dev/fuse` read takes a whole request: header, arguments and payload.
const DEVICE_BUFFER_BYTES: usize = MAX_WRITE_BYTES as usize + 2 * PAGE_BYTES;

// The FUSE ABI (include/uapi/linux/fuse.h) beyond what `ring` names.
const FUSE_KERNEL_VERSION: u32 = 7;
const FUSE_INIT_EXT: u64 = 1 << 30;
const FUSE_OVER_IO_URING: u64 = 1 << 41;
const INIT_OUT_BYTES: usize = 64;
const ATTR_OUT_BYTES: usize = 104;
const _: () = assert!(DEVICE_BUFFER_BYTES >= 8192, "the kernel's smallest /dev/fuse read");

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// A request's header: (opcode, unique, nodeid).
fn header_of(bytes: &[u8]) -> (u32, u64, u64) {
    (u32_at(bytes, 4), u64_at(bytes, 8), u64_at(bytes, 16))
}

/// The root directory's attributes, valid for an hour.
fn root_attributes() -> [u8; ATTR_OUT_BYTES] {
    let mut out = [0u8; ATTR_OUT_BYTES];
    out[0..8].copy_from_slice(&3600u64.to_le_bytes()); // attr_valid
    let attr = 16;
    out[attr..attr + 8].copy_from_slice(&1u64.to_le_bytes()); // ino
    out[attr + 60..attr + 64].copy_from_slice(&(libc::S_IFDIR | 0o755).to_le_bytes()); // mode
    out[attr + 64..attr + 68].copy_from_slice(&2u32.to_le_bytes()); // nlink
    out[attr + 80..attr + 84].copy_from_slice(&4096u32.to_le_bytes()); // blksize
    out
}

/// The probe's whole file system: the error and reply payload for a
/// request, or `None` for one that takes no reply.
fn answer(opcode: u32, nodeid: u64) -> Option<(i32, Vec<u8>)> {
    match opcode {
        FORGET | BATCH_FORGET | INTERRUPT => None,
        LOOKUP => Some((-libc::ENOENT, Vec::new())),
        GETATTR if nodeid == 1 => Some((0, root_attributes().to_vec())),
        GETATTR => Some((-libc::ENOENT, Vec::new())),
        DESTROY => Some((0, Vec::new())),
        _ => Some((-libc::ENOSYS, Vec::new())),
    }
}

fn write_reply(device: i32, error: i32, unique: u64, payload: &[u8]) -> std::io::Result<()> {
    let header = out_header(error, unique, payload.len());
    let parts = [
        libc::iovec { iov_base: header.as_ptr() as *mut libc::c_void, iov_len: header.len() },
        libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() },
    ];
    // SAFETY: two iovecs over live buffers.
    let written = unsafe { libc::writev(device, parts.as_ptr(), 2) };
    if written < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reads one request from `/dev/fuse` into `buffer`; `None` once the
/// connection is gone.
fn read_request(device: i32, buffer: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: the buffer is live and as long as said.
        let read = unsafe { libc::read(device, buffer.as_mut_ptr() as *mut libc::c_void, buffer.len()) };
        if read >= IN_HEADER_BYTES as isize {
            return Some(read as usize);
        }
        let error = std::io::Error::last_os_error().raw_os_error();
        if read < 0 && matches!(error, Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN)) {
            continue; // an interrupted read, or a request that was interrupted away
        }
        return None;
    }
}

/// Serves `/dev/fuse` until the connection ends.
fn serve_device(device: i32) {
    let mut buffer = vec![0u8; DEVICE_BUFFER_BYTES];
    while let Some(length) = read_request(device, &mut buffer) {
        let (opcode, unique, nodeid) = header_of(&buffer[..length]);
        if let Some((error, payload)) = answer(opcode, nodeid) {
            if write_reply(device, error, unique, &payload).is_err() && opcode != INTERRUPT {
                return;
            }
        }
    }
}

/// A mounted probe: its device and mountpoint; unmounted when dropped.
struct Mount {
    device: Arc<OwnedFd>,
    mountpoint: PathBuf,
    mounted: bool,
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let path = CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).expect("no NUL");
            // SAFETY: a NUL-terminated path. A lazy unmount: the servers
            // see the connection end and return.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Mounts the probe at `mountpoint` and answers its INIT, offering the
/// io_uring transport when `uring` is set. Returns whether the kernel took
/// it.
fn mount(mountpoint: &Path, uring: bool) -> Outcome<(Mount, bool)> {
    let path = CString::new("/dev/fuse")?;
    // SAFETY: a NUL-terminated path.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        fail!("open /dev/fuse: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by nothing else.
    let device = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
    let target = CString::new(mountpoint.as_os_str().as_encoded_bytes())?;
    let options = CString::new(format!("fd={raw},rootmode=40000,user_id=0,group_id=0,default_permissions"))?;
    let source = CString::new("flintfs-probe")?;
    let kind = CString::new("fuse.flintfs-probe")?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let mounted = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr() as *const libc::c_void,
        )
    };
    if mounted != 0 {
        fail!("mount the FUSE probe at {}: {}", mountpoint.display(), std::io::Error::last_os_error());
    }
    let mount = Mount { device: device.clone(), mountpoint: mountpoint.to_path_buf(), mounted: true };
    let mut buffer = vec![0u8; DEVICE_BUFFER_BYTES];
    let Some(length) = read_request(raw, &mut buffer) else { fail!("the FUSE probe's connection ended before INIT") };
    let (opcode, unique, _) = header_of(&buffer[..length]);
    if opcode != INIT || length < IN_HEADER_BYTES + 24 {
        fail!("the FUSE probe's first request was {opcode}, not INIT");
    }
    let arguments = &buffer[IN_HEADER_BYTES..length];
    let (major, minor) = (u32_at(arguments, 0), u32_at(arguments, 4));
    let offered = u64::from(u32_at(arguments, 12)) | (u64::from(u32_at(arguments, 16)) << 32);
    if major != FUSE_KERNEL_VERSION || minor < 42 {
        fail!("the kernel speaks FUSE {major}.{minor}; the probe needs 7.42 or later");
    }
    // As the mount does: offered only if a ring can be made here (once
    // offered, the kernel holds every request until the ring is ready).
    let takes_uring = uring && offered & FUSE_OVER_IO_URING != 0 && ring::preflight().is_ok();
    let wanted = FUSE_INIT_EXT | if takes_uring { FUSE_OVER_IO_URING } else { 0 };
    let mut init = [0u8; INIT_OUT_BYTES];
    init[0..4].copy_from_slice(&FUSE_KERNEL_VERSION.to_le_bytes());
    init[4..8].copy_from_slice(&minor.min(44).to_le_bytes());
    init[8..12].copy_from_slice(&arguments[8..12]); // max_readahead, as offered
    init[12..16].copy_from_slice(&((wanted & offered) as u32).to_le_bytes());
    init[16..18].copy_from_slice(&16u16.to_le_bytes()); // max_background
    init[18..20].copy_from_slice(&12u16.to_le_bytes()); // congestion_threshold
    init[20..24].copy_from_slice(&MAX_WRITE_BYTES.to_le_bytes());
    init[24..28].copy_from_slice(&1u32.to_le_bytes()); // time_gran
    init[32..36].copy_from_slice((((wanted & offered) >> 32) as u32).to_le_bytes().as_slice());
    write_reply(raw, 0, unique, &init)?;
    Ok((mount, takes_uring))
}

/// Bytes each ring entry holds: at least the kernel's largest request on
/// the probe's connection, its max_write or (the probe asks for no
/// max_pages) 32 pages of this machine's page size.
fn ring_payload_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(PAGE_BYTES).max(PAGE_BYTES);
    (MAX_WRITE_BYTES as usize).max(32 * page) + page
}

/// Microseconds per LOOKUP round trip: `lookups` stats of missing names.
fn floor_us(mountpoint: &Path, lookups: u64) -> Outcome<f64> {
    let started = Instant::now();
    for index in 0..lookups {
        if std::fs::symlink_metadata(mountpoint.join(format!(".floor-{index}"))).is_ok() {
            fail!("the FUSE probe found a name it never made");
        }
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / lookups as f64)
}

/// One measurement: mount, serve, time the lookups, unmount.
fn measure(mountpoint: &Path, uring: bool, lookups: u64) -> Outcome<Option<f64>> {
    let (mount, took) = mount(mountpoint, uring)?;
    if uring && !took {
        return Ok(None);
    }
    let mut servers = Vec::new();
    // /dev/fuse still carries FORGETs and INTERRUPTs on a ring connection.
    let device_workers = if uring { 1 } else { DEVICE_WORKERS };
    for _ in 0..device_workers {
        let keep = mount.device.clone();
        servers.push(std::thread::spawn(move || serve_device(keep.as_raw_fd())));
    }
    let served = Arc::new(AtomicU64::new(0));
    let mut queues = None;
    let mut refused = false;
    if uring {
        // The same queues the mount runs (flintfs_fuse::ring), answering
        // as the probe does, and counting the lookups that crossed them.
        let counted = served.clone();
        let answer = move |request: &Request, out: &mut [u8]| {
            if request.opcode == LOOKUP {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            match answer(request.opcode, request.nodeid) {
                Some((0, payload)) => {
                    out[..payload.len()].copy_from_slice(&payload);
                    Ok(payload.len())
                }
                Some((error, _)) => Err(Errno::from_i32(-error)),
                None => Err(Errno::ENOSYS),
            }
        };
        match ring::spawn_queues(mount.device.as_fd(), RING_DEPTH, ring_payload_bytes(), answer) {
            Ok(started) => queues = Some(started),
            Err(error) => {
                // Refused by the kernel (then it is on /dev/fuse), or not
                // brought up here (then it is told to refuse): either way
                // the ring is not measured.
                eprintln!("fuse_transport: no io_uring ({error})");
                let _ = ring::refuse(mount.device.as_fd());
                refused = true;
            }
        }
    }
    let floor = if refused { Ok(0.0) } else { floor_us(mountpoint, lookups) };
    drop(mount);
    for server in servers {
        if server.join().is_err() {
            fail!("a FUSE probe server panicked");
        }
    }
    if let Some(queues) = queues {
        queues.join();
    }
    if refused {
        return Ok(None);
    }
    let floor = floor?;
    // Every lookup must have crossed the ring, or the figure is
    // /dev/fuse's under another name.
    if uring && served.load(Ordering::Relaxed) < lookups {
        fail!("the io_uring probe answered {} of {lookups} lookups on its ring", served.load(Ordering::Relaxed));
    }
    Ok(Some(floor))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs the probe in `directory` and returns its row.
pub fn run(quick: bool, directory: &Path) -> Outcome<Value> {
    let lookups = LOOKUPS[usize::from(!quick)];
    let mountpoint = directory.join("transport");
    std::fs::create_dir_all(&mountpoint)?;
    let was = std::fs::read_to_string(ENABLE_URING).ok();
    let switched = was.as_deref().map(str::trim) == Some("N") && std::fs::write(ENABLE_URING, "Y").is_ok();
    let result = (|| {
        let mut device = Vec::new();
        let mut ring = Vec::new();
        for _ in 0..ROUNDS {
            device.push(measure(&mountpoint, false, lookups)?.expect("the device transport always runs"));
            if let Some(us) = measure(&mountpoint, true, lookups)? {
                ring.push(us);
            }
        }
        Ok::<_, Failure>((median(&mut device), (!ring.is_empty()).then(|| median(&mut ring))))
    })();
    if switched {
        let _ = std::fs::write(ENABLE_URING, "N");
    }
    let (device_us, ring_us) = result?;
    let best = ring_us.unwrap_or(device_us).min(device_us);
    let mut value = crate::bench::row("fuse_transport", "fuse-probe", lookups, best * lookups as f64 / 1e6, None);
    value["devfuse_floor_us"] = json!(device_us);
    value["devfuse_workers"] = json!(DEVICE_WORKERS);
    value["uring_floor_us"] = json!(ring_us);
    value["uring_queue_depth"] = json!(RING_DEPTH);
    value["uring_available"] = json!(ring_us.is_some());
    Ok(value)
}
