//! Hybrid KV accounting (`kv_cache_groups`): instead of a pool of blocks, one byte budget
//! per rank shared by cache groups, each with its own page size and, for sliding-window and
//! convolution layers, a window beyond which pages are dropped (docs/hybrid-kv.md §1.3).
//!
//! A request holds one [`GroupLease`]: while a forward pass takes it from `before` to
//! `after` computed tokens, group `g` (pages of `P` tokens, window `W`) holds pages
//! `[first, ceil(after / P))` with `first = 0` for full attention and
//! `first = max(0, before - (W - 1)) / P` for a window. The window is measured from the
//! pass's first query (`before`), so a prefill chunk holds all of its own pages in every
//! group. Prefix caching is off with groups, so nothing is shared and nothing is cached:
//! a lease is the request's alone and freeing it gives its bytes straight back.

use crate::config::EngineConfig;

/// Page geometry of one group, as the arithmetic needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    page_tokens: u64,
    /// `log2(page_tokens)` when it is a power of two (pages are almost always 16 tokens):
    /// a shift then replaces the division, which every group pays twice a token.
    shift: Option<u32>,
    page_bytes: u64,
    /// Retained history in tokens (`None`: full attention).
    window: Option<u64>,
}

impl Geometry {
    fn new(page_tokens: u64, page_bytes: u64, window: Option<u64>) -> Self {
        let shift = page_tokens.is_power_of_two().then(|| page_tokens.trailing_zeros());
        Self { page_tokens, shift, page_bytes, window }
    }

    #[inline]
    fn div(&self, x: u64) -> u64 {
        match self.shift {
            Some(s) => x >> s,
            None => x / self.page_tokens,
        }
    }

    #[inline]
    fn rem(&self, x: u64) -> u64 {
        match self.shift {
            Some(s) => x & ((1 << s) - 1),
            None => x % self.page_tokens,
        }
    }

    /// Pages held during a pass from `before` to `after` computed tokens.
    #[inline]
    fn pages(&self, before: u64, after: u64) -> std::ops::Range<u64> {
        let first = self.window.map_or(0, |w| self.div(before.saturating_sub(w - 1)));
        // ceil(after / P) without overflow: after < 2^33 (u32 token counts).
        first..self.div(after + self.page_tokens - 1)
    }

    /// How many pages [`Self::pages`] holds.
    #[inline]
    fn span(&self, before: u64, after: u64) -> u64 {
        let r = self.pages(before, after);
        r.end.saturating_sub(r.start)
    }
}

/// What one request holds across all groups: its bytes and its page count, and the token
/// range they were computed for (which gives each group's share back, with no per-group
/// list to keep per request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupLease {
    bytes: u64,
    pages: u64,
    before: u32,
    after: u32,
}

impl GroupLease {
    /// Bytes the request holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Pages the request holds, summed over the groups.
    pub fn pages(&self) -> u64 {
        self.pages
    }
}

/// The byte budget of one rank with cache groups, and what its leases use of it.
#[derive(Debug, Clone)]
pub struct GroupedPool {
    groups: Vec<Geometry>,
    capacity_bytes: u64,
    used_bytes: u64,
    active_pages: u64,
    /// Pages live leases hold, per group.
    group_pages: Vec<u64>,
    /// Per group, the pages of the lease [`Self::allocate`] is taking (reused).
    next_spans: Vec<u64>,
}

impl GroupedPool {
    /// The pool `config` describes, or `None` when it has no cache groups (the linear
    /// block pool applies). Validation guarantees positive pages, windows and capacity.
    pub fn from_config(config: &EngineConfig) -> Option<Self> {
        if config.kv_cache_groups.is_empty() {
            return None;
        }
        let groups = config
            .kv_cache_groups
            .iter()
            .map(|g| {
                Geometry::new(
                    u64::from(g.block_size_tokens.max(1)),
                    g.page_size_bytes,
                    g.sliding_window.map(|w| u64::from(w.max(1))),
                )
            })
            .collect();
        let capacity_bytes = config.kv_cache_capacity_bytes.unwrap_or(0);
        let n = config.kv_cache_groups.len();
        Some(Self {
            groups,
            capacity_bytes,
            used_bytes: 0,
            active_pages: 0,
            group_pages: vec![0; n],
            next_spans: vec![0; n],
        })
    }

    /// The lease a pass from `before` to `after` computed tokens needs. Saturates instead
    /// of overflowing: a lease of `u64::MAX` bytes fits no pool.
    pub fn lease_for(&self, before: u32, after: u32) -> GroupLease {
        lease_for(&self.groups, before, after, None)
    }

    /// Bytes a pass from `before` to `after` computed tokens holds (see [`Self::lease_for`]).
    #[inline]
    pub fn required_bytes(&self, before: u32, after: u32) -> u64 {
        self.lease_for(before, after).bytes
    }

    /// Replaces `lease` with the one a pass from `before` to `after` needs, across every
    /// group at once, if the other leases leave room for it; pages that fell out of a
    /// window are given back in the same move. On failure nothing changes.
    pub fn allocate(&mut self, lease: &mut GroupLease, before: u32, after: u32) -> bool {
        let next = lease_for(&self.groups, before, after, Some(&mut self.next_spans));
        let others = self.used_bytes - lease.bytes;
        if next.bytes > self.capacity_bytes - others {
            return false;
        }
        self.used_bytes = others + next.bytes;
        self.active_pages = self.active_pages - lease.pages + next.pages;
        // Per group, give back the old lease's pages and take the new one's.
        let old = (u64::from(lease.before), u64::from(lease.after));
        for (i, g) in self.groups.iter().enumerate() {
            let held = if lease.pages == 0 { 0 } else { g.span(old.0, old.1) };
            self.group_pages[i] = self.group_pages[i] - held + self.next_spans[i];
        }
        *lease = next;
        true
    }

    /// How many one-token decode passes after `lease`'s (which must be one: `after ==
    /// before + 1`) keep every group's page range as it is, so allocating for them would
    /// change nothing and the scheduler may count them without touching the lease (a
    /// steady run). 0 for any other lease. Each range moves only when its end crosses a
    /// page boundary or its window's first page falls behind, both periodic in the page.
    pub fn steady_decode_passes(&self, lease: &GroupLease) -> u32 {
        if lease.pages == 0 || lease.after != lease.before + 1 {
            return 0;
        }
        let (b0, a0) = (u64::from(lease.before), u64::from(lease.after));
        let mut passes = u64::from(u32::MAX);
        for g in &self.groups {
            let p = g.page_tokens;
            // ceil(a / P) grows at the first a = kP + 1 past a0.
            passes = passes.min(g.rem(p - g.rem(a0)));
            if let Some(w) = g.window {
                // floor(max(0, b - (W - 1)) / P) grows when b - (W - 1) reaches a
                // positive multiple of P.
                let change = match b0.checked_sub(w - 1) {
                    Some(c) => p - g.rem(c),
                    None => p + (w - 1 - b0),
                };
                passes = passes.min(change - 1);
            }
        }
        passes as u32
    }

    /// Pages and bytes live leases hold in each group, in the groups' order.
    pub fn group_usage(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.groups.iter().zip(&self.group_pages).map(|(g, &pages)| (pages, pages * g.page_bytes))
    }

    /// Gives back everything `lease` holds and empties it.
    pub fn release(&mut self, lease: &mut GroupLease) {
        let lease = std::mem::take(lease);
        self.used_bytes -= lease.bytes;
        self.active_pages -= lease.pages;
        if lease.pages > 0 {
            for (i, g) in self.groups.iter().enumerate() {
                self.group_pages[i] -= g.span(u64::from(lease.before), u64::from(lease.after));
            }
        }
    }

    /// The rank's byte budget (`kv_cache_capacity_bytes`).
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Bytes held by live leases.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes no lease holds.
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes - self.used_bytes
    }

    /// Pages held by live leases, summed over the groups (the reference's `active_blocks`).
    pub fn active_pages(&self) -> u64 {
        self.active_pages
    }
}

/// The lease `groups` need for a pass from `before` to `after` computed tokens, each
/// group's pages also written to `spans` when given.
#[inline]
fn lease_for(groups: &[Geometry], before: u32, after: u32, mut spans: Option<&mut Vec<u64>>) -> GroupLease {
    let mut lease = GroupLease { before, after: after.max(before), ..GroupLease::default() };
    let (before, after) = (u64::from(before), u64::from(after.max(before)));
    for (i, g) in groups.iter().enumerate() {
        let n = g.span(before, after);
        if let Some(s) = spans.as_deref_mut() {
            s[i] = n;
        }
        lease.pages += n;
        lease.bytes = lease.bytes.saturating_add(n.saturating_mul(g.page_bytes));
    }
    lease
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheGroupKind, KvCacheGroup};

    fn group(name: &str, page_tokens: u32, page_bytes: u64, window: Option<u32>) -> KvCacheGroup {
        KvCacheGroup {
            name: name.into(),
            kind: CacheGroupKind::Attention,
            num_layers: 1,
            block_size_tokens: page_tokens,
            page_size_bytes: page_bytes,
            sliding_window: window,
        }
    }

    fn pool(groups: Vec<KvCacheGroup>, capacity: u64) -> GroupedPool {
        let config = EngineConfig {
            kv_cache_groups: groups,
            kv_cache_capacity_bytes: Some(capacity),
            ..Default::default()
        };
        GroupedPool::from_config(&config).expect("groups")
    }

    /// docs/hybrid-kv.md §1.4 (case B6): gpt-oss-120B-like, 18 full + 18 window-128
    /// layers, 16-token pages of 589,824 bytes, 40 GiB, one 10,000-token prompt.
    #[test]
    fn worked_example_of_the_doc() {
        let page = 18 * 16 * 2 * 8 * 64 * 2;
        assert_eq!(page, 589_824);
        let mut p = pool(vec![group("full", 16, page, None), group("swa", 16, page, Some(128))], 40 << 30);
        assert_eq!(p.capacity_bytes() / page, 72_817);
        let mut lease = GroupLease::default();
        assert!(p.allocate(&mut lease, 0, 10_000));
        assert_eq!((lease.pages(), lease.bytes()), (1250, 737_280_000));
        // First decode: full ceil(10001/16) = 626 pages; window (10000-127)/16 = 617..626.
        assert!(p.allocate(&mut lease, 10_000, 10_001));
        assert_eq!((lease.pages(), lease.bytes()), (635, 374_538_240));
        assert_eq!((p.active_pages(), p.used_bytes()), (635, 374_538_240));
        // Per group: the full history's 626 pages, the window's 9.
        let usage: Vec<(u64, u64)> = p.group_usage().collect();
        assert_eq!(usage, vec![(626, 626 * page), (9, 9 * page)]);
        p.release(&mut lease);
        assert_eq!((p.active_pages(), p.used_bytes(), lease), (0, 0, GroupLease::default()));
        assert!(p.group_usage().all(|u| u == (0, 0)));
    }

    /// B5: window 48 on 16-token pages holds ceil(W/P) or ceil(W/P)+1 pages in decode.
    #[test]
    fn window_pages_in_steady_decode() {
        let p = pool(vec![group("swa", 16, 1, Some(48))], 1 << 20);
        let held: Vec<u64> = (100..160).map(|n| p.lease_for(n, n + 1).pages()).collect();
        assert!(held.iter().all(|&n| n == 3 || n == 4), "{held:?}");
        assert_eq!(p.lease_for(0, 100).pages(), 7, "a prefill chunk holds every page");
        // C1: 1-token pages, window 4: 100 in prefill, 4 in every decode pass.
        let c1 = pool(vec![group("conv", 1, 1, Some(4))], 1 << 20);
        assert_eq!(c1.lease_for(0, 100).pages(), 100);
        assert!((100..160).all(|n| c1.lease_for(n, n + 1).pages() == 4));
        // C2: window 1 and a 2^20-token page: one page at all times.
        let c2 = pool(vec![group("state", 1 << 20, 8, Some(1))], 1 << 20);
        assert!([(0, 100), (100, 101), (5000, 5001)].iter().all(|&(b, a)| c2.lease_for(b, a).pages() == 1));
    }

    /// Steady decode passes keep every group's page range, and the pass after them moves
    /// one (checked against the page arithmetic itself over many geometries).
    #[test]
    fn steady_decode_passes_match_the_page_ranges() {
        let geometries = [
            vec![group("full", 16, 1, None)],
            vec![group("full", 16, 1, None), group("swa", 16, 1, Some(512))],
            vec![group("full", 16, 1, None), group("swa", 16, 1, Some(48)), group("conv", 16, 1, Some(4))],
            vec![group("odd", 12, 1, None), group("w", 5, 1, Some(7))],
            vec![group("one", 1, 1, None)],
            vec![group("state", 1 << 20, 8, Some(1))],
        ];
        for groups in geometries {
            let p = pool(groups, 1 << 40);
            for b0 in 0..700u32 {
                let mut lease = GroupLease::default();
                assert!(p.clone().allocate(&mut lease, b0, b0 + 1));
                let n = p.steady_decode_passes(&lease);
                let ranges = |b: u64| p.groups.iter().map(move |g| g.pages(b, b + 1));
                let base: Vec<_> = ranges(u64::from(b0)).collect();
                for j in 1..=u64::from(n).min(5000) {
                    assert!(ranges(u64::from(b0) + j).eq(base.iter().cloned()), "b0 {b0} pass {j} of {n}");
                }
                if n < 5000 {
                    let after: Vec<_> = ranges(u64::from(b0 + n) + 1).collect();
                    assert_ne!(after, base, "b0 {b0}: the pass after {n} steady ones moves a range");
                }
            }
        }
        let p = pool(vec![group("full", 16, 1, None)], 1 << 20);
        assert_eq!(p.steady_decode_passes(&p.lease_for(0, 100)), 0, "a prefill lease starts no run");
        assert_eq!(p.steady_decode_passes(&GroupLease::default()), 0);
    }

    /// The reference's own example: atomic reservation over groups, failure leaves the
    /// lease unchanged, expired window pages are reused.
    #[test]
    fn atomic_reservation_and_expired_pages() {
        let mut p = pool(vec![group("full", 4, 8, None), group("window", 2, 6, Some(3))], 42);
        let (mut first, mut second) = (GroupLease::default(), GroupLease::default());
        assert!(p.allocate(&mut first, 0, 4));
        assert_eq!(first.bytes(), 20);
        assert!(p.allocate(&mut second, 0, 2));
        assert_eq!(second.bytes(), 14);
        assert!(!p.allocate(&mut first, 4, 8), "34 + 14 > 42");
        assert_eq!((first.bytes(), p.used_bytes()), (20, 34));
        p.release(&mut second);
        assert!(p.allocate(&mut first, 4, 8));
        assert_eq!(p.used_bytes(), 34);
        assert!(p.allocate(&mut first, 8, 9));
        assert_eq!((first.pages(), p.used_bytes()), (5, 36));
        let pages: u64 = p.group_usage().map(|u| u.0).sum();
        assert_eq!(pages, p.active_pages(), "per-group pages add up");
        assert_eq!(p.group_usage().map(|u| u.1).sum::<u64>(), p.used_bytes());
        p.release(&mut first);
        p.release(&mut first);
        assert_eq!((p.used_bytes(), p.active_pages(), p.free_bytes()), (0, 0, 42));
        assert!(p.group_usage().all(|u| u == (0, 0)));
    }
}
