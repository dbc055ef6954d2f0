//! Limits on caller-supplied sizes and the checks that enforce them, so that
//! no sum or product of counts can wrap and no allocation sized by the
//! caller can abort the process.
//!
//! * Every integer a caller passes is of one [`Number`] kind, whose range
//!   is written once here (README, "Bad input and limits"): the bindings
//!   convert every Python int through one, and the core's entry points
//!   check the same bounds on the values they are handed.
//! * Every token count (`max_model_len`, the per-step counts of
//!   `allocate_slots`, a request's `num_computed_tokens`) is below
//!   [`MAX_TOKENS`] (2^48): the sum of any four of them fits in 64 bits, so
//!   the arithmetic of a step cannot overflow once they are checked. A sum
//!   that is stored (a request's progress) is checked again
//!   ([`add_tokens`]).
//! * Pools have fewer than 2^32 - 2 blocks (block ids are `u32`; see
//!   [`BlockPool::new`](crate::BlockPool::new)), and block counts, block
//!   sizes and table positions are below 2^32: the product of two of them
//!   fits in 64 bits.
//! * Buffers sized by the caller (pool metadata, token and hash buffers,
//!   per-block arrays read out of a pool) are reserved fallibly first: a
//!   reservation the allocator refuses is [`KvError::OutOfMemory`], raised
//!   before anything changed.

use crate::error::{KvError, KvResult};

/// Exclusive upper bound of every token count (2^48 tokens).
pub const MAX_TOKENS: usize = 1 << 48;
// `step_args::check_step` relies on it: counts are all below a power of two exactly
// when their bitwise OR is.
const _: () = assert!(MAX_TOKENS.is_power_of_two());

/// The kinds of integer a caller hands the core, each with its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Number {
    /// A token count or position: below [`MAX_TOKENS`] (2^48).
    Tokens,
    /// A count of blocks, or a position in a block table or in a request's
    /// hashes: below 2^32 (no pool holds more blocks, block ids are `u32`).
    Blocks,
    /// A block id: 32 bits (the pool checks it against its size).
    BlockId,
    /// A group id: 32 bits (the callee checks it against its groups).
    GroupId,
    /// A 32-bit value whose finer rule is the callee's (a size in tokens,
    /// the tokens of one block, a priority, clock ticks).
    U32,
    /// A 64-bit value whose finer rule is the callee's (a clock reading).
    U64,
}

impl Number {
    /// Every kind, for tests and for the bindings' table of kinds.
    pub const ALL: [Self; 6] = [
        Self::Tokens,
        Self::Blocks,
        Self::BlockId,
        Self::GroupId,
        Self::U32,
        Self::U64,
    ];

    /// The largest value of the kind.
    pub const fn max(self) -> u64 {
        match self {
            // Lossless: usize is 64 bits (see the assertion below).
            Self::Tokens => MAX_TOKENS as u64 - 1,
            Self::Blocks | Self::BlockId | Self::GroupId | Self::U32 => u32::MAX as u64,
            Self::U64 => u64::MAX,
        }
    }

    /// The kind's upper bound in words, for refusals ("below 2^48").
    pub const fn bound(self) -> &'static str {
        match self {
            Self::Tokens => "below 2^48",
            Self::Blocks | Self::BlockId | Self::GroupId | Self::U32 => "below 2^32",
            Self::U64 => "below 2^64",
        }
    }

    /// The kind's name, as the bindings spell it (`"tokens"`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::Blocks => "blocks",
            Self::BlockId => "block_id",
            Self::GroupId => "group_id",
            Self::U32 => "u32",
            Self::U64 => "u64",
        }
    }

    /// The kind spelled `name` ([`Self::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// `value` if it is of this kind, else the refusal naming `name`
    /// ([`KvError::InvalidBlockId`] for a block id, otherwise
    /// [`KvError::InvalidArgument`]).
    #[inline]
    pub fn check(self, name: &'static str, value: u64) -> KvResult<u64> {
        if value <= self.max() {
            Ok(value)
        } else {
            Err(self.too_large(name, value))
        }
    }

    #[cold]
    fn too_large(self, name: &'static str, value: u64) -> KvError {
        match self {
            Self::BlockId => KvError::InvalidBlockId {
                value: Some(value.into()),
            },
            _ => KvError::InvalidArgument {
                name,
                detail: self.refusal(&value.to_string(), false),
            },
        }
    }

    /// Why `shown` (a value as the caller wrote it, negative or not) is
    /// not of this kind: the one wording of every range refusal, which
    /// the bindings also use for ints beyond 64 bits.
    #[cold]
    pub fn refusal(self, shown: &str, negative: bool) -> String {
        let rule = if negative {
            "non-negative"
        } else {
            self.bound()
        };
        format!("{shown} (must be {rule})")
    }
}

// Counts are `usize` and the ranges above are written in `u64`: the
// conversions between them are lossless only on 64-bit targets.
const _: () = assert!(usize::BITS == 64);

/// `Err(InvalidArgument)` naming `name` unless `value` is below 2^32 (a
/// block count or table position, [`Number::Blocks`]).
#[inline]
pub fn check_blocks(name: &'static str, value: usize) -> KvResult<usize> {
    Number::Blocks.check(name, value as u64).map(|_| value)
}

/// `a + b` tokens, refused (naming `name`) unless the sum is below
/// [`MAX_TOKENS`]: the one sum of token counts that is stored.
#[inline]
pub fn add_tokens(name: &'static str, a: usize, b: usize) -> KvResult<usize> {
    match a.checked_add(b) {
        Some(sum) if sum < MAX_TOKENS => Ok(sum),
        _ => Err(sum_too_large(name, a, b)),
    }
}

#[cold]
fn sum_too_large(name: &'static str, a: usize, b: usize) -> KvError {
    KvError::InvalidArgument {
        name,
        detail: Number::Tokens.refusal(&format!("{a} + {b} tokens"), false),
    }
}

/// A count the caller gave as a signed int: `Err(InvalidArgument)` naming
/// `name` when it is negative.
pub fn non_negative(name: &'static str, value: i64) -> KvResult<usize> {
    usize::try_from(value).map_err(|_| KvError::InvalidArgument {
        name,
        detail: format!("must be non-negative, got {value}"),
    })
}

/// Exclusive upper bound of the group count of a result made from a count
/// alone (`KVCacheBlocks.empty`): far beyond any layout's groups, small
/// enough that the result and every view of it stay a few megabytes.
pub const MAX_EMPTY_GROUPS: usize = 1 << 20;

/// Bytes of metadata a pool of `num_blocks` blocks allocates up front:
/// 8 bytes of block metadata, 4 of the primary key's token count and 8 of
/// free-queue links per block, and the queue's two sentinels.
pub fn pool_metadata_bytes(num_blocks: usize) -> Option<usize> {
    num_blocks.checked_add(2)?.checked_mul(20)
}

/// Reserve a pool's metadata ([`pool_metadata_bytes`]) before building it.
pub fn reserve_pool(num_blocks: usize) -> KvResult<()> {
    reserve(
        "the block pool's metadata",
        pool_metadata_bytes(num_blocks).unwrap_or(usize::MAX),
    )
}

/// `Err(InvalidArgument)` naming `name` unless `value < MAX_TOKENS`
/// ([`Number::Tokens`]).
#[inline]
pub fn check_tokens(name: &'static str, value: usize) -> KvResult<usize> {
    Number::Tokens.check(name, value as u64).map(|_| value)
}

/// The error for a request the coordinator does not track but whose
/// progress says some of its tokens are computed: a freed (or preempted)
/// request passed back without resetting `num_computed_tokens`. Its KV is
/// gone, so allocating as if it were computed would cache blocks holding
/// tokens that were never computed.
#[cold]
pub fn stale_request(num_computed_tokens: usize) -> KvError {
    KvError::InvalidArgument {
        name: "request",
        detail: format!(
            "the request holds no blocks here but has num_computed_tokens={num_computed_tokens}; \
             a freed or preempted request must restart from num_computed_tokens=0"
        ),
    }
}

/// Reserve `bytes` of address space for `what` and release it again: the
/// allocations that follow (of that total) then fit, and a refusal is
/// reported as [`KvError::OutOfMemory`] instead of aborting the process.
pub fn reserve(what: &'static str, bytes: usize) -> KvResult<()> {
    let mut probe: Vec<u8> = Vec::new();
    probe
        .try_reserve_exact(bytes)
        .map_err(|_| KvError::OutOfMemory { what, bytes })
}

/// The refusal of `items` entries of a table for `what` (a hash map or set
/// sized by the caller's list).
#[cold]
pub fn out_of_memory(what: &'static str, items: usize) -> KvError {
    KvError::OutOfMemory {
        what,
        bytes: items.saturating_mul(16),
    }
}

/// `vec.try_reserve(additional)` as a [`KvError::OutOfMemory`] for `what`.
pub fn try_reserve<T>(vec: &mut Vec<T>, additional: usize, what: &'static str) -> KvResult<()> {
    vec.try_reserve(additional)
        .map_err(|_| KvError::OutOfMemory {
            what,
            bytes: additional.saturating_mul(std::mem::size_of::<T>()),
        })
}

/// The `len` items of `items` in a vector reserved fallibly first (a
/// per-block array of a pool, a request's digests): `OutOfMemory` for
/// `what`, never an abort.
pub fn try_collect<T>(
    len: usize,
    items: impl IntoIterator<Item = T>,
    what: &'static str,
) -> KvResult<Vec<T>> {
    let mut out = Vec::new();
    try_reserve(&mut out, len, what)?;
    out.extend(items.into_iter().take(len));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_negative_refuses_negative_counts_by_name() {
        assert_eq!(non_negative("n", 7).unwrap(), 7);
        let e = non_negative("shared_prefix_boundary", -1).unwrap_err();
        assert!(matches!(
            e,
            KvError::InvalidArgument {
                name: "shared_prefix_boundary",
                ..
            }
        ));
        assert!(
            e.to_string().contains("must be non-negative, got -1"),
            "{e}"
        );
    }

    #[test]
    fn token_counts_are_bounded() {
        assert_eq!(check_tokens("n", MAX_TOKENS - 1), Ok(MAX_TOKENS - 1));
        let err = check_tokens("num_new_tokens", MAX_TOKENS).unwrap_err();
        assert!(err.to_string().contains("num_new_tokens"), "{err}");
        // Four checked counts cannot wrap a u64.
        assert!((MAX_TOKENS - 1).checked_mul(4).is_some());
    }

    #[test]
    fn number_kinds_have_the_documented_ranges() {
        assert_eq!(Number::Tokens.max(), (1 << 48) - 1);
        assert_eq!(Number::Blocks.max(), u64::from(u32::MAX));
        assert_eq!(Number::BlockId.max(), u64::from(u32::MAX));
        assert_eq!(Number::GroupId.max(), u64::from(u32::MAX));
        assert_eq!(Number::U32.max(), u64::from(u32::MAX));
        assert_eq!(Number::U64.max(), u64::MAX);
        for k in Number::ALL {
            assert_eq!(Number::from_name(k.name()), Some(k));
            assert_eq!(k.check("n", 0), Ok(0));
            assert_eq!(k.check("n", k.max()), Ok(k.max()));
            if let Some(past) = k.max().checked_add(1) {
                let e = k.check("n", past).unwrap_err();
                match k {
                    Number::BlockId => assert_eq!(
                        e,
                        KvError::InvalidBlockId {
                            value: Some(past.into())
                        }
                    ),
                    _ => assert_eq!(
                        e.to_string(),
                        format!("invalid n: {past} (must be {})", k.bound())
                    ),
                }
                assert!(k.check("n", u64::MAX).is_err());
            }
        }
        assert_eq!(Number::from_name("bytes"), None);
        assert_eq!(Number::U32.refusal("-1", true), "-1 (must be non-negative)");
        assert_eq!(check_blocks("b", u32::MAX as usize), Ok(u32::MAX as usize));
        assert!(check_blocks("b", 1 << 32).is_err());
    }

    #[test]
    fn stored_sums_stay_token_counts() {
        assert_eq!(add_tokens("n", MAX_TOKENS - 2, 1), Ok(MAX_TOKENS - 1));
        assert!(add_tokens("n", MAX_TOKENS - 1, 1).is_err());
        // No wrap: a sum past 2^64 is refused, not reduced.
        let e = add_tokens("num_computed", usize::MAX, 1).unwrap_err();
        assert!(e.to_string().contains("num_computed"), "{e}");
        assert!(add_tokens("n", 1, usize::MAX).is_err());
    }

    #[test]
    fn collected_buffers_are_reserved_fallibly() {
        assert_eq!(try_collect(3, 1..10, "t"), Ok(vec![1, 2, 3]));
        let huge = try_collect(usize::MAX / 4, std::iter::repeat(0u64), "t");
        assert!(matches!(huge, Err(KvError::OutOfMemory { what: "t", .. })));
    }

    /// The core's own entry points check the token range of the counts
    /// they are handed, so nothing below them can wrap.
    #[test]
    fn impossible_reservations_are_errors_not_aborts() {
        assert!(matches!(
            reserve("test", usize::MAX / 2),
            Err(KvError::OutOfMemory { .. })
        ));
        let mut v: Vec<u64> = Vec::new();
        assert!(try_reserve(&mut v, usize::MAX / 4, "test").is_err());
        assert!(v.is_empty());
        assert_eq!(pool_metadata_bytes(usize::MAX), None);
    }
}
