//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the fuzz targets of `fuzz/` (cargo-fuzz,
//! libFuzzer, the nightly toolchain), each run for a bounded time; fails when one finds a crash
//! (a panic, an input running over 10 s, or over 2 GiB of memory), its input kept under
//! `target/fuzz/artifacts/TARGET/`.
//!
//! cargo-fuzz is installed when missing (`cargo install cargo-fuzz --locked`). Each target
//! starts from its committed seeds (`fuzz/seeds/TARGET`), the crashes found before
//! (`fuzz/regressions/TARGET`, each also a unit test), from real files this command makes
//! with the installed runtimes (`target/fuzz/seeds/TARGET`: a JVM's own heap dump with its
//! unreferenced strings left out, a V8 heap snapshot and a small valid part of it, a Go
//! executable, the demo recording), and from the corpus earlier runs grew
//! (`target/fuzz/corpus/TARGET`). The targets are built in release with debug assertions and
//! overflow checks (cargo-fuzz's default), without a sanitizer (the parsers are safe Rust).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use super::{cargo, root, run, run_status};

/// The fuzz targets (fuzz/fuzz_targets), each an entry point of `leaktrace::fuzzing`.
pub(crate) const TARGETS: &[&str] =
    &["hprof", "v8_snapshot", "cdp", "go_binary", "go_buckets", "python_walk", "recording"];

#[derive(clap::Args)]
pub(crate) struct FuzzArgs {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Targets to run (default: all).
    targets: Vec<String>,
}

/// `cargo +nightly fuzz ...` (rustup's cargo, which takes `+nightly`), run from the workspace
/// root without the toolchain `cargo xtask` runs under.
fn cargo_fuzz() -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(root());
    for v in ["CARGO", "RUSTUP_TOOLCHAIN", "RUSTC", "RUSTDOC", "CARGO_TARGET_DIR"] {
        c.env_remove(v);
    }
    c.args(["+nightly", "fuzz"]);
    c
}

pub(crate) fn fuzz(args: FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &args.targets {
            if !TARGETS.contains(&t.as_str()) {
                bail!("no fuzz target {t:?} (there are: {})", TARGETS.join(", "));
            }
        }
        args.targets.iter().map(String::as_str).collect()
    };
    let ok = cargo_fuzz().arg("--version").stdout(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok {
        run(cargo().args(["install", "cargo-fuzz", "--locked"])).context("installing cargo-fuzz")?;
    }
    let work = root().join("target/fuzz");
    make_seeds(&work.join("seeds"));
    run(cargo_fuzz().args(["build", "--sanitizer", "none"])).context("building the fuzz targets")?;
    let mut lines = Vec::new();
    let mut crashed = Vec::new();
    for t in targets {
        let (corpus, artifacts) = (work.join("corpus").join(t), work.join("artifacts").join(t));
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&artifacts)?;
        let mut cmd = cargo_fuzz();
        cmd.args(["run", "--sanitizer", "none", t]).arg(&corpus);
        let regressions = root().join("fuzz/regressions").join(t);
        for seeds in [root().join("fuzz/seeds").join(t), regressions, work.join("seeds").join(t)] {
            if seeds.is_dir() {
                cmd.arg(seeds);
            }
        }
        cmd.arg("--").args([
            format!("-max_total_time={}", args.seconds),
            "-timeout=10".into(),
            "-rss_limit_mb=2048".into(),
            "-malloc_limit_mb=2048".into(),
            "-max_len=1048576".into(),
            "-print_final_stats=1".into(),
        ]);
        cmd.arg(format!("-artifact_prefix={}/", artifacts.display()));
        let clock = Instant::now();
        let passed = run_status(&mut cmd)?;
        let took = clock.elapsed().as_secs_f64();
        let found: Vec<PathBuf> = std::fs::read_dir(&artifacts)?.filter_map(|e| Some(e.ok()?.path())).collect();
        let runs = count_files(&corpus);
        lines.push(format!(
            "{t}: {took:.0} s, {}; corpus {runs} inputs",
            if passed { "nothing found".to_string() } else { format!("CRASH: {}", show_paths(&found)) }
        ));
        if !passed {
            crashed.push(t);
        }
    }
    eprintln!("xtask: fuzz:\n  {}", lines.join("\n  "));
    if !crashed.is_empty() {
        bail!("fuzz targets found crashes: {} (inputs under {})", crashed.join(", "), work.join("artifacts").display());
    }
    Ok(())
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

fn show_paths(p: &[PathBuf]) -> String {
    p.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Makes a target's real seeds in a directory.
type SeedMaker = fn(&Path) -> Result<()>;
/// What [`hprof_without_unnamed_strings`] does with each record: tag, header, body.
type RecordVisit<'a> = &'a mut dyn FnMut(u8, &[u8], &[u8]);

/// The real seeds, each made when its runtime is installed (said and skipped otherwise).
fn make_seeds(dir: &Path) {
    let steps: [(&str, SeedMaker); 4] =
        [("hprof", hprof_seed), ("v8_snapshot", v8_seed), ("go_binary", go_seed), ("recording", recording_seed)];
    for (t, make) in steps {
        let d = dir.join(t);
        if count_files(&d) > 0 {
            continue;
        }
        if let Err(e) = std::fs::create_dir_all(&d).map_err(anyhow::Error::from).and_then(|()| make(&d)) {
            eprintln!("xtask: fuzz: no real seed for {t}: {e:#}");
        }
    }
}

fn recording_seed(d: &Path) -> Result<()> {
    std::fs::copy(root().join("leaktrace-analysis/testdata/demo-recording.json"), d.join("demo-recording.json"))?;
    Ok(())
}

/// A JVM's heap dump of itself (a static list of 50 byte arrays), then the same dump without
/// the STRING records no LOAD_CLASS names (most of its bytes).
fn hprof_seed(d: &Path) -> Result<()> {
    let src = "import com.sun.management.HotSpotDiagnosticMXBean;\n\
               public class Dump {\n\
               static final java.util.List<byte[]> CACHE = new java.util.ArrayList<>();\n\
               public static void main(String[] a) throws Exception {\n\
               for (int i = 0; i < 50; i++) CACHE.add(new byte[64]);\n\
               java.lang.management.ManagementFactory.getPlatformMXBean(HotSpotDiagnosticMXBean.class).dumpHeap(a[0], true);\n\
               }\n}\n";
    let tmp = d.join("src");
    std::fs::create_dir_all(&tmp)?;
    std::fs::write(tmp.join("Dump.java"), src)?;
    run(Command::new("javac").current_dir(&tmp).args(["-d", ".", "Dump.java"]))?;
    let full = tmp.join("full.hprof");
    run(Command::new("java").current_dir(&tmp).args(["-Xmx8m", "-XX:+UseSerialGC", "-cp", ".", "Dump"]).arg(&full))?;
    let data = std::fs::read(&full)?;
    std::fs::write(d.join("jvm-dump.hprof"), hprof_without_unnamed_strings(&data)?)?;
    std::fs::remove_dir_all(&tmp)?;
    Ok(())
}

/// An HPROF file whose STRING records are only the class names (LOAD_CLASS's name ids).
fn hprof_without_unnamed_strings(d: &[u8]) -> Result<Vec<u8>> {
    let start = d.iter().position(|&b| b == 0).context("no HPROF header")? + 13;
    let id = u32::from_be_bytes(d[start - 12..start - 8].try_into()?) as usize;
    let records = |f: RecordVisit<'_>| -> Result<()> {
        let mut i = start;
        while i + 9 <= d.len() {
            let len = u32::from_be_bytes(d[i + 5..i + 9].try_into()?) as usize;
            let body = d.get(i + 9..i + 9 + len).context("a record past the end")?;
            f(d[i], &d[i..i + 9], body);
            i += 9 + len;
        }
        Ok(())
    };
    let mut names = std::collections::HashSet::new();
    records(&mut |tag, _, b| {
        if tag == 0x02 && b.len() >= 8 + 2 * id {
            names.insert(b[8 + id..8 + 2 * id].to_vec());
        }
    })?;
    let mut out = d[..start].to_vec();
    records(&mut |tag, head, b| {
        if tag != 0x01 || (b.len() >= id && names.contains(&b[..id])) {
            out.extend_from_slice(head);
            out.extend_from_slice(b);
        }
    })?;
    Ok(out)
}

/// A V8 heap snapshot of a Node process, and its first 400 nodes with the edges among them
/// and the strings they name (a valid snapshot of a few KiB).
fn v8_seed(d: &Path) -> Result<()> {
    let full = d.join("node.heapsnapshot");
    let script = format!("require('v8').writeHeapSnapshot({:?})", full.display().to_string());
    run(Command::new("node").args(["-e", &script]))?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&full)?)?;
    std::fs::write(d.join("node-part.heapsnapshot"), v8_part(&v, 400).context("an unexpected snapshot layout")?)?;
    Ok(())
}

fn v8_part(v: &serde_json::Value, keep: usize) -> Option<String> {
    let meta = &v["snapshot"]["meta"];
    let fields = |k: &str| -> Option<Vec<String>> {
        meta[k].as_array()?.iter().map(|f| f.as_str().map(str::to_string)).collect()
    };
    let (nfields, efields) = (fields("node_fields")?, fields("edge_fields")?);
    let (nf, ef) = (nfields.len(), efields.len());
    let at = |fs: &[String], f: &str| fs.iter().position(|x| x == f);
    let (n_name, n_edges, e_type, e_name, e_to) = (
        at(&nfields, "name")?,
        at(&nfields, "edge_count")?,
        at(&efields, "type")?,
        at(&efields, "name_or_index")?,
        at(&efields, "to_node")?,
    );
    let edge_types: Vec<&str> = meta["edge_types"][0].as_array()?.iter().filter_map(|t| t.as_str()).collect();
    let nodes: Vec<u64> = v["nodes"].as_array()?.iter().filter_map(|x| x.as_u64()).collect();
    let edges: Vec<u64> = v["edges"].as_array()?.iter().filter_map(|x| x.as_u64()).collect();
    let strings = v["strings"].as_array()?;
    let keep = keep.min(nodes.len() / nf);
    let mut names: Vec<serde_json::Value> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut name = |k: u64| -> u64 {
        *index.entry(k).or_insert_with(|| {
            names.push(strings.get(k as usize).cloned().unwrap_or_default());
            names.len() as u64 - 1
        })
    };
    let (mut out_nodes, mut out_edges) = (Vec::new(), Vec::new());
    let mut e = 0usize;
    for i in 0..keep {
        let mut node = nodes[i * nf..(i + 1) * nf].to_vec();
        let count = node[n_edges] as usize;
        let mut kept = 0;
        for k in e..e + count {
            let mut r = edges.get(k * ef..(k + 1) * ef)?.to_vec();
            if (r[e_to] as usize) / nf >= keep {
                continue;
            }
            if !matches!(edge_types.get(r[e_type] as usize), Some(&"element" | &"hidden")) {
                r[e_name] = name(r[e_name]);
            }
            out_edges.extend(r);
            kept += 1;
        }
        e += count;
        node[n_name] = name(node[n_name]);
        node[n_edges] = kept;
        out_nodes.extend(node);
    }
    let mut snapshot = v["snapshot"].clone();
    snapshot["node_count"] = keep.into();
    snapshot["edge_count"] = (out_edges.len() / ef).into();
    let part = serde_json::json!({"snapshot": snapshot, "nodes": out_nodes, "edges": out_edges, "strings": names});
    Some(part.to_string())
}

/// A small Go executable (its DWARF compressed, as Go 1.19 writes it).
fn go_seed(d: &Path) -> Result<()> {
    let tmp = d.join("src");
    std::fs::create_dir_all(&tmp)?;
    std::fs::write(tmp.join("main.go"), "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"seed\") }\n")?;
    let out = d.join("go-hello");
    run(Command::new("go").current_dir(&tmp).env("GO111MODULE", "off").args(["build", "-o"]).arg(&out).arg("main.go"))?;
    std::fs::remove_dir_all(&tmp)?;
    Ok(())
}
