//! The dominator part of `cargo xtask bench`: the time and memory of the heap graph's dominator
//! tree and retained sizes (leaktrace-analysis/src/dominators.rs) over 1 M and 10 M nodes, run by
//! `leaktrace-analysis/examples/dominators_bench.rs` (a seeded random heap-like graph, two edges
//! per node). The results replace the section between [`BEGIN`] and [`END`] in
//! docs/benchmarks.md.

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- dominators bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- dominators bench: end -->";

/// Graph sizes measured.
const SIZES: &[u64] = &[1_000_000, 10_000_000];

/// One run's figures: dominators_s, build_s, peak bytes per node, edges.
fn one_run(bin: &Path, nodes: u64) -> Result<(f64, f64, f64, f64)> {
    let mut c = Command::new(bin);
    c.arg(nodes.to_string());
    let out = capture(&mut c).context("dominators_bench")?;
    let get = |k: &str| field(&out, k).with_context(|| format!("no {k} in:\n{out}"));
    Ok((get("dominators_s")?, get("build_s")?, get("peak_bytes_per_node")?, get("edges")?))
}

pub(crate) fn measure(reps: usize) -> Result<String> {
    run(Command::new("cargo").current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "leaktrace-analysis",
        "--example",
        "dominators_bench",
    ]))?;
    let bin = root().join("target/release/examples/dominators_bench");
    let mut s = format!("{BEGIN}\n## Dominators over the heap graph\n\n");
    s.push_str(
        "`leaktrace-analysis/examples/dominators_bench.rs NODES`: a seeded random graph (a \
         spanning tree from the root plus one random edge per node: cycles and shared nodes; a \
         quarter roots, a quarter native blocks, half managed objects), its dominator tree and \
         each node's retained bytes split native / managed / off-heap (Cooper–Harvey–Kennedy on \
         index arrays). Time: the process's CPU time (the machine is shared) for the dominators and retained sizes, and for building the compressed \
         graph from the edge list; memory: peak resident size less the size before the graph, \
         per node (edge list, graph and dominators together). Median of the runs; budget for 1 M \
         nodes: < 2 s, < 150 B/node.\n\n",
    );
    s.push_str("| nodes | edges | dominators (s) | build graph (s) | peak B/node |\n|---:|---:|---:|---:|---:|\n");
    for &n in SIZES {
        let mut runs = Vec::new();
        for rep in 0..reps {
            let r = one_run(&bin, n)?;
            eprintln!("xtask: bench: dominators {n} nodes rep {rep}: {:.3} s, {:.1} B/node", r.0, r.2);
            runs.push(r);
        }
        let med = |f: fn(&(f64, f64, f64, f64)) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        s.push_str(&format!(
            "| {n} | {:.0} | {:.3} | {:.3} | {:.1} |\n",
            med(|r| r.3),
            med(|r| r.0),
            med(|r| r.1),
            med(|r| r.2)
        ));
    }
    s.push('\n');
    s.push_str(END);
    Ok(s)
}
