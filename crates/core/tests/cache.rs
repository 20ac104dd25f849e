//! The page cache against a model: the byte bound always holds, no dirty
//! page is ever dropped (it is returned for write-back), lookups see the
//! latest value, and victims go least recently used first.

use std::collections::BTreeMap;

use flintfs_core::{Dirty, PageCache};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Operation {
    Insert { key: u8, value: u32, bytes: usize, dirty: bool },
    Get { key: u8 },
    Modify { key: u8, value: u32 },
    Clean { key: u8 },
    Remove { key: u8 },
    Recharge { key: u8, bytes: usize },
    PopOldestClean,
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        4 => (0u8..24, any::<u32>(), 1usize..300, any::<bool>())
            .prop_map(|(key, value, bytes, dirty)| Operation::Insert { key, value, bytes, dirty }),
        3 => (0u8..24).prop_map(|key| Operation::Get { key }),
        2 => (0u8..24, any::<u32>()).prop_map(|(key, value)| Operation::Modify { key, value }),
        1 => (0u8..24).prop_map(|key| Operation::Clean { key }),
        1 => (0u8..24).prop_map(|key| Operation::Remove { key }),
        // Up to the whole capacity: a page that grows to fill the cache
        // pushes every other page out, and stays.
        2 => (0u8..24, prop_oneof![1usize..300, 900usize..=1000])
            .prop_map(|(key, bytes)| Operation::Recharge { key, bytes }),
        1 => Just(Operation::PopOldestClean),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_cache_agrees_with_its_model(operations in proptest::collection::vec(operation(), 1..400)) {
        const CAPACITY: usize = 1000;
        let mut cache: PageCache<u8, u32> = PageCache::new(CAPACITY);
        // The model: the value of every page as the file system knows it,
        // whether cached or written home, and whether home is current.
        let mut latest: BTreeMap<u8, u32> = BTreeMap::new();
        let mut home: BTreeMap<u8, u32> = BTreeMap::new();
        let mut recency: Vec<u8> = Vec::new();
        // What each page was last charged.
        let mut charged: BTreeMap<u8, usize> = BTreeMap::new();
        for operation in operations {
            match operation {
                Operation::Insert { key, value, bytes, dirty } => {
                    // A clean insert is a fetch: its value is the home copy.
                    let value = if dirty { value } else { *home.entry(key).or_insert(value) };
                    let dirty_flags = if dirty { Dirty::BOTH } else { Dirty::CLEAN };
                    let was_dirty = cache.dirty(key).is_some_and(Dirty::any);
                    if !dirty && was_dirty {
                        continue; // the engine never fetches over a dirty cached page
                    }
                    latest.insert(key, value);
                    recency.retain(|&other| other != key);
                    let evicted = cache.insert(key, value, bytes, dirty_flags);
                    charged.insert(key, bytes);
                    recency.push(key);
                    for victim in evicted {
                        prop_assert!(victim.dirty.any(), "only dirty victims come back");
                        prop_assert_eq!(Some(&victim.value), latest.get(&victim.key), "a victim carries its latest value");
                        home.insert(victim.key, victim.value);
                    }
                    recency.retain(|&other| cache.contains(other));
                }
                Operation::Get { key } => {
                    if let Some(value) = cache.get(key) {
                        prop_assert_eq!(Some(value), latest.get(&key));
                        recency.retain(|&other| other != key);
                        recency.push(key);
                    }
                }
                Operation::Modify { key, value } => {
                    if let Some(slot) = cache.get_mut(key) {
                        *slot = value;
                        latest.insert(key, value);
                        prop_assert_eq!(cache.dirty(key), Some(Dirty::BOTH));
                        recency.retain(|&other| other != key);
                        recency.push(key);
                    }
                }
                Operation::Clean { key } => {
                    // Written home and logged: both flags clear.
                    if let Some(value) = cache.get(key).copied() {
                        home.insert(key, value);
                        cache.clear_dirty(key, Dirty::BOTH);
                        recency.retain(|&other| other != key);
                        recency.push(key);
                    }
                }
                Operation::Recharge { key, bytes } => {
                    // A page that changed size in place: it stays, becomes
                    // the most recent, and others make room for it.
                    if cache.contains(key) {
                        let evicted = cache.recharge(key, bytes);
                        prop_assert!(cache.contains(key), "a recharged page stays");
                        charged.insert(key, bytes);
                        recency.retain(|&other| other != key);
                        recency.push(key);
                        let mut victims = Vec::new();
                        for victim in evicted {
                            prop_assert!(victim.dirty.any(), "only dirty victims come back");
                            prop_assert_eq!(
                                Some(&victim.value),
                                latest.get(&victim.key),
                                "a victim carries its latest value"
                            );
                            home.insert(victim.key, victim.value);
                            victims.push(victim.key);
                        }
                        // Victims leave least recent first.
                        let order: Vec<u8> = recency.iter().copied().filter(|other| victims.contains(other)).collect();
                        prop_assert_eq!(victims, order);
                        recency.retain(|&other| cache.contains(other));
                    } else {
                        prop_assert!(cache.recharge(key, bytes).is_empty());
                    }
                }
                Operation::PopOldestClean => {
                    // Only the least recent page goes, and only clean: its
                    // value is then the one at home.
                    let oldest = recency.first().copied();
                    let oldest_dirty = oldest.is_some_and(|key| cache.dirty(key).is_some_and(Dirty::any));
                    match cache.pop_oldest_clean() {
                        Some((key, value)) => {
                            prop_assert_eq!(Some(key), oldest, "the least recent page goes");
                            prop_assert!(!oldest_dirty, "a dirty page never goes without its write-back");
                            prop_assert_eq!(Some(&value), latest.get(&key));
                            prop_assert_eq!(home.get(&key), Some(&value), "a clean page is current at home");
                            prop_assert!(!cache.contains(key));
                            recency.remove(0);
                        }
                        None => prop_assert!(oldest.is_none() || oldest_dirty, "a clean least recent page stays"),
                    }
                }
                Operation::Remove { key } => {
                    if let Some((value, dirty)) = cache.remove(key) {
                        if dirty.any() {
                            home.insert(key, value);
                        }
                        recency.retain(|&other| other != key);
                    }
                }
            }
            prop_assert!(cache.used_bytes() <= CAPACITY);
            let cached_bytes: usize =
                charged.iter().filter(|(key, _)| cache.contains(**key)).map(|(_, bytes)| bytes).sum();
            prop_assert_eq!(cache.used_bytes(), cached_bytes, "the bound counts each page at its last charge");
            // No page is ever lost: what is not cached is current at home.
            for (key, value) in &latest {
                if !cache.contains(*key) {
                    prop_assert_eq!(home.get(key), Some(value), "page {} lost", key);
                }
            }
            prop_assert_eq!(recency.len(), cache.len());
        }
    }
}

#[test]
fn victims_leave_least_recently_used_first() {
    let mut cache: PageCache<u32, &str> = PageCache::new(30);
    for key in 0..3 {
        assert!(cache.insert(key, "page", 10, Dirty::BOTH).is_empty());
    }
    cache.get(0); // 1 is now the least recent
    let evicted = cache.insert(3, "new", 10, Dirty::CLEAN);
    assert_eq!(evicted.len(), 1);
    assert_eq!(evicted[0].key, 1);
    assert!(cache.contains(0) && cache.contains(2) && cache.contains(3));
    assert_eq!(cache.dirty_keys(Dirty { persistence: false, checkpoint: true }), vec![0, 2]);
    cache.clear_dirty(0, Dirty { persistence: true, checkpoint: false });
    assert_eq!(cache.dirty(0), Some(Dirty { persistence: false, checkpoint: true }));
    // A clean page is dropped silently when pushed out.
    let evicted = cache.insert(4, "another", 25, Dirty::CLEAN);
    assert!(evicted.iter().all(|victim| victim.dirty.any()));
    assert!(!cache.contains(3));
}
