//! The page header: the first [`PAGE_HEADER_BYTES`] of every page's spare
//! area (OOB). It says what the page is, where it was meant to be written,
//! in which generation of its zone, and when (a global sequence number). One
//! CRC-32C covers the header and the whole page data, so a torn, misdirected
//! or stale page is caught: torn and corrupted pages by the checksum,
//! misdirected ones by the address, stale ones by the zone generation.

use crate::codec::{fixed_fields, Reader};
use crate::{DecodeError, FORMAT_VERSION};

/// Bytes of the page header at the start of the OOB. The signature and the
/// ECC follow it ([`crate::protection`]); the header's decoder reads only
/// its own bytes.
pub const PAGE_HEADER_BYTES: usize = 64;
/// Offset of the CRC within the header.
const PAGE_HEADER_CRC: usize = PAGE_HEADER_BYTES - 4;

const FLAG_END_OF_RECORD: u8 = 1;
const FLAGS_KNOWN: u8 = FLAG_END_OF_RECORD;

/// What a page holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageKind {
    /// The superblock, at page 0 of each superblock zone.
    Superblock,
    /// A page of a checkpoint record.
    Checkpoint,
    /// A page of a metadata-log record.
    Log,
    /// Chunks packed back to back, each with its own chunk header.
    PackedData,
    /// One whole data block; its inverted index is in this header.
    DataBlock,
    /// A metadata page of the namespace or an index (its own header in the
    /// data says which).
    Node,
    /// Nothing: written at unmount to fill an erase block's last data
    /// slots, so that its parity goes to flash and no page is left with
    /// the ECC alone. Its data is zero and its length 0.
    Filler,
}

impl PageKind {
    fn to_byte(self) -> u8 {
        match self {
            PageKind::Superblock => 1,
            PageKind::Checkpoint => 2,
            PageKind::Log => 3,
            PageKind::PackedData => 4,
            PageKind::DataBlock => 5,
            PageKind::Node => 6,
            PageKind::Filler => 7,
        }
    }

    fn from_byte(byte: u8) -> Option<PageKind> {
        Some(match byte {
            1 => PageKind::Superblock,
            2 => PageKind::Checkpoint,
            3 => PageKind::Log,
            4 => PageKind::PackedData,
            5 => PageKind::DataBlock,
            6 => PageKind::Node,
            7 => PageKind::Filler,
            _ => return None,
        })
    }

    /// Pages of these kinds carry a multi-page record.
    pub fn is_record(self) -> bool {
        matches!(self, PageKind::Checkpoint | PageKind::Log)
    }
}

/// The inverted index of a whole data block: which file, where in it, and
/// the version that written it (ReconFS's `(ino, off, len, ver)`; the length
/// is the header's `length`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InvertedIndex {
    pub ino: u64,
    /// Byte offset in the file.
    pub offset: u64,
    pub version: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub kind: PageKind,
    /// The last page of a multi-page record.
    pub end_of_record: bool,
    /// The reset generation of the zone when the page was programmed.
    pub zone_generation: u32,
    /// Strictly increasing over every page the file system programs.
    pub sequence: u64,
    /// Where the page was meant to be programmed.
    pub zone: u32,
    pub page: u32,
    /// For [`PageKind::DataBlock`]; zero for every other kind.
    pub inverted: InvertedIndex,
    /// Bytes of the page data in use (the rest is zero).
    pub length: u32,
    /// Chunks in a packed page; the page's index within its record for
    /// record pages; zero otherwise.
    pub count: u32,
}

impl PageHeader {
    /// The header bytes for a page whose data is `data`; the CRC binds
    /// them.
    pub fn encode(&self, data: &[u8]) -> [u8; PAGE_HEADER_BYTES] {
        assert!(self.length as usize <= data.len(), "page header length {} past the data", self.length);
        assert!(
            self.kind == PageKind::DataBlock || self.inverted == InvertedIndex::default(),
            "only a data block page carries an inverted index in its header"
        );
        assert!(!self.end_of_record || self.kind.is_record(), "only record pages end a record");
        // Straight into the header's bytes: every page programmed has one,
        // and a writer's buffer was an allocation per page.
        let fields: [&[u8]; 12] = [
            &[self.kind.to_byte(), if self.end_of_record { FLAG_END_OF_RECORD } else { 0 }],
            &FORMAT_VERSION.to_le_bytes(),
            &self.zone_generation.to_le_bytes(),
            &self.sequence.to_le_bytes(),
            &self.zone.to_le_bytes(),
            &self.page.to_le_bytes(),
            &self.inverted.ino.to_le_bytes(),
            &self.inverted.offset.to_le_bytes(),
            &self.inverted.version.to_le_bytes(),
            &self.length.to_le_bytes(),
            &self.count.to_le_bytes(),
            &[0u8; 4],
        ];
        debug_assert_eq!(
            fields.iter().map(|field| field.len()).sum::<usize>(),
            PAGE_HEADER_CRC,
            "the fields end at the CRC"
        );
        let mut bytes: [u8; PAGE_HEADER_BYTES] = fixed_fields(&fields);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..PAGE_HEADER_CRC]), data);
        bytes[PAGE_HEADER_CRC..].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(PageHeader::decode(&bytes, data).as_ref(), Ok(self));
        bytes
    }

    /// Decodes and checks a page header against its page data. It does not
    /// know where the page was read from: see [`PageHeader::check_location`].
    pub fn decode(oob: &[u8], data: &[u8]) -> Result<PageHeader, DecodeError> {
        let mut reader = Reader::new("page header", oob);
        if oob.len() >= PAGE_HEADER_BYTES && oob[..PAGE_HEADER_BYTES].iter().all(|&byte| byte == 0xFF) {
            return Err(reader.error("the page is erased"));
        }
        let kind_byte = reader.u8()?;
        let flags = reader.u8()?;
        let version = reader.u16()?;
        let zone_generation = reader.u32()?;
        let sequence = reader.u64()?;
        let zone = reader.u32()?;
        let page = reader.u32()?;
        let inverted = InvertedIndex { ino: reader.u64()?, offset: reader.u64()?, version: reader.u64()? };
        let length = reader.u32()?;
        let count = reader.u32()?;
        let reserved = reader.u32()?;
        let stored_crc = reader.u32()?;
        let computed_crc = crc32c::crc32c_append(crc32c::crc32c(&oob[..PAGE_HEADER_CRC]), data);
        if stored_crc != computed_crc {
            return Err(reader.error(format!(
                "checksum {stored_crc:#010x} does not match the page ({computed_crc:#010x}): torn or corrupted"
            )));
        }
        // After the checksum: a flipped bit in the version field or a
        // reserved byte is damage, reported as such.
        if reserved != 0 {
            return Err(reader.error("reserved bytes 56..60 are not zero"));
        }
        if version != FORMAT_VERSION {
            return Err(reader.error(format!("format version {version}; this build reads version {FORMAT_VERSION}")));
        }
        let kind = PageKind::from_byte(kind_byte).ok_or_else(|| reader.error(format!("unknown kind {kind_byte}")))?;
        if flags & !FLAGS_KNOWN != 0 {
            return Err(reader.error(format!("unknown flags {flags:#04x}")));
        }
        let end_of_record = flags & FLAG_END_OF_RECORD != 0;
        if end_of_record && !kind.is_record() {
            return Err(reader.error(format!("{kind:?} page marked end of record")));
        }
        if kind != PageKind::DataBlock && inverted != InvertedIndex::default() {
            return Err(reader.error(format!("{kind:?} page carries an inverted index")));
        }
        if length as usize > data.len() {
            return Err(reader.error(format!("length {length} is past the {}-byte page", data.len())));
        }
        Ok(PageHeader { kind, end_of_record, zone_generation, sequence, zone, page, inverted, length, count })
    }

    /// Errors unless the page was read where it was meant to be, in the
    /// zone generation it was meant for.
    pub fn check_location(&self, zone: u32, page: u32, zone_generation: u32) -> Result<(), DecodeError> {
        let error = |reason: String| DecodeError { structure: "page header", reason };
        if (self.zone, self.page) != (zone, page) {
            return Err(error(format!(
                "read at zone {zone} page {page} but written for zone {} page {}: misdirected",
                self.zone, self.page
            )));
        }
        if self.zone_generation != zone_generation {
            return Err(error(format!(
                "zone {zone} page {page} is from zone generation {}, the zone is at {zone_generation}: stale",
                self.zone_generation
            )));
        }
        Ok(())
    }
}
