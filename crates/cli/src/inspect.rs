//! `inspect`: what is on flash, decoded. It reads; it never writes the
//! file system (opening the image takes its lock, so not while mounted,
//! except `geometry`, which reads only the image header).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use flintfs_core::Volume;
use flintfs_flash::{FlashDevice, PageAddress, PageState};
use flintfs_format::{ChunkHeader, Node, PageHeader, PageKind};
use serde_json::{json, Value};

use crate::device::{open_device_to_look, Device};
use crate::image::IMAGE_WAIT;
use crate::{fail, Outcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum What {
    Geometry,
    Superblock,
    Checkpoint,
    Zones,
    Wear,
    Page,
}

#[derive(Args)]
pub struct InspectArguments {
    pub image: PathBuf,
    /// What to show (all but `page` when left out).
    pub what: Option<What>,
    /// For `page`: ZONE:PAGE, or a device page number.
    pub address: Option<String>,
    #[arg(long)]
    pub json: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn geometry(arguments: &InspectArguments) -> Outcome<Value> {
    let device = open_device_to_look(&arguments.image, IMAGE_WAIT)?;
    let geometry = device.geometry();
    Ok(json!({
        "backend": device.backend_name(),
        "page_size": geometry.page_size_bytes,
        "oob_size": geometry.oob_size_bytes,
        "block_pages": geometry.block_pages,
        "zone_blocks": geometry.zone_blocks,
        "zone_count": geometry.zone_count,
        "nvm_size": geometry.nvm_size_bytes,
        "open_zones_max": geometry.open_zones_max,
        "size_bytes": geometry.device_size_bytes(),
    }))
}

fn volume(arguments: &InspectArguments) -> Outcome<Volume<Device>> {
    let device = open_device_to_look(&arguments.image, IMAGE_WAIT)?;
    let (volume, _) = Volume::mount(device).map_err(|error| error.message)?;
    Ok(volume)
}

fn superblock(volume: &Volume<Device>) -> Value {
    let superblock = volume.superblock();
    json!({
        "format_version": flintfs_format::FORMAT_VERSION,
        "uuid": hex(&superblock.uuid),
        "created_ns": superblock.created_ns,
        "unindexed_segments": superblock.unindexed_segments,
        "block_parity_pages": superblock.block_parity_pages,
        "segment_parity_blocks": superblock.segment_parity_blocks,
        "compression": format!("{:?}", superblock.compression).to_lowercase(),
    })
}

fn checkpoint(volume: &Volume<Device>) -> Value {
    let checkpoint = volume.checkpoint();
    let tree = &checkpoint.tree;
    json!({
        "number": checkpoint.number,
        "sequence_next": checkpoint.sequence_next,
        "inodes_created": checkpoint.ino_next,
        "unindexed": checkpoint.unindexed,
        "heads": checkpoint.heads.iter().map(|head| json!({
            "role": role_name(head.role),
            "zone": head.zone,
            "write_pointer": head.write_pointer,
        })).collect::<Vec<_>>(),
        "slot_count": tree.slot_count,
        "free_slot_head": tree.free_slot_head,
        "version_next": tree.version_next,
        "map_directory_pages": tree.map_directory.len(),
        "root": tree.root.to_string(),
        "orphans": tree.orphans,
    })
}

fn role_name(role: flintfs_format::ZoneRole) -> String {
    let name = format!("{role:?}");
    // HotData -> hot_data
    let mut out = String::new();
    for (index, character) in name.chars().enumerate() {
        if character.is_uppercase() && index > 0 {
            out.push('_');
        }
        out.push(character.to_ascii_lowercase());
    }
    out
}

fn zones(volume: &Volume<Device>) -> Value {
    let usage = &volume.checkpoint().zones;
    let zones: Vec<Value> = volume
        .device()
        .report_zones()
        .iter()
        .map(|report| {
            let entry = usage.get(report.zone as usize);
            json!({
                "zone": report.zone,
                "state": report.state.name(),
                "write_pointer": report.write_pointer,
                "capacity": report.capacity_pages,
                "role": entry.map(|entry| role_name(entry.role)),
                "valid_bytes": entry.map(|entry| entry.valid_bytes),
                "erase_count": report.erase_count_max,
                "bad_blocks": report.bad_blocks,
            })
        })
        .collect();
    Value::Array(zones)
}

fn wear(volume: &Volume<Device>) -> Value {
    // The emulator counts each erase block's erases; the block backend each
    // zone's (a real device wears its own cells behind its own mapping).
    let (counts, endurance): (Vec<(u32, bool)>, Option<u32>) = match volume.device() {
        Device::Image(device) => (
            device.blocks().iter().map(|block| (block.erase_count, block.bad)).collect(),
            Some(device.options().faults.endurance_cycles),
        ),
        Device::Block(device) => {
            (device.report_zones().iter().map(|zone| (zone.erase_count_max, false)).collect(), None)
        }
    };
    let blocks = counts;
    let good: Vec<u32> = blocks.iter().filter(|(_, bad)| !bad).map(|(count, _)| *count).collect();
    let minimum = good.iter().copied().min().unwrap_or(0);
    let maximum = good.iter().copied().max().unwrap_or(0);
    let mean =
        if good.is_empty() { 0.0 } else { good.iter().map(|&count| f64::from(count)).sum::<f64>() / good.len() as f64 };
    json!({
        "blocks": blocks.len(),
        "bad_blocks": blocks.len() - good.len(),
        "erase_count_min": minimum,
        "erase_count_max": maximum,
        "erase_count_mean": mean,
        "max_over_mean": if mean > 0.0 { f64::from(maximum) / mean } else { 0.0 },
        "endurance_cycles": endurance,
    })
}

fn parse_address(text: &str, geometry: &flintfs_flash::Geometry) -> Outcome<PageAddress> {
    let address = match text.split_once(':') {
        Some((zone, page)) => match (zone.parse(), page.parse()) {
            (Ok(zone), Ok(page)) => PageAddress::new(zone, page),
            _ => fail!("{text:?} is not an address (ZONE:PAGE or a page number)"),
        },
        None => {
            let Ok(number) = text.parse::<u64>() else {
                fail!("{text:?} is not an address (ZONE:PAGE or a page number)")
            };
            let zone_pages = geometry.zone_pages();
            PageAddress::new(u32::try_from(number / zone_pages).unwrap_or(u32::MAX), (number % zone_pages) as u32)
        }
    };
    if let Err(error) = geometry.check_address(address) {
        fail!("{error}");
    }
    Ok(address)
}

fn page(arguments: &InspectArguments) -> Outcome<Value> {
    let Some(text) = &arguments.address else { fail!("inspect page needs an address: ZONE:PAGE or a page number") };
    let mut device = open_device_to_look(&arguments.image, IMAGE_WAIT)?;
    let geometry = device.geometry();
    let address = parse_address(text, &geometry)?;
    let mut data = vec![0u8; geometry.page_size_bytes as usize];
    let mut oob = vec![0u8; geometry.oob_size_bytes as usize];
    let state = device.read_page(address, &mut data, &mut oob)?;
    let mut value = json!({ "zone": address.zone, "page": address.page, "state": format!("{state:?}").to_lowercase() });
    if state == PageState::Erased {
        return Ok(value);
    }
    match PageHeader::decode(&oob, &data) {
        Err(error) => value["error"] = format!("the page header does not decode: {error}").into(),
        Ok(header) => {
            value["header"] = json!({
                "kind": format!("{:?}", header.kind),
                "end_of_record": header.end_of_record,
                "zone_generation": header.zone_generation,
                "sequence": header.sequence,
                "zone": header.zone,
                "page": header.page,
                "inverted_index": { "ino": header.inverted.ino, "offset": header.inverted.offset, "version": header.inverted.version },
                "length": header.length,
                "count": header.count,
            });
            let used = &data;
            value["content"] = match header.kind {
                PageKind::Node if flintfs_format::is_inode_pack(used) => {
                    match flintfs_format::decode_inode_pack(used) {
                        Ok(files) => json!({ "inode_pack": files.iter().map(node_summary).collect::<Vec<_>>() }),
                        Err(error) => json!({ "error": error.to_string() }),
                    }
                }
                PageKind::Node => match Node::decode(used) {
                    Ok(node) => node_summary(&node),
                    Err(error) => json!({ "error": error.to_string() }),
                },
                PageKind::PackedData => match flintfs_format::parse_packed(&data, header.length, header.count) {
                    Ok(chunks) => {
                        json!({ "chunks": chunks.iter().map(|(chunk, range)| chunk_summary(chunk, range)).collect::<Vec<_>>() })
                    }
                    Err(error) => json!({ "error": error.to_string() }),
                },
                PageKind::Log => log_page(&header, &data),
                _ => Value::Null,
            };
        }
    }
    Ok(value)
}

/// A metadata-log page: the batch it holds when the record is this one page,
/// else where the page sits in its record.
fn log_page(header: &PageHeader, data: &[u8]) -> Value {
    if header.count != 0 || !header.end_of_record {
        return json!({ "log_record_page": header.count, "last": header.end_of_record });
    }
    let mut assembler = flintfs_format::RecordAssembler::new(flintfs_format::RecordKind::Log);
    let batch = match assembler.push(header, data) {
        Ok(Some((_, payload))) => flintfs_format::LogBatch::decode(&payload).map_err(|error| error.to_string()),
        Ok(None) => Err("the record is not whole".to_string()),
        Err(error) => Err(error.to_string()),
    };
    match batch {
        Ok(batch) => json!({
            "epoch": batch.epoch,
            "batch": batch.batch,
            "records": batch
                .records
                .iter()
                .map(|record| json!({
                    "version_next": record.version_next,
                    "now_ns": record.now_ns,
                    "operation": format!("{:?}", record.operation),
                }))
                .collect::<Vec<_>>(),
        }),
        Err(error) => json!({ "error": error }),
    }
}

fn chunk_summary(chunk: &ChunkHeader, range: &std::ops::Range<usize>) -> Value {
    json!({
        "kind": format!("{:?}", chunk.kind),
        "compression": format!("{:?}", chunk.compression),
        "ino": chunk.ino,
        "offset": chunk.offset,
        "logical_length": chunk.logical_length,
        "stored_length": chunk.stored_length,
        "version": chunk.version,
        "bytes": [range.start, range.end],
    })
}

fn node_summary(node: &Node) -> Value {
    match node {
        Node::Directory { slot, inode, entry_count, .. } => {
            json!({ "node": "directory", "slot": slot, "ino": inode.ino, "entries": entry_count })
        }
        Node::Bucket { directory, slot, local_depth, next, entries } => json!({
            "node": "bucket", "directory": directory, "slot": slot, "local_depth": local_depth,
            "next": next, "entries": entries.len(),
        }),
        Node::Table { directory, slot, slots } => {
            json!({ "node": "table", "directory": directory, "slot": slot, "slots": slots.len() })
        }
        Node::Map { number, entries } => json!({ "node": "map", "number": number, "entries": entries.len() }),
        Node::MapDirectory { number, pointers } => json!({
            "node": "map_directory", "number": number,
            "pointers": pointers.iter().filter(|pointer| !pointer.is_null()).count(),
        }),
        Node::File { slot, inode, .. } => {
            json!({ "node": "file", "slot": slot, "ino": inode.ino, "size": inode.size, "nlink": inode.nlink })
        }
        Node::Index { ino, version, level, number, pointers } => json!({
            "node": "index", "ino": ino, "version": version, "level": level, "number": number,
            "pointers": pointers.iter().filter(|pointer| !pointer.is_null()).count(),
        }),
    }
}

fn print_zones(zones: &Value) {
    println!(
        "{:>6} {:<12} {:>8} {:>8} {:<11} {:>12} {:>6} {:>4}",
        "zone", "state", "wp", "capacity", "role", "valid_bytes", "erases", "bad"
    );
    for zone in zones.as_array().into_iter().flatten() {
        let text = |name: &str| zone[name].as_str().unwrap_or("-").to_string();
        let number = |name: &str| zone[name].as_u64().map_or("-".to_string(), |value| value.to_string());
        println!(
            "{:>6} {:<12} {:>8} {:>8} {:<11} {:>12} {:>6} {:>4}",
            number("zone"),
            text("state"),
            number("write_pointer"),
            number("capacity"),
            text("role"),
            number("valid_bytes"),
            number("erase_count"),
            number("bad_blocks")
        );
    }
}

/// Prints a JSON value as indented `name: value` lines.
fn print_text(value: &Value, indent: usize) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                match field {
                    Value::Object(_) => {
                        println!("{:indent$}{name}:", "");
                        print_text(field, indent + 2);
                    }
                    Value::Array(items) if items.iter().any(Value::is_object) => {
                        println!("{:indent$}{name}:", "");
                        for item in items {
                            println!("{:indent$}  {item}", "");
                        }
                    }
                    _ => println!("{:indent$}{name}: {field}", ""),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                println!("{:indent$}{item}", "");
            }
        }
        other => println!("{:indent$}{other}", ""),
    }
}

pub fn inspect(arguments: InspectArguments) -> Outcome<ExitCode> {
    if arguments.address.is_some() && arguments.what != Some(What::Page) {
        fail!("an address goes only with `inspect IMAGE page ADDRESS`");
    }
    let value = match arguments.what {
        Some(What::Geometry) => geometry(&arguments)?,
        Some(What::Page) => page(&arguments)?,
        Some(what) => {
            let volume = volume(&arguments)?;
            match what {
                What::Superblock => superblock(&volume),
                What::Checkpoint => checkpoint(&volume),
                What::Zones => zones(&volume),
                What::Wear => wear(&volume),
                What::Geometry | What::Page => unreachable!("handled above"),
            }
        }
        None => {
            let geometry = geometry(&arguments)?;
            let volume = volume(&arguments)?;
            json!({
                "geometry": geometry,
                "superblock": superblock(&volume),
                "checkpoint": checkpoint(&volume),
                "wear": wear(&volume),
            })
        }
    };
    if arguments.json {
        println!("{value}");
    } else if arguments.what == Some(What::Zones) {
        print_zones(&value);
    } else {
        print_text(&value, 0);
    }
    Ok(ExitCode::SUCCESS)
}
