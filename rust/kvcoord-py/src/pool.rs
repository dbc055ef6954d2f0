//! `kvcoord.BlockPool`: conversion and delegation only; the logic is
//! `kvcoord_core::BlockPool`.

use kvcoord_core::{BlockId, BlockPool, KvEvent, PoolConfig};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::convert::{self, id_list};
use crate::errors::{core, InvariantError};
use crate::events::{event_to_py, PyEventList};

/// The KV-cache block pool (see `_core.pyi` for the documented surface).
#[pyclass(module = "kvcoord._core", name = "BlockPool")]
pub(crate) struct PyBlockPool {
    pub(crate) inner: BlockPool,
    /// Reused output buffer for `get_new_blocks`.
    scratch: Vec<BlockId>,
}

impl PyBlockPool {
    pub(crate) fn wrap(inner: BlockPool) -> Self {
        Self { inner, scratch: Vec::new() }
    }
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_blocks, *, enable_caching = true, hash_block_size = 16, enable_events = false))]
    fn new(num_blocks: i64, enable_caching: bool, hash_block_size: i64, enable_events: bool) -> PyResult<Self> {
        let num_blocks = convert::count(num_blocks, "num_blocks")?;
        let hash_block_size = u32::try_from(hash_block_size).map_err(|_| {
            crate::errors::ConfigError::new_err(format!(
                "invalid hash_block_size={hash_block_size}: must be positive"
            ))
        })?;
        let config = PoolConfig { num_blocks, enable_caching, hash_block_size, enable_events };
        Ok(Self::wrap(core(BlockPool::new(config))?))
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    #[getter]
    fn num_cached_blocks(&self) -> usize {
        self.inner.num_cached_keys()
    }

    #[getter]
    fn enable_caching(&self) -> bool {
        self.inner.caching_enabled()
    }

    #[getter]
    fn hash_block_size(&self) -> u32 {
        self.inner.config().hash_block_size
    }

    #[getter]
    fn enable_events(&self) -> bool {
        self.inner.events_enabled()
    }

    #[getter]
    fn metadata_bytes(&self) -> usize {
        self.inner.metadata_bytes()
    }

    fn get_new_blocks<'py>(&mut self, py: Python<'py>, num_blocks: i64) -> PyResult<Bound<'py, PyList>> {
        let n = convert::count(num_blocks, "num_blocks")?;
        self.scratch.clear();
        core(self.inner.get_new_blocks(n, &mut self.scratch))?;
        id_list(py, &self.scratch)
    }

    fn get_new_blocks_array<'py>(&mut self, py: Python<'py>, num_blocks: i64) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let n = convert::count(num_blocks, "num_blocks")?;
        let mut out = Vec::with_capacity(n);
        core(self.inner.get_new_blocks(n, &mut out))?;
        Ok(out.into_iter().map(|b| b.0).collect::<Vec<u32>>().into_pyarray(py))
    }

    fn free_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.scratch.clear();
        convert::extract_block_ids(block_ids, &mut self.scratch)?;
        let ids = std::mem::take(&mut self.scratch);
        let r = self.inner.free_blocks(&ids);
        self.scratch = ids;
        core(r)
    }

    fn touch(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        core(self.inner.touch(&ids))
    }

    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, group_id, block_mask = None))]
    fn cache_full_blocks(
        &mut self,
        block_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_cached_blocks: i64,
        num_full_blocks: i64,
        group_id: i64,
        block_mask: Option<Vec<bool>>,
    ) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        let hashes = convert::block_hashes(block_hashes)?;
        let num_cached = convert::count(num_cached_blocks, "num_cached_blocks")?;
        let num_full = convert::count(num_full_blocks, "num_full_blocks")?;
        let group = convert::group_id(group_id)?;
        core(self.inner.cache_full_blocks(&ids, &hashes, num_cached, num_full, group, block_mask.as_deref()))
    }

    fn get_cached_block<'py>(
        &self,
        py: Python<'py>,
        block_hash: &Bound<'_, PyAny>,
        group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let hash = convert::block_hash(block_hash)?;
        let groups = convert::group_ids(group_ids)?;
        let mut out = Vec::with_capacity(groups.len());
        if self.inner.get_cached_block(&hash, &groups, &mut out) {
            Ok(Some(id_list(py, &out)?))
        } else {
            Ok(None)
        }
    }

    fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::block_ids(block_ids)?;
        core(self.inner.evict_blocks(&ids))
    }

    fn reset_prefix_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
        if self.inner.reset_prefix_cache() {
            return Ok(true);
        }
        let logger = py.import("logging")?.call_method1("getLogger", ("kvcoord",))?;
        logger.call_method1(
            "warning",
            (format!(
                "Failed to reset the prefix cache: {} blocks are still in use",
                self.inner.num_used_blocks()
            ),),
        )?;
        Ok(false)
    }

    fn take_events(&mut self, py: Python<'_>) -> PyResult<PyEventList> {
        self.inner.take_events().iter().map(|e: &KvEvent| event_to_py(py, e)).collect()
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.inner.free_block_ids().map(|b| b.0).collect::<Vec<u32>>().into_pyarray(py)
    }

    fn ref_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.inner.ref_counts().collect::<Vec<u32>>().into_pyarray(py)
    }

    fn cached_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.inner.cached_mask().collect::<Vec<bool>>().into_pyarray(py)
    }

    fn block_hash<'py>(&self, py: Python<'py>, block_id: i64) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        let key = core(self.inner.cache_key(convert::block_id(block_id)?))?;
        Ok(key.map(|k| (PyBytes::new(py, k.hash.as_bytes()), k.group.0)))
    }

    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(InvariantError::new_err)
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockPool(num_blocks={}, free={}, cached_keys={}, enable_caching={})",
            self.inner.num_blocks(),
            self.inner.num_free_blocks(),
            self.inner.num_cached_keys(),
            if self.inner.caching_enabled() { "True" } else { "False" }
        )
    }
}
