//! KV-cache events as small frozen Python objects: one per event, never one
//! per block. A `BlockStored` keeps the core's record and hands out its
//! per-block data as numpy arrays on demand (vLLM's field names; hashes in
//! vLLM's default external form, the digest's last 8 bytes as a big-endian
//! unsigned integer).

use kvcoord_core::events::{EventExtraKey, StoredBlocks};
use kvcoord_core::{BlockHash, KvEvent};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// A `cache_full_blocks` call registered blocks in the prefix cache.
#[pyclass(module = "kvcoord._core", frozen)]
pub(crate) struct BlockStored {
    inner: Box<StoredBlocks>,
}

#[pymethods]
impl BlockStored {
    /// Hashes of the stored blocks, vLLM's integer form (uint64).
    #[getter]
    fn block_hashes<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        let v: Vec<u64> = self
            .inner
            .block_hashes
            .iter()
            .map(BlockHash::external)
            .collect();
        v.into_pyarray(py)
    }

    /// The full digests of the stored blocks (vLLM's bytes form).
    #[getter]
    fn block_hash_digests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.inner
                .block_hashes
                .iter()
                .map(|h| PyBytes::new(py, h.as_bytes())),
        )
    }

    /// Ids of the stored blocks, aligned with `block_hashes` (uint32).
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        let v: Vec<u32> = self.inner.block_ids.iter().map(|b| b.0).collect();
        v.into_pyarray(py)
    }

    /// Integer hash of the block before the range; None when it starts at 0.
    #[getter]
    fn parent_block_hash(&self) -> Option<u64> {
        self.inner
            .parent_block_hash
            .as_ref()
            .map(BlockHash::external)
    }

    /// Full digest of the block before the range; None when it starts at 0.
    #[getter]
    fn parent_block_digest<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner
            .parent_block_hash
            .as_ref()
            .map(|h| PyBytes::new(py, h.as_bytes()))
    }

    /// The request's tokens of the whole range (skipped blocks included),
    /// uint32; empty when the pool was driven without a request.
    #[getter]
    fn token_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.inner.token_ids.clone().into_pyarray(py)
    }

    /// Tokens per block of the group.
    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.block_size
    }

    /// Position (in blocks) of the range's first block.
    #[getter]
    fn first_block(&self) -> usize {
        self.inner.first_block
    }

    /// Number of blocks in the range, skipped (null or masked) ones included:
    /// the range covers tokens `first_block * block_size` to
    /// `(first_block + num_blocks) * block_size`.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks
    }

    /// Positions (in blocks) of the stored blocks, aligned with `block_ids`
    /// (uint32; the range's positions less the skipped ones).
    #[getter]
    fn positions<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        let v: Vec<u32> = self
            .inner
            .positions()
            .map(|p| u32::try_from(p).unwrap_or(u32::MAX))
            .collect();
        v.into_pyarray(py)
    }

    /// The KV-cache group (vLLM's `group_idx`).
    #[getter]
    fn group_idx(&self) -> u32 {
        self.inner.group.0
    }

    /// `"GPU"`, `"CPU"` or `"STORAGE"`.
    #[getter]
    fn medium(&self) -> &'static str {
        self.inner.medium.as_str()
    }

    /// The request's `LoRA` adapter name, if any.
    #[getter]
    fn lora_name(&self) -> Option<&str> {
        self.inner.lora_name.as_deref()
    }

    /// The group's spec kind in vLLM's spelling (`"full_attention"`...).
    #[getter]
    fn kv_cache_spec_kind(&self) -> Option<&'static str> {
        self.inner.spec_kind
    }

    /// The group's sliding window, when it has one.
    #[getter]
    fn kv_cache_spec_sliding_window(&self) -> Option<u32> {
        self.inner.sliding_window
    }

    /// Per stored block, its untagged extra keys as vLLM publishes them (a
    /// tuple of `LoRA` name, `(mm_identifier, offset)` pairs and cache
    /// salt, or None); None when no block was stored.
    #[getter]
    fn extra_keys<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let n = self.inner.block_hashes.len();
        if n == 0 {
            return Ok(None);
        }
        if self.inner.extra_keys.is_empty() {
            return PyList::new(py, (0..n).map(|_| py.None())).map(Some);
        }
        let mut items: Vec<Py<PyAny>> = Vec::with_capacity(n);
        for keys in &self.inner.extra_keys {
            items.push(match keys {
                None => py.None(),
                Some(keys) => {
                    let mut parts: Vec<Py<PyAny>> = Vec::with_capacity(keys.len());
                    for k in keys {
                        parts.push(match k {
                            EventExtraKey::Text(s) => s.into_pyobject(py)?.into_any().unbind(),
                            EventExtraKey::Mm(id, off) => {
                                (id.as_str(), *off).into_pyobject(py)?.into_any().unbind()
                            }
                        });
                    }
                    PyTuple::new(py, parts)?.into_any().unbind()
                }
            });
        }
        PyList::new(py, items).map(Some)
    }

    fn __len__(&self) -> usize {
        self.inner.block_hashes.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockStored(num_blocks={}, first_block={}, block_size={}, group_idx={}, \
             num_tokens={}, has_parent={})",
            self.inner.block_hashes.len(),
            self.inner.first_block,
            self.inner.block_size,
            self.inner.group.0,
            self.inner.token_ids.len(),
            if self.inner.parent_block_hash.is_some() {
                "True"
            } else {
                "False"
            }
        )
    }
}

/// A block lost its cache key (it was evicted or reused).
#[pyclass(module = "kvcoord._core", frozen)]
pub(crate) struct BlockRemoved {
    hash: BlockHash,
    group: u32,
    medium: &'static str,
}

#[pymethods]
impl BlockRemoved {
    /// The removed key's hash, vLLM's integer form.
    #[getter]
    fn block_hash(&self) -> u64 {
        self.hash.external()
    }

    /// vLLM's list form: `[block_hash]`.
    #[getter]
    fn block_hashes(&self) -> Vec<u64> {
        vec![self.hash.external()]
    }

    /// The removed key's full digest.
    #[getter]
    fn block_hash_digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.hash.as_bytes())
    }

    /// The removed key's group (vLLM's `group_idx`).
    #[getter]
    fn group_idx(&self) -> u32 {
        self.group
    }

    /// `"GPU"`, `"CPU"` or `"STORAGE"`.
    #[getter]
    fn medium(&self) -> &'static str {
        self.medium
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockRemoved(block_hash={:#018x}, group_idx={})",
            self.hash.external(),
            self.group
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

pub(crate) type PyEventList = Vec<Py<PyAny>>;

pub(crate) fn event_to_py(py: Python<'_>, e: KvEvent) -> PyResult<Py<PyAny>> {
    Ok(match e {
        KvEvent::BlockStored(inner) => Py::new(py, BlockStored { inner })?.into_any(),
        KvEvent::BlockRemoved {
            block_hash,
            group,
            medium,
        } => Py::new(
            py,
            BlockRemoved {
                hash: block_hash,
                group: group.0,
                medium: medium.as_str(),
            },
        )?
        .into_any(),
        KvEvent::AllBlocksCleared => Py::new(py, AllBlocksCleared)?.into_any(),
    })
}
