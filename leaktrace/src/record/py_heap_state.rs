//! What `--python-heap` keeps per traced process ([`super::pyheap`] takes the censuses): a
//! module of its own so that the traced process (`traced.rs`) holds it without depending on the
//! census code, which reads the traced processes. Its fields are its own: the census code and
//! the recording's assembly go through its methods.

use crate::runtimes::python::heap::Located;
use leaktrace_analysis::runtimes::python::heap::PyCensus;

/// Per process: where its interpreter is (found at the first census) and its censuses.
#[derive(Default)]
pub(crate) struct PyHeap {
    /// Where the interpreter's state is (Err: why it cannot be read); None before the first
    /// census.
    located: Option<Result<Located, String>>,
    /// Censuses taken, oldest first.
    censuses: Vec<PyCensus>,
}

impl PyHeap {
    /// Where the interpreter's state is, found by `locate` at the first call. Err: why it cannot
    /// be read, given once (an empty reason after).
    pub(super) fn located(&mut self, locate: impl FnOnce() -> Result<Located, String>) -> Result<Located, String> {
        match self.located.get_or_insert_with(locate) {
            Ok(at) => Ok(*at),
            Err(why) => Err(std::mem::take(why)),
        }
    }

    /// A census taken, after the others.
    pub(super) fn push(&mut self, census: PyCensus) {
        self.censuses.push(census);
    }

    /// The censuses taken, oldest first, for the recording (none are left).
    pub(super) fn take(&mut self) -> Vec<PyCensus> {
        std::mem::take(&mut self.censuses)
    }
}
