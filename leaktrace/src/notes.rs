//! The one way the library tells the user something while it works (a warning, a probe placed,
//! a target paused for a scan): one line at a time, through the reporter the command line
//! installs ([`install`]); library modules never print to stderr themselves (`clippy::print_stderr`
//! is denied in `[workspace.lints]`, allowed only at the roots of main.rs, xtask and the
//! end-to-end tests). Without a reporter installed (a program using the library, the unit
//! tests) the lines go to stderr, as the command line's do.
//!
//! The lines are the user's, not a log: each already starts with `leaktrace: ` and reads on its
//! own. Use [`note!`](crate::note) as `eprintln!`.

use std::sync::OnceLock;

/// Where the lines go: called once per line, without its newline.
pub type Reporter = Box<dyn Fn(&str) + Send + Sync>;

static REPORTER: OnceLock<Reporter> = OnceLock::new();

/// Send every line from now on to `reporter`. Once per process: a second call returns its
/// reporter back, unused.
pub fn install(reporter: Reporter) -> Result<(), Reporter> {
    REPORTER.set(reporter)
}

/// Tell the user `line` (one line, no newline): through the installed reporter, else on stderr.
pub fn note(line: &str) {
    match REPORTER.get() {
        Some(r) => r(line),
        None => to_stderr(line),
    }
}

/// The reporter of the command line: each line on stderr.
#[allow(clippy::print_stderr, reason = "the one place the library's lines reach stderr")]
pub fn to_stderr(line: &str) {
    eprintln!("{line}");
}

/// `note!("leaktrace: …", args)`: format a line as `eprintln!` does and [`note`] it.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::notes::note(&format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn lines_go_to_the_installed_reporter_and_only_one_is_installed() {
        static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
        // Other tests of this process may note lines too: they land here as well.
        assert!(install(Box::new(|l| LINES.lock().unwrap().push(l.to_string()))).is_ok());
        crate::note!("leaktrace: PID {}: {}", 42, "a warning");
        assert!(LINES.lock().unwrap().iter().any(|l| l == "leaktrace: PID 42: a warning"));
        assert!(install(Box::new(to_stderr)).is_err(), "a second reporter is refused");
    }
}
