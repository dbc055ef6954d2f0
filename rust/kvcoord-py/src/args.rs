//! Range- and type-checked conversion of scalar arguments (counts, ids,
//! flags). Every failure is a `kvcoord.errors` exception naming the
//! argument: an int out of range is an `InvalidArgumentError` (a
//! `ValueError`), anything that is not an int an `ArgumentTypeError` (also a
//! `TypeError`), never a bare `OverflowError` or `TypeError` from `PyO3`.
//! Numpy integer scalars (anything with `__index__`) are ints. String
//! arguments are [`Text`], whose refusal is an `ArgumentTypeError` too.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use crate::errors::{config_error, type_error, value_error};

/// The value's repr, for messages.
pub(crate) fn shown(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
}

/// The value's type name, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Whether `obj` is an int for Python (an `int` or has `__index__`).
pub(crate) fn is_int_like(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyInt>()
        || obj
            .hasattr(pyo3::intern!(obj.py(), "__index__"))
            .unwrap_or(false)
}

/// `ArgumentTypeError`: `name` must be an int.
#[cold]
pub(crate) fn not_an_int(obj: &Bound<'_, PyAny>, name: &str) -> PyErr {
    type_error(format!("{name} must be an int, got {}", type_name(obj)))
}

/// Why a scalar is refused, before the caller's words for it are chosen: a
/// rule its value breaks, or not an int at all.
enum Refusal {
    Rule(&'static str),
    NotInt,
}

#[inline]
fn to_count(obj: &Bound<'_, PyAny>) -> Result<usize, Refusal> {
    // `i64` first: CPython converts small ints to a signed value on a fast
    // path (unsigned conversion goes through a byte array).
    match obj.extract::<i64>().map(usize::try_from) {
        Ok(Ok(v)) => Ok(v),
        _ => count_beyond_i64(obj),
    }
}

#[cold]
fn count_beyond_i64(obj: &Bound<'_, PyAny>) -> Result<usize, Refusal> {
    match obj.extract::<u64>() {
        Ok(v) => usize::try_from(v).map_err(|_| Refusal::Rule("a 64-bit count")),
        // Only an int out of range overflows; an `__index__` that raises
        // or returns a non-int is not an int, whatever its attributes.
        Err(e) if !e.is_instance_of::<PyOverflowError>(obj.py()) => Err(Refusal::NotInt),
        Err(_) if obj.lt(0).unwrap_or(false) => Err(Refusal::Rule("non-negative")),
        Err(_) => Err(Refusal::Rule("below 2^64")),
    }
}

fn to_u32(obj: &Bound<'_, PyAny>) -> Result<u32, Refusal> {
    u32::try_from(to_count(obj)?).map_err(|_| Refusal::Rule("in [0, 2^32)"))
}

/// An argument's refusal: `InvalidArgumentError` or `ArgumentTypeError`.
#[cold]
fn argument_error(obj: &Bound<'_, PyAny>, name: &str, why: Refusal) -> PyErr {
    match why {
        Refusal::Rule(rule) => {
            value_error(format!("invalid {name}: {} (must be {rule})", shown(obj)))
        }
        Refusal::NotInt => not_an_int(obj, name),
    }
}

/// A configuration value's refusal, in the core's words for configuration
/// (`invalid name=value: rule`): `ConfigError` or `ConfigTypeError`.
#[cold]
fn config_refusal(obj: &Bound<'_, PyAny>, name: &str, why: Refusal) -> PyErr {
    match why {
        Refusal::Rule(rule) => config_error(
            format!("invalid {name}={}: must be {rule}", shown(obj)),
            false,
        ),
        Refusal::NotInt => config_error(
            format!("{name} must be an int, got {}", type_name(obj)),
            true,
        ),
    }
}

/// A non-negative count (`usize`); the core checks its upper limits.
#[inline]
pub(crate) fn count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    // The per-step path: one signed conversion, nothing else inlined.
    match obj.extract::<i64>().map(usize::try_from) {
        Ok(Ok(v)) => Ok(v),
        _ => refused_count(obj, name),
    }
}

#[cold]
#[inline(never)]
fn refused_count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    count_beyond_i64(obj).map_err(|why| argument_error(obj, name, why))
}

/// A non-negative value that fits in `u32`.
pub(crate) fn u32_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    to_u32(obj).map_err(|why| argument_error(obj, name, why))
}

/// A configuration count: like [`count`], but refused as a configuration.
pub(crate) fn config_count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    to_count(obj).map_err(|why| config_refusal(obj, name, why))
}

/// A configuration value that fits in `u32` (see [`config_count`]).
pub(crate) fn config_u32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    to_u32(obj).map_err(|why| config_refusal(obj, name, why))
}

/// A signed configuration value (the core checks its sign and range):
/// `ConfigTypeError` unless an int, `ConfigError` beyond 64 bits.
pub(crate) fn config_i64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !is_int_like(obj) {
        return Err(config_refusal(obj, name, Refusal::NotInt));
    }
    obj.extract::<i64>()
        .map_err(|_| config_refusal(obj, name, Refusal::Rule("a signed 64-bit int")))
}

/// A flag: exactly `True` or `False` (not a truthy string or number).
#[inline]
pub(crate) fn flag(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    match obj.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) if is_numpy_bool(obj) => obj.is_truthy(),
        Err(_) => Err(type_error(format!(
            "{name} must be a bool, got {} {}",
            type_name(obj),
            shown(obj)
        ))),
    }
}

/// An optional count (default 0).
///
/// A `match`, not `map_or(Ok(0), ..)`: that builds the default `PyResult`
/// eagerly and drops it through an out-of-line call, about 30 instructions
/// per omitted argument on the decode path (four per `allocate_slots`).
#[inline]
pub(crate) fn opt_count(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<usize> {
    match obj {
        None => Ok(0),
        Some(o) => count(o, name),
    }
}

/// An optional flag with its default (a `match`, as in [`opt_count`]).
#[inline]
pub(crate) fn opt_flag(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    default: bool,
) -> PyResult<bool> {
    match obj {
        None => Ok(default),
        Some(o) => flag(o, name),
    }
}

/// A sequence of flags (each exactly `True` or `False`).
pub(crate) fn flags(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<bool>> {
    let items = obj.try_iter().map_err(|_| {
        type_error(format!(
            "{name} must be a sequence of bools, got {}",
            type_name(obj)
        ))
    })?;
    items.map(|item| flag(&item?, name)).collect()
}

/// Whether `obj` is a numpy bool scalar (`numpy.bool_`).
fn is_numpy_bool(obj: &Bound<'_, PyAny>) -> bool {
    let ty = obj.get_type();
    let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
    let name = ty.name().map(|n| n.to_string()).unwrap_or_default();
    module == "numpy" && (name == "bool" || name == "bool_")
}

/// The `request` argument: a `kvcoord.Request`, else `ArgumentTypeError`.
pub(crate) fn request<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<PyRef<'py, crate::request::PyRequest>> {
    let req = obj.cast::<crate::request::PyRequest>().map_err(|_| {
        type_error(format!(
            "request must be a kvcoord.Request, got {}",
            type_name(obj)
        ))
    })?;
    Ok(req.try_borrow()?)
}

/// A retention priority (the `priority` eviction policy): a count, with
/// values beyond `i64` left for the core to refuse (it names the range).
pub(crate) fn priority(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    Ok(i64::try_from(count(obj, "priority")?).unwrap_or(i64::MAX))
}

/// A `str` argument. Anything else is an `ArgumentTypeError` (a kvcoord
/// error and a `TypeError`; `PyO3` adds a note naming the argument), where
/// a plain `String` parameter would raise a bare `TypeError`.
pub(crate) struct Text(pub(crate) String);

impl Text {
    /// A default value for a `#[pyo3(signature)]`.
    pub(crate) fn from_static(s: &'static str) -> Self {
        Self(s.to_owned())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// An optional `str` argument as `Option<&str>`.
    pub(crate) fn opt(text: Option<&Self>) -> Option<&str> {
        text.map(Self::as_str)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Text {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        obj.extract::<String>()
            .map(Self)
            .map_err(|_| type_error(format!("expected a str, got {}", type_name(&obj))))
    }
}
