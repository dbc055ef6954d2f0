//! Limits on caller-supplied sizes and the checks that enforce them, so that
//! no sum or product of counts can wrap and no allocation sized by the
//! caller can abort the process.
//!
//! * Every token count (`max_model_len`, the per-step counts of
//!   `allocate_slots`, a request's `num_computed_tokens`) is below
//!   [`MAX_TOKENS`] (2^48): the sum of any four of them fits in 64 bits, so
//!   the arithmetic of a step cannot overflow once they are checked.
//! * Pools have fewer than 2^32 - 2 blocks (block ids are `u32`; see
//!   [`BlockPool::new`](crate::BlockPool::new)).
//! * Buffers sized by the caller (pool metadata, token and hash buffers) are
//!   reserved fallibly first: a reservation the allocator refuses is
//!   [`KvError::OutOfMemory`], raised before anything changed.

use crate::coordinator::{AllocateArgs, RequestView};
use crate::error::{KvError, KvResult};

/// Exclusive upper bound of every token count (2^48 tokens).
pub const MAX_TOKENS: usize = 1 << 48;
// `check_step` relies on it: counts are all below a power of two exactly
// when their bitwise OR is.
const _: () = assert!(MAX_TOKENS.is_power_of_two());

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

/// `Err(InvalidArgument)` naming `name` unless `value < MAX_TOKENS`.
#[inline]
pub fn check_tokens(name: &'static str, value: usize) -> KvResult<usize> {
    if value < MAX_TOKENS {
        Ok(value)
    } else {
        Err(too_many_tokens(name, value))
    }
}

#[cold]
fn too_many_tokens(name: &'static str, value: usize) -> KvError {
    KvError::InvalidArgument {
        name,
        detail: format!("{value} tokens is beyond the supported maximum of 2^48 - 1"),
    }
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

/// `vec.try_reserve(additional)` as a [`KvError::OutOfMemory`] for `what`.
pub fn try_reserve<T>(vec: &mut Vec<T>, additional: usize, what: &'static str) -> KvResult<()> {
    vec.try_reserve(additional)
        .map_err(|_| KvError::OutOfMemory {
            what,
            bytes: additional.saturating_mul(std::mem::size_of::<T>()),
        })
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
