//! Arbitrary bytes through every on-flash format decoder: a value or an
//! error, never a panic. A decoded value re-encodes to a value that decodes
//! the same (where the structure round-trips by construction).
#![no_main]

use flintfs_format::{
    decode_inode_pack, decode_inode_pack_record, encode_inode_pack, parse_packed, Checkpoint, ChunkHeader, LogBatch, Node, PageHeader, RecordAssembler,
    RecordKind, Superblock,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if bytes.len() < 8 {
        return;
    }
    let split = (u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize) % (bytes.len() - 3);
    let (oob, data) = bytes[4..].split_at(split.min(bytes.len() - 4));
    if let Ok(header) = PageHeader::decode(oob, data) {
        assert_eq!(PageHeader::decode(&header.encode(data), data), Ok(header));
        if header.kind == flintfs_format::PageKind::PackedData {
            let _ = parse_packed(data, header.length, header.count);
        }
        for kind in [RecordKind::Checkpoint, RecordKind::Log] {
            let _ = RecordAssembler::new(kind).push(&header, data);
        }
    }
    if let Ok(chunk) = ChunkHeader::decode(oob) {
        assert_eq!(ChunkHeader::decode(&chunk.encode()), Ok(chunk));
    }
    if let Ok(checkpoint) = Checkpoint::decode(data) {
        assert_eq!(Checkpoint::decode(&checkpoint.encode()), Ok(checkpoint));
    }
    if let Ok(batch) = LogBatch::decode(data) {
        assert_eq!(LogBatch::decode(&batch.encode()), Ok(batch));
    }
    if let Ok(superblock) = Superblock::decode(data) {
        assert_eq!(Superblock::decode(&superblock.encode()), Ok(superblock));
    }
    // Node pages and inode packs: a decoded node re-encodes to the same
    // page.
    if let Ok(node) = Node::decode(data) {
        let (page, _) = node.encode(data.len());
        assert_eq!(Node::decode(&page), Ok(node));
    }
    // One record alone: what the whole pack's decode gives, where that
    // succeeds.
    // Any record position a pack can have (up to 255), from bytes the
    // split above does not use.
    let index = usize::from(bytes[bytes.len() - 5]);
    let one = decode_inode_pack_record(data, index);
    if let Ok(files) = decode_inode_pack(data) {
        assert_eq!(one, Ok(files.get(index).cloned()));
        let (page, _, _) = encode_inode_pack(&files, data.len());
        assert_eq!(decode_inode_pack(&page), Ok(files));
    }
    let length = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
    let _ = parse_packed(data, length, length % 200);
    // The NVM header and frame header, for any region size.
    if let flintfs_format::NvmHeaderState::Valid(header) = flintfs_format::NvmHeader::decode(data, u64::from(length)) {
        assert_eq!(
            flintfs_format::NvmHeader::decode(&header.encode(), u64::from(length)),
            flintfs_format::NvmHeaderState::Valid(header.clone())
        );
        assert!(header.epoch_start(u64::from(length)) < header.log_bytes);
    }
    let _ = flintfs_format::decode_nvm_frame_header(data);
    // An open stripe's record header re-encodes to itself.
    if let Ok(Some((header, _))) = flintfs_format::NvmStripeHeader::decode(data) {
        if header.units <= 4 && header.unit_bytes <= 256 {
            let count = if header.data_pages == 0 { 0 } else { header.units as usize };
            let units = vec![vec![0u8; header.unit_bytes as usize]; count];
            let encoded = header.encode(&[0; 16], &units);
            let decoded = flintfs_format::NvmStripeHeader::decode(&encoded).map(|found| found.map(|(header, _)| header));
            assert_eq!(decoded, Ok(Some(header)));
        }
    }
    // NVM node slots: a header copy re-encodes to itself; a prefix or
    // selection word is any 8 bytes.
    if let Ok(Some(header)) = flintfs_format::NvmSlotHeader::decode(data, (length % 65_536) as usize) {
        assert_eq!(flintfs_format::NvmSlotHeader::decode(&header.encode(), usize::MAX), Ok(Some(header)));
    }
    if data.len() >= 8 {
        let word = u64::from_le_bytes(data[..8].try_into().unwrap());
        let _ = flintfs_format::decode_nvm_slot_prefix(word);
        assert_eq!(flintfs_format::NvmSlotWord::decode(word).encode(), word);
        // The wear levelling: a ring word found is the one its number
        // encodes, and the layout of any region size maps every logical
        // line inside the region.
        let number = u64::from(length);
        let ring_records = number % 100_000;
        if let Some(moves) = flintfs_format::decode_nvm_wear_record(word, number % 1_000, ring_records) {
            assert_eq!(flintfs_format::encode_nvm_wear_record(moves), word);
        }
        let region = word % (1 << 32);
        if let Some(layout) = flintfs_format::NvmWearLayout::for_region(region) {
            let line = number % layout.lines;
            let moves = word >> 16;
            assert!(layout.physical_line_offset(moves, line) + flintfs_format::NVM_WEAR_LINE_BYTES <= region);
            let (from, to) = layout.move_after(moves);
            assert!(from.max(to) + flintfs_format::NVM_WEAR_LINE_BYTES <= region);
        }
    }
    // Compressed chunk payloads: any bytes, any claimed length up to a
    // block, give that many bytes or an error.
    let logical = (length % 65_536) as usize + 1;
    for codec in [flintfs_format::Compression::Lz4, flintfs_format::Compression::Zstd] {
        let whole = flintfs_format::decompress(codec, data, logical);
        if let Ok(block) = &whole {
            assert_eq!(block.len(), logical);
        }
        // Into a caller's buffer, as a read does: the same answer.
        // Not zeros, which decompress starts from: what the buffer held
        // before must not show through.
        let mut into = vec![0xA5u8; logical];
        match (flintfs_format::decompress_into(codec, data, &mut into), whole) {
            (Ok(()), Ok(block)) => assert_eq!(into, block),
            (Err(_), Err(_)) => {}
            (into, whole) => panic!("decompress_into {into:?} against decompress {:?}", whole.map(|block| block.len())),
        }
    }
    // The record assembler on page headers built straight from the bytes
    // (random bytes almost never pass a page checksum, so decoding first
    // would leave it unexplored).
    let mut assembler = RecordAssembler::new(if bytes[0] & 1 == 0 { RecordKind::Checkpoint } else { RecordKind::Log });
    for piece in bytes.chunks(40) {
        if piece.len() < 24 {
            break;
        }
        let field = |at: usize| u32::from_le_bytes(piece[at..at + 4].try_into().unwrap());
        let header = PageHeader {
            kind: if bytes[0] & 1 == 0 { flintfs_format::PageKind::Checkpoint } else { flintfs_format::PageKind::Log },
            end_of_record: piece[0] & 1 == 1,
            zone_generation: field(4),
            sequence: u64::from(field(8)) % 8,
            zone: 0,
            page: field(12),
            inverted: Default::default(),
            length: field(16) % 700,
            count: field(20) % 4,
        };
        let _ = assembler.push(&header, &piece[24..]);
    }
});
