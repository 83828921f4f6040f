//! Site indices given back (`leaktrace watch`, whose processes come and go for days): the
//! indices of a released process's `SITES` entries go back to the kernel side's `FREE_SITES`
//! queue, which it takes from before a new index from `NEXT_SITE`, so that `--max-sites` bounds
//! the sites of the processes traced at once, not of every process ever traced.
//!
//! Order (see `leaktrace-ebpf/src/probes.rs`, `site_index` and `account_free`):
//! 1. at release, the process's `SITES` entries are deleted, then `SITE_EPOCH` is bumped: a
//!    `SITE_CACHE` entry made before is not taken again (a reused PID with the same stack looks
//!    its site up anew, it never counts under the old index);
//! 2. the indices wait ([`SiteRecycler`]) until the process's uprobe links are detached (each
//!    drop waits for the probes that were running) and [`QUARANTINE`] has passed since that was
//!    seen: no probe of the released process can still add to them;
//! 3. then, for each index: `SITE_SINCE` is set to now less [`SINCE_MARGIN_MS`] (a later free of
//!    a block born before, the former owner's, is not credited), its `SITE_STATS` slot is zeroed,
//!    and it is pushed to `FREE_SITES`.

use anyhow::Context as _;
use aya::maps::{Array, MapData, Queue};
use leaktrace_common::SiteStats;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Size the kernel side's site maps (`SITES`, `SITE_STATS`, `SITE_INDICES`, `FREE_SITES`,
/// `SITE_SINCE`) for `max_sites` sites (--max-sites).
pub fn size_site_maps<'a, 'b>(loader: &'a mut aya::EbpfLoader<'b>, max_sites: u32) -> &'a mut aya::EbpfLoader<'b> {
    ["SITES", "SITE_STATS", "SITE_INDICES", "FREE_SITES", "SITE_SINCE"]
        .into_iter()
        .fold(loader, |l, name| l.map_max_entries(name, max_sites))
}

/// How long indices wait after their process's links are seen detached.
pub const QUARANTINE: Duration = Duration::from_secs(1);

/// `SITE_SINCE` is set this much before now (ms): the kernel side's clock (jiffies) may lag the
/// agent's by a tick, and a block the new owner allocates must not count as older than that.
/// Blocks of the former owner are at least [`QUARANTINE`] older.
pub const SINCE_MARGIN_MS: u64 = 500;

/// The indices of one released process, waiting to be given back.
struct Batch {
    indices: Vec<u32>,
    /// The thread detaching the process's links (None: it had none).
    detach: Option<JoinHandle<()>>,
    /// When the detach was first seen finished.
    detached_at: Option<Instant>,
}

/// The kernel side's maps for giving site indices back, and the indices waiting.
pub struct SiteRecycler {
    free: Queue<MapData, u32>,
    epoch: Array<MapData, u64>,
    since: Array<MapData, u32>,
    waiting: Vec<Batch>,
    /// Indices given back so far.
    given_back: u64,
}

impl SiteRecycler {
    /// Take the maps (`FREE_SITES`, `SITE_EPOCH`, `SITE_SINCE`) out of the loaded object.
    /// Errors: a map is missing or of another type.
    pub fn new(ebpf: &mut aya::Ebpf) -> anyhow::Result<SiteRecycler> {
        let mut take = |name: &str| ebpf.take_map(name).with_context(|| format!("eBPF map {name} missing"));
        Ok(SiteRecycler {
            free: Queue::try_from(take("FREE_SITES")?)?,
            epoch: Array::try_from(take("SITE_EPOCH")?)?,
            since: Array::try_from(take("SITE_SINCE")?)?,
            waiting: Vec::new(),
            given_back: 0,
        })
    }

    /// A process's `SITES` entries were just deleted (their indices: `indices`; its links are
    /// being detached by `detach`): no cached index of them is taken from now on, and the
    /// indices are given back once safe ([`SiteRecycler::give_back`]).
    pub fn released(&mut self, indices: Vec<u32>, detach: Option<JoinHandle<()>>) {
        if indices.is_empty() {
            return;
        }
        let e = self.epoch.get(&0, 0).unwrap_or(0);
        let _ = self.epoch.set(0, e.wrapping_add(1), 0);
        self.waiting.push(Batch { indices, detach, detached_at: None });
    }

    /// Give back the indices whose quarantine is over; `now_ms`: now on the clock of blocks'
    /// birth times (`AllocInfo::born_ms`). Returns how many went back. An index whose slot
    /// cannot be reset is kept spent (never given back half reset).
    pub fn give_back(&mut self, stats: &mut Array<MapData, SiteStats>, now_ms: u64) -> usize {
        let now = Instant::now();
        let mut ready = Vec::new();
        self.waiting.retain_mut(|b| {
            if b.detached_at.is_none() && b.detach.as_ref().is_none_or(JoinHandle::is_finished) {
                b.detached_at = Some(now);
            }
            match b.detached_at {
                Some(t) if now.duration_since(t) >= QUARANTINE => {
                    ready.append(&mut b.indices);
                    false
                }
                _ => true,
            }
        });
        let since = u32::try_from(now_ms.saturating_sub(SINCE_MARGIN_MS)).unwrap_or(u32::MAX);
        let mut n = 0;
        for i in ready {
            if self.since.set(i, since, 0).is_ok()
                && stats.set(i, SiteStats::default(), 0).is_ok()
                && self.free.push(i, 0).is_ok()
            {
                n += 1;
            }
        }
        self.given_back += n as u64;
        n
    }

    /// Indices given back so far, and indices waiting.
    pub fn counts(&self) -> (u64, usize) {
        (self.given_back, self.waiting.iter().map(|b| b.indices.len()).sum())
    }
}
