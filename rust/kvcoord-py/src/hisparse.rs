//! `kvcoord._core.HiSparsePair`: the core's [`HiSparsePair`] over two
//! `CoordinatorCore` objects, the host and device halves of a `HiSparse`
//! manager. Conversion and delegation only: each call enters both cores
//! (host first, the one order anything enters two), builds the pair and
//! runs one of its transactions.

use kvcoord_core::coordinator::{AllocateArgs, NewBlocks, PredictArgs};
use kvcoord_core::{BlockId, GroupId, HiSparsePair, KvError};
use pyo3::prelude::*;

use crate::args;
use crate::blocks::PyKVCacheBlocks;
use crate::convert;
use crate::coordinator::{fill_hits, PyCoordinatorCore};
use crate::errors::{core, err};
use crate::numbers::{self, Tokens};
use crate::request::request_arg;

/// The host and device cores of one `HiSparse` manager (see `_core.pyi`).
#[pyclass(module = "kvcoord._core", name = "HiSparsePair", frozen)]
pub(crate) struct PyHiSparsePair {
    host: Py<PyCoordinatorCore>,
    device: Py<PyCoordinatorCore>,
}

impl PyHiSparsePair {
    /// `f(pair)` with both cores entered, its error mapped.
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut HiSparsePair<'_>) -> Result<R, KvError>,
    ) -> PyResult<R> {
        let mut host = self.host.get().enter(py)?;
        let mut device = self.device.get().enter(py)?;
        let mut pair = core(HiSparsePair::new(&mut host.inner, &mut device.inner))?;
        core(f(&mut pair))
    }
}

/// Optional block ids of the host's one group.
fn host_hits(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<BlockId>>> {
    obj.filter(|o| !o.is_none())
        .map(convert::block_ids)
        .transpose()
}

/// Optional block ids per device group.
fn device_hits(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<Vec<BlockId>>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let mut hits = Vec::new();
    fill_hits(obj, &mut hits)?;
    Ok(Some(hits))
}

/// A token count keyword, `default` when omitted or None.
fn tokens_or(obj: Option<&Bound<'_, PyAny>>, name: &str, default: usize) -> PyResult<usize> {
    numbers::opt_arg(obj, name, Tokens(default)).map(|t| t.0)
}

/// An optional token count keyword.
fn opt_tokens(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<usize>> {
    Ok(numbers::maybe::<Tokens>(obj, name)?.map(|t| t.0))
}

pymethods!(PyHiSparsePair {
    /// The host half (the source group on the host pool).
    get host(&self, py: Python<'_>) -> Py<PyCoordinatorCore> = self.host.clone_ref(py);
    /// The device half (every other group, on the device pool).
    get device(&self, py: Python<'_>) -> Py<PyCoordinatorCore> = self.device.clone_ref(py);
} {
    #[new]
    fn new(
        py: Python<'_>,
        host: Py<PyCoordinatorCore>,
        device: Py<PyCoordinatorCore>,
    ) -> PyResult<Self> {
        if host.is(&device) {
            return Err(err(KvError::InvalidArgument {
                name: "device",
                detail: "the host and device halves must be two cores".into(),
            }));
        }
        let pair = Self { host, device };
        pair.with(py, |_| Ok(()))?;
        Ok(pair)
    }

    /// One step of `request` in both halves or in neither (see `_core.pyi`).
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = None, host_hits = None,
                        device_hits = None, num_lookahead_tokens = None, num_encoder_tokens = None,
                        delay_cache_blocks = None, num_external_computed_tokens = None))]
    #[allow(clippy::too_many_arguments)] // vLLM's keyword arguments, converted once
    fn allocate_slots(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        num_new_computed_tokens: Option<&Bound<'_, PyAny>>,
        host_hits: Option<&Bound<'_, PyAny>>,
        device_hits: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        num_encoder_tokens: Option<&Bound<'_, PyAny>>,
        delay_cache_blocks: Option<&Bound<'_, PyAny>>,
        num_external_computed_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyKVCacheBlocks>> {
        let request = request_arg(request)?;
        let args = AllocateArgs {
            num_new_tokens: numbers::arg::<Tokens>(num_new_tokens, "num_new_tokens")?.0,
            num_new_computed_tokens: tokens_or(num_new_computed_tokens, "num_new_computed_tokens", 0)?,
            num_lookahead_tokens: tokens_or(num_lookahead_tokens, "num_lookahead_tokens", 0)?,
            num_encoder_tokens: tokens_or(num_encoder_tokens, "num_encoder_tokens", 0)?,
            delay_cache_blocks: args::opt_flag(delay_cache_blocks, "delay_cache_blocks", false)?,
            num_external_computed_tokens: tokens_or(
                num_external_computed_tokens,
                "num_external_computed_tokens",
                0,
            )?,
        };
        let host_hits = self::host_hits(host_hits)?;
        let device_hits = self::device_hits(device_hits)?;
        let mut out = NewBlocks::new();
        let fitted = self.with(py, |pair| {
            pair.allocate(
                &request.inner,
                &args,
                host_hits.as_deref(),
                device_hits.as_deref(),
                &mut out,
            )
        })?;
        fitted.then(|| PyKVCacheBlocks::new(out)).transpose()
    }

    /// Both halves' prediction for a step over every group (see `_core.pyi`).
    #[pyo3(signature = (request, num_tokens, host_hits = None, device_hits = None,
                        total_computed_tokens = None, num_encoder_tokens = None,
                        max_in_flight_tokens = None, num_local_computed_tokens = None,
                        num_tokens_main_model = None, prefill_end = None))]
    #[allow(clippy::too_many_arguments)]
    fn num_blocks_to_allocate(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        host_hits: Option<&Bound<'_, PyAny>>,
        device_hits: Option<&Bound<'_, PyAny>>,
        total_computed_tokens: Option<&Bound<'_, PyAny>>,
        num_encoder_tokens: Option<&Bound<'_, PyAny>>,
        max_in_flight_tokens: Option<&Bound<'_, PyAny>>,
        num_local_computed_tokens: Option<&Bound<'_, PyAny>>,
        num_tokens_main_model: Option<&Bound<'_, PyAny>>,
        prefill_end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let request = request_arg(request)?;
        let predict = PredictArgs {
            num_tokens: numbers::arg::<Tokens>(num_tokens, "num_tokens")?.0,
            total_computed_tokens: tokens_or(total_computed_tokens, "total_computed_tokens", 0)?,
            local_computed_tokens: opt_tokens(num_local_computed_tokens, "num_local_computed_tokens")?,
            num_encoder_tokens: tokens_or(num_encoder_tokens, "num_encoder_tokens", 0)?,
            max_in_flight_tokens: opt_tokens(max_in_flight_tokens, "max_in_flight_tokens")?,
            num_tokens_main_model: opt_tokens(num_tokens_main_model, "num_tokens_main_model")?,
            prefill_end: opt_tokens(prefill_end, "prefill_end")?,
        };
        let host_hits = self::host_hits(host_hits)?;
        let device_hits = self::device_hits(device_hits)?.unwrap_or_default();
        self.with(py, |pair| {
            pair.num_blocks_to_allocate(&request.inner, host_hits.as_deref(), &device_hits, &predict)
        })
    }

    /// The source group's admission count (see `_core.pyi`).
    #[pyo3(signature = (request, num_tokens, host_hits = None, total_computed_tokens = None,
                        num_local_computed_tokens = None))]
    fn host_admission_blocks(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        host_hits: Option<&Bound<'_, PyAny>>,
        total_computed_tokens: Option<&Bound<'_, PyAny>>,
        num_local_computed_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let request = request_arg(request)?;
        let predict = PredictArgs {
            total_computed_tokens: tokens_or(total_computed_tokens, "total_computed_tokens", 0)?,
            local_computed_tokens: opt_tokens(num_local_computed_tokens, "num_local_computed_tokens")?,
            ..PredictArgs::new(numbers::arg::<Tokens>(num_tokens, "num_tokens")?.0)
        };
        let host_hits = self::host_hits(host_hits)?;
        self.with(py, |pair| {
            pair.host_admission_blocks(&request.inner, host_hits.as_deref(), &predict)
        })
    }

    /// Free a request in both halves; False when neither held it.
    fn free(&self, py: Python<'_>, request_id: &str) -> PyResult<bool> {
        self.with(py, |pair| pair.free(request_id))
    }

    /// Forget a request in both halves and hand its references to the
    /// caller: per group (the host's first), its ids; None when neither
    /// held it.
    fn pop_request_to_caller(
        &self,
        py: Python<'_>,
        request_id: &str,
    ) -> PyResult<Option<Vec<Vec<u32>>>> {
        let got = self.with(py, |pair| pair.pop_request_to_caller(request_id))?;
        Ok(got.map(|groups| {
            groups
                .into_iter()
                .map(|g| g.into_iter().map(|b| b.0).collect())
                .collect()
        }))
    }

    /// Reset the prefix cache of each pool with no block in use, the
    /// host's first; which halves reset, as (host, device).
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<(bool, bool)> {
        let reset = self.with(py, |pair| Ok(pair.reset_prefix_cache()))?;
        Ok((reset.host, reset.device))
    }

    /// The most blocks one request holds in a group (vLLM's group id) with
    /// `max_in_flight_tokens` in flight; None: no cap.
    fn max_admission_blocks(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyAny>,
        max_in_flight_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let group = numbers::arg::<GroupId>(group, "group")?;
        let tokens = numbers::arg::<Tokens>(max_in_flight_tokens, "max_in_flight_tokens")?.0;
        self.with(py, |pair| pair.max_admission_blocks(group, tokens))
    }

    /// Check both cores' invariants and the pair's.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |pair| pair.check_invariants().map_err(KvError::Invariant))
    }
});
