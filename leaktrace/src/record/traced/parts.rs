//! What the record's other rooms ask of a traced process, as methods (the census of
//! `--python-heap`, `record/pyheap.rs`), so that they do not reach into its fields. Its PID and
//! a new note for its recording are the session's questions ([`super::super::session::Tracee`]).
use super::*;

impl Traced {
    /// The process's recording has ended (it exited, or the session ended it).
    pub(in crate::record) fn ended(&self) -> bool {
        self.session.end_reason.is_some()
    }

    /// What `--python-heap` keeps for the process.
    pub(in crate::record) fn py_heap_mut(&mut self) -> &mut super::super::py_heap_state::PyHeap {
        &mut self.py_heap
    }

    /// A note for the process's recording, after the others, unless it already has that very
    /// note.
    pub(in crate::record) fn warn_once(&mut self, line: String) {
        if !self.warnings.contains(&line) {
            self.warnings.push(line);
        }
    }

    /// The objects the process maps, as its symbolizer knows them.
    pub(in crate::record) fn mappings(&mut self) -> Vec<leaktrace_analysis::recording::ObjectMapping> {
        self.symbolizer.mappings()
    }

    /// The recording's stack `id`, when there is one.
    pub(in crate::record) fn stack(&self, id: u32) -> Option<&Stack> {
        self.stacks.get(id as usize)
    }
}
