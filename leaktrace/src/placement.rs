//! Where exactly to put an entry uprobe.
//!
//! On x86-64 the kernel runs the probed instruction either by emulating it (cheap: push, nop,
//! jmp/call/jcc) or by single-stepping a copy of it out of line (expensive: ~15 µs per hit here,
//! against ~0.45 µs emulated). glibc's `free` starts with `test %rdi,%rdi; je ...`, which is
//! stepped out of line; its next instruction, after the NULL check, is `push %rbp`. For functions
//! whose NULL-pointer call is a no-op (free), the probe goes on the first emulated instruction
//! after such a check: only free(NULL) is skipped, which needs no tracing. Anything else keeps
//! the probe on the function's first instruction.

use iced_x86::{Code, ConditionCode, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

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
        _ => matches!(
            ins.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) && matches!(ins.op0_kind(), OpKind::NearBranch64),
    }
}

/// Choose the probe placement for a function starting with `code` (its first bytes; 32 are
/// plenty). `null_is_noop`: calling the function with a NULL first argument does nothing.
pub fn place(code: &[u8], null_is_noop: bool) -> Placement {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut ins = Vec::new();
    while decoder.can_decode() && ins.len() < 4 {
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
        let skips_on_null = jz.flow_control() == FlowControl::ConditionalBranch && jz.condition_code() == ConditionCode::e;
        if tests_rdi && skips_on_null && is_emulated(next) {
            return Placement {
                delta: next.ip(),
                note: format!("+{}: after the NULL check (a NULL call is a no-op), on an emulated instruction", next.ip()),
            };
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
        assert_eq!(place(&code, true).delta, 9);
        // Not for functions where NULL matters (realloc(NULL, n) allocates).
        assert_eq!(place(&code, false).delta, 0);
    }

    #[test]
    fn push_prologue_stays_at_entry() {
        // push %r12; push %rbp (glibc malloc)
        let code = [0x41, 0x54, 0x55, 0x53];
        assert_eq!(place(&code, true), Placement { delta: 0, note: "entry (emulated)".into() });
    }

    #[test]
    fn other_prologues_stay_at_entry() {
        // cmpb $0x0,0x140201(%rip); push %r12  (glibc posix_memalign)
        let code = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54];
        assert_eq!(place(&code, true).delta, 0);
        assert_eq!(place(&[], true).delta, 0);
    }
}
