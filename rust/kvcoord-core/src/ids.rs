//! Typed identifiers: physical block ids, KV-cache group ids and request ids.
//!
//! Both are `u32` on the Rust side. Python sees plain `int`s (or int32/int64
//! numpy arrays); the bindings check the range once at the boundary.

use std::fmt;

/// Index of one physical KV-cache block, `0 .. num_blocks`.
///
/// Block 0 is the *null block*: a shared placeholder that block tables use
/// for positions that hold no real block (tokens outside a sliding window,
/// padding). It is never handed out, never reference-counted and never
/// cached; the pool skips it silently where vLLM does.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The null block.
    pub const NULL: BlockId = BlockId(0);

    /// The id as a `usize` index into per-block arrays.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// Whether this is the null block.
    #[inline]
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Index of a KV-cache group (a set of layers sharing one block table).
///
/// The prefix index salts every block hash with the group id, so one prompt
/// prefix is cached separately per group.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct GroupId(pub u32);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A request, as the caller (the scheduler) names it.
///
/// The core never interprets the value; the bindings map Python request ids
/// to these.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct ReqId(pub u64);

impl fmt::Display for ReqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The first of `values` that is not a 32-bit id (block ids and token ids
/// are `u32`), as its position and value; `None` when all are.
pub fn first_outside_u32<T: Copy + TryInto<u32> + Into<i128>>(
    values: impl IntoIterator<Item = T>,
) -> Option<(usize, i128)> {
    values
        .into_iter()
        .enumerate()
        .find(|&(_, v)| v.try_into().is_err())
        .map(|(i, v)| (i, v.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_outside_u32_names_the_first_bad_value() {
        assert_eq!(first_outside_u32::<i64>([0, 5, u32::MAX.into()]), None);
        assert_eq!(first_outside_u32::<i64>([1, -1, 1 << 40]), Some((1, -1)));
        assert_eq!(
            first_outside_u32::<u64>([3, u64::MAX]),
            Some((1, u64::MAX.into()))
        );
        assert_eq!(first_outside_u32::<u32>([u32::MAX]), None);
        assert_eq!(first_outside_u32::<i8>([]), None);
    }

    #[test]
    fn ids_are_four_bytes() {
        assert_eq!(std::mem::size_of::<BlockId>(), 4);
        assert_eq!(std::mem::size_of::<GroupId>(), 4);
    }

    #[test]
    fn null_block_is_zero() {
        assert!(BlockId::NULL.is_null());
        assert!(!BlockId(1).is_null());
        assert_eq!(BlockId(7).index(), 7);
    }
}
