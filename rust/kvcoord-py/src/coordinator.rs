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

use crate::args;
use crate::convert;
use crate::guard;
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

    /// The request's view, refused when caching and the request is hashed
    /// in another unit than this manager's (its hashes would be cached
    /// under wrong keys).
    fn checked_view<'r>(&self, r: &'r PyRequest) -> PyResult<RequestView<'r>> {
        let unit = r.hasher().config().block_size();
        let mine = self.inner.config().hash_block_size as usize;
        if self.inner.config().enable_caching() && unit != mine {
            return Err(crate::errors::ConfigError::new_err(format!(
                "request {:?} is hashed in units of {unit} tokens but this manager uses \
                 hash_block_size={mine}",
                r.id()
            )));
        }
        Ok(view(r))
    }
}

/// `new_computed_blocks` as one id list per group: a result of this
/// manager (`KVCacheBlocks`) or a plain sequence of per-group id lists.
fn extract_hits(
    py: Python<'_>,
    slf: &Bound<'_, PyCoordinatorCore>,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Vec<Vec<BlockId>>> {
    let result_type = guard::borrow(slf)?.result_type.clone_ref(py);
    let unwrapped;
    let obj = if obj.is_instance(result_type.bind(py))? {
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
    let mut hits = Vec::with_capacity(seq.len()?);
    for item in seq.try_iter()? {
        hits.push(convert::block_ids(&item?)?);
    }
    Ok(hits)
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

    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = None, new_computed_blocks = None,
                        num_lookahead_tokens = None, num_encoder_tokens = None, delay_cache_blocks = None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        slf: &Bound<'py, Self>,
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
        // Hits are converted before this object is borrowed: converting may
        // run Python code, during which another thread may call in.
        let hits = match new_computed_blocks {
            None => None,
            Some(obj) => Some(extract_hits(py, slf, obj)?),
        };
        let mut guard = guard::borrow_mut(slf)?;
        let this = &mut *guard;
        let view = this.checked_view(&request)?;
        let request_id = request.id();
        let known = this.lookup(request_id);
        let req = known.unwrap_or(ReqId(this.next_req));
        let mut out = std::mem::take(&mut this.out);
        let result = this.inner.allocate_slots_into(
            req,
            &view,
            num_new_tokens,
            num_new_computed,
            hits.as_deref(),
            lookahead,
            encoder,
            delay_cache_blocks,
            &mut out,
        );
        let converted = match result {
            Ok(true) => {
                if known.is_none() {
                    this.req_ids.insert(request_id.to_owned(), req);
                    this.next_req += 1;
                }
                if out.flat().is_empty() {
                    // The common decode step: nothing new in any group.
                    Ok(Some(Err(this.empty.bind(py).clone())))
                } else {
                    (0..out.num_groups())
                        .map(|g| convert::id_list(py, out.group(g)))
                        .collect::<PyResult<Vec<_>>>()
                        .map(|lists| Some(Ok((lists, this.result_type.clone_ref(py)))))
                }
            }
            Ok(false) => Ok(None),
            Err(e) => Err(CoreError(e).into()),
        };
        this.out = out;
        // The result type is Python code: run it with the borrow released.
        drop(guard);
        match converted? {
            None => Ok(None),
            Some(Err(empty)) => Ok(Some(empty)),
            Some(Ok((lists, result_type))) => result_type
                .bind(py)
                .call1((PyTuple::new(py, lists)?,))
                .map(Some),
        }
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
