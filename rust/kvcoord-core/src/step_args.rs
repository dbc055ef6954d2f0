//! The arguments of one step of a request, `allocate_slots`' and a
//! prediction's (vLLM's keyword arguments), and the range checks of their
//! counts.
//!
//! They sit below the coordinator so that the checks (written with the
//! token limits of [`crate::limits`]) and the types they check live in one
//! file. Every count of a step is a token count: below
//! [`MAX_TOKENS`], so the sum of any four of
//! them fits in 64 bits and the step's arithmetic cannot wrap once
//! [`check_step`] (or [`check_predict`]) passed.

use crate::error::KvResult;
use crate::limits::{check_tokens, stale_request, MAX_TOKENS};
use crate::request::RequestView;

/// The per-step numbers of one `allocate_slots` call (vLLM's keyword
/// arguments), so that the core's signatures stay short.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocateArgs {
    /// Tokens to make room for in this step (> 0 unless hits are adopted).
    pub num_new_tokens: usize,
    /// Prefix-cache hit tokens adopted with `new_computed_blocks`.
    pub num_new_computed_tokens: usize,
    /// Speculative tokens that need slots but are never cached.
    pub num_lookahead_tokens: usize,
    /// Encoder tokens (sizes cross-attention groups).
    pub num_encoder_tokens: usize,
    /// Skip caching the newly full blocks this step.
    pub delay_cache_blocks: bool,
    /// Tokens a KV connector supplies after the hits (computed, not cached
    /// here): a new request's table covers them with fresh blocks, in every
    /// group before any group's blocks for the new tokens (vLLM's
    /// `allocate_external_computed_blocks`); these blocks are not part of
    /// the result. A running request allocates them as new tokens.
    pub num_external_computed_tokens: usize,
}

impl AllocateArgs {
    /// `num_new_tokens` new tokens, nothing else.
    pub const fn new(num_new_tokens: usize) -> Self {
        Self {
            num_new_tokens,
            num_new_computed_tokens: 0,
            num_lookahead_tokens: 0,
            num_encoder_tokens: 0,
            delay_cache_blocks: false,
            num_external_computed_tokens: 0,
        }
    }

    /// Adopting a prefix-cache hit of `num_new_computed_tokens` tokens.
    pub const fn with_hit(num_new_tokens: usize, num_new_computed_tokens: usize) -> Self {
        Self {
            num_new_computed_tokens,
            ..Self::new(num_new_tokens)
        }
    }
}

/// What a prediction
/// ([`CoordinatorCore::num_blocks_to_allocate`](crate::CoordinatorCore::num_blocks_to_allocate))
/// is for: vLLM's `get_num_blocks_to_allocate` arguments plus the admission cap.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PredictArgs {
    /// Slots the allocation would give the request (speculative ones
    /// included).
    pub num_tokens: usize,
    /// Tokens computed before the step (hits included).
    pub total_computed_tokens: usize,
    /// Of `total_computed_tokens`, those computed locally (the rest came
    /// from a KV connector; `None`: all of them), which `HiSparse` groups
    /// tell apart.
    pub local_computed_tokens: Option<usize>,
    /// Encoder tokens (sizes cross-attention groups).
    pub num_encoder_tokens: usize,
    /// vLLM's full-sequence admission check: groups that release blocks
    /// behind their attention are capped at the most blocks a request can
    /// hold in them
    /// ([`Manager::max_admission_blocks`](crate::managers::Manager::max_admission_blocks)).
    pub max_in_flight_tokens: Option<usize>,
    /// Of `num_tokens`, the main model's (the rest are speculative, which
    /// Mamba groups do not count); `None`: all of them.
    pub num_tokens_main_model: Option<usize>,
    /// Where the request's prefill ends, as the caller counts it (under
    /// sparse retention a Mamba "align" group reserves its prefill
    /// checkpoint only on the chunk reaching it); `None`: the request's own
    /// (`max(num_prompt_tokens, num_tokens - 1)`, as an allocation takes it).
    pub prefill_end: Option<usize>,
}

impl PredictArgs {
    /// `num_tokens` slots for a request with nothing computed.
    pub const fn new(num_tokens: usize) -> Self {
        Self {
            num_tokens,
            total_computed_tokens: 0,
            local_computed_tokens: None,
            num_encoder_tokens: 0,
            max_in_flight_tokens: None,
            num_tokens_main_model: None,
            prefill_end: None,
        }
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
