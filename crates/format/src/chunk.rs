//! Chunks: pieces of file data, possibly compressed, packed back to back in
//! a [`crate::PageKind::PackedData`] page. Each starts with a chunk header
//! that is its inverted index (ReconFS's `(ino, off, len, ver)`), so a page
//! can be reconnected to its file after a crash without any pointer to it.

use std::ops::Range;

use crate::codec::{fixed_fields, Reader, Writer};
use crate::DecodeError;

/// Bytes of a chunk header.
pub const CHUNK_HEADER_BYTES: usize = 40;
/// Largest logical (uncompressed) chunk: one file block of the largest page.
pub const CHUNK_LOGICAL_BYTES_MAX: u32 = 64 * 1024;

/// What a chunk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkKind {
    /// Bytes of a regular file at `offset`.
    FileData,
}

impl ChunkKind {
    fn to_byte(self) -> u8 {
        match self {
            ChunkKind::FileData => 1,
        }
    }

    fn from_byte(byte: u8) -> Option<ChunkKind> {
        match byte {
            1 => Some(ChunkKind::FileData),
            _ => None,
        }
    }
}

/// How a chunk's payload is stored. Incompressible chunks are stored raw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn to_byte(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }

    pub fn from_byte(byte: u8) -> Option<Compression> {
        Some(match byte {
            0 => Compression::None,
            1 => Compression::Lz4,
            2 => Compression::Zstd,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkHeader {
    pub kind: ChunkKind,
    pub compression: Compression,
    /// Bytes of payload following the header in the page.
    pub stored_length: u32,
    pub ino: u64,
    /// Byte offset of the chunk's data in the file.
    pub offset: u64,
    /// Bytes of file data the payload decompresses to.
    pub logical_length: u32,
    /// Version of the inode when written; stale when older than the inode's
    /// birth version (the inode number was reused).
    pub version: u64,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_BYTES] {
        if let Err(reason) = self.validate() {
            panic!("refusing to encode an invalid chunk header: {reason}");
        }
        // Straight into the header's bytes: a writer's buffer was an
        // allocation per chunk packed.
        let fields: [&[u8]; 8] = [
            &[self.kind.to_byte(), self.compression.to_byte()],
            &[0u8; 2],
            &self.stored_length.to_le_bytes(),
            &self.ino.to_le_bytes(),
            &self.offset.to_le_bytes(),
            &self.logical_length.to_le_bytes(),
            &[0u8; 4],
            &self.version.to_le_bytes(),
        ];
        debug_assert_eq!(
            fields.iter().map(|field| field.len()).sum::<usize>(),
            CHUNK_HEADER_BYTES,
            "the fields fill the header"
        );
        let bytes: [u8; CHUNK_HEADER_BYTES] = fixed_fields(&fields);
        debug_assert_eq!(ChunkHeader::decode(&bytes).as_ref(), Ok(self));
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<ChunkHeader, DecodeError> {
        let mut reader = Reader::new("chunk header", bytes);
        let kind_byte = reader.u8()?;
        let compression_byte = reader.u8()?;
        reader.zeros(2)?;
        let stored_length = reader.u32()?;
        let ino = reader.u64()?;
        let offset = reader.u64()?;
        let logical_length = reader.u32()?;
        reader.zeros(4)?;
        let version = reader.u64()?;
        let kind = ChunkKind::from_byte(kind_byte).ok_or_else(|| reader.error(format!("unknown kind {kind_byte}")))?;
        let compression = Compression::from_byte(compression_byte)
            .ok_or_else(|| reader.error(format!("unknown compression {compression_byte}")))?;
        let header = ChunkHeader { kind, compression, stored_length, ino, offset, logical_length, version };
        header.validate().map_err(|reason| reader.error(reason))?;
        Ok(header)
    }

    /// The rules a chunk header keeps, before it is written and after it is
    /// read.
    pub fn validate(&self) -> Result<(), String> {
        if self.logical_length == 0 || self.logical_length > CHUNK_LOGICAL_BYTES_MAX {
            return Err(format!("logical length {} outside 1..={CHUNK_LOGICAL_BYTES_MAX}", self.logical_length));
        }
        if self.compression == Compression::None && self.stored_length != self.logical_length {
            return Err(format!(
                "uncompressed chunk stores {} bytes for {} logical bytes",
                self.stored_length, self.logical_length
            ));
        }
        // A chunk is stored compressed only when that made it shorter.
        if self.compression != Compression::None
            && (self.stored_length == 0 || self.stored_length >= self.logical_length)
        {
            return Err(format!(
                "compressed chunk stores {} bytes for {} logical bytes",
                self.stored_length, self.logical_length
            ));
        }
        if self.offset.checked_add(u64::from(self.logical_length)).is_none() {
            return Err(format!("offset {} + {} overflows", self.offset, self.logical_length));
        }
        Ok(())
    }
}

/// Packs chunks into one page's data, back to back from byte 0.
pub struct PackedPage {
    page_size_bytes: usize,
    writer: Writer,
    count: u32,
}

impl PackedPage {
    pub fn new(page_size_bytes: usize) -> PackedPage {
        PackedPage { page_size_bytes, writer: Writer::with_capacity(page_size_bytes), count: 0 }
    }

    /// Bytes still free for a header and its payload.
    pub fn free_bytes(&self) -> usize {
        self.page_size_bytes - self.writer.len()
    }

    /// Appends a chunk if it fits; false (and nothing written) if not.
    pub fn push(&mut self, header: &ChunkHeader, payload: &[u8]) -> bool {
        assert_eq!(header.stored_length as usize, payload.len(), "header and payload disagree");
        if CHUNK_HEADER_BYTES + payload.len() > self.free_bytes() {
            return false;
        }
        self.writer.bytes(&header.encode()).bytes(payload);
        self.count += 1;
        true
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// The page data (zero padded), the bytes in use and the chunk count,
    /// for the page header's `length` and `count`.
    pub fn finish(self) -> (Vec<u8>, u32, u32) {
        let length = self.writer.len() as u32;
        let mut data = self.writer.finish();
        data.resize(self.page_size_bytes, 0);
        (data, length, self.count)
    }
}

/// The chunks of a packed page: each header with the range of its payload
/// in `data`. `length` and `count` come from the (already verified) page
/// header; everything is checked against them.
pub fn parse_packed(data: &[u8], length: u32, count: u32) -> Result<Vec<(ChunkHeader, Range<usize>)>, DecodeError> {
    let error = |reason: String| DecodeError { structure: "packed page", reason };
    let length = length as usize;
    if length > data.len() {
        return Err(error(format!("length {length} past the {}-byte page", data.len())));
    }
    if count as usize > length / CHUNK_HEADER_BYTES {
        return Err(error(format!("{count} chunks cannot fit in {length} bytes")));
    }
    let mut chunks = Vec::with_capacity(count as usize);
    let mut position = 0usize;
    for index in 0..count {
        let header_end = position + CHUNK_HEADER_BYTES;
        if header_end > length {
            return Err(error(format!("chunk {index} header runs past {length} bytes")));
        }
        let header = ChunkHeader::decode(&data[position..header_end])
            .map_err(|inner| error(format!("chunk {index}: {}", inner.reason)))?;
        let payload_end = header_end.saturating_add(header.stored_length as usize);
        if payload_end > length {
            return Err(error(format!("chunk {index} payload runs past {length} bytes")));
        }
        chunks.push((header, header_end..payload_end));
        position = payload_end;
    }
    if position != length {
        return Err(error(format!("{} bytes after the last chunk", length - position)));
    }
    if !crate::codec::all_zero(&data[length..]) {
        return Err(error("padding after the chunks is not zero".into()));
    }
    Ok(chunks)
}
