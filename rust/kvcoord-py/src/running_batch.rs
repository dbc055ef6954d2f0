//! `kvcoord._core.batch_plan` and `batch_step`: conversion only, the step's
//! arithmetic is `kvcoord_core::running_batch` (the replay's running batch,
//! `kvcoord.replay.running`).

use kvcoord_core::running_batch::{apply_step, plan_tokens, step_sums, BatchArrays};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::errors::{core, type_error, value_error};
use crate::numbers::{self, Tokens, U32};
use crate::request::{advance_bound, PyRequest};

fn slice<'a>(a: &'a PyReadonlyArray1<'_, i64>, name: &str) -> PyResult<&'a [i64]> {
    a.as_slice()
        .map_err(|_| type_error(format!("{name} must be a contiguous int64 array")))
}

fn slice_mut<'a>(a: &'a mut PyReadwriteArray1<'_, i64>, name: &str) -> PyResult<&'a mut [i64]> {
    a.as_slice_mut()
        .map_err(|_| type_error(format!("{name} must be a contiguous int64 array")))
}

/// A token count argument as the `i64` the batch's arrays hold (below 2^48,
/// so the conversion cannot fail).
fn token_count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    let tokens = numbers::arg::<Tokens>(obj, name)?.0;
    i64::try_from(tokens).map_err(|_| value_error(format!("invalid {name}: {tokens}")))
}

/// Tokens per running request of one step, first come first served under
/// `budget`, written to `n`; returns how many requests the budget reached
/// and those whose allocation may change the pool (see
/// `kvcoord_core::running_batch::plan_tokens`).
#[pyfunction]
#[pyo3(signature = (computed, num_tokens, budget, steady_block_size, n))]
pub(crate) fn batch_plan(
    computed: PyReadonlyArray1<'_, i64>,
    num_tokens: PyReadonlyArray1<'_, i64>,
    budget: &Bound<'_, PyAny>,
    steady_block_size: &Bound<'_, PyAny>,
    mut n: PyReadwriteArray1<'_, i64>,
) -> PyResult<(usize, Vec<usize>)> {
    let budget = token_count(budget, "budget")?;
    let steady_block_size =
        i64::from(numbers::arg::<U32>(steady_block_size, "steady_block_size")?.0);
    let (c, t) = (
        slice(&computed, "computed")?,
        slice(&num_tokens, "num_tokens")?,
    );
    let plan = core(plan_tokens(
        c,
        t,
        budget,
        steady_block_size,
        slice_mut(&mut n, "n")?,
    ))?;
    Ok((plan.count, plan.events))
}

/// The sums of one step, then the tokens sampled after the first, the
/// requests that sampled their first token and those that finished.
type StepOut = ((i64, i64, i64, i64, i64, i64), i64, Vec<usize>, Vec<usize>);

/// One step of the first `count` running requests (`n[i]` tokens each):
/// the batch's arrays advance in place, and so do `requests[:count]`
/// (their computed tokens, and the token each samples); returns the
/// step-time model's sums `(tokens, full_pairs, window_pairs, full_kv,
/// window_kv, seqs)`, the tokens sampled after a request's first, and the
/// indices that sampled their first token and that finished.
#[pyfunction]
#[pyo3(signature = (n, count, window, computed, num_tokens, out_pos, out_len, out_base, out_tokens, requests))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_step(
    n: PyReadonlyArray1<'_, i64>,
    count: &Bound<'_, PyAny>,
    window: &Bound<'_, PyAny>,
    mut computed: PyReadwriteArray1<'_, i64>,
    mut num_tokens: PyReadwriteArray1<'_, i64>,
    mut out_pos: PyReadwriteArray1<'_, i64>,
    out_len: PyReadonlyArray1<'_, i64>,
    out_base: PyReadonlyArray1<'_, i64>,
    out_tokens: PyReadonlyArray1<'_, i64>,
    requests: &Bound<'_, PyList>,
) -> PyResult<StepOut> {
    let count = numbers::arg::<U32>(count, "count")?.0 as usize;
    let window = token_count(window, "window")?;
    if requests.len() < count {
        return Err(value_error(format!(
            "invalid requests: at least {count} kvcoord.Request, got {}",
            requests.len()
        )));
    }
    let reqs = (0..count)
        .map(|i| {
            let item = requests.get_item(i)?;
            item.cast_into::<PyRequest>().map_err(|e| {
                type_error(format!(
                    "requests must be a list of kvcoord.Request, got {}",
                    crate::args::type_name(e.into_inner().as_any())
                ))
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let n = slice(&n, "n")?;
    let mut a = BatchArrays {
        computed: slice_mut(&mut computed, "computed")?,
        num_tokens: slice_mut(&mut num_tokens, "num_tokens")?,
        out_pos: slice_mut(&mut out_pos, "out_pos")?,
        out_len: slice(&out_len, "out_len")?,
        out_base: slice(&out_base, "out_base")?,
        out_tokens: slice(&out_tokens, "out_tokens")?,
    };
    // the requests are checked and advanced before the arrays change
    let s = core(step_sums(&a, n, count, window))?;
    advance_bound(&reqs, &n[..count], Some(&s.sampled))?;
    apply_step(&mut a, n, &s);
    Ok((
        (
            s.tokens,
            s.full_pairs,
            s.window_pairs,
            s.full_kv,
            s.window_kv,
            s.seqs,
        ),
        s.later_tokens,
        s.first,
        s.finished,
    ))
}
