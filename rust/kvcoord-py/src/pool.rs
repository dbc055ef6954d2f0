//! `kvcoord.BlockPool`: conversion and delegation only; the logic is
//! `kvcoord_core::BlockPool`.

use kvcoord_core::{BlockPool, EvictionConfig, KvEvent, PoolConfig};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::args;
use crate::convert::{self, id_list, Scratch};
use crate::errors::core;
use crate::events::{event_to_py, PyEventList};
use crate::residency;

/// A standalone KV-cache block pool (see `_core.pyi` for the documented
/// surface). A manager's pool is exposed read-only by
/// [`PyBlockPoolView`](crate::coordinator::PyBlockPoolView) instead.
#[pyclass(module = "kvcoord._core", name = "BlockPool")]
pub(crate) struct PyBlockPool {
    inner: BlockPool,
    /// Reused buffers (keep `get_new_blocks`/`free_blocks` allocation-free).
    scratch: Scratch,
}

// Same shape as the view's fallible borrow, so the methods read alike.
#[allow(clippy::unnecessary_wraps)]
impl PyBlockPool {
    fn with<R>(&self, _py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        Ok(f(&self.inner))
    }

    fn with_mut<R>(
        &mut self,
        _py: Python<'_>,
        f: impl FnOnce(&mut BlockPool, &mut Scratch) -> R,
    ) -> PyResult<R> {
        Ok(f(&mut self.inner, &mut self.scratch))
    }
}

// ---- read-only operations shared with the manager's pool view ------------

pub(crate) fn get_cached_block<'py>(
    py: Python<'py>,
    pool: &BlockPool,
    block_hash: &Bound<'_, PyAny>,
    group_ids: &Bound<'_, PyAny>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let hash = convert::block_hash(block_hash)?;
    let groups = convert::group_ids(group_ids)?;
    let mut out = Vec::with_capacity(groups.len());
    if pool.get_cached_block(&hash, &groups, &mut out) {
        Ok(Some(id_list(py, &out)?))
    } else {
        Ok(None)
    }
}

pub(crate) fn free_block_ids<'py>(py: Python<'py>, p: &BlockPool) -> Bound<'py, PyArray1<u32>> {
    p.free_block_ids()
        .map(|b| b.0)
        .collect::<Vec<u32>>()
        .into_pyarray(py)
}

pub(crate) fn ref_counts<'py>(py: Python<'py>, p: &BlockPool) -> Bound<'py, PyArray1<u32>> {
    p.ref_counts().collect::<Vec<u32>>().into_pyarray(py)
}

pub(crate) fn cached_mask<'py>(py: Python<'py>, p: &BlockPool) -> Bound<'py, PyArray1<bool>> {
    p.cached_mask().collect::<Vec<bool>>().into_pyarray(py)
}

pub(crate) fn block_hash<'py>(
    py: Python<'py>,
    p: &BlockPool,
    block_id: &Bound<'_, PyAny>,
) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
    let b = convert::block_id_arg(block_id)?;
    let key = core(p.cache_key(b))?;
    Ok(key.map(|k| (PyBytes::new(py, k.hash.as_bytes()), k.group.0)))
}

pub(crate) fn repr(p: &BlockPool, name: &str) -> String {
    format!(
        "{name}(num_blocks={}, free={}, cached_keys={}, enable_caching={})",
        p.num_blocks(),
        p.num_free_blocks(),
        p.num_cached_keys(),
        if p.caching_enabled() { "True" } else { "False" }
    )
}

/// Forget every cached prefix; logs a warning (as vLLM does) when refused.
pub(crate) fn reset_prefix_cache(py: Python<'_>, pool: &mut BlockPool) -> PyResult<bool> {
    let ok = pool.reset_prefix_cache();
    if !ok {
        let in_use = pool.num_used_blocks();
        let logger = py
            .import("logging")?
            .call_method1("getLogger", ("kvcoord",))?;
        logger.call_method1(
            "warning",
            (format!(
                "Failed to reset the prefix cache: {in_use} blocks are still in use"
            ),),
        )?;
    }
    Ok(ok)
}

pub(crate) fn take_events(py: Python<'_>, pool: &mut BlockPool) -> PyResult<PyEventList> {
    pool.take_events()
        .into_iter()
        .map(|e: KvEvent| event_to_py(py, e))
        .collect()
}

#[pymethods]
impl PyBlockPool {
    #[new]
    /// Scalars are converted by `args` (`None` stands for the default).
    #[pyo3(signature = (num_blocks, *, enable_caching = None, hash_block_size = None, enable_events = None, eviction_policy = "lru"))]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        enable_caching: Option<&Bound<'_, PyAny>>,
        hash_block_size: Option<&Bound<'_, PyAny>>,
        enable_events: Option<&Bound<'_, PyAny>>,
        eviction_policy: &str,
    ) -> PyResult<Self> {
        let eviction: EvictionConfig = core(eviction_policy.parse())?;
        let num_blocks = args::config_count(num_blocks, "num_blocks")?;
        let hash_block_size = match hash_block_size {
            Some(h) => args::config_u32(h, "hash_block_size")?,
            None => 16,
        };
        let enable_caching = args::opt_flag(enable_caching, "enable_caching", true)?;
        let enable_events = args::opt_flag(enable_events, "enable_events", false)?;
        let config = PoolConfig {
            num_blocks,
            enable_caching,
            hash_block_size,
            enable_events,
        };
        let pool = convert::build_pool_sized(py, num_blocks, || {
            BlockPool::with_eviction(config, eviction)
        });
        Ok(Self {
            inner: core(pool)?,
            scratch: Scratch::default(),
        })
    }

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
    fn eviction_policy(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, BlockPool::eviction_policy)
    }

    fn set_priority(
        &mut self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        priority: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        // Out-of-range priorities are the core's error (it names the range).
        let priority = i64::try_from(args::count(priority, "priority")?).unwrap_or(i64::MAX);
        self.with_mut(py, |pool, scratch| {
            scratch.ids.clear();
            convert::extract_block_ids(block_ids, &mut scratch.ids)?;
            core(pool.set_priority(&scratch.ids, priority))
        })?
    }

    fn advance_clock(&mut self, py: Python<'_>, ticks: &Bound<'_, PyAny>) -> PyResult<()> {
        let ticks = i64::try_from(args::count(ticks, "ticks")?).unwrap_or(i64::MAX);
        self.with_mut(py, |pool, _| core(pool.advance_clock(ticks)))?
    }

    #[getter]
    fn metadata_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, BlockPool::metadata_bytes)
    }

    fn get_new_blocks<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n = args::count(num_blocks, "num_blocks")?;
        self.with_mut(py, |pool, scratch| {
            scratch.ids.clear();
            core(pool.get_new_blocks(n, &mut scratch.ids))?;
            id_list(py, &scratch.ids)
        })?
    }

    fn get_new_blocks_array<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let n = args::count(num_blocks, "num_blocks")?;
        self.with_mut(py, |pool, scratch| {
            scratch.ids.clear();
            core(pool.get_new_blocks(n, &mut scratch.ids))?;
            Ok(scratch.ids_array(py))
        })?
    }

    fn free_blocks(&mut self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_mut(py, |pool, scratch| {
            scratch.ids.clear();
            convert::extract_block_ids(block_ids, &mut scratch.ids)?;
            core(pool.free_blocks(&scratch.ids))
        })?
    }

    fn touch(&mut self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_mut(py, |pool, scratch| {
            scratch.ids.clear();
            convert::extract_block_ids(block_ids, &mut scratch.ids)?;
            core(pool.touch(&scratch.ids))
        })?
    }

    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, group_id, block_mask = None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_full_blocks(
        &mut self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_cached_blocks: &Bound<'_, PyAny>,
        num_full_blocks: &Bound<'_, PyAny>,
        group_id: &Bound<'_, PyAny>,
        block_mask: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let block_mask = block_mask
            .filter(|m| !m.is_none())
            .map(|m| args::flags(m, "block_mask"))
            .transpose()?;
        let ids = convert::block_ids(block_ids)?;
        let hashes = convert::block_hashes(block_hashes)?;
        let num_cached = args::count(num_cached_blocks, "num_cached_blocks")?;
        let num_full = args::count(num_full_blocks, "num_full_blocks")?;
        let group = kvcoord_core::GroupId(args::u32_arg(group_id, "group id")?);
        self.with_mut(py, |pool, _| {
            core(pool.cache_full_blocks(
                &ids,
                &hashes,
                num_cached,
                num_full,
                group,
                block_mask.as_deref(),
            ))
        })?
    }

    fn get_cached_block<'py>(
        &self,
        py: Python<'py>,
        block_hash: &Bound<'_, PyAny>,
        group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        get_cached_block(py, &self.inner, block_hash, group_ids)
    }

    fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        core(self.inner.evict_blocks(&ids))
    }

    /// Start tracking residency metrics for every block (see `_core.pyi`).
    fn enable_residency(&mut self) {
        self.inner.enable_residency();
    }

    #[getter]
    fn residency_enabled(&self) -> bool {
        self.inner.residency().is_some()
    }

    fn set_residency_clock(&mut self, now: &Bound<'_, PyAny>) -> PyResult<()> {
        residency::set_clock(&mut self.inner, args::count(now, "now")? as u64);
        Ok(())
    }

    fn residency_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        residency::snapshot(py, &self.inner)
    }

    fn drain_eviction_records(&mut self) -> Vec<residency::RecordTuple> {
        residency::drain(&mut self.inner)
    }

    fn reset_prefix_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
        reset_prefix_cache(py, &mut self.inner)
    }

    fn take_events(&mut self, py: Python<'_>) -> PyResult<PyEventList> {
        take_events(py, &mut self.inner)
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        free_block_ids(py, &self.inner)
    }

    fn ref_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        ref_counts(py, &self.inner)
    }

    fn cached_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        cached_mask(py, &self.inner)
    }

    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        block_hash(py, &self.inner, block_id)
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::invariants(self.with(py, BlockPool::check_invariants)?)
    }

    fn __repr__(&self) -> String {
        repr(&self.inner, "BlockPool")
    }
}
