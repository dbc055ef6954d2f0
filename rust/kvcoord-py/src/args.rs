//! Range- and type-checked conversion of scalar arguments (counts, ids,
//! flags). Every failure is a `kvcoord.errors` exception naming the
//! argument: an int out of range is an `InvalidArgumentError` (a
//! `ValueError`), anything that is not an int an `ArgumentTypeError` (also a
//! `TypeError`), never a bare `OverflowError` or `TypeError` from `PyO3`.
//! Numpy integer scalars (anything with `__index__`) are ints. String
//! arguments are [`Text`], whose refusal is an `ArgumentTypeError` too.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
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

/// Why `obj` did not convert to a machine integer, given the error of
/// that conversion (which ran the object's `__index__`, if any).
pub(crate) enum NotMachineInt<'py> {
    /// An int (or an object whose `__index__` gives one) out of the
    /// conversion's range: its value.
    OutOfRange(Bound<'py, PyInt>),
    /// Not an int: no `__index__`, a `bool`, an array of more than one
    /// value, an `__index__` that returns something else.
    NotInt,
    /// An exception the caller's own code raised (an `__index__` that
    /// raises, or calls back into a kvcoord object): passed on as is, as
    /// Python's own conversions do.
    Raised(PyErr),
}

/// The value of an int-like `obj` (`operator.index(obj)`), `None` when it
/// has none. Cold: only refusals ask.
#[cold]
pub(crate) fn index_value<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyInt>> {
    if obj.is_instance_of::<PyBool>() {
        return None;
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return Some(i.clone());
    }
    let index = obj.py().import("operator").ok()?.getattr("index").ok()?;
    index.call1((obj,)).ok()?.cast_into::<PyInt>().ok()
}

/// Why `obj` failed a conversion to a machine integer with `error`: an
/// overflow is an int out of range, a `TypeError` not an int, anything
/// else the caller's own exception.
#[cold]
pub(crate) fn why_not_machine_int<'py>(
    obj: &Bound<'py, PyAny>,
    error: PyErr,
) -> NotMachineInt<'py> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() || error.is_instance_of::<PyTypeError>(py) {
        return NotMachineInt::NotInt;
    }
    if !error.is_instance_of::<PyOverflowError>(py) {
        return NotMachineInt::Raised(error);
    }
    index_value(obj).map_or(NotMachineInt::NotInt, NotMachineInt::OutOfRange)
}

/// Whether an int-like value is negative (`false` when it cannot tell).
pub(crate) fn is_negative(value: &Bound<'_, PyInt>) -> bool {
    value.lt(0).unwrap_or(false)
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
    Raised(PyErr),
}

#[inline]
fn to_count(obj: &Bound<'_, PyAny>) -> Result<usize, Refusal> {
    // `i64` first: CPython converts small ints to a signed value on a fast
    // path (unsigned conversion goes through a byte array).
    match obj.extract::<i64>().map(usize::try_from) {
        Ok(Ok(v)) if !obj.is_instance_of::<PyBool>() => Ok(v),
        _ => count_beyond_i64(obj),
    }
}

/// A `bool` is not a count (`True` is an int for Python, but passing it
/// where a count or an id goes is a mistake, as `KVCacheBlocks` says).
#[cold]
fn count_beyond_i64(obj: &Bound<'_, PyAny>) -> Result<usize, Refusal> {
    if obj.is_instance_of::<PyBool>() {
        return Err(Refusal::NotInt);
    }
    match obj.extract::<u64>() {
        Ok(v) => usize::try_from(v).map_err(|_| Refusal::Rule("a 64-bit count")),
        Err(e) => match why_not_machine_int(obj, e) {
            NotMachineInt::OutOfRange(v) if is_negative(&v) => Err(Refusal::Rule("non-negative")),
            NotMachineInt::OutOfRange(_) => Err(Refusal::Rule("below 2^64")),
            NotMachineInt::NotInt => Err(Refusal::NotInt),
            NotMachineInt::Raised(e) => Err(Refusal::Raised(e)),
        },
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
        Refusal::Raised(e) => e,
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
        Refusal::Raised(e) => e,
    }
}

/// A non-negative count (`usize`); the core checks its upper limits.
#[inline]
pub(crate) fn count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    // The per-step path: one signed conversion, nothing else inlined.
    match obj.extract::<i64>().map(usize::try_from) {
        Ok(Ok(v)) if !obj.is_instance_of::<PyBool>() => Ok(v),
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
    if obj.is_instance_of::<PyBool>() {
        return Err(config_refusal(obj, name, Refusal::NotInt));
    }
    obj.extract::<i64>().map_err(|e| {
        let why = match why_not_machine_int(obj, e) {
            NotMachineInt::OutOfRange(_) => Refusal::Rule("a signed 64-bit int"),
            NotMachineInt::NotInt => Refusal::NotInt,
            NotMachineInt::Raised(e) => Refusal::Raised(e),
        };
        config_refusal(obj, name, why)
    })
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
    let mut out = Vec::new();
    crate::convert::collect_items(obj, &items, &mut out, "flags", |_, item| flag(item, name))?;
    Ok(out)
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
