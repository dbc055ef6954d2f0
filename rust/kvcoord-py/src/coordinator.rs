//! `kvcoord._core.CoordinatorCore`, the Rust mechanism under every Python
//! coordinator policy (per-group block tables, hit finders, the fused
//! `allocate_slots`, the request registry), and `BlockPoolView`, its pool
//! read-only. Conversion and delegation only: requests and their registry
//! are core state.

use kvcoord_core::coordinator::{
    AllocateArgs, CoordinatorConfig, CoordinatorCore, NewBlocks, PredictArgs,
};
use kvcoord_core::events::Medium;
use kvcoord_core::{
    BlockId, BlockPool, CoordinatorKind, EvictionConfig, GroupId, KvError, Manager, ReqId,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::args;
use crate::blocks::PyKVCacheBlocks;
use crate::convert;
use crate::errors::{core, err, type_error};
use crate::exclusive::{Entered, Exclusive};
use crate::kinds::{self, PyCoordinatorKind, PyGroupSpec};
use crate::numbers::{self, Blocks, Tokens, U32};
use crate::pool::{pool_readers, pool_writers};
use crate::request::PyRequest;

/// One scheduler's KV-cache mechanism: a pool shared by one manager per
/// group, every request's per-group block tables and the request registry.
///
/// Frozen: the state is behind an [`Exclusive`], so a call from another
/// thread waits for the running one instead of failing.
#[pyclass(module = "kvcoord._core", name = "CoordinatorCore", frozen)]
pub(crate) struct PyCoordinatorCore {
    state: Exclusive<CoreState>,
    /// The shared empty result (the common decode step allocates nothing).
    empty: Py<PyKVCacheBlocks>,
}

pub(crate) struct CoreState {
    pub(crate) inner: CoordinatorCore,
    /// Reused buffers for the per-step calls.
    out: NewBlocks,
    hits: Vec<Vec<BlockId>>,
}

impl PyCoordinatorCore {
    pub(crate) fn enter(&self, py: Python<'_>) -> PyResult<Entered<'_, CoreState>> {
        self.state.enter(py)
    }

    /// `f(core)`, read-only.
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&CoordinatorCore) -> R) -> PyResult<R> {
        Ok(f(&self.enter(py)?.inner))
    }

    /// `f(core)`, its result's error mapped.
    fn with_mut<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut CoordinatorCore) -> Result<R, KvError>,
    ) -> PyResult<R> {
        core(f(&mut self.enter(py)?.inner))
    }

    /// `f(core, request)` for a registered request id.
    fn with_request<R>(
        &self,
        py: Python<'_>,
        request_id: &str,
        f: impl FnOnce(&mut CoordinatorCore, ReqId) -> Result<R, KvError>,
    ) -> PyResult<R> {
        self.with_mut(py, |c| {
            let req = c.request_id(request_id)?;
            f(c, req)
        })
    }

    /// `f(pool)`, read-only (the shape `pool_writers` expects).
    fn pool_ref<R>(&self, py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        Ok(f(self.enter(py)?.inner.pool()))
    }

    fn pool_mut<R>(&self, py: Python<'_>, f: impl FnOnce(&mut BlockPool) -> R) -> PyResult<R> {
        Ok(f(self.enter(py)?.inner.pool_mut()))
    }

    /// `f(pool, ids)` with `block_ids` converted.
    fn pool_ids<R>(
        &self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut BlockPool, &[BlockId]) -> Result<R, KvError>,
    ) -> PyResult<R> {
        let ids = convert::block_ids(block_ids)?;
        core(f(self.enter(py)?.inner.pool_mut(), &ids))
    }
}

pool_writers!(pymethods!(PyCoordinatorCore {
    /// Tokens per hash unit (requests must be hashed with it).
    get hash_block_size(&self, py: Python<'_>) -> PyResult<u32> =
        self.with(py, |c| c.config().hash_block_size);
    /// LCM of the groups' block sizes.
    get scheduler_block_size(&self, py: Python<'_>) -> PyResult<u32> =
        self.with(py, |c| c.config().scheduler_block_size);
    /// The shared pool, read-only.
    get block_pool(slf: Bound<'_, Self>) -> PyBlockPoolView = PyBlockPoolView { owner: slf.unbind() };
    /// The shared empty result (no new block in any group).
    get empty(&self, py: Python<'_>) -> Py<PyKVCacheBlocks> = self.empty.clone_ref(py);
    get num_requests(&self, py: Python<'_>) -> PyResult<usize> = self.with(py, CoordinatorCore::num_requests);
    /// Multi-module MTP's re-prefillable tail (`num_prefill_lookahead - 1`).
    get num_reprefillable_tokens(&self, py: Python<'_>) -> PyResult<usize> =
        self.with(py, |c| c.config().num_reprefillable_tokens);
    /// Whether `allocate_slots` checks each hit against the prefix index.
    get verify_hits(&self, py: Python<'_>) -> PyResult<bool> =
        self.with(py, |c| c.config().verify_hits);
    /// The groups whose hits drop the EAGLE block, those of equal spec
    /// included.
    get eagle_groups(&self, py: Python<'_>) -> PyResult<Vec<u32>> =
        self.with(py, |c| c.config().eagle_group_ids().map(|g| g.0).collect());
    /// Tokens a hit ends on a multiple of: the hash unit with sub-block
    /// (partial) hits, else the scheduler block size.
    get hit_alignment(&self, py: Python<'_>) -> PyResult<usize> =
        self.with(py, |c| c.config().hit_alignment());
    /// Whether sub-block (partial) hits are on (vLLM's
    /// `enable_partial_hash_hits`).
    get partial_hits(&self, py: Python<'_>) -> PyResult<bool> =
        self.with(py, |c| c.config().partial_hits());
    /// The prefix-cache retention interval (None: dense).
    get retention_interval(&self, py: Python<'_>) -> PyResult<Option<i64>> =
        self.with(py, |c| c.config().retention_interval);
    /// Per group, the re-prefillable tokens it holds back from caching.
    get held_back_tokens(&self, py: Python<'_>) -> PyResult<Vec<usize>> =
        self.with(py, |c| c.config().held_back_tokens().collect());
    /// Whether decode steps have rooms (`decode_slots`): every group full
    /// attention, one held-back tail.
    get has_decode_room(&self, py: Python<'_>) -> PyResult<bool> =
        self.with(py, CoordinatorCore::has_decode_room);
}) {
    #[new]
    #[pyo3(signature = (num_blocks, groups, *, kind, max_model_len, retention_interval = None,
                        options = None))]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        groups: Vec<PyGroupSpec>,
        kind: PyCoordinatorKind,
        max_model_len: &Bound<'_, PyAny>,
        retention_interval: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let num_blocks = numbers::config::<Blocks>(num_blocks, "num_blocks")?.0;
        let kind = CoordinatorKind::from(kind);
        let max_model_len = numbers::config::<Tokens>(max_model_len, "max_model_len")?.0;
        let mut config = CoordinatorConfig::new(
            kinds::specs(&groups),
            num_blocks,
            kind.enable_caching(),
            max_model_len,
        );
        config.kind = kind;
        config.retention_interval = numbers::opt_config_i64(retention_interval, "retention_interval")?;
        if let Some(options) = options {
            read_options(options, &mut config)?;
        }
        let inner = convert::build_pool_sized(py, num_blocks, || CoordinatorCore::new(config));
        Ok(Self {
            state: Exclusive::new(CoreState {
                inner: core(inner)?,
                out: NewBlocks::new(),
                hits: Vec::new(),
            }),
            empty: Py::new(py, PyKVCacheBlocks::new(NewBlocks::empty(groups.len()))?)?,
        })
    }

    /// How many of `num_computed_tokens` group `group` may cache.
    fn num_cacheable_tokens(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let n = numbers::arg::<Tokens>(num_computed_tokens, "num_computed_tokens")?.0;
        self.with_mut(py, |c| c.config().checked_cacheable_tokens(group, n))
    }

    /// Per group, `None` unless its hits drop EAGLE's block (listed groups
    /// and those of equal spec), else the tokens a hybrid lookup lets it
    /// match past the candidate before dropping them.
    #[getter]
    fn eagle_margins(&self, py: Python<'_>) -> PyResult<Vec<Option<usize>>> {
        self.with(py, |c| c.managers().iter().map(Manager::eagle_hit_margin).collect())
    }

    /// Longest hit for groups sharing one spec: the blocks (one group per
    /// entry of `group_ids`) and the hit length in tokens.
    #[pyo3(signature = (group_ids, request, max_length, alignment, *, drop_eagle = false))]
    fn find_longest_cache_hit(
        &self,
        py: Python<'_>,
        group_ids: &Bound<'_, PyAny>,
        request: &Bound<'_, PyAny>,
        max_length: &Bound<'_, PyAny>,
        alignment: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = kw::drop_eagle)] drop_eagle: bool,
    ) -> PyResult<(PyKVCacheBlocks, usize)> {
        let request = crate::request::request_arg(request)?;
        let groups = convert::group_ids(group_ids)?;
        let max_length = numbers::arg::<Tokens>(max_length, "max_length")?.0;
        let alignment = numbers::arg::<Tokens>(alignment, "alignment")?.0;
        let (blocks, hit) = self.with_mut(py, |c| {
            c.find_longest_cache_hit(
                &groups,
                request.inner.block_hashes(),
                max_length,
                alignment,
                drop_eagle,
            )
        })?;
        Ok((
            PyKVCacheBlocks::new(NewBlocks::from_groups(blocks.iter().map(Vec::as_slice)))?,
            hit,
        ))
    }

    /// Every scalar is converted by `args` (range and type checked, naming
    /// the argument).
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = 0, new_computed_blocks = None,
                        num_lookahead_tokens = 0, num_encoder_tokens = 0, delay_cache_blocks = false,
                        num_external_computed_tokens = 0))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        // An omitted keyword takes its default without a call; one given,
        // `None` included, is converted (a `None` count or flag is refused).
        #[pyo3(from_py_with = kw::num_new_computed_tokens)] num_new_computed_tokens: usize,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = kw::num_lookahead_tokens)] num_lookahead_tokens: usize,
        #[pyo3(from_py_with = kw::num_encoder_tokens)] num_encoder_tokens: usize,
        #[pyo3(from_py_with = kw::delay_cache_blocks)] delay_cache_blocks: bool,
        #[pyo3(from_py_with = kw::num_external_computed_tokens)]
        num_external_computed_tokens: usize,
    ) -> PyResult<Option<Py<PyKVCacheBlocks>>> {
        let request = crate::request::request_arg(request)?;
        let args = AllocateArgs {
            num_new_tokens: numbers::arg::<Tokens>(num_new_tokens, "num_new_tokens")?.0,
            num_new_computed_tokens,
            num_lookahead_tokens,
            num_encoder_tokens,
            delay_cache_blocks,
            num_external_computed_tokens,
        };
        let mut state = self.enter(py)?;
        let CoreState { inner, out, hits } = &mut *state;
        let hits = match new_computed_blocks {
            Some(obj) => {
                fill_hits(obj, hits)?;
                Some(hits.as_slice())
            }
            None => None,
        };
        if !core(inner.allocate_request(&request.inner, &args, hits, out))? {
            return Ok(None);
        }
        if out.flat().is_empty() {
            return Ok(Some(self.empty.clone_ref(py)));
        }
        let blocks = PyKVCacheBlocks::new(out.clone())?;
        drop(state);
        Ok(Some(Py::new(py, blocks)?))
    }

    /// One decode step of vLLM's running `request` (`kvcoord.vllm`'s fast
    /// path; see `_core.pyi`): `mine`, its kvcoord request, brought up to
    /// date from it, then the core's `decode_step`. `None` when the pool
    /// cannot hold the step, `NotImplemented` (nothing changed) when the
    /// registry must sync `mine` first.
    #[allow(clippy::too_many_arguments)] // one call per step, positional
    pub(crate) fn decode_slots<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        mine: &Bound<'py, PyRequest>,
        request_id: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_lookahead_tokens: &Bound<'py, PyAny>,
        rooms: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let num_new_tokens = numbers::arg::<Tokens>(num_new_tokens, "num_new_tokens")?.0;
        let num_lookahead_tokens =
            numbers::arg::<Tokens>(num_lookahead_tokens, "num_lookahead_tokens")?.0;
        let mut mine = mine.try_borrow_mut()?;
        // vLLM's request is read before the core is entered (no Python code
        // runs while the core's state is held).
        let Some(num_hashes) = crate::decode::sync_running(request, &mut mine.inner)? else {
            return Ok(py.NotImplemented().into_bound(py));
        };
        let mut state = self.enter(py)?;
        let CoreState { inner, out, .. } = &mut *state;
        let step = inner.decode_step(
            &mine.inner,
            num_new_tokens,
            num_lookahead_tokens,
            num_hashes,
            out,
        );
        let Some(room) = core(step)? else {
            return Ok(py.None().into_bound(py));
        };
        let new = if out.is_empty() {
            NewBlocks::new()
        } else {
            out.clone()
        };
        drop(state);
        crate::decode::answer(py, room, num_lookahead_tokens, &new, request_id, rooms)
    }

    /// The room limit `decode_slots` records, for an allocation of `need`
    /// slots that cached the full blocks of `cached_to` tokens, `hashed` of
    /// them with hashes, and steps of `num_lookahead_tokens` speculative
    /// tokens; `None` where decode steps have no room.
    fn decode_room(
        &self,
        py: Python<'_>,
        need: &Bound<'_, PyAny>,
        cached_to: &Bound<'_, PyAny>,
        hashed: &Bound<'_, PyAny>,
        num_lookahead_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let need = numbers::arg::<Tokens>(need, "need")?.0;
        let cached_to = numbers::arg::<Tokens>(cached_to, "cached_to")?.0;
        let hashed = numbers::arg::<Tokens>(hashed, "hashed")?.0;
        let lookahead = numbers::arg::<Tokens>(num_lookahead_tokens, "num_lookahead_tokens")?.0;
        let room = core(self.with(py, |c| c.decode_room(need, cached_to, hashed))?)?;
        Ok(room.map(|r| r.limit(lookahead)))
    }

    /// Blocks an allocation of `num_tokens` slots would pull from the pool
    /// (vLLM's `get_num_blocks_to_allocate`); with `max_in_flight_tokens`,
    /// capped per group at the most blocks a request can hold (vLLM's
    /// full-sequence admission check); `num_tokens_main_model` of the
    /// slots are the main model's (the rest speculative: Mamba groups do
    /// not count them); `prefill_end` where the prefill ends (None: the
    /// request's own). Changes nothing.
    #[pyo3(signature = (request, num_tokens, new_computed_blocks = None, total_computed_tokens = None,
                        num_encoder_tokens = None, max_in_flight_tokens = None,
                        num_local_computed_tokens = None, num_tokens_main_model = None,
                        prefill_end = None))]
    #[allow(clippy::too_many_arguments)]
    fn num_blocks_to_allocate(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        total_computed_tokens: Option<&Bound<'_, PyAny>>,
        num_encoder_tokens: Option<&Bound<'_, PyAny>>,
        max_in_flight_tokens: Option<&Bound<'_, PyAny>>,
        num_local_computed_tokens: Option<&Bound<'_, PyAny>>,
        num_tokens_main_model: Option<&Bound<'_, PyAny>>,
        prefill_end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let request = crate::request::request_arg(request)?;
        let opt = |v, name| Ok::<_, PyErr>(numbers::maybe::<Tokens>(v, name)?.map(|t| t.0));
        let zero_or = |v, name| numbers::opt_arg(v, name, Tokens(0)).map(|t| t.0);
        let predict = PredictArgs {
            num_tokens: numbers::arg::<Tokens>(num_tokens, "num_tokens")?.0,
            total_computed_tokens: zero_or(total_computed_tokens, "total_computed_tokens")?,
            local_computed_tokens: opt(num_local_computed_tokens, "num_local_computed_tokens")?,
            num_encoder_tokens: zero_or(num_encoder_tokens, "num_encoder_tokens")?,
            max_in_flight_tokens: opt(max_in_flight_tokens, "max_in_flight_tokens")?,
            num_tokens_main_model: opt(num_tokens_main_model, "num_tokens_main_model")?,
            prefill_end: opt(prefill_end, "prefill_end")?,
        };
        let mut state = self.enter(py)?;
        let CoreState { inner, hits, .. } = &mut *state;
        hits.clear();
        if let Some(obj) = new_computed_blocks {
            fill_hits(obj, hits)?;
        }
        core(inner.num_blocks_to_allocate(&request.inner, hits, &predict))
    }

    /// Release the blocks of `request_id` that left every group's attention
    /// once `num_computed_tokens` tokens are processed (with
    /// `num_prompt_tokens`, R-SWA groups free their decode gap); an unknown
    /// id holds nothing (False).
    #[pyo3(signature = (request_id, num_computed_tokens, num_prompt_tokens = None))]
    fn remove_skipped_blocks(
        &self,
        py: Python<'_>,
        request_id: &str,
        num_computed_tokens: &Bound<'_, PyAny>,
        num_prompt_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let n = numbers::arg::<Tokens>(num_computed_tokens, "num_computed_tokens")?.0;
        let prompt = numbers::maybe::<Tokens>(num_prompt_tokens, "num_prompt_tokens")?.map(|t| t.0);
        self.with_mut(py, |c| c.remove_skipped_request(request_id, n, prompt))
    }

    fn cache_blocks(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let request = crate::request::request_arg(request)?;
        let n = numbers::arg::<Tokens>(num_tokens, "num_tokens")?.0;
        self.with_mut(py, |c| c.cache_request(&request.inner, n))
    }

    /// A new scheduler step begins (Mamba "align" states cached during the
    /// previous step become usable as hits).
    fn new_step_starts(&self, py: Python<'_>) -> PyResult<()> {
        self.enter(py)?.inner.new_step_starts();
        Ok(())
    }

    /// Drain the Mamba "align" states committed since the last call:
    /// `(request_id, group, block_id, num_tokens)` each, in the order they
    /// were cached (vLLM's boundary-state hand-offs; nothing pinned).
    fn take_boundary_state_offloads(
        &self,
        py: Python<'_>,
    ) -> PyResult<Vec<(String, u32, u32, usize)>> {
        let mut state = self.enter(py)?;
        let inner = &mut state.inner;
        let taken = inner.take_boundary_state_offloads();
        Ok(taken
            .into_iter()
            .map(|o| {
                let name = inner.request_name(o.req).unwrap_or_default();
                (name.to_owned(), o.group.0, o.block.0, o.num_tokens)
            })
            .collect())
    }

    /// The prefill checkpoint a live request's latest allocation reserved
    /// in a Mamba "align" group: `(token_position, table_index)`, or None.
    fn request_mamba_checkpoint(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(usize, usize)>> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let state = self.enter(py)?;
        core(state.inner.request_mamba_checkpoint(request_id, group))
    }

    /// Change the prefix-cache retention interval between steps (None:
    /// dense); refused as at construction.
    fn set_retention_interval(&self, py: Python<'_>, interval: &Bound<'_, PyAny>) -> PyResult<()> {
        let interval = numbers::opt_config_i64(Some(interval), "retention_interval")?;
        self.with_mut(py, |c| c.set_retention_interval(interval))
    }

    /// Drain the copy-on-write copies made since the last call:
    /// `(src_block_id, dst_block_id)` each; both ends stay held by the
    /// caller until freed through `free_caller_blocks`.
    fn take_block_copies(&self, py: Python<'_>) -> PyResult<Vec<(u32, u32)>> {
        let mut state = self.enter(py)?;
        Ok(state
            .inner
            .take_block_copies()
            .into_iter()
            .map(|(s, d)| (s.0, d.0))
            .collect())
    }

    /// A finishing request's own sub-block prompt-tail states that no later
    /// token was computed into: `(group, block_id, num_tokens)` each.
    fn finalize_partial_tail_offloads(
        &self,
        py: Python<'_>,
        request_id: &str,
        num_computed_tokens: &Bound<'_, PyAny>,
        num_in_flight_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(u32, u32, usize)>> {
        let computed = numbers::arg::<Tokens>(num_computed_tokens, "num_computed_tokens")?.0;
        let in_flight = numbers::arg::<Tokens>(num_in_flight_tokens, "num_in_flight_tokens")?.0;
        let mut state = self.enter(py)?;
        Ok(core(state
            .inner
            .finalize_partial_tail_offloads(request_id, computed, in_flight))?
            .into_iter()
            .map(|(g, b, t)| (g.0, b.0, t))
            .collect())
    }

    /// Free a request's blocks; unknown ids are ignored (as in vLLM).
    fn free(&self, py: Python<'_>, request_id: &str) -> PyResult<bool> {
        self.with_mut(py, |c| c.free_request(request_id))
    }

    /// Forget a request and hand its blocks' references to the caller
    /// (vLLM's `pop_blocks_for_free`): per group, the ids in allocation
    /// order (leading nulls trimmed); None for an unknown id. Released with
    /// `free_caller_blocks`.
    fn pop_request_to_caller(
        &self,
        py: Python<'_>,
        request_id: &str,
    ) -> PyResult<Option<Vec<Vec<u32>>>> {
        let got = self.with_mut(py, |c| c.pop_request_to_caller(request_id))?;
        Ok(got.map(|groups| {
            groups
                .into_iter()
                .map(|g| g.into_iter().map(|b| b.0).collect())
                .collect()
        }))
    }

    /// The request's block tables per group (0 marks null positions).
    fn blocks(&self, py: Python<'_>, request_id: &str) -> PyResult<PyKVCacheBlocks> {
        let state = self.enter(py)?;
        let tables = core(state.inner.request_block_ids(request_id))?;
        PyKVCacheBlocks::new(NewBlocks::from_groups(tables))
    }

    // ---- HiSparse rows (see kvcoord_core::managers::hisparse) ----------

    /// The block a request's page is read from in a `HiSparse` resident group
    /// (overlay applied), `None` when it is read from the host.
    fn resident_page(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
        page: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u32>> {
        let (group, page) = row_args(group, page)?;
        let found = self.with_request(py, request_id, |c, req| c.resident_page(req, group, page))?;
        Ok(found.map(|b| b.0))
    }

    /// A request's row in a resident group from page `start`, overlay
    /// applied (0 marks host-only pages).
    #[pyo3(signature = (request_id, group, start = None))]
    fn residency_row(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
        start: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<u32>> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let start = numbers::opt_arg(start, "start", Blocks(0))?.0;
        let row = self.with_request(py, request_id, |c, req| c.residency_row(req, group, start))?;
        Ok(row.into_iter().map(|b| b.0).collect())
    }

    /// Point a host-only page at `block_id` (unbacked until the next
    /// `touch_resident_blocks` of it); `False` when the page is resident or
    /// past the table.
    fn adopt_resident_page(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
        page: &Bound<'_, PyAny>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let (group, page) = row_args(group, page)?;
        let block = numbers::arg::<BlockId>(block_id, "block_id")?;
        self.with_request(py, request_id, |c, req| c.adopt_resident_page(req, group, page, block))
    }

    /// `unpin_resident_block` of the block a page is read from; the block,
    /// or `None` for a host-only page.
    fn unpin_resident_page(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
        page: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u32>> {
        let (group, page) = row_args(group, page)?;
        let found = self.with_request(py, request_id, |c, req| c.unpin_resident_page(req, group, page))?;
        Ok(found.map(|b| b.0))
    }

    /// Make a page host-only, consuming a reference given up on its block;
    /// the block it was read from.
    fn drop_resident_page(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
        page: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u32>> {
        let (group, page) = row_args(group, page)?;
        let found = self.with_request(py, request_id, |c, req| c.drop_resident_page(req, group, page))?;
        Ok(found.map(|b| b.0))
    }

    /// Ask for a request's hot region in a `HiSparse` hot group.
    fn require_hot(&self, py: Python<'_>, request_id: &str, group: &Bound<'_, PyAny>) -> PyResult<()> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        self.with_request(py, request_id, |c, req| c.require_hot(req, group))
    }

    /// Whether a request holds its whole hot region in a hot group.
    fn has_hot(&self, py: Python<'_>, request_id: &str, group: &Bound<'_, PyAny>) -> PyResult<bool> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        self.with_request(py, request_id, |c, req| c.has_hot(req, group))
    }

    /// Grow a request's hot region to its whole size when it has been asked
    /// for (vLLM's `HiSparseHotManager.allocate_new_blocks`); the new ids.
    fn allocate_hot(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let got = self.with_request(py, request_id, |c, req| c.allocate_hot(req, group))?;
        Ok(got.into_iter().map(|b| b.0).collect())
    }

    /// Whether a request's hot region in a hot group has been asked for
    /// (vLLM's `hot_required` membership).
    fn hot_required(
        &self,
        py: Python<'_>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        self.with_request(py, request_id, |c, req| c.hot_required(req, group))
    }

    /// Give up one reference on a block of a resident group while its pages
    /// are still read (vLLM's `unpin_blocks` on that group's pool).
    fn unpin_resident_block(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyAny>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let block = numbers::arg::<BlockId>(block_id, "block_id")?;
        self.with_mut(py, |c| c.unpin_resident_block(group, block))
    }

    /// vLLM's `touch` on a resident group's pool: backs a waiting adoption,
    /// else a caller reference.
    fn touch_resident_blocks(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyAny>,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let ids = convert::block_ids(block_ids)?;
        self.with_mut(py, |c| c.touch_resident_blocks(group, &ids))
    }

    /// Take one caller reference on each block (vLLM's `touch`).
    fn touch_caller_blocks(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        self.with_mut(py, |c| c.touch_caller_blocks(&ids))
    }

    /// Unpinned blocks the pool handed out (or forgot) since the last call.
    fn take_reused_watched(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        let reused = self.pool_mut(py, BlockPool::take_reused_watched)?;
        Ok(reused.into_iter().map(|b| b.0).collect())
    }

    fn num_common_prefix_blocks(&self, py: Python<'_>, request_id: &str) -> PyResult<Vec<usize>> {
        self.with_mut(py, |c| c.request_common_prefix_blocks(request_id))
    }

    /// Switch the pool's eviction policy (a spec string such as `"lfu"`);
    /// refused while any block is in use.
    fn set_eviction_policy(&self, py: Python<'_>, spec: &str) -> PyResult<()> {
        let eviction: EvictionConfig = core(spec.parse())?;
        self.with_mut(py, |c| c.pool_mut().set_eviction(eviction))
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::invariants(self.with(py, CoordinatorCore::check_invariants)?)
    }

    /// Take blocks from the free queue for the caller, held outside every
    /// request table until `free_caller_blocks`.
    fn get_caller_blocks<'py>(
        &self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n = numbers::arg::<Blocks>(num_blocks, "num_blocks")?.0;
        let mut out = Vec::new();
        self.with_mut(py, |c| c.get_caller_blocks(n, &mut out))?;
        convert::id_list(py, &out)
    }

    /// Release one caller reference of each block (eviction order).
    fn free_caller_blocks(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        self.with_mut(py, |c| c.free_caller_blocks(&ids))
    }

    /// References the caller holds outside every request table.
    #[getter]
    fn num_caller_references(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, CoordinatorCore::num_caller_references)
    }

    /// Cache the caller's blocks `block_ids[num_cached_blocks:num_full_blocks]`.
    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, group_id, block_size))]
    #[allow(clippy::too_many_arguments)] // Python arguments, converted once
    fn cache_caller_blocks(
        &self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_cached_blocks: &Bound<'_, PyAny>,
        num_full_blocks: &Bound<'_, PyAny>,
        group_id: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        let hashes = convert::block_hashes(block_hashes)?;
        let num_cached = numbers::arg::<Blocks>(num_cached_blocks, "num_cached_blocks")?.0;
        let num_full = numbers::arg::<Blocks>(num_full_blocks, "num_full_blocks")?.0;
        let group = numbers::arg::<GroupId>(group_id, "group id")?;
        let block_size = numbers::arg::<U32>(block_size, "block_size")?.0 as usize;
        self.with_mut(py, |c| {
            c.cache_caller_blocks(&ids, &hashes, num_cached, num_full, group, block_size)
        })
    }

    /// Put uncached blocks, in order, in the prefix index under one key.
    fn insert_cache_key(
        &self,
        py: Python<'_>,
        block_hash: &Bound<'_, PyAny>,
        group_id: &Bound<'_, PyAny>,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let hash = convert::block_hash(block_hash)?;
        let group = numbers::arg::<GroupId>(group_id, "group id")?;
        let ids = convert::block_ids(block_ids)?;
        self.with_mut(py, |c| c.insert_cache_key(hash, group, &ids))
    }
});

/// `new_computed_blocks`: a `KVCacheBlocks` (ids read directly), or a plain
/// sequence of per-group id sequences/arrays.
pub(crate) fn fill_hits(obj: &Bound<'_, PyAny>, hits: &mut Vec<Vec<BlockId>>) -> PyResult<()> {
    if let Ok(b) = obj.cast::<PyKVCacheBlocks>() {
        b.get().inner.to_vecs_into(hits);
        return Ok(());
    }
    let seq = obj
        .cast::<PyTuple>()
        .map(|t| t.as_sequence().clone())
        .or_else(|_| obj.cast::<PyList>().map(|l| l.as_sequence().clone()))
        .map_err(|_| {
            err(KvError::InvalidArgument {
                name: "new_computed_blocks",
                detail: "expected a KVCacheBlocks or one list of block ids per group".into(),
            })
        })?;
    let n = seq.len()?;
    hits.resize_with(n, Vec::new);
    hits.truncate(n);
    for (g, item) in seq.try_iter()?.enumerate() {
        hits[g].clear();
        convert::extend_ids(&item?, &mut hits[g], 0)?;
    }
    Ok(())
}

// ---- the manager's pool, read-only ------------------------------------
//
// A separate type from the standalone `BlockPool`: its blocks are
// allocated, cached and freed through the manager (whose block tables must
// match the reference counts), so it has no mutating method. It lives here,
// beside its owner, so that no two modules import each other.

/// Read-only view of the pool inside a `CoordinatorCore`.
#[pyclass(module = "kvcoord._core", name = "BlockPoolView", frozen)]
pub(crate) struct PyBlockPoolView {
    owner: Py<PyCoordinatorCore>,
}

impl PyBlockPoolView {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        self.owner.get().pool_ref(py, f)
    }
}

pool_readers!(PyBlockPoolView, "BlockPoolView", {});

/// A row call's group and page, converted.
fn row_args(group: &Bound<'_, PyAny>, page: &Bound<'_, PyAny>) -> PyResult<(GroupId, usize)> {
    let group = numbers::arg::<GroupId>(group, "group")?;
    Ok((group, numbers::arg::<Blocks>(page, "page")?.0))
}

/// `CoordinatorCore`'s keyword conversions: each refusal is a kvcoord
/// error naming its keyword (not `PyO3`'s bare `TypeError` or
/// `OverflowError`).
/// Set `config`'s options from a `kvcoord.coordinator.CoordinatorOptions`
/// (any object with its attributes), each converted and refused as the
/// keyword of that name. A `None` where the dataclass allows one keeps the
/// core's default.
fn read_options<'py>(options: &Bound<'py, PyAny>, config: &mut CoordinatorConfig) -> PyResult<()> {
    let get = |name: &str| {
        options.getattr(name).map_err(|_| {
            type_error(format!(
                "options must be a CoordinatorOptions, got {} without {name}",
                args::type_name(options)
            ))
        })
    };
    let given = |value: Bound<'py, PyAny>| (!value.is_none()).then_some(value);
    if let Some(h) = given(get("hash_block_size")?) {
        config.hash_block_size = numbers::config::<U32>(&h, "hash_block_size")?.0;
    }
    config.enable_events = kw::enable_events(&get("enable_events")?)?;
    if let Some(n) = given(get("num_reprefillable_tokens")?) {
        config.num_reprefillable_tokens =
            numbers::config::<Tokens>(&n, "num_reprefillable_tokens")?.0;
    }
    if let Some(g) = given(get("eagle_group_ids")?) {
        config.eagle_groups = convert::group_ids(&g)?;
    }
    if let Some(n) = given(get("num_hash_lookahead_tokens")?) {
        config.num_hash_lookahead_tokens =
            numbers::config::<Tokens>(&n, "num_hash_lookahead_tokens")?.0;
    }
    config.allow_partial_hits = kw::allow_partial_hits(&get("allow_partial_hits")?)?;
    config.context_parallel = kw::context_parallel(&get("context_parallel")?)?;
    config.verify_hits = kw::verify_hits(&get("verify_hits")?)?;
    config.group_id_base = kw::group_id_base(&get("group_id_base")?)?;
    let medium = get("event_medium")?;
    let Ok(medium) = medium.cast::<PyString>() else {
        return Err(type_error(format!(
            "event_medium must be a str, got {}",
            args::type_name(&medium)
        )));
    };
    config.event_medium = core(medium.to_str()?.parse::<Medium>())?;
    config.rekey_keyed_prompt_tail = kw::rekey_keyed_prompt_tail(&get("rekey_keyed_prompt_tail")?)?;
    config.eagle_junction_block = kw::eagle_junction_block(&get("eagle_junction_block")?)?;
    Ok(())
}

mod kw {
    use pyo3::prelude::*;

    use crate::args;
    use crate::numbers::{self, Tokens, U32};

    /// A token count keyword (`numbers::Tokens`).
    #[inline]
    fn tokens(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
        numbers::arg::<Tokens>(obj, name).map(|t| t.0)
    }

    /// A 32-bit configuration keyword (`numbers::U32`).
    fn config_u32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
        numbers::config::<U32>(obj, name).map(|v| v.0)
    }

    /// One conversion per keyword, named after it.
    macro_rules! keywords {
        ($($name:ident: $convert:path => $ty:ty),* $(,)?) => {$(
            pub(super) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<$ty> {
                $convert(obj, stringify!($name))
            }
        )*};
    }

    keywords! {
        enable_events: args::flag => bool,
        allow_partial_hits: args::flag => bool,
        context_parallel: args::flag => bool,
        verify_hits: args::flag => bool,
        rekey_keyed_prompt_tail: args::flag => bool,
        eagle_junction_block: args::flag => bool,
        drop_eagle: args::flag => bool,
        delay_cache_blocks: args::flag => bool,
        group_id_base: config_u32 => u32,
        num_new_computed_tokens: tokens => usize,
        num_lookahead_tokens: tokens => usize,
        num_encoder_tokens: tokens => usize,
        num_external_computed_tokens: tokens => usize,
    }
}
