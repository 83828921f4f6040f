//! Hostile and broken recordings: a fuzz-like property test over mutations of a real
//! recording (the demo's, `testdata/demo-recording.json`), with a fixed seed and a time budget,
//! run by `cargo xtask test` with the unit tests. Every mutant either loads, and then analysis,
//! every report renderer, `check`'s evaluation and `compare` run without a panic, or is refused
//! with a one-line error. Plus the named cases: truncation, deep nesting, NaN and out-of-range
//! numbers, stack ids without stacks, free > alloc, a file past the size cap (a sparse 10 GB one).

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use crate::analyze::{AnalyzeOptions, analyze};
use crate::recording::Recording;

/// A real recording: `leaktrace demo --duration 4s` (exact mode, a work probe, 3 sites growing).
const SEED: &[u8] = include_bytes!("../testdata/demo-recording.json");

/// Wall-clock budget of the mutation rounds (each round gets its share; the count of cases run
/// is printed). The named cases always run in full.
const BUDGET: Duration = Duration::from_secs(40);

/// xorshift64*: a fixed seed gives the same mutants on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What happened to one mutant.
#[derive(Debug, PartialEq)]
enum Outcome {
    Loaded,
    Refused(String),
}

/// Load `data` as `report` and `compare` do; when it loads, run everything downstream of the
/// recording. Panics (the test fails) on a panic anywhere, or on an error that is not one
/// non-empty line.
fn exercise(data: &[u8], what: &str) -> Outcome {
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| match Recording::parse(data) {
        Ok(rec) => {
            let a = analyze(&rec, &AnalyzeOptions { top: 10 });
            let _ = crate::report::render(&rec, &a);
            let _ = crate::check::evaluate(&rec, 1024.0);
            let _ = crate::compare::compare(&rec, "a", &rec, "b");
            Outcome::Loaded
        }
        Err(e) => Outcome::Refused(format!("{e:#}")),
    }));
    match run {
        Ok(Outcome::Refused(msg)) => {
            assert!(!msg.is_empty() && !msg.contains('\n'), "{what}: error is not one line: {msg:?}");
            Outcome::Refused(msg)
        }
        Ok(o) => o,
        Err(_) => panic!("{what}: panicked (mutant: {:?}...)", String::from_utf8_lossy(&data[..data.len().min(300)])),
    }
}

fn refused(data: &[u8], what: &str) -> String {
    match exercise(data, what) {
        Outcome::Refused(m) => m,
        Outcome::Loaded => panic!("{what}: loaded, should have been refused"),
    }
}

fn seed_value() -> serde_json::Value {
    serde_json::from_slice(SEED).unwrap()
}

/// Every JSON path (object keys and array indexes) in `v`, parents before children.
fn paths(v: &serde_json::Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, c) in m {
                prefix.push(k.clone());
                out.push(prefix.clone());
                paths(c, prefix, out);
                prefix.pop();
            }
        }
        serde_json::Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                prefix.push(i.to_string());
                out.push(prefix.clone());
                paths(c, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut serde_json::Value, path: &[String]) -> Option<&'a mut serde_json::Value> {
    path.iter().try_fold(v, |v, k| match v {
        serde_json::Value::Object(m) => m.get_mut(k),
        serde_json::Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

fn remove(v: &mut serde_json::Value, path: &[String]) {
    let (last, parent) = path.split_last().unwrap();
    match at(v, parent) {
        Some(serde_json::Value::Object(m)) => {
            m.remove(last);
        }
        Some(serde_json::Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>() {
                a.remove(i);
            }
        }
        _ => {}
    }
}

#[test]
fn the_seed_is_a_valid_recording() {
    assert_eq!(exercise(SEED, "seed"), Outcome::Loaded);
    let rec = Recording::parse(SEED).unwrap();
    assert!(rec.checkpoints.len() > 5 && rec.stacks.len() > 3, "the seed exercises the analysis");
}

#[test]
#[allow(clippy::print_stderr, reason = "a test's summary, shown with --nocapture")]
fn mutants_of_a_real_recording_load_or_give_one_line_errors() {
    let start = Instant::now();
    let share = BUDGET / 4;
    let mut rng = Rng(0x5eed_0bad_cafe_f00d);
    let mut counts = [0usize; 4];

    // 1. Truncation at every 13th byte (and every byte of the first 256).
    let cuts = (0..SEED.len().min(256)).chain((256..SEED.len()).step_by(13));
    for cut in cuts {
        if start.elapsed() > share {
            break;
        }
        refused(&SEED[..cut], &format!("truncated at {cut}"));
        counts[0] += 1;
    }

    // 2. Byte flips: one to four bytes replaced by random bytes or JSON's own characters.
    const JSONISH: &[u8] = b"{}[]\",:0123456789-+.eE \\nulltruefalse\x00\xff";
    while start.elapsed() < share * 2 {
        let mut m = SEED.to_vec();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(m.len());
            m[i] = if rng.below(2) == 0 { rng.next() as u8 } else { JSONISH[rng.below(JSONISH.len())] };
        }
        exercise(&m, "byte flips");
        counts[1] += 1;
    }

    // 3. Field deletions: every key and array element, one at a time.
    let seed = seed_value();
    let mut all = Vec::new();
    paths(&seed, &mut Vec::new(), &mut all);
    for p in &all {
        if start.elapsed() > share * 3 {
            break;
        }
        let mut v = seed.clone();
        remove(&mut v, p);
        exercise(&serde_json::to_vec(&v).unwrap(), &format!("without {}", p.join(".")));
        counts[2] += 1;
    }

    // 4. Values replaced by hostile ones (types swapped, extremes, negatives) at random paths.
    let hostile = [
        serde_json::json!(null),
        serde_json::json!(-1),
        serde_json::json!(0),
        serde_json::json!(u64::MAX),
        serde_json::json!(1.0e308),
        serde_json::json!(-1.0e308),
        serde_json::json!(4294967296u64),
        serde_json::json!(""),
        serde_json::json!("x".repeat(5000)),
        serde_json::json!([]),
        serde_json::json!({}),
        serde_json::json!(true),
    ];
    while start.elapsed() < share * 4 {
        let mut v = seed.clone();
        for _ in 0..1 + rng.below(3) {
            let p = &all[rng.below(all.len())];
            if let Some(slot) = at(&mut v, p) {
                *slot = hostile[rng.below(hostile.len())].clone();
            }
        }
        exercise(&serde_json::to_vec(&v).unwrap(), "hostile values");
        counts[3] += 1;
    }
    eprintln!(
        "mutants run in {:.1}s: {} truncations, {} byte flips, {} field deletions, {} hostile values",
        start.elapsed().as_secs_f64(),
        counts[0],
        counts[1],
        counts[2],
        counts[3]
    );
    assert!(counts.iter().all(|&c| c > 50), "each kind of mutant ran: {counts:?}");
}

#[test]
fn named_hostile_recordings_are_refused_with_the_reason() {
    let seed = seed_value();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = seed.clone();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    };

    let m = refused(&SEED[..SEED.len() / 2], "truncated");
    assert!(m.contains("not valid JSON") && m.contains("EOF"), "{m}");

    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let m = refused(deep.as_bytes(), "deep nesting");
    assert!(m.contains("recursion limit"), "{m}");
    let deep_inside = String::from_utf8_lossy(SEED).replacen(
        "{",
        &format!("{{\"x\":{}0{},", "[".repeat(10_000), "]".repeat(10_000)),
        1,
    );
    // An unknown field is skipped without recursion (serde_json's ignore_value keeps its own
    // stack): it loads, with no stack overflow.
    assert_eq!(exercise(deep_inside.as_bytes(), "deep nesting in an unknown field"), Outcome::Loaded);

    let nan = String::from_utf8_lossy(SEED).replacen("\"interval_s\":0.5", "\"interval_s\":NaN", 1);
    assert_ne!(nan.as_bytes(), SEED, "the seed has interval_s 0.5");
    let m = refused(nan.as_bytes(), "NaN");
    assert!(m.contains("not valid JSON"), "{m}");
    let inf = String::from_utf8_lossy(SEED).replacen("\"interval_s\":0.5", "\"interval_s\":1e999", 1);
    let m = refused(inf.as_bytes(), "1e999");
    assert!(m.contains("number out of range"), "{m}");

    let m = refused(&edit(&|v| v["checkpoints"][1]["sites"][0]["stack"] = 999_999.into()), "unknown stack");
    assert!(m.contains("refers to stack 999999, which the recording does not have"), "{m}");
    let m = refused(&edit(&|v| v["stacks"] = serde_json::json!([])), "no stacks");
    assert!(m.contains("which the recording does not have"), "{m}");
    let m = refused(
        &edit(&|v| {
            let s = &mut v["checkpoints"][1]["sites"][0];
            s["free_bytes"] = (s["alloc_bytes"].as_u64().unwrap() + 1).into();
        }),
        "free > alloc",
    );
    assert!(m.contains("freed") && m.contains("but allocated only"), "{m}");
    let m = refused(&edit(&|v| v["checkpoints"][2]["t_s"] = serde_json::json!(-1.0)), "negative time");
    assert!(m.contains("not a finite number of seconds"), "{m}");
    let m = refused(&edit(&|v| v["checkpoints"][3]["t_s"] = serde_json::json!(0.0)), "time going back");
    assert!(m.contains("before the one before it"), "{m}");
    let m = refused(
        &edit(&|v| {
            let first = v["stacks"][0].clone();
            v["stacks"].as_array_mut().unwrap().push(first);
        }),
        "duplicate stack",
    );
    assert!(m.contains("appears twice"), "{m}");
    let m = refused(&edit(&|v| v["format_version"] = 99.into()), "version");
    assert!(m.contains("recording format 99 is not supported"), "{m}");
    let m = refused(b"", "empty");
    assert!(m.contains("not valid JSON"), "{m}");
}

#[test]
fn files_past_the_size_cap_are_refused_before_reading() {
    let dir = std::env::temp_dir().join(format!("leaktrace-hostile-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A sparse 10 GB file: refused from its size, nothing read (this returns at once).
    let huge = dir.join("huge.json");
    std::fs::File::create(&huge).unwrap().set_len(10 << 30).unwrap();
    let started = Instant::now();
    let e = format!("{:#}", Recording::load(&huge).unwrap_err());
    assert!(e.contains("is 10737418240 bytes, more than the 1073741824 bytes"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(1), "refused without reading");
    // The cap applies to any file: the seed under a cap smaller than itself.
    let small = dir.join("recording.json");
    std::fs::write(&small, SEED).unwrap();
    let e = format!("{:#}", Recording::load_limited(&small, 1000).unwrap_err());
    assert!(e.contains("more than the 1000 bytes"), "{e}");
    assert!(Recording::load(&small).is_ok());
    let e = format!("{:#}", Recording::load(&dir).unwrap_err());
    assert!(e.contains("not a regular file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
