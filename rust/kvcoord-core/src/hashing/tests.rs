//! Tests of the block hashes: vLLM's byte-identical formats, the native
//! format, the incremental hasher and the refusals.

use super::*;

fn hex(h: &BlockHash) -> String {
    to_hex(h.as_bytes())
}

#[test]
fn a_block_completes_once_its_last_token_arrives() {
    assert!(!completes_block(0, 16, 15));
    assert!(completes_block(0, 16, 16));
    assert!(!completes_block(2, 16, 47));
    assert!(completes_block(2, 16, 48));
    assert!(completes_block(1, 16, 100));
    assert!(!completes_block(usize::MAX - 1, 16, usize::MAX - 1));
}

fn cfg(algo: HashAlgo, bs: usize, seed: &str) -> HashConfig {
    HashConfig::new(algo, bs, Some(seed)).unwrap()
}

fn lora() -> LoraKey {
    LoraKey {
        name: "ad".into(),
        path: "/p".into(),
    }
}

#[test]
fn names_round_trip() {
    for a in HashAlgo::ALL {
        assert_eq!(HashAlgo::from_name(a.name()).unwrap(), a);
        assert_eq!(a.to_string().parse::<HashAlgo>().unwrap(), a);
    }
    let err = HashAlgo::from_name("sha256").unwrap_err().to_string();
    assert!(
        err.contains("sha256_cbor, xxhash_cbor, xxh3_native"),
        "{err}"
    );
    assert!(err.contains("\"sha256\""), "{err}");
}

#[test]
fn vllm_default_none_hash() {
    // Recorded in the conformance vectors.
    assert_eq!(
        hex(&none_hash(HashAlgo::Sha256Cbor, VLLM_DEFAULT_SEED)),
        "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
    );
    assert_eq!(default_seed(HashAlgo::Sha256Cbor), VLLM_DEFAULT_SEED);
}

#[test]
fn random_default_seed_is_fixed_per_process() {
    let a = default_seed(HashAlgo::XxhashCbor);
    assert_eq!(a.len(), 64);
    assert_ne!(a, VLLM_DEFAULT_SEED);
    assert_eq!(a, default_seed(HashAlgo::Native));
    assert_eq!(
        HashConfig::new(HashAlgo::XxhashCbor, 4, None)
            .unwrap()
            .none_hash(),
        none_hash(HashAlgo::XxhashCbor, a)
    );
}

#[test]
fn zero_block_size_rejected() {
    let e = HashConfig::new(HashAlgo::Native, 0, Some("s")).unwrap_err();
    assert!(matches!(
        e,
        KvError::InvalidConfig {
            name: "hash_block_size",
            ..
        }
    ));
}

#[test]
fn token_validation() {
    assert_eq!(token_id(0, 0).unwrap(), 0);
    assert_eq!(token_id(0, i64::from(u32::MAX)).unwrap(), u32::MAX);
    assert_eq!(
        token_id(3, -1),
        Err(KvError::InvalidTokenId {
            position: 3,
            value: -1
        })
    );
    assert!(token_id(0, 1 << 32).is_err());
}

/// Independent re-statement of the payload for one block (no reuse of
/// the hasher's code paths beyond `CborBuf`).
#[test]
fn cbor_payload_of_a_salted_lora_block() {
    let config = cfg(HashAlgo::Sha256Cbor, 2, "s");
    let extra = ExtraKeys::new(Some(lora()), vec![], Some("salt".into()));
    let got = compute_block_hashes(config, extra, &[1, 300]);
    let mut c = CborBuf::new();
    c.array(3);
    c.bytes(config.none_hash().as_bytes());
    c.u32_array(&[1, 300]);
    c.array(2);
    c.array(3);
    c.text("lora");
    c.text("ad");
    c.text("/p");
    c.array(2);
    c.text("cache_salt");
    c.text("salt");
    let want = Sha256::digest(c.as_bytes());
    assert_eq!(got[0].as_bytes(), want.as_slice());
}

/// vLLM's documented example: items at [0,3) "hash1" and [3,6) "hash2",
/// block size 3: each block carries its own item at relative offset 0.
#[test]
fn mm_keys_per_block() {
    let config = cfg(HashAlgo::Sha256Cbor, 3, VLLM_DEFAULT_SEED);
    let mm = vec![
        mm_feature("hash1".into(), 0, 3).unwrap(),
        mm_feature("hash2".into(), 3, 3).unwrap(),
    ];
    let mut h = RequestHasher::new(config, ExtraKeys::new(None, mm, None));
    h.scan_mm(0, 3);
    assert_eq!(h.mm_scratch, vec![(0, 0)]);
    h.scan_mm(3, 6);
    assert_eq!(h.mm_scratch, vec![(1, 0)]);
}

/// Windows from vLLM's extra-key tests: 20 tokens, items [0,5) and
/// [10,15).
#[test]
fn mm_windows_negative_offsets() {
    let config = cfg(HashAlgo::Sha256Cbor, 5, "s");
    let mm = vec![
        mm_feature("a".into(), 0, 5).unwrap(),
        mm_feature("b".into(), 10, 5).unwrap(),
    ];
    let mut h = RequestHasher::new(config, ExtraKeys::new(None, mm, None));
    h.scan_mm(0, 5);
    assert_eq!((h.mm_scratch.clone(), h.mm_next), (vec![(0, 0)], 1));
    h.mm_next = 0;
    h.scan_mm(3, 8);
    assert_eq!(h.mm_scratch, vec![(0, -3)]);
    h.mm_next = 0;
    h.scan_mm(0, 15);
    assert_eq!(
        (h.mm_scratch.clone(), h.mm_next),
        (vec![(0, 0), (1, 10)], 2)
    );
    // An item spanning several blocks appears on each with its offset
    // relative to that block's start.
    let mm = vec![mm_feature("x".into(), 2, 9).unwrap()];
    let mut h = RequestHasher::new(
        cfg(HashAlgo::Sha256Cbor, 4, "s"),
        ExtraKeys::new(None, mm, None),
    );
    let mut seen = vec![];
    for b in 0..4u64 {
        h.scan_mm(b * 4, b * 4 + 4);
        seen.push(h.mm_scratch.clone());
    }
    assert_eq!(
        seen,
        vec![vec![(0, 2)], vec![(0, -2)], vec![(0, -6)], vec![]]
    );
}

#[test]
fn mm_validation_and_sorting() {
    assert!(mm_feature("x".into(), -1, 2).is_err());
    assert!(mm_feature("x".into(), 1, -2).is_err());
    assert!(mm_feature("x".into(), 1 << 32, 1).is_err());
    let e = ExtraKeys::new(
        None,
        vec![
            mm_feature("b".into(), 9, 1).unwrap(),
            mm_feature("a".into(), 2, 1).unwrap(),
        ],
        None,
    );
    assert_eq!(e.mm_features[0].identifier, "a");
    assert!(ExtraKeys::new(None, vec![], Some(String::new())).is_empty());
}

fn all_extra() -> ExtraKeys {
    ExtraKeys::new(
        Some(lora()),
        vec![
            mm_feature("img-1".into(), 3, 10).unwrap(),
            mm_feature("img-2".into(), 20, 2).unwrap(),
        ],
        Some("tenant".into()),
    )
}

#[test]
fn incremental_equals_one_shot() {
    let tokens: Vec<u32> = (0..203u32)
        .map(|i| i.wrapping_mul(2_654_435_761) >> 8)
        .collect();
    for algo in HashAlgo::COMPUTED {
        for bs in [1, 3, 16] {
            for extra in [ExtraKeys::default(), all_extra()] {
                let config = cfg(algo, bs, "seed");
                let one = compute_block_hashes(config, extra.clone(), &tokens);
                assert_eq!(one.len(), tokens.len() / bs);
                for step in [1, 2, 5, 17, 64] {
                    let mut h = RequestHasher::new(config, extra.clone());
                    let mut n = 0;
                    while n < tokens.len() {
                        n = (n + step).min(tokens.len());
                        h.update(&tokens[..n]);
                    }
                    assert_eq!(h.block_hashes(), &one[..], "{algo} bs={bs} step={step}");
                }
            }
        }
    }
}

#[test]
fn change_propagates_forward_only() {
    let tokens: Vec<u32> = (0..64).collect();
    for algo in HashAlgo::COMPUTED {
        let config = cfg(algo, 8, "seed");
        let base = compute_block_hashes(config, ExtraKeys::default(), &tokens);
        let mut t2 = tokens.clone();
        t2[27] += 1;
        let changed = compute_block_hashes(config, ExtraKeys::default(), &t2);
        assert_eq!(&base[..3], &changed[..3]);
        assert!(base[3..].iter().zip(&changed[3..]).all(|(a, b)| a != b));
        let salted = compute_block_hashes(
            config,
            ExtraKeys::new(None, vec![], Some("x".into())),
            &tokens,
        );
        assert!(base.iter().zip(&salted).all(|(a, b)| a != b));
    }
}

#[test]
fn partial_blocks_are_not_hashed() {
    let mut h = RequestHasher::new(cfg(HashAlgo::Native, 4, "s"), ExtraKeys::default());
    assert_eq!(h.update(&[1, 2, 3]), 0);
    assert_eq!(h.update(&[1, 2, 3, 4, 5]), 1);
    assert_eq!(h.num_hashed_tokens(), 4);
    assert_eq!(h.pending_blocks(12), 2);
}

/// Native format version 1 is frozen: these digests must never change.
/// (They were computed independently with Python's `xxhash` package from
/// the layout in the module docs.)
#[test]
fn native_format_pinned() {
    let root = none_hash(HashAlgo::Native, "kvcoord");
    assert_eq!(hex(&root), "de2688cf3de81f83ca80bb15cec258bc");
    let plain = compute_block_hashes(
        cfg(HashAlgo::Native, 4, "kvcoord"),
        ExtraKeys::default(),
        &[1, 2, 3, 4, 5, 6, 7, 8],
    );
    let plain: Vec<String> = plain.iter().map(hex).collect();
    assert_eq!(
        plain,
        vec![
            "eec51e83b8741f5b95744442e51a8cdd",
            "6e4b85306cbccb9cc6f9f33600ebad07"
        ]
    );
    let rich = compute_block_hashes(
        cfg(HashAlgo::Native, 4, "kvcoord"),
        all_extra(),
        &[10, 20, 30, 40, 50, 60, 70, 80],
    );
    let rich: Vec<String> = rich.iter().map(hex).collect();
    assert_eq!(
        rich,
        vec![
            "a79d47b9455dc5231b7660f33b4b8968",
            "07878580d38fcdf066dccefadce071ca"
        ]
    );
}

/// The native payload, written out by hand, hashes to the same digest.
#[test]
fn native_payload_layout() {
    let config = cfg(HashAlgo::Native, 2, "kvcoord");
    let extra = ExtraKeys::new(
        Some(lora()),
        vec![mm_feature("m".into(), 1, 3).unwrap()],
        Some("s".into()),
    );
    let got = compute_block_hashes(config, extra, &[7, 0x0102_0304, 9, 9]);
    let mut p = Vec::new();
    p.extend_from_slice(config.none_hash().as_bytes());
    p.extend_from_slice(&2u32.to_le_bytes());
    p.extend_from_slice(&7u32.to_le_bytes());
    p.extend_from_slice(&[4, 3, 2, 1]);
    p.push(1);
    p.extend_from_slice(&2u64.to_le_bytes());
    p.extend_from_slice(b"ad");
    p.extend_from_slice(&2u64.to_le_bytes());
    p.extend_from_slice(b"/p");
    p.push(2);
    p.extend_from_slice(&1u64.to_le_bytes());
    p.extend_from_slice(b"m");
    p.extend_from_slice(&1i64.to_le_bytes());
    p.push(3);
    p.extend_from_slice(&1u64.to_le_bytes());
    p.extend_from_slice(b"s");
    assert_eq!(got[0].as_bytes(), &xxh3_128(&p).to_be_bytes());
    // Block 1: item [1,4) seen from start 2 -> relative offset -1; no salt.
    let mut q = Vec::new();
    q.extend_from_slice(got[0].as_bytes());
    q.extend_from_slice(&2u32.to_le_bytes());
    q.extend_from_slice(&9u32.to_le_bytes());
    q.extend_from_slice(&9u32.to_le_bytes());
    q.push(1);
    q.extend_from_slice(&2u64.to_le_bytes());
    q.extend_from_slice(b"ad");
    q.extend_from_slice(&2u64.to_le_bytes());
    q.extend_from_slice(b"/p");
    q.push(2);
    q.extend_from_slice(&1u64.to_le_bytes());
    q.extend_from_slice(b"m");
    q.extend_from_slice(&(-1i64).to_le_bytes());
    assert_eq!(got[1].as_bytes(), &xxh3_128(&q).to_be_bytes());
}

#[test]
fn one_shot_sha256_equals_the_streaming_hasher() {
    // Every padding case: one to four blocks, the length field alone in
    // the last block, and the streaming fallback beyond.
    let msg: Vec<u8> = (0..400u32)
        .map(|i| (i.wrapping_mul(131) >> 3) as u8)
        .collect();
    for n in 0..=msg.len() {
        let want: [u8; 32] = Sha256::digest(&msg[..n]).into();
        assert_eq!(sha256(&msg[..n]), want, "length {n}");
    }
}

#[test]
fn supplied_digests_are_taken_as_given_and_checked_all_or_nothing() {
    let d = |b: u8, n: usize| BlockHash::from_slice(&vec![b; n]).unwrap();
    let mut h = RequestHasher::new(cfg(HashAlgo::Supplied, 4, "s"), ExtraKeys::default());
    assert_eq!(h.update(&[1; 12]), 0, "nothing is computed");
    assert_eq!(h.digest_len(), 32);
    h.supply(&[d(1, 16)], 12).unwrap();
    assert_eq!(h.block_hashes(), &[d(1, 16)]);
    assert_eq!(h.digest_len(), 16);
    // A different length, or more digests than full blocks: nothing changes.
    assert!(matches!(
        h.supply(&[d(2, 16), d(3, 32)], 12),
        Err(KvError::InvalidArgument { .. })
    ));
    assert!(matches!(
        h.supply(&[d(2, 16), d(3, 16), d(4, 16)], 12),
        Err(KvError::InvalidArgument { .. })
    ));
    assert_eq!(h.block_hashes(), &[d(1, 16)]);
    // Fewer digests than full blocks is fine (a look-ahead hash waits).
    h.supply(&[d(2, 16)], 12).unwrap();
    assert_eq!(h.block_hashes().len(), 2);
    assert_eq!(h.pending_blocks(40), 0);
}

#[test]
fn computing_hashers_refuse_supplied_digests() {
    let mut h = RequestHasher::new(cfg(HashAlgo::Native, 4, "s"), ExtraKeys::default());
    h.update(&[1; 8]);
    let d = BlockHash::from_slice(&[9; 16]).unwrap();
    assert!(matches!(
        h.supply(&[d], 8),
        Err(KvError::InvalidConfig { .. })
    ));
    assert_eq!(h.block_hashes().len(), 2);
    assert_eq!(HashAlgo::from_name("supplied").unwrap(), HashAlgo::Supplied);
    assert!(matches!(
        HashAlgo::Supplied.computing("a root digest"),
        Err(KvError::InvalidConfig { .. })
    ));
    assert_eq!(HashAlgo::Native.computing("x").unwrap(), HashAlgo::Native);
    assert!(!HashAlgo::Supplied.is_vllm_compatible());
}
