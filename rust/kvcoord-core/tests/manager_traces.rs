//! Replays the recorded vLLM 0.33.0 scheduler traces
//! (`tests/data/conformance/manager-*.jsonl.gz`) through `CoordinatorCore`
//! and checks every lookup, every allocation and every state snapshot.
//!
//! The policies (the hybrid fixed point over the per-spec finders) are
//! Python's and are replayed through pytest (`tests/manager_replayer.py`);
//! here the mechanism is checked: for the hybrid layouts, every spec group's
//! finder, asked at the recorded hit length, must return exactly that length
//! and the recorded blocks (the fixed point is where all groups agree), and
//! allocation, caching and freeing must reproduce every recorded id.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use kvcoord_core::{
    hashing, AllocateArgs, BlockHash, BlockId, CoordinatorConfig, CoordinatorCore, CoordinatorKind,
    ExtraKeys, GroupId, GroupSpec, HashAlgo, HashConfig, ReqId, RequestView,
};
use serde_json::Value;

/// Group ids sharing one spec (the buckets a hybrid lookup scans together).
fn buckets(specs: &[GroupSpec]) -> Vec<Vec<GroupId>> {
    let mut out: Vec<(GroupSpec, Vec<GroupId>)> = Vec::new();
    for (g, s) in specs.iter().enumerate() {
        let id = GroupId(u32::try_from(g).unwrap());
        match out.iter_mut().find(|(spec, _)| spec == s) {
            Some((_, ids)) => ids.push(id),
            None => out.push((*s, vec![id])),
        }
    }
    out.into_iter().map(|(_, ids)| ids).collect()
}

/// Ask every bucket's finder for a hit of at most `length` tokens; each must
/// return exactly `length` (the groups agree there). Returns the blocks per
/// group and `length`.
fn agree_at(
    c: &CoordinatorCore,
    num_groups: usize,
    buckets: &[Vec<GroupId>],
    hashes: &[BlockHash],
    length: usize,
    alignment: usize,
) -> (Vec<Vec<BlockId>>, usize) {
    let mut out = vec![Vec::new(); num_groups];
    for ids in buckets {
        let (blocks, hit) = c
            .find_longest_cache_hit(ids, hashes, length, alignment, false)
            .unwrap();
        assert_eq!(hit, length, "groups {ids:?} disagree with the recorded hit");
        for (g, b) in ids.iter().zip(blocks) {
            out[g.0 as usize] = b;
        }
    }
    (out, length)
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/conformance")
}

/// A request as the recorded scheduler saw it.
struct Request {
    id: ReqId,
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    salt: Option<String>,
    computed: usize,
    /// Chained hashes of the full hash units so far.
    hashes: Vec<BlockHash>,
    /// The last lookup's result, adopted by the next `allocate_slots`.
    last_hit: Vec<Vec<BlockId>>,
    /// The last lookup's shared-prefix boundary (kept on the request, as
    /// vLLM's scheduler does).
    shared_prefix_boundary: usize,
}

impl Request {
    /// Extend the hash chain over newly completed hash units.
    fn update_hashes(&mut self, unit: usize) {
        // The core's own hasher (native format: any collision-free chained
        // hash gives vLLM's decisions).
        if self.tokens.len() / unit == self.hashes.len() {
            return;
        }
        let config = HashConfig::new(HashAlgo::Native, unit, Some("trace")).unwrap();
        let extra = ExtraKeys::new(None, Vec::new(), self.salt.clone());
        self.hashes = hashing::compute_block_hashes(config, extra, &self.tokens);
    }

    fn view(&self) -> RequestView<'_> {
        RequestView {
            shared_prefix_boundary: self.shared_prefix_boundary,
            ..RequestView::new(
                self.computed,
                self.tokens.len(),
                self.num_prompt_tokens,
                &self.hashes,
            )
        }
    }
}

fn spec_of(g: &Value) -> GroupSpec {
    let bs = g["block_size"].as_u64().unwrap() as u32;
    match g["type"].as_str().unwrap() {
        "full_attention" => GroupSpec::full_attention(bs),
        "sliding_window" => {
            GroupSpec::sliding_window(bs, g["sliding_window"].as_u64().unwrap() as u32)
        }
        "chunked_local" => {
            GroupSpec::chunked_local(bs, g["attention_chunk_size"].as_u64().unwrap() as u32)
        }
        "mamba" => match g["mamba_cache_mode"].as_str().unwrap_or("none") {
            "none" => GroupSpec::mamba(bs, 0),
            "align" => GroupSpec::mamba_align(
                bs,
                g["num_prefill_checkpoint_blocks"].as_u64().unwrap_or(0) > 0,
                g["prefill_checkpoint_alignment"].as_u64().map(|a| a as u32),
            ),
            other => panic!("unknown mamba_cache_mode {other}"),
        },
        "mla_attention" => GroupSpec::mla_attention(bs),
        "sliding_window_mla" => {
            GroupSpec::sliding_window_mla(bs, g["sliding_window"].as_u64().unwrap() as u32)
        }
        "rswa" => GroupSpec::rswa(bs, g["rswa_window"].as_u64().unwrap() as u32),
        other => panic!("unknown group type {other}"),
    }
}

fn as_ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn lists(v: &[Vec<BlockId>]) -> Vec<Vec<u32>> {
    v.iter().map(|l| l.iter().map(|b| b.0).collect()).collect()
}

fn expect_lists(v: &Value) -> Vec<Vec<u32>> {
    v.as_array().unwrap().iter().map(as_ids).collect()
}

/// Replay one trace; returns the number of ops checked.
#[allow(clippy::too_many_lines)]
fn replay(path: &Path) -> usize {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let reader = BufReader::new(GzDecoder::new(std::fs::File::open(path).unwrap()));
    let mut lines = reader.lines();
    let header: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let layout = &header["layout"];
    let specs: Vec<GroupSpec> = layout["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(spec_of)
        .collect();
    let caching = layout["enable_caching"].as_bool().unwrap();
    let unit = header["hash_block_size"].as_u64().unwrap() as usize;
    let mut cfg = CoordinatorConfig::new(
        specs.clone(),
        layout["num_blocks"].as_u64().unwrap() as usize,
        caching,
        layout["max_model_len"].as_u64().unwrap() as usize,
    );
    cfg.hash_block_size = unit as u32;
    let kind = cfg.kind;
    let sched = cfg.scheduler_block_size as usize;
    let mut c = CoordinatorCore::new(cfg).unwrap();
    let buckets = buckets(&specs);
    let mut reqs: HashMap<String, Request> = HashMap::new();
    let mut next_id = 0u64;
    let mut checked = 0;

    for (lineno, line) in lines.enumerate() {
        let line = line.unwrap();
        let op: Value = serde_json::from_str(&line).unwrap();
        let at = format!("{name}:{} {}", lineno + 2, &line[..line.len().min(160)]);
        let key = op["req"].as_str().unwrap_or_default().to_owned();
        match op["op"].as_str().unwrap() {
            "add_request" => {
                let tokens: Vec<u32> = as_ids(&op["prompt"]);
                let mut r = Request {
                    id: ReqId(next_id),
                    num_prompt_tokens: tokens.len(),
                    tokens,
                    salt: op["cache_salt"].as_str().map(str::to_owned),
                    computed: 0,
                    hashes: Vec::new(),
                    last_hit: vec![Vec::new(); specs.len()],
                    shared_prefix_boundary: 0,
                };
                next_id += 1;
                r.update_hashes(unit);
                reqs.insert(key, r);
            }
            "get_computed_blocks" => {
                let r = reqs.get_mut(&key).unwrap();
                let max_len = r.tokens.len() - 1;
                let expect = &op["expect"];
                let (blocks, hit) = match kind {
                    CoordinatorKind::NoPrefixCache => (vec![Vec::new(); specs.len()], 0),
                    CoordinatorKind::Unitary => {
                        let bs = specs[0].block_size as usize;
                        c.find_longest_cache_hit(&[GroupId(0)], &r.hashes, max_len, bs, false)
                            .unwrap()
                    }
                    CoordinatorKind::Hybrid => {
                        let want = expect["num_computed_tokens"].as_u64().unwrap() as usize;
                        agree_at(&c, specs.len(), &buckets, &r.hashes, want, sched)
                    }
                };
                assert_eq!(
                    hit,
                    expect["num_computed_tokens"].as_u64().unwrap() as usize,
                    "{at}"
                );
                assert_eq!(lists(&blocks), expect_lists(&expect["blocks"]), "{at}");
                r.last_hit = blocks;
                // The policy's third result (checked by the pytest replay
                // through the shipped policy) lives on the request, as in
                // vLLM's scheduler; the core reads it when caching.
                r.shared_prefix_boundary =
                    op["shared_prefix_boundary"].as_u64().unwrap_or(0) as usize;
            }
            "allocate_slots" => {
                let r = &reqs[&key];
                let hits = op["use_computed"]
                    .as_bool()
                    .unwrap()
                    .then_some(r.last_hit.as_slice());
                let got = c
                    .allocate_slots(
                        r.id,
                        &r.view(),
                        &AllocateArgs {
                            num_new_tokens: op["num_new_tokens"].as_u64().unwrap() as usize,
                            num_new_computed_tokens: op["num_new_computed_tokens"].as_u64().unwrap()
                                as usize,
                            num_lookahead_tokens: 0,
                            num_encoder_tokens: 0,
                            delay_cache_blocks: false,
                            num_external_computed_tokens: 0,
                        },
                        hits,
                    )
                    .unwrap_or_else(|e| panic!("{at}: {e}"));
                let expect = (!op["expect"].is_null()).then(|| expect_lists(&op["expect"]));
                assert_eq!(got.as_deref().map(lists), expect, "{at}");
            }
            "new_step" => c.new_step_starts(),
            "advance" => reqs.get_mut(&key).unwrap().computed += op["n"].as_u64().unwrap() as usize,
            "append_token" => {
                let r = reqs.get_mut(&key).unwrap();
                r.tokens.push(op["token"].as_u64().unwrap() as u32);
                r.update_hashes(unit);
            }
            "preempt" => {
                let r = reqs.get_mut(&key).unwrap();
                c.free(r.id).unwrap();
                r.computed = 0;
            }
            "finish" => {
                let r = reqs.remove(&key).unwrap();
                c.free(r.id).unwrap();
            }
            "check" => {
                assert_eq!(
                    c.pool().num_free_blocks(),
                    op["num_free_blocks"].as_u64().unwrap() as usize,
                    "{at}"
                );
                let expect = op["block_ids"].as_object().unwrap();
                assert_eq!(c.num_requests(), expect.len(), "{at}");
                for (k, v) in expect {
                    let got: Vec<Vec<u32>> = c
                        .block_ids(reqs[k].id)
                        .unwrap()
                        .iter()
                        .map(|l| l.iter().map(|b| b.0).collect())
                        .collect();
                    assert_eq!(got, expect_lists(v), "{at} request {k}");
                }
                c.check_invariants().unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            other => panic!("{at}: unknown op {other}"),
        }
        checked += 1;
    }
    c.check_invariants().unwrap();
    checked
}

fn replay_layout(layout: &str) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("manager-{layout}-s")) && n.ends_with(".jsonl.gz")
            })
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no traces for layout {layout}");
    for f in files {
        assert!(replay(&f) > 0);
    }
}

#[test]
fn unitary_full_attention() {
    replay_layout("full");
}

#[test]
fn no_cache() {
    replay_layout("no_cache");
}

#[test]
fn hybrid_swa() {
    replay_layout("hybrid_swa");
}

#[test]
fn hybrid_three_groups() {
    replay_layout("hybrid_3g");
}

#[test]
fn hybrid_chunked_local() {
    replay_layout("hybrid_local");
}

#[test]
fn hybrid_mamba_no_cache() {
    replay_layout("hybrid_mamba_nocache");
}

#[test]
fn mla() {
    replay_layout("mla");
}

#[test]
fn hybrid_swa_mla() {
    replay_layout("hybrid_swa_mla");
}

#[test]
fn rswa() {
    replay_layout("rswa");
}

#[test]
fn rswa_no_cache() {
    replay_layout("rswa_nocache");
}

#[test]
fn hybrid_rswa() {
    replay_layout("hybrid_rswa");
}

#[test]
fn hybrid_mamba_align() {
    replay_layout("hybrid_mamba_align");
}

#[test]
fn hybrid_mamba_align_checkpoint() {
    replay_layout("hybrid_mamba_align_ckpt");
}

/// Every trace file in the data folder belongs to a layout replayed above.
#[test]
fn every_trace_layout_is_replayed() {
    let known = [
        "full",
        "no_cache",
        "hybrid_swa",
        "hybrid_3g",
        "hybrid_local",
        "hybrid_mamba_nocache",
        "mla",
        "hybrid_swa_mla",
        "rswa",
        "rswa_nocache",
        "hybrid_rswa",
        "hybrid_mamba_align",
        "hybrid_mamba_align_ckpt",
    ];
    for e in std::fs::read_dir(data_dir()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix("manager-") {
            let layout = rest.rsplit_once("-s").unwrap().0;
            assert!(known.contains(&layout), "trace {name} has no replay test");
        }
    }
}
