//! Keeps the unwinder's rule lookup a global BPF function (bpf-linker `--export`): the kernel's
//! verifier checks a global function once, on its own, instead of once per path that reaches
//! it, which keeps the walk-carrying programs within the verifier's instruction budget. Only for
//! the BPF target: a host build of this crate (`cargo test` over the workspace) links with cc.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("bpf") {
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_unwind_rule");
        println!("cargo:rustc-link-arg-bins=--export=leaktrace_stack_word");
    }
}
