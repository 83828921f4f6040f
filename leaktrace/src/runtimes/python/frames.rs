//! CPython frames in the stacks: where a traced interpreter keeps its frame chain (given to the
//! kernel side at attach, see `leaktrace-ebpf/src/python.rs`), and the code objects the kernel
//! found there turned into Python frames (qualified name, file, line) read from the target's
//! memory. See docs/kernel.md ("Python frames").
//!
//! Structure offsets come, for 3.13, from the interpreter's own `_Py_DebugOffsets` (the first
//! field of `_PyRuntime`: cookie `xdebugpy`, `PY_VERSION_HEX`, then `offsetof` values the
//! interpreter was built with; [`debug_offsets_layout`]), and otherwise from [`LAYOUTS`], one per
//! supported version, measured with `offsetof` on the version's own headers
//! (`Include/internal/*.h`, built with `Py_BUILD_CORE`) and checked at attach against the running
//! interpreter: its `Py_Version` (or, before 3.11, the version in its file name) and the object
//! that defines `_PyRuntime`.

use std::collections::HashMap;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use leaktrace_common::{PyFrame, PyTarget, py_offset};
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::discover::MappedObject;
use leaktrace_analysis::recording::{Frame, FrameKind};

/// The structure offsets of one CPython version (bytes).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// (major, minor).
    pub version: (u8, u8),
    /// Offset in `_PyRuntime` of the pointer to the thread state holding the GIL, or of the
    /// first pointer of the path to it (`py_offset::TSTATE_PATH1`).
    pub runtime_tstate: u64,
    /// Offset in `_PyRuntime` of the pointer to the main interpreter (`interpreters.main`; 3.13:
    /// `interpreters.head`), whose thread states the kernel searches ([`PyTarget::interp_addr`]).
    pub runtime_interp: u64,
    /// Offsets the kernel follows ([`PyTarget::offsets`]).
    pub kernel: [u32; py_offset::NUM],
    /// `PyCodeObject` fields.
    pub co_code_adaptive: u64,
    pub co_filename: u64,
    pub co_name: u64,
    pub co_qualname: u64,
    pub co_firstlineno: u64,
    pub co_linetable: u64,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`: where a compact string's
    /// characters start.
    pub ascii_header: u64,
    pub compact_header: u64,
    /// How the frame's instruction position and the line table read.
    pub format: Format,
}

/// The version's frame and line-table formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// 3.11+: `prev_instr` (a pointer into `co_code_adaptive`), the location table
    /// ([`line_of`]).
    Locations,
    /// 3.10: `f_lasti` (an instruction index, 32 bits), the PEP 626 line table
    /// ([`line_of_310`]); no `co_qualname` (the function's bare name).
    Pep626,
    /// 3.8 and 3.9: `f_lasti` (a byte offset into `co_code`, 32 bits), the line number table
    /// `co_lnotab` ([`line_of_lnotab`]); no `co_qualname`.
    Lnotab,
}

const NONE: u32 = py_offset::NONE;

/// The supported versions.
///
/// In every version the allocating thread's own thread state is the one of the main
/// interpreter's list (`_PyRuntime.interpreters.main` → `tstate_head` (3.8–3.10) or
/// `threads.head` (3.11+) → `PyThreadState.next` ...) whose `thread_id` (`pthread_self()`) is the
/// task's fsbase; the GIL holder named below is tried first. Offsets of `interpreters.main`,
/// the list head, `next` and `thread_id` measured the same way (3.11: 48, 16, 8, 152; 3.12: 48,
/// 72, 8, 136; 3.8–3.10: 40, 8, 8, 176; 3.13.0: `interpreters.head` 632, 7344, 8, 152).
///
/// - 3.11: `_PyRuntime.gilstate.tstate_current` (the GIL holder, NULL when no thread holds
///   it) → `PyThreadState.cframe` → `_PyCFrame.current_frame` → `_PyInterpreterFrame`
///   { `f_code`, `prev_instr`, `previous` }; `PyThreadState.native_thread_id`. Identical in
///   3.11.2 (Debian) and 3.11.7 (pyenv).
/// - 3.10: `_PyRuntime.gilstate.tstate_current` → `PyThreadState.frame` → `PyFrameObject`
///   { `f_code`, `f_lasti`, `f_back` }. No `native_thread_id` (a kernel without the fsbase
///   offset in its BTF gets the GIL holder's frames for whichever thread allocates); no
///   `co_qualname`.
/// - 3.12: the thread state is thread-local (`_Py_tss_tstate`), so the GIL's last holder:
///   `_PyRuntime.interpreters.main` → `PyInterpreterState.ceval.gil` →
///   `_gil_runtime_state.last_holder`; the frame chain as in 3.11, with the C stack's shim
///   frames (`<shim>` code objects) left out by the agent.
/// - 3.13: as 3.12 but the thread state holds the frame (`PyThreadState.current_frame`, no
///   `_PyCFrame`), a frame's code is `f_executable` and its position `instr_ptr` (the instruction
///   being run); the GIL's last holder read from the main interpreter's own GIL
///   (`PyInterpreterState._gil.last_holder`, where `ceval.gil` points). Used only when the
///   interpreter's `_Py_DebugOffsets` cannot be read; measured on 3.13.0.
/// - 3.9 and 3.8: as 3.10 (`PyFrameObject` chain from `gilstate.tstate_current`), with
///   `f_lasti` in bytes and `co_lnotab`.
pub const LAYOUTS: &[Layout] = &[
    Layout {
        version: (3, 11),
        runtime_tstate: 576,
        runtime_interp: 48,
        kernel: [56, 8, 160, 32, 56, 48, NONE, NONE, 16, 8, 152],
        co_code_adaptive: 184,
        co_filename: 112,
        co_name: 120,
        co_qualname: 128,
        co_firstlineno: 72,
        co_linetable: 136,
        ascii_header: 48,
        compact_header: 72,
        format: Format::Locations,
    },
    Layout {
        version: (3, 12),
        runtime_tstate: 48,
        runtime_interp: 48,
        kernel: [56, 0, 144, 0, 56, 8, 384, 8, 72, 8, 136],
        co_code_adaptive: 192,
        co_filename: 112,
        co_name: 120,
        co_qualname: 128,
        co_firstlineno: 68,
        co_linetable: 136,
        ascii_header: 40,
        compact_header: 56,
        format: Format::Locations,
    },
    Layout {
        version: (3, 10),
        runtime_tstate: 568,
        runtime_interp: 40,
        kernel: [NONE, 24, NONE, 32, 96, 24, NONE, NONE, 8, 8, 176],
        co_code_adaptive: 0,
        co_filename: 104,
        co_name: 112,
        co_qualname: 112,
        co_firstlineno: 40,
        co_linetable: 120,
        ascii_header: 48,
        compact_header: 72,
        format: Format::Pep626,
    },
    Layout {
        version: (3, 13),
        runtime_tstate: 632,
        runtime_interp: 632,
        kernel: [NONE, 72, 160, 0, 56, 8, 7760, NONE, 7344, 8, 152],
        co_code_adaptive: 200,
        co_filename: 112,
        co_name: 120,
        co_qualname: 128,
        co_firstlineno: 68,
        co_linetable: 136,
        ascii_header: 40,
        compact_header: 56,
        format: Format::Locations,
    },
    Layout {
        version: (3, 9),
        runtime_tstate: 568,
        runtime_interp: 40,
        kernel: [NONE, 24, NONE, 32, 104, 24, NONE, NONE, 8, 8, 176],
        co_code_adaptive: 0,
        co_filename: 104,
        co_name: 112,
        co_qualname: 112,
        co_firstlineno: 40,
        co_linetable: 120,
        ascii_header: 48,
        compact_header: 72,
        format: Format::Lnotab,
    },
    Layout {
        version: (3, 8),
        runtime_tstate: 1368,
        runtime_interp: 40,
        kernel: [NONE, 24, NONE, 32, 104, 24, NONE, NONE, 8, 8, 176],
        co_code_adaptive: 0,
        co_filename: 104,
        co_name: 112,
        co_qualname: 112,
        co_firstlineno: 40,
        co_linetable: 120,
        ascii_header: 48,
        compact_header: 72,
        format: Format::Lnotab,
    },
];

/// Where a layout's offsets came from (for the report's note).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The interpreter's `_Py_DebugOffsets`.
    DebugOffsets,
    /// [`LAYOUTS`].
    Table,
}

/// Byte offsets of the fields of CPython 3.13's `_Py_DebugOffsets` (Include/internal/
/// pycore_runtime.h: every field a `uint64_t`, the 8-byte cookie first) that leaktrace reads.
mod dbg {
    pub(crate) const VERSION: usize = 8;
    pub(crate) const INTERPRETERS_HEAD: usize = 40;
    pub(crate) const INTERP_SIZE: usize = 48;
    pub(crate) const INTERP_THREADS_HEAD: usize = 72;
    pub(crate) const INTERP_GIL_HOLDER: usize = 144;
    pub(crate) const TSTATE_SIZE: usize = 152;
    pub(crate) const TSTATE_NEXT: usize = 168;
    pub(crate) const TSTATE_CURRENT_FRAME: usize = 184;
    pub(crate) const TSTATE_THREAD_ID: usize = 192;
    pub(crate) const TSTATE_NATIVE_THREAD_ID: usize = 200;
    pub(crate) const FRAME_SIZE: usize = 224;
    pub(crate) const FRAME_PREVIOUS: usize = 232;
    pub(crate) const FRAME_EXECUTABLE: usize = 240;
    pub(crate) const FRAME_INSTR_PTR: usize = 248;
    pub(crate) const CODE_SIZE: usize = 272;
    pub(crate) const CODE_FILENAME: usize = 280;
    pub(crate) const CODE_NAME: usize = 288;
    pub(crate) const CODE_QUALNAME: usize = 296;
    pub(crate) const CODE_LINETABLE: usize = 304;
    pub(crate) const CODE_FIRSTLINENO: usize = 312;
    pub(crate) const CODE_ADAPTIVE: usize = 344;
    pub(crate) const UNICODE_ASCII_SIZE: usize = 560;
    /// The bytes read: up to the end of the unicode offsets.
    pub(crate) const LEN: usize = 568;
}

/// The layout of CPython 3.13 from the `_Py_DebugOffsets` at the start of `_PyRuntime`
/// (`bytes`, at least [`dbg::LEN`] of them). None when the cookie is not `xdebugpy`, the
/// version is not 3.13 (3.14 changed the structure) or an offset lies outside its structure.
pub fn debug_offsets_layout(bytes: &[u8]) -> Option<Layout> {
    if bytes.len() < dbg::LEN || &bytes[..8] != b"xdebugpy" {
        return None;
    }
    let at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    let hex = at(dbg::VERSION);
    if (hex >> 24, (hex >> 16) & 0xff) != (3, 13) {
        return None;
    }
    let within = |size: usize, fields: &[usize]| fields.iter().all(|&f| at(f) + 8 <= at(size));
    if !within(dbg::INTERP_SIZE, &[dbg::INTERP_GIL_HOLDER, dbg::INTERP_THREADS_HEAD])
        || !within(
            dbg::TSTATE_SIZE,
            &[dbg::TSTATE_CURRENT_FRAME, dbg::TSTATE_NATIVE_THREAD_ID, dbg::TSTATE_NEXT, dbg::TSTATE_THREAD_ID],
        )
        || !within(dbg::FRAME_SIZE, &[dbg::FRAME_PREVIOUS, dbg::FRAME_EXECUTABLE, dbg::FRAME_INSTR_PTR])
        || !within(
            dbg::CODE_SIZE,
            &[dbg::CODE_FILENAME, dbg::CODE_NAME, dbg::CODE_QUALNAME, dbg::CODE_LINETABLE, dbg::CODE_FIRSTLINENO],
        )
        || at(dbg::CODE_ADAPTIVE) > at(dbg::CODE_SIZE)
        || !(16..=256).contains(&at(dbg::UNICODE_ASCII_SIZE))
    {
        return None;
    }
    let k = |i: usize| u32::try_from(at(i)).ok();
    Some(Layout {
        version: (3, 13),
        runtime_tstate: at(dbg::INTERPRETERS_HEAD),
        runtime_interp: at(dbg::INTERPRETERS_HEAD),
        kernel: [
            NONE,
            k(dbg::TSTATE_CURRENT_FRAME)?,
            k(dbg::TSTATE_NATIVE_THREAD_ID)?,
            k(dbg::FRAME_EXECUTABLE)?,
            k(dbg::FRAME_INSTR_PTR)?,
            k(dbg::FRAME_PREVIOUS)?,
            k(dbg::INTERP_GIL_HOLDER)?,
            NONE,
            k(dbg::INTERP_THREADS_HEAD)?,
            k(dbg::TSTATE_NEXT)?,
            k(dbg::TSTATE_THREAD_ID)?,
        ],
        co_code_adaptive: at(dbg::CODE_ADAPTIVE),
        co_filename: at(dbg::CODE_FILENAME),
        co_name: at(dbg::CODE_NAME),
        co_qualname: at(dbg::CODE_QUALNAME),
        co_firstlineno: at(dbg::CODE_FIRSTLINENO),
        co_linetable: at(dbg::CODE_LINETABLE),
        ascii_header: at(dbg::UNICODE_ASCII_SIZE),
        // PyCompactUnicodeObject: PyASCIIObject, then utf8_length and utf8.
        compact_header: at(dbg::UNICODE_ASCII_SIZE) + 16,
        format: Format::Locations,
    })
}

/// A traced interpreter: its layout and the code objects already read.
pub struct Interpreter {
    pub layout: Layout,
    /// Where [`Interpreter::layout`] came from.
    pub source: Source,
    mem: Memory,
    code: HashMap<u64, Option<Code>>,
}

/// The target's memory, read through one /proc/PID/mem handle kept for the session: opening it
/// takes the target's mm and exec locks, which a busy process holds often (opened per read, as
/// before, stalls of 7–12 s were measured with `--pymalloc --python-frames on`). Reopened when a
/// read finds no address space behind the handle (the process exec'd: the handle keeps the old,
/// emptied one) — an unmapped address fails with EIO instead and is not retried.
struct Memory {
    pid: u32,
    file: Option<std::fs::File>,
}

impl Memory {
    /// The memory of `pid`, opened at the first read.
    fn new(pid: u32) -> Memory {
        Memory { pid, file: None }
    }

    /// `len` bytes at `addr`; None when they cannot be read.
    fn read(&mut self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        for reopened in [false, true] {
            if self.file.is_none() {
                let mm = crate::procinfo::mm_task(self.pid);
                self.file = Some(std::fs::File::open(format!("/proc/{mm}/mem")).ok()?);
            }
            match self.file.as_ref()?.read_exact_at(&mut buf, addr) {
                Ok(()) => return Some(buf),
                // A read of 0 bytes: no address space behind the handle any more (exec, exit).
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !reopened && len > 0 => self.file = None,
                Err(_) => return None,
            }
        }
        None
    }

    fn u64_at(&mut self, addr: u64) -> Option<u64> {
        self.read(addr, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
}

/// What a code object says of itself.
#[derive(Clone, Debug)]
struct Code {
    qualname: String,
    filename: String,
    firstlineno: u32,
    linetable: Vec<u8>,
}

/// Find the interpreter of `pid` among its `objects` (the object that defines `_PyRuntime`:
/// libpython, or a statically linked python executable) and where its frames are. Err: why the
/// frames cannot be read (one line, for the report's notes).
pub fn locate(pid: u32, objects: &[MappedObject]) -> Result<(Interpreter, PyTarget), String> {
    let mut found = None;
    for o in objects {
        let name = o.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if !(name.starts_with("libpython") || name.starts_with("python")) {
            continue;
        }
        if let Some(s) = runtime_symbols(&o.open_path) {
            found = Some((o, s));
            break;
        }
    }
    let Some((obj, RuntimeSymbols { runtime: runtime_vaddr, version, first_load, debug })) = found else {
        return Err("Python frames are not read: no object of the process defines _PyRuntime".into());
    };
    // Before 3.11 there is no Py_Version: the version in the object's name (libpython3.10.so.1.0,
    // python3.10).
    let (major, minor) = version.or_else(|| version_in_name(&obj.path)).ok_or_else(|| {
        format!(
            "Python frames are not read: no CPython version in {} (no Py_Version, no version in its name)",
            obj.path.display()
        )
    })?;
    let table = LAYOUTS.iter().find(|l| l.version == (major, minor)).copied();
    let (layout, source) = match (debug.filter(|d| d.version == (major, minor)), table) {
        (Some(d), _) => (d, Source::DebugOffsets),
        (None, Some(t)) => (t, Source::Table),
        (None, None) => return Err(unsupported(major, minor)),
    };
    let bias = load_bias(pid, obj, first_load)
        .ok_or_else(|| format!("Python frames are not read: {} is not mapped at offset 0", obj.path.display()))?;
    let runtime = runtime_vaddr.wrapping_add(bias);
    let target = PyTarget {
        tstate_addr: runtime + layout.runtime_tstate,
        interp_addr: runtime + layout.runtime_interp,
        offsets: layout.kernel,
        _pad: 0,
    };
    Ok((Interpreter { layout, source, mem: Memory::new(pid), code: HashMap::new() }, target))
}

/// The note for an interpreter whose version has no layout.
fn unsupported(major: u8, minor: u8) -> String {
    let mut versions: Vec<(u8, u8)> = LAYOUTS.iter().map(|l| l.version).collect();
    versions.sort();
    let supported: Vec<String> = versions.iter().map(|(a, b)| format!("{a}.{b}")).collect();
    format!(
        "Python frames are not read: CPython {major}.{minor} is not supported (supported: {}); stacks are native only",
        supported.join(", ")
    )
}

/// The (major, minor) of `libpython3.10.so.1.0`, `python3.10`, `libpython3.10d.so`.
fn version_in_name(path: &Path) -> Option<(u8, u8)> {
    let name = path.file_name()?.to_str()?;
    let v = name.trim_start_matches("lib").strip_prefix("python")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// What an object that defines `_PyRuntime` says of it.
struct RuntimeSymbols {
    /// `_PyRuntime`'s virtual address.
    runtime: u64,
    /// (major, minor) from `Py_Version` (3.11+).
    version: Option<(u8, u8)>,
    /// The lowest segment's virtual address, page-aligned.
    first_load: u64,
    /// The layout its `_Py_DebugOffsets` gives (3.13).
    debug: Option<Layout>,
}

/// The [`RuntimeSymbols`] of `path`; None when it does not define `_PyRuntime`.
fn runtime_symbols(path: &Path) -> Option<RuntimeSymbols> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let mut runtime = None;
    let mut version = None;
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        match sym.name() {
            Ok("_PyRuntime") if runtime.is_none() => runtime = Some(sym.address()),
            Ok("Py_Version") if version.is_none() => {
                // A const unsigned long (PY_VERSION_HEX) in a file-backed section.
                let v = file_bytes(&file, sym.address(), 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
                if let Some(v) = v.filter(|&v| v != 0) {
                    version = Some(((v >> 24) as u8, (v >> 16) as u8));
                }
            }
            _ => {}
        }
    }
    let first_load = file.segments().map(|s| s.address() & !0xfff).min().unwrap_or(0);
    let runtime = runtime?;
    // `_PyRuntime` is initialized data (3.13: its `_Py_DebugOffsets` first), the same bytes as
    // in the running process until it starts.
    let debug = file_bytes(&file, runtime, dbg::LEN).and_then(debug_offsets_layout);
    Some(RuntimeSymbols { runtime, version, first_load, debug })
}

/// `len` bytes of `file` at virtual address `addr`, when a segment holds them in the file (not
/// .bss).
fn file_bytes<'a>(file: &object::File<'a>, addr: u64, len: usize) -> Option<&'a [u8]> {
    file.segments().find_map(|s| {
        let (a, size) = (s.address(), s.size());
        if !(a..a + size).contains(&addr) {
            return None;
        }
        let bytes = s.data().ok()?;
        let at = (addr - a) as usize;
        bytes.get(at..at + len)
    })
}

/// Where `obj` is loaded in `pid`: the start of its mapping at file offset 0 minus its first
/// segment's address (0 for a non-PIE executable).
fn load_bias(pid: u32, obj: &MappedObject, first_load: u64) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", crate::procinfo::mm_task(pid))).ok()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let range = f.next()?;
        let _perms = f.next()?;
        let offset = u64::from_str_radix(f.next()?, 16).ok()?;
        let _dev = f.next()?;
        let inode: u64 = f.next()?.parse().ok()?;
        if inode != obj.inode || offset != 0 {
            return None;
        }
        let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
        Some(start.wrapping_sub(first_load))
    })
}

impl Interpreter {
    /// The Python frames of `frames` (innermost first, as the kernel read them): code objects
    /// read from the process's memory once each. Frames whose code object cannot be read are
    /// left out.
    pub fn frames(&mut self, frames: &[PyFrame]) -> Vec<Frame> {
        let mut out = Vec::with_capacity(frames.len());
        for f in frames {
            let layout = self.layout;
            let mem = &mut self.mem;
            let code = self.code.entry(f.code).or_insert_with(|| read_code(mem, &layout, f.code));
            let Some(code) = code else { continue };
            if code.filename == "<shim>" {
                // 3.12+: the frame the eval loop pushes on entry from C (owned by the C stack).
                continue;
            }
            let index = match layout.format {
                Format::Locations => f.instr.wrapping_sub(f.code + layout.co_code_adaptive) as i64 / 2,
                Format::Pep626 | Format::Lnotab => f.instr as u32 as i32 as i64,
            };
            let line = if !(0..1 << 24).contains(&index) {
                // Not started yet (prev_instr before the first instruction, f_lasti -1).
                Some(code.firstlineno)
            } else if layout.format == Format::Pep626 {
                line_of_310(&code.linetable, code.firstlineno, index as u32)
            } else if layout.format == Format::Lnotab {
                line_of_lnotab(&code.linetable, code.firstlineno, index as u32)
            } else {
                line_of(&code.linetable, code.firstlineno, index as u32)
            };
            out.push(Frame {
                addr: f.code,
                function: Some(code.qualname.clone()),
                file: Some(code.filename.clone()),
                line,
                kind: FrameKind::Python,
                ..Default::default()
            });
        }
        out
    }
}

/// A code object's names, first line and line table.
fn read_code(mem: &mut Memory, l: &Layout, code: u64) -> Option<Code> {
    // 3.13+: a code object, its type (`ob_type`, at 8) named "code" (`tp_name`, at 24): the
    // frames entered from C hold None in `f_executable`. (Older frames always hold code.)
    if l.version >= (3, 13) {
        let ob_type = mem.u64_at(code + 8)?;
        let tp_name = mem.u64_at(ob_type + 24)?;
        if mem.read(tp_name, 5)? != b"code\0" {
            return None;
        }
    }
    let qualname = match mem.u64_at(code + l.co_qualname).and_then(|o| read_str(mem, l, o)) {
        Some(q) => q,
        None => {
            let name = mem.u64_at(code + l.co_name)?;
            read_str(mem, l, name)?
        }
    };
    let filename = mem.u64_at(code + l.co_filename)?;
    let filename = read_str(mem, l, filename)?;
    let firstlineno = mem.read(code + l.co_firstlineno, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()))?;
    let table = mem.u64_at(code + l.co_linetable)?;
    // PyBytesObject: ob_size at 16, the bytes at 32.
    let len = mem.u64_at(table + 16)?;
    let linetable = if len <= 1 << 20 { mem.read(table + 32, len as usize)? } else { Vec::new() };
    Some(Code { qualname, filename, firstlineno, linetable })
}

/// A compact `str` object's text (ASCII or 1-, 2- or 4-byte kinds), at most 4096 characters.
fn read_str(mem: &mut Memory, l: &Layout, obj: u64) -> Option<String> {
    if obj == 0 {
        return None;
    }
    let head = mem.read(obj + 16, 24)?;
    let length = u64::from_le_bytes(head[0..8].try_into().unwrap());
    let state = u32::from_le_bytes(head[16..20].try_into().unwrap());
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || length > 4096 || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = obj + if ascii == 1 { l.ascii_header } else { l.compact_header };
    let raw = mem.read(data, length as usize * kind as usize)?;
    let chars: Option<String> = match kind {
        1 => Some(raw.iter().map(|&b| b as char).collect()),
        2 => raw.chunks(2).map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32)).collect(),
        _ => raw.chunks(4).map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap()))).collect(),
    };
    chars
}

/// The line of code unit `index` (instruction offset / 2) in a CPython 3.11+ location table
/// (`co_linetable`, Objects/locations.md), counted from `firstlineno`; None where the table
/// says the instruction has no line, or does not cover it.
pub fn line_of(table: &[u8], firstlineno: u32, index: u32) -> Option<u32> {
    let mut line = firstlineno as i64;
    let mut at = 0u32;
    let mut i = 0usize;
    while i < table.len() {
        let first = table[i];
        if first & 0x80 == 0 {
            return None; // not the start of an entry: a table we do not understand
        }
        i += 1;
        let code = (first >> 3) & 15;
        let units = (first & 7) as u32 + 1;
        let mut has_line = true;
        match code {
            15 => has_line = false,
            14 => {
                line += svarint(table, &mut i)?;
                for _ in 0..3 {
                    varint(table, &mut i)?;
                }
            }
            13 => line += svarint(table, &mut i)?,
            10..=12 => {
                line += (code - 10) as i64;
                i += 2;
            }
            _ => i += 1,
        }
        if index < at + units {
            return (has_line && line > 0).then_some(line as u32);
        }
        at += units;
    }
    None
}

/// The line of instruction `index` (code units) in a CPython 3.10 line table (`co_linetable`,
/// PEP 626, Objects/lnotab_notes.txt: pairs of an unsigned byte-offset delta and a signed line
/// delta, -128 for "no line"), counted from `firstlineno`; None where the table says the
/// instruction has no line, or does not cover it.
pub fn line_of_310(table: &[u8], firstlineno: u32, index: u32) -> Option<u32> {
    let target = index as u64 * 2;
    let (mut addr, mut line) = (0u64, firstlineno as i64);
    for pair in table.chunks_exact(2) {
        let end = addr + pair[0] as u64;
        let delta = pair[1] as i8;
        let cur = if delta == -128 {
            None
        } else {
            line += delta as i64;
            Some(line)
        };
        if (addr..end).contains(&target) {
            return cur.filter(|&l| l > 0).map(|l| l as u32);
        }
        addr = end;
    }
    None
}

/// The line of byte offset `lasti` in a CPython 3.8/3.9 `co_lnotab` (Objects/lnotab_notes.txt:
/// pairs of an unsigned byte-offset delta and a signed line delta; the line of an offset is the
/// one after the last pair whose offset is not past it, as `PyCode_Addr2Line`), counted from
/// `firstlineno`. The table does not say where the code ends: never None but for a line below 1.
pub fn line_of_lnotab(table: &[u8], firstlineno: u32, lasti: u32) -> Option<u32> {
    let (mut addr, mut line) = (0u64, firstlineno as i64);
    for pair in table.chunks_exact(2) {
        addr += pair[0] as u64;
        if addr > lasti as u64 {
            break;
        }
        line += pair[1] as i8 as i64;
    }
    (line > 0).then_some(line as u32)
}

fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = *t.get(*i)?;
        *i += 1;
        v |= ((b & 63) as u64) << shift;
        if b & 64 == 0 || shift > 56 {
            return Some(v);
        }
        shift += 6;
    }
}

fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
    let v = varint(t, i)?;
    Some(if v & 1 == 1 { -((v >> 1) as i64) } else { (v >> 1) as i64 })
}

/// Whether Python frames `py` are those of an import (a frame of the import machinery,
/// `<frozen importlib._bootstrap>` or `<frozen importlib._bootstrap_external>`): what is allocated
/// there is the imported module's code and state.
pub fn in_import(py: &[Frame]) -> bool {
    py.iter().any(|f| f.file.as_deref().is_some_and(|n| n.starts_with("<frozen importlib.")))
}

/// Put the Python frames `py` (innermost first) in `native` in place of the interpreter's eval
/// loop (`_PyEval_EvalFrameDefault` frames). As many eval frames as Python frames (always in
/// 3.10, where each Python call is a C call): one for one, in order. Else (3.11+, where Python
/// calls Python without a C call): all at the first eval frame, without the later ones (each of
/// them runs some of these Python frames); at the end when the walk did not reach the eval loop.
/// Frames are owned or shared (`Arc<Frame>`, as the recorder keeps them).
pub fn merge<F: std::borrow::Borrow<Frame>>(native: Vec<F>, py: Vec<F>) -> Vec<F> {
    if py.is_empty() {
        return native;
    }
    let is_eval = |f: &F| f.borrow().function.as_deref().is_some_and(|n| n == "_PyEval_EvalFrameDefault");
    if native.iter().filter(|f| is_eval(f)).count() == py.len() {
        let mut py = py.into_iter();
        return native.into_iter().map(|f| if is_eval(&f) { py.next().unwrap_or(f) } else { f }).collect();
    }
    let mut out = Vec::with_capacity(native.len() + py.len());
    let mut py = Some(py);
    for f in native {
        if is_eval(&f) {
            if let Some(p) = py.take() {
                out.extend(p);
            }
            continue;
        }
        out.push(f);
    }
    if let Some(p) = py {
        out.extend(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    /// The line table of this function, compiled by CPython 3.11.7 (`f.__code__.co_linetable`,
    /// co_firstlineno 1); the expected line of each code unit is from `f.__code__.co_lines()`:
    ///
    /// ```python
    /// def f(x):          # 1
    ///     y = x + 1      # 2
    ///
    ///     return g(y,    # 4
    ///              x)    # 5
    /// ```
    #[test]
    fn memory_is_read_through_one_handle() {
        let data: Vec<u8> = (0..64u8).collect();
        let mut mem = Memory::new(std::process::id());
        assert_eq!(mem.read(data.as_ptr() as u64 + 8, 4), Some(vec![8, 9, 10, 11]));
        let fd = mem.file.as_ref().map(|f| f.as_raw_fd()).expect("opened at the first read");
        assert_eq!(mem.u64_at(data.as_ptr() as u64), Some(u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7])));
        // An unmapped address fails (EIO) without reopening the handle.
        assert_eq!(mem.read(8, 8), None);
        assert_eq!(mem.file.as_ref().map(|f| f.as_raw_fd()), Some(fd), "the same handle is kept");
        assert_eq!(mem.read(data.as_ptr() as u64 + 63, 1), Some(vec![63]));
        // A process that does not exist: no handle, no data.
        let mut gone = Memory::new(u32::MAX - 1);
        assert_eq!(gone.read(data.as_ptr() as u64, 1), None);
    }

    #[test]
    fn line_table_311() {
        let table: &[u8] = &[
            0x80, 0x00, 0xd8, 0x08, 0x09, 0x88, 0x41, 0x89, 0x05, 0x80, 0x41, 0xe5, 0x0b, 0x0c, 0x88, 0x51, 0xd8, 0x0d,
            0x0e, 0xf1, 0x03, 0x01, 0x0c, 0x10, 0xf4, 0x00, 0x01, 0x0c, 0x10, 0xf0, 0x00, 0x01, 0x05, 0x10,
        ];
        let expect: &[(u32, Option<u32>)] = &[
            (0, Some(1)),
            (1, Some(2)),
            (2, Some(2)),
            (3, Some(2)),
            (4, Some(2)),
            (5, Some(2)),
            (6, Some(4)),
            (7, Some(4)),
            (8, Some(4)),
            (9, Some(4)),
            (10, Some(4)),
            (11, Some(4)),
            (12, Some(4)),
            (13, Some(5)),
            (14, Some(4)),
            (15, Some(4)),
            (16, Some(4)),
            (17, Some(4)),
            (18, Some(4)),
            (19, Some(4)),
            (20, Some(4)),
            (21, Some(4)),
        ];
        // the first unit past the table has no line
        assert_eq!(line_of(table, 1, 22), None);
        for &(unit, line) in expect {
            assert_eq!(line_of(table, 1, unit), line, "code unit {unit}");
        }
        // Counted from the code object's first line.
        assert_eq!(line_of(table, 40, 13), Some(44));
        // Not a table (no entry start bit): no line rather than a wrong one.
        assert_eq!(line_of(&[0x01, 0x02], 1, 0), None);
    }

    /// The same function compiled by CPython 3.10.13 (PEP 626 table), lines from `co_lines()`.
    #[test]
    fn line_table_310() {
        let table: &[u8] = &[0x08, 0x01, 0x04, 0x02, 0x02, 0x01, 0x04, 0xff];
        let expect: &[(u32, Option<u32>)] = &[
            (0, Some(2)),
            (1, Some(2)),
            (2, Some(2)),
            (3, Some(2)),
            (4, Some(4)),
            (5, Some(4)),
            (6, Some(5)),
            (7, Some(4)),
            (8, Some(4)),
        ];
        assert_eq!(line_of_310(table, 1, 9), None);
        for &(unit, line) in expect {
            assert_eq!(line_of_310(table, 1, unit), line, "code unit {unit}");
        }
        // A range with no line (-128).
        assert_eq!(line_of_310(&[0x02, 0x00, 0x02, 0x80], 7, 1), None);
        assert_eq!(line_of_310(&[0x02, 0x00, 0x02, 0x80], 7, 0), Some(7));
    }

    /// The same function compiled by CPython 3.9.18 and 3.8.18 (`co_lnotab`, the same in both);
    /// lines from `dis.get_instructions` (byte offsets).
    #[test]
    fn line_table_lnotab() {
        let table: &[u8] = &[0, 1, 8, 2, 4, 1, 2, 255];
        let expect: &[(u32, u32)] = &[(0, 2), (2, 2), (4, 2), (6, 2), (8, 4), (10, 4), (12, 5), (14, 4), (16, 4)];
        for &(offset, line) in expect {
            assert_eq!(line_of_lnotab(table, 1, offset), Some(line), "byte offset {offset}");
        }
        assert_eq!(line_of_lnotab(table, 40, 12), Some(44));
        assert_eq!(line_of_lnotab(&[2, 0x80], 1, 2), None, "a line below 1");
    }

    /// `_Py_DebugOffsets` read as 3.13.0 writes it (the offsets measured on its headers), and
    /// refused with another cookie, another version or an offset outside its structure.
    #[test]
    fn debug_offsets_313() {
        let mut b = vec![0u8; dbg::LEN];
        let mut put = |at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put(dbg::VERSION, 0x030d_00f0);
        for (at, v) in [
            (dbg::INTERPRETERS_HEAD, 632),
            (dbg::INTERP_SIZE, 100_000),
            (dbg::INTERP_GIL_HOLDER, 7760),
            (dbg::INTERP_THREADS_HEAD, 7344),
            (dbg::TSTATE_SIZE, 400),
            (dbg::TSTATE_CURRENT_FRAME, 72),
            (dbg::TSTATE_NATIVE_THREAD_ID, 160),
            (dbg::TSTATE_NEXT, 8),
            (dbg::TSTATE_THREAD_ID, 152),
            (dbg::FRAME_SIZE, 80),
            (dbg::FRAME_PREVIOUS, 8),
            (dbg::FRAME_EXECUTABLE, 0),
            (dbg::FRAME_INSTR_PTR, 56),
            (dbg::CODE_SIZE, 208),
            (dbg::CODE_FILENAME, 112),
            (dbg::CODE_NAME, 120),
            (dbg::CODE_QUALNAME, 128),
            (dbg::CODE_LINETABLE, 136),
            (dbg::CODE_FIRSTLINENO, 68),
            (dbg::CODE_ADAPTIVE, 200),
            (dbg::UNICODE_ASCII_SIZE, 40),
        ] {
            put(at, v);
        }
        b[..8].copy_from_slice(b"xdebugpy");
        let l = debug_offsets_layout(&b).expect("a 3.13 layout");
        let table = LAYOUTS.iter().find(|t| t.version == (3, 13)).unwrap();
        assert_eq!(l.kernel, table.kernel);
        assert_eq!(
            (l.runtime_tstate, l.co_code_adaptive, l.co_qualname, l.co_firstlineno, l.ascii_header, l.compact_header),
            (632, 200, 128, 68, 40, 56)
        );
        let mut other = b.clone();
        other[0] = b'y';
        assert!(debug_offsets_layout(&other).is_none(), "another cookie");
        let mut v314 = b.clone();
        v314[dbg::VERSION..dbg::VERSION + 8].copy_from_slice(&0x030e_00f0u64.to_le_bytes());
        assert!(debug_offsets_layout(&v314).is_none(), "3.14");
        let mut outside = b.clone();
        outside[dbg::FRAME_INSTR_PTR..dbg::FRAME_INSTR_PTR + 8].copy_from_slice(&80u64.to_le_bytes());
        assert!(debug_offsets_layout(&outside).is_none(), "instr_ptr past the frame");
        assert!(debug_offsets_layout(&b[..100]).is_none(), "too short");
    }

    #[test]
    fn merge_in_place_of_the_eval_loop() {
        let n = |name: &str| Frame { function: Some(name.into()), ..Default::default() };
        let p = |name: &str| Frame { function: Some(name.into()), kind: FrameKind::Python, ..Default::default() };
        let names = |v: Vec<Frame>| v.into_iter().map(|f| f.function.unwrap()).collect::<Vec<_>>();
        let eval = "_PyEval_EvalFrameDefault";
        // One eval frame per Python frame (3.10): one for one.
        let native = vec![n("strdup"), n("ext"), n(eval), n("call"), n(eval), n("main")];
        assert_eq!(names(merge(native, vec![p("f"), p("g")])), ["strdup", "ext", "f", "call", "g", "main"]);
        // Fewer eval frames (3.11): all at the first, the later ones dropped.
        let native = vec![n("strdup"), n("ext"), n(eval), n("call"), n(eval), n("main")];
        assert_eq!(
            names(merge(native, vec![p("f"), p("g"), p("h")])),
            ["strdup", "ext", "f", "g", "h", "call", "main"]
        );
        // No eval frame reached: at the end.
        assert_eq!(names(merge(vec![n("a")], vec![p("f")])), ["a", "f"]);
    }

    #[test]
    fn versions_in_names() {
        assert_eq!(version_in_name(Path::new("/usr/lib/libpython3.10.so.1.0")), Some((3, 10)));
        assert_eq!(version_in_name(Path::new("/usr/bin/python3.9")), Some((3, 9)));
        assert_eq!(version_in_name(Path::new("/usr/bin/python3")), None);
    }
}
