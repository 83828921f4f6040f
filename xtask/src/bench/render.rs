//! docs/benchmarks.md, rendered from the results.

use super::*;

impl Bench {
    /// docs/benchmarks.md from `r`: the run's header, the microbenchmark, the targets, the
    /// kernel-side split, the real workloads and the agent's cost, with paths made relative to
    /// the workspace.
    pub(super) fn render(&self, r: &Results) -> String {
        // Growth mode's counted cost on redis: in the targets table and under the redis tables.
        let g = self.growth_model(r);
        let m = Micro::of(r);
        let mut s = String::new();
        self.render_header(&mut s, r);
        self.render_micro(&mut s, r, &m);
        self.render_targets(&mut s, r, &m, &g);
        render_kernel_stats(&mut s, r, &m);
        self.render_workloads(&mut s, r, &g);
        render_agent(&mut s, r);
        self.relative_paths(s)
    }

    /// The run's header: date, command, machine, load, time taken.
    fn render_header(&self, s: &mut String, r: &Results) {
        let machine = machine();
        let loads = self.loads.borrow();

        s.push_str("# Benchmarks\n\n");
        s.push_str(
            "What tracing costs. Written by `cargo xtask bench` (as root); every figure below comes \
             from one run of it, and the comparisons are ratios within that run.\n\n",
        );
        s.push_str(&format!("- Date: {}\n", r.date));
        s.push_str(&format!("- Command: `cargo xtask bench --reps {} --pairs {} --redis-requests {} --python-iterations {} --live-allocs {}`\n",
            self.args.reps, self.args.pairs, self.args.redis_requests, self.args.python_iterations, self.args.live_allocs));
        for (k, v) in &machine {
            s.push_str(&format!("- {k}: {v}\n"));
        }
        s.push_str(&format!(
            "- Load: {}; 1-minute load average during the runs: median {:.2}, max {:.2} (the machine is shared)\n",
            r.waited,
            median(&loads),
            loads.iter().copied().fold(0.0, f64::max)
        ));
        s.push_str(&format!("- Took {:.0} s\n\n", r.elapsed.as_secs_f64()));
    }

    /// "Cost per malloc+free pair": the microbenchmark's table, memleak's comparison, the
    /// commands, the naive script and the floor.
    fn render_micro(&self, s: &mut String, r: &Results, m: &Micro) {
        let Micro { base, floor, lt_sys, memleak, .. } = *m;
        s.push_str("## Cost per malloc+free pair\n\n");
        s.push_str(&format!(
            "`xtask/bench/pairs.c`: {} × `malloc({PAIR_SIZE})` + `free` through volatile function pointers, \
             after a warm-up; the figure is the process's CPU time (user + system: the uprobes run in \
             its context) for the loop divided by the pairs, median of {} interleaved runs. The \
             program uses a private copy of glibc ({}), so the probes of every tool fire in it only. \
             leaktrace's probes: malloc entry + return at the symbol, free at `{}`.\n\n",
            self.args.pairs,
            self.args.reps,
            r_libc_version(),
            self.free_placement
        ));
        s.push_str("| variant | ns per pair (median) | added by tracing | × floor | runs (ns) |\n| --- | ---: | ---: | ---: | --- |\n");
        for x in &r.micro {
            let m = x.median();
            let add = m - base;
            let ratio = if x.name == "untraced" { "".into() } else { format!("{:.2}", add / floor) };
            s.push_str(&format!(
                "| {} | {:.0} | {} | {} | {} |\n",
                x.name,
                m,
                if x.name == "untraced" { "—".into() } else { format!("{add:.0}") },
                ratio,
                x.values.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ")
            ));
        }
        if lt_sys.is_finite() && memleak.is_finite() {
            s.push_str(&format!(
                "\nAgainst libbpf-tools memleak (`../shared/tools/memleak-libbpf`, CO-RE, bcc 6d0a964), the same \
                 pairs on the system's libc launched by each tool: leaktrace exact adds {lt_sys:.0} ns per pair, \
                 memleak {memleak:.0} ns: **{:.2}×** memleak's cost.\n",
                lt_sys / memleak
            ));
        }
        s.push_str("\nCommands (one run each):\n\n```sh\n");
        for x in &r.micro {
            s.push_str(&format!("{}\n", x.command));
        }
        s.push_str("```\n\n");
        s.push_str("The naive script (`xtask/bench/naive.bt`, like bcc's memleak):\n\n```\n");
        s.push_str(&std::fs::read_to_string(root().join("xtask/bench/naive.bt")).unwrap_or_default());
        s.push_str(
            "```\n\nThe floor is `xtask/bench/floor.c`: a two-instruction eBPF program (`r0 = 0; exit`) \
            attached with perf_event_open at the same file offsets as leaktrace's probes (bpftrace 0.17 \
            cannot place a uprobe at `free+9`: it is built without the disassembler that checks offsets).\n\n",
        );
    }

    /// "Targets": each goal of the issues with its measured figure and whether it is met.
    fn render_targets(&self, s: &mut String, r: &Results, m: &Micro, g: &GrowthModel) {
        let Micro { base, floor, exact, naive, lt_sys, memleak } = *m;

        // Targets.
        s.push_str("## Targets\n\n| target | measured | met |\n| --- | --- | --- |\n");
        let exact_vs_floor = exact / floor;
        let naive_vs_exact = naive / exact;
        let paired = paired_ratio(&r.micro, "leaktrace exact", "floor");
        s.push_str(&format!(
            "| exact mode within 1.2× of the floor (added ns per pair) | {exact:.0} ns vs {floor:.0} ns: {exact_vs_floor:.2}× (medians); median of the {} rounds' own ratios (each round runs untraced, floor and exact one after another, so a drift of the machine's speed between rounds cancels): {paired:.2}× | {} (both) |\n",
            self.args.reps,
            yes(exact_vs_floor <= 1.2 && paired <= 1.2)
        ));
        if lt_sys.is_finite() && memleak.is_finite() {
            s.push_str(&format!(
                "| exact mode ≤ 0.4× libbpf-tools memleak's added cost per pair | {lt_sys:.0} ns vs {memleak:.0} ns: {:.2}× | {} |\n",
                lt_sys / memleak,
                yes(lt_sys / memleak <= 0.4)
            ));
        }
        s.push_str(&format!(
            "| exact mode ≥ 10× cheaper per pair than the naive bpftrace script | {naive:.0} ns vs {exact:.0} ns: {naive_vs_exact:.1}× | {} |\n",
            yes(naive_vs_exact >= 10.0)
        ));
        let growth_ratio = |series: &[Series]| {
            let base = series[0].median();
            series.iter().find(|x| x.name == "leaktrace growth").map(|x| x.median() / base).unwrap_or(f64::NAN)
        };
        let (rgrowth_cpu, rgrowth_wall) = (growth_ratio(&r.redis_cpu), growth_ratio(&r.redis));
        s.push_str(&format!(
            "| growth mode keeps redis's throughput ≥ 98 % of untraced | computed from what it adds per request (below): {}; measured: {} per redis-server CPU second, {} in wall-clock requests/s — both within the spread of the untraced runs ({:.0} %–{:.0} % of their median) | {} |\n",
            pct(g.throughput),
            pct(rgrowth_cpu),
            pct(rgrowth_wall),
            spread(&r.redis_cpu[0]).0 * 100.0,
            spread(&r.redis_cpu[0]).1 * 100.0,
            yes(g.throughput >= 0.98)
        ));
        let sampled: Vec<String> = r
            .micro
            .iter()
            .filter(|x| x.name.contains("sampled"))
            .map(|x| {
                format!(
                    "{}: {:.0} ns ({:.2}× floor)",
                    x.name.trim_start_matches("leaktrace sampled "),
                    x.median() - base,
                    (x.median() - base) / floor
                )
            })
            .collect();
        s.push_str(&format!("| sampled mode (stated, no target) | {} | — |\n\n", sampled.join("; ")));
    }

    /// The redis workloads' notes: where leaktrace put redis's allocator probes and the agent's
    /// CPU; Python's commands. One section per workload (redis, redis per CPU second, Python).
    fn render_workloads(&self, s: &mut String, r: &Results, g: &GrowthModel) {
        // Real workloads.
        for (title, unit, series, note) in [
            (
                "redis-server under redis-benchmark",
                "requests/s (SET and GET together)",
                &r.redis,
                "redis-server (Debian's, linked with libjemalloc) on 127.0.0.1 with persistence off, traced by `leaktrace record --pid` attached before each redis-benchmark run and stopped after it (exact and sampled mode run a twentieth of the requests: the rate is what is compared). Throughput is wall-clock, so it is the figure most exposed to the machine's other load; redis-server and redis-benchmark take both cores, so the agent's own CPU (last column) competes with them.",
            ),
            (
                "redis-server's CPU per request",
                "requests per redis-server CPU second",
                &r.redis_cpu,
                "The same runs, counted against redis-server's own CPU time (utime + stime of all its threads from /proc/PID/stat, over the redis-benchmark run): the uprobes, page-fault and syscall probes run in redis-server's context, so this is what tracing costs redis, and the machine's other load does not add to it the way it adds to wall-clock time. redis serves requests on one thread, so this is the throughput redis would have with a core to itself. The growth-mode target is judged on this figure.",
            ),
            (
                "A Python workload",
                "iterations per CPU second",
                &r.python,
                "`xtask/bench/churn.py` (dict and list churn, a bounded window of live dicts) under CPython with a shared libpython, launched under leaktrace; the figure is iterations over the loop's process CPU time.",
            ),
        ] {
            let b = series[0].median();
            s.push_str(&format!("## {title}\n\n{note}\n\n| variant | {unit} (median) | vs untraced | runs |\n| --- | ---: | ---: | --- |\n"));
            for x in series.iter() {
                s.push_str(&format!(
                    "| {} | {:.0} | {} | {} |\n",
                    x.name,
                    x.median(),
                    pct(x.median() / b),
                    x.values.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ")
                ));
            }
            if std::ptr::eq(series, &r.redis_cpu) {
                // Same commands as the table above; then growth mode's cost from counts.
                s.push_str(&format!(
                    "\nGrowth mode's cost per request, counted: its eBPF programs ran {:.1} ns per request \
                     (kernel.bpf_stats_enabled during the growth runs: every program of the agent, for \
                     whichever process it fired); redis-server made {:.3} read/write system calls and \
                     {:.4} page faults per request (/proc/PID/io, /proc/PID/stat), and while syscall \
                     tracepoints are attached each system call costs {:.1} ns more ({:.1} → {:.1} ns per \
                     getppid(), `xtask/bench/syscalls.c`); the syscall count is doubled, as epoll_wait \
                     and other calls are not in syscr/syscw. Added: {:.1} ns per request, against {:.0} ns \
                     of redis-server CPU per request untraced: {} of untraced throughput.\n\n",
                    g.prog_ns,
                    g.syscalls,
                    g.faults,
                    g.syscall_extra_ns,
                    r.syscall_ns.0,
                    r.syscall_ns.1,
                    g.prog_ns + 2.0 * g.syscalls * g.syscall_extra_ns,
                    g.request_ns,
                    pct(g.throughput)
                ));
                continue;
            }
            s.push_str("\n```sh\n");
            for x in series.iter() {
                s.push_str(&format!("{}\n", x.command));
            }
            s.push_str("```\n\n");
            if std::ptr::eq(series, &r.redis) {
                let notes = self.redis_notes.borrow();
                s.push_str("The agent's CPU during the redis-benchmark runs (median share of a core): ");
                let parts: Vec<String> = series
                    .iter()
                    .zip(notes.0.iter())
                    .filter(|(x, _)| x.name != "untraced")
                    .map(|(x, c)| format!("{} {:.1} %", x.name, c * 100.0))
                    .collect();
                s.push_str(&parts.join("; "));
                s.push_str(".\n\nWhere leaktrace put redis's allocator probes (its coverage lines; `+N` is a probe moved past a NULL check or past first instructions the kernel would single-step, see leaktrace/src/placement.rs; the others sit on the function's first instruction):\n\n```\n");
                for l in &notes.1 {
                    s.push_str(l);
                    s.push('\n');
                }
                s.push_str("```\n\n");
            }
        }
    }

    /// Paths relative to the workspace, so that the commands read the same on any machine.
    fn relative_paths(&self, s: String) -> String {
        let bin_dir = self.leaktrace.parent().map(|d| format!("{}/", d.display()));
        let s = match bin_dir {
            Some(d) => s.replace(&d, "target/release/"),
            None => s,
        };
        s.replace(&format!("{}/", root().display()), "")
    }
}

/// The microbenchmark's medians that the sections quote: ns per pair of the untraced run, and
/// ns per pair each variant adds to it (NaN for a variant not run).
struct Micro {
    base: f64,
    floor: f64,
    exact: f64,
    naive: f64,
    /// leaktrace exact on the system's libc.
    lt_sys: f64,
    /// libbpf-tools memleak on the system's libc.
    memleak: f64,
}

impl Micro {
    /// The medians of `r.micro` (its first series is the untraced run).
    fn of(r: &Results) -> Micro {
        let base = r.micro[0].median();
        let added = |name: &str| {
            r.micro.iter().find(|x| x.name.starts_with(name)).map(|x| x.median() - base).unwrap_or(f64::NAN)
        };
        Micro {
            base,
            floor: added("floor"),
            exact: added("leaktrace exact"),
            naive: added("naive bpftrace"),
            lt_sys: added("leaktrace exact, system libc"),
            memleak: added("libbpf-tools memleak -c"),
        }
    }
}

/// A share as a percentage with one decimal ("98.7 %").
fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// "Where exact mode's time goes in the kernel": bpf_stats of the programs, and the notes of
/// the separate measurements.
fn render_kernel_stats(s: &mut String, r: &Results, m: &Micro) {
    let Micro { floor, exact, .. } = *m;

    if !r.stats.is_empty() {
        s.push_str("## Where exact mode's time goes in the kernel\n\n");
        s.push_str(&format!(
            "One more exact-mode run of the microbenchmark with `kernel.bpf_stats_enabled=1`; \
             `bpftool prog show -j`, run_time_ns / run_cnt of leaktrace's programs (the time inside \
             the eBPF programs only; the uprobe's own trap and return trampoline are the floor). \
             Per pair the programs take {:.0} ns, against {exact:.0} ns added by exact mode and \
             {floor:.0} ns by empty probes.\n\n| program | runs | ns per run | total ms |\n| --- | ---: | ---: | ---: |\n",
            r.stats.iter().filter(|(n, ..)| ["malloc_enter", "alloc_return", "free_enter"].contains(&n.as_str())).map(|(_, c, ns)| *ns as f64 / *c as f64).sum::<f64>()
        ));
        for (name, cnt, ns) in &r.stats {
            s.push_str(&format!("| {name} | {cnt} | {:.0} | {:.1} |\n", *ns as f64 / *cnt as f64, *ns as f64 / 1e6));
        }
        s.push('\n');
        s.push_str(WALK_MEMO_NOTE);
        s.push_str("\n\n");
        s.push_str(BOOKKEEPING_NOTE);
        s.push_str("\n\n");
        s.push_str(BLOCK_TABLE_NOTE);
        s.push_str("\n\n");
    }
}

/// "The agent at N live allocations": its CPU, RSS and BPF maps.
fn render_agent(s: &mut String, r: &Results) {
    // Agent cost.
    let a = &r.agent;
    let total_maps: u64 = a.maps.iter().map(|m| m.3).sum();
    s.push_str(&format!(
        "## The agent at {} live allocations\n\n`{}`: `xtask/bench/hold.c` mallocs {} blocks of 64 bytes \
         and keeps them (filled in {:.1} s under exact tracing). Read 1.5 s after the last malloc: \
         /proc/PID/stat (utime + stime) and /proc/PID/status of leaktrace, and `bpftool map show -j` \
         (bytes_memlock of the maps whose ids leaktrace's file descriptors hold).\n\n",
        a.live, a.command, a.live, a.fill_s
    ));
    s.push_str(&format!(
        "| figure | value |\n| --- | ---: |\n| agent CPU time from start (attach, {} allocations, checkpoints) | {:.2} s |\n\
         | agent CPU while holding them (1 s checkpoints) | {:.1} % of a core |\n| agent RSS (VmRSS) | {:.1} MiB |\n\
         | agent peak RSS (VmHWM) | {:.1} MiB |\n| BPF maps, total bytes_memlock | {:.1} MiB |\n\n",
        a.live,
        a.cpu_at_held,
        a.cpu_per_s_steady * 100.0,
        a.rss_kib as f64 / 1024.0,
        a.hwm_kib as f64 / 1024.0,
        total_maps as f64 / 1048576.0
    ));
    s.push_str("| map | type | max_entries | bytes_memlock |\n| --- | --- | ---: | ---: |\n");
    for (name, ty, max, bytes) in &a.maps {
        s.push_str(&format!("| {name} | {ty} | {max} | {bytes} |\n"));
    }
    s.push('\n');
}

/// How `malloc_enter`'s time splits and what the walk memo saved: a separate measurement (stubbed
/// builds of the kernel side, bpf_stats), not made by the bench run, kept in benchmarks.md.
const WALK_MEMO_NOTE: &str = "How `malloc_enter`'s time splits, and what the walk memo saved (kernel.bpf_stats through \
    `BPF_ENABLE_STATS`, the microbenchmark `pairs 200017 64` pinned to one CPU under `leaktrace record`, \
    5–7 runs of each build interleaved, min / median ns per run, on a machine shared with other builds; \
    2026-12-01). With parts of the kernel side stubbed out: of ~255 ns, the native walk of six frames \
    took ~130, the Python check (no Python target: one array read) and the `STACKS_SEEN` check ~20, the \
    rest (the thread's in-flight slot, the sampling flag, the read of the caller's word) ~105. The walk \
    memo (kernel.md, \"Walk memo\": a thread's last walk is taken again when the stack words it \
    read are unchanged, checked with one copy of the stack and a compare) took `malloc_enter` from 331 / \
    363 to 137 / 145 ns, and the three programs per pair from 576 / 615 to 368 / 390 ns; with the malloc \
    16 frames further down (a 22-frame stack, built `-O2 -fomit-frame-pointer`) from 573 / 758 to 151 / \
    180 ns, and from 804 / 1053 to 376 / 430 ns per pair. `alloc_return` and `free_enter` did not \
    change. A call whose stack differs from the thread's last one pays the check on top of the walk (not \
    measured on its own).";

/// Where `alloc_return`'s and `free_enter`'s time goes: measured with stubbed builds as
/// [`WALK_MEMO_NOTE`], kept in benchmarks.md.
const BOOKKEEPING_NOTE: &str = "The two other programs, measured the same way on a quieter machine (the memo build: `alloc_return` \
    105 / 113, `free_enter` 88 / 91 ns): without the block's bookkeeping (`record`, `free_addr`) they \
    take 30 / 32 and 29 / 31 ns; without only the `ALLOCS` insert (so that frees find nothing) 61 / 62 \
    and 45 / 50 ns. So the `ALLOCS` hash-map insert costs ~45 ns, a free's lookup and delete ~40–60, and \
    the rest of `alloc_return`'s bookkeeping (the site index from the per-CPU cache, the page note, two \
    atomic adds, a counter) ~30. `ALLOCS` is not preallocated (`BPF_F_NO_PREALLOC`): preallocating \
    `--max-allocs` entries (1 M by default, 10 M for large targets) would pin tens to hundreds of MiB of \
    kernel memory for every run, so it was left as is (it saved ~75 ns a pair; the fast table below \
    replaced it).";

/// What the fast block table (`BLOCKS`) and the jiffies clock saved: measured with runtime switches
/// in the kernel side (bpf_stats), not made by the bench run, kept in benchmarks.md.
const BLOCK_TABLE_NOTE: &str = "The block table, measured again on this machine on 2026-12-02 (bpf_stats as above, \
    `pairs 2000000 64 2500` under `leaktrace record`, two runs of each variant interleaved, ns per run; \
    bpf_stats itself adds ~55 ns to every run: the bench's floor program, `r0 = 0; exit`, reads 55 ns \
    under it, and the pairs took ~105 ns more per probe with stats on). With the `ALLOCS` hash map as the \
    block table: `malloc_enter` 439–465, `alloc_return` 458–479, `free_enter` 349–368 ns. Parts switched \
    off one at a time: without the `ALLOCS` insert (and so no free finding its block) `alloc_return` \
    216–225 and `free_enter` 177–183; `alloc_return` stopping after the in-flight slot 128–133; without \
    the clock read (`bpf_ktime_get_ns`) 395–403; `free_enter` stopping after its in-flight check 76–78; \
    without the site (the walk memo's check and the stack key) `malloc_enter` 121–136, without only the \
    memo's copy of the stack (~424 bytes here) 242–243. So a hash-map insert cost ~245 ns and a lookup \
    and delete ~180 here (this machine's helper calls are slow: returns go through the SRSO safe-RET \
    thunk), the clock read ~60, the stack copy ~170. Since: blocks live in `BLOCKS`, an array of 4-slot \
    buckets claimed by compare-and-swap on a 64-bit tag (kernel.md, maps; the hash map \
    only takes a full bucket's blocks), and birth times come from jiffies (an inlined load; the agent \
    ties them to the monotonic clock at load): `alloc_return` 168–186 and `free_enter` 126–155 ns, \
    `malloc_enter` unchanged (the stack copy and the walk memo's check are now most of what is left).";

/// The median over rounds of (`num` − untraced) / (`den` − untraced) within each round (the
/// variants whose names start with `num` and `den`, `series[0]` untraced): a paired ratio, which
/// a change of the machine's speed from one round to the next does not move. NaN when a series
/// is missing.
fn paired_ratio(series: &[Series], num: &str, den: &str) -> f64 {
    let find = |name: &str| series.iter().find(|x| x.name.starts_with(name));
    let (Some(base), Some(n), Some(d)) = (series.first(), find(num), find(den)) else { return f64::NAN };
    let ratios: Vec<f64> = base
        .values
        .iter()
        .zip(&n.values)
        .zip(&d.values)
        .map(|((b, n), d)| (n - b) / (d - b))
        .filter(|r| r.is_finite())
        .collect();
    if ratios.is_empty() { f64::NAN } else { median(&ratios) }
}
