//! What `--python-heap` keeps per traced process ([`super::pyheap`] takes the censuses): a
//! module of its own so that the traced process (`traced.rs`) holds it without depending on the
//! census code, which reads the traced processes.

use crate::runtimes::python::heap::Located;

/// Per process: where its interpreter is (found at the first census) and its censuses.
#[derive(Default)]
pub(crate) struct PyHeap {
    /// Where the interpreter's state is (Err: why it cannot be read); None before the first
    /// census.
    pub(super) located: Option<Result<Located, String>>,
    /// Censuses taken, oldest first.
    pub censuses: Vec<leaktrace_analysis::runtimes::python::heap::PyCensus>,
}
