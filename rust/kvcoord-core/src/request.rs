//! A request as the block manager sees it, and the registry of live
//! requests: both are core state, so that the bindings hold nothing.
//!
//! # Invariants
//!
//! * `num_prompt_tokens <= tokens.len()`.
//! * `hasher` has hashed every full hash unit of `tokens`
//!   (`hasher.num_hashed_tokens() == tokens.len() / unit * unit`), except
//!   for supplied digests (`hash_algo = "supplied"`), which may cover fewer
//!   units (never more).
//! * In a [`RequestRegistry`], each live id maps to one distinct [`ReqId`].

use hashbrown::HashMap;

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::hashing::RequestHasher;
use crate::ids::ReqId;

/// What `allocate_slots` and `cache_blocks` need to know about a request.
#[derive(Copy, Clone, Debug)]
pub struct RequestView<'a> {
    /// Tokens whose KV is already computed (`request.num_computed_tokens`).
    pub num_computed_tokens: usize,
    /// Tokens known so far: prompt plus accepted outputs (`request.num_tokens`).
    pub num_tokens: usize,
    /// Prompt length.
    pub num_prompt_tokens: usize,
    /// The request's block hashes, one per full hash unit.
    pub hashes: &'a [BlockHash],
    /// Where a longer shared prefix was seen by some group's lookup (0 =
    /// none); a reachable boundary for sparse caching.
    pub shared_prefix_boundary: usize,
    /// Tokens scheduled in steps whose output is not back yet (async
    /// scheduling); their blocks are kept. 0 without async scheduling.
    pub num_in_flight_tokens: usize,
}

impl<'a> RequestView<'a> {
    /// A view with no shared-prefix boundary and nothing in flight.
    pub fn new(
        num_computed_tokens: usize,
        num_tokens: usize,
        num_prompt_tokens: usize,
        hashes: &'a [BlockHash],
    ) -> Self {
        Self {
            num_computed_tokens,
            num_tokens,
            num_prompt_tokens,
            hashes,
            shared_prefix_boundary: 0,
            num_in_flight_tokens: 0,
        }
    }
}

/// A request's tokens, progress and chained block hashes.
#[derive(Clone, Debug)]
pub struct Request {
    /// The scheduler's id (the key of the registry).
    id: String,
    /// Prompt then output tokens.
    tokens: Vec<u32>,
    /// Leading entries of `tokens` that are the prompt.
    num_prompt_tokens: usize,
    /// Tokens whose KV is computed (the scheduler's progress). Invariant:
    /// this and the two other counts below are below
    /// [`MAX_TOKENS`](crate::limits::MAX_TOKENS) (their setters check).
    num_computed_tokens: usize,
    /// Hashes of every full hash unit of `tokens`.
    hasher: RequestHasher,
    /// Whether lookups must ignore the prefix cache (e.g. prompt logprobs).
    pub skip_reading_prefix_cache: bool,
    /// The shared-prefix boundary of the last prefix-cache lookup (vLLM's
    /// third `get_computed_blocks` result, kept on the request as vLLM's
    /// scheduler does): 0, or where some group matched beyond the hit.
    shared_prefix_boundary: usize,
    /// Tokens of `num_computed_tokens` scheduled in steps whose output is
    /// not back yet (async scheduling: vLLM's `num_in_flight_tokens`). Their
    /// attention still reads the blocks below them, so windows release
    /// blocks on the processed basis, `num_computed_tokens` minus these.
    num_in_flight_tokens: usize,
}

impl Request {
    /// A request whose prompt is `prompt`, hashed by `hasher` (fresh).
    pub fn new(id: String, prompt: Vec<u32>, mut hasher: RequestHasher) -> Self {
        hasher.update(&prompt);
        Self {
            id,
            num_prompt_tokens: prompt.len(),
            tokens: prompt,
            num_computed_tokens: 0,
            hasher,
            skip_reading_prefix_cache: false,
            shared_prefix_boundary: 0,
            num_in_flight_tokens: 0,
        }
    }

    /// A request whose prompt is what `fill` writes into an empty buffer,
    /// hashed by `hash` (see [`try_append`](Self::try_append)).
    ///
    /// # Errors
    ///
    /// `fill`'s error, or [`KvError::OutOfMemory`] for the hashes.
    pub fn try_new<E: From<KvError>>(
        id: String,
        hasher: RequestHasher,
        fill: impl FnOnce(&mut Vec<u32>) -> Result<(), E>,
        hash: impl FnOnce(&mut RequestHasher, &[u32]),
    ) -> Result<Self, E> {
        let mut request = Self::new(id, Vec::new(), hasher);
        request.try_append(fill, hash)?;
        request.num_prompt_tokens = request.tokens.len();
        Ok(request)
    }

    /// The scheduler's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// All tokens (prompt then outputs).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The prompt's tokens.
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.tokens[..self.num_prompt_tokens]
    }

    /// The output tokens (appended after the prompt).
    pub fn output_tokens(&self) -> &[u32] {
        &self.tokens[self.num_prompt_tokens..]
    }

    /// Number of tokens (prompt + outputs).
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Number of prompt tokens.
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// The hasher (algorithm, unit, extra keys).
    pub fn hasher(&self) -> &RequestHasher {
        &self.hasher
    }

    /// Hashes of the full hash units, block 0 first.
    pub fn block_hashes(&self) -> &[BlockHash] {
        self.hasher.block_hashes()
    }

    /// Append output tokens and hash the units they complete.
    pub fn append_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.hasher.update(&self.tokens);
    }

    /// Append caller-supplied digests for the next full hash units (a
    /// request whose algorithm is `supplied`); all-or-nothing.
    pub fn supply_block_hashes(&mut self, digests: &[BlockHash]) -> crate::KvResult<()> {
        self.hasher.supply(digests, self.tokens.len())
    }

    /// Append one output token (the decode step's case).
    pub fn push_token(&mut self, token: u32) {
        self.tokens.push(token);
        if self.hasher.pending_blocks(self.tokens.len()) > 0 {
            self.hasher.update(&self.tokens);
        }
    }

    /// Append the tokens `fill` writes at the end of the token buffer, then
    /// hash the units they complete by `hash(hasher, all_tokens)` (which
    /// must call [`RequestHasher::update`]; a caller may run it on another
    /// thread, see [`RequestHasher::num_tokens_to_hash`]). All or nothing:
    /// when `fill` fails, or the hashes' memory cannot be reserved, the
    /// request is unchanged.
    ///
    /// # Errors
    ///
    /// `fill`'s error, or [`KvError::OutOfMemory`] for the hashes.
    pub fn try_append<E: From<KvError>>(
        &mut self,
        fill: impl FnOnce(&mut Vec<u32>) -> Result<(), E>,
        hash: impl FnOnce(&mut RequestHasher, &[u32]),
    ) -> Result<(), E> {
        let base = self.tokens.len();
        let filled = fill(&mut self.tokens)
            .and_then(|()| Ok(self.hasher.try_reserve_for(self.tokens.len())?));
        if let Err(e) = filled {
            self.tokens.truncate(base);
            return Err(e);
        }
        hash(&mut self.hasher, &self.tokens);
        Ok(())
    }

    /// Tokens whose KV is computed (the scheduler's progress).
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// The shared-prefix boundary of the last prefix-cache lookup.
    pub fn shared_prefix_boundary(&self) -> usize {
        self.shared_prefix_boundary
    }

    /// Tokens of `num_computed_tokens` in steps whose output is not back.
    pub fn num_in_flight_tokens(&self) -> usize {
        self.num_in_flight_tokens
    }

    /// Set the scheduler's progress; refused (nothing changed) unless it is
    /// a token count ([`check_tokens`](crate::limits::check_tokens)).
    pub fn set_num_computed_tokens(&mut self, value: usize) -> KvResult<()> {
        self.num_computed_tokens = crate::limits::check_tokens("num_computed_tokens", value)?;
        Ok(())
    }

    /// Set the shared-prefix boundary (a token position, checked so).
    pub fn set_shared_prefix_boundary(&mut self, value: usize) -> KvResult<()> {
        self.shared_prefix_boundary = crate::limits::check_tokens("shared_prefix_boundary", value)?;
        Ok(())
    }

    /// Set the tokens in flight (a token count, checked so).
    pub fn set_num_in_flight_tokens(&mut self, value: usize) -> KvResult<()> {
        self.num_in_flight_tokens = crate::limits::check_tokens("num_in_flight_tokens", value)?;
        Ok(())
    }

    /// Number of output tokens (appended after the prompt).
    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    /// What `allocate_slots` and `cache_blocks` read.
    pub fn view(&self) -> RequestView<'_> {
        RequestView {
            shared_prefix_boundary: self.shared_prefix_boundary,
            num_in_flight_tokens: self.num_in_flight_tokens,
            ..RequestView::new(
                self.num_computed_tokens,
                self.tokens.len(),
                self.num_prompt_tokens,
                self.hasher.block_hashes(),
            )
        }
    }
}

/// One request's progress in a scheduler step: tokens newly computed and
/// the token sampled, if any (see [`step_progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepProgress {
    /// Added to `num_computed_tokens`.
    pub computed: usize,
    /// Appended (hashing the block it completes).
    pub token: Option<u32>,
}

impl Request {
    /// Apply one step's progress; refused (nothing changed) when the new
    /// `num_computed_tokens` would not be a token count. A step from
    /// [`step_progress`] is never refused.
    #[inline]
    pub fn advance(&mut self, step: StepProgress) -> KvResult<()> {
        self.num_computed_tokens =
            crate::limits::add_tokens("num_computed", self.num_computed_tokens, step.computed)?;
        if let Some(t) = step.token {
            self.push_token(t);
        }
        Ok(())
    }
}

/// A request a step advances, as [`step_progress`] sees it: `key` tells
/// requests apart (the same key twice is the same request, advanced
/// twice), `num_computed_tokens` is its progress before the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRequest {
    /// Equal for the same request, distinct otherwise.
    pub key: usize,
    /// The request's `num_computed_tokens` before the step.
    pub num_computed_tokens: usize,
}

/// One scheduler step's progress for `requests`, checked as a whole before
/// any request changes: `computed[i]` tokens computed (non-negative, and
/// leaving every request's progress a token count, a request listed twice
/// advanced twice) and, where `sampled` is given, `sampled[i]` the token
/// sampled (a negative value: none; otherwise a valid token id). Each step
/// then [`Request::advance`]s its request without a refusal.
pub fn step_progress(
    requests: &[StepRequest],
    computed: &[i64],
    sampled: Option<&[i64]>,
) -> KvResult<Vec<StepProgress>> {
    let num_requests = requests.len();
    if computed.len() != num_requests || sampled.is_some_and(|s| s.len() != num_requests) {
        return Err(KvError::InvalidArgument {
            name: "advance_requests",
            detail: format!(
                "{num_requests} requests but {} computed counts and {} new tokens",
                computed.len(),
                sampled.map_or(num_requests, <[i64]>::len)
            ),
        });
    }
    let mut out = Vec::new();
    crate::limits::try_reserve(&mut out, num_requests, "a step's progress")?;
    // Each count is below 2^48 and there are fewer than 2^16 * 2^40 of
    // them in memory, so the sum cannot wrap: it saturates only as a bound.
    let (mut sum, mut most) = (0usize, 0usize);
    for (i, &c) in computed.iter().enumerate() {
        let computed = crate::limits::non_negative("num_computed", c)?;
        let computed = crate::limits::check_tokens("num_computed", computed)?;
        let token = match sampled.map(|s| s[i]) {
            Some(t) if t >= 0 => Some(crate::hashing::token_id(i, t)?),
            _ => None,
        };
        sum = sum.saturating_add(computed);
        most = most.max(requests[i].num_computed_tokens);
        out.push(StepProgress { computed, token });
    }
    // The common case in one comparison: no request, however often listed,
    // can get past the largest progress plus everything computed.
    if most.saturating_add(sum) >= crate::limits::MAX_TOKENS {
        check_totals(requests, &out)?;
    }
    Ok(out)
}

/// Each request's progress after all of its steps, checked exactly (a
/// request listed several times adds up).
#[cold]
fn check_totals(requests: &[StepRequest], steps: &[StepProgress]) -> KvResult<()> {
    let mut totals: HashMap<usize, usize> = HashMap::new();
    totals
        .try_reserve(requests.len())
        .map_err(|_| KvError::OutOfMemory {
            what: "a step's progress",
            bytes: requests.len().saturating_mul(16),
        })?;
    for (r, step) in requests.iter().zip(steps) {
        let total = totals.entry(r.key).or_insert(r.num_computed_tokens);
        *total = crate::limits::add_tokens("num_computed", *total, step.computed)?;
    }
    Ok(())
}

/// Scheduler ids of the requests that hold blocks, mapped to the core's
/// dense [`ReqId`]s.
#[derive(Clone, Debug, Default)]
pub struct RequestRegistry {
    ids: HashMap<String, ReqId>,
    /// The reverse of `ids`.
    names: HashMap<ReqId, String>,
    /// The next id to hand out (never reused).
    next: u64,
}

impl RequestRegistry {
    /// The core id of a live request.
    pub fn get(&self, id: &str) -> Option<ReqId> {
        self.ids.get(id).copied()
    }

    /// The id a request would get if registered now.
    pub fn peek(&self, id: &str) -> ReqId {
        self.get(id).unwrap_or(ReqId(self.next))
    }

    /// Register `id` as `req` (from [`peek`](Self::peek)); a no-op when it
    /// is already registered.
    pub fn insert(&mut self, id: &str, req: ReqId) {
        if !self.ids.contains_key(id) {
            debug_assert_eq!(req, ReqId(self.next));
            self.ids.insert(id.to_owned(), req);
            self.names.insert(req, id.to_owned());
            self.next += 1;
        }
    }

    /// Forget `id`; returns its core id if it was live.
    pub fn remove(&mut self, id: &str) -> Option<ReqId> {
        let req = self.ids.remove(id)?;
        self.names.remove(&req);
        Some(req)
    }

    /// The scheduler id of a live request.
    pub fn name(&self, req: ReqId) -> Option<&str> {
        self.names.get(&req).map(String::as_str)
    }

    /// Number of live requests.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no request is live.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::{step_progress, StepProgress, StepRequest};

    #[test]
    fn step_progress_checks_everything_first() {
        let reqs = |n: usize| -> Vec<StepRequest> {
            (0..n)
                .map(|key| StepRequest {
                    key,
                    num_computed_tokens: 0,
                })
                .collect()
        };
        let got = step_progress(&reqs(2), &[3, 0], Some(&[-1, 7])).unwrap();
        assert_eq!(
            got,
            vec![
                StepProgress {
                    computed: 3,
                    token: None
                },
                StepProgress {
                    computed: 0,
                    token: Some(7)
                },
            ]
        );
        assert_eq!(step_progress(&reqs(1), &[1], None).unwrap()[0].token, None);
        let e = step_progress(&reqs(2), &[1], None).unwrap_err().to_string();
        assert!(
            e.contains("2 requests but 1 computed counts and 2 new tokens"),
            "{e}"
        );
        let e = step_progress(&reqs(1), &[-2], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be non-negative, got -2"), "{e}");
        assert!(step_progress(&reqs(1), &[0], Some(&[1 << 40])).is_err());
    }

    #[test]
    fn step_progress_keeps_every_total_a_token_count() {
        use crate::limits::MAX_TOKENS;
        let max = i64::try_from(MAX_TOKENS - 1).unwrap();
        let at = |key, num_computed_tokens| StepRequest {
            key,
            num_computed_tokens,
        };
        // Up to the last token count exactly, refused one past it.
        assert_eq!(
            step_progress(&[at(0, 1)], &[max - 1], None).unwrap()[0].computed,
            MAX_TOKENS - 2
        );
        assert!(step_progress(&[at(0, 1)], &[max], None).is_err());
        assert!(step_progress(&[at(0, 0)], &[max + 1], None).is_err());
        assert!(step_progress(&[at(0, 0)], &[i64::MAX], None).is_err());
        // The same request twice adds up; two requests do not.
        let half = max / 2 + 1;
        assert!(step_progress(&[at(0, 0), at(0, 0)], &[half, half], None).is_err());
        assert!(step_progress(&[at(0, 0), at(1, 0)], &[half, half], None).is_ok());
        // What it accepts, advance applies without a refusal.
        let mut r = Request::new("r".into(), vec![], hasher(4));
        r.set_num_computed_tokens(MAX_TOKENS - 3).unwrap();
        let key = StepRequest {
            key: 0,
            num_computed_tokens: r.num_computed_tokens(),
        };
        for step in step_progress(&[key, key], &[1, 1], None).unwrap() {
            r.advance(step).unwrap();
        }
        assert_eq!(r.num_computed_tokens(), MAX_TOKENS - 1);
        let step = StepProgress {
            computed: 1,
            token: Some(5),
        };
        assert!(r.advance(step).is_err());
        assert_eq!(
            (r.num_computed_tokens(), r.num_tokens()),
            (MAX_TOKENS - 1, 0)
        );
    }

    #[test]
    fn progress_setters_keep_token_counts() {
        use crate::limits::MAX_TOKENS;
        let mut r = Request::new("r".into(), vec![1], hasher(4));
        r.set_num_computed_tokens(MAX_TOKENS - 1).unwrap();
        r.set_shared_prefix_boundary(MAX_TOKENS - 1).unwrap();
        r.set_num_in_flight_tokens(MAX_TOKENS - 1).unwrap();
        for bad in [MAX_TOKENS, usize::MAX] {
            assert!(r.set_num_computed_tokens(bad).is_err());
            assert!(r.set_shared_prefix_boundary(bad).is_err());
            assert!(r.set_num_in_flight_tokens(bad).is_err());
        }
        let v = r.view();
        assert_eq!(v.num_computed_tokens, MAX_TOKENS - 1);
        assert_eq!(v.shared_prefix_boundary, MAX_TOKENS - 1);
        assert_eq!(v.num_in_flight_tokens, MAX_TOKENS - 1);
    }

    use super::*;

    fn update(h: &mut RequestHasher, tokens: &[u32]) {
        h.update(tokens);
    }

    #[test]
    fn try_new_and_try_append_are_all_or_nothing() {
        let fill = |t: &mut Vec<u32>| {
            t.extend([1, 2, 3]);
            Ok::<_, KvError>(())
        };
        let mut r = Request::try_new("r".into(), hasher(2), fill, update).unwrap();
        assert_eq!((r.num_prompt_tokens(), r.num_output_tokens()), (3, 0));
        assert_eq!(r.block_hashes().len(), 1);
        let refused = r.try_append(
            |t| {
                t.extend([4, 5]);
                Err(KvError::InvalidTokenId {
                    position: 5,
                    value: -1,
                })
            },
            |_, _| panic!("nothing is hashed after a refusal"),
        );
        assert!(refused.is_err());
        assert_eq!((r.tokens(), r.block_hashes().len()), (&[1, 2, 3][..], 1));
        r.try_append(
            |t| {
                t.push(4);
                Ok::<_, KvError>(())
            },
            update,
        )
        .unwrap();
        assert_eq!((r.num_output_tokens(), r.block_hashes().len()), (1, 2));
        assert_eq!(
            (r.prompt_tokens(), r.output_tokens()),
            (&[1, 2, 3][..], &[4][..])
        );
        assert_eq!(r.hasher().num_tokens_to_hash(8), 4);
        let whole = Request::new("w".into(), vec![1, 2, 3, 4], hasher(2));
        assert_eq!(whole.block_hashes(), r.block_hashes());
    }
    use crate::hashing::{ExtraKeys, HashAlgo, HashConfig};

    fn hasher(unit: usize) -> RequestHasher {
        let config = HashConfig::new(HashAlgo::Native, unit, Some("t")).unwrap();
        RequestHasher::new(config, ExtraKeys::default())
    }

    #[test]
    fn tokens_and_hashes_grow_together() {
        let mut r = Request::new("a".into(), vec![1, 2, 3, 4, 5], hasher(4));
        assert_eq!((r.num_tokens(), r.num_prompt_tokens()), (5, 5));
        assert_eq!(r.block_hashes().len(), 1);
        r.push_token(6);
        r.push_token(7);
        assert_eq!(r.block_hashes().len(), 1);
        r.push_token(8);
        assert_eq!(r.block_hashes().len(), 2);
        r.append_tokens(&[9, 10, 11, 12]);
        assert_eq!(r.block_hashes().len(), 3);
        let whole = Request::new("b".into(), (1..=12).collect(), hasher(4));
        assert_eq!(whole.block_hashes(), r.block_hashes());
        assert_eq!(r.view().num_prompt_tokens, 5);
    }

    #[test]
    fn registry_assigns_distinct_ids_once() {
        let mut reg = RequestRegistry::default();
        let a = reg.peek("a");
        reg.insert("a", a);
        reg.insert("a", a);
        let b = reg.peek("b");
        assert_ne!(a, b);
        reg.insert("b", b);
        assert_eq!(reg.len(), 2);
        assert_eq!(reg.remove("a"), Some(a));
        assert_eq!(reg.get("a"), None);
        assert_ne!(reg.peek("a"), a, "ids are never reused");
    }
}
