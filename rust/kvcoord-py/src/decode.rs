//! The fused decode step of `kvcoord.vllm`'s manager: what
//! `CoordinatorCore.decode_slots` reads from vLLM's `Request` (once per
//! call) to bring kvcoord's request up to date, and how the core's answer
//! is handed back. Conversion only; the step is
//! `kvcoord_core::CoordinatorCore::decode_step`.

use kvcoord_core::{DecodeRoom, NewBlocks, Request};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// Bring `mine` up to date with vLLM's `request`, as the adapter's request
/// registry does (new output tokens appended, vLLM's new block hashes
/// supplied, the computed-token count copied), reading vLLM's token and
/// hash lists directly. Returns vLLM's hash count, or `None` (and `mine`
/// unchanged) where the registry must do it: a request that is not vLLM
/// 0.33.0's, a kvcoord request ahead of vLLM's, placeholder token ids, or
/// hashes a computing request lacks.
pub(crate) fn sync_running(
    request: &Bound<'_, PyAny>,
    mine: &mut Request,
) -> PyResult<Option<usize>> {
    let py = request.py();
    let Ok(tokens) = request.getattr(intern!(py, "_all_token_ids")) else {
        return Ok(None);
    };
    let Ok(tokens) = tokens.cast_into::<PyList>() else {
        return Ok(None);
    };
    let hashes = request.getattr(intern!(py, "block_hashes"))?;
    let Ok(hashes) = hashes.cast_into::<PyList>() else {
        return Ok(None);
    };
    let computed = request.getattr(intern!(py, "num_computed_tokens"))?;
    let computed =
        crate::numbers::arg::<crate::numbers::Tokens>(&computed, "num_computed_tokens")?.0;
    let (num_tokens, num_hashes) = (tokens.len(), hashes.len());
    let held = mine.num_tokens();
    let held_hashes = mine.block_hashes().len();
    let supplied = !mine.hasher().config().algo().computes();
    if held > num_tokens || (held_hashes < num_hashes && !supplied) {
        return Ok(None);
    }
    if held < num_tokens {
        let mut new = Vec::new();
        crate::errors::core(kvcoord_core::limits::try_reserve(
            &mut new,
            num_tokens - held,
            "token ids",
        ))?;
        for i in held..num_tokens {
            match crate::tokens::token(i, &tokens.get_item(i)?) {
                Ok(t) => new.push(t),
                Err(_) => return Ok(None), // placeholders: the registry converts them
            }
        }
        let fill = |t: &mut Vec<u32>| {
            t.extend_from_slice(&new);
            Ok::<(), kvcoord_core::KvError>(())
        };
        crate::errors::core(mine.try_append(fill, |h, t| {
            h.update(t);
        }))?;
    }
    if held_hashes < num_hashes {
        let digests = crate::convert::block_hashes(&hashes.get_slice(held_hashes, num_hashes))?;
        crate::errors::core(mine.supply_block_hashes(&digests))?;
    }
    crate::errors::core(mine.set_num_computed_tokens(computed))?;
    Ok(Some(num_hashes))
}

/// The answer of a decode step that fitted: `rooms[request_id]` set to the
/// room's limit for `num_lookahead_tokens` (removed where there are no
/// rooms), and the new block ids: `()` when no group got one, else one list
/// per group.
pub(crate) fn answer<'py>(
    py: Python<'py>,
    room: Option<DecodeRoom>,
    num_lookahead_tokens: usize,
    out: &NewBlocks,
    request_id: &Bound<'py, PyAny>,
    rooms: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    match room {
        Some(r) => rooms.set_item(request_id, r.limit(num_lookahead_tokens))?,
        None => {
            if rooms.contains(request_id)? {
                rooms.del_item(request_id)?;
            }
        }
    }
    if out.is_empty() {
        return Ok(PyTuple::empty(py).into_any());
    }
    let lists = (0..out.num_groups())
        .map(|g| PyList::new(py, out.group(g).iter().map(|b| b.0)))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyTuple::new(py, lists)?.into_any())
}
