//! The real pprof client, `go tool pprof` (Go from Debian, installed by `cargo xtask setup`), on
//! profiles leaktrace wrote or sent.

use std::path::Path;
use std::process::Command;

use crate::temp_root;

/// `go tool pprof -symbolize=none ARGS... FILES...`; panics with its output unless it succeeds.
/// Returns its stdout.
pub fn go_pprof(args: &[&str], files: &[&Path]) -> String {
    let mut cmd = Command::new("go");
    cmd.args(["tool", "pprof", "-symbolize=none"]).args(args).args(files);
    // pprof keeps fetched profiles under $PPROF_TMPDIR; nothing is fetched, but keep it out of $HOME.
    cmd.env("PPROF_TMPDIR", temp_root());
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot run go (`cargo xtask setup` installs golang-go): {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{cmd:?} failed ({}):\n{stdout}\n{stderr}", o.status);
    stdout.into_owned()
}

/// The rows of `go tool pprof -top -unit=B`: (flat bytes, function), in the order printed.
pub fn top_rows(text: &str) -> Vec<(i64, String)> {
    let mut rows = Vec::new();
    let mut body = false;
    for l in text.lines() {
        if l.trim_start().starts_with("flat") {
            body = true;
            continue;
        }
        if !body {
            continue;
        }
        // "    600000B 94.83% 94.83%    600000B 94.83%  leak_malloc"
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols.len() < 6 {
            continue;
        }
        if let Ok(flat) = cols[0].trim_end_matches('B').parse::<i64>() {
            rows.push((flat, cols[5..].join(" ")));
        }
    }
    rows
}

/// `go tool pprof -top -unit=B -sample_index=inuse_space FILE`: its rows and its whole text.
pub fn pprof_top_inuse(file: &Path) -> (Vec<(i64, String)>, String) {
    let text = go_pprof(&["-top", "-unit=B", "-sample_index=inuse_space"], &[file]);
    (top_rows(&text), text)
}
