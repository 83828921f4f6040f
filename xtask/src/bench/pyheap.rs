//! The Python heap census part of `cargo xtask bench`: how long `record
//! --python-heap` stops a CPython process holding about a million objects.
//!
//! Each run: start `xtask/bench/pyheap_objects.py OBJECTS SECS` under pyenv's CPython 3.11
//! (OBJECTS/4 lists of an int, a str and a float), wait for its "ready", attach `leaktrace
//! record --python-heap --python-heap-every 1 --python-heap-max-pause 30s` for 3 s (a census at
//! each of the checkpoints and one at the end), then check that the target ran on and printed
//! the checksum computed here (its heap unchanged by the censuses). The figures come from
//! recording.json's `python_heap` (each census's pause, objects, completeness, memory read).
//! The census thread runs at nice −10 during the pause (leaktrace raises it itself); on a
//! loaded machine the pause is still longer than the census's CPU time, which is reported too.
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- python heap census bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- python heap census bench: end -->";

/// The interpreter measured (installed by `cargo xtask setup`).
const PYTHON: &str = "/root/.pyenv/versions/3.11.7/bin/python3";

/// One census's figures, from recording.json.
struct Census {
    pause_ms: f64,
    cpu_ms: f64,
    objects: u64,
    complete: bool,
    mib_read: f64,
}

/// The checksum pyheap_objects.py prints for `objects` (its rows: 1000 + i, "row-i", i + 0.5).
fn checksum(objects: u64) -> u64 {
    (0..objects / 4).map(|i| 1000 + 2 * i + 4 + i.max(1).ilog10() as u64 + 1).sum()
}

fn one_run(work: &Path, objects: u64, rep: usize) -> Result<Vec<Census>> {
    let mut target = Spawned::new({
        let mut c = Command::new(PYTHON);
        c.arg(root().join("xtask/bench/pyheap_objects.py")).args([&objects.to_string(), "8"]);
        c
    })?;
    target.wait_stdout_line("ready", Duration::from_secs(120))?;
    let out = work.join(format!("pyheap-{rep}"));
    let mut cmd = Command::new(release_binary());
    cmd.args(["record", "--quiet", "--interval", "1s", "--duration", "3s", "--python-heap"])
        .args(["--python-heap-every", "1", "--python-heap-max-pause", "30s", "--pid"])
        .arg(target.pid().to_string())
        .arg("--out")
        .arg(&out);
    Spawned::new(cmd)?.wait(Duration::from_secs(300))?;
    let sum = target.wait_stdout_line("sum ", Duration::from_secs(60))?;
    let want = format!("sum {}", checksum(objects));
    if sum != want {
        bail!("the target's data changed during the censuses: {sum}, expected {want}");
    }
    target.wait(Duration::from_secs(30))?;
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("recording.json"))
            .with_context(|| format!("{}/recording.json", out.display()))?,
    )?;
    let censuses: Vec<Census> = rec["python_heap"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| Census {
            pause_ms: c["pause_ms"].as_f64().unwrap_or(f64::NAN),
            cpu_ms: c["cpu_ms"].as_f64().unwrap_or(f64::NAN),
            objects: c["objects"].as_u64().unwrap_or(0),
            complete: c["complete"].as_bool().unwrap_or(false),
            mib_read: c["notes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str()?.strip_suffix(" MiB of the target's memory read")?.parse().ok())
                .next()
                .unwrap_or(0.0),
        })
        .collect();
    if censuses.is_empty() {
        bail!("{}: no census in recording.json", out.display());
    }
    Ok(censuses)
}

/// Measure `reps` recordings of a heap of `objects` objects; the markdown section.
pub(super) fn measure(reps: usize, objects: u64) -> Result<String> {
    if !Path::new(PYTHON).exists() {
        bail!("{PYTHON} is missing (cargo xtask setup installs it)");
    }
    let work = root().join("target/bench/pyheap");
    std::fs::create_dir_all(&work)?;
    let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let mut all = Vec::new();
    let mut loads = Vec::new();
    for rep in 0..reps.max(1) {
        loads.extend(loadavg());
        all.extend(one_run(&work, objects, rep)?);
    }
    let pauses: Vec<f64> = all.iter().map(|c| c.pause_ms).collect();
    let (min, max) = (pauses.iter().copied().fold(f64::INFINITY, f64::min), pauses.iter().copied().fold(0.0, f64::max));
    let last = all.last().expect("at least one census");
    let mut s = format!("{BEGIN}\n");
    s.push_str(&format!(
        "Measured by `cargo xtask bench` ({date}; `--pyheap-only` runs just this part), {} recording(s), 1-minute load \
         {} at the starts. `xtask/bench/pyheap_objects.py {objects}` under CPython 3.11.7 (pyenv): {} lists of an \
         int, a str and a float; `leaktrace record --python-heap --python-heap-every 1 --python-heap-max-pause 30s \
         --interval 1s --duration 3s --pid PID` takes a census at each checkpoint and at the end; the target's \
         checksum is checked after every recording.\n\n",
        reps.max(1),
        load_range(&loads),
        objects / 4
    ));
    s.push_str("| figure | value |\n| --- | ---: |\n");
    s.push_str(&format!("| objects counted per census | {} |\n", last.objects));
    s.push_str(&format!(
        "| pause, threads stopped → resumed (median of {} censuses; min–max) | {:.0} ms ({:.0}–{:.0}) |\n",
        all.len(),
        median(&pauses),
        min,
        max
    ));
    let cpu: Vec<f64> = all.iter().map(|c| c.cpu_ms).collect();
    s.push_str(&format!(
        "| the agent's CPU time in the pause (median; min–max; the rest is waiting for a CPU) | {:.0} ms ({:.0}–{:.0}) |\n",
        median(&cpu),
        cpu.iter().copied().fold(f64::INFINITY, f64::min),
        cpu.iter().copied().fold(0.0, f64::max)
    ));
    s.push_str(&format!("| target memory read per census | {:.1} MiB |\n", last.mib_read));
    s.push_str(&format!("| every census complete (not cut by a cap) | {} |\n", yes(all.iter().all(|c| c.complete))));
    s.push_str(&format!(
        "| censuses under the 1 s goal | {} of {} |\n",
        pauses.iter().filter(|&&p| p < 1000.0).count(),
        all.len()
    ));
    s.push('\n');
    s.push_str(END);
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    /// The checksum of 8 objects (rows 0 and 1): 1000 + 0 + len("row-0") + 0 and 1001 + 5 + 1.
    #[test]
    fn checksum_of_two_rows() {
        assert_eq!(super::checksum(8), 1000 + 5 + 1001 + 5 + 1);
    }
}
