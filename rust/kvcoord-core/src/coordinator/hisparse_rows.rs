//! The coordinator's calls on a request's `HiSparse` rows (see
//! [`managers::hisparse`](crate::managers::hisparse)): what vLLM's
//! `HiSparseCoordinator` asks of its resident and hot managers and of their
//! pool, call for call, and the caller's extra references on blocks
//! (`touch`), which its spills take.
//!
//! vLLM's references are anonymous counts, and its coordinator's pool calls
//! name blocks, not pages: it unpins a block, and drops the pages reading
//! it later; it adopts a page, then touches the block. So the accounting is
//! per group and block, as anonymous: references given up by unpinning
//! (each later consumed by a drop of a page reading the block), and
//! adoptions waiting for their touch. The invariant per block is: pool
//! references = row pages (overlay applied, unbacked ones excluded) -
//! given up + caller references.

use super::CoordinatorCore;
use crate::error::{KvError, KvResult};
use crate::ids::{BlockId, GroupId, ReqId};
use crate::managers::{hisparse, GroupTable};
use crate::spec::SpecKind;

impl CoordinatorCore {
    /// The core id of a live request known by its scheduler id.
    pub fn request_id(&self, id: &str) -> KvResult<ReqId> {
        self.req_of(id)
    }

    /// `req`'s table in `group`, which must be of a `HiSparse` resident kind.
    fn resident_table(&self, req: ReqId, group: GroupId) -> KvResult<&GroupTable> {
        self.check_kind(group, true)?;
        let tables = self.tables(req)?;
        Ok(&tables[group.0 as usize])
    }

    /// Refuse a group that is not a `HiSparse` resident (`resident`) or hot
    /// group.
    fn check_kind(&self, group: GroupId, resident: bool) -> KvResult<()> {
        let m = self
            .managers
            .get(group.0 as usize)
            .ok_or(KvError::UnknownGroup(group))?;
        let ok = match m.spec().kind {
            SpecKind::HiSparseResident => resident,
            SpecKind::HiSparseHot { .. } => !resident,
            _ => false,
        };
        if ok {
            return Ok(());
        }
        let want = if resident { "resident" } else { "hot" };
        Err(KvError::InvalidArgument {
            name: "group",
            detail: format!(
                "group {group} is a {} group, not a HiSparse {want} group",
                m.spec().facts().spec_name
            ),
        })
    }

    /// `req`'s table in `group`, mutably, with the pool (kind checked).
    fn row_mut(
        &mut self,
        req: ReqId,
        group: GroupId,
        resident: bool,
    ) -> KvResult<(&mut crate::pool::BlockPool, &mut GroupTable)> {
        self.check_kind(group, resident)?;
        let tables = self
            .requests
            .get_mut(&req)
            .ok_or(KvError::RequestWithoutBlocks(req))?;
        Ok((&mut self.pool, &mut tables[group.0 as usize]))
    }

    /// The block page `page` of `req` is read from in resident group
    /// `group` (overlay applied), `None` when it is read from the host.
    pub fn resident_page(
        &self,
        req: ReqId,
        group: GroupId,
        page: usize,
    ) -> KvResult<Option<BlockId>> {
        Ok(hisparse::resident_page(
            self.resident_table(req, group)?,
            page,
        ))
    }

    /// `req`'s row in resident group `group` from page `start`, overlay
    /// applied (host-only pages are the null block).
    pub fn residency_row(
        &self,
        req: ReqId,
        group: GroupId,
        start: usize,
    ) -> KvResult<Vec<BlockId>> {
        let mut out = Vec::new();
        hisparse::residency_row(self.resident_table(req, group)?, start, &mut out);
        Ok(out)
    }

    /// Point `req`'s host-only page `page` in resident group `group` at
    /// `block` (a device copy of its contents; vLLM's `adopt_resident_page`).
    /// The page holds no reference until the next
    /// [`touch_resident_blocks`](Self::touch_resident_blocks) of `block` in
    /// `group` takes it. `false` when the page is resident already or past
    /// the table.
    pub fn adopt_resident_page(
        &mut self,
        req: ReqId,
        group: GroupId,
        page: usize,
        block: BlockId,
    ) -> KvResult<bool> {
        self.check_block(block)?;
        let (_, t) = self.row_mut(req, group, true)?;
        let adopted = hisparse::adopt_page(t, page, block)?;
        if adopted {
            self.hisparse.pending.push((req, group, page, block));
        }
        Ok(adopted)
    }

    /// Take one reference on each block of resident group `group` (vLLM's
    /// `touch` on that group's pool): it backs the oldest adoption of the
    /// block waiting for it, else it is a caller reference
    /// ([`free_caller_blocks`](Self::free_caller_blocks) releases it).
    pub fn touch_resident_blocks(&mut self, group: GroupId, blocks: &[BlockId]) -> KvResult<()> {
        self.check_kind(group, true)?;
        self.pool.touch(blocks)?;
        for &b in blocks.iter().filter(|b| !b.is_null()) {
            let found = self
                .hisparse
                .pending
                .iter()
                .position(|&(_, g, _, pb)| g == group && pb == b);
            if let Some(i) = found {
                let (req, g, page, _) = self.hisparse.pending.remove(i);
                if let Some(tables) = self.requests.get_mut(&req) {
                    hisparse::back_page(&mut tables[g.0 as usize], page);
                }
            } else {
                *self.caller_held.entry(b).or_insert(0) += 1;
            }
        }
        Ok(())
    }

    /// Give up one reference on `block` of resident group `group` while the
    /// pages reading it keep doing so (vLLM's `BlockPool.unpin_blocks`): the
    /// pool watches the block and reports it through
    /// [`take_reused_watched`](crate::pool::BlockPool::take_reused_watched)
    /// once it hands it out. Refused (nothing changed) unless a table holds
    /// a reference on it beyond the caller's; `check_invariants` checks that
    /// rows of `group` read it.
    pub fn unpin_resident_block(&mut self, group: GroupId, block: BlockId) -> KvResult<()> {
        self.check_kind(group, true)?;
        self.check_block(block)?;
        let held = self.pool.ref_count(block)?;
        let caller = self.caller_held.get(&block).copied().unwrap_or(0);
        if held <= caller {
            return Err(KvError::InvalidArgument {
                name: "block",
                detail: format!("block {block} holds no reference of a request to give up"),
            });
        }
        self.pool.unpin_blocks(&[block])?;
        *self.hisparse.given_up.entry((group, block)).or_insert(0) += 1;
        Ok(())
    }

    /// [`unpin_resident_block`](Self::unpin_resident_block) of the block
    /// `req`'s page `page` is read from; returns it (`None`, nothing
    /// changed, for a host-only page).
    pub fn unpin_resident_page(
        &mut self,
        req: ReqId,
        group: GroupId,
        page: usize,
    ) -> KvResult<Option<BlockId>> {
        let Some(b) = self.resident_page(req, group, page)? else {
            return Ok(None);
        };
        self.unpin_resident_block(group, b)?;
        Ok(Some(b))
    }

    /// Make `req`'s page `page` of `group` host-only (vLLM's
    /// `drop_resident_page`: the pool reused its block, or the request lets
    /// it go); it consumes a reference given up on its block. Returns the
    /// block it was read from, `None` for a host-only page. Refused
    /// (nothing changed) when no reference on the block was given up, or
    /// the page's adoption is not backed yet (the page would keep, or
    /// lose, a reference nothing accounts for).
    pub fn drop_resident_page(
        &mut self,
        req: ReqId,
        group: GroupId,
        page: usize,
    ) -> KvResult<Option<BlockId>> {
        let Some(b) = self.resident_page(req, group, page)? else {
            return Ok(None);
        };
        let refused = |detail: String| KvError::InvalidArgument {
            name: "page",
            detail,
        };
        if hisparse::is_unbacked(&self.tables(req)?[group.0 as usize], page) {
            return Err(refused(format!(
                "page {page} was adopted and not touched yet"
            )));
        }
        let Some(n) = self.hisparse.given_up.get_mut(&(group, b)) else {
            return Err(refused(format!(
                "page {page} still holds its reference on block {b}: unpin it first"
            )));
        };
        *n -= 1;
        if *n == 0 {
            self.hisparse.given_up.remove(&(group, b));
        }
        let (_, t) = self.row_mut(req, group, true)?;
        Ok(hisparse::drop_page(t, page))
    }

    /// Refuse the null block and ids out of range.
    fn check_block(&self, block: BlockId) -> KvResult<()> {
        if block.is_null() || !self.pool.ids_in_range(&[block]) {
            return Err(KvError::InvalidArgument {
                name: "block",
                detail: format!("block {block} is the null block or out of range"),
            });
        }
        Ok(())
    }

    /// Ask for `req`'s hot region in hot group `group`: its next allocation
    /// (and prediction) includes it.
    pub fn require_hot(&mut self, req: ReqId, group: GroupId) -> KvResult<()> {
        let (_, t) = self.row_mut(req, group, false)?;
        t.hisparse.hot_required = true;
        Ok(())
    }

    /// Whether `req` holds its whole hot region in hot group `group`.
    pub fn has_hot(&self, req: ReqId, group: GroupId) -> KvResult<bool> {
        self.check_kind(group, false)?;
        let m = &self.managers[group.0 as usize];
        let SpecKind::HiSparseHot { blocks_per_request } = m.spec().kind else {
            unreachable!("checked above");
        };
        let t = &self.tables(req)?[group.0 as usize];
        Ok(hisparse::has_hot(t, blocks_per_request as usize))
    }

    /// Grow `req`'s table in hot group `group` to its whole region when the
    /// region has been asked for (vLLM's `HiSparseHotManager.allocate_new_blocks`
    /// called on its own); the new blocks, none when it is not asked for or
    /// already held. The pool must hold them all (else refused, unchanged).
    pub fn allocate_hot(&mut self, req: ReqId, group: GroupId) -> KvResult<Vec<BlockId>> {
        self.check_kind(group, false)?;
        let SpecKind::HiSparseHot { blocks_per_request } =
            self.managers[group.0 as usize].spec().kind
        else {
            unreachable!("checked above");
        };
        let (pool, t) = self.row_mut(req, group, false)?;
        let mut new = Vec::new();
        let want = (blocks_per_request as usize).saturating_sub(t.blocks.len());
        if t.hisparse.hot_required && want > pool.num_free_blocks() {
            return Err(KvError::InvalidArgument {
                name: "group",
                detail: format!("{want} hot blocks asked, {} free", pool.num_free_blocks()),
            });
        }
        hisparse::hot_allocate_new(pool, t, blocks_per_request as usize, &mut new)?;
        Ok(new)
    }

    /// Whether `req`'s hot region in `group` has been asked for.
    pub fn hot_required(&self, req: ReqId, group: GroupId) -> KvResult<bool> {
        self.check_kind(group, false)?;
        Ok(self.tables(req)?[group.0 as usize].hisparse.hot_required)
    }

    /// Take one caller reference on each listed block (vLLM's
    /// `BlockPool.touch` from outside the manager: a free block leaves the
    /// free queue). The null block is skipped; released again with
    /// [`free_caller_blocks`](Self::free_caller_blocks).
    pub fn touch_caller_blocks(&mut self, blocks: &[BlockId]) -> KvResult<()> {
        self.pool.touch(blocks)?;
        for &b in blocks.iter().filter(|b| !b.is_null()) {
            *self.caller_held.entry(b).or_insert(0) += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::coordinator::{AllocateArgs, CoordinatorConfig, CoordinatorCore};
    use crate::ids::{BlockId, GroupId, ReqId};
    use crate::managers::GroupSpec;
    use crate::request::RequestView;

    /// The device groups of vLLM's `HiSparse` shape: an indexer (full
    /// attention), one resident group and one hot group of 2 blocks.
    fn core(num_blocks: usize) -> CoordinatorCore {
        let groups = vec![
            GroupSpec::full_attention(16),
            GroupSpec::hisparse_resident(16),
            GroupSpec::hisparse_hot(16, 2),
        ];
        CoordinatorCore::new(CoordinatorConfig::new(groups, num_blocks, false, 1024)).unwrap()
    }

    fn view(tokens: &[u32], computed: usize) -> RequestView<'static> {
        RequestView::new(computed, tokens.len(), tokens.len(), &[])
    }

    #[test]
    fn allocate_hot_grows_a_required_region_only() {
        let mut c = core(8);
        let tokens: Vec<u32> = (0..16).collect();
        let r = ReqId(1);
        c.allocate_slots(r, &view(&tokens, 0), &AllocateArgs::new(16), None)
            .unwrap()
            .unwrap();
        // Not asked for: nothing.
        assert!(c.allocate_hot(r, GroupId(2)).unwrap().is_empty());
        assert!(c.allocate_hot(r, GroupId(1)).is_err());
        c.require_hot(r, GroupId(2)).unwrap();
        let free = c.pool().num_free_blocks();
        let got = c.allocate_hot(r, GroupId(2)).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(c.pool().num_free_blocks(), free - 2);
        assert!(c.has_hot(r, GroupId(2)).unwrap());
        assert!(c.allocate_hot(r, GroupId(2)).unwrap().is_empty());
        c.check_invariants().unwrap();
        // Too few free blocks: refused, unchanged.
        let r2 = ReqId(2);
        c.allocate_slots(r2, &view(&tokens, 0), &AllocateArgs::new(16), None)
            .unwrap()
            .unwrap();
        c.require_hot(r2, GroupId(2)).unwrap();
        let rest = c.pool().num_free_blocks();
        let mut held = Vec::new();
        c.get_caller_blocks(rest, &mut held).unwrap();
        assert!(c.allocate_hot(r2, GroupId(2)).is_err());
        assert!(!c.has_hot(r2, GroupId(2)).unwrap());
        c.check_invariants().unwrap();
    }

    #[test]
    fn allocation_and_residency() {
        let mut c = core(32);
        let tokens: Vec<u32> = (0..64).collect();
        let r = ReqId(1);
        let new = c
            .allocate_slots(r, &view(&tokens, 0), &AllocateArgs::new(64), None)
            .unwrap()
            .unwrap();
        // Indexer and resident get a block per page; no hot region yet.
        assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4, 0]);
        assert!(!c.has_hot(r, GroupId(2)).unwrap());
        c.check_invariants().unwrap();
        // Asked for: the next step allocates it.
        c.require_hot(r, GroupId(2)).unwrap();
        let new = c
            .allocate_slots(r, &view(&tokens, 64), &AllocateArgs::new(1), None)
            .unwrap()
            .unwrap();
        assert_eq!(new.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 1, 2]);
        assert!(c.has_hot(r, GroupId(2)).unwrap());
        // Unpin page 0: free in the pool, still read; reused, then dropped.
        let page0 = c.resident_page(r, GroupId(1), 0).unwrap().unwrap();
        let free = c.pool().num_free_blocks();
        assert_eq!(
            c.unpin_resident_page(r, GroupId(1), 0).unwrap(),
            Some(page0)
        );
        assert_eq!(c.pool().num_free_blocks(), free + 1);
        c.check_invariants().unwrap();
        let mut taken = Vec::new();
        let n = c.pool().num_free_blocks();
        c.get_caller_blocks(n, &mut taken).unwrap();
        assert_eq!(c.pool_mut().take_reused_watched(), vec![page0]);
        assert_eq!(c.drop_resident_page(r, GroupId(1), 0).unwrap(), Some(page0));
        let row = c.residency_row(r, GroupId(1), 0).unwrap();
        assert_eq!(row[0], BlockId::NULL);
        // The table itself stays append-only.
        assert_eq!(c.block_ids(r).unwrap()[1][0], page0);
        c.check_invariants().unwrap();
        c.free_caller_blocks(&taken).unwrap();
        // Adopt a caller's block into the host-only page: unbacked (and not
        // droppable) until the touch that follows takes its reference.
        let mut copy = Vec::new();
        c.get_caller_blocks(1, &mut copy).unwrap();
        assert!(c.adopt_resident_page(r, GroupId(1), 0, copy[0]).unwrap());
        assert!(!c.adopt_resident_page(r, GroupId(1), 0, copy[0]).unwrap());
        c.check_invariants().unwrap();
        assert!(c.drop_resident_page(r, GroupId(1), 0).is_err());
        c.touch_resident_blocks(GroupId(1), &copy).unwrap();
        assert_eq!(c.num_caller_references(), 1);
        c.free_caller_blocks(&copy).unwrap();
        assert_eq!(c.pool().ref_count(copy[0]).unwrap(), 1);
        c.check_invariants().unwrap();
        // A touch with no adoption waiting is the caller's.
        c.touch_resident_blocks(GroupId(1), &copy).unwrap();
        assert_eq!(c.num_caller_references(), 1);
        c.free_caller_blocks(&copy).unwrap();
        // Unpinning needs a request's reference; dropping consumes one given up.
        assert!(c.unpin_resident_block(GroupId(1), BlockId(0)).is_err());
        assert!(c.unpin_resident_block(GroupId(0), copy[0]).is_err());
        c.unpin_resident_block(GroupId(1), copy[0]).unwrap();
        assert!(c.unpin_resident_block(GroupId(1), copy[0]).is_err());
        c.check_invariants().unwrap();
        assert_eq!(
            c.drop_resident_page(r, GroupId(1), 0).unwrap(),
            Some(copy[0])
        );
        c.check_invariants().unwrap();
        // Spill pins: caller references on the request's blocks.
        c.touch_caller_blocks(&[page0, copy[0]]).unwrap();
        c.check_invariants().unwrap();
        c.free_caller_blocks(&[page0, copy[0]]).unwrap();
        assert!(c.free(r).unwrap());
        assert_eq!(c.pool().num_free_blocks(), 31);
        c.check_invariants().unwrap();
    }

    #[test]
    fn wrong_group_kinds_are_refused() {
        let mut c = core(16);
        let tokens: Vec<u32> = (0..16).collect();
        let r = ReqId(1);
        c.allocate_slots(r, &view(&tokens, 0), &AllocateArgs::new(16), None)
            .unwrap()
            .unwrap();
        assert!(c.resident_page(r, GroupId(0), 0).is_err());
        assert!(c.require_hot(r, GroupId(1)).is_err());
        assert!(c.has_hot(r, GroupId(9)).is_err());
        assert!(c.resident_page(ReqId(7), GroupId(1), 0).is_err());
        // A pinned page is not dropped.
        assert!(c.drop_resident_page(r, GroupId(1), 0).is_err());
        c.check_invariants().unwrap();
    }

    #[test]
    fn import_reserves_the_tail_and_the_hot_region() {
        let mut c = core(32);
        let tokens: Vec<u32> = (0..40).collect();
        let r = ReqId(3);
        let args = AllocateArgs {
            num_external_computed_tokens: 40,
            delay_cache_blocks: true,
            ..AllocateArgs::new(0)
        };
        let free = c.pool().num_free_blocks();
        c.allocate_slots(r, &view(&tokens, 0), &args, None)
            .unwrap()
            .unwrap();
        let tables = c.block_ids(r).unwrap();
        // Indexer: 3 external blocks; resident: host-only pages then a
        // writable tail; hot: its region.
        assert_eq!(tables[0].len(), 3);
        assert_eq!(tables[1].len(), 3);
        assert!(tables[1][..2].iter().all(|b| b.is_null()));
        assert!(!tables[1][2].is_null());
        assert!(c.has_hot(r, GroupId(2)).unwrap());
        assert_eq!(free - c.pool().num_free_blocks(), 3 + 1 + 2);
        c.check_invariants().unwrap();
    }
}
