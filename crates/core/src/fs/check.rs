//! The checker over the whole tree: everything reachable from the root,
//! read without disturbing the cache (nothing it does writes), held to
//! every invariant the engine keeps:
//! - every directory is reached once, from its parent, and its link count
//!   is two plus its subdirectories;
//! - every entry's hash is its name's, it sits in the bucket its hash
//!   selects, and a directory's entry count is its entries;
//! - every file's link count is the number of entries naming it, and a
//!   file found physically names its one directory and its name's hash;
//! - every block pointer leads to a page or chunk whose inverted index is
//!   that file, that offset, and a version not older than the inode;
//! - every slot of the map is either reached exactly once or on the free
//!   list;
//! - the segment usage table counts exactly the bytes the tree references.
//!
//! It runs on the live file system, so it sees what the caller sees,
//! including what is still only in memory.

use std::collections::{BTreeMap, BTreeSet};

use flintfs_flash::FlashDevice;
use flintfs_format::{
    name_hash, DirectoryContent, Entry, FileContent, FileType, Node, Pointer, Target, INDEX_ROOTS, SLOT_NONE,
};

use super::nodes::MapEntry;
use super::nodes::{map_capacity, NodeKey};
use super::{Fs, Location, ROOT_SLOT};
use crate::check::CheckReport;
use crate::error::Result;
use crate::volume::ROOT_INO;

/// What the walk gathered.
#[derive(Default)]
struct Walk {
    findings: Vec<String>,
    /// Bytes referenced per zone.
    usage: BTreeMap<u32, u64>,
    /// Slots reached, and how.
    slots: BTreeMap<u32, &'static str>,
    /// Links found per file, with where its inode was found.
    links: BTreeMap<u64, (u32, Target)>,
    directories: u64,
    files: u64,
    blocks: u64,
    /// Name-hash ranges (directory, first, last) of buckets that could not
    /// be read: the entries there are lost.
    lost_ranges: Vec<(u64, u64, u64)>,
}

/// The first and last name hash of `run` table entries from `index` in a
/// table of depth `depth` (entries are indexed by the hash's top bits, of
/// 63).
fn hash_range(index: usize, run: usize, depth: u8) -> (u64, u64) {
    let shift = 63 - u32::from(depth);
    let low = (index as u64) << shift;
    let high = (((index + run) as u64) << shift).wrapping_sub(1) & (u64::MAX >> 1);
    (low, high)
}

impl<D: FlashDevice> Fs<D> {
    /// Checks every invariant of the durable frame and of the tree.
    pub fn check(&mut self) -> Result<CheckReport> {
        // Written back first where there is room; what finds none stays
        // pending, where the walk reads it (`peek`), as every read does.
        // Outside a checkpoint a write-back may not take the reserve, and
        // on a device that full the checkpoint is what writes it.
        super::ops::note_work_left(self.drain(), "before a check");
        let mut report = self.volume.check_frame(false)?;
        let mut walk = Walk::default();
        self.check_tree(&mut walk);
        report.findings.append(&mut walk.findings);
        Ok(report)
    }

    /// A node as the file system sees it now: from memory if it is there,
    /// else from `home`, without caching it.
    fn peek(&mut self, key: NodeKey, home: Pointer) -> std::result::Result<(Node, Pointer), String> {
        if let Some(cached) = self.nodes.peek(key).or_else(|| self.pending.get(&key)) {
            return Ok((cached.node.clone(), cached.home));
        }
        if let Some(cached) = self.load_kept(key).map_err(|error| error.message)? {
            return Ok((cached.node, cached.home));
        }
        if home.is_null() {
            return Err(format!("{key:?} is nowhere: not in memory, and nothing points at it"));
        }
        self.read_node(key, home).map(|node| (node, home)).map_err(|error| error.message)
    }

    fn count(&mut self, walk: &mut Walk, pointer: Pointer) {
        if !pointer.is_null() {
            *walk.usage.entry(pointer.zone()).or_default() += self.pointer_bytes(pointer);
        }
    }

    fn check_tree(&mut self, walk: &mut Walk) {
        // The map directory pages, then the map pages they locate.
        let capacity = map_capacity(self.page_size);
        let directory_capacity = super::nodes::map_directory_capacity(self.page_size);
        let map_pages = super::nodes::map_page_count(self.slot_count, self.page_size) as usize;
        let mut map_homes: Vec<Pointer> = Vec::with_capacity(map_pages);
        for number in 0..self.map_directory.len() {
            let home = self.map_directory[number];
            match self.peek(NodeKey::MapDirectory(number as u32), home) {
                Ok((Node::MapDirectory { pointers, .. }, home)) => {
                    self.count(walk, home);
                    map_homes.extend(pointers);
                }
                Ok(_) => walk.findings.push(format!("map directory page {number} is not a map directory page")),
                Err(reason) => {
                    walk.findings.push(format!("map directory page {number}: {reason}"));
                    map_homes.extend(std::iter::repeat_n(Pointer::NULL, directory_capacity));
                }
            }
        }
        if let Some(stray) = map_homes.iter().skip(map_pages).position(|home| !home.is_null()) {
            walk.findings.push(format!("map directory points at map page {}, past the map", map_pages + stray));
        }
        let mut map_entries: Vec<u64> = Vec::with_capacity(self.slot_count as usize);
        for page in 0..map_pages {
            let home = map_homes.get(page).copied().unwrap_or(Pointer::NULL);
            match self.peek(NodeKey::Map(page as u32), home) {
                Ok((Node::Map { entries, .. }, home)) => {
                    self.count(walk, home);
                    map_entries.extend(entries);
                }
                Ok(_) => walk.findings.push(format!("map page {page} is not a map page")),
                Err(reason) => {
                    walk.findings.push(format!("map page {page}: {reason}"));
                    map_entries.extend(std::iter::repeat_n(0, capacity));
                }
            }
        }
        map_entries.truncate(self.slot_count as usize);
        let slot_home = |slot: u32| -> Pointer {
            map_entries.get(slot as usize).map_or(Pointer::NULL, |&entry| match MapEntry::decode(entry) {
                MapEntry::Home(home) => home,
                _ => Pointer::NULL,
            })
        };
        // The checkpoint's root pointer is the root's page as the map had
        // it then: the same, while nothing has changed since.
        let unchanged = !self.changed
            && self.nodes.dirty_count() == 0
            && self.pending.is_empty()
            && self.kept.as_ref().is_none_or(|kept| !kept.has_uncommitted());
        let recorded_root = self.volume.checkpoint.tree.root;
        if unchanged && recorded_root != slot_home(ROOT_SLOT) {
            walk.findings
                .push(format!("the checkpoint puts the root at {recorded_root}, the map at {}", slot_home(ROOT_SLOT)));
        }
        // Directories, breadth first from the root.
        let mut queue = vec![(ROOT_SLOT, ROOT_INO)];
        while let Some((slot, parent)) = queue.pop() {
            if walk.slots.insert(slot, "directory").is_some() {
                walk.findings.push(format!("directory slot {slot} is reached twice: a cycle or a second link"));
                continue;
            }
            walk.directories += 1;
            let (node, home) = match self.peek(NodeKey::Slot(slot), slot_home(slot)) {
                Ok(found) => found,
                Err(reason) => {
                    walk.findings.push(format!("directory slot {slot}: {reason}"));
                    continue;
                }
            };
            self.count(walk, home);
            let Node::Directory { inode, entry_count, content, .. } = node else {
                walk.findings.push(format!("slot {slot} is reached as a directory but holds {:?}", node.kind()));
                continue;
            };
            let ino = u64::from(slot) + 1;
            if inode.ino != ino || inode.parent != parent {
                walk.findings.push(format!(
                    "directory slot {slot}: inode {} with parent {}, expected inode {ino} under {parent}",
                    inode.ino, inode.parent
                ));
            }
            let entries = self.directory_entries(walk, ino, content, &slot_home);
            if entries.len() as u64 != entry_count {
                let lost = if walk.lost_ranges.iter().any(|&(directory, _, _)| directory == ino) {
                    format!(": {} lost with its unreadable buckets", entry_count.saturating_sub(entries.len() as u64))
                } else {
                    String::new()
                };
                walk.findings
                    .push(format!("directory {ino}: counts {entry_count} entries, holds {}{lost}", entries.len()));
            }
            let mut names = BTreeSet::new();
            let mut subdirectories = 0;
            for entry in entries {
                if entry.hash != name_hash(self.hash_seed, &entry.name) {
                    walk.findings.push(format!("directory {ino}: entry {:?} has the wrong hash", entry.name));
                }
                if !names.insert(entry.name.clone()) {
                    walk.findings.push(format!("directory {ino}: two entries named {:?}", entry.name));
                }
                if entry.file_type == FileType::Directory {
                    subdirectories += 1;
                    match entry.target {
                        Target::Slot(child) if u64::from(child) + 1 == entry.ino => queue.push((child, ino)),
                        _ => walk.findings.push(format!("directory {ino}: subdirectory entry {entry:?} is malformed")),
                    }
                    continue;
                }
                self.check_file_entry(walk, ino, &entry, &slot_home);
                if let Target::Physical(_) = entry.target {
                    let expected = MapEntry::decode(MapEntry::locator(ino, entry.hash));
                    let found =
                        map_entries.get((entry.ino as usize).wrapping_sub(1)).map(|&value| MapEntry::decode(value));
                    if found != Some(expected) {
                        walk.findings.push(format!(
                            "inode {}: its map entry is {found:?}, not a locator for directory {ino}",
                            entry.ino
                        ));
                    }
                }
            }
            if inode.nlink != 2 + subdirectories {
                walk.findings.push(format!(
                    "directory {ino}: link count {}, expected {}",
                    inode.nlink,
                    2 + subdirectories
                ));
            }
        }
        // Files: link counts, then their data.
        let links: Vec<(u64, (u32, Target))> = walk.links.iter().map(|(&ino, &found)| (ino, found)).collect();
        for (ino, (count, target)) in links {
            self.check_file(walk, ino, count, target, &slot_home);
        }
        // Orphans: unlinked, still held, still counted.
        let mut orphans: Vec<(u64, Location, bool)> = self
            .known
            .iter()
            .filter(|(_, known)| known.orphan)
            .map(|(&ino, known)| (ino, known.location, known.directory))
            .collect();
        // In inode order, as the report has always listed them.
        orphans.sort_unstable_by_key(|&(ino, _, _)| ino);
        for (ino, location, directory) in orphans {
            if directory {
                // A removed directory still held: only its slot is kept.
                walk.slots.insert((ino - 1) as u32, "removed directory");
                continue;
            }
            let target = match location {
                Location::Physical { home } => Target::Physical(home),
                Location::Slot(slot) => Target::Slot(slot),
            };
            self.check_file(walk, ino, 0, target, &slot_home);
        }
        // Every slot reached once or free.
        let mut free = BTreeSet::new();
        let mut next = self.free_slot_head;
        while next != SLOT_NONE {
            if next >= self.slot_count || !free.insert(next) {
                walk.findings.push(format!("the free-slot list is broken at slot {next}"));
                break;
            }
            match map_entries.get(next as usize).map(|&entry| MapEntry::decode(entry)) {
                Some(MapEntry::Free { next: following }) => next = following,
                _ => {
                    walk.findings.push(format!("slot {next} is on the free list but its map entry is not free"));
                    break;
                }
            }
        }
        for slot in 0..self.slot_count {
            match (walk.slots.contains_key(&slot), free.contains(&slot)) {
                (true, true) => walk.findings.push(format!("slot {slot} is both in use and free")),
                (false, false) => {
                    let finding = self
                        .lost_with_a_bucket(walk, slot, &map_entries)
                        .unwrap_or_else(|| format!("slot {slot} is neither reached nor free: leaked"));
                    walk.findings.push(finding)
                }
                _ => {}
            }
        }
        // Segment usage against what the tree references.
        for (zone, usage) in self.volume.checkpoint.zones.iter().enumerate() {
            let counted = walk.usage.get(&(zone as u32)).copied().unwrap_or(0);
            if usage.valid_bytes != counted {
                walk.findings.push(format!(
                    "zone {zone}: the usage table says {} valid bytes, the tree references {counted}",
                    usage.valid_bytes
                ));
            }
            if counted > 0 && !usage.role.is_log_head() {
                walk.findings.push(format!("zone {zone} is {:?} but the tree references it", usage.role));
            }
        }
    }

    /// What a slot that nothing reaches held, when its entry was in a
    /// bucket that could not be read: the file or directory lost with it.
    fn lost_with_a_bucket(&mut self, walk: &Walk, slot: u32, map_entries: &[u64]) -> Option<String> {
        let in_lost = |directory: u64, hash: u64| {
            walk.lost_ranges.iter().any(|&(lost, low, high)| lost == directory && (low..=high).contains(&hash))
        };
        let ino = u64::from(slot) + 1;
        match MapEntry::decode(*map_entries.get(slot as usize)?) {
            MapEntry::Locator { parent, hash_prefix } if in_lost(parent, hash_prefix) => Some(format!(
                "inode {ino}, a file of directory {parent}, is lost: its entry was in an unreadable bucket"
            )),
            MapEntry::Home(home) => match self.peek(NodeKey::Slot(slot), home) {
                Ok((Node::Directory { inode, .. }, _))
                    if walk.lost_ranges.iter().any(|&(lost, _, _)| lost == inode.parent) =>
                {
                    Some(format!(
                        "inode {ino}, a directory of directory {}, is lost with all below it: its entry was in an \
                         unreadable bucket",
                        inode.parent
                    ))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// Every entry of a directory, checking its buckets on the way.
    fn directory_entries(
        &mut self,
        walk: &mut Walk,
        ino: u64,
        content: DirectoryContent,
        slot_home: &dyn Fn(u32) -> Pointer,
    ) -> Vec<Entry> {
        let (depth, slots) = match content {
            DirectoryContent::Inline(entries) => return entries,
            DirectoryContent::Hashed { global_depth, slots } => (global_depth, slots),
        };
        let size = 1usize << depth;
        let direct = flintfs_format::directory_area_bytes(self.page_size) / 4;
        let table: Vec<u32> = if size <= direct {
            slots
        } else {
            let mut table = Vec::with_capacity(size);
            for page in slots {
                if walk.slots.insert(page, "table").is_some() {
                    walk.findings.push(format!("directory {ino}: table slot {page} is reached twice"));
                    continue;
                }
                match self.peek(NodeKey::Slot(page), slot_home(page)) {
                    Ok((Node::Table { slots, directory, .. }, home)) if directory == ino => {
                        self.count(walk, home);
                        table.extend(slots);
                    }
                    Ok(_) => walk.findings.push(format!("directory {ino}: table slot {page} is not its table page")),
                    Err(reason) => walk.findings.push(format!("directory {ino}: table slot {page}: {reason}")),
                }
            }
            table
        };
        if table.len() != size {
            walk.findings.push(format!("directory {ino}: a table of depth {depth} with {} entries", table.len()));
            return Vec::new();
        }
        let mut entries = Vec::new();
        let mut index = 0;
        while index < size {
            let head = table[index];
            let mut run = 1;
            let mut slot = head;
            let mut first = true;
            loop {
                if walk.slots.insert(slot, "bucket").is_some() {
                    walk.findings.push(format!("directory {ino}: bucket slot {slot} is reached twice"));
                    break;
                }
                let (node, home) = match self.peek(NodeKey::Slot(slot), slot_home(slot)) {
                    Ok(found) => found,
                    Err(reason) => {
                        // The run of a lost head is the table entries that
                        // point at it; the hashes it held are what is lost.
                        if first {
                            run = table[index..].iter().take_while(|&&other| other == head).count();
                        }
                        let (low, high) = hash_range(index, run, depth);
                        walk.findings.push(format!(
                            "directory {ino}: bucket slot {slot} at {} is lost ({reason}): its entries, with name \
                             hashes {low:#018x} to {high:#018x}, are gone",
                            slot_home(slot)
                        ));
                        walk.lost_ranges.push((ino, low, high));
                        break;
                    }
                };
                self.count(walk, home);
                let Node::Bucket { directory, local_depth, next, entries: bucket, .. } = node else {
                    walk.findings.push(format!("directory {ino}: slot {slot} in its table is not a bucket"));
                    break;
                };
                if directory != ino || local_depth > depth {
                    walk.findings.push(format!("directory {ino}: bucket {slot} belongs elsewhere or is too deep"));
                    break;
                }
                if first {
                    run = 1usize << (depth - local_depth);
                    if index % run != 0 || table[index..index + run].iter().any(|&other| other != head) {
                        walk.findings.push(format!("directory {ino}: bucket {slot} does not cover its run"));
                    }
                    first = false;
                }
                for entry in &bucket {
                    let at = if depth == 0 { 0 } else { (entry.hash >> (63 - u32::from(depth))) as usize };
                    if at / run != index / run {
                        walk.findings.push(format!("directory {ino}: entry {:?} is in the wrong bucket", entry.name));
                    }
                }
                entries.extend(bucket);
                if next == SLOT_NONE {
                    break;
                }
                slot = next;
            }
            index += run;
        }
        entries
    }

    fn check_file_entry(&mut self, walk: &mut Walk, directory: u64, entry: &Entry, slot_home: &dyn Fn(u32) -> Pointer) {
        let found = walk.links.entry(entry.ino).or_insert((0, entry.target));
        found.0 += 1;
        if found.1 != entry.target {
            walk.findings.push(format!("inode {}: its entries point at different places", entry.ino));
        }
        if let Target::Physical(_) = entry.target {
            if found.0 > 1 {
                walk.findings.push(format!("inode {}: found physically from more than one entry", entry.ino));
            }
            let (node, _) = match self.file_node(entry.ino, entry.target, slot_home) {
                Ok(found) => found,
                Err(reason) => {
                    walk.findings.push(format!("inode {}: {reason}", entry.ino));
                    return;
                }
            };
            if let Node::File { inode, .. } = node {
                if inode.parent != directory || inode.name_hash != entry.hash {
                    walk.findings.push(format!(
                        "inode {}: names directory {} hash {:#x}, its entry is in {directory} with {:#x}",
                        entry.ino, inode.parent, inode.name_hash, entry.hash
                    ));
                }
                if inode.file_type() != Some(entry.file_type) {
                    walk.findings.push(format!("inode {}: its entry says {:?}", entry.ino, entry.file_type));
                }
            }
        }
    }

    /// A file's node, from memory or from where `target` says.
    fn file_node(
        &mut self,
        ino: u64,
        target: Target,
        slot_home: &dyn Fn(u32) -> Pointer,
    ) -> std::result::Result<(Node, Pointer), String> {
        let (key, home) = match target {
            Target::Physical(home) => (NodeKey::File(ino), home),
            Target::Slot(slot) => (NodeKey::Slot(slot), slot_home(slot)),
        };
        let (node, home) = self.peek(key, home)?;
        match &node {
            Node::File { inode, .. } if inode.ino == ino => Ok((node, home)),
            _ => Err(format!("{key:?} does not hold inode {ino}")),
        }
    }

    fn check_file(
        &mut self,
        walk: &mut Walk,
        ino: u64,
        links: u32,
        target: Target,
        slot_home: &dyn Fn(u32) -> Pointer,
    ) {
        walk.files += 1;
        let slot = ino.checked_sub(1).and_then(|slot| u32::try_from(slot).ok()).unwrap_or(SLOT_NONE);
        if walk.slots.insert(slot, "file").is_some() {
            walk.findings.push(format!("inode {ino}: slot {slot} is also reached as something else"));
        }
        if matches!(target, Target::Slot(found) if found != slot) {
            walk.findings.push(format!("inode {ino}: its entries name a slot other than its own"));
        }
        let (node, home) = match self.file_node(ino, target, slot_home) {
            Ok(found) => found,
            Err(reason) => {
                walk.findings.push(format!("inode {ino}: {reason}"));
                return;
            }
        };
        self.count(walk, home);
        let Node::File { inode, content, .. } = node else { unreachable!("file_node checks") };
        if inode.nlink != links {
            walk.findings.push(format!("inode {ino}: link count {}, found {links} entries", inode.nlink));
        }
        if matches!(target, Target::Slot(_)) && inode.parent != 0 {
            walk.findings.push(format!("inode {ino}: found through the map but names a parent"));
        }
        let FileContent::Index { height, blocks_stored, units_stored, roots, .. } = content else { return };
        let block_bytes = self.block_bytes();
        let mut blocks = Vec::new();
        if height == 0 {
            blocks.extend(roots.iter().enumerate().map(|(block, &pointer)| (block as u64, pointer)));
        } else {
            for (root, &pointer) in roots.iter().enumerate().take(INDEX_ROOTS) {
                self.walk_index(walk, ino, inode.born, height - 1, root as u64, pointer, &mut blocks);
            }
        }
        let pointed = blocks.iter().filter(|(_, pointer)| !pointer.is_null()).count() as u64;
        if pointed != u64::from(blocks_stored) {
            walk.findings
                .push(format!("inode {ino}: counts {blocks_stored} blocks stored, its index points at {pointed}"));
        }
        let units: u64 =
            blocks.iter().map(|&(_, pointer)| super::data::Stored::of(pointer, self.page_size).units).sum();
        if units != units_stored {
            walk.findings.push(format!("inode {ino}: counts {units_stored} units stored, its pointers name {units}"));
        }
        for (block, pointer) in blocks {
            if pointer.is_null() {
                continue;
            }
            walk.blocks += 1;
            self.count(walk, pointer);
            if block * block_bytes >= inode.size {
                walk.findings.push(format!("inode {ino}: block {block} is past its size {}", inode.size));
            }
            if let Err(error) = self.read_block(ino, inode.born, block, pointer) {
                walk.findings.push(format!("inode {ino}: block {block}: {}", error.message));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn walk_index(
        &mut self,
        walk: &mut Walk,
        ino: u64,
        born: u64,
        level: u8,
        number: u64,
        pointer: Pointer,
        blocks: &mut Vec<(u64, Pointer)>,
    ) {
        let key = NodeKey::Index { level, ino, number };
        if pointer.is_null() && !self.in_memory(key) {
            return;
        }
        let (node, home) = match self.peek(key, pointer) {
            Ok(found) => found,
            Err(reason) => {
                walk.findings.push(format!("inode {ino}: index page {level}/{number}: {reason}"));
                return;
            }
        };
        self.count(walk, home);
        let Node::Index { pointers, version, .. } = node else { unreachable!("peek checks identity") };
        if version < born {
            walk.findings.push(format!("inode {ino}: index page {level}/{number} is from an older life"));
        }
        let fanout = self.index_fanout();
        for (child, &child_pointer) in pointers.iter().enumerate() {
            let child_number = number * fanout + child as u64;
            if level == 0 {
                blocks.push((child_number, child_pointer));
            } else {
                self.walk_index(walk, ino, born, level - 1, child_number, child_pointer, blocks);
            }
        }
    }
}
