//! The eviction seam, proved with test doubles.
//!
//! * Every recorded vLLM 0.33.0 pool trace (`tests/data/conformance/pool-*`)
//!   replays exactly through the default pool and through a one-level test
//!   double plugged in with `BlockPool::with_policy`: the seam's mechanism
//!   (unhashed blocks to the front, cached ones to the back of their level,
//!   reuse from the lowest level's front) reproduces vLLM's order.
//! * A scripted double (level = block id mod 3, hooks recorded) shows that
//!   the pool calls every hook with the right arguments, only for calls it
//!   accepts, and orders reuse by the levels the policy returns.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use flate2::read::GzDecoder;
use kvcoord_core::eviction::{EvictionPolicy, LevelQueue};
use kvcoord_core::{BlockHash, BlockId, BlockPool, GroupId, KvError, PoolConfig};
use serde_json::Value;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/conformance")
}

/// A policy with one level and no state: every cached block goes to the
/// back of the queue, which is what vLLM does.
#[derive(Clone, Debug)]
struct OneLevel;

impl EvictionPolicy for OneLevel {
    fn name(&self) -> String {
        "one-level".into()
    }
    fn num_levels(&self) -> usize {
        1
    }
    fn free_level(&mut self, _block: BlockId, _now: u32) -> usize {
        0
    }
    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}

fn ids(v: &Value) -> Vec<BlockId> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| BlockId(x.as_u64().unwrap() as u32))
        .collect()
}

fn hash(hex: &str) -> BlockHash {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    BlockHash::from_slice(&bytes).unwrap()
}

/// Compare the pool with a recorded full-state check.
fn check_state(pool: &BlockPool, op: &Value, at: &str) {
    assert_eq!(
        pool.num_free_blocks() as u64,
        op["num_free_blocks"].as_u64().unwrap(),
        "{at}"
    );
    assert_eq!(
        pool.free_block_ids().collect::<Vec<_>>(),
        ids(&op["free_queue"]),
        "{at}"
    );
    let refs: Vec<u64> = pool.ref_counts().map(u64::from).collect();
    let want: Vec<u64> = op["ref_cnt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(refs, want, "{at}");
    let cached: Vec<bool> = pool.cached_mask().collect();
    let want: Vec<bool> = op["cached"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_bool().unwrap())
        .collect();
    assert_eq!(cached, want, "{at}");
}

/// Replay one pool trace through `pool`, checking every result and every
/// recorded state; returns the number of full-state checks.
fn replay(path: &Path, pool: &mut BlockPool) -> usize {
    let reader = BufReader::new(GzDecoder::new(std::fs::File::open(path).unwrap()));
    let mut checks = 0;
    for (n, line) in reader.lines().enumerate().skip(1) {
        let op: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let at = format!("{}:{} {}", path.display(), n + 1, op["op"]);
        match op["op"].as_str().unwrap() {
            "get_new_blocks" => {
                let mut out = Vec::new();
                let res = pool.get_new_blocks(op["n"].as_u64().unwrap() as usize, &mut out);
                if op["expect"] == "ValueError" {
                    assert!(
                        matches!(res, Err(KvError::OutOfBlocks { .. })),
                        "{at}: {res:?}"
                    );
                } else {
                    res.unwrap();
                    assert_eq!(out, ids(&op["expect"]), "{at}");
                }
            }
            "free_blocks" => pool.free_blocks(&ids(&op["ids"])).unwrap(),
            "touch" => pool.touch(&ids(&op["ids"])).unwrap(),
            "evict_blocks" => pool.evict_blocks(&ids(&op["ids"])).unwrap(),
            "cache_full_blocks" => {
                let hashes: Vec<BlockHash> = op["hashes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| hash(h.as_str().unwrap()))
                    .collect();
                let mask: Option<Vec<bool>> = op["block_mask"]
                    .as_array()
                    .map(|m| m.iter().map(|x| x.as_bool().unwrap()).collect::<Vec<_>>());
                pool.cache_full_blocks(
                    &ids(&op["ids"]),
                    &hashes,
                    op["num_cached_blocks"].as_u64().unwrap() as usize,
                    op["num_full_blocks"].as_u64().unwrap() as usize,
                    GroupId(op["group_id"].as_u64().unwrap() as u32),
                    mask.as_deref(),
                )
                .unwrap();
            }
            "get_cached_block" => {
                let groups: Vec<GroupId> = op["group_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| GroupId(g.as_u64().unwrap() as u32))
                    .collect();
                let mut out = Vec::new();
                let hit =
                    pool.get_cached_block(&hash(op["hash"].as_str().unwrap()), &groups, &mut out);
                if op["expect"].is_null() {
                    assert!(!hit, "{at}");
                } else {
                    assert!(hit, "{at}");
                    assert_eq!(out, ids(&op["expect"]), "{at}");
                }
            }
            "reset_prefix_cache" => {
                assert_eq!(
                    pool.reset_prefix_cache(),
                    op["expect"].as_bool().unwrap(),
                    "{at}"
                );
            }
            "check" => {
                checks += 1;
                check_state(pool, &op, &at);
            }
            other => panic!("{at}: unknown op {other}"),
        }
        pool.check_invariants()
            .unwrap_or_else(|e| panic!("{at}: {e}"));
    }
    checks
}

fn traces() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("pool-") && n.ends_with(".jsonl.gz")
        })
        .collect();
    v.sort();
    assert!(
        v.len() >= 4,
        "pool traces missing from {}",
        data_dir().display()
    );
    v
}

fn header(path: &Path) -> PoolConfig {
    let reader = BufReader::new(GzDecoder::new(std::fs::File::open(path).unwrap()));
    let h: Value = serde_json::from_str(&reader.lines().next().unwrap().unwrap()).unwrap();
    PoolConfig {
        enable_caching: h["enable_caching"].as_bool().unwrap(),
        hash_block_size: h["hash_block_size"].as_u64().unwrap() as u32,
        ..PoolConfig::new(h["num_blocks"].as_u64().unwrap() as usize)
    }
}

#[test]
fn default_pool_replays_every_pool_trace() {
    for path in traces() {
        let mut pool = BlockPool::new(header(&path)).unwrap();
        assert_eq!(pool.eviction_policy(), "lru");
        assert!(replay(&path, &mut pool) > 0, "{path:?} has no checks");
    }
}

#[test]
fn one_level_double_through_the_seam_replays_every_pool_trace() {
    for path in traces() {
        let mut pool = BlockPool::with_policy(header(&path), Box::new(OneLevel)).unwrap();
        assert_eq!(pool.eviction_policy(), "one-level");
        assert!(replay(&path, &mut pool) > 0);
    }
}

/// Hooks the pool called, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Allocate(Vec<u32>),
    Hit(u32),
    Cache(u32, u32),
    Free(u32, u32),
    Priority(u32, u8),
    Clock(u32),
}

/// Level = block id mod 3; every hook recorded in a shared log.
#[derive(Clone, Debug)]
struct Scripted {
    log: Arc<Mutex<Vec<Call>>>,
}

impl EvictionPolicy for Scripted {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn num_levels(&self) -> usize {
        3
    }
    fn on_allocate(&mut self, blocks: &[BlockId], _queue: &mut LevelQueue) {
        let ids = blocks.iter().map(|b| b.0).collect();
        self.log.lock().unwrap().push(Call::Allocate(ids));
    }
    fn on_hit(&mut self, block: BlockId) {
        self.log.lock().unwrap().push(Call::Hit(block.0));
    }
    fn on_cache(&mut self, block: BlockId, depth: u32) {
        self.log.lock().unwrap().push(Call::Cache(block.0, depth));
    }
    fn free_level(&mut self, block: BlockId, now: u32) -> usize {
        self.log.lock().unwrap().push(Call::Free(block.0, now));
        block.index() % 3
    }
    fn set_priority(&mut self, block: BlockId, priority: u8) {
        self.log
            .lock()
            .unwrap()
            .push(Call::Priority(block.0, priority));
    }
    fn on_clock(&mut self, now: u32, _queue: &mut LevelQueue) {
        self.log.lock().unwrap().push(Call::Clock(now));
    }
    fn clone_box(&self) -> Box<dyn EvictionPolicy> {
        Box::new(self.clone())
    }
}

fn h(n: u8) -> BlockHash {
    BlockHash::from_slice(&[n; 32]).unwrap()
}

#[test]
fn scripted_double_sees_every_hook_and_orders_reuse() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut pool =
        BlockPool::with_policy(PoolConfig::new(10), Box::new(Scripted { log: log.clone() }))
            .unwrap();
    let take = |log: &Arc<Mutex<Vec<Call>>>| std::mem::take(&mut *log.lock().unwrap());

    let mut a = Vec::new();
    pool.get_new_blocks(6, &mut a).unwrap();
    assert_eq!(take(&log), vec![Call::Allocate(vec![1, 2, 3, 4, 5, 6])]);
    let hashes: Vec<BlockHash> = (0..5).map(h).collect();
    pool.cache_full_blocks(
        &a,
        &hashes,
        1,
        5,
        GroupId(0),
        Some(&[true, false, true, true]),
    )
    .unwrap();
    // Blocks 2, 4 and 5 cached as chain blocks 2, 4 and 5 (block 3 masked).
    assert_eq!(
        take(&log),
        vec![Call::Cache(2, 2), Call::Cache(4, 4), Call::Cache(5, 5)]
    );
    pool.set_priority(&[BlockId(0), BlockId(2)], 3).unwrap();
    assert_eq!(take(&log), vec![Call::Priority(2, 3)]);
    pool.advance_clock(7).unwrap();
    assert_eq!(take(&log), vec![Call::Clock(7)]);

    // Free tail first: 6 and 3 are unhashed (front of level 0, in order),
    // 5, 4, 2 cached at levels 2, 1, 2; block 1 was never cached.
    let mut rev = a.clone();
    rev.reverse();
    pool.free_blocks(&rev).unwrap();
    assert_eq!(
        take(&log),
        vec![Call::Free(5, 7), Call::Free(4, 7), Call::Free(2, 7)]
    );
    let queue: Vec<u32> = pool.free_block_ids().map(|b| b.0).collect();
    assert_eq!(queue, vec![6, 3, 1, 7, 8, 9, 4, 5, 2]);
    pool.check_invariants().unwrap();

    // A hit on a free cached block takes it out wherever it is.
    pool.touch(&[BlockId(5), BlockId(0)]).unwrap();
    assert_eq!(take(&log), vec![Call::Hit(5)]);
    assert_eq!(pool.num_free_blocks(), 8);

    // Refused calls reach no hook and change nothing.
    let before: Vec<u32> = pool.free_block_ids().map(|b| b.0).collect();
    assert!(pool.free_blocks(&[BlockId(5), BlockId(5)]).is_err());
    assert!(pool.touch(&[BlockId(4), BlockId(10)]).is_err());
    assert!(pool.get_new_blocks(9, &mut Vec::new()).is_err());
    assert!(pool.set_priority(&[BlockId(1)], 8).is_err());
    assert!(pool.set_priority(&[BlockId(11)], 1).is_err());
    assert!(pool.advance_clock(i64::from(u32::MAX)).is_err());
    assert!(pool.advance_clock(-1).is_err());
    assert!(pool.set_priority(&[BlockId(1)], -1).is_err());
    assert!(take(&log).is_empty());
    assert_eq!(
        pool.free_block_ids().map(|b| b.0).collect::<Vec<_>>(),
        before
    );
    assert_eq!(pool.ref_count(BlockId(5)).unwrap(), 1);

    // Reuse: level 0 first (6 3 1 7 8 9), then level 1 (4), then 2 (2).
    let mut b = Vec::new();
    pool.get_new_blocks(8, &mut b).unwrap();
    assert_eq!(b, [6, 3, 1, 7, 8, 9, 4, 2].map(BlockId));
    assert!(!pool.is_cached(BlockId(4)).unwrap(), "reuse evicts");
    assert_eq!(pool.num_evictions(), 2);
    pool.check_invariants().unwrap();
}

#[test]
fn policy_with_too_many_levels_is_refused() {
    #[derive(Clone, Debug)]
    struct Wide;
    impl EvictionPolicy for Wide {
        fn name(&self) -> String {
            "wide".into()
        }
        fn num_levels(&self) -> usize {
            17
        }
        fn free_level(&mut self, _: BlockId, _: u32) -> usize {
            0
        }
        fn clone_box(&self) -> Box<dyn EvictionPolicy> {
            Box::new(self.clone())
        }
    }
    let err = BlockPool::with_policy(PoolConfig::new(4), Box::new(Wide)).unwrap_err();
    assert!(err.to_string().contains("levels"), "{err}");
}
