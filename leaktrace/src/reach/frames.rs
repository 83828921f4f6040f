//! Which function's frame a stack slot is in: a stopped thread's frames walked from its
//! registers with the objects' call frame information (the tables the kernel-side walk uses,
//! [`crate::unwind`]), each frame the range [its stack pointer, its CFA).
//!
//! A scan that named a slot's frame by the nearest return address below the slot was misled by
//! stale words: an -O2 `main` reserves a large frame it does not write in full, and what the
//! dynamic loader's start-up code left there (a return address into `init_cpu_features`, in
//! ld.so) sat below the slot in some runs and named main's slot `init_cpu_features`. Within the
//! walked frames no stack word names a frame; above them (the walk stopped: no rule, a signal
//! frame, an unreadable word) the nearest return address still does.

use std::collections::HashMap;

use leaktrace_common::{UnwindRow, unwind};

use crate::procinfo::MapsLine;

/// Most frames walked per thread.
const MAX_FRAMES: usize = 256;

/// Largest frame believed, bytes (as the kernel-side walk).
const MAX_FRAME_BYTES: u64 = 8 << 20;

/// A thread's frames from its stack pointer up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Frames {
    /// (end, pc), ends ascending: the stack from the previous frame's end (the stack pointer
    /// for the first) up to `end` (the frame's CFA) is the frame of the function at `pc` (the
    /// thread's instruction pointer for the first frame, the call's last byte — return address
    /// − 1 — for the others).
    pub(super) frames: Vec<(u64, u64)>,
    /// The pc the words above the last frame belong to, up to the next return address: where
    /// the walk stopped (the outermost frame's, or the caller the walk had no rule for).
    pub(super) rest: u64,
}

impl Frames {
    /// The pc of the walked frame holding the stack address `addr`; None above the walked
    /// frames. Addresses below the stack pointer (the red zone) are the first frame's.
    pub(super) fn pc_at(&self, addr: u64) -> Option<u64> {
        let i = self.frames.partition_point(|&(end, _)| end <= addr);
        self.frames.get(i).map(|&(_, pc)| pc)
    }
}

/// One frame of the walk: the caller's stack pointer (this frame's CFA), the return address
/// and the caller's %rbp, from the rule `row` of the function at `pc` whose stack pointer is
/// `sp` and %rbp is `rbp`; `read` reads a stack word (None: unreadable). None: the walk stops
/// here (a rule not evaluated here, an implausible frame, an unreadable word).
pub(super) fn step(
    row: &UnwindRow,
    pc: u64,
    sp: u64,
    rbp: u64,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> Option<(u64, u64, u64)> {
    let plausible = |cfa: u64| cfa > sp && cfa - sp <= MAX_FRAME_BYTES;
    match row.kind {
        unwind::CFA_RSP | unwind::CFA_RBP | unwind::PLT => {
            let base = if row.kind == unwind::CFA_RBP { rbp } else { sp };
            let mut cfa = base.checked_add(u64::from(row.cfa_offset) * 8)?;
            if row.kind == unwind::PLT && (pc & 15) >= u64::from(row.rbp_offset as u8) {
                cfa += 8;
            }
            if !plausible(cfa) {
                return None;
            }
            let ret = read(cfa - 8)?;
            let rbp = if row.kind != unwind::PLT && row.rbp_offset != 0 {
                read(cfa.wrapping_add((i64::from(row.rbp_offset) * 8) as u64))?
            } else {
                rbp
            };
            Some((cfa, ret, rbp))
        }
        unwind::CFA_DEREF_RBP => {
            let cfa = read(rbp.wrapping_add((i64::from(row.rbp_offset) * 8) as u64))?;
            if !plausible(cfa) {
                return None;
            }
            Some((cfa, read(cfa - 8)?, read(rbp)?))
        }
        _ => None,
    }
}

/// Walk a thread's frames from its instruction pointer, stack pointer and %rbp. `rule` gives
/// the unwind row of a code address (None: no object, no table); `read` reads a stack word.
pub(super) fn walk(
    ip: u64,
    sp: u64,
    rbp: u64,
    rule: &mut impl FnMut(u64) -> Option<UnwindRow>,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> Frames {
    let mut out = Frames { frames: Vec::new(), rest: ip };
    let (mut pc, mut sp, mut rbp) = (ip, sp, rbp);
    while out.frames.len() < MAX_FRAMES {
        let Some(row) = rule(pc) else { break };
        if row.kind == unwind::END {
            break;
        }
        let Some((cfa, ret, caller_rbp)) = step(&row, pc, sp, rbp, read) else { break };
        if ret < 2 {
            break;
        }
        out.frames.push((cfa, pc));
        // The call's last byte: inside the caller even when the call ends it (`exit`).
        (pc, sp, rbp) = (ret - 1, cfa, caller_rbp);
        out.rest = pc;
    }
    out
}

/// The unwind rows of code addresses in a stopped process, from its maps: each object's table
/// built on first use ([`crate::unwind::build_from`], the object opened by
/// [`crate::target_fs::open_mapped_or_path`]: the very file mapped).
pub(super) struct Rules<'m> {
    mm: u32,
    lines: Vec<MapsLine<'m>>,
    tables: HashMap<String, Option<crate::unwind::Table>>,
}

impl<'m> Rules<'m> {
    /// `maps`: /proc/PID/maps of `mm` (the process, or its live thread holding the memory).
    pub(super) fn new(mm: u32, maps: &'m str) -> Self {
        let lines = maps
            .lines()
            .filter_map(crate::procinfo::parse_maps_line)
            .filter(|l| l.perms.as_bytes().get(2) == Some(&b'x') && l.path.starts_with('/'))
            .collect();
        Rules { mm, lines, tables: HashMap::new() }
    }

    /// The row covering the code address `pc`; None when no object with a table maps it.
    pub(super) fn rule(&mut self, pc: u64) -> Option<UnwindRow> {
        let l = self.lines.iter().find(|l| l.start <= pc && pc < l.end)?;
        let mm = self.mm;
        let table = self
            .tables
            .entry(l.path.clone())
            .or_insert_with(|| {
                let f = crate::target_fs::open_mapped_or_path(mm, l.range, &l.path, l.dev, l.inode).ok()?;
                crate::unwind::build_from(&object::ReadCache::new(f)).ok()
            })
            .as_ref()?;
        let vpc = i64::try_from(pc - l.start + l.offset).ok()? + table.vaddr_minus_offset;
        let i = table.rows.partition_point(|r| i64::from(r.pc) <= vpc);
        (i > 0).then(|| table.rows[i - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32, kind: u8, cfa_offset: u16, rbp_offset: i8) -> UnwindRow {
        UnwindRow { pc, cfa_offset, rbp_offset, kind }
    }

    /// The case that named main's slot `init_cpu_features`: held at `exit`'s entry, main's
    /// large -O2 frame holds a stale return address into another object below the slot; the
    /// walk gives the slot to main all the same, and the words above the outermost frame to it.
    #[test]
    fn a_stale_return_address_inside_a_frame_names_nothing() {
        let sp = 0x7ffc_0000_1000u64;
        let (exit, main_ret, start_ret, stale) =
            (0x7f00_0000_2000u64, 0x5500_0000_1263u64, 0x7f00_0000_324au64, 0x7f10_0000_5b29u64);
        // exit's entry: CFA = rsp + 8; main: 5 pushes + 0x100 = CFA rsp + 0x130; the caller of
        // main: CFA = rsp + 0x90; then the outermost frame.
        let mut stack: HashMap<u64, u64> = HashMap::new();
        stack.insert(sp, main_ret);
        stack.insert(sp + 8 + 0x78, stale);
        stack.insert(sp + 8 + 0x80, 0x5500_1000_0010); // the slot: a block's address
        stack.insert(sp + 8 + 0x128, start_ret);
        let mut read = |a: u64| Some(stack.get(&a).copied().unwrap_or(0));
        let mut rule = |pc: u64| match pc {
            p if p == exit => Some(row(0, unwind::CFA_RSP, 1, 0)),
            p if p == main_ret - 1 => Some(row(0, unwind::CFA_RSP, 0x130 / 8, 0)),
            p if p == start_ret - 1 => Some(row(0, unwind::END, 0, 0)),
            _ => None,
        };
        let f = walk(exit, sp, 0, &mut rule, &mut read);
        assert_eq!(f.frames, vec![(sp + 8, exit), (sp + 8 + 0x130, main_ret - 1)]);
        assert_eq!(f.rest, start_ret - 1);
        assert_eq!(f.pc_at(sp), Some(exit));
        assert_eq!(f.pc_at(sp + 8 + 0x80), Some(main_ret - 1));
        assert_eq!(f.pc_at(sp + 8 + 0x130), None);
    }

    /// %rbp-based frames: the CFA from %rbp, the caller's %rbp from its save slot; a walk that
    /// meets code without a rule stops there, the rest going to that caller.
    #[test]
    fn rbp_frames_and_a_stop() {
        let sp = 0x1000u64;
        let rbp = 0x1040u64;
        let ret = 0x4000_0100u64;
        let mut stack: HashMap<u64, u64> = HashMap::new();
        // CFA = rbp + 16: return address at rbp + 8, the caller's %rbp at rbp (CFA − 16).
        stack.insert(rbp + 8, ret);
        stack.insert(rbp, 0x2000);
        let mut read = |a: u64| Some(stack.get(&a).copied().unwrap_or(0));
        let mut rule = |pc: u64| (pc == 0x3000).then(|| row(0, unwind::CFA_RBP, 2, -2));
        let f = walk(0x3000, sp, rbp, &mut rule, &mut read);
        assert_eq!(f.frames, vec![(rbp + 16, 0x3000)]);
        assert_eq!(f.rest, ret - 1);
        // An implausible CFA (at or below the stack pointer) stops the walk at once.
        let mut rule = |_| Some(row(0, unwind::CFA_RBP, 0, 0));
        let f = walk(0x3000, sp, 0x800, &mut rule, &mut read);
        assert!(f.frames.is_empty());
        assert_eq!(f.rest, 0x3000);
        assert_eq!(f.pc_at(sp), None);
    }
}
