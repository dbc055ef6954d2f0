//! `kvcoord._core.CoordinatorCore`: the Rust mechanism under every Python
//! coordinator policy (per-group block tables, hit finders, the fused
//! `allocate_slots`). Conversion and delegation only.

use hashbrown::HashMap;
use kvcoord_core::coordinator::{
    CoordinatorConfig, CoordinatorCore, CoordinatorKind, NewBlocks, RequestView,
};
use kvcoord_core::{BlockId, KvError, ReqId};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::convert;
use crate::errors::{core, CoreError, InvariantError};
use crate::kinds::{self, PyCoordinatorKind, PyGroupSpec};
use crate::pool::PyBlockPool;
use crate::request::PyRequest;

/// One scheduler's KV-cache mechanism: a pool shared by one manager per
/// group, and every request's per-group block tables.
#[pyclass(module = "kvcoord._core", name = "CoordinatorCore")]
pub(crate) struct PyCoordinatorCore {
    pub(crate) inner: CoordinatorCore,
    /// Python request ids -> core request ids (assigned on first allocation).
    req_ids: HashMap<String, ReqId>,
    next_req: u64,
    /// Reused buffers for the per-step calls.
    out: NewBlocks,
    hits: Vec<Vec<BlockId>>,
    /// The Python type `allocate_slots` returns (`kvcoord.KVCacheBlocks`,
    /// built from a tuple of per-group id lists), and its shared empty value:
    /// building the result here lets the facade hand `allocate_slots` to the
    /// scheduler as this method itself, one boundary crossing and no Python
    /// frame per decode step.
    result_type: Py<PyAny>,
    empty: Py<PyAny>,
}

fn view(r: &PyRequest) -> RequestView<'_> {
    RequestView::new(
        r.num_computed_tokens_usize(),
        r.num_tokens_usize(),
        r.num_prompt_tokens_usize(),
        r.block_hashes_slice(),
    )
}

fn per_group_lists<'py, 'a>(
    py: Python<'py>,
    groups: impl ExactSizeIterator<Item = &'a [BlockId]>,
) -> PyResult<Bound<'py, PyList>> {
    let lists = groups
        .map(|ids| convert::id_list(py, ids))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, lists)
}

impl PyCoordinatorCore {
    fn lookup(&self, request_id: &str) -> Option<ReqId> {
        self.req_ids.get(request_id).copied()
    }
}

#[pymethods]
impl PyCoordinatorCore {
    #[new]
    #[pyo3(signature = (num_blocks, groups, *, kind, hash_block_size, max_model_len,
                        result_type, retention_interval = None, enable_events = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: i64,
        groups: Vec<PyGroupSpec>,
        kind: PyCoordinatorKind,
        hash_block_size: Option<i64>,
        max_model_len: i64,
        result_type: Py<PyAny>,
        retention_interval: Option<i64>,
        enable_events: bool,
    ) -> PyResult<Self> {
        let num_blocks = convert::count(num_blocks, "num_blocks")?;
        let kind = CoordinatorKind::from(kind);
        let mut config = CoordinatorConfig::new(
            kinds::specs(&groups),
            num_blocks,
            kind.enable_caching(),
            convert::config_count(max_model_len, "max_model_len")?,
        );
        config.kind = kind;
        if let Some(hbs) = hash_block_size {
            config.hash_block_size = convert::config_count(hbs, "hash_block_size")?;
        }
        config.retention_interval = retention_interval;
        config.enable_events = enable_events;
        let empty_lists = (0..groups.len()).map(|_| PyList::empty(py));
        let empty = result_type.call1(py, (PyTuple::new(py, empty_lists)?,))?;
        let inner = convert::build_pool_sized(py, num_blocks, || CoordinatorCore::new(config));
        Ok(Self {
            inner: core(inner)?,
            req_ids: HashMap::new(),
            next_req: 0,
            out: NewBlocks::new(),
            hits: Vec::new(),
            result_type,
            empty,
        })
    }

    /// Tokens per hash unit (requests must be hashed with it).
    #[getter]
    fn hash_block_size(&self) -> u32 {
        self.inner.config().hash_block_size
    }

    /// LCM of the groups' block sizes.
    #[getter]
    fn scheduler_block_size(&self) -> u32 {
        self.inner.config().scheduler_block_size
    }

    /// The shared pool (a handle on this coordinator's pool, not a copy).
    #[getter]
    fn block_pool(slf: Bound<'_, Self>) -> PyBlockPool {
        PyBlockPool::of_coordinator(slf.unbind())
    }

    /// The shared empty result (no new block in any group).
    #[getter]
    fn empty(&self, py: Python<'_>) -> Py<PyAny> {
        self.empty.clone_ref(py)
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    fn find_longest_cache_hit<'py>(
        &self,
        py: Python<'py>,
        group_ids: &Bound<'_, PyAny>,
        request: PyRef<'_, PyRequest>,
        max_length: i64,
        alignment: i64,
    ) -> PyResult<(Bound<'py, PyList>, usize)> {
        let groups = convert::group_ids(group_ids)?;
        let max_length = convert::count(max_length, "max_length")?;
        let alignment = convert::count(alignment, "alignment")?;
        let (blocks, hit) = core(self.inner.find_longest_cache_hit(
            &groups,
            request.block_hashes_slice(),
            max_length,
            alignment,
        ))?;
        Ok((per_group_lists(py, blocks.iter().map(Vec::as_slice))?, hit))
    }

    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = 0, new_computed_blocks = None,
                        num_lookahead_tokens = 0, num_encoder_tokens = 0, delay_cache_blocks = false))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &mut self,
        py: Python<'py>,
        request: PyRef<'_, PyRequest>,
        num_new_tokens: i64,
        num_new_computed_tokens: i64,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: i64,
        num_encoder_tokens: i64,
        delay_cache_blocks: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let num_new_tokens = convert::count(num_new_tokens, "num_new_tokens")?;
        let num_new_computed = convert::count(num_new_computed_tokens, "num_new_computed_tokens")?;
        let lookahead = convert::count(num_lookahead_tokens, "num_lookahead_tokens")?;
        let encoder = convert::count(num_encoder_tokens, "num_encoder_tokens")?;
        let mut hits = std::mem::take(&mut self.hits);
        let has_hits = match new_computed_blocks {
            None => false,
            Some(obj) => {
                // A result of this manager (`KVCacheBlocks`), or a plain
                // sequence of per-group id lists.
                let unwrapped;
                let obj = if obj.is_instance(self.result_type.bind(py))? {
                    unwrapped = obj.call_method0(pyo3::intern!(py, "arrays"))?;
                    &unwrapped
                } else {
                    obj
                };
                let groups = obj
                    .cast::<PyTuple>()
                    .map(|t| t.as_sequence().clone())
                    .or_else(|_| obj.cast::<PyList>().map(|l| l.as_sequence().clone()));
                let seq = groups.map_err(|_| {
                    CoreError(KvError::InvalidArgument {
                        name: "new_computed_blocks",
                        detail: "expected one list of block ids per group".into(),
                    })
                })?;
                hits.resize_with(seq.len()?, Vec::new);
                for (g, item) in seq.try_iter()?.enumerate() {
                    hits[g].clear();
                    convert::extract_block_ids(&item?, &mut hits[g])?;
                }
                hits.truncate(seq.len()?);
                true
            }
        };
        let request_id = request.id();
        let known = self.lookup(request_id);
        let req = known.unwrap_or(ReqId(self.next_req));
        let mut out = std::mem::take(&mut self.out);
        let result = self.inner.allocate_slots_into(
            req,
            &view(&request),
            num_new_tokens,
            num_new_computed,
            has_hits.then_some(hits.as_slice()),
            lookahead,
            encoder,
            delay_cache_blocks,
            &mut out,
        );
        self.hits = hits;
        let converted = match result {
            Ok(true) => {
                if known.is_none() {
                    self.req_ids.insert(request_id.to_owned(), req);
                    self.next_req += 1;
                }
                if out.flat().is_empty() {
                    // The common decode step: nothing new in any group.
                    Ok(Some(self.empty.bind(py).clone()))
                } else {
                    let lists = (0..out.num_groups())
                        .map(|g| convert::id_list(py, out.group(g)))
                        .collect::<PyResult<Vec<_>>>()?;
                    self.result_type
                        .bind(py)
                        .call1((PyTuple::new(py, lists)?,))
                        .map(Some)
                }
            }
            Ok(false) => Ok(None),
            Err(e) => Err(CoreError(e).into()),
        };
        self.out = out;
        converted
    }

    fn cache_blocks(&mut self, request: PyRef<'_, PyRequest>, num_tokens: i64) -> PyResult<()> {
        let n = convert::count(num_tokens, "num_tokens")?;
        let Some(req) = self.lookup(request.id()) else {
            return Err(crate::errors::UnknownRequestError::new_err(format!(
                "no request {:?} in the KV cache manager",
                request.id()
            )));
        };
        core(self.inner.cache_blocks(req, &view(&request), n))
    }

    /// Free a request's blocks; unknown ids are ignored (as in vLLM).
    fn free(&mut self, request_id: &str) -> PyResult<bool> {
        match self.req_ids.remove(request_id) {
            Some(req) => core(self.inner.free(req)),
            None => Ok(false),
        }
    }

    fn block_ids<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(req) = self.lookup(request_id) else {
            return Ok(None);
        };
        let tables = core(self.inner.block_ids(req))?;
        per_group_lists(py, tables.into_iter()).map(Some)
    }

    fn num_common_prefix_blocks(&self, request_id: &str) -> PyResult<Option<Vec<usize>>> {
        let Some(req) = self.lookup(request_id) else {
            return Ok(None);
        };
        core(
            self.inner
                .get_num_common_prefix_blocks(req, self.inner.num_requests()),
        )
        .map(Some)
    }

    fn check_invariants(&self) -> PyResult<()> {
        self.inner
            .check_invariants()
            .map_err(InvariantError::new_err)?;
        if self.req_ids.len() != self.inner.num_requests() {
            return Err(InvariantError::new_err(format!(
                "{} request ids mapped but {} requests tracked",
                self.req_ids.len(),
                self.inner.num_requests()
            )));
        }
        Ok(())
    }
}
