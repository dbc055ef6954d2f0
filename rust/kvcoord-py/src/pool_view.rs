//! `kvcoord._core.BlockPoolView`: a manager's pool, read-only. Its blocks are
//! allocated, cached and freed through the manager (whose block tables
//! must match the reference counts), so this type has no mutating method.

use kvcoord_core::BlockPool;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::coordinator::PyCoordinatorCore;
use crate::errors::InvariantError;
use crate::pool;

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
        self.with(py, BlockPool::check_invariants)?
            .map_err(InvariantError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |p| pool::repr(p, "BlockPoolView"))
    }
}
