//! The unwinding part of `cargo xtask bench`: what the unwind-table stack walk costs.
//!
//! - A malloc+free pair made 20 calls below main (xtask/bench/deep.c), built with and without
//!   frame pointers, untraced and traced in exact mode, interleaved: the added time per pair of
//!   each build and their ratio (the walk's cost without frame pointers against with them).
//! - The unwind tables of libc, libstdc++, libssl and libpython: rows, kernel bytes, build time
//!   (`leaktrace unwind-table`).
//!
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md, which
//! sits in the part of the file that the rest of the bench keeps.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::{release_binary, root, run, show};

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- unwind bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- unwind bench: end -->";

/// Block size of the pairs.
const SIZE: &str = "64";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Run `cmd`, return the `ns_per_pair` it printed.
fn ns_per_pair(cmd: &mut Command) -> Result<f64> {
    eprintln!("xtask: $ {}", show(cmd));
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("{} failed: {}", show(cmd), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("ns_per_pair "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no ns_per_pair from {}:\n{text}", show(cmd)))
}

/// A library the system's compiler links with (or None).
fn system_lib(name: &str) -> Option<PathBuf> {
    let out = Command::new("gcc").arg(format!("-print-file-name={name}")).output().ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_absolute().then(|| std::fs::canonicalize(&p).unwrap_or(p))
}

fn libpython() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sysconfig,os; print(os.path.join(sysconfig.get_config_var('LIBDIR'), sysconfig.get_config_var('LDLIBRARY')))"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_file().then_some(p)
}

/// Measure and return the markdown section (between [`BEGIN`] and [`END`]).
pub(crate) fn measure(reps: usize, pairs: u64) -> Result<String> {
    let work = root().join("target/bench-unwind");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let src = root().join("xtask/bench/deep.c");
    let fp = work.join("deep-fp");
    let nofp = work.join("deep-nofp");
    for (out, flag) in [(&fp, "-fno-omit-frame-pointer"), (&nofp, "-fomit-frame-pointer")] {
        run(Command::new("gcc").args(["-O2", "-g", flag, "-Wall", "-o"]).arg(out).arg(&src))?;
    }
    let leaktrace = release_binary();
    let n = pairs.to_string();
    let rec_dir = |tag: &str| work.join(format!("rec-{tag}"));
    let traced = |bin: &Path, tag: &str| {
        let dir = rec_dir(tag);
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = Command::new(&leaktrace);
        c.args(["record", "--interval", "1s", "--out"]).arg(dir).arg("--").arg(bin).args([&n, SIZE]);
        c
    };
    let labels = [
        "untraced, frame pointers",
        "untraced, no frame pointers",
        "exact, frame pointers",
        "exact, no frame pointers",
    ];
    let mut values: [Vec<f64>; 4] = Default::default();
    for rep in 0..reps {
        for (i, label) in labels.iter().enumerate() {
            let mut cmd = match i {
                0 => {
                    let mut c = Command::new(&fp);
                    c.args([&n, SIZE]);
                    c
                }
                1 => {
                    let mut c = Command::new(&nofp);
                    c.args([&n, SIZE]);
                    c
                }
                2 => traced(&fp, "fp"),
                _ => traced(&nofp, "nofp"),
            };
            let v = ns_per_pair(&mut cmd).with_context(|| format!("unwind bench, {label}"))?;
            eprintln!("xtask: bench: unwind rep {rep} {label}: {v:.1} ns/pair");
            values[i].push(v);
        }
    }
    // The traced build without frame pointers must have been walked to main, or the figure
    // measures a walk that gave up early.
    let recording = std::fs::read_to_string(rec_dir("nofp").join("recording.json"))?;
    if !(recording.contains("\"level_1\"") && recording.contains("\"main\"")) {
        bail!("the traced run without frame pointers has no stack through level_1 to main: the walk is broken");
    }
    let m: Vec<f64> = values.iter().map(|v| median(v.clone())).collect();
    let added_fp = m[2] - m[0];
    let added_nofp = m[3] - m[1];

    let mut s = String::new();
    s.push_str(&format!("{BEGIN}\n## Stack walk without frame pointers\n\n"));
    s.push_str(&format!(
        "`cargo xtask bench` (or `cargo xtask bench --unwind-only --reps {reps} --pairs {pairs}`): \
         xtask/bench/deep.c makes its malloc+free pairs 20 calls below main ({pairs} pairs of \
         {SIZE} bytes a run, CPU time of the loop / pairs), built `-O2 -fno-omit-frame-pointer` and \
         `-O2 -fomit-frame-pointer`, each untraced and traced in exact mode; {reps} runs of each, \
         interleaved, medians. Both builds are walked with the unwind tables (libc has no frame \
         pointers either way): the ratio is the cost of the walk without frame pointers against \
         with them. Target: at most 1.5x.\n\n"
    ));
    s.push_str("| variant | ns per pair (median) | runs |\n| --- | ---: | --- |\n");
    for (i, label) in labels.iter().enumerate() {
        let runs: Vec<String> = values[i].iter().map(|v| format!("{v:.0}")).collect();
        s.push_str(&format!("| {label} | {:.0} | {} |\n", m[i], runs.join(", ")));
    }
    s.push_str(&format!(
        "\nAdded by tracing: {added_fp:.0} ns per pair with frame pointers, {added_nofp:.0} ns without; \
         ratio **{:.2}x**.\n\n",
        added_nofp / added_fp
    ));

    s.push_str(
        "Unwind tables (`leaktrace unwind-table LIB...`: rows of 8 bytes in the kernel's \
         `UNWIND_ROWS` map, built from `.eh_frame` with gimli, once per file):\n\n\
         | object | rows | kernel bytes | build time |\n| --- | ---: | ---: | ---: |\n",
    );
    let libs: Vec<PathBuf> = ["libc.so.6", "libstdc++.so.6", "libssl.so.3", "libcrypto.so.3"]
        .iter()
        .filter_map(|l| system_lib(l))
        .chain(libpython())
        .collect();
    let mut c = Command::new(&leaktrace);
    c.arg("unwind-table").args(&libs);
    eprintln!("xtask: $ {}", show(&c));
    let out = c.output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut rows_total, mut bytes_total, mut ms_total) = (0u64, 0u64, 0f64);
    for line in text.lines() {
        // "PATH: R rows, B bytes, built in T ms from .eh_frame; U rules not usable by the walk"
        let Some((path, rest)) = line.split_once(": ") else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| words.get(i).and_then(|w| w.trim_end_matches(',').parse::<f64>().ok());
        let (Some(rows), Some(bytes), Some(ms)) = (num(0), num(2), num(6)) else { continue };
        rows_total += rows as u64;
        bytes_total += bytes as u64;
        ms_total += ms;
        s.push_str(&format!("| {path} | {rows:.0} | {bytes:.0} | {ms:.1} ms |\n"));
    }
    s.push_str(&format!(
        "| **all** | {rows_total} | {bytes_total} ({:.2} MiB) | {ms_total:.1} ms |\n\n\
         The default `--max-unwind-rows` (2 M rows, 16 MiB) holds about {:.0} processes' worth of \
         these distinct libraries; a table is shared by every process that maps the same file.\n{END}\n",
        bytes_total as f64 / (1 << 20) as f64,
        (2u64 << 20) as f64 / rows_total.max(1) as f64
    ));
    Ok(s)
}

/// Put `section` in place of the old one in the document at `out` (at its end if it has none).
pub(crate) fn write_section(out: &Path, section: &str) -> Result<()> {
    write_marked(out, BEGIN, END, section)
}

/// Replace the part of `out` between the lines `begin` and `end` (included) with `section`, or
/// append `section` when the marks are not there.
pub(crate) fn write_marked(out: &Path, begin: &str, end: &str, section: &str) -> Result<()> {
    let old = std::fs::read_to_string(out).unwrap_or_default();
    let doc = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{}{}", &old[..b], section, &old[e + end.len()..].trim_start_matches('\n'))
        }
        _ => format!("{}\n{section}", old.trim_end()),
    };
    std::fs::write(out, doc).with_context(|| format!("cannot write {}", out.display()))
}
