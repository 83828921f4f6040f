//! CPython detection: a mapped libpython, or a python executable with the interpreter inside;
//! the PYTHONMALLOC setting from the target's environment; per process, its frames read by the
//! kernel at allocations (`pyframes`). The frame rules are in
//! `leaktrace_analysis::runtimes::python`.

pub mod frames;
pub mod heap;
pub mod names;

use std::sync::Arc;

use super::{RuntimeInfo, RuntimeInstance, RuntimeOptions, file_name};
use crate::objects::MappedObject;
use crate::probes::Tracer;
use crate::runtimes::python::frames::{self as pyframes, Interpreter};
use crate::symbolize::StackSymbolizer;
use leaktrace_analysis::recording::{Frame, Runtime};

/// Detect CPython: a mapped libpython, or an executable named python* that defines the
/// interpreter's allocator (Debian's static-libpython build). `pymalloc`: CPython's allocator
/// API is hooked (`--pymalloc`); without it (and without PYTHONMALLOC), a note says that blocks
/// pymalloc serves are seen only as arena growth, and what would show them.
pub fn detect(pid: u32, objects: &[MappedObject], pymalloc: bool) -> Option<RuntimeInfo> {
    let obj = objects.iter().find(|o| file_name(&o.path).starts_with("libpython")).or_else(|| {
        objects.iter().find(|o| {
            let n = file_name(&o.path);
            n.starts_with("python")
                && !n.contains(".so")
                && crate::discover::function_offsets(&o.open_path, &["PyObject_Malloc"]).is_ok_and(|m| !m.is_empty())
        })
    })?;
    let name = file_name(&obj.path);
    // libpython3.11.so.1.0, python3.11, libpython3.11d.so → 3.11
    let version = name
        .trim_start_matches("lib")
        .trim_start_matches("python")
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .map(|v| v.trim_end_matches('.').to_string())
        .filter(|v| v.contains('.'));
    let mut notes = vec![format!(
        "Python runtime detected ({}): managed = pymalloc arenas and malloc called by the \
         interpreter; native = malloc from extensions and the C libraries they call",
        obj.path.display()
    )];
    let pythonmalloc = environ_var(pid, "PYTHONMALLOC");
    if pythonmalloc.is_none() && !pymalloc {
        notes.push(
            "pymalloc serves Python objects and PyMem_Malloc blocks of up to 512 bytes from its own arenas, \
             without a malloc call: who allocates them (an extension's PyMem_Malloc, a missing Py_DECREF) \
             is seen only as arena growth (_PyObject_ArenaMmap); record with --pymalloc, or run the program \
             with PYTHONMALLOC=malloc, to trace each of them by its call stack"
                .to_string(),
        );
    }
    if let Some(v) = pythonmalloc {
        notes.push(match v.as_str() {
            "malloc" | "malloc_debug" => format!(
                "PYTHONMALLOC={v}: pymalloc is bypassed, every Python object is a malloc call \
                 (still classed managed by its interpreter caller); no arenas, more probe overhead \
                 per object"
            ),
            "debug" | "pymalloc_debug" => format!(
                "PYTHONMALLOC={v}: the debug hooks add guard bytes to every block, so managed \
                 figures are larger than the objects"
            ),
            _ => format!("PYTHONMALLOC={v}"),
        });
    }
    Some(RuntimeInfo { name: Runtime::Python, version, notes })
}

/// A variable of the target's initial environment (/proc/PID/environ).
pub(crate) fn environ_var(pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(name).and_then(|r| r.strip_prefix('=')).map(str::to_string)
    })
}

/// CPython ([`super::RuntimeDetector`]).
pub struct Python;

impl super::RuntimeDetector for Python {
    fn detect(&self, pid: u32, objects: &[MappedObject], opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>> {
        let info = detect(pid, objects, opts.pymalloc)?;
        Some(Box::new(PythonInstance {
            pid,
            info,
            frames_on: opts.python_frames,
            tried: false,
            interp: None,
            budget_noted: false,
        }))
    }
}

/// CPython in one process: its frames, read by the kernel at allocations once the
/// interpreter is located.
struct PythonInstance {
    pid: u32,
    info: RuntimeInfo,
    /// Python frames are to be read (`--python-frames`).
    frames_on: bool,
    /// The interpreter's frames were looked for (found or not: once per program image).
    tried: bool,
    /// The interpreter whose frames the kernel reads, once located.
    interp: Option<Interpreter>,
    /// The note that the budget of stacks with Python frames is spent was given.
    budget_noted: bool,
}

impl RuntimeInstance for PythonInstance {
    fn info(&self) -> &RuntimeInfo {
        &self.info
    }

    /// Have the kernel read its Python frames at allocations (once per program image); a note
    /// says why not when they cannot be read.
    fn sync_mappings(&mut self, tracer: &mut Tracer, objects: &[MappedObject], warnings: &mut Vec<String>) {
        if !self.frames_on
            || self.tried
            // Held at an exec: libpython may be among the libraries not mapped yet; the next
            // rescan, once it runs, finds the interpreter.
            || crate::procinfo::stopped(self.pid)
        {
            return;
        }
        self.tried = true;
        let failed = match pyframes::locate(self.pid, objects) {
            Ok((interp, target)) => match tracer.add_python_target(self.pid, target) {
                Ok(()) => {
                    warnings.push(frames_note(&interp, tracer));
                    self.interp = Some(interp);
                    return;
                }
                Err(e) => format!("Python frames are not read: {e:#}"),
            },
            Err(why) => why,
        };
        // Wanted (`--python-frames on`, or auto) and cannot be read: one line on stderr now (the
        // user learns it while recording, not only from the report), and the same sentence in
        // the report's caveats.
        crate::note!("leaktrace: PID {}: {failed}", self.pid);
        warnings.push(failed);
    }

    /// CPython frames read with this stack, in place of the interpreter's eval loop.
    fn symbolize(
        &mut self,
        tracer: &Tracer,
        stack: u64,
        frames: &mut Vec<Arc<Frame>>,
        symbolizer: &mut StackSymbolizer,
        warnings: &mut Vec<String>,
    ) -> bool {
        let Some(py) = self.interp.as_mut() else { return false };
        if !self.budget_noted
            && let Some(budget) = tracer.python_budget_spent()
        {
            self.budget_noted = true;
            warnings.push(format!(
                "the {budget} stacks with Python frames that --max-stacks allows were all stored: stacks first seen \
                 after that have native frames only (raise --max-stacks, or --python-frames off)"
            ));
        }
        let Some(raw) = (stack != 0).then(|| tracer.py_stack(stack)).flatten() else { return false };
        let py_frames = py.frames(&raw);
        // Made during an import (module code and state, kept by design): its Python frames are
        // left out, and the stack is its native twin (one site for every import, as without
        // Python frames, rather than one per importing line).
        if pyframes::in_import(&py_frames) {
            return false;
        }
        let with_python = !py_frames.is_empty();
        let py_frames = py_frames.into_iter().map(|f| symbolizer.intern(f)).collect();
        *frames = pyframes::merge(std::mem::take(frames), py_frames);
        with_python
    }

    fn detach(&mut self, tracer: &mut Tracer) {
        if self.interp.take().is_some() {
            tracer.remove_python_target(self.pid);
        }
    }
}

/// The note that Python frames are read, from which interpreter and which thread's.
fn frames_note(interp: &Interpreter, tracer: &Tracer) -> String {
    let (major, minor) = interp.layout.version;
    let source = match interp.source {
        pyframes::Source::DebugOffsets => " (offsets from its _Py_DebugOffsets)",
        pyframes::Source::Table => "",
    };
    // Which thread's frames an allocation gets (leaktrace-ebpf/src/python.rs).
    let whose = if tracer.python_threads_by_fsbase() {
        "the allocating thread's own, with or without the GIL"
    } else if (major, minor) >= (3, 11) {
        "the allocating thread's own, found by its native_thread_id (the kernel's BTF gives no \
         task fsbase): none in a pid namespace other than the host's"
    } else {
        "the GIL holder's, whichever thread allocates (the kernel's BTF gives no task fsbase to tell \
         threads apart)"
    };
    format!(
        "Python frames (function, file, line) read from CPython {major}.{minor}'s frame chain{source} at \
         each allocation ({whose}), in place of the eval loop's frames"
    )
}
