//! The runtimes' own heap tools' costs, `cargo xtask bench --holds-only`: how long
//! each stops its target, measured by the target itself, and where the time goes.
//!
//! Each target runs a 5 ms sleep loop (a timer in Node, a thread in the JVM, a goroutine in Go)
//! and prints every gap over 100 ms between two wake-ups (`gap MS`): the time it could not run.
//! - Node (`xtask/bench/node_heap.js OBJECTS`): first one heap snapshot of itself through the
//!   in-process inspector (no socket, not traced: `inproc` line), then `leaktrace record
//!   --heap-snapshots --pid PID --duration 4s` takes its two over the inspector connection; from
//!   recording.json each snapshot's time to V8's first chunk (V8 building the snapshot, the
//!   program stopped), the chunks' transfer, leaktrace's parse and analysis.
//! - JVM (`xtask/bench/JvmHeap.java RECORDS`, Serial GC): `leaktrace record --heap-dump --pid
//!   PID --duration 3s`: two class histograms (each a full GC) and one HPROF dump; jcmd's time
//!   for each, the dump's size and objects, leaktrace's read of it.
//! - Go (`xtask/bench/go-census`, GOROUTINES blocked goroutines, 1 M linked objects in a
//!   package variable): `leaktrace record --heap-census --pid PID --duration 3s`: two goroutine
//!   censuses and typed heap walks read from /proc/PID/mem, without stopping the program.
//!
//! Memory: the target's peak RSS (VmHWM) after the recording over its peak before, what the
//! snapshot or dump cost it.
//!
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- runtime heap tools bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- runtime heap tools bench: end -->";

/// Sizes of the three targets' heaps.
pub(super) struct Sizes {
    pub node_objects: u64,
    pub jvm_records: u64,
    pub go_goroutines: u64,
}

/// The gaps over 100 ms a target printed, ms, largest first.
fn gaps(target: &mut Spawned) -> Vec<f64> {
    std::thread::sleep(Duration::from_millis(1500));
    target.drain();
    let mut g: Vec<f64> = target.seen.iter().filter_map(|l| l.strip_prefix("gap ")?.trim().parse().ok()).collect();
    g.sort_by(|a, b| b.total_cmp(a));
    g
}

/// Record `target` with `options` for `duration`; recording.json.
fn record(work: &Path, tag: &str, target: &Spawned, options: &[&str], duration: &str) -> Result<serde_json::Value> {
    let out = work.join(tag);
    let mut cmd = Command::new(release_binary());
    cmd.args(["record", "--quiet", "--interval", "1s", "--duration", duration]).args(options);
    cmd.arg("--pid").arg(target.pid().to_string()).arg("--out").arg(&out);
    Spawned::new(cmd)?.wait(Duration::from_secs(600))?;
    let text = std::fs::read_to_string(out.join("recording.json"))
        .with_context(|| format!("{}/recording.json", out.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn range(v: &[f64], scale: f64, digits: usize) -> String {
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return "—".into();
    }
    let (min, max) = (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max));
    let m = median(&v);
    if v.len() == 1 {
        format!("{:.*}", digits, m * scale)
    } else {
        format!("{:.*} ({:.*}–{:.*})", digits, m * scale, digits, min * scale, digits, max * scale)
    }
}

/// The Node part: rows of the table.
fn node(work: &Path, reps: usize, objects: u64) -> Result<Vec<(String, String)>> {
    let (mut inproc, mut took, mut first, mut transfer, mut parse, mut analyse, mut stops) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut took2, mut first2, mut stops2) = (vec![], vec![], vec![]);
    let (mut mb, mut nodes, mut peak, mut failed) = (0.0, 0u64, vec![], vec![]);
    for rep in 0..reps {
        let mut t = Spawned::new({
            let mut c = Command::new("node");
            c.arg(root().join("xtask/bench/node_heap.js")).arg(objects.to_string());
            c
        })?;
        let l = t.wait_stdout_line("inproc ", Duration::from_secs(600))?;
        let w: Vec<f64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
        inproc.push(w.get(1).copied().unwrap_or(f64::NAN) / 1000.0);
        t.wait_stdout_line("ready", Duration::from_secs(60))?;
        let (rss, hwm) = (status_kib(t.pid(), "VmRSS")?, status_kib(t.pid(), "VmHWM")?);
        let rec = record(work, &format!("node-{rep}"), &t, &["--heap-snapshots"], "4s")?;
        peak.push((status_kib(t.pid(), "VmHWM")?.saturating_sub(hwm.max(rss))) as f64 / 1024.0);
        let s = &rec["runtime_holds"]["node_snapshots"];
        if !s.is_object() {
            // Said in the table; the other runs still count.
            failed.push(format!("run {rep}: {}", rec["runtime_holds"]["node"]["errors"]));
            continue;
        }
        took.push(f(&s["first"]["took_s"]));
        took2.push(f(&s["second"]["took_s"]));
        for (k, c) in s["costs"].as_array().into_iter().flatten().enumerate() {
            if k == 0 { &mut first } else { &mut first2 }.push(f(&c["first_chunk_s"]));
            transfer.push(f(&c["transfer_s"]));
            parse.push(f(&c["parse_s"]));
            analyse.push(f(&c["analyse_s"]));
            mb = f(&c["bytes"]) / 1e6;
        }
        nodes = s["objects_second"].as_u64().unwrap_or(0);
        let g = gaps(&mut t);
        stops.push(g.first().copied().unwrap_or(0.0) / 1000.0);
        stops2.push(g.get(1).copied().unwrap_or(0.0) / 1000.0);
    }
    if took.is_empty() {
        bail!("no heap snapshots: {}", failed.join("; "));
    }
    Ok(vec![
        (format!("Node: heap of {objects} objects; snapshot"), format!("{mb:.1} MB of JSON, {nodes} nodes")),
        (
            "Node: runs without snapshots (leaktrace's note)".into(),
            if failed.is_empty() { "none".into() } else { failed.join("; ") },
        ),
        ("Node: in-process snapshot, untraced (s)".into(), range(&inproc, 1.0, 2)),
        ("Node: leaktrace's first snapshot (before the probes), whole (s)".into(), range(&took, 1.0, 2)),
        ("… to V8's first chunk: the snapshot built, program stopped (s)".into(), range(&first, 1.0, 2)),
        ("Node: leaktrace's second snapshot (after the probes are detached), whole (s)".into(), range(&took2, 1.0, 2)),
        ("… to V8's first chunk (s)".into(), range(&first2, 1.0, 2)),
        ("Node: both snapshots:".into(), String::new()),
        ("… chunks written and transferred (s)".into(), range(&transfer, 1.0, 2)),
        ("… leaktrace's parse, program running (s)".into(), range(&parse, 1.0, 3)),
        ("… leaktrace's analysis (dominators, paths), program running (s)".into(), range(&analyse, 1.0, 3)),
        ("Node: the program's longest stop per run (s)".into(), range(&stops, 1.0, 2)),
        ("Node: its second-longest stop per run, 0 when none over 100 ms (s)".into(), range(&stops2, 1.0, 2)),
        ("Node: the program's peak RSS over its peak before (VmHWM), MiB".into(), range(&peak, 1.0, 1)),
    ])
}

/// The JVM part: rows of the table.
fn jvm(work: &Path, reps: usize, records: u64) -> Result<Vec<(String, String)>> {
    let classes = work.join("java");
    std::fs::create_dir_all(&classes)?;
    run(Command::new("javac").arg("-d").arg(&classes).arg(root().join("xtask/bench/JvmHeap.java")))?;
    let (mut histo, mut dump, mut read, mut stops, mut used) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut mb, mut objects, mut peak) = (0.0, 0u64, vec![]);
    for rep in 0..reps {
        let mut t = Spawned::new({
            let mut c = Command::new("java");
            c.args(["-Xmx1g", "-XX:+UseSerialGC", "-cp"]).arg(&classes).arg("JvmHeap").arg(records.to_string());
            c
        })?;
        let l = t.wait_stdout_line("ready", Duration::from_secs(300))?;
        used.extend(l.split_whitespace().nth(1).and_then(|x| x.parse::<f64>().ok()));
        let (rss, hwm) = (status_kib(t.pid(), "VmRSS")?, status_kib(t.pid(), "VmHWM")?);
        let rec = record(work, &format!("jvm-{rep}"), &t, &["--heap-dump"], "3s")?;
        peak.push((status_kib(t.pid(), "VmHWM")?.saturating_sub(hwm.max(rss))) as f64 / 1024.0);
        let h = &rec["runtime_holds"];
        histo.extend([f(&h["jvm"]["start"]["taken"]["took_s"]), f(&h["jvm"]["end"]["taken"]["took_s"])]);
        let d = &h["jvm_heap_dump"];
        if !d.is_object() {
            bail!("no heap dump in the recording: {}", h["jvm"]["errors"]);
        }
        dump.push(f(&d["taken"]["took_s"]));
        read.push(f(&d["parse_s"]));
        mb = f(&d["file_bytes"]) / 1e6;
        objects = d["objects"].as_u64().unwrap_or(0);
        stops.extend(gaps(&mut t).into_iter().take(3).map(|ms| ms / 1000.0));
    }
    Ok(vec![
        (
            format!("JVM: {records} records kept (Serial GC); heap used after a GC"),
            format!("{:.1} MB; dump {mb:.1} MB, {objects} objects", median(&used) / 1e6),
        ),
        ("JVM: jcmd GC.class_histogram, whole (s)".into(), range(&histo, 1.0, 2)),
        ("JVM: jcmd GC.heap_dump, whole (s)".into(), range(&dump, 1.0, 2)),
        ("JVM: leaktrace's read of the dump, program running (s)".into(), range(&read, 1.0, 3)),
        ("JVM: the program's three longest stops per run (s)".into(), range(&stops, 1.0, 2)),
        ("JVM: the program's peak RSS over its peak before (VmHWM), MiB".into(), range(&peak, 1.0, 1)),
    ])
}

/// Objects the Go target keeps in a package variable (the typed heap walk's cost).
const GO_OBJECTS: u64 = 1_000_000;

/// The Go part: rows of the table.
fn go(work: &Path, reps: usize, goroutines: u64) -> Result<Vec<(String, String)>> {
    let bin = work.join("go-census");
    run(Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(root().join("xtask/bench/go-census"))
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", work.join("gocache"))
        .env("GOFLAGS", "-mod=mod"))?;
    let (mut census, mut stops, mut counted) = (vec![], vec![], 0u64);
    let (mut walks, mut walked, mut cpu) = (vec![], 0u64, vec![]);
    for rep in 0..reps {
        let mut t = Spawned::new({
            let mut c = Command::new(&bin);
            c.arg(goroutines.to_string()).arg(GO_OBJECTS.to_string());
            c
        })?;
        t.wait_stdout_line("ready", Duration::from_secs(60))?;
        let rec = record(work, &format!("go-{rep}"), &t, &["--heap-census"], "3s")?;
        let g = &rec["runtime_holds"]["go"];
        census.extend([f(&g["start"]["taken"]["took_s"]), f(&g["end"]["taken"]["took_s"])]);
        walks.extend([f(&g["walk_start"]["took_s"]), f(&g["walk_end"]["took_s"])]);
        cpu.extend([f(&g["walk_start"]["cpu_s"]), f(&g["walk_end"]["cpu_s"])]);
        walked = g["walk_end"]["objects"].as_u64().unwrap_or(0);
        counted = g["end"]["total"].as_u64().unwrap_or(0);
        stops.push(gaps(&mut t).first().copied().unwrap_or(0.0) / 1000.0);
    }
    Ok(vec![
        (format!("Go: {goroutines} blocked goroutines; goroutines counted"), counted.to_string()),
        (
            "Go: one census (goroutines, heap profile, heap walk), program running (ms)".into(),
            range(&census, 1000.0, 1),
        ),
        (format!("Go: {GO_OBJECTS} linked objects in a package variable; objects walked"), walked.to_string()),
        ("Go: one typed heap walk, program running (s)".into(), range(&walks, 1.0, 2)),
        ("Go: one typed heap walk, the agent's CPU (s)".into(), range(&cpu, 1.0, 2)),
        ("Go: the program's longest stop per run, 0 when none over 100 ms (s)".into(), range(&stops, 1.0, 2)),
    ])
}

/// Measure the three runtimes, `reps` runs each; the markdown section. A runtime whose part
/// fails gets one line saying why.
pub(super) fn measure(reps: usize, sizes: &Sizes) -> Result<String> {
    let work = root().join("target/bench/holds");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let reps = reps.max(1);
    let mut loads = Vec::new();
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (name, part, size) in [
        ("Node", &node as &dyn Fn(&Path, usize, u64) -> Result<Vec<(String, String)>>, sizes.node_objects),
        ("JVM", &jvm, sizes.jvm_records),
        ("Go", &go, sizes.go_goroutines),
    ] {
        loads.extend(loadavg());
        match part(&work, reps, size) {
            Ok(r) => rows.extend(r),
            Err(e) => failed.push(format!("- {name}: not measured: {}", format!("{e:#}").lines().next().unwrap_or(""))),
        }
    }
    let mut s = format!("{BEGIN}\n");
    s.push_str(&format!(
        "Measured by `cargo xtask bench` ({date}; `--holds-only` runs just this part), {reps} run(s) of each target, \
         1-minute load {} at the starts; medians (min–max). Each target prints its own stops (gaps over 100 ms in a \
         5 ms sleep loop); the rest comes from recording.json (`runtime_holds`).\n\n",
        load_range(&loads)
    ));
    s.push_str("| figure | value |\n| --- | ---: |\n");
    for (k, v) in &rows {
        s.push_str(&format!("| {k} | {v} |\n"));
    }
    for l in &failed {
        s.push_str(&format!("\n{l}"));
    }
    s.push_str(&format!("\n{END}\n"));
    Ok(s)
}
