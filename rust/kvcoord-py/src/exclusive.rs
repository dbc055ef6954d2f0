//! One call at a time into a mutable core object, waiting instead of failing.
//!
//! The borrow flag `PyO3` keeps on each `#[pyclass]` makes a second call fail at once
//! with `RuntimeError("Already borrowed")`. Under the GIL that still happens
//! across threads: a call that allocates a Python object can start a garbage
//! collection, whose callbacks and finalizers are Python code, and the
//! interpreter may switch threads there. On free-threaded Python it is the
//! normal case. So the mutable classes (`CoordinatorCore`, `BlockPool`) are
//! frozen and keep their state in an [`Exclusive`]: a call from another
//! thread waits, without the GIL, until the running call returns; a call
//! re-entering its own object on the same thread (say, from a generator
//! passed as an argument) is refused with `RuntimeError` and changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// `T` behind a lock that knows which thread holds it.
pub(crate) struct Exclusive<T> {
    state: Mutex<T>,
    /// [`thread_token`] of the thread inside a call, 0 when none.
    holder: AtomicUsize,
}

/// The state of an [`Exclusive`] for the length of one call.
pub(crate) struct Entered<'a, T> {
    // Field order matters: `holder` is cleared (in `drop`) before the guard
    // releases the lock, so a waiter never sees a stale holder.
    guard: MutexGuard<'a, T>,
    holder: &'a AtomicUsize,
}

/// A number that tells the calling thread apart from every other live one:
/// the address of a per-thread byte (never 0).
#[inline]
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| std::ptr::from_ref(t) as usize)
}

impl<T: Send> Exclusive<T> {
    pub(crate) fn new(state: T) -> Self {
        Self {
            state: Mutex::new(state),
            holder: AtomicUsize::new(0),
        }
    }

    /// Enter a call: the state, once no other call holds it.
    #[inline]
    pub(crate) fn enter(&self, py: Python<'_>) -> PyResult<Entered<'_, T>> {
        let me = thread_token();
        let guard = loop {
            match self.state.try_lock() {
                Ok(guard) => break guard,
                Err(TryLockError::WouldBlock) => {
                    if self.holder.load(Ordering::Relaxed) == me {
                        return Err(PyRuntimeError::new_err(
                            "re-entrant call: this kvcoord object is already running a call \
                             on this thread (an argument ran Python code that called it again); \
                             nothing was changed",
                        ));
                    }
                    // Wait for the holder without the GIL (it may need the
                    // GIL to finish), then try again with it.
                    py.detach(|| drop(self.state.lock()));
                }
                // Only a panic inside a call poisons the lock, and no panic
                // is let through a call (the bindings return errors).
                Err(TryLockError::Poisoned(_)) => {
                    return Err(PyRuntimeError::new_err(
                        "this kvcoord object is unusable: an earlier call panicked inside it",
                    ));
                }
            }
        };
        self.holder.store(me, Ordering::Relaxed);
        Ok(Entered {
            guard,
            holder: &self.holder,
        })
    }
}

impl<T> Drop for Entered<'_, T> {
    fn drop(&mut self) {
        self.holder.store(0, Ordering::Relaxed);
    }
}

impl<T> std::ops::Deref for Entered<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for Entered<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}
