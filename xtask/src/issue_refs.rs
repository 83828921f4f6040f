//! `cargo xtask lint`'s check that no source file or document refers to the project's issue
//! tracker: a comment or a doc says what the code does and why; which issue asked for it is
//! history, and history is `git log`'s.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Every tracked `*.rs` and `*.md` file under `root` (vendored code left out) with a line that
/// names an issue by number ("issue 34", "Issue #31", "(#14)"), as `file:line: text`.
pub(crate) fn find(root: &Path) -> Result<Vec<String>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z", "--", "*.rs", "*.md"])
        .output()
        .context("cannot run git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut found = Vec::new();
    for name in out.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        // This file's own tests spell out what it finds.
        if name.starts_with("vendor/") || name == "xtask/src/issue_refs.rs" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&name)) else { continue };
        for (i, line) in text.lines().enumerate() {
            if names_an_issue(line) {
                found.push(format!("{name}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    Ok(found)
}

/// Whether `line` names an issue of this project by number: "issue" (any case) followed by a
/// space, an optional `#` and a digit, or `(#` followed by a digit.
fn names_an_issue(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let digit_after = |rest: &str| rest.trim_start_matches('#').starts_with(|c: char| c.is_ascii_digit());
    lower.match_indices("issue ").any(|(at, m)| digit_after(&lower[at + m.len()..]))
        || lower.match_indices("(#").any(|(at, m)| digit_after(&lower[at + m.len()..]))
}

#[cfg(test)]
mod tests {
    use super::names_an_issue;

    #[test]
    fn issue_numbers_are_found_and_other_text_is_not() {
        for line in [
            "// Growth mode (issue 34): pages",
            "/// Issue #31: censuses",
            "//! Reachability (#14)",
            "issue #13's goals",
        ] {
            assert!(names_an_issue(line), "{line}");
        }
        for line in ["// an issue with the kernel", "// color: #555", "// see golang/go#57175", "// item 3 of the list"]
        {
            assert!(!names_an_issue(line), "{line}");
        }
    }
}
