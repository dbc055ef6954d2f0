//! Argument conversion at the boundary: block ids, token ids, group ids
//! and hashes arrive as Python lists/sequences or numpy arrays and leave as
//! lists or numpy arrays. One pass per argument, no Python object per block
//! kept; every 32-bit id sequence goes through [`extend_ids`].

use kvcoord_core::{BlockHash, BlockId, GroupId, KvError};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray2, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::errors::{core, err, type_error};

/// What a sequence of 32-bit ids holds (block ids, token ids), written
/// once for [`extend_ids`], the one converter of them all.
pub(crate) trait Id: Sized {
    /// Their name in messages.
    const WHAT: &'static str;
    /// What a caller may pass, for messages.
    const EXPECTED: &'static str;
    /// The refusal of a numpy array of another dtype; `None`: such an array
    /// is read item by item (each item refused on its own).
    const OTHER_ARRAYS: Option<&'static str>;
    /// An id known to fit (an array's checked value).
    fn wrap(v: u32) -> Self;
    /// The id `item` at `position` stands for.
    fn item(position: usize, item: &Bound<'_, PyAny>) -> PyResult<Self>;
    /// The refusal of an array's `value` at `position` (not 32-bit).
    fn out_of_range(position: usize, value: i128) -> PyErr;
}

impl Id for BlockId {
    const WHAT: &'static str = "block ids";
    const EXPECTED: &'static str = "a sequence of ints or an integer numpy array";
    const OTHER_ARRAYS: Option<&'static str> =
        Some("block ids must be a 1-D integer numpy array (or a sequence of ints)");

    fn wrap(v: u32) -> Self {
        Self(v)
    }

    #[inline]
    fn item(_: usize, item: &Bound<'_, PyAny>) -> PyResult<Self> {
        block_id_of(item)
    }

    #[cold]
    fn out_of_range(_: usize, value: i128) -> PyErr {
        err(KvError::InvalidBlockId { value: Some(value) })
    }
}

/// Append the ids in `obj` (a list/tuple/sequence of ints, or a 1-D integer
/// numpy array in either byte order) to `out`, checking each; positions in
/// errors count from `base`. On error `out` may hold part of the input:
/// callers pass a scratch vector or truncate.
pub(crate) fn extend_ids<I: Id>(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<I>,
    base: usize,
) -> PyResult<()> {
    if let Ok(list) = obj.cast::<PyList>() {
        return extend_items(list.iter(), list.len(), out, base);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return extend_items(tuple.iter(), tuple.len(), out, base);
    }
    if extend_from_int_array(obj, out, base)? {
        return Ok(());
    }
    if let Some(refusal) = I::OTHER_ARRAYS.filter(|_| obj.cast::<PyUntypedArray>().is_ok()) {
        return Err(type_error(refusal));
    }
    if is_text(obj) {
        let what = I::WHAT;
        return Err(type_error(format!(
            "{what} must be a sequence of ints, not str/bytes"
        )));
    }
    let items = obj.try_iter().map_err(|_| {
        let (what, expected, got) = (I::WHAT, I::EXPECTED, crate::args::type_name(obj));
        type_error(format!("{what} must be {expected}, got {got}"))
    })?;
    collect_items(obj, &items, out, I::WHAT, |i, item| I::item(base + i, item))
}

/// The items of `obj` (iterated as `items`) converted by `each` (given
/// each item's position), appended to `out` with fallible reservations:
/// room for `len(obj)` first when it has a length, then doubling. A huge
/// or endless iterable is `OutOfMemoryError` (the README's promise for
/// buffers sized by the caller), never an abort.
pub(crate) fn collect_items<'py, T>(
    obj: &Bound<'py, PyAny>,
    items: &Bound<'py, pyo3::types::PyIterator>,
    out: &mut Vec<T>,
    what: &'static str,
    mut each: impl FnMut(usize, &Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<()> {
    if let Ok(n) = obj.len() {
        core(kvcoord_core::limits::try_reserve(out, n, what))?;
    }
    for (i, item) in items.clone().enumerate() {
        let value = each(i, &item?)?;
        if out.len() == out.capacity() {
            let more = out.capacity().max(16);
            core(kvcoord_core::limits::try_reserve(out, more, what))?;
        }
        out.push(value);
    }
    Ok(())
}

/// Whether `obj` is text or raw bytes (`str`, `bytes`, `bytearray`,
/// `memoryview`): iterable, but never a sequence of ids.
pub(crate) fn is_text(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<pyo3::types::PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<pyo3::types::PyByteArray>()
        || obj.is_instance_of::<pyo3::types::PyMemoryView>()
}

/// The items of a list or tuple of `n`, written into room made first: no
/// capacity check or length update per item. (A list may shrink while it
/// is read, by an item's `__index__`: only the items read are kept.)
#[inline]
fn extend_items<'py, I: Id>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    n: usize,
    out: &mut Vec<I>,
    base: usize,
) -> PyResult<()> {
    core(kvcoord_core::limits::try_reserve(out, n, I::WHAT))?;
    let start = out.len();
    out.resize_with(start + n, || I::wrap(0));
    let mut read = 0;
    let mut result = Ok(());
    for (slot, item) in out[start..].iter_mut().zip(items) {
        match I::item(base + read, &item) {
            Ok(id) => *slot = id,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        read += 1;
    }
    out.truncate(start + read);
    result
}

/// Arrays up to this length are copied before they are read.
const COPY_MAX_VALUES: usize = 4096;

/// `out` extended by the ids `values` (all checked first); `Ok(true)`.
fn push_checked<T: Copy + TryInto<u32> + Into<i128>, I: Id>(
    values: impl Iterator<Item = T> + Clone,
    out: &mut Vec<I>,
    base: usize,
) -> PyResult<bool> {
    if let Some((i, v)) = kvcoord_core::ids::first_outside_u32(values.clone()) {
        return Err(I::out_of_range(base + i, v));
    }
    out.extend(values.map(|v| I::wrap(v.try_into().unwrap_or(0))));
    Ok(true)
}

/// Append the values of `obj`, a 1-D numpy array of any integer dtype in
/// either byte order, to `out`: `Ok(false)` when `obj` is not such an
/// array. Every value must fit in 32 bits; nothing is appended otherwise.
fn extend_from_int_array<I: Id>(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<I>,
    base: usize,
) -> PyResult<bool> {
    if obj.cast::<PyUntypedArray>().is_err() {
        return Ok(false);
    }
    // A failed `cast` is a cheap dtype check (no Python exception is
    // built), so the common `uint32` array pays one. A small contiguous
    // array is copied (cheaper than numpy's borrow tracking, see
    // numpy's borrow tracking, which registers and releases a borrow in a
    // shared table on every call), a large or strided one read in place.
    macro_rules! each_dtype {
        ($($t:ty),*) => {$(
            if let Ok(typed) = obj.cast::<PyArray1<$t>>() {
                core(kvcoord_core::limits::try_reserve(out, typed.len(), I::WHAT))?;
                if typed.len() <= COPY_MAX_VALUES {
                    if let Ok(values) = typed.to_vec() {
                        return push_checked(values.iter().copied(), out, base);
                    }
                }
                let view = typed.try_readonly()?;
                return push_checked(view.as_array().iter().copied(), out, base);
            }
        )*};
    }
    each_dtype!(u32, i64, i32, u64, u16, i16, u8, i8);
    match native_int_array(obj)? {
        Some(native) => extend_from_int_array(&native, out, base),
        None => Ok(false),
    }
}

/// One block id from a Python object ([`crate::numbers`]' conversion of
/// block ids: an int or anything with `__index__`, not a `bool`, 32-bit;
/// the pool checks the upper bound).
#[inline]
pub(crate) fn block_id_of(item: &Bound<'_, PyAny>) -> PyResult<BlockId> {
    crate::numbers::arg(item, "a block id")
}

/// `arr` converted to its dtype in native byte order, when it is an integer
/// array stored in the other order (`None` otherwise).
fn native_int_array<'py>(arr: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let dtype = arr.getattr(pyo3::intern!(arr.py(), "dtype"))?;
    let kind: String = dtype.getattr(pyo3::intern!(arr.py(), "kind"))?.extract()?;
    let native: bool = dtype
        .getattr(pyo3::intern!(arr.py(), "isnative"))?
        .extract()?;
    if native || !(kind == "i" || kind == "u") {
        return Ok(None);
    }
    let to = dtype.call_method1(pyo3::intern!(arr.py(), "newbyteorder"), ("=",))?;
    arr.call_method1(pyo3::intern!(arr.py(), "astype"), (to,))
        .map(Some)
}

/// Block ids as a fresh `Vec`.
pub(crate) fn block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockId>> {
    let mut v = Vec::new();
    extend_ids(obj, &mut v, 0)?;
    Ok(v)
}

/// Group ids from a sequence of ints.
pub(crate) fn group_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<GroupId>> {
    let not_ids = || {
        type_error(format!(
            "group_ids must be a sequence of group ids, got {}",
            crate::args::type_name(obj)
        ))
    };
    if is_text(obj) || obj.cast::<PyUntypedArray>().is_ok_and(|a| a.ndim() != 1) {
        return Err(not_ids());
    }
    let items = obj.try_iter().map_err(|_| not_ids())?;
    let mut out = Vec::new();
    collect_items(obj, &items, &mut out, "group ids", |_, item| {
        crate::numbers::arg::<GroupId>(item, "group id")
    })?;
    Ok(out)
}

/// One block hash from a bytes-like object (`bytes`, `bytearray`,
/// `memoryview`, a sequence of byte values); a `str` or anything else that
/// is not bytes is a `HashTypeError`.
pub(crate) fn block_hash(obj: &Bound<'_, PyAny>) -> PyResult<BlockHash> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return core(BlockHash::from_slice(b.as_bytes()));
    }
    // A sequence of byte values no longer than a digest can be (a longer
    // sequence is refused as not a hash, never copied).
    let short = obj.len().is_ok_and(|n| n <= 64);
    if short && !obj.is_instance_of::<pyo3::types::PyString>() {
        if let Ok(b) = obj.extract::<Vec<u8>>() {
            return core(BlockHash::from_slice(&b));
        }
    }
    Err(crate::errors::hash_type_error(format!(
        "invalid block hash: must be bytes, got {}",
        crate::args::type_name(obj)
    )))
}

/// Block hashes from a sequence of bytes or a 2-D uint8 numpy array
/// (one row per hash).
pub(crate) fn block_hashes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    if let Ok(arr) = obj.extract::<PyReadonlyArray2<'_, u8>>() {
        let view = arr.as_array();
        let mut out = Vec::new();
        core(kvcoord_core::limits::try_reserve(
            &mut out,
            view.nrows(),
            "block hashes",
        ))?;
        for row in view.rows() {
            let row: Vec<u8> = row.iter().copied().collect();
            out.push(core(BlockHash::from_slice(&row))?);
        }
        return Ok(out);
    }
    if is_text(obj) {
        return Err(crate::errors::hash_type_error(
            "invalid block hash: block_hashes must be a sequence of bytes (one per block), \
             not a single str or bytes object"
                .into(),
        ));
    }
    if obj.cast::<PyUntypedArray>().is_ok() {
        return Err(crate::errors::hash_type_error(
            "invalid block hash: a numpy array of block hashes must be 2-D uint8 \
             (one row per hash)"
                .into(),
        ));
    }
    let items = obj.try_iter().map_err(|_| {
        crate::errors::hash_type_error(format!(
            "invalid block hash: block_hashes must be a sequence of bytes, got {}",
            crate::args::type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    collect_items(obj, &items, &mut out, "block hashes", |_, item| {
        block_hash(item)
    })?;
    Ok(out)
}

/// The values of a 1-D `int64` or `int32` numpy array, copied into a
/// vector reserved fallibly; `None` for anything else.
pub(crate) fn signed_array(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<i64>>> {
    macro_rules! each_dtype {
        ($($t:ty),*) => {$(
            if let Ok(arr) = obj.cast::<PyArray1<$t>>() {
                let view = arr.try_readonly()?;
                let values = view.as_array();
                let got = kvcoord_core::limits::try_collect(
                    values.len(),
                    values.iter().map(|&v| i64::from(v)),
                    "per-request ints",
                );
                return core(got).map(Some);
            }
        )*};
    }
    each_dtype!(i64, i32);
    Ok(None)
}

/// Results of at least this many bytes are probed before Python builds
/// them ([`room_for`]); smaller ones cost no probe.
const PROBE_MIN_BYTES: usize = 1 << 20;

/// Bytes of one Python int in a list: the list's pointer and the int.
const LIST_INT_BYTES: usize = 40;

/// Room for a result of `items` Python objects of `bytes_each` bytes that
/// Python itself allocates (a list, a numpy array's data): reserved and
/// released first, so that a result sized by the caller that cannot fit is
/// `OutOfMemoryError` (nothing changed) where `PyO3` and numpy would panic
/// on the failed allocation.
pub(crate) fn room_for_items(items: usize, bytes_each: usize, what: &'static str) -> PyResult<()> {
    let bytes = items.saturating_mul(bytes_each);
    if bytes < PROBE_MIN_BYTES {
        return Ok(());
    }
    core(kvcoord_core::limits::reserve(what, bytes))
}

/// [`room_for_items`] of a list of `items` ints.
pub(crate) fn room_for(items: usize, what: &'static str) -> PyResult<()> {
    room_for_items(items, LIST_INT_BYTES, what)
}

/// A digest as Python `bytes`.
pub(crate) fn digest<'py>(py: Python<'py>, h: &BlockHash) -> Bound<'py, PyBytes> {
    PyBytes::new(py, h.as_bytes())
}

/// Digests as a new list of `bytes`.
pub(crate) fn digest_list<'py>(
    py: Python<'py>,
    hashes: &[BlockHash],
) -> PyResult<Bound<'py, PyList>> {
    // A pointer and a `bytes` object of up to 32 bytes per digest.
    room_for_items(hashes.len(), 8 + 33 + 32, "a list of block hashes")?;
    PyList::new(py, hashes.iter().map(|h| digest(py, h)))
}

/// Ids as a Python list of ints.
pub(crate) fn id_list<'py>(py: Python<'py>, ids: &[BlockId]) -> PyResult<Bound<'py, PyList>> {
    room_for(ids.len(), "a list of block ids")?;
    PyList::new(py, ids.iter().map(|b| b.0))
}

/// Reusable buffers of a binding object, so that its hot calls allocate
/// nothing on the Rust side.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Block ids going into or coming out of the core.
    pub(crate) ids: Vec<BlockId>,
    /// `ids` as raw `u32`, the source of a numpy copy.
    raw: Vec<u32>,
}

impl Scratch {
    /// `self.ids` as a new `uint32` numpy array. `from_slice` copies into
    /// numpy-owned memory; `from_iter`/`into_pyarray` would allocate a `Vec`
    /// and a capsule object to own it.
    pub(crate) fn ids_array<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        self.raw.clear();
        core(kvcoord_core::limits::try_reserve(
            &mut self.raw,
            self.ids.len(),
            "block ids",
        ))?;
        self.raw.extend(self.ids.iter().map(|b| b.0));
        room_for_items(self.raw.len(), 4, "an array of block ids")?;
        Ok(PyArray1::from_slice(py, &self.raw))
    }
}

/// Pools at least this large are built without the GIL (about a millisecond
/// of work at this size; construction is linear in the number of blocks).
const DETACH_MIN_BLOCKS: usize = 1 << 16;

/// Build a pool-sized structure, releasing the GIL while it is large enough
/// for other Python threads to notice the wait.
pub(crate) fn build_pool_sized<T: Send>(
    py: Python<'_>,
    num_blocks: usize,
    build: impl FnOnce() -> T + Send,
) -> T {
    if num_blocks >= DETACH_MIN_BLOCKS {
        py.detach(build)
    } else {
        build()
    }
}

/// A sequence of flags (each exactly `True` or `False`).
pub(crate) fn flags(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<bool>> {
    let items = obj.try_iter().map_err(|_| {
        type_error(format!(
            "{name} must be a sequence of bools, got {}",
            crate::args::type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    collect_items(obj, &items, &mut out, "flags", |_, item| {
        crate::args::flag(item, name)
    })?;
    Ok(out)
}
