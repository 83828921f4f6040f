//! Entry points of the fuzz targets (`fuzz/`, run by `cargo xtask fuzz`): each parser of what a
//! target sends, given the bytes as the target would send them. None may panic, hang or
//! allocate past its caps on any input; docs/reliability.md says how long each ran.

pub use crate::holds::fuzzing::{cdp, go_binary, go_buckets, hprof, v8_snapshot};

/// The Python heap census's walk over bytes standing for the target's memory
/// ([`crate::runtimes::python::heap::walk_image`]).
pub fn python_walk(data: &[u8]) {
    let _ = crate::runtimes::python::heap::walk_image(data);
}

/// A recording file as `report` and `compare` load it; when it loads, the analysis, every
/// report, `check`'s evaluation and `compare` run on it.
pub fn recording(data: &[u8]) {
    if let Ok(rec) = leaktrace_analysis::recording::Recording::parse(data) {
        let a = leaktrace_analysis::analyze::analyze(&rec, &leaktrace_analysis::analyze::AnalyzeOptions { top: 10 });
        let _ = leaktrace_analysis::report::render(&rec, &a);
        let _ = leaktrace_analysis::check::evaluate(&rec, 1024.0);
        let _ = leaktrace_analysis::compare::compare(&rec, "a", &rec, "b");
    }
}
