//! Fixed-width little-endian fields over byte slices, with every read
//! bounds-checked, so a decoder built on [`Reader`] cannot panic on any
//! input.

use crate::DecodeError;

/// Whether every byte is zero. Eight bytes a step, with no early exit, so
/// the compiler can vectorise it: a node page's zero tail, checked byte by
/// byte with an early exit, was a tenth of an unlink's host time.
pub fn all_zero(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    let folded = words.by_ref().fold(0u64, |acc, word| acc | u64::from_ne_bytes(word.try_into().expect("8 bytes")));
    folded == 0 && words.remainder().iter().all(|&byte| byte == 0)
}

/// Reads fields in order from a byte slice.
pub struct Reader<'a> {
    structure: &'static str,
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub fn new(structure: &'static str, bytes: &'a [u8]) -> Reader<'a> {
        Reader { structure, bytes, position: 0 }
    }

    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.position)
    }

    pub fn error(&self, reason: impl Into<String>) -> DecodeError {
        DecodeError { structure: self.structure, reason: reason.into() }
    }

    pub fn take(&mut self, length: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.position.checked_add(length).filter(|&end| end <= self.bytes.len()).ok_or_else(|| {
            self.error(format!(
                "needs {length} bytes at offset {}, only {} remain",
                self.position,
                self.bytes.len().saturating_sub(self.position)
            ))
        })?;
        let field = &self.bytes[self.position..end];
        self.position = end;
        Ok(field)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// Reserved bytes must be zero: a non-zero byte is damage or a newer
    /// format, never silently ignored.
    pub fn zeros(&mut self, length: usize) -> Result<(), DecodeError> {
        let offset = self.position;
        if !all_zero(self.take(length)?) {
            return Err(self.error(format!("reserved bytes {offset}..{} are not zero", offset + length)));
        }
        Ok(())
    }
}

/// `fields` one after the other in an array of `N` bytes, zeros after
/// them; for the fixed headers every page and every chunk has, which a
/// [`Writer`]'s vector would cost an allocation each. The fields must fit.
pub fn fixed_fields<const N: usize>(fields: &[&[u8]]) -> [u8; N] {
    let mut bytes = [0u8; N];
    let mut at = 0;
    for field in fields {
        bytes[at..at + field.len()].copy_from_slice(field);
        at += field.len();
    }
    bytes
}

/// Appends fields in order to a byte vector.
#[derive(Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(capacity: usize) -> Writer {
        Writer { bytes: Vec::with_capacity(capacity) }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn u8(&mut self, value: u8) -> &mut Writer {
        self.bytes.push(value);
        self
    }

    pub fn u16(&mut self, value: u16) -> &mut Writer {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u32(&mut self, value: u32) -> &mut Writer {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u64(&mut self, value: u64) -> &mut Writer {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, value: &[u8]) -> &mut Writer {
        self.bytes.extend_from_slice(value);
        self
    }

    pub fn zeros(&mut self, length: usize) -> &mut Writer {
        self.bytes.resize(self.bytes.len() + length, 0);
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}
