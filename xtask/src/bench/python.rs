//! A pure-Python workload, traced in each mode.

use super::*;

impl Bench {
    pub(super) fn python_workload(&self) -> Result<Vec<Series>> {
        let script = root().join("xtask/bench/churn.py");
        let n = self.args.python_iterations.to_string();
        let mut variants: Vec<(&str, Command)> = Vec::new();
        let mut c = Command::new(&self.python);
        c.arg(&script).arg(&n);
        variants.push(("untraced", c));
        for (name, mode, tag) in [
            ("leaktrace exact", vec![], "py-exact"),
            ("leaktrace sampled --sample-bytes 512KiB", vec!["--sample-bytes", "524288"], "py-sampled"),
            ("leaktrace growth", vec!["--mode", "growth", "--no-escalate"], "py-growth"),
        ] {
            let mut c = self.leaktrace_launch(&mode, tag);
            c.arg(&self.python).arg(&script).arg(&n);
            variants.push((name, c));
        }
        let mut series: Vec<Series> = variants
            .iter()
            .map(|(name, c)| Series { name: name.to_string(), command: show(c), values: vec![] })
            .collect();
        for rep in 0..self.args.reps {
            for (i, (name, cmd)) in variants.iter_mut().enumerate() {
                self.note_load();
                let out = capture(cmd)?;
                let cpu = field(&out, "cpu_s").with_context(|| format!("no cpu_s in:\n{out}"))?;
                eprintln!("xtask: bench: python rep {rep} {name}: {cpu:.3} s CPU");
                series[i].values.push(self.args.python_iterations as f64 / cpu);
            }
        }
        Ok(series)
    }
}
