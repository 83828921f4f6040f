//! Microbenchmark: ns per malloc+free pair, and where the kernel spends it.

use super::*;

impl Bench {
    pub(super) fn micro(&self) -> Result<Vec<Series>> {
        let n = self.args.pairs.to_string();
        let size = PAIR_SIZE.to_string();
        let naive = self.work.join("naive.bt");
        let script = std::fs::read_to_string(root().join("xtask/bench/naive.bt"))?
            .replace("@LIBC@", &self.libc.display().to_string());
        std::fs::write(&naive, script)?;

        let mut variants: Vec<(String, Command)> = Vec::new();
        let pairs_args = |c: &mut Command| {
            c.arg(&self.pairs).args([&n, &size]);
        };
        let mut c = Command::new(&self.pairs);
        c.args([&n, &size]);
        variants.push(("untraced".into(), c));
        let mut c = Command::new(&self.floor);
        c.arg(&self.libc)
            .arg(format!("e:{:#x}", self.malloc_off))
            .arg(format!("r:{:#x}", self.malloc_off))
            .arg(format!("e:{:#x}", self.free_off))
            .arg("--");
        pairs_args(&mut c);
        variants.push(("floor: empty probes at leaktrace's places".into(), c));
        let mut c = self.leaktrace_launch(&[], "exact");
        pairs_args(&mut c);
        variants.push(("leaktrace exact".into(), c));
        for (label, bytes) in SAMPLE_BYTES {
            let sb = bytes.to_string();
            let mut c = self.leaktrace_launch(&["--sample-bytes", &sb], &format!("sampled-{bytes}"));
            pairs_args(&mut c);
            variants.push((format!("leaktrace sampled --sample-bytes {label}"), c));
        }
        let mut c = self.leaktrace_launch(&["--mode", "growth", "--no-escalate"], "growth");
        pairs_args(&mut c);
        variants.push(("leaktrace growth".into(), c));
        let mut c = Command::new("bpftrace");
        c.arg(&naive).arg("-c").arg(format!("{} {n} {size}", self.pairs.display()));
        variants.push(("naive bpftrace (memleak-like)".into(), c));
        let mut c = Command::new("heaptrack");
        c.arg("-o").arg(self.work.join("heaptrack.pairs"));
        pairs_args(&mut c);
        variants.push(("heaptrack (LD_PRELOAD)".into(), c));
        // The strongest eBPF peer, side by side: the same pairs, on the system's libc (memleak
        // probes libc.so.6 by name), launched by each tool.
        if let Some(memleak) = &self.memleak {
            let mut c = self.leaktrace_launch(&[], "exact-system-libc");
            c.arg(&self.pairs_fixed);
            variants.push(("leaktrace exact, system libc (as memleak)".into(), c));
            let mut c = Command::new(memleak);
            c.arg("-c").arg(&self.pairs_fixed);
            variants.push(("libbpf-tools memleak -c".into(), c));
            let mut c = Command::new(memleak);
            c.args(["-s", "64", "-c"]).arg(&self.pairs_fixed);
            variants.push(("libbpf-tools memleak -s 64 -c".into(), c));
        }

        let mut series: Vec<Series> =
            variants.iter().map(|(name, c)| Series { name: name.clone(), command: show(c), values: vec![] }).collect();
        for rep in 0..self.args.reps {
            for (i, (name, cmd)) in variants.iter_mut().enumerate() {
                self.note_load();
                let out = capture(cmd).with_context(|| format!("microbenchmark, {name}"))?;
                let v = field(&out, "ns_per_pair").with_context(|| format!("{name}: no ns_per_pair in:\n{out}"))?;
                eprintln!("xtask: bench: micro rep {rep} {name}: {v:.1} ns/pair");
                series[i].values.push(v);
            }
        }
        Ok(series)
    }

    /// Per-program kernel time of exact mode on the microbenchmark (kernel.bpf_stats_enabled).
    pub(super) fn kernel_breakdown(&self) -> Result<Vec<(String, u64, u64)>> {
        let _stats = BpfStats::enable()?;
        let mut cmd = self.leaktrace_launch(&[], "stats");
        // Hold the target 3 s after its loop so the programs can be read while attached.
        cmd.arg(&self.pairs).args([&self.args.pairs.to_string(), &PAIR_SIZE.to_string(), "3000"]);
        let mut child = Spawned::new(cmd)?;
        child.wait_stdout_line("ns_per_pair", Duration::from_secs(120))?;
        std::thread::sleep(Duration::from_millis(300));
        let mut out = programs_of(child.pid())?;
        child.wait(Duration::from_secs(60))?;
        out.retain(|(_, cnt, _)| *cnt > 0);
        out.sort_by_key(|(_, _, ns)| std::cmp::Reverse(*ns));
        Ok(out)
    }
}
