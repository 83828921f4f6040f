//! Parsers of command-line values shared by `record`, `check` and `watch`.

use std::time::Duration;

/// The longest duration any option takes: 10 years. Longer ones are surely a mistake, and a
/// deadline computed from them (now + duration) would overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A duration option's value: `30s`, `2m`, `250ms`, `1h30m` (humantime) or a number of seconds.
/// Errors, as one line: zero, negative, unparsable, or longer than [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    // (The options taking a duration accept values that begin with '-', so that `-5s` gets this
    // message rather than being taken for an option.)
    if s.trim_start().starts_with('-') {
        return Err("must be greater than zero (examples: 30s, 2m, 250ms)".into());
    }
    let d = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= MAX_DURATION.as_secs_f64() => {
            Duration::from_secs_f64(secs)
        }
        Ok(secs) if secs.is_finite() && secs > 0.0 => Duration::MAX,
        _ => match humantime::parse_duration(s) {
            Ok(d) => d,
            Err(e) => return Err(format!("{e} (examples: 30s, 2m, 250ms)")),
        },
    };
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    if d > MAX_DURATION {
        return Err("too long: at most 10 years".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_range_and_one_line_errors_outside() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["0", "0s", "-5s", "abc", "18446744073709551615s", "18446744073709551615", "11y"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
        assert_eq!(parse_duration("18446744073709551615s").unwrap_err(), "too long: at most 10 years");
    }
}
