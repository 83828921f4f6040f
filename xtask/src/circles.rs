//! `cargo xtask lint`'s import-circle check: no circle among the files of a crate.
//!
//! Each source file is a node; file A depends on file B when A names an item of B's module
//! through a `crate::` or `super::` path (in a `use` or inline, brace groups included), B being
//! the file of the longest module prefix of the path. A file's use of its ancestors' items
//! (`super::Item`, `crate::record::Options` from `record/session.rs`) is not counted: a module
//! and its submodules are one room (the parent declares them). The `#[cfg(test)] mod` blocks at
//! the end of a file are left out (tests may reach anywhere), and so are files named `tests.rs`.
//! The text is read, not compiled: `//` comments are left out (a doc link is no import), paths in
//! strings count, which errs on the side of finding a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// The circles among the files under `src` (a crate's source root, holding lib.rs or main.rs):
/// each as the list of its files (paths relative to `src`), sorted; empty when there is none.
pub(crate) fn find(src: &Path) -> Result<Vec<Vec<String>>> {
    let files = rust_files(src)?;
    let modules: BTreeMap<Vec<String>, String> = files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        if file.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(src.join(file)).with_context(|| format!("cannot read {file}"))?;
        let here = module_of(file);
        let edges = graph.entry(file.clone()).or_default();
        for path in paths(&without_comments(without_tests(&text)), &here) {
            let Some(target) = (1..=path.len()).rev().find_map(|n| modules.get(&path[..n])) else { continue };
            let target_mod = module_of(target);
            if target != file && !here.starts_with(&target_mod) {
                edges.insert(target.clone());
            }
        }
    }
    Ok(cycles(&graph))
}

/// The `.rs` files under `dir` (all depths), relative to `dir`, `/`-separated, sorted.
pub(crate) fn rust_files(dir: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    Ok(files)
}

/// The `.rs` files under `dir`, relative to `root`, `/`-separated.
fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(root, &p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(root).expect("under root");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// The module path of a file: `lib.rs`/`main.rs` → [], `a/mod.rs` → [a], `a/b.rs` → [a, b].
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod"))
        || (parts.len() == 1 && matches!(file, "lib.rs" | "main.rs"))
    {
        parts.pop();
    }
    parts
}

/// `text` up to its first `#[cfg(test)]` followed by a `mod` item.
fn without_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod ") || rest.starts_with("pub mod ") || rest.starts_with("pub(crate) mod ") {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// `text` without its `//` comments (doc comments' links name items, they do not import them).
/// A `//` inside a string literal cuts the rest of its line too, which can only miss a path.
fn without_comments(text: &str) -> String {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

/// Every module path named from the module `here` with `crate::` or `super::` (absolute, from the
/// crate root), brace groups expanded.
fn paths(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let boundary =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        let base = if !boundary {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("super::") {
            let mut base = here.to_vec();
            let mut n = 0;
            while text[i + n..].starts_with("super::") {
                base.pop();
                n += "super::".len();
            }
            Some((base, n))
        } else {
            None
        };
        match base {
            Some((base, n)) => {
                let end = tree(&text[i + n..], &base, &mut out);
                i += n + end.max(1);
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Parse a use tree (`a::b`, `a::{b, c::d}`, `a::*`) at the start of `s`, prefixed by `base`;
/// push each path; return the bytes read.
fn tree(s: &str, base: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = base.to_vec();
    let mut i = 0;
    loop {
        let ident: String = s[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if ident.is_empty() {
            if s[i..].starts_with('{') {
                i += 1;
                loop {
                    i += s[i..].len() - s[i..].trim_start().len();
                    if s[i..].starts_with('}') || i >= s.len() {
                        return (i + 1).min(s.len());
                    }
                    i += tree(&s[i..], &path, out);
                    i += s[i..].len() - s[i..].trim_start().len();
                    if s[i..].starts_with(',') {
                        i += 1;
                    }
                }
            }
            out.push(path);
            return i;
        }
        i += ident.len();
        if ident != "self" {
            path.push(ident);
        }
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            // `a as b`, `a;`, `a,` or an item used inline (`crate::x::f(…)`).
            let skip = s[i..].trim_start();
            if let Some(r) = skip.strip_prefix("as ") {
                let alias: usize = r.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').count();
                i = s.len() - r.trim_start().len() + alias;
            }
            out.push(path);
            return i;
        }
    }
}

/// The strongly connected components of more than one file (Tarjan's algorithm), each sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn use_trees_and_inline_paths_are_read() {
        let here = p(&["record", "session"]);
        let found = paths(
            "use crate::{a::{b, c::D}, e as f};\nuse super::super::g::H;\nlet x = crate::k::l(1); use super::m;",
            &here,
        );
        let want: Vec<Vec<String>> =
            [&["a", "b"][..], &["a", "c", "D"], &["e"], &["g", "H"], &["k", "l"], &["record", "m"]]
                .iter()
                .map(|v| p(v))
                .collect();
        assert_eq!(found, want);
        assert!(paths("use my_crate::x; // not_super::y", &here).is_empty());
    }

    #[test]
    fn a_circle_between_files_is_found_but_not_a_child_using_its_parent() {
        let dir = std::env::temp_dir().join(format!("xtask-circles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rec")).unwrap();
        std::fs::write(dir.join("lib.rs"), "pub mod a;\npub mod b;\npub mod rec;\n").unwrap();
        std::fs::write(dir.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
        std::fs::write(
            dir.join("b.rs"),
            "pub struct B(crate::a::A);\n#[cfg(test)]\nmod tests { use crate::rec::x; }\n",
        )
        .unwrap();
        std::fs::write(dir.join("rec/mod.rs"), "mod session;\npub struct Options;\nuse session::S;\n").unwrap();
        std::fs::write(dir.join("rec/session.rs"), "use super::Options;\nuse crate::rec::Options as O;\n").unwrap();
        let found = find(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, vec![p(&["a.rs", "b.rs"])]);
    }

    #[test]
    fn the_workspace_has_no_import_circle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let found: Vec<(&str, Vec<Vec<String>>)> =
            crate::CIRCLE_CHECKED.iter().map(|src| (*src, find(&root.join(src)).unwrap())).collect();
        assert!(found.iter().all(|(_, c)| c.is_empty()), "{found:?}");
    }
}
