//! Unwind tables for the kernel-side stack walk, built from an object's call frame information.
//!
//! For every object a target maps, `.eh_frame` (or `.debug_frame` when there is no `.eh_frame`)
//! is read with gimli and each FDE's rows are turned into compact [`UnwindRow`]s sorted by
//! address: CFA = %rsp + N or %rbp + N, the PLT expression, the stack-realignment (DRAP)
//! expression, where the caller's %rbp is saved, and "outermost frame" where the return address
//! is undefined. Anything else (other CFA registers or expressions) becomes a no-rule row, where
//! the kernel walk falls back to frame pointers. Rows are 8 bytes; consecutive rows with the same
//! rule are merged. x86-64 only: on other architectures no table is built.

use std::path::Path;

use anyhow::{Context as _, bail};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, LittleEndian, Register, RegisterRule, UnwindContext,
    UnwindSection,
};
use leaktrace_common::{UnwindRow, unwind};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

const RSP: Register = Register(7);
const RBP: Register = Register(6);
const RA: Register = Register(16);

/// Most rows one object's table may have (the kernel's binary search takes 24 steps).
pub const MAX_ROWS_PER_OBJECT: usize = 1 << 24;

/// An object's unwind table, ready to load.
#[derive(Debug, Default)]
pub struct Table {
    /// Rows sorted by `pc` (the object's virtual addresses).
    pub rows: Vec<UnwindRow>,
    /// Virtual address minus file offset of the executable segment.
    pub vaddr_minus_offset: i64,
    /// Which section the rows come from: ".eh_frame" or ".debug_frame".
    pub section: &'static str,
    /// FDE rows whose rule the walk does not evaluate (become no-rule rows).
    pub unsupported_rows: usize,
}

/// Build the table of the ELF object at `path`. Errors: unreadable or not ELF, no CFI at all,
/// addresses above 4 GiB, or more than [`MAX_ROWS_PER_OBJECT`] rows.
pub fn build(path: &Path) -> anyhow::Result<Table> {
    // Read on demand (headers, the CFI sections, the symbol table), not the whole file:
    // libraries can be hundreds of megabytes.
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    build_from(&object::ReadCache::new(file))
}

/// [`build`] for the object's bytes (a byte slice, or a `ReadCache` over a file).
pub fn build_from<'d, R: object::ReadRef<'d>>(data: R) -> anyhow::Result<Table> {
    if !cfg!(target_arch = "x86_64") {
        bail!("unwind tables are built for x86-64 only");
    }
    let obj = object::File::parse(data).context("not an ELF object")?;
    let exec_segment = obj
        .segments()
        .find(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .context("no executable segment")?;
    let (file_off, _) = exec_segment.file_range();
    let vaddr_minus_offset = exec_segment.address() as i64 - file_off as i64;
    let mut bases = BaseAddresses::default();
    if let Some(s) = obj.section_by_name(".text") {
        bases = bases.set_text(s.address());
    }
    if let Some(s) = obj.section_by_name(".got") {
        bases = bases.set_got(s.address());
    }
    let mut raw = Vec::new();
    let mut unsupported = 0;
    // .eh_frame first; .debug_frame for the functions .eh_frame does not cover (code built with
    // -fno-asynchronous-unwind-tables and -g keeps its CFI there only).
    let mut covered = Vec::new();
    let mut sources = Vec::new();
    if let Some(s) = obj.section_by_name(".eh_frame").filter(|s| s.size() > 0) {
        let bytes = s.data().context("reading .eh_frame")?;
        let bases = bases.clone().set_eh_frame(s.address());
        let eh = EhFrame::new(bytes, LittleEndian);
        collect(&eh, &bases, &mut raw, &mut unsupported, &mut covered)?;
        sources.push(".eh_frame");
    }
    if let Some(s) = obj.section_by_name(".debug_frame").filter(|s| s.size() > 0) {
        let bytes = s.data().context("reading .debug_frame")?;
        let df = DebugFrame::new(bytes, LittleEndian);
        let before = raw.len();
        collect(&df, &bases, &mut raw, &mut unsupported, &mut covered)?;
        if raw.len() > before {
            sources.push(".debug_frame");
        }
    }
    raw.extend(go_cgo_rows(&obj));
    let section = match sources.as_slice() {
        [] => bail!("no .eh_frame or .debug_frame"),
        [one] => *one,
        _ => ".eh_frame + .debug_frame",
    };
    let rows = compact(raw);
    if rows.len() > MAX_ROWS_PER_OBJECT {
        bail!("{} unwind rows (at most {MAX_ROWS_PER_OBJECT} per object)", rows.len());
    }
    Ok(Table { rows, vaddr_minus_offset, section, unsupported_rows: unsupported })
}

/// A row before compaction: (address, rule, is the end of an FDE's range).
type RawRow = (u64, UnwindRow, bool);

/// Append the rows of every FDE of `section` whose range does not overlap one in `covered`
/// (ranges of sections read before), and add their ranges to it.
fn collect<R, S>(
    section: &S,
    bases: &BaseAddresses,
    out: &mut Vec<RawRow>,
    unsupported: &mut usize,
    covered: &mut Vec<(u64, u64)>,
) -> anyhow::Result<()>
where
    R: gimli::Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let mut ctx = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    let mut seen_before = std::mem::take(covered);
    seen_before.sort_unstable();
    let mut added = Vec::new();
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            // A malformed entry ends what can be read; the rows so far stay usable.
            Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let range = (fde.initial_address(), fde.initial_address() + fde.len());
        // The last range of an earlier section starting before this one ends (sorted by start;
        // FDE ranges do not overlap each other).
        let i = seen_before.partition_point(|r| r.0 < range.1);
        if i > 0 && seen_before[i - 1].1 > range.0 {
            continue;
        }
        added.push(range);
        let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
            continue;
        };
        let mut last_end = fde.initial_address();
        while let Ok(Some(row)) = table.next_row() {
            let rule = convert(section, row, unsupported);
            out.push((row.start_address(), rule, false));
            last_end = row.end_address();
        }
        out.push((last_end.max(fde.initial_address() + fde.len()), UnwindRow::default(), true));
    }
    seen_before.extend(added);
    *covered = seen_before;
    Ok(())
}

/// One gimli row as a compact rule (no-rule when the walk cannot evaluate it).
fn convert<R, S>(section: &S, row: &gimli::UnwindTableRow<usize>, unsupported: &mut usize) -> UnwindRow
where
    R: gimli::Reader<Offset = usize>,
    S: UnwindSection<R>,
{
    let none = UnwindRow::default();
    // A signal trampoline: every register is an expression on the ucontext at %rsp
    // (DW_OP_breg7 160; DW_OP_deref for the CFA).
    if let CfaRule::Expression(e) = row.cfa()
        && let Ok(expr) = e.get(section)
        && expr.0.to_slice().is_ok_and(|b| *b == [0x77, 0xa0, 0x01, 0x06][..])
    {
        return UnwindRow { kind: unwind::SIGNAL, ..none };
    }
    // No rule for the return address: the x86-64 ABI's, at CFA - 8.
    match row.register(RA).unwrap_or(RegisterRule::Offset(-8)) {
        RegisterRule::Undefined => {
            return UnwindRow { kind: unwind::END, ..none };
        }
        RegisterRule::Offset(-8) => {}
        _ => {
            *unsupported += 1;
            return none;
        }
    }
    let rbp_offset = match row.register(RBP).unwrap_or(RegisterRule::SameValue) {
        RegisterRule::Offset(o) if o % 8 == 0 && (i8::MIN as i64..=i8::MAX as i64).contains(&(o / 8)) && o != 0 => {
            (o / 8) as i8
        }
        _ => 0,
    };
    let units = |off: i64| -> Option<u16> {
        (off > 0 && off % 8 == 0 && off as u64 <= unwind::MAX_CFA_OFFSET).then_some((off / 8) as u16)
    };
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                RSP => unwind::CFA_RSP,
                RBP => unwind::CFA_RBP,
                _ => {
                    *unsupported += 1;
                    return none;
                }
            };
            match units(*offset) {
                Some(cfa_offset) => UnwindRow { pc: 0, cfa_offset, rbp_offset, kind },
                None => {
                    *unsupported += 1;
                    none
                }
            }
        }
        CfaRule::Expression(e) => {
            let bytes: Vec<u8> = match e.get(section) {
                Ok(expr) => expr.0.to_slice().map(|c| c.to_vec()).unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            match expression_rule(&bytes) {
                Some(r) => r,
                None => {
                    *unsupported += 1;
                    none
                }
            }
        }
    }
}

/// The two CFA expressions x86-64 compilers and linkers emit.
fn expression_rule(e: &[u8]) -> Option<UnwindRow> {
    // PLT entries: DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
    // DW_OP_lit11 (or lit10); DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus.
    // CFA = rsp + 8, plus 8 once the entry's push has run ((rip & 15) >= 11).
    if let [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] = e
        && (0x30..=0x4f).contains(lit)
    {
        return Some(UnwindRow { pc: 0, cfa_offset: 1, rbp_offset: (lit - 0x30) as i8, kind: unwind::PLT });
    }
    // Stack realignment through a DRAP register (gcc): DW_OP_breg6 (rbp) -8; DW_OP_deref:
    // CFA = *(rbp - 8), and the caller's rbp is saved at [rbp].
    if let [0x76, 0x78, 0x06] = e {
        return Some(UnwindRow { pc: 0, cfa_offset: 0, rbp_offset: -1, kind: unwind::CFA_DEREF_RBP });
    }
    None
}

/// Rows for a cgo binary's stack switch: Go's `runtime.asmcgocall` calls the C function on the
/// thread's system stack (`unwind::GO_SYSTEMSTACK`). Found by symbol (`.abi0` since Go 1.17's
/// register ABI), and only when the instructions after its `call *%rax` restore the goroutine's
/// stack the way the walk undoes it (`mov G(%rsp),%rdi; mov 8(%rdi),%rsi; sub D(%rsp),%rsi`):
/// the slots G and D come from those instructions, so a Go version that moves them is read
/// correctly, and one that changes the sequence gets no row (the walk stops there, as before).
/// A row covers the call instruction only (the walk looks a return address up at `pc − 1`).
/// Empty for anything that is not a cgo binary with a symbol table.
fn go_cgo_rows<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Vec<RawRow> {
    use object::ObjectSymbol as _;
    let mut out = Vec::new();
    let Some(text) = obj.section_by_name(".text") else { return out };
    let func = crate::runtimes::go::names::ASMCGOCALL_SYMBOLS.iter().find_map(|name| {
        obj.symbols().find(|s| s.name() == Ok(*name) && s.size() > 0).and_then(|s| {
            // The function's bytes only (a large object's .text is not read).
            let bytes = text.data_range(s.address(), s.size()).ok()??;
            asmcgocall_slots(bytes).map(|slots| (s.address(), bytes, slots))
        })
    });
    let Some((addr, bytes, (g_slot, depth_slot))) = func else { return out };
    let row =
        UnwindRow { pc: 0, cfa_offset: g_slot as u16, rbp_offset: depth_slot as i8, kind: unwind::GO_SYSTEMSTACK };
    for i in 0..bytes.len().saturating_sub(1) {
        if bytes[i..].starts_with(&[0xff, 0xd0]) && restores_stack(&bytes[i + 2..], g_slot, depth_slot) {
            out.push((addr + i as u64, row, false));
            out.push((addr + i as u64 + 2, UnwindRow::default(), true));
        }
    }
    out
}

/// The (g, depth) slots of asmcgocall, in 8-byte units, from the first `call *%rax` followed by
/// the goroutine-stack restore sequence.
fn asmcgocall_slots(bytes: &[u8]) -> Option<(u8, u8)> {
    (0..bytes.len().saturating_sub(1)).find_map(|i| {
        if !bytes[i..].starts_with(&[0xff, 0xd0]) {
            return None;
        }
        let rest = &bytes[i + 2..];
        // mov G(%rsp),%rdi
        let (g, rest) = rsp_operand(rest, &[0x48, 0x8b], 0x3c)?;
        // mov 8(%rdi),%rsi: g.stack.hi
        let rest = rest.strip_prefix(&[0x48, 0x8b, 0x77, unwind::GO_G_STACK_HI as u8][..])?;
        // sub D(%rsp),%rsi
        let (d, _) = rsp_operand(rest, &[0x48, 0x2b], 0x34)?;
        (g % 8 == 0 && d % 8 == 0 && g != d && g / 8 <= i8::MAX as u8 && d / 8 <= i8::MAX as u8)
            .then_some((g / 8, d / 8))
    })
}

/// Whether `rest` (the bytes after a `call *%rax`) restores the stack from the slots: the save
/// path's sequence, or the no-switch path's `mov D(%rsp),%rsi`.
fn restores_stack(rest: &[u8], g_slot: u8, depth_slot: u8) -> bool {
    if let Some((g, rest)) = rsp_operand(rest, &[0x48, 0x8b], 0x3c)
        && g == g_slot * 8
        && rest.starts_with(&[0x48, 0x8b, 0x77, unwind::GO_G_STACK_HI as u8])
    {
        return true;
    }
    matches!(rsp_operand(rest, &[0x48, 0x8b], 0x34), Some((d, _)) if d == depth_slot * 8)
}

/// An instruction `opcode modrm(reg, [%rsp + disp])`: `modrm0` is its ModRM byte with no
/// displacement (the form for disp 0, followed by the SIB byte 0x24); the disp8 form has ModRM
/// `modrm0 + 0x40`. Returns the displacement and the bytes after the instruction.
fn rsp_operand<'a>(b: &'a [u8], opcode: &[u8], modrm0: u8) -> Option<(u8, &'a [u8])> {
    let b = b.strip_prefix(opcode)?;
    match b {
        [m, 0x24, rest @ ..] if *m == modrm0 => Some((0, rest)),
        [m, 0x24, disp, rest @ ..] if *m == modrm0 + 0x40 && *disp < 0x80 => Some((*disp, rest)),
        _ => None,
    }
}

/// Sort rows by address, let a function's first row win over the end marker of the function
/// before it at the same address, and merge runs of the same rule.
fn compact(mut raw: Vec<RawRow>) -> Vec<UnwindRow> {
    // At one address: end markers first, then rules (the last one at an address wins below).
    raw.sort_by_key(|&(pc, _, is_end)| (pc, !is_end));
    let mut out: Vec<UnwindRow> = Vec::with_capacity(raw.len());
    for (pc, mut row, _) in raw {
        let Ok(pc) = u32::try_from(pc) else { continue };
        row.pc = pc;
        if let Some(last) = out.last_mut()
            && last.pc == pc
        {
            *last = row;
            continue;
        }
        out.push(row);
    }
    // Merge a row into the one before it when the rule is the same.
    out.dedup_by(|b, a| a.kind == b.kind && a.cfa_offset == b.cfa_offset && a.rbp_offset == b.rbp_offset);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libc() -> Option<std::path::PathBuf> {
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.exists())
    }

    /// Debian's libc (no frame pointers): thousands of rows, sorted, most of them evaluable, the
    /// PLT form recognised, and `_start`-like outermost rows present.
    #[test]
    fn distro_libc_table() {
        let Some(path) = libc() else { return };
        let t = build(&path).unwrap();
        assert_eq!(t.section, ".eh_frame");
        assert!(t.rows.len() > 5_000, "{} rows", t.rows.len());
        assert!(t.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        let rsp = t.rows.iter().filter(|r| r.kind == unwind::CFA_RSP).count();
        assert!(rsp * 2 > t.rows.len(), "{rsp} of {} rows are rsp-based", t.rows.len());
        assert!(t.rows.iter().any(|r| r.kind == unwind::END), "no outermost-frame row (clone3, start_thread)");
        assert!(t.rows.iter().any(|r| r.kind == unwind::SIGNAL), "no signal-trampoline row (__restore_rt)");
        assert!(t.unsupported_rows * 100 < t.rows.len(), "{} unsupported rows", t.unsupported_rows);
    }

    #[test]
    fn plt_and_drap_expressions() {
        let plt = expression_rule(&[0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22]).unwrap();
        assert_eq!((plt.kind, plt.cfa_offset, plt.rbp_offset), (unwind::PLT, 1, 11));
        let drap = expression_rule(&[0x76, 0x78, 0x06]).unwrap();
        assert_eq!(drap.kind, unwind::CFA_DEREF_RBP);
        assert!(expression_rule(&[0x77, 0x10]).is_none());
    }

    #[test]
    fn compaction_keeps_function_starts_and_gaps() {
        let rule = |off| UnwindRow { pc: 0, cfa_offset: off, rbp_offset: 0, kind: unwind::CFA_RSP };
        let rows = compact(vec![
            (0x100, rule(1), false),
            (0x104, rule(2), false),
            (0x110, UnwindRow::default(), true),
            (0x110, rule(1), false), // next function starts where the last ended
            (0x120, UnwindRow::default(), true),
            (0x200, rule(1), false),
            (0x201, rule(1), false), // same rule: merged
            (0x210, UnwindRow::default(), true),
        ]);
        let pcs: Vec<(u32, u16)> = rows.iter().map(|r| (r.pc, r.cfa_offset)).collect();
        assert_eq!(pcs, vec![(0x100, 1), (0x104, 2), (0x110, 1), (0x120, 0), (0x200, 1), (0x210, 0)]);
    }

    #[test]
    fn debug_frame_covers_what_eh_frame_does_not() {
        // A function built -fno-asynchronous-unwind-tables -g has its CFI in .debug_frame only.
        let dir = std::env::temp_dir().join(format!("lt-unwind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, exe) = (dir.join("a.c"), dir.join("b.c"), dir.join("mix"));
        std::fs::write(&a, "int mid(int x) { return x * 3 + 1; }\n").unwrap();
        std::fs::write(&b, "int mid(int); int main(int c, char **v) { return mid(c); }\n").unwrap();
        let ok = std::process::Command::new("gcc")
            .args(["-O2", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-c", "-o"])
            .arg(dir.join("a.o"))
            .arg(&a)
            .status()
            .is_ok_and(|s| s.success())
            && std::process::Command::new("gcc")
                .args(["-O2", "-g", "-o"])
                .arg(&exe)
                .arg(dir.join("a.o"))
                .arg(&b)
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            return; // no compiler here
        }
        let t = build(&exe).unwrap();
        assert_eq!(t.section, ".eh_frame + .debug_frame", "{t:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Go 1.19's asmcgocall (save path, then the no-switch path): g at 48(%rsp), the depth at
    /// 40(%rsp); Go 1.21's form (g at 8, depth at 0(%rsp), no displacement byte).
    #[test]
    fn asmcgocall_switch_is_decoded() {
        let go119: &[u8] = &[
            0x48, 0x89, 0x7c, 0x24, 0x28, 0x48, 0x89, 0xdf, 0x48, 0x89, 0xd9, 0xff, 0xd0, // call *%rax
            0x48, 0x8b, 0x7c, 0x24, 0x30, 0x48, 0x8b, 0x77, 0x08, 0x48, 0x2b, 0x74, 0x24, 0x28, 0xc3, 0x48, 0x89, 0xdf,
            0xff, 0xd0, 0x48, 0x8b, 0x74, 0x24, 0x28, 0x48, 0x89, 0xf4, 0xc3,
        ];
        assert_eq!(asmcgocall_slots(go119), Some((6, 5)));
        assert!(restores_stack(&go119[13..], 6, 5));
        assert!(restores_stack(&go119[33..], 6, 5));
        assert!(!restores_stack(&go119[33..], 6, 4));
        let go121: &[u8] =
            &[0xff, 0xd0, 0x48, 0x8b, 0x7c, 0x24, 0x08, 0x48, 0x8b, 0x77, 0x08, 0x48, 0x2b, 0x34, 0x24, 0xc3];
        assert_eq!(asmcgocall_slots(go121), Some((1, 0)));
        // Something else after the call: no rule.
        assert_eq!(asmcgocall_slots(&[0xff, 0xd0, 0x48, 0x89, 0xc7, 0xc3]), None);
    }

    #[test]
    fn not_elf_is_an_error() {
        assert!(build_from(&b"\x7fELF garbage"[..]).is_err());
        assert!(build_from(&b""[..]).is_err());
    }
}
