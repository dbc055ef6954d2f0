//! Every vector of `tests/data/conformance/hashes.jsonl` (recorded from vLLM
//! 0.33.0) reproduced byte for byte, one-shot and incrementally.

use kvcoord_core::hashing::{self, compute_block_hashes, mm_feature};
use kvcoord_core::{ExtraKeys, HashAlgo, HashConfig, LoraKey, RequestHasher};
use serde_json::Value;

fn hex(b: &[u8]) -> String {
    hashing::to_hex(b)
}

fn vectors() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/conformance/hashes.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("read hashes.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

fn case(v: &Value) -> (HashConfig, ExtraKeys, Vec<u32>, Vec<String>) {
    let algo = HashAlgo::from_name(v["algo"].as_str().unwrap()).unwrap();
    let seed = v["none_hash_seed"].as_str().unwrap();
    let bs = v["block_size"].as_u64().unwrap() as usize;
    let config = HashConfig::new(algo, bs, Some(seed)).unwrap();
    assert_eq!(
        hex(config.none_hash().as_bytes()),
        v["none_hash"].as_str().unwrap()
    );
    let tokens: Vec<u32> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, t)| hashing::token_id(i, t.as_i64().unwrap()).unwrap())
        .collect();
    let lora = match &v["lora"] {
        Value::Null => None,
        l => Some(LoraKey {
            name: l["name"].as_str().unwrap().into(),
            path: l["path"].as_str().unwrap().into(),
        }),
    };
    let mm = v
        .get("mm_features")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|m| {
                    mm_feature(
                        m["identifier"].as_str().unwrap().into(),
                        m["offset"].as_i64().unwrap(),
                        m["length"].as_i64().unwrap(),
                    )
                    .unwrap()
                })
                .collect()
        })
        .unwrap_or_default();
    let salt = v["cache_salt"].as_str().map(str::to_owned);
    let want = v["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_owned())
        .collect();
    (config, ExtraKeys::new(lora, mm, salt), tokens, want)
}

#[test]
fn all_vectors_one_shot() {
    let vs = vectors();
    assert_eq!(vs.len(), 32);
    let mut algos = std::collections::HashSet::new();
    for (i, v) in vs.iter().enumerate() {
        let (config, extra, tokens, want) = case(v);
        algos.insert(config.algo());
        let got: Vec<String> = compute_block_hashes(config, extra, &tokens)
            .iter()
            .map(|h| hex(h.as_bytes()))
            .collect();
        assert_eq!(got, want, "vector {i}");
    }
    assert_eq!(algos.len(), 2);
}

#[test]
fn all_vectors_token_by_token() {
    for (i, v) in vectors().iter().enumerate() {
        let (config, extra, tokens, want) = case(v);
        let mut h = RequestHasher::new(config, extra);
        for n in 0..=tokens.len() {
            h.update(&tokens[..n]);
        }
        let got: Vec<String> = h.block_hashes().iter().map(|h| hex(h.as_bytes())).collect();
        assert_eq!(got, want, "vector {i}");
    }
}
