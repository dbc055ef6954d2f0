//! The one place where core errors become Python exceptions.
//!
//! The exception classes are defined in `kvcoord/errors.py` so that each can
//! derive from both `KvCoordError` and the builtin a caller expects
//! (`ValueError`, `KeyError`); `create_exception!` allows only one base.

use kvcoord_core::KvError;
use pyo3::PyErr;

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

/// Newtype so `?` can convert a foreign error into `PyErr` (orphan rule).
pub(crate) struct CoreError(pub(crate) KvError);

impl From<KvError> for CoreError {
    fn from(e: KvError) -> Self {
        Self(e)
    }
}

impl From<CoreError> for PyErr {
    fn from(CoreError(e): CoreError) -> PyErr {
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
            KvError::UnknownRequest(_) | KvError::NoSuchRequest(_) => {
                UnknownRequestError::new_err(msg)
            }
            KvError::InvalidTokenId { .. } => InvalidTokenError::new_err(msg),
            KvError::InvalidConfig { .. } => ConfigError::new_err(msg),
            KvError::OutOfMemory { .. } => OutOfMemoryError::new_err(msg),
        }
    }
}

/// Shorthand for binding methods.
pub(crate) type PyResult<T> = Result<T, PyErr>;

/// A core error as a Python exception.
pub(crate) fn err(e: KvError) -> PyErr {
    CoreError(e).into()
}

/// An invariant check's result.
pub(crate) fn invariants(r: Result<(), String>) -> PyResult<()> {
    r.map_err(|what| err(KvError::Invariant(what)))
}

/// Map a core result.
pub(crate) fn core<T>(r: Result<T, KvError>) -> PyResult<T> {
    r.map_err(|e| CoreError(e).into())
}
