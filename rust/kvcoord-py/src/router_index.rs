//! `kvcoord._core.PrefixIndex`: conversion only, the index is
//! `kvcoord_core::RouterIndex` (a cluster router's view of which engine
//! caches which block, built from KV events alone).

use kvcoord_core::{GroupId, RouterIndex};
use pyo3::prelude::*;
use pyo3::types::PySet;

use crate::coordinator::PyCoordinatorCore;
use crate::errors::{core, type_error};
use crate::events::{AllBlocksCleared, BlockRemoved, BlockStored};
use crate::numbers::{U32, U64};

/// Which engine caches which block, from the engines' KV events only; see
/// `kvcoord.replay.routers`.
#[pyclass(module = "kvcoord._core", name = "PrefixIndex")]
pub(crate) struct PyPrefixIndex {
    index: RouterIndex,
}

fn engine_arg(engine: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(crate::numbers::arg::<U32>(engine, "engine")?.0 as usize)
}

pymethods!(PyPrefixIndex {
    /// Engines indexed.
    get num_engines(&self) -> usize = self.index.num_engines();
    /// The KV-cache group whose events are indexed.
    get group_idx(&self) -> u32 = self.index.group().0;
    /// Events applied so far (every group's).
    get events_seen(&self) -> u64 = self.index.events_seen();
}
    #[new]
    #[pyo3(signature = (num_engines, group_idx = None))]
    fn new(num_engines: &Bound<'_, PyAny>, group_idx: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let n = crate::numbers::arg::<U32>(num_engines, "num_engines")?.0 as usize;
        let group = match group_idx {
            Some(g) => crate::numbers::arg::<U32>(g, "group_idx")?.0,
            None => 0,
        };
        Ok(Self {
            index: core(RouterIndex::new(n, GroupId(group)))?,
        })
    }

    /// Apply `engine`'s events (as `take_events()` returns them) in order.
    fn apply(&mut self, engine: &Bound<'_, PyAny>, events: &Bound<'_, PyAny>) -> PyResult<()> {
        let k = engine_arg(engine)?;
        for ev in events.try_iter()? {
            let ev = ev?;
            if let Ok(s) = ev.cast::<BlockStored>() {
                let s = &s.get().inner;
                core(self.index.stored(k, s.group, s.external_hashes()))?;
            } else if let Ok(r) = ev.cast::<BlockRemoved>() {
                let r = r.get();
                core(self.index.removed(k, r.group, r.block_hash.external()))?;
            } else if ev.cast::<AllBlocksCleared>().is_ok() {
                core(self.index.cleared(k))?;
            } else {
                return Err(type_error(format!(
                    "not a KV event: {}",
                    crate::args::type_name(&ev)
                )));
            }
        }
        Ok(())
    }

    /// Drain the events of `coordinator` (engine `engine`'s coordinator, recording
    /// events) into the index, as `apply(engine, coordinator.take_events())` would,
    /// without making a Python object per event.
    fn drain(
        &mut self,
        py: Python<'_>,
        engine: &Bound<'_, PyAny>,
        coordinator: &Bound<'_, PyCoordinatorCore>,
    ) -> PyResult<()> {
        let k = engine_arg(engine)?;
        let events = coordinator.get().enter(py)?.inner.pool_mut().take_events();
        core(self.index.apply(k, &events))
    }

    /// Per engine, the longest run of leading blocks of `block_hashes`
    /// (vLLM's integer form) it caches.
    fn matched_blocks(&self, block_hashes: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
        let mut keys = Vec::new();
        for h in block_hashes.try_iter()? {
            keys.push(crate::numbers::arg::<U64>(&h?, "block hash")?.0);
        }
        Ok(self.index.matched_blocks(&keys))
    }

    /// The block hashes the index says `engine` caches.
    fn keys<'py>(&self, py: Python<'py>, engine: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
        let k = engine_arg(engine)?;
        PySet::new(py, core(self.index.keys(k))?)
    }
);
