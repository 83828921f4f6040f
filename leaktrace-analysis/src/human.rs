//! Human-readable numbers, the one place bytes, rates and counts are formatted for every output
//! (reports, summary, check, compare, the recorder's status line): binary units (KiB = 1024 B),
//! always paired with the exact figure where precision matters. A leaf: it uses nothing else of
//! leaktrace.

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// `bytes` in binary units with one decimal: "512 B", "1.5 KiB", "3.0 MiB".
pub fn bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// A signed byte count with its sign: "+1.5 KiB", "-512 B", "0 B".
pub fn bytes_signed(b: i64) -> String {
    match b.cmp(&0) {
        std::cmp::Ordering::Greater => format!("+{}", bytes(b as u64)),
        std::cmp::Ordering::Less => format!("-{}", bytes(b.unsigned_abs())),
        std::cmp::Ordering::Equal => "0 B".to_string(),
    }
}

/// A rate in bytes per second, signed, in binary units: "+1000 B/s", "+1.2 MiB/s".
pub fn rate(bytes_per_s: f64) -> String {
    if !bytes_per_s.is_finite() {
        return "? B/s".to_string();
    }
    let sign = if bytes_per_s > 0.0 {
        "+"
    } else if bytes_per_s < 0.0 {
        "-"
    } else {
        ""
    };
    let a = bytes_per_s.abs();
    if a < 1024.0 {
        return format!("{sign}{a:.0} B/s");
    }
    let mut v = a;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{sign}{v:.1} {}/s", UNITS[u])
}

/// Exact bytes with thousands separators: "1,572,864 B".
pub fn exact(bytes: u64) -> String {
    format!("{} B", group(bytes.to_string()))
}

/// Signed exact bytes: "+1,000 B", "-5 B".
pub fn exact_signed(b: i64) -> String {
    let sign = if b > 0 {
        "+"
    } else if b < 0 {
        "-"
    } else {
        ""
    };
    format!("{sign}{} B", group(b.unsigned_abs().to_string()))
}

fn group(digits: String) -> String {
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds with sensible precision: "0.5 s", "42 s", "1 h 2 min".
pub fn seconds(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "? s".to_string();
    }
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 600.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min {:.0} s", (s / 60.0).floor(), s % 60.0)
    } else {
        format!("{:.0} h {:.0} min", (s / 3600.0).floor(), (s % 3600.0) / 60.0)
    }
}

/// A rate with thousands separators: "1,024 B/unit", "12.5 B/s", "0 B/unit".
pub fn rate_in(x: f64, unit: &str) -> String {
    format!("{} {unit}", number(x))
}

/// A number for humans: integers with thousands separators from 100 up, at most one decimal
/// from 1, two below.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "?".into();
    }
    let a = x.abs();
    let sign = if x < 0.0 && (a >= 0.005) { "-" } else { "" };
    if a >= 100.0 {
        let digits = format!("{:.0}", a);
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if a >= 1.0 && (a - a.round()).abs() < 0.05 {
        format!("{sign}{:.0}", a.round())
    } else if a >= 1.0 {
        format!("{sign}{a:.1}")
    } else if a < 0.005 {
        "0".into()
    } else {
        format!("{sign}{a:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert!(bytes(u64::MAX).ends_with(" PiB"));
        assert_eq!(bytes_signed(-512), "-512 B");
        assert_eq!(rate(1000.0), "+1000 B/s");
        assert_eq!(rate(-2048.0), "-2.0 KiB/s");
        assert_eq!(rate(f64::NAN), "? B/s");
        assert_eq!(exact(1_572_864), "1,572,864 B");
        assert_eq!(exact(100), "100 B");
        assert_eq!(exact_signed(-1000), "-1,000 B");
        assert_eq!(seconds(61.0), "61 s");
    }

    #[test]
    fn rates_and_numbers() {
        assert_eq!(rate_in(1024.0, "B/unit"), "1,024 B/unit");
        assert_eq!(rate_in(0.0, "B/s"), "0 B/s");
        assert_eq!(rate_in(12.34, "B/s"), "12.3 B/s");
        assert_eq!(number(-1234567.0), "-1,234,567");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(50.0), "50");
        assert_eq!(number(99.96), "100");
        assert_eq!(number(-0.001), "0");
    }
}
