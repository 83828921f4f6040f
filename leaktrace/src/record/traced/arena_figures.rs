//! glibc's own figure of its arenas at each checkpoint ([`crate::reach::arena_stats`]), into the
//! allocator footprint; why it cannot be read, once, in the warnings.
use super::*;

impl Traced {
    /// Add glibc's Σ `system_mem` of its arenas to `f` (a process whose malloc is glibc's); the
    /// first failure to find `main_arena` becomes a warning ("could not read ...").
    pub(super) fn glibc_figures(&mut self, f: &mut AllocatorFootprint) {
        match self.glibc_stats.read() {
            Ok(Some(a)) => {
                if let Some(note) = self.glibc_stats.take_note() {
                    self.warnings.push(format!("glibc's arena headers: {note}"));
                }
                f.glibc_system_mem_bytes = a.system_mem_bytes;
                f.glibc_arenas = a.arenas;
                f.glibc_free_bytes = a.free_bytes.unwrap_or(0);
            }
            Ok(None) => {}
            Err(e) => self.warnings.push(format!(
                "could not read glibc's arena headers (the allocator's own figure of the memory it holds): {e}; \
                 its regions' resident pages are measured instead"
            )),
        }
    }
}
