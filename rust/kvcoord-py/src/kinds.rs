//! The kind table as Python sees it: `GroupSpec` (a core spec, built by one
//! constructor per kind and answering the kind's facts), `CoordinatorKind`,
//! and the config rules written once in the core (scheduler block size,
//! hash unit, coordinator choice, retention interval). Conversion only.

use kvcoord_core::{coordinator, CoordinatorKind, GroupSpec, HitSearch, NullEntries, SpecKind};
use pyo3::prelude::*;

use crate::errors::core;
use crate::numbers::{config_i64, opt_config_i64, U32};

/// One KV cache group's spec, as the core holds it. Built by the Python spec
/// dataclasses (`FullAttentionSpec(...).core`), one constructor per kind.
#[pyclass(
    module = "kvcoord._core",
    name = "GroupSpec",
    frozen,
    eq,
    hash,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PyGroupSpec(pub(crate) GroupSpec);

/// A core spec of `kind` from Python's sizes (range-checked and validated
/// by the core, under the kind's public field names).
fn spec(kind: SpecKind, block_size: i64, param: Option<i64>) -> PyResult<PyGroupSpec> {
    Ok(PyGroupSpec(core(GroupSpec::from_sizes(
        kind, block_size, param,
    ))?))
}

/// `GroupSpec`'s methods: the getters, then one static constructor per
/// kind, `name(block_size[, param]) = kind` (the kind's parameter is the
/// caller's, range-checked by the core), then the rest.
macro_rules! group_spec_methods {
    ({ $($getters:tt)* } $( $name:ident($($param:ident)?) = $kind:expr; )* { $($rest:tt)* }) => {
        pymethods!(PyGroupSpec { $($getters)* }
            $(
                #[staticmethod]
                fn $name(
                    block_size: &Bound<'_, PyAny>
                    $(, $param: &Bound<'_, PyAny>)?
                ) -> PyResult<Self> {
                    let block_size = config_i64(block_size, "block_size")?;
                    $(let $param = config_i64($param, stringify!($param))?;)?
                    spec($kind, block_size, None $(.or(Some($param)))?)
                }
            )*
            $($rest)*
        );
    };
}

group_spec_methods!({
    get block_size(&self) -> u32 = self.0.block_size;
    /// Name of the public spec type.
    get spec_name(&self) -> &'static str = self.0.facts().spec_name;
    get prefix_cacheable(&self) -> bool = self.0.facts().prefix_cacheable;
    /// Whether retention intervals (sparse caching) apply.
    get sparse(&self) -> bool = self.0.facts().sparse;
    /// Whether hits are prefix-closed (full attention): hybrid lookups scan
    /// these first and never again.
    get prefix_closed_hits(&self) -> bool =
        matches!(self.0.facts().hit_search, HitSearch::PrefixClosed);
    /// Whether a request's table may hold null entries after real blocks
    /// (R-SWA decode gaps, Mamba "align" skipped states): the kind releases
    /// blocks of a running request, not only when it is freed.
    get interior_nulls(&self) -> bool = matches!(self.0.facts().nulls, NullEntries::Anywhere);
}
    full_attention() = SpecKind::FullAttention;
    sliding_window(sliding_window) = SpecKind::SlidingWindow { sliding_window: 0 };
    chunked_local(attention_chunk_size) = SpecKind::ChunkedLocal { attention_chunk_size: 0 };
    mamba(num_speculative_blocks) = SpecKind::Mamba { num_speculative_blocks: 0 };
    cross_attention() = SpecKind::CrossAttention;
    mla_attention() = SpecKind::MlaAttention;
    sliding_window_mla(sliding_window) = SpecKind::SlidingWindowMla { sliding_window: 0 };
    rswa(rswa_window) = SpecKind::Rswa { rswa_window: 0 };
    hisparse_resident() = SpecKind::HiSparseResident;
    hisparse_hot(blocks_per_request) = SpecKind::HiSparseHot { blocks_per_request: 0 };
{
    /// Mamba with `mamba_cache_mode="align"` (prefix caching of states at
    /// block boundaries).
    #[staticmethod]
    #[pyo3(signature = (block_size, num_speculative_blocks, num_prefill_checkpoint_blocks,
                        prefill_checkpoint_alignment))]
    fn mamba_align(
        block_size: &Bound<'_, PyAny>,
        num_speculative_blocks: &Bound<'_, PyAny>,
        num_prefill_checkpoint_blocks: &Bound<'_, PyAny>,
        prefill_checkpoint_alignment: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self(core(GroupSpec::mamba_align_from_sizes(
            config_i64(block_size, "block_size")?,
            config_i64(num_speculative_blocks, "num_speculative_blocks")?,
            config_i64(num_prefill_checkpoint_blocks, "num_prefill_checkpoint_blocks")?,
            opt_config_i64(prefill_checkpoint_alignment, "prefill_checkpoint_alignment")?,
        ))?))
    }

    fn __repr__(&self) -> String {
        let param = self.0.param().map(|p| format!(", param={p}"));
        format!(
            "GroupSpec({}, block_size={}{})",
            self.0.facts().spec_name,
            self.0.block_size,
            param.unwrap_or_default()
        )
    }
});

/// Which coordinator policy serves a configuration (see
/// `kvcoord_core::CoordinatorKind`).
#[pyclass(
    module = "kvcoord._core",
    name = "CoordinatorKind",
    frozen,
    eq,
    hash,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PyCoordinatorKind {
    NoPrefixCache,
    Unitary,
    Hybrid,
}

/// The two spellings of the policies convert both ways, variant by variant.
macro_rules! same_variants {
    ($a:ident, $b:ident: $($v:ident),*) => {
        impl From<$a> for $b {
            fn from(k: $a) -> Self {
                match k { $($a::$v => Self::$v),* }
            }
        }
        impl From<$b> for $a {
            fn from(k: $b) -> Self {
                match k { $($b::$v => Self::$v),* }
            }
        }
    };
}
same_variants!(PyCoordinatorKind, CoordinatorKind: NoPrefixCache, Unitary, Hybrid);

pub(crate) fn specs(groups: &[PyGroupSpec]) -> Vec<GroupSpec> {
    groups.iter().map(|g| g.0).collect()
}

/// vLLM's coordinator choice for `num_groups` groups.
#[pyfunction]
pub(crate) fn choose_coordinator(
    num_groups: &Bound<'_, PyAny>,
    enable_caching: &Bound<'_, PyAny>,
) -> PyResult<PyCoordinatorKind> {
    let num_groups = crate::numbers::arg::<U32>(num_groups, "num_groups")?.0 as usize;
    let enable_caching = crate::args::flag(enable_caching, "enable_caching")?;
    Ok(CoordinatorKind::choose(num_groups, enable_caching).into())
}

/// LCM of the groups' block sizes.
#[pyfunction]
pub(crate) fn scheduler_block_size(groups: Vec<PyGroupSpec>) -> u32 {
    coordinator::scheduler_block_size(&specs(&groups))
}

/// The hash unit requests must be hashed with for these groups.
#[pyfunction]
pub(crate) fn default_hash_block_size(groups: Vec<PyGroupSpec>, enable_caching: bool) -> u32 {
    coordinator::default_hash_block_size(&specs(&groups), enable_caching)
}

/// Check a prefix-cache retention interval; raises `ConfigError` (a
/// `ValueError`) naming the value and the rule it breaks.
#[pyfunction]
#[pyo3(signature = (interval, scheduler_block_size, has_sparse_groups))]
pub(crate) fn validate_retention_interval(
    interval: Option<&Bound<'_, PyAny>>,
    scheduler_block_size: &Bound<'_, PyAny>,
    has_sparse_groups: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let interval = opt_config_i64(interval, "prefix_cache_retention_interval")?;
    let sbs = crate::numbers::config::<U32>(scheduler_block_size, "scheduler_block_size")?.0;
    let sparse = crate::args::flag(has_sparse_groups, "has_sparse_groups")?;
    core(kvcoord_core::validate_retention_interval(
        interval, sbs, sparse,
    ))
}
