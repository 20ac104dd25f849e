//! The host file a backend keeps its durable state in (an image file, or
//! the block backend's device or file), or that file under a scratch view.
//!
//! A check must leave what it checks as it found it (`flintfs fsck`
//! without `--repair`, `inspect`, `stat` of an image or a block-backend
//! device), yet opening a device writes (an image's new epoch, the zone
//! records open corrected) and mounting an engine may write more
//! (recovery's checkpoint). Under a
//! scratch view those writes land in memory instead: each 4 KiB chunk of
//! the file is copied at its first write, every read sees the view over
//! the file, and a sync does nothing. The device and the engine above run
//! exactly as on a real open, so what a check finds is what a mount would
//! find, and nothing reaches the file. The view is bounded
//! ([`SCRATCH_BYTES_MAX`]): a check that would write more fails with a
//! message rather than take the host's memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, MutexGuard};

/// Bytes of the chunks a scratch view copies.
pub const SCRATCH_CHUNK_BYTES: u64 = 4096;
/// Bytes a scratch view holds at most (a check's recovery writes a
/// checkpoint: its node pages, a few records, tens of MiB after the
/// longest log; an `fsck -p` at boot must not take the host's memory).
pub const SCRATCH_BYTES_MAX: u64 = 256 << 20;
const _: () = assert!(SCRATCH_BYTES_MAX.is_multiple_of(SCRATCH_CHUNK_BYTES));
/// Pieces given to one pwritev (Linux's UIO_MAXIOV).
const IO_VECTORS_MAX: usize = 1024;

/// A host file, written through, or under a scratch view. Reads and
/// writes take it shared, so that the image backend's writer thread and
/// the reads of the thread that owns the device may use it at once (a
/// scratch view is behind a lock, taken only by a check, which has one
/// thread).
pub(crate) struct HostFile {
    file: File,
    /// Chunk index to the chunk's bytes as written, for a scratch view.
    scratch: Option<Mutex<BTreeMap<u64, Box<[u8]>>>>,
    /// Bytes the scratch view may hold.
    scratch_bytes_max: u64,
}

impl HostFile {
    /// Writes go to `file`.
    pub(crate) fn through(file: File) -> HostFile {
        HostFile { file, scratch: None, scratch_bytes_max: 0 }
    }

    /// Writes go to a view in memory; `file` is only read.
    pub(crate) fn scratch(file: File) -> HostFile {
        HostFile::scratch_bounded(file, SCRATCH_BYTES_MAX)
    }

    fn scratch_bounded(file: File, scratch_bytes_max: u64) -> HostFile {
        HostFile { file, scratch: Some(Mutex::new(BTreeMap::new())), scratch_bytes_max }
    }

    /// The file, for what only asks about it (its host file system, its
    /// holes). Nothing may write through it: writes go through
    /// [`HostFile::write_all_at`], [`HostFile::write_pieces_at`] and
    /// [`HostFile::punch_hole`].
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Whether writes land in a scratch view rather than the file.
    pub(crate) fn is_scratch(&self) -> bool {
        self.scratch.is_some()
    }

    /// Gives `[start, start + length)` back to the host (a hole), best
    /// effort: the bytes are garbage to the caller. Nothing in a scratch
    /// view, which would only have to remember zeros it never reads.
    pub(crate) fn punch_hole(&self, start: u64, length: u64) {
        if self.scratch.is_some() {
            return;
        }
        // SAFETY: fallocate on a descriptor this file owns.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                start as libc::off_t,
                length as libc::off_t,
            );
        }
    }

    /// The scratch view's chunks; a check that panicked while holding
    /// them left bytes as good as any (each copy is whole or not made).
    fn chunks(scratch: &Mutex<BTreeMap<u64, Box<[u8]>>>) -> MutexGuard<'_, BTreeMap<u64, Box<[u8]>>> {
        scratch.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
        let Some(scratch) = &self.scratch else { return self.file.read_exact_at(buffer, offset) };
        let chunks = HostFile::chunks(scratch);
        if chunks.is_empty() {
            return self.file.read_exact_at(buffer, offset);
        }
        let mut done = 0;
        while done < buffer.len() {
            let position = offset + done as u64;
            let (chunk, within) = (position / SCRATCH_CHUNK_BYTES, (position % SCRATCH_CHUNK_BYTES) as usize);
            if let Some(bytes) = chunks.get(&chunk) {
                let length = (SCRATCH_CHUNK_BYTES as usize - within).min(buffer.len() - done);
                buffer[done..done + length].copy_from_slice(&bytes[within..within + length]);
                done += length;
                continue;
            }
            // Up to the next chunk the view holds, in one read from the
            // file (as past the file's end a real file would, this fails:
            // an open refuses a file shorter than its layout).
            let next_held = chunks.range(chunk..).next().map_or(u64::MAX, |(&next, _)| next * SCRATCH_CHUNK_BYTES);
            let length = (next_held - position).min((buffer.len() - done) as u64) as usize;
            self.file.read_exact_at(&mut buffer[done..done + length], position)?;
            done += length;
        }
        Ok(())
    }

    pub(crate) fn write_all_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        let Some(scratch) = &self.scratch else { return self.file.write_all_at(bytes, offset) };
        let mut chunks = HostFile::chunks(scratch);
        let mut done = 0;
        while done < bytes.len() {
            let position = offset + done as u64;
            let (chunk, within) = (position / SCRATCH_CHUNK_BYTES, (position % SCRATCH_CHUNK_BYTES) as usize);
            let length = (SCRATCH_CHUNK_BYTES as usize - within).min(bytes.len() - done);
            if !chunks.contains_key(&chunk) {
                if (chunks.len() as u64 + 1) * SCRATCH_CHUNK_BYTES > self.scratch_bytes_max {
                    return Err(std::io::Error::other(format!(
                        "a check would write more than {} MiB into its scratch view of the file",
                        self.scratch_bytes_max >> 20
                    )));
                }
                chunks.insert(chunk, read_chunk(&self.file, chunk)?);
            }
            let stored = chunks.get_mut(&chunk).expect("the chunk was just copied");
            stored[within..within + length].copy_from_slice(&bytes[done..done + length]);
            done += length;
        }
        Ok(())
    }

    /// Writes `pieces` one after another from `offset`, in as few system
    /// calls as the host takes (pwritev), as one write_all_at of them
    /// joined would.
    pub(crate) fn write_pieces_at(&self, pieces: &[&[u8]], offset: u64) -> std::io::Result<()> {
        if self.scratch.is_some() {
            let mut at = offset;
            for piece in pieces {
                self.write_all_at(piece, at)?;
                at += piece.len() as u64;
            }
            return Ok(());
        }
        let mut slices: Vec<std::io::IoSlice<'_>> = pieces.iter().map(|piece| std::io::IoSlice::new(piece)).collect();
        let mut slices = &mut slices[..];
        let mut at = offset;
        // Empty pieces first: a pwritev of nothing but them writes 0 bytes,
        // which is no failure.
        std::io::IoSlice::advance_slices(&mut slices, 0);
        while !slices.is_empty() {
            let count = slices.len().min(IO_VECTORS_MAX);
            let position = libc::off_t::try_from(at).map_err(|_| std::io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            // SAFETY: IoSlice is ABI-compatible with iovec on Unix, and the
            // `count` slices it points at are borrowed for the call.
            let written = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    slices.as_ptr().cast::<libc::iovec>(),
                    count as libc::c_int,
                    position,
                )
            };
            match written {
                0 => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                written if written < 0 => {
                    let error = std::io::Error::last_os_error();
                    if error.kind() != std::io::ErrorKind::Interrupted {
                        return Err(error);
                    }
                }
                written => {
                    std::io::IoSlice::advance_slices(&mut slices, written as usize);
                    at += written as u64;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn sync_data(&self) -> std::io::Result<()> {
        match self.scratch {
            Some(_) => Ok(()),
            None => self.file.sync_data(),
        }
    }
}

/// The chunk `index` of `file` as it is: what lies past the file's end
/// reads as zeros (a sparse image's tail, a block device never has one).
fn read_chunk(file: &File, index: u64) -> std::io::Result<Box<[u8]>> {
    let mut bytes = vec![0u8; SCRATCH_CHUNK_BYTES as usize].into_boxed_slice();
    let mut done = 0;
    while done < bytes.len() {
        match file.read_at(&mut bytes[done..], index * SCRATCH_CHUNK_BYTES + done as u64) {
            Ok(0) => break,
            Ok(read) => done += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces land as one write of them joined would put them, on the
    /// file (more pieces than one pwritev takes) and in a scratch view.
    #[test]
    fn pieces_are_written_as_one_write_of_them_joined() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("image");
        let original = vec![0x11u8; 8 * SCRATCH_CHUNK_BYTES as usize];
        let lengths: Vec<usize> = (0..IO_VECTORS_MAX + 300).map(|index| [0, 1, 4, 7, 28][index % 5]).collect();
        let owned: Vec<Vec<u8>> =
            lengths.iter().enumerate().map(|(index, &length)| vec![(index % 250) as u8 + 1; length]).collect();
        let pieces: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let joined = pieces.concat();
        let offset = SCRATCH_CHUNK_BYTES - 3;
        for scratch in [true, false] {
            std::fs::write(&path, &original).unwrap();
            let file = std::fs::OpenOptions::new().read(true).write(!scratch).open(&path).unwrap();
            let host = if scratch { HostFile::scratch(file) } else { HostFile::through(file) };
            let mut expected = vec![0u8; joined.len() + 20];
            host.read_exact_at(&mut expected, offset - 10).unwrap();
            expected[10..10 + joined.len()].copy_from_slice(&joined);
            host.write_pieces_at(&pieces, offset).unwrap();
            let mut seen = vec![0u8; expected.len()];
            host.read_exact_at(&mut seen, offset - 10).unwrap();
            assert_eq!(seen, expected, "scratch view: {scratch}");
            host.write_pieces_at(&[&[], &[], &[]], offset).unwrap();
            if scratch {
                assert_eq!(std::fs::read(&path).unwrap(), original, "a scratch view leaves the file alone");
            }
        }
    }

    /// A scratch view reads back what was written over it, across chunk
    /// edges and past the file's end, and leaves the file as it was.
    #[test]
    fn a_scratch_view_reads_its_writes_and_leaves_the_file_alone() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("image");
        let original: Vec<u8> = (0..6 * SCRATCH_CHUNK_BYTES as usize + 100).map(|index| (index % 251) as u8).collect();
        std::fs::write(&path, &original).unwrap();
        let view = HostFile::scratch(std::fs::OpenOptions::new().read(true).open(&path).unwrap());
        let mut untouched = vec![0u8; 3 * SCRATCH_CHUNK_BYTES as usize];
        view.read_exact_at(&mut untouched, 100).unwrap();
        assert_eq!(untouched, original[100..][..untouched.len()], "an empty view reads the file");
        let written = vec![0xAB; SCRATCH_CHUNK_BYTES as usize + 10];
        view.write_all_at(&written, SCRATCH_CHUNK_BYTES - 5).unwrap();
        let tail = vec![0xCD; 50];
        let end = original.len() as u64 + 20;
        view.write_all_at(&tail, end).unwrap();
        view.sync_data().unwrap();
        let mut expected = original.clone();
        expected.resize(end as usize + tail.len(), 0);
        expected[SCRATCH_CHUNK_BYTES as usize - 5..][..written.len()].copy_from_slice(&written);
        expected[end as usize..].copy_from_slice(&tail);
        let mut seen = vec![0u8; expected.len()];
        view.read_exact_at(&mut seen, 0).unwrap();
        assert_eq!(seen, expected, "the view reads its own writes over the file");
        let mut piece = vec![0u8; 7];
        view.read_exact_at(&mut piece, SCRATCH_CHUNK_BYTES - 8).unwrap();
        assert_eq!(piece, [&original[SCRATCH_CHUNK_BYTES as usize - 8..][..3], &[0xAB; 4][..]].concat());
        // From held chunks (1 and 2) through three the view does not hold
        // (3 to 5, read from the file in one go) into the held tail (6).
        let start = 2 * SCRATCH_CHUNK_BYTES - 20;
        let mut across = vec![0u8; (end + 10 - start) as usize];
        view.read_exact_at(&mut across, start).unwrap();
        assert_eq!(across, expected[start as usize..][..across.len()]);
        drop(view);
        assert_eq!(std::fs::read(&path).unwrap(), original, "the file is as it was");
    }

    /// A view past its bound refuses the write with a message, holding
    /// what it held, and the file is as it was.
    #[test]
    fn a_scratch_view_past_its_bound_refuses_the_write() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("image");
        std::fs::write(&path, vec![5u8; 8 * SCRATCH_CHUNK_BYTES as usize]).unwrap();
        let file = std::fs::OpenOptions::new().read(true).open(&path).unwrap();
        let view = HostFile::scratch_bounded(file, 2 * SCRATCH_CHUNK_BYTES);
        view.write_all_at(&[1u8; 2 * SCRATCH_CHUNK_BYTES as usize], 0).unwrap();
        let refused = view.write_all_at(&[2u8; 4], 3 * SCRATCH_CHUNK_BYTES).unwrap_err();
        assert!(refused.to_string().contains("scratch view"), "{refused}");
        let mut seen = vec![0u8; 4 * SCRATCH_CHUNK_BYTES as usize];
        view.read_exact_at(&mut seen, 0).unwrap();
        assert_eq!(seen[..2 * SCRATCH_CHUNK_BYTES as usize], [1u8; 2 * SCRATCH_CHUNK_BYTES as usize]);
        assert_eq!(seen[2 * SCRATCH_CHUNK_BYTES as usize..], [5u8; 2 * SCRATCH_CHUNK_BYTES as usize]);
        assert_eq!(std::fs::read(&path).unwrap(), vec![5u8; 8 * SCRATCH_CHUNK_BYTES as usize]);
    }
}
