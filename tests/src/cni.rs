//! A pod network for the container tests: Debian's CNI plugins (`containernetworking-plugins`,
//! installed by `cargo xtask setup` into /usr/lib/cni) with a bridge of this test's own name,
//! no gateway (the bridge has no address: no host route), no masquerade, a private subnet and
//! host-local IPAM state in the containerd's directory. containerd (`Containerd::with_network`)
//! reads the config from its CNI directory and makes each pod's network namespace under its
//! state directory (`netns_mounts_under_state_dir`).
//!
//! [`Bridge::teardown`] removes what the plugins leave or a failed test left: the veths still on
//! the bridge, the bridge itself, the plugins' result cache of this network.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where Debian's containernetworking-plugins has the plugins.
pub const CNI_PLUGINS_DIR: &str = "/usr/lib/cni";

/// The bridge network of one containerd.
#[derive(Debug, Clone)]
pub struct Bridge {
    /// The bridge device's name (unique to this test process and containerd).
    pub name: String,
    /// The CNI network's name.
    pub network: String,
    /// The pods' subnet.
    pub subnet: String,
}

impl Bridge {
    /// A new bridge network (nothing made yet: the bridge plugin makes the device with the
    /// first pod).
    pub fn new() -> Bridge {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // IFNAMSIZ: 15 characters at most.
        let name = format!("ltbr{}x{n}", pid % 10_000_000);
        Bridge { network: format!("leaktrace-{name}"), subnet: format!("10.{}.{}.0/24", 200 + n % 50, pid % 250), name }
    }

    /// Write the CNI config list into `conf_dir`, IPAM state under `state_dir`.
    pub fn write_config(&self, conf_dir: &Path, state_dir: &Path) {
        for p in ["bridge", "host-local", "loopback"] {
            assert!(
                Path::new(CNI_PLUGINS_DIR).join(p).is_file(),
                "{CNI_PLUGINS_DIR}/{p} is missing: `cargo xtask setup` installs containernetworking-plugins"
            );
        }
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [{
                "type": "bridge",
                "bridge": self.name,
                "isGateway": false,
                "isDefaultGateway": false,
                "ipMasq": false,
                "hairpinMode": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.subnet}]],
                    "dataDir": state_dir.join("ipam"),
                },
            }],
        });
        std::fs::write(conf_dir.join("10-leaktrace.conflist"), conf.to_string()).expect("write the CNI config");
    }

    /// The veths on the bridge now (their names).
    pub fn ports(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(format!("/sys/class/net/{}/brif", self.name)) else { return vec![] };
        rd.flatten().filter_map(|e| e.file_name().to_str().map(str::to_string)).collect()
    }

    /// Remove the veths still on the bridge, the bridge, and the plugins' cached results of
    /// this network.
    pub fn teardown(&self) {
        for port in self.ports() {
            ip(&["link", "del", &port]);
        }
        if Path::new("/sys/class/net").join(&self.name).exists() {
            ip(&["link", "del", &self.name]);
        }
        let cache = PathBuf::from("/var/lib/cni/results");
        if let Ok(rd) = std::fs::read_dir(&cache) {
            for e in rd.flatten() {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&format!("{}-", self.network))) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

impl Default for Bridge {
    fn default() -> Self {
        Bridge::new()
    }
}

/// `ip ARGS` (iproute2); its stdout ("" when it failed).
pub fn ip(args: &[&str]) -> String {
    Command::new("ip").args(args).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}
