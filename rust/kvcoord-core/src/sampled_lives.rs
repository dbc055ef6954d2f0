//! [`SampledLives`]: vLLM's KV-cache residency metrics
//! (`KVCacheMetricsCollector`, `--kv-cache-metrics`), kept by the pool so
//! that serving them costs no Python call per block.
//!
//! vLLM follows a random sample of block *lives*: at each allocation a
//! block is sampled with probability `sample_rate` (its life starts then);
//! each prefix-cache hit on it is an access; its life ends when the pool
//! drops its cache entry: when it is handed out again (with caching on,
//! whether or not it was cached) or named by `evict_blocks`. The end of a
//! sampled life yields one [`LifeSample`], with vLLM's
//! `KVCacheEvictionEvent` content: lifetime, idle time since the last
//! access (or the allocation) and the gaps between its last four accesses.
//! A prefix-cache reset forgets every life and every undrained sample.
//!
//! This differs from [`crate::residency`] (kvcoord's own metrics: every
//! block, the caller's clock, only lives that ended a cache entry) on
//! purpose: this one reports what vLLM's scheduler expects to receive.
//!
//! # Invariants
//!
//! Checked by [`SampledLives::check_invariants`]: every followed life's
//! access history holds at most four times, in order, none before the
//! life's start; the sample threshold matches the rate.

use std::collections::HashMap;
use std::time::Instant;

use crate::error::{KvError, KvResult};
use crate::ids::BlockId;

/// One ended life of a sampled block (times in nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifeSample {
    /// End of the life minus its start (the block's allocation).
    pub lifetime_ns: u64,
    /// End of the life minus the last access (the allocation when none).
    pub idle_ns: u64,
    /// Gaps between the last (up to four) accesses, oldest first; empty
    /// with fewer than two accesses.
    pub reuse_gaps_ns: Vec<u64>,
}

/// A followed life: its start and its last four accesses.
#[derive(Clone, Copy, Debug, Default)]
struct Life {
    born: u64,
    last: u64,
    /// Oldest first; `num_accesses` of them are set.
    accesses: [u64; 4],
    num_accesses: u8,
}

/// Where time comes from.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// Nanoseconds since the metrics were switched on (vLLM's
    /// `time.monotonic_ns()`; only differences are reported).
    Monotonic(Instant),
    /// Set by the caller (tests).
    Manual(u64),
}

/// The sampled lives of one pool and their undrained samples (module docs).
#[derive(Clone, Debug)]
pub struct SampledLives {
    sample_rate: f64,
    /// A draw below this samples the block: `sample_rate` of 2^64, or
    /// `None` for a rate of 1 (every block).
    threshold: Option<u64>,
    /// splitmix64 state.
    rng: u64,
    lives: HashMap<BlockId, Life>,
    samples: Vec<LifeSample>,
    clock: Clock,
}

impl SampledLives {
    /// Follow a `sample_rate` share of lives (vLLM's range: `0 <
    /// sample_rate <= 1`), drawing from a generator seeded with `seed`.
    pub fn new(sample_rate: f64, seed: u64) -> KvResult<Self> {
        if !(sample_rate > 0.0 && sample_rate <= 1.0) {
            return Err(KvError::InvalidConfig {
                name: "sample_rate",
                value: sample_rate.to_string(),
                rule: "must be in (0, 1]".into(),
            });
        }
        // A rate below 1 is a positive product below 2^64: the cast neither
        // saturates nor loses a sign.
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let threshold = if sample_rate < 1.0 {
            Some((sample_rate * 18_446_744_073_709_551_616.0) as u64)
        } else {
            None
        };
        Ok(Self {
            sample_rate,
            threshold,
            rng: seed,
            lives: HashMap::new(),
            samples: Vec::new(),
            clock: Clock::Monotonic(Instant::now()),
        })
    }

    /// Read time from [`Self::set_now`] instead of the monotonic clock.
    #[must_use]
    pub fn with_manual_clock(mut self) -> Self {
        self.clock = Clock::Manual(0);
        self
    }

    /// Set the manual clock (ignored on the monotonic one; never backwards).
    pub fn set_now(&mut self, now: u64) {
        if let Clock::Manual(t) = &mut self.clock {
            *t = (*t).max(now);
        }
    }

    /// The share of lives followed.
    pub fn sample_rate(&self) -> f64 {
        self.sample_rate
    }

    /// Lives followed now.
    pub fn num_followed(&self) -> usize {
        self.lives.len()
    }

    fn now(&self) -> u64 {
        match self.clock {
            Clock::Monotonic(start) => {
                u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
            }
            Clock::Manual(t) => t,
        }
    }

    /// splitmix64: one draw.
    fn draw(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `blocks` were handed out: each starts a new life, followed with
    /// the sample rate's probability; `ends_lives` (caching on) ends each
    /// block's previous life first.
    pub(crate) fn on_allocated(&mut self, blocks: &[BlockId], ends_lives: bool) {
        let now = self.now();
        for &b in blocks {
            if ends_lives {
                self.end(b, now);
            }
            let sampled = match self.threshold {
                None => true,
                Some(t) => self.draw() < t,
            };
            if sampled {
                let life = Life {
                    born: now,
                    last: now,
                    ..Life::default()
                };
                self.lives.insert(b, life);
            } else {
                self.lives.remove(&b);
            }
        }
    }

    /// `blocks` served a prefix-cache hit.
    pub(crate) fn on_accessed(&mut self, blocks: &[BlockId]) {
        if self.lives.is_empty() {
            return;
        }
        let now = self.now();
        for b in blocks {
            if let Some(life) = self.lives.get_mut(b) {
                life.last = now;
                let n = usize::from(life.num_accesses);
                if n == life.accesses.len() {
                    life.accesses.rotate_left(1);
                    life.accesses[n - 1] = now;
                } else {
                    life.accesses[n] = now;
                    life.num_accesses += 1;
                }
            }
        }
    }

    /// `blocks` lost their cache entries (`evict_blocks`): their lives end.
    pub(crate) fn on_evicted(&mut self, blocks: &[BlockId]) {
        if self.lives.is_empty() {
            return;
        }
        let now = self.now();
        for &b in blocks {
            self.end(b, now);
        }
    }

    fn end(&mut self, b: BlockId, now: u64) {
        let Some(life) = self.lives.remove(&b) else {
            return;
        };
        let accesses = &life.accesses[..usize::from(life.num_accesses)];
        self.samples.push(LifeSample {
            lifetime_ns: now.saturating_sub(life.born),
            idle_ns: now.saturating_sub(life.last),
            reuse_gaps_ns: accesses.windows(2).map(|w| w[1] - w[0]).collect(),
        });
    }

    /// A prefix-cache reset: forget every life and undrained sample.
    pub(crate) fn on_reset(&mut self) {
        self.lives.clear();
        self.samples.clear();
    }

    /// Take the samples of lives ended since the last drain, oldest first.
    pub fn drain(&mut self) -> Vec<LifeSample> {
        std::mem::take(&mut self.samples)
    }

    /// Check the module docs' invariants; `Err` names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.threshold.is_none() != (self.sample_rate >= 1.0) {
            return Err(format!(
                "sample threshold disagrees with rate {}",
                self.sample_rate
            ));
        }
        for (b, life) in &self.lives {
            let accesses = &life.accesses[..usize::from(life.num_accesses.min(4))];
            if life.num_accesses > 4
                || accesses.windows(2).any(|w| w[0] > w[1])
                || accesses.first().is_some_and(|&t| t < life.born)
                || life.last < life.born
            {
                return Err(format!("block {b}: life history out of order: {life:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_block() -> SampledLives {
        SampledLives::new(1.0, 7).unwrap().with_manual_clock()
    }

    #[test]
    fn a_life_reports_lifetime_idle_and_access_gaps() {
        let mut s = every_block();
        let b = [BlockId(3)];
        s.set_now(10);
        s.on_allocated(&b, true);
        for t in [13, 20, 21, 30, 34] {
            s.set_now(t);
            s.on_accessed(&b);
        }
        s.set_now(50);
        s.on_allocated(&b, true); // handed out again: the life ends
        s.check_invariants().unwrap();
        let got = s.drain();
        // vLLM keeps the last four accesses; the allocation is not one.
        let want = LifeSample {
            lifetime_ns: 40,
            idle_ns: 16,
            reuse_gaps_ns: vec![1, 9, 4],
        };
        assert_eq!(got, [want]);
        assert!(s.drain().is_empty());
        assert_eq!(s.num_followed(), 1, "the new life is followed");
    }

    #[test]
    fn a_block_never_hit_has_no_gaps_and_idles_since_allocation() {
        let mut s = every_block();
        s.set_now(5);
        s.on_allocated(&[BlockId(1)], true);
        s.set_now(9);
        s.on_accessed(&[BlockId(1)]);
        s.set_now(12);
        s.on_evicted(&[BlockId(1), BlockId(2)]); // block 2 was never followed
        let got = s.drain();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].lifetime_ns, got[0].idle_ns), (7, 3));
        assert!(got[0].reuse_gaps_ns.is_empty());
    }

    #[test]
    fn without_caching_a_reallocation_ends_no_life() {
        let mut s = every_block();
        s.on_allocated(&[BlockId(1)], false);
        s.on_allocated(&[BlockId(1)], false);
        assert!(s.drain().is_empty());
        // Negative control: with caching on, it does.
        s.on_allocated(&[BlockId(1)], true);
        assert_eq!(s.drain().len(), 1);
    }

    #[test]
    fn a_reset_forgets_lives_and_samples() {
        let mut s = every_block();
        s.on_allocated(&[BlockId(1), BlockId(2)], true);
        s.on_evicted(&[BlockId(1)]);
        s.on_reset();
        assert!(s.drain().is_empty());
        assert_eq!(s.num_followed(), 0);
        s.on_evicted(&[BlockId(2)]);
        assert!(s.drain().is_empty());
    }

    #[test]
    fn the_sample_rate_is_the_share_of_lives_followed() {
        let mut s = SampledLives::new(0.05, 11).unwrap().with_manual_clock();
        let blocks: Vec<BlockId> = (1..=20_000).map(BlockId).collect();
        s.on_allocated(&blocks, true);
        let share = s.num_followed() as f64 / blocks.len() as f64;
        assert!((0.04..0.06).contains(&share), "{share}");
        let followed = s.num_followed();
        s.on_evicted(&blocks);
        assert_eq!(s.drain().len(), followed);
        // Same seed, same sample.
        let mut again = SampledLives::new(0.05, 11).unwrap();
        again.on_allocated(&blocks, true);
        assert_eq!(again.num_followed(), followed);
    }

    #[test]
    fn rates_outside_vllms_range_are_refused() {
        for rate in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(SampledLives::new(rate, 0).is_err(), "{rate}");
        }
    }
}
