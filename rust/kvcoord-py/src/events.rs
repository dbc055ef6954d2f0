//! KV-cache events as small frozen Python objects (one per event, not per
//! block: a `BlockStored` carries all of a call's hashes).

use kvcoord_core::KvEvent;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A `cache_full_blocks` call registered blocks in the prefix cache.
#[pyclass(module = "kvcoord._core", frozen, get_all)]
pub(crate) struct BlockStored {
    block_hashes: Vec<Py<PyBytes>>,
    block_ids: Vec<u32>,
    parent_block_hash: Option<Py<PyBytes>>,
    group_id: u32,
}

#[pymethods]
impl BlockStored {
    fn __repr__(&self) -> String {
        format!(
            "BlockStored(num_hashes={}, group_id={}, has_parent={})",
            self.block_hashes.len(),
            self.group_id,
            self.parent_block_hash.is_some()
        )
    }
}

/// A cache key left the prefix cache (its last block was evicted or reused).
#[pyclass(module = "kvcoord._core", frozen, get_all)]
pub(crate) struct BlockRemoved {
    block_hash: Py<PyBytes>,
    group_id: u32,
}

#[pymethods]
impl BlockRemoved {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "BlockRemoved(block_hash={}, group_id={})",
            hex(self.block_hash.as_bytes(py)),
            self.group_id
        )
    }
}

/// `reset_prefix_cache` dropped every key.
#[pyclass(module = "kvcoord._core", frozen)]
pub(crate) struct AllBlocksCleared;

#[pymethods]
impl AllBlocksCleared {
    fn __repr__(&self) -> &'static str {
        "AllBlocksCleared()"
    }
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

pub(crate) type PyEventList = Vec<Py<PyAny>>;

pub(crate) fn event_to_py(py: Python<'_>, e: &KvEvent) -> PyResult<Py<PyAny>> {
    let bytes = |h: &kvcoord_core::BlockHash| PyBytes::new(py, h.as_bytes()).unbind();
    Ok(match e {
        KvEvent::BlockStored {
            block_hashes,
            block_ids,
            parent_block_hash,
            group,
        } => Py::new(
            py,
            BlockStored {
                block_hashes: block_hashes.iter().map(bytes).collect(),
                block_ids: block_ids.iter().map(|b| b.0).collect(),
                parent_block_hash: parent_block_hash.as_ref().map(bytes),
                group_id: group.0,
            },
        )?
        .into_any(),
        KvEvent::BlockRemoved { block_hash, group } => Py::new(
            py,
            BlockRemoved {
                block_hash: bytes(block_hash),
                group_id: group.0,
            },
        )?
        .into_any(),
        KvEvent::AllBlocksCleared => Py::new(py, AllBlocksCleared)?.into_any(),
    })
}
