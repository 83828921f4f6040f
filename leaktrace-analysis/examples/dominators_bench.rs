//! `cargo xtask bench` (xtask/src/bench/dominators.rs) runs this: the dominator tree and
//! retained bytes of a seeded random heap-like graph of N nodes (a spanning tree from the root,
//! so every node is reached, plus one more edge per node to a random node: cycles and shared
//! nodes), and prints `nodes`, `edges`, `build_s`, `dominators_s` (CPU time), `dominators_wall_s` and `peak_bytes_per_node`, one
//! `name value` a line. The
//! memory figure is the process's peak resident size (VmHWM) less its size before the graph,
//! per node: the builder's edge list, the graph and the dominators together.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use leaktrace_analysis::dominators::{Dominators, GraphBuilder};

fn vm_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The process's CPU time, seconds (the machine is shared: wall time counts others' work too).
fn cpu_s() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `t` is.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let before = vm_kib("VmRSS:");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |below: u64| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % below.max(1)
    };
    let c0 = cpu_s();
    let mut b = GraphBuilder::with_capacity(n as usize, 2 * n as usize);
    for i in 1..n {
        let node = match i % 4 {
            0 => b.add_root(i as u32),
            1 => b.add_native(16 + rnd(4096), rnd(1000) as u32),
            _ => b.add_managed(1, rnd(200) as u32, 16 + rnd(256)),
        };
        b.add_edge(rnd(i) as u32, node);
        b.add_edge(node, rnd(n) as u32);
    }
    let edges = 2 * (n - 1);
    let g = b.build();
    let built = cpu_s() - c0;
    let (t1, c1) = (Instant::now(), cpu_s());
    let d = Dominators::of(&g);
    let (dom_s, dom_wall_s) = (cpu_s() - c1, t1.elapsed().as_secs_f64());
    let peak = vm_kib("VmHWM:").saturating_sub(before) * 1024;
    assert!(d.retained(0).total() > 0);
    println!(
        "nodes {n}\nedges {edges}\nbuild_s {built:.3}\ndominators_s {dom_s:.3}\ndominators_wall_s {dom_wall_s:.3}"
    );
    println!("peak_bytes_per_node {:.1}", peak as f64 / n as f64);
}
