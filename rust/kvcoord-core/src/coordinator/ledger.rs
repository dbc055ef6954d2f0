//! The per-block `HiSparse` accounting of a coordinator ([`Ledger`]): the
//! references given up by unpinning and the adoptions waiting for their
//! touch (see `hisparse_rows.rs` for the calls that keep it).

use hashbrown::HashMap;

use crate::ids::{BlockId, GroupId, ReqId};

/// The per-block `HiSparse` accounting of a coordinator (see `hisparse_rows.rs`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Ledger {
    /// References given up by unpinning, per (resident group, block), not
    /// yet consumed by a drop.
    pub(crate) given_up: HashMap<(GroupId, BlockId), u32>,
    /// Adoptions waiting for the adopter's touch: (request, group, page,
    /// block), oldest first.
    pub(crate) pending: Vec<(ReqId, GroupId, usize, BlockId)>,
}

impl Ledger {
    /// `req` freed its blocks: its pending adoptions go with them.
    pub(crate) fn forget(&mut self, req: ReqId) {
        if !self.pending.is_empty() {
            self.pending.retain(|p| p.0 != req);
        }
    }
}
