//! KV-cache events as small frozen Python objects: one per event, never one
//! per block. A `BlockStored` keeps the core's record and hands out its
//! per-block data as numpy arrays on demand (vLLM's field names; hashes in
//! vLLM's default external form, the digest's last 8 bytes as a big-endian
//! unsigned integer). What each field holds is the core's
//! (`kvcoord_core::events`).

use kvcoord_core::events::{EventExtraKey, Medium, StoredBlocks};
use kvcoord_core::{BlockHash, GroupId, KvEvent};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::convert::{digest, digest_list};

/// A `cache_full_blocks` call registered blocks in the prefix cache.
#[pyclass(module = "kvcoord._core", frozen)]
pub(crate) struct BlockStored {
    pub(crate) inner: Box<StoredBlocks>,
}

/// Ids or positions (`len` of them) as a `uint32` array, reserved fallibly.
fn u32_array(
    py: Python<'_>,
    len: usize,
    v: impl Iterator<Item = u32>,
) -> PyResult<Bound<'_, PyArray1<u32>>> {
    let values = kvcoord_core::limits::try_collect(len, v, "an event's ids");
    Ok(crate::errors::core(values)?.into_pyarray(py))
}

/// One extra key as vLLM publishes it: a string, or `(identifier, offset)`.
fn extra_key(py: Python<'_>, k: &EventExtraKey) -> PyResult<Py<PyAny>> {
    Ok(match k {
        EventExtraKey::Text(s) => s.into_pyobject(py)?.into_any().unbind(),
        EventExtraKey::Mm(id, off) => (id.as_str(), *off).into_pyobject(py)?.into_any().unbind(),
    })
}

pymethods!(BlockStored {
    /// Hashes of the stored blocks, vLLM's integer form (uint64).
    get block_hashes['py](&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> =
        self.inner.external_hashes().collect::<Vec<_>>().into_pyarray(py);
    /// The full digests of the stored blocks (vLLM's bytes form).
    get block_hash_digests['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> =
        digest_list(py, &self.inner.block_hashes);
    /// Ids of the stored blocks, aligned with `block_hashes` (uint32).
    get block_ids['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> =
        u32_array(py, self.inner.block_ids.len(), self.inner.block_ids.iter().map(|b| b.0));
    /// Integer hash of the block before the range; None when it starts at 0.
    get parent_block_hash(&self) -> Option<u64> =
        self.inner.parent_block_hash.as_ref().map(BlockHash::external);
    /// Full digest of the block before the range; None when it starts at 0.
    get parent_block_digest['py](&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> =
        self.inner.parent_block_hash.as_ref().map(|h| digest(py, h));
    /// The request's tokens of the whole range (skipped blocks included),
    /// uint32; empty when the pool was driven without a request.
    get token_ids['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> =
        u32_array(py, self.inner.token_ids.len(), self.inner.token_ids.iter().copied());
    /// Tokens per block of the group.
    get block_size(&self) -> u32 = self.inner.block_size;
    /// Position (in blocks) of the range's first block.
    get first_block(&self) -> usize = self.inner.first_block;
    /// Number of blocks in the range, skipped (null or masked) ones included:
    /// the range covers tokens `first_block * block_size` to
    /// `(first_block + num_blocks) * block_size`.
    get num_blocks(&self) -> usize = self.inner.num_blocks;
    /// Positions (in blocks) of the stored blocks, aligned with `block_ids`
    /// (uint32; the range's positions less the skipped ones).
    get positions['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> = u32_array(
        py,
        self.inner.num_blocks,
        self.inner.positions().map(|p| u32::try_from(p).unwrap_or(u32::MAX)),
    );
    /// The KV-cache group (vLLM's `group_idx`).
    get group_idx(&self) -> u32 = self.inner.group.0;
    /// `"GPU"`, `"CPU"` or `"STORAGE"`.
    get medium(&self) -> &'static str = self.inner.medium.as_str();
    /// The request's `LoRA` adapter name, if any.
    get lora_name(&self) -> Option<&str> = self.inner.lora_name.as_deref();
    /// The group's spec kind in vLLM's spelling (`"full_attention"`...).
    get kv_cache_spec_kind(&self) -> Option<&'static str> = self.inner.spec_kind;
    /// The group's sliding window, when it has one.
    get kv_cache_spec_sliding_window(&self) -> Option<u32> = self.inner.sliding_window;
    /// Per stored block, its untagged extra keys as vLLM publishes them (a
    /// tuple of `LoRA` name, `(mm_identifier, offset)` pairs and cache
    /// salt, or None); None when no block was stored.
    get extra_keys['py](&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> = {
        let Some(per_block) = self.inner.extra_keys_per_block() else {
            return Ok(None);
        };
        let items = per_block.map(|keys| match keys {
            None => Ok(py.None()),
            Some(keys) => {
                let parts = keys.iter().map(|k| extra_key(py, k)).collect::<PyResult<Vec<_>>>()?;
                Ok(PyTuple::new(py, parts)?.into_any().unbind())
            }
        });
        PyList::new(py, items.collect::<PyResult<Vec<_>>>()?).map(Some)
    };
}
    fn __len__(&self) -> usize {
        self.inner.block_hashes.len()
    }

    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "BlockStored(num_blocks={}, first_block={}, block_size={}, group_idx={}, \
             num_tokens={}, has_parent={})",
            s.block_hashes.len(),
            s.first_block,
            s.block_size,
            s.group.0,
            s.token_ids.len(),
            if s.parent_block_hash.is_some() { "True" } else { "False" }
        )
    }
);

/// A block lost its cache key (it was evicted or reused).
#[pyclass(module = "kvcoord._core", frozen)]
pub(crate) struct BlockRemoved {
    pub(crate) block_hash: BlockHash,
    pub(crate) group: GroupId,
    medium: Medium,
}

pymethods!(BlockRemoved {
    /// The removed key's hash, vLLM's integer form.
    get block_hash(&self) -> u64 = self.block_hash.external();
    /// vLLM's list form: `[block_hash]`.
    get block_hashes(&self) -> Vec<u64> = vec![self.block_hash.external()];
    /// The removed key's full digest.
    get block_hash_digest['py](&self, py: Python<'py>) -> Bound<'py, PyBytes> =
        digest(py, &self.block_hash);
    /// The removed key's group (vLLM's `group_idx`).
    get group_idx(&self) -> u32 = self.group.0;
    /// `"GPU"`, `"CPU"` or `"STORAGE"`.
    get medium(&self) -> &'static str = self.medium.as_str();
}
    fn __repr__(&self) -> String {
        let (hash, group) = (self.block_hash.external(), self.group.0);
        format!("BlockRemoved(block_hash={hash:#018x}, group_idx={group})")
    }
);

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
                block_hash,
                group,
                medium,
            },
        )?
        .into_any(),
        KvEvent::AllBlocksCleared => Py::new(py, AllBlocksCleared)?.into_any(),
    })
}
