//! `cargo xtask lint`'s check that files inside a target's root are opened only through
//! `leaktrace/src/target_fs.rs`: a line of `leaktrace/src` that builds a `/proc/{pid}/root` path
//! (`"/proc/{…}/root…"`) outside that helper is an error, unless its file is in [`ALLOWED`] or the
//! line (or the one before it) says `lint-allow: target_fs` with its reason.

use std::path::Path;

use anyhow::Result;

/// Files that may build a `/proc/{pid}/root` path, and why.
const ALLOWED: &[(&str, &str)] = &[
    // The helper itself.
    ("target_fs.rs", "opens /proc/PID/root as the directory fd every read starts from"),
    // Compares the root link itself with the agent's (stat of /proc/PID/root, no file in it).
    ("record/targets.rs", "whether a process shares the agent's root: the link itself is stat'ed"),
];

/// Every line under `src` (a crate's source root) that builds a /proc/{pid}/root path outside
/// the allowed places, as `file:line: text`.
pub(crate) fn find(src: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for file in crate::circles::rust_files(src)? {
        let name = file.clone();
        if ALLOWED.iter().any(|(f, _)| *f == name) {
            continue;
        }
        let text = std::fs::read_to_string(src.join(&file))?;
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") || !builds_root_path(code) {
                continue;
            }
            let marked = |l: &str| l.contains("lint-allow: target_fs");
            if marked(line) || i.checked_sub(1).is_some_and(|p| marked(lines[p])) {
                continue;
            }
            found.push(format!("{name}:{}: {}", i + 1, code));
        }
    }
    Ok(found)
}

/// Whether a line of code builds a `/proc/{…}/root` path: a format string `/proc/{`, then `}/root`.
fn builds_root_path(code: &str) -> bool {
    code.find("/proc/{").is_some_and(|at| code[at..].contains("}/root"))
}

#[cfg(test)]
mod tests {
    use super::builds_root_path;

    #[test]
    fn root_paths_are_found() {
        assert!(builds_root_path(r#"std::fs::read(format!("/proc/{pid}/root{path}"))"#));
        assert!(builds_root_path(r#"Path::new(&format!("/proc/{mm}/root")).join(p)"#));
        assert!(!builds_root_path(r#"format!("/proc/{pid}/maps")"#));
        assert!(!builds_root_path(r#"format!("/proc/{pid}/map_files/{range}")"#));
    }
}
