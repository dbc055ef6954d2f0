//! `kvcoord._core.CoordinatorCore`: the Rust mechanism under every Python
//! coordinator policy (per-group block tables, hit finders, the fused
//! `allocate_slots`, the request registry). Conversion and delegation only:
//! requests and their registry are core state.

use kvcoord_core::coordinator::{AllocateArgs, CoordinatorConfig, CoordinatorCore, NewBlocks};
use kvcoord_core::{BlockId, BlockPool, CoordinatorKind, EvictionConfig, KvError};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::args;
use crate::blocks::PyKVCacheBlocks;
use crate::convert;
use crate::errors::{core, CoreError};
use crate::events::PyEventList;
use crate::kinds::{self, PyCoordinatorKind, PyGroupSpec};
use crate::pool;
use crate::request::PyRequest;

/// One scheduler's KV-cache mechanism: a pool shared by one manager per
/// group, every request's per-group block tables and the request registry.
#[pyclass(module = "kvcoord._core", name = "CoordinatorCore")]
pub(crate) struct PyCoordinatorCore {
    pub(crate) inner: CoordinatorCore,
    /// Reused buffers for the per-step calls.
    out: NewBlocks,
    hits: Vec<Vec<BlockId>>,
    /// The shared empty result (the common decode step allocates nothing).
    empty: Py<PyKVCacheBlocks>,
}

#[pymethods]
impl PyCoordinatorCore {
    #[new]
    #[pyo3(signature = (num_blocks, groups, *, kind, hash_block_size, max_model_len,
                        retention_interval = None, enable_events = false))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, converted once
    fn new(
        py: Python<'_>,
        num_blocks: i64,
        groups: Vec<PyGroupSpec>,
        kind: PyCoordinatorKind,
        hash_block_size: Option<i64>,
        max_model_len: i64,
        retention_interval: Option<i64>,
        enable_events: bool,
    ) -> PyResult<Self> {
        let num_blocks = convert::count(num_blocks, "num_blocks")?;
        let kind = CoordinatorKind::from(kind);
        let mut config = CoordinatorConfig::new(
            kinds::specs(&groups),
            num_blocks,
            kind.enable_caching(),
            convert::config_count(max_model_len, "max_model_len")?,
        );
        config.kind = kind;
        if let Some(hbs) = hash_block_size {
            config.hash_block_size = convert::config_count(hbs, "hash_block_size")?;
        }
        config.retention_interval = retention_interval;
        config.enable_events = enable_events;
        let inner = convert::build_pool_sized(py, num_blocks, || CoordinatorCore::new(config));
        Ok(Self {
            inner: core(inner)?,
            out: NewBlocks::new(),
            hits: Vec::new(),
            empty: Py::new(py, PyKVCacheBlocks::empty(groups.len()))?,
        })
    }

    /// Tokens per hash unit (requests must be hashed with it).
    #[getter]
    fn hash_block_size(&self) -> u32 {
        self.inner.config().hash_block_size
    }

    /// LCM of the groups' block sizes.
    #[getter]
    fn scheduler_block_size(&self) -> u32 {
        self.inner.config().scheduler_block_size
    }

    /// The shared pool, read-only.
    #[getter]
    fn block_pool(slf: Bound<'_, Self>) -> PyBlockPoolView {
        PyBlockPoolView {
            owner: slf.unbind(),
        }
    }

    /// The shared empty result (no new block in any group).
    #[getter]
    fn empty(&self, py: Python<'_>) -> Py<PyKVCacheBlocks> {
        self.empty.clone_ref(py)
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    /// Longest hit for groups sharing one spec: one read-only `uint32`
    /// array per group, and the hit length in tokens.
    fn find_longest_cache_hit<'py>(
        &self,
        py: Python<'py>,
        group_ids: &Bound<'_, PyAny>,
        request: PyRef<'_, PyRequest>,
        max_length: i64,
        alignment: i64,
    ) -> PyResult<(Bound<'py, PyList>, usize)> {
        let groups = convert::group_ids(group_ids)?;
        let max_length = convert::count(max_length, "max_length")?;
        let alignment = convert::count(alignment, "alignment")?;
        let (blocks, hit) = core(self.inner.find_longest_cache_hit(
            &groups,
            request.inner.block_hashes(),
            max_length,
            alignment,
        ))?;
        let arrays = blocks.iter().map(|ids| {
            let raw: Vec<u32> = ids.iter().map(|b| b.0).collect();
            PyArray1::from_vec(py, raw)
        });
        Ok((PyList::new(py, arrays)?, hit))
    }

    /// Every scalar is converted by `args` (range and type checked, naming
    /// the argument); `None` stands for an omitted default.
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = None, new_computed_blocks = None,
                        num_lookahead_tokens = None, num_encoder_tokens = None, delay_cache_blocks = None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots(
        &mut self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        num_new_computed_tokens: Option<&Bound<'_, PyAny>>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        num_encoder_tokens: Option<&Bound<'_, PyAny>>,
        delay_cache_blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyKVCacheBlocks>>> {
        let request = args::request(request)?;
        let args = AllocateArgs {
            num_new_tokens: args::count(num_new_tokens, "num_new_tokens")?,
            num_new_computed_tokens: args::opt_count(
                num_new_computed_tokens,
                "num_new_computed_tokens",
            )?,
            num_lookahead_tokens: args::opt_count(num_lookahead_tokens, "num_lookahead_tokens")?,
            num_encoder_tokens: args::opt_count(num_encoder_tokens, "num_encoder_tokens")?,
            delay_cache_blocks: args::opt_flag(delay_cache_blocks, "delay_cache_blocks", false)?,
        };
        let mut hits = std::mem::take(&mut self.hits);
        let has_hits = match new_computed_blocks {
            None => false,
            Some(obj) => {
                let filled = fill_hits(obj, &mut hits);
                if let Err(e) = filled {
                    self.hits = hits;
                    return Err(e);
                }
                true
            }
        };
        let mut out = std::mem::take(&mut self.out);
        let result = self.inner.allocate_request(
            &request.inner,
            &args,
            has_hits.then_some(hits.as_slice()),
            &mut out,
        );
        self.hits = hits;
        let converted = match result {
            Ok(true) if out.flat().is_empty() => Ok(Some(self.empty.clone_ref(py))),
            Ok(true) => PyKVCacheBlocks::from_new_blocks(&out)
                .and_then(|b| Py::new(py, b))
                .map(Some),
            Ok(false) => Ok(None),
            Err(e) => Err(CoreError(e).into()),
        };
        self.out = out;
        converted
    }

    fn cache_blocks(
        &mut self,
        request: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let request = args::request(request)?;
        let n = args::count(num_tokens, "num_tokens")?;
        core(self.inner.cache_request(&request.inner, n))
    }

    /// A new scheduler step begins (Mamba "align" states cached during the
    /// previous step become usable as hits).
    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
    }

    /// Start tracking residency metrics of the pool's blocks.
    fn enable_residency(&mut self) {
        self.inner.pool_mut().enable_residency();
    }

    fn set_residency_clock(&mut self, now: &Bound<'_, PyAny>) -> PyResult<()> {
        let now = crate::args::count(now, "now")? as u64;
        crate::residency::set_clock(self.inner.pool_mut(), now);
        Ok(())
    }

    fn residency_snapshot<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        crate::residency::snapshot(py, self.inner.pool())
    }

    fn drain_eviction_records(&mut self) -> Vec<crate::residency::RecordTuple> {
        crate::residency::drain(self.inner.pool_mut())
    }

    /// Free a request's blocks; unknown ids are ignored (as in vLLM).
    fn free(&mut self, request_id: &str) -> PyResult<bool> {
        core(self.inner.free_request(request_id))
    }

    /// The request's block tables per group (0 marks null positions).
    fn blocks(&self, request_id: &str) -> PyResult<PyKVCacheBlocks> {
        let tables = core(self.inner.request_block_ids(request_id))?;
        PyKVCacheBlocks::from_groups(tables.into_iter())
    }

    fn num_common_prefix_blocks(&self, request_id: &str) -> PyResult<Vec<usize>> {
        core(self.inner.request_common_prefix_blocks(request_id))
    }

    /// Drop these blocks from the prefix cache (they stay allocated).
    fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        core(self.inner.pool_mut().evict_blocks(&ids))
    }

    /// Forget every cached prefix; refused (False, with a warning) while
    /// blocks are in use.
    fn reset_prefix_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
        pool::reset_prefix_cache(py, self.inner.pool_mut())
    }

    /// Switch the pool's eviction policy (a spec string such as `"lfu"`);
    /// refused while any block is in use.
    fn set_eviction_policy(&mut self, spec: &str) -> PyResult<()> {
        let eviction: EvictionConfig = core(spec.parse())?;
        core(self.inner.pool_mut().set_eviction(eviction))
    }

    /// Mark blocks with a retention priority (the `priority` eviction
    /// policy; ignored by the others).
    fn set_priority(
        &mut self,
        block_ids: &Bound<'_, PyAny>,
        priority: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        // Out-of-range priorities are the core's error (it names the range).
        let priority = i64::try_from(args::count(priority, "priority")?).unwrap_or(i64::MAX);
        let ids = convert::block_ids(block_ids)?;
        core(self.inner.pool_mut().set_priority(&ids, priority))
    }

    /// Advance the pool's eviction clock (retention durations count its ticks).
    fn advance_clock(&mut self, ticks: &Bound<'_, PyAny>) -> PyResult<()> {
        let ticks = i64::try_from(args::count(ticks, "ticks")?).unwrap_or(i64::MAX);
        core(self.inner.pool_mut().advance_clock(ticks))
    }

    /// Drain the pool's KV-cache events.
    fn take_events(&mut self, py: Python<'_>) -> PyResult<PyEventList> {
        pool::take_events(py, self.inner.pool_mut())
    }

    fn check_invariants(&self) -> PyResult<()> {
        crate::errors::invariants(self.inner.check_invariants())
    }
}

/// `new_computed_blocks`: a `KVCacheBlocks` (ids read directly), or a plain
/// sequence of per-group id sequences/arrays.
fn fill_hits(obj: &Bound<'_, PyAny>, hits: &mut Vec<Vec<BlockId>>) -> PyResult<()> {
    if let Ok(b) = obj.cast::<PyKVCacheBlocks>() {
        b.get().fill_hits(hits);
        return Ok(());
    }
    let seq = obj
        .cast::<PyTuple>()
        .map(|t| t.as_sequence().clone())
        .or_else(|_| obj.cast::<PyList>().map(|l| l.as_sequence().clone()))
        .map_err(|_| {
            CoreError(KvError::InvalidArgument {
                name: "new_computed_blocks",
                detail: "expected a KVCacheBlocks or one list of block ids per group".into(),
            })
        })?;
    let n = seq.len()?;
    hits.resize_with(n, Vec::new);
    hits.truncate(n);
    for (g, item) in seq.try_iter()?.enumerate() {
        hits[g].clear();
        convert::extract_block_ids(&item?, &mut hits[g])?;
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
    pub(crate) owner: Py<PyCoordinatorCore>,
}

impl PyBlockPoolView {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        Ok(f(self.owner.bind(py).try_borrow()?.inner.pool()))
    }
}

#[pymethods]
impl PyBlockPoolView {
    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, BlockPool::num_blocks)
    }

    #[getter]
    fn num_free_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, BlockPool::num_free_blocks)
    }

    #[getter]
    fn usage(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, BlockPool::usage)
    }

    #[getter]
    fn num_cached_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, BlockPool::num_cached_keys)
    }

    /// The eviction policy's spec string (e.g. `"lru"`).
    #[getter]
    fn eviction_policy(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, BlockPool::eviction_policy)
    }

    #[getter]
    fn num_evictions(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, BlockPool::num_evictions)
    }

    #[getter]
    fn enable_caching(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, BlockPool::caching_enabled)
    }

    #[getter]
    fn hash_block_size(&self, py: Python<'_>) -> PyResult<u32> {
        self.with(py, |p| p.config().hash_block_size)
    }

    #[getter]
    fn enable_events(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, BlockPool::events_enabled)
    }

    #[getter]
    fn metadata_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, BlockPool::metadata_bytes)
    }

    fn get_cached_block<'py>(
        &self,
        py: Python<'py>,
        block_hash: &Bound<'_, PyAny>,
        group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        self.with(py, |p| pool::get_cached_block(py, p, block_hash, group_ids))?
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        self.with(py, |p| pool::free_block_ids(py, p))
    }

    fn ref_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        self.with(py, |p| pool::ref_counts(py, p))
    }

    fn cached_mask<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<bool>>> {
        self.with(py, |p| pool::cached_mask(py, p))
    }

    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        self.with(py, |p| pool::block_hash(py, p, block_id))?
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::invariants(self.with(py, BlockPool::check_invariants)?)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |p| pool::repr(p, "BlockPoolView"))
    }
}
