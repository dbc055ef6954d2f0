//! The planner's best possible prefix-cache hit rate: an unbounded cache
//! that never evicts, fed requests in arrival order.
//!
//! Only prefix *equality* matters here, not vLLM's digests, so each full
//! block gets a 64-bit key chained from its predecessor's: a cheap
//! multiply-xorshift over the block's tokens, then a full 64-bit mix. Not
//! collision-resistant against crafted input, which a hit-rate estimate
//! does not need; for real traces a false hit is a 64-bit coincidence. Because a
//! stored prefix brings all its own prefixes with it, the set of keys is
//! prefix-closed and a request's hit is its leading run of known keys.

use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashSet;

use crate::{KvError, KvResult};

/// Keys are already uniformly mixed 64-bit values: hashing them again would
/// only cost time.
#[derive(Default)]
struct KeyIsHash(u64);

impl Hasher for KeyIsHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is reached for `u64` keys; fold anything else.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// `SplitMix64`'s finaliser: a bijective mix of 64 bits.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The chain's starting key for a salted request (FNV-1a, then mixed).
fn salt_key(salt: &[u8]) -> u64 {
    let fnv = salt.iter().fold(0xCBF2_9CE4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    });
    mix(fnv ^ 0xA5A5_5A5A_C3C3_3C3C)
}

/// An unbounded prefix cache keyed by chained 64-bit block keys.
pub struct UnboundedPrefixCache {
    block_size: usize,
    seen: HashSet<u64, BuildHasherDefault<KeyIsHash>>,
    keys: Vec<u64>,
    prompt_tokens: u64,
    hit_tokens: u64,
}

impl UnboundedPrefixCache {
    /// A cache that counts hits in whole blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> KvResult<Self> {
        if block_size == 0 {
            return Err(KvError::InvalidConfig {
                name: "block_size",
                value: "0".into(),
                rule: "must be positive".into(),
            });
        }
        Ok(Self {
            block_size,
            seen: HashSet::default(),
            keys: Vec::new(),
            prompt_tokens: 0,
            hit_tokens: 0,
        })
    }

    /// Block size the hits are counted in.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Prompt tokens seen so far.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    /// Prompt tokens an unbounded cache served so far.
    pub fn hit_tokens(&self) -> u64 {
        self.hit_tokens
    }

    /// Distinct prefixes stored.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing was stored yet.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Accounts one request and returns its hit in tokens.
    ///
    /// `tokens` are the request's prompt (its first `num_prompt`) followed
    /// by all its output tokens. The hit is the longest run of leading full
    /// blocks an earlier request computed, capped like vLLM's lookup at
    /// `num_prompt - 1` tokens (the last prompt token is always recomputed).
    /// Afterwards the request's computed tokens (the prompt and all but the
    /// last output token) stay cached forever. `salt` separates requests
    /// whose prefixes must never be shared (vLLM's `cache_salt`). On error
    /// nothing changed.
    pub fn add(
        &mut self,
        tokens: &[u32],
        num_prompt: usize,
        salt: Option<&[u8]>,
    ) -> KvResult<usize> {
        let bs = self.block_size;
        let num_prompt = num_prompt.min(tokens.len());
        let num_blocks = tokens.len().saturating_sub(1) / bs;
        let max_hit = (num_prompt.saturating_sub(1) / bs).min(num_blocks);
        self.keys.clear();
        crate::limits::try_reserve(&mut self.keys, num_blocks, "best-case block keys")?;
        let mut key = salt.map_or(0x5EED_CAFE_F00D_0001, salt_key);
        for block in tokens[..num_blocks * bs].chunks_exact(bs) {
            // one multiply per token; the block's value is mixed fully below
            let mut content = 0u64;
            for (pos, &t) in (1u64..).zip(block) {
                content =
                    (content ^ u64::from(t) ^ (pos << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                content ^= content >> 29;
            }
            key = mix(key ^ mix(content));
            self.keys.push(key);
        }
        let hit = self.keys[..max_hit]
            .iter()
            .take_while(|k| self.seen.contains(*k))
            .count();
        let new = num_blocks - hit;
        self.seen
            .try_reserve(new)
            .map_err(|_| KvError::OutOfMemory {
                what: "best-case prefix set",
                bytes: new.saturating_mul(16),
            })?;
        self.seen.extend(self.keys[hit..].iter().copied());
        let hit_tokens = hit * bs;
        // Totals over every request: saturating, never wrapped.
        self.prompt_tokens = self.prompt_tokens.saturating_add(num_prompt as u64);
        self.hit_tokens = self.hit_tokens.saturating_add(hit_tokens as u64);
        Ok(hit_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
        r.collect()
    }

    /// `add` with the prompt and the output apart.
    fn add(
        c: &mut UnboundedPrefixCache,
        prompt: &[u32],
        output: &[u32],
        salt: Option<&[u8]>,
    ) -> usize {
        let all: Vec<u32> = prompt.iter().chain(output).copied().collect();
        c.add(&all, prompt.len(), salt).unwrap()
    }

    #[test]
    fn second_request_hits_the_shared_full_blocks_only() {
        let mut c = UnboundedPrefixCache::new(4).unwrap();
        assert_eq!(add(&mut c, &toks(0..10), &[], None), 0);
        // 9 tokens computed -> blocks [0..4), [4..8) stored
        let mut p = toks(0..8);
        p.extend([100, 101, 102]);
        assert_eq!(add(&mut c, &p, &[7], None), 8);
        assert_eq!(c.prompt_tokens(), 21);
        assert_eq!(c.hit_tokens(), 8);
    }

    #[test]
    fn hit_is_capped_below_the_last_prompt_token() {
        let mut c = UnboundedPrefixCache::new(4).unwrap();
        add(&mut c, &toks(0..8), &[1, 2, 3], None);
        // the same 8-token prompt may reuse only 7 tokens: one full block
        assert_eq!(add(&mut c, &toks(0..8), &[], None), 4);
    }

    #[test]
    fn outputs_are_cached_and_salts_separate() {
        let mut c = UnboundedPrefixCache::new(2).unwrap();
        add(&mut c, &[1, 2], &[3, 4, 5], None); // computed 1 2 3 4
        assert_eq!(add(&mut c, &[1, 2, 3, 4, 9], &[], None), 4);
        assert_eq!(add(&mut c, &[1, 2, 3, 4, 9], &[], Some(b"salt")), 0);
    }

    #[test]
    fn a_changed_token_ends_the_hit_even_at_equal_later_blocks() {
        let mut c = UnboundedPrefixCache::new(2).unwrap();
        add(&mut c, &[1, 2, 3, 4, 5, 6, 0], &[], None);
        assert_eq!(add(&mut c, &[9, 2, 3, 4, 5, 6, 0], &[], None), 0);
        // block contents alone do not match: position in the block matters
        add(&mut c, &[7, 8, 0], &[], None);
        assert_eq!(add(&mut c, &[8, 7, 0], &[], None), 0);
    }

    #[test]
    fn zero_block_size_is_a_config_error() {
        assert!(UnboundedPrefixCache::new(0).is_err());
    }
}
