//! Prefix-cache hits: the lookups ([`CoordinatorCore::find_longest_cache_hit`])
//! and the checks of the hits a caller hands back to `allocate_slots`
//! (`new_computed_blocks`).
//!
//! Hits come from `find_longest_cache_hit`, but they travel through the
//! caller and the pool may change in between (another thread, or a misuse):
//! a hit block may have been evicted and reused, and a caller may pass
//! anything. Adopting a block that does not hold this request's prefix
//! would let two requests write one block, or serve wrong KV. So every hit
//! is checked against the prefix index before anything is pinned: block `i`
//! of group `g` must be cached under this request's own hash of block `i`
//! for group `g` (one probe per block). Null entries are allowed only where
//! the group's attention window skips the block (they are never adopted);
//! full attention skips nothing.
//!
//! The check is a coordinator option ([`CoordinatorConfig::verify_hits`]):
//! vLLM's scheduler is single-threaded and adopts whatever blocks it is
//! handed (its connectors and tests rely on that), so its adapter turns the
//! probe off and keeps only [`check_group_hit_shape`], the part without
//! which the tables themselves would be wrong.
//!
//! [`CoordinatorConfig::verify_hits`]: crate::CoordinatorConfig::verify_hits

use super::config::CoordinatorConfig;
use super::CoordinatorCore;
use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::managers::{HashView, Manager};
use crate::pool::BlockPool;
use crate::request::RequestView;
use crate::step_args::AllocateArgs;

/// Check `list`, the hits of group `m` covering `num_local` computed
/// tokens (one entry per block), against the request's `hashes` (units of
/// `hash_block_size` tokens).
pub(crate) fn verify_group_hits(
    m: &Manager,
    pool: &BlockPool,
    hashes: &[BlockHash],
    hash_block_size: usize,
    list: &[BlockId],
    num_local: usize,
) -> KvResult<()> {
    let refuse = |detail: String| KvError::InvalidArgument {
        name: "new_computed_blocks",
        detail: format!("group {}: {detail}", m.group()),
    };
    let view = HashView::new(hashes, hash_block_size, m.block_size())?;
    // A sub-block hit's last block is not full.
    let allowed = view.len() + usize::from(num_local % m.block_size() != 0);
    if list.len() > allowed {
        return Err(refuse(format!(
            "{} hit blocks but the request has only {} full hashed blocks",
            list.len(),
            view.len()
        )));
    }
    check_group_hit_shape(m, list, num_local)?;
    for (i, &b) in list.iter().enumerate() {
        if b.is_null() {
            continue;
        }
        let matches = if (i + 1) * m.block_size() > num_local {
            // A hit ending inside this block (sub-block hits): one of its
            // keys is this request's hash at a hash-unit boundary from the
            // hit's end to the block's (a longer hit cut by another group).
            let lo = num_local / hash_block_size;
            let hi = ((i + 1) * m.block_size() / hash_block_size).min(hashes.len());
            lo > 0
                && lo <= hi
                && pool
                    .cache_keys(b)?
                    .iter()
                    .any(|(k, _)| k.group == m.group() && hashes[lo - 1..hi].contains(&k.hash))
        } else {
            let key = pool.cache_key(b)?;
            key.is_some_and(|k| k.group == m.group() && k.hash == *view.get(i))
        };
        if !matches {
            return Err(refuse(format!(
                "block {b} at position {i} is not cached for this request's prefix \
                 (stale hit: evicted or reused since the lookup, or not from this request's lookup)"
            )));
        }
    }
    Ok(())
}

/// What every hit list of group `m` (covering `num_local` computed tokens)
/// must satisfy whether or not its blocks are verified: null entries only
/// where the attention window skips the block (a null inside the window
/// would be a table entry that holds no KV). Ids, counts and the pool's own
/// limits are checked by the caller and the pool.
pub(crate) fn check_group_hit_shape(
    m: &Manager,
    list: &[BlockId],
    num_local: usize,
) -> KvResult<()> {
    let skipped = m.num_skipped_tokens(num_local) / m.block_size();
    match list.iter().skip(skipped).position(|b| b.is_null()) {
        None => Ok(()),
        Some(i) => Err(KvError::InvalidArgument {
            name: "new_computed_blocks",
            detail: format!(
                "group {}: null block at position {}, inside the attention window",
                m.group(),
                skipped + i
            ),
        }),
    }
}

impl CoordinatorCore {
    fn check_group_set(&self, group_ids: &[GroupId]) -> KvResult<&Manager> {
        let first = group_ids.first().ok_or_else(|| KvError::InvalidArgument {
            name: "group_ids",
            detail: "must not be empty".into(),
        })?;
        let manager_of = |g: &GroupId| {
            self.managers
                .get(g.0 as usize)
                .ok_or(KvError::UnknownGroup(*g))
        };
        let m = manager_of(first)?;
        for g in group_ids {
            if manager_of(g)?.spec() != m.spec() {
                return Err(KvError::InvalidArgument {
                    name: "group_ids",
                    detail: format!("groups {first} and {g} have different specs"),
                });
            }
        }
        Ok(m)
    }

    /// Longest prefix-cache hit for groups sharing one spec: at most
    /// `max_length` tokens, ending on a multiple of `alignment` (the group's
    /// block size when unitary, the scheduler block size when hybrid).
    /// `hashes` are the request's hash-unit hashes. `drop_eagle`: the hit
    /// drops its last block for EAGLE (only EAGLE groups may ask; see
    /// [`Manager::find_longest_cache_hit`]). Returns each group's blocks
    /// (null block in skipped positions) and the hit in tokens. Nothing is
    /// pinned: pass the blocks to `allocate_slots` right away.
    pub fn find_longest_cache_hit(
        &self,
        group_ids: &[GroupId],
        hashes: &[BlockHash],
        max_length: usize,
        alignment: usize,
        drop_eagle: bool,
    ) -> KvResult<(Vec<Vec<BlockId>>, usize)> {
        let mut out = Vec::new();
        crate::limits::try_reserve(&mut out, group_ids.len(), "hit lists")?;
        out.resize_with(group_ids.len(), Vec::new);
        let hit = self.find_longest_cache_hit_into(
            group_ids, hashes, max_length, alignment, drop_eagle, &mut out,
        )?;
        Ok((out, hit))
    }

    /// [`find_longest_cache_hit`](Self::find_longest_cache_hit) into
    /// caller-owned lists (`out[i]` for `group_ids[i]`, cleared first).
    pub fn find_longest_cache_hit_into(
        &self,
        group_ids: &[GroupId],
        hashes: &[BlockHash],
        max_length: usize,
        alignment: usize,
        drop_eagle: bool,
        out: &mut [Vec<BlockId>],
    ) -> KvResult<usize> {
        let m = self.check_group_set(group_ids)?;
        if drop_eagle && !m.eagle() {
            return Err(KvError::InvalidArgument {
                name: "drop_eagle",
                detail: format!("group {} is not an EAGLE group", m.group()),
            });
        }
        if !self.config.enable_caching() {
            if out.len() != group_ids.len() {
                return Err(KvError::InvalidArgument {
                    name: "out",
                    detail: format!("{} lists for {} groups", out.len(), group_ids.len()),
                });
            }
            out.iter_mut().for_each(Vec::clear);
            return Ok(0);
        }
        m.find_longest_cache_hit(
            &self.pool,
            group_ids,
            hashes,
            self.config.hash_block_size as usize,
            max_length,
            alignment,
            drop_eagle,
            out,
        )
    }
}

/// Validate hit lists passed to `allocate_slots`: one list per group, only
/// for a new request, only where caching applies, in range, and covering
/// exactly the locally computed tokens (fewer for a lagging group before
/// external tokens).
pub(super) fn check_hits(
    managers: &[Manager],
    pool: &BlockPool,
    config: &CoordinatorConfig,
    hits: &[Vec<BlockId>],
    tracked: bool,
    view: &RequestView<'_>,
    args: &AllocateArgs,
) -> KvResult<()> {
    let num_local = view.num_computed_tokens + args.num_new_computed_tokens;
    let num_external = args.num_external_computed_tokens;
    let hashes = view.hashes;
    let arg = |detail: String| KvError::InvalidArgument {
        name: "new_computed_blocks",
        detail,
    };
    if hits.len() != managers.len() {
        return Err(arg(format!(
            "{} lists for {} groups",
            hits.len(),
            managers.len()
        )));
    }
    // A connector's per-group lookup (vLLM's, beside Mamba groups) may hand
    // a group a hit below the reported one (even none) when external
    // tokens follow: that group adopts what its own hit covers, as vLLM
    // does (a Mamba group none of it: the state at the end of the external
    // tokens replaces it).
    let lagging = |list: &[BlockId], expected: usize| num_external > 0 && list.len() < expected;
    // A full-attention group whose pool keeps a longer prefix than the
    // reconciled hit (vLLM's `retains_longer_hit`: HiSparse's host group)
    // adopts the blocks of it that the local and external tokens cover
    // together: the external tokens are already in those blocks.
    let retained = |m: &Manager, list: &[BlockId], expected: usize| {
        num_external > 0
            && m.spec().is_full_attention()
            && list.len() > expected
            && list.len() <= (num_local + num_external).div_ceil(m.block_size())
    };
    for (m, list) in managers.iter().zip(hits) {
        if list.is_empty() {
            let needs_blocks = !tracked && num_local > 0 && config.enable_caching();
            if needs_blocks && m.spec().prefix_cacheable() && num_external == 0 {
                return Err(arg(format!(
                    "group {}: {num_local} hit tokens but no hit blocks",
                    m.group()
                )));
            }
            continue;
        }
        if tracked {
            return Err(arg(
                "a running request cannot adopt prefix-cache hits".into()
            ));
        }
        if !config.enable_caching() || !m.spec().prefix_cacheable() {
            return Err(arg(format!(
                "group {} cannot have prefix-cache hits",
                m.group()
            )));
        }
        if !pool.ids_in_range(list) {
            return Err(arg(format!("group {}: block id out of range", m.group())));
        }
        let sub_block = config.partial_hits()
            && m.spec().facts().sub_block_hits
            && num_local % config.hash_block_size as usize == 0;
        if num_local % m.block_size() != 0 && !sub_block {
            return Err(KvError::Unsupported {
                what: format!(
                    "partial-block hit ({num_local} tokens, block size {})",
                    m.block_size()
                ),
            });
        }
        // A lookup result covers exactly the computed prefix, one entry
        // (null included) per block (a lagging group's hit: fewer).
        let expected = if sub_block {
            num_local.div_ceil(m.block_size())
        } else {
            num_local / m.block_size()
        };
        if list.len() != expected && !lagging(list, expected) && !retained(m, list, expected) {
            return Err(arg(format!(
                "group {}: {} hit blocks for {num_local} computed tokens (expected {expected})",
                m.group(),
                list.len()
            )));
        }
        let hbs = config.hash_block_size as usize;
        let covered = if sub_block && list.len() == expected {
            num_local
        } else {
            list.len() * m.block_size()
        };
        if config.verify_hits {
            verify_group_hits(m, pool, hashes, hbs, list, covered)?;
        } else {
            check_group_hit_shape(m, list, covered)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::coordinator::{AllocateArgs, CoordinatorConfig, CoordinatorCore};
    use crate::eviction::EvictionConfig;
    use crate::ids::{BlockId, ReqId};
    use crate::managers::GroupSpec;
    use crate::request::RequestView;
    use crate::BlockHash;

    const BS: usize = 4;

    /// Distinct hashes per request (`seed`), one per block.
    fn hashes(seed: u8, n: usize) -> Vec<BlockHash> {
        (0..n)
            .map(|i| {
                let mut d = [7u8; 16];
                d[0] = seed;
                d[1] = u8::try_from(i).unwrap();
                BlockHash::from_slice(&d).unwrap()
            })
            .collect()
    }

    /// Full attention and a wide sliding window (vLLM's
    /// `test_cache_hit_local_and_external` shape), hits verified or not.
    fn core(verify_hits: bool) -> CoordinatorCore {
        let groups = vec![
            GroupSpec::full_attention(4),
            GroupSpec::sliding_window(4, 400),
        ];
        let mut cfg = CoordinatorConfig::new(groups, 31, true, 8192);
        cfg.verify_hits = verify_hits;
        CoordinatorCore::new(cfg).unwrap()
    }

    fn free_ids(c: &CoordinatorCore) -> Vec<u32> {
        c.pool().free_block_ids().map(|b| b.0).collect()
    }

    fn block_ids(c: &CoordinatorCore, r: ReqId) -> Vec<Vec<u32>> {
        c.block_ids(r)
            .unwrap()
            .iter()
            .map(|g| g.iter().map(|b| b.0).collect())
            .collect()
    }

    fn ids(v: &[u32]) -> Vec<BlockId> {
        v.iter().copied().map(BlockId).collect()
    }

    /// `k` hit blocks per group, then `external` blocks and one new block.
    fn allocate(
        c: &mut CoordinatorCore,
        r: ReqId,
        hs: &[BlockHash],
        hits: &[Vec<BlockId>],
        external: usize,
    ) -> crate::KvResult<Option<Vec<Vec<BlockId>>>> {
        let k = hits[0].len();
        let n = (k + external + 1) * BS;
        let view = RequestView::new(0, n, n, hs);
        let mut args = AllocateArgs::with_hit(BS, k * BS);
        args.num_external_computed_tokens = external * BS;
        c.allocate_slots(r, &view, &args, Some(hits))
    }

    #[test]
    fn free_head_blocks_are_refused_when_verified() {
        let mut c = core(true);
        let hs = hashes(1, 8);
        let before = free_ids(&c);
        let hits = [ids(&before[..5]), ids(&before[5..10])];
        let err = allocate(&mut c, ReqId(1), &hs, &hits, 2).unwrap_err();
        assert!(err
            .to_string()
            .contains("not cached for this request's prefix"));
        assert_eq!(free_ids(&c), before);
        assert!(!c.contains(ReqId(1)));
        c.check_invariants().unwrap();
    }

    #[test]
    fn free_head_blocks_are_adopted_unverified() {
        let mut c = core(false);
        let hs = hashes(1, 8);
        let before = free_ids(&c);
        let hits = [ids(&before[..5]), ids(&before[5..10])];
        assert!(allocate(&mut c, ReqId(1), &hs, &hits, 2).unwrap().is_some());
        // Every group's hits first, then the external blocks (from the head
        // after all hits left the queue), then the new block.
        let tables = block_ids(&c, ReqId(1));
        assert_eq!(tables[0][..5], before[..5]);
        assert_eq!(tables[1][..5], before[5..10]);
        assert_eq!(tables[0][5..], [11, 12, 15]);
        assert_eq!(tables[1][5..], [13, 14, 16]);
        assert_eq!(free_ids(&c), before[16..]);
        // The hits stay unkeyed (caching starts after them); the rest is
        // cached under the request's hashes.
        for g in &tables {
            for (i, &b) in g.iter().enumerate() {
                let key = c.pool().cache_key(BlockId(b)).unwrap();
                assert_eq!(key.is_some(), i >= 5, "block {b} at {i}");
            }
        }
        c.check_invariants().unwrap();
        // Freed: the unkeyed hits go to the front, the keyed blocks back.
        c.free(ReqId(1)).unwrap();
        let after = free_ids(&c);
        assert_eq!(after.len(), before.len());
        assert!(after[..10].iter().all(|b| before[..10].contains(b)));
        c.check_invariants().unwrap();
    }

    #[test]
    fn cached_and_in_use_blocks_are_adopted_unverified_and_keep_their_keys() {
        let mut c = core(false);
        // Request 1 caches two blocks per group and stays running.
        let h1 = hashes(1, 3);
        let view = RequestView::new(0, 9, 9, &h1);
        let first = c
            .allocate_slots(ReqId(1), &view, &AllocateArgs::new(9), None)
            .unwrap()
            .unwrap();
        let (a, b) = (first[0][0], first[1][0]);
        let key_a = c.pool().cache_key(a).unwrap().unwrap();
        // Request 2 takes request 1's cached in-use blocks as its hits.
        let h2 = hashes(2, 4);
        let view = RequestView::new(0, 12, 12, &h2);
        let hits = [vec![a], vec![b]];
        let args = AllocateArgs::with_hit(8, 4);
        assert!(c
            .allocate_slots(ReqId(2), &view, &args, Some(&hits))
            .unwrap()
            .is_some());
        assert_eq!(c.pool().ref_count(a).unwrap(), 2);
        assert_eq!(c.pool().cache_key(a).unwrap(), Some(key_a));
        c.check_invariants().unwrap();
        c.free(ReqId(1)).unwrap();
        c.free(ReqId(2)).unwrap();
        assert_eq!(c.pool().ref_count(a).unwrap(), 0);
        c.check_invariants().unwrap();
    }

    #[test]
    fn unverified_hits_still_refuse_what_the_tables_cannot_hold() {
        let mut c = core(false);
        let hs = hashes(1, 8);
        let before = free_ids(&c);
        let cases: [[Vec<u32>; 2]; 4] = [
            [vec![0, 1], vec![2, 3]],  // null inside full attention's window
            [vec![1, 2], vec![3, 99]], // out of range
            [vec![1, 2], vec![3]],     // too few for the hit tokens
            [vec![1, 2, 4], vec![3]],  // too many
        ];
        for case in cases {
            let hits = [ids(&case[0]), ids(&case[1])];
            let n = 4 * BS;
            let view = RequestView::new(0, n, n, &hs);
            let args = AllocateArgs::with_hit(BS, 2 * BS);
            assert!(c
                .allocate_slots(ReqId(1), &view, &args, Some(&hits))
                .is_err());
            assert_eq!(free_ids(&c), before);
            assert!(!c.contains(ReqId(1)));
            c.check_invariants().unwrap();
        }
    }

    #[test]
    fn unverified_hits_under_every_eviction_policy_and_residency() {
        for spec in ["lfu", "prefix-depth", "priority"] {
            let mut c = core(false);
            let policy: EvictionConfig = spec.parse().unwrap();
            c.pool_mut().set_eviction(policy).unwrap();
            c.pool_mut().enable_residency().unwrap();
            let h1 = hashes(1, 4);
            let view = RequestView::new(0, 12, 12, &h1);
            c.allocate_slots(ReqId(1), &view, &AllocateArgs::new(12), None)
                .unwrap()
                .unwrap();
            c.free(ReqId(1)).unwrap();
            // Free cached, free uncached and fresh blocks as hits.
            let free = free_ids(&c);
            let cached: Vec<u32> = free
                .iter()
                .copied()
                .filter(|&b| c.pool().cache_key(BlockId(b)).unwrap().is_some())
                .collect();
            let hits = [ids(&[cached[0], free[0]]), ids(&[cached[1], free[1]])];
            let hs = hashes(2, 8);
            assert!(
                allocate(&mut c, ReqId(2), &hs, &hits, 1).unwrap().is_some(),
                "{spec}"
            );
            c.check_invariants().unwrap();
            c.free(ReqId(2)).unwrap();
            c.check_invariants().unwrap();
            assert_eq!(c.pool().num_free_blocks(), 30, "{spec}");
        }
    }

    /// A request the core has not seen whose computed tokens come without
    /// blocks (already computed elsewhere, or claimed as hits with none):
    /// refused when verified, state untouched; unverified, those tokens get
    /// fresh blocks like the tokens to compute, as vLLM gives them.
    #[test]
    fn computed_tokens_without_blocks_get_fresh_blocks_unverified() {
        let hs = hashes(2, 8);
        let n = 6 * BS;
        for claimed_as_hits in [false, true] {
            let (view, args) = if claimed_as_hits {
                (
                    RequestView::new(0, n, n, &hs),
                    AllocateArgs::with_hit(BS, 5 * BS),
                )
            } else {
                (
                    RequestView::new(5 * BS, n, n, &hs),
                    AllocateArgs::with_hit(BS, 0),
                )
            };
            let mut strict = core(true);
            let before = free_ids(&strict);
            assert!(strict.allocate_slots(ReqId(1), &view, &args, None).is_err());
            assert_eq!(free_ids(&strict), before);
            assert!(!strict.contains(ReqId(1)));
            strict.check_invariants().unwrap();

            let mut c = core(false);
            let new = c
                .allocate_slots(ReqId(1), &view, &args, None)
                .unwrap()
                .unwrap();
            assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), [6, 6]);
            assert_eq!(block_ids(&c, ReqId(1))[0], before[..6]);
            assert_eq!(block_ids(&c, ReqId(1))[1], before[6..12]);
            assert_eq!(c.pool().num_free_blocks(), before.len() - 12);
            c.check_invariants().unwrap();
        }
    }

    /// Unverified computed tokens beyond a sliding window: the prediction
    /// lets the window skip them, the fresh blocks cover them all. A pool
    /// that holds the prediction but not the blocks refuses the step with
    /// nothing changed. Regression: the allocation failed midway
    /// (`OutOfBlocks`) with the request half built.
    #[test]
    fn computed_tokens_without_blocks_that_do_not_fit_change_nothing() {
        let groups = vec![GroupSpec::sliding_window(4, 8)];
        let mut cfg = CoordinatorConfig::new(groups, 6, true, 8192);
        cfg.verify_hits = false;
        let mut c = CoordinatorCore::new(cfg).unwrap();
        let hs = hashes(3, 8);
        let n = 8 * BS;
        // 7 blocks computed elsewhere, 1 to compute: 8 fresh blocks, 5 free.
        let view = RequestView::new(7 * BS, n, n, &hs);
        let args = AllocateArgs::with_hit(BS, 0);
        let before = free_ids(&c);
        assert_eq!(before.len(), 5);
        assert!(c
            .allocate_slots(ReqId(1), &view, &args, None)
            .unwrap()
            .is_none());
        assert_eq!(free_ids(&c), before);
        assert!(!c.contains(ReqId(1)));
        c.check_invariants().unwrap();
    }
}
