//! Where exactly to put an entry uprobe.
//!
//! On x86-64 the kernel runs the probed instruction either by emulating it (cheap: push, nop,
//! jmp/call/jcc) or by single-stepping a copy of it out of line (expensive: ~5.5 µs per hit on the
//! VM the benchmarks ran on, against ~0.8 µs emulated). glibc's `free` starts with `test %rdi,%rdi; je ...`, which is
//! stepped out of line; its next instruction, after the NULL check, is `push %rbp`. For functions
//! whose NULL-pointer call is a no-op (free), the probe goes on the first emulated instruction
//! after such a check: only free(NULL) is skipped, which needs no tracing.
//!
//! Any function (allocating ones too, with their return probes) may also have its probes moved
//! past a prefix of instructions that have no effect a probe could see: they fall through, write
//! no memory, and leave the stack pointer, the frame pointer and the argument registers the
//! probe reads as they were (jemalloc's `malloc` starts with `cmp $0x1000,%rdi; ja ...`; its
//! `free` with nine register-only instructions before a `jne`). A probe on the first emulated
//! instruction after such a prefix sees every call, with the same arguments and the same return
//! address at the stack pointer, so a return probe placed there works too. Anything else keeps
//! the probes on the function's first instruction.

use iced_x86::{
    Code, ConditionCode, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

/// Registers of the first six integer arguments (System V x86-64).
const ARG_REGS: [Register; 6] =
    [Register::RDI, Register::RSI, Register::RDX, Register::RCX, Register::R8, Register::R9];
/// Longest prefix of skippable instructions looked at.
const MAX_PREFIX: usize = 16;

/// A probe offset relative to the function's first instruction, with why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Bytes after the function's first instruction.
    pub delta: u64,
    /// Human description for the coverage table, e.g. "+9: after the NULL check (free(NULL) is a no-op)".
    pub note: String,
}

/// True for instructions the x86-64 uprobe code emulates instead of single-stepping.
pub fn is_emulated(ins: &Instruction) -> bool {
    match ins.mnemonic() {
        Mnemonic::Push => ins.op0_kind() == OpKind::Register && ins.op0_register().size() == 8,
        Mnemonic::Nop => true,
        _ => {
            matches!(
                ins.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
            ) && matches!(ins.op0_kind(), OpKind::NearBranch64)
        }
    }
}

fn writes(access: OpAccess) -> bool {
    matches!(access, OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
}

/// `ins` can be skipped by a probe placed after it: it falls through to the next instruction,
/// writes no memory, and writes neither the stack pointer, nor the frame pointer, nor the first
/// `args` argument registers.
fn is_skippable(ins: &Instruction, factory: &mut InstructionInfoFactory, args: usize) -> bool {
    if ins.flow_control() != FlowControl::Next || ins.is_stack_instruction() || ins.has_lock_prefix() {
        return false;
    }
    let info = factory.info(ins);
    if info.used_memory().iter().any(|m| writes(m.access())) {
        return false;
    }
    let guarded = |r: Register| {
        let full = r.full_register();
        full == Register::RSP || full == Register::RBP || ARG_REGS[..args.min(6)].contains(&full)
    };
    !info.used_registers().iter().any(|u| guarded(u.register()) && writes(u.access()))
}

/// Choose the probe placement for a function starting with `code` (its first bytes; 64 are
/// plenty). `null_is_noop`: calling the function with a NULL first argument does nothing, and it
/// has no return probe. `args`: how many integer argument registers its probes read.
pub fn place(code: &[u8], null_is_noop: bool, args: usize) -> Placement {
    if !cfg!(target_arch = "x86_64") {
        // The decoding and the emulation rules below are x86-64's.
        return Placement { delta: 0, note: "entry".to_string() };
    }
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut ins = Vec::new();
    while decoder.can_decode() && ins.len() < MAX_PREFIX + 1 {
        let i = decoder.decode();
        if i.is_invalid() {
            break;
        }
        ins.push(i);
    }
    let at_entry = |why: &str| Placement { delta: 0, note: why.to_string() };
    let Some(first) = ins.first() else { return at_entry("entry (undecodable)") };
    if is_emulated(first) {
        return at_entry("entry (emulated)");
    }
    if null_is_noop && ins.len() >= 3 {
        let (test, jz, next) = (&ins[0], &ins[1], &ins[2]);
        let tests_rdi = test.code() == Code::Test_rm64_r64
            && test.op0_kind() == OpKind::Register
            && test.op0_register() == Register::RDI
            && test.op1_register() == Register::RDI;
        let skips_on_null =
            jz.flow_control() == FlowControl::ConditionalBranch && jz.condition_code() == ConditionCode::e;
        if tests_rdi && skips_on_null && is_emulated(next) {
            return Placement {
                delta: next.ip(),
                note: format!(
                    "+{}: after the NULL check (a NULL call is a no-op), on an emulated instruction",
                    next.ip()
                ),
            };
        }
    }
    let mut factory = InstructionInfoFactory::new();
    for (k, i) in ins.iter().enumerate() {
        if is_emulated(i) {
            return Placement {
                delta: i.ip(),
                note: format!(
                    "+{}: after {k} instruction(s) that change no argument, stack pointer or memory, on an emulated instruction",
                    i.ip()
                ),
            };
        }
        if !is_skippable(i, &mut factory, args) {
            break;
        }
    }
    at_entry("entry (single-stepped)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_free_prologue_moves_past_null_check() {
        // test %rdi,%rdi; je +0xbf; push %rbp; lea -0x10(%rdi),%rsi
        let code = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55, 0x48, 0x8d, 0x77, 0xf0];
        assert_eq!(place(&code, true, 1).delta, 9);
        // Not for functions where NULL matters (realloc(NULL, n) allocates): the `test` alone
        // is skipped, the probe sits on the `je`, which every call passes.
        assert_eq!(place(&code, false, 2).delta, 3);
    }

    #[test]
    fn push_prologue_stays_at_entry() {
        // push %r12; push %rbp (glibc malloc)
        let code = [0x41, 0x54, 0x55, 0x53];
        assert_eq!(place(&code, true, 1), Placement { delta: 0, note: "entry (emulated)".into() });
    }

    #[test]
    fn side_effect_free_prefixes_are_skipped() {
        // cmpb $0x0,0x140201(%rip); push %r12  (glibc posix_memalign)
        let code = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54];
        assert_eq!(place(&code, false, 3).delta, 7);
        // cmp $0x1000,%rdi; ja +0x93  (jemalloc malloc)
        let code = [0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x87, 0x93, 0x00, 0x00, 0x00];
        assert_eq!(place(&code, false, 1).delta, 7);
        // jemalloc free: nine register-only instructions (some read memory), then jne.
        let code = [
            0x48, 0x89, 0xf8, // mov %rdi,%rax
            0x48, 0x8b, 0x15, 0x0e, 0x53, 0x0a, 0x00, // mov 0xa530e(%rip),%rdx
            0x48, 0x89, 0xf9, // mov %rdi,%rcx
            0x48, 0xc1, 0xe8, 0x1a, // shr $0x1a,%rax
            0x48, 0x81, 0xe1, 0x00, 0x00, 0x00, 0xc0, // and $0xffffffffc0000000,%rcx
            0x25, 0xf0, 0x00, 0x00, 0x00, // and $0xf0,%eax
            0x64, 0x48, 0x03, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, // add %fs:0x0,%rax
            0x48, 0x01, 0xd0, // add %rdx,%rax
            0x48, 0x3b, 0x88, 0xb0, 0x01, 0x00, 0x00, // cmp 0x1b0(%rax),%rcx
            0x0f, 0x85, 0x8a, 0x00, 0x00, 0x00, // jne
        ];
        assert_eq!(place(&code, true, 1).delta, 0x30);
        // ... but not where the probe reads %rdx or %rcx (a function with three arguments).
        assert_eq!(place(&code, false, 3).delta, 0);
    }

    #[test]
    fn prefixes_with_effects_stay_at_entry() {
        assert_eq!(place(&[], true, 1).delta, 0);
        // mov %rsi,%rdi; jmp: the first argument changes.
        assert_eq!(place(&[0x48, 0x89, 0xf7, 0xeb, 0x00], false, 1).delta, 0);
        // sub $0x8,%rsp; call: the return address is no longer at the stack pointer.
        assert_eq!(place(&[0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0], false, 1).delta, 0);
        // mov %rax,0x10(%rip); jmp: writes memory.
        assert_eq!(place(&[0x48, 0x89, 0x05, 0x10, 0, 0, 0, 0xeb, 0x00], false, 1).delta, 0);
        // mov %rsp,%rbp; jmp: the frame pointer the stack walk starts from changes.
        assert_eq!(place(&[0x48, 0x89, 0xe5, 0xeb, 0x00], false, 0).delta, 0);
        // ret: leaves the function.
        assert_eq!(place(&[0xc3, 0x90], false, 1).delta, 0);
    }
}
