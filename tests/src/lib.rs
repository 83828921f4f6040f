//! Harness of leaktrace's end-to-end tests: the real `leaktrace` binary traces real programs
//! (the fixtures in `tests/fixtures/`, compiled here) with real eBPF, as root, and the tests
//! assert on the numbers and names of its `report.json`.
//!
//! - [`leaktrace_bin`]: the binary under test (`LEAKTRACE_BIN`, else next to the test binary's
//!   target directory). `cargo xtask test` builds it and sets `LEAKTRACE_BIN`.
//! - [`fixtures`]: the fixtures, compiled once per test binary into a fresh temporary directory.
//! - [`Running`] / [`run`]: a leaktrace process with a timeout; on timeout it is killed (with its
//!   process group) and the test fails showing leaktrace's stderr.
//! - [`Target`]: a fixture started by the test (attach mode), killed when dropped.
//! - [`Report`]: `report.json`, with lookups of sites by culprit function.
//! - [`assert_leaky_report`]: the checks every `leaky` recording must pass.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use serde_json::Value;

/// Bytes leaked per iteration by every leak function of the fixtures.
pub const LEAK_BYTES: u64 = 1000;
/// Capacity of `cache_put`'s cache in `leaky.c`: 64 slots of 512 bytes.
pub const CACHE_SLOTS: u64 = 64;
pub const CACHE_CAPACITY_BYTES: u64 = CACHE_SLOTS * 512;
/// Size of `temp_work`'s temporary block in `leaky.c`.
pub const TEMP_BYTES: u64 = 4096;
/// Longest a leaktrace run may take before the test kills it and fails.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// The seven files a recording directory holds.
pub const OUTPUT_FILES: &[&str] = &[
    "recording.json",
    "report.json",
    "report.md",
    "live.svg",
    "growth.svg",
    "stacks.folded",
    "memory.svg",
];

// ----------------------------------------------------------------------------------------------
// The binary and the machine

/// Path of the leaktrace binary under test.
pub fn leaktrace_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("LEAKTRACE_BIN") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "LEAKTRACE_BIN={} does not exist: run `cargo xtask test`", p.display());
            return p;
        }
        // The test binary is <target>/<profile>/deps/<name>-<hash>.
        let exe = std::env::current_exe().expect("current_exe");
        let mut candidates = Vec::new();
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join("leaktrace"));
            if let Some(target) = profile_dir.parent() {
                candidates.push(target.join("release/leaktrace"));
                candidates.push(target.join("debug/leaktrace"));
            }
        }
        candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
            panic!(
                "the leaktrace binary was not found (LEAKTRACE_BIN is not set and there is no \
                 target/release/leaktrace or target/debug/leaktrace): run the end-to-end tests with \
                 `cargo xtask test`, which builds it"
            )
        })
    })
}

/// The end-to-end tests load eBPF for real: fail (never skip) when not root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests must run as root (they load eBPF programs and attach uprobes): run \
         `cargo xtask test` as root"
    );
}

// ----------------------------------------------------------------------------------------------
// Temporary directories

/// This test binary's temporary directory (created once, unique per process).
pub fn temp_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("leaktrace-tests-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        dir
    })
}

/// A not-yet-existing directory for one recording (`--out`). Removed when dropped if the test
/// passed; kept (and its path printed) when it failed.
pub struct OutDir {
    pub path: PathBuf,
}

impl OutDir {
    pub fn new(name: &str) -> OutDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        OutDir {
            path: temp_root().join(format!("out-{name}-{n}")),
        }
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("recording kept for inspection: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Fixtures

/// Compiled fixtures.
pub struct Fixtures {
    pub dir: PathBuf,
    /// `leaky MODE ITERATIONS RATE_PER_S` (tests/fixtures/leaky.c).
    pub leaky: PathBuf,
    /// `leaky_new ITERATIONS RATE_PER_S` (tests/fixtures/leaky_new.cpp).
    pub leaky_new: PathBuf,
    /// `python3 grow_list.py [COUNT] [RATE]` (tests/fixtures/grow_list.py).
    pub grow_list_py: PathBuf,
}

pub fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn compile(compiler: &str, source: &Path, output: &Path) {
    let mut cmd = Command::new(compiler);
    cmd.args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o"])
        .arg(output)
        .arg(source);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {compiler} (is it installed? `cargo xtask setup` installs it): {e}")
    });
    assert!(
        out.status.success(),
        "compiling {} failed ({:?}):\n{}",
        source.display(),
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fixtures, compiled on first use (gcc/g++ -O1 -g -fno-omit-frame-pointer).
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let dir = temp_root().join("fixtures");
        std::fs::create_dir_all(&dir).expect("create fixtures dir");
        let leaky = dir.join("leaky");
        compile("gcc", &fixture_source("leaky.c"), &leaky);
        let leaky_new = dir.join("leaky_new");
        compile("g++", &fixture_source("leaky_new.cpp"), &leaky_new);
        let grow_list_py = dir.join("grow_list.py");
        std::fs::copy(fixture_source("grow_list.py"), &grow_list_py).expect("copy grow_list.py");
        Fixtures {
            dir,
            leaky,
            leaky_new,
            grow_list_py,
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

// ----------------------------------------------------------------------------------------------
// Running leaktrace

/// A `leaktrace` command with these arguments.
pub fn leaktrace<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(leaktrace_bin());
    cmd.args(args);
    cmd
}

/// How a process ended, with everything it printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub command: String,
}

impl Output {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    /// For failure messages.
    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {:?} (code {:?}, signal {:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.status,
            self.status.code(),
            self.status.signal(),
            self.stdout,
            self.stderr
        )
    }
    /// Panic (showing everything) unless the process exited with status 0.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "leaktrace failed\n{}",
            self.describe()
        );
        self
    }
}

fn show(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())))
        .collect();
    parts.push(cmd.get_program().to_string_lossy().into_owned());
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// A running process (leaktrace) in its own process group, whose stdout and stderr are
/// collected; stderr lines are also observable while it runs.
pub struct Running {
    child: Child,
    command: String,
    stdout: Option<JoinHandle<String>>,
    stderr_lines: Arc<Mutex<Vec<String>>>,
    stderr_rx: Receiver<String>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Spawn `cmd` (stdout and stderr piped, stdin from `stdin` or /dev/null).
    pub fn spawn(mut cmd: Command, stdin: Option<&[u8]>) -> Running {
        let command = show(&cmd);
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        if let Some(data) = stdin {
            let mut pipe = child.stdin.take().expect("stdin piped");
            let data = data.to_vec();
            std::thread::spawn(move || {
                let _ = pipe.write_all(&data);
                // dropping the pipe closes it: the reader sees end of file
            });
        }
        let mut out = child.stdout.take().expect("stdout piped");
        let stdout = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        });
        let err = child.stderr.take().expect("stderr piped");
        let stderr_lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, stderr_rx) = channel();
        let lines = Arc::clone(&stderr_lines);
        let stderr_thread = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Running {
            child,
            command,
            stdout: Some(stdout),
            stderr_lines,
            stderr_rx,
            stderr_thread: Some(stderr_thread),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// stderr so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr_lines.lock().unwrap().join("\n")
    }

    /// Wait until a stderr line starts with `prefix`. Err (with stderr so far) on timeout or when
    /// the process closed its stderr first.
    pub fn wait_for_stderr_line(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_rx.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no stderr line starting with {prefix:?} within {timeout:?} from {}\nstderr so far:\n{}",
                        self.command,
                        self.stderr_so_far()
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    return Err(format!(
                        "{} ended ({status:?}) before printing a stderr line starting with {prefix:?}\nstderr:\n{}",
                        self.command,
                        self.stderr_so_far()
                    ));
                }
            }
        }
    }

    /// Send a signal to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    fn kill_group(&mut self) {
        // SAFETY: as above; the child leads its own process group (process_group(0)).
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.kill();
    }

    /// Wait for the end (at most `timeout`, else kill it with its process group and panic with
    /// its stderr).
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait().expect("try_wait") {
                Some(status) => break status,
                None if Instant::now() >= deadline => {
                    self.kill_group();
                    let _ = self.child.wait();
                    std::thread::sleep(Duration::from_millis(100));
                    panic!(
                        "timed out after {timeout:?}, killed: {}\nstderr:\n{}",
                        self.command,
                        self.stderr_so_far()
                    );
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        // A child left behind by leaktrace could hold the pipes open: give the readers a moment,
        // then kill the group.
        let grace = Instant::now() + Duration::from_secs(5);
        while !self.stdout.as_ref().unwrap().is_finished() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.stdout.as_ref().unwrap().is_finished() {
            // SAFETY: as above.
            unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        }
        let stdout = self.stdout.take().unwrap().join().unwrap_or_default();
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
        Output {
            status,
            stdout,
            stderr: self.stderr_so_far(),
            command: self.command.clone(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// Run `cmd` to its end (see [`Running::wait`]).
pub fn run(cmd: Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    Running::spawn(cmd, stdin).wait(timeout)
}

/// `leaktrace record --interval 250ms --out OUT [extra...] -- TARGET...`, to its end.
pub fn record_launch(out: &OutDir, extra: &[&str], target: Command) -> Output {
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--out"]);
    cmd.arg(&out.path).args(extra).arg("--");
    for (k, v) in target.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.arg(target.get_program()).args(target.get_args());
    run(cmd, None, TIMEOUT)
}

/// The "PID <pid>" line every fixture prints first.
pub fn pid_line(stdout: &str) -> Option<u32> {
    stdout
        .lines()
        .next()?
        .strip_prefix("PID ")?
        .trim()
        .parse()
        .ok()
}

// ----------------------------------------------------------------------------------------------
// A target process started by the test (attach mode)

/// A fixture process started by the test: its stdout lines are read as they come, it is reaped
/// as soon as it exits (so that it does not linger as a zombie), and killed when dropped.
pub struct Target {
    pub pid: u32,
    lines: Receiver<String>,
    status: Arc<Mutex<Option<ExitStatus>>>,
    reaper: Option<JoinHandle<()>>,
}

impl Target {
    pub fn spawn(mut cmd: Command) -> Target {
        let command = show(&cmd);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        let pid = child.id();
        let out = child.stdout.take().expect("stdout piped");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let status = Arc::new(Mutex::new(None));
        let st = Arc::clone(&status);
        let reaper = std::thread::spawn(move || {
            let s = child.wait().expect("wait for target");
            *st.lock().unwrap() = Some(s);
        });
        Target {
            pid,
            lines,
            status,
            reaper: Some(reaper),
        }
    }

    /// The next stdout line, within `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Read the "PID <pid>" line and check it names this process.
    pub fn expect_pid_line(&self) {
        let line = self
            .next_line(Duration::from_secs(10))
            .expect("the target printed no PID line");
        assert_eq!(line, format!("PID {}", self.pid), "the target's first line");
    }

    pub fn signal(&self, sig: i32) {
        if self.status.lock().unwrap().is_none() {
            // SAFETY: kill has no memory-safety preconditions; the target is not reaped yet.
            unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        }
    }

    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.status.lock().unwrap()
    }

    /// Wait for the target's exit, at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exit_status() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        {
            let status = self.status.lock().unwrap();
            if status.is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

// ----------------------------------------------------------------------------------------------
// report.json

/// A parsed `report.json`.
pub struct Report {
    pub dir: PathBuf,
    pub json: Value,
}

impl Report {
    /// Load DIR/report.json.
    pub fn load(dir: &Path) -> Report {
        let path = dir.join("report.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
        Report {
            dir: dir.to_path_buf(),
            json,
        }
    }

    /// `json[a][b]...`, panicking with the path when absent.
    pub fn get(&self, path: &[&str]) -> &Value {
        let mut v = &self.json;
        for key in path {
            v = v.get(key).unwrap_or_else(|| {
                panic!(
                    "report.json has no {} ({})",
                    path.join("."),
                    self.dir.display()
                )
            });
        }
        v
    }

    pub fn sites(&self) -> &[Value] {
        self.get(&["sites"]).as_array().expect("sites is an array")
    }

    /// Every site whose culprit is `function`, largest live_bytes first. A demangled C++ name
    /// matches without its parameter list (`leak_new` matches `leak_new(int)`).
    pub fn sites_of(&self, function: &str) -> Vec<&Value> {
        let mut v: Vec<&Value> = self
            .sites()
            .iter()
            .filter(|s| {
                s["function"]
                    .as_str()
                    .is_some_and(|f| same_function(f, function))
            })
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(u64_of(s, "live_bytes")));
        v
    }

    /// The site (the largest, if several) whose culprit is `function` (see [`Report::sites_of`]);
    /// panics showing all sites.
    pub fn site(&self, function: &str) -> &Value {
        self.sites_of(function)
            .into_iter()
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "no site has culprit function {function:?}; sites:\n{}",
                    self.summary()
                )
            })
    }

    /// The site with the largest growth_bytes.
    pub fn largest_growth(&self) -> &Value {
        self.sites()
            .iter()
            .max_by_key(|s| i64_of(s, "growth_bytes"))
            .unwrap_or_else(|| panic!("report has no sites ({})", self.dir.display()))
    }

    /// One line per site, for failure messages.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for site in self.sites().iter().take(25) {
            let chain: Vec<String> = site["frames"]
                .as_array()
                .map(|fs| {
                    fs.iter()
                        .map(|f| {
                            let name = f["function"]
                                .as_str()
                                .filter(|n| !n.is_empty())
                                .unwrap_or("?");
                            format!("{name}@{}", object_name(f))
                        })
                        .collect()
                })
                .unwrap_or_default();
            s.push_str(&format!(
                "  {:<24} class={:<9} live={}/{} allocated={}/{} freed={}/{} growth={} ({}/s) lost={} frames=[{}]\n",
                site["function"].as_str().unwrap_or("?"),
                site["class"].as_str().unwrap_or("?"),
                site["live_bytes"],
                site["live_allocations"],
                site["allocated_bytes"],
                site["allocations"],
                site["freed_bytes"],
                site["frees"],
                site["growth_bytes"],
                site["growth_bytes_per_s"],
                site["stack_lost"],
                chain.join(" <- ")
            ));
        }
        if self.sites().len() > 25 {
            s.push_str(&format!("  ... {} sites in all\n", self.sites().len()));
        }
        s.push_str(&format!(
            "  verdict: {}\n  drops: {}\n  events: {}\n",
            self.json["verdict"], self.json["drops"], self.json["events"]
        ));
        s
    }
}

fn object_name(frame: &Value) -> &str {
    frame["object"]
        .as_str()
        .and_then(|o| o.rsplit('/').next())
        .unwrap_or("?")
}

/// `v[key]` as u64 (panics naming the key and showing `v` when absent or not a non-negative
/// integer).
pub fn u64_of(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a non-negative integer in {v}"))
}

pub fn i64_of(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

pub fn f64_of(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

/// Assert |actual − expected| ≤ tolerance × expected.
pub fn assert_within(what: &str, actual: f64, expected: f64, tolerance: f64, context: &str) {
    assert!(
        (actual - expected).abs() <= tolerance * expected.abs(),
        "{what}: expected {expected} ± {:.0}%, got {actual}\n{context}",
        tolerance * 100.0
    );
}

/// The checks that every recording of `leaky MODE ITERATIONS RATE` (the whole run traced) must
/// pass: the leak is found with its exact size and culprit, the decoys are not called leaks.
pub fn assert_leaky_report(report: &Report, mode: &str, iterations: u64) {
    let ctx = format!("report {}:\n{}", report.dir.display(), report.summary());
    let culprit = leak_function(mode);

    // The leak: the site with the largest growth, named after the function that called the
    // allocator directly, with the exact leaked size.
    let leak = report.site(&culprit);
    let top = report.largest_growth();
    assert_eq!(
        top["function"],
        culprit.as_str(),
        "the site with the largest growth should be {culprit}\n{ctx}"
    );
    let expected = (iterations * LEAK_BYTES) as f64;
    assert_within(
        &format!("{culprit} live_bytes"),
        u64_of(leak, "live_bytes") as f64,
        expected,
        0.10,
        &ctx,
    );
    assert_within(
        &format!("{culprit} growth per iteration (growth_bytes / {iterations})"),
        i64_of(leak, "growth_bytes") as f64 / iterations as f64,
        LEAK_BYTES as f64,
        0.10,
        &ctx,
    );
    assert_eq!(str_of(leak, "class"), "leak", "class of {culprit}\n{ctx}");
    assert!(
        f64_of(leak, "growth_bytes_per_s") > 0.0,
        "{culprit} growth_bytes_per_s should be > 0\n{ctx}"
    );
    let expected_live_allocations = if mode == "realloc" { 1 } else { iterations };
    assert_eq!(
        u64_of(leak, "live_allocations"),
        expected_live_allocations,
        "{culprit} live_allocations\n{ctx}"
    );
    assert!(
        !leak["stack_lost"].as_bool().unwrap_or(true),
        "{culprit} stack_lost should be false\n{ctx}"
    );
    assert_culprit_frames(leak, &culprit, "leaky.c", &["run_workload", "main"], &ctx);

    // The bounded cache: full (64 × 512 B) at the end, not a leak.
    let cache = report.site("cache_put");
    assert_ne!(
        str_of(cache, "class"),
        "leak",
        "cache_put must not be classed a leak\n{ctx}"
    );
    let cache_live = u64_of(cache, "live_bytes");
    assert!(
        cache_live as f64 <= CACHE_CAPACITY_BYTES as f64 * 1.10,
        "cache_put live_bytes {cache_live} exceeds the cache capacity {CACHE_CAPACITY_BYTES} (+10%)\n{ctx}"
    );
    assert_within(
        "cache_put live_bytes (a full cache)",
        cache_live as f64,
        CACHE_CAPACITY_BYTES as f64,
        0.10,
        &ctx,
    );
    assert_eq!(
        u64_of(cache, "allocations"),
        iterations,
        "cache_put allocations\n{ctx}"
    );
    assert_eq!(
        u64_of(cache, "frees"),
        iterations - CACHE_SLOTS,
        "cache_put frees (evictions)\n{ctx}"
    );

    // Temporary blocks: all freed. report.json lists only sites with live bytes or growth, so
    // temp_work's site may be absent there; recording.json must show all its blocks freed.
    if let Some(temp) = report.sites_of("temp_work").first() {
        assert_ne!(
            str_of(temp, "class"),
            "leak",
            "temp_work must not be classed a leak\n{ctx}"
        );
        assert!(
            u64_of(temp, "live_bytes") <= TEMP_BYTES,
            "temp_work live_bytes should be 0 (at most one block in flight)\n{ctx}"
        );
    }
    let temp = recorded_totals(&report.dir, "temp_work");
    assert_eq!(
        temp,
        SiteTotals {
            alloc_bytes: iterations * TEMP_BYTES,
            alloc_count: iterations,
            free_bytes: iterations * TEMP_BYTES,
            free_count: iterations
        },
        "temp_work totals at the last checkpoint of recording.json\n{ctx}"
    );

    // Nothing lost, everything counted.
    assert_eq!(
        report.get(&["drops", "total"]).as_u64(),
        Some(0),
        "drops.total\n{ctx}"
    );
    let allocs = report
        .get(&["events", "allocs"])
        .as_u64()
        .expect("events.allocs");
    assert!(
        allocs >= 3 * iterations,
        "events.allocs {allocs} < 3 × {iterations}\n{ctx}"
    );
    let frees = report
        .get(&["events", "frees"])
        .as_u64()
        .expect("events.frees");
    assert!(
        frees >= 2 * iterations - CACHE_SLOTS,
        "events.frees {frees} < {}\n{ctx}",
        2 * iterations - CACHE_SLOTS
    );

    // Process memory series.
    let rss = report
        .get(&["memory", "rss_bytes"])
        .as_array()
        .expect("memory.rss_bytes is an array");
    assert!(!rss.is_empty(), "memory.rss_bytes is empty\n{ctx}");
    assert!(
        rss.iter().any(|p| p[1].as_u64().unwrap_or(0) > 0),
        "memory.rss_bytes has no positive value\n{ctx}"
    );
    let native = report
        .get(&["memory", "native_live_bytes"])
        .as_array()
        .expect("memory.native_live_bytes");
    let native_max = native
        .iter()
        .filter_map(|p| p[1].as_u64())
        .max()
        .unwrap_or(0);
    assert!(
        native_max as f64 >= 0.9 * (expected + CACHE_CAPACITY_BYTES as f64),
        "memory.native_live_bytes peaks at {native_max}, below the leak + cache\n{ctx}"
    );

    let verdict = report.get(&["verdict"]);
    assert!(
        !str_of(verdict, "class").is_empty() && !str_of(verdict, "summary").is_empty(),
        "verdict\n{ctx}"
    );
}

/// Totals of one kind of site at the last checkpoint of a recording.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SiteTotals {
    pub alloc_bytes: u64,
    pub alloc_count: u64,
    pub free_bytes: u64,
    pub free_count: u64,
}

/// Sum, over the stacks of DIR/recording.json whose first frame outside the allocator's object
/// is `function`, of their totals at the last checkpoint.
pub fn recorded_totals(dir: &Path, function: &str) -> SiteTotals {
    totals_where(dir, |frames| {
        let alloc_obj = frames.first().and_then(|f| f["object"].as_str());
        frames
            .iter()
            .find(|f| f["object"].as_str() != alloc_obj)
            .and_then(|f| f["function"].as_str())
            == Some(function)
    })
}

/// Totals at the end of the recording in `dir`, summed over the stacks whose frames satisfy
/// `select` (frames innermost first, as in recording.json).
pub fn totals_where(dir: &Path, select: impl Fn(&[Value]) -> bool) -> SiteTotals {
    let path = dir.join("recording.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rec: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ids: Vec<u64> = rec["stacks"]
        .as_array()
        .expect("recording.stacks")
        .iter()
        .filter(|st| {
            select(
                st["frames"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
            )
        })
        .filter_map(|st| st["id"].as_u64())
        .collect();
    let mut t = SiteTotals::default();
    for s in latest_samples(&rec).values() {
        if ids.contains(&s["stack"].as_u64().unwrap_or(u64::MAX)) {
            t.alloc_bytes += u64_of(s, "alloc_bytes");
            t.alloc_count += u64_of(s, "alloc_count");
            t.free_bytes += u64_of(s, "free_bytes");
            t.free_count += u64_of(s, "free_count");
        }
    }
    t
}

/// The site's frames: the innermost is in the allocator; the culprit frame (first non-allocator
/// frame) is `culprit`, in `file` with a line number; `callers` follow it, in this order.
pub fn assert_culprit_frames(site: &Value, culprit: &str, file: &str, callers: &[&str], ctx: &str) {
    let frames = site["frames"]
        .as_array()
        .unwrap_or_else(|| panic!("site has no frames array\n{ctx}"));
    assert!(!frames.is_empty(), "{culprit}: empty frames\n{ctx}");
    assert_eq!(
        frames[0]["allocator"].as_bool(),
        Some(true),
        "{culprit}: frames[0] should be the allocator\n{ctx}"
    );
    let idx = frames
        .iter()
        .position(|f| f["allocator"].as_bool() == Some(false))
        .unwrap_or_else(|| panic!("{culprit}: no non-allocator frame\n{ctx}"));
    let f = &frames[idx];
    let name = f["function"].as_str().unwrap_or("");
    assert!(
        same_function(name, culprit),
        "{culprit}: first non-allocator frame is {name:?}\n{ctx}"
    );
    let f_file = f["file"].as_str().unwrap_or("");
    assert!(
        f_file.ends_with(file),
        "{culprit}: frame file {f_file:?} should end with {file}\n{ctx}"
    );
    assert!(
        f["line"].as_u64().unwrap_or(0) > 0,
        "{culprit}: frame has no line number\n{ctx}"
    );
    let names: Vec<&str> = frames[idx + 1..]
        .iter()
        .filter_map(|f| f["function"].as_str())
        .collect();
    let mut pos = 0;
    for caller in callers {
        match names[pos..].iter().position(|n| same_function(n, caller)) {
            Some(p) => pos += p + 1,
            None => {
                panic!("{culprit}: caller {caller} missing after it in the stack {names:?}\n{ctx}")
            }
        }
    }
}

/// Assert the recording directory holds all seven outputs, non-empty.
pub fn assert_outputs_exist(dir: &Path) {
    for name in OUTPUT_FILES {
        let p = dir.join(name);
        let len = std::fs::metadata(&p)
            .map(|m| m.len())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(len > 0, "{} is empty", p.display());
    }
}

// ----------------------------------------------------------------------------------------------
// The modes fixture (tests/fixtures/modes.c)

/// `modes WORKLOAD N` (tests/fixtures/modes.c: sites, pairs, realloc, grow), compiled on first
/// use (gcc -O1 -g -fno-omit-frame-pointer).
pub fn modes_fixture() -> &'static Path {
    static MODES: OnceLock<PathBuf> = OnceLock::new();
    MODES.get_or_init(|| {
        let dir = temp_root().join("fixtures-modes");
        std::fs::create_dir_all(&dir).expect("create fixtures-modes dir");
        let bin = dir.join("modes");
        compile("gcc", &fixture_source("modes.c"), &bin);
        bin
    })
}

/// Record `modes WORKLOAD N` launched under leaktrace with `extra` options; asserts it ran to
/// its end.
pub fn record_modes(name: &str, extra: &[&str], workload: &str, n: u64) -> (OutDir, Output) {
    let out = OutDir::new(name);
    let mut target = Command::new(modes_fixture());
    target.args([workload, &n.to_string()]);
    let o = record_launch(&out, extra, target);
    o.assert_success();
    assert!(
        o.stdout.contains(&format!("done {workload} {n}")),
        "modes {workload} {n} did not run to its end\n{}",
        o.describe()
    );
    (out, o)
}

// ----------------------------------------------------------------------------------------------
// Production attach (tests/tests/production.rs): fixtures built with other flags and libraries,
// C++ names, processes, cgroups, eBPF programs

/// Compile `sources` into `output` with the fixtures' flags (`-O1 -g -fno-omit-frame-pointer
/// -Wall`) followed by `extra` (after the sources: libraries, `-static`, `-shared -fPIC`, ...).
pub fn compile_with(compiler: &str, sources: &[&Path], output: &Path, extra: &[&str]) {
    let mut cmd = Command::new(compiler);
    cmd.args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o"])
        .arg(output)
        .args(sources)
        .args(extra);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {compiler} (is it installed? `cargo xtask setup` installs it): {e}")
    });
    assert!(
        out.status.success(),
        "compiling {} failed ({}):\n{}\n(`cargo xtask setup` installs the libraries the fixtures link with)",
        output.display(),
        show(&cmd),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A function name without its C++ parameter list: `leak_object(int)` → `leak_object`;
/// C names are returned as they are.
pub fn function_base(name: &str) -> &str {
    if !name.ends_with(')') {
        return name;
    }
    let mut depth = 0usize;
    for (i, c) in name.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return &name[..i];
                }
            }
            _ => {}
        }
    }
    name
}

/// Every site whose culprit is `base`, with or without a C++ parameter list, largest live
/// bytes first.
pub fn sites_named<'a>(report: &'a Report, base: &str) -> Vec<&'a Value> {
    let mut v: Vec<&Value> = report
        .sites()
        .iter()
        .filter(|s| s["function"].as_str().map(function_base) == Some(base))
        .collect();
    v.sort_by_key(|s| std::cmp::Reverse(u64_of(s, "live_bytes")));
    v
}

/// The site (the largest, if several) whose culprit is `base` (see [`sites_named`]); panics
/// showing all sites.
pub fn site_named<'a>(report: &'a Report, base: &str) -> &'a Value {
    sites_named(report, base)
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            panic!(
                "no site has culprit function {base:?} (with or without parameters); sites:\n{}",
                report.summary()
            )
        })
}

/// Function names of allocator internals and entry points, as blazesym names them (a test-side
/// approximation of leaktrace's own list): the frames a stack's culprit is searched past.
fn looks_like_allocator(function: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "malloc",
        "calloc",
        "realloc",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "__libc_",
        "__GI___libc_",
        "_int_",
        "_mid_memalign",
        "__posix_memalign",
        "tcache_",
        "strdup",
        "__strdup",
        "strndup",
        "__strndup",
        "operator new",
        "operator delete",
        "tc_",
        "je_",
        "tcmalloc::",
    ];
    PREFIXES.iter().any(|p| function.starts_with(p))
}

/// [`recorded_totals`] for the stacks whose culprit is `base`, with or without a C++ parameter
/// list. The culprit is the first frame after the innermost one that is outside the
/// allocator's object or, in the same object (a static executable), not named like an
/// allocator function.
pub fn recorded_totals_named(dir: &Path, base: &str) -> SiteTotals {
    totals_where(dir, |frames| {
        let alloc_obj = frames.first().and_then(|f| f["object"].as_str());
        frames
            .iter()
            .skip(1)
            .find(|f| {
                f["object"].as_str() != alloc_obj
                    || !f["function"].as_str().is_some_and(looks_like_allocator)
            })
            .and_then(|f| f["function"].as_str())
            .map(function_base)
            == Some(base)
    })
}

/// Call `f` every 20 ms until it returns Some, at most `timeout`.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The children of process `pid` (of all its threads), from /proc/PID/task/*/children.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// /proc/PID/comm, without the newline.
pub fn comm_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// True while `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_ascii_whitespace().next().map(str::to_string))
        })
        .is_some_and(|st| st != "Z" && st != "X")
}

/// Where the cgroup v2 hierarchy is mounted (/proc/self/mountinfo): /sys/fs/cgroup on a
/// unified system, /sys/fs/cgroup/unified on a hybrid one. Err saying why there is none.
pub fn cgroup2_mount() -> Result<PathBuf, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_ascii_whitespace().next()? != "cgroup2" {
                return None;
            }
            pre.split_ascii_whitespace().nth(4).map(PathBuf::from)
        })
        .collect();
    // Prefer the usual places.
    found.sort_by_key(|p| !p.starts_with("/sys/fs/cgroup"));
    found.into_iter().next().ok_or_else(|| {
        "no cgroup v2 hierarchy is mounted on this machine (no cgroup2 line in \
         /proc/self/mountinfo)"
            .to_string()
    })
}

/// A new, empty cgroup v2 directory; its processes are killed and the directory removed when
/// dropped.
pub struct TempCgroup {
    pub path: PathBuf,
}

impl TempCgroup {
    /// Err when there is no cgroup v2 hierarchy, or the directory cannot be created.
    pub fn new(name: &str) -> Result<TempCgroup, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let root = cgroup2_mount()?;
        let path = root.join(format!(
            "leaktrace-test-{}-{name}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path)
            .map_err(|e| format!("cannot create the cgroup {}: {e}", path.display()))?;
        Ok(TempCgroup { path })
    }

    /// Move process `pid` into this cgroup.
    pub fn add(&self, pid: u32) {
        let procs = self.path.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|e| panic!("cannot move PID {pid} into {}: {e}", procs.display()));
    }

    /// The processes in this cgroup now.
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        for pid in self.procs() {
            // SAFETY: kill has no memory-safety preconditions; these are the test's processes.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // A cgroup can be removed once its last process is gone (reaped by its parent).
        let removed = wait_for(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.path).ok()
        });
        if removed.is_none() {
            eprintln!("cgroup {} could not be removed", self.path.display());
        }
    }
}

/// IDs of the eBPF programs that process `pid` holds file descriptors to (the `prog_id:` line of
/// /proc/PID/fdinfo/N).
pub fn bpf_prog_ids_of(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for fd in fds.flatten() {
        if let Ok(text) = std::fs::read_to_string(fd.path()) {
            ids.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("prog_id:"))
                    .filter_map(|v| v.trim().parse::<u32>().ok()),
            );
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Every loaded eBPF program as `bpftool prog show -j` lists it: (id, PIDs holding it). The
/// PIDs are empty when this bpftool is built without that feature (no `pids` field).
pub fn bpftool_progs() -> Vec<(u32, Vec<u32>)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run bpftool (is it installed? `cargo xtask setup` installs it): {e}")
        });
    assert!(
        out.status.success(),
        "bpftool prog show -j failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bpftool prog show -j printed no JSON: {e}"));
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let id = p["id"].as_u64()? as u32;
                    let pids = p["pids"]
                        .as_array()
                        .map(|ps| {
                            ps.iter()
                                .filter_map(|x| x["pid"].as_u64().map(|n| n as u32))
                                .collect()
                        })
                        .unwrap_or_default();
                    Some((id, pids))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// True when the reported function name `reported` is `wanted`, or is the demangled C++ name of
/// `wanted` with its parameter list (`leak_new(int)`, `ns::f(char const*) const`).
pub fn same_function(reported: &str, wanted: &str) -> bool {
    reported == wanted
        || reported
            .strip_prefix(wanted)
            .is_some_and(|rest| rest.starts_with('('))
}

/// The latest sample of every stack in a recording: checkpoints list only the sites whose totals
/// changed, so a site's totals at the end are its last sample in any checkpoint.
pub fn latest_samples(rec: &Value) -> std::collections::BTreeMap<u64, Value> {
    let mut out = std::collections::BTreeMap::new();
    for c in rec["checkpoints"]
        .as_array()
        .expect("recording has checkpoints")
    {
        for s in c["sites"].as_array().expect("checkpoint.sites") {
            out.insert(s["stack"].as_u64().unwrap_or(u64::MAX), s.clone());
        }
    }
    out
}
