//! Python bindings of kvcoord: the `kvcoord._core` extension module.
//!
//! Thin by design: each method extracts its arguments, calls
//! `kvcoord_core`, converts the result and maps errors (`errors.rs`). No
//! policy lives here.

// PyO3 extracts arguments by value (`PyRef`, `Vec`) and requires `&self` on
// dunder methods, which these two pedantic lints flag without a fix.
#![allow(clippy::needless_pass_by_value, clippy::unused_self)]

/// `#[pymethods] impl $ty { ... }` whose plain getters are written as a
/// table, one line each: `get name(&self) -> T = expr;` (generic
/// parameters in brackets: `get name['py](&self, py: Python<'py>) -> ...`),
/// then, after a `;`, the type's other methods. One `#[pymethods]` block
/// per class, as `PyO3` requires. The other methods may come in one brace
/// group (the end of a [`pool::pool_writers`] chain).
macro_rules! pymethods {
    ($ty:ty { $($getters:tt)* } { $($rest:tt)* }) => {
        pymethods!($ty { $($getters)* } $($rest)*);
    };
    ($ty:ty {
        $( $(#[$attr:meta])* get $name:ident $([$($gen:tt)*])? ($($args:tt)*) -> $ret:ty = $body:expr; )*
    } $($rest:tt)*) => {
        #[pyo3::pymethods]
        impl $ty {
            $( $(#[$attr])* #[getter] fn $name $(<$($gen)*>)? ($($args)*) -> $ret { $body } )*
            $($rest)*
        }
    };
}

mod args;
mod best_case;
mod blocks;
mod convert;
mod coordinator;
mod decode;
mod errors;
mod events;
mod exclusive;
mod hisparse;
mod kinds;
mod numbers;
mod pool;
mod request;
mod residency;
mod router_index;
mod running_batch;
mod tokens;
mod vllm;

use pyo3::prelude::*;

/// The compiled core of kvcoord.
#[pymodule(gil_used = false)]
#[pyo3(name = "_core")]
mod core_module {
    #[pymodule_export]
    use crate::best_case::{mooncake_prompt_tokens, PyUnboundedPrefixCache};
    #[pymodule_export]
    use crate::blocks::PyKVCacheBlocks;
    #[pymodule_export]
    use crate::coordinator::PyBlockPoolView;
    #[pymodule_export]
    use crate::coordinator::PyCoordinatorCore;
    #[pymodule_export]
    use crate::events::{AllBlocksCleared, BlockRemoved, BlockStored};
    #[pymodule_export]
    use crate::hisparse::PyHiSparsePair;
    #[pymodule_export]
    use crate::kinds::{
        choose_coordinator, default_hash_block_size, scheduler_block_size,
        validate_retention_interval, PyCoordinatorKind, PyGroupSpec,
    };
    #[pymodule_export]
    use crate::numbers::int_arg;
    #[pymodule_export]
    use crate::pool::PyBlockPool;
    #[pymodule_export]
    use crate::request::{
        advance_requests, compute_block_hashes, none_hash, BlockHashes, PyRequest,
    };
    #[pymodule_export]
    use crate::router_index::PyPrefixIndex;
    #[pymodule_export]
    use crate::running_batch::{batch_plan, batch_step};
    #[pymodule_export]
    use crate::vllm::{PyBlockHashGate, PyDecodeFastPath};

    use super::{Bound, PyModule, PyModuleMethods, PyResult};

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        crate::numbers::add_constants(m)?;
        m.add(
            "HASH_ALGOS",
            pyo3::types::PyTuple::new(m.py(), crate::request::hash_algo_names())?,
        )?;
        m.add(
            "EVICTION_POLICIES",
            pyo3::types::PyTuple::new(m.py(), kvcoord_core::EvictionConfig::NAMES)?,
        )?;
        Ok(())
    }
}
