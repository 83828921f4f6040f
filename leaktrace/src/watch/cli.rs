//! `leaktrace watch`'s command line (flattened into the CLI's subcommand) and its options.

use std::path::PathBuf;
use std::time::Duration;

use super::state::EscalationPolicy;
use super::{Selector, WatchOptions};
use crate::push::PushConfig;

/// `leaktrace watch` arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// Watch these processes (repeatable). With no selector, every process of the host.
    #[arg(long)]
    pub pid: Vec<u32>,
    /// Watch every process of this cgroup and of the cgroups below it (absolute, or relative to
    /// the cgroup2 mount, else the v1 memory controller's; e.g. a node's kubepods root),
    /// rescanned every 5 s.
    #[arg(long, conflicts_with = "pid")]
    pub cgroup: Option<PathBuf>,
    /// Watch the processes of this Kubernetes pod on this node (name or UID), as `record --pod`
    /// finds them, rescanned every 5 s.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["pid", "cgroup"])]
    pub pod: Option<String>,
    /// Namespace of --pod.
    #[arg(long, value_name = "NS", requires = "pod")]
    pub namespace: Option<String>,
    /// The container runtime's CRI socket, asked first for the pods' names (else
    /// $LEAKTRACE_CRI_SOCKET, then containerd's, k3s's and CRI-O's usual sockets).
    #[arg(long, value_name = "PATH")]
    pub cri_socket: Option<std::path::PathBuf>,
    /// Container of --pod (its name).
    #[arg(long, value_name = "NAME", requires = "pod")]
    pub container: Option<String>,
    /// Stop after this long (e.g. 10m, 24h). Default: until SIGINT or SIGTERM.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::parse_duration)]
    pub duration: Option<Duration>,
    /// Output directory: one directory per escalated or OOM-killed process, NAMESPACE_POD or
    /// pid-PID, with one report directory per event and time under it (default
    /// ./leaktrace-watch-TIMESTAMP).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Length of each growth-mode window, over which every process gets its verdict (a
    /// process that starts during one has a shorter first window).
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::parse_duration, default_value = "30s")]
    pub window: Duration,
    /// Time between checkpoints in a window.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Escalate a process after this many windows in a row with a leak verdict.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub escalate_after: u32,
    /// Length of an escalation's exact window (every allocator call of the process traced, then
    /// the probes removed).
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::parse_duration, default_value = "10s", value_name = "DURATION")]
    pub escalate_for: Duration,
    /// Exact windows running at once, at most.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub max_escalations: u64,
    /// Maximum distinct allocation sites of the processes watched at once (kernel map size, 1
    /// to 4194304; 48 bytes each, allocated at start). A process's sites are given back a
    /// second or so after it is no longer watched; beyond the limit, new sites are not counted
    /// (`sites_map_full`).
    #[arg(long, default_value_t = crate::probes::Limits::default().max_sites, value_parser = clap::value_parser!(u32).range(1..=1 << 22))]
    pub max_sites: u32,
    /// No process is escalated again within this long of its last escalation's start.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::parse_duration, default_value = "30m")]
    pub cooldown: Duration,
    /// Never escalate.
    #[arg(long)]
    pub no_escalate: bool,
    /// The agent's own CPU limit, percent of one core, averaged over the last minute (every
    /// thread): above it, no escalation starts until it is back under (growth-mode tracing goes
    /// on).
    #[arg(long, value_name = "PERCENT", default_value_t = 10.0, value_parser = parse_percent)]
    pub max_cpu: f64,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464), path /metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Sites listed in each report.md.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// `--push URL` and its options, as `record` has them: each watched process's heap and
    /// growth profiles (of its current window) sent every --push-interval (default: --window),
    /// labelled with its pod, namespace and container when it runs in a kubelet pod.
    #[command(flatten)]
    pub push: crate::push::PushArgs,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.1..=200.0).contains(&p) => Ok(p),
        Ok(_) => Err("must be between 0.1 and 200 (percent of one core)".into()),
        Err(e) => Err(format!("{e} (examples: 2, 10, 50)")),
    }
}

impl WatchArgs {
    /// The options these arguments give. Errors: an interval shorter than 100 ms or not
    /// shorter than the window.
    pub fn options(self) -> anyhow::Result<WatchOptions> {
        anyhow::ensure!(
            self.interval >= Duration::from_millis(100) && self.interval * 4 <= self.window,
            "--interval must be at least 100ms and a quarter of --window at most (a verdict needs checkpoints)"
        );
        if let Some(s) = self.cri_socket {
            crate::cri::set_socket(s);
        }
        let selector = match (self.pid.is_empty(), self.cgroup, self.pod) {
            (false, _, _) => Selector::Pids(self.pid),
            (true, Some(c), _) => Selector::Cgroup(c),
            (true, None, Some(pod)) => {
                Selector::Pod(crate::pod::PodSelector { pod, namespace: self.namespace, container: self.container })
            }
            (true, None, None) => Selector::Host,
        };
        Ok(WatchOptions {
            selector,
            duration: self.duration,
            out: self.out,
            window: self.window,
            interval: self.interval,
            policy: EscalationPolicy {
                after_windows: self.escalate_after,
                max_concurrent: self.max_escalations as usize,
                cooldown: self.cooldown,
                window: (!self.no_escalate).then_some(self.escalate_for),
            },
            metrics_listen: self.metrics_listen,
            top: self.top,
            max_cpu_pct: self.max_cpu,
            max_sites: self.max_sites,
            // A watch has no end to push at: periodic pushes, every window unless told.
            push: self.push.config()?.map(|c| PushConfig { interval: c.interval.or(Some(self.window)), ..c }),
        })
    }
}
