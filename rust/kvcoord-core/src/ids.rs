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

#[cfg(test)]
mod tests {
    use super::*;

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
