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
//!
//! Paths a module writes relative to itself count too (`self::x::f`, `x::f` with `x` one of its
//! submodules, in a `use` or inline): `analyze/mod.rs` saying `pub(crate) use first_touch::f;`
//! depends on `analyze/first_touch.rs`. A path through a `use` of another module (a re-export,
//! or a private `use` its submodules see) depends on both: on the module it names and on the file
//! the item lives in — `crate::analyze::f` on `analyze/mod.rs` and on `analyze/first_touch.rs`.
//! A glob (`pub use thresholds::*;`) is followed for a name the module does not
//! define itself and the glob's module does (an item's name after `fn`, `struct`, `enum`, `const`,
//! `static`, `type`, `trait`, `mod`, `union` or `macro_rules!`, or a name it binds by `use`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// The circles among the files under `src` (a crate's source root, holding lib.rs or main.rs):
/// each as the list of its files (paths relative to `src`), sorted; empty when there is none.
pub(crate) fn find(src: &Path) -> Result<Vec<Vec<String>>> {
    let files = rust_files(src)?;
    let modules: BTreeMap<Vec<String>, String> = files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut texts = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(src.join(file)).with_context(|| format!("cannot read {file}"))?;
        texts.insert(file.clone(), without_comments(without_tests(&text)));
    }
    let scopes: BTreeMap<Vec<String>, Scope> =
        files.iter().map(|f| (module_of(f), Scope::of(&texts[f], &module_of(f), &modules))).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        if file.ends_with("tests.rs") {
            continue;
        }
        let here = module_of(file);
        let children: BTreeSet<String> = modules
            .keys()
            .filter(|m| m.len() == here.len() + 1 && m.starts_with(&here))
            .filter_map(|m| m.last().cloned())
            .collect();
        let edges = graph.entry(file.clone()).or_default();
        for path in paths(&texts[file], &here, &children) {
            // The module the path names (where a `use` may pass it on) and the file of the item.
            let named = (0..=path.len()).rev().find_map(|n| modules.get(&path[..n]));
            for target in named.into_iter().chain(resolve(&path, &modules, &scopes)) {
                let target_mod = module_of(target);
                if target != file && !here.starts_with(&target_mod) {
                    edges.insert(target.clone());
                }
            }
        }
    }
    Ok(cycles(&graph))
}

/// What a module's text binds: the names its `use` declarations bring in (with the absolute
/// paths they name), its globs' modules, and the names of the items it defines.
struct Scope {
    binds: Vec<(String, Vec<String>)>,
    globs: Vec<Vec<String>>,
    defines: BTreeSet<String>,
}

impl Scope {
    fn of(text: &str, here: &[String], modules: &BTreeMap<Vec<String>, String>) -> Scope {
        let mut scope = Scope { binds: Vec::new(), globs: Vec::new(), defines: BTreeSet::new() };
        for (path, name) in uses(text, here, modules) {
            match name.as_deref() {
                Some("*") => scope.globs.push(path),
                Some(alias) => scope.binds.push((alias.to_string(), path)),
                None => {
                    if let Some(last) = path.last() {
                        scope.binds.push((last.clone(), path.clone()));
                    }
                }
            }
        }
        let words: Vec<&str> =
            text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '!')).filter(|w| !w.is_empty()).collect();
        for pair in words.windows(2) {
            if matches!(
                pair[0],
                "fn" | "struct" | "enum" | "const" | "static" | "type" | "trait" | "mod" | "union" | "macro_rules!"
            ) {
                scope.defines.insert(pair[1].to_string());
            }
        }
        scope
    }

    /// Where `name`, named in this module, lives: the path a `use` binds it to, or the glob
    /// module that defines it when this module does not.
    fn lookup(&self, name: &str, scopes: &BTreeMap<Vec<String>, Scope>) -> Option<Vec<String>> {
        if let Some((_, path)) = self.binds.iter().find(|(n, _)| n == name) {
            return Some(path.clone());
        }
        if self.defines.contains(name) {
            return None;
        }
        self.globs
            .iter()
            .find(|g| {
                scopes.get(*g).is_some_and(|s| s.defines.contains(name) || s.binds.iter().any(|(n, _)| n == name))
            })
            .map(|g| g.iter().cloned().chain(std::iter::once(name.to_string())).collect())
    }
}

/// The file of the item `path` names (absolute, from the crate root): the file of its longest
/// module prefix, after following the `use` declarations it goes through (at most 16).
fn resolve<'a>(
    path: &[String],
    modules: &'a BTreeMap<Vec<String>, String>,
    scopes: &BTreeMap<Vec<String>, Scope>,
) -> Option<&'a String> {
    let mut path = path.to_vec();
    let mut file = None;
    for _ in 0..16 {
        let n = (0..=path.len()).rev().find(|n| modules.contains_key(&path[..*n]))?;
        file = modules.get(&path[..n]);
        let Some(first) = path.get(n) else { break };
        let Some(to) = scopes.get(&path[..n]).and_then(|s| s.lookup(first, scopes)) else { break };
        let next: Vec<String> = to.into_iter().chain(path[n + 1..].iter().cloned()).collect();
        if next == path {
            break;
        }
        path = next;
    }
    file
}

/// The `use` declarations of the module `here`'s text: each bound path (absolute) with its alias
/// (`as name`) or `*` for a glob. A path relative to `here` counts when it starts with one of its
/// submodules; one of another crate is left out.
fn uses(text: &str, here: &[String], modules: &BTreeMap<Vec<String>, String>) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find("use ") {
        let at = from + i;
        from = at + "use ".len();
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let rest = text[from..].trim_start();
        let (base, skip) = if let Some(r) = rest.strip_prefix("crate::") {
            (Vec::new(), rest.len() - r.len())
        } else if rest.starts_with("super::") || rest.starts_with("self::") {
            let mut base = here.to_vec();
            let mut r = rest;
            while let Some(t) = r.strip_prefix("super::") {
                base.pop();
                r = t;
            }
            if let Some(t) = r.strip_prefix("self::") {
                r = t;
            }
            (base, rest.len() - r.len())
        } else {
            let first: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let mut child = here.to_vec();
            child.push(first);
            if !modules.contains_key(&child) {
                continue;
            }
            (here.to_vec(), 0)
        };
        let start = text.len() - rest.len() + skip;
        let mut found = Vec::new();
        tree(&text[start..], &base, &mut found);
        out.extend(found);
    }
    out
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
fn paths(text: &str, here: &[String], children: &BTreeSet<String>) -> Vec<Vec<String>> {
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
        } else if rest.starts_with("self::") {
            Some((here.to_vec(), "self::".len()))
        } else {
            let ident: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            (!ident.is_empty() && rest[ident.len()..].starts_with("::") && children.contains(&ident))
                .then(|| (here.to_vec(), 0))
        };
        match base {
            Some((base, n)) => {
                let mut found = Vec::new();
                let end = tree(&text[i + n..], &base, &mut found);
                out.extend(found.into_iter().map(|(p, _)| p));
                i += n + end.max(1);
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Parse a use tree (`a::b`, `a::{b, c::d}`, `a::*`, `a as b`) at the start of `s`, prefixed by
/// `base`; push each path with its alias (`as` name, or `*` for a glob); return the bytes read.
fn tree(s: &str, base: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) -> usize {
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
            let glob = s[i..].starts_with('*');
            out.push((path, glob.then(|| "*".to_string())));
            return i + usize::from(glob);
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
            let mut alias = None;
            if let Some(r) = skip.strip_prefix("as ") {
                let name: String = r.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                i = s.len() - r.trim_start().len() + name.len();
                alias = Some(name);
            }
            out.push((path, alias));
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
        let children: BTreeSet<String> = ["window".to_string()].into();
        let found = paths(
            "use crate::{a::{b, c::D}, e as f};\nuse super::super::g::H;\nlet x = crate::k::l(1); use super::m;\n\
             use self::window::W; let y = window::f(); let z = other::g();",
            &here,
            &children,
        );
        let want: Vec<Vec<String>> = [
            &["a", "b"][..],
            &["a", "c", "D"],
            &["e"],
            &["g", "H"],
            &["k", "l"],
            &["record", "m"],
            &["record", "session", "window", "W"],
            &["record", "session", "window", "f"],
        ]
        .iter()
        .map(|v| p(v))
        .collect();
        assert_eq!(found, want);
        assert!(paths("use my_crate::x; // not_super::y", &here, &children).is_empty());
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

    /// A crate in a fresh temporary directory: `files` as (path, text); removed when dropped.
    struct Planted(PathBuf);

    impl Planted {
        fn new(tag: &str, files: &[(&str, &str)]) -> Planted {
            let dir = std::env::temp_dir().join(format!("xtask-circles-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for (path, text) in files {
                let p = dir.join(path);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, text).unwrap();
            }
            Planted(dir)
        }
    }

    impl Drop for Planted {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// timeline.rs names `crate::analyze::mapped`, which analyze/mod.rs re-exports from
    /// analyze/first_touch.rs, which names `crate::timeline::Timeline`: a circle, though neither
    /// file names the other's module (the check missed it when it followed `crate::` and
    /// `super::` paths only).
    #[test]
    fn a_circle_through_a_re_export_is_found() {
        let lib = "pub mod analyze;\npub mod timeline;\n";
        let timeline = "pub struct Timeline;\nfn f() { crate::analyze::mapped(); }\n";
        let touch = "use crate::timeline::Timeline;\npub(crate) fn mapped() {}\n";
        let circle = vec![p(&["analyze/first_touch.rs", "analyze/mod.rs", "timeline.rs"])];
        for (tag, analyze) in [
            ("pub-use", "mod first_touch;\npub(crate) use first_touch::mapped;\n"),
            ("self-alias", "mod first_touch;\npub use self::first_touch::{mapped as mapped, other};\n"),
            ("private-use", "mod first_touch;\nuse crate::analyze::first_touch::mapped;\n"),
            ("glob", "mod first_touch;\npub use first_touch::*;\npub fn own() {}\n"),
            ("inline", "mod first_touch;\npub(crate) fn mapped() { first_touch::mapped() }\n"),
        ] {
            let c = Planted::new(
                tag,
                &[
                    ("lib.rs", lib),
                    ("timeline.rs", timeline),
                    ("analyze/mod.rs", analyze),
                    ("analyze/first_touch.rs", touch),
                ],
            );
            assert_eq!(find(&c.0).unwrap(), circle, "{tag}");
        }
        // The item moved where both can use it: no circle.
        let c = Planted::new(
            "moved",
            &[
                ("lib.rs", "pub mod analyze;\npub mod timeline;\npub mod origin;\n"),
                ("timeline.rs", "pub struct Timeline;\nfn f() { crate::origin::mapped(); }\n"),
                ("origin.rs", "pub(crate) fn mapped() {}\n"),
                ("analyze/mod.rs", "mod first_touch;\nfn g() { first_touch::h() }\n"),
                ("analyze/first_touch.rs", "use crate::timeline::Timeline;\npub(crate) fn h() {}\n"),
            ],
        );
        assert!(find(&c.0).unwrap().is_empty());
    }

    /// The file of an item re-exported twice is found through both `use`s.
    #[test]
    fn a_path_through_re_exports_resolves_to_the_file_of_the_item() {
        let files = [
            ("lib.rs", "pub mod a;\npub use a::f;\n"),
            ("a/mod.rs", "mod b;\npub use b::f as f;\n"),
            ("a/b.rs", "pub fn f() {}\n"),
        ];
        let c = Planted::new("resolve", &files);
        let modules: BTreeMap<Vec<String>, String> = files.iter().map(|(f, _)| (module_of(f), f.to_string())).collect();
        let scopes: BTreeMap<Vec<String>, Scope> = files
            .iter()
            .map(|(f, t)| (module_of(f), Scope::of(&without_comments(t), &module_of(f), &modules)))
            .collect();
        assert_eq!(resolve(&p(&["f"]), &modules, &scopes).map(String::as_str), Some("a/b.rs"));
        assert_eq!(resolve(&p(&["a", "f"]), &modules, &scopes).map(String::as_str), Some("a/b.rs"));
        drop(c);
    }

    #[test]
    fn the_workspace_has_no_import_circle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let found: Vec<(&str, Vec<Vec<String>>)> =
            crate::CIRCLE_CHECKED.iter().map(|src| (*src, find(&root.join(src)).unwrap())).collect();
        assert!(found.iter().all(|(_, c)| c.is_empty()), "{found:?}");
    }
}
