//! Reference sliding-window attention (R-SWA, vLLM 0.33.0's `RSWAManager`):
//! the prompt stays fully visible, but only the last `rswa_window` generated
//! tokens do. Lookups and caching are those of full attention; every
//! allocation first releases the decode gap between the prompt's last block
//! and the window. Released gap blocks keep their cache keys, so a later
//! request whose prompt covers them can hit them again.

use crate::error::KvResult;
use crate::ids::BlockId;
use crate::pool::BlockPool;

/// The table entries of the decode gap once `processed` tokens are computed:
/// from the first block wholly after the prompt up to (not including) the
/// block holding the window's first token. Empty while the window still
/// reaches into the prompt.
#[inline]
pub fn gap(
    num_prompt_tokens: usize,
    processed: usize,
    rswa_window: usize,
    block_size: usize,
) -> std::ops::Range<usize> {
    let first = num_prompt_tokens.div_ceil(block_size);
    let window_start = num_prompt_tokens.max(processed.saturating_sub(rswa_window));
    first..window_start / block_size
}

/// Release the gap (see [`gap`]): walk it from the highest entry down, stop
/// at the first entry already null, and free the collected blocks in that
/// order (highest first).
pub(crate) fn remove_gap(
    pool: &mut BlockPool,
    blocks: &mut [BlockId],
    range: std::ops::Range<usize>,
    scratch: &mut Vec<BlockId>,
) -> KvResult<()> {
    let last = range.end.min(blocks.len());
    if range.start >= last {
        return Ok(());
    }
    scratch.clear();
    for entry in blocks[range.start..last].iter_mut().rev() {
        if entry.is_null() {
            break;
        }
        scratch.push(std::mem::replace(entry, BlockId::NULL));
    }
    pool.free_blocks(scratch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::GroupId;
    use crate::managers::test_util::{ids, pool};
    use crate::managers::{GroupSpec, GroupTable, Manager};

    #[test]
    fn gap_ranges() {
        // Prompt 16, block 4, window 8 (vLLM's own cases).
        assert_eq!(gap(16, 28, 8, 4), 4..5);
        assert_eq!(gap(16, 36, 8, 4), 4..7);
        assert!(gap(16, 20, 8, 4).is_empty());
        // A partly filled prompt block is never part of the gap.
        assert_eq!(gap(18, 40, 8, 4), 5..8);
    }

    #[test]
    fn frees_the_gap_highest_first_and_stops_at_nulls() {
        let m = Manager::new(GroupSpec::rswa(4, 8), GroupId(0)).unwrap();
        let mut p = pool(20, 4);
        let mut t = GroupTable::default();
        let mut new = Vec::new();
        m.allocate_new_blocks(&mut p, &mut t, 36, &mut new).unwrap();
        assert_eq!(ids(&new), (1..=9).collect::<Vec<_>>());
        let mut scratch = Vec::new();
        m.remove_skipped_blocks(&mut p, &mut t, 28, Some(16), &mut scratch)
            .unwrap();
        assert_eq!(ids(&t.blocks), [1, 2, 3, 4, 0, 6, 7, 8, 9]);
        m.remove_skipped_blocks(&mut p, &mut t, 36, Some(16), &mut scratch)
            .unwrap();
        assert_eq!(ids(&t.blocks), [1, 2, 3, 4, 0, 0, 0, 8, 9]);
        // Freed uncached blocks go to the front of the queue in the order
        // freed: the second call's 7 and 6 ahead of the first call's 5.
        assert_eq!(
            ids(&p.free_block_ids().take(3).collect::<Vec<_>>()),
            [7, 6, 5]
        );
        // Without the prompt length nothing is freed (plain full attention).
        m.remove_skipped_blocks(&mut p, &mut t, 60, None, &mut scratch)
            .unwrap();
        assert_eq!(t.num_leading_nulls(), 0);
        t.check_invariants(true).unwrap();
    }
}
