//! A leak that grows in steps, judged by its envelope. A buffer grown with `realloc` as records
//! are appended and never shrunk (a log buffer per connection, doubling when full) holds the
//! same blocks while the allocator's view of them rises in steps, flat in between; the steps
//! come further apart as the buffer doubles. A least-squares line through such stairs has a
//! 95 % interval as wide as its slope, so the slope test alone calls it "not significant". Stairs
//! that only go up are growth: judged by their count and the line through their high-water
//! marks (the envelope), not by a fit through the treads.

use super::thresholds::MIN_ENVELOPE_STEPS;

/// The stairs of a site's live bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Envelope {
    /// Steps: separate runs of checkpoint intervals in which live bytes rose to a new high-water
    /// mark (a run starting at the recording's first interval, start-up, not counted).
    pub steps: usize,
    /// Slope of the envelope, bytes per second: from the first counted step's high-water mark to
    /// the last one's, each at the checkpoint that first saw it.
    pub rate: f64,
}

/// The envelope of `live` (bytes at each checkpoint, times in `times`) over the analysed span
/// `start..end`, when it is stairs that only go up: live bytes never fell from one checkpoint to
/// the next; at least [`MIN_ENVELOPE_STEPS`] steps; the last one at or after `steady_start` (in
/// the steady window); and the flat stretch after it no longer than twice the gap between the
/// last two steps (a doubling buffer's next step comes after twice the last gap; a longer flat
/// end is growth that stopped). None otherwise.
pub(super) fn envelope(times: &[f64], live: &[u64], start: usize, end: usize, steady_start: usize) -> Option<Envelope> {
    let end = end.min(live.len()).min(times.len());
    if end < start + 3 {
        return None;
    }
    let span = &live[start..end];
    if span.windows(2).any(|w| w[1] < w[0]) {
        return None;
    }
    // (first interval, checkpoint that first saw the step's top) of each run of rises.
    let mut steps: Vec<(usize, usize)> = Vec::new();
    let mut high = live[start];
    for i in start..end - 1 {
        if live[i + 1] > high {
            high = live[i + 1];
            match steps.last_mut() {
                Some(s) if s.1 == i => s.1 = i + 1,
                _ => steps.push((i, i + 1)),
            }
        }
    }
    steps.retain(|s| s.0 != 0);
    if steps.len() < MIN_ENVELOPE_STEPS {
        return None;
    }
    let corner = |s: &(usize, usize)| (times[s.1], live[s.1] as f64);
    let (first, last) = (corner(&steps[0]), corner(steps.last()?));
    let before_last = corner(&steps[steps.len() - 2]);
    let tail = times[end - 1] - last.0;
    if steps.last()?.1 < steady_start || tail > 2.0 * (last.0 - before_last.0) || last.0 <= first.0 {
        return None;
    }
    Some(Envelope { steps: steps.len(), rate: (last.1 - first.1) / (last.0 - first.0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four buffers doubling together from 4 KiB at 8 KB/s each, sampled every 250 ms for 12 s:
    /// steps at 0.5, 1, 2, 4 and 8 s, the envelope at 65,536 B/s (twice the records' rate); the
    /// same stairs stepping back down (a batch buffer shrunk after use) are no envelope, nor
    /// stairs that stopped long before the end.
    #[test]
    fn doubling_stairs_have_an_envelope_and_a_shrinking_buffer_none() {
        let times: Vec<f64> = (0..=48).map(|k| k as f64 * 0.25).collect();
        let cap = |t: f64| -> u64 {
            let mut c = 4096u64;
            while (c as f64) < 8192.0 * t {
                c *= 2;
            }
            4 * c
        };
        let live: Vec<u64> = times.iter().map(|&t| cap(t)).collect();
        let e = envelope(&times, &live, 0, live.len(), 24).expect("stairs going up");
        assert_eq!(e.steps, 5, "{live:?}");
        assert!((e.rate - 65_536.0).abs() < 0.1 * 65_536.0, "{e:?}");
        // Down again after every 1.5 s (a batch buffer shrunk back): not stairs going up.
        let batch: Vec<u64> = times.iter().map(|&t| cap(t % 1.5)).collect();
        assert_eq!(envelope(&times, &batch, 0, batch.len(), 24), None);
        // Stairs that stopped at 4 s of 12 s: the last step is before the steady window.
        let stopped: Vec<u64> = times.iter().map(|&t| cap(t.min(3.9))).collect();
        assert_eq!(envelope(&times, &stopped, 0, stopped.len(), 24), None);
        // A smooth rise is one run of rises, not stairs: the least-squares fit judges it.
        let smooth: Vec<u64> = times.iter().map(|&t| (1000.0 * t) as u64 + 1).collect();
        assert_eq!(envelope(&times, &smooth, 0, smooth.len(), 24), None);
    }
}
