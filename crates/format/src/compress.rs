//! The codecs of compressed chunks: lz4 (lz4_flex, the block format
//! without a size prefix) and zstd (one zstd frame). A chunk's header
//! gives its codec, its stored length and its logical length, so the
//! payload carries neither.
//!
//! Decompression is total: any payload gives the logical bytes or a
//! [`DecodeError`], never a panic, and never more bytes than the header
//! promised (the output buffer is sized by the header, not by the payload).

use crate::chunk::Compression;
use crate::DecodeError;

/// The zstd level used when a mount or a file names zstd without one:
/// zstd's own default, the ratio-for-speed point btrfs also takes.
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;
/// The levels zstd accepts that a mount or file may name (negative levels,
/// zstd's "fast" modes, trade ratio for speed below lz4's and are left out).
pub const ZSTD_LEVEL_MIN: i32 = 1;
pub const ZSTD_LEVEL_MAX: i32 = 19;
const _: () = assert!(ZSTD_LEVEL_MIN <= ZSTD_LEVEL_DEFAULT && ZSTD_LEVEL_DEFAULT <= ZSTD_LEVEL_MAX);

/// A codec and, for zstd, its level: what a mount (`-o compress=`) or a
/// file (`user.flintfs.compress`) asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompressionChoice {
    pub codec: Compression,
    /// zstd's level; 0 for the other codecs.
    pub level: i32,
}

impl CompressionChoice {
    pub const NONE: CompressionChoice = CompressionChoice { codec: Compression::None, level: 0 };
    pub const LZ4: CompressionChoice = CompressionChoice { codec: Compression::Lz4, level: 0 };
    pub const ZSTD: CompressionChoice = CompressionChoice { codec: Compression::Zstd, level: ZSTD_LEVEL_DEFAULT };

    /// The default for a codec recorded without a level (the superblock).
    pub fn of(codec: Compression) -> CompressionChoice {
        match codec {
            Compression::None => CompressionChoice::NONE,
            Compression::Lz4 => CompressionChoice::LZ4,
            Compression::Zstd => CompressionChoice::ZSTD,
        }
    }

    /// Parses `none`, `lz4`, `zstd` or `zstd:LEVEL` (what `-o compress=`
    /// and the xattr take); the error says what is accepted.
    pub fn parse(text: &str) -> Result<CompressionChoice, String> {
        let accepted = || {
            format!("compression {text:?}: expected none, lz4, zstd or zstd:LEVEL (LEVEL {ZSTD_LEVEL_MIN} to {ZSTD_LEVEL_MAX})")
        };
        match text {
            "none" => Ok(CompressionChoice::NONE),
            "lz4" => Ok(CompressionChoice::LZ4),
            "zstd" => Ok(CompressionChoice::ZSTD),
            _ => {
                let level = text.strip_prefix("zstd:").ok_or_else(accepted)?;
                let level: i32 = level.parse().map_err(|_| accepted())?;
                if !(ZSTD_LEVEL_MIN..=ZSTD_LEVEL_MAX).contains(&level) {
                    return Err(accepted());
                }
                Ok(CompressionChoice { codec: Compression::Zstd, level })
            }
        }
    }
}

impl std::fmt::Display for CompressionChoice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.codec {
            Compression::None => formatter.write_str("none"),
            Compression::Lz4 => formatter.write_str("lz4"),
            Compression::Zstd if self.level == ZSTD_LEVEL_DEFAULT => formatter.write_str("zstd"),
            Compression::Zstd => write!(formatter, "zstd:{}", self.level),
        }
    }
}

thread_local! {
    static LZ4_OUTPUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static ZSTD_COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `input` compressed with `choice`, or `None` when the result would not
/// be shorter than `limit_bytes` (the caller stores the data raw then).
/// `None` for [`Compression::None`].
pub fn compress(choice: CompressionChoice, input: &[u8], limit_bytes: usize) -> Option<Vec<u8>> {
    let limit_bytes = limit_bytes.min(input.len());
    match choice.codec {
        Compression::None => None,
        Compression::Lz4 => LZ4_OUTPUT.with(|cell| {
            // The worst case's buffer, kept per thread: made per call it was
            // an allocation and a 4 KiB memset for every block tried, most
            // of which (noise) give nothing back. What compresses is copied
            // out at its own length, so a chunk waiting to be packed holds
            // only its bytes.
            let mut output = cell.borrow_mut();
            let needed = lz4_flex::block::get_maximum_output_size(input.len());
            if output.len() < needed {
                output.resize(needed, 0);
            }
            let length = lz4_flex::block::compress_into(input, &mut output[..needed]).ok()?;
            (length < limit_bytes).then(|| output[..length].to_vec())
        }),
        Compression::Zstd => {
            // A buffer of the limit: zstd stops with an error when the frame
            // would not fit, which is the answer "not worth it".
            let mut output = Vec::with_capacity(limit_bytes);
            let level = choice.level.clamp(ZSTD_LEVEL_MIN, ZSTD_LEVEL_MAX);
            let length = ZSTD_COMPRESSOR.with(|cell| {
                let mut cell = cell.borrow_mut();
                // A context per thread, kept: making one costs more than
                // compressing a page with it.
                if cell.as_ref().is_none_or(|(kept, _)| *kept != level) {
                    let mut compressor = zstd::bulk::Compressor::new(level).ok()?;
                    // The frame needs no checksum (the page's CRC and ECC
                    // cover the payload) nor its content size (the chunk
                    // header holds it).
                    compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(false)).ok()?;
                    compressor.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(false)).ok()?;
                    compressor.set_parameter(zstd::zstd_safe::CParameter::DictIdFlag(false)).ok()?;
                    *cell = Some((level, compressor));
                }
                let (_, compressor) = cell.as_mut()?;
                compressor.compress_to_buffer(input, &mut output).ok()
            })?;
            (length < limit_bytes).then_some(output)
        }
    }
}

/// The `logical_bytes` that `payload` decompresses to with `codec`; an
/// error for a payload that is not a valid stream, or that gives more or
/// fewer bytes than that.
pub fn decompress(codec: Compression, payload: &[u8], logical_bytes: usize) -> Result<Vec<u8>, DecodeError> {
    let mut output = vec![0u8; logical_bytes];
    decompress_into(codec, payload, &mut output)?;
    Ok(output)
}

/// [`decompress`] into `output`, whose length is the logical length: a
/// read lands a block straight in the caller's buffer, with no block of
/// its own to allocate, zero and copy out again. On an error `output`
/// holds whatever the codec wrote before it stopped, which the caller
/// must not return.
pub fn decompress_into(codec: Compression, payload: &[u8], output: &mut [u8]) -> Result<(), DecodeError> {
    let error = |reason: String| DecodeError { structure: "compressed chunk", reason };
    let logical_bytes = output.len();
    let length = match codec {
        Compression::None => {
            if payload.len() != logical_bytes {
                return Err(error(format!("{} raw bytes for {logical_bytes}", payload.len())));
            }
            output.copy_from_slice(payload);
            logical_bytes
        }
        Compression::Lz4 => {
            lz4_flex::block::decompress_into(payload, output).map_err(|inner| error(format!("lz4: {inner}")))?
        }
        Compression::Zstd => ZSTD_DECOMPRESSOR.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(zstd::bulk::Decompressor::new().map_err(|inner| error(format!("zstd context: {inner}")))?);
            }
            let decompressor = cell.as_mut().expect("made above");
            decompressor.decompress_to_buffer(payload, output).map_err(|inner| error(format!("zstd: {inner}")))
        })?,
    };
    if length != logical_bytes {
        return Err(error(format!("{length} bytes decompressed, {logical_bytes} expected")));
    }
    Ok(())
}
