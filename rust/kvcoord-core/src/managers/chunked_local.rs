//! Chunked local attention: tokens attend only within their chunk of
//! `attention_chunk_size` tokens, so everything before the current chunk is
//! skipped (null) and a hit is a left-to-right run inside the last chunk.

use super::hash_view::{lookup_all, HashView, HitLists};
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId};
use crate::pool::BlockPool;

/// Tokens before the chunk that holds the token after the first `n`.
#[inline]
pub fn num_skipped_tokens(n: usize, chunk: usize) -> usize {
    n / chunk * chunk
}

/// Positions before the chunk containing `max_length` are null (counted as
/// computed: outside the local window); then scan left to right to the first
/// miss. The hit counts the null prefix.
pub(crate) fn find_longest_cache_hit(
    pool: &BlockPool,
    groups: &[GroupId],
    view: &HashView<'_>,
    chunk: usize,
    max_length: usize,
    alignment: usize,
    out: &mut HitLists,
) -> KvResult<usize> {
    let bs = view.block_size();
    if bs != alignment {
        return Err(KvError::Unsupported {
            what: format!(
                "chunked-local lookup with hit alignment {alignment} != block size {bs} \
                 (different block sizes are not supported)"
            ),
        });
    }
    let first = num_skipped_tokens(max_length, chunk) / bs;
    if first > view.len() {
        // The null prefix would claim tokens the request does not have.
        return Err(KvError::InvalidArgument {
            name: "max_length",
            detail: format!(
                "{max_length} tokens reach past the {} hashed blocks",
                view.len()
            ),
        });
    }
    for list in out.iter_mut() {
        list.resize(first, BlockId::NULL);
    }
    let max_blocks = (max_length / bs).min(view.len());
    let mut i = first;
    while i < max_blocks && lookup_all(pool, groups, view.get(i), out) {
        i += 1;
    }
    Ok(out.first().map_or(0, Vec::len) * bs)
}

#[cfg(test)]
mod tests {
    use crate::ids::{BlockId, GroupId};
    use crate::managers::test_util::{cache_block, h, hashes, ids, pool};
    use crate::managers::{GroupSpec, GroupTable, Manager};

    /// B = 2, chunk 4: `pattern` over the first blocks, `tail` extra tokens.
    fn find(pattern: &[bool], tail: usize) -> usize {
        let mut p = pool(40, 2);
        for (i, &c) in pattern.iter().enumerate() {
            if c {
                cache_block(&mut p, i as u32 + 1, &h(i as u32));
            }
        }
        let m = Manager::new(GroupSpec::chunked_local(2, 4), GroupId(0)).unwrap();
        let mut out = vec![Vec::new()];
        let hs = hashes(pattern.len() as u32);
        let max = pattern.len() * 2 + tail;
        let hit = m
            .find_longest_cache_hit(&p, &[GroupId(0)], &hs, 2, max, 2, false, &mut out)
            .unwrap();
        assert_eq!(hit, out[0].len() * 2);
        let first = max / 4 * 4 / 2;
        assert!(out[0][..first.min(out[0].len())]
            .iter()
            .all(|b| b.is_null()));
        out[0].len()
    }

    #[test]
    fn finder_table_37() {
        let (t, f) = (true, false);
        assert_eq!(find(&[t], 0), 1);
        assert_eq!(find(&[t], 1), 1);
        assert_eq!(find(&[t, f], 0), 2);
        assert_eq!(find(&[t, t, f], 1), 2);
        assert_eq!(find(&[t, t, t], 0), 3);
        assert_eq!(find(&[t, t, t, f], 0), 4);
        let random = [t, f, t, f, f, t, t, f];
        let with = |extra: &[bool]| [&random[..], extra].concat();
        assert_eq!(find(&with(&[t]), 1), 9);
        assert_eq!(find(&with(&[f]), 0), 8);
        assert_eq!(find(&with(&[t, t]), 1), 10);
        for last in [[f, f], [f, t], [t, f], [t, t]] {
            assert_eq!(find(&with(&last), 0), 10);
        }
    }

    #[test]
    fn eagle_drop_is_refused() {
        // vLLM's chunked-local finder asserts that no EAGLE drop is asked.
        let p = pool(8, 2);
        let m = Manager::new(GroupSpec::chunked_local(2, 4), GroupId(0)).unwrap();
        let mut out = vec![Vec::new()];
        let err = m
            .find_longest_cache_hit(&p, &[GroupId(0)], &hashes(2), 2, 4, 2, true, &mut out)
            .unwrap_err();
        assert!(err.to_string().contains("EAGLE"), "{err}");
    }

    #[test]
    fn skipped_block_removal_39() {
        let m = Manager::new(GroupSpec::chunked_local(2, 4), GroupId(0)).unwrap();
        let mut p = pool(40, 2);
        let mut t = GroupTable::default();
        m.allocate_new_blocks(&mut p, &mut t, 20, &mut Vec::new())
            .unwrap();
        let mut scratch = Vec::new();
        for (processed, nulls) in [(4, 2), (6, 2), (12, 6)] {
            m.remove_skipped_blocks(&mut p, &mut t, processed, None, &mut scratch)
                .unwrap();
            assert_eq!(t.num_leading_nulls(), nulls);
        }
        assert_eq!(t.blocks()[6], BlockId(7));
        p.check_invariants().unwrap();
        let _ = ids(&[]);
    }
}
