//! The one place where core errors become Python exceptions.
//!
//! The exception classes are defined in `kvcoord/errors.py` so that each can
//! derive from both `KvCoordError` and the builtin a caller expects
//! (`ValueError`, `KeyError`); `create_exception!` allows only one base.

use kvcoord_core::KvError;
use pyo3::{PyErr, PyResult};

pyo3::import_exception!(kvcoord.errors, OutOfBlocksError);
pyo3::import_exception!(kvcoord.errors, InvalidArgumentError);
pyo3::import_exception!(kvcoord.errors, InvalidBlockIdError);
pyo3::import_exception!(kvcoord.errors, BlockStateError);
pyo3::import_exception!(kvcoord.errors, InvalidHashError);
pyo3::import_exception!(kvcoord.errors, ConfigError);
pyo3::import_exception!(kvcoord.errors, UnknownRequestError);
pyo3::import_exception!(kvcoord.errors, InvariantError);
pyo3::import_exception!(kvcoord.errors, InvalidTokenError);
pyo3::import_exception!(kvcoord.errors, ArgumentTypeError);
pyo3::import_exception!(kvcoord.errors, OutOfMemoryError);
pyo3::import_exception!(kvcoord.errors, ConfigTypeError);
pyo3::import_exception!(kvcoord.errors, HashTypeError);

/// A core error as a Python exception: the one mapping.
#[cold]
pub(crate) fn err(e: KvError) -> PyErr {
    let msg = e.to_string();
    // Exhaustive on purpose: a new core variant must be mapped here.
    match e {
        KvError::OutOfBlocks { .. } => OutOfBlocksError::new_err(msg),
        KvError::BlockOutOfRange { .. } | KvError::InvalidBlockId { .. } => {
            InvalidBlockIdError::new_err(msg)
        }
        KvError::RefCountUnderflow(_)
        | KvError::RefCountOverflow(_)
        | KvError::AlreadyCached(_)
        | KvError::NotHeldByCaller(_) => BlockStateError::new_err(msg),
        KvError::InvalidHashLength(_) | KvError::InvalidHash { .. } => {
            InvalidHashError::new_err(msg)
        }
        KvError::Invariant(_) => InvariantError::new_err(msg),
        KvError::InvalidArgument { .. }
        | KvError::UnknownGroup(_)
        | KvError::Unsupported { .. } => InvalidArgumentError::new_err(msg),
        KvError::RequestWithoutBlocks(_) | KvError::UnknownRequestId(_) => {
            UnknownRequestError::new_err(msg)
        }
        KvError::InvalidTokenId { .. } => InvalidTokenError::new_err(msg),
        KvError::InvalidConfig { .. } => ConfigError::new_err(msg),
        KvError::OutOfMemory { .. } => OutOfMemoryError::new_err(msg),
    }
}

/// Map a core result.
pub(crate) fn core<T>(r: Result<T, KvError>) -> PyResult<T> {
    r.map_err(err)
}

/// An invariant check's result.
pub(crate) fn invariants(r: Result<(), String>) -> PyResult<()> {
    r.map_err(|what| err(KvError::Invariant(what)))
}

/// A binding's error where a core function is generic over its caller's
/// (`E: From<KvError>`); `?` turns it back into the `PyErr` (orphan rule:
/// `PyErr` cannot be `From<KvError>` here).
pub(crate) struct Refused(pub(crate) PyErr);

impl From<KvError> for Refused {
    fn from(e: KvError) -> Self {
        Self(err(e))
    }
}

impl From<Refused> for PyErr {
    fn from(Refused(e): Refused) -> PyErr {
        e
    }
}

// The bindings' own refusals: about a Python object, before the core sees a
// value (a wrong type, an int beyond 64 bits). The message is the caller's;
// the class is chosen here.

/// `ArgumentTypeError` (a `TypeError`): not the type the argument takes.
#[cold]
pub(crate) fn type_error(msg: impl Into<String>) -> PyErr {
    ArgumentTypeError::new_err(msg.into())
}

/// `InvalidArgumentError` (a `ValueError`): an int out of range.
#[cold]
pub(crate) fn value_error(msg: impl Into<String>) -> PyErr {
    InvalidArgumentError::new_err(msg.into())
}

/// `ConfigError` / `ConfigTypeError`: a configuration value refused.
#[cold]
pub(crate) fn config_error(msg: String, is_type: bool) -> PyErr {
    if is_type {
        ConfigTypeError::new_err(msg)
    } else {
        ConfigError::new_err(msg)
    }
}

/// `HashTypeError` (an `InvalidHashError` and a `TypeError`): a block
/// hash that is not bytes.
#[cold]
pub(crate) fn hash_type_error(msg: String) -> PyErr {
    HashTypeError::new_err(msg)
}

/// The errors of Python's protocols (`KVCacheBlocks(...)` type checks,
/// sequence indexing and `index`), as the protocols expect: a wrong type is
/// an `ArgumentTypeError` (a `TypeError`), the others the builtins.
#[cold]
pub(crate) fn protocol_error(kind: Protocol, msg: impl Into<String>) -> PyErr {
    use pyo3::exceptions::{PyIndexError, PyValueError};
    let msg = msg.into();
    match kind {
        Protocol::Type => ArgumentTypeError::new_err(msg),
        Protocol::Index => PyIndexError::new_err(msg),
        Protocol::NotFound => PyValueError::new_err(msg),
    }
}

/// Which builtin error [`protocol_error`] raises.
pub(crate) enum Protocol {
    Type,
    Index,
    NotFound,
}
