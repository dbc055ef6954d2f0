//! [`NewBlocks`]: block ids per KV cache group in one flat buffer, the shape
//! of every manager result (`allocate_slots`' new blocks, a cache hit, a
//! request's tables). The bindings hand it to Python as it is: one flat id
//! array and group offsets, no object per block.

use crate::error::{KvError, KvResult};
use crate::ids::BlockId;

/// Block ids per group, group 0 first, in one flat buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewBlocks {
    /// All groups' ids, group after group.
    pub(crate) ids: Vec<BlockId>,
    /// `ends[g]` is one past group `g`'s last id in `ids`. Invariant:
    /// non-decreasing, the last equals `ids.len()`.
    pub(crate) ends: Vec<usize>,
}

impl NewBlocks {
    /// An empty buffer (no group).
    pub fn new() -> Self {
        Self::default()
    }

    /// `num_groups` groups, none holding a block.
    pub fn empty(num_groups: usize) -> Self {
        Self {
            ids: Vec::new(),
            ends: vec![0; num_groups],
        }
    }

    /// [`Self::empty`] of a caller-given count: below
    /// [`MAX_EMPTY_GROUPS`](crate::limits::MAX_EMPTY_GROUPS), reserved
    /// fallibly (an allocation the allocator refuses is
    /// [`KvError::OutOfMemory`], not an abort).
    pub fn try_empty(num_groups: usize) -> KvResult<Self> {
        if num_groups >= crate::limits::MAX_EMPTY_GROUPS {
            return Err(KvError::InvalidArgument {
                name: "num_groups",
                detail: format!("{num_groups} groups is beyond the supported maximum of 2^20 - 1"),
            });
        }
        let mut ends = Vec::new();
        crate::limits::try_reserve(&mut ends, num_groups, "the result's groups")?;
        ends.resize(num_groups, 0);
        Ok(Self {
            ids: Vec::new(),
            ends,
        })
    }

    /// One group per item, in order.
    pub fn from_groups<'a>(groups: impl IntoIterator<Item = &'a [BlockId]>) -> Self {
        let mut out = Self::new();
        for g in groups {
            out.push_group(g.iter().copied());
        }
        out
    }

    /// Append one group holding `ids`.
    pub fn push_group(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        self.ids.extend(ids);
        self.ends.push(self.ids.len());
    }

    /// [`Self::push_group`] of caller-given ids, reserved fallibly: an
    /// allocation the allocator refuses is [`KvError::OutOfMemory`] (and
    /// nothing is appended), not an abort.
    pub fn try_push_group(&mut self, ids: &[BlockId]) -> KvResult<()> {
        crate::limits::try_reserve(&mut self.ids, ids.len(), "block ids")?;
        crate::limits::try_reserve(&mut self.ends, 1, "the result's groups")?;
        self.push_group(ids.iter().copied());
        Ok(())
    }

    /// Group `g` of the result is group `picks[g].1` of `picks[g].0`, cut
    /// to its first `picks[g].2` blocks (a hybrid hit assembled from its
    /// per-spec lookups).
    pub fn gather(picks: &[(&Self, usize, usize)]) -> KvResult<Self> {
        let mut out = Self::new();
        for (g, &(part, index, keep)) in picks.iter().enumerate() {
            if index >= part.num_groups() {
                return Err(KvError::InvalidArgument {
                    name: "picks",
                    detail: format!(
                        "entry {g}: group {index} of a result with {} groups",
                        part.num_groups()
                    ),
                });
            }
            let ids = part.group(index);
            out.push_group(ids[..keep.min(ids.len())].iter().copied());
        }
        Ok(out)
    }

    /// Group by group, `self`'s ids then `other`'s.
    pub fn concat(&self, other: &Self) -> KvResult<Self> {
        if self.num_groups() != other.num_groups() {
            return Err(KvError::InvalidArgument {
                name: "KVCacheBlocks",
                detail: format!(
                    "cannot add results of {} and {} groups",
                    self.num_groups(),
                    other.num_groups()
                ),
            });
        }
        let mut out = Self::new();
        // Fallible: the sum of two large results may not fit.
        let total = self.ids.len().saturating_add(other.ids.len());
        crate::limits::try_reserve(&mut out.ids, total, "block ids")?;
        crate::limits::try_reserve(&mut out.ends, self.num_groups(), "the result's groups")?;
        for g in 0..self.num_groups() {
            out.push_group(self.group(g).iter().chain(other.group(g)).copied());
        }
        Ok(out)
    }

    /// Number of groups described.
    #[inline]
    pub fn num_groups(&self) -> usize {
        self.ends.len()
    }

    /// Whether no group holds a block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Group `g`'s ids, in table order (empty for an unknown group).
    pub fn group(&self, g: usize) -> &[BlockId] {
        let Some(&end) = self.ends.get(g) else {
            return &[];
        };
        let start = if g == 0 { 0 } else { self.ends[g - 1] };
        &self.ids[start..end]
    }

    /// All ids, group after group.
    #[inline]
    pub fn flat(&self) -> &[BlockId] {
        &self.ids
    }

    /// One past each group's last index in [`flat`](Self::flat).
    #[inline]
    pub fn group_ends(&self) -> &[usize] {
        &self.ends
    }

    /// Group offsets into [`flat`](Self::flat): 0, then each group's end.
    pub fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(0).chain(self.ends.iter().copied())
    }

    /// Per-group lists.
    pub fn to_vecs(&self) -> Vec<Vec<BlockId>> {
        let mut out = Vec::new();
        self.to_vecs_into(&mut out);
        out
    }

    /// Per-group lists into reusable buffers (resized to the group count).
    pub fn to_vecs_into(&self, out: &mut Vec<Vec<BlockId>>) {
        out.resize_with(self.num_groups(), Vec::new);
        for (g, v) in out.iter_mut().enumerate() {
            v.clear();
            v.extend_from_slice(self.group(g));
        }
    }

    /// The largest id, if any.
    pub fn max_id(&self) -> Option<BlockId> {
        self.ids.iter().copied().max()
    }

    /// `self`, when every id fits in `int32`, the dtype results cross to
    /// Python as; else [`KvError::InvalidBlockId`] naming the largest.
    pub fn fitting_i32(self) -> KvResult<Self> {
        match self.max_id().filter(|b| i32::try_from(b.0).is_err()) {
            Some(b) => Err(KvError::InvalidBlockId {
                value: Some(i128::from(b.0)),
            }),
            None => Ok(self),
        }
    }

    /// The flat ids as `int32` (saturated; see [`fitting_i32`](Self::fitting_i32)).
    pub fn flat_i32(&self) -> impl Iterator<Item = i32> + '_ {
        self.ids
            .iter()
            .map(|b| i32::try_from(b.0).unwrap_or(i32::MAX))
    }

    pub(crate) fn clear(&mut self) {
        self.ids.clear();
        self.ends.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<BlockId> {
        v.iter().copied().map(BlockId).collect()
    }

    #[test]
    fn groups_offsets_and_lists() {
        let b = NewBlocks::from_groups([ids(&[1, 2]).as_slice(), &[], &ids(&[7])]);
        assert_eq!(b.num_groups(), 3);
        assert_eq!(b.group(0), ids(&[1, 2]).as_slice());
        assert!(b.group(1).is_empty());
        assert!(b.group(3).is_empty());
        assert_eq!(b.offsets().collect::<Vec<_>>(), vec![0, 2, 2, 3]);
        assert_eq!(b.to_vecs(), vec![ids(&[1, 2]), vec![], ids(&[7])]);
        assert_eq!(b.max_id(), Some(BlockId(7)));
        assert_eq!(b.flat_i32().collect::<Vec<_>>(), vec![1, 2, 7]);
        assert!(b.clone().fitting_i32().is_ok());
        let wide = NewBlocks::from_groups([ids(&[1, 1 << 31]).as_slice()]);
        assert!(matches!(
            wide.fitting_i32(),
            Err(KvError::InvalidBlockId { value: Some(v) }) if v == 1 << 31
        ));
        assert!(!b.is_empty());
        let e = NewBlocks::empty(2);
        assert!(e.is_empty() && e.num_groups() == 2);
        assert_eq!(e.offsets().collect::<Vec<_>>(), vec![0, 0, 0]);
    }

    #[test]
    fn to_vecs_into_resizes_and_clears() {
        let b = NewBlocks::from_groups([ids(&[3]).as_slice()]);
        let mut out = vec![ids(&[9, 9]), ids(&[8])];
        b.to_vecs_into(&mut out);
        assert_eq!(out, vec![ids(&[3])]);
    }

    #[test]
    fn gather_cuts_and_refuses_unknown_groups() {
        let a = NewBlocks::from_groups([ids(&[1, 2, 3]).as_slice(), &ids(&[4, 5])]);
        let b = NewBlocks::from_groups([ids(&[6]).as_slice()]);
        let g = NewBlocks::gather(&[(&a, 1, 1), (&b, 0, 9), (&a, 0, 2)]).unwrap();
        assert_eq!(g.to_vecs(), vec![ids(&[4]), ids(&[6]), ids(&[1, 2])]);
        let e = NewBlocks::gather(&[(&b, 1, 1)]).unwrap_err();
        assert!(e
            .to_string()
            .contains("entry 0: group 1 of a result with 1 groups"));
    }

    #[test]
    fn concat_is_group_wise_and_needs_equal_group_counts() {
        let a = NewBlocks::from_groups([ids(&[1]).as_slice(), &ids(&[2])]);
        let b = NewBlocks::from_groups([ids(&[3]).as_slice(), &[]]);
        assert_eq!(
            a.concat(&b).unwrap().to_vecs(),
            vec![ids(&[1, 3]), ids(&[2])]
        );
        assert!(a.concat(&NewBlocks::empty(1)).is_err());
    }

    #[test]
    fn caller_sized_results_are_bounded_and_fallible() {
        let e = NewBlocks::try_empty(crate::limits::MAX_EMPTY_GROUPS).unwrap_err();
        assert!(matches!(
            e,
            KvError::InvalidArgument {
                name: "num_groups",
                ..
            }
        ));
        assert_eq!(NewBlocks::try_empty(3).unwrap(), NewBlocks::empty(3));
        let mut r = NewBlocks::new();
        r.try_push_group(&ids(&[5, 6])).unwrap();
        assert_eq!(r.to_vecs(), vec![ids(&[5, 6])]);
    }
}
