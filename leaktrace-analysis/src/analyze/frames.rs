//! Which frame of a stack is its culprit, and how frames are labelled in reports.

use crate::recording::{Frame, Stack, StackKind};
use crate::runtimes::MemoryKind;
use std::sync::Arc;

pub(super) use crate::frame_origin::is_runtime_frame;
pub(crate) use crate::frame_origin::is_system_frame;
pub use crate::frame_origin::{basename, is_allocator};
pub use crate::runtimes::native_interface_caller;

/// Label of a frame: its function name, else `basename(object)+0xFILE_OFFSET` (what addr2line
/// and objdump take), else `basename(object)+0xaddr` (recordings made before file offsets were
/// kept), else `0xaddr`.
pub fn frame_label(f: &Frame) -> String {
    if f.kind == crate::recording::FrameKind::Python {
        // A Python frame: its function and the line being run (`handle (app.py:42)`).
        let func = f.function.as_deref().unwrap_or("?");
        return match (&f.file, f.line) {
            (Some(file), Some(line)) => format!("{func} ({}:{line})", basename(file)),
            (Some(file), None) => format!("{func} ({})", basename(file)),
            _ => func.to_string(),
        };
    }
    match (&f.function, &f.object, f.file_offset) {
        (Some(func), _, _) if !func.is_empty() => func.clone(),
        (_, Some(obj), Some(off)) => format!("{}+{:#x}", basename(obj), off),
        (_, Some(obj), None) => format!("{}+{:#x}", basename(obj), f.addr),
        _ => format!("{:#x}", f.addr),
    }
}

/// True for a frame of the program's own code that a managed-heap site can be named after: a
/// frame a runtime names as the program's ([`crate::runtimes::RuntimeRules::is_program_code_frame`]:
/// a JavaScript or Java frame named from the runtime's perf map, a Python frame), or a native
/// frame of a known object that is neither a runtime, system code nor an allocator
/// ([`is_native_program_frame`]: a C extension calling `PyMem_Malloc`). The runtimes' own
/// frames are not.
pub fn is_program_frame(f: &Frame) -> bool {
    is_runtime_program_frame(f) || is_native_program_frame(f)
}

/// True for a frame some runtime names as the program's own code
/// ([`crate::runtimes::RuntimeRules::is_program_code_frame`]).
fn is_runtime_program_frame(f: &Frame) -> bool {
    crate::runtimes::all().any(|r| r.is_program_code_frame(f))
}

/// True for a native frame of a program's own code (a C extension, or any library that is
/// neither a runtime, system code nor an allocator) with a known object: the code that called a
/// runtime's C API when the runtime allocated for it.
fn is_native_program_frame(f: &Frame) -> bool {
    f.kind == crate::recording::FrameKind::Native
        && f.object.is_some()
        && !is_runtime_frame(f)
        && !is_system_frame(f)
        && !is_allocator(f)
}

/// The culprit frame of a stack: innermost non-allocator named frame (for a mapping, also not
/// libc's mmap or syscall wrapper: [`crate::allocator_frames::is_mapping_frame`]); when that frame is
/// system or standard-library code ([`is_system_frame`]: a leak made inside libc, libz, libssl,
/// libstdc++) and the stack goes on into the user's code, the first frame there (the function
/// that called into the library), unless the stack passes through a managed runtime's own
/// object; when that frame is cgo's own malloc (`C.CString`), the Go function that called it;
/// the library that called a runtime's native interface when the allocation went through it
/// ([`native_interface_caller`]: a JNI library's `GetStringUTFChars`, not libjvm's
/// `os::malloc`); when that frame is a runtime's code, the first Python frame or named JIT
/// frame beyond it (not beyond a frame of V8's garbage collector: a page it maps holds what
/// survived, not what the function that triggered the collection allocated), or, for CPython's code allocating (not mapping an arena), a C extension's
/// frame met before it (the extension whose `PyBytes_FromStringAndSize` object was never
/// released, not the Python line that called it); else the innermost named frame; else the innermost frame. A frame without a function
/// name (stripped code) counts when its object is known, labelled `object+0xFILE_OFFSET`.
/// Returns (index, label).
pub fn culprit(stack: &Stack) -> (Option<usize>, String) {
    let named = |f: &Frame| f.function.as_deref().is_some_and(|n| !n.is_empty());
    let wrapper = |f: &Frame| {
        stack.kind == StackKind::Mmap && f.function.as_deref().is_some_and(crate::allocator_frames::is_mapping_frame)
    };
    // A frame that can be named: by its function, or by its object and file offset (stripped
    // code); frames with neither (JIT code) cannot.
    let nameable = |f: &Frame| named(f) || f.object.is_some();
    // Frame 0 of an allocation is the probed allocator function itself, named or not (a
    // stripped allocator has no name to recognise it by).
    let entry = |i: usize| i == 0 && stack.kind == StackKind::Malloc;
    let first = (0..stack.frames.len()).find(|&i| {
        let f = &stack.frames[i];
        nameable(f) && !is_allocator(f) && !wrapper(f) && (!entry(i) || named(f))
    });
    // A runtime's bridge to C code (cgo's own malloc for `C.CString`): the runtime's function
    // that called through it.
    let bridge_caller =
        first.and_then(|i| crate::runtimes::all().find_map(|r| r.bridge_caller(&stack.frames, i, &nameable)));
    let interface_caller = first
        .filter(|&i| is_system_frame(&stack.frames[i]) || is_runtime_frame(&stack.frames[i]))
        .and_then(|_| native_interface_caller(&stack.frames));
    let user = first.filter(|&i| is_system_frame(&stack.frames[i])).and_then(|i| {
        if stack.frames.iter().any(|f| is_runtime_frame(f)) {
            return None;
        }
        stack.frames[i..].iter().position(|f| nameable(f) && !is_system_frame(f) && !is_allocator(f)).map(|j| i + j)
    });
    // A runtime's JIT frames named from its perf map (Node with --perf-basic-prof), or a Python
    // frame read from the interpreter: memory the runtime allocated for the program's own
    // JavaScript or Python code is that function's (its line, for Python).
    // Before the Python frame, a C extension that called the interpreter's C API (an object it
    // made with `PyBytes_FromStringAndSize` and never released: a missing `Py_DECREF`) is the
    // culprit, not the Python line that called the extension.
    let user = user.or_else(|| {
        let i = first?;
        let f = &stack.frames[i];
        if !(is_runtime_frame(f) || is_system_frame(f)) {
            return None;
        }
        // An arena pymalloc maps holds every caller's objects: not the extension's.
        let api = stack.kind == StackKind::Malloc && crate::runtimes::all().any(|r| r.is_allocating_api_frame(f));
        // A page V8's collector maps (a semi-space grown, old-space pages for promoted objects)
        // holds what survived, not what the JavaScript function that triggered the collection
        // allocated: no JS frame beyond a collector frame names it.
        let collector = |f: &Frame| crate::runtimes::all().any(|r| r.is_collector_frame(f));
        stack.frames[i..]
            .iter()
            .take_while(|f| !collector(f))
            .position(|f| is_runtime_program_frame(f) || api && is_native_program_frame(f))
            .map(|j| i + j)
    });
    let idx = bridge_caller
        .or(interface_caller)
        .or(user)
        .or(first)
        .or_else(|| stack.frames.iter().position(|f| named(f)))
        .or(if stack.frames.is_empty() { None } else { Some(0) });
    match idx {
        Some(i) => (Some(i), frame_label(&stack.frames[i])),
        None if stack.lost => (None, "[stack lost]".to_string()),
        None => (None, "[unknown]".to_string()),
    }
}

/// Functions of libc and the loader that allocate once per process (or per loaded object) and
/// keep it to the end: stdio buffers, locale data, atexit and TLS tables, the loader's own
/// memory. Matched as a prefix of any frame's function name.
const ONE_TIME_FUNCTIONS: &[&str] = &[
    "_IO_file_doallocate",
    "_IO_doallocbuf",
    "__libc_setlocale",
    "setlocale",
    "_nl_",
    "__new_exitfn",
    "__cxa_atexit",
    "__gconv",
    "__tzfile_read",
    "tzset",
    "_dl_",
    "__libc_early_init",
    "__libc_alloc_buffer",
    "_GLOBAL__sub_I",
];

/// True for a site that holds one of libc's or the runtime's one-time allocations, which a
/// program keeps until exit by design and which LeakSanitizer does not report either: a memory
/// kind of the runtime ([`MemoryKind::Runtime`]: the loader, arenas, a runtime's own memory), a
/// stack through a function of [`ONE_TIME_FUNCTIONS`], or a stack with no frame outside system
/// libraries, allocators and the loader (made before main or by a library's own initialisation).
/// `frames`: the site's stack, innermost first; glibc's internal aliases (`__GI__IO_doallocbuf`)
/// count as the public name.
pub fn is_one_time_site(frames: &[Arc<Frame>], kind: MemoryKind) -> bool {
    if kind == MemoryKind::Runtime {
        return true;
    }
    let one_time = |f: &Frame| {
        f.function.as_deref().is_some_and(|n| {
            let n = n.strip_prefix("__GI_").unwrap_or(n);
            ONE_TIME_FUNCTIONS.iter().any(|p| n.starts_with(p))
        })
    };
    let loader = |f: &Frame| f.object.as_deref().map(basename).is_some_and(|b| b.starts_with("ld-"));
    let user = |f: &Frame| {
        (f.function.is_some() || f.object.is_some()) && !is_system_frame(f) && !is_allocator(f) && !loader(f)
    };
    frames.iter().any(|f| one_time(f)) || !frames.iter().any(|f| user(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(object: &str) -> Frame {
        Frame { object: Some(object.into()), function: Some("f".into()), ..Default::default() }
    }

    #[test]
    fn packages_installed_under_system_directories_are_not_system_code() {
        assert!(is_system_frame(&at("/usr/lib/x86_64-linux-gnu/libz.so.1.2.13")));
        assert!(is_system_frame(&at("/usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so")));
        assert!(!is_system_frame(&at("/usr/lib/python3/dist-packages/lxml/etree.cpython-311-x86_64-linux-gnu.so")));
        assert!(!is_system_frame(&at("/usr/lib/python3.11/site-packages/ext/_leak.cpython-311-x86_64-linux-gnu.so")));
        assert!(!is_system_frame(&at("/usr/lib/node_modules/addon/build/Release/addon.node.so")));
        assert!(!is_system_frame(&at("/srv/app/libplugin.so")));
    }

    fn named(function: &str) -> Frame {
        Frame { object: Some("/srv/app/server".into()), function: Some(function.into()), ..Default::default() }
    }

    /// Rust's standard library inlined into a release build is standard-library
    /// code however its name starts; the user's impls of standard traits are the user's.
    #[test]
    fn rust_standard_library_frames_are_system_code() {
        for std in [
            "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
            "<alloc::vec::Vec<T>>::push",
            "<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem",
            "<&str as alloc::string::ToString>::to_string",
            "<[u8] as alloc::slice::hack::ConvertVec>::to_vec",
            "<alloc::string::String as core::fmt::Write>::write_str",
            "<core::iter::adapters::map::Map<I,F> as core::iter::traits::iterator::Iterator>::fold",
            "std::collections::hash::map::HashMap<K,V,S>::insert",
        ] {
            assert!(is_system_frame(&named(std)), "{std}");
        }
        for user in [
            "nofp_rust::remember_request",
            "<app::Config as core::fmt::Display>::fmt",
            "<alloc::vec::Vec<T> as app::Store>::put",
            "<app::Cache<K> as core::clone::Clone>::clone",
        ] {
            assert!(!is_system_frame(&named(user)), "{user}");
        }
    }
}
