//! The one conversion of every integer argument into the core: each is of
//! one [`Number`] kind (a token count, a block count, a block id, ...),
//! whose range is the core's (`kvcoord_core::limits`, README "Bad input and
//! limits"). Anything outside it is a `kvcoord.errors` exception naming the
//! argument: a negative int, one past the kind's bound or beyond 64 bits is
//! an `InvalidArgumentError` (`InvalidBlockIdError` for block ids,
//! `ConfigError` for configuration values), something that is not an int an
//! `ArgumentTypeError` (`ConfigTypeError`); never `OverflowError`. Numpy
//! integer scalars (anything with `__index__`) are ints, `bool`s are not.
//!
//! Each kind is a type ([`Tokens`], [`Blocks`], [`U32`], [`U64`], the
//! core's `BlockId` and `GroupId`) converted by [`arg`] or [`config`]: a
//! binding names the kind, never a range. The Python facades convert their
//! own integer arguments with the same code ([`int_arg`]).

use kvcoord_core::limits::{Number, MAX_TOKENS};
use kvcoord_core::{BlockId, GroupId, KvError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use crate::args::{is_negative, not_an_int, shown, type_name, why_not_machine_int, NotMachineInt};
use crate::errors::{config_error, err, value_error};

/// An integer kind: its [`Number`] and how a checked value becomes it.
pub(crate) trait Kind: Sized {
    /// The range.
    const NUMBER: Number;
    /// The value, known to be at most `NUMBER.max()`.
    fn checked(value: u64) -> Self;

    /// The refusal of argument `name`, an int out of range (`shown` as the
    /// caller wrote it, `value` when it fits in 128 bits).
    #[cold]
    fn out_of_range(name: &str, shown: &str, _value: Option<i128>, negative: bool) -> PyErr {
        value_error(format!(
            "invalid {name}: {}",
            Self::NUMBER.refusal(shown, negative)
        ))
    }
}

/// A token count or token position ([`Number::Tokens`], below 2^48).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tokens(pub(crate) usize);

/// A count of blocks, or a position in a block table or a request's hashes
/// ([`Number::Blocks`], below 2^32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocks(pub(crate) usize);

/// A 32-bit value whose finer rule is the core's ([`Number::U32`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct U32(pub(crate) u32);

/// A 64-bit value whose finer rule is the core's ([`Number::U64`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct U64(pub(crate) u64);

// `checked` narrows a value at most `NUMBER.max()`: the casts are lossless
// (usize is 64 bits, asserted in `kvcoord_core::limits`).
impl Kind for Tokens {
    const NUMBER: Number = Number::Tokens;
    fn checked(value: u64) -> Self {
        Self(value as usize)
    }
}

impl Kind for Blocks {
    const NUMBER: Number = Number::Blocks;
    fn checked(value: u64) -> Self {
        Self(value as usize)
    }
}

impl Kind for U32 {
    const NUMBER: Number = Number::U32;
    fn checked(value: u64) -> Self {
        Self(value as u32)
    }
}

impl Kind for U64 {
    const NUMBER: Number = Number::U64;
    fn checked(value: u64) -> Self {
        Self(value)
    }
}

impl Kind for GroupId {
    const NUMBER: Number = Number::GroupId;
    fn checked(value: u64) -> Self {
        Self(value as u32)
    }
}

impl Kind for BlockId {
    const NUMBER: Number = Number::BlockId;
    fn checked(value: u64) -> Self {
        Self(value as u32)
    }

    /// A block id out of range is the core's `InvalidBlockId`.
    #[cold]
    fn out_of_range(_: &str, _: &str, value: Option<i128>, _: bool) -> PyErr {
        err(KvError::InvalidBlockId { value })
    }
}

/// Why an object is not an int of a kind.
enum Refusal {
    /// An int out of range: as shown, its value when it fits in 128 bits.
    OutOfRange {
        shown: String,
        value: Option<i128>,
        negative: bool,
    },
    /// Not an int (a `bool`, no `__index__`).
    NotInt,
    /// The caller's own exception (an `__index__` that raised), as is.
    Raised(PyErr),
}

/// `obj` as an int in `[0, max]`. One signed conversion on the common path
/// (`CPython` converts small ints to a signed value without a detour).
#[inline]
fn convert(obj: &Bound<'_, PyAny>, max: u64) -> Result<u64, Refusal> {
    match obj.extract::<i64>() {
        Ok(v) if v >= 0 && v.unsigned_abs() <= max && !obj.is_instance_of::<PyBool>() => {
            Ok(v.unsigned_abs())
        }
        _ => convert_slow(obj, max),
    }
}

/// [`convert`] past its fast path: a `bool`, a negative int, one beyond
/// `i64` or `max`, or not an int.
#[cold]
#[inline(never)]
fn convert_slow(obj: &Bound<'_, PyAny>, max: u64) -> Result<u64, Refusal> {
    if obj.is_instance_of::<PyBool>() {
        return Err(Refusal::NotInt);
    }
    let out_of_range = |v: &Bound<'_, PyInt>| Refusal::OutOfRange {
        shown: shown(v),
        value: v.extract::<i128>().ok(),
        negative: is_negative(v),
    };
    match obj.extract::<u64>() {
        Ok(v) if v <= max => Ok(v),
        Ok(v) => Err(Refusal::OutOfRange {
            shown: v.to_string(),
            value: Some(v.into()),
            negative: false,
        }),
        Err(e) => Err(match why_not_machine_int(obj, e) {
            NotMachineInt::OutOfRange(v) => out_of_range(&v),
            NotMachineInt::NotInt => Refusal::NotInt,
            NotMachineInt::Raised(e) => Refusal::Raised(e),
        }),
    }
}

/// Argument `name` as an int of kind `K`.
#[inline]
pub(crate) fn arg<K: Kind>(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<K> {
    match convert(obj, K::NUMBER.max()) {
        Ok(v) => Ok(K::checked(v)),
        Err(why) => Err(argument_refusal::<K>(obj, name, why)),
    }
}

#[cold]
fn argument_refusal<K: Kind>(obj: &Bound<'_, PyAny>, name: &str, why: Refusal) -> PyErr {
    match why {
        Refusal::OutOfRange {
            shown,
            value,
            negative,
        } => K::out_of_range(name, &shown, value, negative),
        Refusal::NotInt => not_an_int(obj, name),
        Refusal::Raised(e) => e,
    }
}

/// An optional argument of kind `K`, `default` when omitted.
///
/// A `match`, not `map_or`: that builds the default `PyResult` eagerly and
/// drops it through an out-of-line call, about 30 instructions per omitted
/// argument on the decode path (four per `allocate_slots`).
#[inline]
pub(crate) fn opt_arg<K: Kind>(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    default: K,
) -> PyResult<K> {
    match obj {
        None => Ok(default),
        Some(o) => arg(o, name),
    }
}

/// An argument of kind `K` that may be omitted or `None`.
pub(crate) fn maybe<K: Kind>(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<K>> {
    obj.filter(|o| !o.is_none())
        .map(|o| arg(o, name))
        .transpose()
}

/// Configuration value `name` as an int of kind `K`, refused in the core's
/// words for configuration (`invalid name=value: must be ...`):
/// `ConfigError`, or `ConfigTypeError` when not an int.
pub(crate) fn config<K: Kind>(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<K> {
    convert(obj, K::NUMBER.max())
        .map(K::checked)
        .map_err(|why| config_refusal(obj, name, K::NUMBER.bound(), why))
}

#[cold]
fn config_refusal(obj: &Bound<'_, PyAny>, name: &str, bound: &str, why: Refusal) -> PyErr {
    match why {
        Refusal::OutOfRange {
            shown, negative, ..
        } => {
            let rule = if negative { "non-negative" } else { bound };
            config_error(format!("invalid {name}={shown}: must be {rule}"), false)
        }
        Refusal::NotInt => config_error(
            format!("{name} must be an int, got {}", type_name(obj)),
            true,
        ),
        Refusal::Raised(e) => e,
    }
}

/// A signed configuration value (the core checks its sign and range):
/// `ConfigTypeError` unless an int, `ConfigError` beyond 64 bits.
pub(crate) fn config_i64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(config_refusal(obj, name, "", Refusal::NotInt));
    }
    obj.extract::<i64>()
        .map_err(|e| match why_not_machine_int(obj, e) {
            NotMachineInt::OutOfRange(v) => config_error(
                format!("invalid {name}={}: must be a signed 64-bit int", shown(&v)),
                false,
            ),
            NotMachineInt::NotInt => config_refusal(obj, name, "", Refusal::NotInt),
            NotMachineInt::Raised(e) => e,
        })
}

/// An optional signed configuration value (`None` stands for none).
pub(crate) fn opt_config_i64(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<i64>> {
    obj.filter(|o| !o.is_none())
        .map(|o| config_i64(o, name))
        .transpose()
}

/// The conversion of a Python facade's own integer argument: `value` as an
/// int of the kind named `kind` (a [`Number`]'s name, `"tokens"` by
/// default, or `"i64"`: a signed 64-bit value, configuration only),
/// refused as `name`; with `config`, in the words of a configuration value.
#[pyfunction]
#[pyo3(signature = (value, name, kind = None, *, config = false))]
pub(crate) fn int_arg(
    value: &Bound<'_, PyAny>,
    name: crate::args::Text,
    kind: Option<crate::args::Text>,
    config: bool,
) -> PyResult<i128> {
    let kind = kind.as_ref().map_or("tokens", crate::args::Text::as_str);
    let name = name.as_str();
    if kind == "i64" && config {
        return config_i64(value, name).map(i128::from);
    }
    let number = Number::from_name(kind).ok_or_else(|| {
        value_error(format!(
            "invalid kind: {kind:?} (must be one of {:?}, or \"i64\" with config=True)",
            Number::ALL.map(Number::name)
        ))
    })?;
    Ok(match number {
        Number::Tokens => pick::<Tokens>(value, name, config)?.0 as i128,
        Number::Blocks => pick::<Blocks>(value, name, config)?.0 as i128,
        Number::BlockId => pick::<BlockId>(value, name, config)?.0.into(),
        Number::GroupId => pick::<GroupId>(value, name, config)?.0.into(),
        Number::U32 => pick::<U32>(value, name, config)?.0.into(),
        Number::U64 => pick::<U64>(value, name, config)?.0.into(),
    })
}

fn pick<K: Kind>(value: &Bound<'_, PyAny>, name: &str, as_config: bool) -> PyResult<K> {
    if as_config {
        config(value, name)
    } else {
        arg(value, name)
    }
}

/// Each kind's range as Python sees it: `{name: largest value}` (the
/// `NUMBER_MAX` of `kvcoord._core`), and the token bound on its own.
pub(crate) fn add_constants(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let ranges = pyo3::types::PyDict::new(m.py());
    for k in Number::ALL {
        ranges.set_item(k.name(), k.max())?;
    }
    m.add("NUMBER_MAX", ranges)?;
    m.add("MAX_TOKENS", MAX_TOKENS)?;
    Ok(())
}
