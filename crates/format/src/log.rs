//! The metadata persistence log: what fsync programs instead of a
//! checkpoint. A log *batch* is the payload of one log record (see
//! [`crate::record`]): every operation record buffered since the previous
//! batch, in the order the operations ran, and the inode states fsync adds.
//! Recovery loads the newest checkpoint and replays the batches of its
//! epoch in order (ReconFS section 3.4, OPRW).
//!
//! Operation records are logical: they name directories and files by
//! inode number and entries by name, and carry whatever the engine chose
//! (the inode number, the version counter, the time), so replaying them on
//! the checkpoint's tree makes the same choices again. An inode state
//! carries a regular file's attributes, its inline bytes, and the
//! addresses of the blocks written since it was last logged: the only
//! record that points at flash, and the one the write-pointer check
//! judges.

use crate::codec::{Reader, Writer};
use crate::node::{FileType, Pointer, INLINE_BYTES_CAP, NAME_BYTES_MAX, XATTR_BYTES_CAP, XATTR_NAME_BYTES_MAX};
use crate::DecodeError;

/// Bytes of a batch's header: epoch, batch number, record count, reserved.
pub const LOG_BATCH_HEADER_BYTES: usize = 24;
/// Bytes of a record's header: tag, reserved, body length, version
/// counter, time.
pub const LOG_RECORD_HEADER_BYTES: usize = 24;
/// Longest symlink target a create record carries (PATH_MAX).
pub const LOG_CONTENT_BYTES_MAX: usize = 4096;
/// Most block addresses one inode state carries.
pub const LOG_BLOCKS_PER_RECORD_MAX: usize = 1 << 16;
/// Bytes of an embedded block's header in an inode state: block number,
/// compression, reserved, logical and stored lengths.
pub const LOG_EMBEDDED_HEADER_BYTES: usize = 20;

/// A small block carried in an inode state itself, as the chunk it would
/// be (compressed or not), so the fsync that makes it durable programs no
/// packed page for it: the block stays buffered, and goes home at the next
/// checkpoint (or sooner) like any buffered block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddedBlock {
    pub block: u64,
    pub compression: crate::Compression,
    /// Bytes of file data the payload gives (the block's valid bytes).
    pub logical_length: u32,
    pub payload: Vec<u8>,
}

/// One batch: the payload of one log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBatch {
    /// The number of the checkpoint this log follows. Recovery replays
    /// only batches of the checkpoint it loaded.
    pub epoch: u64,
    /// 0, 1, 2, ... within the epoch: a gap ends the log.
    pub batch: u64,
    pub records: Vec<LogRecord>,
}

/// One logged operation, with the engine state it ran with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// The version counter before the operation.
    pub version_next: u64,
    /// The time the operation took.
    pub now_ns: i64,
    pub operation: LogOperation,
}

/// What `setattr` changes, field by field; `None` leaves a field alone.
/// The engine's API takes it as it is logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttributes {
    pub permissions: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOperation {
    /// A file, directory, node or symlink (`content` is its target) made
    /// as `ino` under `name` in `parent`.
    Create {
        parent: u64,
        ino: u64,
        file_type: FileType,
        permissions: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        name: Vec<u8>,
        content: Vec<u8>,
    },
    Link {
        ino: u64,
        new_parent: u64,
        new_name: Vec<u8>,
    },
    /// `held`: the file was open, so its last unlink left it an orphan.
    Unlink {
        parent: u64,
        ino: u64,
        held: bool,
        name: Vec<u8>,
    },
    Rmdir {
        parent: u64,
        ino: u64,
        held: bool,
        name: Vec<u8>,
    },
    /// `replaced` is the inode the new name pointed at (0 for none), held
    /// or not.
    Rename {
        parent: u64,
        new_parent: u64,
        ino: u64,
        replaced: u64,
        replaced_held: bool,
        no_replace: bool,
        exchange: bool,
        name: Vec<u8>,
        new_name: Vec<u8>,
    },
    SetAttributes {
        ino: u64,
        changes: SetAttributes,
    },
    SetXattr {
        ino: u64,
        create: bool,
        replace: bool,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        ino: u64,
        name: Vec<u8>,
    },
    Fallocate {
        ino: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    /// An orphan freed when its last reference went.
    Delete {
        ino: u64,
    },
    /// A regular file's state at fsync: attributes, inline bytes (`None`
    /// for a file of blocks), `(block, address)` for every block written
    /// since the file was last logged, and the small blocks the record
    /// carries itself (applied after the addresses).
    InodeState {
        ino: u64,
        born: u64,
        current: u64,
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        atime_ns: i64,
        mtime_ns: i64,
        ctime_ns: i64,
        inline: Option<Vec<u8>>,
        blocks: Vec<(u64, Pointer)>,
        embedded: Vec<EmbeddedBlock>,
    },
}

impl LogOperation {
    fn tag(&self) -> u8 {
        match self {
            LogOperation::Create { .. } => 1,
            LogOperation::Link { .. } => 2,
            LogOperation::Unlink { .. } => 3,
            LogOperation::Rmdir { .. } => 4,
            LogOperation::Rename { .. } => 5,
            LogOperation::SetAttributes { .. } => 6,
            LogOperation::SetXattr { .. } => 7,
            LogOperation::RemoveXattr { .. } => 8,
            LogOperation::Fallocate { .. } => 9,
            LogOperation::Delete { .. } => 10,
            LogOperation::InodeState { .. } => 11,
        }
    }

    /// Every inode the record names: what the skip list follows.
    pub fn inodes(&self) -> Vec<u64> {
        let mut inodes = match self {
            LogOperation::Create { parent, ino, .. } => vec![*parent, *ino],
            LogOperation::Link { ino, new_parent, .. } => vec![*ino, *new_parent],
            LogOperation::Unlink { parent, ino, .. } | LogOperation::Rmdir { parent, ino, .. } => vec![*parent, *ino],
            LogOperation::Rename { parent, new_parent, ino, replaced, .. } => {
                vec![*parent, *new_parent, *ino, *replaced]
            }
            LogOperation::SetAttributes { ino, .. }
            | LogOperation::SetXattr { ino, .. }
            | LogOperation::RemoveXattr { ino, .. }
            | LogOperation::Fallocate { ino, .. }
            | LogOperation::Delete { ino }
            | LogOperation::InodeState { ino, .. } => vec![*ino],
        };
        inodes.retain(|&ino| ino != 0);
        inodes.sort_unstable();
        inodes.dedup();
        inodes
    }

    /// The flash addresses the record points at.
    pub fn pointers(&self) -> &[(u64, Pointer)] {
        match self {
            LogOperation::InodeState { blocks, .. } => blocks,
            _ => &[],
        }
    }
}

fn flag(value: bool) -> u8 {
    u8::from(value)
}

fn read_flag(reader: &mut Reader) -> Result<bool, DecodeError> {
    match reader.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(reader.error(format!("flag byte {other}"))),
    }
}

fn put_name(writer: &mut Writer, name: &[u8]) {
    writer.u16(name.len() as u16).bytes(name);
}

fn read_bytes(reader: &mut Reader, length: usize, max: usize, what: &str) -> Result<Vec<u8>, DecodeError> {
    if length > max {
        return Err(reader.error(format!("{what} of {length} bytes is over {max}")));
    }
    Ok(reader.take(length)?.to_vec())
}

fn read_name(reader: &mut Reader, max: usize) -> Result<Vec<u8>, DecodeError> {
    let length = reader.u16()? as usize;
    let name = read_bytes(reader, length, max, "name")?;
    if name.is_empty() {
        return Err(reader.error("an empty name"));
    }
    Ok(name)
}

fn put_blob(writer: &mut Writer, bytes: &[u8]) {
    writer.u32(bytes.len() as u32).bytes(bytes);
}

fn read_blob(reader: &mut Reader, max: usize, what: &str) -> Result<Vec<u8>, DecodeError> {
    let length = reader.u32()? as usize;
    read_bytes(reader, length, max, what)
}

fn put_option_u32(writer: &mut Writer, value: Option<u32>) {
    writer.u8(flag(value.is_some())).u32(value.unwrap_or(0));
}

fn put_option_u64(writer: &mut Writer, value: Option<u64>) {
    writer.u8(flag(value.is_some())).u64(value.unwrap_or(0));
}

fn read_option_u32(reader: &mut Reader) -> Result<Option<u32>, DecodeError> {
    let present = read_flag(reader)?;
    let value = reader.u32()?;
    Ok(present.then_some(value))
}

fn read_option_u64(reader: &mut Reader) -> Result<Option<u64>, DecodeError> {
    let present = read_flag(reader)?;
    let value = reader.u64()?;
    Ok(present.then_some(value))
}

fn read_ino(reader: &mut Reader) -> Result<u64, DecodeError> {
    let ino = reader.u64()?;
    if ino == 0 || ino > u64::from(u32::MAX) {
        return Err(reader.error(format!("inode number {ino}")));
    }
    Ok(ino)
}

impl LogRecord {
    fn encode_body(&self, writer: &mut Writer) {
        match &self.operation {
            LogOperation::Create { parent, ino, file_type, permissions, uid, gid, rdev, name, content } => {
                writer.u64(*parent).u64(*ino).u32(file_type.mode_bits()).u32(*permissions).u32(*uid).u32(*gid);
                writer.u32(*rdev);
                put_name(writer, name);
                put_blob(writer, content);
            }
            LogOperation::Link { ino, new_parent, new_name } => {
                writer.u64(*ino).u64(*new_parent);
                put_name(writer, new_name);
            }
            LogOperation::Unlink { parent, ino, held, name } | LogOperation::Rmdir { parent, ino, held, name } => {
                writer.u64(*parent).u64(*ino).u8(flag(*held));
                put_name(writer, name);
            }
            LogOperation::Rename {
                parent,
                new_parent,
                ino,
                replaced,
                replaced_held,
                no_replace,
                exchange,
                name,
                new_name,
            } => {
                writer.u64(*parent).u64(*new_parent).u64(*ino).u64(*replaced);
                writer.u8(flag(*replaced_held)).u8(flag(*no_replace)).u8(flag(*exchange));
                put_name(writer, name);
                put_name(writer, new_name);
            }
            LogOperation::SetAttributes { ino, changes } => {
                writer.u64(*ino);
                put_option_u32(writer, changes.permissions);
                put_option_u32(writer, changes.uid);
                put_option_u32(writer, changes.gid);
                put_option_u64(writer, changes.size);
                put_option_u64(writer, changes.atime_ns.map(|time| time as u64));
                put_option_u64(writer, changes.mtime_ns.map(|time| time as u64));
            }
            LogOperation::SetXattr { ino, create, replace, name, value } => {
                writer.u64(*ino).u8(flag(*create)).u8(flag(*replace));
                put_name(writer, name);
                put_blob(writer, value);
            }
            LogOperation::RemoveXattr { ino, name } => {
                writer.u64(*ino);
                put_name(writer, name);
            }
            LogOperation::Fallocate { ino, offset, length, mode } => {
                writer.u64(*ino).u64(*offset).u64(*length).u32(*mode);
            }
            LogOperation::Delete { ino } => {
                writer.u64(*ino);
            }
            LogOperation::InodeState {
                ino,
                born,
                current,
                mode,
                uid,
                gid,
                size,
                atime_ns,
                mtime_ns,
                ctime_ns,
                inline,
                blocks,
                embedded,
            } => {
                writer.u64(*ino).u64(*born).u64(*current).u32(*mode).u32(*uid).u32(*gid).u64(*size);
                writer.u64(*atime_ns as u64).u64(*mtime_ns as u64).u64(*ctime_ns as u64);
                writer.u8(flag(inline.is_some()));
                put_blob(writer, inline.as_deref().unwrap_or(&[]));
                writer.u32(blocks.len() as u32);
                for (block, pointer) in blocks {
                    writer.u64(*block).u64(pointer.0);
                }
                writer.u32(embedded.len() as u32);
                for block in embedded {
                    writer
                        .u64(block.block)
                        .u8(block.compression.to_byte())
                        .zeros(3)
                        .u32(block.logical_length)
                        .u32(block.payload.len() as u32)
                        .bytes(&block.payload);
                }
            }
        }
    }

    fn decode_body(tag: u8, reader: &mut Reader) -> Result<LogOperation, DecodeError> {
        let operation = match tag {
            1 => {
                let parent = read_ino(reader)?;
                let ino = read_ino(reader)?;
                let mode = reader.u32()?;
                let file_type =
                    FileType::from_mode(mode).ok_or_else(|| reader.error(format!("file type bits {mode:#o}")))?;
                let permissions = reader.u32()?;
                if permissions & !0o7777 != 0 {
                    return Err(reader.error(format!("permissions {permissions:#o}")));
                }
                let uid = reader.u32()?;
                let gid = reader.u32()?;
                let rdev = reader.u32()?;
                let name = read_name(reader, NAME_BYTES_MAX)?;
                let content = read_blob(reader, LOG_CONTENT_BYTES_MAX, "content")?;
                LogOperation::Create { parent, ino, file_type, permissions, uid, gid, rdev, name, content }
            }
            2 => {
                let ino = read_ino(reader)?;
                let new_parent = read_ino(reader)?;
                let new_name = read_name(reader, NAME_BYTES_MAX)?;
                LogOperation::Link { ino, new_parent, new_name }
            }
            3 | 4 => {
                let parent = read_ino(reader)?;
                let ino = read_ino(reader)?;
                let held = read_flag(reader)?;
                let name = read_name(reader, NAME_BYTES_MAX)?;
                if tag == 3 {
                    LogOperation::Unlink { parent, ino, held, name }
                } else {
                    LogOperation::Rmdir { parent, ino, held, name }
                }
            }
            5 => {
                let parent = read_ino(reader)?;
                let new_parent = read_ino(reader)?;
                let ino = read_ino(reader)?;
                let replaced = reader.u64()?;
                if replaced > u64::from(u32::MAX) {
                    return Err(reader.error(format!("inode number {replaced}")));
                }
                let replaced_held = read_flag(reader)?;
                let no_replace = read_flag(reader)?;
                let exchange = read_flag(reader)?;
                let name = read_name(reader, NAME_BYTES_MAX)?;
                let new_name = read_name(reader, NAME_BYTES_MAX)?;
                LogOperation::Rename {
                    parent,
                    new_parent,
                    ino,
                    replaced,
                    replaced_held,
                    no_replace,
                    exchange,
                    name,
                    new_name,
                }
            }
            6 => {
                let ino = read_ino(reader)?;
                let changes = SetAttributes {
                    permissions: read_option_u32(reader)?,
                    uid: read_option_u32(reader)?,
                    gid: read_option_u32(reader)?,
                    size: read_option_u64(reader)?,
                    atime_ns: read_option_u64(reader)?.map(|time| time as i64),
                    mtime_ns: read_option_u64(reader)?.map(|time| time as i64),
                };
                LogOperation::SetAttributes { ino, changes }
            }
            7 => {
                let ino = read_ino(reader)?;
                let create = read_flag(reader)?;
                let replace = read_flag(reader)?;
                let name = read_name(reader, XATTR_NAME_BYTES_MAX)?;
                let value = read_blob(reader, XATTR_BYTES_CAP, "xattr value")?;
                LogOperation::SetXattr { ino, create, replace, name, value }
            }
            8 => {
                let ino = read_ino(reader)?;
                let name = read_name(reader, XATTR_NAME_BYTES_MAX)?;
                LogOperation::RemoveXattr { ino, name }
            }
            9 => {
                let ino = read_ino(reader)?;
                LogOperation::Fallocate { ino, offset: reader.u64()?, length: reader.u64()?, mode: reader.u32()? }
            }
            10 => LogOperation::Delete { ino: read_ino(reader)? },
            11 => {
                let ino = read_ino(reader)?;
                let born = reader.u64()?;
                let current = reader.u64()?;
                if current < born {
                    return Err(reader.error(format!("version {current} older than born {born}")));
                }
                let mode = reader.u32()?;
                if FileType::from_mode(mode) != Some(FileType::Regular) {
                    return Err(reader.error(format!("an inode state of mode {mode:#o}, not a regular file")));
                }
                let uid = reader.u32()?;
                let gid = reader.u32()?;
                let size = reader.u64()?;
                let atime_ns = reader.u64()? as i64;
                let mtime_ns = reader.u64()? as i64;
                let ctime_ns = reader.u64()? as i64;
                let has_inline = read_flag(reader)?;
                let bytes = read_blob(reader, INLINE_BYTES_CAP, "inline data")?;
                if !has_inline && !bytes.is_empty() {
                    return Err(reader.error("inline bytes for a file of blocks"));
                }
                if has_inline && bytes.len() as u64 != size {
                    return Err(reader.error(format!("{} inline bytes for a size of {size}", bytes.len())));
                }
                let count = reader.u32()? as usize;
                if count > LOG_BLOCKS_PER_RECORD_MAX {
                    return Err(reader.error(format!("{count} blocks, over {LOG_BLOCKS_PER_RECORD_MAX}")));
                }
                let mut blocks = Vec::with_capacity(count.min(reader.remaining() / 16));
                for _ in 0..count {
                    let block = reader.u64()?;
                    let pointer = Pointer(reader.u64()?);
                    if pointer.is_null() {
                        return Err(reader.error(format!("block {block} at a null address")));
                    }
                    blocks.push((block, pointer));
                }
                let count = reader.u32()? as usize;
                if count > 0 && has_inline {
                    return Err(reader.error("embedded blocks for a file of inline bytes"));
                }
                let mut embedded = Vec::with_capacity(count.min(reader.remaining() / LOG_EMBEDDED_HEADER_BYTES));
                for _ in 0..count {
                    let block = reader.u64()?;
                    let compression_byte = reader.u8()?;
                    reader.zeros(3)?;
                    let logical_length = reader.u32()?;
                    let stored = reader.u32()? as usize;
                    let compression = crate::Compression::from_byte(compression_byte)
                        .ok_or_else(|| reader.error(format!("unknown compression {compression_byte}")))?;
                    // The rules of a chunk header: the same bytes, carried
                    // here instead of in a packed page.
                    let header = crate::ChunkHeader {
                        kind: crate::ChunkKind::FileData,
                        compression,
                        stored_length: stored as u32,
                        ino,
                        offset: 0,
                        logical_length,
                        version: current,
                    };
                    header.validate().map_err(|reason| reader.error(format!("embedded block {block}: {reason}")))?;
                    if embedded.last().is_some_and(|last: &EmbeddedBlock| last.block >= block) {
                        return Err(reader.error("embedded blocks out of order or repeated"));
                    }
                    let payload = reader.take(stored)?.to_vec();
                    embedded.push(EmbeddedBlock { block, compression, logical_length, payload });
                }
                LogOperation::InodeState {
                    ino,
                    born,
                    current,
                    mode,
                    uid,
                    gid,
                    size,
                    atime_ns,
                    mtime_ns,
                    ctime_ns,
                    inline: has_inline.then_some(bytes),
                    blocks,
                    embedded,
                }
            }
            other => return Err(reader.error(format!("unknown record tag {other}"))),
        };
        Ok(operation)
    }
}

impl LogRecord {
    /// The record as it sits in a batch (header and body), appended to
    /// `out`: a batch is its header and records encoded one by one, so an
    /// engine can buffer records encoded once, as they happen.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut body = Writer::with_capacity(64);
        self.encode_body(&mut body);
        let body = body.finish();
        let mut header = Writer::with_capacity(LOG_RECORD_HEADER_BYTES);
        header.u8(self.operation.tag()).zeros(3).u32(body.len() as u32);
        header.u64(self.version_next).u64(self.now_ns as u64);
        out.extend_from_slice(&header.finish());
        out.extend_from_slice(&body);
    }

    /// Bytes the record takes in a batch.
    pub fn encoded_bytes(&self) -> usize {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out.len()
    }
}

impl LogBatch {
    pub fn encode(&self) -> Vec<u8> {
        let mut records = Vec::with_capacity(64 * self.records.len());
        for record in &self.records {
            record.encode_into(&mut records);
        }
        LogBatch::encode_encoded(self.epoch, self.batch, self.records.len() as u32, &records)
    }

    /// A batch of `count` records already encoded back to back
    /// ([`LogRecord::encode_into`]).
    pub fn encode_encoded(epoch: u64, batch: u64, count: u32, records: &[u8]) -> Vec<u8> {
        let mut writer = Writer::with_capacity(LOG_BATCH_HEADER_BYTES + records.len());
        writer.u64(epoch).u64(batch).u32(count).zeros(4).bytes(records);
        writer.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LogBatch, DecodeError> {
        let mut reader = Reader::new("log batch", bytes);
        let epoch = reader.u64()?;
        let batch = reader.u64()?;
        let count = reader.u32()? as usize;
        reader.zeros(4)?;
        if count > reader.remaining() / LOG_RECORD_HEADER_BYTES {
            return Err(reader.error(format!("{count} records cannot fit in {} bytes", reader.remaining())));
        }
        let mut records = Vec::with_capacity(count);
        for index in 0..count {
            let tag = reader.u8()?;
            reader.zeros(3)?;
            let length = reader.u32()? as usize;
            let version_next = reader.u64()?;
            let now_ns = reader.u64()? as i64;
            let body = reader.take(length)?;
            let mut body_reader = Reader::new("log record", body);
            let operation = LogRecord::decode_body(tag, &mut body_reader).map_err(|error| DecodeError {
                structure: "log record",
                reason: format!("{index}: {}", error.reason),
            })?;
            if body_reader.remaining() != 0 {
                return Err(reader.error(format!("record {index} has {} bytes past its body", body_reader.remaining())));
            }
            records.push(LogRecord { version_next, now_ns, operation });
        }
        if reader.remaining() != 0 {
            return Err(reader.error(format!("{} bytes past the last record", reader.remaining())));
        }
        Ok(LogBatch { epoch, batch, records })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LogBatch {
        let records = vec![
            LogOperation::Create {
                parent: 1,
                ino: 2,
                file_type: FileType::Symlink,
                permissions: 0o777,
                uid: 5,
                gid: 6,
                rdev: 0,
                name: b"link".to_vec(),
                content: b"target".to_vec(),
            },
            LogOperation::Link { ino: 2, new_parent: 1, new_name: b"again".to_vec() },
            LogOperation::Unlink { parent: 1, ino: 2, held: true, name: b"link".to_vec() },
            LogOperation::Rmdir { parent: 1, ino: 3, held: false, name: b"d".to_vec() },
            LogOperation::Rename {
                parent: 1,
                new_parent: 4,
                ino: 5,
                replaced: 6,
                replaced_held: true,
                no_replace: false,
                exchange: false,
                name: b"a".to_vec(),
                new_name: b"b".to_vec(),
            },
            LogOperation::SetAttributes {
                ino: 5,
                changes: SetAttributes {
                    permissions: Some(0o600),
                    size: Some(0),
                    mtime_ns: Some(-3),
                    ..Default::default()
                },
            },
            LogOperation::SetXattr {
                ino: 5,
                create: true,
                replace: false,
                name: b"user.a".to_vec(),
                value: vec![1, 2],
            },
            LogOperation::RemoveXattr { ino: 5, name: b"user.a".to_vec() },
            LogOperation::Fallocate { ino: 5, offset: 4096, length: 8192, mode: 1 },
            LogOperation::Delete { ino: 2 },
            LogOperation::InodeState {
                ino: 5,
                born: 7,
                current: 9,
                mode: FileType::Regular.mode_bits() | 0o644,
                uid: 1,
                gid: 2,
                size: 10_000,
                atime_ns: 1,
                mtime_ns: 2,
                ctime_ns: 3,
                inline: None,
                blocks: vec![(0, Pointer::page_at(9, 3)), (2, Pointer::new(9, 4, 1, 3))],
                embedded: vec![
                    EmbeddedBlock {
                        block: 1,
                        compression: crate::Compression::Lz4,
                        logical_length: 4096,
                        payload: vec![7; 20],
                    },
                    EmbeddedBlock {
                        block: 3,
                        compression: crate::Compression::None,
                        logical_length: 5,
                        payload: vec![1, 2, 3, 4, 5],
                    },
                ],
            },
            LogOperation::InodeState {
                ino: 8,
                born: 7,
                current: 7,
                mode: FileType::Regular.mode_bits() | 0o644,
                uid: 1,
                gid: 2,
                size: 3,
                atime_ns: 1,
                mtime_ns: 2,
                ctime_ns: 3,
                inline: Some(vec![1, 2, 3]),
                blocks: Vec::new(),
                embedded: Vec::new(),
            },
        ];
        LogBatch {
            epoch: 12,
            batch: 3,
            records: records
                .into_iter()
                .enumerate()
                .map(|(index, operation)| LogRecord { version_next: 100 + index as u64, now_ns: -5, operation })
                .collect(),
        }
    }

    #[test]
    fn every_record_round_trips() {
        let batch = sample();
        assert_eq!(LogBatch::decode(&batch.encode()), Ok(batch));
    }

    #[test]
    fn a_batch_cut_anywhere_or_with_any_byte_changed_is_an_error_or_a_batch_never_a_panic() {
        let bytes = sample().encode();
        for end in 0..bytes.len() {
            assert!(LogBatch::decode(&bytes[..end]).is_err(), "cut at {end} decoded");
        }
        for index in 0..bytes.len() {
            let mut changed = bytes.clone();
            changed[index] ^= 0xa5;
            let _ = LogBatch::decode(&changed);
        }
    }

    #[test]
    fn the_skip_list_follows_every_inode_a_record_names() {
        let batch = sample();
        assert_eq!(batch.records[4].operation.inodes(), vec![1, 4, 5, 6]);
        assert_eq!(batch.records[10].operation.pointers().len(), 2);
        assert!(batch.records[0].operation.pointers().is_empty());
    }
}
