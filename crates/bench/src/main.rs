//! # `flintfs-bench`: flintfs beside its peers, in one run
//!
//! Its own binary, so that the `flintfs` command builds with no C
//! toolchain: littlefs (a peer) is C bound through bindgen, and the report's
//! charts are a drawing stack the file system never needs. `flintfs bench`
//! runs this binary when it is installed beside `flintfs` or on the PATH.
//! The FUSE target (`flintfs-fuse`) runs the `flintfs` binary: the one
//! named by `FLINTFS_BIN`, else the one beside this binary, else the
//! PATH's.

mod bench;
mod bench_floor;
mod bench_littlefs;
mod bench_protection;
mod bench_report;
mod bench_staged;
mod bench_threads;
mod bench_transport;

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use clap::Parser;

/// Heap bytes allocated and not yet freed, by this process: the bench
/// reports the in-process engine's memory as this counter's growth over
/// its mount. A relaxed counter on the system allocator costs an atomic
/// add per allocation, which is why it lives here and not in `flintfs`.
pub static HEAP_LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Calls that handed out heap memory (alloc, alloc_zeroed and realloc),
/// by this process: the in-process rows report them per operation over
/// the measured phase. Unlike host time on a shared machine, the count
/// is the same from run to run, so a change to the engine's hot paths
/// shows in it at once.
pub static HEAP_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

struct CountingAllocator;

// SAFETY: every call is passed to the system allocator unchanged; only the
// counter is added to.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            HEAP_LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            HEAP_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        pointer
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            HEAP_LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            HEAP_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        pointer
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(pointer, layout) };
        HEAP_LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            HEAP_LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            HEAP_LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            HEAP_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

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
    name = "flintfs-bench",
    version,
    about = "Workloads on flintfs and its peers (ext2, ext4, btrfs, xfs on loop devices, littlefs) in one run"
)]
struct Command {
    #[command(flatten)]
    arguments: bench::BenchArguments,
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe, as command-line tools do.
    // SAFETY: restoring a signal's default disposition at startup.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let command = match Command::try_parse() {
        Ok(command) => command,
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            let rendered = error.to_string();
            let first = rendered.lines().next().unwrap_or("bad arguments");
            eprintln!("flintfs-bench: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match bench::bench(command.arguments) {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("flintfs-bench: {message}");
            ExitCode::FAILURE
        }
    }
}
