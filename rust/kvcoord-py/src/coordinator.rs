//! `kvcoord._core.CoordinatorCore`, the Rust mechanism under every Python
//! coordinator policy (per-group block tables, hit finders, the fused
//! `allocate_slots`, the request registry), and `BlockPoolView`, its pool
//! read-only. Conversion and delegation only: requests and their registry
//! are core state.

use kvcoord_core::coordinator::{AllocateArgs, CoordinatorConfig, CoordinatorCore, NewBlocks};
use kvcoord_core::{BlockId, BlockPool, CoordinatorKind, EvictionConfig, KvError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::args;
use crate::blocks::PyKVCacheBlocks;
use crate::convert;
use crate::errors::{core, CoreError};
use crate::events::PyEventList;
use crate::kinds::{self, PyCoordinatorKind, PyGroupSpec};
use crate::pool::{self, pool_readers};
use crate::request::PyRequest;
use crate::residency;

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
        num_blocks: &Bound<'_, PyAny>,
        groups: Vec<PyGroupSpec>,
        kind: PyCoordinatorKind,
        hash_block_size: Option<&Bound<'_, PyAny>>,
        max_model_len: &Bound<'_, PyAny>,
        retention_interval: Option<i64>,
        enable_events: bool,
    ) -> PyResult<Self> {
        let num_blocks = args::config_count(num_blocks, "num_blocks")?;
        let kind = CoordinatorKind::from(kind);
        let max_model_len = args::config_count(max_model_len, "max_model_len")?;
        let mut config = CoordinatorConfig::new(
            kinds::specs(&groups),
            num_blocks,
            kind.enable_caching(),
            max_model_len,
        );
        config.kind = kind;
        if let Some(h) = hash_block_size {
            config.hash_block_size = args::config_u32(h, "hash_block_size")?;
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

    /// Longest hit for groups sharing one spec: the blocks (one group per
    /// entry of `group_ids`) and the hit length in tokens.
    fn find_longest_cache_hit(
        &self,
        group_ids: &Bound<'_, PyAny>,
        request: PyRef<'_, PyRequest>,
        max_length: &Bound<'_, PyAny>,
        alignment: &Bound<'_, PyAny>,
    ) -> PyResult<(PyKVCacheBlocks, usize)> {
        let groups = convert::group_ids(group_ids)?;
        let max_length = args::count(max_length, "max_length")?;
        let alignment = args::count(alignment, "alignment")?;
        let (blocks, hit) = core(self.inner.find_longest_cache_hit(
            &groups,
            request.inner.block_hashes(),
            max_length,
            alignment,
        ))?;
        Ok((
            PyKVCacheBlocks::from_groups(blocks.iter().map(Vec::as_slice))?,
            hit,
        ))
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
        let Self {
            inner,
            out,
            hits,
            empty,
        } = self;
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
            return Ok(Some(empty.clone_ref(py)));
        }
        Ok(Some(Py::new(py, PyKVCacheBlocks::from_new_blocks(out)?)?))
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
    #[pyo3(signature = (records = None), text_signature = "($self, records=True)")]
    fn enable_residency(&mut self, records: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let keep = args::opt_flag(records, "records", true)?;
        self.inner.pool_mut().enable_residency_with(keep);
        Ok(())
    }

    fn set_residency_clock(&mut self, now: &Bound<'_, PyAny>) -> PyResult<()> {
        residency::set_clock(self.inner.pool_mut(), args::count(now, "now")? as u64);
        Ok(())
    }

    fn residency_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        residency::snapshot(py, self.inner.pool())
    }

    fn drain_eviction_records(&mut self) -> Vec<residency::RecordTuple> {
        residency::drain(self.inner.pool_mut())
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
        core(
            self.inner
                .pool_mut()
                .evict_blocks(&convert::block_ids(block_ids)?),
        )
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
        let priority = args::priority(priority)?;
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
    owner: Py<PyCoordinatorCore>,
}

impl PyBlockPoolView {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        Ok(f(self.owner.bind(py).try_borrow()?.inner.pool()))
    }
}

pool_readers!(PyBlockPoolView, "BlockPoolView", {});
