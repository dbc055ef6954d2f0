//! `HiSparse` device groups (vLLM 0.33.0's `HiSparseResidentManager` and
//! `HiSparseHotManager`): the groups of a model whose KV lives on a host
//! tier, of which only some pages stay on the device.
//!
//! **Resident groups**
//! ([`SpecKind::HiSparseResident`](super::SpecKind::HiSparseResident)).
//! A request's table has one entry per page, append-only: the null block
//! for a page that lives only on the host (a prefix hit, an import), else a
//! device block.
//! Residency changes are an overlay on top of it ([`HiSparseRow`]): a null
//! page pointed at a device copy of its contents (adopted), a device page
//! dropped (read from the host again). The row with the overlay applied is
//! what the request reads; each of its real pages holds one reference,
//! except an adopted page until the adopter's `touch` backs it. A block's
//! reference may be given up while rows still read it (*unpinned*: the pool
//! counts the block as free and may hand it out, and the readers must then
//! drop their pages); as in vLLM's pool, that reference is anonymous, so the
//! coordinator keeps the count per group and block (see
//! `coordinator::hisparse_rows`). Admission caps a request's pages
//! at `cdiv(min(max_in_flight_tokens, max_model_len), block_size)`; an
//! import keeps its last page writable (one device block) and leaves the
//! pages before it on the host.
//!
//! **Hot groups** ([`SpecKind::HiSparseHot`](super::SpecKind::HiSparseHot)).
//! A request gets exactly `blocks_per_request` blocks once it must read
//! from the host (an import, a new request resuming a host prefix, or on
//! demand: `HiSparseRow::hot_required`); until then it holds none.
//!
//! Neither kind is prefix-cacheable (the host group caches for them) and
//! neither releases blocks behind its attention. The policy deciding when
//! pages are adopted, unpinned or dropped is the `HiSparse` coordinator's,
//! above these rules.

use super::table::GroupTable;
pub use super::table::HiSparseRow;
use crate::error::{KvError, KvResult};
use crate::ids::BlockId;
use crate::pool::BlockPool;

/// The overlay's invariants: changes lie within the table, and every
/// unbacked page is a real page of the row.
pub fn check_row(table: &GroupTable) -> Result<(), String> {
    let n = table.blocks.len();
    let row = &table.hisparse;
    if let Some((&page, _)) = row.changes.range(n..).next() {
        return Err(format!(
            "residency change at page {page} past the table ({n} pages)"
        ));
    }
    if let Some(&page) = row
        .unbacked
        .iter()
        .find(|&&p| resident_page(table, p).is_none())
    {
        return Err(format!("unbacked page {page} is not resident"));
    }
    Ok(())
}

// ---- resident groups ---------------------------------------------------

/// The block a resident page is read from (overlay applied), `None` when
/// the page is read from the host or lies past the table.
pub fn resident_page(table: &GroupTable, page: usize) -> Option<BlockId> {
    let &b = table.blocks.get(page)?;
    let b = table.hisparse.changes.get(&page).copied().unwrap_or(b);
    (!b.is_null()).then_some(b)
}

/// The row from page `start` with the overlay applied (host-only pages
/// stay null), appended to `out`.
pub fn residency_row(table: &GroupTable, start: usize, out: &mut Vec<BlockId>) {
    let changes = &table.hisparse.changes;
    for (page, &b) in table.blocks.iter().enumerate().skip(start) {
        out.push(changes.get(&page).copied().unwrap_or(b));
    }
}

/// The references the row's pages hold: its real pages (overlay applied),
/// less the unbacked ones. References given up by unpinning are counted
/// apart, per block.
pub fn referenced(table: &GroupTable) -> impl Iterator<Item = BlockId> + '_ {
    let row = &table.hisparse;
    table
        .blocks
        .iter()
        .enumerate()
        .filter_map(move |(page, &b)| {
            let b = row.changes.get(&page).copied().unwrap_or(b);
            (!b.is_null() && !row.unbacked.contains(&page)).then_some(b)
        })
}

/// Point host-only page `page` at `block`, a device copy of its contents
/// (vLLM's `adopt_resident_page`): the page is unbacked until the adopter
/// takes its reference ([`back_page`]). `false` (nothing changed) when the
/// page is past the table or already resident.
pub fn adopt_page(table: &mut GroupTable, page: usize, block: BlockId) -> KvResult<bool> {
    if block.is_null() {
        return Err(KvError::InvalidArgument {
            name: "block",
            detail: "a page cannot adopt the null block".into(),
        });
    }
    if page >= table.blocks.len() || resident_page(table, page).is_some() {
        return Ok(false);
    }
    table.hisparse.changes.insert(page, block);
    table.hisparse.unbacked.insert(page);
    Ok(true)
}

/// The adopter took the reference of adopted page `page`.
pub fn back_page(table: &mut GroupTable, page: usize) {
    table.hisparse.unbacked.remove(&page);
}

/// Whether `page` was adopted and not backed yet.
pub fn is_unbacked(table: &GroupTable, page: usize) -> bool {
    table.hisparse.unbacked.contains(&page)
}

/// Make resident page `page` host-only (vLLM's `drop_resident_page`);
/// returns the block it was read from, `None` for a host-only page. The
/// caller accounts for the reference (see `coordinator::hisparse_rows`).
pub fn drop_page(table: &mut GroupTable, page: usize) -> Option<BlockId> {
    let b = resident_page(table, page)?;
    table.hisparse.changes.insert(page, BlockId::NULL);
    Some(b)
}

/// Blocks a resident group pulls for `num_tokens` slots with `total`
/// computed tokens of which `local` are local (prefix hits): vLLM's
/// `HiSparseResidentManager.get_num_blocks_to_allocate`. An import
/// (`total > local`) needs its last page writable plus the pages past it;
/// otherwise the pages past the host prefix, capped at `cap` pages.
pub fn resident_blocks_to_allocate(
    table: Option<&GroupTable>,
    block_size: usize,
    num_tokens: usize,
    total: usize,
    local: usize,
    cap: Option<usize>,
) -> usize {
    let existing = table.map_or(0, |t| t.blocks.len());
    if total > local {
        let imported = total.div_ceil(block_size);
        let tail_missing = table.is_none_or(|t| resident_page(t, imported - 1).is_none());
        return usize::from(tail_missing)
            + num_tokens
                .div_ceil(block_size)
                .saturating_sub(imported.max(existing));
    }
    let host_pages = local.div_ceil(block_size);
    let mut required = num_tokens.div_ceil(block_size);
    if let Some(cap) = cap {
        required = required.min(cap);
    }
    required.saturating_sub(existing.max(host_pages))
}

/// A new request's host prefix: one null page per page of the `local`
/// computed tokens.
pub fn resident_add_local(table: &mut GroupTable, block_size: usize, local: usize) {
    table
        .blocks
        .resize(local.div_ceil(block_size), BlockId::NULL);
    table.num_cached = 0;
}

/// An import of `total` computed tokens: the pages before its last stay on
/// the host (null); the last gets a writable device block unless it is
/// resident already.
pub fn resident_add_external(
    pool: &mut BlockPool,
    table: &mut GroupTable,
    block_size: usize,
    total: usize,
    scratch: &mut Vec<BlockId>,
) -> KvResult<()> {
    if total == 0 {
        return Ok(());
    }
    let tail = (total - 1) / block_size;
    if table.blocks.len() <= tail {
        table.blocks.resize(tail + 1, BlockId::NULL);
    }
    if resident_page(table, tail).is_none() {
        scratch.clear();
        pool.get_new_blocks(1, scratch)?;
        table.blocks[tail] = scratch[0];
        table.hisparse.changes.remove(&tail);
        scratch.clear();
    }
    Ok(())
}

/// Release a resident row: every referenced page (overlay applied,
/// unbacked pages hold nothing), tail first, leading nulls trimmed.
pub fn resident_free(pool: &mut BlockPool, table: &mut GroupTable) -> KvResult<()> {
    let mut held: Vec<BlockId> = referenced(table).collect();
    held.reverse();
    let res = pool.free_blocks(&held);
    table.blocks.clear();
    table.num_cached = 0;
    table.hisparse.clear();
    res
}

// ---- hot groups --------------------------------------------------------

/// Blocks a hot group pulls: its whole region (less what it holds) once the
/// request must read from the host — an import (`total > local`), a new
/// request resuming a host prefix (`local > 0`, `table` is `None`), or a
/// request asked to — else none (vLLM's `HiSparseHotManager`).
pub fn hot_blocks_to_allocate(
    table: Option<&GroupTable>,
    blocks_per_request: usize,
    total: usize,
    local: usize,
) -> usize {
    let import = total > local;
    let resumes = local > 0 && table.is_none();
    let required = table.is_some_and(|t| t.hisparse.hot_required);
    if import || resumes || required {
        let held = table.map_or(0, |t| t.blocks.len());
        blocks_per_request.saturating_sub(held)
    } else {
        0
    }
}

/// A new request adopting a prefix: it needs its hot region when it
/// resumes a host prefix, or always when the configuration has no resident
/// group (nothing else can hold its pages).
pub fn hot_add_local(table: &mut GroupTable, local: usize, has_resident_groups: bool) {
    table.num_cached = 0;
    if local > 0 || !has_resident_groups {
        table.hisparse.hot_required = true;
    }
}

/// Grow a hot table to its region when it is required, appending the new
/// ids to `new_blocks`.
pub fn hot_allocate_new(
    pool: &mut BlockPool,
    table: &mut GroupTable,
    blocks_per_request: usize,
    new_blocks: &mut Vec<BlockId>,
) -> KvResult<()> {
    if !table.hisparse.hot_required {
        return Ok(());
    }
    let n = blocks_per_request.saturating_sub(table.blocks.len());
    if n > 0 {
        let start = new_blocks.len();
        pool.get_new_blocks(n, new_blocks)?;
        table.blocks.extend_from_slice(&new_blocks[start..]);
    }
    Ok(())
}

/// Whether a hot table holds its whole region.
pub fn has_hot(table: &GroupTable, blocks_per_request: usize) -> bool {
    table.blocks.len() == blocks_per_request
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managers::test_util::pool;

    fn table(ids: &[u32]) -> GroupTable {
        GroupTable {
            blocks: ids.iter().map(|&i| BlockId(i)).collect(),
            ..GroupTable::default()
        }
    }

    #[test]
    fn overlay_adopt_and_drop() {
        let mut p = pool(10, 4);
        let mut ids = Vec::new();
        p.get_new_blocks(2, &mut ids).unwrap();
        // Page 0 host-only, page 1 on the device.
        let mut t = GroupTable {
            blocks: vec![BlockId::NULL, ids[0]],
            ..GroupTable::default()
        };
        assert_eq!(resident_page(&t, 0), None);
        assert_eq!(resident_page(&t, 1), Some(ids[0]));
        assert_eq!(resident_page(&t, 2), None);
        // Adopt a copy into page 0; page 1 and past the table refuse.
        assert!(adopt_page(&mut t, 0, ids[1]).unwrap());
        assert!(!adopt_page(&mut t, 1, ids[1]).unwrap());
        assert!(!adopt_page(&mut t, 5, ids[1]).unwrap());
        assert!(adopt_page(&mut t, 0, BlockId::NULL).is_err());
        let mut row = Vec::new();
        residency_row(&t, 0, &mut row);
        assert_eq!(row, vec![ids[1], ids[0]]);
        // Unbacked until the adopter's touch.
        assert!(is_unbacked(&t, 0));
        assert_eq!(referenced(&t).collect::<Vec<_>>(), vec![ids[0]]);
        back_page(&mut t, 0);
        assert_eq!(referenced(&t).collect::<Vec<_>>(), vec![ids[1], ids[0]]);
        // Dropping makes the page host-only; the table stays append-only.
        assert_eq!(drop_page(&mut t, 1), Some(ids[0]));
        assert_eq!(drop_page(&mut t, 1), None);
        assert_eq!(t.blocks[1], ids[0]);
        check_row(&t).unwrap();
        // Freeing releases what the row references: the adopted copy.
        p.touch(&[ids[1]]).unwrap();
        resident_free(&mut p, &mut t).unwrap();
        assert_eq!(p.ref_count(ids[1]).unwrap(), 1);
        assert_eq!(p.ref_count(ids[0]).unwrap(), 1);
        assert!(t.hisparse.is_empty() && t.blocks.is_empty());
        p.check_invariants().unwrap();
    }

    #[test]
    fn row_invariants_catch_a_broken_overlay() {
        let mut t = table(&[0, 3]);
        check_row(&t).unwrap();
        // A change past the table.
        t.hisparse.changes.insert(2, BlockId(4));
        assert!(check_row(&t).unwrap_err().contains("past the table"));
        t.hisparse.changes.clear();
        // An unbacked page that is read from the host.
        t.hisparse.unbacked.insert(0);
        assert!(check_row(&t).unwrap_err().contains("not resident"));
        t.hisparse.unbacked.clear();
        t.hisparse.unbacked.insert(1);
        check_row(&t).unwrap();
        assert_eq!(referenced(&t).count(), 0);
    }

    #[test]
    fn resident_prediction() {
        let bs = 16;
        // A new request with a 2-page host prefix, 64 tokens: 2 device pages.
        assert_eq!(resident_blocks_to_allocate(None, bs, 64, 32, 32, None), 2);
        // Capped at 3 pages of admission: 1 more than the prefix.
        assert_eq!(
            resident_blocks_to_allocate(None, bs, 64, 32, 32, Some(3)),
            1
        );
        // An import of 40 tokens (pages 0-2) then 8 new: the tail page only.
        assert_eq!(resident_blocks_to_allocate(None, bs, 48, 40, 0, None), 1);
        // An import whose tail page is resident already: only the pages past it.
        let t = table(&[0, 0, 3]);
        assert_eq!(
            resident_blocks_to_allocate(Some(&t), bs, 80, 40, 0, None),
            2
        );
        // A running request: pages past its table.
        assert_eq!(
            resident_blocks_to_allocate(Some(&t), bs, 64, 48, 48, None),
            1
        );
    }

    #[test]
    fn resident_import_keeps_a_writable_tail() {
        let mut p = pool(10, 4);
        let mut t = GroupTable::default();
        resident_add_local(&mut t, 16, 16);
        assert_eq!(t.blocks, vec![BlockId::NULL]);
        let mut scratch = Vec::new();
        resident_add_external(&mut p, &mut t, 16, 33, &mut scratch).unwrap();
        assert_eq!(t.blocks.len(), 3);
        assert!(t.blocks[..2].iter().all(|b| b.is_null()));
        assert!(!t.blocks[2].is_null());
        // Again: the tail is resident, nothing taken.
        let free = p.num_free_blocks();
        resident_add_external(&mut p, &mut t, 16, 33, &mut scratch).unwrap();
        assert_eq!(p.num_free_blocks(), free);
        t.check_invariants(false).unwrap();
    }

    #[test]
    fn hot_region_on_demand() {
        let mut p = pool(10, 4);
        // A cold admission needs none; a host-prefix resume or import needs all.
        assert_eq!(hot_blocks_to_allocate(None, 2, 0, 0), 0);
        assert_eq!(hot_blocks_to_allocate(None, 2, 16, 16), 2);
        assert_eq!(hot_blocks_to_allocate(None, 2, 16, 0), 2);
        let mut t = GroupTable::default();
        // Running: only once asked.
        assert_eq!(hot_blocks_to_allocate(Some(&t), 2, 16, 16), 0);
        let mut new = Vec::new();
        hot_allocate_new(&mut p, &mut t, 2, &mut new).unwrap();
        assert!(new.is_empty() && !has_hot(&t, 2));
        t.hisparse.hot_required = true;
        assert_eq!(hot_blocks_to_allocate(Some(&t), 2, 16, 16), 2);
        hot_allocate_new(&mut p, &mut t, 2, &mut new).unwrap();
        assert_eq!(new.len(), 2);
        assert!(has_hot(&t, 2));
        assert_eq!(hot_blocks_to_allocate(Some(&t), 2, 16, 16), 0);
        // Adopting a prefix without resident groups always asks.
        let mut u = GroupTable::default();
        hot_add_local(&mut u, 0, true);
        assert!(!u.hisparse.hot_required);
        hot_add_local(&mut u, 0, false);
        assert!(u.hisparse.hot_required);
    }
}
