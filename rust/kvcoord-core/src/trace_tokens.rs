//! Token ids synthesised from a Mooncake trace's block hash ids, for
//! `kvcoord replay` (`kvcoord.replay.workloads.mooncake_prompt_tokens`).
//!
//! A Mooncake request names its prompt by `hash_ids`, one per 512-token
//! block. Token `j` of the block named `h` is a hash of `(h, j)` reduced to
//! `[0, VOCAB_SIZE)`, so equal ids give equal token runs and an equal id
//! prefix an equal token prefix at any block size. This is the same
//! arithmetic as the numpy reference in the Python package (its tests check
//! the two agree), in one pass with no temporaries: a long trace
//! synthesises over a hundred million tokens.

use std::sync::OnceLock;

/// Tokens named by one hash id.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;
/// Synthesised token ids are in `[0, VOCAB_SIZE)`.
pub const VOCAB_SIZE: u32 = 32000;

/// The `splitmix64` finaliser (wrapping arithmetic).
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-position keys of a block: `splitmix64(j + 0xA5A5)`.
fn offset_keys() -> &'static [u64; MOONCAKE_BLOCK_TOKENS] {
    static KEYS: OnceLock<[u64; MOONCAKE_BLOCK_TOKENS]> = OnceLock::new();
    KEYS.get_or_init(|| std::array::from_fn(|j| splitmix64(j as u64 + 0xA5A5)))
}

/// Append the prompt of a Mooncake request to `out`: the blocks of
/// `hash_ids` (as many as `input_length` needs), cut at `input_length`.
/// Fewer ids than that give a shorter prompt (every token of every id).
/// The tokens are reserved fallibly (`OutOfMemory`, `out` unchanged).
pub fn mooncake_prompt_tokens(
    hash_ids: &[u64],
    input_length: usize,
    out: &mut Vec<u32>,
) -> crate::KvResult<()> {
    let n_blocks = input_length.div_ceil(MOONCAKE_BLOCK_TOKENS);
    let ids = &hash_ids[..n_blocks.min(hash_ids.len())];
    let total = ids
        .len()
        .saturating_mul(MOONCAKE_BLOCK_TOKENS)
        .min(input_length);
    crate::limits::try_reserve(out, total, "a Mooncake prompt's tokens")?;
    let keys = offset_keys();
    let mut left = total;
    for &h in ids {
        let base = splitmix64(
            h.wrapping_mul(0x100_0000_01B3)
                .wrapping_add(0x6D6F_6F6E_6361_6B65),
        );
        let take = left.min(MOONCAKE_BLOCK_TOKENS);
        out.extend(keys[..take].iter().map(|&k| {
            // the high 31 bits of the mixed word, reduced to the vocabulary
            let high = ((base ^ k).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 33) as u32;
            high % VOCAB_SIZE
        }));
        left -= take;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(ids: &[u64], n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        mooncake_prompt_tokens(ids, n, &mut out).unwrap();
        out
    }

    #[test]
    fn shared_ids_share_tokens() {
        let a = tokens(&[7, 9], 1000);
        assert_eq!(a.len(), 1000);
        assert_eq!(tokens(&[7], 512), a[..512]);
        assert_eq!(tokens(&[9], 488), a[512..]);
        assert!(a.iter().all(|&t| t < VOCAB_SIZE));
        assert_ne!(tokens(&[8], 512), a[..512]);
    }

    #[test]
    fn short_id_lists_and_empty_prompts() {
        assert!(tokens(&[1, 2], 0).is_empty());
        assert_eq!(tokens(&[1], 2000).len(), 512, "one id names 512 tokens");
        assert!(tokens(&[], 10).is_empty());
    }

    #[test]
    fn pinned_values() {
        // the numpy reference's values (kvcoord.replay.workloads)
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(tokens(&[0], 4), [31417, 2012, 26557, 20574]);
        let t = tokens(&[12_345_678_901_234, 5], 1000);
        assert_eq!([t[0], t[511], t[512], t[999]], [25733, 11319, 27315, 7147]);
    }
}
