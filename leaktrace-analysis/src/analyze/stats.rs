//! The statistics: least-squares trends with their 95 % intervals, the steady window, and the
//! confidence factors.

use super::*;

/// Theil–Sen slope of `(t_s, bytes)` points, bytes per second: the median of the slopes between
/// every two points at different times (at most 200 points are used, evenly spaced). Robust to
/// a few points far off the line: blocks caught live at one checkpoint, between their malloc
/// and their free, move it little. None with fewer than two distinct times.
pub(crate) fn median_slope(points: &[(f64, f64)]) -> Option<f64> {
    let step = points.len().div_ceil(200).max(1);
    let pts: Vec<(f64, f64)> = points.iter().step_by(step).copied().collect();
    let mut slopes: Vec<f64> = Vec::new();
    for (i, a) in pts.iter().enumerate() {
        for b in &pts[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    if slopes.is_empty() {
        return None;
    }
    slopes.sort_by(f64::total_cmp);
    let m = slopes.len() / 2;
    Some(if slopes.len() % 2 == 1 { slopes[m] } else { 0.5 * (slopes[m - 1] + slopes[m]) })
}

/// Two-sided 95 % quantile of Student's t with `df` degrees of freedom.
pub fn t_crit95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        // 1.96 + 2.4/df matches the table within 0.003 at df = 40, 60, 120.
        _ => 1.96 + 2.4 / df as f64,
    }
}

/// Least-squares fit of `(t_s, bytes)` points. See [`Trend`].
pub fn fit(points: &[(f64, f64)]) -> Trend {
    let n = points.len();
    let mut tr = Trend { n, ..Trend::default() };
    if n == 0 {
        return tr;
    }
    tr.from_s = points[0].0;
    tr.to_s = points[n - 1].0;
    let nf = n as f64;
    let mt = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    if n < 2 || sxx.is_nan() || sxx <= 0.0 || !sxx.is_finite() {
        return tr;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    if !slope.is_finite() {
        return tr;
    }
    tr.slope_bytes_per_s = slope;
    if n < 3 {
        return tr;
    }
    let resid: Vec<f64> = points.iter().map(|p| p.1 - (my + slope * (p.0 - mt))).collect();
    let ssr: f64 = resid.iter().map(|e| e * e).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    // Residuals below float rounding of the data are a perfect fit.
    let ssr = if ssr <= syy * 1e-18 { 0.0 } else { ssr };
    let mut se = (ssr / (nf - 2.0) / sxx).sqrt();
    if n >= 6 && ssr > 0.0 {
        // Checkpoint series are autocorrelated (a burst stays live for several checkpoints);
        // widen the error by sqrt((1+r)/(1-r)), r = lag-1 autocorrelation of the residuals.
        let r: f64 = resid.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / ssr;
        let r = r.clamp(0.0, 0.9);
        se *= ((1.0 + r) / (1.0 - r)).sqrt();
    }
    if !se.is_finite() {
        return tr;
    }
    let ci = t_crit95(n - 2) * se;
    let t = if se > 0.0 {
        (slope / se).clamp(-T_CAP, T_CAP)
    } else if slope == 0.0 {
        0.0
    } else {
        T_CAP.copysign(slope)
    };
    tr.stderr_bytes_per_s = Some(se);
    tr.ci95_bytes_per_s = Some(ci);
    tr.t_stat = Some(t);
    tr.significant_growth = slope > 0.0 && slope - ci > 0.0;
    tr
}

/// Checkpoint windows, as index ranges into the time-sorted checkpoints.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Windows {
    /// Last half of the analysed span (or all of it, see `whole_run`).
    pub(super) steady: std::ops::Range<usize>,
    /// From the first checkpoint of the span to the first checkpoint of the steady window,
    /// inclusive.
    pub(super) early: Option<std::ops::Range<usize>>,
    /// Last quarter of the span, up to the last checkpoint at which the process was active.
    pub(super) late: Option<std::ops::Range<usize>>,
    /// The process made no allocation or free during the last quarter: no plateau check was
    /// possible (a site that stopped growing when the process went idle may be a leak or a
    /// filled cache).
    pub(super) late_idle: bool,
    pub(super) whole_run: bool,
}

/// Windows over `span` (indexes into the time-sorted `times`); `last_active` is the index of the
/// first checkpoint after the process's last allocation or free (the plateau check ends there:
/// an idle process cannot show a plateau).
pub(super) fn windows(times: &[f64], span: std::ops::Range<usize>, last_active: usize) -> Windows {
    let (a, b) = (span.start.min(times.len()), span.end.min(times.len()));
    let ts = &times[a..b];
    let whole = Windows { steady: a..b, early: None, late: None, late_idle: false, whole_run: true };
    let (Some(&t0), Some(&t1)) = (ts.first(), ts.last()) else { return whole };
    let dur = t1 - t0;
    let start = a + ts.partition_point(|&t| t < t0 + dur / 2.0);
    if dur.is_nan() || dur <= 0.0 || b - start < MIN_WINDOW_POINTS || start == a {
        return whole;
    }
    let late_start = a + ts.partition_point(|&t| t < t0 + dur * 0.75);
    let late_end = (last_active + 1).clamp(a, b);
    let late = (late_end.saturating_sub(late_start) >= MIN_PLATEAU_POINTS && late_start > start)
        .then_some(late_start..late_end);
    let late_idle = late.is_none() && b.saturating_sub(late_start) >= MIN_PLATEAU_POINTS;
    Windows { steady: start..b, early: Some(a..start + 1), late, late_idle, whole_run: false }
}

/// Index range of the checkpoints whose time lies in `[from, to]` (`times` sorted).
pub(super) fn time_range(times: &[f64], from: f64, to: f64) -> std::ops::Range<usize> {
    times.partition_point(|&t| t < from)..times.partition_point(|&t| t <= to)
}

pub(super) fn points(times: &[f64], ys: &[u64], r: std::ops::Range<usize>) -> Vec<(f64, f64)> {
    r.filter_map(|i| Some((*times.get(i)?, *ys.get(i)? as f64))).collect()
}

/// Least-squares fit of `ys` against units of work over the checkpoints `r` that counted them
/// (slope in bytes per unit). None when the window holds fewer than 2 distinct unit counts: no
/// work was done, so no per-unit growth can be measured.
pub(super) fn unit_fit(units: &[Option<u64>], ys: &[u64], r: std::ops::Range<usize>) -> Option<Trend> {
    let pts: Vec<(f64, f64)> = r.filter_map(|i| Some(((*units.get(i)?)? as f64, *ys.get(i)? as f64))).collect();
    let first = pts.first()?.0;
    pts.iter().any(|p| p.0 != first).then(|| fit(&pts))
}

/// Factor for the number of checkpoints in a window: 0.25 below 3, 0.5 at 3, 1 from 10.
pub(super) fn f_points(n: usize) -> f64 {
    if n < MIN_WINDOW_POINTS { 0.25 } else { (0.5 + 0.5 * (n - MIN_WINDOW_POINTS) as f64 / 7.0).min(1.0) }
}

/// Factor for the strength of a significant slope: 1 − (t_crit / t)².
pub(super) fn f_tstat(tr: &Trend) -> f64 {
    let crit = t_crit95(tr.n.saturating_sub(2));
    match tr.t_stat {
        Some(t) if t > crit => 1.0 - (crit / t).powi(2),
        _ => 0.0,
    }
}

/// A t statistic for humans: one decimal, "> 1000" for (near-)perfect fits, "n/a" without one.
pub(super) fn fmt_t(t: Option<f64>) -> String {
    match t {
        Some(t) if t.abs() >= 1000.0 => format!("{}> 1000", if t < 0.0 { "-" } else { "" }),
        Some(t) => format!("= {t:.1}"),
        None => "n/a".to_string(),
    }
}

pub(super) fn round3(x: f64) -> f64 {
    if x.is_finite() { (x * 1000.0).round() / 1000.0 } else { 0.0 }
}

pub(super) fn clamp_conf(x: f64) -> f64 {
    round3(if x.is_finite() { x.clamp(0.01, 0.99) } else { 0.01 })
}
