//! Keeps the stack walk's helpers global BPF functions (bpf-linker `--export`): the rule lookup,
//! the stack-window reads, the walk memo's save and record, the Python walk and key. The
//! kernel's verifier checks a global function once, on its own, instead of once per path that
//! reaches it, which keeps the walk-carrying programs within the verifier's instruction budget
//! and their load time short. Only for
//! the BPF target: a host build of this crate (`cargo test` over the workspace) links with cc.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("bpf") {
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_unwind_rule");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_stack_word");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_walk_word");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_memo_save");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_memo_open");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_memo_spoil");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_memo_close");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_py_walk");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_py_key");
    }
}
