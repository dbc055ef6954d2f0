//! Model-based test of partial (secondary) prefix-cache keys: random
//! sequences of allocations, frees, full and partial caching, copy-on-write
//! moves, evictions and resets drive the real `BlockPool` and a naive model
//! written after vLLM 0.33.0's pool (a primary key with its token count per
//! block, a per-block list of secondary keys, a key -> blocks map in
//! insertion order). Both must accept or refuse alike and agree on the free
//! queue, every lookup, the cached mask and the event stream;
//! `check_invariants()` runs after every operation.

use kvcoord_core::events::KvEvent;
use kvcoord_core::{BlockHash, BlockId, BlockPool, GroupId, PoolConfig};
use proptest::prelude::*;

const N: usize = 10;
/// Hash units per block of the cached groups (hash unit = 1 token).
const SCALE: usize = 2;
const HASHES: u8 = 6;
const GROUPS: u32 = 2;

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    FreeOwner(usize),
    CacheFull {
        owner: usize,
        num_cached: usize,
        num_full: usize,
        group: u32,
    },
    CachePartial {
        owner: usize,
        pos: usize,
        units: usize,
        group: u32,
        replace: bool,
    },
    Move {
        owner: usize,
        pos: usize,
    },
    Evict(Vec<u32>),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..4).prop_map(Op::Get),
        2 => (0usize..6).prop_map(Op::FreeOwner),
        3 => (0usize..6, 0usize..3, 0usize..4, 0..GROUPS).prop_map(|(owner, num_cached, num_full, group)| {
            Op::CacheFull { owner, num_cached, num_full, group }
        }),
        4 => (0usize..6, 0usize..4, 0usize..9, 0..GROUPS, proptest::bool::weighted(0.2)).prop_map(
            |(owner, pos, units, group, replace)| Op::CachePartial { owner, pos, units, group, replace }
        ),
        2 => (0usize..6, 0usize..4).prop_map(|(owner, pos)| Op::Move { owner, pos }),
        1 => proptest::collection::vec(0u32..N as u32, 0..3).prop_map(Op::Evict),
        1 => Just(Op::Reset),
    ]
}

type Key = (u8, u32);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Stored(Vec<u8>, Option<u8>),
    Removed(Key),
    Cleared,
}

/// vLLM's pool, naively.
struct Model {
    free: Vec<u32>,
    refs: Vec<u32>,
    /// Primary key and its token count.
    primary: Vec<Option<(Key, usize)>>,
    secondary: Vec<Vec<Key>>,
    map: Vec<(Key, Vec<u32>)>,
    events: Vec<Ev>,
}

impl Model {
    fn new() -> Self {
        Self {
            free: (1..N as u32).collect(),
            refs: vec![0; N],
            primary: vec![None; N],
            secondary: vec![Vec::new(); N],
            map: Vec::new(),
            events: Vec::new(),
        }
    }

    fn contains(&self, k: Key, b: u32) -> bool {
        self.map.iter().any(|(kk, v)| *kk == k && v.contains(&b))
    }

    fn remove_all(&mut self, b: u32) -> Vec<Key> {
        let mut keys: Vec<Key> = self.primary[b as usize]
            .take()
            .map(|(k, _)| k)
            .into_iter()
            .collect();
        keys.append(&mut self.secondary[b as usize]);
        for &k in &keys {
            let pos = self.map.iter().position(|(kk, _)| *kk == k).unwrap();
            self.map[pos].1.retain(|&x| x != b);
            if self.map[pos].1.is_empty() {
                self.map.remove(pos);
            }
        }
        keys
    }

    fn remove_reported(&mut self, b: u32) {
        for k in self.remove_all(b) {
            self.events.push(Ev::Removed(k));
        }
    }

    fn insert(&mut self, k: Key, b: u32, tokens: usize) {
        if self.primary[b as usize].map(|(kk, _)| kk) == Some(k) || self.contains(k, b) {
            return;
        }
        if self.primary[b as usize].is_none() {
            self.primary[b as usize] = Some((k, tokens));
        } else {
            self.secondary[b as usize].push(k);
        }
        match self.map.iter_mut().find(|(kk, _)| *kk == k) {
            Some((_, v)) => v.push(b),
            None => self.map.push((k, vec![b])),
        }
    }

    fn get(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let out: Vec<u32> = self.free.drain(..n).collect();
        for &b in &out {
            self.remove_reported(b);
            self.refs[b as usize] = 1;
        }
        Some(out)
    }

    fn free(&mut self, ids: &[u32]) {
        let (mut front, mut back) = (Vec::new(), Vec::new());
        for &b in ids {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                if self.primary[b as usize].is_some() {
                    back.push(b);
                } else {
                    front.push(b);
                }
            }
        }
        front.append(&mut self.free);
        front.extend(back);
        self.free = front;
    }

    fn cache_full(&mut self, ids: &[u32], hashes: &[u8], nc: usize, nf: usize, g: u32) -> bool {
        if nc >= nf {
            return true;
        }
        if nf > ids.len() || nf > hashes.len() / SCALE {
            return false;
        }
        for (i, &b) in ids.iter().enumerate().take(nf).skip(nc) {
            if let Some((_, t)) = self.primary[b as usize] {
                // vLLM asserts that only a partial -> full promotion meets a key.
                if t >= (i + 1) * SCALE {
                    return false;
                }
            }
        }
        let mut stored = Vec::new();
        for i in nc..nf {
            let b = ids[i];
            let h = hashes[(i + 1) * SCALE - 1];
            if self.primary[b as usize].is_some() {
                self.remove_reported(b);
            }
            self.insert((h, g), b, (i + 1) * SCALE);
            stored.push(h);
        }
        let parent = nc.checked_sub(1).map(|i| hashes[(i + 1) * SCALE - 1]);
        self.events.push(Ev::Stored(stored, parent));
        true
    }

    fn cache_partial(
        &mut self,
        b: u32,
        hashes: &[u8],
        units: usize,
        g: u32,
        replace: bool,
    ) -> bool {
        if units == 0 || units > hashes.len() {
            return false;
        }
        let k = (hashes[units - 1], g);
        let mut already =
            self.primary[b as usize].map(|(kk, _)| kk) == Some(k) || self.contains(k, b);
        if replace {
            self.remove_reported(b);
            already = false;
        } else if !already && self.primary[b as usize].is_some_and(|(_, t)| t < units) {
            self.remove_reported(b);
        }
        self.insert(k, b, units);
        if !already {
            let parent = units.checked_sub(2).map(|i| hashes[i]);
            self.events.push(Ev::Stored(vec![k.0], parent));
        }
        true
    }

    fn move_keys(&mut self, src: u32, dst: u32) {
        let tokens = self.primary[src as usize].map_or(0, |(_, t)| t);
        for k in self.remove_all(src) {
            self.insert(k, dst, tokens);
        }
    }

    fn lookup(&self, k: Key) -> Option<u32> {
        self.map.iter().find(|(kk, _)| *kk == k).map(|(_, v)| v[0])
    }
}

fn hash(n: u8) -> BlockHash {
    BlockHash::from_slice(&[n; 32]).unwrap()
}

fn bids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&b| BlockId(b)).collect()
}

fn real_events(pool: &mut BlockPool) -> Vec<Ev> {
    let byte = |h: &BlockHash| h.as_bytes()[0];
    pool.take_events()
        .into_iter()
        .map(|e| match e {
            KvEvent::BlockStored(s) => Ev::Stored(
                s.block_hashes.iter().map(byte).collect(),
                s.parent_block_hash.as_ref().map(byte),
            ),
            KvEvent::BlockRemoved {
                block_hash, group, ..
            } => Ev::Removed((byte(&block_hash), group.0)),
            KvEvent::AllBlocksCleared => Ev::Cleared,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn partial_keys_match_vllms_pool(
        ops in proptest::collection::vec(op(), 1..60),
        unit_hashes in proptest::collection::vec(0..HASHES, 8),
    ) {
        let mut config = PoolConfig::new(N);
        config.hash_block_size = 1;
        config.enable_events = true;
        let mut pool = BlockPool::new(config).unwrap();
        let hs: Vec<BlockHash> = unit_hashes.iter().map(|&h| hash(h)).collect();
        let mut model = Model::new();
        // Each owner holds its blocks at table positions 0.. (one reference
        // each); copies made by a move are owners that are only freed (in
        // vLLM a copy sits at its source's table position).
        let mut owners: Vec<Vec<u32>> = Vec::new();
        let mut copies: Vec<u32> = Vec::new();
        for op in ops {
            match op {
                Op::Get(n) => {
                    let mut out = Vec::new();
                    let real = pool.get_new_blocks(n, &mut out).map(|()| out.iter().map(|b| b.0).collect::<Vec<_>>());
                    let want = model.get(n);
                    prop_assert_eq!(real.as_ref().ok(), want.as_ref());
                    if let Some(v) = want { if !v.is_empty() { owners.push(v); } }
                }
                Op::FreeOwner(i) => {
                    if i >= owners.len() && !copies.is_empty() {
                        let b = copies.remove(i % copies.len());
                        pool.free_blocks(&[BlockId(b)]).unwrap();
                        model.free(&[b]);
                    } else if i < owners.len() {
                        let mut v = owners.remove(i);
                        v.reverse();
                        pool.free_blocks(&bids(&v)).unwrap();
                        model.free(&v);
                    }
                }
                Op::CacheFull { owner, num_cached, num_full, group } => {
                    if let Some(ids) = owners.get(owner).cloned() {
                        let real = pool.cache_full_blocks_scaled(&bids(&ids), &hs, SCALE, num_cached, num_full, GroupId(group), None);
                        let want = model.cache_full(&ids, &unit_hashes, num_cached, num_full, group);
                        prop_assert_eq!(real.is_ok(), want);
                    }
                }
                Op::CachePartial { owner, pos, units, group, replace } => {
                    if let Some(&b) = owners.get(owner).and_then(|o| o.get(pos)) {
                        let real = pool.cache_partial_block(BlockId(b), &hs, units, (pos + 1) * SCALE, GroupId(group), replace);
                        let want = model.cache_partial(b, &unit_hashes, units, group, replace);
                        prop_assert_eq!(real.is_ok(), want);
                        if let Ok(k) = real {
                            prop_assert_eq!(k.map(|k| (k.hash.as_bytes()[0], k.group.0)), Some((unit_hashes[units - 1], group)));
                        }
                    }
                }
                Op::Move { owner, pos } => {
                    if let Some(&src) = owners.get(owner).and_then(|o| o.get(pos)) {
                        let mut out = Vec::new();
                        if pool.get_new_blocks(1, &mut out).is_ok() {
                            let dst = model.get(1).unwrap()[0];
                            prop_assert_eq!(out[0].0, dst);
                            pool.move_block_keys(BlockId(src), BlockId(dst)).unwrap();
                            model.move_keys(src, dst);
                            copies.push(dst);
                        } else {
                            prop_assert!(model.get(1).is_none());
                        }
                    }
                }
                Op::Evict(ids) => {
                    pool.evict_blocks(&bids(&ids)).unwrap();
                    for b in ids { model.remove_reported(b); }
                }
                Op::Reset => {
                    let want = N - model.free.len() == 1;
                    prop_assert_eq!(pool.reset_prefix_cache(), want);
                    if want {
                        for b in 0..N as u32 { model.remove_all(b); }
                        model.events.push(Ev::Cleared);
                    }
                }
            }
            pool.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(real_events(&mut pool), std::mem::take(&mut model.events));
            prop_assert_eq!(pool.free_block_ids().map(|b| b.0).collect::<Vec<_>>(), model.free.clone());
            let mask: Vec<bool> = (0..N).map(|b| model.primary[b].is_some()).collect();
            prop_assert_eq!(pool.cached_mask().collect::<Vec<_>>(), mask);
            prop_assert_eq!(pool.num_cached_keys(), model.map.len());
            for h in 0..HASHES {
                for g in 0..GROUPS {
                    prop_assert_eq!(pool.lookup(&hash(h), GroupId(g)).map(|b| b.0), model.lookup((h, g)));
                }
            }
            for b in 1..N as u32 {
                let keys: Vec<Key> = pool.cache_keys(BlockId(b)).unwrap().iter().map(|(k, _)| (k.hash.as_bytes()[0], k.group.0)).collect();
                let want: Vec<Key> = model.primary[b as usize].map(|(k, _)| k).into_iter().chain(model.secondary[b as usize].iter().copied()).collect();
                prop_assert_eq!(keys, want);
            }
        }
    }
}
