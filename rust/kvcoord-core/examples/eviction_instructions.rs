//! Instruction counts of the eviction policies' hot paths, for callgrind
//! (wall time on a shared machine drifts; instruction counts repeat):
//!
//! ```text
//! cargo build --release -p kvcoord-core --example eviction_instructions
//! valgrind --tool=callgrind target/release/examples/eviction_instructions MODE ROUNDS POLICY
//! ```
//!
//! Run once with `ROUNDS` and once with 0 and divide the difference by
//! `ROUNDS` (set-up cancels out). Modes, as in `benches/eviction.rs`:
//! `get_free` (64 blocks handed out and freed, 1M-block pool), `cycle` (64
//! cached blocks evicted, cached, hit and freed per round, 64k blocks),
//! `cycle_plain` (the same without `set_priority`/`advance_clock`), `admit`
//! (one admission through `CoordinatorCore`; prints the prefix-cache hit
//! rate to stderr).

use std::collections::VecDeque;
use std::hint::black_box;

use kvcoord_core::{
    AllocateArgs, BlockHash, BlockId, BlockPool, CoordinatorConfig, CoordinatorCore, GroupId,
    GroupSpec, PoolConfig, ReqId, RequestView,
};

fn hash(i: u64) -> BlockHash {
    let mut b = [0u8; 32];
    let mut x = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    for chunk in b.chunks_mut(8) {
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    BlockHash::from_slice(&b).unwrap()
}

fn make(spec: &str, n: usize) -> BlockPool {
    BlockPool::with_eviction(PoolConfig::new(n), spec.parse().unwrap()).unwrap()
}

fn cycle(
    p: &mut BlockPool,
    ids: &mut Vec<BlockId>,
    next: &mut u64,
    hashes: &mut Vec<BlockHash>,
    extra: bool,
) {
    ids.clear();
    p.get_new_blocks(64, ids).unwrap();
    hashes.clear();
    hashes.extend((*next..*next + 64).map(hash));
    *next += 64;
    p.cache_full_blocks(ids, hashes, 0, 64, GroupId(0), None)
        .unwrap();
    if extra {
        p.set_priority(&ids[..16], 3).unwrap();
    }
    p.touch(&ids[..16]).unwrap();
    p.free_blocks(&ids[..16]).unwrap();
    ids.reverse();
    p.free_blocks(ids).unwrap();
    if extra {
        p.advance_clock(1).unwrap();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args[1].as_str();
    let rounds: usize = args[2].parse().unwrap();
    let spec = args.get(3).map_or("lru", String::as_str);
    match mode {
        "get_free" => {
            let mut pool = make(spec, 1_000_000);
            let mut out = Vec::with_capacity(64);
            for _ in 0..rounds {
                out.clear();
                pool.get_new_blocks(64, &mut out).unwrap();
                out.reverse();
                pool.free_blocks(black_box(&out)).unwrap();
            }
            black_box(pool.num_free_blocks());
        }
        "cycle" | "cycle_plain" => {
            // 64k blocks filled with cached free blocks first (not counted: same for 0 rounds).
            let mut p = make(spec, 65_536);
            let (mut ids, mut next, mut hs) = (Vec::new(), 0u64, Vec::new());
            let extra = mode == "cycle";
            for _ in 0..1024 {
                cycle(&mut p, &mut ids, &mut next, &mut hs, extra);
            }
            for _ in 0..rounds {
                cycle(&mut p, &mut ids, &mut next, &mut hs, extra);
            }
            black_box(p.num_free_blocks());
        }
        "admit" => {
            let mut cfg =
                CoordinatorConfig::new(vec![GroupSpec::full_attention(16)], 4096, true, 8192);
            cfg.hash_block_size = 16;
            let mut c = CoordinatorCore::new(cfg).unwrap();
            c.pool_mut().set_eviction(spec.parse().unwrap()).unwrap();
            let prompts: Vec<(usize, Vec<BlockHash>)> = (0..1024u64)
                .map(|t| {
                    let blocks = 8 + t % 24;
                    let hashes = (0..blocks)
                        .map(|j| {
                            if j < 8 {
                                hash((t % 4) << 32 | j)
                            } else {
                                hash(1 << 40 | t << 8 | j)
                            }
                        })
                        .collect();
                    (blocks as usize * 16 + 5, hashes)
                })
                .collect();
            let mut running = VecDeque::new();
            let mut hits = vec![Vec::new()];
            let (mut hit_tokens, mut prompt_tokens) = (0usize, 0usize);
            for next in 0..(8192 + rounds) as u64 {
                let (len, hashes) = &prompts[(next % 1024) as usize];
                let max = len - 1;
                let hit = c
                    .find_longest_cache_hit_into(&[GroupId(0)], hashes, max, 16, false, &mut hits)
                    .unwrap();
                if next >= 8192 {
                    hit_tokens += hit;
                    prompt_tokens += len;
                }
                let view = RequestView::new(0, *len, *len, hashes);
                let id = ReqId(next);
                c.allocate_slots(
                    id,
                    &view,
                    &AllocateArgs {
                        num_new_tokens: len - hit,
                        num_new_computed_tokens: hit,
                        num_lookahead_tokens: 0,
                        num_encoder_tokens: 0,
                        delay_cache_blocks: false,
                        num_external_computed_tokens: 0,
                    },
                    Some(&hits),
                )
                .unwrap()
                .unwrap();
                if next % 4 == 0 {
                    let held = c.block_ids(id).unwrap()[0].to_vec();
                    c.pool_mut().set_priority(&held, 3).unwrap();
                }
                c.pool_mut().advance_clock(1).unwrap();
                running.push_back(id);
                while running.len() > 48 {
                    c.free(running.pop_front().unwrap()).unwrap();
                }
            }
            if rounds > 0 {
                let rate = hit_tokens as f64 / prompt_tokens as f64;
                // The one output of a measuring tool.
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("HITRATE {spec} {rate:.4}");
                }
            }
        }
        _ => panic!("mode"),
    }
}
