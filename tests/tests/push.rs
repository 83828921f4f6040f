//! `record --push URL`: the heap profile sent to a Pyroscope-style ingest endpoint, here a
//! small HTTP server inside the test (127.0.0.1) that answers the first request with 503 and
//! stores the others (`leaktrace_tests::pushserver`); what it received is decoded by the real
//! pprof client, `go tool pprof`.
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use leaktrace_tests::pushserver::{Received, make_certificates, part, query_param, start_server, start_tls_server};
use leaktrace_tests::*;

/// Pushes during and at the end of a recording reach the server after a 503 (retried), with
/// the ingest parameters and labels; the last one, decoded by go tool pprof, names leak_malloc
/// with report.json's live bytes (within 1 %).
#[test]
fn push_to_pyroscope_endpoint_with_retry() {
    require_root();
    const N: u64 = 800;
    let (port, got) = start_server();
    let out = OutDir::new("push");
    let url = format!("http://127.0.0.1:{port}");
    let mut target = Command::new(&fixtures().leaky);
    target.args(["malloc", &N.to_string(), "200"]);
    let o = record_launch(
        &out,
        &["--push", &url, "--push-label", "env=test", "--push-label", "team=mem", "--push-interval", "1s"],
        target,
    );
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\n{}", out.path.display(), r.summary(), o.stderr);
    let got = got.lock().unwrap().clone();
    assert!(got.len() >= 3, "expected the 503, its retry and a final push; got {} request(s)\n{ctx}", got.len());
    assert_eq!(got[0].status, 503, "{ctx}");
    assert!(
        o.stderr.contains("push to") && o.stderr.contains("503 Service Unavailable") && o.stderr.contains("retry 1/"),
        "the failed push is not reported with its retry\n{ctx}"
    );
    let pid = pid_line(&o.stdout).expect("PID line");
    let is_growth = |g: &Received| {
        String::from_utf8_lossy(part(g, "sample_type_config").unwrap_or_default()).contains("growth_space")
    };
    for g in got.iter().filter(|g| g.status == 200 && !is_growth(g)) {
        assert!(g.target.starts_with("/ingest?"), "{}", g.target);
        assert_eq!(query_param(&g.target, "format").as_deref(), Some("pprof"), "{}", g.target);
        assert_eq!(
            query_param(&g.target, "name").as_deref(),
            Some(format!("leaky{{env=test,team=mem,pid={pid}}}").as_str()),
            "{}",
            g.target
        );
        let from: u64 = query_param(&g.target, "from").and_then(|v| v.parse().ok()).expect("from");
        let until: u64 = query_param(&g.target, "until").and_then(|v| v.parse().ok()).expect("until");
        assert!(from < until, "{}", g.target);
        let cfg = String::from_utf8_lossy(part(g, "sample_type_config").expect("sample_type_config part")).into_owned();
        assert!(cfg.contains("\"inuse_space\":{\"units\":\"bytes\",\"aggregation\":\"average\"}"), "{cfg}");
        assert!(part(g, "prev_profile").is_some(), "no prev_profile part");
    }
    // Periodic pushes: more than the final one was accepted.
    assert!(got.iter().filter(|g| g.status == 200).count() >= 2, "{ctx}");

    // The last heap-profile push is the final profile: the real decoder reads it.
    let last = got.iter().rfind(|g| !is_growth(g)).unwrap();
    assert_eq!(last.status, 200);
    // The growth profile is pushed too (after the heap profile), its values snapshots; the leak
    // is what grew.
    let growth = got.iter().rfind(|g| is_growth(g)).unwrap_or_else(|| panic!("no growth profile pushed\n{ctx}"));
    let cfg = String::from_utf8_lossy(part(growth, "sample_type_config").unwrap()).into_owned();
    assert!(cfg.contains("\"growth_space\":{\"units\":\"bytes\",\"aggregation\":\"average\"}"), "{cfg}");
    let file = out.path.join("pushed-growth.pb.gz");
    std::fs::write(&file, part(growth, "profile").expect("profile part")).unwrap();
    let text = go_pprof(&["-top", "-unit=B"], &[&file]);
    assert_eq!(top_rows(&text).first().map(|r| r.1.as_str()), Some("leak_malloc"), "{text}\n{ctx}");
    let file = out.path.join("pushed-last.pb.gz");
    std::fs::write(&file, part(last, "profile").expect("profile part")).unwrap();
    assert_pushed_leak(&file, &r, N, &ctx);
}

/// The pushed heap profile `file`, decoded by go tool pprof, has leak_malloc first with
/// report.json's live bytes (within 1 %), and those are `n` leaks' bytes (within 10 %).
fn assert_pushed_leak(file: &std::path::Path, r: &Report, n: u64, ctx: &str) {
    let (rows, text) = pprof_top_inuse(file);
    assert_eq!(rows.first().map(|r| r.1.as_str()), Some("leak_malloc"), "{text}\n{ctx}");
    let live = i64_of(r.site("leak_malloc"), "live_bytes");
    assert_within("pushed inuse_space of leak_malloc", rows[0].0 as f64, live as f64, 0.01, &format!("{text}\n{ctx}"));
    assert_within("leak_malloc live bytes", live as f64, (n * LEAK_BYTES) as f64, 0.10, ctx);
}

/// `--push-format parca`: WriteRaw over Parca's HTTP/JSON route, retried after a 503; the
/// labels name the profile type and the process, and the raw profile, decoded by go tool pprof,
/// names leak_malloc with report.json's live bytes (within 1 %).
#[test]
fn push_to_parca_endpoint_with_retry() {
    use base64::Engine as _;
    require_root();
    const N: u64 = 600;
    let (port, got) = start_server();
    let out = OutDir::new("push-parca");
    let url = format!("http://127.0.0.1:{port}/parca");
    let mut target = Command::new(&fixtures().leaky);
    target.args(["malloc", &N.to_string(), "200"]);
    let o = record_launch(&out, &["--push", &url, "--push-format", "parca", "--push-label", "k8s.node=n1"], target);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\n{}", out.path.display(), r.summary(), o.stderr);
    let got = got.lock().unwrap().clone();
    assert!(got.len() >= 2, "expected the 503 and its retry; got {} request(s)\n{ctx}", got.len());
    assert_eq!(got[0].status, 503, "{ctx}");
    assert!(o.stderr.contains("retry 1/"), "the failed push is not reported with its retry\n{ctx}");
    let pid = pid_line(&o.stdout).expect("PID line");
    let labels_of = |g: &Received| -> Vec<(String, String)> {
        let j: Value = serde_json::from_slice(&g.body).expect("the WriteRaw body is JSON");
        j["series"][0]["labels"]["labels"]
            .as_array()
            .expect("series[0].labels.labels")
            .iter()
            .map(|l| (l["name"].as_str().unwrap_or("").to_string(), l["value"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    let name_of = |g: &Received| labels_of(g).first().map(|l| l.1.clone()).unwrap_or_default();
    // The heap profile ("memory") and, after it, the growth profile ("memory_growth").
    let last = got.iter().rfind(|g| name_of(g) == "memory").expect("a memory profile");
    assert!(got.iter().any(|g| g.status == 200 && name_of(g) == "memory_growth"), "no growth profile\n{ctx}");
    assert_eq!((last.status, last.target.as_str()), (200, "/parca/profiles/writeraw"), "{ctx}");
    assert_eq!(last.content_type, "application/json");
    let j: Value = serde_json::from_slice(&last.body).expect("the WriteRaw body is JSON");
    let labels = labels_of(last);
    let want: Vec<(String, String)> =
        [("__name__", "memory"), ("job", "leaky"), ("k8s_node", "n1"), ("pid", pid.to_string().as_str())]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    assert_eq!(labels, want, "{j}");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(j["series"][0]["samples"][0]["rawProfile"].as_str().expect("rawProfile"))
        .expect("rawProfile is base64");
    let file = out.path.join("parca-last.pb.gz");
    std::fs::write(&file, raw).unwrap();
    assert_pushed_leak(&file, &r, N, &ctx);
}

/// `--push https://...` with `--push-ca` and `--push-token-file`: the store is an HTTPS server
/// on 127.0.0.1 (rustls) whose certificate a CA made in the test (openssl) signs. Every request
/// carries `Authorization: Bearer` and the token file's line; after the 503 and its retry, the
/// last heap profile, decoded by go tool pprof, names leak_malloc with report.json's live bytes
/// (within 1 %).
#[test]
fn push_over_https_with_a_bearer_token() {
    require_root();
    const N: u64 = 500;
    let dir = temp_root().join(format!("push-tls-{}", std::process::id()));
    let (ca, cert, key) = make_certificates(&dir);
    let token = dir.join("token");
    std::fs::write(&token, "t0ken-e2e\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (port, got) = start_tls_server(&cert, &key);
    let out = OutDir::new("push-https");
    let url = format!("https://127.0.0.1:{port}");
    let mut target = Command::new(&fixtures().leaky);
    target.args(["malloc", &N.to_string(), "200"]);
    let (ca_arg, token_arg) = (ca.to_string_lossy().into_owned(), token.to_string_lossy().into_owned());
    let o = record_launch(&out, &["--push", &url, "--push-ca", &ca_arg, "--push-token-file", &token_arg], target);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\n{}", out.path.display(), r.summary(), o.stderr);
    let got = got.lock().unwrap().clone();
    assert!(got.len() >= 2, "expected the 503 and its retry over TLS; got {} request(s)\n{ctx}", got.len());
    assert_eq!(got[0].status, 503, "{ctx}");
    for g in &got {
        assert_eq!(g.authorization.as_deref(), Some("Bearer t0ken-e2e"), "{}\n{ctx}", g.target);
    }
    let is_growth = |g: &Received| {
        String::from_utf8_lossy(part(g, "sample_type_config").unwrap_or_default()).contains("growth_space")
    };
    let last = got.iter().rfind(|g| !is_growth(g)).unwrap();
    assert_eq!(last.status, 200, "{ctx}");
    assert!(last.target.starts_with("/ingest?"), "{}", last.target);
    let file = out.path.join("pushed-https.pb.gz");
    std::fs::write(&file, part(last, "profile").expect("profile part")).unwrap();
    assert_pushed_leak(&file, &r, N, &ctx);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad --push arguments are one clear error line and exit code 2, before anything is traced:
/// among them a token file others may write, and a token that would go in clear.
#[test]
fn push_bad_arguments() {
    let dir = temp_root().join(format!("push-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "t\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o666)).unwrap();
    let shared = token.to_string_lossy().into_owned();
    let kept = dir.join("kept");
    std::fs::write(&kept, "t\n").unwrap();
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o600)).unwrap();
    let kept = kept.to_string_lossy().into_owned();
    for (args, wanted) in [
        (&["--push", "ftp://x:4040"][..], "expected http[s]://"),
        (&["--push", "https://x", "--push-token-file", &shared][..], "users other than its owner may write it"),
        (&["--push", "http://pyroscope:4040", "--push-token-file", &kept][..], "https:// only"),
        (&["--push", "http://127.0.0.1:1", "--push-label", "novalue"][..], "expected KEY=VALUE"),
        (&["--push-label", "a=b"][..], "--push"),
    ] {
        let mut cmd = leaktrace(["record", "--pid", "1"]);
        cmd.args(args);
        let o = run(cmd, None, TIMEOUT);
        assert_eq!(o.code(), Some(2), "{args:?}\n{}", o.describe());
        assert!(o.stderr.contains(wanted), "{args:?}: no {wanted:?}\n{}", o.describe());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
