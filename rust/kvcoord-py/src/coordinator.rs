//! `kvcoord._core.CoordinatorCore`: the Rust mechanism under every Python
//! coordinator policy (per-group block tables, hit finders, the fused
//! `allocate_slots`). Conversion and delegation only.

use hashbrown::HashMap;
use kvcoord_core::coordinator::{
    Arrangement, CoordinatorConfig, CoordinatorCore, NewBlocks, RequestView,
};
use kvcoord_core::managers::GroupSpec;
use kvcoord_core::{BlockId, KvError, ReqId};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::args;
use crate::convert;
use crate::errors::{core, ConfigError, CoreError, InvariantError};
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

fn spec_from_tuple(kind: &str, block_size: u32, param: u32) -> PyResult<GroupSpec> {
    let spec = match kind {
        "full_attention" => GroupSpec::full_attention(block_size),
        "sliding_window" => GroupSpec::sliding_window(block_size, param),
        "chunked_local" => GroupSpec::chunked_local(block_size, param),
        "mamba" => GroupSpec::mamba(block_size, param),
        "cross_attention" => GroupSpec::cross_attention(block_size),
        other => {
            return Err(ConfigError::new_err(format!(
                "unknown KV cache spec kind {other:?}: expected one of full_attention, \
                 sliding_window, chunked_local, mamba, cross_attention"
            )))
        }
    };
    Ok(spec)
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

    /// The request's view, refused when caching and the request is hashed
    /// in another unit than this manager's (its hashes would be cached
    /// under wrong keys).
    fn checked_view<'r>(&self, r: &'r PyRequest) -> PyResult<RequestView<'r>> {
        let unit = r.hasher().config().block_size();
        let mine = self.inner.config().hash_block_size as usize;
        if self.inner.config().enable_caching && unit != mine {
            return Err(ConfigError::new_err(format!(
                "request {:?} is hashed in units of {unit} tokens but this manager uses \
                 hash_block_size={mine}",
                r.id()
            )));
        }
        Ok(view(r))
    }
}

/// The `request` argument: a `kvcoord.Request`, else `ArgumentTypeError`.
fn request_arg<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyRef<'py, PyRequest>> {
    let req = obj.cast::<PyRequest>().map_err(|_| {
        crate::errors::ArgumentTypeError::new_err(format!(
            "request must be a kvcoord.Request, got {}",
            args::type_name(obj)
        ))
    })?;
    Ok(req.try_borrow()?)
}

#[pymethods]
impl PyCoordinatorCore {
    #[new]
    #[pyo3(signature = (num_blocks, groups, *, enable_caching, hash_block_size, max_model_len,
                        result_type, retention_interval = None, arrangement = "unitary",
                        enable_events = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        groups: Vec<(String, u32, u32)>,
        enable_caching: &Bound<'_, PyAny>,
        hash_block_size: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        result_type: Py<PyAny>,
        retention_interval: Option<i64>,
        arrangement: &str,
        enable_events: bool,
    ) -> PyResult<Self> {
        let specs = groups
            .iter()
            .map(|(k, bs, p)| spec_from_tuple(k, *bs, *p))
            .collect::<PyResult<Vec<_>>>()?;
        let arrangement = match arrangement {
            "unitary" => Arrangement::Unitary,
            "hybrid" => Arrangement::Hybrid,
            other => {
                return Err(ConfigError::new_err(format!(
                    "unknown arrangement {other:?}: expected 'unitary' or 'hybrid'"
                )))
            }
        };
        let num_blocks = args::config_count(num_blocks, "num_blocks")?;
        let enable_caching = args::flag(enable_caching, "enable_caching")?;
        let hash_block_size = args::config_u32(hash_block_size, "hash_block_size")?;
        let max_model_len = args::config_count(max_model_len, "max_model_len")?;
        let mut config = CoordinatorConfig::new(specs, num_blocks, enable_caching, max_model_len);
        config.hash_block_size = hash_block_size;
        config.retention_interval = retention_interval;
        config.arrangement = arrangement;
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

    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = None, new_computed_blocks = None,
                        num_lookahead_tokens = None, num_encoder_tokens = None, delay_cache_blocks = None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &mut self,
        py: Python<'py>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        num_new_computed_tokens: Option<&Bound<'_, PyAny>>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        num_encoder_tokens: Option<&Bound<'_, PyAny>>,
        delay_cache_blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let request = request_arg(request)?;
        let num_new_tokens = args::count(num_new_tokens, "num_new_tokens")?;
        let num_new_computed =
            args::opt_count(num_new_computed_tokens, "num_new_computed_tokens")?;
        let lookahead = args::opt_count(num_lookahead_tokens, "num_lookahead_tokens")?;
        let encoder = args::opt_count(num_encoder_tokens, "num_encoder_tokens")?;
        let delay_cache_blocks =
            args::opt_flag(delay_cache_blocks, "delay_cache_blocks", false)?;
        let view = self.checked_view(&request)?;
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
            &view,
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

    fn cache_blocks(
        &mut self,
        request: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let request = request_arg(request)?;
        let n = args::count(num_tokens, "num_tokens")?;
        let Some(req) = self.lookup(request.id()) else {
            return Err(crate::errors::UnknownRequestError::new_err(format!(
                "no request {:?} in the KV cache manager",
                request.id()
            )));
        };
        let view = self.checked_view(&request)?;
        core(self.inner.cache_blocks(req, &view, n))
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
