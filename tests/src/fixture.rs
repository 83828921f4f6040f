//! The fixtures (tests/fixtures/): the shared ones built once per run ([`built_once`]), the
//! others once per test process into its temporary directory.

use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::*;

/// The variable `cargo xtask test` sets to the directory every test process of a run shares for
/// its fixtures ([`built_once`]).
pub const FIXTURES_ENV: &str = "LEAKTRACE_TEST_FIXTURES";

/// Where [`built_once`] builds: `$LEAKTRACE_TEST_FIXTURES` (one directory per `cargo xtask test`
/// run, shared by its test processes), else this process's [`temp_root`].
pub fn fixtures_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| match std::env::var_os(FIXTURES_ENV) {
        Some(d) => {
            let d = PathBuf::from(d);
            std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("cannot create {FIXTURES_ENV}={}: {e}", d.display()));
            d
        }
        None => temp_root().to_path_buf(),
    })
}

/// `fixtures_root()/NAME`, built by `build` once for every process that shares the root: the
/// first to ask builds it under an exclusive lock of `NAME.lock` (flock) and marks it done with
/// `NAME.built`; the others wait on the lock and take what it built. A build that panics
/// leaves no mark (the lock goes with its file): the next to ask starts again from an empty
/// directory and shows the same failure.
pub fn built_once(name: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let root = fixtures_root();
    let dir = root.join(name);
    let done = root.join(format!("{name}.built"));
    if done.exists() {
        return dir;
    }
    let lock_path = root.join(format!("{name}.lock"));
    let lock =
        std::fs::File::create(&lock_path).unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    // SAFETY: flock on a descriptor this function owns (`lock`, open until it returns).
    let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock {}: {}", lock_path.display(), std::io::Error::last_os_error());
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        build(&dir);
        std::fs::write(&done, b"").unwrap_or_else(|e| panic!("cannot write {}: {e}", done.display()));
    }
    drop(lock);
    dir
}

/// Compiled fixtures.
pub struct Fixtures {
    /// This process's own fixtures directory (`temp_root()/fixtures`), where a test file builds
    /// its further variants.
    pub dir: PathBuf,
    /// `leaky MODE ITERATIONS RATE_PER_S` (tests/fixtures/leaky.c).
    pub leaky: PathBuf,
    /// `leaky_new ITERATIONS RATE_PER_S` (tests/fixtures/leaky_new.cpp).
    pub leaky_new: PathBuf,
    /// `python3 grow_list.py [COUNT] [RATE]` (tests/fixtures/grow_list.py).
    pub grow_list_py: PathBuf,
}

/// `temp_root()/NAME`, created: where a test file builds its own fixtures (Java classes, Go
/// programs, shared objects).
pub fn fixture_build_dir(name: &str) -> PathBuf {
    let d = temp_root().join(name);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
    d
}

/// Run a fixture's build step (`javac`, `go build`, `gcc` ...), panicking with its output when
/// it cannot be run or fails.
pub fn run_build_step(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {what} (`cargo xtask setup` installs it): {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Build tests/fixtures/runtimes/jnileak.c (JniLeak's native methods) into `dir/libjnileak.so`
/// against the JDK whose `javac` is on PATH (its `include/` directory, found from javac's real
/// path), -O1 with frame pointers; returns the library's path. Panics with the build's output.
pub fn build_jni_leak_library(dir: &Path) -> PathBuf {
    let javac = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("javac")).find(|j| j.exists()))
        .expect("javac on PATH (`cargo xtask setup` installs it)");
    let home = std::fs::canonicalize(&javac).expect("javac's real path");
    let include = home.parent().and_then(Path::parent).expect("JDK home").join("include");
    let out = dir.join("libjnileak.so");
    run_build_step(
        Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-I"])
            .arg(&include)
            .arg("-I")
            .arg(include.join("linux"))
            .arg("-o")
            .arg(&out)
            .arg(fixture_source("runtimes").join("jnileak.c")),
        "gcc (jnileak.c)",
    );
    out
}

pub fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

pub(crate) fn compile(compiler: &str, source: &Path, output: &Path) {
    let mut cmd = Command::new(compiler);
    cmd.args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o"]).arg(output).arg(source);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler} (is it installed? `cargo xtask setup` installs it): {e}"));
    assert!(
        out.status.success(),
        "compiling {} failed ({:?}):\n{}",
        source.display(),
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fixtures, compiled on first use (gcc/g++ -O1 -g -fno-omit-frame-pointer), once per run
/// ([`built_once`]).
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let dir = temp_root().join("fixtures");
        std::fs::create_dir_all(&dir).expect("create fixtures dir");
        let shared = built_once("fixtures", |d| {
            compile("gcc", &fixture_source("leaky.c"), &d.join("leaky"));
            compile("g++", &fixture_source("leaky_new.cpp"), &d.join("leaky_new"));
            std::fs::copy(fixture_source("grow_list.py"), d.join("grow_list.py")).expect("copy grow_list.py");
        });
        Fixtures {
            dir,
            leaky: shared.join("leaky"),
            leaky_new: shared.join("leaky_new"),
            grow_list_py: shared.join("grow_list.py"),
        }
    })
}

/// The real python3 executable (not a pyenv shim), which must load a shared libpython.
pub fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys, sysconfig; print(sys.executable); print(sysconfig.get_config_var('Py_ENABLE_SHARED'))",
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run python3: {e}"));
        assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let exe = PathBuf::from(lines.next().unwrap_or_default());
        assert_eq!(
            lines.next().map(str::trim),
            Some("1"),
            "python3 ({}) is not built with a shared libpython: this test needs one (e.g. pyenv's \
             CPython built with --enable-shared)",
            exe.display()
        );
        exe
    })
}

/// The culprit function of `leaky MODE`.
pub fn leak_function(mode: &str) -> String {
    match mode {
        "realloc" => "leak_realloc_growth".to_string(),
        m => format!("leak_{m}"),
    }
}

/// tests/fixtures/growth.c built as distributions build (-O2, no frame pointers), once per run
/// ([`built_once`]), for the `watch` tests: `growth MODE ITERATIONS RATE_PER_S [ARG]`.
pub fn growth_o2() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("fixtures-growth-o2", |d| {
            run_build_step(
                Command::new("gcc")
                    .args(["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-o"])
                    .arg(d.join("growth"))
                    .arg(fixture_source("growth.c")),
                "gcc (growth.c)",
            );
        })
        .join("growth")
    })
}

/// Build the C extension `tests/fixtures/pyheap/refleak_ext.c` (a missing `Py_DECREF`) for the
/// Python `interp` into `fixtures-refleak-TAG`, once per run ([`built_once`]; TAG names the
/// interpreter); that directory (for `sys.path`).
pub fn build_refleak_extension(interp: &Path, tag: &str) -> PathBuf {
    build_python_extension(interp, &format!("fixtures-refleak-{tag}"), "refleak_ext", "refleak_ext.c")
}

/// Build the C extension `tests/fixtures/pyheap/SOURCE` as module `MODULE` for the Python
/// `interp` (-O2, its own headers and suffix) into the fixture directory `name`, once per run
/// ([`built_once`]); that directory (for `sys.path`).
pub fn build_python_extension(interp: &Path, name: &str, module: &str, source: &str) -> PathBuf {
    built_once(name, |dir| {
        let cfg = |var: &str| {
            let o = Command::new(interp)
                .args(["-c", &format!("import sysconfig; print(sysconfig.get_config_var('{var}'))")])
                .output()
                .expect("python3");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        let o = Command::new("gcc")
            .args(["-O2", "-g", "-shared", "-fPIC", "-I", &cfg("INCLUDEPY"), "-o"])
            .arg(dir.join(format!("{module}{}", cfg("EXT_SUFFIX"))))
            .arg(fixture_source("pyheap").join(source))
            .output()
            .expect("gcc");
        assert!(o.status.success(), "gcc {source} for {}: {}", interp.display(), String::from_utf8_lossy(&o.stderr));
    })
}
