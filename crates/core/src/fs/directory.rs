//! Directories: entries sorted by hash in the directory's own page (DFFS's
//! inode embedding) until they no longer fit; then an extendible hash
//! table of bucket pages, indexed by the top bits of the name hash, so a
//! name resolves in a fixed number of page reads however big the
//! directory. Buckets split as they fill; the table doubles (moving into
//! table pages once it outgrows the directory page) up to its bound, after
//! which a full bucket chains an overflow bucket. Because the table is
//! indexed by the top bits, the buckets in table order are in hash order,
//! and readdir walks them with the hash as its cookie.

use flintfs_flash::FlashDevice;
use flintfs_format::{
    array_capacity, bucket_area_bytes, directory_area_bytes, DirectoryContent, Entry, Node, Target, GLOBAL_DEPTH_MAX,
    SLOT_NONE,
};

use super::nodes::{MapEntry, NodeKey};
use super::Fs;
use crate::error::{errno, Error, Result};

/// The table index of `hash` in a table of depth `depth`.
fn table_index(hash: u64, depth: u8) -> usize {
    if depth == 0 {
        0
    } else {
        (hash >> (63 - u32::from(depth))) as usize
    }
}

/// The next bucket of a chain whose buckets so far are `visited`: damage
/// that loops the chain (or runs it past every slot) is an error at once,
/// before a walk could copy the same entries again and again.
fn chain_step(visited: &[u32], next: u32, slot_count: u32) -> Result<u32> {
    if visited.contains(&next) || visited.len() as u32 > slot_count {
        return Err(Error::corrupt(format!("a bucket chain loops at slot {next}")));
    }
    Ok(next)
}

/// The bit that decides which half of a split bucket of depth `depth` an
/// entry goes to.
fn split_bit(hash: u64, depth: u8) -> bool {
    (hash >> (62 - u32::from(depth))) & 1 == 1
}

impl<D: FlashDevice> Fs<D> {
    /// The node key of directory `ino`.
    pub(crate) fn directory_key(&self, ino: u64) -> Result<NodeKey> {
        if ino == 0 || ino > u64::from(self.slot_count) {
            return Err(Error::new(errno::ENOENT, format!("directory {ino} does not exist")));
        }
        Ok(NodeKey::Slot((ino - 1) as u32))
    }

    /// The directory node of `ino`, checked to be that directory: ENOTDIR
    /// for a file, ENOENT for nothing.
    pub(crate) fn directory(&mut self, ino: u64) -> Result<Node> {
        let key = self.directory_checked(ino)?;
        self.node(key)
    }

    /// Checks that `ino` is a directory (ENOTDIR for a file, ENOENT for
    /// nothing) without copying its page, and returns its key.
    pub(crate) fn directory_checked(&mut self, ino: u64) -> Result<NodeKey> {
        let key = self.directory_key(ino)?;
        if !self.in_memory(key) {
            match MapEntry::decode(self.map_get(ino as u32 - 1)?) {
                MapEntry::Home(_) => {}
                MapEntry::Locator { .. } => {
                    return Err(Error::new(errno::ENOTDIR, format!("inode {ino} is not a directory")))
                }
                MapEntry::Free { .. } | MapEntry::Unwritten => {
                    return Err(Error::new(errno::ENOENT, format!("directory {ino} does not exist")))
                }
            }
        }
        self.with_node(key, |node| match node {
            Node::Directory { inode, .. } if inode.ino == ino => Ok(key),
            Node::File { inode, .. } if inode.ino == ino => {
                Err(Error::new(errno::ENOTDIR, format!("inode {ino} is not a directory")))
            }
            _ => Err(Error::new(errno::ENOENT, format!("directory {ino} does not exist"))),
        })?
    }

    /// Where the entry for file `ino` in `directory` points, found by the
    /// top bits of its name's hash (a locator's prefix).
    pub(crate) fn directory_find_ino(&mut self, directory: u64, hash_prefix: u64, ino: u64) -> Result<Option<Target>> {
        let key = self.directory_checked(directory)?;
        let inline = self.with_node(key, |node| match node {
            Node::Directory { content: DirectoryContent::Inline(entries), .. } => {
                Some(entries.iter().find(|entry| entry.ino == ino).map(|entry| entry.target))
            }
            _ => None,
        })?;
        if let Some(found) = inline {
            return Ok(found);
        }
        for slot in self.chain(key, hash_prefix)? {
            let found = self.with_node(NodeKey::Slot(slot), |node| match node {
                Node::Bucket { entries, .. } => entries.iter().find(|entry| entry.ino == ino).map(|entry| entry.target),
                _ => None,
            })?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    fn direct_table_capacity(&self) -> usize {
        directory_area_bytes(self.page_size) / 4
    }

    fn table_page_capacity(&self) -> usize {
        array_capacity(self.page_size, 4)
    }

    /// Whether a table of `depth` fits the directory page, directly or as
    /// table pages.
    fn table_fits(&self, depth: u8) -> bool {
        let slots = 1usize << depth;
        depth <= GLOBAL_DEPTH_MAX
            && (slots <= self.direct_table_capacity()
                || slots.div_ceil(self.table_page_capacity()) <= self.direct_table_capacity())
    }

    /// The bucket slot at `index` of a hashed directory.
    fn table_get(&mut self, directory: NodeKey, index: usize) -> Result<u32> {
        let direct = self.direct_table_capacity();
        let capacity = self.table_page_capacity();
        // The slot itself, or the table page that holds it.
        let found = self.with_node(directory, |node| match node {
            Node::Directory { content: DirectoryContent::Hashed { global_depth, slots }, .. } => {
                if (1usize << global_depth) <= direct {
                    Ok(Ok(slots.get(index).copied()))
                } else {
                    slots
                        .get(index / capacity)
                        .map(|&page| Err(page))
                        .ok_or_else(|| Error::corrupt("table index past the table"))
                }
            }
            _ => Err(Error::corrupt(format!("{directory:?} is not a hashed directory"))),
        })??;
        let slot = match found {
            Ok(slot) => slot,
            Err(page) => self.with_node(NodeKey::Slot(page), |node| match node {
                Node::Table { slots, .. } => slots.get(index % capacity).copied(),
                _ => None,
            })?,
        };
        slot.filter(|&slot| slot != SLOT_NONE && slot < self.slot_count)
            .ok_or_else(|| Error::corrupt(format!("{directory:?}: table entry {index} is missing or out of range")))
    }

    /// Points table entries `range` at `bucket`.
    fn table_set(&mut self, directory: NodeKey, range: std::ops::Range<usize>, bucket: u32) -> Result<()> {
        let Node::Directory { content: DirectoryContent::Hashed { global_depth, slots }, .. } = self.node(directory)?
        else {
            return Err(Error::corrupt(format!("{directory:?} is not a hashed directory")));
        };
        if (1usize << global_depth) <= self.direct_table_capacity() {
            return self.modify(directory, |node| {
                let Node::Directory { content: DirectoryContent::Hashed { slots, .. }, .. } = node else {
                    unreachable!()
                };
                slots[range].iter_mut().for_each(|slot| *slot = bucket);
            });
        }
        let capacity = self.table_page_capacity();
        let mut index = range.start;
        while index < range.end {
            let page = *slots.get(index / capacity).ok_or_else(|| Error::corrupt("table index past the table"))?;
            let end = range.end.min((index / capacity + 1) * capacity);
            match self.node(NodeKey::Slot(page))? {
                Node::Table { slots, .. } if slots.len() > (end - 1) % capacity => {}
                _ => return Err(Error::corrupt(format!("{directory:?}: slot {page} is not a whole table page"))),
            }
            self.modify(NodeKey::Slot(page), |node| {
                let Node::Table { slots, .. } = node else { unreachable!("table slots hold tables") };
                slots[index % capacity..(end - 1) % capacity + 1].iter_mut().for_each(|slot| *slot = bucket);
            })?;
            index = end;
        }
        Ok(())
    }

    /// Doubles a directory's table.
    fn table_double(&mut self, directory: NodeKey, directory_ino: u64) -> Result<()> {
        let Node::Directory { content: DirectoryContent::Hashed { global_depth, slots }, .. } = self.node(directory)?
        else {
            unreachable!("only hashed directories double")
        };
        let old_size = 1usize << global_depth;
        let mut old = Vec::with_capacity(old_size);
        for index in 0..old_size {
            old.push(self.table_get(directory, index)?);
        }
        let new: Vec<u32> = (0..old_size * 2).map(|index| old[index >> 1]).collect();
        let depth = global_depth + 1;
        let direct = self.direct_table_capacity();
        let new_slots = if new.len() <= direct {
            new
        } else {
            let capacity = self.table_page_capacity();
            let mut pages = if old_size <= direct { Vec::new() } else { slots };
            while pages.len() < new.len().div_ceil(capacity) {
                let slot = self.allocate_slot()?;
                self.insert_new(NodeKey::Slot(slot), Node::Table { directory: directory_ino, slot, slots: Vec::new() });
                pages.push(slot);
            }
            for (number, &page) in pages.iter().enumerate() {
                let run = new[number * capacity..new.len().min((number + 1) * capacity)].to_vec();
                self.modify(NodeKey::Slot(page), |node| {
                    let Node::Table { slots, .. } = node else { unreachable!("table slots hold tables") };
                    *slots = run;
                })?;
            }
            pages
        };
        self.modify(directory, |node| {
            let Node::Directory { content, .. } = node else { unreachable!() };
            *content = DirectoryContent::Hashed { global_depth: depth, slots: new_slots };
        })
    }

    /// The bucket slots of the chain that holds `hash`.
    fn chain(&mut self, directory: NodeKey, hash: u64) -> Result<Vec<u32>> {
        let global_depth = self.with_node(directory, |node| match node {
            Node::Directory { content: DirectoryContent::Hashed { global_depth, .. }, .. } => *global_depth,
            _ => unreachable!("only hashed directories have chains"),
        })?;
        let head = self.table_get(directory, table_index(hash, global_depth))?;
        self.chain_from(head)
    }

    /// The entry named `name` in directory `ino`. Reads the pages in
    /// place and copies only the entry found.
    pub(crate) fn directory_lookup(&mut self, ino: u64, name: &[u8]) -> Result<Option<Entry>> {
        self.directory_read_entry(ino, name, Entry::clone)
    }

    /// What `read` takes from the entry `name` in directory `ino`, read in
    /// place: a lookup that needs only the inode number copies no entry
    /// (and its name) to find it.
    pub(crate) fn directory_read_entry<R>(
        &mut self,
        ino: u64,
        name: &[u8],
        read: impl Fn(&Entry) -> R,
    ) -> Result<Option<R>> {
        let hash = flintfs_format::name_hash(self.hash_seed, name);
        let key = self.directory_checked(ino)?;
        // Inline: the entry or nothing; hashed: the table's depth.
        let inline_or_depth = self.with_node(key, |node| match node {
            Node::Directory { content: DirectoryContent::Inline(entries), .. } => {
                Ok(entries.iter().find(|entry| entry.name == name).map(&read))
            }
            Node::Directory { content: DirectoryContent::Hashed { global_depth, .. }, .. } => Err(*global_depth),
            _ => unreachable!("checked to be a directory"),
        })?;
        let global_depth = match inline_or_depth {
            Ok(found) => return Ok(found),
            Err(depth) => depth,
        };
        let mut slot = self.table_get(key, table_index(hash, global_depth))?;
        let mut visited = Vec::new();
        loop {
            let (found, next) = self.with_node(NodeKey::Slot(slot), |node| match node {
                Node::Bucket { entries, next, .. } => {
                    Ok((entries.iter().find(|entry| entry.hash == hash && entry.name == name).map(&read), *next))
                }
                _ => Err(Error::corrupt(format!("slot {slot} is chained but is not a bucket"))),
            })??;
            if found.is_some() || next == SLOT_NONE {
                return Ok(found);
            }
            visited.push(slot);
            slot = chain_step(&visited, next, self.slot_count)?;
        }
    }

    /// Adds an entry; the caller has checked the name is not there.
    pub(crate) fn directory_insert(&mut self, ino: u64, entry: Entry) -> Result<()> {
        let key = self.directory_checked(ino)?;
        let page_size = self.page_size;
        // The bytes an inline directory's entries use; `None` once hashed.
        let inline_used = self.with_node(key, |node| match node {
            Node::Directory { content: DirectoryContent::Inline(entries), .. } => {
                Some(entries.iter().map(Entry::encoded_bytes).sum::<usize>())
            }
            _ => None,
        })?;
        if let Some(used) = inline_used {
            // Measured against the area that leaves room for the most xattrs
            // an inode may have, so a later setxattr always fits.
            if used + entry.encoded_bytes() <= directory_area_bytes(page_size) {
                return self.modify(key, |node| {
                    let Node::Directory { content: DirectoryContent::Inline(entries), entry_count, .. } = node else {
                        unreachable!()
                    };
                    let at = entries.partition_point(|other| other.hash <= entry.hash);
                    entries.insert(at, entry);
                    *entry_count += 1;
                });
            }
            // Full: the entries move to a first bucket, and the page holds a
            // table of one slot.
            let bucket = self.allocate_slot()?;
            let entries = self.modify(key, |node| {
                let Node::Directory { content, .. } = node else { unreachable!() };
                match std::mem::replace(content, DirectoryContent::Hashed { global_depth: 0, slots: vec![bucket] }) {
                    DirectoryContent::Inline(entries) => entries,
                    DirectoryContent::Hashed { .. } => unreachable!("inline a moment ago"),
                }
            })?;
            self.insert_new(
                NodeKey::Slot(bucket),
                Node::Bucket { directory: ino, slot: bucket, local_depth: 0, next: SLOT_NONE, entries },
            );
        }
        let bucket_room = bucket_area_bytes(page_size);
        loop {
            let chain = self.chain(key, entry.hash)?;
            for &slot in &chain {
                let used = self.with_node(NodeKey::Slot(slot), |node| match node {
                    Node::Bucket { entries, .. } => entries.iter().map(Entry::encoded_bytes).sum::<usize>(),
                    _ => unreachable!("chains hold buckets"),
                })?;
                if used + entry.encoded_bytes() <= bucket_room {
                    self.modify(NodeKey::Slot(slot), |node| {
                        let Node::Bucket { entries, .. } = node else { unreachable!() };
                        let at = entries.partition_point(|other| other.hash <= entry.hash);
                        entries.insert(at, entry.clone());
                    })?;
                    return self.modify(key, |node| {
                        let Node::Directory { entry_count, .. } = node else { unreachable!() };
                        *entry_count += 1;
                    });
                }
            }
            let Node::Directory { content: DirectoryContent::Hashed { global_depth, .. }, .. } = self.node(key)? else {
                unreachable!()
            };
            let head = chain[0];
            let Node::Bucket { local_depth, entries, .. } = self.node(NodeKey::Slot(head))? else { unreachable!() };
            if local_depth < global_depth {
                // Split: the upper half of the bucket's run of table entries
                // goes to a new bucket, with the entries whose next bit is 1.
                let sibling = self.allocate_slot()?;
                let (high, low): (Vec<Entry>, Vec<Entry>) =
                    entries.into_iter().partition(|entry| split_bit(entry.hash, local_depth));
                self.insert_new(
                    NodeKey::Slot(sibling),
                    Node::Bucket {
                        directory: ino,
                        slot: sibling,
                        local_depth: local_depth + 1,
                        next: SLOT_NONE,
                        entries: high,
                    },
                );
                self.modify(NodeKey::Slot(head), |node| {
                    let Node::Bucket { entries, local_depth, .. } = node else { unreachable!() };
                    *entries = low;
                    *local_depth += 1;
                })?;
                let run = 1usize << (global_depth - local_depth);
                let start = (table_index(entry.hash, global_depth) / run) * run;
                self.table_set(key, start + run / 2..start + run, sibling)?;
            } else if self.table_fits(global_depth + 1) {
                self.table_double(key, ino)?;
            } else {
                // The table is at its bound: chain an overflow bucket.
                let overflow = self.allocate_slot()?;
                let last = *chain.last().expect("not empty");
                self.insert_new(
                    NodeKey::Slot(overflow),
                    Node::Bucket { directory: ino, slot: overflow, local_depth, next: SLOT_NONE, entries: Vec::new() },
                );
                self.modify(NodeKey::Slot(last), |node| {
                    let Node::Bucket { next, .. } = node else { unreachable!() };
                    *next = overflow;
                })?;
            }
        }
    }

    /// Removes the entry named `name` and returns it.
    pub(crate) fn directory_remove(&mut self, ino: u64, name: &[u8]) -> Result<Entry> {
        let key = self.directory_checked(ino)?;
        let hash = flintfs_format::name_hash(self.hash_seed, name);
        let not_found = || Error::new(errno::ENOENT, format!("no entry {:?} in directory {ino}", name_text(name)));
        // Inline: where the entry is, if it is; hashed: `Err`.
        let inline = self.with_node(key, |node| match node {
            Node::Directory { content: DirectoryContent::Inline(entries), .. } => {
                Ok(entries.iter().position(|entry| entry.name == name))
            }
            _ => Err(()),
        })?;
        let removed = match inline {
            Ok(at) => {
                let at = at.ok_or_else(not_found)?;
                self.modify(key, |node| {
                    let Node::Directory { content: DirectoryContent::Inline(entries), .. } = node else {
                        unreachable!()
                    };
                    entries.remove(at)
                })?
            }
            Err(()) => {
                let chain = self.chain(key, hash)?;
                let mut found = None;
                for (position, &slot) in chain.iter().enumerate() {
                    // Where the entry is in this bucket, the bucket's count
                    // and its successor.
                    let (at, count, next) = self.with_node(NodeKey::Slot(slot), |node| match node {
                        Node::Bucket { entries, next, .. } => {
                            (entries.iter().position(|entry| entry.name == name), entries.len(), *next)
                        }
                        _ => unreachable!("chains hold buckets"),
                    })?;
                    if let Some(at) = at {
                        let removed = self.modify(NodeKey::Slot(slot), |node| {
                            let Node::Bucket { entries, .. } = node else { unreachable!() };
                            entries.remove(at)
                        })?;
                        // An emptied overflow bucket leaves its chain.
                        if position > 0 && count == 1 {
                            self.modify(NodeKey::Slot(chain[position - 1]), |node| {
                                let Node::Bucket { next: previous_next, .. } = node else { unreachable!() };
                                *previous_next = next;
                            })?;
                            self.discard_slot(slot)?;
                        }
                        found = Some(removed);
                        break;
                    }
                }
                found.ok_or_else(not_found)?
            }
        };
        self.modify(key, |node| {
            let Node::Directory { entry_count, .. } = node else { unreachable!() };
            *entry_count = entry_count.saturating_sub(1);
        })?;
        Ok(removed)
    }

    /// Points the entry for `ino` (whose name hashes to `hash`) in
    /// directory `directory` at `target`.
    pub(crate) fn directory_set_target(&mut self, directory: u64, hash: u64, ino: u64, target: Target) -> Result<()> {
        let key = self.directory_checked(directory)?;
        // Inline: whether the entry is there; hashed: `None`.
        let inline = self.with_node(key, |node| match node {
            Node::Directory { content: DirectoryContent::Inline(entries), .. } => {
                Some(entries.iter().any(|entry| entry.ino == ino && entry.hash == hash))
            }
            _ => None,
        })?;
        let slots = match inline {
            Some(found) => {
                if found {
                    return self.modify(key, |node| {
                        let Node::Directory { content: DirectoryContent::Inline(entries), .. } = node else {
                            unreachable!()
                        };
                        for entry in entries.iter_mut().filter(|entry| entry.ino == ino && entry.hash == hash) {
                            entry.target = target;
                        }
                    });
                }
                Vec::new()
            }
            None => self.chain(key, hash)?,
        };
        for slot in slots {
            let found = self.with_node(NodeKey::Slot(slot), |node| match node {
                Node::Bucket { entries, .. } => entries.iter().any(|entry| entry.ino == ino && entry.hash == hash),
                _ => false,
            })?;
            if found {
                return self.modify(NodeKey::Slot(slot), |node| {
                    let Node::Bucket { entries, .. } = node else { unreachable!() };
                    for entry in entries.iter_mut().filter(|entry| entry.ino == ino && entry.hash == hash) {
                        entry.target = target;
                    }
                });
            }
        }
        Err(Error::corrupt(format!("directory {directory} has no entry for inode {ino} with hash {hash:#x}")))
    }

    /// Entries with a hash of at least `from_hash`, in hash order: at least
    /// `count` of them if there are, and never part of a group of equal
    /// hashes.
    pub(crate) fn directory_list(&mut self, ino: u64, from_hash: u64, count: usize) -> Result<Vec<Entry>> {
        let key = self.directory_key(ino)?;
        let Node::Directory { content, .. } = self.directory(ino)? else { unreachable!() };
        match content {
            DirectoryContent::Inline(entries) => {
                Ok(entries.into_iter().filter(|entry| entry.hash >= from_hash).collect())
            }
            DirectoryContent::Hashed { global_depth, .. } => {
                let mut listed = Vec::new();
                let size = 1usize << global_depth;
                let mut index = table_index(from_hash, global_depth);
                while index < size && listed.len() < count {
                    let head = self.table_get(key, index)?;
                    let (local_depth, mut bucket_entries) = self.chain_entries(ino, head, from_hash)?;
                    bucket_entries.sort_by_key(|entry| entry.hash);
                    listed.extend(bucket_entries);
                    index = match local_depth {
                        Some(local_depth) => {
                            let run = 1usize << global_depth.saturating_sub(local_depth);
                            (index / run + 1) * run
                        }
                        // The head bucket is lost, and with it its depth:
                        // its run is the table entries that point at it.
                        None => {
                            let mut next = index + 1;
                            while next < size && self.table_get(key, next)? == head {
                                next += 1;
                            }
                            next
                        }
                    };
                }
                Ok(listed)
            }
        }
    }

    /// The entries of the chain from `head` with a hash of at least
    /// `from_hash`, and the head's local depth. A bucket that the flash
    /// lost (damage past what protection rebuilds) is left out with a log
    /// line, and the chain ends there: a listing shows every entry the
    /// other buckets hold rather than none. Lookups of names that hash to
    /// the lost bucket still answer EIO.
    fn chain_entries(&mut self, directory: u64, head: u32, from_hash: u64) -> Result<(Option<u8>, Vec<Entry>)> {
        let mut entries = Vec::new();
        let mut head_depth = None;
        let mut slot = head;
        let mut visited = Vec::new();
        loop {
            // The bucket's depth and successor, and a copy of the entries
            // the listing wants (not of the page).
            let read = self.with_node(NodeKey::Slot(slot), |node| match node {
                Node::Bucket { local_depth, next, entries: bucket, .. } => Some((
                    *local_depth,
                    *next,
                    bucket.iter().filter(|entry| entry.hash >= from_hash).cloned().collect::<Vec<_>>(),
                )),
                _ => None,
            });
            let (local_depth, next, bucket) = match read {
                Ok(Some(read)) => read,
                Ok(None) => return Err(Error::corrupt(format!("slot {slot} is chained but is not a bucket"))),
                Err(error) if error.is_damage() => {
                    tracing::error!(
                        directory,
                        bucket_slot = slot,
                        "a bucket of the directory is unreadable; the listing leaves out its entries: {error}"
                    );
                    return Ok((head_depth, entries));
                }
                Err(error) => return Err(error),
            };
            head_depth.get_or_insert(local_depth);
            entries.extend(bucket);
            if next == SLOT_NONE {
                return Ok((head_depth, entries));
            }
            visited.push(slot);
            slot = chain_step(&visited, next, self.slot_count)?;
        }
    }

    /// A chain from its head bucket.
    fn chain_from(&mut self, head: u32) -> Result<Vec<u32>> {
        let mut chain = vec![head];
        loop {
            let last = *chain.last().expect("not empty");
            let next = self.with_node(NodeKey::Slot(last), |node| match node {
                Node::Bucket { next, .. } => Ok(*next),
                _ => Err(Error::corrupt(format!("slot {last} is chained but is not a bucket"))),
            })??;
            if next == SLOT_NONE {
                return Ok(chain);
            }
            let next = chain_step(&chain, next, self.slot_count)?;
            chain.push(next);
        }
    }

    /// Frees an empty directory's buckets and table pages.
    pub(crate) fn directory_release_buckets(&mut self, ino: u64) -> Result<()> {
        let key = self.directory_key(ino)?;
        let Node::Directory { content: DirectoryContent::Hashed { global_depth, slots }, .. } = self.directory(ino)?
        else {
            return Ok(());
        };
        let size = 1usize << global_depth;
        let mut buckets = Vec::new();
        let mut index = 0;
        while index < size {
            let head = self.table_get(key, index)?;
            let Node::Bucket { local_depth, .. } = self.node(NodeKey::Slot(head))? else {
                return Err(Error::corrupt(format!("directory {ino}: table slot {head} is not a bucket")));
            };
            buckets.extend(self.chain_from(head)?);
            index += 1usize << global_depth.saturating_sub(local_depth);
        }
        for bucket in buckets {
            self.discard_slot(bucket)?;
        }
        if size > self.direct_table_capacity() {
            for page in slots {
                self.discard_slot(page)?;
            }
        }
        self.modify(key, |node| {
            let Node::Directory { content, .. } = node else { unreachable!() };
            *content = DirectoryContent::Inline(Vec::new());
        })
    }
}

/// A name for messages.
pub(crate) fn name_text(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}
