//! `--push URL`: send the heap profile of a recording to a profile store while recording
//! (every `--push-interval`) and at its end.
//!
//! Format: Pyroscope's ingest API (`POST URL/ingest?name=NAME{LABELS}&from=S&until=S&format=pprof`,
//! a `multipart/form-data` body with the fields `profile` (the gzipped pprof heap profile of
//! [`leaktrace_analysis::report::pprof::heap_profile`]), `prev_profile` (the one sent before for that
//! process, or an empty profile) and `sample_type_config` (JSON: `inuse_objects`/`inuse_space`
//! are snapshots, aggregated by average; `alloc_objects`/`alloc_space` are cumulative since
//! attach, so the server takes the difference with `prev_profile`). `from`/`until` are Unix
//! seconds: the last accepted push of that process (or the start of the recording) and now.
//! One request per traced process; its labels are the `--push-label`s and `pid`.
//!
//! The growth profile (growth.pb.gz) follows each accepted heap-profile push when it has
//! samples: to Pyroscope as a second request with [`GROWTH_SAMPLE_TYPE_CONFIG`] (snapshots, an
//! empty `prev_profile`), to Parca with `__name__` [`PARCA_GROWTH`].
//!
//! Parca (`--push-format parca`): `ProfileStoreService.WriteRaw` through the HTTP/JSON route
//! Parca serves next to gRPC (grpc-gateway, `POST URL/profiles/writeraw`, the mapping declared
//! in Parca's `profilestore.proto`): `{"normalized": false, "series": [{"labels": {"labels":
//! [{"name", "value"}, ...]}, "samples": [{"rawProfile": BASE64}]}]}`, the raw sample being the
//! gzipped heap profile with `time_nanos` set to the snapshot's time (Parca stores a profile at
//! that timestamp). Labels: `__name__` = `memory` (Parca's name for heap profiles), `job` = the
//! application name, the `--push-label`s (a '.' in a key becomes '_', as Prometheus label
//! names allow) and `pid`. Addresses are not normalized: the mappings carry start, limit and
//! file offset.
//!
//! Transport: `http://` or `https://` (ureq over rustls; the server's certificate is checked
//! against the system's roots, from the usual files and directories of the distribution, plus
//! `--push-ca FILE`). Authentication, as the stores expect it: `--push-token-file FILE` sends
//! `Authorization: Bearer TOKEN` (Parca Agent's `--remote-store-bearer-token-file`, Polar
//! Signals, an authenticating proxy in front of Pyroscope), `--push-basic-auth-file FILE`
//! (`USER:PASSWORD` on one line) sends `Authorization: Basic ...` (Grafana Cloud Profiles: the
//! instance ID and an access token). The file is read again at every push (a rotated Kubernetes
//! secret is picked up) and refused when users other than its owner may write it, when its
//! owner is neither root nor leaktrace's user, or when it is not one line. A credential is never
//! sent in clear: with `http://`, only to a loopback address. Redirects are not followed.
//!
//! Pushing never stops or slows the recording: profiles are built and sent by one worker
//! thread; the recording hands it a snapshot without waiting (a snapshot is skipped while the
//! worker is still busy with the previous one). A failed request (connection error, timeout,
//! non-2xx status) is reported on stderr and retried with exponential back-off
//! ([`RETRY_DELAYS`]); at the end of the recording the last push is waited for, at most
//! [`FINAL_WAIT`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod credentials;

pub use credentials::PushAuth;
use credentials::{agent, authorization, parse_basic_auth_file, parse_ca_file, parse_token_file};

use leaktrace_analysis::analyze::{AnalyzeOptions, analyze};
use leaktrace_analysis::recording::Recording;
use leaktrace_analysis::report::pprof;

/// Waits between attempts of one push: after the first failure 0.5 s, then 1, 2, 4 and 8 s;
/// after the last retry the push is given up (and said so).
pub const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];
/// Longest the end of a recording waits for the last push (with its retries).
pub const FINAL_WAIT: Duration = Duration::from_secs(30);

/// The profile store's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushFormat {
    /// Pyroscope's HTTP ingest API (also Grafana Alloy's `pyroscope.receive_http`).
    Pyroscope,
    /// Parca's `WriteRaw`, through its HTTP/JSON route `/profiles/writeraw`.
    Parca,
}

/// What `--push` and its options ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct PushConfig {
    /// Base URL of the store (`http://host:port[/prefix]`); `/ingest` (Pyroscope) or
    /// `/profiles/writeraw` (Parca) is appended.
    pub url: PushUrl,
    pub format: PushFormat,
    /// Application name (Pyroscope's `name`, `service_name` in Grafana). None: the target's
    /// executable name.
    pub name: Option<String>,
    /// `--push-label key=value`, in the order given.
    pub labels: Vec<(String, String)>,
    /// Push every this long while recording; None: only at the end.
    pub interval: Option<Duration>,
    /// The credential sent with every request (`--push-token-file`, `--push-basic-auth-file`).
    pub auth: Option<PushAuth>,
    /// `--push-ca FILE`: a PEM file of CA certificates trusted besides the system's roots.
    pub ca: Option<PathBuf>,
}

/// The `--push*` options of `record` (flattened into its arguments).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PushArgs {
    /// Send the heap profile (profile.pb.gz) to this profile store at the end of the recording
    /// and every --push-interval: http[s]://HOST[:PORT][/PATH] of a Pyroscope server
    /// (POST PATH/ingest) or, with --push-format parca, of a Parca server (POST
    /// PATH/profiles/writeraw, e.g. http://parca:7070). Failures are reported and retried; they
    /// never stop the recording.
    #[arg(long, value_name = "URL")]
    pub push: Option<PushUrl>,
    /// Protocol of the store (pyroscope: its HTTP ingest API; parca: WriteRaw over HTTP/JSON).
    #[arg(long, value_enum, default_value = "pyroscope", requires = "push")]
    pub push_format: PushFormatArg,
    /// A label of the pushed profiles, KEY=VALUE (repeatable); `pid` is always added.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_label, requires = "push")]
    pub push_label: Vec<(String, String)>,
    /// Application name of the pushed profiles (default: the target's executable name).
    #[arg(long, value_name = "NAME", value_parser = parse_name, requires = "push")]
    pub push_name: Option<String>,
    /// Also push every this long while recording (e.g. 1m, 15s; at least 1s). Default: only at
    /// the end.
    #[arg(long, value_name = "D", value_parser = parse_interval, requires = "push")]
    pub push_interval: Option<Duration>,
    /// Send `Authorization: Bearer TOKEN`, TOKEN the one line of FILE (read at every push;
    /// refused if users other than its owner may write it).
    #[arg(long, value_name = "FILE", value_parser = parse_token_file, requires = "push", conflicts_with = "push_basic_auth_file")]
    pub push_token_file: Option<PathBuf>,
    /// Send `Authorization: Basic ...` from FILE's one line `USER:PASSWORD` (Grafana Cloud:
    /// the instance ID and an access token; read at every push, same checks as
    /// --push-token-file).
    #[arg(long, value_name = "FILE", value_parser = parse_basic_auth_file, requires = "push")]
    pub push_basic_auth_file: Option<PathBuf>,
    /// Also trust the CA certificates of this PEM file for an https:// store (besides the
    /// system's roots).
    #[arg(long, value_name = "FILE", value_parser = parse_ca_file, requires = "push")]
    pub push_ca: Option<PathBuf>,
}

/// `--push-format` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PushFormatArg {
    #[default]
    Pyroscope,
    Parca,
}

impl PushArgs {
    /// The configuration, or None without `--push`. Errors: a credential would go in clear
    /// (http:// to an address that is not a loopback one).
    pub fn config(&self) -> anyhow::Result<Option<PushConfig>> {
        let Some(url) = self.push.clone() else { return Ok(None) };
        let auth = match (&self.push_token_file, &self.push_basic_auth_file) {
            (Some(f), _) => Some(PushAuth::Bearer(f.clone())),
            (None, Some(f)) => Some(PushAuth::Basic(f.clone())),
            (None, None) => None,
        };
        if auth.is_some() && !url.https && !url.is_loopback() {
            anyhow::bail!(
                "--push {}: a credential is sent over https:// only (or http:// to a loopback address)",
                url.text
            );
        }
        if self.push_ca.is_some() && !url.https {
            anyhow::bail!("--push-ca is for an https:// store, and --push is {}", url.text);
        }
        Ok(Some(PushConfig {
            url,
            format: match self.push_format {
                PushFormatArg::Pyroscope => PushFormat::Pyroscope,
                PushFormatArg::Parca => PushFormat::Parca,
            },
            name: self.push_name.clone(),
            labels: self.push_label.clone(),
            interval: self.push_interval,
            auth,
            ca: self.push_ca.clone(),
        }))
    }
}

/// `--push-interval`: a duration of at least 1 s.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 1m)"))?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s} is shorter than the smallest push interval, 1s"));
    }
    Ok(d)
}

/// `--push-name`: letters, digits, '-', '_', '.'.
fn parse_name(s: &str) -> Result<String, String> {
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(format!("{s:?}: the name must be letters, digits, '-', '_' or '.'"));
    }
    Ok(s.to_string())
}

/// A parsed `http[s]://host[:port][/path]` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushUrl {
    /// As given, for messages.
    pub text: String,
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing '/' ("" for none).
    pub path: String,
}

impl std::str::FromStr for PushUrl {
    type Err = String;
    /// Errors: not `http://` or `https://`, no host, a bad port.
    fn from_str(s: &str) -> Result<PushUrl, String> {
        let (https, rest) = if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(format!("{s}: expected http[s]://HOST[:PORT][/PATH]"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.contains(['@', '?', '#']) || path.contains(['?', '#']) {
            return Err(format!("{s}: no user, query or fragment in the URL (see --push-basic-auth-file)"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                (h, p.parse::<u16>().map_err(|_| format!("{s}: bad port {p:?}"))?)
            }
            _ => (authority, if https { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(format!("{s}: no host"));
        }
        Ok(PushUrl { text: s.to_string(), https, host: host.to_string(), port, path: path.to_string() })
    }
}

impl PushUrl {
    /// `scheme://host:port/path` followed by `rest` (`/ingest?...`).
    fn with(&self, rest: &str) -> String {
        format!("{}://{}:{}{}{rest}", if self.https { "https" } else { "http" }, self.host, self.port, self.path)
    }

    /// The host is a loopback address (`localhost`, 127.0.0.0/8, `[::1]`).
    pub fn is_loopback(&self) -> bool {
        let h = self.host.trim_start_matches('[').trim_end_matches(']');
        h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
    }
}

/// Parse `--push-label KEY=VALUE`: KEY is `[A-Za-z_][A-Za-z0-9_.]*`, VALUE is not empty and has
/// none of `{},="` (they delimit Pyroscope's `name{labels}`).
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    let key_ok = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !key_ok {
        return Err(format!("{s:?}: the key must be letters, digits, '_' or '.', not starting with a digit"));
    }
    if v.is_empty() || v.chars().any(|c| "{},=\"".contains(c) || c.is_control()) {
        return Err(format!("{s:?}: the value must be non-empty and without {{ }} , = \""));
    }
    if k == "pid" {
        return Err(format!("{s:?}: the label pid is set by leaktrace"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Labels of one process added to the `--push-label`s of its profiles, by PID (`watch`: its
/// pod, namespace and container); called by the push worker, once per process and push.
pub type LabelsOf = Arc<dyn Fn(u32) -> Vec<(String, String)> + Send + Sync>;

/// One hand-over to the worker: the recordings (one per process) as they are now.
struct Job {
    recordings: Vec<Recording>,
    /// Unix time of this snapshot, s.
    until_s: u64,
}

/// The push worker of one recording. Dropping it without [`Pusher::finish`] lets the worker
/// end after its current job.
#[derive(Debug)]
pub struct Pusher {
    cfg: PushConfig,
    tx: Option<SyncSender<Job>>,
    done: Receiver<()>,
    next: Option<Instant>,
    /// Set by the worker from taking a job until it is sent (or given up).
    busy: Arc<AtomicBool>,
    /// Snapshots skipped because the worker was busy.
    skipped: u64,
    started_unix_ms: u64,
}

impl Pusher {
    /// Start the worker thread. `started_unix_ms` is the start of the recording (the `from` of
    /// the first push).
    pub fn start(cfg: PushConfig, started_unix_ms: u64) -> Pusher {
        Pusher::start_labelled(cfg, started_unix_ms, None)
    }

    /// [`Pusher::start`], each process's profiles also labelled with what `labels` gives for
    /// its PID (after the `--push-label`s, before `pid`).
    pub fn start_labelled(cfg: PushConfig, started_unix_ms: u64, labels: Option<LabelsOf>) -> Pusher {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(1);
        let (done_tx, done) = std::sync::mpsc::channel();
        let worker_cfg = cfg.clone();
        let busy = Arc::new(AtomicBool::new(false));
        let worker_busy = busy.clone();
        std::thread::Builder::new()
            .name("leaktrace-push".into())
            .spawn(move || {
                let agent = agent(worker_cfg.url.https, worker_cfg.ca.as_deref());
                let mut w =
                    Worker { cfg: worker_cfg, from_s: started_unix_ms / 1000, prev: HashMap::new(), labels, agent };
                while let Ok(job) = rx.recv() {
                    worker_busy.store(true, Ordering::SeqCst);
                    w.push(job);
                    worker_busy.store(false, Ordering::SeqCst);
                }
                let _ = done_tx.send(());
            })
            .expect("spawn the push thread");
        let next = cfg.interval.map(|d| Instant::now() + d);
        Pusher { cfg, tx: Some(tx), done, next, busy, skipped: 0, started_unix_ms }
    }

    /// Start of the recording, Unix time in ms (as given to [`Pusher::start`]).
    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    /// True when a periodic push is due (`--push-interval` elapsed since the last one).
    pub fn due(&self) -> bool {
        self.next.is_some_and(|n| Instant::now() >= n)
    }

    /// Hand a periodic snapshot to the worker without waiting: skipped when the worker is still
    /// busy. `snapshot` is only called when the worker can take it.
    pub fn tick(&mut self, snapshot: impl FnOnce() -> Vec<Recording>) {
        if let (Some(n), Some(d)) = (self.next.as_mut(), self.cfg.interval) {
            *n = Instant::now() + d;
        }
        let Some(tx) = &self.tx else { return };
        if self.busy.load(Ordering::SeqCst) {
            self.skipped += 1;
            return;
        }
        let job = Job { recordings: snapshot(), until_s: unix_now_s() };
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.skipped += 1,
            Err(TrySendError::Disconnected(_)) => self.tx = None,
        }
    }

    /// The final push: hand over `recordings` (waiting for the worker to take them) and wait for
    /// the worker to finish, at most [`FINAL_WAIT`]. What could not be sent is said on stderr.
    pub fn finish(mut self, recordings: Vec<Recording>) {
        let deadline = Instant::now() + FINAL_WAIT;
        if let Some(tx) = self.tx.take() {
            // The queue may still hold a periodic snapshot while the worker retries an older
            // one: wait for room, but not past the deadline.
            let mut job = Job { recordings, until_s: unix_now_s() };
            loop {
                match tx.try_send(job) {
                    Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                    Err(TrySendError::Full(j)) if Instant::now() < deadline => {
                        job = j;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(TrySendError::Full(_)) => break,
                }
            }
            drop(tx);
        }
        if self.skipped > 0 {
            crate::note!(
                "leaktrace: push: {} periodic push(es) skipped while an earlier one was still being sent",
                self.skipped
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if self.done.recv_timeout(left).is_err() {
            crate::note!(
                "leaktrace: warning: push to {}: not finished after {} s, given up (the profiles are in the output directory)",
                self.cfg.url.text,
                FINAL_WAIT.as_secs()
            );
        }
    }
}

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The worker's state: the window start and the last profile sent per process.
struct Worker {
    cfg: PushConfig,
    /// Start of the recording, Unix s: the `from` of a process's first push.
    from_s: u64,
    /// Per process: the last profile the store accepted, and the `until` it was sent with (the
    /// next push's `from`, so a failed push widens the next window instead of leaving a gap).
    prev: HashMap<u32, (Vec<u8>, u64)>,
    /// Labels per process besides the `--push-label`s.
    labels: Option<LabelsOf>,
    /// The HTTP client, or why there is none (every push fails with that).
    agent: Result<ureq::Agent, String>,
}

impl Worker {
    fn push(&mut self, job: Job) {
        for rec in &job.recordings {
            let extra = self.labels.as_ref().map(|f| f(rec.target.pid)).unwrap_or_default();
            let labelled;
            let cfg = if extra.is_empty() {
                &self.cfg
            } else {
                labelled = PushConfig { labels: [self.cfg.labels.clone(), extra].concat(), ..self.cfg.clone() };
                &labelled
            };
            let a = analyze(rec, &AnalyzeOptions::default());
            let mut growth = pprof::growth_profile(rec, &a);
            if cfg.format == PushFormat::Parca {
                let mut heap = pprof::heap_profile(rec, &a);
                // Snapshots at `until`: Parca stores a profile at its timestamp.
                let t = i64::try_from(job.until_s).unwrap_or(0).saturating_mul(1_000_000_000);
                heap.time_nanos = t;
                growth.time_nanos = t;
                if send_with_retries(&self.agent, cfg, &parca_request(cfg, rec, PARCA_HEAP, &pprof::encode_gz(&heap)))
                    && !growth.sample.is_empty()
                {
                    send_with_retries(
                        &self.agent,
                        cfg,
                        &parca_request(cfg, rec, PARCA_GROWTH, &pprof::encode_gz(&growth)),
                    );
                }
                continue;
            }
            let profile = pprof::encode_gz(&pprof::heap_profile(rec, &a));
            let (prev, from_s) =
                self.prev.get(&rec.target.pid).cloned().unwrap_or_else(|| (empty_profile(&profile), self.from_s));
            let until_s = job.until_s.max(from_s + 1);
            let request = ingest_request(cfg, rec, from_s, until_s, &profile, &prev, SAMPLE_TYPE_CONFIG);
            if !send_with_retries(&self.agent, cfg, &request) {
                continue;
            }
            self.prev.insert(rec.target.pid, (profile, until_s));
            // The growth profile: a snapshot of what grew over the steady window so far.
            if !growth.sample.is_empty() {
                let growth = pprof::encode_gz(&growth);
                let empty = empty_profile(&growth);
                let request = ingest_request(cfg, rec, from_s, until_s, &growth, &empty, GROWTH_SAMPLE_TYPE_CONFIG);
                send_with_retries(&self.agent, cfg, &request);
            }
        }
    }
}

/// A profile with the sample types of `profile` and no sample (the `prev_profile` of a first
/// push).
fn empty_profile(profile: &[u8]) -> Vec<u8> {
    match pprof::decode(profile) {
        Ok(mut p) => {
            p.sample.clear();
            p.location.clear();
            p.function.clear();
            p.mapping.clear();
            pprof::encode_gz(&p)
        }
        Err(_) => Vec::new(),
    }
}

/// `sample_type_config` of a heap profile: in-use values are snapshots (averaged over time),
/// alloc values cumulative since attach (the server subtracts `prev_profile`).
pub const SAMPLE_TYPE_CONFIG: &str = r#"{"alloc_objects":{"units":"objects","cumulative":true},"alloc_space":{"units":"bytes","cumulative":true},"inuse_objects":{"units":"objects","aggregation":"average"},"inuse_space":{"units":"bytes","aggregation":"average"}}"#;

/// `sample_type_config` of a growth profile (growth.pb.gz): both values are snapshots.
pub const GROWTH_SAMPLE_TYPE_CONFIG: &str = r#"{"growth_objects":{"units":"objects","aggregation":"average"},"growth_space":{"units":"bytes","aggregation":"average"}}"#;

/// Parca's `__name__` of the heap profile (the name Parca gives heap profiles it scrapes).
pub const PARCA_HEAP: &str = "memory";
/// Parca's `__name__` of the growth profile.
pub const PARCA_GROWTH: &str = "memory_growth";

/// Percent-encode for a query string value.
fn urlencode(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => o.push(b as char),
            _ => o.push_str(&format!("%{b:02X}")),
        }
    }
    o
}

/// The application name: `--push-name`, else the target executable's name (characters other
/// than letters, digits, '-', '_', '.' replaced by '_'; "leaktrace" if nothing is left).
fn app_base_name(cfg: &PushConfig, rec: &Recording) -> String {
    cfg.name.clone().unwrap_or_else(|| {
        let base = leaktrace_analysis::analyze::basename(&rec.target.exe);
        let clean: String =
            base.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
        if clean.is_empty() { "leaktrace".into() } else { clean }
    })
}

/// Pyroscope's application name `NAME{k=v,...,pid=PID}`.
pub fn app_name(cfg: &PushConfig, rec: &Recording) -> String {
    let name = app_base_name(cfg, rec);
    let mut labels: Vec<String> = cfg.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.push(format!("pid={}", rec.target.pid));
    format!("{name}{{{}}}", labels.join(","))
}

/// A POST request: where to (after the URL's path prefix), its content type and body.
struct Request {
    /// `/ingest?...`, `/profiles/writeraw`.
    target: String,
    content_type: String,
    body: Vec<u8>,
}

fn ingest_request(
    cfg: &PushConfig,
    rec: &Recording,
    from_s: u64,
    until_s: u64,
    profile: &[u8],
    prev: &[u8],
    sample_type_config: &str,
) -> Request {
    let boundary = format!("leaktrace-{:016x}{:08x}", unix_now_s(), std::process::id());
    let mut body = Vec::with_capacity(profile.len() + prev.len() + 1024);
    let mut part = |name: &str, file: &str, ctype: &str, data: &[u8]| {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: {ctype}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    };
    part("profile", "profile.pprof", "application/octet-stream", profile);
    part("prev_profile", "profile.pprof", "application/octet-stream", prev);
    part("sample_type_config", "sample_type_config.json", "application/json", sample_type_config.as_bytes());
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let query = format!(
        "name={}&from={from_s}&until={until_s}&format=pprof&spyName=leaktrace&units=bytes",
        urlencode(&app_name(cfg, rec))
    );
    Request {
        target: format!("/ingest?{query}"),
        content_type: format!("multipart/form-data; boundary={boundary}"),
        body,
    }
}

/// Parca's labels of a process's series: `__name__` (`name`: [`PARCA_HEAP`] or
/// [`PARCA_GROWTH`]), `job`, the `--push-label`s ('.' in a key becomes '_') and `pid`.
pub fn parca_labels(cfg: &PushConfig, rec: &Recording, name: &str) -> Vec<(String, String)> {
    let mut labels = vec![("__name__".to_string(), name.to_string()), ("job".to_string(), app_base_name(cfg, rec))];
    labels.extend(cfg.labels.iter().map(|(k, v)| (k.replace('.', "_"), v.clone())));
    labels.push(("pid".to_string(), rec.target.pid.to_string()));
    labels
}

/// The `WriteRaw` request of one profile of one process (JSON, see the module docs); `name` is
/// its `__name__`.
fn parca_request(cfg: &PushConfig, rec: &Recording, name: &str, profile: &[u8]) -> Request {
    use base64::Engine as _;
    let labels: Vec<serde_json::Value> =
        parca_labels(cfg, rec, name).into_iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect();
    let body = serde_json::json!({
        "normalized": false,
        "series": [{
            "labels": {"labels": labels},
            "samples": [{"rawProfile": base64::engine::general_purpose::STANDARD.encode(profile)}],
        }],
    });
    let body = serde_json::to_vec(&body).expect("JSON of strings");
    Request { target: "/profiles/writeraw".into(), content_type: "application/json".into(), body }
}

/// Send `req`, retrying after [`RETRY_DELAYS`]; every failure is said on stderr. True when it
/// was accepted (2xx).
fn send_with_retries(agent: &Result<ureq::Agent, String>, cfg: &PushConfig, req: &Request) -> bool {
    for attempt in 0..=RETRY_DELAYS.len() {
        match agent.as_ref().map_err(String::clone).and_then(|a| send_once(a, cfg, req)) {
            Ok(()) => return true,
            Err(e) => match RETRY_DELAYS.get(attempt) {
                Some(d) => {
                    crate::note!(
                        "leaktrace: warning: push to {} failed: {e}; retry {}/{} in {:.1} s",
                        cfg.url.text,
                        attempt + 1,
                        RETRY_DELAYS.len(),
                        d.as_secs_f64()
                    );
                    std::thread::sleep(*d);
                }
                None => {
                    crate::note!(
                        "leaktrace: warning: push to {} failed: {e}; given up after {} attempts",
                        cfg.url.text,
                        attempt + 1
                    );
                }
            },
        }
    }
    false
}

/// One request; Err says what went wrong (connection, TLS, timeout, status and the start of
/// the body).
fn send_once(agent: &ureq::Agent, cfg: &PushConfig, req: &Request) -> Result<(), String> {
    let mut post = agent.post(cfg.url.with(&req.target)).content_type(req.content_type.as_str());
    if let Some(auth) = &cfg.auth {
        post = post.header("Authorization", authorization(auth)?);
    }
    let mut resp = post.send(&req.body[..]).map_err(|e| format!("{e}"))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    // Only the start of the answer matters.
    let body = resp.body_mut().with_config().limit(64 * 1024).read_to_string().unwrap_or_default();
    let body: String = body.trim().chars().take(200).collect();
    let line = format!("HTTP {} {}", status.as_u16(), status.canonical_reason().unwrap_or(""));
    Err(format!("{}{}", line.trim(), if body.is_empty() { String::new() } else { format!(": {body}") }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small leaking recording (the analysis crate's test fixtures are private to it).
    fn recording() -> Recording {
        let mut rec: Recording = serde_json::from_value(serde_json::json!({
            "format_version": leaktrace_analysis::recording::FORMAT_VERSION, "leaktrace_version": "t",
            "target": {"pid": 4242, "command": ["./server", "--port", "8080"], "exe": "/opt/server/bin/server",
                       "launched": true, "exit_status": 0},
            "mode": "exact", "started_unix_ms": 0, "interval_s": 1.0, "probes": [],
            "stacks": [{"id": 1, "kind": "malloc", "frames": [
                {"addr": 1, "object": "/lib/libc.so.6", "function": "malloc"},
                {"addr": 2, "object": "/opt/server/bin/server", "function": "Session::key"}]}],
            "checkpoints": [], "end_reason": "duration"
        }))
        .unwrap();
        rec.checkpoints = (0..=60u64)
            .map(|t| leaktrace_analysis::recording::Checkpoint {
                t_s: t as f64,
                sites: vec![leaktrace_analysis::recording::SiteSample {
                    stack: 1,
                    alloc_bytes: 1000 * (t + 1),
                    alloc_count: t + 1,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        rec
    }

    #[test]
    fn urls() {
        let u: PushUrl = "http://127.0.0.1:4040".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("127.0.0.1", 4040, ""));
        let u: PushUrl = "http://pyroscope/prefix/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("pyroscope", 80, "/prefix"));
        let u: PushUrl = "https://profiles.example:8443/p".parse().unwrap();
        assert_eq!(
            (u.https, u.port, u.with("/ingest").as_str()),
            (true, 8443, "https://profiles.example:8443/p/ingest")
        );
        assert_eq!("https://x".parse::<PushUrl>().unwrap().port, 443);
        assert!("ftp://x".parse::<PushUrl>().unwrap_err().contains("expected http[s]://"));
        assert!("https://u:p@x".parse::<PushUrl>().unwrap_err().contains("no user"));
        assert!("http://[::1]:9".parse::<PushUrl>().unwrap().is_loopback());
        assert!("http://localhost".parse::<PushUrl>().unwrap().is_loopback());
        assert!(!"http://10.0.0.1".parse::<PushUrl>().unwrap().is_loopback());
        assert!("http://x:99999".parse::<PushUrl>().unwrap_err().contains("bad port"));
        assert!("http://".parse::<PushUrl>().unwrap_err().contains("no host"));
    }

    #[test]
    fn labels_and_name() {
        assert_eq!(parse_label("env=prod").unwrap(), ("env".into(), "prod".into()));
        assert!(parse_label("env").is_err());
        assert!(parse_label("1x=a").is_err());
        assert!(parse_label("x=a,b").is_err());
        assert!(parse_label("x=").is_err());
        assert!(parse_label("pid=3").is_err());
        let cfg = PushConfig {
            url: "http://h:1".parse().unwrap(),
            format: PushFormat::Pyroscope,
            name: None,
            labels: vec![("env".into(), "test".into())],
            interval: None,
            auth: None,
            ca: None,
        };
        let rec = recording();
        let name = app_name(&cfg, &rec);
        assert_eq!(
            name,
            format!("{}{{env=test,pid={}}}", leaktrace_analysis::analyze::basename(&rec.target.exe), rec.target.pid)
        );
        assert_eq!(urlencode("a{b=c,d}"), "a%7Bb%3Dc%2Cd%7D");
    }

    #[test]
    fn request_is_multipart_with_the_profile() {
        let cfg = PushConfig {
            url: "http://127.0.0.1:9/p".parse().unwrap(),
            format: PushFormat::Pyroscope,
            name: Some("app".into()),
            labels: vec![],
            interval: None,
            auth: None,
            ca: None,
        };
        let rec = recording();
        let a = analyze(&rec, &AnalyzeOptions::default());
        let profile = pprof::encode_gz(&pprof::heap_profile(&rec, &a));
        let prev = empty_profile(&profile);
        assert!(pprof::decode(&prev).unwrap().sample.is_empty());
        let req = ingest_request(&cfg, &rec, 100, 160, &profile, &prev, SAMPLE_TYPE_CONFIG);
        assert!(
            cfg.url.with(&req.target).starts_with(&format!(
                "http://127.0.0.1:9/p/ingest?name=app%7Bpid%3D{}%7D&from=100&until=160&format=pprof",
                rec.target.pid
            )),
            "{}",
            req.target
        );
        assert!(req.content_type.starts_with("multipart/form-data; boundary="));
        let body = String::from_utf8_lossy(&req.body);
        for f in [
            "name=\"profile\"",
            "name=\"prev_profile\"",
            "name=\"sample_type_config\"",
            "\"inuse_space\":{\"units\":\"bytes\",\"aggregation\":\"average\"}",
        ] {
            assert!(body.contains(f), "{f}");
        }
        // The profile bytes are in the body verbatim.
        assert!(req.body.windows(profile.len()).any(|w| w == profile.as_slice()));
    }

    #[test]
    fn send_reports_the_status() {
        use std::io::{Read as _, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let n = c.read(&mut buf).unwrap();
            c.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let cfg = PushConfig {
            url: format!("http://127.0.0.1:{port}").parse().unwrap(),
            format: PushFormat::Pyroscope,
            name: None,
            labels: vec![],
            interval: None,
            auth: Some(PushAuth::Bearer(token)),
            ca: None,
        };
        let req = Request { target: "/ingest".into(), content_type: "text/plain".into(), body: b"x".to_vec() };
        let e = send_once(&agent(false, None).unwrap(), &cfg, &req).unwrap_err();
        assert_eq!(e, "HTTP 503 Service Unavailable: busy");
        let head = server.join().unwrap();
        assert!(head.starts_with("POST /ingest HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("\r\nauthorization: Bearer s3cret\r\n"), "{head}");
    }

    /// A credential goes over https, or over http to a loopback address only.
    #[test]
    fn no_credential_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "t").unwrap();
        let args = |url: &str| PushArgs {
            push: Some(url.parse().unwrap()),
            push_token_file: Some(f.clone()),
            ..Default::default()
        };
        let e = args("http://pyroscope:4040").config().unwrap_err().to_string();
        assert!(e.contains("sent over https:// only"), "{e}");
        assert!(args("http://127.0.0.1:4040").config().unwrap().is_some());
        let c = args("https://pyroscope:4040").config().unwrap().unwrap();
        assert_eq!(c.auth, Some(PushAuth::Bearer(f.clone())));
        let ca = PushArgs { push_ca: Some(f.clone()), ..args("http://127.0.0.1:1") };
        assert!(ca.config().unwrap_err().to_string().contains("--push-ca is for an https://"));
    }

    #[test]
    fn parca_request_is_writeraw_json_with_the_profile() {
        use base64::Engine as _;
        let cfg = PushConfig {
            url: "http://parca:7070".parse().unwrap(),
            format: PushFormat::Parca,
            name: None,
            labels: vec![("k8s.node".into(), "n1".into())],
            interval: None,
            auth: None,
            ca: None,
        };
        let rec = recording();
        let a = analyze(&rec, &AnalyzeOptions::default());
        let profile = pprof::encode_gz(&pprof::heap_profile(&rec, &a));
        let req = parca_request(&cfg, &rec, PARCA_HEAP, &profile);
        assert_eq!(cfg.url.with(&req.target), "http://parca:7070/profiles/writeraw");
        assert_eq!(req.content_type, "application/json");
        let j: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(j["normalized"], false);
        let labels: Vec<(String, String)> = j["series"][0]["labels"]["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["name"].as_str().unwrap().to_string(), l["value"].as_str().unwrap().to_string()))
            .collect();
        let want: Vec<(String, String)> =
            [("__name__", "memory"), ("job", "server"), ("k8s_node", "n1"), ("pid", "4242")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(labels, want);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(j["series"][0]["samples"][0]["rawProfile"].as_str().unwrap())
            .unwrap();
        assert_eq!(raw, profile);
    }
}
