//! The culprit frame of a stack: allocator and bridge frames skipped, the leak-pattern catalog.

use super::*;

/// `C.CString`'s malloc (cgo's C wrapper, walked across the system-stack switch): the Go
/// function that called it; a C function called through cgo that mallocs stays the culprit.
#[test]
fn culprit_of_cgo_malloc_is_the_go_caller() {
    let exe = "/srv/app";
    let st = |names: &[&str]| Stack {
        id: 1,
        kind: StackKind::Malloc,
        frames: std::iter::once(frame("malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6", None))
            .chain(names.iter().map(|n| frame(n, exe, None)))
            .map(std::sync::Arc::new)
            .collect(),
        lost: false,
        truncated: None,
        shared: false,
    };
    let bridge = [
        "runtime.asmcgocall",
        "runtime.cgocall",
        "main._cgo_cmalloc",
        "main._Cfunc_CString",
        "main.lookupRoute",
        "main.main",
    ];
    let cstring: Vec<&str> = std::iter::once("_cgo_740f8d7732f3_Cfunc__Cmalloc").chain(bridge).collect();
    assert_eq!(culprit(&st(&cstring)).1, "main.lookupRoute");
    // The walk stopped at the switch: the wrapper is all there is.
    assert_eq!(culprit(&st(&cstring[..2])).1, "_cgo_740f8d7732f3_Cfunc__Cmalloc");
    let c_code = ["make_buf", "_cgo_740f8d7732f3_Cfunc_make_buf", "runtime.asmcgocall", "main.fill"];
    assert_eq!(culprit(&st(&c_code)).1, "make_buf");
}

/// A malloc stack with no frames (id 9), for tests to fill in with `..malloc_stack()`.
fn malloc_stack() -> Stack {
    Stack { id: 9, kind: StackKind::Malloc, frames: vec![], lost: false, truncated: None, shared: false }
}

#[test]
fn culprit_skips_allocator_frames() {
    let (mut st, _) = leak_site();
    st.frames.remove(2); // drop the inlined frame
    assert_eq!(culprit(&st).1, "Session::remember(std::string const&)");
    // Only allocator frames: the innermost named one.
    st.frames.truncate(2);
    assert_eq!(culprit(&st), (Some(0), "malloc".to_string()));
    // No names: object basename + address.
    let st = Stack {
        id: 9,
        kind: StackKind::Malloc,
        frames: vec![Frame { addr: 0x4a2f, object: Some("/usr/bin/app".into()), ..Default::default() }.into()],
        lost: false,
        truncated: None,
        shared: false,
    };
    assert_eq!(culprit(&st).1, "app+0x4a2f");
    // A leak made inside libc (asprintf) and libstdc++ names the user's function that called
    // into them; a stack entirely in libc keeps libc's function.
    let lib = |func: &str, object: &str| frame(func, object, None);
    let st = Stack {
        id: 9,
        kind: StackKind::Malloc,
        frames: vec![
            lib("malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("__vasprintf_internal", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("___asprintf", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("std::__cxx11::basic_string<char>::_M_construct(unsigned long, char)", "/tmp/app").into(),
            lib("build_page", "/tmp/app").into(),
            lib("main", "/tmp/app").into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    assert_eq!(culprit(&st), (Some(4), "build_page".to_string()));
    let only_libc = Stack { frames: st.frames[..3].to_vec(), ..st.clone() };
    assert_eq!(culprit(&only_libc).1, "__vasprintf_internal");
}

/// CPython: the eval loop when nothing better is known; a C extension calling the C API
/// (a missing `Py_DECREF`); the Python line; never the extension for an arena pymalloc maps.
#[test]
fn culprit_of_python_stacks() {
    let st = malloc_stack();
    let lib = |func: &str, object: &str| frame(func, object, None);
    let python = Stack {
        frames: vec![
            lib("malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("strdup", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("_PyEval_EvalFrameDefault", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0").into(),
            lib("main", "/usr/bin/python3.11").into(),
        ],
        ..st.clone()
    };
    assert_eq!(culprit(&python).1, "_PyEval_EvalFrameDefault");
    // A missing Py_DECREF: an object a C extension made through the C API (pymalloc), with the
    // Python frames read: the extension's function, not the Python line that called it; an
    // object the interpreter made for a line of Python: that line.
    let py = |function: &str, line: u32| Frame {
        kind: crate::recording::FrameKind::Python,
        function: Some(function.to_string()),
        file: Some("/srv/app.py".to_string()),
        line: Some(line),
        ..Default::default()
    };
    for libpython in ["/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0", "/usr/bin/python3.11"] {
        let decref = Stack {
            frames: vec![
                lib("PyObject_Malloc", libpython).into(),
                lib("_PyBytes_FromSize", libpython).into(),
                lib("PyBytes_FromStringAndSize", libpython).into(),
                lib("tag_checksum", "/srv/tagsum_ext.cpython-311-x86_64-linux-gnu.so").into(),
                lib("cfunction_vectorcall_O", libpython).into(),
                py("ingest", 22).into(),
                py("<module>", 30).into(),
                lib("Py_BytesMain", libpython).into(),
            ],
            ..st.clone()
        };
        assert_eq!(culprit(&decref), (Some(3), "tag_checksum".to_string()), "{libpython}");
        let mut pure = decref.clone();
        pure.frames.remove(3);
        assert_eq!(culprit(&pure), (Some(4), "ingest (app.py:22)".to_string()), "{libpython}");
        // An arena pymalloc maps while serving the extension holds everyone's objects.
        let arena = Stack {
            kind: StackKind::Mmap,
            frames: vec![
                lib("__GI___mmap64", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
                lib("_PyObject_ArenaMmap", libpython).into(),
                lib("new_arena", libpython).into(),
                lib("_PyObject_Malloc", libpython).into(),
                lib("split_fields", "/srv/pymem_ext.cpython-311-x86_64-linux-gnu.so").into(),
                lib("cfunction_call", libpython).into(),
            ],
            ..st.clone()
        };
        assert_eq!(culprit(&arena).1, "_PyObject_ArenaMmap", "{libpython}");
    }
}

/// Standard-library and system-library frames give way to the program's function.
#[test]
fn culprit_of_library_code_is_its_caller() {
    let st = malloc_stack();
    let lib = |func: &str, object: &str| frame(func, object, None);
    // A Rust trait method of the standard library is std code; a program whose name merely
    // starts like a runtime's is not a runtime.
    let rust = Stack {
        frames: vec![
            lib("__GI___libc_realloc", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("<alloc::string::String as core::fmt::Write>::write_str", "/tmp/rleak").into(),
            lib("rleak::index_names", "/tmp/rleak").into(),
        ],
        ..st.clone()
    };
    assert_eq!(culprit(&rust).1, "rleak::index_names");
    let nodeworker = Stack {
        frames: vec![
            lib("malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("xmlDictCreate", "/usr/lib/x86_64-linux-gnu/libxml2.so.2").into(),
            lib("cache_config_docs", "/tmp/nodeworker").into(),
        ],
        ..st.clone()
    };
    assert_eq!(culprit(&nodeworker).1, "cache_config_docs");
}

/// Node: the user's JavaScript function named from the perf map; not beyond V8's collector.
#[test]
fn culprit_of_node_stacks() {
    let st = malloc_stack();
    let lib = |func: &str, object: &str| frame(func, object, None);
    // Node with a perf map: the Buffer's backing store is allocated by node's allocator for the
    // user's JavaScript function, which is the culprit (Node's own library frames are skipped).
    let jit = |name: &str| Frame { addr: 0x3e00, function: Some(name.to_string()), ..Default::default() };
    let node = Stack {
        frames: vec![
            lib("__libc_calloc", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("node::NodeArrayBufferAllocator::Allocate(unsigned long)", "/usr/bin/node").into(),
            jit("JS:*FastBuffer node:internal/buffer:960:14").into(),
            jit("JS:^step /srv/app.js:10:14").into(),
            lib("node::Start(int, char**)", "/usr/bin/node").into(),
        ],
        ..st.clone()
    };
    assert_eq!(culprit(&node), (Some(3), "JS:^step /srv/app.js:10:14".to_string()));
    // A V8 heap page mapped while JavaScript allocates (a large object: a string above V8's
    // regular-object limit) is the JavaScript function's; a page V8's collector maps (the
    // semi-space it grows, old-space pages for what it promotes) holds what survived, not what
    // the function that triggered the collection allocated.
    let v8_page = |between: &[&str]| {
        let mut frames = vec![
            lib("__GI___mmap64", "/usr/lib/x86_64-linux-gnu/libc.so.6").into(),
            lib("v8::base::OS::Allocate(void*, unsigned long, unsigned long, v8::base::OS::MemoryPermission)", "/usr/bin/node")
                .into(),
            lib("v8::internal::MemoryAllocator::AllocateLargePage(v8::internal::LargeObjectSpace*, unsigned long, v8::internal::Executability)", "/usr/bin/node").into(),
        ];
        frames.extend(between.iter().map(|n| std::sync::Arc::new(lib(n, "/usr/bin/node"))));
        frames.push(jit("JS:^toString node:buffer:834:46").into());
        frames.push(jit("JS:^recordAudit /srv/audit.js:15:21").into());
        frames.push(lib("node::Start(int, char**)", "/usr/bin/node").into());
        Stack { kind: StackKind::Mmap, frames, ..st.clone() }
    };
    let large = v8_page(&["v8::internal::NewLargeObjectSpace::AllocateRaw(int)"]);
    assert_eq!(culprit(&large).1, "JS:^recordAudit /srv/audit.js:15:21");
    let grown = v8_page(&[
        "v8::internal::SemiSpace::GrowTo(unsigned long)",
        "v8::internal::Heap::PerformGarbageCollection(v8::internal::GarbageCollector, v8::internal::GarbageCollectionReason, char const*)",
        "v8::internal::Heap::CollectGarbage(v8::internal::AllocationSpace, v8::internal::GarbageCollectionReason, v8::GCCallbackFlags)",
        "v8::internal::Factory::AllocateRaw(int, v8::internal::AllocationType, v8::internal::AllocationAlignment)",
    ]);
    assert_eq!(
        culprit(&grown).1,
        "v8::base::OS::Allocate(void*, unsigned long, unsigned long, v8::base::OS::MemoryPermission)"
    );
}

/// A lost stack, and libc's mapping wrappers (skipped in a mapping site, not in a malloc site).
#[test]
fn culprit_of_lost_stacks_and_mapping_wrappers() {
    let st = Stack { id: 9, kind: StackKind::Malloc, frames: vec![], lost: true, truncated: None, shared: false };
    assert_eq!(culprit(&st), (None, "[stack lost]".to_string()));
    // A mapping: libc's mmap wrapper or syscall(2) (a raw syscall(SYS_mmap, ...)) is not the
    // culprit, its caller is.
    for wrapper in ["__GI___mmap64", "mmap64", "syscall"] {
        let frames =
            vec![frame(wrapper, "/lib/x86_64-linux-gnu/libc.so.6", None), frame("map_buffers", "/usr/bin/app", None)];
        let st = Stack {
            id: 9,
            kind: StackKind::Mmap,
            frames: frames.iter().cloned().map(std::sync::Arc::new).collect(),
            lost: false,
            truncated: None,
            shared: false,
        };
        assert_eq!(culprit(&st), (Some(1), "map_buffers".to_string()), "{wrapper}");
        // In a malloc site they are functions like others: libc's give way to the user's code
        // that called them.
        let st = Stack {
            id: 9,
            kind: StackKind::Malloc,
            frames: frames.into_iter().map(std::sync::Arc::new).collect(),
            lost: false,
            truncated: None,
            shared: false,
        };
        assert_eq!(culprit(&st), (Some(1), "map_buffers".to_string()), "{wrapper}");
    }
}

/// A Python program leaking through ctypes: libc's strdup called through libffi (ctypes.CDLL),
/// 1,000 B a second, with its Python frame: the verdict says "libc.so.6 via ctypes", never
/// "C extension", in the sentence, report.md's "memory kind" line and report.json's
/// `memory_origin`. The decoy: the same recording with the leak in a real extension module
/// (`.cpython-311-x86_64-linux-gnu.so` under lib-dynload) is called a C extension.
#[test]
fn ctypes_call_into_libc_is_not_a_c_extension() {
    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    const FFI: &str = "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2";
    const CTYPES: &str = "/opt/py/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so";
    const LIBPY: &str = "/opt/py/lib/libpython3.11.so.1.0";
    let stack = |inner: Vec<Frame>| {
        let mut frames: Vec<std::sync::Arc<Frame>> = inner.into_iter().map(Into::into).collect();
        let mut py = frame("leak_record", "", Some(("/srv/app.py", 38)));
        py.kind = crate::recording::FrameKind::Python;
        py.object = None;
        frames.push(py.into());
        frames.push(frame("_PyEval_EvalFrameDefault", LIBPY, None).into());
        Stack { id: 1, kind: StackKind::Malloc, frames, lost: false, truncated: None, shared: false }
    };
    let ctypes = stack(vec![
        frame("__GI___strdup", LIBC, None),
        frame("ffi_call_unix64", FFI, None),
        frame("ffi_call", FFI, None),
        frame("_ctypes_callproc", CTYPES, None),
        frame("_PyObject_MakeTpCall", LIBPY, None),
    ]);
    let ext = stack(vec![
        frame("__GI___strdup", LIBC, None),
        frame("parse_record", "/opt/py/lib/python3.11/lib-dynload/tsparse.cpython-311-x86_64-linux-gnu.so", None),
    ]);
    // The extension's own frame is its leak's culprit; libc's strdup called through ctypes is the
    // Python line's.
    for (st, culprit, origin) in
        [(ctypes, "leak_record (app.py:38)", "libc.so.6 via ctypes"), (ext, "parse_record", "C extension")]
    {
        let leak: SiteFn = Box::new(|t: f64| (1000 * (t as u64 + 1), t as u64 + 1, 0, 0));
        let mut r = recording(&times61(), vec![(st, leak)], &|t| mem((10 << 20) + (1000.0 * t) as u64), &no_counters);
        r.target.runtime = Some(Runtime::Python);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(site(&a, 1).memory_kind, MemoryKind::Native);
        assert_eq!(site(&a, 1).origin.as_deref(), Some(origin));
        let text = sentence(&a);
        assert!(text.starts_with(&format!("native leak in {culprit} ({origin}), Python heap flat")), "{text}");
        let md = crate::report::markdown::report_md(&r, &a);
        assert!(md.contains(&format!("- memory kind: native ({origin})")), "{md}");
        if origin != "C extension" {
            assert!(!md.contains("C extension"), "{md}");
        }
        let json = crate::report::json::report_json(&r, &a);
        assert_eq!(json["sites"][0]["memory_origin"], origin);
    }
}

/// The leak-pattern catalog in the verdict: a zlib stream never ended leaks through
/// inflateInit2_ (malloc ← zcalloc ← inflateInit2_ ← decode_message ← main): the culprit is the
/// user's decode_message and the verdict names inflateEnd as the likely missing release. The
/// operator-new leak of the mixed fixture passes through no catalog API: no hint.
#[test]
fn leak_through_a_catalog_api_names_the_missing_release() {
    let libz = "/lib/x86_64-linux-gnu/libz.so.1";
    let st = Stack {
        id: 7,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("zcalloc", libz, None).into(),
            frame("inflateInit2_", libz, None).into(),
            frame("decode_message", "/opt/server/bin/server", Some(("/build/src/msg.c", 30))).into(),
            frame("main", "/opt/server/bin/server", Some(("/build/src/main.c", 3))).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    let f: SiteFn = Box::new(|t: f64| {
        let n = t as u64;
        (7160 * n, n, 0, 0)
    });
    // The decoy: the same API from read_header, its stream ended: every block but the one in
    // flight is freed. It releases what it gets: no hint.
    let decoy = Stack {
        id: 9,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("zcalloc", libz, None).into(),
            frame("inflateInit2_", libz, None).into(),
            frame("read_header", "/opt/server/bin/server", Some(("/build/src/msg.c", 50))).into(),
            frame("main", "/opt/server/bin/server", Some(("/build/src/main.c", 3))).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    let decoy_fn: SiteFn = Box::new(|t: f64| {
        let n = t as u64;
        (7160 * (n + 1), n + 1, 7160 * n, n)
    });
    let (leak, leak_fn) = leak_site();
    let r = recording(&times61(), vec![(st, f), (decoy, decoy_fn), (leak, leak_fn)], &|_| mem(30 << 20), &no_counters);
    let a = analyze(&r, &AnalyzeOptions::default());
    let d = site(&a, 9);
    assert_ne!(d.class, SiteClass::Leak);
    assert!(d.live_allocations > 0 && d.likely_missing_release.is_none(), "{:?}", d.likely_missing_release);
    let z = site(&a, 7);
    assert_eq!(z.class, SiteClass::Leak);
    assert_eq!(z.function, "decode_message");
    let h = z.likely_missing_release.as_ref().expect("hint");
    assert_eq!((h.acquire.as_str(), h.release.as_str()), ("inflateInit2_", "inflateEnd"));
    assert!(site(&a, 1).likely_missing_release.is_none());
    let text = sentence(&a);
    assert!(text.contains("decode_message") && text.contains("likely missing inflateEnd"), "{text}");
    let md = crate::report::markdown::report_md(&r, &a);
    assert!(md.contains("whose result must be released with inflateEnd"), "{md}");
}

/// A small constructor called from three places: make_record's 200 B records are freed by
/// parse_request and cache_lookup (1,000 a second each) and kept by remember_peer (100 a
/// second). The leak is named after remember_peer, the caller holding all the growth, with
/// make_record said in its reason; a constructor called from one place keeps its own name, and
/// so does one whose growth is split between two callers (60/40: below 80 %).
#[test]
fn constructor_called_from_several_places_is_named_by_its_leaking_caller() {
    let exe = "/srv/app";
    let st = |id: u32, caller: &str| Stack {
        id,
        kind: StackKind::Malloc,
        frames: [("malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6"), ("make_record", exe), (caller, exe), ("main", exe)]
            .iter()
            .map(|(f, o)| std::sync::Arc::new(frame(f, o, None)))
            .collect(),
        lost: false,
        truncated: None,
        shared: false,
    };
    let churn =
        || -> SiteFn { Box::new(|t: f64| (200_000 * t as u64, 1000 * t as u64, 200_000 * t as u64, 1000 * t as u64)) };
    let keep = |per_s: u64| -> SiteFn { Box::new(move |t: f64| (200 * per_s * t as u64, per_s * t as u64, 0, 0)) };
    let run = |sites: Vec<(Stack, SiteFn)>| {
        analyze(&recording(&times61(), sites, &|_| mem(20 << 20), &no_counters), &AnalyzeOptions::default())
    };

    let a = run(vec![
        (st(1, "parse_request"), churn()),
        (st(2, "cache_lookup"), churn()),
        (st(3, "remember_peer"), keep(100)),
    ]);
    let leak = site(&a, 3);
    assert_eq!(leak.class, SiteClass::Leak);
    assert_eq!(leak.function, "remember_peer");
    assert_eq!(leak.culprit_frame, Some(2));
    assert!(leak.evidence.reason.contains("allocated through make_record"), "{}", leak.evidence.reason);
    assert!(sentence(&a).contains("remember_peer"), "{}", sentence(&a));
    assert_eq!(site(&a, 1).function, "make_record", "a site that is no leak keeps its name");

    let a = run(vec![(st(3, "remember_peer"), keep(100))]);
    assert_eq!(site(&a, 3).function, "make_record", "called from one place: the constructor is the leak");

    let a = run(vec![(st(3, "remember_peer"), keep(60)), (st(4, "remember_route"), keep(40))]);
    assert_eq!(site(&a, 3).function, "make_record", "60 % of the growth is not concentrated");

    // A frame that loses its own blocks whoever calls it (the other caller made 7 blocks before
    // the recording and freed none): the frame is the leak, not its busiest caller.
    let once = || -> SiteFn { Box::new(|_t: f64| (3507, 7, 0, 0)) };
    let a = run(vec![(st(1, "warm_up"), once()), (st(3, "remember_peer"), keep(100))]);
    assert_eq!(site(&a, 3).class, SiteClass::Leak);
    assert_eq!(site(&a, 3).function, "make_record", "the other caller frees nothing it makes");
}
