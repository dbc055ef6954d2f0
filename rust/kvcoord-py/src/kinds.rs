//! The kind table as Python sees it: `GroupSpec` (a core spec, built by one
//! constructor per kind and answering the kind's facts), `CoordinatorKind`,
//! and the config rules written once in the core (scheduler block size,
//! hash unit, coordinator choice). Conversion only.

use kvcoord_core::{
    coordinator, CoordinatorKind, GroupSpec, HitSearch, KvError, NullEntries, SpecKind,
};
use pyo3::prelude::*;

use crate::errors::CoreError;

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

/// A size from Python: out-of-range values fail with the core's field name.
fn size(value: i64, field: &'static str, positive: bool) -> PyResult<u32> {
    match u32::try_from(value) {
        Ok(v) if v > 0 || !positive => Ok(v),
        _ => Err(CoreError(KvError::InvalidConfig {
            name: field,
            value: value.to_string(),
            rule: if positive {
                "must be a positive int".into()
            } else {
                "must be an int >= 0".into()
            },
        })
        .into()),
    }
}

/// The block size of a `kind` spec, range-checked under its field name.
fn block_size_of(kind: SpecKind, value: i64) -> PyResult<u32> {
    size(value, kind.facts().block_size_field, true)
}

/// The parameter of a `kind` spec, range-checked under its field name.
fn param_of(kind: SpecKind, value: i64) -> PyResult<u32> {
    let (field, positive) = kind.facts().param_field.unwrap_or(("parameter", true));
    size(value, field, positive)
}

/// The core's own rules on a built spec.
fn checked(spec: GroupSpec) -> PyResult<PyGroupSpec> {
    spec.validate().map_err(CoreError)?;
    Ok(PyGroupSpec(spec))
}

#[pymethods]
impl PyGroupSpec {
    #[staticmethod]
    fn full_attention(block_size: i64) -> PyResult<Self> {
        let bs = block_size_of(SpecKind::FullAttention, block_size)?;
        checked(GroupSpec::full_attention(bs))
    }

    #[staticmethod]
    fn sliding_window(block_size: i64, sliding_window: i64) -> PyResult<Self> {
        let kind = SpecKind::SlidingWindow { sliding_window: 1 };
        let (bs, w) = (
            block_size_of(kind, block_size)?,
            param_of(kind, sliding_window)?,
        );
        checked(GroupSpec::sliding_window(bs, w))
    }

    #[staticmethod]
    fn chunked_local(block_size: i64, attention_chunk_size: i64) -> PyResult<Self> {
        let kind = SpecKind::ChunkedLocal {
            attention_chunk_size: 1,
        };
        let (bs, c) = (
            block_size_of(kind, block_size)?,
            param_of(kind, attention_chunk_size)?,
        );
        checked(GroupSpec::chunked_local(bs, c))
    }

    #[staticmethod]
    fn mamba(block_size: i64, num_speculative_blocks: i64) -> PyResult<Self> {
        let kind = SpecKind::Mamba {
            num_speculative_blocks: 0,
        };
        let (bs, n) = (
            block_size_of(kind, block_size)?,
            param_of(kind, num_speculative_blocks)?,
        );
        checked(GroupSpec::mamba(bs, n))
    }

    #[staticmethod]
    fn cross_attention(block_size: i64) -> PyResult<Self> {
        let bs = block_size_of(SpecKind::CrossAttention, block_size)?;
        checked(GroupSpec::cross_attention(bs))
    }

    #[staticmethod]
    fn mla_attention(block_size: i64) -> PyResult<Self> {
        let bs = block_size_of(SpecKind::MlaAttention, block_size)?;
        checked(GroupSpec::mla_attention(bs))
    }

    #[staticmethod]
    fn sliding_window_mla(block_size: i64, sliding_window: i64) -> PyResult<Self> {
        let kind = SpecKind::SlidingWindowMla { sliding_window: 1 };
        let (bs, w) = (
            block_size_of(kind, block_size)?,
            param_of(kind, sliding_window)?,
        );
        checked(GroupSpec::sliding_window_mla(bs, w))
    }

    #[staticmethod]
    fn rswa(block_size: i64, rswa_window: i64) -> PyResult<Self> {
        let kind = SpecKind::Rswa { rswa_window: 1 };
        let (bs, w) = (
            block_size_of(kind, block_size)?,
            param_of(kind, rswa_window)?,
        );
        checked(GroupSpec::rswa(bs, w))
    }

    /// Mamba with `mamba_cache_mode="align"` (prefix caching of states at
    /// block boundaries).
    #[staticmethod]
    #[pyo3(signature = (block_size, num_speculative_blocks, num_prefill_checkpoint_blocks,
                        prefill_checkpoint_alignment))]
    fn mamba_align(
        block_size: i64,
        num_speculative_blocks: i64,
        num_prefill_checkpoint_blocks: i64,
        prefill_checkpoint_alignment: Option<i64>,
    ) -> PyResult<Self> {
        let kind = SpecKind::MambaAlign {
            num_speculative_blocks: 0,
            prefill_checkpoint: false,
            prefill_checkpoint_alignment: None,
        };
        let bs = block_size_of(kind, block_size)?;
        let spec_blocks = param_of(kind, num_speculative_blocks)?;
        let checkpoint = size(
            num_prefill_checkpoint_blocks,
            "MambaSpec.num_prefill_checkpoint_blocks",
            false,
        )? > 0;
        let alignment = prefill_checkpoint_alignment
            .map(|a| size(a, "MambaSpec.prefill_checkpoint_alignment", true))
            .transpose()?;
        let mut spec = GroupSpec::mamba_align(bs, checkpoint, alignment);
        if let SpecKind::MambaAlign {
            num_speculative_blocks,
            ..
        } = &mut spec.kind
        {
            *num_speculative_blocks = spec_blocks;
        }
        checked(spec)
    }

    #[getter]
    fn block_size(&self) -> u32 {
        self.0.block_size
    }

    /// Name of the public spec type.
    #[getter]
    fn spec_name(&self) -> &'static str {
        self.0.facts().spec_name
    }

    #[getter]
    fn prefix_cacheable(&self) -> bool {
        self.0.facts().prefix_cacheable
    }

    /// Whether retention intervals (sparse caching) apply.
    #[getter]
    fn sparse(&self) -> bool {
        self.0.facts().sparse
    }

    /// Whether hits are prefix-closed (full attention): hybrid lookups scan
    /// these first and never again.
    #[getter]
    fn prefix_closed_hits(&self) -> bool {
        matches!(self.0.facts().hit_search, HitSearch::PrefixClosed)
    }

    /// Whether a request's table may hold null entries after real blocks
    /// (R-SWA decode gaps, Mamba "align" skipped states): the kind releases
    /// blocks of a running request, not only when it is freed.
    #[getter]
    fn interior_nulls(&self) -> bool {
        matches!(self.0.facts().nulls, NullEntries::Anywhere)
    }

    fn __repr__(&self) -> String {
        match self.0.param() {
            Some(p) => format!(
                "GroupSpec({}, block_size={}, param={p})",
                self.0.facts().spec_name,
                self.0.block_size
            ),
            None => format!(
                "GroupSpec({}, block_size={})",
                self.0.facts().spec_name,
                self.0.block_size
            ),
        }
    }
}

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

impl From<PyCoordinatorKind> for CoordinatorKind {
    fn from(k: PyCoordinatorKind) -> Self {
        match k {
            PyCoordinatorKind::NoPrefixCache => Self::NoPrefixCache,
            PyCoordinatorKind::Unitary => Self::Unitary,
            PyCoordinatorKind::Hybrid => Self::Hybrid,
        }
    }
}

impl From<CoordinatorKind> for PyCoordinatorKind {
    fn from(k: CoordinatorKind) -> Self {
        match k {
            CoordinatorKind::NoPrefixCache => Self::NoPrefixCache,
            CoordinatorKind::Unitary => Self::Unitary,
            CoordinatorKind::Hybrid => Self::Hybrid,
        }
    }
}

pub(crate) fn specs(groups: &[PyGroupSpec]) -> Vec<GroupSpec> {
    groups.iter().map(|g| g.0).collect()
}

/// vLLM's coordinator choice for `num_groups` groups.
#[pyfunction]
pub(crate) fn choose_coordinator(num_groups: usize, enable_caching: bool) -> PyCoordinatorKind {
    CoordinatorKind::choose(num_groups, enable_caching).into()
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
