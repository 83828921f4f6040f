//! A traced process's managed runtime, through its [`RuntimeInstance`]: detected from the
//! objects it maps, then called at every rescan, stack, checkpoint, poll and at the end. No
//! runtime is named here: what each does is in its module under `crate::runtimes`.
use super::*;

use crate::runtimes::{Process, RuntimeInstance, RuntimeOptions};
use leaktrace_analysis::recording::Runtime;

impl Traced {
    /// Which runtime the process runs, once detected.
    pub(in crate::record) fn runtime_name(&self) -> Option<Runtime> {
        self.runtime.as_ref().map(|r| r.info().name)
    }

    /// Detect the target's runtime (once) from the objects it maps (`pymalloc`: CPython's
    /// allocator API is hooked, `--pymalloc`), and let it see the objects it maps now.
    pub(in crate::record) fn detect_runtime(&mut self, tracer: &mut Tracer, objects: &[MappedObject], pymalloc: bool) {
        if self.runtime.is_none() {
            let rt = crate::runtimes::detect(self.pid, objects, RuntimeOptions { pymalloc, ..self.runtime_opts });
            self.set_runtime(rt);
        }
        self.sync_runtime(tracer, objects);
    }

    /// The runtime detected in the process (None: none): its notes go to the recording.
    pub(in crate::record) fn set_runtime(&mut self, rt: Option<Box<dyn RuntimeInstance>>) {
        if let Some(rt) = rt {
            self.warnings.extend(rt.info().notes.iter().cloned());
            self.runtime = Some(rt);
        }
    }

    /// The runtime, if any, sees the objects the process maps now (`objects`).
    pub(in crate::record) fn sync_runtime(&mut self, tracer: &mut Tracer, objects: &[MappedObject]) {
        if let Some(rt) = self.runtime.as_mut() {
            rt.sync_mappings(tracer, objects, &mut self.warnings);
        }
    }

    /// The process left its runtime (an exec): the runtime takes its entries out of the
    /// kernel's maps, and the new program's is detected anew.
    pub(in crate::record) fn detach_runtime(&mut self, tracer: &mut Tracer) {
        if let Some(mut rt) = self.runtime.take() {
            rt.detach(tracer);
        }
    }

    /// The runtime's frames put into a new stack's native `frames` (kernel stack `stack`); true
    /// when some were added.
    pub(in crate::record) fn runtime_frames(
        &mut self,
        tracer: &Tracer,
        stack: u64,
        frames: &mut Vec<std::sync::Arc<Frame>>,
    ) -> bool {
        let Some(rt) = self.runtime.as_mut() else { return false };
        rt.symbolize(tracer, stack, frames, &mut self.symbolizer, &mut self.warnings)
    }

    /// At every poll: the runtime's own work (the JVM's jcmd with `--jvm-perf-map`). Never blocks.
    pub(in crate::record) fn runtime_tick(&mut self) {
        if let Some(rt) = self.runtime.as_mut() {
            rt.tick(Process {
                stacks: &mut self.stacks,
                symbolizer: &mut self.symbolizer,
                warnings: &mut self.warnings,
            });
        }
    }

    /// End of the recording: the runtime's last work (the JVM's last perf map, waited for at
    /// most [`crate::runtimes::jvm::jcmd::TIMEOUT`] per command); then, for every runtime and for
    /// none, unnamed JIT frames are named from the perf map as it is now.
    pub(in crate::record) fn jit_final(&mut self) {
        let running = self.session.end_reason.is_none() && procinfo::alive(self.pid);
        let p = Process { stacks: &mut self.stacks, symbolizer: &mut self.symbolizer, warnings: &mut self.warnings };
        match self.runtime.as_mut() {
            Some(rt) => rt.finish(p, running),
            None => {
                p.symbolizer.name_jit_frames(p.stacks);
            }
        }
    }

    /// When JIT frames (code outside any mapped file) stayed unnamed in a runtime that can write
    /// a perf map, what to run it with so they are named.
    pub(in crate::record) fn jit_note(&self) -> Option<String> {
        let rt = self.runtime.as_ref()?;
        let any_unnamed =
            self.stacks.iter().flat_map(|s| s.frames.iter().skip(1)).any(|f| crate::runtimes::unnamed_jit(f));
        if !any_unnamed || self.symbolizer.has_perf_map() {
            return None;
        }
        rt.unnamed_jit_advice()
    }
}
