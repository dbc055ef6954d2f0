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
use crate::exclusive::{Entered, Exclusive};
use crate::numbers::{self, Blocks, Tokens, U32};

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
                let mut out = Vec::new();
                $crate::errors::core(kvcoord_core::limits::try_reserve(&mut out, groups.len(), "block ids"))?;
                if self.with(py, |p| p.get_cached_block(&hash, &groups, &mut out))? {
                    Ok(Some($crate::convert::id_list(py, &out)?))
                } else {
                    Ok(None)
                }
            }

            fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
                let ids = self.with(py, |p| {
                    let ids = p.free_block_ids().map(|b| b.0);
                    kvcoord_core::limits::try_collect(p.num_free_blocks(), ids, "free block ids")
                })?;
                Ok(numpy::PyArray1::from_vec(py, $crate::errors::core(ids)?))
            }

            /// `(prev, next)`: the free-queue entries either side of a free
            /// block (-1 at an end of the queue); `None` if it is not free.
            fn free_neighbours(
                &self,
                py: Python<'_>,
                block_id: &Bound<'_, PyAny>,
            ) -> PyResult<Option<(i64, i64)>> {
                let b = $crate::numbers::arg::<BlockId>(block_id, "block_id")?;
                let found = $crate::errors::core(self.with(py, |p| p.free_neighbours(b))?)?;
                let end = |e: Option<BlockId>| e.map_or(-1, |b| i64::from(b.0));
                Ok(found.map(|(prev, next)| (end(prev), end(next))))
            }

            fn ref_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
                let counts = self.with(py, |p| {
                    kvcoord_core::limits::try_collect(p.num_blocks(), p.ref_counts(), "reference counts")
                })?;
                Ok(numpy::PyArray1::from_vec(py, $crate::errors::core(counts)?))
            }

            fn cached_mask<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<bool>>> {
                let mask = self.with(py, |p| {
                    kvcoord_core::limits::try_collect(p.num_blocks(), p.cached_mask(), "the cached mask")
                })?;
                Ok(numpy::PyArray1::from_vec(py, $crate::errors::core(mask)?))
            }

            fn block_hash<'py>(
                &self,
                py: Python<'py>,
                block_id: &Bound<'_, PyAny>,
            ) -> PyResult<Option<(Bound<'py, pyo3::types::PyBytes>, u32)>> {
                let b = $crate::numbers::arg::<BlockId>(block_id, "block_id")?;
                let key = $crate::errors::core(
                    self.with(py, |p| p.cache_key(b).map(|k| k.map(|k| (k.hash, p.reported_group(k.group)))))?,
                )?;
                Ok(key.map(|(hash, group)| ($crate::convert::digest(py, &hash), group.0)))
            }

            /// Tokens behind the block's primary key when it is a partial
            /// (sub-block) key; None for a full-block key or no key.
            fn primary_key_tokens(&self, py: Python<'_>, block_id: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
                let b = $crate::numbers::arg::<BlockId>(block_id, "block_id")?;
                $crate::errors::core(self.with(py, |p| p.primary_key_tokens(b))?)
            }

            /// Tokens behind the block's primary key (vLLM's
            /// `block_hash_num_tokens`): the block's end for a full-block
            /// key, a partial key's own count; None without a key.
            fn key_num_tokens(&self, py: Python<'_>, block_id: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
                let b = $crate::numbers::arg::<BlockId>(block_id, "block_id")?;
                $crate::errors::core(self.with(py, |p| p.key_num_tokens(b))?)
            }

            /// Every `(hash, group_id)` key the block is cached under: the
            /// primary key first, then its secondary keys.
            fn cache_keys<'py>(
                &self,
                py: Python<'py>,
                block_id: &Bound<'_, PyAny>,
            ) -> PyResult<Vec<(Bound<'py, pyo3::types::PyBytes>, u32)>> {
                let b = $crate::numbers::arg::<BlockId>(block_id, "block_id")?;
                let keys = $crate::errors::core(self.with(py, |p| p.cache_keys(b))?)?;
                Ok(keys
                    .iter()
                    .map(|(k, _)| ($crate::convert::digest(py, &k.hash), k.group.0))
                    .collect())
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
/// `fn pool_ref(&self, py, f: FnOnce(&BlockPool) -> R) -> PyResult<R>`,
/// `fn pool_mut(&self, py, f: FnOnce(&mut BlockPool) -> R) -> PyResult<R>`
/// and `fn pool_ids(&self, py, block_ids, f) -> PyResult<R>`, each entering
/// the owner's state once;
/// the methods are handed to `$cb!($args { ... $extra })`, which emits the
/// type's one `#[pymethods]` block.
macro_rules! pool_writers {
    ($cb:ident!($($args:tt)*) { $($extra:tt)* }) => {
        $cb!($($args)* {
            /// Mark blocks with a retention priority (the `priority`
            /// eviction policy; ignored by the others).
            fn set_priority(
                &self,
                py: Python<'_>,
                block_ids: &Bound<'_, PyAny>,
                priority: &Bound<'_, PyAny>,
            ) -> PyResult<()> {
                // The core names the range (0 to 7).
                let priority = $crate::numbers::arg::<$crate::numbers::U32>(priority, "priority")?;
                let priority = i64::from(priority.0);
                self.pool_ids(py, block_ids, |pool, ids| pool.set_priority(ids, priority))
            }

            /// Advance the pool's eviction clock (retention durations count
            /// its ticks).
            fn advance_clock(&self, py: Python<'_>, ticks: &Bound<'_, PyAny>) -> PyResult<()> {
                // The core names the range (up to 2^31 - 1 per call).
                let ticks = $crate::numbers::arg::<$crate::numbers::U32>(ticks, "ticks")?;
                let ticks = i64::from(ticks.0);
                $crate::errors::core(self.pool_mut(py, |p| p.advance_clock(ticks))?)
            }

            /// Drop these blocks from the prefix cache (they stay allocated).
            fn evict_blocks(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
                self.pool_ids(py, block_ids, BlockPool::evict_blocks)
            }

            /// Start tracking residency metrics for every block; `records`
            /// False keeps the histograms but no per-eviction records.
            #[pyo3(signature = (records = None), text_signature = "($self, records=True)")]
            fn enable_residency(
                &self,
                py: Python<'_>,
                records: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<()> {
                let keep = $crate::args::opt_flag(records, "records", true)?;
                $crate::errors::core(self.pool_mut(py, |p| p.enable_residency_with(keep))?)
            }

            /// Start vLLM's sampled residency metrics: follow a
            /// `sample_rate` share of block lives (0 < rate <= 1), drawn
            /// from `seed`; enabling again starts over.
            fn enable_sampled_lives(
                &self,
                py: Python<'_>,
                sample_rate: f64,
                seed: &Bound<'_, PyAny>,
            ) -> PyResult<()> {
                let seed = $crate::numbers::arg::<$crate::numbers::U64>(seed, "seed")?.0;
                $crate::errors::core(self.pool_mut(py, |p| p.enable_sampled_lives(sample_rate, seed))?)
            }

            /// The sampled lives ended since the last drain, oldest first:
            /// (lifetime, idle, reuse gaps), in nanoseconds.
            fn drain_life_samples(&self, py: Python<'_>) -> PyResult<Vec<(u64, u64, Vec<u64>)>> {
                let samples = self.pool_mut(py, |p| p.drain_life_samples())?;
                Ok(samples
                    .into_iter()
                    .map(|s| (s.lifetime_ns, s.idle_ns, s.reuse_gaps_ns))
                    .collect())
            }

            fn set_residency_clock(&self, py: Python<'_>, now: &Bound<'_, PyAny>) -> PyResult<()> {
                let now = $crate::numbers::arg::<$crate::numbers::U64>(now, "now")?.0;
                self.pool_mut(py, |p| p.set_residency_clock(now))
            }

            fn residency_snapshot<'py>(
                &self,
                py: Python<'py>,
            ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
                self.pool_ref(py, |p| $crate::residency::snapshot(py, p))?
            }

            fn drain_eviction_records(
                &self,
                py: Python<'_>,
            ) -> PyResult<Vec<$crate::residency::RecordTuple>> {
                self.pool_mut(py, $crate::residency::drain)
            }

            /// Forget every cached prefix; refused (False, with a warning)
            /// while blocks are in use.
            fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<bool> {
                let (ok, in_use) = self.pool_mut(py, |p| (p.reset_prefix_cache(), p.num_used_blocks()))?;
                $crate::pool::warn_if_not_reset(py, ok, in_use)
            }

            /// Drain the pool's KV-cache events.
            fn take_events(&self, py: Python<'_>) -> PyResult<$crate::events::PyEventList> {
                let events = self.pool_mut(py, BlockPool::take_events)?;
                $crate::pool::events_to_py(py, events)
            }

            $($extra)*
        });
    };
}
pub(crate) use pool_writers;

/// After `reset_prefix_cache`: log a warning (as vLLM does) when it was
/// refused. Called once the pool's state is released (logging runs Python).
pub(crate) fn warn_if_not_reset(py: Python<'_>, ok: bool, in_use: usize) -> PyResult<bool> {
    if !ok {
        let logger = py
            .import("logging")?
            .call_method1("getLogger", ("kvcoord",))?;
        let msg = format!("Failed to reset the prefix cache: {in_use} blocks are still in use");
        logger.call_method1("warning", (msg,))?;
    }
    Ok(ok)
}

/// Drained KV-cache events as Python objects.
pub(crate) fn events_to_py(py: Python<'_>, events: Vec<KvEvent>) -> PyResult<PyEventList> {
    events
        .into_iter()
        .map(|e: KvEvent| event_to_py(py, e))
        .collect()
}

/// A standalone KV-cache block pool (see `_core.pyi` for the documented
/// surface). A manager's pool is the read-only
/// [`PyBlockPoolView`](crate::coordinator::PyBlockPoolView) instead.
/// Frozen: the state is behind an [`Exclusive`] (calls from other threads
/// wait for the running one).
#[pyclass(module = "kvcoord._core", name = "BlockPool", frozen)]
pub(crate) struct PyBlockPool {
    state: Exclusive<PoolState>,
}

struct PoolState {
    inner: BlockPool,
    /// Reused buffers (keep `get_new_blocks`/`free_blocks` allocation-free).
    scratch: Scratch,
}

impl PyBlockPool {
    fn enter(&self, py: Python<'_>) -> PyResult<Entered<'_, PoolState>> {
        self.state.enter(py)
    }

    /// `f(pool)`, read-only (the shape `pool_readers` expects).
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        Ok(f(&self.enter(py)?.inner))
    }

    fn pool_ref<R>(&self, py: Python<'_>, f: impl FnOnce(&BlockPool) -> R) -> PyResult<R> {
        self.with(py, f)
    }

    fn pool_mut<R>(&self, py: Python<'_>, f: impl FnOnce(&mut BlockPool) -> R) -> PyResult<R> {
        Ok(f(&mut self.enter(py)?.inner))
    }

    /// `f(pool, ids)` with `block_ids` converted into the reused buffer.
    fn pool_ids<R>(
        &self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut BlockPool, &[BlockId]) -> Result<R, kvcoord_core::KvError>,
    ) -> PyResult<R> {
        let mut state = self.enter(py)?;
        let PoolState { inner, scratch } = &mut *state;
        scratch.ids.clear();
        convert::extend_ids(block_ids, &mut scratch.ids, 0)?;
        core(f(inner, &scratch.ids))
    }

    /// `num_blocks` new blocks, into the reused buffer, then `f` of them.
    fn new_blocks<R>(
        &self,
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut Scratch) -> R,
    ) -> PyResult<R> {
        let n = numbers::arg::<Blocks>(num_blocks, "num_blocks")?.0;
        let mut state = self.enter(py)?;
        let PoolState { inner, scratch } = &mut *state;
        scratch.ids.clear();
        core(inner.get_new_blocks(n, &mut scratch.ids))?;
        Ok(f(scratch))
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
        let num_blocks = numbers::config::<Blocks>(num_blocks, "num_blocks")?.0;
        let mut config = PoolConfig::new(num_blocks);
        config.enable_caching = args::opt_flag(enable_caching, "enable_caching", config.enable_caching)?;
        if let Some(h) = hash_block_size {
            config.hash_block_size = numbers::config::<U32>(h, "hash_block_size")?.0;
        }
        config.enable_events = args::opt_flag(enable_events, "enable_events", config.enable_events)?;
        let pool = convert::build_pool_sized(py, num_blocks, || {
            BlockPool::with_eviction(config, eviction)
        });
        Ok(Self {
            state: Exclusive::new(PoolState {
                inner: core(pool)?,
                scratch: Scratch::default(),
            }),
        })
    }

    fn get_new_blocks<'py>(
        &self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.new_blocks(py, num_blocks, |s| id_list(py, &s.ids))?
    }

    fn get_new_blocks_array<'py>(
        &self,
        py: Python<'py>,
        num_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        self.new_blocks(py, num_blocks, |s| s.ids_array(py))?
    }

    fn free_blocks(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.pool_ids(py, block_ids, BlockPool::free_blocks)
    }

    fn touch(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.pool_ids(py, block_ids, BlockPool::touch)
    }

    fn unpin_blocks(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.pool_ids(py, block_ids, BlockPool::unpin_blocks)
    }

    fn take_reused_watched<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let ids: Vec<u32> =
            self.pool_mut(py, |p| p.take_reused_watched().iter().map(|b| b.0).collect())?;
        Ok(PyArray1::from_vec(py, ids))
    }

    #[getter]
    fn num_watched(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, BlockPool::num_watched)
    }

    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, group_id, block_mask = None))]
    #[allow(clippy::too_many_arguments)] // Python arguments, converted once
    fn cache_full_blocks(
        &self,
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
            .map(|m| crate::convert::flags(m, "block_mask"))
            .transpose()?;
        let ids = convert::block_ids(block_ids)?;
        let hashes = convert::block_hashes(block_hashes)?;
        let num_cached = numbers::arg::<Blocks>(num_cached_blocks, "num_cached_blocks")?.0;
        let num_full = numbers::arg::<Blocks>(num_full_blocks, "num_full_blocks")?.0;
        let group = numbers::arg::<GroupId>(group_id, "group id")?;
        core(self.pool_mut(py, |pool| {
            pool.cache_full_blocks(&ids, &hashes, num_cached, num_full, group, block_mask.as_deref())
        })?)
    }

    #[pyo3(signature = (block_id, block_hash, group_id, num_tokens = None))]
    fn insert_key(
        &self,
        py: Python<'_>,
        block_id: &Bound<'_, PyAny>,
        block_hash: &Bound<'_, PyAny>,
        group_id: &Bound<'_, PyAny>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let b = numbers::arg::<BlockId>(block_id, "block_id")?;
        let hash = convert::block_hash(block_hash)?;
        let group = numbers::arg::<GroupId>(group_id, "group id")?;
        let tokens = numbers::maybe::<U32>(num_tokens, "num_tokens")?.map(|t| t.0);
        let key = kvcoord_core::CacheKey { hash, group };
        core(self.pool_mut(py, |pool| pool.insert_key(b, key, tokens))?)
    }

    /// The core's hit search of one spec over this pool (the per-spec
    /// finder a coordinator runs for a group of that spec).
    #[pyo3(signature = (spec, group_ids, block_hashes, max_length, alignment, *, drop_eagle = false))]
    #[allow(clippy::too_many_arguments)] // Python arguments, converted once
    fn find_longest_cache_hit<'py>(
        &self,
        py: Python<'py>,
        spec: &Bound<'_, PyAny>,
        group_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        max_length: &Bound<'_, PyAny>,
        alignment: &Bound<'_, PyAny>,
        drop_eagle: bool,
    ) -> PyResult<(Vec<Bound<'py, PyList>>, usize)> {
        let spec = spec
            .extract::<crate::kinds::PyGroupSpec>()
            .map_err(|_| {
                crate::errors::type_error(format!(
                    "spec must be a kvcoord GroupSpec, got {}",
                    args::type_name(spec)
                ))
            })?
            .0;
        let groups = convert::group_ids(group_ids)?;
        let hashes = convert::block_hashes(block_hashes)?;
        let max_length = numbers::arg::<Tokens>(max_length, "max_length")?.0;
        let alignment = numbers::arg::<Tokens>(alignment, "alignment")?.0;
        let manager = core(kvcoord_core::Manager::new(spec, GroupId(0)))?;
        let mut out = Vec::new();
        core(kvcoord_core::limits::try_reserve(&mut out, groups.len(), "hit lists"))?;
        out.resize_with(groups.len(), Vec::new);
        let hit = core(self.with(py, |pool| {
            let hbs = pool.config().hash_block_size as usize;
            manager.find_longest_cache_hit(
                pool, &groups, &hashes, hbs, max_length, alignment, drop_eagle, &mut out,
            )
        })?)?;
        let lists = out
            .iter()
            .map(|ids| id_list(py, ids))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((lists, hit))
    }

    #[getter]
    fn residency_enabled(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |p| p.residency().is_some())
    }
});
