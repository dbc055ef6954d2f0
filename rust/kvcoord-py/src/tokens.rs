//! Conversion of token ids and of a request's hashing extras (`LoRA`,
//! multimodal items) from Python: token ids are one kind of id for
//! `convert::extend_ids` (plain ints on a tight fast path, anything else
//! through the checked conversion), plus `advance_requests`' per-request
//! ints. Every refusal is a `kvcoord.errors` exception.

use kvcoord_core::hashing;
use kvcoord_core::limits::Number;
use kvcoord_core::{KvError, LoraKey, MmFeature};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

use crate::args::NotMachineInt;

use crate::errors::{core, err, type_error, value_error};

fn invalid_token(position: usize, value: &Bound<'_, PyInt>) -> PyErr {
    // Beyond i128 the value is shown saturated; the position is exact.
    let value = value.extract::<i128>().unwrap_or_else(|_| {
        if crate::args::is_negative(value) {
            i128::MIN
        } else {
            i128::MAX
        }
    });
    err(KvError::InvalidTokenId { position, value })
}

/// `ArgumentTypeError`: the token at `position` is not an int.
#[cold]
fn not_a_token(position: usize, item: &Bound<'_, PyAny>) -> PyErr {
    type_error(format!(
        "token id at position {position} must be an int, got {}",
        crate::args::type_name(item)
    ))
}

/// One token from a Python object at `position` (an int or anything with
/// `__index__`; a `bool` is the int it is, as `tests/test_token_lists.py`
/// documents).
#[inline]
pub(crate) fn token(position: usize, item: &Bound<'_, PyAny>) -> PyResult<u32> {
    match item.extract::<i64>() {
        Ok(v) => core(hashing::token_id(position, v)),
        Err(e) => Err(refused_token(position, item, e)),
    }
}

/// Too large for i64 but still an int: a token error, not `OverflowError`;
/// not an int: `ArgumentTypeError`; the caller's own exception as is.
#[cold]
fn refused_token(position: usize, item: &Bound<'_, PyAny>, e: PyErr) -> PyErr {
    match crate::args::why_not_machine_int(item, e) {
        NotMachineInt::OutOfRange(v) => invalid_token(position, &v),
        NotMachineInt::NotInt => not_a_token(position, item),
        NotMachineInt::Raised(e) => e,
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

/// Token ids are the `u32`s of [`crate::convert::extend_ids`].
impl crate::convert::Id for u32 {
    const WHAT: &'static str = "token ids";
    const EXPECTED: &'static str = "an int, a sequence of ints or an integer numpy array";
    const OTHER_ARRAYS: Option<&'static str> = None;

    fn wrap(v: u32) -> Self {
        v
    }

    /// A tight path for plain ints, the checked conversion (and its error)
    /// for anything else.
    #[inline]
    fn item(position: usize, item: &Bound<'_, PyAny>) -> PyResult<Self> {
        plain_token(item).map_or_else(|| token(position, item), Ok)
    }

    fn out_of_range(position: usize, value: i128) -> PyErr {
        err(KvError::InvalidTokenId { position, value })
    }
}

/// One per-request int of `advance_requests` (`what` names the argument;
/// `tokens`: a value beyond 64 bits is an invalid token id at `position`,
/// otherwise a count out of the token range).
#[inline]
fn step_int(item: &Bound<'_, PyAny>, what: &str, tokens: bool, position: usize) -> PyResult<i64> {
    let e = match item.extract::<i64>() {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    match crate::args::why_not_machine_int(item, e) {
        NotMachineInt::OutOfRange(v) if tokens => Err(invalid_token(position, &v)),
        NotMachineInt::OutOfRange(v) => Err(value_error(format!(
            "invalid {what}[{position}]: {}",
            Number::Tokens.refusal(&crate::args::shown(&v), crate::args::is_negative(&v))
        ))),
        NotMachineInt::NotInt => Err(crate::args::not_an_int(
            item,
            &format!("{what}[{position}]"),
        )),
        NotMachineInt::Raised(e) => Err(e),
    }
}

/// The per-request ints of `advance_requests`: a list (the usual case) item
/// by item with no generic sequence protocol, an `int64`/`int32` numpy array
/// copied out, any other sequence item by item; every buffer reserved
/// fallibly (the lists are the caller's).
pub(crate) fn step_ints(obj: &Bound<'_, PyAny>, what: &str, tokens: bool) -> PyResult<Vec<i64>> {
    let mut out = Vec::new();
    if let Ok(list) = obj.cast::<PyList>() {
        core(kvcoord_core::limits::try_reserve(
            &mut out,
            list.len(),
            "per-request ints",
        ))?;
        for (i, item) in list.iter().enumerate() {
            out.push(step_int(&item, what, tokens, i)?);
        }
        return Ok(out);
    }
    if let Some(values) = crate::convert::signed_array(obj)? {
        return Ok(values);
    }
    let not_ints = || {
        type_error(format!(
            "{what} must be a sequence of ints or an integer numpy array, got {}",
            crate::args::type_name(obj)
        ))
    };
    if crate::convert::is_text(obj) {
        return Err(not_ints());
    }
    let items = obj.try_iter().map_err(|_| not_ints())?;
    crate::convert::collect_items(obj, &items, &mut out, "per-request ints", |i, item| {
        step_int(item, what, tokens, i)
    })?;
    Ok(out)
}

fn str_field(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        let got = crate::args::type_name(obj);
        type_error(format!("{what} must be a str, got {got}"))
    })
}

/// The `N` parts of an extra hash key: a tuple of `N` items, or an object
/// with the attributes `names` (such as `kvcoord.LoRA`); `what` names the
/// argument in refusals.
fn parts<'py, const N: usize>(
    obj: &Bound<'py, PyAny>,
    names: [&str; N],
    what: &str,
) -> PyResult<[Bound<'py, PyAny>; N]> {
    let shape = names.join(", ");
    let got: Vec<_> = if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else if names.iter().all(|n| obj.hasattr(*n).unwrap_or(false)) {
        names
            .iter()
            .map(|n| obj.getattr(*n))
            .collect::<PyResult<_>>()?
    } else {
        let msg = format!("{what} must be a ({shape}) tuple or an object with those attributes");
        return Err(type_error(msg));
    };
    let n = got.len();
    got.try_into().map_err(|_| {
        type_error(format!(
            "{what} must be ({shape}), got a tuple of {n} items"
        ))
    })
}

/// `lora`: `None`, a `(name, path)` tuple, or an object with `name` and
/// `path` attributes (such as `kvcoord.LoRA`).
pub(crate) fn lora_key(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<LoraKey>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let [name, path] = parts(obj, ["name", "path"], "lora")?;
    Ok(Some(LoraKey {
        name: str_field(&name, "lora name")?,
        path: str_field(&path, "lora path")?,
    }))
}

/// `mm_features`: `None` or an iterable of `(identifier, offset, length)`
/// tuples or objects with those attributes (such as
/// `kvcoord.MultiModalFeature`).
pub(crate) fn mm_features(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<MmFeature>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let item = |item: PyResult<Bound<'_, PyAny>>| {
        let names = ["identifier", "offset", "length"];
        let [id, offset, length] = parts(&item?, names, "each mm_features item")?;
        let id = str_field(&id, "mm_features identifier")?;
        core(hashing::mm_feature(
            id,
            mm_int(&offset, "offset")?,
            mm_int(&length, "length")?,
        ))
    };
    let items = obj.try_iter().map_err(|_| {
        let got = crate::args::type_name(obj);
        type_error(format!(
            "mm_features must be an iterable of (identifier, offset, length), got {got}"
        ))
    })?;
    items.map(item).collect()
}

/// A multimodal item's offset or length: an int (range-checked by the core).
fn mm_int(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    let e = match obj.extract::<i64>() {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    Err(match crate::args::why_not_machine_int(obj, e) {
        NotMachineInt::OutOfRange(v) => value_error(format!(
            "invalid mm_features: {what} {} is not in [0, 2^32)",
            crate::args::shown(&v)
        )),
        NotMachineInt::NotInt => crate::args::not_an_int(obj, &format!("mm_features {what}")),
        NotMachineInt::Raised(e) => e,
    })
}
