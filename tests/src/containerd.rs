//! A real container runtime for the container tests (tests/tests/containers.rs): Debian's
//! containerd and runc (installed by `cargo xtask setup`), started by the test in its own
//! session with its root, state, socket and runc state in a temporary directory (cgroupfs
//! driver, no systemd), the CRI plugin on, a local pause image as its sandbox image and CNI
//! pointed at an empty directory (pods use the host's network), or
//! ([`Containerd::with_network`]) at a bridge of its own (`cni.rs`) for pods with their own
//! network namespace (made under its state directory). Images are OCI archives
//! written here from files ([`Image`]) and imported with `ctr -n k8s.io images import`; pods are
//! made through the CRI by `tests/fixtures/cri.py`, which plays the kubelet (see `cri.rs`).
//!
//! [`Containerd`]'s `Drop` takes everything down, also when the test failed: every sandbox
//! stopped and removed through the CRI, containerd and its shims killed (by PID), what is still
//! mounted under its directory unmounted, the pods' cgroups removed in every hierarchy, the
//! shims' sockets under /run/containerd/s removed, the bridge and the veths on it deleted.
//! [`Containerd::shutdown`] does the same and lists what remains of it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::*;

/// Where `cargo xtask setup` installs the CRI stubs (PyPI's container-runtime-interface-api
/// with grpcio) and PyYAML for `tests/fixtures/cri.py`.
pub const CRI_PYTHONPATH: &str = "/opt/leaktrace-tests/cri-api-2.0.1";
/// The sandbox ("pause") image's name, as containerd's `sandbox_image`.
pub const PAUSE_IMAGE: &str = "docker.io/leaktrace/pause:test";

/// A private containerd with the CRI plugin.
pub struct Containerd {
    /// The temporary directory holding everything of this containerd.
    pub dir: PathBuf,
    /// Its state directory: what /run/containerd is on a node (the socket is in it).
    pub state: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
    /// Pod cgroup paths (relative to a hierarchy's root) made for this containerd's pods.
    pub(crate) pod_cgroups: Mutex<Vec<String>>,
    /// The host's network devices when it started.
    net_before: Vec<String>,
    /// Shim sockets seen (removed at teardown).
    sockets: Mutex<Vec<PathBuf>>,
    /// The pods' bridge network, when pods may have their own network.
    pub bridge: Option<Bridge>,
    done: bool,
}

impl Containerd {
    /// Start containerd and import the pause image; panics (after taking down what started)
    /// when it does not answer within 30 s.
    pub fn start() -> Containerd {
        Containerd::start_with(None)
    }

    /// [`Containerd::start`] with a CNI bridge network (`cni.rs`): pods made with
    /// `PodSpec::own_network` get their own network namespace and an address on it.
    pub fn with_network() -> Containerd {
        Containerd::start_with(Some(Bridge::new()))
    }

    fn start_with(bridge: Option<Bridge>) -> Containerd {
        require_root();
        for tool in ["containerd", "ctr", "runc", "containerd-shim-runc-v2"] {
            assert!(which(tool), "{tool} is missing: `cargo xtask setup` installs containerd and runc");
        }
        assert!(
            Path::new(CRI_PYTHONPATH).join("cri_api").is_dir(),
            "{CRI_PYTHONPATH} is missing: `cargo xtask setup` installs the CRI stubs from PyPI"
        );
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = temp_root().join(format!("ctrd{}", N.fetch_add(1, Ordering::Relaxed)));
        let state = dir.join("state");
        for d in ["root", "state", "opt", "runc", "cni/bin", "cni/conf", "logs"] {
            std::fs::create_dir_all(dir.join(d)).expect("create containerd's directories");
        }
        let socket = state.join("containerd.sock");
        let config = dir.join("config.toml");
        let cni_bin = match &bridge {
            Some(b) => {
                b.write_config(&dir.join("cni/conf"), &dir);
                PathBuf::from(CNI_PLUGINS_DIR)
            }
            None => dir.join("cni/bin"),
        };
        std::fs::write(&config, config_toml(&dir, &socket, &cni_bin)).expect("write config.toml");
        let log = std::fs::File::create(dir.join("containerd.log")).expect("containerd.log");
        let mut cmd = Command::new("containerd");
        cmd.arg("--config").arg(&config).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        // Its own session: a test's process group being killed does not take it along, and
        // its shims are not the test's children.
        // SAFETY: setsid(2) is async-signal-safe, called in the child between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let net_before = net_devices();
        let child = cmd.spawn().expect("start containerd");
        let c = Containerd {
            dir,
            state,
            socket,
            child: Some(child),
            pod_cgroups: Mutex::new(Vec::new()),
            net_before,
            sockets: Mutex::new(Vec::new()),
            bridge,
            done: false,
        };
        let t0 = Instant::now();
        let up = wait_for(Duration::from_secs(30), || {
            (c.socket.exists() && c.ctr(&["version"]).status.success()).then_some(())
        });
        assert!(up.is_some(), "containerd did not answer in 30 s\n{}", c.log_tail());
        eprintln!("containerd up in {:.2} s ({})", t0.elapsed().as_secs_f64(), c.dir.display());
        c.import(&pause_image());
        c
    }

    /// `ctr --address SOCKET -n k8s.io ARGS...`.
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("run ctr")
    }

    /// Write `image` as an OCI archive and import it.
    pub fn import(&self, image: &Image) {
        let archive = image.write_archive(&self.dir.join("images"));
        let o = self.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "ctr images import {}: {}{}",
            image.name,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The last lines of containerd's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!("containerd.log (last lines):\n{}", lines[lines.len().saturating_sub(30)..].join("\n"))
    }

    /// Run `cri.py OP` with `request` on stdin; its JSON answer (panics with its stderr).
    pub fn cri(&self, op: &str, request: &Value) -> Value {
        cri_py(Some(&self.socket), op, request).unwrap_or_else(|e| panic!("cri.py {op}: {e}\n{}", self.log_tail()))
    }

    /// Remember a pod's cgroup (relative to a hierarchy's root) to remove it at teardown.
    pub(crate) fn track_cgroup(&self, rel: String) {
        self.pod_cgroups.lock().unwrap().push(rel);
    }

    /// The shims' sockets (unix:///run/containerd/s/HASH), from the tasks' bundles.
    fn shim_sockets(&self) -> Vec<PathBuf> {
        let tasks = self.state.join("io.containerd.runtime.v2.task/k8s.io");
        let Ok(rd) = std::fs::read_dir(tasks) else { return vec![] };
        rd.flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("address")).ok())
            .filter_map(|a| a.trim().strip_prefix("unix://").map(PathBuf::from))
            .collect()
    }

    /// Take everything down; what is left of it (processes, mounts, cgroups, shim sockets,
    /// network devices), which should be nothing.
    pub fn shutdown(mut self) -> Vec<String> {
        self.teardown();
        let mut left = vec![];
        let dir = self.dir.display().to_string();
        for pid in procs() {
            let text = cmdline(pid);
            if (text.starts_with("containerd") || text.contains("containerd-shim")) && text.contains(&dir) {
                left.push(format!("process {pid}: {text}"));
            }
        }
        left.extend(mounts_under(&self.dir).into_iter().map(|m| format!("mount {m}")));
        for rel in self.pod_cgroups.lock().unwrap().iter() {
            for h in cgroup_hierarchies() {
                if h.join(rel).exists() {
                    left.push(format!("cgroup {}", h.join(rel).display()));
                }
            }
        }
        for s in self.sockets.lock().unwrap().iter().filter(|s| s.exists()) {
            left.push(format!("shim socket {}", s.display()));
        }
        for d in net_devices().into_iter().filter(|d| !self.net_before.contains(d)) {
            left.push(format!("network device {d}"));
        }
        left
    }

    /// Note the shim sockets of the running tasks (called after each pod is made).
    pub(crate) fn note_shim_sockets(&self) {
        let mut s = self.sockets.lock().unwrap();
        for p in self.shim_sockets() {
            if !s.contains(&p) {
                s.push(p);
            }
        }
    }

    fn teardown(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.note_shim_sockets();
        let sockets = self.sockets.lock().unwrap().clone();
        if let Err(e) = cri_py(Some(&self.socket), "teardown", &serde_json::json!({})) {
            eprintln!("containerd teardown: removing the sandboxes through the CRI failed: {e}");
        }
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as i32;
            // SAFETY: kill(2) on containerd's PID, our child (not yet reaped).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            if wait_for(Duration::from_secs(10), || child.try_wait().ok().flatten()).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Shims still running (a test that failed half-way): killed by PID, with whatever is
        // left in the pods' cgroups.
        for pid in shim_pids(&self.socket) {
            // SAFETY: kill(2) on a shim of this containerd, found by its -address argument.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let cgroups: Vec<String> = self.pod_cgroups.lock().unwrap().clone();
        for rel in &cgroups {
            kill_cgroup_procs(rel);
        }
        unmount_under(&self.dir);
        for rel in &cgroups {
            remove_cgroup_tree(rel);
        }
        if let Some(b) = &self.bridge {
            b.teardown();
        }
        for s in sockets {
            let _ = std::fs::remove_file(s);
        }
        // The shims' socket directory, and /run/containerd, when nothing else is in them.
        let _ = std::fs::remove_dir("/run/containerd/s");
        let _ = std::fs::remove_dir("/run/containerd");
        if std::thread::panicking() {
            eprintln!("{}\ncontainerd's directory kept: {}", self.log_tail(), self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// containerd's configuration (version 2, containerd 1.6): everything of it under `dir`.
fn config_toml(dir: &Path, socket: &Path, cni_bin: &Path) -> String {
    let d = dir.display();
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = "{d}/runc-v1"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM's bounding set has no CAP_SYS_RESOURCE: never lower a container's oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
  # The pods' network namespaces under its state directory, not /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{d}/cni/conf"
"#,
        socket = socket.display(),
        cni_bin = cni_bin.display()
    )
}

/// `python3 tests/fixtures/cri.py SOCKET OP` with `request` on stdin; its JSON answer.
pub fn cri_py(socket: Option<&Path>, op: &str, request: &Value) -> Result<Value, String> {
    let mut cmd = Command::new("python3");
    cmd.arg(fixture_source("cri.py"))
        .arg(socket.map(|s| s.display().to_string()).unwrap_or_default())
        .arg(op)
        .env("PYTHONPATH", CRI_PYTHONPATH)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run python3: {e}"))?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(request.to_string().as_bytes()).map_err(|e| e.to_string())?;
    }
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!("{}\nrequest: {request}", String::from_utf8_lossy(&o.stderr)));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// `file` (YAML) as JSON, read by PyYAML.
pub fn yaml_file(file: &Path) -> Value {
    cri_py(None, "yaml", &serde_json::json!({ "path": file })).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false)
}

/// PIDs of the containerd shims started for the containerd listening on `socket`.
fn shim_pids(socket: &Path) -> Vec<u32> {
    let want = socket.display().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else { return vec![] };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2")) && args.contains(&want.as_bytes())
        })
        .collect()
}

/// Mount points of every cgroup hierarchy (v1 controllers and the unified one).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let mount = pre.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mount))
        })
        .collect()
}

fn kill_cgroup_procs(rel: &str) {
    for h in cgroup_hierarchies() {
        walk_dirs(&h.join(rel), &mut |d| {
            for pid in std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default().lines() {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: kill(2) on a process in one of this containerd's pods' cgroups.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        });
    }
}

/// Remove the cgroup `rel` and its children in every hierarchy, then its parents up to
/// `kubepods` when they are empty.
fn remove_cgroup_tree(rel: &str) {
    for h in cgroup_hierarchies() {
        let top = h.join(rel);
        let mut dirs = vec![];
        walk_dirs(&top, &mut |d| dirs.push(d.to_path_buf()));
        for d in dirs.iter().rev() {
            let _ = wait_for(Duration::from_secs(5), || std::fs::remove_dir(d).ok());
        }
        let mut p = top.parent();
        while let Some(d) = p {
            if d == h || std::fs::remove_dir(d).is_err() {
                break;
            }
            p = d.parent();
        }
    }
}

/// `f` on `dir` and every directory under it (parents first).
fn walk_dirs(dir: &Path, f: &mut dyn FnMut(&Path)) {
    if !dir.is_dir() {
        return;
    }
    f(dir);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk_dirs(&e.path(), f);
            }
        }
    }
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut m: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    m.sort_by_key(|p| std::cmp::Reverse(p.len()));
    m
}

fn unmount_under(dir: &Path) {
    for p in mounts_under(dir) {
        if let Ok(c) = std::ffi::CString::new(p) {
            // SAFETY: umount2(2) with a NUL-terminated path that outlives the call.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn procs() -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return vec![] };
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).collect()
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).replace('\0', " ")
}

/// The host's network devices.
fn net_devices() -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/sys/class/net") else { return vec![] };
    rd.flatten().filter_map(|e| e.file_name().to_str().map(str::to_string)).collect()
}

/// An image made from files: each `(source on the host, path in the image)` copied into one
/// layer (mode kept), the directories `dirs` made empty, `entrypoint` as its config's.
pub struct Image {
    pub name: String,
    pub files: Vec<(PathBuf, String)>,
    pub dirs: Vec<String>,
    pub entrypoint: Vec<String>,
}

impl Image {
    /// Write the OCI image layout as a tar archive in `dir`; its path.
    fn write_archive(&self, dir: &Path) -> PathBuf {
        let slug: String = self.name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let work = dir.join(&slug);
        let rootfs = work.join("rootfs");
        let layout = work.join("layout");
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::create_dir_all(&blobs).unwrap();
        for d in &self.dirs {
            std::fs::create_dir_all(rootfs.join(d.trim_start_matches('/'))).unwrap();
        }
        for (src, dest) in &self.files {
            let to = rootfs.join(dest.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(src, &to).unwrap_or_else(|e| panic!("copy {} into the image: {e}", src.display()));
        }
        let layer = work.join("layer.tar");
        tar(&rootfs, &layer);
        let (layer_digest, layer_size) = blob(&blobs, &std::fs::read(&layer).unwrap());
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": { "Entrypoint": self.entrypoint, "WorkingDir": "/" },
            "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
        });
        let (config_digest, config_size) = blob(&blobs, config.to_string().as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": format!("sha256:{config_digest}"), "size": config_size },
            "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar",
                         "digest": format!("sha256:{layer_digest}"), "size": layer_size }],
        });
        let (manifest_digest, manifest_size) = blob(&blobs, manifest.to_string().as_bytes());
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{ "mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "digest": format!("sha256:{manifest_digest}"), "size": manifest_size,
                            "platform": { "architecture": "amd64", "os": "linux" },
                            "annotations": { "io.containerd.image.name": self.name,
                                             "org.opencontainers.image.ref.name": self.name } }],
        });
        std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
        std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let archive = work.join("image.tar");
        tar(&layout, &archive);
        archive
    }
}

/// `tar` of the contents of `dir`, owned by root.
fn tar(dir: &Path, out: &Path) {
    let o = Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .output()
        .expect("run tar");
    assert!(o.status.success(), "tar {}: {}", dir.display(), String::from_utf8_lossy(&o.stderr));
}

/// Store `bytes` as a blob; its sha256 (hex) and size.
fn blob(blobs: &Path, bytes: &[u8]) -> (String, usize) {
    let tmp = blobs.join("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    let o = Command::new("sha256sum").arg(&tmp).output().expect("run sha256sum");
    let digest = String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(digest.len(), 64, "sha256sum: {}", String::from_utf8_lossy(&o.stderr));
    std::fs::rename(&tmp, blobs.join(&digest)).unwrap();
    (digest, bytes.len())
}

/// Compile a fixture statically (gcc -static -O1 -g -fno-omit-frame-pointer) into the
/// fixtures' directory; its path.
pub fn static_fixture(source: &str) -> PathBuf {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let out = fixtures().dir.join(format!("{}-static", source.trim_end_matches(".c")));
    if !out.exists() {
        let tmp = out.with_extension("partial");
        let mut cmd = Command::new("gcc");
        cmd.args(["-static", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o"])
            .arg(&tmp)
            .arg(fixture_source(source));
        run_build_step(&mut cmd, &format!("gcc -static ({source})"));
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// The pause image: a static pause program.
pub fn pause_image() -> Image {
    Image {
        name: PAUSE_IMAGE.into(),
        files: vec![(static_fixture("pause.c"), "/pause".into())],
        dirs: vec![],
        entrypoint: vec!["/pause".into()],
    }
}

/// leaktrace's own image as deploy/Containerfile makes it (the release binary at
/// /usr/local/bin/leaktrace, working directory /out), with the shared libraries the binary
/// loads (from `ldd`) in place of the slim Debian base.
pub fn leaktrace_image(name: &str) -> Image {
    let bin = leaktrace_bin();
    let o = Command::new("ldd").arg(bin).output().expect("run ldd");
    let mut files = vec![(bin.to_path_buf(), "/usr/local/bin/leaktrace".to_string())];
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line.split("=>").last().unwrap_or("").split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            let real = std::fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path));
            files.push((real, path.to_string()));
        }
    }
    Image {
        name: name.into(),
        files,
        dirs: vec!["/out".into(), "/tmp".into(), "/proc".into(), "/sys".into(), "/dev".into()],
        entrypoint: vec!["/usr/local/bin/leaktrace".into()],
    }
}
