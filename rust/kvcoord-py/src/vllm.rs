//! The two entry points of `kvcoord.vllm` that vLLM's scheduler calls per
//! request and step, answered without a Python frame when there is nothing
//! to do: `BlockHashGate` (the request block hasher vLLM's `Request` calls on
//! every token append) and `DecodeFastPath` (the base class of
//! `kvcoord.vllm.KVCacheManager` that holds its `allocate_slots`).
//!
//! Conversion only: whether a call has anything to do is the core's rule
//! (`hashing::completes_block`, `decode::inside_room`); everything else is
//! handed to the adapter's Python code (the hasher behind the gate, the
//! manager's `_allocate` and `_decode_core`), or, for the decode steps that
//! reach the core, to `CoordinatorCore.decode_slots`.

use kvcoord_core::decode::inside_room;
use kvcoord_core::hashing::completes_block;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use crate::errors::value_error;
use crate::request::PyRequest;

/// The length of `obj` when it is a list (the common case, read without a
/// method call) or has one.
fn length(obj: &Bound<'_, PyAny>) -> Option<usize> {
    match obj.cast::<PyList>() {
        Ok(list) => Some(list.len()),
        Err(_) => obj.len().ok(),
    }
}

/// vLLM's request block hasher in front of `hasher` (the adapter's, which
/// hashes in kvcoord's core or hands the request to vLLM's): a call for a
/// request whose tokens complete no block returns the empty tuple at once. A
/// call whose tokens complete a block, for a request that already keeps its
/// kvcoord hashing request in the attribute `hashes_attr`, is that
/// request's `catch_up` (no Python frame). Any other call is
/// `hasher(request)`, which also decides every case `catch_up` refuses.
#[pyclass(module = "kvcoord._core", name = "BlockHashGate", frozen)]
pub(crate) struct PyBlockHashGate {
    block_size: usize,
    hasher: Py<PyAny>,
    hashes_attr: Option<Py<PyString>>,
}

#[pymethods]
impl PyBlockHashGate {
    #[new]
    #[pyo3(signature = (block_size, hasher, hashes_attr = None))]
    fn new(
        block_size: &Bound<'_, PyAny>,
        hasher: Py<PyAny>,
        hashes_attr: Option<Bound<'_, PyString>>,
    ) -> PyResult<Self> {
        let block_size =
            crate::numbers::arg::<crate::numbers::U32>(block_size, "block_size")?.0 as usize;
        if block_size == 0 {
            return Err(value_error("block_size must be at least 1"));
        }
        // Interned: the attribute is read on every completed block.
        let hashes_attr = match hashes_attr {
            Some(a) => Some(PyString::intern(a.py(), a.to_str()?).unbind()),
            None => None,
        };
        Ok(Self {
            block_size,
            hasher,
            hashes_attr,
        })
    }

    /// The block hashes of `request` (vLLM's ``Request``) that its new
    /// tokens completed, as ``hasher`` returns them.
    fn hash_request<'py>(&self, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = request.py();
        // vLLM 0.33.0's token list, read as the adapter's hasher reads it;
        // a request without it goes to that hasher.
        if let (Ok(tokens), Ok(hashes)) = (
            request.getattr(intern!(py, "_all_token_ids")),
            request.getattr(intern!(py, "block_hashes")),
        ) {
            if let (Some(num_tokens), Some(done)) = (length(&tokens), length(&hashes)) {
                if !completes_block(done, self.block_size, num_tokens) {
                    // The shared empty tuple: vLLM only extends its
                    // `block_hashes` with the answer, and a new empty list
                    // on every token append is a fifth of the gate's cost.
                    return Ok(PyTuple::empty(py).into_any());
                }
                if let Some(new) = self.catch_up(request, &tokens, done) {
                    return Ok(new.into_any());
                }
            }
        }
        self.hasher.bind(py).call1((request,))
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.hasher)
    }
}

impl PyBlockHashGate {
    /// The new digests from `request`'s kvcoord hashing request brought up
    /// to `tokens` (an exact list), or `None` where `hasher` must answer: no
    /// such request yet, a list of another type, a request that is borrowed
    /// or ahead of `tokens`, or tokens it refuses (all-or-nothing: nothing
    /// changed, and `hasher` then hands the request back to vLLM).
    fn catch_up<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        tokens: &Bound<'py, PyAny>,
        done: usize,
    ) -> Option<Bound<'py, PyList>> {
        let attr = self.hashes_attr.as_ref()?;
        let tokens = tokens.cast_exact::<PyList>().ok()?;
        let mine = request.getattr(attr.bind(request.py())).ok()?;
        let mine = mine.cast_exact::<PyRequest>().ok()?;
        let mut mine = mine.try_borrow_mut().ok()?;
        mine.catch_up_from(request.py(), tokens, done)
            .ok()
            .flatten()
    }
}

/// What `allocate_slots` reads, set once by the manager's constructor.
struct Parts {
    /// Request id -> room limit (the manager's `_decode_room`).
    rooms: Py<PyDict>,
    /// The manager's `empty_kv_cache_blocks`.
    empty: Py<PyAny>,
    /// The request registry's entries by id and the core's `decode_slots`
    /// (the manager's `_decode_fixed`), where decode steps past a room take
    /// that call.
    fixed: Option<(Py<PyDict>, Py<PyAny>)>,
    /// `KVCacheBlocks` and the pool its results carry.
    blocks_type: Py<PyAny>,
    pool: Py<PyAny>,
}

/// The base class of `kvcoord.vllm.KVCacheManager`: its `allocate_slots`.
///
/// A decode step of a running request that stays inside its room (see
/// `CoordinatorCore.decode_room`) returns the empty blocks without the core;
/// one that leaves it, in a configuration with nothing else to record, goes
/// to `CoordinatorCore.decode_slots`; every other call is the subclass's
/// `_allocate(...)` (or `_decode_core(...)` where the registry must sync
/// first).
///
/// Not frozen: the parts are set after construction (and may be set again).
/// Python code runs during a call only to read vLLM's request, build a
/// result or take the general path (after the call's borrow ended).
#[pyclass(module = "kvcoord._core", name = "DecodeFastPath", subclass)]
pub(crate) struct PyDecodeFastPath {
    parts: Option<Parts>,
    /// The speculative-token count every room limit is for.
    room_lookahead: usize,
}

/// `allocate_slots`'s optional arguments as passed (`None`: not passed).
struct Optional<'a, 'py> {
    num_new_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    new_computed_blocks: Option<&'a Bound<'py, PyAny>>,
    num_lookahead_tokens: Option<&'a Bound<'py, PyAny>>,
    num_external_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    delay_cache_blocks: Option<&'a Bound<'py, PyAny>>,
    num_encoder_tokens: Option<&'a Bound<'py, PyAny>>,
    full_sequence_must_fit: Option<&'a Bound<'py, PyAny>>,
    reserved_blocks: Option<&'a Bound<'py, PyAny>>,
    has_scheduled_reqs: Option<&'a Bound<'py, PyAny>>,
    skip_zeroing_group_ids: Option<&'a Bound<'py, PyAny>>,
}

/// Whether `obj` (absent: the default, false) is true for Python; an
/// object whose truth cannot be told counts as true (the general path
/// then decides).
fn truthy(obj: Option<&Bound<'_, PyAny>>) -> bool {
    obj.is_some_and(|o| o.is_truthy().unwrap_or(true))
}

/// An int argument (absent: `default`) as an `i64`; `None` for anything
/// else (the general path then decides).
fn int_or(obj: Option<&Bound<'_, PyAny>>, default: i64) -> Option<i64> {
    obj.map_or(Some(default), |o| o.extract::<i64>().ok())
}

/// Where an `allocate_slots` call goes.
enum Route<'py> {
    /// Answered here.
    Answer(Bound<'py, PyAny>),
    /// The adapter's decode path (`_decode_core`): the registry syncs first.
    DecodeCore,
    /// The adapter's general path (`_allocate`).
    General,
}

/// An int argument as passed, or `default` where it was not.
fn passed_or<'py>(
    py: Python<'py>,
    obj: Option<&Bound<'py, PyAny>>,
    default: i64,
) -> PyResult<Bound<'py, PyAny>> {
    match obj {
        Some(o) => Ok(o.clone()),
        None => Ok(default.into_pyobject(py)?.into_any()),
    }
}

impl PyDecodeFastPath {
    /// Where the call goes; answered here when it is a decode step of a
    /// running request with a room, nothing else passed, and either inside
    /// the room or one `decode_slots` call.
    fn route<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        opt: &Optional<'_, 'py>,
    ) -> PyResult<Route<'py>> {
        let py = request.py();
        let Some(parts) = self.parts.as_ref() else {
            return Ok(Route::General);
        };
        let request_id = request.getattr(intern!(py, "request_id"))?;
        let Some(limit) = parts.rooms.bind(py).get_item(&request_id)? else {
            return Ok(Route::General);
        };
        let lookahead = int_or(opt.num_lookahead_tokens, 0);
        let room_lookahead = self.room_lookahead;
        let empty = parts.empty.bind(py);
        let plain = lookahead.and_then(|l| usize::try_from(l).ok()) == Some(room_lookahead)
            && opt
                .new_computed_blocks
                .is_none_or(|b| b.is_none() || b.is(empty))
            && !(truthy(opt.num_new_computed_tokens)
                || truthy(opt.num_external_computed_tokens)
                || truthy(opt.num_encoder_tokens)
                || truthy(opt.full_sequence_must_fit)
                || truthy(opt.reserved_blocks));
        let new = match num_new_tokens.extract::<i64>().map(usize::try_from) {
            Ok(Ok(n)) if n > 0 && plain => n,
            _ => return Ok(Route::General),
        };
        let computed = request.getattr(intern!(py, "num_computed_tokens"))?;
        let (Ok(computed), Ok(limit)) = (computed.extract::<usize>(), limit.extract::<usize>())
        else {
            return Ok(Route::General);
        };
        if inside_room(limit, computed, new) {
            return Ok(Route::Answer(empty.clone()));
        }
        if truthy(opt.delay_cache_blocks) {
            return Ok(Route::General);
        }
        let Some((registered, decode_slots)) = parts.fixed.as_ref() else {
            return Ok(Route::General);
        };
        // kvcoord's request, when the registry holds it for this very object.
        let Some(entry) = registered.bind(py).get_item(&request_id)? else {
            return Ok(Route::DecodeCore);
        };
        let Ok(entry) = entry.cast_into::<PyTuple>() else {
            return Ok(Route::DecodeCore);
        };
        let (Ok(theirs), Ok(mine)) = (entry.get_item(0), entry.get_item(1)) else {
            return Ok(Route::DecodeCore);
        };
        if !theirs.is(request) {
            return Ok(Route::DecodeCore);
        }
        let lookahead = passed_or(py, opt.num_lookahead_tokens, 0)?;
        let rooms = parts.rooms.bind(py);
        let ids = decode_slots.bind(py).call1((
            request,
            mine,
            &request_id,
            num_new_tokens,
            &lookahead,
            rooms,
        ))?;
        if ids.is(py.NotImplemented()) {
            return Ok(Route::DecodeCore);
        }
        if ids.is_none() {
            return Ok(Route::Answer(ids));
        }
        let ids = ids.cast_into::<PyTuple>()?;
        if ids.is_empty() {
            return Ok(Route::Answer(empty.clone()));
        }
        let made = parts
            .blocks_type
            .bind(py)
            .call1((ids, parts.pool.bind(py)))?;
        Ok(Route::Answer(made))
    }
}

#[pymethods]
impl PyDecodeFastPath {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self {
            parts: None,
            room_lookahead: 0,
        }
    }

    /// Set what `allocate_slots` reads: the manager's room dict, its empty
    /// blocks, `(registry entries, CoordinatorCore.decode_slots)` where
    /// decode steps past a room take that call (else None), the result type
    /// and the pool it carries.
    #[pyo3(signature = (rooms, empty, fixed, blocks_type, pool))]
    fn _init_fast_path(
        &mut self,
        rooms: Py<PyDict>,
        empty: Py<PyAny>,
        fixed: Option<(Py<PyDict>, Py<PyAny>)>,
        blocks_type: Py<PyAny>,
        pool: Py<PyAny>,
    ) {
        self.parts = Some(Parts {
            rooms,
            empty,
            fixed,
            blocks_type,
            pool,
        });
    }

    /// The speculative-token count the room limits are for.
    #[getter(_room_lookahead)]
    fn room_lookahead(&self) -> usize {
        self.room_lookahead
    }

    #[setter(_room_lookahead)]
    fn set_room_lookahead(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.room_lookahead =
            crate::numbers::arg::<crate::numbers::Tokens>(value, "_room_lookahead")?.0;
        Ok(())
    }

    /// vLLM's ``allocate_slots`` (see ``kvcoord.vllm.KVCacheManager``).
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = None,
                        new_computed_blocks = None, num_lookahead_tokens = None,
                        num_external_computed_tokens = None, delay_cache_blocks = None,
                        num_encoder_tokens = None, full_sequence_must_fit = None,
                        reserved_blocks = None, has_scheduled_reqs = None,
                        skip_zeroing_group_ids = None))]
    #[allow(clippy::too_many_arguments)] // vLLM's signature
    fn allocate_slots<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_new_computed_tokens: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<&Bound<'py, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
        num_external_computed_tokens: Option<&Bound<'py, PyAny>>,
        delay_cache_blocks: Option<&Bound<'py, PyAny>>,
        num_encoder_tokens: Option<&Bound<'py, PyAny>>,
        full_sequence_must_fit: Option<&Bound<'py, PyAny>>,
        reserved_blocks: Option<&Bound<'py, PyAny>>,
        has_scheduled_reqs: Option<&Bound<'py, PyAny>>,
        skip_zeroing_group_ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let opt = Optional {
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
            full_sequence_must_fit,
            reserved_blocks,
            has_scheduled_reqs,
            skip_zeroing_group_ids,
        };
        let route = slf.try_borrow()?.route(request, num_new_tokens, &opt)?;
        match route {
            Route::Answer(answer) => Ok(answer),
            Route::DecodeCore => {
                let lookahead = passed_or(py, opt.num_lookahead_tokens, 0)?;
                slf.call_method1(
                    intern!(py, "_decode_core"),
                    (request, num_new_tokens, lookahead),
                )
            }
            Route::General => {
                let or_int = |o: Option<&Bound<'py, PyAny>>, d: i64| passed_or(py, o, d);
                let or_bool = |o: Option<&Bound<'py, PyAny>>, d: bool| match o {
                    Some(o) => o.clone(),
                    None => pyo3::types::PyBool::new(py, d).to_owned().into_any(),
                };
                let none = py.None().into_bound(py);
                let call = (
                    request,
                    num_new_tokens,
                    or_int(opt.num_new_computed_tokens, 0)?,
                    opt.new_computed_blocks
                        .map_or_else(|| none.clone(), Clone::clone),
                    or_int(opt.num_lookahead_tokens, 0)?,
                    or_int(opt.num_external_computed_tokens, 0)?,
                    or_bool(opt.delay_cache_blocks, false),
                    or_int(opt.num_encoder_tokens, 0)?,
                    or_bool(opt.full_sequence_must_fit, false),
                    or_int(opt.reserved_blocks, 0)?,
                    or_bool(opt.has_scheduled_reqs, true),
                    opt.skip_zeroing_group_ids
                        .map_or_else(|| PyTuple::empty(py).into_any(), Clone::clone),
                );
                slf.call_method1(intern!(py, "_allocate"), call)
            }
        }
    }

    fn __clear__(&mut self) {
        self.parts = None;
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(p) = &self.parts {
            visit.call(&p.rooms)?;
            visit.call(&p.empty)?;
            if let Some((registered, decode_slots)) = &p.fixed {
                visit.call(registered)?;
                visit.call(decode_slots)?;
            }
            visit.call(&p.blocks_type)?;
            visit.call(&p.pool)?;
        }
        Ok(())
    }
}
