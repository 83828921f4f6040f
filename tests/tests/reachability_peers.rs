//! The scan at exit against valgrind memcheck's and LeakSanitizer's own leak tests, on
//! tests/fixtures/peers.c built -O2 (launched: `record --reachability [--follow-forks] -- peers
//! MODE`). The expected figures are the ones valgrind 3.19 (`--leak-check=full
//! --trace-children=yes`) and LSan (`gcc -fsanitize=leak`) report on the same fixture
//! (docs/reachability.md, "Compared with valgrind memcheck and LeakSanitizer": where they
//! differ, valgrind's); exact-mode bytes, exact:
//! - a child after `fork` (LSan `fork_and_leak`): its leak is lost in the child's report, with
//!   its allocating function, and in no report of the parent's;
//! - a child forked by a thread of a threaded parent (LSan `fork_threaded`, `use_stacks_threaded`):
//!   only the forking thread exists in the child, so the copies of the other threads' stacks
//!   are no roots: the child's block at an address those copies still hold is lost;
//! - threads that have exited (LSan `create_thread_leak`): a block only in the thread's own
//!   frame is lost, one in a global held; the argument a thread dropped, the result its
//!   joiner dropped and a detached thread's result are lost, though glibc's cached descriptor
//!   of the thread still holds them; a result no join has collected yet is held (valgrind;
//!   LSan calls it lost);
//! - a block whose only pointer was in the frames a `siglongjmp` out of a signal handler
//!   abandoned is lost (valgrind `leak-segv-jmp`: a leak check across a handler's longjmp).
use std::path::PathBuf;
use std::process::Command;

use leaktrace_tests::*;

/// Runs of each fixture per test: the same figures every time.
const RUNS: usize = 3;

/// tests/fixtures/peers.c built -O2 without frame pointers, once per run.
fn peers_bin() -> PathBuf {
    built_once("reachability_peers", |dir| {
        let flags = ["-O2", "-fomit-frame-pointer", "-pthread"];
        compile_with("gcc", &[&fixture_source("peers.c")], &dir.join("peers"), &flags);
    })
    .join("peers")
}

/// (reachable bytes, reachable blocks, unreachable bytes, unreachable blocks) of `function`'s
/// site in the scan `r` (exactly one site).
fn figures(r: &Value, function: &str, ctx: &str) -> (u64, u64, u64, u64) {
    let sites = r["sites"].as_array().unwrap_or_else(|| panic!("no reachability sites\n{ctx}"));
    let found: Vec<&Value> = sites.iter().filter(|s| s["function"].as_str() == Some(function)).collect();
    assert_eq!(found.len(), 1, "sites of {function}\n{ctx}");
    let s = found[0];
    (
        u64_of(s, "reachable_bytes"),
        u64_of(s, "reachable_blocks"),
        u64_of(s, "unreachable_bytes"),
        u64_of(s, "unreachable_blocks"),
    )
}

fn has_site(r: &Value, function: &str) -> bool {
    r["sites"].as_array().is_some_and(|s| s.iter().any(|s| s["function"] == function))
}

/// The global that holds `function`'s block (the root of its chain).
fn held_by(r: &Value, function: &str) -> String {
    let s = r["sites"].as_array().and_then(|s| s.iter().find(|s| s["function"] == function));
    s.map(|s| s["retained_by"][0]["symbol"].as_str().unwrap_or("?").to_string()).unwrap_or_default()
}

/// `record --reachability [extra] -- peers MODE`: every report's (directory, reachability
/// scan) and a context for messages. A recording with --follow-forks has one `pid-N`
/// directory per process.
fn run(mode: &str, extra: &[&str], name: &str) -> (Vec<(PathBuf, Value)>, String) {
    let out = OutDir::new(name);
    let mut c = Command::new(peers_bin());
    c.arg(mode);
    let mut args = vec!["--reachability"];
    args.extend_from_slice(extra);
    let o = record_launch(&out, &args, c);
    o.assert_success();
    let dirs: Vec<PathBuf> = if extra.contains(&"--follow-forks") {
        std::fs::read_dir(&out.path)
            .expect("the output directory")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("pid-"))
            .map(|e| e.path())
            .collect()
    } else {
        vec![out.path.clone()]
    };
    let scans: Vec<(PathBuf, Value)> =
        dirs.into_iter().map(|d| (d.clone(), Report::load(&d).get(&["reachability"]).clone())).collect();
    let dump: Vec<String> =
        scans.iter().map(|(d, r)| format!("{}: {}", d.display(), serde_json::to_string_pretty(r).unwrap())).collect();
    let ctx = format!("{name}\n{}\n{}", o.describe(), dump.join("\n"));
    for (d, r) in &scans {
        assert!(r.is_object(), "{}: no scan\n{ctx}", d.display());
        assert_eq!(r["complete"], true, "{}\n{ctx}", d.display());
        let notes = r["notes"].as_array().expect("notes");
        assert!(
            notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("at the program's exit"))),
            "{}: not scanned at exit\n{ctx}",
            d.display()
        );
    }
    (scans, ctx)
}

/// The parent's and the child's scans, told apart by a site only the child has.
fn parent_and_child<'a>(scans: &'a [(PathBuf, Value)], child_site: &str, ctx: &str) -> (&'a Value, &'a Value) {
    assert_eq!(scans.len(), 2, "the parent's and the child's reports\n{ctx}");
    let child: Vec<&Value> = scans.iter().map(|(_, r)| r).filter(|r| has_site(r, child_site)).collect();
    assert_eq!(child.len(), 1, "one scan has {child_site}: the child's\n{ctx}");
    let parent = scans.iter().map(|(_, r)| r).find(|r| !has_site(r, child_site)).expect("the parent's scan");
    (parent, child[0])
}

/// A leak in a child after `fork`: 10 × 1,337 bytes lost in the child's scan, not in the
/// parent's; the child's global and the parent's global hold their blocks.
#[test]
fn leak_in_a_forked_child_is_the_childs() {
    require_root();
    for run_no in 0..RUNS {
        let (scans, ctx) = run("fork", &["--follow-forks"], &format!("peers-fork-{run_no}"));
        let (parent, child) = parent_and_child(&scans, "child_keep", &ctx);
        assert_eq!(figures(child, "child_leak", &ctx), (0, 0, 13_370, 10), "{ctx}");
        assert_eq!(figures(child, "child_keep", &ctx), (48, 1, 0, 0), "{ctx}");
        assert_eq!(held_by(child, "child_keep"), "g_child", "{ctx}");
        assert!(!has_site(parent, "child_leak"), "the child's leak in the parent's scan\n{ctx}");
        assert_eq!(figures(parent, "parent_keep", &ctx), (64, 1, 0, 0), "{ctx}");
        assert_eq!(held_by(parent, "parent_keep"), "g_parent", "{ctx}");
        // Inherited blocks are the parent's: not reported in the child (valgrind reports them
        // there too, as the child's).
        assert!(!has_site(child, "parent_keep"), "{ctx}");
    }
}

/// A child forked by a thread of a threaded parent: its block at the address the copies of
/// the main thread's and the waiting thread's stacks still hold is lost (neither thread exists
/// in the child), and the parent has no such site.
#[test]
fn forked_child_of_a_threaded_parent_has_only_the_forking_thread() {
    require_root();
    for run_no in 0..RUNS {
        let (scans, ctx) = run("fork-threaded", &["--follow-forks"], &format!("peers-fork-threaded-{run_no}"));
        let (parent, child) = parent_and_child(&scans, "child_leak_threaded", &ctx);
        assert_eq!(figures(child, "child_leak_threaded", &ctx), (0, 0, 1000, 1), "{ctx}");
        assert!(!has_site(parent, "child_leak_threaded"), "{ctx}");
        // The parent freed the stale block before the fork.
        assert!(!has_site(parent, "stale_block"), "{ctx}");
    }
}

/// Threads that have exited: a block only in the thread's frame is lost, one in a global
/// held, the argument it dropped, the result its joiner dropped and a detached thread's result
/// are lost; the result of a thread not joined yet is held by its descriptor.
#[test]
fn blocks_of_exited_threads() {
    require_root();
    for run_no in 0..RUNS {
        let (scans, ctx) = run("thread-exit", &[], &format!("peers-thread-exit-{run_no}"));
        let r = &scans[0].1;
        assert_eq!(figures(r, "thread_stack_leak", &ctx), (0, 0, 96, 1), "{ctx}");
        assert_eq!(figures(r, "thread_keep", &ctx), (80, 1, 0, 0), "{ctx}");
        assert_eq!(held_by(r, "thread_keep"), "g_thread", "{ctx}");
        assert_eq!(figures(r, "thread_result", &ctx), (0, 0, 234, 1), "{ctx}");
        assert_eq!(figures(r, "thread_arg", &ctx), (0, 0, 123, 1), "{ctx}");
        // A detached thread's result: nobody can collect it.
        assert_eq!(figures(r, "thread_detached_result", &ctx), (0, 0, 345, 1), "{ctx}");
        // An exited joinable thread not joined yet: pthread_join would still return its result
        // (valgrind: still reachable too).
        assert_eq!(figures(r, "thread_unjoined_result", &ctx), (456, 1, 0, 0), "{ctx}");
        let s = r["sites"].as_array().unwrap().iter().find(|s| s["function"] == "thread_unjoined_result").unwrap();
        assert_eq!(s["retained_by"][0]["region"], "thread descriptor (glibc stack cache)", "{ctx}");
    }
}

/// A `siglongjmp` out of a SIGUSR1 handler on an alternate stack: the block of the abandoned
/// call is lost, the block allocated after the jump is held by its global.
#[test]
fn block_abandoned_by_a_longjmp_out_of_a_signal_handler_is_lost() {
    require_root();
    for run_no in 0..RUNS {
        let (scans, ctx) = run("longjmp", &[], &format!("peers-longjmp-{run_no}"));
        let r = &scans[0].1;
        assert_eq!(figures(r, "jump_leak", &ctx), (0, 0, 200, 1), "{ctx}");
        assert_eq!(figures(r, "after_jump", &ctx), (56, 1, 0, 0), "{ctx}");
        assert_eq!(held_by(r, "after_jump"), "g_after", "{ctx}");
    }
}
