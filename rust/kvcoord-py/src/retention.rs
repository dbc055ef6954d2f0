//! `validate_retention_interval`, exposed for the Python config layer.

use pyo3::prelude::*;

use crate::errors::core;

/// Check a prefix-cache retention interval; raises `ConfigError` (a
/// `ValueError`) naming the value and the rule it breaks.
#[pyfunction]
#[pyo3(signature = (interval, scheduler_block_size, has_sparse_groups))]
pub(crate) fn validate_retention_interval(
    interval: Option<i64>,
    scheduler_block_size: u32,
    has_sparse_groups: bool,
) -> PyResult<()> {
    core(kvcoord_core::validate_retention_interval(
        interval,
        scheduler_block_size,
        has_sparse_groups,
    ))
}
