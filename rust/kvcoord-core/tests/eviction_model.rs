//! Model-based tests of the built-in eviction policies: random operation
//! sequences drive a real `BlockPool` under each policy and a naive reference
//! (one `Vec` per level, eager aging, linear scans) in lockstep. Both must
//! accept or refuse each operation alike and hand out the same ids; after
//! every operation `check_invariants()` must hold and the free queue, the
//! reference counts, the cached set and the free count must match. The
//! free-count accounting is LRU's: every unreferenced block is free.

use kvcoord_core::{BlockHash, BlockId, BlockPool, EvictionConfig, GroupId, PoolConfig};
use proptest::prelude::*;

const N: usize = 10;

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    Free(Vec<u32>),
    FreeOwner(usize),
    Touch(Vec<u32>),
    /// A prefix hit on all of an owner's blocks, held by a new owner.
    TouchOwner(usize),
    Cache {
        owner: usize,
        num_cached: usize,
        num_full: usize,
        hashes: Vec<u8>,
        mask: Option<Vec<bool>>,
    },
    Evict(Vec<u32>),
    Reset,
    Priority(Vec<u32>, u8),
    Clock(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let ids = proptest::collection::vec(0u32..(N as u32 + 1), 0..4);
    prop_oneof![
        4 => (0usize..N + 1).prop_map(Op::Get),
        1 => ids.clone().prop_map(Op::Free),
        3 => (0usize..8).prop_map(Op::FreeOwner),
        1 => ids.clone().prop_map(Op::Touch),
        4 => (0usize..8).prop_map(Op::TouchOwner),
        4 => (0usize..8, 0usize..5, 0usize..6, proptest::collection::vec(0u8..6, 6),
              proptest::option::of(proptest::collection::vec(any::<bool>(), 0..5)))
            .prop_map(|(owner, num_cached, num_full, hashes, mask)| Op::Cache {
                owner, num_cached, num_full, hashes, mask
            }),
        1 => ids.clone().prop_map(Op::Evict),
        1 => Just(Op::Reset),
        2 => (ids, 0u8..10).prop_map(|(ids, p)| Op::Priority(ids, p)),
        2 => (0u32..4).prop_map(Op::Clock),
    ]
}

/// The reference: policy state kept eagerly, levels as plain vectors.
struct Model {
    policy: EvictionConfig,
    levels: Vec<Vec<u32>>,
    refs: Vec<u32>,
    /// Cache key per block: (hash, group).
    key: Vec<Option<u8>>,
    /// Index: key -> blocks in insertion order.
    index: Vec<(u8, Vec<u32>)>,
    /// LFU: current use count; depth: level at release; priority: priority.
    state: Vec<u32>,
    /// Priority: expiry tick per block.
    expiry: Vec<u32>,
    half_life: usize,
    handed_out: usize,
    now: u32,
}

impl Model {
    fn new(policy: EvictionConfig) -> Self {
        let (num_levels, half_life) = match policy {
            EvictionConfig::Lru => (1, 0),
            EvictionConfig::Lfu { half_life } => (8, half_life as usize),
            EvictionConfig::PrefixDepth { half_life } => (16, half_life as usize),
            EvictionConfig::Priority { .. } => (8, 0),
        };
        let mut levels = vec![Vec::new(); num_levels];
        levels[0] = (1..N as u32).collect();
        Self {
            policy,
            levels,
            refs: vec![0; N],
            key: vec![None; N],
            index: Vec::new(),
            state: vec![0; N],
            expiry: vec![0; N],
            half_life,
            handed_out: 0,
            now: 0,
        }
    }

    fn free_len(&self) -> usize {
        self.levels.iter().map(Vec::len).sum()
    }

    fn queue(&self) -> Vec<u32> {
        self.levels.concat()
    }

    fn drop_key(&mut self, b: u32) {
        if let Some(k) = self.key[b as usize].take() {
            let pos = self.index.iter().position(|(kk, _)| *kk == k).unwrap();
            self.index[pos].1.retain(|&x| x != b);
            if self.index[pos].1.is_empty() {
                self.index.remove(pos);
            }
        }
    }

    /// Every free block one level down; level 1 behind level 0.
    fn age(&mut self) {
        let one = std::mem::take(&mut self.levels[1]);
        self.levels[0].extend(one);
        self.levels[1..].rotate_left(1);
        if let EvictionConfig::Lfu { .. } = self.policy {
            for c in &mut self.state {
                *c >>= 1;
            }
        }
    }

    fn get(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free_len() {
            return None;
        }
        let mut out = Vec::new();
        for level in &mut self.levels {
            let k = (n - out.len()).min(level.len());
            out.extend(level.drain(..k));
        }
        for &b in &out {
            self.drop_key(b);
            self.refs[b as usize] = 1;
            match self.policy {
                EvictionConfig::Lfu { .. } => self.state[b as usize] = 1,
                EvictionConfig::Priority { .. } => self.state[b as usize] = 0,
                _ => {}
            }
        }
        if self.half_life > 0 {
            self.handed_out += n;
            while self.handed_out >= self.half_life {
                self.handed_out -= self.half_life;
                self.age();
            }
        }
        Some(out)
    }

    fn level_on_free(&mut self, b: u32) -> usize {
        let s = self.state[b as usize];
        match self.policy {
            EvictionConfig::Lru => 0,
            EvictionConfig::Lfu { .. } => (s.max(1).ilog2() as usize).min(7),
            EvictionConfig::PrefixDepth { .. } => s as usize,
            EvictionConfig::Priority { retention } => {
                if s == 0 || retention == 0 {
                    0
                } else {
                    self.expiry[b as usize] = self.now + retention;
                    s as usize
                }
            }
        }
    }

    fn free(&mut self, ids: &[u32]) -> bool {
        if ids.iter().any(|&b| b as usize >= N) {
            return false;
        }
        let mut need = [0u32; N];
        for &b in ids.iter().filter(|&&b| b != 0) {
            need[b as usize] += 1;
        }
        if (0..N).any(|b| need[b] > self.refs[b]) {
            return false;
        }
        let (mut front, mut back) = (Vec::new(), Vec::new());
        for &b in ids.iter().filter(|&&b| b != 0) {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                if self.key[b as usize].is_some() {
                    back.push(b);
                } else {
                    front.push(b);
                }
            }
        }
        front.append(&mut self.levels[0]);
        self.levels[0] = front;
        for b in back {
            let level = self.level_on_free(b);
            self.levels[level].push(b);
        }
        true
    }

    fn touch(&mut self, ids: &[u32]) -> bool {
        if ids.iter().any(|&b| b as usize >= N) {
            return false;
        }
        for &b in ids.iter().filter(|&&b| b != 0) {
            if self.refs[b as usize] == 0 {
                for level in &mut self.levels {
                    level.retain(|&x| x != b);
                }
            }
            self.refs[b as usize] += 1;
            if let EvictionConfig::Lfu { .. } = self.policy {
                self.state[b as usize] = (self.state[b as usize] + 1).min(255);
            }
        }
        true
    }

    fn cache(
        &mut self,
        ids: &[u32],
        hashes: &[u8],
        nc: usize,
        nf: usize,
        mask: Option<&[bool]>,
    ) -> bool {
        if nc >= nf {
            return true;
        }
        if nf > ids.len() || nf > hashes.len() || mask.is_some_and(|m| m.len() != nf - nc) {
            return false;
        }
        let chosen: Vec<(usize, u32)> = (nc..nf)
            .filter(|&i| ids[i] != 0 && mask.is_none_or(|m| m[i - nc]))
            .map(|i| (i, ids[i]))
            .collect();
        let mut seen = Vec::new();
        for &(_, b) in &chosen {
            if self.key[b as usize].is_some() || seen.contains(&b) {
                return false;
            }
            seen.push(b);
        }
        for (i, b) in chosen {
            let k = hashes[i];
            self.key[b as usize] = Some(k);
            match self.index.iter_mut().find(|(kk, _)| *kk == k) {
                Some((_, v)) => v.push(b),
                None => self.index.push((k, vec![b])),
            }
            if let EvictionConfig::PrefixDepth { .. } = self.policy {
                let depth = i as u32 + 1;
                self.state[b as usize] = 15 - depth.ilog2().min(15);
            }
        }
        true
    }

    fn set_priority(&mut self, ids: &[u32], p: u8) -> bool {
        if ids.iter().any(|&b| b as usize >= N) || p > 7 {
            return false;
        }
        if let EvictionConfig::Priority { .. } = self.policy {
            for &b in ids.iter().filter(|&&b| b != 0) {
                let s = &mut self.state[b as usize];
                *s = (*s).max(u32::from(p));
            }
        }
        true
    }

    fn clock(&mut self, ticks: u32) {
        self.now += ticks;
        if !matches!(self.policy, EvictionConfig::Priority { .. }) {
            return;
        }
        // Every expired protected block, in (expiry, level, position) order.
        let mut expired: Vec<(u32, usize, usize, u32)> = Vec::new();
        for (l, level) in self.levels.iter().enumerate().skip(1) {
            for (pos, &b) in level.iter().enumerate() {
                if self.expiry[b as usize] <= self.now {
                    expired.push((self.expiry[b as usize], l, pos, b));
                }
            }
        }
        expired.sort_unstable();
        for (_, l, _, b) in expired {
            self.levels[l].retain(|&x| x != b);
            self.levels[0].push(b);
            self.state[b as usize] = 0;
        }
    }
}

fn hash(n: u8) -> BlockHash {
    BlockHash::from_slice(&[n; 32]).unwrap()
}

fn bids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&b| BlockId(b)).collect()
}

/// `check_invariants()`, then the whole visible state against the model.
fn compare(pool: &BlockPool, model: &Model) -> Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(
        pool.free_block_ids().map(|b| b.0).collect::<Vec<_>>(),
        model.queue()
    );
    prop_assert_eq!(pool.num_free_blocks(), model.free_len());
    prop_assert_eq!(pool.ref_counts().collect::<Vec<_>>(), model.refs.clone());
    let mask: Vec<bool> = model.key.iter().map(Option::is_some).collect();
    prop_assert_eq!(pool.cached_mask().collect::<Vec<_>>(), mask);
    prop_assert_eq!(pool.num_cached_keys(), model.index.len());
    Ok(())
}

fn run(policy: EvictionConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut pool = BlockPool::with_eviction(PoolConfig::new(N), policy).unwrap();
    let mut model = Model::new(policy);
    let mut owners: Vec<Vec<u32>> = Vec::new();
    for op in ops {
        match op {
            Op::Get(n) => {
                let mut out = Vec::new();
                let real = pool
                    .get_new_blocks(n, &mut out)
                    .map(|()| out.iter().map(|b| b.0).collect::<Vec<_>>());
                let want = model.get(n);
                prop_assert_eq!(real.as_ref().ok(), want.as_ref());
                if let Some(v) = want {
                    if !v.is_empty() {
                        owners.push(v);
                    }
                }
            }
            Op::Free(ids) => {
                prop_assert_eq!(pool.free_blocks(&bids(&ids)).is_ok(), model.free(&ids));
            }
            Op::FreeOwner(i) => {
                if i < owners.len() {
                    let mut v = owners.remove(i);
                    v.reverse();
                    prop_assert_eq!(pool.free_blocks(&bids(&v)).is_ok(), model.free(&v));
                }
            }
            Op::Touch(ids) => {
                prop_assert_eq!(pool.touch(&bids(&ids)).is_ok(), model.touch(&ids));
                if !ids.is_empty() && ids.iter().all(|&b| (b as usize) < N) {
                    owners.push(ids);
                }
            }
            Op::TouchOwner(i) => {
                if let Some(ids) = owners.get(i).cloned() {
                    prop_assert_eq!(pool.touch(&bids(&ids)).is_ok(), model.touch(&ids));
                    owners.push(ids);
                }
            }
            Op::Cache {
                owner,
                num_cached,
                num_full,
                hashes,
                mask,
            } => {
                if let Some(ids) = owners.get(owner).cloned() {
                    let hs: Vec<BlockHash> = hashes.iter().map(|&h| hash(h)).collect();
                    let real = pool.cache_full_blocks(
                        &bids(&ids),
                        &hs,
                        num_cached,
                        num_full,
                        GroupId(0),
                        mask.as_deref(),
                    );
                    let want = model.cache(&ids, &hashes, num_cached, num_full, mask.as_deref());
                    prop_assert_eq!(real.is_ok(), want);
                }
            }
            Op::Evict(ids) => {
                let ok = ids.iter().all(|&b| (b as usize) < N);
                prop_assert_eq!(pool.evict_blocks(&bids(&ids)).is_ok(), ok);
                if ok {
                    for b in ids {
                        model.drop_key(b);
                    }
                }
            }
            Op::Reset => {
                let want = N - model.free_len() == 1;
                prop_assert_eq!(pool.reset_prefix_cache(), want);
                if want {
                    for b in 0..N as u32 {
                        model.drop_key(b);
                    }
                }
            }
            Op::Priority(ids, p) => {
                prop_assert_eq!(
                    pool.set_priority(&bids(&ids), i64::from(p)).is_ok(),
                    model.set_priority(&ids, p)
                );
            }
            Op::Clock(t) => {
                pool.advance_clock(i64::from(t)).unwrap();
                model.clock(t);
            }
        }
        compare(&pool, &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn lru_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(EvictionConfig::Lru, ops)?;
    }

    #[test]
    fn lfu_matches_model(ops in proptest::collection::vec(op(), 1..80), half_life in 1u32..40) {
        run(EvictionConfig::Lfu { half_life }, ops)?;
    }

    #[test]
    fn prefix_depth_matches_model(ops in proptest::collection::vec(op(), 1..80), half_life in 1u32..60) {
        run(EvictionConfig::PrefixDepth { half_life }, ops)?;
    }

    #[test]
    fn priority_matches_model(ops in proptest::collection::vec(op(), 1..80), retention in 0u32..5) {
        run(EvictionConfig::Priority { retention }, ops)?;
    }
}

/// Without hits, LFU is LRU: every count is 1.
#[test]
fn lfu_without_hits_is_lru() {
    let mut lru = BlockPool::new(PoolConfig::new(8)).unwrap();
    let mut lfu =
        BlockPool::with_eviction(PoolConfig::new(8), EvictionConfig::Lfu { half_life: 3 }).unwrap();
    for pool in [&mut lru, &mut lfu] {
        let mut a = Vec::new();
        pool.get_new_blocks(5, &mut a).unwrap();
        let hs: Vec<BlockHash> = (0..4).map(hash).collect();
        pool.cache_full_blocks(&a, &hs, 0, 4, GroupId(0), None)
            .unwrap();
        a.reverse();
        pool.free_blocks(&a).unwrap();
        let mut b = Vec::new();
        pool.get_new_blocks(4, &mut b).unwrap();
        b.reverse();
        pool.free_blocks(&b).unwrap();
    }
    assert_eq!(
        lru.free_block_ids().collect::<Vec<_>>(),
        lfu.free_block_ids().collect::<Vec<_>>()
    );
}

/// A worked example per policy, readable next to docs/eviction.md.
#[test]
fn worked_examples() {
    fn setup(policy: EvictionConfig) -> (BlockPool, Vec<BlockId>) {
        // Blocks 1..=4 cached as chain depths 1..=4 of one prompt.
        let mut pool = BlockPool::with_eviction(PoolConfig::new(8), policy).unwrap();
        let mut a = Vec::new();
        pool.get_new_blocks(4, &mut a).unwrap();
        let hs: Vec<BlockHash> = (0..4).map(hash).collect();
        pool.cache_full_blocks(&a, &hs, 0, 4, GroupId(0), None)
            .unwrap();
        (pool, a)
    }
    let order = |p: &BlockPool| p.free_block_ids().map(|b| b.0).collect::<Vec<_>>();

    // LFU: block 2 hit twice (count 3, level 1) outlives the others.
    let (mut p, a) = setup(EvictionConfig::Lfu { half_life: 100 });
    p.touch(&[a[1], a[1]]).unwrap();
    p.free_blocks(&[a[1], a[1]]).unwrap();
    let mut rev = a.clone();
    rev.reverse();
    p.free_blocks(&rev).unwrap();
    assert_eq!(order(&p), vec![5, 6, 7, 4, 3, 1, 2]);

    // Prefix depth: deeper buckets first (4 | 2-3 | 1), whatever the
    // release order; release order within a bucket.
    let (mut p, a) = setup(EvictionConfig::PrefixDepth { half_life: 100 });
    p.free_blocks(&a).unwrap();
    assert_eq!(order(&p), vec![5, 6, 7, 4, 2, 3, 1]);

    // Priority: block 1 of a priority-5 request outlives the others until
    // its retention (10 ticks) expires; then it is ordinary, released at
    // its expiry: a block released later goes behind it.
    let (mut p, a) = setup(EvictionConfig::Priority { retention: 10 });
    p.set_priority(&a[..1], 5).unwrap();
    p.free_blocks(&a).unwrap();
    assert_eq!(order(&p), vec![5, 6, 7, 2, 3, 4, 1]);
    p.advance_clock(10).unwrap();
    let mut b = Vec::new();
    p.get_new_blocks(1, &mut b).unwrap();
    p.cache_full_blocks(&b, &[hash(9)], 0, 1, GroupId(0), None)
        .unwrap();
    p.free_blocks(&b).unwrap();
    assert_eq!(order(&p), vec![6, 7, 2, 3, 4, 1, 5]);
    p.check_invariants().unwrap();
}
