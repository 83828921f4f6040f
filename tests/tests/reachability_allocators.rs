//! `record --reachability` under the allocators people preload, on tests/fixtures/allocators_lost.c built -O0 and
//! -O2 without frame pointers: with jemalloc, tcmalloc and mimalloc, 64 lost blocks of each of
//! three sizes are lost and the 64 blocks of the global array are held by `g_keep`, in every
//! run (jemalloc's extent descriptors point at the first block of each slab and at every large
//! block: taken for roots, they made up to all 64 of a size "held").
use std::path::PathBuf;
use std::process::Command;

use leaktrace_tests::*;

/// Runs of each allocator and build: the same figures every time.
const RUNS: usize = 10;

const ALLOCATORS: [(&str, &str); 3] =
    [("jemalloc", "libjemalloc.so.2"), ("tcmalloc", "libtcmalloc_minimal.so.4"), ("mimalloc", "libmimalloc.so.2")];

/// The allocator library `name` where Debian installs it (`cargo xtask setup` installs them).
fn library(name: &str) -> PathBuf {
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
        .iter()
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is not installed (`cargo xtask setup` installs it)"))
}

/// tests/fixtures/allocators_lost.c built at `opt`, without frame pointers.
fn fixture_bin(opt: &str) -> PathBuf {
    let dir = temp_root().join("fixtures-allocators-lost");
    std::fs::create_dir_all(&dir).expect("create fixtures dir");
    let bin = dir.join(format!("allocators_lost{opt}"));
    let o = Command::new("gcc")
        .args([opt, "-g", "-fomit-frame-pointer", "-Wall", "-o"])
        .arg(&bin)
        .arg(fixture_source("allocators_lost.c"))
        .output()
        .expect("gcc");
    assert!(o.status.success(), "gcc allocators_lost.c: {}", String::from_utf8_lossy(&o.stderr));
    bin
}

/// (lost blocks, held blocks, holder symbols) of every site named `function` in a report's
/// reachability, summed.
fn blocks_of(r: &Report, function: &str) -> (u64, u64, Vec<String>) {
    let sites = r.get(&["reachability", "sites"]).as_array().cloned().unwrap_or_default();
    let mut out = (0, 0, Vec::new());
    for s in sites.iter().filter(|s| s["function"] == function) {
        out.0 += u64_of(s, "unreachable_blocks");
        out.1 += u64_of(s, "reachable_blocks");
        // The roots of the path (the blocks on the way and the site's block are not holders).
        for h in s["retained_by"].as_array().into_iter().flatten().filter(|h| h["step"] == "root") {
            out.2.push(h["symbol"].as_str().or(h["kind"].as_str()).unwrap_or("?").to_string());
        }
    }
    out
}

#[test]
fn allocator_metadata_is_no_root_under_jemalloc_tcmalloc_and_mimalloc() {
    require_root();
    for opt in ["-O0", "-O2"] {
        let bin = fixture_bin(opt);
        for (name, lib) in ALLOCATORS {
            for run in 0..RUNS {
                let out = OutDir::new(&format!("reach-alloc-{name}{opt}-{run}"));
                let mut target = Command::new(&bin);
                target.env("LD_PRELOAD", library(lib));
                let o = record_launch(&out, &["--reachability", "--quiet"], target);
                o.assert_success();
                assert!(o.stdout.contains("done"), "the fixture did not finish\n{}", o.describe());
                let r = Report::load(&out.path);
                let ctx = format!("{name} {opt} run {run}: report {}\n{}", out.path.display(), o.stderr);
                let (lost, held, by) = blocks_of(&r, "leak_one");
                assert_eq!((lost, held), (3 * 64, 0), "leak_one's blocks (lost, held), held by {by:?}\n{ctx}");
                let (lost, held, by) = blocks_of(&r, "keep_one");
                assert_eq!((lost, held), (0, 64), "keep_one's blocks (lost, held)\n{ctx}");
                assert!(by.iter().all(|s| s == "g_keep"), "keep_one's holders {by:?}\n{ctx}");
            }
        }
    }
}
