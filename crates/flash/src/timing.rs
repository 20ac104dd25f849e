//! Simulated device time. Every operation advances a simulated clock by what
//! it would cost on NAND spread over channels x dies, so throughput and
//! latency can be measured independently of the host machine's noise.
//!
//! The model: a page transfer occupies its channel; a read, program or erase
//! occupies its die. The host waits for reads and erases to complete, for a
//! program only until its transfer ends (the page then sits in the write
//! buffer while the die programs it), and on a flush until every die is idle.
//! Blocks are spread round-robin over dies, and dies over channels.

/// Timing parameters. Defaults are NAND-like (MLC datasheet figures): 50 us
/// page read, 600 us page program, 3 ms block erase, an ONFI 4.x channel at
/// 400 MB/s, 8 channels of 4 dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimingConfig {
    pub read_ns: u64,
    pub program_ns: u64,
    pub erase_ns: u64,
    /// Channel transfer cost per byte, in picoseconds (2500 ps = 400 MB/s).
    pub transfer_ps_per_byte: u64,
    pub channels: u32,
    pub dies_per_channel: u32,
    /// Fixed cost of a flush command on top of waiting for the dies.
    pub flush_ns: u64,
    /// NVM load or store cost per 64-byte line.
    pub nvm_access_ns_per_line: u64,
    /// Cost of one persist barrier (cache line write-back and fence).
    pub nvm_persist_ns: u64,
}

/// Most channels, and most dies per channel, the model accepts.
pub const CHANNELS_MAX: u32 = 1024;
pub const DIES_PER_CHANNEL_MAX: u32 = 64;
const _: () = assert!((CHANNELS_MAX as u64) * (DIES_PER_CHANNEL_MAX as u64) <= u32::MAX as u64);

impl TimingConfig {
    pub fn validate(&self) -> crate::Result<()> {
        let bad = |field: &'static str, value: u32, max: u32| crate::DeviceError::Geometry {
            field,
            reason: format!("{value} is outside 1..={max}"),
        };
        if !(1..=CHANNELS_MAX).contains(&self.channels) {
            return Err(bad("channels", self.channels, CHANNELS_MAX));
        }
        if !(1..=DIES_PER_CHANNEL_MAX).contains(&self.dies_per_channel) {
            return Err(bad("dies_per_channel", self.dies_per_channel, DIES_PER_CHANNEL_MAX));
        }
        Ok(())
    }
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            read_ns: 50_000,
            program_ns: 600_000,
            erase_ns: 3_000_000,
            transfer_ps_per_byte: 2_500,
            channels: 8,
            dies_per_channel: 4,
            flush_ns: 10_000,
            nvm_access_ns_per_line: 100,
            nvm_persist_ns: 300,
        }
    }
}

/// Bytes in one NVM cache line, the unit of NVM write cost.
const NVM_LINE_BYTES: u64 = 64;

/// The simulated clock and the busy-until times of channels and dies.
#[derive(Clone, Debug)]
pub(crate) struct Clock {
    config: TimingConfig,
    now_ns: u64,
    channel_free_ns: Vec<u64>,
    die_free_ns: Vec<u64>,
}

impl Clock {
    pub fn new(config: TimingConfig, now_ns: u64) -> Clock {
        assert!(config.validate().is_ok(), "timing config validated by DeviceOptions");
        let channels = config.channels;
        let dies = channels * config.dies_per_channel;
        Clock {
            config,
            now_ns,
            channel_free_ns: vec![now_ns; channels as usize],
            die_free_ns: vec![now_ns; dies as usize],
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    pub(crate) fn die_count(&self) -> u32 {
        self.die_free_ns.len() as u32
    }

    /// The die an erase block sits on (blocks round-robin over dies).
    pub(crate) fn die_of_block(&self, block: u64) -> u32 {
        (block % self.die_free_ns.len() as u64) as u32
    }

    fn die_and_channel(&self, block: u64) -> (usize, usize) {
        let die = (block % self.die_free_ns.len() as u64) as usize;
        (die, die % self.channel_free_ns.len())
    }

    fn transfer_ns(&self, bytes: u64) -> u64 {
        bytes.saturating_mul(self.config.transfer_ps_per_byte).div_ceil(1000)
    }

    /// A read of `bytes` from `block`; returns when the data is at the host.
    pub fn read(&mut self, block: u64, bytes: u64) {
        let (die, channel) = self.die_and_channel(block);
        let sensed = self.now_ns.max(self.die_free_ns[die]).saturating_add(self.config.read_ns);
        self.die_free_ns[die] = sensed;
        let transferred = sensed.max(self.channel_free_ns[channel]).saturating_add(self.transfer_ns(bytes));
        self.channel_free_ns[channel] = transferred;
        self.now_ns = transferred;
    }

    /// A read served from the device's write buffer: transfer only.
    pub fn read_buffered(&mut self, bytes: u64) {
        self.advance(self.transfer_ns(bytes));
    }

    /// A program of `bytes` to `block`. The host continues once the transfer
    /// is done; returns the simulated time the program itself completes.
    pub fn program(&mut self, block: u64, bytes: u64) -> u64 {
        let (die, channel) = self.die_and_channel(block);
        let transferred = self.now_ns.max(self.channel_free_ns[channel]).saturating_add(self.transfer_ns(bytes));
        self.channel_free_ns[channel] = transferred;
        let programmed = transferred.max(self.die_free_ns[die]).saturating_add(self.config.program_ns);
        self.die_free_ns[die] = programmed;
        self.now_ns = transferred;
        programmed
    }

    /// An erase of each listed block; returns when all are erased.
    pub fn erase(&mut self, blocks: impl Iterator<Item = u64>) {
        let mut done = self.now_ns;
        for block in blocks {
            let (die, _) = self.die_and_channel(block);
            let erased = self.now_ns.max(self.die_free_ns[die]).saturating_add(self.config.erase_ns);
            self.die_free_ns[die] = erased;
            done = done.max(erased);
        }
        self.now_ns = done;
    }

    /// Wait until `instant` (a buffered program completing).
    pub fn wait_until(&mut self, instant_ns: u64) {
        self.now_ns = self.now_ns.max(instant_ns);
    }

    /// A flush: wait for every die, then the command's own cost.
    pub fn flush(&mut self) {
        let busy = self.die_free_ns.iter().copied().max().unwrap_or(self.now_ns);
        self.now_ns = self.now_ns.max(busy).saturating_add(self.config.flush_ns);
    }

    pub fn nvm_access(&mut self, bytes: u64) {
        self.advance(bytes.div_ceil(NVM_LINE_BYTES).saturating_mul(self.config.nvm_access_ns_per_line));
    }

    pub fn nvm_persist(&mut self) {
        self.advance(self.config.nvm_persist_ns);
    }

    /// Idle time passes (retention, background work).
    pub fn advance(&mut self, duration_ns: u64) {
        self.now_ns = self.now_ns.saturating_add(duration_ns);
    }

    /// After a power cut: nothing is in flight any more.
    pub fn power_up(&mut self) {
        for free in self.channel_free_ns.iter_mut().chain(self.die_free_ns.iter_mut()) {
            *free = self.now_ns;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_returns_after_transfer_and_flush_waits_for_the_die() {
        let config = TimingConfig::default();
        let mut clock = Clock::new(config, 0);
        let done = clock.program(0, 4096 + 128);
        let transfer = ((4096 + 128) * 2500u64).div_ceil(1000);
        assert_eq!(clock.now_ns(), transfer);
        assert_eq!(done, transfer + config.program_ns);
        clock.flush();
        assert_eq!(clock.now_ns(), transfer + config.program_ns + config.flush_ns);
    }

    #[test]
    fn different_dies_work_in_parallel_and_one_die_serialises() {
        let config = TimingConfig::default();
        let mut parallel = Clock::new(config, 0);
        parallel.erase([0u64, 1, 2, 3].into_iter());
        assert_eq!(parallel.now_ns(), config.erase_ns);
        let mut serial = Clock::new(config, 0);
        let dies = u64::from(config.channels * config.dies_per_channel);
        serial.erase([0u64, dies, 2 * dies].into_iter());
        assert_eq!(serial.now_ns(), 3 * config.erase_ns);
    }
}
