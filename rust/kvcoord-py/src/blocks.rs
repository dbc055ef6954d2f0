//! `kvcoord.KVCacheBlocks`: the manager's result type (block ids per
//! group), built here straight from the core's output buffer. Ids live in
//! one flat `i32` vector with `i64` group offsets; the read-only numpy
//! arrays are made on first access, so a result nobody reads costs no numpy
//! object and a block id never becomes a Python int on the hot path.

use kvcoord_core::{BlockId, KvError, NewBlocks};
use numpy::{PyArray1, PyUntypedArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyInt, PyList, PySlice, PyString, PyTuple};

use crate::convert;
use crate::errors::{err, CoreError};

/// Block ids per KV cache group (see `_core.pyi`). Immutable.
#[pyclass(module = "kvcoord._core", name = "KVCacheBlocks", frozen)]
pub(crate) struct PyKVCacheBlocks {
    /// All groups' ids, group 0 first. Invariant: every value is >= 0.
    flat: Vec<i32>,
    /// `offsets[g]..offsets[g+1]` is group `g`'s range of `flat`.
    /// Invariant: starts at 0, non-decreasing, ends at `flat.len()`.
    offsets: Vec<usize>,
    flat_array: PyOnceLock<Py<PyArray1<i32>>>,
    offsets_array: PyOnceLock<Py<PyArray1<i64>>>,
}

fn id32(b: BlockId) -> PyResult<i32> {
    i32::try_from(b.0).map_err(|_| {
        err(KvError::InvalidBlockId {
            value: Some(i128::from(b.0)),
        })
    })
}

impl PyKVCacheBlocks {
    fn from_parts(flat: Vec<i32>, offsets: Vec<usize>) -> Self {
        debug_assert_eq!(offsets.last().copied(), Some(flat.len()));
        Self {
            flat,
            offsets,
            flat_array: PyOnceLock::new(),
            offsets_array: PyOnceLock::new(),
        }
    }

    /// No block in any of `num_groups` groups.
    pub(crate) fn empty(num_groups: usize) -> Self {
        Self::from_parts(Vec::new(), vec![0; num_groups + 1])
    }

    /// The new blocks of one `allocate_slots` call (validated by the pool).
    pub(crate) fn from_new_blocks(out: &NewBlocks) -> PyResult<Self> {
        Self::from_groups((0..out.num_groups()).map(|g| out.group(g)))
    }

    /// Per-group id lists from the core (validated by the pool).
    pub(crate) fn from_groups<'a>(
        groups: impl ExactSizeIterator<Item = &'a [BlockId]>,
    ) -> PyResult<Self> {
        let mut flat = Vec::new();
        let mut offsets = Vec::with_capacity(groups.len() + 1);
        offsets.push(0);
        for g in groups {
            for &b in g {
                flat.push(id32(b)?);
            }
            offsets.push(flat.len());
        }
        Ok(Self::from_parts(flat, offsets))
    }

    /// Number of groups.
    pub(crate) fn num_groups_usize(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Group `g`'s ids.
    pub(crate) fn group(&self, g: usize) -> &[i32] {
        &self.flat[self.offsets[g]..self.offsets[g + 1]]
    }

    /// Per-group ids into reusable core buffers.
    pub(crate) fn fill_hits(&self, hits: &mut Vec<Vec<BlockId>>) {
        let n = self.num_groups_usize();
        hits.resize_with(n, Vec::new);
        hits.truncate(n);
        for (g, out) in hits.iter_mut().enumerate() {
            out.clear();
            // Non-negative by the type's invariant.
            out.extend(self.group(g).iter().map(|&v| BlockId(v.unsigned_abs())));
        }
    }

    fn flat_array<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyArray1<i32>>> {
        self.flat_array
            .get_or_try_init(py, || readonly(PyArray1::from_slice(py, &self.flat)))
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
    let text =
        |o: &Bound<'_, PyAny>| o.is_instance_of::<PyString>() || o.is_instance_of::<PyBytes>();
    let is_array = |o: &Bound<'_, PyAny>| o.cast::<PyUntypedArray>().is_ok();
    if text(per_group) || is_array(per_group) {
        return Err(PyTypeError::new_err(
            "KVCacheBlocks expects one sequence of block ids per group",
        ));
    }
    let (mut flat, mut offsets, mut ids) = (Vec::new(), vec![0usize], Vec::new());
    for (g, group) in per_group.try_iter()?.enumerate() {
        let group = group?;
        if is_array(&group) && form != Form::Lists {
            ids.clear();
            convert::extract_block_ids(&group, &mut ids)?;
            for &b in &ids {
                flat.push(id32(b)?);
            }
        } else if form == Form::Arrays {
            let got = group.get_type().name()?;
            let msg = format!("group {g}: from_arrays expects numpy arrays, got {got}");
            return Err(PyTypeError::new_err(msg));
        } else if text(&group) {
            let msg = format!("group {g}: block ids must be a sequence of ints, not str/bytes");
            return Err(PyTypeError::new_err(msg));
        } else {
            for item in group.try_iter()? {
                let item = item?;
                if item.is_instance_of::<PyBool>() || !item.is_instance_of::<PyInt>() {
                    let msg = format!("group {g}: block id {} is not an int", item.repr()?);
                    return Err(PyTypeError::new_err(msg));
                }
                let id = convert::block_id_of(&item)?;
                flat.push(id32(id)?);
            }
        }
        offsets.push(flat.len());
    }
    Ok(PyKVCacheBlocks::from_parts(flat, offsets))
}

#[pymethods]
impl PyKVCacheBlocks {
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
        picks: Vec<(Bound<'_, Self>, usize, usize)>,
    ) -> PyResult<Self> {
        let mut flat = Vec::new();
        let mut offsets = vec![0usize];
        for (g, (part, index, keep)) in picks.iter().enumerate() {
            let part = part.get();
            if *index >= part.num_groups_usize() {
                return Err(err(KvError::InvalidArgument {
                    name: "picks",
                    detail: format!(
                        "entry {g}: group {index} of a result with {} groups",
                        part.num_groups_usize()
                    ),
                }));
            }
            let ids = part.group(*index);
            flat.extend_from_slice(&ids[..(*keep).min(ids.len())]);
            offsets.push(flat.len());
        }
        Ok(Self::from_parts(flat, offsets))
    }

    #[classmethod]
    #[pyo3(name = "empty")]
    fn py_empty(_cls: &Bound<'_, pyo3::types::PyType>, num_groups: usize) -> Self {
        Self::empty(num_groups)
    }

    #[getter]
    fn num_groups(&self) -> usize {
        self.num_groups_usize()
    }

    #[getter]
    fn flat<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        self.flat_array(py).cloned()
    }

    #[getter]
    fn offsets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.offsets_array
            .get_or_try_init(py, || {
                let wide = self
                    .offsets
                    .iter()
                    .map(|&o| i64::try_from(o).unwrap_or(i64::MAX));
                readonly(PyArray1::from_iter(py, wide))
            })
            .map(|a| a.bind(py).clone())
    }

    /// One read-only `int32` array per group (views of `flat`).
    fn arrays<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let flat = self.flat_array(py)?;
        let views = (0..self.num_groups_usize())
            .map(|g| {
                let at = |i: usize| isize::try_from(self.offsets[i]).unwrap_or(isize::MAX);
                let s = PySlice::new(py, at(g), at(g + 1), 1);
                flat.get_item(s)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, views)
    }

    /// Fresh lists of ids per group (vLLM's shape; not for hot paths).
    fn get_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let lists = (0..self.num_groups_usize())
            .map(|g| PyList::new(py, self.group(g)))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    fn is_empty(&self) -> bool {
        self.flat.is_empty()
    }

    #[allow(clippy::unnecessary_wraps)] // PyO3's comparison protocol shape
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = other.py();
        match other.cast::<Self>() {
            Ok(o) => {
                let o = o.get();
                Ok(
                    PyBool::new(py, self.offsets == o.offsets && self.flat == o.flat)
                        .to_owned()
                        .into_any()
                        .unbind(),
                )
            }
            Err(_) => Ok(py.NotImplemented()),
        }
    }

    fn __add__(&self, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(o) = other.cast::<Self>() else {
            return Ok(py.NotImplemented());
        };
        let o = o.get();
        if o.num_groups_usize() != self.num_groups_usize() {
            return Err(CoreError(KvError::InvalidArgument {
                name: "KVCacheBlocks",
                detail: format!(
                    "cannot add results of {} and {} groups",
                    self.num_groups_usize(),
                    o.num_groups_usize()
                ),
            })
            .into());
        }
        let mut flat = Vec::with_capacity(self.flat.len() + o.flat.len());
        let mut offsets = vec![0usize];
        for g in 0..self.num_groups_usize() {
            flat.extend_from_slice(self.group(g));
            flat.extend_from_slice(o.group(g));
            offsets.push(flat.len());
        }
        Ok(Py::new(py, Self::from_parts(flat, offsets))?.into_any())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "KVCacheBlocks({})",
            self.get_block_ids(py)?.repr()?
        ))
    }
}
