//! CPython detection: a mapped libpython, or a python executable with the interpreter inside;
//! the PYTHONMALLOC setting from the target's environment. The frame rules are in
//! `leaktrace_analysis::runtimes::python`.

use super::{RuntimeInfo, file_name};
use crate::objects::MappedObject;
use crate::recording::Runtime;

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
    fn runtime(&self) -> Runtime {
        Runtime::Python
    }

    fn detect(&self, pid: u32, objects: &[MappedObject], pymalloc: bool) -> Option<RuntimeInfo> {
        detect(pid, objects, pymalloc)
    }
}
