//! A reference model of a POSIX namespace, in memory and obviously right,
//! and a seeded generator of operations on it. Tests run the same
//! operations on the engine and on the model and require the same results
//! (data, or the same errno), then compare the whole trees.
//!
//! Paths are lists of names from the root, so the model and the engine
//! need not agree on inode numbers.

use std::collections::BTreeMap;

use flintfs_core::errno;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

pub type Path = Vec<Vec<u8>>;
type Id = u64;
const ROOT: Id = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Regular,
    Directory,
    Symlink,
    Fifo,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Object {
    Directory { entries: BTreeMap<Vec<u8>, Id>, parent: Id, xattrs: BTreeMap<Vec<u8>, Vec<u8>> },
    File { kind: Kind, data: Vec<u8>, nlink: u32, xattrs: BTreeMap<Vec<u8>, Vec<u8>>, permissions: u32 },
}

/// The model file system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    objects: BTreeMap<Id, Object>,
    next: Id,
    /// The bound on one inode's xattrs, as the engine encodes them (name
    /// length, value length, name, value): past it, ENOSPC.
    xattr_bytes_max: usize,
}

/// What a whole tree looks like, for comparing the model with the engine:
/// every path with its kind, content, link count and xattrs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot(pub BTreeMap<Path, SnapshotEntry>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub kind: Kind,
    pub data: Vec<u8>,
    pub nlink: u32,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// A file's permission bits (chmod's); `None` for a directory, whose
    /// bits the model does not change.
    pub permissions: Option<u32>,
}

/// One operation of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    Create {
        directory: Path,
        name: Vec<u8>,
    },
    Mkdir {
        directory: Path,
        name: Vec<u8>,
    },
    Mkfifo {
        directory: Path,
        name: Vec<u8>,
    },
    Symlink {
        directory: Path,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Write {
        path: Path,
        offset: u64,
        length: u64,
        fill: u8,
    },
    Truncate {
        path: Path,
        size: u64,
    },
    Read {
        path: Path,
        offset: u64,
        length: u64,
    },
    /// fallocate(PUNCH_HOLE | KEEP_SIZE): the range reads as zeros, the
    /// size stays.
    PunchHole {
        path: Path,
        offset: u64,
        length: u64,
    },
    /// fallocate(ZERO_RANGE), with KEEP_SIZE or without: the range reads
    /// as zeros after; without KEEP_SIZE a range past the end grows the
    /// file to cover it.
    ZeroRange {
        path: Path,
        offset: u64,
        length: u64,
        keep_size: bool,
    },
    Unlink {
        directory: Path,
        name: Vec<u8>,
    },
    Rmdir {
        directory: Path,
        name: Vec<u8>,
    },
    Rename {
        directory: Path,
        name: Vec<u8>,
        new_directory: Path,
        new_name: Vec<u8>,
        no_replace: bool,
        exchange: bool,
    },
    Link {
        path: Path,
        directory: Path,
        name: Vec<u8>,
    },
    SetXattr {
        path: Path,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        path: Path,
        name: Vec<u8>,
    },
    Chmod {
        path: Path,
        permissions: u32,
    },
    Readdir {
        directory: Path,
    },
    /// fsync, or fdatasync when `data_only`.
    Fsync {
        path: Path,
        data_only: bool,
    },
    Sync,
    Remount,
}

impl Operation {
    /// Operations after which everything before is durable.
    pub fn is_durable_point(&self) -> bool {
        matches!(self, Operation::Fsync { .. } | Operation::Sync | Operation::Remount)
    }
}

/// What an operation returned, in the form both sides can give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Data(Vec<u8>),
    Names(Vec<(Vec<u8>, Kind)>),
    Error(i32),
}

/// The bytes a write of `length` with `fill` puts down: varied, so a
/// misplaced block shows. An even fill gives runs of 16 bytes, which
/// compress to a small chunk even in a 512-byte block; an odd fill gives
/// noise, which does not compress and is stored raw. Both come from the
/// position, so a block written at another offset shows too.
pub fn write_pattern(offset: u64, length: u64, fill: u8) -> Vec<u8> {
    (offset..offset + length)
        .map(|position| {
            if fill.is_multiple_of(2) {
                fill ^ (position / 16 % 251) as u8
            } else {
                let mixed = (position ^ u64::from(fill) << 56).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                fill ^ (mixed >> 56) as u8
            }
        })
        .collect()
}

impl Default for Model {
    fn default() -> Model {
        Model::new()
    }
}

impl Model {
    pub fn new() -> Model {
        let mut objects = BTreeMap::new();
        objects.insert(ROOT, Object::Directory { entries: BTreeMap::new(), parent: ROOT, xattrs: BTreeMap::new() });
        Model { objects, next: 1, xattr_bytes_max: usize::MAX }
    }

    /// A model of a file system with pages of `page_size_bytes`.
    pub fn for_page_size(page_size_bytes: usize) -> Model {
        Model { xattr_bytes_max: flintfs_format::xattr_bytes_max(page_size_bytes), ..Model::new() }
    }

    fn resolve(&self, path: &[Vec<u8>]) -> Result<Id, i32> {
        let mut id = ROOT;
        for name in path {
            match &self.objects[&id] {
                Object::Directory { .. } if name.len() > 255 => return Err(errno::ENAMETOOLONG),
                Object::Directory { entries, .. } => id = *entries.get(name).ok_or(errno::ENOENT)?,
                Object::File { .. } => return Err(errno::ENOTDIR),
            }
        }
        Ok(id)
    }

    fn directory(&self, path: &[Vec<u8>]) -> Result<Id, i32> {
        let id = self.resolve(path)?;
        match self.objects[&id] {
            Object::Directory { .. } => Ok(id),
            _ => Err(errno::ENOTDIR),
        }
    }

    fn entries(&self, id: Id) -> &BTreeMap<Vec<u8>, Id> {
        match &self.objects[&id] {
            Object::Directory { entries, .. } => entries,
            _ => unreachable!("a directory"),
        }
    }

    fn entries_mut(&mut self, id: Id) -> &mut BTreeMap<Vec<u8>, Id> {
        match self.objects.get_mut(&id) {
            Some(Object::Directory { entries, .. }) => entries,
            _ => unreachable!("a directory"),
        }
    }

    fn check_name(name: &[u8]) -> Result<(), i32> {
        if name.len() > 255 {
            return Err(errno::ENAMETOOLONG);
        }
        if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
            return Err(errno::EINVAL);
        }
        Ok(())
    }

    fn is_directory(&self, id: Id) -> bool {
        matches!(self.objects[&id], Object::Directory { .. })
    }

    /// Whether `id` is `ancestor` or below it.
    fn within(&self, mut id: Id, ancestor: Id) -> bool {
        loop {
            if id == ancestor {
                return true;
            }
            if id == ROOT {
                return false;
            }
            id = match self.objects[&id] {
                Object::Directory { parent, .. } => parent,
                _ => unreachable!("directories only"),
            };
        }
    }

    fn make(&mut self, directory: &[Vec<u8>], name: &[u8], object: Object) -> Result<(), i32> {
        let parent = self.directory(directory)?;
        Model::check_name(name)?;
        if self.entries(parent).contains_key(name) {
            return Err(errno::EEXIST);
        }
        let id = self.next;
        self.next += 1;
        let object = match object {
            Object::Directory { entries, xattrs, .. } => Object::Directory { entries, parent, xattrs },
            file => file,
        };
        self.objects.insert(id, object);
        self.entries_mut(parent).insert(name.to_vec(), id);
        Ok(())
    }

    fn file(kind: Kind, data: Vec<u8>) -> Object {
        // A symlink's bits are 0777, as on Linux; the others are made 0644.
        let permissions = if kind == Kind::Symlink { 0o777 } else { 0o644 };
        Object::File { kind, data, nlink: 1, xattrs: BTreeMap::new(), permissions }
    }

    /// Drops one link of `id`; removes it when none is left.
    fn unlink_object(&mut self, id: Id) {
        if let Some(Object::File { nlink, .. }) = self.objects.get_mut(&id) {
            *nlink -= 1;
            if *nlink == 0 {
                self.objects.remove(&id);
            }
        } else {
            self.objects.remove(&id);
        }
    }

    fn data_mut(&mut self, path: &[Vec<u8>]) -> Result<&mut Vec<u8>, i32> {
        let id = self.resolve(path)?;
        match self.objects.get_mut(&id) {
            Some(Object::File { kind: Kind::Regular, data, .. }) => Ok(data),
            Some(Object::Directory { .. }) => Err(errno::EISDIR),
            _ => Err(errno::EINVAL),
        }
    }

    /// vfs_fallocate's errors: a zero length, then what is not a regular
    /// file (a name that resolves to nothing fails its open first). The
    /// largest file's EFBIG is the engine's limit, which generated offsets
    /// never reach.
    fn fallocate_target(&self, path: &[Vec<u8>], length: u64) -> Result<(), i32> {
        let id = self.resolve(path)?;
        if length == 0 {
            return Err(errno::EINVAL);
        }
        match self.objects.get(&id) {
            Some(Object::Directory { .. }) => Err(errno::EISDIR),
            Some(Object::File { kind: Kind::Fifo, .. }) => Err(errno::ESPIPE),
            Some(Object::File { kind: Kind::Symlink, .. }) => Err(errno::ENODEV),
            _ => Ok(()),
        }
    }

    /// The range reads as zeros after; without `keep_size` a range past the
    /// end grows the file to cover it.
    fn zero_range(&mut self, path: &[Vec<u8>], offset: u64, length: u64, keep_size: bool) -> Result<(), i32> {
        self.fallocate_target(path, length)?;
        let data = self.data_mut(path)?;
        let range_end = (offset + length) as usize;
        if !keep_size && range_end > data.len() {
            data.resize(range_end, 0);
        }
        let end = range_end.min(data.len());
        let start = (offset as usize).min(end);
        data[start..end].fill(0);
        Ok(())
    }

    fn xattrs_mut(&mut self, path: &[Vec<u8>]) -> Result<&mut BTreeMap<Vec<u8>, Vec<u8>>, i32> {
        let id = self.resolve(path)?;
        match self.objects.get_mut(&id) {
            Some(Object::File { xattrs, .. }) | Some(Object::Directory { xattrs, .. }) => Ok(xattrs),
            None => unreachable!("resolved"),
        }
    }

    /// Applies an operation; returns what POSIX says it returns.
    pub fn apply(&mut self, operation: &Operation) -> Outcome {
        match self.apply_inner(operation) {
            Ok(outcome) => outcome,
            Err(code) => Outcome::Error(code),
        }
    }

    fn apply_inner(&mut self, operation: &Operation) -> Result<Outcome, i32> {
        match operation {
            Operation::Create { directory, name } => self.make(directory, name, Model::file(Kind::Regular, Vec::new())),
            Operation::Mkfifo { directory, name } => self.make(directory, name, Model::file(Kind::Fifo, Vec::new())),
            Operation::Symlink { directory, name, target } => {
                self.make(directory, name, Model::file(Kind::Symlink, target.clone()))
            }
            Operation::Mkdir { directory, name } => self.make(
                directory,
                name,
                Object::Directory { entries: BTreeMap::new(), parent: ROOT, xattrs: BTreeMap::new() },
            ),
            Operation::Write { path, offset, length, fill } => {
                let data = self.data_mut(path)?;
                let end = (offset + length) as usize;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*offset as usize..end].copy_from_slice(&write_pattern(*offset, *length, *fill));
                Ok(())
            }
            Operation::Truncate { path, size } => {
                self.data_mut(path)?.resize(*size as usize, 0);
                Ok(())
            }
            // A punched hole is a zeroed range that keeps the size.
            Operation::PunchHole { path, offset, length } => self.zero_range(path, *offset, *length, true),
            Operation::ZeroRange { path, offset, length, keep_size } => {
                self.zero_range(path, *offset, *length, *keep_size)
            }
            Operation::Read { path, offset, length } => {
                let data = self.data_mut(path)?;
                let start = (*offset as usize).min(data.len());
                let end = ((offset + length) as usize).min(data.len());
                return Ok(Outcome::Data(data[start..end].to_vec()));
            }
            Operation::Unlink { directory, name } => {
                let parent = self.directory(directory)?;
                Model::check_name(name)?;
                let id = *self.entries(parent).get(name).ok_or(errno::ENOENT)?;
                if self.is_directory(id) {
                    return Err(errno::EISDIR);
                }
                self.entries_mut(parent).remove(name);
                self.unlink_object(id);
                Ok(())
            }
            Operation::Rmdir { directory, name } => {
                let parent = self.directory(directory)?;
                Model::check_name(name)?;
                let id = *self.entries(parent).get(name).ok_or(errno::ENOENT)?;
                if !self.is_directory(id) {
                    return Err(errno::ENOTDIR);
                }
                if !self.entries(id).is_empty() {
                    return Err(errno::ENOTEMPTY);
                }
                self.entries_mut(parent).remove(name);
                self.objects.remove(&id);
                Ok(())
            }
            Operation::Rename { directory, name, new_directory, new_name, no_replace, exchange } => {
                self.rename(directory, name, new_directory, new_name, *no_replace, *exchange)
            }
            Operation::Link { path, directory, name } => {
                let id = self.resolve(path)?;
                let parent = self.directory(directory)?;
                Model::check_name(name)?;
                if self.is_directory(id) {
                    return Err(errno::EPERM);
                }
                if self.entries(parent).contains_key(name) {
                    return Err(errno::EEXIST);
                }
                if let Some(Object::File { nlink, .. }) = self.objects.get_mut(&id) {
                    *nlink += 1;
                }
                self.entries_mut(parent).insert(name.clone(), id);
                Ok(())
            }
            Operation::SetXattr { path, name, value } => {
                let bound = self.xattr_bytes_max;
                let xattrs = self.xattrs_mut(path)?;
                let mut after = xattrs.clone();
                after.insert(name.clone(), value.clone());
                let bytes: usize = after.iter().map(|(name, value)| 3 + name.len() + value.len()).sum();
                if bytes > bound {
                    return Err(errno::ENOSPC);
                }
                *xattrs = after;
                Ok(())
            }
            Operation::RemoveXattr { path, name } => {
                self.xattrs_mut(path)?.remove(name).ok_or(errno::ENODATA)?;
                Ok(())
            }
            Operation::Chmod { path, permissions } => {
                let id = self.resolve(path)?;
                if let Some(Object::File { permissions: current, .. }) = self.objects.get_mut(&id) {
                    *current = *permissions;
                }
                Ok(())
            }
            Operation::Readdir { directory } => {
                let id = self.directory(directory)?;
                let mut names: Vec<(Vec<u8>, Kind)> =
                    self.entries(id).iter().map(|(name, &child)| (name.clone(), self.kind(child))).collect();
                names.sort();
                return Ok(Outcome::Names(names));
            }
            Operation::Fsync { path, .. } => {
                self.resolve(path)?;
                Ok(())
            }
            Operation::Sync | Operation::Remount => Ok(()),
        }
        .map(|()| Outcome::Done)
    }

    fn kind(&self, id: Id) -> Kind {
        match &self.objects[&id] {
            Object::Directory { .. } => Kind::Directory,
            Object::File { kind, .. } => *kind,
        }
    }

    fn rename(
        &mut self,
        directory: &[Vec<u8>],
        name: &[u8],
        new_directory: &[Vec<u8>],
        new_name: &[u8],
        no_replace: bool,
        exchange: bool,
    ) -> Result<(), i32> {
        let parent = self.directory(directory)?;
        let new_parent = self.directory(new_directory)?;
        if no_replace && exchange {
            return Err(errno::EINVAL);
        }
        for checked in [name, new_name] {
            Model::check_name(checked)?;
        }
        let source = *self.entries(parent).get(name).ok_or(errno::ENOENT)?;
        let target = self.entries(new_parent).get(new_name).copied();
        if self.is_directory(source) && self.within(new_parent, source) {
            return Err(errno::EINVAL);
        }
        if exchange {
            let target = target.ok_or(errno::ENOENT)?;
            if self.is_directory(target) && self.within(parent, target) {
                return Err(errno::EINVAL);
            }
            if (parent, name) == (new_parent, new_name) {
                return Ok(());
            }
            self.entries_mut(parent).insert(name.to_vec(), target);
            self.entries_mut(new_parent).insert(new_name.to_vec(), source);
            self.set_parent(target, parent);
            self.set_parent(source, new_parent);
            return Ok(());
        }
        if (parent, name) == (new_parent, new_name) {
            return Ok(());
        }
        if let Some(target) = target {
            if no_replace {
                return Err(errno::EEXIST);
            }
            if target == source {
                return Ok(());
            }
            match (self.is_directory(source), self.is_directory(target)) {
                (true, false) => return Err(errno::ENOTDIR),
                (false, true) => return Err(errno::EISDIR),
                (true, true) if !self.entries(target).is_empty() => return Err(errno::ENOTEMPTY),
                _ => {}
            }
            self.entries_mut(new_parent).remove(new_name);
            self.unlink_object(target);
        }
        self.entries_mut(parent).remove(name);
        self.entries_mut(new_parent).insert(new_name.to_vec(), source);
        self.set_parent(source, new_parent);
        Ok(())
    }

    fn set_parent(&mut self, id: Id, new_parent: Id) {
        if let Some(Object::Directory { parent, .. }) = self.objects.get_mut(&id) {
            *parent = new_parent;
        }
    }

    /// The whole tree.
    pub fn snapshot(&self) -> Snapshot {
        let mut out = BTreeMap::new();
        let mut stack: Vec<(Path, Id)> = vec![(Vec::new(), ROOT)];
        while let Some((path, id)) = stack.pop() {
            let entry = match &self.objects[&id] {
                Object::Directory { entries, xattrs, .. } => {
                    for (name, &child) in entries {
                        let mut child_path = path.clone();
                        child_path.push(name.clone());
                        stack.push((child_path, child));
                    }
                    let subdirectories = entries.values().filter(|&&child| self.is_directory(child)).count();
                    SnapshotEntry {
                        kind: Kind::Directory,
                        data: Vec::new(),
                        nlink: 2 + subdirectories as u32,
                        xattrs: xattrs.clone(),
                        permissions: None,
                    }
                }
                Object::File { kind, data, nlink, xattrs, permissions } => SnapshotEntry {
                    kind: *kind,
                    data: data.clone(),
                    nlink: *nlink,
                    xattrs: xattrs.clone(),
                    permissions: Some(*permissions),
                },
            };
            out.insert(path, entry);
        }
        Snapshot(out)
    }

    /// Which object each path names: the identity that hard links share
    /// and renames keep, for judging a file by what it is, not where.
    pub fn identities(&self) -> BTreeMap<Path, u64> {
        let mut out = BTreeMap::new();
        let mut stack: Vec<(Path, Id)> = vec![(Vec::new(), ROOT)];
        while let Some((path, id)) = stack.pop() {
            if let Object::Directory { entries, .. } = &self.objects[&id] {
                for (name, &child) in entries {
                    let mut child_path = path.clone();
                    child_path.push(name.clone());
                    stack.push((child_path, child));
                }
            }
            out.insert(path, id);
        }
        out
    }

    /// Every path in the tree, directories and the rest apart.
    pub fn paths(&self) -> (Vec<Path>, Vec<Path>) {
        let snapshot = self.snapshot();
        let mut directories = Vec::new();
        let mut others = Vec::new();
        for (path, entry) in snapshot.0 {
            if entry.kind == Kind::Directory {
                directories.push(path);
            } else {
                others.push(path);
            }
        }
        (directories, others)
    }
}

/// A seeded generator of operations that mostly make sense against the
/// model's current tree, and sometimes do not (to exercise every error).
pub struct Generator {
    random: Pcg64,
    /// Largest write and file size it asks for.
    pub write_bytes_max: u64,
    /// Sync and remount (each a checkpoint) one time in 20 they would
    /// come, fsync the rest: so that a log the checkpoints would keep
    /// short (the NVM ring) fills within a workload.
    pub checkpoints_rare: bool,
}

const NAMES: [&[u8]; 8] = [b"a", b"b", b"c", b"dir", b"file", b"x", b"a-longer-name-for-buckets", b"z"];

impl Generator {
    pub fn new(seed: u64, write_bytes_max: u64) -> Generator {
        Generator { random: Pcg64::seed_from_u64(seed), write_bytes_max, checkpoints_rare: false }
    }

    fn name(&mut self) -> Vec<u8> {
        match self.random.random_range(0..100) {
            0 => vec![b'n'; 256],
            1 => vec![b'l'; 255],
            2..=20 => format!("f{}", self.random.random_range(0..200)).into_bytes(),
            _ => NAMES[self.random.random_range(0..NAMES.len())].to_vec(),
        }
    }

    fn pick(&mut self, paths: &[Path]) -> Path {
        if paths.is_empty() || self.random.random_range(0..10) == 0 {
            return vec![self.name()];
        }
        paths[self.random.random_range(0..paths.len())].clone()
    }

    fn directory(&mut self, directories: &[Path]) -> Path {
        if self.random.random_range(0..20) == 0 {
            let mut path = self.pick(directories);
            path.push(self.name());
            return path;
        }
        self.pick(directories)
    }

    /// The next operation for a tree like `model`'s.
    pub fn next(&mut self, model: &Model) -> Operation {
        let (directories, files) = model.paths();
        let any: Vec<Path> = directories.iter().chain(&files).cloned().collect();
        let size_max = self.write_bytes_max;
        match self.random.random_range(0..100) {
            0..=11 => Operation::Create { directory: self.directory(&directories), name: self.name() },
            12..=16 => Operation::Mkdir { directory: self.directory(&directories), name: self.name() },
            17 => Operation::Mkfifo { directory: self.directory(&directories), name: self.name() },
            18..=19 => Operation::Symlink {
                directory: self.directory(&directories),
                name: self.name(),
                target: vec![b't'; self.random.random_range(1..300)],
            },
            20..=39 => {
                let short = self.random.random_bool(0.7);
                let length = self.random.random_range(1..=if short { size_max.min(200) } else { size_max });
                // One write in ten lands up to four times further, so files
                // pass the inode's 16 roots and grow an index page (a pack
                // record while its pointers are few, a page past that).
                let far = if self.random.random_bool(0.1) { 4 } else { 1 };
                Operation::Write {
                    path: self.pick(&files),
                    offset: self.random.random_range(0..size_max * far),
                    length,
                    fill: self.random.random(),
                }
            }
            40..=44 => Operation::Truncate { path: self.pick(&files), size: self.random.random_range(0..=size_max) },
            45..=51 => Operation::Read {
                path: self.pick(&files),
                offset: self.random.random_range(0..size_max),
                length: self.random.random_range(1..=size_max),
            },
            52 => Operation::ZeroRange {
                path: self.pick(&files),
                offset: self.random.random_range(0..size_max),
                length: self.random.random_range(1..=size_max),
                keep_size: self.random.random_bool(0.5),
            },
            53..=54 => Operation::PunchHole {
                path: self.pick(&files),
                offset: self.random.random_range(0..size_max),
                length: self.random.random_range(1..=size_max),
            },
            55..=62 => {
                let path = self.pick(&files);
                let (directory, name) = split(path);
                Operation::Unlink { directory, name }
            }
            63..=66 => {
                let path = self.pick(&directories);
                let (directory, name) = split(path);
                Operation::Rmdir { directory, name }
            }
            67..=76 => {
                let (directory, name) = split(self.pick(&any));
                let new_directory = self.directory(&directories);
                let flags = self.random.random_range(0..10);
                Operation::Rename {
                    directory,
                    name,
                    new_directory,
                    new_name: self.name(),
                    no_replace: flags == 0,
                    exchange: flags == 1,
                }
            }
            77..=80 => {
                Operation::Link { path: self.pick(&files), directory: self.directory(&directories), name: self.name() }
            }
            81..=83 => Operation::SetXattr {
                path: self.pick(&any),
                name: format!("user.{}", self.random.random_range(0..4)).into_bytes(),
                value: vec![self.random.random(); self.random.random_range(0..40)],
            },
            84 => Operation::RemoveXattr {
                path: self.pick(&any),
                name: format!("user.{}", self.random.random_range(0..4)).into_bytes(),
            },
            85..=86 => Operation::Chmod { path: self.pick(&files), permissions: self.random.random_range(0..0o1000) },
            87..=92 => Operation::Readdir { directory: self.pick(&directories) },
            93..=95 => Operation::Fsync { path: self.pick(&any), data_only: self.random.random_bool(0.3) },
            96..=99 if self.checkpoints_rare && self.random.random_range(0..20) != 0 => {
                Operation::Fsync { path: self.pick(&any), data_only: self.random.random_bool(0.3) }
            }
            96..=97 => Operation::Sync,
            _ => Operation::Remount,
        }
    }
}

/// A path's directory and last name (the root splits into itself and an
/// empty name, which every operation refuses).
fn split(mut path: Path) -> (Path, Vec<u8>) {
    let name = path.pop().unwrap_or_default();
    (path, name)
}
