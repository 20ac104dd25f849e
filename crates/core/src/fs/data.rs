//! The data path. A file's data is small enough to live in its inode, or
//! it is a radix tree of block pointers: [`INDEX_ROOTS`] roots in the
//! inode, index pages below them. Writes are buffered a block at a time,
//! up to a byte bound, and written out in the data log: a whole block as a
//! data block page (its inverted index in the page header), a small tail
//! as a chunk packed with other files' tails (its inverted index in the
//! chunk header). Nothing else of the file is rewritten, so a write costs
//! the same wherever it lands. Every read checks the inverted index
//! against what it expected to find.

use flintfs_flash::{FlashDevice, PageAddress};
use flintfs_format::{
    inline_bytes_max, parse_packed, ChunkHeader, ChunkKind, Compression, CompressionChoice, FileContent, InvertedIndex,
    Node, PackedPage, PageKind, Pointer, ZoneRole, CHUNK_HEADER_BYTES, CHUNK_UNIT_BYTES, INDEX_ROOTS,
};

use super::nodes::NodeKey;
use super::Fs;
use crate::allocator::PageMeta;
use crate::error::{errno, Error, Result};

impl<D: FlashDevice> Fs<D> {
    pub(crate) fn block_bytes(&self) -> u64 {
        self.page_size as u64
    }

    /// The largest file: [`flintfs_format::FILE_BLOCKS_MAX`] blocks. A
    /// sparse file may be larger than the device, as on ext4; its writes
    /// meet ENOSPC when the device fills, not EFBIG.
    pub(crate) fn file_bytes_max(&self) -> u64 {
        flintfs_format::FILE_BLOCKS_MAX * self.block_bytes()
    }

    /// Blocks an index of `height` covers.
    pub(crate) fn index_capacity_blocks(&self, height: u8) -> u64 {
        self.span(height).saturating_mul(INDEX_ROOTS as u64)
    }

    /// `fanout^level`, the blocks one pointer of an index page at `level`
    /// covers.
    fn span(&self, level: u8) -> u64 {
        let fanout = self.index_fanout();
        (0..level).fold(1u64, |blocks, _| blocks.saturating_mul(fanout))
    }

    /// Where block `block` of a file is; null for a hole.
    pub(crate) fn block_pointer(&mut self, ino: u64, block: u64) -> Result<Pointer> {
        let file_key = self.file_key(ino)?;
        // Read in place: a copy of the inode per block read was a hot spot.
        let fanout = self.index_fanout();
        let span = |level: u8| (0..level).fold(1u64, |blocks, _| blocks.saturating_mul(fanout));
        let capacity = |height: u8| span(height).saturating_mul(INDEX_ROOTS as u64);
        let (height, root) = match self.with_node(file_key, |node| match node {
            Node::File { content: FileContent::Index { height, roots, .. }, .. } => {
                if block >= capacity(*height) {
                    None
                } else {
                    Some((*height, roots[(block / span(*height)) as usize]))
                }
            }
            _ => None,
        })? {
            Some(found) => found,
            None => return Ok(Pointer::NULL),
        };
        if height == 0 {
            return Ok(root);
        }
        let mut pointer = root;
        for level in (0..height).rev() {
            let key = NodeKey::Index { level, ino, number: block / span(level + 1) };
            if !self.in_memory(key) && pointer.is_null() {
                return Ok(Pointer::NULL);
            }
            let child = ((block / span(level)) % fanout) as usize;
            pointer = self.with_node(key, |node| match node {
                Node::Index { pointers, .. } => pointers[child],
                _ => unreachable!("index keys hold index nodes"),
            })?;
        }
        Ok(pointer)
    }

    /// Points block `block` of a file at `pointer`; returns what it pointed
    /// at before. Grows the tree as needed, and keeps the file's count of
    /// stored blocks.
    pub(crate) fn set_block_pointer(&mut self, ino: u64, block: u64, pointer: Pointer) -> Result<Pointer> {
        let old = self.point_block(ino, block, pointer)?;
        if old.is_null() != pointer.is_null() {
            self.dirty_blocks.forget_holes(ino);
        }
        if old != pointer {
            let added = Stored::of(pointer, self.page_size);
            let freed = Stored::of(old, self.page_size);
            self.count_stored(ino, added, freed)?;
        }
        Ok(old)
    }

    /// Adds what `added` names to a file's count of stored blocks and
    /// units, and takes away what `freed` names.
    fn count_stored(&mut self, ino: u64, added: Stored, freed: Stored) -> Result<()> {
        let file_key = self.file_key(ino)?;
        self.modify(file_key, |node| {
            let Node::File { content: FileContent::Index { blocks_stored, units_stored, .. }, .. } = node else {
                unreachable!("only files with an index store blocks")
            };
            *blocks_stored = stored_less(stored_plus(*blocks_stored, added.blocks), freed.blocks);
            *units_stored = units_stored.saturating_add(added.units).saturating_sub(freed.units);
        })
    }

    /// The 512-byte sectors a file uses: the units its index names on
    /// flash (a compressed block takes its chunk's size), and the blocks
    /// buffered in memory that it does not point at yet.
    pub(crate) fn sectors_used(&mut self, ino: u64, units_stored: u64) -> Result<u64> {
        let sector_bytes = 512;
        let unstored = match self.dirty_blocks.holes(ino) {
            Some(holes) => {
                if cfg!(debug_assertions) {
                    let buffered: Vec<u64> = self.dirty_blocks.blocks_of(ino).collect();
                    let counted = self.holes_among(ino, &buffered)?;
                    assert_eq!(holes, counted, "inode {ino}'s memo of buffered blocks not stored");
                }
                holes
            }
            None => {
                let buffered: Vec<u64> = self.dirty_blocks.blocks_of(ino).collect();
                let holes = self.holes_among(ino, &buffered)?;
                self.dirty_blocks.remember_holes(ino, holes);
                holes
            }
        };
        let bytes = units_stored
            .saturating_mul(u64::from(CHUNK_UNIT_BYTES))
            .saturating_add(unstored.saturating_mul(self.block_bytes()));
        Ok(bytes.div_ceil(sector_bytes))
    }

    /// How many of `blocks` (ascending) the file's index does not point at.
    /// Blocks under one index leaf are read from it together: a file with
    /// many buffered blocks (a log being appended) made every stat walk
    /// the index once per block, a quarter of webserver's host time.
    fn holes_among(&mut self, ino: u64, blocks: &[u64]) -> Result<u64> {
        if blocks.is_empty() {
            return Ok(0);
        }
        let fanout = self.index_fanout();
        let file_key = self.file_key(ino)?;
        let height = self.with_node(file_key, |node| match node {
            Node::File { content: FileContent::Index { height, .. }, .. } => *height,
            _ => 0,
        })?;
        // Only a tree with leaves, and only blocks it covers, read a leaf.
        let covered = if height == 0 { 0 } else { self.index_capacity_blocks(height) };
        let mut holes = 0u64;
        let mut index = 0;
        while index < blocks.len() {
            let block = blocks[index];
            // The first block of a leaf walks the path (and brings the leaf
            // in); the rest under the same leaf read it in place.
            let leaf = block / fanout;
            let group_end =
                blocks[index..].iter().position(|&other| other / fanout != leaf).map_or(blocks.len(), |at| index + at);
            if self.block_pointer(ino, block)?.is_null() {
                holes += 1;
            }
            let rest = &blocks[index + 1..group_end];
            let leaf_key = NodeKey::Index { level: 0, ino, number: leaf };
            if rest.is_empty() {
                // Nothing more under this leaf.
            } else if rest.iter().all(|&other| other < covered) {
                // The walk brought the leaf in if it exists; if it does not,
                // nothing under it is stored.
                holes += if self.in_memory(leaf_key) {
                    self.with_node(leaf_key, |node| match node {
                        Node::Index { pointers, .. } => {
                            rest.iter().filter(|&&other| pointers[(other % fanout) as usize].is_null()).count() as u64
                        }
                        _ => unreachable!("index keys hold index nodes"),
                    })?
                } else {
                    rest.len() as u64
                };
            } else {
                for &other in rest {
                    if self.block_pointer(ino, other)?.is_null() {
                        holes += 1;
                    }
                }
            }
            index = group_end;
        }
        Ok(holes)
    }

    /// The first block in `from..end` that the file's index points at
    /// (`present`), or does not; buffered blocks are the caller's.
    /// Subtrees with no index page are skipped whole, so a search across a
    /// hole of any size reads at most one path of index pages.
    pub(crate) fn index_find(&mut self, ino: u64, from: u64, end: u64, present: bool) -> Result<Option<u64>> {
        let file_key = self.file_key(ino)?;
        let Node::File { content: FileContent::Index { height, roots, .. }, .. } = self.node(file_key)? else {
            return Ok(None);
        };
        let span = self.span(height);
        let mut root = from / span;
        while root < INDEX_ROOTS as u64 && root.saturating_mul(span) < end {
            let start = root * span;
            let found = if height == 0 {
                (roots[root as usize].is_null() != present).then_some(start)
            } else {
                self.subtree_find(ino, height - 1, root, roots[root as usize], from.max(start), end, present)?
            };
            if let Some(block) = found.filter(|&block| block < end) {
                return Ok(Some(block));
            }
            root += 1;
        }
        // Past what the index covers, the file is a hole.
        let covered = self.index_capacity_blocks(height);
        Ok((!present && covered.max(from) < end).then_some(covered.max(from)))
    }

    /// [`Fs::index_find`] below index page `(level, number)`, which its
    /// parent points at with `pointer`.
    #[allow(clippy::too_many_arguments)]
    fn subtree_find(
        &mut self,
        ino: u64,
        level: u8,
        number: u64,
        pointer: Pointer,
        from: u64,
        end: u64,
        present: bool,
    ) -> Result<Option<u64>> {
        let key = NodeKey::Index { level, ino, number };
        let start = number.saturating_mul(self.span(level + 1));
        if pointer.is_null() && !self.in_memory(key) {
            return Ok((!present).then_some(from.max(start)));
        }
        let Node::Index { pointers, .. } = self.node(key)? else { unreachable!("index keys hold index nodes") };
        let (fanout, span) = (self.index_fanout(), self.span(level));
        for child in (from.max(start) - start) / span..fanout {
            let child_start = start + child * span;
            if child_start >= end {
                break;
            }
            let found = if level == 0 {
                (pointers[child as usize].is_null() != present).then_some(child_start)
            } else {
                let child_number = number * fanout + child;
                self.subtree_find(
                    ino,
                    level - 1,
                    child_number,
                    pointers[child as usize],
                    from.max(child_start),
                    end,
                    present,
                )?
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    fn point_block(&mut self, ino: u64, block: u64, pointer: Pointer) -> Result<Pointer> {
        let file_key = self.file_key(ino)?;
        // Read in place, as `block_pointer` does: a copy of the node at
        // every block written was an allocation per write.
        let Some((born, mut height, mut roots)) = self.with_node(file_key, |node| match node {
            Node::File { inode, content: FileContent::Index { height, roots, .. }, .. } => {
                Some((inode.born, *height, *roots))
            }
            _ => None,
        })?
        else {
            return Err(Error::corrupt(format!("inode {ino} holds its data inline")));
        };
        let fanout = self.index_fanout();
        while block >= self.index_capacity_blocks(height) {
            if height >= flintfs_format::INDEX_HEIGHT_MAX {
                return Err(Error::new(errno::EFBIG, format!("block {block} is past the largest index")));
            }
            // One level up: a new index page holds the old roots.
            let mut pointers = vec![Pointer::NULL; fanout as usize];
            pointers[..INDEX_ROOTS].copy_from_slice(&roots);
            self.insert_new(
                NodeKey::Index { level: height, ino, number: 0 },
                Node::Index { ino, version: born, level: height, number: 0, pointers },
            );
            height += 1;
            roots = [Pointer::NULL; INDEX_ROOTS];
            self.modify(file_key, |node| {
                let Node::File { content: FileContent::Index { height: now, roots: kept, .. }, .. } = node else {
                    unreachable!()
                };
                (*now, *kept) = (height, roots);
            })?;
        }
        if height == 0 {
            return self.modify(file_key, |node| {
                let Node::File { content: FileContent::Index { roots, .. }, .. } = node else { unreachable!() };
                std::mem::replace(&mut roots[block as usize], pointer)
            });
        }
        let mut parent_pointer = roots[(block / self.span(height)) as usize];
        for level in (0..height).rev() {
            let number = block / self.span(level + 1);
            let key = NodeKey::Index { level, ino, number };
            if !self.in_memory(key) && parent_pointer.is_null() {
                self.insert_new(
                    key,
                    Node::Index { ino, version: born, level, number, pointers: vec![Pointer::NULL; fanout as usize] },
                );
            }
            let child = ((block / self.span(level)) % fanout) as usize;
            if level == 0 {
                return self.modify(key, |node| {
                    let Node::Index { pointers, .. } = node else { unreachable!() };
                    std::mem::replace(&mut pointers[child], pointer)
                });
            }
            parent_pointer = self.with_node(key, |node| match node {
                Node::Index { pointers, .. } => pointers[child],
                _ => unreachable!("index keys hold index nodes"),
            })?;
        }
        unreachable!("the loop returns at level 0")
    }

    /// Frees every block from `first` on, and the index pages that no
    /// longer hold any.
    pub(crate) fn free_blocks_from(&mut self, ino: u64, first: u64) -> Result<()> {
        self.free_blocks_in(ino, first, u64::MAX)
    }

    /// Frees the blocks `first..end`, and the index pages that lie wholly
    /// inside it (one that holds blocks on either side stays, with null
    /// pointers where the freed ones were). The walk visits only index
    /// pages that cover part of the range and exist.
    pub(crate) fn free_blocks_in(&mut self, ino: u64, first: u64, end: u64) -> Result<()> {
        let file_key = self.file_key(ino)?;
        let Node::File { content: FileContent::Index { height, roots, .. }, .. } = self.node(file_key)? else {
            return Ok(());
        };
        if first >= end {
            return Ok(());
        }
        let keys: Vec<(u64, u64)> = self.dirty_blocks.range((ino, first)..(ino, end)).map(|(key, _)| *key).collect();
        for key in keys {
            self.dirty_blocks.discard(&key);
        }
        self.dirty_blocks.forget_holes(ino);
        let mut cleared = [false; INDEX_ROOTS];
        let mut freed = Stored::default();
        if height == 0 {
            for block in first.min(INDEX_ROOTS as u64)..end.min(INDEX_ROOTS as u64) {
                freed = freed.plus(Stored::of(roots[block as usize], self.page_size));
                self.release(roots[block as usize]);
                cleared[block as usize] = true;
            }
        } else {
            let span = self.span(height);
            for root in 0..INDEX_ROOTS as u64 {
                let start = root * span;
                if start.saturating_add(span) <= first || start >= end {
                    continue;
                }
                let key = NodeKey::Index { level: height - 1, ino, number: root };
                if !self.in_memory(key) && roots[root as usize].is_null() {
                    continue;
                }
                freed = freed.plus(self.free_index_in(ino, height - 1, root, first, end)?);
                if start >= first && start.saturating_add(span) <= end {
                    self.discard(key, roots[root as usize]);
                    cleared[root as usize] = true;
                }
            }
        }
        self.modify(file_key, |node| {
            let Node::File { content: FileContent::Index { roots: kept, blocks_stored, units_stored, .. }, .. } = node
            else {
                unreachable!()
            };
            // Roots changed by write-backs during the walk are current in
            // the node; only the freed ones are cleared.
            for (index, &freed_root) in cleared.iter().enumerate() {
                if freed_root {
                    kept[index] = Pointer::NULL;
                }
            }
            *blocks_stored = stored_less(*blocks_stored, freed.blocks);
            *units_stored = units_stored.saturating_sub(freed.units);
        })
    }

    /// Frees the blocks `first..end` below one index page; returns what it
    /// freed.
    fn free_index_in(&mut self, ino: u64, level: u8, number: u64, first: u64, end: u64) -> Result<Stored> {
        let key = NodeKey::Index { level, ino, number };
        let Node::Index { pointers, .. } = self.node(key)? else { unreachable!() };
        let fanout = self.index_fanout();
        let span = self.span(level);
        let mut cleared = Vec::new();
        let mut freed = Stored::default();
        for (child, &pointer) in pointers.iter().enumerate() {
            let start = (number * fanout + child as u64) * span;
            if start.saturating_add(span) <= first || start >= end {
                continue;
            }
            if level == 0 {
                freed = freed.plus(Stored::of(pointer, self.page_size));
                self.release(pointer);
                cleared.push(child);
                continue;
            }
            let child_key = NodeKey::Index { level: level - 1, ino, number: number * fanout + child as u64 };
            if !self.in_memory(child_key) && pointer.is_null() {
                continue;
            }
            freed = freed.plus(self.free_index_in(ino, level - 1, number * fanout + child as u64, first, end)?);
            if start >= first && start.saturating_add(span) <= end {
                // The child's own write-backs may have moved it: discard
                // where it is now.
                let Node::Index { pointers: now, .. } = self.node(key)? else { unreachable!() };
                self.discard(child_key, now[child]);
                cleared.push(child);
            }
        }
        if !cleared.is_empty() {
            self.modify(key, |node| {
                let Node::Index { pointers, .. } = node else { unreachable!() };
                for child in cleared {
                    pointers[child] = Pointer::NULL;
                }
            })?;
        }
        Ok(freed)
    }

    /// Reads block `block` of file `ino` from `pointer`, checking its
    /// inverted index; returns the whole block (zeros past what is stored).
    pub(crate) fn read_block(&mut self, ino: u64, born: u64, block: u64, pointer: Pointer) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.page_size);
        self.read_block_onto(ino, born, block, pointer, &mut out)?;
        Ok(out)
    }

    /// [`Fs::read_block`] appended to `out`: a block's length more. On an
    /// error `out` may have grown by part of it.
    fn read_block_onto(&mut self, ino: u64, born: u64, block: u64, pointer: Pointer, out: &mut Vec<u8>) -> Result<()> {
        let page_size = self.page_size;
        let wanted = WantedBlock { ino, born, block, pointer, offset: block * self.block_bytes() };
        let whole = pointer.whole_page();
        // A hit is read in place: copying the cached page out first cost
        // webserver a fifth of its time.
        if let Some(cached) = self.read_cache.get(whole) {
            self.counters.read_cache_hits += 1;
            return wanted.cut_from_page(cached, out, page_size);
        }
        if pointer.zone() >= self.volume.device().geometry().zone_count {
            return Err(Error::corrupt(format!("inode {ino} block {block} points past the device: {pointer}")));
        }
        let address = PageAddress::new(pointer.zone(), pointer.page());
        // A full cache lets its least recent page go now, not at the
        // insert below, and that page's buffer takes the read: no page is
        // allocated and zeroed for it (all of the read cache is clean).
        let mut buffer = Vec::new();
        if self.read_cache.used_bytes() + page_size > self.read_cache.capacity_bytes() {
            if let Some((_, oldest)) = self.read_cache.pop_oldest_clean() {
                buffer = oldest.data;
            }
        }
        let (header, data) = self.volume.read_page_into(address, buffer).inspect_err(|error| {
            // The one line an operator needs: where, and whose bytes.
            tracing::error!(
                zone = address.zone,
                page = address.page,
                ino,
                offset = wanted.offset,
                "file data is lost: {}",
                error.message
            );
        })?;
        self.counters.data_pages_read += 1;
        let page = CachedPage::new(header, data);
        let cut = wanted.cut_from_page(&page, out, page_size);
        // Only clean pages go in: nothing comes back to write.
        let bytes = page.bytes(page_size);
        if bytes <= self.read_cache.capacity_bytes() {
            let _ = self.read_cache.insert(whole, page, bytes, crate::cache::Dirty::CLEAN);
        }
        cut
    }

    /// The bytes of a file from `offset`, at most `size`, stopping at its
    /// end. Holes read as zeros.
    pub(crate) fn file_read(&mut self, ino: u64, offset: u64, size: u64) -> Result<Vec<u8>> {
        let file_key = self.file_key(ino)?;
        // The inode is read in place, and an inline file's bytes copied
        // once, straight out of it.
        let (end, born, inline) = self.with_node(file_key, |node| {
            let Node::File { inode, content, .. } = node else { unreachable!("file keys hold files") };
            let end = inode.size.min(offset.saturating_add(size));
            let inline = match content {
                FileContent::Inline(data) if offset < end => Some(data[offset as usize..end as usize].to_vec()),
                _ => None,
            };
            (end, inode.born, inline)
        })?;
        if offset >= end {
            return Ok(Vec::new());
        }
        if let Some(data) = inline {
            return Ok(data);
        }
        let block_bytes = self.block_bytes();
        // The size comes from flash: no allocation is sized from it alone.
        let mut out = Vec::with_capacity(((end - offset) as usize).min(1 << 20));
        let mut position = offset;
        while position < end {
            let block = position / block_bytes;
            let within = (position % block_bytes) as usize;
            let take = ((block_bytes - within as u64).min(end - position)) as usize;
            if let Some(buffered) = self.dirty_blocks.get(&(ino, block)) {
                out.extend_from_slice(&buffered[within..within + take]);
            } else {
                let pointer = self.block_pointer(ino, block)?;
                let start = out.len();
                if pointer.is_null() {
                    out.resize(start + take, 0);
                } else if take == self.page_size {
                    // A whole block lands in place: no buffer of its own,
                    // and no zeros written first where stored bytes go.
                    self.read_block_onto(ino, born, block, pointer, &mut out)?;
                    debug_assert_eq!(out.len(), start + take);
                } else {
                    let data = self.read_block(ino, born, block, pointer)?;
                    out.extend_from_slice(&data[within..within + take]);
                }
            }
            position += take as u64;
        }
        Ok(out)
    }

    /// Writes `data` at `offset` into the file's buffers; the size grows to
    /// cover it. Times are the caller's business.
    pub(crate) fn file_write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let file_key = self.file_key(ino)?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= self.file_bytes_max())
            .ok_or_else(|| Error::new(errno::EFBIG, "a write past the largest file"))?;
        // The inode is read in place: a copy of the node per write showed.
        let (size, born, inline) = self.with_node(file_key, |node| {
            let Node::File { inode, content, .. } = node else { unreachable!("file keys hold files") };
            (inode.size, inode.born, matches!(content, FileContent::Inline(_)))
        })?;
        let block_bytes = self.block_bytes();
        let growth = end.div_ceil(block_bytes).saturating_sub(size.div_ceil(block_bytes).max(offset / block_bytes));
        if inline {
            if end as usize <= inline_bytes_max(self.page_size) {
                self.reserve_space(0, 0)?;
                return self.modify(file_key, |node| {
                    let Node::File { inode, content: FileContent::Inline(inline), .. } = node else { unreachable!() };
                    if inline.len() < end as usize {
                        inline.resize(end as usize, 0);
                    }
                    inline[offset as usize..end as usize].copy_from_slice(data);
                    inode.size = inline.len() as u64;
                });
            }
            let touched = end.div_ceil(block_bytes) - offset / block_bytes;
            self.check_capacity(touched)?;
            self.reserve_space(touched, 2 + touched / self.index_fanout())?;
            self.inline_to_blocks(ino)?;
        } else {
            let new_blocks = end.div_ceil(block_bytes) - offset / block_bytes;
            self.check_capacity(growth)?;
            self.reserve_space(new_blocks, new_blocks / self.index_fanout() + 1)?;
        }
        let mut position = offset;
        while position < end {
            let block = position / block_bytes;
            let within = (position % block_bytes) as usize;
            let take = ((block_bytes - within as u64).min(end - position)) as usize;
            let source = (position - offset) as usize;
            let piece = &data[source..source + take];
            if take == block_bytes as usize {
                // A whole block is its own buffer: no zeros first.
                // Past the end the index points at nothing (a truncate
                // frees what it cut), which keeps the stat memo exact for
                // a file being appended.
                let hole = (block * block_bytes >= size).then_some(true);
                self.dirty_blocks.write_whole((ino, block), piece, hole);
            } else {
                if !self.dirty_blocks.contains_key(&(ino, block)) {
                    let (existing, hole) = if block * block_bytes >= size {
                        (vec![0u8; block_bytes as usize], true)
                    } else {
                        let pointer = self.block_pointer(ino, block)?;
                        if pointer.is_null() {
                            (vec![0u8; block_bytes as usize], true)
                        } else {
                            (self.read_block(ino, born, block, pointer)?, false)
                        }
                    };
                    self.dirty_blocks.insert_new((ino, block), existing, hole);
                }
                let buffer = self.dirty_blocks.get_mut(&(ino, block)).expect("inserted");
                buffer[within..within + take].copy_from_slice(piece);
            }
            position += take as u64;
        }
        self.changed = true;
        self.modify(file_key, |node| {
            let Node::File { inode, .. } = node else { unreachable!() };
            inode.size = inode.size.max(end);
        })?;
        Ok(())
    }

    /// Moves an inline file's bytes to block 0 (inline data is smaller than
    /// a block), leaving an empty index.
    pub(crate) fn inline_to_blocks(&mut self, ino: u64) -> Result<()> {
        let file_key = self.file_key(ino)?;
        let block_bytes = self.block_bytes() as usize;
        let first = self.modify(file_key, |node| {
            let Node::File { content, .. } = node else { unreachable!() };
            let empty = FileContent::Index {
                height: 0,
                incompressible: false,
                blocks_stored: 0,
                units_stored: 0,
                roots: [Pointer::NULL; INDEX_ROOTS],
            };
            match std::mem::replace(content, empty) {
                FileContent::Inline(data) => data,
                index => {
                    *content = index;
                    Vec::new()
                }
            }
        })?;
        if !first.is_empty() {
            let mut block = first;
            block.resize(block_bytes, 0);
            self.dirty_blocks.insert((ino, 0), block);
        }
        Ok(())
    }

    /// Writes buffered blocks out to the data log: all of them, or those of
    /// one file. Whatever fails to reach the device stays buffered; nothing
    /// buffered is dropped on an error.
    pub(crate) fn flush_data(&mut self, only: Option<u64>) -> Result<()> {
        self.flush_data_with(only, None)
    }

    /// [`Fs::flush_data`], and with `embedding`, small blocks (those that
    /// would be chunks) go into it instead, up to its room, and stay
    /// buffered: the fsync that asked carries them in its log record.
    pub(crate) fn flush_data_with(&mut self, only: Option<u64>, mut embedding: Option<&mut Embedding>) -> Result<()> {
        if self.options.read_only {
            // What a read-only recovery replayed stays buffered in memory.
            return Ok(());
        }
        let keys: Vec<(u64, u64)> = match only {
            Some(ino) => self.dirty_blocks.range((ino, 0)..=(ino, u64::MAX)).map(|(key, _)| *key).collect(),
            None => self.dirty_blocks.keys().copied().collect(),
        };
        // The pages being packed, with their chunks' buffers: kept until
        // each page is programmed.
        let mut packing = Packing::default();
        // Whole blocks waiting to be programmed together (a run, sealed
        // on both cores): at most what the data head's zone still takes,
        // so a run never moves the head on early.
        let mut whole: Vec<WholeBlock> = Vec::new();
        let mut ahead = Vec::new().into_iter();
        let mut result = Ok(());
        for (position, &(ino, block)) in keys.iter().enumerate() {
            if position % COMPRESS_AHEAD_BATCH_BLOCKS == 0 {
                let batch = &keys[position..(position + COMPRESS_AHEAD_BATCH_BLOCKS).min(keys.len())];
                ahead = self.compress_ahead(batch).into_iter();
            }
            let compressed = ahead.next().flatten();
            let Some(buffer) = self.dirty_blocks.remove(&(ino, block)) else { continue };
            if let Err((error, buffer)) =
                self.flush_block(ino, block, buffer, &mut packing, &mut whole, embedding.as_deref_mut(), compressed)
            {
                self.dirty_blocks.insert((ino, block), buffer);
                result = Err(error);
                break;
            }
            if whole.len() as u64 >= self.data_run_pages() {
                result = self.program_blocks(&mut whole);
                if result.is_err() {
                    break;
                }
            }
        }
        if result.is_ok() && !whole.is_empty() {
            result = self.program_blocks(&mut whole);
        }
        if result.is_err() {
            for block in whole.drain(..) {
                self.dirty_blocks.insert((block.ino, block.block), block.buffer);
            }
            self.unpack(&mut packing);
            return result;
        }
        while let Some((page, mut chunks)) = packing.pages.pop() {
            if let Err(error) = self.program_packed(page, &mut chunks, ZoneRole::HotData) {
                self.unpack(&mut packing);
                return Err(error);
            }
        }
        Ok(())
    }

    /// Gives the chunks of pages not programmed back to the buffer.
    fn unpack(&mut self, packing: &mut Packing) {
        for (_, chunks) in packing.pages.drain(..) {
            for chunk in chunks {
                self.dirty_blocks.insert((chunk.ino, chunk.block), chunk.buffer);
            }
        }
    }

    /// Pages the next run of whole blocks may take: what the data head's
    /// zone still holds (a run that does not fit moves the head to a new
    /// zone, leaving the rest of the old one unused), at most
    /// [`DATA_RUN_PAGES_MAX`]. With the head full (or none yet), one page,
    /// which takes a fresh zone; the runs after it are sized to that zone,
    /// whose capacity retired blocks may have cut.
    fn data_run_pages(&self) -> u64 {
        self.volume.head_free_pages(ZoneRole::HotData).clamp(1, DATA_RUN_PAGES_MAX)
    }

    /// Programs `whole` as one run and points each file at its block. A
    /// block that cannot be pointed at, and every one after it, goes back
    /// to the buffer (its page stops counting); on a failed program every
    /// buffer does.
    fn program_blocks(&mut self, whole: &mut Vec<WholeBlock>) -> Result<()> {
        let page_size = self.page_size;
        let run: Vec<(PageMeta, &[u8])> = whole.iter().map(|block| (block.meta, block.buffer.as_slice())).collect();
        let addresses = match self.volume.append_run_once(ZoneRole::HotData, &run) {
            Ok(addresses) => addresses,
            // A failed program of the run: block by block, each fits any
            // zone and gets its own attempts (what the pages of the run
            // that did program hold is referenced by nothing).
            Err(error) if error.errno == errno::EIO => {
                self.counters.data_runs_placed_one_by_one += 1;
                let mut addresses = Vec::with_capacity(run.len());
                for (meta, data) in &run {
                    addresses.push(self.volume.append(ZoneRole::HotData, *meta, data)?);
                }
                addresses
            }
            Err(error) => return Err(error),
        };
        let mut result = Ok(());
        for (block, address) in whole.drain(..).zip(addresses) {
            self.counters.data_pages_written += 1;
            let home = Pointer::page_at(address.zone, address.page);
            if result.is_ok() {
                result = self.point_block_at(block.ino, block.block, home, page_size as i64);
            }
            if result.is_err() {
                self.dirty_blocks.insert((block.ino, block.block), block.buffer);
            } else {
                self.dirty_blocks.recycle(block.buffer);
            }
        }
        result
    }

    /// Points `ino`'s block `block` at its new copy `home` (of `bytes` in
    /// its zone), and lets the old one go. On an error nothing points at
    /// the new copy, and it stops counting; the caller keeps the buffer.
    fn point_block_at(&mut self, ino: u64, block: u64, home: Pointer, bytes: i64) -> Result<()> {
        self.volume.account(home.zone(), bytes);
        match self.set_block_pointer(ino, block, home) {
            Ok(old) => {
                self.release(old);
                self.log_note_block(ino, block);
                Ok(())
            }
            Err(error) => {
                self.release(home);
                Err(error)
            }
        }
    }

    /// The next blocks of a flush (`keys`, in order, a batch of at most
    /// [`COMPRESS_AHEAD_BATCH_BLOCKS`]) compressed ahead, half on the
    /// helper thread (`crate::helper`), each as `flush_block` would try
    /// it: compression is much of a flush of compressible data, and the
    /// second core sat idle. One entry per key, `None` where the block is
    /// not tried (its file's codec is none, it is marked incompressible,
    /// or it is too short or cut away); empty for a batch too short to pay
    /// for the handover, or when the helper is unavailable. A result is only used where `flush_block` would
    /// compress the same bytes the same way, so the pages written are the
    /// same. Batches bound both the payloads held and the attempts wasted
    /// on a file that turns out incompressible: `flush_block` marks it
    /// after [`super::INCOMPRESSIBLE_AFTER_BLOCKS`] misses, and the next
    /// batch leaves it out.
    fn compress_ahead(&mut self, keys: &[(u64, u64)]) -> Vec<Option<Ahead>> {
        if keys.len() < COMPRESS_PARALLEL_BLOCKS_MIN {
            return Vec::new();
        }
        let block_bytes = self.block_bytes();
        // Per file, once: its size, codec and incompressible mark, `None`
        // when not tried.
        let mut file: Option<(u64, Option<FileToCompress>)> = None;
        let mut jobs: Vec<(usize, CompressionChoice, usize)> = Vec::new();
        for (index, &(ino, block)) in keys.iter().enumerate() {
            if file.is_none_or(|(known, _)| known != ino) {
                let read = self.file_key(ino).and_then(|key| {
                    self.with_node(key, |node| match node {
                        Node::File { inode, content, .. } => {
                            Some((inode.clone(), matches!(content, FileContent::Index { incompressible: true, .. })))
                        }
                        _ => None,
                    })
                });
                let tried = match read {
                    Ok(Some((inode, marked))) => {
                        let choice = self.compression_of(&inode);
                        (choice.codec != Compression::None).then_some((inode.size, choice, marked))
                    }
                    _ => None,
                };
                file = Some((ino, tried));
            }
            let Some((_, Some((size, choice, marked)))) = file else { continue };
            let start = block * block_bytes;
            if start >= size {
                continue;
            }
            // A marked file tries only a block whose stored copy is a
            // chunk (`flush_block`'s retry), and its probes, which are
            // left to `flush_block`.
            if marked && !self.block_pointer(ino, block).is_ok_and(|pointer| pointer.chunk() > 0) {
                continue;
            }
            let valid = (size - start).min(block_bytes) as usize;
            if valid >= super::COMPRESSION_BYTES_MIN {
                jobs.push((index, choice, valid));
            }
        }
        if jobs.len() < COMPRESS_PARALLEL_BLOCKS_MIN {
            return Vec::new();
        }
        let page_size = self.page_size;
        let inputs: Vec<(&[u8], CompressionChoice)> = jobs
            .iter()
            .map(|&(index, choice, valid)| {
                let buffer = self.dirty_blocks.get(&keys[index]).expect("every key is buffered");
                (&buffer[..valid], choice)
            })
            .collect();
        let compress_all = |inputs: &[(&[u8], CompressionChoice)]| -> Vec<Option<Vec<u8>>> {
            inputs.iter().map(|&(data, choice)| compress_for_chunk(page_size, choice, data)).collect()
        };
        let half = inputs.len() / 2;
        let (first, second) = inputs.split_at(half);
        // Without the helper the batch is left to `flush_block`, which
        // stops trying a file once it is marked incompressible.
        let Ok((mut payloads, second_payloads)) =
            crate::helper::try_join(|| compress_all(first), || compress_all(second))
        else {
            return Vec::new();
        };
        payloads.extend(second_payloads);
        let mut ahead: Vec<Option<Ahead>> = (0..keys.len()).map(|_| None).collect();
        for ((index, choice, valid), payload) in jobs.into_iter().zip(payloads) {
            ahead[index] = Some(Ahead { choice, valid, payload });
        }
        ahead
    }

    /// Writes one buffered block: a data block page, or a chunk added to
    /// `packing`. On an error the buffer comes back. `ahead` is the block
    /// compressed already, if it was (`compress_ahead`).
    #[allow(clippy::too_many_arguments)]
    fn flush_block(
        &mut self,
        ino: u64,
        block: u64,
        mut buffer: Vec<u8>,
        packing: &mut Packing,
        whole: &mut Vec<WholeBlock>,
        embedding: Option<&mut Embedding>,
        ahead: Option<Ahead>,
    ) -> std::result::Result<(), (Error, Vec<u8>)> {
        let page_size = self.page_size;
        let block_bytes = self.block_bytes();
        // The inode alone is copied, not the node with its content.
        let read = self.file_key(ino).and_then(|key| {
            self.with_node(key, |node| match node {
                Node::File { inode, content, .. } => {
                    Some((inode.clone(), matches!(content, FileContent::Index { incompressible: true, .. })))
                }
                _ => None,
            })
        });
        let (inode, incompressible) = match read {
            Ok(Some(found)) => found,
            Ok(None) => return Err((Error::corrupt(format!("inode {ino} with buffered data is not a file")), buffer)),
            Err(error) => return Err((error, buffer)),
        };
        let start = block * block_bytes;
        if start >= inode.size {
            // Cut off by a truncate since it was buffered.
            return Ok(());
        }
        let valid = (inode.size - start).min(block_bytes) as usize;
        buffer[valid..].fill(0);
        let choice = self.compression_of(&inode);
        // A file marked incompressible still tries a block whose stored
        // copy is a chunk: what it replaces compressed, so it likely does
        // too. Stored raw instead, a rewrite of a file's compressible part
        // (a repeated-byte head before a noisy tail) grew each block from
        // tens of bytes to a page, and a volume at 90% to 99% full.
        let retry = incompressible
            && choice.codec != Compression::None
            && self.block_pointer(ino, block).is_ok_and(|pointer| pointer.chunk() > 0);
        // The chunk the block is, if it is one: compressed, or short enough
        // to pack raw. Either way it is carried in an fsync's record while
        // the record has room, and packed into a page otherwise.
        // The retry leaves the file's mark and its count of probes alone.
        // What was compressed ahead stands for these very bytes and codec.
        let ahead = ahead.filter(|ahead| ahead.choice == choice && ahead.valid == valid).map(|ahead| ahead.payload);
        let compressed = if retry {
            self.compress_block(choice, &buffer[..valid], ahead)
        } else {
            self.try_compress(ino, choice, incompressible, &buffer[..valid], ahead)
        };
        let chunk = match compressed {
            Some(payload) => Some((choice.codec, payload)),
            None if CHUNK_HEADER_BYTES + valid <= page_size / 2 => Some((Compression::None, buffer[..valid].to_vec())),
            None => None,
        };
        if let Some((compression, payload)) = chunk {
            if let Some(embedding) = embedding {
                let carried = self.log.carried.get(&(ino, block)).is_some_and(|(version, carried)| {
                    *version == inode.current
                        && carried.compression == compression
                        && carried.logical_length as usize == valid
                        && carried.payload == payload
                });
                if carried {
                    // An earlier record of this log carries these very
                    // bytes, and nothing since has changed what they mean.
                    self.dirty_blocks.insert((ino, block), buffer);
                    return Ok(());
                }
                let bytes = flintfs_format::LOG_EMBEDDED_HEADER_BYTES + payload.len();
                if embedding.bytes + bytes <= embedding.bytes_max {
                    embedding.bytes += bytes;
                    embedding.blocks.push(flintfs_format::EmbeddedBlock {
                        block,
                        compression,
                        logical_length: valid as u32,
                        payload,
                    });
                    self.dirty_blocks.insert((ino, block), buffer);
                    self.counters.blocks_embedded += 1;
                    return Ok(());
                }
            }
            let header = ChunkHeader {
                kind: ChunkKind::FileData,
                compression,
                stored_length: payload.len() as u32,
                ino,
                offset: start,
                logical_length: valid as u32,
                version: inode.current,
            };
            let units = (CHUNK_HEADER_BYTES + payload.len()).div_ceil(CHUNK_UNIT_BYTES as usize) as u32;
            self.pack_chunk(&header, &payload, PackedChunk { ino, block, units, buffer }, packing)?;
            if compression != Compression::None {
                self.counters.chunks_compressed += 1;
            }
            return Ok(());
        }
        let meta = PageMeta {
            kind: PageKind::DataBlock,
            end_of_record: false,
            inverted: InvertedIndex { ino, offset: start, version: inode.current },
            length: valid as u32,
            count: 0,
        };
        whole.push(WholeBlock { ino, block, buffer, meta });
        Ok(())
    }

    /// Adds a chunk to the open page it fills best (the one with the least
    /// room that still takes it). When none takes it, a new page is
    /// opened; with [`PACKED_PAGES_OPEN_MAX`] open already, the fullest is
    /// programmed first (with its files pointed at their chunks). Chunks
    /// of different sizes thus share pages, and no chunk straddles two. On
    /// an error the chunk's buffer comes back.
    fn pack_chunk(
        &mut self,
        header: &ChunkHeader,
        payload: &[u8],
        chunk: PackedChunk,
        packing: &mut Packing,
    ) -> std::result::Result<(), (Error, Vec<u8>)> {
        let needed = CHUNK_HEADER_BYTES + payload.len();
        let fits = |page: &PackedPage| page.count() < Pointer::CHUNKS_MAX && page.free_bytes() >= needed;
        let best = (0..packing.pages.len())
            .filter(|&index| fits(&packing.pages[index].0))
            .min_by_key(|&index| packing.pages[index].0.free_bytes());
        let index = match best {
            Some(index) => index,
            None => {
                if packing.pages.len() >= PACKED_PAGES_OPEN_MAX {
                    let fullest = (0..packing.pages.len())
                        .min_by_key(|&index| packing.pages[index].0.free_bytes())
                        .expect("pages are open");
                    let (page, mut chunks) = packing.pages.swap_remove(fullest);
                    if let Err(error) = self.program_packed(page, &mut chunks, ZoneRole::HotData) {
                        return Err((error, chunk.buffer));
                    }
                }
                packing.pages.push((PackedPage::new(self.page_size), Vec::new()));
                packing.pages.len() - 1
            }
        };
        let (page, chunks) = &mut packing.pages[index];
        assert!(page.push(header, payload), "a chunk goes only where it fits, and fits an empty page");
        chunks.push(chunk);
        Ok(())
    }

    /// The compression a file's blocks get: its `user.flintfs.compress`
    /// xattr, or the mount's.
    pub(crate) fn compression_of(&self, inode: &flintfs_format::Inode) -> CompressionChoice {
        inode
            .xattrs
            .iter()
            .find(|(name, _)| name.as_slice() == COMPRESSION_XATTR)
            .and_then(|(_, value)| parse_compression_xattr(value).ok())
            .unwrap_or(self.compression)
    }

    /// Clears a file's incompressible mark and its run of misses: its
    /// blocks are tried again (its codec was named again, or its data was
    /// cut to nothing).
    pub(crate) fn forget_incompressible(&mut self, ino: u64) -> Result<()> {
        self.compression_misses.remove(&ino);
        let key = self.file_key(ino)?;
        let marked = self.with_node(key, |node| {
            matches!(node, Node::File { content: FileContent::Index { incompressible: true, .. }, .. })
        })?;
        if !marked {
            return Ok(());
        }
        self.modify(key, |node| {
            if let Node::File { content: FileContent::Index { incompressible, .. }, .. } = node {
                *incompressible = false;
            }
        })
    }

    /// `data` (a block's valid bytes) compressed with `choice`, when that
    /// saves enough to pay for decompressing it at every read; `None` to
    /// store it raw. Keeps the file's run of misses, and marks the file
    /// incompressible when the run is long enough.
    fn try_compress(
        &mut self,
        ino: u64,
        choice: CompressionChoice,
        incompressible: bool,
        data: &[u8],
        ahead: Option<Option<Vec<u8>>>,
    ) -> Option<Vec<u8>> {
        if choice.codec == Compression::None || data.len() < super::COMPRESSION_BYTES_MIN {
            return None;
        }
        if incompressible {
            // One block in INCOMPRESSIBLE_PROBE_BLOCKS is still tried, so a
            // file whose data turns compressible again (a log after a
            // binary header, a tar of mixed files) is found out; the rest
            // pay nothing. The count is in memory: a remount starts it
            // again.
            let skipped = self.compression_streak(ino);
            *skipped += 1;
            if *skipped < super::INCOMPRESSIBLE_PROBE_BLOCKS {
                return None;
            }
            self.compression_misses.remove(&ino);
            let payload = self.compress_block(choice, data, ahead)?;
            let cleared = self.file_key(ino).and_then(|key| {
                self.modify(key, |node| {
                    if let Node::File { content: FileContent::Index { incompressible, .. }, .. } = node {
                        *incompressible = false;
                    }
                })
            });
            if cleared.is_ok() {
                self.counters.files_unmarked_incompressible += 1;
            }
            return Some(payload);
        }
        if let Some(payload) = self.compress_block(choice, data, ahead) {
            self.compression_misses.remove(&ino);
            return Some(payload);
        }
        let misses = self.compression_streak(ino);
        *misses += 1;
        if *misses >= super::INCOMPRESSIBLE_AFTER_BLOCKS {
            self.compression_misses.remove(&ino);
            // A hint, not a promise: a crash that loses it costs attempts.
            let marked = self.file_key(ino).and_then(|key| {
                self.modify(key, |node| {
                    if let Node::File { content: FileContent::Index { incompressible, .. }, .. } = node {
                        *incompressible = true;
                    }
                })
            });
            if marked.is_ok() {
                self.counters.files_marked_incompressible += 1;
            }
        }
        None
    }

    /// A file's count of misses (or, marked, of blocks skipped); the
    /// counts start over when they would pass their bound.
    fn compression_streak(&mut self, ino: u64) -> &mut u32 {
        if self.compression_misses.len() >= super::COMPRESSION_STREAKS_MAX
            && !self.compression_misses.contains_key(&ino)
        {
            self.compression_misses.clear();
        }
        self.compression_misses.entry(ino).or_insert(0)
    }

    /// One attempt (see [`compress_for_chunk`]), or its result found
    /// `ahead` of time.
    fn compress_block(
        &mut self,
        choice: CompressionChoice,
        data: &[u8],
        ahead: Option<Option<Vec<u8>>>,
    ) -> Option<Vec<u8>> {
        self.counters.compression_attempts += 1;
        match ahead {
            Some(payload) => {
                debug_assert_eq!(payload, compress_for_chunk(self.page_size, choice, data), "compressed ahead alike");
                payload
            }
            None => compress_for_chunk(self.page_size, choice, data),
        }
    }

    /// Programs a page of packed chunks and points each file at its chunk.
    /// A chunk that cannot be pointed at, and every one after it, goes back
    /// to the buffer (its copy on the page stops counting).
    pub(crate) fn program_packed(
        &mut self,
        packer: PackedPage,
        chunks: &mut Vec<PackedChunk>,
        role: ZoneRole,
    ) -> Result<()> {
        let (data, length, count) = packer.finish();
        assert_eq!(count as usize, chunks.len(), "one chunk per block packed");
        let meta = PageMeta::new(PageKind::PackedData, length).with_count(count);
        let address = match self.volume.append(role, meta, &data) {
            Ok(address) => address,
            Err(error) => {
                for chunk in chunks.drain(..) {
                    self.dirty_blocks.insert((chunk.ino, chunk.block), chunk.buffer);
                }
                return Err(error);
            }
        };
        self.counters.data_pages_written += 1;
        let mut result = Ok(());
        for (index, chunk) in chunks.drain(..).enumerate() {
            if result.is_err() {
                self.dirty_blocks.insert((chunk.ino, chunk.block), chunk.buffer);
                continue;
            }
            let pointer = Pointer::new(address.zone, address.page, index as u32 + 1, chunk.units);
            self.counters.chunks_written += 1;
            let bytes = i64::from(chunk.units) * i64::from(CHUNK_UNIT_BYTES);
            result = self.point_block_at(chunk.ino, chunk.block, pointer, bytes);
            if result.is_err() {
                self.dirty_blocks.insert((chunk.ino, chunk.block), chunk.buffer);
            } else {
                self.dirty_blocks.recycle(chunk.buffer);
            }
        }
        result
    }
}

/// Most whole blocks one run programs: a zone's worth on the default
/// geometry. A run is sealed on two threads (`Protected::seal_pages`); the
/// figures below were taken when each run started a second thread of its
/// own, about 25 µs to start and join, the sealing of 16 pages, so short
/// runs paid it often. large_rand_write in process,
/// medians of five alternating runs: 220,295 ops/s at 64 pages, 265,835 at
/// 256, 286,245 at 1,024. A run whose program fails is not tried again
/// whole (`Volume::append_run_once`): only a zone with no retired block
/// could take a zone's worth. A run's buffers are moved out of the data
/// buffer, not copied, so a long run holds no more memory than the buffer
/// did, besides its sealed spare areas (128 bytes a page).
pub const DATA_RUN_PAGES_MAX: u64 = 1024;

/// Blocks to compress a batch must have to try them on two threads
/// (`Fs::compress_ahead`): chosen when each batch started a thread of its
/// own, about 25 µs to start and join, the lz4 attempts of some ten 4 KiB
/// blocks.
pub const COMPRESS_PARALLEL_BLOCKS_MIN: usize = 64;
/// Blocks of a flush compressed ahead at a time: the payloads held, and
/// the attempts a file that turns out incompressible can cost before the
/// next batch leaves it out (one at a time it costs
/// `INCOMPRESSIBLE_AFTER_BLOCKS`).
pub const COMPRESS_AHEAD_BATCH_BLOCKS: usize = 256;
const _: () = assert!(COMPRESS_PARALLEL_BLOCKS_MIN <= COMPRESS_AHEAD_BATCH_BLOCKS);

/// A file's size, codec and incompressible mark, as `compress_ahead` reads
/// them once per file of a batch.
type FileToCompress = (u64, CompressionChoice, bool);

/// A block compressed ahead of its flush: the codec and the valid bytes it
/// was compressed for, and the payload (`None`: not worth it).
pub(crate) struct Ahead {
    choice: CompressionChoice,
    valid: usize,
    payload: Option<Vec<u8>>,
}

/// `data` compressed with `choice`, when its chunk (header and payload, in
/// whole units) takes at most 15/16 of the raw bytes and at most half a
/// page of `page_size` bytes. A pure function of its arguments, so a block
/// may be compressed on any thread.
pub(crate) fn compress_for_chunk(page_size: usize, choice: CompressionChoice, data: &[u8]) -> Option<Vec<u8>> {
    // A chunk larger than half a page cannot share its page with another
    // like it, so it would save nothing on flash (and its zone would look
    // half empty to the cleaner while cleaning it gives nothing back). The
    // payload limit is what the units leave after the header (compress
    // wants strictly less than its limit).
    let chunk_bytes_max = (data.len() * super::COMPRESSED_SIXTEENTHS_MAX / 16).min(page_size / 2);
    let units_max = chunk_bytes_max / CHUNK_UNIT_BYTES as usize;
    let payload_max = (units_max * CHUNK_UNIT_BYTES as usize).saturating_sub(CHUNK_HEADER_BYTES);
    let payload = flintfs_format::compress(choice, data, payload_max + 1)?;
    debug_assert!(payload.len() <= payload_max);
    Some(payload)
}

/// The xattr that sets a file's compression (`none`, `lz4`, `zstd`,
/// `zstd:LEVEL`), as btrfs's `btrfs.compression` property does.
pub const COMPRESSION_XATTR: &[u8] = b"user.flintfs.compress";
const _: () = assert!(DATA_RUN_PAGES_MAX as usize >= crate::protect::SEAL_PARALLEL_PAGES_MIN);

/// Small blocks an fsync carries in its log record instead of programming
/// a packed page for them: their chunks, and the bytes those take in the
/// record, at most `bytes_max`.
#[derive(Debug, Default)]
pub(crate) struct Embedding {
    pub blocks: Vec<flintfs_format::EmbeddedBlock>,
    pub bytes: usize,
    pub bytes_max: usize,
}

/// Packed pages a flush fills at once. Chunks go to the one they fill
/// best, so a chunk of a little over a third of a page can still share
/// with smaller ones; more pages would pack a little tighter for more
/// buffers held.
pub const PACKED_PAGES_OPEN_MAX: usize = 4;

/// The packed pages being filled, each with its chunks' buffers.
#[derive(Default)]
pub(crate) struct Packing {
    pages: Vec<(PackedPage, Vec<PackedChunk>)>,
}

/// A whole block on its way into a run of data block pages, with its
/// buffer, which goes back to the buffered blocks if it is not pointed at.
pub(crate) struct WholeBlock {
    pub ino: u64,
    pub block: u64,
    pub buffer: Vec<u8>,
    pub meta: PageMeta,
}

/// A block on its way into a packed page, with its whole buffer, which
/// goes back to the buffered blocks if the page cannot be programmed.
pub(crate) struct PackedChunk {
    pub ino: u64,
    pub block: u64,
    pub units: u32,
    pub buffer: Vec<u8>,
}

/// What a set of block pointers names on flash: blocks, and 16-byte units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub blocks: u64,
    pub units: u64,
}

impl Stored {
    /// What `pointer` names: nothing for a hole, a whole page, or a chunk
    /// of its size.
    pub(crate) fn of(pointer: Pointer, page_size: usize) -> Stored {
        if pointer.is_null() {
            Stored::default()
        } else if pointer.chunk() == 0 {
            Stored { blocks: 1, units: (page_size / CHUNK_UNIT_BYTES as usize) as u64 }
        } else {
            Stored { blocks: 1, units: u64::from(pointer.chunk_units()) }
        }
    }

    fn plus(self, other: Stored) -> Stored {
        Stored { blocks: self.blocks + other.blocks, units: self.units.saturating_add(other.units) }
    }
}

/// The codec a `user.flintfs.compress` value names (a trailing newline or
/// NUL, as shells and C strings leave, is allowed).
pub(crate) fn parse_compression_xattr(value: &[u8]) -> Result<CompressionChoice> {
    let text = std::str::from_utf8(value).map_err(|_| Error::invalid("a compression name is not UTF-8"))?;
    CompressionChoice::parse(text.trim_end_matches(['\n', '\0'])).map_err(Error::invalid)
}

/// A count of stored blocks plus `added`. A count that would leave its
/// range (a damaged image) stays at the bound, and fsck reports it against
/// the pointers.
fn stored_plus(count: u32, added: u64) -> u32 {
    u32::try_from(u64::from(count).saturating_add(added)).unwrap_or(u32::MAX)
}

/// A count of stored blocks less `freed`, at least zero.
fn stored_less(count: u32, freed: u64) -> u32 {
    u32::try_from(u64::from(count).saturating_sub(freed)).unwrap_or(0)
}

/// A verified data page in the read cache. A packed page is parsed whole
/// once, when it comes in, and only where each chunk starts is kept (4
/// bytes a chunk, counted against the cache's bound): a block read then
/// decodes the one header it wants, not every header on the page (parsing
/// them all each time was a seventh of webserver's time).
pub(crate) struct CachedPage {
    header: flintfs_format::PageHeader,
    data: Vec<u8>,
    /// Where each chunk's header starts, or why the page does not parse.
    chunks: std::result::Result<Vec<u32>, String>,
}

impl CachedPage {
    fn new(header: flintfs_format::PageHeader, data: Vec<u8>) -> CachedPage {
        let chunks = if header.kind == PageKind::PackedData {
            parse_packed(&data, header.length, header.count)
                .map(|chunks| chunks.iter().map(|(_, range)| (range.start - CHUNK_HEADER_BYTES) as u32).collect())
                .map_err(|error| error.to_string())
        } else {
            Ok(Vec::new())
        };
        CachedPage { header, data, chunks }
    }

    /// What the page holds against the cache's bound: the page and where
    /// its chunks start.
    fn bytes(&self, page_size: usize) -> usize {
        let starts = self.chunks.as_ref().map_or(0, |chunks| chunks.len());
        page_size + starts * std::mem::size_of::<u32>()
    }

    /// Chunk `index` (from 0): its header and where its payload lies.
    fn chunk(&self, index: usize) -> std::result::Result<(ChunkHeader, std::ops::Range<usize>), String> {
        let starts = self.chunks.as_ref().map_err(|reason| reason.clone())?;
        let start = *starts.get(index).ok_or_else(|| "no such chunk".to_string())? as usize;
        let header_end = start + CHUNK_HEADER_BYTES;
        // The page parsed whole when it came in, so this cannot fail; it is
        // still checked, never assumed.
        let header = self
            .data
            .get(start..header_end)
            .ok_or_else(|| "a chunk header past the page".to_string())
            .and_then(|bytes| ChunkHeader::decode(bytes).map_err(|error| error.to_string()))?;
        let end = header_end + header.stored_length as usize;
        if end > self.data.len() {
            return Err("a chunk past the page".into());
        }
        Ok((header, header_end..end))
    }
}

/// A block a read wants, and what its page must say to be it.
struct WantedBlock {
    ino: u64,
    born: u64,
    block: u64,
    pointer: Pointer,
    offset: u64,
}

impl WantedBlock {
    /// The block out of its verified page, once the page's inverted index
    /// names it, appended to `out`: `block_bytes` more, zeros past what is
    /// stored. On an error `out` may have grown by part of it.
    fn cut_from_page(&self, page: &CachedPage, out: &mut Vec<u8>, block_bytes: usize) -> Result<()> {
        let WantedBlock { ino, born, block, pointer, offset } = *self;
        let (header, data) = (&page.header, page.data.as_slice());
        let start = out.len();
        let bad = |what: String| Error::corrupt(format!("inode {ino} block {block} at {pointer}: {what}"));
        if pointer.chunk() == 0 {
            if header.kind != PageKind::DataBlock {
                return Err(bad(format!("a {:?} page, not a data block", header.kind)));
            }
            let index = header.inverted;
            if index.ino != ino || index.offset != offset || index.version < born {
                return Err(bad(format!("the page belongs to {index:?}")));
            }
            let stored = data.get(..header.length as usize).filter(|stored| stored.len() <= block_bytes);
            out.extend_from_slice(stored.ok_or_else(|| bad(format!("{} bytes stored", header.length)))?);
        } else {
            if header.kind != PageKind::PackedData {
                return Err(bad(format!("a {:?} page, not packed chunks", header.kind)));
            }
            let (chunk, range) = page.chunk(pointer.chunk() as usize - 1).map_err(bad)?;
            if chunk.ino != ino || chunk.offset != offset || chunk.version < born || chunk.kind != ChunkKind::FileData {
                return Err(bad(format!("the chunk belongs to inode {} offset {}", chunk.ino, chunk.offset)));
            }
            if chunk.logical_length as usize > block_bytes || range.len() > block_bytes {
                return Err(bad("a chunk longer than a block".into()));
            }
            if chunk.compression == Compression::None {
                out.extend_from_slice(&data[range]);
            } else {
                // The page verified (CRC, ECC), so a payload that does not
                // decompress to its logical length was written wrong:
                // refused, never returned as garbage.
                // Straight into `out`: an error leaves it part-written, and
                // the read fails with it.
                out.resize(start + chunk.logical_length as usize, 0);
                flintfs_format::decompress_into(chunk.compression, &data[range], &mut out[start..])
                    .map_err(|error| bad(error.to_string()))?;
            }
        }
        out.resize(start + block_bytes, 0);
        Ok(())
    }
}
