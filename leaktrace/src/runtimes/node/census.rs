//! Node's sampling heap profiler driven from outside (`--heap-census`): the inspector opened the
//! documented way (SIGUSR1, unless it already listens on 9229; refused when it does not catch
//! SIGUSR1, run with `--disable-sigusr1`, whose default action would end it), reached inside
//! the target's network namespace (a socket connected from a thread that joined it), spoken to
//! with the DevTools protocol over a WebSocket (tungstenite): `HeapProfiler.startSampling` at
//! the start, `HeapProfiler.getSamplingProfile` at the end (the objects sampled since that are
//! still alive, by the JS function that allocated them; JS functions are named without
//! `--perf-basic-prof`), then `stopSampling`. An inspector leaktrace opened is closed again
//! (`require('inspector').close()` from the command-line API); the target runs on. It is closed
//! on every way out: at the end, from `Drop` (an error, a panic unwinding), and, when leaktrace
//! itself is killed, by a guardian process that outlives it ([`super::guard`]). It stays
//! open from the start of the sampling to its end: V8 ends a sampling when its session closes.
//! Only a listener of the target's own (its socket among the target's descriptors) bound to
//! 127.0.0.1 or 0.0.0.0 is spoken to, through 127.0.0.1.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leaktrace_analysis::holds::{Census, JsFunction, JsSampling, Taken};

use super::cdp::Collected;
use serde_json::{Value, json};

/// The inspector's default port (`--inspect`, SIGUSR1).
const DEFAULT_PORT: u16 = 9229;
/// Longest wait for the inspector to listen after SIGUSR1, and for one protocol answer.
const WAIT: Duration = Duration::from_secs(10);
/// Mean bytes between samples asked of V8 (its default is 32 KiB).
pub const SAMPLING_INTERVAL: u64 = 16 * 1024;
/// Functions kept of a profile.
const MAX_FUNCTIONS: usize = 200;

type Ws = tungstenite::WebSocket<TcpStream>;

enum Phase {
    Idle,
    /// SIGUSR1 sent at this moment, with the ports it listened on before: the inspector is the
    /// port that appears.
    Signalled(Instant, Vec<u16>),
    /// Sampling since this moment.
    Sampling(Instant),
    Done,
}

/// The sampling heap profile of one Node process.
pub struct NodeCensus {
    pub(super) pid: u32,
    phase: Phase,
    ws: Option<Ws>,
    /// The inspector was opened by leaktrace (and is closed at the end).
    opened: bool,
    /// Its port, once connected.
    opened_port: Option<u16>,
    /// The guardian that closes the inspector leaktrace opened if leaktrace dies first.
    guard: Option<InspectorGuard>,
    /// [`NodeCensus::close`] ran.
    closed: bool,
    next_id: u64,
    /// When the census began: a launched node gets [`WAIT`] to install its SIGUSR1 handler.
    created: Instant,
    pub census: Census<JsSampling>,
    /// `--heap-snapshots` (its size limit, bytes): the first snapshot and what the two found.
    pub(crate) snapshot_max: Option<u64>,
    pub(super) first: Option<super::snap::First>,
    pub snapshots: Option<leaktrace_analysis::holds::JsSnapshots>,
}

impl NodeCensus {
    pub fn new(pid: u32) -> NodeCensus {
        NodeCensus {
            pid,
            phase: Phase::Idle,
            ws: None,
            opened: false,
            opened_port: None,
            guard: None,
            closed: false,
            next_id: 1,
            created: Instant::now(),
            census: Census::default(),
            snapshot_max: None,
            first: None,
            snapshots: None,
        }
    }

    /// At every poll: open the inspector (SIGUSR1) and start sampling once it listens. Waits at
    /// most [`WAIT`] per protocol answer, only while starting.
    pub fn tick(&mut self) {
        match &self.phase {
            Phase::Idle => {
                // An inspector already open on its default port is used; any other port the
                // process listens on is the program's own (never sent a request).
                let before = listening_ports(self.pid);
                if before.contains(&DEFAULT_PORT) {
                    self.start(DEFAULT_PORT);
                } else if catches_sigusr1(self.pid) {
                    // SAFETY: kill(2) on the target's PID with a signal it handles.
                    unsafe { libc::kill(self.pid as i32, libc::SIGUSR1) };
                    self.opened = true;
                    self.phase = Phase::Signalled(Instant::now(), before);
                } else if self.created.elapsed() < WAIT {
                    // A node just launched installs its handler while it starts: asked again
                    // at the next poll.
                } else {
                    self.fail("node does not handle SIGUSR1 (run with --disable-sigusr1?) and no inspector listens on 9229: none opened");
                }
            }
            Phase::Signalled(at, before) => {
                let (at, new) = (*at, listening_ports(self.pid).into_iter().find(|p| !before.contains(p)));
                match new {
                    Some(port) => self.start(port),
                    None if at.elapsed() > WAIT && port_taken_by_another(self.pid, DEFAULT_PORT) => self.fail(
                        "no inspector opened within 10 s of SIGUSR1: port 9229 is taken by another process of its network namespace (another node's inspector?), so node could not bind it; start it with --inspect-port=PORT",
                    ),
                    None if at.elapsed() > WAIT => self.fail(
                        "no new inspector port within 10 s of SIGUSR1 (an inspector already open on another port than 9229 is not looked for)",
                    ),
                    None => {}
                }
            }
            Phase::Sampling(_) | Phase::Done => {}
        }
    }

    /// At attach (a running Node process): open the inspector and start sampling now, waiting
    /// for the inspector to listen (at most [`WAIT`], polled every 20 ms), so the profile covers
    /// the recording from its start rather than from the first poll after the session's first
    /// checkpoints (seconds on node's large executable).
    pub fn start_at_attach(&mut self) {
        self.tick();
        while matches!(self.phase, Phase::Signalled(..)) && !crate::stopping::signalled() {
            std::thread::sleep(Duration::from_millis(20));
            self.tick();
        }
    }

    fn fail(&mut self, why: &str) {
        self.census.errors.push(why.to_string());
        self.phase = Phase::Done;
    }

    fn start(&mut self, port: u16) {
        if self.opened {
            self.opened_port = Some(port);
            match InspectorGuard::start(self.pid, port) {
                Ok(g) => self.guard = Some(g),
                Err(e) => {
                    self.fail(&format!("{e}: the inspector is not used (it could be left open)"));
                    self.close();
                    return;
                }
            }
        }
        let r = connect(self.pid, port).and_then(|ws| {
            self.ws = Some(ws);
            self.call("HeapProfiler.startSampling", json!({ "samplingInterval": SAMPLING_INTERVAL }))
        });
        match r {
            Ok(_) => {
                self.phase = Phase::Sampling(Instant::now());
                if let Some(max) = self.snapshot_max {
                    self.first_snapshot(max);
                }
            }
            Err(e) => {
                self.fail(&format!("inspector on port {port}: {e}"));
                self.close();
            }
        }
    }

    /// One protocol call whose answer comes as `event`s with a `chunk` each (a heap snapshot):
    /// the chunks joined, at most `cap` bytes of them, waiting at most `wait` in all.
    pub(super) fn call_collect(
        &mut self,
        method: &str,
        params: Value,
        event: &str,
        (wait, cap): (Duration, usize),
    ) -> Result<Collected, String> {
        let id = self.next_id;
        self.next_id += 1;
        let ws = self.ws.as_mut().ok_or("not connected")?;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        ws.send(tungstenite::Message::text(msg)).map_err(|e| format!("{method}: {e}"))?;
        let sent = Instant::now();
        let deadline = crate::stopping::cap(sent + wait);
        let mut out = Collected { text: String::new(), first_s: None, chunks: 0 };
        while Instant::now() < deadline {
            let Some(v) = read_json(ws, method)? else { continue };
            if v["method"] == event {
                out.first_s.get_or_insert_with(|| sent.elapsed().as_secs_f64());
            }
            if out.absorb(&v, method, event, id, cap)? {
                return Ok(out);
            }
        }
        Err(format!("{method}: no answer within {} s", wait.as_secs()))
    }

    /// One protocol call: its `result`, events before it skipped.
    pub(super) fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let ws = self.ws.as_mut().ok_or("not connected")?;
        call_ws(ws, id, method, params, crate::stopping::cap(Instant::now() + WAIT))
    }

    /// End of the recording: read the profile (when sampling and the process runs), stop
    /// sampling, close what leaktrace opened. `now_s`: seconds since the recording's start.
    pub fn finish(&mut self, alive: bool, now_s: &dyn Fn() -> f64) {
        if let Phase::Sampling(since) = self.phase {
            // The session's t_s of a poll may be stale by a slow checkpoint: the real clock.
            let t0 = now_s() - since.elapsed().as_secs_f64();
            if !alive {
                self.census.errors.push("the process ended before the sampling profile was read".into());
            } else {
                if let Some(max) = self.snapshot_max {
                    self.second_snapshot(max, now_s);
                }
                let clock = Instant::now();
                match self.call("HeapProfiler.getSamplingProfile", json!({})) {
                    Ok(p) => {
                        let taken = Taken { t_s: now_s(), took_s: clock.elapsed().as_secs_f64(), units_of_work: None };
                        self.census.end = Some(sampling(&p["profile"], taken, t0));
                    }
                    Err(e) => self.census.errors.push(e),
                }
                let _ = self.call("HeapProfiler.stopSampling", json!({}));
            }
        }
        self.phase = Phase::Done;
        self.close();
    }

    /// Disconnect; an inspector leaktrace opened is closed (its port checked afterwards), and
    /// its guardian told so (else the guardian tries once leaktrace is gone).
    fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if self.opened && self.ws.is_some() {
            let r = self.call("Runtime.evaluate", json!({ "expression": CLOSE, "includeCommandLineAPI": true }));
            if let Err(e) = r {
                self.census.errors.push(format!("the inspector leaktrace opened may still listen: {e}"));
            }
        }
        if let Some(mut ws) = self.ws.take() {
            let _ = ws.close(None);
            let _ = ws.flush();
        }
        if let Some(port) = self.opened_port {
            let deadline = crate::stopping::cap(Instant::now() + Duration::from_secs(3));
            while listening_ports(self.pid).contains(&port) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if listening_ports(self.pid).contains(&port) {
                self.census.errors.push(format!(
                    "the inspector leaktrace opened still listens on port {port} (its guardian closes it once leaktrace ends)"
                ));
                drop(self.guard.take());
            } else if let Some(g) = self.guard.take() {
                g.closed();
            }
        }
    }
}

impl Drop for NodeCensus {
    /// An inspector leaktrace opened is closed on every way out (an error, a panic unwinding).
    fn drop(&mut self) {
        if self.opened {
            self.close();
        }
    }
}

/// Closes the inspector from inside: `require` exists only while the command-line API
/// evaluates: taken then, used a moment later (once leaktrace disconnected: close() waits for
/// the sessions); every failure caught, so nothing can throw into the target.
const CLOSE: &str = "((r) => setTimeout(() => { try { r('inspector').close(); } catch (e) {} }, 50))(\
                     typeof require === 'function' ? require : (p) => process.mainModule.require(p))";

/// The next message on `ws` as JSON: None when the short read timed out or the message is not
/// JSON text (the caller looks at its deadline and reads again); an error when the connection
/// failed (`method` names the call in it).
fn read_json(ws: &mut Ws, method: &str) -> Result<Option<Value>, String> {
    match ws.read() {
        Ok(m) => Ok(m.into_text().ok().and_then(|text| serde_json::from_str::<Value>(text.as_str()).ok())),
        Err(tungstenite::Error::Io(e))
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            Ok(None)
        }
        Err(e) => Err(format!("{method}: {e}")),
    }
}

/// One protocol call on `ws` until `deadline`: its `result`, events before it skipped.
fn call_ws(ws: &mut Ws, id: u64, method: &str, params: Value, deadline: Instant) -> Result<Value, String> {
    let msg = json!({ "id": id, "method": method, "params": params }).to_string();
    ws.send(tungstenite::Message::text(msg)).map_err(|e| format!("{method}: {e}"))?;
    while Instant::now() < deadline {
        let Some(v) = read_json(ws, method)? else { continue };
        if v["id"] == id {
            if let Some(e) = v.get("error") {
                return Err(format!("{method}: {}", e["message"].as_str().unwrap_or("error")));
            }
            return Ok(v["result"].clone());
        }
    }
    Err(format!("{method}: no answer in time"))
}

/// Close the inspector of `pid` listening on `port` (the guardian's work once leaktrace is
/// gone), by `deadline`: Ok(false) when it no longer listened, Ok(true) once closed.
pub(super) fn close_inspector(pid: u32, port: u16, deadline: Instant) -> Result<bool, String> {
    if !listening_ports(pid).contains(&port) {
        return Ok(false);
    }
    let mut ws = connect(pid, port)?;
    call_ws(&mut ws, 1, "Runtime.evaluate", json!({ "expression": CLOSE, "includeCommandLineAPI": true }), deadline)?;
    let _ = ws.close(None);
    let _ = ws.flush();
    drop(ws);
    while listening_ports(pid).contains(&port) {
        if Instant::now() >= deadline {
            return Err("it still listens".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(true)
}

/// The guardian's hidden subcommand ([`super::guard`]): `leaktrace __node-inspector-guard
/// PID PORT START_TIME`.
pub const GUARD_SUBCOMMAND: &str = "__node-inspector-guard";

/// The agent's side of the guardian of an inspector leaktrace opened ([`super::guard`]): its
/// pipe.
pub(super) struct InspectorGuard {
    child: std::process::Child,
    pipe: Option<std::process::ChildStdin>,
}

impl InspectorGuard {
    /// Start the guardian of the inspector of `pid` on `port`. Errors: no such program, fork.
    pub(super) fn start(pid: u32, port: u16) -> Result<InspectorGuard, String> {
        let start_time = start_time(pid).ok_or("the target is gone")?;
        use std::os::unix::process::CommandExt as _;
        let mut cmd = std::process::Command::new("/proc/self/exe");
        cmd.args([GUARD_SUBCOMMAND, &pid.to_string(), &port.to_string(), &start_time.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: setsid(2) is async-signal-safe; it only detaches the child from the
        // terminal's process group.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot start the inspector's guardian: {e}"))?;
        let pipe = child.stdin.take();
        Ok(InspectorGuard { child, pipe })
    }

    /// The agent closed the inspector itself: the guardian ends without doing anything.
    pub(super) fn closed(mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"closed\n");
        }
        self.reap();
    }

    /// Wait for the guardian a moment (it ends at once after `closed`, or once it closed the
    /// inspector); one still working is left to finish on its own.
    fn reap(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for InspectorGuard {
    fn drop(&mut self) {
        // The pipe ends without `closed`: the guardian closes the inspector.
        drop(self.pipe.take());
    }
}

/// The start time of `pid` (field 22 of /proc/PID/stat, clock ticks since boot).
pub(super) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` catches SIGUSR1 (`SigCgt` of /proc/PID/status).
fn catches_sigusr1(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("SigCgt:")).and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGUSR1 - 1)) != 0)
}

/// The TCP ports listened on in `pid`'s network namespace, each with its socket's inode and
/// whether it is reached through 127.0.0.1 (bound to 127.0.0.1 or 0.0.0.0) (/proc/PID/net/tcp
/// and tcp6 show the whole namespace).
fn namespace_listeners(pid: u32) -> Vec<(u16, String, bool)> {
    let mut out = Vec::new();
    for f in ["tcp", "tcp6"] {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default();
        for l in table.lines().skip(1) {
            let c: Vec<&str> = l.split_whitespace().collect();
            if c.len() > 9
                && c[3] == "0A"
                && let Some(p) = c[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                let loopback = f == "tcp" && matches!(c[1].split(':').next(), Some("0100007F" | "00000000"));
                out.push((p, c[9].to_string(), loopback));
            }
        }
    }
    out
}

/// The TCP ports `pid` itself listens on through 127.0.0.1 (the namespace's listeners bound to
/// 127.0.0.1 or 0.0.0.0 whose socket is one of its file descriptors), sorted.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut ports: Vec<u16> = namespace_listeners(pid)
        .into_iter()
        .filter(|(_, inode, lo)| *lo && inodes.contains(inode))
        .map(|(p, ..)| p)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Some socket of `pid`'s network namespace that is not `pid`'s listens on TCP `port`.
fn port_taken_by_another(pid: u32, port: u16) -> bool {
    !listening_ports(pid).contains(&port) && namespace_listeners(pid).iter().any(|(p, ..)| *p == port)
}

/// A TCP connection to 127.0.0.1:`port` in the network namespace of `pid` (from a thread that
/// joins it; the socket keeps it).
fn connect_tcp(pid: u32, port: u16) -> Result<TcpStream, String> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("its network namespace: {e}"))?;
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd as _;
        // SAFETY: setns on this short-lived thread only; the fd is valid for the call.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| format!("connect: {e}"))?;
        // Short reads: the caller's deadline (cut short by a signal) is looked at between them.
        s.set_read_timeout(Some(Duration::from_millis(500))).map_err(|e| e.to_string())?;
        Ok(s)
    })
    .join()
    .map_err(|_| "connecting thread panicked".to_string())?
}

/// The inspector's WebSocket: its target's URL from `/json/list`, then the handshake.
fn connect(pid: u32, port: u16) -> Result<Ws, String> {
    let deadline = Instant::now() + WAIT;
    let mut s = connect_tcp(pid, port)?;
    s.write_all(b"GET /json/list HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let reply = read_http(&mut s, deadline)?;
    let url = super::cdp::ws_url(reply.as_bytes())?;
    let mut shake = tungstenite::client(url.as_str(), connect_tcp(pid, port)?);
    let ws = loop {
        match shake {
            Ok((ws, _)) => break ws,
            Err(tungstenite::HandshakeError::Interrupted(mid)) if Instant::now() < crate::stopping::cap(deadline) => {
                shake = mid.handshake();
            }
            Err(tungstenite::HandshakeError::Interrupted(_)) => return Err("WebSocket: no handshake in time".into()),
            Err(tungstenite::HandshakeError::Failure(e)) => return Err(format!("WebSocket: {e}")),
        }
    };
    // Short reads: a call's own deadline (cut short by a signal) is looked at between them.
    ws.get_ref().set_read_timeout(Some(Duration::from_millis(500))).map_err(|e| e.to_string())?;
    Ok(ws)
}

/// The answer to an HTTP request on `s` (until the inspector closes it), at most
/// [`MAX_HTTP`] bytes, by `deadline` (sooner once a signal ends the recording).
fn read_http(s: &mut TcpStream, deadline: Instant) -> Result<String, String> {
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if reply.len() + n > MAX_HTTP => return Err(format!("/json/list: over {MAX_HTTP} bytes")),
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if http_complete(&reply) {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("/json/list: {e}")),
        }
        if Instant::now() >= crate::stopping::cap(deadline) {
            return Err("/json/list: no whole answer in time".into());
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Whether `reply` holds a whole HTTP answer: its headers and `Content-Length` bytes after them
/// (the inspector may keep the connection open after answering).
fn http_complete(reply: &[u8]) -> bool {
    let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase();
    let length = head.lines().find_map(|l| l.strip_prefix("content-length:")?.trim().parse::<usize>().ok());
    length.is_some_and(|n| reply.len() - (end + 4) >= n)
}

/// Most bytes of the inspector's HTTP answer read (`/json/list` names one target).
const MAX_HTTP: usize = 1 << 20;

/// One frame of a sampling profile: function, script URL, line (1-based).
type JsFrame = (String, String, u32);

/// The program's frame of an allocation stack (innermost first): the first with a script that is
/// not Node's own library (`node:buffer`), else the innermost.
fn program_frame(stack: &[JsFrame]) -> &JsFrame {
    stack.iter().find(|f| !f.1.is_empty() && !f.1.starts_with("node:")).unwrap_or(&stack[0])
}

/// A sampling profile (`{head: {callFrame, selfSize, children}}`) by the program's allocating
/// function ([`program_frame`]).
pub(crate) fn sampling(profile: &Value, taken: Taken, started_t_s: f64) -> JsSampling {
    let mut by: std::collections::HashMap<JsFrame, (u64, u64, Vec<String>)> = Default::default();
    let mut total: u64 = 0;
    let mut todo: Vec<(&Value, Vec<JsFrame>)> = vec![(&profile["head"], Vec::new())];
    while let Some((n, mut stack)) = todo.pop() {
        let f = &n["callFrame"];
        let name = f["functionName"].as_str().filter(|s| !s.is_empty()).unwrap_or("(anonymous)").to_string();
        let line = f["lineNumber"].as_i64().unwrap_or(-1).saturating_add(1).clamp(0, u32::MAX as i64) as u32;
        stack.insert(0, (name, f["url"].as_str().unwrap_or("").to_string(), line));
        let size = n["selfSize"].as_u64().unwrap_or(0);
        total = total.saturating_add(size);
        if size > 0 {
            let e = by.entry(program_frame(&stack).clone()).or_default();
            e.0 = e.0.saturating_add(size);
            if size > e.1 {
                e.1 = size;
                e.2 = stack.iter().take(12).map(|f| f.0.clone()).collect();
            }
        }
        for c in n["children"].as_array().into_iter().flatten() {
            todo.push((c, stack.clone()));
        }
    }
    let mut functions: Vec<JsFunction> = by
        .into_iter()
        .map(|((function, url, line), (live_bytes, _, stack))| JsFunction { function, url, line, live_bytes, stack })
        .collect();
    functions.sort_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then_with(|| a.function.cmp(&b.function)));
    functions.truncate(MAX_FUNCTIONS);
    JsSampling { taken, started_t_s, sampling_interval: SAMPLING_INTERVAL, functions, total_bytes: total }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampling_profile_by_function() {
        let p = json!({ "head": { "callFrame": { "functionName": "(root)", "url": "", "lineNumber": -1 }, "selfSize": 0, "children": [
            { "callFrame": { "functionName": "tick", "url": "file:///a.js", "lineNumber": 29 }, "selfSize": 100, "children": [
                { "callFrame": { "functionName": "recordAudit", "url": "file:///a.js", "lineNumber": 14 }, "selfSize": 0, "children": [
                    { "callFrame": { "functionName": "slice", "url": "node:buffer", "lineNumber": 661 }, "selfSize": 4000, "children": [] }
                ] },
                { "callFrame": { "functionName": "", "url": "file:///a.js", "lineNumber": 3 }, "selfSize": 50, "children": [] }
            ] }
        ] } });
        let s = sampling(&p, Taken::default(), 1.0);
        assert_eq!(s.total_bytes, 4150);
        assert_eq!(s.functions[0].function, "recordAudit");
        assert_eq!(s.functions[0].line, 15);
        assert_eq!(s.functions[0].stack, ["slice", "recordAudit", "tick", "(root)"]);
        assert_eq!(s.functions[2].function, "(anonymous)");
        assert!(listening_ports(std::process::id()).is_empty(), "the test process listens on nothing");
    }
}
