//! The checkpoint payload: the state a clean mount starts from, without
//! reading anything whose count grows with the number of files. It carries
//! the segment usage table inline (one entry per zone), the allocator state,
//! the pre-declared next-k segments (the unindexed zone) and the open log
//! heads.

use crate::codec::{Reader, Writer};
use crate::superblock::{CHECKPOINT_ZONES, FIRST_DYNAMIC_ZONE, SUPERBLOCK_ZONES};
use crate::DecodeError;

/// Bytes of the fixed part of a checkpoint payload.
pub const CHECKPOINT_FIXED_BYTES: usize = 72;
/// Bytes of one zone usage entry.
pub const ZONE_USAGE_BYTES: usize = 24;
/// Most orphans a checkpoint lists (files unlinked while open,
/// directories removed while held): half a page of inode numbers, so the
/// list grows the record by at most one page. More than that are not
/// listed, and a crash leaks them until fsck.
pub const fn orphans_max(page_size_bytes: usize) -> usize {
    page_size_bytes / 16
}
/// Bytes of one log head entry.
pub const LOG_HEAD_BYTES: usize = 12;
/// Most log heads a checkpoint records: one per log-head role.
pub const LOG_HEADS_MAX: usize = 4;

/// What a zone is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZoneRole {
    /// Holds nothing the file system needs; may be reset and allocated.
    Free,
    Superblock,
    Checkpoint,
    /// Data written by the host (hot).
    HotData,
    /// Data moved by the cleaner (cold).
    ColdData,
    /// Namespace and index pages.
    Node,
    /// The metadata persistence log.
    Log,
}

impl ZoneRole {
    fn to_byte(self) -> u8 {
        match self {
            ZoneRole::Free => 0,
            ZoneRole::Superblock => 1,
            ZoneRole::Checkpoint => 2,
            ZoneRole::HotData => 3,
            ZoneRole::ColdData => 4,
            ZoneRole::Node => 5,
            ZoneRole::Log => 6,
        }
    }

    fn from_byte(byte: u8) -> Option<ZoneRole> {
        Some(match byte {
            0 => ZoneRole::Free,
            1 => ZoneRole::Superblock,
            2 => ZoneRole::Checkpoint,
            3 => ZoneRole::HotData,
            4 => ZoneRole::ColdData,
            5 => ZoneRole::Node,
            6 => ZoneRole::Log,
            _ => return None,
        })
    }

    /// Roles a log head appends to.
    pub fn is_log_head(self) -> bool {
        matches!(self, ZoneRole::HotData | ZoneRole::ColdData | ZoneRole::Node | ZoneRole::Log)
    }
}

/// One entry of the segment usage table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneUsage {
    pub role: ZoneRole,
    /// Resets of this zone by the file system; every page header written in
    /// the zone carries it.
    pub generation: u32,
    /// Bytes still referenced in the zone (for the cleaner's cost-benefit).
    pub valid_bytes: u64,
    /// Sequence of the zone's newest page (its age, for cost-benefit).
    pub last_sequence: u64,
}

/// An open log head: the zone a role appends to, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHead {
    pub role: ZoneRole,
    pub zone: u32,
    pub write_pointer: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Increases by one with every checkpoint; the newest valid one wins.
    pub number: u64,
    /// The next page sequence number to use.
    pub sequence_next: u64,
    /// The next inode number to allocate.
    pub ino_next: u64,
    /// The segment usage table: one entry per zone.
    pub zones: Vec<ZoneUsage>,
    /// The next-k segments: where new pages go until the next checkpoint,
    /// and all that recovery scans.
    pub unindexed: Vec<u32>,
    pub heads: Vec<LogHead>,
    /// The namespace's roots: the paged map and its allocator.
    pub tree: TreeRoots,
}

/// Where the namespace starts: the map, which locates directories,
/// buckets, table pages and multi-link files by slot. Its pages are found
/// through map directory pages (a second level), so the record holds one
/// pointer per directory page, not one per map page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeRoots {
    /// Slots ever allocated: the map covers slots `0..slot_count`.
    pub slot_count: u32,
    /// The first free slot (freed slots are chained through the map), or
    /// [`crate::SLOT_NONE`].
    pub free_slot_head: u32,
    /// The next inode version to hand out.
    pub version_next: u64,
    /// Where each map directory page is; null for a page never written.
    pub map_directory: Vec<crate::Pointer>,
    /// Where the root directory's page is (the node of slot 0, as the map
    /// also says): mount proves the tree is there with one read. Null
    /// before mkfs has made the root.
    pub root: crate::Pointer,
    /// Inode numbers of files unlinked while open and directories removed
    /// while held, when the checkpoint was taken: mount frees them.
    pub orphans: Vec<u64>,
    /// Node pages this checkpoint keeps in the NVM region's slots (FSMAC):
    /// their copies there, not the ones on flash, are the file system's.
    /// Zero when the flash alone is complete (a clean unmount without
    /// `nvm_keep`, or no NVM).
    pub nvm_nodes: u32,
}

impl Default for TreeRoots {
    /// No slots yet: what mkfs starts from before it makes the root.
    fn default() -> TreeRoots {
        TreeRoots {
            slot_count: 0,
            free_slot_head: crate::SLOT_NONE,
            version_next: 1,
            map_directory: Vec::new(),
            root: crate::Pointer::NULL,
            orphans: Vec::new(),
            nvm_nodes: 0,
        }
    }
}

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        if let Err(reason) = self.validate() {
            panic!("refusing to encode an invalid checkpoint: {reason}");
        }
        let mut writer = Writer::with_capacity(Checkpoint::encoded_bytes(
            self.zones.len(),
            self.unindexed.len(),
            self.heads.len(),
            self.tree.map_directory.len(),
            self.tree.orphans.len(),
        ));
        writer
            .u64(self.number)
            .u64(self.sequence_next)
            .u64(self.ino_next)
            .u32(self.zones.len() as u32)
            .u32(self.unindexed.len() as u32)
            .u32(self.heads.len() as u32)
            .u32(self.tree.slot_count)
            .u32(self.tree.free_slot_head)
            .u32(self.tree.map_directory.len() as u32)
            .u64(self.tree.version_next)
            .u32(self.tree.orphans.len() as u32)
            .u32(self.tree.nvm_nodes)
            .u64(self.tree.root.0);
        for usage in &self.zones {
            writer
                .u8(usage.role.to_byte())
                .zeros(3)
                .u32(usage.generation)
                .u64(usage.valid_bytes)
                .u64(usage.last_sequence);
        }
        for zone in &self.unindexed {
            writer.u32(*zone);
        }
        for head in &self.heads {
            writer.u8(head.role.to_byte()).zeros(3).u32(head.zone).u32(head.write_pointer);
        }
        for page in &self.tree.map_directory {
            writer.u64(page.0);
        }
        for orphan in &self.tree.orphans {
            writer.u64(*orphan);
        }
        let bytes = writer.finish();
        debug_assert_eq!(Checkpoint::decode(&bytes).as_ref(), Ok(self));
        bytes
    }

    /// Bytes of the encoded payload for these counts: what [`Checkpoint::encode`]
    /// writes and [`Checkpoint::decode`] requires.
    pub fn encoded_bytes(
        zones: usize,
        unindexed: usize,
        heads: usize,
        map_directory_pages: usize,
        orphans: usize,
    ) -> usize {
        CHECKPOINT_FIXED_BYTES
            .saturating_add(zones.saturating_mul(ZONE_USAGE_BYTES))
            .saturating_add(unindexed.saturating_mul(4))
            .saturating_add(heads.saturating_mul(LOG_HEAD_BYTES))
            .saturating_add(map_directory_pages.saturating_mul(8))
            .saturating_add(orphans.saturating_mul(8))
    }

    pub fn decode(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
        let mut reader = Reader::new("checkpoint", bytes);
        let number = reader.u64()?;
        let sequence_next = reader.u64()?;
        let ino_next = reader.u64()?;
        let zone_count = reader.u32()? as usize;
        let unindexed_count = reader.u32()? as usize;
        let head_count = reader.u32()? as usize;
        let slot_count = reader.u32()?;
        let free_slot_head = reader.u32()?;
        let map_directory_count = reader.u32()? as usize;
        let version_next = reader.u64()?;
        let orphan_count = reader.u32()? as usize;
        let nvm_nodes = reader.u32()?;
        let root = crate::Pointer(reader.u64()?);
        let expected =
            Checkpoint::encoded_bytes(zone_count, unindexed_count, head_count, map_directory_count, orphan_count)
                - CHECKPOINT_FIXED_BYTES;
        if bytes.len() - CHECKPOINT_FIXED_BYTES != expected {
            return Err(reader.error(format!(
                "{zone_count} zones, {unindexed_count} unindexed segments, {head_count} heads, {map_directory_count} \
                 map directory pages and {orphan_count} orphans need {expected} bytes, {} follow",
                bytes.len() - CHECKPOINT_FIXED_BYTES
            )));
        }
        let mut zones = Vec::with_capacity(zone_count);
        for zone in 0..zone_count {
            let role_byte = reader.u8()?;
            reader.zeros(3)?;
            let role = ZoneRole::from_byte(role_byte)
                .ok_or_else(|| reader.error(format!("zone {zone} has unknown role {role_byte}")))?;
            zones.push(ZoneUsage {
                role,
                generation: reader.u32()?,
                valid_bytes: reader.u64()?,
                last_sequence: reader.u64()?,
            });
        }
        let mut unindexed = Vec::with_capacity(unindexed_count);
        for _ in 0..unindexed_count {
            unindexed.push(reader.u32()?);
        }
        let mut heads = Vec::with_capacity(head_count);
        for index in 0..head_count {
            let role_byte = reader.u8()?;
            reader.zeros(3)?;
            let role = ZoneRole::from_byte(role_byte)
                .ok_or_else(|| reader.error(format!("head {index} has unknown role {role_byte}")))?;
            heads.push(LogHead { role, zone: reader.u32()?, write_pointer: reader.u32()? });
        }
        let mut map_directory = Vec::with_capacity(map_directory_count);
        for _ in 0..map_directory_count {
            map_directory.push(crate::Pointer(reader.u64()?));
        }
        let mut orphans = Vec::with_capacity(orphan_count.min(bytes.len() / 8));
        for _ in 0..orphan_count {
            orphans.push(reader.u64()?);
        }
        let tree = TreeRoots { slot_count, free_slot_head, version_next, map_directory, root, orphans, nvm_nodes };
        let checkpoint = Checkpoint { number, sequence_next, ino_next, zones, unindexed, heads, tree };
        checkpoint.validate().map_err(|reason| reader.error(reason))?;
        Ok(checkpoint)
    }

    /// The rules a checkpoint keeps, checked before it is written and after
    /// it is read.
    pub fn validate(&self) -> Result<(), String> {
        let zone_count = self.zones.len() as u64;
        if let Some(zone) = self.unindexed.iter().find(|&&zone| u64::from(zone) >= zone_count) {
            return Err(format!("unindexed segment {zone} is past the {zone_count} zones"));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(zone) = self.unindexed.iter().find(|&&zone| !seen.insert(zone)) {
            return Err(format!("unindexed segment {zone} listed twice"));
        }
        if self.heads.len() > LOG_HEADS_MAX {
            return Err(format!("{} log heads, at most {LOG_HEADS_MAX}", self.heads.len()));
        }
        let mut roles = std::collections::BTreeSet::new();
        for head in &self.heads {
            if !head.role.is_log_head() {
                return Err(format!("a log head with role {:?}", head.role));
            }
            if !roles.insert(head.role.to_byte()) {
                return Err(format!("two log heads for {:?}", head.role));
            }
            let Some(usage) = self.zones.get(head.zone as usize) else {
                return Err(format!("log head {:?} in zone {} past the {zone_count} zones", head.role, head.zone));
            };
            if usage.role != head.role {
                return Err(format!("log head {:?} in zone {} whose role is {:?}", head.role, head.zone, usage.role));
            }
        }
        if self.ino_next == 0 {
            return Err("inode number 0 is never allocated".into());
        }
        let tree = &self.tree;
        if tree.slot_count == crate::SLOT_NONE {
            return Err("the slot count is at its bound".into());
        }
        if tree.free_slot_head != crate::SLOT_NONE && tree.free_slot_head >= tree.slot_count {
            return Err(format!("free slot {} is past the {} slots", tree.free_slot_head, tree.slot_count));
        }
        if tree.orphans.iter().any(|&ino| ino == 0 || ino > u64::from(tree.slot_count)) {
            return Err("an orphan past the slots".into());
        }
        // The page size is not known here; 64 KiB pages bound it.
        if tree.orphans.len() > orphans_max(64 * 1024) {
            return Err(format!("{} orphans, more than any page size allows", tree.orphans.len()));
        }
        for page in &tree.map_directory {
            if !page.is_null()
                && (page.zone() as u64 >= zone_count || page.chunk() != 0 || page.zone() < FIRST_DYNAMIC_ZONE)
            {
                return Err(format!("map directory page at {page} is not a page of a dynamic zone"));
            }
        }
        let root = tree.root;
        if !root.is_null()
            && (root.zone() as u64 >= zone_count || root.chunk() != 0 || root.zone() < FIRST_DYNAMIC_ZONE)
        {
            return Err(format!("the root directory at {root} is not a page of a dynamic zone"));
        }
        // The fixed zones keep their roles; heads and unindexed zones are
        // dynamic zones, and an unindexed zone is free and not a head.
        for (zones, role) in [(SUPERBLOCK_ZONES, ZoneRole::Superblock), (CHECKPOINT_ZONES, ZoneRole::Checkpoint)] {
            for zone in zones {
                if let Some(usage) = self.zones.get(zone as usize) {
                    if usage.role != role {
                        return Err(format!("fixed zone {zone} has role {:?}, not {role:?}", usage.role));
                    }
                }
            }
        }
        if let Some(zone) = self
            .zones
            .iter()
            .skip(FIRST_DYNAMIC_ZONE as usize)
            .position(|usage| matches!(usage.role, ZoneRole::Superblock | ZoneRole::Checkpoint))
        {
            return Err(format!("dynamic zone {} has a fixed role", zone + FIRST_DYNAMIC_ZONE as usize));
        }
        for head in &self.heads {
            if head.zone < FIRST_DYNAMIC_ZONE {
                return Err(format!("log head {:?} in fixed zone {}", head.role, head.zone));
            }
        }
        for &zone in &self.unindexed {
            if zone < FIRST_DYNAMIC_ZONE
                || self.zones[zone as usize].role != ZoneRole::Free
                || self.heads.iter().any(|head| head.zone == zone)
            {
                return Err(format!("unindexed segment {zone} is not a free dynamic zone"));
            }
        }
        Ok(())
    }
}
