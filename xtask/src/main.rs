//! Developer tasks for leaktrace: `cargo xtask <setup|build|test|lint|demo|bench|fuzz>`.
//!
//! `bench` (bench/) measures what tracing costs and writes docs/benchmarks.md; it installs its
//! own tools (bpftrace, heaptrack, redis) and is not part of CI.
//!
//! Every command this runs is printed first (`xtask: $ ...`, on stderr).
//!
//! `setup` installs, when missing, what building the eBPF object needs on a fresh Debian machine:
//! the nightly toolchain's rust-src (rustup), LLVM 22 (apt: llvm-22-dev, libpolly-22-dev) and
//! bpf-linker (cargo install); and what the end-to-end tests need: gcc and g++ to build the
//! fixtures, jemalloc and tcmalloc (libjemalloc-dev, libgoogle-perftools-dev) and the static C
//! library to link some of them with, bpftool, unshare and setpriv, containerd and runc (and the
//! CRI stubs for Python from PyPI) for the container tests. It skips whatever is
//! already present, so running it again is cheap.
#![allow(clippy::print_stderr, reason = "the developer tasks tell what they run on stderr")]

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod bench_unwind;
mod circles;
mod fuzz;
mod issue_refs;
mod runtime_names;
mod suite;
mod target_reads;

const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PACKAGES: &[&str] = &["llvm-22-dev", "libpolly-22-dev"];
const DEFAULT_LLVM_PREFIX: &str = "/usr/lib/llvm-22";

#[derive(Parser)]
#[command(name = "xtask", bin_name = "cargo xtask", about = "leaktrace developer tasks", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building and testing needs (nightly rust-src, LLVM 22, bpf-linker, gcc/g++),
    /// skipping what is present.
    Setup,
    /// setup, then the release build of leaktrace's binary (with the workspace's features, as
    /// `test` builds it).
    Build,
    /// setup, one release build of leaktrace and every test binary, then the unit tests and the
    /// end-to-end tests (real eBPF: needs root) from one pool of N jobs (xtask/src/suite.rs; docs/benchmarks.md). Arguments: FILTER...
    /// (a test runs when its `FILE::TEST` name contains one), --exact, --skip PATTERN, --jobs N
    /// (else LEAKTRACE_TEST_JOBS, else 6), --list (print the plan, run nothing).
    Test {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// setup, then the gates CI runs before the tests: `cargo fmt --check` and `cargo clippy
    /// --release --all-targets -- -D warnings` on the userspace crates (not leaktrace-ebpf, built
    /// only for bpf).
    Lint,
    /// setup, release build, then run `leaktrace demo` with the extra arguments (needs root).
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// setup, release build, then measure what tracing costs (microbenchmark against empty probes,
    /// a naive bpftrace script and heaptrack; redis and Python workloads; the agent at 1 M live
    /// allocations) and write docs/benchmarks.md (needs root; installs bpftrace, heaptrack, redis).
    Bench(bench::BenchArgs),
    /// Fuzz the parsers of what a target sends (fuzz/: HPROF, V8 heap snapshots, the Node
    /// inspector's replies, Go executables and heap-profile buckets, the Python heap walk, the
    /// recording file) for --seconds each (default 60) with cargo-fuzz on the nightly toolchain
    /// (installed when missing); fails when one finds a crash.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    prepend_cargo_bin_to_path();
    let result = match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Build => setup().and_then(|()| build()),
        Cmd::Test { args } => match test(&args) {
            Ok(true) => return ExitCode::SUCCESS,
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
        Cmd::Lint => setup().and_then(|()| lint()),
        Cmd::Demo { args } => demo(&args),
        Cmd::Bench(args) => bench::bench(args),
        Cmd::Fuzz(args) => fuzz::fuzz(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives in `<root>/xtask`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent directory").to_path_buf()
}

/// The cargo that runs us (`cargo xtask` sets CARGO), else `cargo` from PATH.
fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// `$CARGO_HOME/bin` (default `~/.cargo/bin`): where rustup's proxies and `cargo install` live.
fn cargo_bin_dir() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|h| h.join("bin"))
}

/// Make sure programs installed by `cargo install` (bpf-linker) are found by the commands we run.
fn prepend_cargo_bin_to_path() {
    let Some(bin) = cargo_bin_dir() else { return };
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|p| p == bin) {
        return;
    }
    let joined = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))
        .expect("PATH entries contain no ':'");
    // SAFETY: called at the start of main, before any other thread exists.
    unsafe { std::env::set_var("PATH", joined) };
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program` as found on PATH.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command as a shell line, with the environment variables it sets.
fn show(cmd: &Command) -> String {
    let mut parts: Vec<String> =
        cmd.get_envs().filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), quote(v)))).collect();
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

/// Print and run `cmd`; Ok(true) when it exits successfully.
fn run_status(cmd: &mut Command) -> Result<bool> {
    eprintln!("xtask: $ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("cannot run {}", quote(cmd.get_program())))?;
    Ok(status.success())
}

/// Print and run `cmd`; an error when it fails.
fn run(cmd: &mut Command) -> Result<()> {
    if !run_status(cmd)? {
        bail!("command failed: {}", show(cmd));
    }
    Ok(())
}

/// Run a query command quietly; its stdout when it succeeds.
fn query(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

// ----------------------------------------------------------------------------------------------
// setup

fn setup() -> Result<()> {
    eprintln!("xtask: setup: checking the build and test requirements");
    let mut apt = Apt::default();
    ensure_nightly_rust_src()?;
    ensure_lint_tools()?;
    ensure_bpf_linker(&mut apt)?;
    ensure_c_compilers(&mut apt)?;
    ensure_production_test_tools(&mut apt)?;
    ensure_runtimes(&mut apt)?;
    check_python();
    ensure_python_packages()?;
    eprintln!("xtask: setup: done");
    Ok(())
}

/// The managed runtimes the runtime-split end-to-end tests trace (tests/tests/runtimes*.rs): a JDK
/// (java, javac), Go (go, with cgo through gcc; also `go tool pprof`, the pprof client that
/// tests/tests/pprof.rs and push.rs read leaktrace's profiles with) and Node.js, from Debian's
/// packages, installed only when the command is missing.
fn ensure_runtimes(apt: &mut Apt) -> Result<()> {
    let missing: Vec<&str> =
        [("java", "default-jdk-headless"), ("javac", "default-jdk-headless"), ("go", "golang-go"), ("node", "nodejs")]
            .into_iter()
            .filter(|(prog, _)| which(prog).is_none())
            .map(|(_, pkg)| pkg)
            .fold(Vec::new(), |mut v, p| {
                if !v.contains(&p) {
                    v.push(p);
                }
                v
            });
    if !missing.is_empty() {
        apt.install(
            &missing,
            "a managed runtime (needed by the runtime end-to-end tests; Go also by the pprof tests)",
            &[],
        )?;
    }
    eprintln!("xtask: ok: java, javac, go, node");
    Ok(())
}

fn ensure_nightly_rust_src() -> Result<()> {
    if which("rustup").is_none() {
        bail!(
            "rustup is not on PATH: the eBPF object is built with the nightly toolchain's rust-src, \
             installed through rustup (https://rustup.rs); install rustup, then run `cargo xtask \
             setup` again"
        );
    }
    let toolchains = query("rustup", &["toolchain", "list"]).context("`rustup toolchain list` failed")?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        run(Command::new("rustup")
            .args(["toolchain", "install", "nightly", "--profile", "minimal", "--component", "rust-src"])
            .stdin(Stdio::null()))
        .context("cannot install the nightly toolchain (needed to build the eBPF object)")?;
    }
    let components = query("rustup", &["component", "list", "--toolchain", "nightly", "--installed"])
        .context("`rustup component list --toolchain nightly --installed` failed")?;
    if !components.lines().any(|l| l.trim() == "rust-src" || l.starts_with("rust-src")) {
        run(Command::new("rustup")
            .args(["component", "add", "rust-src", "--toolchain", "nightly"])
            .stdin(Stdio::null()))
        .context("cannot add rust-src to the nightly toolchain (needed to build the eBPF object)")?;
    }
    eprintln!("xtask: ok: nightly toolchain with rust-src");
    Ok(())
}

/// rustfmt and clippy for `cargo xtask lint`, added to the default toolchain when missing.
fn ensure_lint_tools() -> Result<()> {
    let missing: Vec<&str> = [("fmt", "rustfmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(sub, _)| query("cargo", &[sub, "--version"]).is_none())
        .map(|(_, component)| component)
        .collect();
    if !missing.is_empty() {
        if which("rustup").is_none() {
            bail!("{} missing and rustup is not on PATH: install them with your toolchain", missing.join(" and "));
        }
        run(Command::new("rustup").args(["component", "add"]).args(&missing).stdin(Stdio::null()))
            .context("cannot add rustfmt and clippy to the toolchain (needed by `cargo xtask lint`)")?;
    }
    eprintln!("xtask: ok: rustfmt and clippy");
    Ok(())
}

/// bpf-linker on PATH (which includes ~/.cargo/bin) that runs, with its version line.
fn working_bpf_linker() -> Option<(PathBuf, String)> {
    let path = which("bpf-linker")?;
    let version = query(path.to_str()?, &["--version"])?;
    Some((path, version.trim().to_string()))
}

fn ensure_bpf_linker(apt: &mut Apt) -> Result<()> {
    if let Some((path, version)) = working_bpf_linker() {
        eprintln!("xtask: ok: {version} ({})", path.display());
        return Ok(());
    }
    let prefix =
        std::env::var_os("LLVM_PREFIX").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_LLVM_PREFIX));
    let llvm_present = prefix.join("bin/llvm-config").is_file() && prefix.join("lib/libPolly.a").is_file();
    let install_cmd = format!(
        "LLVM_PREFIX={} cargo install bpf-linker --version {BPF_LINKER_VERSION} \
         --no-default-features --features llvm-22",
        prefix.display()
    );
    if !llvm_present {
        eprintln!(
            "xtask: bpf-linker is missing, and so is LLVM 22 ({} and {}): installing {}",
            prefix.join("bin/llvm-config").display(),
            prefix.join("lib/libPolly.a").display(),
            LLVM_PACKAGES.join(" ")
        );
        apt.install(LLVM_PACKAGES, "LLVM 22 (needed to build bpf-linker)", &[&install_cmd])?;
    }
    run(cargo()
        .env("LLVM_PREFIX", &prefix)
        .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
        .args(["--no-default-features", "--features", "llvm-22"])
        .stdin(Stdio::null()))
    .context("cannot install bpf-linker (the linker of the eBPF object)")?;
    match working_bpf_linker() {
        Some((path, version)) => {
            eprintln!("xtask: ok: {version} ({})", path.display());
            Ok(())
        }
        None => bail!(
            "bpf-linker was installed but `bpf-linker --version` does not run from PATH ({})",
            std::env::var("PATH").unwrap_or_default()
        ),
    }
}

fn ensure_c_compilers(apt: &mut Apt) -> Result<()> {
    let missing: Vec<&str> = [("gcc", "gcc"), ("g++", "g++")]
        .into_iter()
        .filter(|(prog, _)| which(prog).is_none())
        .map(|(_, pkg)| pkg)
        .collect();
    if !missing.is_empty() {
        apt.install(&missing, "a C or C++ compiler (needed by the end-to-end test fixtures)", &[])?;
    }
    eprintln!("xtask: ok: gcc and g++");
    Ok(())
}

/// What the production end-to-end tests (tests/tests/production.rs) need besides the compilers:
/// jemalloc, tcmalloc and mimalloc to link fixtures with and to LD_PRELOAD (tests/tests/verdicts_arenas.rs),
/// the static C library (`gcc -static`), bpftool (to see that a killed agent leaves no eBPF program
/// behind), util-linux's unshare and setpriv (a container, a non-root run), and Prometheus (scraping
/// `watch --metrics-listen`).
fn ensure_production_test_tools(apt: &mut Apt) -> Result<()> {
    // gcc prints the full path of a library it can link with, else only the name given.
    let gcc_finds = |file: &str| {
        query("gcc", &[&format!("-print-file-name={file}")]).is_some_and(|p| Path::new(p.trim()).is_absolute())
    };
    let sbin_or_path =
        |prog: &str| which(prog).is_some() || ["/usr/sbin", "/sbin"].iter().any(|d| Path::new(d).join(prog).is_file());
    let mut missing: Vec<&str> = Vec::new();
    for (ok, pkg) in [
        (gcc_finds("libjemalloc.so"), "libjemalloc-dev"),
        (gcc_finds("libtcmalloc.so"), "libgoogle-perftools-dev"),
        (gcc_finds("libmimalloc.so"), "libmimalloc-dev"),
        // The runtime libraries tests/tests/verdicts_arenas.rs LD_PRELOADs (Debian's package names).
        (gcc_finds("libjemalloc.so.2"), "libjemalloc2"),
        (gcc_finds("libtcmalloc_minimal.so.4"), "libtcmalloc-minimal4"),
        (gcc_finds("libmimalloc.so.2"), "libmimalloc2.0"),
        (which("musl-gcc").is_some(), "musl-tools"),
        (gcc_finds("libc.a"), "libc6-dev"),
        (sbin_or_path("bpftool"), "bpftool"),
        (sbin_or_path("unshare") && sbin_or_path("setpriv"), "util-linux"),
        (which("strip").is_some(), "binutils"),
        // Distro libraries built without frame pointers, for the unwinding tests.
        (gcc_finds("libz.so"), "zlib1g-dev"),
        (gcc_finds("libssl.so"), "libssl-dev"),
        (gcc_finds("libsqlite3.so"), "libsqlite3-dev"),
        // libc's separate debug file: names and lines of glibc's internal functions.
        (Path::new("/usr/share/doc/libc6-dbg").exists(), "libc6-dbg"),
        // Debian's own CPython with its headers (python_frame_roots.rs builds an extension for
        // /usr/bin/python3.11, Debian's statically linked interpreter).
        (
            !Path::new("/usr/bin/python3.11").exists() || Path::new("/usr/include/python3.11/Python.h").exists(),
            "python3.11-dev",
        ),
        // tests/tests/status.rs runs leaktrace in a real terminal.
        (which("tmux").is_some(), "tmux"),
        // tests/tests/watch_metrics.rs scrapes `watch --metrics-listen` with a real Prometheus.
        (which("prometheus").is_some(), "prometheus"),
        // tests/tests/errors.rs sees that a bad --out is refused before any bpf(2) call.
        (which("strace").is_some(), "strace"),
        // tests/tests/containers.rs runs real pods: containerd (with ctr and its runc shim), runc.
        (which("containerd").is_some() && which("ctr").is_some(), "containerd"),
        (which("runc").is_some(), "runc"),
        // Pods with their own network namespace: the CNI bridge, host-local and loopback plugins.
        (
            ["bridge", "host-local", "loopback"].iter().all(|p| Path::new(CNI_PLUGINS_DIR).join(p).is_file()),
            "containernetworking-plugins",
        ),
    ] {
        if !ok && !missing.contains(&pkg) {
            missing.push(pkg);
        }
    }
    if !missing.is_empty() {
        apt.install(
            &missing,
            "jemalloc, tcmalloc, mimalloc, musl, the static C library, bpftool, util-linux, zlib, \
             OpenSSL, SQLite, tmux, Prometheus, strace, containerd, runc or the CNI plugins (needed by the production, \
             unwinding, status-line, watch, errors and containers end-to-end tests)",
            &[],
        )?;
    }
    eprintln!(
        "xtask: ok: jemalloc, tcmalloc, mimalloc, musl-gcc, static libc, bpftool, unshare, setpriv, \
         libz, libssl, libsqlite3, tmux, prometheus, strace, containerd, runc, CNI plugins"
    );
    Ok(())
}

/// Where Debian's containernetworking-plugins puts the CNI plugins (tests/src/cni.rs
/// reads them from there too).
const CNI_PLUGINS_DIR: &str = "/usr/lib/cni";

/// The Python end-to-end test traces a CPython whose interpreter is in a shared libpython: only
/// warn here (build and demo do not need it).
fn check_python() {
    let shared = query("python3", &["-c", "import sysconfig; print(sysconfig.get_config_var('Py_ENABLE_SHARED'))"]);
    match shared.as_deref().map(str::trim) {
        Some("1") => eprintln!("xtask: ok: python3 with a shared libpython"),
        Some(_) => eprintln!(
            "xtask: warning: python3 is not built with a shared libpython: the Python end-to-end \
             test (which looks for libpython frames) will fail"
        ),
        None => {
            eprintln!("xtask: warning: python3 not found: the Python end-to-end test will fail")
        }
    }
}

/// Where the end-to-end tests find protobuf 4.24.2 (tests/tests/retention.rs): the real wheel
/// from PyPI, installed with `pip install --target` (abi3: any CPython 3.7+ loads it from
/// PYTHONPATH).
const PROTOBUF_DIR: &str = "/opt/leaktrace-tests/protobuf-4.24.2";

/// Where tests/fixtures/cri.py (the kubelet's side of the CRI in tests/tests/containers.rs) finds
/// the CRI v1 stubs for grpcio and PyYAML, installed with `pip install --target`.
const CRI_API_DIR: &str = "/opt/leaktrace-tests/cri-api-2.0.1";
const CRI_API_PACKAGES: &[&str] = &["container-runtime-interface-api==2.0.1", "PyYAML==6.0.3"];

/// The PyPI packages the end-to-end tests load, installed by python3's pip when missing.
fn ensure_python_packages() -> Result<()> {
    ensure_cri_api()?;
    if Path::new(PROTOBUF_DIR).join("google/protobuf/__init__.py").exists() {
        eprintln!("xtask: ok: protobuf 4.24.2 in {PROTOBUF_DIR}");
        return Ok(());
    }
    eprintln!("xtask: setup: installing protobuf 4.24.2 from PyPI into {PROTOBUF_DIR}");
    let tmp = format!("{PROTOBUF_DIR}.partial");
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--root-user-action=ignore",
            "--target",
        ])
        .arg(&tmp)
        .arg("protobuf==4.24.2"))
    .context("cannot install protobuf 4.24.2 from PyPI (`python3 -m pip install --target ...`)")?;
    std::fs::rename(&tmp, PROTOBUF_DIR).with_context(|| format!("cannot move {tmp} to {PROTOBUF_DIR}"))?;
    Ok(())
}

fn ensure_cri_api() -> Result<()> {
    let dir = Path::new(CRI_API_DIR);
    if dir.join("cri_api/v1/api_pb2_grpc.py").exists() && dir.join("yaml/__init__.py").exists() {
        eprintln!("xtask: ok: the CRI stubs, grpcio and PyYAML in {CRI_API_DIR}");
        return Ok(());
    }
    eprintln!("xtask: setup: installing {} from PyPI into {CRI_API_DIR}", CRI_API_PACKAGES.join(" "));
    let tmp = format!("{CRI_API_DIR}.partial");
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--root-user-action=ignore"])
        .arg("--target")
        .arg(&tmp)
        .args(CRI_API_PACKAGES))
    .context("cannot install the CRI stubs from PyPI (`python3 -m pip install --target ...`)")?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir).with_context(|| format!("cannot move {tmp} to {CRI_API_DIR}"))?;
    Ok(())
}

/// Debian packages through apt-get, non-interactively; `apt-get update` once per run.
#[derive(Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    fn install(&mut self, packages: &[&str], what: &str, then: &[&str]) -> Result<()> {
        let pkgs = packages.join(" ");
        let mut manual = format!("apt-get update && apt-get install -y {pkgs}");
        for t in then {
            manual.push_str(" && ");
            manual.push_str(t);
        }
        if which("apt-get").is_none() {
            bail!(
                "{what} is missing and this machine has no apt-get: install the equivalent of the \
                 Debian packages {pkgs} with your package manager, then run `cargo xtask setup` again"
            );
        }
        if !is_root() {
            bail!(
                "{what} is missing, and installing it needs root: run as root\n    {manual}\nor run \
                 `cargo xtask setup` as root"
            );
        }
        if !self.updated {
            run(apt_get().arg("update")).context("apt-get update failed")?;
            self.updated = true;
        }
        run(apt_get().args(["install", "-y", "--no-install-recommends"]).args(packages))
            .with_context(|| format!("cannot install {pkgs} ({what})"))
    }
}

fn apt_get() -> Command {
    let mut c = Command::new("apt-get");
    c.env("DEBIAN_FRONTEND", "noninteractive").stdin(Stdio::null());
    c
}

// ----------------------------------------------------------------------------------------------
// build, test, demo

fn release_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root().join(p) })
        .unwrap_or_else(|| root().join("target"));
    target.join("release/leaktrace")
}

/// `cargo build --release` of leaktrace's binary, with the features the whole workspace resolves
/// (`--workspace --exclude leaktrace-ebpf --bin leaktrace`), not leaktrace's alone (`-p
/// leaktrace`): every crate it compiles is then the very one `cargo xtask test`'s build uses
/// ([`suite::build_test_binaries`]), so a build before a test compiles nothing twice.
fn build() -> Result<()> {
    run(cargo().args(["build", "--release", "--workspace", "--exclude", "leaktrace-ebpf", "--bin", "leaktrace"]))?;
    eprintln!("xtask: built {}", release_binary().display());
    Ok(())
}

/// setup, the release build, then every test from one pool ([`suite`]); Ok(false) when a test
/// failed (the closing line `N passed, N failed` is then already printed).
fn test(raw: &[OsString]) -> Result<bool> {
    let args = suite::Args::parse(raw)?;
    if !is_root() && !args.list {
        bail!(
            "`cargo xtask test` must run as root: the end-to-end tests load eBPF programs and \
             attach uprobes for real (they are never skipped). Run it as root (e.g. `sudo -E \
             cargo xtask test`); as a normal user you can still run the unit tests with `cargo \
             test --workspace --exclude leaktrace-tests`"
        );
    }
    setup()?;
    // suite::run builds leaktrace's binary and every test binary in one cargo command.
    suite::run(&args, &release_binary())
}

/// The userspace crates: what `lint` checks (leaktrace-ebpf builds only for the bpf target).
const USERSPACE_CRATES: &[&str] = &["leaktrace", "leaktrace-analysis", "leaktrace-common", "xtask", "leaktrace-tests"];

/// `cargo fmt --check` on [`USERSPACE_CRATES`] and the kernel side (leaktrace-ebpf), and
/// `cargo clippy --release --all-targets -- -D warnings` on [`USERSPACE_CRATES`] (clippy does not
/// build for the bpf target); an error naming the gate that failed.
///
/// Clippy runs with the release profile, the tests' profile: the build scripts and proc-macros
/// it compiles and runs (and the eBPF object leaktrace's build script builds, in a directory of
/// the release and check builds alike, leaktrace/build.rs) are the ones `cargo xtask test` then
/// finds built, not a second set in the dev profile.
fn lint() -> Result<()> {
    let packages: Vec<&str> = USERSPACE_CRATES.iter().flat_map(|p| ["-p", p]).collect();
    run(cargo().arg("fmt").arg("--check").args(&packages).args(["-p", "leaktrace-ebpf"]))
        .context("`cargo fmt --check` failed: run `cargo fmt` on these packages and commit the result")?;
    run(cargo().arg("clippy").arg("--release").args(&packages).args(["--all-targets", "--", "-D", "warnings"]))
        .context("clippy found warnings (fix them, or allow one with a reason where it is wrong)")?;
    no_import_circles()?;
    no_long_files()?;
    let reads = target_reads::find(&root().join("leaktrace/src"))?;
    if !reads.is_empty() {
        bail!(
            "paths inside a target's root built outside leaktrace/src/target_fs.rs (open them with target_fs, \
             which keeps links in the target's root and refuses FIFOs and devices):\n  {}",
            reads.join("\n  ")
        );
    }
    let refs = issue_refs::find(&root())?;
    if !refs.is_empty() {
        bail!(
            "lines that name an issue by number (say what the code does and why; the history is git log's):\n  {}",
            refs.join("\n  ")
        );
    }
    let named = runtime_names::find(&root())?;
    if !named.is_empty() {
        bail!(
            "runtimes tested by name outside their folders (move the test into src/runtimes/<name>/, \
             behind the runtime's own function; xtask/src/runtime_names.rs lists the few exceptions):\n  {}",
            named.join("\n  ")
        );
    }
    eprintln!(
        "xtask: lint: fmt, clippy, the import-circle, the file-length, the target-read, the issue-number and the \
         runtime-name checks passed"
    );
    Ok(())
}

/// The source roots of the crates whose files [`circles::find`] checks.
const CIRCLE_CHECKED: &[&str] = &[
    "leaktrace/src",
    "leaktrace-analysis/src",
    "leaktrace-common/src",
    "leaktrace-ebpf/src",
    "xtask/src",
    "tests/src",
];

/// Most lines a Rust source file may have (sources and tests alike): a file a newcomer can read.
const MAX_FILE_LINES: usize = 1000;

/// No `.rs` file under the crates' source roots or `tests/tests` longer than
/// [`MAX_FILE_LINES`]; each one found is listed with its length.
fn no_long_files() -> Result<()> {
    let mut long = Vec::new();
    for dir in CIRCLE_CHECKED.iter().chain(&["tests/tests"]) {
        for file in circles::rust_files(&root().join(dir))? {
            let path = root().join(dir).join(&file);
            let lines = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .lines()
                .count();
            if lines > MAX_FILE_LINES {
                long.push(format!("{dir}/{file} ({lines} lines)"));
            }
        }
    }
    if !long.is_empty() {
        bail!("files over {MAX_FILE_LINES} lines (split them along a seam):\n  {}", long.join("\n  "));
    }
    Ok(())
}

/// No import circle among the files of any crate ([`circles`]); each one found is listed.
fn no_import_circles() -> Result<()> {
    let mut found = Vec::new();
    for src in CIRCLE_CHECKED {
        for circle in circles::find(&root().join(src))? {
            found.push(format!("{src}: {}", circle.join(" <-> ")));
        }
    }
    if !found.is_empty() {
        bail!(
            "import circles between files (move the item both use to a module both depend on):\n  {}",
            found.join("\n  ")
        );
    }
    Ok(())
}

fn demo(args: &[OsString]) -> Result<()> {
    setup()?;
    build()?;
    let mut cmd = Command::new(release_binary());
    cmd.arg("demo").args(args).current_dir(root());
    eprintln!("xtask: $ {}", show(&cmd));
    let err = cmd.exec();
    Err(err).with_context(|| format!("cannot run {}", release_binary().display()))
}
