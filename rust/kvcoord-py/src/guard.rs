//! Borrowing a binding object that another thread may be using.
//!
//! A call holds its object's borrow for the call's duration. With the GIL,
//! another thread can run only where the holder runs Python code or
//! releases the GIL; on free-threaded Python, anywhere. Instead of failing
//! with PyO3's bare `RuntimeError: Already borrowed`, these helpers wait
//! (with the GIL released, so the holder can finish) and give up after
//! [`WAIT`] with a `ConcurrentUseError`, nothing changed: concurrent calls
//! are serialised, and a call that re-enters its own object from inside
//! (a generator passed as an argument that calls the manager) is refused.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::PyClass;

use crate::errors::ConcurrentUseError;

/// Longest wait for another call on the same object to finish.
const WAIT: Duration = Duration::from_secs(2);

/// `obj` borrowed mutably, waiting while another thread holds it.
#[inline]
pub(crate) fn borrow_mut<'py, T: PyClass<Frozen = pyo3::pyclass::boolean_struct::False>>(
    obj: &Bound<'py, T>,
) -> PyResult<PyRefMut<'py, T>> {
    match obj.try_borrow_mut() {
        Ok(r) => Ok(r),
        Err(_) => wait(obj.py(), || obj.try_borrow_mut().ok()),
    }
}

/// `obj` borrowed shared, waiting while another thread holds it mutably.
#[inline]
pub(crate) fn borrow<'py, T: PyClass>(obj: &Bound<'py, T>) -> PyResult<PyRef<'py, T>> {
    match obj.try_borrow() {
        Ok(r) => Ok(r),
        Err(_) => wait(obj.py(), || obj.try_borrow().ok()),
    }
}

#[cold]
fn wait<R>(py: Python<'_>, mut attempt: impl FnMut() -> Option<R>) -> PyResult<R> {
    let start = Instant::now();
    loop {
        py.detach(|| std::thread::sleep(Duration::from_micros(20)));
        if let Some(r) = attempt() {
            return Ok(r);
        }
        if start.elapsed() > WAIT {
            return Err(ConcurrentUseError::new_err(
                "the KV cache manager (or pool) is in use by another call that did not finish \
                 within 2 s (a call re-entering it from inside itself?); nothing was changed",
            ));
        }
    }
}
