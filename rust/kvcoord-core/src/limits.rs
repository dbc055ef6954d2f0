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

use crate::coordinator::{AllocateArgs, PredictArgs, RequestView};
use crate::error::{KvError, KvResult};

/// Exclusive upper bound of every token count (2^48 tokens).
pub const MAX_TOKENS: usize = 1 << 48;
// `check_step` relies on it: counts are all below a power of two exactly
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

/// Check the counts of one `allocate_slots` step (and the request's
/// progress) against [`MAX_TOKENS`], naming the first one out of range.
#[inline]
pub fn check_step(view: &RequestView<'_>, args: &AllocateArgs) -> KvResult<()> {
    // One comparison on the common path: every count is below 2^48 exactly
    // when their bitwise OR is.
    let any = args.num_new_tokens
        | args.num_new_computed_tokens
        | args.num_lookahead_tokens
        | args.num_encoder_tokens
        | args.num_external_computed_tokens
        | view.num_computed_tokens
        | view.num_in_flight_tokens;
    if any < MAX_TOKENS {
        return Ok(());
    }
    name_step_overflow(view, args)
}

/// The error of [`check_step`], naming the first count out of range.
#[cold]
fn name_step_overflow(view: &RequestView<'_>, args: &AllocateArgs) -> KvResult<()> {
    check_tokens("num_new_tokens", args.num_new_tokens)?;
    check_tokens("num_new_computed_tokens", args.num_new_computed_tokens)?;
    check_tokens("num_lookahead_tokens", args.num_lookahead_tokens)?;
    check_tokens("num_encoder_tokens", args.num_encoder_tokens)?;
    check_tokens(
        "num_external_computed_tokens",
        args.num_external_computed_tokens,
    )?;
    check_tokens("num_computed_tokens", view.num_computed_tokens)?;
    check_tokens("num_in_flight_tokens", view.num_in_flight_tokens)?;
    Ok(())
}

/// Check the counts of a prediction (`num_blocks_to_allocate`) against
/// [`MAX_TOKENS`], naming the first one out of range.
pub fn check_predict(args: &PredictArgs) -> KvResult<()> {
    let optional = |name, v: Option<usize>| v.map_or(Ok(0), |v| check_tokens(name, v));
    check_tokens("num_tokens", args.num_tokens)?;
    check_tokens("total_computed_tokens", args.total_computed_tokens)?;
    check_tokens("num_encoder_tokens", args.num_encoder_tokens)?;
    optional("num_local_computed_tokens", args.local_computed_tokens)?;
    optional("max_in_flight_tokens", args.max_in_flight_tokens)?;
    optional("num_tokens_main_model", args.num_tokens_main_model)?;
    optional("prefill_end", args.prefill_end)?;
    Ok(())
}

/// Refuse an untracked request whose progress says some tokens are
/// computed ([`stale_request`]), when `verify` (the coordinator's
/// `verify_hits`; off, such tokens get fresh blocks as in vLLM).
#[inline]
pub fn check_progress(tracked: bool, view: &RequestView<'_>, verify: bool) -> KvResult<()> {
    if verify && !tracked && view.num_computed_tokens != 0 {
        return Err(stale_request(view.num_computed_tokens));
    }
    Ok(())
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
    fn entry_points_refuse_counts_past_the_token_range() {
        use crate::coordinator::{CoordinatorConfig, CoordinatorCore, NewBlocks, PredictArgs};
        use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
        use crate::managers::GroupSpec;
        use crate::request::Request;

        let mut config = CoordinatorConfig::new(vec![GroupSpec::full_attention(4)], 64, true, 1024);
        config.hash_block_size = 4;
        let mut c = CoordinatorCore::new(config).unwrap();
        let hash = HashConfig::new(HashAlgo::Native, 4, Some("t")).unwrap();
        let r = Request::new(
            "a".into(),
            (0..9).collect(),
            RequestHasher::new(hash, ExtraKeys::default()),
        );
        let mut out = NewBlocks::new();
        assert!(c
            .allocate_request(&r, &AllocateArgs::new(9), None, &mut out)
            .unwrap());
        let before = c.clone();
        for bad in [MAX_TOKENS, usize::MAX] {
            assert!(c.cache_request(&r, bad).is_err());
            assert!(c
                .num_blocks_to_allocate(&r, &[], &PredictArgs::new(bad))
                .is_err());
            let past = PredictArgs {
                prefill_end: Some(bad),
                ..PredictArgs::new(1)
            };
            assert!(c.num_blocks_to_allocate(&r, &[], &past).is_err());
            assert!(c.remove_skipped_request("a", bad, None).is_err());
            assert!(c.remove_skipped_request("a", 1, Some(bad)).is_err());
            assert!(c.finalize_partial_tail_offloads("a", bad, 0).is_err());
            assert!(c.finalize_partial_tail_offloads("a", 0, bad).is_err());
            assert!(c
                .config()
                .checked_cacheable_tokens(crate::GroupId(0), bad)
                .is_err());
            let hashes = r.block_hashes();
            assert!(c
                .find_longest_cache_hit(&[crate::GroupId(0)], hashes, bad, 4, false)
                .is_err());
            assert!(c
                .find_longest_cache_hit(&[crate::GroupId(0)], hashes, 8, bad, false)
                .is_err());
        }
        assert_eq!(c.pool().num_free_blocks(), before.pool().num_free_blocks());
        c.check_invariants().unwrap();
        let last = MAX_TOKENS - 1;
        assert!(c
            .num_blocks_to_allocate(&r, &[], &PredictArgs::new(last))
            .is_ok());
        assert_eq!(
            c.config().checked_cacheable_tokens(crate::GroupId(0), last),
            Ok(last)
        );
    }

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
