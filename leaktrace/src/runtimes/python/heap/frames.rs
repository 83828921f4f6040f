//! The live threads' frame locals as roots of the census: an object kept only by a
//! local variable of a running function (`def worker(): cache = []; while True: cache.append(..)`)
//! is held by that frame, not "referenced from nowhere".
//!
//! Every thread state of the main interpreter (`tstate_head` / `threads.head`, then `next`) is
//! read, and its frame chain from the innermost frame (3.11, 3.12: `cframe->current_frame`; 3.13:
//! `current_frame`; 3.8–3.10: `frame`) through `previous` / `f_back`. Each frame's local slots
//! are roots: 3.11+ `_PyInterpreterFrame.localsplus[0 .. co_nlocalsplus]` named by
//! `co_localsplusnames`; 3.8–3.10 `PyFrameObject.f_localsplus[0 .. co_nlocals + cells + frees]`
//! named by `co_varnames`, `co_cellvars`, `co_freevars`. The evaluation stack above them is not
//! read: the innermost frame's stack top is not saved while it runs (3.12 marks it −1), and a
//! stale slot would count a freed object.
//!
//! Offsets: the thread-state list, the current frame and the frame chain as the kernel side
//! follows them ([`crate::runtimes::python::frames::Layout::kernel`]); the local slots and the code object's
//! counts measured with `offsetof` on each version's headers (pyenv 3.8.18–3.13.0 and Debian's
//! 3.11.2, `Include/internal/pycore_frame.h`, `cpython/code.h`, `frameobject.h`, built with
//! `Py_BUILD_CORE`).

use leaktrace_common::py_offset as K;

use super::decode;
use super::layout::HeapLayout;
use super::mem::{FastMap, Mem};
use crate::runtimes::python::frames::{self as pyframes, Format};

/// Most threads and frames per thread read, and local slots per frame.
const MAX_THREADS: usize = 4096;
const MAX_FRAMES: usize = 2048;
const MAX_SLOTS: u64 = 4096;

/// Where one version keeps the frames and their locals.
#[derive(Clone, Copy, Debug)]
pub struct FrameLayout {
    /// `PyInterpreterState` → first thread state; `PyThreadState.next`, `.thread_id`
    /// (`pthread_self()`: the thread's fsbase on x86-64).
    interp_threads: u64,
    tstate_next: u64,
    tstate_pthread: u64,
    /// `PyThreadState.cframe` (3.11, 3.12), None when the thread state holds the frame.
    tstate_cframe: Option<u64>,
    current_frame: u64,
    frame_code: u64,
    frame_previous: u64,
    frame_instr: u64,
    /// Offset of the first local slot in a frame.
    localsplus: u64,
    /// 3.11+: `_PyInterpreterFrame.owner` (a C-stack shim frame, 3, is skipped).
    frame_owner: Option<u64>,
    /// 3.11+: `co_nlocalsplus` and `co_localsplusnames`; before: `co_nlocals` and
    /// `co_varnames`, with `co_cellvars` and `co_freevars` after them.
    co_nlocals: u64,
    co_names: u64,
    co_cells_frees: Option<(u64, u64)>,
    co_qualname: u64,
    co_filename: u64,
    co_firstlineno: u64,
    co_linetable: u64,
    co_code_adaptive: u64,
    format: Format,
}

impl FrameLayout {
    /// The frame layout of the interpreter whose frames `l` describes; None for a version
    /// whose local slots are not known.
    pub fn new(l: &pyframes::Layout) -> Option<FrameLayout> {
        let k = |i: usize| (l.kernel[i] != K::NONE).then_some(u64::from(l.kernel[i]));
        let (localsplus, frame_owner, co_nlocals, co_names, co_cells_frees) = match l.version {
            (3, 8) | (3, 9) => (360, None, 28, 72, Some((88, 80))),
            (3, 10) => (352, None, 28, 72, Some((88, 80))),
            (3, 11) => (72, Some(69), 76, 96, None),
            (3, 12) | (3, 13) => (72, Some(70), 72, 96, None),
            _ => return None,
        };
        Some(FrameLayout {
            interp_threads: k(K::INTERP_THREADS)?,
            tstate_next: k(K::TSTATE_NEXT)?,
            tstate_pthread: k(K::TSTATE_PTHREAD_ID)?,
            tstate_cframe: k(K::TSTATE_CFRAME),
            current_frame: k(K::CURRENT_FRAME)?,
            frame_code: k(K::FRAME_CODE)?,
            frame_previous: k(K::FRAME_PREVIOUS)?,
            frame_instr: k(K::FRAME_INSTR)?,
            localsplus,
            frame_owner,
            co_nlocals,
            co_names,
            co_cells_frees,
            co_qualname: l.co_qualname,
            co_filename: l.co_filename,
            co_firstlineno: l.co_firstlineno,
            co_linetable: l.co_linetable,
            co_code_adaptive: l.co_code_adaptive,
            format: l.format,
        })
    }
}

/// A local variable of a running frame, a root of the census.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalRoot {
    /// The object the slot holds.
    pub obj: u64,
    /// The root as a pattern groups it: "local `cache` of worker()".
    pub pattern: String,
    /// The root as an example path tells it, with the thread and the frame's line:
    /// "local `cache` of worker() (thread 4242, app.py:17)".
    pub example: String,
}

/// What a code object says of itself, for the roots.
struct Code {
    qualname: String,
    file: String,
    firstlineno: u32,
    linetable: Vec<u8>,
    /// The local slots' names, in slot order.
    names: Vec<String>,
}

/// The local roots of every thread of the interpreter at `interp`. `tids`: a stopped thread's
/// fsbase (its `pthread_self()`) → its thread id; `pid`: the main thread's. Unreadable thread
/// states, frames and code objects are skipped.
pub fn local_roots(
    mem: &mut Mem,
    hl: &HeapLayout,
    fl: &FrameLayout,
    interp: u64,
    tids: &FastMap<u64, i32>,
    pid: u32,
) -> Vec<LocalRoot> {
    let mut out = Vec::new();
    let mut codes: FastMap<u64, Option<Code>> = FastMap::default();
    let mut tstate = mem.u64(interp + fl.interp_threads).unwrap_or(0);
    let mut n = 0;
    while tstate != 0 && n < MAX_THREADS {
        n += 1;
        let thread = match mem.u64(tstate + fl.tstate_pthread).and_then(|p| tids.get(&p)) {
            Some(&t) if t as u32 == pid => "main thread".to_string(),
            Some(&t) => format!("thread {t}"),
            None => "a thread".to_string(),
        };
        let holder = match fl.tstate_cframe {
            Some(o) => mem.u64(tstate + o).unwrap_or(0),
            None => tstate,
        };
        let mut frame = if holder == 0 { 0 } else { mem.u64(holder + fl.current_frame).unwrap_or(0) };
        let mut depth = 0;
        while frame != 0 && depth < MAX_FRAMES {
            depth += 1;
            frame_roots(mem, hl, fl, frame, &thread, &mut codes, &mut out);
            frame = mem.u64(frame + fl.frame_previous).unwrap_or(0);
        }
        tstate = mem.u64(tstate + fl.tstate_next).unwrap_or(0);
    }
    out
}

/// The roots of one frame.
fn frame_roots(
    mem: &mut Mem,
    hl: &HeapLayout,
    fl: &FrameLayout,
    frame: u64,
    thread: &str,
    codes: &mut FastMap<u64, Option<Code>>,
    out: &mut Vec<LocalRoot>,
) {
    // 3.12+: the shim frame the eval loop pushes on entry from C holds nothing.
    if let Some(o) = fl.frame_owner
        && mem.bytes(frame + o, 1).is_some_and(|b| b[0] == 3)
    {
        return;
    }
    let Some(code) = mem.u64(frame + fl.frame_code).filter(|&c| c != 0) else { return };
    let Some(c) = codes.entry(code).or_insert_with(|| read_code(mem, hl, fl, code)).as_ref() else { return };
    if c.names.is_empty() {
        return;
    }
    let Some(slots) = mem.bytes(frame + fl.localsplus, 8 * c.names.len()) else { return };
    let instr = mem.u64(frame + fl.frame_instr).unwrap_or(0);
    let index = match fl.format {
        Format::Locations => instr.wrapping_sub(code + fl.co_code_adaptive) as i64 / 2,
        Format::Pep626 | Format::Lnotab => instr as u32 as i32 as i64,
    };
    let line = if !(0..1 << 24).contains(&index) {
        Some(c.firstlineno)
    } else {
        match fl.format {
            Format::Locations => pyframes::line_of(&c.linetable, c.firstlineno, index as u32),
            Format::Pep626 => pyframes::line_of_310(&c.linetable, c.firstlineno, index as u32),
            Format::Lnotab => pyframes::line_of_lnotab(&c.linetable, c.firstlineno, index as u32),
        }
    };
    let at = line.map_or_else(|| c.file.clone(), |l| format!("{}:{l}", c.file));
    for (name, slot) in c.names.iter().zip(slots.chunks_exact(8)) {
        let obj = u64::from_le_bytes(slot.try_into().unwrap());
        if obj == 0 {
            continue;
        }
        let pattern = format!("local `{name}` of {}()", c.qualname);
        let example = format!("{pattern} ({thread}, {at})");
        out.push(LocalRoot { obj, pattern, example });
    }
}

/// A code object's names, file, line table and local slots' names; None when it is not a code
/// object (3.13: a frame entered from C holds None) or cannot be read.
fn read_code(mem: &mut Mem, hl: &HeapLayout, fl: &FrameLayout, code: u64) -> Option<Code> {
    let ty = mem.u64(code + 8)?;
    let tp_name = mem.u64(ty + 24)?;
    if mem.bytes(tp_name, 5)? != b"code\0" {
        return None;
    }
    let text = |mem: &mut Mem, off: u64| mem.u64(code + off).and_then(|s| decode::read_str(mem, hl, s, 200));
    let qualname = text(mem, fl.co_qualname)?;
    let file = text(mem, fl.co_filename).unwrap_or_default();
    let file = file.rsplit('/').next().unwrap_or_default().to_string();
    let firstlineno = u32::from_le_bytes(mem.bytes(code + fl.co_firstlineno, 4)?.try_into().unwrap());
    let linetable = mem.u64(code + fl.co_linetable).and_then(|t| {
        // PyBytesObject: ob_size at 16, the bytes at 32.
        let len = mem.u64(t + 16)?;
        if len <= 1 << 20 { mem.bytes(t + 32, len as usize) } else { None }
    });
    let count = u64::from(u32::from_le_bytes(mem.bytes(code + fl.co_nlocals, 4)?.try_into().unwrap()));
    let mut names = tuple_strs(mem, hl, code + fl.co_names);
    if let Some((cells, frees)) = fl.co_cells_frees {
        // 3.8–3.10: the slots are the locals (`co_nlocals` of `co_varnames`), the cells, the
        // free variables.
        names.truncate(count as usize);
        names.extend(tuple_strs(mem, hl, code + cells));
        names.extend(tuple_strs(mem, hl, code + frees));
    } else {
        names.truncate(count as usize);
    }
    if names.len() as u64 > MAX_SLOTS {
        names.truncate(MAX_SLOTS as usize);
    }
    Some(Code { qualname, file, firstlineno, linetable: linetable.unwrap_or_default(), names })
}

/// The texts of the tuple of str whose pointer is at `field` (`?` for an item that is not a
/// str); empty when unreadable.
fn tuple_strs(mem: &mut Mem, hl: &HeapLayout, field: u64) -> Vec<String> {
    let tuple = mem.u64(field).unwrap_or(0);
    if tuple == 0 {
        return Vec::new();
    }
    let n = mem.u64(tuple + 16).unwrap_or(0);
    if n > MAX_SLOTS {
        return Vec::new();
    }
    let Some(items) = mem.bytes(tuple + 24, 8 * n as usize) else { return Vec::new() };
    items
        .chunks_exact(8)
        .map(|c| decode::read_str(mem, hl, u64::from_le_bytes(c.try_into().unwrap()), 80).unwrap_or_else(|| "?".into()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every version with frame layouts has its locals' layout, and the offsets the kernel side
    /// follows are the ones measured with `offsetof` for the locals' slots (3.11:
    /// `_PyInterpreterFrame.f_code` 32, `previous` 48; 3.12+: 0 and 8; 3.8–3.10:
    /// `PyFrameObject.f_back` 24, `f_code` 32).
    #[test]
    fn every_supported_version_has_its_locals_layout() {
        for l in pyframes::LAYOUTS {
            let f = FrameLayout::new(l).unwrap_or_else(|| panic!("{:?}", l.version));
            let (code, previous) = match l.version {
                (3, 11) => (32, 48),
                (3, 12) | (3, 13) => (0, 8),
                _ => (32, 24),
            };
            assert_eq!((f.frame_code, f.frame_previous), (code, previous), "{:?}", l.version);
            assert_eq!(f.co_cells_frees.is_none(), l.version >= (3, 11), "{:?}", l.version);
            assert!(f.localsplus > f.frame_previous && f.co_names > f.co_nlocals, "{:?}", l.version);
        }
    }
}
