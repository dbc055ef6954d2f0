//! `kvcoord.Request` and the hashing functions: conversion and delegation
//! only; the hashing is `kvcoord_core::hashing`.

use kvcoord_core::hashing;
use kvcoord_core::{
    BlockHash, ExtraKeys, HashAlgo, HashConfig, KvError, LoraKey, MmFeature, Request, RequestHasher,
};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PySlice, PyString, PyTuple};

use crate::args::Text;
use crate::errors::{core, err};

/// Hash without holding the GIL when at least this many tokens are new
/// (releasing and re-taking the GIL costs about a microsecond).
const DETACH_MIN_TOKENS: usize = 4096;

// ---------------------------------------------------------------- conversion

fn invalid_token(position: usize, value: &Bound<'_, PyAny>) -> PyErr {
    // Beyond i128 the value is shown saturated; the position is exact.
    let value = value.extract::<i128>().unwrap_or(i128::MAX);
    err(KvError::InvalidTokenId { position, value })
}

/// One token from a Python object at `position`.
#[inline]
fn token(position: usize, item: &Bound<'_, PyAny>) -> PyResult<u32> {
    match item.extract::<i64>() {
        Ok(v) => core(hashing::token_id(position, v)),
        // Too large for i64 but still an int: a token error, not OverflowError.
        Err(_) if crate::args::is_int_like(item) => Err(invalid_token(position, item)),
        Err(e) => Err(crate::errors::ArgumentTypeError::new_err(format!(
            "token id at position {position} must be an int, got {} ({e})",
            item.get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))),
    }
}

/// The token id `item` holds when it is an exact `int` in `[0, 2^32)`:
/// the list fast path, with no error built and no generic dispatch.
#[inline]
fn plain_token(item: &Bound<'_, PyAny>) -> Option<u32> {
    if item.is_exact_instance_of::<PyInt>() {
        item.extract::<i64>()
            .ok()
            .and_then(|v| u32::try_from(v).ok())
    } else {
        None
    }
}

/// Append the token ids of a list's or tuple's items: a tight loop over
/// plain ints, the checked conversion (and its error) for anything else.
fn tokens_from_items<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    out: &mut Vec<u32>,
    base: usize,
) -> PyResult<()> {
    for (i, item) in items.enumerate() {
        match plain_token(&item) {
            Some(t) => out.push(t),
            None => out.push(token(base + i, &item)?),
        }
    }
    Ok(())
}

/// One per-request int of `advance_requests` (`what` names the argument;
/// `tokens`: a value beyond 64 bits is an invalid token id at `position`).
#[inline]
fn step_int(item: &Bound<'_, PyAny>, what: &str, tokens: bool, position: usize) -> PyResult<i64> {
    if let Ok(v) = item.extract::<i64>() {
        return Ok(v);
    }
    if !crate::args::is_int_like(item) {
        return Err(crate::args::not_an_int(
            item,
            &format!("{what}[{position}]"),
        ));
    }
    if tokens {
        return Err(invalid_token(position, item));
    }
    Err(crate::errors::InvalidArgumentError::new_err(format!(
        "invalid {what}[{position}]: {} (must be below 2^63)",
        crate::args::shown(item)
    )))
}

/// The per-request ints of `advance_requests`: a list (the usual case) item
/// by item with no generic sequence protocol, anything else (numpy arrays,
/// other sequences) through `convert::int_vec`, its overflow and type
/// errors mapped onto `kvcoord.errors`.
fn step_ints(obj: &Bound<'_, PyAny>, what: &str, tokens: bool) -> PyResult<Vec<i64>> {
    if let Ok(list) = obj.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(step_int(&item, what, tokens, i)?);
        }
        return Ok(out);
    }
    let py = obj.py();
    crate::convert::int_vec(obj).map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
            crate::errors::InvalidArgumentError::new_err(format!(
                "invalid {what}: a value is beyond 64 bits ({e})"
            ))
        } else if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py)
            && !e.is_instance_of::<crate::errors::ArgumentTypeError>(py)
        {
            crate::errors::ArgumentTypeError::new_err(format!(
                "{what} must be a sequence of ints or an integer numpy array ({e})"
            ))
        } else {
            e
        }
    })
}

macro_rules! try_token_array {
    ($obj:expr, $out:expr, $base:expr, $($t:ty),*) => {
        $(
            if let Ok(arr) = $obj.extract::<PyReadonlyArray1<'_, $t>>() {
                let view = arr.as_array();
                reserve_tokens($out, view.len())?;
                // Check the whole array first (a loop the compiler
                // vectorizes), then convert; report the first bad position.
                #[allow(clippy::cast_lossless, clippy::unnecessary_cast, clippy::cast_possible_wrap, clippy::cast_sign_loss, clippy::checked_conversions, unused_comparisons)]
                {
                    let ok = |v: $t| v >= 0 && (v as u64) <= u64::from(u32::MAX);
                    if view.iter().all(|&v| ok(v)) {
                        $out.extend(view.iter().map(|&v| v as u32));
                    } else {
                        let (i, &v) = view.iter().enumerate().find(|&(_, &v)| !ok(v)).expect("a bad value");
                        return Err(err(KvError::InvalidTokenId {
                            position: $base + i,
                            value: v as i128,
                        }));
                    }
                }
                return Ok(());
            }
        )*
    };
}

/// Append the token ids in `obj` (an int, a list/tuple/sequence of ints, or a
/// 1-D integer numpy array) to `out`, validating each. Positions in errors
/// count from `base`. On error `out` may hold part of the input: callers
/// pass a scratch vector or truncate.
pub(crate) fn extract_tokens(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<u32>,
    base: usize,
) -> PyResult<()> {
    if let Ok(list) = obj.cast::<PyList>() {
        reserve_tokens(out, list.len())?;
        return tokens_from_items(list.iter(), out, base);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        reserve_tokens(out, tuple.len())?;
        return tokens_from_items(tuple.iter(), out, base);
    }
    // uint32 first: always valid, copied as one slice when contiguous.
    if let Ok(arr) = obj.extract::<PyReadonlyArray1<'_, u32>>() {
        reserve_tokens(out, arr.as_array().len())?;
        match arr.as_slice() {
            Ok(s) => out.extend_from_slice(s),
            Err(_) => out.extend(arr.as_array().iter().copied()),
        }
        return Ok(());
    }
    try_token_array!(obj, out, base, i64, i32, u64, u16, i16, u8, i8);
    if obj.cast::<numpy::PyUntypedArray>().is_ok() {
        if let Some(native) = crate::convert::native_int_array(obj)? {
            return extract_tokens(&native, out, base);
        }
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(crate::errors::ArgumentTypeError::new_err(
            "token ids must be a sequence of ints, not str/bytes",
        ));
    }
    let items = obj.try_iter().map_err(|_| {
        crate::errors::ArgumentTypeError::new_err(format!(
            "token ids must be an int, a sequence of ints or an integer numpy array, got {}",
            crate::args::type_name(obj)
        ))
    })?;
    for (i, item) in items.enumerate() {
        out.push(token(base + i, &item?)?);
    }
    Ok(())
}

/// Room for `n` more tokens, or `OutOfMemoryError` (nothing appended).
fn reserve_tokens(out: &mut Vec<u32>, n: usize) -> PyResult<()> {
    core(kvcoord_core::limits::try_reserve(out, n, "token ids"))
}

fn str_field(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        crate::errors::ArgumentTypeError::new_err(format!(
            "{what} must be a str, got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))
    })
}

/// `lora`: `None`, a `(name, path)` tuple, or an object with `name` and
/// `path` attributes (such as `kvcoord.LoRA`).
fn lora_key(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<LoraKey>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let (name, path) = if let Ok(t) = obj.cast::<PyTuple>() {
        if t.len() != 2 {
            return Err(crate::errors::ArgumentTypeError::new_err(format!(
                "lora must be (name, path), got a tuple of {} items",
                t.len()
            )));
        }
        (t.get_item(0)?, t.get_item(1)?)
    } else if obj.hasattr("name")? && obj.hasattr("path")? {
        (obj.getattr("name")?, obj.getattr("path")?)
    } else {
        return Err(crate::errors::ArgumentTypeError::new_err(
            "lora must be None, a (name, path) tuple or an object with .name and .path",
        ));
    };
    Ok(Some(LoraKey {
        name: str_field(&name, "lora name")?,
        path: str_field(&path, "lora path")?,
    }))
}

/// `mm_features`: `None` or an iterable of `(identifier, offset, length)`
/// tuples or objects with those attributes (such as
/// `kvcoord.MultiModalFeature`).
fn mm_features(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<MmFeature>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for item in obj.try_iter()? {
        let item = item?;
        let (id, offset, length) = if let Ok(t) = item.cast::<PyTuple>() {
            if t.len() != 3 {
                return Err(crate::errors::ArgumentTypeError::new_err(format!(
                    "each mm_features item must be (identifier, offset, length), got a tuple of {} items",
                    t.len()
                )));
            }
            (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?)
        } else if item.hasattr("identifier")? {
            (
                item.getattr("identifier")?,
                item.getattr("offset")?,
                item.getattr("length")?,
            )
        } else {
            return Err(crate::errors::ArgumentTypeError::new_err(
                "each mm_features item must be an (identifier, offset, length) tuple or an object with those attributes",
            ));
        };
        let id = str_field(&id, "mm_features identifier")?;
        out.push(core(hashing::mm_feature(
            id,
            mm_int(&offset, "offset")?,
            mm_int(&length, "length")?,
        ))?);
    }
    Ok(out)
}

/// A multimodal item's offset or length: an int (range-checked by the core).
fn mm_int(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    obj.extract::<i64>().map_err(|_| {
        if crate::args::is_int_like(obj) {
            crate::errors::InvalidArgumentError::new_err(format!(
                "invalid mm_features: {what} {} is not in [0, 2^32)",
                crate::args::shown(obj)
            ))
        } else {
            crate::args::not_an_int(obj, &format!("mm_features {what}"))
        }
    })
}

fn hash_config(
    hash_algo: &str,
    hash_block_size: &Bound<'_, PyAny>,
    hash_seed: Option<&str>,
) -> PyResult<HashConfig> {
    let algo = core(HashAlgo::from_name(hash_algo))?;
    let raw = crate::args::config_count(hash_block_size, "hash_block_size")?;
    let bs = Some(raw).filter(|&b| b > 0).ok_or_else(|| {
        crate::errors::CoreError(KvError::InvalidConfig {
            name: "hash_block_size",
            value: raw.to_string(),
            rule: "must be a positive number of tokens".into(),
        })
    })?;
    core(HashConfig::new(algo, bs, hash_seed))
}

fn hashes_to_list<'py>(py: Python<'py>, hashes: &[BlockHash]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, hashes.iter().map(|h| PyBytes::new(py, h.as_bytes())))
}

fn hashes_to_bytes<'py>(py: Python<'py>, hashes: &[BlockHash]) -> Bound<'py, PyBytes> {
    let d = hashes.first().map_or(0, BlockHash::len);
    PyBytes::new_with(py, hashes.len() * d, |buf| {
        for (dst, h) in buf.chunks_exact_mut(d.max(1)).zip(hashes) {
            dst.copy_from_slice(h.as_bytes());
        }
        Ok(())
    })
    .expect("filling a fresh bytes object cannot fail")
}

/// Run `hasher.update(tokens)`, without the GIL when the new part is long.
fn update_hashes(py: Python<'_>, hasher: &mut RequestHasher, tokens: &[u32]) -> PyResult<()> {
    core(hasher.try_reserve_for(tokens.len()))?;
    let new_tokens = hasher.pending_blocks(tokens.len()) * hasher.config().block_size();
    if new_tokens >= DETACH_MIN_TOKENS {
        py.detach(|| hasher.update(tokens));
    } else {
        hasher.update(tokens);
    }
    Ok(())
}

/// Convert `obj` into `tokens` and bring `hasher` up to date with them.
///
/// (A pipelined variant, converting on this thread while a worker thread
/// hashed, was measured slower on the 2-core development machine: thread
/// start-up and cross-core traffic cost more than the overlap saved.)
fn extract_and_hash(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    hasher: &mut RequestHasher,
    tokens: &mut Vec<u32>,
) -> PyResult<()> {
    extract_tokens(obj, tokens, 0)?;
    update_hashes(py, hasher, tokens)
}

// ------------------------------------------------------------------ Request

/// A request's tokens and the chained hashes of its full blocks (see
/// `_core.pyi` for the documented surface): a `kvcoord_core::Request`.
#[pyclass(module = "kvcoord._core", name = "Request")]
pub(crate) struct PyRequest {
    pub(crate) inner: Request,
}

#[pymethods]
impl PyRequest {
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
        let config = hash_config(
            hash_algo.as_str(),
            hash_block_size,
            Text::opt(hash_seed.as_ref()),
        )?;
        let extra = ExtraKeys::new(
            lora_key(lora)?,
            self::mm_features(mm_features)?,
            cache_salt.map(|t| t.0),
        );
        let mut tokens = Vec::new();
        let mut hasher = RequestHasher::new(config, extra);
        extract_and_hash(py, prompt_token_ids, &mut hasher, &mut tokens)?;
        Ok(Self {
            inner: Request::from_hashed(request_id.0, tokens, hasher),
        })
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
                && crate::args::is_int_like(token_ids));
        if scalar {
            let t = token(self.inner.num_tokens(), token_ids)?;
            self.inner.push_token(t);
            return Ok(());
        }
        let (tokens, hasher) = self.inner.tokens_and_hasher_mut();
        let base = tokens.len();
        if let Err(e) = extract_tokens(token_ids, tokens, base) {
            tokens.truncate(base);
            return Err(e);
        }
        if let Err(e) = update_hashes(py, hasher, tokens) {
            tokens.truncate(base);
            return Err(e);
        }
        Ok(())
    }

    #[getter]
    fn request_id(&self) -> &str {
        self.inner.id()
    }

    #[getter]
    fn get_skip_reading_prefix_cache(&self) -> bool {
        self.inner.skip_reading_prefix_cache
    }

    #[setter]
    fn set_skip_reading_prefix_cache(&mut self, value: bool) {
        self.inner.skip_reading_prefix_cache = value;
    }

    #[getter]
    fn num_prompt_tokens(&self) -> usize {
        self.inner.num_prompt_tokens()
    }

    #[getter]
    fn num_output_tokens(&self) -> usize {
        self.inner.num_tokens() - self.inner.num_prompt_tokens()
    }

    #[getter]
    fn num_tokens(&self) -> usize {
        self.inner.num_tokens()
    }

    #[getter]
    fn get_shared_prefix_boundary(&self) -> usize {
        self.inner.shared_prefix_boundary
    }

    #[setter]
    fn set_shared_prefix_boundary(&mut self, value: i64) -> PyResult<()> {
        self.inner.shared_prefix_boundary = crate::convert::count(value, "shared_prefix_boundary")?;
        Ok(())
    }

    #[getter]
    fn get_num_computed_tokens(&self) -> usize {
        self.inner.num_computed_tokens
    }

    #[setter]
    fn set_num_computed_tokens(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.num_computed_tokens = crate::args::count(value, "num_computed_tokens")?;
        Ok(())
    }

    #[getter]
    fn prompt_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.inner.tokens()[..self.inner.num_prompt_tokens()])
    }

    #[getter]
    fn output_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.inner.tokens()[self.inner.num_prompt_tokens()..])
    }

    #[getter]
    fn all_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.tokens())
    }

    /// All token ids as a new 1-D uint32 numpy array.
    fn token_ids_array<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_slice(py, self.inner.tokens())
    }

    #[getter]
    fn hash_block_size(&self) -> usize {
        self.inner.hasher().config().block_size()
    }

    #[getter]
    fn hash_algo(&self) -> &'static str {
        self.inner.hasher().config().algo().name()
    }

    #[getter]
    fn digest_len(&self) -> usize {
        self.inner.hasher().digest_len()
    }

    #[getter]
    fn cache_salt(&self) -> Option<&str> {
        self.inner.hasher().extra_keys().cache_salt.as_deref()
    }

    #[getter]
    fn lora(&self) -> Option<(String, String)> {
        self.inner
            .hasher()
            .extra_keys()
            .lora
            .as_ref()
            .map(|l| (l.name.clone(), l.path.clone()))
    }

    #[getter]
    fn mm_features(&self) -> Vec<(String, u32, u32)> {
        self.inner
            .hasher()
            .extra_keys()
            .mm_features
            .iter()
            .map(|f| (f.identifier.clone(), f.offset, f.length))
            .collect()
    }

    /// A live, read-only sequence view of the block hashes (bytes items).
    #[getter]
    fn block_hashes(slf: Bound<'_, Self>) -> BlockHashes {
        BlockHashes {
            request: slf.unbind(),
        }
    }

    #[getter]
    fn num_block_hashes(&self) -> usize {
        self.inner.block_hashes().len()
    }

    /// The block hashes as a new `(n, digest_len)` uint8 numpy array.
    fn block_hashes_array<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<u8>> {
        let hashes = self.inner.block_hashes();
        let d = self.inner.hasher().digest_len();
        let mut flat = Vec::with_capacity(hashes.len() * d);
        for h in hashes {
            flat.extend_from_slice(h.as_bytes());
        }
        Array2::from_shape_vec((hashes.len(), d), flat)
            .expect("shape matches")
            .into_pyarray(py)
    }

    /// The block hashes concatenated into one bytes object
    /// (`n * digest_len` bytes).
    fn block_hashes_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        hashes_to_bytes(py, self.inner.block_hashes())
    }

    fn __repr__(&self) -> String {
        let r = &self.inner;
        format!(
            "Request(request_id={:?}, num_prompt_tokens={}, num_tokens={}, num_computed_tokens={}, \
             hash_algo={:?}, hash_block_size={}, num_block_hashes={})",
            r.id(),
            r.num_prompt_tokens(),
            r.num_tokens(),
            r.num_computed_tokens,
            r.hasher().config().algo().name(),
            r.hasher().config().block_size(),
            r.block_hashes().len()
        )
    }
}

/// One scheduler step's bookkeeping for many requests in one call:
/// `requests[i].num_computed_tokens += num_computed[i]`, then, where
/// `new_tokens` is given and `new_tokens[i] >= 0`, append that sampled
/// token (hashing the block it completes). All arguments are checked
/// before any request changes.
#[pyfunction]
#[pyo3(signature = (requests, num_computed, new_tokens = None))]
pub(crate) fn advance_requests(
    requests: &Bound<'_, PyList>,
    num_computed: &Bound<'_, PyAny>,
    new_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let n = requests.len();
    let computed: Vec<i64> = step_ints(num_computed, "num_computed", false)?;
    let sampled: Option<Vec<i64>> = new_tokens
        .map(|t| step_ints(t, "new_tokens", true))
        .transpose()?;
    if computed.len() != n || sampled.as_ref().is_some_and(|s| s.len() != n) {
        return Err(crate::errors::CoreError(KvError::InvalidArgument {
            name: "advance_requests",
            detail: format!(
                "{n} requests but {} computed counts and {} new tokens",
                computed.len(),
                sampled.as_ref().map_or(n, Vec::len)
            ),
        })
        .into());
    }
    let mut borrowed = Vec::with_capacity(n);
    for (i, item) in requests.iter().enumerate() {
        let r = item.cast_into::<PyRequest>()?;
        let add = crate::convert::count(computed[i], "num_computed")?;
        if let Some(s) = &sampled {
            if s[i] >= 0 {
                core(hashing::token_id(i, s[i]))?;
            }
        }
        borrowed.push((r, add));
    }
    for (i, (r, add)) in borrowed.into_iter().enumerate() {
        let mut r = r.try_borrow_mut()?;
        r.inner.num_computed_tokens += add;
        if let Some(s) = &sampled {
            if let Ok(t) = u32::try_from(s[i]) {
                r.inner.push_token(t);
            }
        }
    }
    Ok(())
}

/// Read-only sequence view over a request's block hashes.
#[pyclass(module = "kvcoord._core", name = "BlockHashes", frozen, sequence)]
pub(crate) struct BlockHashes {
    request: Py<PyRequest>,
}

#[pymethods]
impl BlockHashes {
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.request.try_borrow(py)?.inner.block_hashes().len())
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = self.request.try_borrow(py)?;
        let hashes = req.inner.block_hashes();
        if let Ok(slice) = index.cast::<PySlice>() {
            let ind = slice.indices(isize::try_from(hashes.len()).unwrap_or(isize::MAX))?;
            let mut out = Vec::with_capacity(ind.slicelength);
            let mut i = ind.start;
            for _ in 0..ind.slicelength {
                out.push(PyBytes::new(py, hashes[i.unsigned_abs()].as_bytes()));
                i += ind.step;
            }
            return Ok(PyList::new(py, out)?.into_any());
        }
        let i: isize = index.extract()?;
        let n = isize::try_from(hashes.len()).unwrap_or(isize::MAX);
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(PyIndexError::new_err("block hash index out of range"));
        }
        Ok(PyBytes::new(py, hashes[j.unsigned_abs()].as_bytes()).into_any())
    }

    /// Position of the first hash equal to `value` (`ValueError` if none);
    /// `Sequence.index` semantics, `start`/`stop` included.
    #[pyo3(signature = (value, start = 0, stop = None))]
    fn index(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        start: isize,
        stop: Option<isize>,
    ) -> PyResult<usize> {
        let req = self.request.try_borrow(py)?;
        let hashes = req.inner.block_hashes();
        let n = isize::try_from(hashes.len()).unwrap_or(isize::MAX);
        let clamp = |i: isize| (if i < 0 { i + n } else { i }).clamp(0, n).unsigned_abs();
        let (lo, hi) = (clamp(start), clamp(stop.unwrap_or(n)));
        if let Ok(b) = value.cast::<PyBytes>() {
            let wanted = b.as_bytes();
            if let Some(i) = (lo..hi.max(lo)).find(|&i| hashes[i].as_bytes() == wanted) {
                return Ok(i);
            }
        }
        Err(pyo3::exceptions::PyValueError::new_err(
            "block hash is not in this request's block hashes",
        ))
    }

    /// Number of hashes equal to `value`.
    fn count(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<usize> {
        let req = self.request.try_borrow(py)?;
        let Ok(b) = value.cast::<PyBytes>() else {
            return Ok(0);
        };
        let wanted = b.as_bytes();
        Ok(req
            .inner
            .block_hashes()
            .iter()
            .filter(|h| h.as_bytes() == wanted)
            .count())
    }

    fn __contains__(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.count(py, value)? > 0)
    }

    fn __reversed__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let req = self.request.try_borrow(py)?;
        let list = hashes_to_list(py, req.inner.block_hashes())?;
        list.reverse()?;
        list.try_iter().map(Bound::into_any)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let req = self.request.try_borrow(py)?;
        hashes_to_list(py, req.inner.block_hashes())?
            .try_iter()
            .map(Bound::into_any)
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let req = self.request.try_borrow(py)?;
        if let Ok(o) = other.cast::<BlockHashes>() {
            let theirs = o.get().request.try_borrow(py)?;
            return Ok(req.inner.block_hashes() == theirs.inner.block_hashes());
        }
        if other.is_instance_of::<PyString>() || other.is_instance_of::<PyBytes>() {
            return Ok(false);
        }
        let Ok(items) = other.try_iter() else {
            return Ok(false);
        };
        let as_list = PyList::empty(py);
        for item in items {
            as_list.append(item?)?;
        }
        hashes_to_list(py, req.inner.block_hashes())?.eq(as_list)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let req = self.request.try_borrow(py)?;
        let hashes = req.inner.block_hashes();
        Ok(format!(
            "BlockHashes(n={}, digest_len={})",
            hashes.len(),
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
    let config = hash_config(
        hash_algo.as_str(),
        hash_block_size,
        Text::opt(hash_seed.as_ref()),
    )?;
    let extra = ExtraKeys::new(
        lora_key(lora)?,
        self::mm_features(mm_features)?,
        cache_salt.map(|t| t.0),
    );
    let mut tokens = Vec::new();
    let mut hasher = RequestHasher::new(config, extra);
    extract_and_hash(py, token_ids, &mut hasher, &mut tokens)?;
    hashes_to_list(py, hasher.block_hashes())
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
    let seed = Text::opt(hash_seed.as_ref()).unwrap_or_else(|| hashing::default_seed(algo));
    Ok(PyBytes::new(py, hashing::none_hash(algo, seed).as_bytes()))
}

/// The names `hash_algo` accepts.
pub(crate) fn hash_algo_names() -> Vec<&'static str> {
    HashAlgo::NAMES.to_vec()
}
