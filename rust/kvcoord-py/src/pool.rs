//! `kvcoord.BlockPool` and the read-only methods it shares with a manager's
//! `BlockPoolView`: conversion and delegation only; the logic is
//! `kvcoord_core::BlockPool`.

use kvcoord_core::{BlockId, BlockPool, EvictionConfig, GroupId, KvEvent, PoolConfig};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::args;
use crate::convert::{self, id_list, Scratch};
use crate::errors::core;
use crate::events::{event_to_py, PyEventList};

/// The read-only surface of a pool, written once for both pool types:
/// `$ty` has `fn with<R>(&self, py, f: impl FnOnce(&BlockPool) -> R) ->
/// PyResult<R>`; `$extra` are the type's own methods (one `#[pymethods]`
/// block per class).
macro_rules! pool_readers {
    ($ty:ty, $name:literal, { $($extra:tt)* }) => {
        pymethods!($ty {
            get num_blocks(&self, py: Python<'_>) -> PyResult<usize> =
                self.with(py, BlockPool::num_blocks);
            get num_free_blocks(&self, py: Python<'_>) -> PyResult<usize> =
                self.with(py, BlockPool::num_free_blocks);
            get usage(&self, py: Python<'_>) -> PyResult<f64> = self.with(py, BlockPool::usage);
            get num_cached_blocks(&self, py: Python<'_>) -> PyResult<usize> =
                self.with(py, BlockPool::num_cached_keys);
            get num_evictions(&self, py: Python<'_>) -> PyResult<u64> =
                self.with(py, BlockPool::num_evictions);
            get enable_caching(&self, py: Python<'_>) -> PyResult<bool> =
                self.with(py, BlockPool::caching_enabled);
            get hash_block_size(&self, py: Python<'_>) -> PyResult<u32> =
                self.with(py, |p| p.config().hash_block_size);
            get enable_events(&self, py: Python<'_>) -> PyResult<bool> =
                self.with(py, BlockPool::events_enabled);
            get eviction_policy(&self, py: Python<'_>) -> PyResult<String> =
                self.with(py, BlockPool::eviction_policy);
            get metadata_bytes(&self, py: Python<'_>) -> PyResult<usize> =
                self.with(py, BlockPool::metadata_bytes);
        }
            fn get_cached_block<'py>(
                &self,
                py: Python<'py>,
                block_hash: &Bound<'_, PyAny>,
                group_ids: &Bound<'_, PyAny>,
            ) -> PyResult<Option<Bound<'py, pyo3::types::PyList>>> {
                let hash = $crate::convert::block_hash(block_hash)?;
                let groups = $crate::convert::group_ids(group_ids)?;
                let mut out = Vec::with_capacity(groups.len());
                if self.with(py, |p| p.get_cached_block(&hash, &groups, &mut out))? {
                    Ok(Some($crate::convert::id_list(py, &out)?))
                } else {
                    Ok(None)
                }
            }

            fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
                let ids = self.with(py, |p| p.free_block_ids().map(|b| b.0).collect())?;
                Ok(numpy::PyArray1::from_vec(py, ids))
            }

            /// `(prev, next)`: the free-queue entries either side of a free
            /// block (-1 at an end of the queue); `None` if it is not free.
            fn free_neighbours(
                &self,
                py: Python<'_>,
                block_id: &Bound<'_, PyAny>,
            ) -> PyResult<Option<(i64, i64)>> {
                let b = $crate::convert::block_id_of(block_id)?;
                let found = $crate::errors::core(self.with(py, |p| p.free_neighbours(b))?)?;
                let end = |e: Option<BlockId>| e.map_or(-1, |b| i64::from(b.0));
                Ok(found.map(|(prev, next)| (end(prev), end(next))))
            }

            fn ref_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
                Ok(numpy::PyArray1::from_vec(py, self.with(py, |p| p.ref_counts().collect())?))
            }

            fn cached_mask<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<bool>>> {
                Ok(numpy::PyArray1::from_vec(py, self.with(py, |p| p.cached_mask().collect())?))
            }

            fn block_hash<'py>(
                &self,
                py: Python<'py>,
                block_id: &Bound<'_, PyAny>,
            ) -> PyResult<Option<(Bound<'py, pyo3::types::PyBytes>, u32)>> {
                let b = $crate::convert::block_id_of(block_id)?;
                let key = $crate::errors::core(self.with(py, |p| p.cache_key(b))?)?;
                Ok(key.map(|k| ($crate::convert::digest(py, &k.hash), k.group.0)))
            }

            fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
                crate::errors::invariants(self.with(py, BlockPool::check_invariants)?)
            }

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                self.with(py, |p| {
                    format!(
                        "{}(num_blocks={}, free={}, cached_keys={}, enable_caching={})",
                        $name,
                        p.num_blocks(),
                        p.num_free_blocks(),
                        p.num_cached_keys(),
                        if p.caching_enabled() { "True" } else { "False" }
                    )
                })
            }

            $($extra)*
        );
    };
}
pub(crate) use pool_readers;

/// The pool methods that change it, written once for both owners of a pool
/// (a standalone `BlockPool` and a `CoordinatorCore`). `$ty` has
/// `fn pool(&self) -> &BlockPool`, `fn pool_mut(&mut self) -> &mut
/// BlockPool` and `fn with_ids(&mut self, block_ids, f) -> PyResult<R>`;
/// the methods are handed to `$cb!($args { ... $extra })`, which emits the
/// type's one `#[pymethods]` block.
macro_rules! pool_writers {
    ($cb:ident!($($args:tt)*) { $($extra:tt)* }) => {
        $cb!($($args)* {
            /// Mark blocks with a retention priority (the `priority`
            /// eviction policy; ignored by the others).
            fn set_priority(
                &mut self,
                block_ids: &Bound<'_, PyAny>,
                priority: &Bound<'_, PyAny>,
            ) -> PyResult<()> {
                let priority = $crate::args::priority(priority)?;
                self.with_ids(block_ids, |pool, ids| pool.set_priority(ids, priority))
            }

            /// Advance the pool's eviction clock (retention durations count
            /// its ticks).
            fn advance_clock(&mut self, ticks: &Bound<'_, PyAny>) -> PyResult<()> {
                let ticks = $crate::args::count(ticks, "ticks")?;
                let ticks = i64::try_from(ticks).unwrap_or(i64::MAX);
                $crate::errors::core(self.pool_mut().advance_clock(ticks))
            }

            /// Drop these blocks from the prefix cache (they stay allocated).
            fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
                self.with_ids(block_ids, BlockPool::evict_blocks)
            }

            /// Start tracking residency metrics for every block; `records`
            /// False keeps the histograms but no per-eviction records.
            #[pyo3(signature = (records = None), text_signature = "($self, records=True)")]
            fn enable_residency(&mut self, records: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
                let keep = $crate::args::opt_flag(records, "records", true)?;
                self.pool_mut().enable_residency_with(keep);
                Ok(())
            }

            fn set_residency_clock(&mut self, now: &Bound<'_, PyAny>) -> PyResult<()> {
                let now = $crate::args::count(now, "now")? as u64;
                self.pool_mut().set_residency_clock(now);
                Ok(())
            }

            fn residency_snapshot<'py>(
                &self,
                py: Python<'py>,
            ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
                $crate::residency::snapshot(py, self.pool())
            }

            fn drain_eviction_records(&mut self) -> Vec<$crate::residency::RecordTuple> {
                $crate::residency::drain(self.pool_mut())
            }

            /// Forget every cached prefix; refused (False, with a warning)
            /// while blocks are in use.
            fn reset_prefix_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
                $crate::pool::reset_prefix_cache(py, self.pool_mut())
            }

            /// Drain the pool's KV-cache events.
            fn take_events(&mut self, py: Python<'_>) -> PyResult<$crate::events::PyEventList> {
                $crate::pool::take_events(py, self.pool_mut())
            }

            $($extra)*
        });
    };
}
pub(crate) use pool_writers;

/// Forget every cached prefix; logs a warning (as vLLM does) when refused.
pub(crate) fn reset_prefix_cache(py: Python<'_>, pool: &mut BlockPool) -> PyResult<bool> {
    let ok = pool.reset_prefix_cache();
    if !ok {
        let in_use = pool.num_used_blocks();
        let logger = py
            .import("logging")?
            .call_method1("getLogger", ("kvcoord",))?;
        let msg = format!("Failed to reset the prefix cache: {in_use} blocks are still in use");
        logger.call_method1("warning", (msg,))?;
    }
    Ok(ok)
}

/// Drain the pool's KV-cache events as Python objects.
pub(crate) fn take_events(py: Python<'_>, pool: &mut BlockPool) -> PyResult<PyEventList> {
    pool.take_events()
        .into_iter()
        .map(|e: KvEvent| event_to_py(py, e))
        .collect()
}

/// A standalone KV-cache block pool (see `_core.pyi` for the documented
/// surface). A manager's pool is the read-only
/// [`PyBlockPoolView`](crate::coordinator::PyBlockPoolView) instead.
#[pyclass(module = "kvcoord._core", name = "BlockPool")]
pub(crate) struct PyBlockPool {
    inner: BlockPool,
    /// Reused buffers (keep `get_new_blocks`/`free_blocks` allocation-free).
    scratch: Scratch,
}

impl PyBlockPool {
    #[allow(clippy::unnecessary_wraps)] // the shape `pool_readers` expects
    fn with<R>(&self, _py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        Ok(f(&self.inner))
    }

    fn pool(&self) -> &BlockPool {
        &self.inner
    }

    fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.inner
    }

    /// `f(pool, ids)` with `block_ids` converted into the reused buffer.
    fn with_ids<R>(
        &mut self,
        block_ids: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut BlockPool, &[BlockId]) -> Result<R, kvcoord_core::KvError>,
    ) -> PyResult<R> {
        let ids = &mut self.scratch.ids;
        ids.clear();
        convert::extend_ids(block_ids, ids, 0)?;
        core(f(&mut self.inner, ids))
    }

    /// `num_blocks` new blocks, into the reused buffer.
    fn new_blocks(&mut self, num_blocks: &Bound<'_, PyAny>) -> PyResult<&mut Scratch> {
        let n = args::count(num_blocks, "num_blocks")?;
        self.scratch.ids.clear();
        core(self.inner.get_new_blocks(n, &mut self.scratch.ids))?;
        Ok(&mut self.scratch)
    }
}

pool_writers!(pool_readers!(PyBlockPool, "BlockPool",) {
    #[new]
    /// Scalars are converted by `args` (`None` stands for the default).
    #[pyo3(
        signature = (
            num_blocks, *, enable_caching = None, hash_block_size = None, enable_events = None,
            eviction_policy = args::Text::from_static("lru")
        ),
        text_signature = "(num_blocks, *, enable_caching=None, hash_block_size=None, \
                          enable_events=None, eviction_policy='lru')"
    )]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        enable_caching: Option<&Bound<'_, PyAny>>,
        hash_block_size: Option<&Bound<'_, PyAny>>,
        enable_events: Option<&Bound<'_, PyAny>>,
        eviction_policy: args::Text,
    ) -> PyResult<Self> {
        let eviction: EvictionConfig = core(eviction_policy.as_str().parse())?;
        let num_blocks = args::config_count(num_blocks, "num_blocks")?;
        let mut config = PoolConfig::new(num_blocks);
        config.enable_caching = args::opt_flag(enable_caching, "enable_caching", config.enable_caching)?;
        if let Some(h) = hash_block_size {
            config.hash_block_size = args::config_u32(h, "hash_block_size")?;
        }
        config.enable_events = args::opt_flag(enable_events, "enable_events", config.enable_events)?;
        let pool = convert::build_pool_sized(py, num_blocks, || {
            BlockPool::with_eviction(config, eviction)
        });
        Ok(Self {
            inner: core(pool)?,
            scratch: Scratch::default(),
        })
    }

    fn get_new_blocks<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        id_list(py, &self.new_blocks(num_blocks)?.ids)
    }

    fn get_new_blocks_array<'py>(
        &mut self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        Ok(self.new_blocks(num_blocks)?.ids_array(py))
    }

    fn free_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_ids(block_ids, BlockPool::free_blocks)
    }

    fn touch(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_ids(block_ids, BlockPool::touch)
    }

    fn unpin_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_ids(block_ids, BlockPool::unpin_blocks)
    }

    fn take_reused_watched<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        let ids: Vec<u32> = self
            .inner
            .take_reused_watched()
            .iter()
            .map(|b| b.0)
            .collect();
        PyArray1::from_vec(py, ids)
    }

    #[getter]
    fn num_watched(&self) -> usize {
        self.inner.num_watched()
    }

    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, group_id, block_mask = None))]
    fn cache_full_blocks(
        &mut self,
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
        let group = GroupId(args::u32_arg(group_id, "group id")?);
        core(self.inner.cache_full_blocks(
            &ids,
            &hashes,
            num_cached,
            num_full,
            group,
            block_mask.as_deref(),
        ))
    }

    #[getter]
    fn residency_enabled(&self) -> bool {
        self.inner.residency().is_some()
    }
});
