//! One scheduler step of a replay's running batch, over its arrays.
//!
//! The replay (`kvcoord.replay.running`) keeps the progress of its running
//! requests in arrays, in admission order: tokens computed, tokens known
//! (prompt plus the output sampled so far), output tokens sampled and to
//! sample, and where each request's output tokens start in one shared
//! buffer. A step is two passes over them, both here so that a step costs
//! two calls rather than dozens of array operations:
//!
//! * [`plan_tokens`]: every request gets `min(tokens left, budget left)`
//!   tokens, first come first served (chunked prefill; 1 while decoding),
//!   and the requests whose `allocate_slots` call may change the pool are
//!   listed (the others are skipped by the caller);
//! * [`run_step`]: the step ran: progress advances, a request whose known
//!   tokens are all computed samples its next output token, and the sums
//!   the step-time model takes come back.
//!
//! Arrays shorter than the requests they are asked about are refused
//! (nothing changes).

use crate::error::{KvError, KvResult};
use crate::limits::MAX_TOKENS;

fn too_short(name: &'static str, len: usize, need: usize) -> KvResult<()> {
    if len < need {
        return Err(KvError::InvalidArgument {
            name,
            detail: format!("at least {need} entries, not {len}"),
        });
    }
    Ok(())
}

/// Token counts a batch holds: `0 <= value < 2^48` (the core's token range),
/// so that a step's sums are exact in `i128` and saturate, never wrap, in
/// the `i64` the step-time model takes.
fn check_count(name: &'static str, i: usize, value: i64) -> KvResult<i64> {
    if usize::try_from(value).is_ok_and(|v| v < MAX_TOKENS) {
        return Ok(value);
    }
    Err(KvError::InvalidArgument {
        name,
        detail: format!("a token count in [0, 2^48), not {value} (request {i})"),
    })
}

/// `x` clamped into `i64`.
fn saturate(x: i128) -> i64 {
    i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
}

/// The arrays of a running batch (admission order; one entry per request).
#[derive(Debug)]
pub struct BatchArrays<'a> {
    /// Tokens computed (with KV).
    pub computed: &'a mut [i64],
    /// Tokens known: the prompt plus the output sampled so far.
    pub num_tokens: &'a mut [i64],
    /// Output tokens sampled so far.
    pub out_pos: &'a mut [i64],
    /// Output tokens to sample in all.
    pub out_len: &'a [i64],
    /// Where the request's output tokens start in `out_tokens`.
    pub out_base: &'a [i64],
    /// Every request's output tokens, request after request.
    pub out_tokens: &'a [i64],
}

/// Tokens per request of one step: `n[i]` for the first `count`
/// requests (0 from `count` on), `events` the requests (ascending) whose
/// allocation may change the pool.
#[derive(Debug, PartialEq, Eq)]
pub struct StepPlan {
    /// Requests reached before the budget ran out.
    pub count: usize,
    /// Requests whose `allocate_slots` call is needed.
    pub events: Vec<usize>,
}

/// FCFS token assignment under `budget`: request `i` gets `min(tokens left,
/// budget left after the requests before it)`, written to `n` (one entry
/// per request). With `steady_block_size` (a layout whose groups keep every
/// block of a running request; 0: none) only chunks of more than one token
/// and single tokens at a block edge (the computed count or the count after
/// it a multiple of the block size) are events; otherwise every reached
/// request is.
pub fn plan_tokens(
    computed: &[i64],
    num_tokens: &[i64],
    budget: i64,
    steady_block_size: i64,
    n: &mut [i64],
) -> KvResult<StepPlan> {
    too_short("num_tokens", num_tokens.len(), computed.len())?;
    too_short("n", n.len(), computed.len())?;
    let mut before = 0i64;
    let mut count = 0;
    for (i, (&c, &t)) in computed.iter().zip(num_tokens).enumerate() {
        let (c, t) = (
            check_count("computed", i, c)?,
            check_count("num_tokens", i, t)?,
        );
        let rem = (t - c).max(0);
        if before < budget {
            count = i + 1;
        }
        n[i] = rem.min((budget - before).max(0));
        before = before.saturating_add(rem);
    }
    let bs = steady_block_size;
    let events = if bs > 0 {
        (0..count)
            .filter(|&i| {
                let c = computed[i];
                n[i] != 1 || c % bs == 0 || (c + 1) % bs == 0
            })
            .collect()
    } else {
        (0..count).collect()
    };
    Ok(StepPlan { count, events })
}

/// What one step computed, summed over its requests (the step-time
/// model's arguments), and which requests sampled a token.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StepSums {
    /// Tokens computed.
    pub tokens: i64,
    /// Query-key pairs of full-attention layers (per layer).
    pub full_pairs: i64,
    /// Query-key pairs of window-capped layers (per layer).
    pub window_pairs: i64,
    /// KV tokens read by full-attention layers.
    pub full_kv: i64,
    /// KV tokens read by window-capped layers.
    pub window_kv: i64,
    /// Requests scheduled.
    pub seqs: i64,
    /// Per request reached: the token it sampled, -1 for none.
    pub sampled: Vec<i64>,
    /// Requests that sampled their first output token.
    pub first: Vec<usize>,
    /// Requests that sampled their last output token (finished).
    pub finished: Vec<usize>,
    /// Tokens sampled after a request's first.
    pub later_tokens: i64,
}

/// Query-key pairs of `new` tokens after `cached` ones under a window of
/// `window` tokens: each token attends to at most `window` positions.
fn window_pairs(cached: i64, new: i64, window: i64) -> i128 {
    let (lo, hi) = (i128::from(cached), i128::from(cached) + i128::from(new));
    let window = i128::from(window);
    let full_end = hi.min(window);
    let head = if lo < full_end {
        let (a, b) = (lo + 1, full_end);
        (a + b) * (b - a + 1) / 2
    } else {
        0
    };
    let capped_start = lo.max(window);
    let tail = if hi > capped_start {
        (hi - capped_start) * window
    } else {
        0
    };
    head + tail
}

/// What the step computes for the first `count` requests, `n[i]` tokens
/// each (0: not scheduled), before anything changes: a request whose known
/// tokens are then all computed samples its next output token. `window`:
/// the window of window-capped layers (0: none).
pub fn step_sums(a: &BatchArrays<'_>, n: &[i64], count: usize, window: i64) -> KvResult<StepSums> {
    too_short("n", n.len(), count)?;
    too_short("computed", a.computed.len(), count)?;
    too_short("num_tokens", a.num_tokens.len(), count)?;
    too_short("out_pos", a.out_pos.len(), count)?;
    too_short("out_len", a.out_len.len(), count)?;
    too_short("out_base", a.out_base.len(), count)?;
    let mut sums = StepSums {
        sampled: vec![-1; count],
        ..StepSums::default()
    };
    // Exact in i128 (counts below 2^48), saturated into the sums.
    let (mut full_pairs, mut window_pairs_sum) = (0i128, 0i128);
    for (i, &ni) in n[..count].iter().enumerate() {
        let ni = check_count("n", i, ni)?;
        if ni == 0 {
            continue;
        }
        let done = check_count("computed", i, a.computed[i])?;
        let new_c = done + ni;
        sums.seqs += 1;
        sums.tokens = sums.tokens.saturating_add(ni);
        let (wide_n, wide_done) = (i128::from(ni), i128::from(done));
        full_pairs += wide_n * wide_done + wide_n * (wide_n + 1) / 2;
        sums.full_kv = sums.full_kv.saturating_add(new_c);
        if window > 0 {
            window_pairs_sum += window_pairs(done, ni, window);
            sums.window_kv = sums.window_kv.saturating_add(new_c.min(window));
        }
        if new_c < a.num_tokens[i] {
            continue;
        }
        let pos = a.out_pos[i];
        let at = usize::try_from(a.out_base[i] + pos).unwrap_or(usize::MAX);
        sums.sampled[i] = match a.out_tokens.get(at) {
            Some(&t) if t >= 0 => t,
            _ => {
                return Err(KvError::InvalidArgument {
                    name: "out_tokens",
                    detail: format!(
                        "a token id at {at} for request {i}, of {}",
                        a.out_tokens.len()
                    ),
                })
            }
        };
        if pos == 0 {
            sums.first.push(i);
        } else {
            sums.later_tokens += 1;
        }
        if pos + 1 >= a.out_len[i] {
            sums.finished.push(i);
        }
    }
    sums.full_pairs = saturate(full_pairs);
    sums.window_pairs = saturate(window_pairs_sum);
    Ok(sums)
}

/// The step `sums` (of [`step_sums`] with the same `n`) ran: progress
/// advances, and each request that sampled a token counts it.
pub fn apply_step(a: &mut BatchArrays<'_>, n: &[i64], sums: &StepSums) {
    for (i, &t) in sums.sampled.iter().enumerate() {
        a.computed[i] += n[i];
        if t >= 0 {
            a.out_pos[i] += 1;
            a.num_tokens[i] += 1;
        }
    }
}

/// [`step_sums`], then [`apply_step`].
pub fn run_step(
    a: &mut BatchArrays<'_>,
    n: &[i64],
    count: usize,
    window: i64,
) -> KvResult<StepSums> {
    let s = step_sums(a, n, count, window)?;
    apply_step(a, n, &s);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_goes_first_come_first_served() {
        let computed = [100, 0, 0, 40];
        let num_tokens = [101, 300, 500, 41];
        let mut n = [0; 4];
        let p = plan_tokens(&computed, &num_tokens, 256, 16, &mut n).unwrap();
        assert_eq!(n, [1, 255, 0, 0]);
        assert_eq!(
            p.count, 2,
            "the third request is reached with no budget left"
        );
        assert_eq!(p.events, vec![1], "a decode token mid-block is no event");
        let p = plan_tokens(&computed, &num_tokens, 256, 0, &mut n).unwrap();
        assert_eq!(
            p.events,
            vec![0, 1],
            "without a steady block size every one is"
        );
        let mut n = [0; 1];
        let p = plan_tokens(&[47], &[48], 8, 16, &mut n).unwrap();
        assert_eq!(
            (n, p.events),
            ([1], vec![0]),
            "the token after it fills a block"
        );
    }

    #[test]
    fn a_step_advances_samples_and_sums() {
        let mut computed = vec![0, 10, 5];
        let mut num_tokens = vec![4, 11, 9];
        let mut out_pos = vec![0, 2, 0];
        let out_len = vec![2, 3, 1];
        let out_base = vec![0, 2, 5];
        let out_tokens = vec![70, 71, 80, 81, 82, 90];
        let mut a = BatchArrays {
            computed: &mut computed,
            num_tokens: &mut num_tokens,
            out_pos: &mut out_pos,
            out_len: &out_len,
            out_base: &out_base,
            out_tokens: &out_tokens,
        };
        assert!(run_step(&mut a, &[4, 1], 3, 8).is_err(), "n too short");
        assert!(
            run_step(&mut a, &[4, -1, 2], 3, 8).is_err(),
            "a negative count"
        );
        let s = run_step(&mut a, &[4, 1, 2], 3, 8).unwrap();
        assert_eq!(s.sampled, vec![70, 82, -1]);
        assert_eq!((s.first, s.finished, s.later_tokens), (vec![0], vec![1], 1));
        assert_eq!((s.tokens, s.seqs), (7, 3));
        assert_eq!(s.full_pairs, 10 + 11 + (10 + 3));
        assert_eq!(s.full_kv, 4 + 11 + 7);
        assert_eq!(s.window_kv, 4 + 8 + 7);
        // request 1: one token at position 11 sees the window's 8; request 2:
        // tokens 6 and 7 see 6 and 7, within the window
        assert_eq!(s.window_pairs, 10 + 8 + 13);
        assert_eq!(
            (computed, num_tokens, out_pos),
            (vec![4, 11, 7], vec![5, 12, 9], vec![1, 3, 0])
        );
    }

    #[test]
    fn counts_outside_the_token_range_are_refused_and_sums_saturate() {
        let mut n = [0; 1];
        assert!(plan_tokens(&[-1], &[4], 8, 0, &mut n).is_err());
        assert!(plan_tokens(&[0], &[1 << 48], 8, 0, &mut n).is_err());
        let top = (1i64 << 48) - 1;
        let (mut computed, mut num_tokens) = (vec![top - 1, top - 1], vec![top, top]);
        let (mut out_pos, out_len, out_base, out_tokens) =
            (vec![0, 0], [2, 2], [0, 2], [1, 2, 3, 4]);
        let a = BatchArrays {
            computed: &mut computed,
            num_tokens: &mut num_tokens,
            out_pos: &mut out_pos,
            out_len: &out_len,
            out_base: &out_base,
            out_tokens: &out_tokens,
        };
        assert!(step_sums(&a, &[-1, 0], 2, 0).is_err());
        assert!(step_sums(&a, &[1 << 48, 0], 2, 0).is_err());
        // Two requests of 2^47 new tokens after 2^48 - 2: about 2^96 pairs each.
        let big = 1i64 << 47;
        let s = step_sums(&a, &[big, big], 2, top).unwrap();
        assert_eq!((s.full_pairs, s.window_pairs), (i64::MAX, i64::MAX));
        assert_eq!(s.tokens, 2 * big);
    }

    #[test]
    fn window_pairs_match_a_count_by_hand() {
        for window in [1, 3, 8] {
            for cached in 0..12 {
                for new in 0..12 {
                    let by_hand: i64 = (cached + 1..=cached + new).map(|p| p.min(window)).sum();
                    assert_eq!(window_pairs(cached, new, window), i128::from(by_hand));
                }
            }
        }
    }
}
