//! `leaktrace report DIR` re-renders every output from DIR/recording.json alone, to the same
//! analysis; it needs no root.
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use leaktrace_tests::*;

fn record_small(name: &str) -> OutDir {
    let fx = fixtures();
    let out = OutDir::new(name);
    let mut target = Command::new(&fx.leaky);
    target.args(["malloc", "200", "400"]);
    record_launch(&out, &[], target).assert_success();
    out
}

fn analysis(r: &Report) -> (Value, Value) {
    (r.get(&["sites"]).clone(), r.get(&["verdict"]).clone())
}

#[test]
fn outputs_written_and_rerendered_from_recording_alone() {
    require_root();
    let out = record_small("report");
    assert_outputs_exist(&out.path);
    let original = Report::load(&out.path);
    assert_eq!(original.site("leak_malloc")["live_bytes"].as_u64(), Some(200 * LEAK_BYTES), "{}", original.summary());

    // What each file holds.
    let folded = std::fs::read_to_string(out.file("stacks.folded")).unwrap();
    assert!(folded.lines().any(|l| l.contains("leak_malloc")), "stacks.folded has no leak_malloc stack:\n{folded}");
    let md = std::fs::read_to_string(out.file("report.md")).unwrap();
    assert!(md.contains("leak_malloc"), "report.md does not name leak_malloc");
    for svg in ["live.svg", "growth.svg", "memory.svg"] {
        let text = std::fs::read_to_string(out.file(svg)).unwrap();
        assert!(text.contains("<svg"), "{svg} is not an SVG");
    }
    assert!(
        std::fs::read_to_string(out.file("live.svg")).unwrap().contains("leak_malloc"),
        "live.svg lacks leak_malloc"
    );

    // A directory holding only recording.json.
    let copy = OutDir::new("report-copy");
    std::fs::create_dir_all(&copy.path).unwrap();
    std::fs::copy(out.file("recording.json"), copy.file("recording.json")).unwrap();
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&copy.path);
    run(cmd, None, TIMEOUT).assert_success();
    assert_outputs_exist(&copy.path);
    let again = Report::load(&copy.path);
    assert_eq!(analysis(&again), analysis(&original), "report.json sites/verdict differ after `leaktrace report`");

    // In place, too.
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&out.path);
    run(cmd, None, TIMEOUT).assert_success();
    assert_eq!(analysis(&Report::load(&out.path)), analysis(&original), "in-place re-render differs");
}

#[test]
fn report_needs_no_root() {
    require_root(); // to record; the report itself runs as nobody
    let out = record_small("report-nobody");
    let copy = OutDir::new("report-nobody-copy");
    std::fs::create_dir_all(&copy.path).unwrap();
    std::fs::copy(out.file("recording.json"), copy.file("recording.json")).unwrap();
    let nobody = 65534;
    std::os::unix::fs::chown(&copy.path, Some(nobody), Some(nobody)).unwrap();
    std::os::unix::fs::chown(copy.file("recording.json"), Some(nobody), Some(nobody)).unwrap();
    // The binary copied where nobody may run it (a clone under /root, mode 0700, is not).
    let bin = copy.path.parent().unwrap().join("leaktrace-for-nobody");
    if !bin.exists() {
        std::fs::copy(leaktrace_bin(), &bin).unwrap();
    }
    std::fs::set_permissions(copy.path.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.arg("report").arg(&copy.path).uid(nobody).gid(nobody);
    run(cmd, None, TIMEOUT).assert_success();
    assert_outputs_exist(&copy.path);
    assert_eq!(
        analysis(&Report::load(&copy.path)),
        analysis(&Report::load(&out.path)),
        "report as nobody differs from the original"
    );
}
