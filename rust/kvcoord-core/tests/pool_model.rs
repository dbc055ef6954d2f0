//! Model-based test: random operation sequences drive the real `BlockPool`
//! and a naive reference (vectors and linear scans) in lockstep. Both must
//! accept or refuse each operation alike, return the same ids, and expose
//! the same state; `check_invariants()` runs after every operation.

use std::collections::HashMap;

use kvcoord_core::{BlockHash, BlockId, BlockPool, GroupId, PoolConfig};
use proptest::prelude::*;

const N: usize = 10;

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    Free(Vec<u32>),
    FreeOwner(usize),
    Touch(Vec<u32>),
    Cache { owner: usize, num_cached: usize, num_full: usize, hashes: Vec<u8>, group: u32, mask: Option<Vec<bool>> },
    Lookup { hash: u8, groups: Vec<u32> },
    Evict(Vec<u32>),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let ids = proptest::collection::vec(0u32..(N as u32 + 1), 0..4);
    prop_oneof![
        3 => (0usize..N + 1).prop_map(Op::Get),
        1 => ids.clone().prop_map(Op::Free),
        3 => (0usize..8).prop_map(Op::FreeOwner),
        1 => ids.clone().prop_map(Op::Touch),
        3 => (0usize..8, 0usize..5, 0usize..5, proptest::collection::vec(0u8..5, 5), 0u32..3,
              proptest::option::of(proptest::collection::vec(any::<bool>(), 0..5)))
            .prop_map(|(owner, num_cached, num_full, hashes, group, mask)| Op::Cache {
                owner, num_cached, num_full, hashes, group, mask
            }),
        2 => (0u8..5, proptest::collection::vec(0u32..3, 1..3)).prop_map(|(hash, groups)| Op::Lookup { hash, groups }),
        1 => ids.prop_map(Op::Evict),
        1 => Just(Op::Reset),
    ]
}

/// The naive reference.
struct Model {
    free: Vec<u32>,
    refs: Vec<u32>,
    key: HashMap<u32, (u8, u32)>,
    index: Vec<((u8, u32), Vec<u32>)>,
}

impl Model {
    fn new() -> Self {
        Self { free: (1..N as u32).collect(), refs: vec![0; N], key: HashMap::new(), index: Vec::new() }
    }

    fn drop_key(&mut self, b: u32) {
        if let Some(k) = self.key.remove(&b) {
            let pos = self.index.iter().position(|(kk, _)| *kk == k).unwrap();
            self.index[pos].1.retain(|&x| x != b);
            if self.index[pos].1.is_empty() {
                self.index.remove(pos);
            }
        }
    }

    fn get(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let out: Vec<u32> = self.free.drain(..n).collect();
        for &b in &out {
            self.drop_key(b);
            self.refs[b as usize] = 1;
        }
        Some(out)
    }

    fn free(&mut self, ids: &[u32]) -> bool {
        if ids.iter().any(|&b| b as usize >= N) {
            return false;
        }
        let mut need = vec![0u32; N];
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
                if self.key.contains_key(&b) { back.push(b) } else { front.push(b) }
            }
        }
        front.extend(self.free.drain(..));
        front.extend(back);
        self.free = front;
        true
    }

    fn touch(&mut self, ids: &[u32]) -> bool {
        if ids.iter().any(|&b| b as usize >= N) {
            return false;
        }
        for &b in ids.iter().filter(|&&b| b != 0) {
            if self.refs[b as usize] == 0 {
                self.free.retain(|&x| x != b);
            }
            self.refs[b as usize] += 1;
        }
        true
    }

    fn cache(&mut self, ids: &[u32], hashes: &[u8], nc: usize, nf: usize, g: u32, mask: Option<&[bool]>) -> bool {
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
            if self.key.contains_key(&b) || seen.contains(&b) {
                return false;
            }
            seen.push(b);
        }
        for (i, b) in chosen {
            let k = (hashes[i], g);
            self.key.insert(b, k);
            match self.index.iter_mut().find(|(kk, _)| *kk == k) {
                Some((_, v)) => v.push(b),
                None => self.index.push((k, vec![b])),
            }
        }
        true
    }

    fn lookup(&self, h: u8, groups: &[u32]) -> Option<Vec<u32>> {
        groups
            .iter()
            .map(|&g| self.index.iter().find(|(k, _)| *k == (h, g)).map(|(_, v)| v[0]))
            .collect()
    }
}

fn hash(n: u8) -> BlockHash {
    BlockHash::from_slice(&[n; 32]).unwrap()
}

fn bids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&b| BlockId(b)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn pool_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut pool = BlockPool::new(PoolConfig::new(N)).unwrap();
        let mut model = Model::new();
        let mut owners: Vec<Vec<u32>> = Vec::new();
        for op in ops {
            match op {
                Op::Get(n) => {
                    let mut out = Vec::new();
                    let real = pool.get_new_blocks(n, &mut out).map(|()| out.iter().map(|b| b.0).collect::<Vec<_>>());
                    let want = model.get(n);
                    prop_assert_eq!(real.as_ref().ok(), want.as_ref());
                    if let Some(v) = want { if !v.is_empty() { owners.push(v); } }
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
                    if !ids.is_empty() && ids.iter().all(|&b| (b as usize) < N) { owners.push(ids); }
                }
                Op::Cache { owner, num_cached, num_full, hashes, group, mask } => {
                    if let Some(ids) = owners.get(owner).cloned() {
                        let hs: Vec<BlockHash> = hashes.iter().map(|&h| hash(h)).collect();
                        let real = pool.cache_full_blocks(&bids(&ids), &hs, num_cached, num_full, GroupId(group), mask.as_deref());
                        let want = model.cache(&ids, &hashes, num_cached, num_full, group, mask.as_deref());
                        prop_assert_eq!(real.is_ok(), want);
                    }
                }
                Op::Lookup { hash: h, groups } => {
                    let gs: Vec<GroupId> = groups.iter().map(|&g| GroupId(g)).collect();
                    let mut out = Vec::new();
                    let real = pool.get_cached_block(&hash(h), &gs, &mut out).then(|| out.iter().map(|b| b.0).collect::<Vec<_>>());
                    prop_assert_eq!(real, model.lookup(h, &groups));
                }
                Op::Evict(ids) => {
                    let ok = ids.iter().all(|&b| (b as usize) < N);
                    prop_assert_eq!(pool.evict_blocks(&bids(&ids)).is_ok(), ok);
                    if ok { for b in ids { model.drop_key(b); } }
                }
                Op::Reset => {
                    let want = N - model.free.len() == 1;
                    prop_assert_eq!(pool.reset_prefix_cache(), want);
                    if want { model.key.clear(); model.index.clear(); }
                }
            }
            pool.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(pool.free_block_ids().map(|b| b.0).collect::<Vec<_>>(), model.free.clone());
            prop_assert_eq!(pool.ref_counts().collect::<Vec<_>>(), model.refs.clone());
            let mask: Vec<bool> = (0..N as u32).map(|b| model.key.contains_key(&b)).collect();
            prop_assert_eq!(pool.cached_mask().collect::<Vec<_>>(), mask);
            prop_assert_eq!(pool.num_cached_keys(), model.index.len());
        }
    }
}
