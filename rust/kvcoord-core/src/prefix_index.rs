//! The prefix index: `(block hash, group id) -> cached block(s)`.
//!
//! vLLM does not de-duplicate identical full blocks (a running request keeps
//! writing its own block so its table stays append-only), so one key can map
//! to several blocks. Lookups return the earliest inserted one. Each cached
//! block has exactly one key, and the pool remembers it as a `u32` slot so a
//! block can be dropped from the index without re-hashing anything.
//!
//! # Implementation
//!
//! Entries live in a slab (`entries`, recycled through `free_slots`); a
//! `hashbrown::HashTable<u32>` maps a key to its slot. The key is stored once,
//! in the slab entry. The table's hasher is seeded per process, so callers
//! cannot pick digests that all land in one probe sequence.

use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::{hash_table, HashTable};
use smallvec::SmallVec;

use crate::block_hash::BlockHash;
use crate::ids::{BlockId, GroupId};

/// Slot of an entry in the index; stable while the entry exists.
pub type KeySlot = u32;

/// A prefix-cache key: a block hash salted with the group it was cached for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    /// The block's chained hash.
    pub hash: BlockHash,
    /// The KV-cache group.
    pub group: GroupId,
}

impl Hash for CacheKey {
    /// Fold every digest word and the group into one `u64` and hand that to
    /// the table's seeded hasher (one multiply). Digests are already uniform,
    /// so the byte-wise hashing a derive would do buys nothing but time on
    /// the lookup path; the per-process seed still keeps probe sequences
    /// unpredictable.
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        let mut acc = (u64::from(self.group.0) << 8) | self.hash.len() as u64;
        for word in self.hash.as_bytes().chunks_exact(8) {
            let w = u64::from_le_bytes(word.try_into().expect("8-byte chunk"));
            acc = acc.rotate_left(29) ^ w;
        }
        state.write_u64(acc);
    }
}

/// Exactly one cache line (40-byte key, 24-byte block list), aligned to one:
/// a lookup's key compare and the `blocks[0]` it returns then cost one miss,
/// where a slab at the allocator's 16-byte offset split every entry over two
/// lines.
#[derive(Clone, Debug)]
#[repr(align(64))]
struct Entry {
    key: CacheKey,
    /// Blocks cached under `key`, in insertion order. Invariant: non-empty
    /// while the entry is live; empty exactly when its slot is in `free_slots`.
    blocks: SmallVec<[BlockId; 2]>,
}

/// Map from cache key to the blocks cached under it.
#[derive(Clone, Debug)]
pub struct PrefixIndex {
    /// Key -> slot in `entries`. Invariant: holds exactly the live slots.
    table: HashTable<KeySlot>,
    entries: Vec<Entry>,
    free_slots: Vec<KeySlot>,
    hasher: foldhash::fast::RandomState,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            table: HashTable::new(),
            entries: Vec::new(),
            free_slots: Vec::new(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is cached.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn find_slot(&self, key: &CacheKey) -> Option<KeySlot> {
        let h = self.hasher.hash_one(key);
        let entries = &self.entries;
        self.table
            .find(h, |&slot| entries[slot as usize].key == *key)
            .copied()
    }

    /// The earliest-inserted block cached under `key`.
    #[inline]
    pub fn get_one(&self, key: &CacheKey) -> Option<BlockId> {
        self.find_slot(key)
            .map(|slot| self.entries[slot as usize].blocks[0])
    }

    /// Cache `block` under `key` and return the entry's slot. The caller
    /// guarantees `block` is not already cached under any key.
    ///
    /// # Panics
    /// After 2^32 distinct live keys (more than any pool can hold).
    pub fn insert(&mut self, key: CacheKey, block: BlockId) -> KeySlot {
        let Self {
            table,
            entries,
            free_slots,
            hasher,
        } = self;
        let h = hasher.hash_one(key);
        // One probe finds the key or the place for it.
        let live = &*entries;
        let found = table.entry(
            h,
            |&s| live[s as usize].key == key,
            |&s| hasher.hash_one(live[s as usize].key),
        );
        match found {
            hash_table::Entry::Occupied(occupied) => {
                let slot = *occupied.get();
                entries[slot as usize].blocks.push(block);
                slot
            }
            hash_table::Entry::Vacant(vacant) => {
                let slot = if let Some(slot) = free_slots.pop() {
                    let e = &mut entries[slot as usize];
                    e.key = key;
                    e.blocks.push(block);
                    slot
                } else {
                    let slot =
                        KeySlot::try_from(entries.len()).expect("fewer than 2^32 cached keys");
                    let mut blocks = SmallVec::new();
                    blocks.push(block);
                    entries.push(Entry { key, blocks });
                    slot
                };
                vacant.insert(slot);
                slot
            }
        }
    }

    /// Remove `block` from the entry at `slot`; returns the entry's key when
    /// this removed the key altogether (no block left under it).
    ///
    /// # Panics
    /// If `block` is not cached at `slot` (the pool's invariant guarantees it).
    pub fn remove(&mut self, slot: KeySlot, block: BlockId) -> Option<CacheKey> {
        let entry = &mut self.entries[slot as usize];
        let pos = entry
            .blocks
            .iter()
            .position(|&b| b == block)
            .expect("block cached at slot");
        entry.blocks.remove(pos);
        if !entry.blocks.is_empty() {
            return None;
        }
        let key = entry.key;
        let h = self.hasher.hash_one(key);
        self.table
            .find_entry(h, |&s| s == slot)
            .expect("live slot is in the table")
            .remove();
        self.free_slots.push(slot);
        Some(key)
    }

    /// The slot of `key`'s entry, if the key is cached.
    pub fn slot_of(&self, key: &CacheKey) -> Option<KeySlot> {
        self.find_slot(key)
    }

    /// Number of (key, block) pairs: every block listed under every key.
    pub fn num_pairs(&self) -> usize {
        self.table
            .iter()
            .map(|&s| self.entries[s as usize].blocks.len())
            .sum()
    }

    /// The key of a live entry.
    pub fn key_at(&self, slot: KeySlot) -> CacheKey {
        self.entries[slot as usize].key
    }

    /// Whether the live entry at `slot` lists `block`.
    pub fn slot_holds(&self, slot: KeySlot, block: BlockId) -> bool {
        self.entries
            .get(slot as usize)
            .is_some_and(|e| e.blocks.contains(&block))
    }

    /// Drop every key.
    pub fn clear(&mut self) {
        self.table.clear();
        self.entries.clear();
        self.free_slots.clear();
    }

    /// Check that the table, slab and free list agree; `Err` describes the
    /// first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let live = self.entries.iter().filter(|e| !e.blocks.is_empty()).count();
        if live != self.table.len() {
            return Err(format!(
                "{live} live entries but {} keys in the table",
                self.table.len()
            ));
        }
        if live + self.free_slots.len() != self.entries.len() {
            return Err("free slot list out of step with the slab".into());
        }
        for &slot in &self.table {
            let e = &self.entries[slot as usize];
            if e.blocks.is_empty() {
                return Err(format!("table points at free slot {slot}"));
            }
            if self.find_slot(&e.key) != Some(slot) {
                return Err(format!("key at slot {slot} does not find itself"));
            }
        }
        Ok(())
    }

    /// Approximate heap bytes held by the index.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.table.capacity() * (std::mem::size_of::<KeySlot>() + 1)
            + self.free_slots.capacity() * std::mem::size_of::<KeySlot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8, group: u32) -> CacheKey {
        CacheKey {
            hash: BlockHash::from_slice(&[n; 32]).unwrap(),
            group: GroupId(group),
        }
    }

    #[test]
    fn one_block_per_key() {
        let mut ix = PrefixIndex::new();
        let s0 = ix.insert(key(0, 0), BlockId(10));
        let s1 = ix.insert(key(1, 0), BlockId(11));
        assert_eq!(ix.get_one(&key(0, 0)), Some(BlockId(10)));
        assert_eq!(ix.get_one(&key(0, 1)), None, "group salts the key");
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.remove(s0, BlockId(10)), Some(key(0, 0)));
        assert_eq!(ix.get_one(&key(0, 0)), None);
        assert_eq!(ix.remove(s1, BlockId(11)), Some(key(1, 0)));
        assert!(ix.is_empty());
        ix.check_invariants().unwrap();
    }

    #[test]
    fn duplicates_keep_insertion_order() {
        let mut ix = PrefixIndex::new();
        let s = ix.insert(key(0, 0), BlockId(1));
        assert_eq!(ix.insert(key(0, 0), BlockId(2)), s);
        ix.insert(key(0, 0), BlockId(3));
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.remove(s, BlockId(1)), None);
        assert_eq!(ix.get_one(&key(0, 0)), Some(BlockId(2)));
        assert_eq!(ix.remove(s, BlockId(3)), None);
        assert_eq!(ix.get_one(&key(0, 0)), Some(BlockId(2)));
        assert_eq!(ix.remove(s, BlockId(2)), Some(key(0, 0)));
        ix.check_invariants().unwrap();
    }

    #[test]
    fn slots_are_recycled() {
        let mut ix = PrefixIndex::new();
        let s = ix.insert(key(5, 1), BlockId(1));
        ix.remove(s, BlockId(1));
        let t = ix.insert(key(6, 1), BlockId(2));
        assert_eq!(s, t);
        assert!(ix.slot_holds(t, BlockId(2)));
        ix.check_invariants().unwrap();
    }
}
