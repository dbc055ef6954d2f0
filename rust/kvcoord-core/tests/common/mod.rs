//! Helpers shared by the integration tests: the hybrid fixed point that the
//! Python layer runs over `CoordinatorCore`'s per-spec finders, and a chained
//! request hash.

#![allow(dead_code, unreachable_pub)]

use kvcoord_core::{BlockHash, BlockId, CoordinatorCore, GroupId, GroupSpec};
use sha2::{Digest, Sha256};

/// Chained hashes of the full `unit`-token blocks of `tokens` past the
/// `hashes` already computed: any collision-free chained hash of (parent,
/// tokens, salt on block 0) gives the same decisions as vLLM's.
pub fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], unit: usize, salt: Option<&str>) {
    while (hashes.len() + 1) * unit <= tokens.len() {
        let i = hashes.len();
        let mut h = Sha256::new();
        match hashes.last() {
            Some(p) => h.update(p.as_bytes()),
            None => h.update(b"root"),
        }
        for t in &tokens[i * unit..(i + 1) * unit] {
            h.update(t.to_le_bytes());
        }
        if i == 0 {
            if let Some(s) = salt {
                h.update(b"salt");
                h.update(s.as_bytes());
            }
        }
        hashes.push(BlockHash::from_slice(&h.finalize()).unwrap());
    }
}

/// Groups that share a spec, full attention first (stable), as vLLM's hybrid
/// coordinator buckets them.
pub fn buckets(specs: &[GroupSpec]) -> Vec<(GroupSpec, Vec<GroupId>)> {
    let mut out: Vec<(GroupSpec, Vec<GroupId>)> = Vec::new();
    for (g, s) in specs.iter().enumerate() {
        match out.iter_mut().find(|(spec, _)| spec == s) {
            Some((_, ids)) => ids.push(GroupId(g as u32)),
            None => out.push((*s, vec![GroupId(g as u32)])),
        }
    }
    out.sort_by_key(|(s, _)| !s.is_full_attention());
    out
}

/// Test-only port of the hybrid fixed point (no EAGLE, no partial hits):
/// query each bucket at the current candidate length, full attention first,
/// until no bucket shortens it; full-attention lists are truncated at the end.
pub fn hybrid_find(
    c: &CoordinatorCore,
    specs: &[GroupSpec],
    buckets: &[(GroupSpec, Vec<GroupId>)],
    hashes: &[BlockHash],
    max_len: usize,
    alignment: usize,
) -> (Vec<Vec<BlockId>>, usize) {
    let (blocks, hit, _) = hybrid_find_with_longest(c, specs, buckets, hashes, max_len, alignment);
    (blocks, hit)
}

/// [`hybrid_find`] plus the longest hit any bucket saw on the way (the
/// shared-prefix signal: `boundary = longest` when it exceeds the hit).
pub fn hybrid_find_with_longest(
    c: &CoordinatorCore,
    specs: &[GroupSpec],
    buckets: &[(GroupSpec, Vec<GroupId>)],
    hashes: &[BlockHash],
    max_len: usize,
    alignment: usize,
) -> (Vec<Vec<BlockId>>, usize, usize) {
    let mut longest = 0;
    let mut per_group: Vec<Vec<BlockId>> = vec![Vec::new(); specs.len()];
    let mut full_len: Vec<Option<usize>> = vec![None; buckets.len()];
    let simple = buckets.len() == 2 && buckets[0].0.is_full_attention();
    let mut candidate = max_len;
    loop {
        let mut cur = candidate;
        for (bi, (spec, groups)) in buckets.iter().enumerate() {
            if let (true, Some(len)) = (spec.is_full_attention(), full_len[bi]) {
                cur = cur.min(len);
                continue;
            }
            let (blocks, len) = c
                .find_longest_cache_hit(groups, hashes, cur, alignment)
                .unwrap();
            cur = len;
            for (g, b) in groups.iter().zip(blocks) {
                per_group[g.0 as usize] = b;
            }
            if spec.is_full_attention() {
                full_len[bi] = Some(len);
            }
            longest = longest.max(cur);
        }
        if cur >= candidate {
            break;
        }
        candidate = cur;
        if simple {
            break;
        }
    }
    for (g, s) in specs.iter().enumerate() {
        if s.is_full_attention() {
            per_group[g].truncate(candidate.div_ceil(s.block_size as usize));
        }
    }
    (per_group, candidate, longest)
}
