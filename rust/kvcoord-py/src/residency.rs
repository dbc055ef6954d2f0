//! Residency metrics as Python sees them (`BlockPool` and the manager's
//! `CoordinatorCore` share these conversions). Conversion only.

use kvcoord_core::{BlockPool, Histogram};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One eviction record: `(block_id, lifetime, idle, reuse_gaps, hits)`.
pub(crate) type RecordTuple = (u32, u64, u64, Vec<u64>, u32);

/// The histograms as a dict of name -> (buckets, count, sum, max); `None`
/// when metrics are off.
pub(crate) fn snapshot<'py>(
    py: Python<'py>,
    pool: &BlockPool,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(snap) = pool.residency().map(kvcoord_core::Residency::snapshot) else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    let hist = |h: &Histogram| (h.buckets.to_vec(), h.count, h.sum, h.max);
    d.set_item("lifetime", hist(&snap.lifetime))?;
    d.set_item("idle_before_eviction", hist(&snap.idle_before_eviction))?;
    d.set_item("reuse_gap", hist(&snap.reuse_gap))?;
    d.set_item("hits_per_block", hist(&snap.hits_per_block))?;
    Ok(Some(d))
}

/// Take the eviction records gathered since the last drain.
pub(crate) fn drain(pool: &mut BlockPool) -> Vec<RecordTuple> {
    let records = pool.drain_eviction_records().into_iter();
    records
        .map(|r| (r.block.0, r.lifetime, r.idle, r.reuse_gaps, r.hits))
        .collect()
}
