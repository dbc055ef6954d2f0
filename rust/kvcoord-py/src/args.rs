//! Type-checked conversion of the other scalar arguments (flags, strings)
//! and the helpers every refusal uses. Every failure is a
//! `kvcoord.errors` exception naming the argument, never a bare
//! `TypeError` from `PyO3`; integers are `crate::numbers`'. String
//! arguments are [`Text`], whose refusal is an `ArgumentTypeError`.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use crate::errors::type_error;

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

/// An optional flag with its default (a `match`, as in
/// [`crate::numbers::opt_arg`]).
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

/// Whether `obj` is a numpy bool scalar (`numpy.bool_`).
fn is_numpy_bool(obj: &Bound<'_, PyAny>) -> bool {
    let ty = obj.get_type();
    let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
    let name = ty.name().map(|n| n.to_string()).unwrap_or_default();
    module == "numpy" && (name == "bool" || name == "bool_")
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
