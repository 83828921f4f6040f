//! The agent's own cost at 1 M live allocations.

use super::*;

impl Bench {
    pub(super) fn agent_cost(&self) -> Result<AgentCost> {
        let n = self.args.live_allocs;
        let max = (n + n / 8 + 65536).to_string();
        let mut cmd = self.leaktrace_launch(&["--max-allocs", &max], "hold");
        cmd.arg(&self.hold).args([&n.to_string(), "64", "8"]);
        let command = show(&cmd);
        self.note_load();
        let t0 = Instant::now();
        let mut child = Spawned::new(cmd)?;
        child.wait_stdout_line("held", Duration::from_secs(300))?;
        let fill_s = t0.elapsed().as_secs_f64();
        let pid = child.pid();
        std::thread::sleep(Duration::from_millis(1500));
        let cpu_at_held = cpu_seconds(pid)?;
        let rss_kib = status_kib(pid, "VmRSS")?;
        let map_ids = fd_ids(pid, "map_id")?;
        let maps: serde_json::Value =
            serde_json::from_str(&capture(Command::new("bpftool").args(["map", "show", "-j"]))?)?;
        let mut map_bytes = Vec::new();
        for m in maps.as_array().into_iter().flatten() {
            if map_ids.contains(&m["id"].as_u64().unwrap_or(0)) {
                map_bytes.push((
                    m["name"].as_str().unwrap_or("?").to_string(),
                    m["type"].as_str().unwrap_or("?").to_string(),
                    m["max_entries"].as_u64().unwrap_or(0),
                    m["bytes_memlock"].as_u64().unwrap_or(0),
                ));
            }
        }
        map_bytes.sort_by_key(|m| std::cmp::Reverse(m.3));
        let steady = Duration::from_secs(5);
        std::thread::sleep(steady);
        let cpu_later = cpu_seconds(pid)?;
        let hwm_kib = status_kib(pid, "VmHWM")?;
        child.wait(Duration::from_secs(300))?;
        Ok(AgentCost {
            command,
            live: n,
            fill_s,
            cpu_at_held,
            cpu_per_s_steady: (cpu_later - cpu_at_held) / steady.as_secs_f64(),
            rss_kib,
            hwm_kib,
            maps: map_bytes,
        })
    }
}
