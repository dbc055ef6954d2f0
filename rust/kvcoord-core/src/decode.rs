//! The decode step of a running request, as a scheduler's fast path needs
//! it: one allocation with nothing but new (and lookahead) tokens, the
//! caching that follows, and the request's [`DecodeRoom`] afterwards.
//!
//! Most decode steps of a running request need no new block and complete no
//! block to cache; vLLM's manager changes nothing then. A caller that knows
//! the room a request has after an allocation can answer those steps
//! without the core, and call [`CoordinatorCore::decode_step`] for the
//! others. Rooms exist only where a step inside one changes nothing in any
//! group: every group full attention (no block ever leaves a window) and
//! one held-back tail for all groups.

use crate::coordinator::{AllocateArgs, CoordinatorCore, NewBlocks};
use crate::error::KvResult;
use crate::limits::check_tokens;
use crate::request::Request;
use crate::spec::SpecKind;

/// What a request holds after an allocation, as lower bounds over groups:
/// a later step whose computed plus new (and lookahead) tokens stay within
/// `slots`, and whose computed plus new tokens stay below `next_block`,
/// needs no block and caches none.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DecodeRoom {
    /// Slots the request's tables hold (the smallest over groups).
    pub slots: usize,
    /// The first token count that completes a block not yet cached (the
    /// smallest over groups; `usize::MAX` with caching off).
    pub next_block: usize,
}

impl DecodeRoom {
    /// The one figure a fast path compares with: a step of `num_lookahead_tokens`
    /// speculative tokens that brings the computed plus new tokens to `done`
    /// stays within the room iff `done < limit`.
    pub fn limit(self, num_lookahead_tokens: usize) -> usize {
        self.slots
            .saturating_add(1)
            .saturating_sub(num_lookahead_tokens)
            .min(self.next_block)
    }
}

/// Whether a step of a running request that brings its computed tokens
/// from `num_computed_tokens` to `num_computed_tokens + num_new_tokens`
/// stays inside the room whose [`DecodeRoom::limit`] is `limit` (for the
/// step's speculative-token count): then it needs no block and caches none,
/// and a scheduler's fast path answers it without the core.
pub fn inside_room(limit: usize, num_computed_tokens: usize, num_new_tokens: usize) -> bool {
    num_computed_tokens.saturating_add(num_new_tokens) < limit
}

impl CoordinatorCore {
    /// Whether decode steps have a [`DecodeRoom`] in this configuration:
    /// every group is full attention and all hold back the same
    /// re-prefillable tail.
    pub fn has_decode_room(&self) -> bool {
        let groups = &self.config().groups;
        let mut held = self.config().held_back_tokens();
        let first = held.next();
        !groups.is_empty()
            && groups.iter().all(|g| g.kind == SpecKind::FullAttention)
            && held.all(|h| Some(h) == first)
    }

    /// The room after an allocation for `need` slots that cached the full
    /// blocks of the first `cached_to` tokens, of which only the first
    /// `hashed` have hashes (the re-prefillable tail is held back from
    /// caching); `None` where there are no rooms ([`Self::has_decode_room`]).
    /// Each count must be a token count (refused otherwise).
    pub fn decode_room(
        &self,
        need: usize,
        cached_to: usize,
        hashed: usize,
    ) -> KvResult<Option<DecodeRoom>> {
        let need = check_tokens("need", need)?;
        let cached_to = check_tokens("cached_to", cached_to)?;
        let hashed = check_tokens("hashed", hashed)?;
        if !self.has_decode_room() {
            return Ok(None);
        }
        let config = self.config();
        let held_back = config.held_back_tokens().next().unwrap_or(0);
        let cached_to = cached_to.saturating_sub(held_back).min(hashed);
        let mut room = DecodeRoom {
            slots: usize::MAX,
            next_block: usize::MAX,
        };
        for g in &config.groups {
            // Counts below 2^48 and sizes below 2^32: each rounding up to a
            // block adds less than a block, far below 2^64.
            let bs = (g.block_size as usize).max(1);
            room.slots = room.slots.min(need.div_ceil(bs) * bs);
            room.next_block = room.next_block.min((cached_to / bs + 1) * bs);
        }
        // A block is cached once the tokens past the held-back tail fill it.
        room.next_block = if config.enable_caching() {
            room.next_block.saturating_add(held_back)
        } else {
            usize::MAX
        };
        Ok(Some(room))
    }

    /// A decode step of the running `request`: `num_new_tokens` new and
    /// `num_lookahead_tokens` speculative tokens, no hits, no external or
    /// encoder tokens. `num_hashes` is how many hash units the scheduler's
    /// own request has hashes for: when they leave full blocks of the
    /// tokens unhashed (a hasher that lags, e.g. with hash lookahead), the
    /// blocks are cached after the allocation, up to the computed plus new
    /// tokens, and the room stops at the hashed blocks.
    ///
    /// Returns `None` when the pool cannot hold the step (nothing changed),
    /// else the room afterwards (`None` inside where there are no rooms),
    /// with the new blocks in `out`.
    pub fn decode_step(
        &mut self,
        request: &Request,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        num_hashes: usize,
        out: &mut NewBlocks,
    ) -> KvResult<Option<Option<DecodeRoom>>> {
        let config = self.config();
        let unit = config.hash_block_size as usize;
        let max_model_len = config.max_model_len;
        let caching = config.enable_caching();
        let num_tokens = request.num_tokens();
        let hashed = num_hashes.saturating_mul(unit);
        let lagging = hashed.saturating_add(unit) < num_tokens + 1;
        let args = AllocateArgs {
            num_lookahead_tokens,
            delay_cache_blocks: lagging,
            ..AllocateArgs::new(num_new_tokens)
        };
        let Some(req) = self.allocate_registered(request, &args, None, out)? else {
            return Ok(None);
        };
        // The allocation checked every count below 2^48: these sums fit.
        let computed = request.num_computed_tokens().min(max_model_len);
        let cached_to = (computed + num_new_tokens).min(num_tokens);
        if lagging && caching {
            // The id the allocation found (a second registry probe is a
            // cache miss of its own in a scheduler's step).
            self.cache_registered(req, request, cached_to)?;
        }
        let need = (computed + num_new_tokens + num_lookahead_tokens).min(max_model_len);
        // Only its minimum with `cached_to` matters (a token count).
        let hashed = hashed.min(cached_to);
        Ok(Some(self.decode_room(need, cached_to, hashed)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::CoordinatorConfig;
    use crate::hashing::{HashAlgo, HashConfig, RequestHasher};
    use crate::managers::GroupSpec;
    use crate::ExtraKeys;

    fn core(groups: Vec<GroupSpec>, reprefill: usize) -> CoordinatorCore {
        let mut config = CoordinatorConfig::new(groups, 64, true, 1024);
        config.hash_block_size = 4;
        config.num_reprefillable_tokens = reprefill;
        CoordinatorCore::new(config).unwrap()
    }

    fn request(id: &str, tokens: usize) -> Request {
        let config = HashConfig::new(HashAlgo::from_name("sha256_cbor").unwrap(), 4, None).unwrap();
        let hasher = RequestHasher::new(config, ExtraKeys::default());
        Request::new(id.into(), (0..tokens as u32).collect(), hasher)
    }

    #[test]
    fn rooms_only_for_full_attention_with_one_tail() {
        assert!(core(vec![GroupSpec::full_attention(4)], 0).has_decode_room());
        let two = vec![GroupSpec::full_attention(4), GroupSpec::full_attention(8)];
        assert!(core(two, 0).has_decode_room());
        let swa = vec![
            GroupSpec::full_attention(4),
            GroupSpec::sliding_window(4, 8),
        ];
        assert!(!core(swa, 0).has_decode_room());
        assert_eq!(
            core(vec![GroupSpec::sliding_window(4, 8)], 0).decode_room(5, 4, 4),
            Ok(None)
        );
    }

    #[test]
    fn limit_folds_both_bounds() {
        let room = DecodeRoom {
            slots: 8,
            next_block: 12,
        };
        for lookahead in 0..12 {
            let limit = room.limit(lookahead);
            for done in 0..16 {
                let inside = done + lookahead <= room.slots && done < room.next_block;
                assert_eq!(done < limit, inside, "{done} {lookahead}");
            }
        }
    }

    #[test]
    fn inside_room_is_strictly_below_the_limit() {
        assert!(inside_room(10, 8, 1));
        assert!(!inside_room(10, 9, 1));
        assert!(!inside_room(0, 0, 0));
        assert!(!inside_room(usize::MAX, usize::MAX, 1));
    }

    #[test]
    fn room_is_the_smallest_over_groups() {
        let two = vec![GroupSpec::full_attention(4), GroupSpec::full_attention(8)];
        let c = core(two, 0);
        assert_eq!(
            c.decode_room(9, 9, 9),
            Ok(Some(DecodeRoom {
                slots: 12,
                next_block: 12
            }))
        );
        let held = core(vec![GroupSpec::full_attention(4)], 2);
        assert_eq!(
            held.decode_room(9, 9, 8),
            Ok(Some(DecodeRoom {
                slots: 12,
                next_block: 10
            }))
        );
        // Counts past the token range are refused, not rounded past 2^64.
        let max = crate::limits::MAX_TOKENS - 1;
        let room = c.decode_room(max, max, max).unwrap().unwrap();
        assert_eq!(room.slots, max.div_ceil(8) * 8);
        assert!(c.decode_room(usize::MAX, 9, 9).is_err());
        assert!(c.decode_room(9, usize::MAX, 9).is_err());
        assert!(c.decode_room(9, 9, max + 1).is_err());
    }

    /// The room answers exactly the steps that change nothing: walking a
    /// request one token at a time, a step inside the room allocates no
    /// block and caches none.
    #[test]
    fn steps_inside_the_room_change_nothing() {
        let mut c = core(vec![GroupSpec::full_attention(4)], 0);
        let mut r = request("a", 6);
        let mut out = NewBlocks::new();
        let first = c.allocate_request(&r, &AllocateArgs::new(6), None, &mut out);
        assert!(first.unwrap());
        r.set_num_computed_tokens(6).unwrap();
        let mut room = c.decode_room(6, 6, 4).unwrap().unwrap();
        for t in 6..40u32 {
            r.push_token(t);
            let done = r.num_computed_tokens() + 1;
            let hashes = r.block_hashes().len();
            let cached_before = c.pool().num_cached_keys();
            let free_before = c.pool().num_free_blocks();
            if done <= room.slots && done < room.next_block {
                // What the core would do: nothing.
                let mut probe = c.clone();
                let got = probe.decode_step(&r, 1, 0, hashes, &mut out).unwrap();
                assert!(got.is_some() && out.is_empty());
                assert_eq!(probe.pool().num_cached_keys(), cached_before);
                assert_eq!(probe.pool().num_free_blocks(), free_before);
            } else {
                room = c
                    .decode_step(&r, 1, 0, hashes, &mut out)
                    .unwrap()
                    .unwrap()
                    .unwrap();
                c.check_invariants().unwrap();
            }
            r.set_num_computed_tokens(done).unwrap();
        }
        assert_eq!(c.pool().num_cached_keys(), 10);
    }
}
