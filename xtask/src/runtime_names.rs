//! `cargo xtask lint`'s check that code outside a runtime's folders (`src/runtimes/<name>/` of
//! the agent and of the analysis crate) tests no runtime by name: a string literal that is a
//! runtime's name ("python", "jvm", "node", "go", …) or one of its symbols' or frames' marks
//! ("PyObject_…", "JS:…", "runtime.…", "libjvm…") belongs in that runtime's folder, so adding
//! or changing a runtime touches its folders and nothing else. Test code (a `tests/` folder, a
//! `*_tests.rs` file, everything after a file's first `#[cfg(test)]`) and comments are not
//! checked: fixtures spell out real frames.

use std::path::Path;

use anyhow::Result;

/// The source roots checked, relative to the workspace root.
pub(crate) const CHECKED: &[&str] = &["leaktrace/src", "leaktrace-analysis/src"];

/// Literals that are a runtime's name (compared without case).
const NAMES: &[&str] =
    &["python", "python3", "cpython", "jvm", "java", "hotspot", "node", "nodejs", "v8", "go", "golang"];

/// Prefixes of literals that are a runtime's symbols, frames or objects.
const PREFIXES: &[&str] = &[
    "PyObject_",
    "_PyObject_",
    "PyMem_",
    "_PyMem_",
    "Py_",
    "_Py",
    "PyInit_",
    "JS:",
    "libpython",
    "libjvm",
    "libnode",
    "runtime.",
];

/// The exceptions, each a file (relative to its source root) and the literals it may hold, with
/// the reason. Keep it short: a new entry is a runtime's code that should move to its folder.
const ALLOWED: &[(&str, &[&str], &str)] = &[
    // The recording's format: the serialized names of `Runtime` and `FrameKind` are defined here.
    ("recording.rs", &["python", "jvm", "go", "node"], "the names in recording.json"),
    // CPython's allocator API hooked like malloc (`--pymalloc`): entries of the allocator tables.
    ("allocators.rs", &["PyObject_", "PyMem_"], "--pymalloc's entry points"),
    ("allocator_frames.rs", &["PyObject_", "_PyObject_", "PyMem_", "_PyMem_"], "CPython's allocator frames"),
    ("discover.rs", &["PyObject_"], "--pymalloc's entry points"),
    // Which objects are a runtime's own (shared by every runtime's rules).
    ("frame_origin.rs", &["python", "node", "nodejs", "java", "libpython", "libjvm", "libnode"], "runtime objects"),
    // `runtime_holds` in report.json has one key per runtime (RuntimeHolds has a field per runtime).
    ("report/holds.rs", &["jvm", "go", "node"], "report.json's runtime_holds keys"),
];

/// Every line of the checked roots under `root` that tests a runtime by name outside the
/// runtimes' folders, as `root/file:line: literal: text`.
pub(crate) fn find(root: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for src in CHECKED {
        let dir = root.join(src);
        if !dir.is_dir() {
            continue;
        }
        for file in crate::circles::rust_files(&dir)? {
            if file.starts_with("runtimes/") || file.contains("/runtimes/") || is_test_file(&file) {
                continue;
            }
            let text = std::fs::read_to_string(dir.join(&file))?;
            for (i, literal, line) in named(&text) {
                if !allowed(&file, &literal) {
                    found.push(format!("{src}/{file}:{}: {literal:?}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    Ok(found)
}

/// A file of tests only.
fn is_test_file(file: &str) -> bool {
    file.starts_with("tests/") || file.contains("/tests/") || file.ends_with("_tests.rs")
}

/// Whether `literal` in `file` is one of [`ALLOWED`]'s.
fn allowed(file: &str, literal: &str) -> bool {
    ALLOWED.iter().any(|(f, lits, _)| {
        *f == file && lits.iter().any(|l| literal.eq_ignore_ascii_case(l) || literal.starts_with(l))
    })
}

/// The (line index, literal, line) of each string literal of `text` that names a runtime, up to
/// its first `#[cfg(test)]`; comment lines skipped.
fn named(text: &str) -> Vec<(usize, String, &str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        for literal in literals(line) {
            if NAMES.iter().any(|n| literal.eq_ignore_ascii_case(n)) || PREFIXES.iter().any(|p| literal.starts_with(p))
            {
                out.push((i, literal, line));
            }
        }
    }
    out
}

/// The string literals of one line of code (their text, escapes kept), up to a `//` comment.
fn literals(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    let mut current: Option<String> = None;
    while let Some(c) = chars.next() {
        match (&mut current, c) {
            (None, '"') => current = Some(String::new()),
            (None, '/') if chars.peek() == Some(&'/') => break,
            (None, '\'') => {
                // A char literal ('"' or '\'') or a lifetime: skip a quoted char.
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') && rest.chars().nth(2) == Some('\'') || rest.chars().nth(1) == Some('\'') {
                    let n = if rest.starts_with('\\') { 3 } else { 2 };
                    for _ in 0..n {
                        chars.next();
                    }
                }
            }
            (Some(s), '\\') => {
                s.push('\\');
                if let Some(n) = chars.next() {
                    s.push(n);
                }
            }
            (Some(s), '"') => {
                out.push(std::mem::take(s));
                current = None;
            }
            (Some(s), c) => s.push(c),
            (None, _) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{find, literals};

    #[test]
    fn literals_are_read_past_escapes_chars_and_comments() {
        assert_eq!(literals(r#"if a == "python" && b == 'x' { f("a\"b") } // "jvm""#), ["python", r#"a\"b"#]);
        assert_eq!(literals(r#"let q = '"'; g("node")"#), ["node"]);
    }

    /// A planted file that tests a runtime by name is found; the same test inside a runtime's
    /// folder, in a test module, in a comment or in an allowed file is not.
    #[test]
    fn the_gate_fires_on_a_planted_file() {
        let root = std::env::temp_dir().join(format!("xtask-runtime-names-{}", std::process::id()));
        let src = root.join("leaktrace/src");
        std::fs::create_dir_all(src.join("record")).expect("mkdir");
        std::fs::create_dir_all(src.join("runtimes/python")).expect("mkdir");
        let planted = "fn f(rt: &str, s: &str) -> bool {\n    // \"python\" in a comment\n    rt == \"python\" || s.starts_with(\"PyObject_\")\n}\n#[cfg(test)]\nmod tests { const N: &str = \"jvm\"; }\n";
        std::fs::write(src.join("record/planted.rs"), planted).expect("write");
        std::fs::write(src.join("runtimes/python/mod.rs"), planted).expect("write");
        std::fs::write(src.join("recording.rs"), "const R: &str = \"python\";\n").expect("write");
        let found = find(&root);
        std::fs::remove_dir_all(&root).expect("clean up");
        let found = found.expect("find");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("leaktrace/src/record/planted.rs:3: \"python\""), "{found:?}");
        assert!(found[1].starts_with("leaktrace/src/record/planted.rs:3: \"PyObject_\""), "{found:?}");
    }
}
