//! Goroutine-local roots of the typed walk of the Go heap ([`super::walk`]): every goroutine
//! of the runtime's `allgs` (as the goroutine census reads them) is unwound from where the
//! scheduler left it (`g.sched.pc`/`sp`, or `g.syscallpc`/`syscallsp` in a system call) through
//! the executable's `.debug_frame` (the CFA of each frame: `rsp` plus the offset at that pc;
//! the return address at CFA − 8), and in each frame of a program function (not the runtime's)
//! the locals and parameters the DWARF places in the frame at that pc (`DW_OP_fbreg`, the frame
//! base being `DW_OP_call_frame_cfa`, or `DW_OP_call_frame_cfa` plus a constant, whole or in
//! `DW_OP_piece`s; location lists honored) are read with their types and walked as roots named
//! `function.local` (`main.main.l`). The same local in several goroutines is one root.
//!
//! What this sees and what it does not: a build without optimizations (`-gcflags=all=-N -l`)
//! gives every local a frame slot for its whole scope (a slot may hold a dead value, which is
//! then walked too: an over-count, never a miss). An optimized build gives a local a location
//! list; across a call (where a parked goroutine always is, Go's ABI keeping no register
//! across calls) a live pointer is spilled to the frame and the list says where, but a local
//! the compiler keeps only in a register, folds into another, or allocates on the stack
//! without a DWARF entry is not seen: the runtime's stack maps (`FUNCDATA_LocalsPointerMaps`)
//! would find such a slot's pointer without its name or type; they are not read. A running
//! goroutine (its registers are on a thread) is not unwound: the walk counts it.
//!
//! The target forges the stacks, the pcs and the DWARF: every frame must lie in the
//! goroutine's `stack.lo..stack.hi` and move up, frames, goroutines, locals and pieces are
//! bounded, and a read that fails ends that goroutine's unwinding.

use gimli::UnwindSection as _;
use object::{Object as _, ObjectSymbol as _};

use super::dwarf::{Memory, NONE, Shape, TypeId, Types, is_program_root, section, structs};

/// Frames unwound per goroutine at most.
const MAX_FRAMES: usize = 1024;
/// Goroutines whose stacks are read at most, frames unwound in all at most (a forged stack
/// cannot make the pass long).
pub const MAX_GOROUTINES: usize = 100_000;
pub const MAX_ALL_FRAMES: u64 = 1_000_000;
/// Locals kept from the DWARF at most, pieces of one location at most.
const MAX_LOCALS: usize = 1_000_000;
const MAX_PIECES: usize = 16;
/// Largest offset of a `runtime.g` field believed (the structure is about 400 B).
const MAX_FIELD_OFFSET: u64 = 4096;
/// A local's value read at most (a larger one is not a root).
const MAX_LOCAL_SIZE: u64 = 1 << 16;
/// DWARF register number of `rsp` on x86-64.
const RSP: u16 = 7;
/// `g.atomicstatus` values: `_Grunning`, `_Gsyscall`, `_Gdead`, `_Gcopystack`.
const G_RUNNING: u32 = 2;
const G_SYSCALL: u32 = 3;
const G_DEAD: u32 = 6;
const G_COPYSTACK: u32 = 8;

/// Bytes of a local's value at CFA + `cfa_off` (None: in a register, not readable from outside).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Piece {
    pub cfa_off: Option<i64>,
    pub size: u64,
}

/// A local or parameter: where its value is (pc ranges as linked, each with its pieces).
#[derive(Clone, Debug)]
pub struct Local {
    pub name: String,
    pub ty: TypeId,
    pub at: Vec<(u64, u64, Vec<Piece>)>,
}

/// A function's code range, name, and the locals walked (those whose type holds pointers; none
/// for the runtime's own functions).
#[derive(Clone, Debug)]
pub struct Func {
    pub lo: u64,
    pub hi: u64,
    pub name: String,
    pub locals: Vec<Local>,
}

/// Where the fields the unwinding needs are in `runtime.g` (and its `gobuf`).
#[derive(Clone, Copy, Debug, Default)]
struct GFields {
    sched_sp: u64,
    sched_pc: u64,
    syscallsp: u64,
    syscallpc: u64,
    stack: u64,
    status: u64,
    startpc: u64,
}

impl GFields {
    fn span(&self) -> u64 {
        [self.sched_sp, self.sched_pc, self.syscallsp, self.syscallpc, self.stack + 8, self.startpc]
            .into_iter()
            .max()
            .unwrap_or(0)
            + 8
    }
}

/// One goroutine-local root as read: `function.local`, its type, its value's bytes, and the
/// function the goroutine was started at.
#[derive(Clone, Debug)]
pub struct LocalRoot {
    pub name: String,
    pub ty: TypeId,
    pub value: Vec<u8>,
    pub started_at: String,
}

/// What one pass over the goroutines found.
#[derive(Clone, Debug, Default)]
pub struct StackRoots {
    pub roots: Vec<LocalRoot>,
    pub goroutines: u64,
    /// Running goroutines (not unwound: their registers are on a thread).
    pub running: u64,
    pub frames: u64,
    /// Why the pass stopped short, when it did.
    pub cut: Option<String>,
}

/// What the executable says about its goroutines' frames, read once.
pub struct Stacks {
    /// CFA = rsp + offset from `start` (link address) on, sorted; an `end` closes each FDE.
    cfa: Vec<(u64, u64, i64)>,
    /// Every function, by `lo`.
    funcs: Vec<Func>,
    g: GFields,
    allgs: u64,
}

impl Stacks {
    /// Read the frames' tables from `file` with `types` (the same DWARF).
    pub fn new(file: &object::File<'_>, types: &Types) -> Result<Stacks, String> {
        let allgs = file
            .symbols()
            .find(|s| s.name() == Ok("runtime.allgs"))
            .map(|s| s.address())
            .ok_or("no symbol runtime.allgs")?;
        let structs = structs(file, &["runtime.g", "runtime.gobuf"])?;
        let (_, g) = structs.get("runtime.g").ok_or("no runtime.g in DWARF")?;
        let (_, gobuf) = structs.get("runtime.gobuf").ok_or("no runtime.gobuf in DWARF")?;
        let f = |m: &std::collections::HashMap<String, u64>, n: &str| {
            m.get(n).copied().filter(|&o| o <= MAX_FIELD_OFFSET).ok_or(format!("no runtime.g/gobuf field {n} in DWARF"))
        };
        let sched = f(g, "sched")?;
        let fields = GFields {
            sched_sp: sched + f(gobuf, "sp")?,
            sched_pc: sched + f(gobuf, "pc")?,
            syscallsp: f(g, "syscallsp")?,
            syscallpc: f(g, "syscallpc")?,
            stack: f(g, "stack")?,
            status: f(g, "atomicstatus")?,
            startpc: f(g, "startpc")?,
        };
        let cfa = cfa_table(file)?;
        let funcs = functions(file, types)?;
        Ok(Stacks { cfa, funcs, g: fields, allgs })
    }

    /// Locals in the program's frames in use right now; `bias` added to link addresses.
    pub fn roots(&self, mem: &mut dyn Memory, bias: u64, types: &Types) -> StackRoots {
        let mut out = StackRoots::default();
        let mut b = Vec::new();
        if !mem.read(self.allgs.wrapping_add(bias), 16, &mut b) {
            return out;
        }
        let (ptr, len) = (word(&b, 0), (word(&b, 8) as usize).min(MAX_GOROUTINES));
        let mut gs = Vec::new();
        if len == 0 || !mem.read(ptr, len * 8, &mut gs) {
            return out;
        }
        let span = self.g.span() as usize;
        for i in 0..len {
            if out.cut.is_some() {
                break;
            }
            let gp = word(&gs, (i * 8) as u64);
            if gp < 4096 || !mem.read(gp, span, &mut b) {
                continue;
            }
            let status = u32::from_le_bytes(
                b.get(self.g.status as usize..self.g.status as usize + 4)
                    .and_then(|s| s.try_into().ok())
                    .unwrap_or_default(),
            ) & !0x1000;
            if status == G_DEAD || status == G_COPYSTACK {
                continue;
            }
            out.goroutines += 1;
            if status == G_RUNNING {
                out.running += 1;
                continue;
            }
            let (sp, pc) = if status == G_SYSCALL {
                (word(&b, self.g.syscallsp), word(&b, self.g.syscallpc))
            } else {
                (word(&b, self.g.sched_sp), word(&b, self.g.sched_pc))
            };
            let stack = (word(&b, self.g.stack), word(&b, self.g.stack + 8));
            let started_at = self.func(word(&b, self.g.startpc).wrapping_sub(bias)).map_or("?", |f| &f.name);
            let started_at = started_at.to_string();
            self.unwind(mem, bias, types, (pc, sp), stack, &started_at, &mut out);
        }
        out
    }

    /// Walk one goroutine's frames from (`pc`, `sp`) (as loaded) within `stack` (lo, hi).
    #[allow(clippy::too_many_arguments, reason = "one goroutine's unwinding state")]
    fn unwind(
        &self,
        mem: &mut dyn Memory,
        bias: u64,
        types: &Types,
        (mut pc, mut sp): (u64, u64),
        (lo, hi): (u64, u64),
        started_at: &str,
        out: &mut StackRoots,
    ) {
        let mut b = Vec::new();
        for depth in 0..MAX_FRAMES {
            if sp < lo || sp >= hi || pc == 0 {
                return;
            }
            if out.frames >= MAX_ALL_FRAMES {
                out.cut = Some(format!("the goroutines' frames stopped at {MAX_ALL_FRAMES}: their locals are partial"));
                return;
            }
            // A caller's pc is a return address: the call is the byte before it.
            let q = pc.wrapping_sub(bias).wrapping_sub(u64::from(depth > 0));
            let (Some(off), Some(f)) = (self.cfa_at(q), self.func(q)) else { return };
            let cfa = sp.wrapping_add_signed(off);
            if cfa <= sp || cfa > hi || f.name == "runtime.goexit" {
                return;
            }
            out.frames += 1;
            for l in &f.locals {
                let Some((_, _, pieces)) = l.at.iter().find(|(a, z, _)| q >= *a && q < *z) else { continue };
                let size = types.size(l.ty);
                let mut value = vec![0u8; size as usize];
                let (mut at, mut any) = (0usize, false);
                for p in pieces {
                    let end = at.saturating_add(p.size as usize).min(value.len());
                    if let Some(o) = p.cfa_off
                        && end > at
                        && mem.read(cfa.wrapping_add_signed(o), end - at, &mut b)
                    {
                        value[at..end].copy_from_slice(&b[..end - at]);
                        any = true;
                    }
                    at = end;
                }
                if any && value.iter().any(|&x| x != 0) {
                    let name = format!("{}.{}", f.name, l.name);
                    out.roots.push(LocalRoot { name, ty: l.ty, value, started_at: started_at.to_string() });
                }
            }
            if !mem.read(cfa - 8, 8, &mut b) {
                return;
            }
            (pc, sp) = (word(&b, 0), cfa);
        }
    }

    fn cfa_at(&self, pc: u64) -> Option<i64> {
        let i = self.cfa.partition_point(|r| r.0 <= pc).checked_sub(1)?;
        let (_, end, off) = self.cfa[i];
        (pc < end).then_some(off)
    }

    fn func(&self, pc: u64) -> Option<&Func> {
        let i = self.funcs.partition_point(|f| f.lo <= pc).checked_sub(1)?;
        let f = &self.funcs[i];
        (pc < f.hi).then_some(f)
    }
}

fn word(b: &[u8], at: u64) -> u64 {
    b.get(at as usize..(at as usize).saturating_add(8))
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
}

/// `.debug_frame`'s rows where the CFA is `rsp` plus an offset (every Go function's).
fn cfa_table(file: &object::File<'_>) -> Result<Vec<(u64, u64, i64)>, String> {
    let data = section(file, ".debug_frame");
    if data.is_empty() {
        return Err("the executable has no .debug_frame".into());
    }
    let mut frame = gimli::DebugFrame::new(&data, gimli::LittleEndian);
    frame.set_address_size(8);
    let bases = gimli::BaseAddresses::default();
    let mut ctx = Box::new(gimli::UnwindContext::new());
    let mut rows = Vec::new();
    let mut entries = frame.entries(&bases);
    while let Some(e) = entries.next().map_err(|e| format!(".debug_frame: {e}"))? {
        let gimli::CieOrFde::Fde(partial) = e else { continue };
        let Ok(fde) = partial.parse(gimli::DebugFrame::cie_from_offset) else { continue };
        let Ok(mut table) = fde.rows(&frame, &bases, &mut ctx) else { continue };
        while let Ok(Some(row)) = table.next_row() {
            if let gimli::CfaRule::RegisterAndOffset { register, offset } = row.cfa()
                && register.0 == RSP
                && rows.len() < MAX_LOCALS
            {
                rows.push((row.start_address(), row.end_address(), *offset));
            }
        }
    }
    rows.sort_by_key(|r| r.0);
    Ok(rows)
}

/// Every subprogram's range and name, and the locals of the program's own functions.
fn functions(file: &object::File<'_>, types: &Types) -> Result<Vec<Func>, String> {
    let owned =
        gimli::DwarfSections::load(|id| Ok::<_, gimli::Error>(section(file, id.name()))).map_err(|e| e.to_string())?;
    let dwarf = owned.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let err = |e: gimli::Error| format!("DWARF: {e}");
    let mut funcs: Vec<Func> = Vec::new();
    let mut kept = 0usize;
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(err)? {
        let unit = dwarf.unit(header).map_err(err)?;
        let mut entries = unit.entries();
        // The function being read (its depth, index) and the enclosing scopes' ranges.
        let mut func: Option<(isize, usize)> = None;
        let mut scopes: Vec<(isize, Vec<(u64, u64)>)> = Vec::new();
        while let Some(e) = entries.next_dfs().map_err(err)? {
            let depth = e.depth();
            scopes.retain(|s| s.0 < depth);
            if func.is_some_and(|f| f.0 >= depth) {
                func = None;
            }
            let ranges = || -> Vec<(u64, u64)> {
                let mut v = Vec::new();
                if let Ok(mut r) = dwarf.die_ranges(&unit, e) {
                    while let Ok(Some(r)) = r.next() {
                        if v.len() < 64 {
                            v.push((r.begin, r.end));
                        }
                    }
                }
                v
            };
            match e.tag() {
                gimli::DW_TAG_subprogram => {
                    let name = e
                        .attr_value(gimli::DW_AT_name)
                        .and_then(|v| dwarf.attr_string(&unit, v).ok())
                        .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
                        .unwrap_or_default();
                    let r = ranges();
                    let Some(&(lo, hi)) = r.first() else { continue };
                    let program = is_program_root(&name);
                    funcs.push(Func { lo, hi, name, locals: Vec::new() });
                    if program {
                        func = Some((depth, funcs.len() - 1));
                        scopes.push((depth, r));
                    }
                }
                gimli::DW_TAG_lexical_block if func.is_some() => scopes.push((depth, ranges())),
                gimli::DW_TAG_variable | gimli::DW_TAG_formal_parameter if kept < MAX_LOCALS => {
                    let Some((_, fi)) = func else { continue };
                    let ty = match e.attr_value(gimli::DW_AT_type) {
                        Some(gimli::AttributeValue::UnitRef(o)) => o.to_debug_info_offset(&unit.header).map(|d| d.0),
                        Some(gimli::AttributeValue::DebugInfoRef(d)) => Some(d.0),
                        _ => None,
                    };
                    let ty = ty.and_then(|o| types.by_die.get(&(o as u64)).copied()).unwrap_or(NONE);
                    if *types.shape(ty) == Shape::NoPtr || types.size(ty) > MAX_LOCAL_SIZE {
                        continue;
                    }
                    let scope = scopes.last().map(|s| s.1.clone()).unwrap_or_default();
                    let at = location(&dwarf, &unit, e, &scope, types.size(ty));
                    if at.is_empty() {
                        continue;
                    }
                    let name = e
                        .attr_value(gimli::DW_AT_name)
                        .and_then(|v| dwarf.attr_string(&unit, v).ok())
                        .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
                        .unwrap_or_default();
                    kept += 1;
                    funcs[fi].locals.push(Local { name, ty, at });
                }
                _ => {}
            }
        }
    }
    funcs.sort_by_key(|f| f.lo);
    Ok(funcs)
}

type Reader<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// Where a local is: its expression over its scope, or its location list's entries.
fn location(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    e: &gimli::DebuggingInformationEntry<Reader<'_>>,
    scope: &[(u64, u64)],
    size: u64,
) -> Vec<(u64, u64, Vec<Piece>)> {
    let enc = unit.encoding();
    match e.attr_value(gimli::DW_AT_location) {
        Some(gimli::AttributeValue::Exprloc(x)) => match pieces(x, enc, size) {
            Some(p) => scope.iter().map(|&(a, z)| (a, z, p.clone())).collect(),
            None => Vec::new(),
        },
        Some(v) => {
            let mut out = Vec::new();
            if let Ok(Some(mut list)) = dwarf.attr_locations(unit, v) {
                while let Ok(Some(l)) = list.next() {
                    if out.len() >= 256 {
                        break;
                    }
                    if let Some(p) = pieces(l.data, enc, size) {
                        out.push((l.range.begin, l.range.end, p));
                    }
                }
            }
            out
        }
        None => Vec::new(),
    }
}

/// A location expression as pieces of the frame (`DW_OP_fbreg N`, `DW_OP_call_frame_cfa` plus
/// constants, registers as unreadable pieces, `DW_OP_piece`); None for any other operation.
pub fn pieces(x: gimli::Expression<Reader<'_>>, enc: gimli::Encoding, size: u64) -> Option<Vec<Piece>> {
    let mut ops = x.operations(enc);
    let mut out = Vec::new();
    let mut cur: Option<Option<i64>> = None;
    while let Ok(Some(op)) = ops.next() {
        match op {
            gimli::Operation::FrameOffset { offset } => cur = Some(Some(offset)),
            gimli::Operation::CallFrameCFA => cur = Some(Some(0)),
            gimli::Operation::PlusConstant { value } => {
                cur = Some(cur.flatten().map(|o| o.wrapping_add(value as i64)));
            }
            gimli::Operation::SignedConstant { value } if cur.is_some() => {
                // `DW_OP_call_frame_cfa; DW_OP_consts N; DW_OP_plus`: the plus follows.
                let Ok(Some(gimli::Operation::Plus)) = ops.next() else { return None };
                cur = Some(cur.flatten().map(|o| o.wrapping_add(value)));
            }
            gimli::Operation::Register { .. } => cur = Some(None),
            gimli::Operation::Piece { size_in_bits, bit_offset: None } if size_in_bits % 8 == 0 => {
                if out.len() >= MAX_PIECES {
                    return None;
                }
                out.push(Piece { cfa_off: cur.take().flatten(), size: size_in_bits / 8 });
            }
            _ => return None,
        }
    }
    if out.is_empty() {
        return Some(vec![Piece { cfa_off: Some(cur.flatten()?), size }]);
    }
    out.iter().any(|p| p.cfa_off.is_some()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr(b: &[u8]) -> Option<Vec<Piece>> {
        let enc = gimli::Encoding { address_size: 8, format: gimli::Format::Dwarf32, version: 4 };
        pieces(gimli::Expression(gimli::EndianSlice::new(b, gimli::LittleEndian)), enc, 16)
    }

    #[test]
    fn locations_in_the_frame_read_as_pieces() {
        // DW_OP_fbreg -120
        assert_eq!(expr(&[0x91, 0x88, 0x7f]), Some(vec![Piece { cfa_off: Some(-120), size: 16 }]));
        // DW_OP_call_frame_cfa; DW_OP_consts -8; DW_OP_plus
        assert_eq!(expr(&[0x9c, 0x11, 0x78, 0x22]), Some(vec![Piece { cfa_off: Some(-8), size: 16 }]));
        // DW_OP_fbreg -152, DW_OP_piece 8, DW_OP_reg3, DW_OP_piece 8
        assert_eq!(
            expr(&[0x91, 0xe8, 0x7e, 0x93, 8, 0x53, 0x93, 8]),
            Some(vec![Piece { cfa_off: Some(-152), size: 8 }, Piece { cfa_off: None, size: 8 }])
        );
        // DW_OP_reg0 alone: nothing in the frame; DW_OP_addr: not a local's frame slot.
        assert_eq!(expr(&[0x50]), None);
        assert_eq!(expr(&[0x03, 0, 0, 0, 0, 0, 0, 0, 0]), None);
    }
}
