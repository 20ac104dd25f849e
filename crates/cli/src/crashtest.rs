//! `flintfs crashtest`: the test kit's crash tests (`docs/SEMANTICS.md`),
//! with a progress bar, a table or `--json`, and a non-zero exit when
//! anything was violated.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use flintfs_testkit::crashtest::{self, CrashOptions, FsyncMode, Mode};
use indicatif::{ProgressBar, ProgressStyle};

use crate::Outcome;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArgument {
    /// Every one- and two-operation workload over a small file set, cut at every device operation.
    Bounded,
    /// Generated workloads (--cuts of them), cut at every device operation.
    Exhaustive,
    /// --cuts random cuts over at least 100 seeds' workloads.
    Random,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FsyncArgument {
    WpCheck,
    Ordered,
    Unchecked,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BarrierArgument {
    Keep,
    Skip,
}

#[derive(Args)]
pub struct CrashtestArguments {
    #[arg(long, value_enum)]
    pub mode: ModeArgument,
    /// Random: cuts in all (default 10000). Exhaustive: workloads (default 3).
    #[arg(long)]
    pub cuts: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "wp-check")]
    pub fsync: FsyncArgument,
    /// The mount's compression: none, lz4, zstd or zstd:LEVEL (default:
    /// the image's, lz4).
    #[arg(long, value_name = "CODEC")]
    pub compress: Option<String>,
    /// Bytes of NVM beside the flash (the metadata log goes there).
    #[arg(long, value_name = "SIZE", value_parser = crate::image::parse_size, default_value = "0")]
    pub nvm: u64,
    /// For tests of the test: `skip` writes an NVM log frame's commit word
    /// without persisting the frame first, which the crashtest must catch.
    #[arg(long, value_enum, default_value = "keep")]
    pub nvm_barrier: BarrierArgument,
    /// Operations of each generated workload (exhaustive and random).
    #[arg(long, default_value_t = crashtest::GENERATED_OPERATIONS_DEFAULT)]
    pub operations: u64,
    /// Bounded: run every Nth workload only (1 runs them all).
    #[arg(long, default_value_t = 1)]
    pub sample: u64,
    #[arg(long)]
    pub json: bool,
}

pub fn crashtest(arguments: CrashtestArguments) -> Outcome<ExitCode> {
    let mode = match arguments.mode {
        ModeArgument::Bounded => Mode::Bounded,
        ModeArgument::Exhaustive => Mode::Exhaustive,
        ModeArgument::Random => Mode::Random,
    };
    let mut options = CrashOptions::new(mode);
    options.seed = arguments.seed;
    options.operations = arguments.operations;
    options.sample = arguments.sample.max(1);
    if let Some(cuts) = arguments.cuts {
        options.cuts = cuts;
    }
    if let Some(codec) = &arguments.compress {
        options.compression = Some(
            flintfs_format::CompressionChoice::parse(codec)
                .map_err(|reason| crate::Failure(format!("crashtest: {reason}")))?,
        );
    }
    options.nvm_size_bytes = arguments.nvm;
    options.nvm_barrier = matches!(arguments.nvm_barrier, BarrierArgument::Keep);
    options.fsync = match arguments.fsync {
        FsyncArgument::WpCheck => FsyncMode::WpCheck,
        FsyncArgument::Ordered => FsyncMode::Ordered,
        FsyncArgument::Unchecked => FsyncMode::Unchecked,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("  crashtest {msg} [{bar:32}] {pos}/{len} workloads {elapsed} (eta {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("{:?}", arguments.mode).to_lowercase());
    let started = std::time::Instant::now();
    let summary = crashtest::run(&options, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    if arguments.json {
        println!("{}", crashtest::summary_json(&options, &summary));
    } else {
        println!(
            "crashtest {} (seed {}, fsync {:?}{}): {} workloads, {} cuts, {} violations, in {:.1} s",
            format!("{:?}", arguments.mode).to_lowercase(),
            options.seed,
            arguments.fsync,
            if options.nvm_size_bytes > 0 {
                format!(", {} B NVM, barrier {:?}", options.nvm_size_bytes, arguments.nvm_barrier)
            } else {
                String::new()
            },
            summary.workloads,
            summary.cuts,
            summary.violations,
            started.elapsed().as_secs_f64()
        );
        println!(
            "  device operations per workload: {} to {}",
            summary.device_operations_min, summary.device_operations_max
        );
        if options.nvm_size_bytes > 0 {
            println!(
                "  in the uncut runs: {} write-homes of a full NVM log, {} dirty nodes kept in NVM, {} sent home \
                 from a full NVM",
                summary.nvm_write_homes, summary.nodes_parked, summary.nodes_sent_home
            );
        }
        let histogram: Vec<String> =
            summary.recovery_pages_read.iter().map(|(bucket, count)| format!("<={bucket}: {count}")).collect();
        println!("  pages read by recovery: {}", histogram.join(", "));
        for failure in summary.failures.iter().take(20) {
            println!("  violation: seed {} cut {}: {}", failure.seed, failure.cut, failure.what);
        }
    }
    Ok(if summary.violations == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
