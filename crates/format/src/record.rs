//! Multi-page records: a checkpoint or a metadata-log record spans
//! consecutive pages of one zone. Each page's header carries its index in
//! the record, and the last is flagged end-of-record. The first page's data
//! starts with a record header that gives the payload's length and CRC. A
//! record is whole only when every page from 0 to the flagged one is there,
//! in order, and the payload checks; a record cut short by power loss is
//! recognised and dropped whole (ReconFS's multi-page atomicity).

use crate::codec::{Reader, Writer};
use crate::page::{PageHeader, PageKind};
use crate::DecodeError;

/// Bytes of the record header at the start of a record's first page.
pub const RECORD_HEADER_BYTES: usize = 24;
/// Largest record payload (a bound on what recovery will assemble).
pub const RECORD_PAYLOAD_BYTES_MAX: u32 = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Checkpoint,
    Log,
}

impl RecordKind {
    fn to_u32(self) -> u32 {
        match self {
            RecordKind::Checkpoint => 1,
            RecordKind::Log => 2,
        }
    }

    fn from_u32(value: u32) -> Option<RecordKind> {
        match value {
            1 => Some(RecordKind::Checkpoint),
            2 => Some(RecordKind::Log),
            _ => None,
        }
    }

    /// The page kind that carries records of this kind.
    pub fn page_kind(self) -> PageKind {
        match self {
            RecordKind::Checkpoint => PageKind::Checkpoint,
            RecordKind::Log => PageKind::Log,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub payload_length: u32,
    /// Sequence number of the record's first page.
    pub first_sequence: u64,
    pub payload_crc: u32,
}

impl RecordHeader {
    fn encode(&self) -> [u8; RECORD_HEADER_BYTES] {
        let mut writer = Writer::with_capacity(RECORD_HEADER_BYTES);
        writer.u32(self.kind.to_u32()).u32(self.payload_length).u64(self.first_sequence).u32(self.payload_crc).zeros(4);
        writer.finish().try_into().expect("record header size")
    }

    fn decode(bytes: &[u8]) -> Result<RecordHeader, DecodeError> {
        let mut reader = Reader::new("record header", bytes);
        let kind_value = reader.u32()?;
        let payload_length = reader.u32()?;
        let first_sequence = reader.u64()?;
        let payload_crc = reader.u32()?;
        reader.zeros(4)?;
        let kind =
            RecordKind::from_u32(kind_value).ok_or_else(|| reader.error(format!("unknown kind {kind_value}")))?;
        if payload_length > RECORD_PAYLOAD_BYTES_MAX {
            return Err(reader.error(format!("payload of {payload_length} bytes is over {RECORD_PAYLOAD_BYTES_MAX}")));
        }
        Ok(RecordHeader { kind, payload_length, first_sequence, payload_crc })
    }
}

/// One page of a record, ready to program: its data (zero padded) and the
/// values its page header must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordPage {
    pub data: Vec<u8>,
    /// Bytes of `data` in use: the page header's `length`.
    pub length: u32,
    /// Index within the record: the page header's `count`.
    pub index: u32,
    pub end_of_record: bool,
}

/// Splits a payload into record pages. The pages must be programmed
/// consecutively in one zone, the first with sequence `first_sequence`.
pub fn split_record(kind: RecordKind, payload: &[u8], first_sequence: u64, page_size_bytes: usize) -> Vec<RecordPage> {
    assert!(payload.len() <= RECORD_PAYLOAD_BYTES_MAX as usize, "record payload over the maximum");
    assert!(page_size_bytes > RECORD_HEADER_BYTES, "page too small for a record header");
    let header = RecordHeader {
        kind,
        payload_length: payload.len() as u32,
        first_sequence,
        payload_crc: crc32c::crc32c(payload),
    };
    let mut stream = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
    stream.extend_from_slice(&header.encode());
    stream.extend_from_slice(payload);
    let pages = stream.len().div_ceil(page_size_bytes);
    stream
        .chunks(page_size_bytes)
        .enumerate()
        .map(|(index, bytes)| {
            let mut data = bytes.to_vec();
            data.resize(page_size_bytes, 0);
            RecordPage { data, length: bytes.len() as u32, index: index as u32, end_of_record: index + 1 == pages }
        })
        .collect()
}

/// Reassembles records from pages read in order. Feed every page of the
/// record's kind as it is read; a whole record comes out when its last page
/// goes in. A page out of place resets the assembler and is reported, so
/// the caller can say where and why a log stopped. A page with index 0
/// starts a new record and abandons an unfinished one (cut short by power
/// loss): check [`RecordAssembler::in_record`] before pushing to learn of it.
pub struct RecordAssembler {
    kind: RecordKind,
    next_index: u32,
    expected_sequence: u64,
    stream: Vec<u8>,
}

impl RecordAssembler {
    pub fn new(kind: RecordKind) -> RecordAssembler {
        RecordAssembler { kind, next_index: 0, expected_sequence: 0, stream: Vec::new() }
    }

    /// True between the first and the last page of a record.
    pub fn in_record(&self) -> bool {
        self.next_index > 0
    }

    /// Adds a verified page (`header` decoded from its OOB against `data`).
    pub fn push(&mut self, header: &PageHeader, data: &[u8]) -> Result<Option<(RecordHeader, Vec<u8>)>, DecodeError> {
        let error = |reason: String| DecodeError { structure: "record", reason };
        let result = self.push_inner(header, data);
        if result.is_err() || matches!(result, Ok(Some(_))) {
            self.next_index = 0;
            self.stream.clear();
        }
        result.map_err(error)
    }

    fn push_inner(&mut self, header: &PageHeader, data: &[u8]) -> Result<Option<(RecordHeader, Vec<u8>)>, String> {
        if header.kind != self.kind.page_kind() {
            return Err(format!("a {:?} page inside a {:?} record", header.kind, self.kind));
        }
        if header.count == 0 {
            self.next_index = 0;
            self.stream.clear();
        }
        if header.count != self.next_index {
            return Err(format!(
                "page {} of a record where page {} was expected (sequence {})",
                header.count, self.next_index, header.sequence
            ));
        }
        if self.next_index > 0 && header.sequence != self.expected_sequence {
            return Err(format!("sequence {} where {} was expected", header.sequence, self.expected_sequence));
        }
        let length = header.length as usize;
        if length > data.len() {
            return Err(format!("page length {length} past the page"));
        }
        if self.stream.len() + length > RECORD_HEADER_BYTES + RECORD_PAYLOAD_BYTES_MAX as usize {
            return Err("record longer than the maximum".into());
        }
        self.stream.extend_from_slice(&data[..length]);
        self.next_index += 1;
        self.expected_sequence = header.sequence.wrapping_add(1);
        if !header.end_of_record {
            if length != data.len() {
                return Err(format!("page {} of a record is not full but not its last", header.count));
            }
            return Ok(None);
        }
        let record_header = RecordHeader::decode(&self.stream).map_err(|inner| inner.reason)?;
        if record_header.kind != self.kind {
            return Err(format!("a {:?} record header in {:?} pages", record_header.kind, self.kind));
        }
        let payload = &self.stream[RECORD_HEADER_BYTES.min(self.stream.len())..];
        if payload.len() != record_header.payload_length as usize {
            return Err(format!(
                "record payload is {} bytes, its header says {}",
                payload.len(),
                record_header.payload_length
            ));
        }
        let first_sequence = header.sequence.wrapping_sub(u64::from(header.count));
        if record_header.first_sequence != first_sequence {
            return Err(format!(
                "record header says it began at sequence {}, its pages say {first_sequence}",
                record_header.first_sequence
            ));
        }
        if crc32c::crc32c(payload) != record_header.payload_crc {
            return Err("record payload checksum mismatch".into());
        }
        Ok(Some((record_header, payload.to_vec())))
    }
}
