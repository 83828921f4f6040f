//! The names by which the rest of the agent recognises Go. A leaf: it imports nothing of the
//! crate, so `unwind.rs` reads it without an import circle.

/// The symbols of Go's cgo trampoline (`runtime.asmcgocall`, ABI0 name first), where the
/// unwinder steps from the system stack back to the goroutine's.
pub const ASMCGOCALL_SYMBOLS: [&str; 2] = ["runtime.asmcgocall.abi0", "runtime.asmcgocall"];
