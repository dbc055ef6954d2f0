//! Residency metrics: how long cached blocks live, how long they sit idle
//! before eviction, how often and how far apart they are reused.
//!
//! vLLM 0.33.0 samples 1% of blocks (`KVCacheMetricsCollector`); kvcoord can
//! afford every block. Off by default; when on, each block costs 45 bytes
//! (allocation time, its last four accesses for the eviction record's reuse
//! gaps, their count, and a hit count) and every event is O(1).
//!
//! Time is the caller's clock ([`Residency::set_now`]: simulated
//! microseconds, scheduler steps, ...), so results are reproducible.
//!
//! * **lifetime**: eviction time minus the time the block was allocated for
//!   the data it held;
//! * **idle before eviction**: eviction time minus its last access (a hit,
//!   or the allocation when it was never hit);
//! * **reuse gap**: at every hit, the time since the previous access;
//! * **hits per block**: at eviction, how many hits the data served.
//!
//! An *eviction* is a block losing its cache key: reallocated for new data
//! (the prefix-cache eviction proper), dropped by `evict_blocks`, or cleared
//! by a prefix-cache reset. (vLLM also records sampled blocks that were
//! never cached when they are reallocated; those could never serve a hit,
//! so kvcoord leaves them out.)

use crate::ids::BlockId;

/// Buckets of a [`Histogram`]: bucket 0 holds 0, bucket `k >= 1` holds
/// values in `[2^(k-1), 2^k)`.
pub const NUM_BUCKETS: usize = 65;

/// A log2-bucketed histogram of `u64` values, with exact count, sum and max.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    /// Counts per bucket (see [`NUM_BUCKETS`]).
    pub buckets: [u64; NUM_BUCKETS],
    /// Number of values.
    pub count: u64,
    /// Sum of the values (saturating).
    pub sum: u64,
    /// Largest value (0 when empty).
    pub max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: [0; NUM_BUCKETS],
            count: 0,
            sum: 0,
            max: 0,
        }
    }
}

impl Histogram {
    /// The bucket of `v`.
    #[inline]
    pub fn bucket(v: u64) -> usize {
        (u64::BITS - v.leading_zeros()) as usize
    }

    /// Record one value.
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.buckets[Self::bucket(v)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(v);
        self.max = self.max.max(v);
    }
}

/// One evicted block's history, with the content of vLLM's
/// `KVCacheEvictionEvent` (times in the caller's clock units).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRecord {
    /// The block.
    pub block: BlockId,
    /// Eviction time minus allocation time.
    pub lifetime: u64,
    /// Eviction time minus last access.
    pub idle: u64,
    /// Gaps between the last (up to four) accesses, oldest first.
    pub reuse_gaps: Vec<u64>,
    /// Hits served since allocation.
    pub hits: u32,
}

/// One block's times (45 bytes of data).
#[derive(Copy, Clone, Debug, Default)]
struct BlockTimes {
    born: u64,
    /// The last four access times, newest at `num_accesses - 1` (the
    /// allocation counts as the first access).
    accesses: [u64; 4],
    hits: u32,
    num_accesses: u8,
}

/// Per-block times, the histograms and the undrained eviction records.
#[derive(Clone, Debug)]
pub struct Residency {
    now: u64,
    /// Per block, by id: one record, so that an eviction followed by the
    /// block's reallocation touches one place (a replay evicts millions of
    /// blocks spread over the pool).
    blocks: Vec<BlockTimes>,
    lifetime: Histogram,
    idle: Histogram,
    reuse_gap: Histogram,
    hits_per_block: Histogram,
    records: Vec<EvictionRecord>,
    /// Whether [`Self::on_evict`] keeps an [`EvictionRecord`] (off: the
    /// histograms only, for a long replay that never drains the records).
    keep_records: bool,
}

/// A copy of the histograms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResidencySnapshot {
    /// Lifetime of evicted blocks.
    pub lifetime: Histogram,
    /// Idle time before eviction.
    pub idle_before_eviction: Histogram,
    /// Time between consecutive accesses of a block, one value per hit.
    pub reuse_gap: Histogram,
    /// Hits served by each evicted block.
    pub hits_per_block: Histogram,
}

impl Residency {
    /// Heap bytes [`Self::new`] allocates for `num_blocks` blocks.
    pub fn bytes_for(num_blocks: usize) -> usize {
        num_blocks.saturating_mul(std::mem::size_of::<BlockTimes>())
    }

    /// Tracking for `num_blocks` blocks, clock at 0.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            now: 0,
            blocks: vec![BlockTimes::default(); num_blocks],
            lifetime: Histogram::default(),
            idle: Histogram::default(),
            reuse_gap: Histogram::default(),
            hits_per_block: Histogram::default(),
            records: Vec::new(),
            keep_records: true,
        }
    }

    /// Whether each eviction also keeps an [`EvictionRecord`] for
    /// [`Self::drain_records`] (on by default). Off, an eviction only
    /// updates the histograms: no allocation per evicted block, and memory
    /// that does not grow with the number of evictions.
    pub fn set_keep_records(&mut self, keep: bool) {
        self.keep_records = keep;
    }

    /// Whether evictions keep records (see [`Self::set_keep_records`]).
    pub fn keeps_records(&self) -> bool {
        self.keep_records
    }

    /// The clock.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Move the clock (never backwards: an earlier time is ignored).
    pub fn set_now(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    /// Heap bytes of the per-block state.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<BlockTimes>()
    }

    fn push_access(t: &mut BlockTimes, now: u64) {
        let n = t.num_accesses as usize;
        if n == 4 {
            t.accesses.rotate_left(1);
            t.accesses[3] = now;
        } else {
            t.accesses[n] = now;
            t.num_accesses += 1;
        }
    }

    /// `b` was handed out for new data.
    #[inline]
    pub(crate) fn on_allocate(&mut self, b: BlockId) {
        let now = self.now;
        let t = &mut self.blocks[b.index()];
        t.born = now;
        t.hits = 0;
        t.num_accesses = 0;
        Self::push_access(t, now);
    }

    /// `b` served a prefix-cache hit.
    #[inline]
    pub(crate) fn on_hit(&mut self, b: BlockId) {
        let now = self.now;
        let t = &mut self.blocks[b.index()];
        let n = t.num_accesses as usize;
        if n > 0 {
            self.reuse_gap.record(now.saturating_sub(t.accesses[n - 1]));
        }
        t.hits = t.hits.saturating_add(1);
        Self::push_access(t, now);
    }

    /// `b` lost its cache key.
    pub(crate) fn on_evict(&mut self, b: BlockId) {
        let now = self.now;
        let t = &self.blocks[b.index()];
        let a = &t.accesses[..t.num_accesses as usize];
        let lifetime = now.saturating_sub(t.born);
        let idle = now.saturating_sub(a.last().copied().unwrap_or(t.born));
        self.lifetime.record(lifetime);
        self.idle.record(idle);
        self.hits_per_block.record(u64::from(t.hits));
        if !self.keep_records {
            return;
        }
        self.records.push(EvictionRecord {
            block: b,
            lifetime,
            idle,
            reuse_gaps: a.windows(2).map(|w| w[1] - w[0]).collect(),
            hits: t.hits,
        });
    }

    /// The histograms so far.
    pub fn snapshot(&self) -> ResidencySnapshot {
        ResidencySnapshot {
            lifetime: self.lifetime.clone(),
            idle_before_eviction: self.idle.clone(),
            reuse_gap: self.reuse_gap.clone(),
            hits_per_block: self.hits_per_block.clone(),
        }
    }

    /// Take the eviction records gathered since the last drain.
    pub fn drain_records(&mut self) -> Vec<EvictionRecord> {
        std::mem::take(&mut self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        assert_eq!(Histogram::bucket(0), 0);
        assert_eq!(Histogram::bucket(1), 1);
        assert_eq!(Histogram::bucket(3), 2);
        assert_eq!(Histogram::bucket(4), 3);
        assert_eq!(Histogram::bucket(u64::MAX), 64);
    }

    #[test]
    fn lifetime_idle_gaps_and_hits() {
        let mut r = Residency::new(4);
        let b = BlockId(2);
        r.set_now(10);
        r.on_allocate(b);
        for t in [13, 20, 21, 30] {
            r.set_now(t);
            r.on_hit(b);
        }
        r.set_now(5); // ignored: the clock never goes back
        r.set_now(50);
        r.on_evict(b);
        let rec = r.drain_records();
        assert_eq!(
            rec,
            [EvictionRecord {
                block: b,
                lifetime: 40,
                idle: 20,
                reuse_gaps: vec![7, 1, 9],
                hits: 4,
            }]
        );
        let s = r.snapshot();
        assert_eq!(
            (s.reuse_gap.count, s.reuse_gap.sum, s.reuse_gap.max),
            (4, 20, 9)
        );
        assert_eq!(s.hits_per_block.buckets[Histogram::bucket(4)], 1);
        assert!(r.drain_records().is_empty());
    }

    #[test]
    fn histograms_without_records() {
        let run = |keep: bool| {
            let mut r = Residency::new(4);
            r.set_keep_records(keep);
            let b = BlockId(1);
            r.set_now(3);
            r.on_allocate(b);
            r.set_now(8);
            r.on_hit(b);
            r.set_now(20);
            r.on_evict(b);
            (r.snapshot(), r.drain_records().len())
        };
        let (with, n_with) = run(true);
        let (without, n_without) = run(false);
        assert_eq!(with, without, "the histograms do not depend on records");
        assert_eq!((n_with, n_without), (1, 0));
    }
}
