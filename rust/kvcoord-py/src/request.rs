//! `kvcoord.Request` and the hashing functions: conversion and delegation
//! only; the hashing is `kvcoord_core::hashing`.

use kvcoord_core::hashing;
use kvcoord_core::{BlockHash, ExtraKeys, HashAlgo, HashConfig, Request, RequestHasher};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PySlice, PyString, PyTuple};

use crate::args::Text;
use crate::convert::extend_ids;
use crate::convert::{digest, digest_list};
use crate::errors::{core, protocol_error, Protocol, Refused};
use crate::numbers::{self, Blocks, Tokens, U32};
use crate::tokens::{lora_key, mm_features, step_ints, token};

/// Hash without holding the GIL when at least this many tokens are new
/// (releasing and re-taking the GIL costs about a microsecond).
const DETACH_MIN_TOKENS: usize = 4096;

/// The hash arguments `Request` and `compute_block_hashes` share.
struct HashArgs<'a, 'py> {
    hash_block_size: &'a Bound<'py, PyAny>,
    hash_algo: &'a Text,
    hash_seed: Option<&'a Text>,
    cache_salt: Option<Text>,
    lora: Option<&'a Bound<'py, PyAny>>,
    mm_features: Option<&'a Bound<'py, PyAny>>,
}

impl HashArgs<'_, '_> {
    /// A request of the tokens in `obj` hashed as these arguments say
    /// (`computing`: the caller that needs a computing algorithm, if any).
    fn request(
        self,
        py: Python<'_>,
        request_id: String,
        obj: &Bound<'_, PyAny>,
        computing: Option<&str>,
    ) -> PyResult<Request> {
        let mut algo = core(HashAlgo::from_name(self.hash_algo.as_str()))?;
        if let Some(what) = computing {
            algo = core(algo.computing(what))?;
        }
        let block_size =
            numbers::config::<U32>(self.hash_block_size, "hash_block_size")?.0 as usize;
        let config = core(HashConfig::new(algo, block_size, Text::opt(self.hash_seed)))?;
        let extra = ExtraKeys::new(
            lora_key(self.lora)?,
            mm_features(self.mm_features)?,
            self.cache_salt.map(|t| t.0),
        );
        let hasher = RequestHasher::new(config, extra);
        let fill = |t: &mut Vec<u32>| extend_ids(obj, t, 0).map_err(Refused);
        // (Converting on this thread while a worker thread hashed was
        // measured slower on a 2-core machine: thread start-up and
        // cross-core traffic cost more than the overlap saved.)
        Ok(Request::try_new(request_id, hasher, fill, |h, t| {
            hash(py, h, t);
        })?)
    }
}

/// `hasher.update(tokens)`, without the GIL when the new part is long.
fn hash(py: Python<'_>, hasher: &mut RequestHasher, tokens: &[u32]) {
    if hasher.num_tokens_to_hash(tokens.len()) >= DETACH_MIN_TOKENS {
        py.detach(|| hasher.update(tokens));
    } else {
        hasher.update(tokens);
    }
}

// ------------------------------------------------------------------ Request

/// A request's tokens and the chained hashes of its full blocks (see
/// `_core.pyi` for the documented surface): a `kvcoord_core::Request`.
#[pyclass(module = "kvcoord._core", name = "Request")]
pub(crate) struct PyRequest {
    pub(crate) inner: Request,
}

impl PyRequest {
    fn extra(&self) -> &ExtraKeys {
        self.inner.hasher().extra_keys()
    }

    /// `catch_up` with its hash position converted (the block hash gate's
    /// call, once per completed block).
    pub(crate) fn catch_up_from<'py>(
        &mut self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyList>,
        start: usize,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let (held, n) = (self.inner.num_tokens(), token_ids.len());
        if held > n {
            return Ok(None);
        }
        if held < n {
            let new = token_ids.get_slice(held, n);
            let fill = |t: &mut Vec<u32>| extend_ids(new.as_any(), t, held).map_err(Refused);
            self.inner.try_append(fill, |h, t| hash(py, h, t))?;
        }
        let hashes = self.inner.block_hashes();
        digest_list(py, hashes.get(start..).unwrap_or_default()).map(Some)
    }
}

/// Ints as a new list, room for it checked first (`crate::convert::room_for`).
fn int_list<'py>(py: Python<'py>, values: &[u32]) -> PyResult<Bound<'py, PyList>> {
    crate::convert::room_for(values.len(), "a list of token ids")?;
    PyList::new(py, values)
}

pymethods!(PyRequest {
    get request_id(&self) -> &str = self.inner.id();
    get skip_reading_prefix_cache(&self) -> bool = self.inner.skip_reading_prefix_cache;
    get num_prompt_tokens(&self) -> usize = self.inner.num_prompt_tokens();
    get num_output_tokens(&self) -> usize = self.inner.num_output_tokens();
    get num_tokens(&self) -> usize = self.inner.num_tokens();
    get shared_prefix_boundary(&self) -> usize = self.inner.shared_prefix_boundary();
    get num_in_flight_tokens(&self) -> usize = self.inner.num_in_flight_tokens();
    get num_computed_tokens(&self) -> usize = self.inner.num_computed_tokens();
    get prompt_token_ids['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> =
        int_list(py, self.inner.prompt_tokens());
    get output_token_ids['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> =
        int_list(py, self.inner.output_tokens());
    get all_token_ids['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> =
        int_list(py, self.inner.tokens());
    get hash_block_size(&self) -> usize = self.inner.hasher().config().block_size();
    get hash_algo(&self) -> &'static str = self.inner.hasher().config().algo().name();
    get digest_len(&self) -> usize = self.inner.hasher().digest_len();
    get cache_salt(&self) -> Option<&str> = self.extra().cache_salt.as_deref();
    get lora(&self) -> Option<(String, String)> =
        self.extra().lora.as_ref().map(|l| (l.name.clone(), l.path.clone()));
    get mm_features(&self) -> Vec<(String, u32, u32)> =
        self.extra().mm_features.iter().map(|f| (f.identifier.clone(), f.offset, f.length)).collect();
    /// A live, read-only sequence view of the block hashes (bytes items).
    get block_hashes(slf: Bound<'_, Self>) -> BlockHashes = BlockHashes { request: slf.unbind() };
    get num_block_hashes(&self) -> usize = self.inner.block_hashes().len();
}
    #[new]
    #[pyo3(
        signature = (
            request_id, prompt_token_ids, *, hash_block_size,
            hash_algo = Text::from_static("sha256_cbor"), hash_seed = None, cache_salt = None,
            lora = None, mm_features = None
        ),
        text_signature = "(request_id, prompt_token_ids, *, hash_block_size, \
                          hash_algo='sha256_cbor', hash_seed=None, cache_salt=None, lora=None, \
                          mm_features=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        request_id: Text,
        prompt_token_ids: &Bound<'_, PyAny>,
        hash_block_size: &Bound<'_, PyAny>,
        hash_algo: Text,
        hash_seed: Option<Text>,
        cache_salt: Option<Text>,
        lora: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let args = HashArgs {
            hash_block_size,
            hash_algo: &hash_algo,
            hash_seed: hash_seed.as_ref(),
            cache_salt,
            lora,
            mm_features,
        };
        let inner = args.request(py, request_id.0, prompt_token_ids, None)?;
        Ok(Self { inner })
    }

    /// Append caller-supplied block hashes (a sequence of bytes or a 2-D
    /// uint8 array) for the next full blocks; `hash_algo="supplied"` only.
    /// All-or-nothing.
    fn supply_block_hashes(&mut self, block_hashes: &Bound<'_, PyAny>) -> PyResult<()> {
        let digests = crate::convert::block_hashes(block_hashes)?;
        core(self.inner.supply_block_hashes(&digests))
    }

    /// Append one token (an int) or many (a sequence or numpy array); hashes
    /// the blocks this completes. All-or-nothing: on an invalid token nothing
    /// is appended.
    fn append_output_token_ids(
        &mut self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        // Lists and tuples are never scalars: asking them for `__index__`
        // raises inside `hasattr`, which cost ~6 us per append.
        let scalar = token_ids.is_instance_of::<PyInt>()
            || (!token_ids.is_instance_of::<PyList>()
                && !token_ids.is_instance_of::<PyTuple>()
                && token_ids.cast::<numpy::PyUntypedArray>().is_err()
                && token_ids
                    .hasattr(pyo3::intern!(py, "__index__"))
                    .unwrap_or(false));
        if scalar {
            let t = token(self.inner.num_tokens(), token_ids)?;
            self.inner.push_token(t);
            return Ok(());
        }
        let base = self.inner.num_tokens();
        let fill = |t: &mut Vec<u32>| extend_ids(token_ids, t, base).map_err(Refused);
        Ok(self.inner.try_append(fill, |h, t| hash(py, h, t))?)
    }

    /// Catch up with a token list that extends this request's tokens (a
    /// scheduler's request, all its tokens so far): append the ones past
    /// `num_tokens` (hashing the blocks they complete), then return the
    /// block hashes from `start` on as a new list. `None` (nothing changed)
    /// when this request holds more tokens than `token_ids`. All-or-nothing
    /// on an invalid token.
    fn catch_up<'py>(
        &mut self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyList>,
        start: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let start = numbers::arg::<Blocks>(start, "start")?.0;
        self.catch_up_from(py, token_ids, start)
    }

    #[setter]
    fn set_skip_reading_prefix_cache(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.skip_reading_prefix_cache =
            crate::args::flag(value, "skip_reading_prefix_cache")?;
        Ok(())
    }

    #[setter]
    fn set_shared_prefix_boundary(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = numbers::arg::<Tokens>(value, "shared_prefix_boundary")?.0;
        core(self.inner.set_shared_prefix_boundary(value))
    }

    #[setter]
    fn set_num_in_flight_tokens(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = numbers::arg::<Tokens>(value, "num_in_flight_tokens")?.0;
        core(self.inner.set_num_in_flight_tokens(value))
    }

    #[setter]
    fn set_num_computed_tokens(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = numbers::arg::<Tokens>(value, "num_computed_tokens")?.0;
        core(self.inner.set_num_computed_tokens(value))
    }

    /// All token ids as a new 1-D uint32 numpy array.
    fn token_ids_array<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let tokens = self.inner.tokens();
        let copy = kvcoord_core::limits::try_collect(tokens.len(), tokens.iter().copied(), "token ids");
        Ok(PyArray1::from_vec(py, core(copy)?))
    }

    /// The block hashes as a new `(n, digest_len)` uint8 numpy array.
    fn block_hashes_array<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let hashes = self.inner.block_hashes();
        let d = self.inner.hasher().digest_len();
        let flat = core(BlockHash::concat(hashes))?;
        // Every digest of a request has its length `d`: the shape matches.
        let shaped = Array2::from_shape_vec((hashes.len(), d), flat).map_err(|e| {
            crate::errors::err(kvcoord_core::KvError::Invariant(format!(
                "block hashes of mixed lengths: {e}"
            )))
        })?;
        Ok(shaped.into_pyarray(py))
    }

    /// The block hashes concatenated into one bytes object
    /// (`n * digest_len` bytes).
    fn block_hashes_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &core(BlockHash::concat(self.inner.block_hashes()))?))
    }

    fn __repr__(&self) -> String {
        let r = &self.inner;
        format!(
            "Request(request_id={:?}, num_prompt_tokens={}, num_tokens={}, num_computed_tokens={}, \
             hash_algo={:?}, hash_block_size={}, num_block_hashes={})",
            r.id(),
            r.num_prompt_tokens(),
            r.num_tokens(),
            r.num_computed_tokens(),
            r.hasher().config().algo().name(),
            r.hasher().config().block_size(),
            r.block_hashes().len()
        )
    }
);

/// One scheduler step's bookkeeping for many requests in one call:
/// `requests[i].num_computed_tokens += num_computed[i]`, then, where
/// `new_tokens` is given and `new_tokens[i] >= 0`, append that sampled
/// token (hashing the block it completes). All arguments are checked
/// before any request changes.
#[pyfunction]
#[pyo3(signature = (requests, num_computed, new_tokens = None))]
pub(crate) fn advance_requests(
    requests: &Bound<'_, PyAny>,
    num_computed: &Bound<'_, PyAny>,
    new_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let computed = step_ints(num_computed, "num_computed", false)?;
    let sampled = new_tokens
        .map(|t| step_ints(t, "new_tokens", true))
        .transpose()?;
    let not_requests = |got: &Bound<'_, PyAny>| {
        crate::errors::type_error(format!(
            "requests must be a list of kvcoord.Request, got {}",
            crate::args::type_name(got)
        ))
    };
    let requests = requests
        .try_iter()
        .map_err(|_| not_requests(requests))?
        .map(|item| {
            let item = item?;
            item.cast_into::<PyRequest>()
                .map_err(|e| not_requests(e.into_inner().as_any()))
        })
        .collect::<PyResult<Vec<_>>>()?;
    advance_bound(&requests, &computed, sampled.as_deref())
}

/// [`advance_requests`] of requests and counts already converted.
pub(crate) fn advance_bound(
    requests: &[Bound<'_, PyRequest>],
    computed: &[i64],
    sampled: Option<&[i64]>,
) -> PyResult<()> {
    // One borrow per request, held through the step. A request listed twice
    // (advanced twice) cannot be borrowed twice: those steps take the
    // general path.
    let (mut held, mut before) = (Vec::new(), Vec::new());
    core(kvcoord_core::limits::try_reserve(
        &mut held,
        requests.len(),
        "requests",
    ))?;
    core(kvcoord_core::limits::try_reserve(
        &mut before,
        requests.len(),
        "requests",
    ))?;
    for r in requests {
        let Ok(m) = r.try_borrow_mut() else {
            drop(held);
            return advance_listed(requests, computed, sampled);
        };
        before.push(step_request(r, &m.inner));
        held.push(m);
    }
    let steps = core(kvcoord_core::step_progress(&before, computed, sampled))?;
    // `step_progress` checked every total: no `advance` is refused.
    for (m, step) in held.iter_mut().zip(steps) {
        core(m.inner.advance(step))?;
    }
    Ok(())
}

/// A request as `step_progress` tells requests apart: by the object.
fn step_request(r: &Bound<'_, PyRequest>, inner: &Request) -> kvcoord_core::StepRequest {
    kvcoord_core::StepRequest {
        key: r.as_ptr() as usize,
        num_computed_tokens: inner.num_computed_tokens(),
    }
}

/// `advance_requests` borrowing each request as its turn comes (a request
/// listed twice; one borrowed elsewhere is refused before anything
/// changes).
#[cold]
fn advance_listed(
    requests: &[Bound<'_, PyRequest>],
    computed: &[i64],
    sampled: Option<&[i64]>,
) -> PyResult<()> {
    let before = requests
        .iter()
        .map(|r| Ok(step_request(r, &r.try_borrow()?.inner)))
        .collect::<PyResult<Vec<_>>>()?;
    let steps = core(kvcoord_core::step_progress(&before, computed, sampled))?;
    for (r, step) in requests.iter().zip(steps) {
        core(r.try_borrow_mut()?.inner.advance(step))?;
    }
    Ok(())
}

/// A sequence index as `list` takes one: an int (or `__index__`), clamped
/// to `isize` (an index beyond it is out of range for any sequence);
/// anything else is a `TypeError`.
fn sequence_index(index: &Bound<'_, PyAny>) -> PyResult<isize> {
    use crate::args::NotMachineInt;
    match index.extract::<isize>() {
        Ok(i) => Ok(i),
        Err(e) => match crate::args::why_not_machine_int(index, e) {
            NotMachineInt::OutOfRange(v) if crate::args::is_negative(&v) => Ok(isize::MIN),
            NotMachineInt::OutOfRange(_) => Ok(isize::MAX),
            NotMachineInt::NotInt => Err(protocol_error(
                Protocol::Type,
                format!(
                    "block hash indices must be integers or slices, not {}",
                    crate::args::type_name(index)
                ),
            )),
            NotMachineInt::Raised(e) => Err(e),
        },
    }
}

/// Read-only sequence view over a request's block hashes.
#[pyclass(module = "kvcoord._core", name = "BlockHashes", frozen, sequence)]
pub(crate) struct BlockHashes {
    request: Py<PyRequest>,
}

impl BlockHashes {
    /// `f` of the request's hashes, as they are now (the view is live).
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&[BlockHash]) -> R) -> PyResult<R> {
        Ok(f(self.request.try_borrow(py)?.inner.block_hashes()))
    }

    /// The hashes as a new list of `bytes`.
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.with(py, |h| digest_list(py, h))?
    }
}

#[pymethods]
impl BlockHashes {
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, <[BlockHash]>::len)
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(slice) = index.cast::<PySlice>() {
            // Only the items of the slice become bytes objects (a hasher
            // takes the few newest hashes of a long request this way).
            return self.with(py, |hashes| {
                let n = isize::try_from(hashes.len()).unwrap_or(isize::MAX);
                let ix = slice.indices(n)?;
                if ix.step == 1 {
                    let (lo, hi) = (
                        ix.start.unsigned_abs(),
                        ix.stop.unsigned_abs().max(ix.start.unsigned_abs()),
                    );
                    return digest_list(py, &hashes[lo..hi]).map(Bound::into_any);
                }
                let picked = (0..ix.slicelength).map(|k| {
                    let at = ix.start + ix.step * isize::try_from(k).unwrap_or(isize::MAX);
                    digest(py, &hashes[at.unsigned_abs()])
                });
                PyList::new(py, picked).map(Bound::into_any)
            })?;
        }
        let i = sequence_index(index)?;
        let item = self.with(py, |hashes| {
            let n = isize::try_from(hashes.len()).unwrap_or(isize::MAX);
            let j = if i < 0 { i + n } else { i };
            (0..n)
                .contains(&j)
                .then(|| digest(py, &hashes[j.unsigned_abs()]))
        })?;
        item.map(Bound::into_any)
            .ok_or_else(|| protocol_error(Protocol::Index, "block hash index out of range"))
    }

    /// Position of the first hash equal to `value` (`ValueError` if none);
    /// `Sequence.index` semantics, `start`/`stop` included.
    #[pyo3(
        signature = (value, start = None, stop = None),
        text_signature = "($self, value, start=0, stop=None)"
    )]
    fn index(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        start: Option<&Bound<'_, PyAny>>,
        stop: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let start = start.map_or(Ok(0), sequence_index)?;
        let stop = stop.map(sequence_index).transpose()?;
        let wanted = value.cast::<PyBytes>().ok();
        let found = self.with(py, |hashes| {
            let n = isize::try_from(hashes.len()).unwrap_or(isize::MAX);
            let clamp = |i: isize| (if i < 0 { i + n } else { i }).clamp(0, n).unsigned_abs();
            let lo = clamp(start);
            let part = hashes.get(lo..clamp(stop.unwrap_or(n)))?;
            let wanted = wanted?.as_bytes();
            part.iter()
                .position(|h| h.as_bytes() == wanted)
                .map(|i| lo + i)
        })?;
        found.ok_or_else(|| {
            protocol_error(
                Protocol::NotFound,
                "block hash is not in this request's block hashes",
            )
        })
    }

    /// Number of hashes equal to `value`.
    fn count(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Ok(wanted) = value.cast::<PyBytes>() else {
            return Ok(0);
        };
        let wanted = wanted.as_bytes();
        self.with(py, |h| h.iter().filter(|h| h.as_bytes() == wanted).count())
    }

    fn __contains__(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.count(py, value)? > 0)
    }

    fn __reversed__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let list = self.list(py)?;
        list.reverse()?;
        list.try_iter().map(Bound::into_any)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.list(py)?.try_iter().map(Bound::into_any)
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        if let Ok(o) = other.cast::<BlockHashes>() {
            let theirs = o.get().request.try_borrow(py)?;
            return self.with(py, |mine| mine == theirs.inner.block_hashes());
        }
        if other.is_instance_of::<PyString>() || other.is_instance_of::<PyBytes>() {
            return Ok(false);
        }
        // Only a sized collection can be equal (as for `list`): an iterator
        // or generator is never read, so an endless one cannot hang this,
        // and a length that differs settles it without reading anything.
        match other.len() {
            Ok(n) if n == self.__len__(py)? => {}
            _ => return Ok(false),
        }
        let Ok(items) = other.try_iter() else {
            return Ok(false);
        };
        let as_list = PyList::empty(py);
        for item in items {
            as_list.append(item?)?;
        }
        self.list(py)?.eq(as_list)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let req = self.request.try_borrow(py)?;
        Ok(format!(
            "BlockHashes(n={}, digest_len={})",
            req.inner.block_hashes().len(),
            req.inner.hasher().digest_len()
        ))
    }
}

// ---------------------------------------------------------------- functions

/// Hashes of every full block of `token_ids` (one-shot; equals what a
/// `Request` with the same arguments holds).
#[pyfunction]
#[pyo3(
    signature = (
        token_ids, *, hash_block_size, hash_algo = Text::from_static("sha256_cbor"),
        hash_seed = None, cache_salt = None, lora = None, mm_features = None
    ),
    text_signature = "(token_ids, *, hash_block_size, hash_algo='sha256_cbor', hash_seed=None, \
                      cache_salt=None, lora=None, mm_features=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn compute_block_hashes<'py>(
    py: Python<'py>,
    token_ids: &Bound<'py, PyAny>,
    hash_block_size: &Bound<'py, PyAny>,
    hash_algo: Text,
    hash_seed: Option<Text>,
    cache_salt: Option<Text>,
    lora: Option<&Bound<'py, PyAny>>,
    mm_features: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let args = HashArgs {
        hash_block_size,
        hash_algo: &hash_algo,
        hash_seed: hash_seed.as_ref(),
        cache_salt,
        lora,
        mm_features,
    };
    let request = args.request(py, String::new(), token_ids, Some("compute_block_hashes"))?;
    digest_list(py, request.block_hashes())
}

/// The root digest (`NONE_HASH`, parent of block 0) for an algorithm and
/// seed; the seed defaults as for `Request`.
#[pyfunction]
#[pyo3(
    signature = (hash_algo = Text::from_static("sha256_cbor"), hash_seed = None),
    text_signature = "(hash_algo='sha256_cbor', hash_seed=None)"
)]
pub(crate) fn none_hash(
    py: Python<'_>,
    hash_algo: Text,
    hash_seed: Option<Text>,
) -> PyResult<Bound<'_, PyBytes>> {
    let algo = core(HashAlgo::from_name(hash_algo.as_str()))?;
    let algo = core(algo.computing("none_hash"))?;
    let seed = Text::opt(hash_seed.as_ref()).unwrap_or_else(|| hashing::default_seed(algo));
    Ok(PyBytes::new(py, hashing::none_hash(algo, seed).as_bytes()))
}

/// The names `hash_algo` accepts.
pub(crate) fn hash_algo_names() -> Vec<&'static str> {
    HashAlgo::NAMES.to_vec()
}

/// The `request` argument: a `kvcoord.Request`, else `ArgumentTypeError`.
pub(crate) fn request_arg<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyRef<'py, PyRequest>> {
    let req = obj.cast::<PyRequest>().map_err(|_| {
        crate::errors::type_error(format!(
            "request must be a kvcoord.Request, got {}",
            crate::args::type_name(obj)
        ))
    })?;
    Ok(req.try_borrow()?)
}
