//! `kvcoord.KVCacheBlocks`: the manager's result type, the core's
//! [`NewBlocks`] (block ids per group in one flat buffer) as Python sees
//! it. The read-only numpy arrays are made on first access, so a result
//! nobody reads costs no numpy object and a block id never becomes a Python
//! int on the hot path.

use kvcoord_core::NewBlocks;
use numpy::{PyArray1, PyUntypedArray};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PySlice, PyTuple};

use crate::convert;
use crate::errors::{core, protocol_error, Protocol};
use crate::numbers::Blocks;

/// Block ids per KV cache group (see `_core.pyi`). Immutable.
#[pyclass(module = "kvcoord._core", name = "KVCacheBlocks", frozen)]
pub(crate) struct PyKVCacheBlocks {
    /// Invariant: every id fits in `int32` (checked by [`Self::new`]).
    pub(crate) inner: NewBlocks,
    flat_array: PyOnceLock<Py<PyArray1<i32>>>,
    offsets_array: PyOnceLock<Py<PyArray1<i64>>>,
}

impl PyKVCacheBlocks {
    /// A result of the core's ids; refused when an id does not fit in
    /// `int32` (the arrays' dtype).
    pub(crate) fn new(inner: NewBlocks) -> PyResult<Self> {
        Ok(Self {
            inner: core(inner.fitting_i32())?,
            flat_array: PyOnceLock::new(),
            offsets_array: PyOnceLock::new(),
        })
    }

    fn flat_array<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyArray1<i32>>> {
        self.flat_array
            .get_or_try_init(py, || {
                let n = self.inner.flat().len();
                let ids = core(kvcoord_core::limits::try_collect(
                    n,
                    self.inner.flat_i32(),
                    "block ids",
                ))?;
                readonly(PyArray1::from_vec(py, ids))
            })
            .map(|a| a.bind(py))
    }
}

fn readonly<T: numpy::Element>(a: Bound<'_, PyArray1<T>>) -> PyResult<Py<PyArray1<T>>> {
    a.getattr(pyo3::intern!(a.py(), "flags"))?
        .setattr(pyo3::intern!(a.py(), "writeable"), false)?;
    Ok(a.unbind())
}

/// The per-group forms a constructor accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Lists,
    Arrays,
    Either,
}

/// A result from one id sequence (ints, bools refused) or 1-D integer numpy
/// array per group, as `form` allows; every id checked.
fn build(per_group: &Bound<'_, PyAny>, form: Form) -> PyResult<PyKVCacheBlocks> {
    let is_array = |o: &Bound<'_, PyAny>| o.cast::<PyUntypedArray>().is_ok();
    let not_groups = || {
        protocol_error(
            Protocol::Type,
            format!(
                "KVCacheBlocks expects one sequence of block ids per group, got {}",
                crate::args::type_name(per_group)
            ),
        )
    };
    if convert::is_text(per_group) || is_array(per_group) {
        return Err(not_groups());
    }
    let groups = per_group.try_iter().map_err(|_| not_groups())?;
    let (mut out, mut ids) = (NewBlocks::new(), Vec::new());
    for (g, group) in groups.enumerate() {
        let group = group?;
        ids.clear();
        if is_array(&group) && form != Form::Lists {
            convert::extend_ids(&group, &mut ids, 0)?;
        } else if form == Form::Arrays {
            let got = crate::args::type_name(&group);
            let msg = format!("group {g}: from_arrays expects numpy arrays, got {got}");
            return Err(protocol_error(Protocol::Type, msg));
        } else if convert::is_text(&group) || is_array(&group) {
            let got = crate::args::type_name(&group);
            let msg = format!("group {g}: block ids must be a list of ints, got {got}");
            return Err(protocol_error(Protocol::Type, msg));
        } else {
            let items = group.try_iter().map_err(|_| {
                let got = crate::args::type_name(&group);
                let msg = format!("group {g}: block ids must be a sequence of ints, got {got}");
                protocol_error(Protocol::Type, msg)
            })?;
            // An int (numpy integer scalars included), not a bool: the
            // checks every block id passes.
            convert::collect_items(&group, &items, &mut ids, "block ids", |_, item| {
                convert::block_id_of(item)
            })?;
        }
        core(out.try_push_group(&ids))?;
    }
    PyKVCacheBlocks::new(out)
}

pymethods!(PyKVCacheBlocks {
    get num_groups(&self) -> usize = self.inner.num_groups();
    get flat['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> =
        self.flat_array(py).cloned();
    get offsets['py](&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> = self
        .offsets_array
        .get_or_try_init(py, || {
            let wide = self.inner.offsets().map(|o| i64::try_from(o).unwrap_or(i64::MAX));
            let n = self.inner.num_groups() + 1;
            readonly(PyArray1::from_vec(py, core(kvcoord_core::limits::try_collect(n, wide, "offsets"))?))
        })
        .map(|a| a.bind(py).clone());
}
    /// `KVCacheBlocks(per_group)`: one sequence of ints or integer array per
    /// group (validated).
    #[new]
    fn py_new(per_group: &Bound<'_, PyAny>) -> PyResult<Self> {
        build(per_group, Form::Either)
    }

    #[classmethod]
    fn from_lists(
        _cls: &Bound<'_, pyo3::types::PyType>,
        per_group_lists: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        build(per_group_lists, Form::Lists)
    }

    #[classmethod]
    fn from_arrays(
        _cls: &Bound<'_, pyo3::types::PyType>,
        per_group_arrays: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        build(per_group_arrays, Form::Arrays)
    }

    /// Group `g` of the result is group `picks[g][1]` of `picks[g][0]`,
    /// cut to its first `picks[g][2]` blocks: a result assembled from other
    /// results (a hybrid hit from its per-spec lookups) needs no validation.
    #[classmethod]
    fn gather(
        _cls: &Bound<'_, pyo3::types::PyType>,
        picks: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let bad = |what: String| protocol_error(Protocol::Type, what);
        let items = picks.try_iter().map_err(|_| {
            bad(format!(
                "picks must be a sequence of (KVCacheBlocks, group, count) tuples, got {}",
                crate::args::type_name(picks)
            ))
        })?;
        let mut held = Vec::new();
        for (i, pick) in items.enumerate() {
            let pick = pick?;
            let parts = pick
                .cast::<PyTuple>()
                .ok()
                .filter(|t| t.len() == 3)
                .ok_or_else(|| bad(format!("picks[{i}] must be a (KVCacheBlocks, group, count) tuple")))?;
            let blocks = parts.get_item(0)?.cast_into::<Self>().map_err(|_| {
                bad(format!("picks[{i}][0] must be a KVCacheBlocks"))
            })?;
            let group = crate::numbers::arg::<Blocks>(&parts.get_item(1)?, "group")?.0;
            let keep = crate::numbers::arg::<Blocks>(&parts.get_item(2)?, "count")?.0;
            held.push((blocks, group, keep));
        }
        let picks: Vec<_> = held
            .iter()
            .map(|(p, g, k)| (&p.get().inner, *g, *k))
            .collect();
        Self::new(core(NewBlocks::gather(&picks))?)
    }

    #[classmethod]
    #[pyo3(name = "empty")]
    fn py_empty(
        _cls: &Bound<'_, pyo3::types::PyType>,
        num_groups: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        // The core names the bound on groups (2^20).
        let n = crate::numbers::arg::<crate::numbers::U32>(num_groups, "num_groups")?.0 as usize;
        Self::new(core(NewBlocks::try_empty(n))?)
    }

    /// Pickling: the ids per group, rebuilt (and checked) by `from_lists`.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyTuple>,))> {
        let py = slf.py();
        let build = slf.get_type().getattr(pyo3::intern!(py, "from_lists"))?;
        Ok((build, (slf.get().get_block_ids(py)?,)))
    }

    /// One read-only `int32` array per group (views of `flat`).
    fn arrays<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let flat = self.flat_array(py)?;
        let at = |i: usize| isize::try_from(i).unwrap_or(isize::MAX);
        let mut start = 0;
        let views = self.inner.group_ends().iter().map(|&end| {
            let s = PySlice::new(py, at(start), at(end), 1);
            start = end;
            flat.get_item(s)
        });
        PyTuple::new(py, views.collect::<PyResult<Vec<_>>>()?)
    }

    /// Fresh lists of ids per group (vLLM's shape; not for hot paths).
    fn get_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let lists = (0..self.inner.num_groups())
            .map(|g| convert::id_list(py, self.inner.group(g)))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        let py = other.py();
        match other.cast::<Self>() {
            Ok(o) => PyBool::new(py, self.inner == o.get().inner).to_owned().into_any().unbind(),
            Err(_) => py.NotImplemented(),
        }
    }

    fn __add__(&self, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(o) = other.cast::<Self>() else {
            return Ok(py.NotImplemented());
        };
        let sum = core(self.inner.concat(&o.get().inner))?;
        Ok(Py::new(py, Self::new(sum)?)?.into_any())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "KVCacheBlocks({})",
            self.get_block_ids(py)?.repr()?
        ))
    }
);
