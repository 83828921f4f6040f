//! The leak-pattern catalog (`leaktrace-analysis/data/leak_patterns.json`, built into the
//! binary): APIs whose result must be released by a matching call (a leaking stack through
//! `inflateInit2_` likely misses `inflateEnd`), and look-alikes that retain memory by design
//! (allocator arenas, pymalloc arenas, V8 semi-spaces, JIT code caches, thread caches, stdio
//! buffers). Every entry carries its source.

use std::sync::Arc;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::frames::{is_runtime_frame, is_system_frame};
use crate::allocator_frames::is_allocator_frame;
use crate::recording::Frame;

/// The catalog's text, as shipped.
pub const CATALOG_JSON: &str = include_str!("../../data/leak_patterns.json");

#[derive(Deserialize)]
struct Catalog {
    release_pairs: Vec<Pair>,
    lookalikes: Vec<Look>,
}

#[derive(Deserialize)]
struct Pair {
    acquire: Vec<String>,
    release: String,
    library: String,
    source: String,
}

#[derive(Deserialize)]
struct Look {
    frames: Vec<String>,
    name: String,
    why: String,
    #[serde(default)]
    warm_up: bool,
    source: String,
}

fn catalog() -> &'static Catalog {
    static C: OnceLock<Catalog> = OnceLock::new();
    // The file is part of the crate and checked by a unit test; an unreadable catalog would be a
    // build defect, so it degrades to an empty one rather than failing an analysis.
    C.get_or_init(|| {
        serde_json::from_str(CATALOG_JSON).unwrap_or(Catalog { release_pairs: Vec::new(), lookalikes: Vec::new() })
    })
}

/// Whether a catalog pattern matches a function name: a glob in which each `*` stands for any
/// run of characters (none included) and every other character for itself, wherever the `*`
/// is: `inflateInit*`, `*_Cfunc_CString`, `*::GetStringUTFChars`, `_cgo_*_Cfunc__Cmalloc`,
/// `tcmalloc::*ThreadCache*`. A pattern without `*` is the exact name.
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    // split yields at least one part; the first is a prefix (empty when the pattern starts with `*`).
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else { return rest.is_empty() };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The release call a leaking stack likely misses: the stack passes through an API of the
/// catalog whose result must be released.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReleaseHint {
    /// The API the stack passes through (the frame's function name, e.g. "inflateInit2_").
    pub acquire: String,
    /// What releases its result ("inflateEnd").
    pub release: String,
    /// Library of the API ("zlib").
    pub library: String,
    /// Where the pairing is documented.
    pub source: String,
}

/// A site that retains memory by design ("glibc malloc arena or heap"), from the catalog.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lookalike {
    /// What it is.
    pub name: String,
    /// Why its memory stays.
    pub why: String,
    /// A runtime's warm-up (JIT compilation, code caches): memory that grows while the runtime
    /// compiles the program's hot code, not a leak.
    pub warm_up: bool,
    /// Where that is documented.
    pub source: String,
}

/// The release call a stack likely misses: the innermost frame matching an `acquire` pattern,
/// searched from the allocator up to the first frame of the user's code at or above the culprit
/// (`culprit`: index into `frames`), so that an API calling back into user code that allocates
/// is not blamed. None when no frame matches.
pub fn release_hint(frames: &[Arc<Frame>], culprit: Option<usize>) -> Option<ReleaseHint> {
    let c = culprit.unwrap_or(0);
    let user = |i: usize| {
        let f = &frames[i];
        i >= c
            && (f.function.is_some() || f.object.is_some())
            && !is_system_frame(f)
            && !is_runtime_frame(f)
            && !f.function.as_deref().is_some_and(is_allocator_frame)
    };
    for (i, f) in frames.iter().enumerate() {
        if let Some(name) = f.function.as_deref().map(|n| n.strip_prefix("__GI_").unwrap_or(n)) {
            for p in &catalog().release_pairs {
                if p.acquire.iter().any(|a| matches(a, name)) {
                    return Some(ReleaseHint {
                        acquire: name.to_string(),
                        release: p.release.clone(),
                        library: p.library.clone(),
                        source: p.source.clone(),
                    });
                }
            }
        }
        if user(i) {
            break;
        }
    }
    None
}

/// The look-alike a stack belongs to: the first catalog entry one of whose patterns matches any
/// frame's function name.
pub fn lookalike(frames: &[Arc<Frame>]) -> Option<Lookalike> {
    catalog().lookalikes.iter().find_map(|l| {
        frames
            .iter()
            .filter_map(|f| f.function.as_deref())
            .map(|n| n.strip_prefix("__GI_").unwrap_or(n))
            .any(|n| l.frames.iter().any(|p| matches(p, n)))
            .then(|| Lookalike {
                name: l.name.clone(),
                why: l.why.clone(),
                warm_up: l.warm_up,
                source: l.source.clone(),
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arcs(frames: &[Frame]) -> Vec<Arc<Frame>> {
        frames.iter().cloned().map(Arc::new).collect()
    }
    use crate::analyze::fixtures::frame;

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
    const LIBZ: &str = "/lib/x86_64-linux-gnu/libz.so.1";
    const EXE: &str = "/opt/server/bin/server";

    #[test]
    fn catalog_parses_and_every_entry_has_a_source() {
        let c: Catalog = serde_json::from_str(CATALOG_JSON).expect("leak_patterns.json");
        assert!(c.release_pairs.len() >= 20 && c.lookalikes.len() >= 8);
        for p in &c.release_pairs {
            assert!(!p.acquire.is_empty() && !p.release.is_empty(), "{:?}", p.acquire);
            assert!(p.source.starts_with("https://"), "{:?}: {}", p.acquire, p.source);
        }
        for l in &c.lookalikes {
            assert!(l.source.starts_with("https://"), "{}: {}", l.name, l.source);
        }
    }

    /// Every pattern of the catalog is well-formed and can match: not empty, no surrounding
    /// space, no `**`, not `*` alone, and it matches the names it stands for (each `*` replaced
    /// by some text, and by none). A `*` in the middle once made a pattern an exact name no
    /// frame has (`_cgo_*_Cfunc__Cmalloc`, `tcmalloc::*ThreadCache*`).
    #[test]
    fn every_catalog_pattern_is_well_formed_and_can_match() {
        let c: Catalog = serde_json::from_str(CATALOG_JSON).expect("leak_patterns.json");
        let patterns =
            c.release_pairs.iter().flat_map(|p| &p.acquire).chain(c.lookalikes.iter().flat_map(|l| &l.frames));
        let mut n = 0;
        for p in patterns {
            n += 1;
            assert!(!p.is_empty() && p != "*" && !p.contains("**"), "pattern {p:?}");
            assert_eq!(p.trim(), p, "pattern {p:?} has surrounding space");
            for fill in ["", "X", "Some::Thing<int>"] {
                let name = p.replace('*', fill);
                assert!(matches(p, &name), "pattern {p:?} does not match {name:?}");
            }
        }
        assert!(n >= 100, "{n} patterns");
    }

    #[test]
    fn patterns_are_globs() {
        assert!(matches("inflateInit2_", "inflateInit2_"));
        assert!(!matches("inflate", "inflateInit2_"));
        assert!(matches("inflateInit*", "inflateInit2_") && matches("inflateInit*", "inflateInit"));
        assert!(matches("*_Cfunc_CString", "main._Cfunc_CString") && !matches("*_Cfunc_CString", "_Cfunc_CStringX"));
        // A `*` in the middle: cgo's C-side malloc wrapper, named with the package's hash.
        assert!(matches("_cgo_*_Cfunc__Cmalloc", "_cgo_3b1a9c2e7d55_Cfunc__Cmalloc"));
        assert!(!matches("_cgo_*_Cfunc__Cmalloc", "_cgo_3b1a9c2e7d55_Cfunc_CString"));
        assert!(!matches("_cgo_*_Cfunc__Cmalloc", "x_cgo_3b1a_Cfunc__Cmalloc"));
        assert!(matches(
            "tcmalloc::*ThreadCache*",
            "tcmalloc::tcmalloc_internal::ThreadCache::CreateCacheIfNecessary()"
        ));
        assert!(!matches("tcmalloc::*ThreadCache*", "tcmalloc::PageHeap::New(unsigned long)"));
        assert!(matches(
            "v8::internal::wasm::*CodeManager*",
            "v8::internal::wasm::WasmCodeManager::Commit(v8::base::AddressRegion)"
        ));
        // Parts do not overlap: `ab*b` needs two b's.
        assert!(!matches("ab*b", "ab") && matches("ab*b", "abb") && matches("*a*", "a"));
        // The cgo wrapper of a `C.CString` leak names C.free.
        let frames = vec![
            frame("malloc", LIBC, None),
            frame("_cgo_3b1a9c2e7d55_Cfunc__Cmalloc", "/srv/router", None),
            frame("main.lookupRoute", "/srv/router", Some(("main.go", 12))),
        ];
        assert_eq!(release_hint(&arcs(&frames), Some(2)).map(|h| h.release), Some("C.free".to_string()));
    }

    #[test]
    fn jit_compilation_is_warm_up_and_arenas_are_not() {
        const JVM: &str = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so";
        let mdo = [
            frame("os::malloc(unsigned long, MEMFLAGS, NativeCallStack const&)", JVM, None),
            frame("MethodData::allocate(ClassLoaderData*, methodHandle const&, JavaThread*)", JVM, None),
            frame("Method::build_interpreter_method_data(methodHandle const&, JavaThread*)", JVM, None),
            frame("CompilationPolicy::create_mdo(methodHandle const&, JavaThread*)", JVM, None),
        ];
        let l = lookalike(&arcs(&mdo)).expect("JIT compilation is a look-alike");
        assert!(l.warm_up && l.name.starts_with("JVM JIT compilation"), "{l:?}");
        // Class loading fills metaspace too, but a class-loader leak is a leak: not warm-up.
        let class = [frame("ClassFileParser::parse_method(ClassFileStream const*)", JVM, None)];
        assert!(lookalike(&arcs(&class)).is_none_or(|l| !l.warm_up));
        let arena = [frame("_int_new_arena", LIBC, None), frame("arena_get2", LIBC, None)];
        assert!(!lookalike(&arcs(&arena)).unwrap().warm_up);
    }

    #[test]
    fn names_the_missing_release() {
        // A zlib stream never ended: malloc ← zcalloc ← inflateInit2_ ← decode_message ← main.
        let frames = vec![
            frame("malloc", LIBC, None),
            frame("zcalloc", LIBZ, None),
            frame("inflateInit2_", LIBZ, None),
            frame("decode_message", EXE, Some(("msg.c", 10))),
            frame("main", EXE, Some(("main.c", 3))),
        ];
        let h = release_hint(&arcs(&frames), Some(3)).expect("hint");
        assert_eq!(
            (h.acquire.as_str(), h.release.as_str(), h.library.as_str()),
            ("inflateInit2_", "inflateEnd", "zlib")
        );
        // strdup (an allocator frame) → free.
        let frames =
            vec![frame("malloc", LIBC, None), frame("strdup", LIBC, None), frame("remember", EXE, Some(("r.c", 4)))];
        assert_eq!(release_hint(&arcs(&frames), Some(2)).map(|h| h.release), Some("free".to_string()));
        // A callback: user code called by an API allocates: the API is above the user frame,
        // not blamed.
        let frames = vec![
            frame("malloc", LIBC, None),
            frame("on_row", EXE, Some(("db.c", 9))),
            frame("sqlite3_prepare_v2", "/lib/x86_64-linux-gnu/libsqlite3.so.0", None),
            frame("main", EXE, Some(("main.c", 3))),
        ];
        assert_eq!(release_hint(&arcs(&frames), Some(1)), None);
        // No API: no hint.
        let frames = vec![frame("malloc", LIBC, None), frame("client_info", EXE, Some(("kvd.c", 5)))];
        assert_eq!(release_hint(&arcs(&frames), Some(1)), None);
    }

    #[test]
    fn names_lookalikes() {
        let arena =
            vec![frame("mmap", LIBC, None), frame("alloc_new_heap", LIBC, None), frame("_int_new_arena", LIBC, None)];
        assert_eq!(lookalike(&arcs(&arena)).map(|l| l.name), Some("glibc malloc arena or heap".to_string()));
        let pymalloc = vec![frame("mmap", LIBC, None), frame("_PyObject_ArenaMmap", "/usr/bin/python3.11", None)];
        assert_eq!(lookalike(&arcs(&pymalloc)).map(|l| l.name), Some("pymalloc arena".to_string()));
        let user = vec![frame("malloc", LIBC, None), frame("client_info", EXE, None)];
        assert_eq!(lookalike(&arcs(&user)), None);
    }
}
