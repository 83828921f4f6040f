//! Keeps the unwinder's rule lookup a global BPF function (bpf-linker `--export`): the kernel's
//! verifier checks a global function once, on its own, instead of once per path that reaches
//! it, which keeps the walk-carrying programs within the verifier's instruction budget.
fn main() {
    println!("cargo:rustc-link-arg-bins=--export=leaktrace_unwind_rule");
}
