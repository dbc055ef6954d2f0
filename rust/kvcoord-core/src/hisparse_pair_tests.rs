//! Tests of [`HiSparsePair`]: each transaction changes both halves or
//! neither, with a failure injected in each half.

use super::HiSparsePair;
use crate::block_ids::NewBlocks;
use crate::coordinator::{CoordinatorConfig, CoordinatorCore};
use crate::error::KvError;
use crate::events::Medium;
use crate::hashing::{ExtraKeys, HashAlgo, HashConfig, RequestHasher};
use crate::ids::{BlockId, GroupId};
use crate::request::Request;
use crate::spec::GroupSpec;
use crate::step_args::{AllocateArgs, PredictArgs};

const BS: u32 = 4;

/// A host core of `host_blocks` blocks and a device core (indexer,
/// resident, hot of 2 blocks) of `device_blocks`, both caching.
fn halves(host_blocks: usize, device_blocks: usize) -> (CoordinatorCore, CoordinatorCore) {
    let mut host =
        CoordinatorConfig::new(vec![GroupSpec::full_attention(BS)], host_blocks, true, 256);
    host.verify_hits = false;
    host.allow_partial_hits = true;
    host.event_medium = Medium::Cpu;
    let groups = vec![
        GroupSpec::full_attention(BS),
        GroupSpec::hisparse_resident(BS),
        GroupSpec::hisparse_hot(BS, 2),
    ];
    let mut device = CoordinatorConfig::new(groups, device_blocks, true, 256);
    device.group_id_base = 1;
    (
        CoordinatorCore::new(host).unwrap(),
        CoordinatorCore::new(device).unwrap(),
    )
}

fn request(id: &str, first: u32, len: u32) -> Request {
    let config = HashConfig::new(HashAlgo::Native, BS as usize, Some("t")).unwrap();
    Request::new(
        id.into(),
        (first..first + len).collect(),
        RequestHasher::new(config, ExtraKeys::default()),
    )
}

/// Everything a core holds: pool metadata (references, free queue order,
/// cache keys), tables, registry and ledgers.
fn snapshot(core: &CoordinatorCore) -> String {
    format!("{core:?}")
}

/// Both halves after request "a" (12 tokens) ran, cached its blocks in
/// both pools and finished: cached free blocks at the tail of each free
/// queue, which a later allocation may evict.
fn warmed(host_blocks: usize, device_blocks: usize) -> (CoordinatorCore, CoordinatorCore) {
    let (mut host, mut device) = halves(host_blocks, device_blocks);
    let a = request("a", 0, 12);
    let mut pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    let mut out = NewBlocks::new();
    let args = AllocateArgs {
        delay_cache_blocks: true,
        ..AllocateArgs::new(12)
    };
    assert!(pair.allocate(&a, &args, None, None, &mut out).unwrap());
    assert_eq!(out.num_groups(), 4);
    pair.check_invariants().unwrap();
    host.cache_request(&a, 12).unwrap();
    device.cache_request(&a, 12).unwrap();
    let mut pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    assert!(pair.free("a").unwrap());
    pair.check_invariants().unwrap();
    assert!(host.pool().num_cached_keys() > 0 && device.pool().num_cached_keys() > 0);
    (host, device)
}

#[test]
fn allocates_frees_and_pops_in_both_halves() {
    let (mut host, mut device) = warmed(16, 32);
    let b = request("b", 100, 9);
    let mut pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    let mut out = NewBlocks::new();
    assert!(pair
        .allocate(&b, &AllocateArgs::new(9), None, None, &mut out)
        .unwrap());
    // Host group first (3 blocks), then indexer, resident, hot (none yet).
    assert_eq!(out.num_groups(), 4);
    assert_eq!(out.group(0).len(), 3);
    assert_eq!(out.group(1).len(), 3);
    pair.check_invariants().unwrap();
    let popped = pair.pop_request_to_caller("b").unwrap().unwrap();
    assert_eq!(popped.len(), 4);
    assert_eq!(popped[0], out.group(0));
    assert_eq!(pair.pop_request_to_caller("b").unwrap(), None);
    assert!(!pair.free("b").unwrap());
    pair.check_invariants().unwrap();
}

/// Allocate `b` through the pair; both halves must be exactly as before.
fn assert_refused_unchanged(
    host: &mut CoordinatorCore,
    device: &mut CoordinatorCore,
    args: &AllocateArgs,
    host_hits: Option<&[BlockId]>,
    device_hits: Option<&[Vec<BlockId>]>,
    expect_error: bool,
) {
    let (h0, d0) = (snapshot(host), snapshot(device));
    let b = request("b", 100, 40);
    let mut pair = HiSparsePair::new(host, device).unwrap();
    let mut out = NewBlocks::new();
    let got = pair.allocate(&b, args, host_hits, device_hits, &mut out);
    assert_eq!(got.is_err(), expect_error, "{got:?}");
    if let Ok(fitted) = got {
        assert!(!fitted);
    }
    assert!(out.is_empty());
    pair.check_invariants().unwrap();
    assert_eq!(snapshot(host), h0, "host half changed");
    assert_eq!(snapshot(device), d0, "device half changed");
}

#[test]
fn a_device_failure_leaves_both_halves_as_they_were() {
    // The device pool cannot hold 40 tokens (10 blocks per group) where
    // the host can.
    let (mut host, mut device) = warmed(64, 16);
    let args = AllocateArgs::new(40);
    assert_refused_unchanged(&mut host, &mut device, &args, None, None, false);
    // An argument only the device half checks: encoder tokens out of
    // range (the host half takes none), and a hit list per device group
    // of the wrong length.
    let (mut host, mut device) = warmed(64, 64);
    let encoder = AllocateArgs {
        num_encoder_tokens: crate::limits::MAX_TOKENS,
        ..AllocateArgs::new(8)
    };
    assert_refused_unchanged(&mut host, &mut device, &encoder, None, None, true);
    let wrong = vec![vec![BlockId(1)]];
    let small = AllocateArgs::new(8);
    assert_refused_unchanged(&mut host, &mut device, &small, None, Some(&wrong), true);
}

#[test]
fn the_two_call_path_leaves_the_host_changed_on_a_device_failure() {
    // Negative control: the host half allocated first by its own call, the
    // device half's refusal then leaves the host changed (what the pair's
    // plan-then-device-first order prevents).
    let (mut host, mut device) = warmed(64, 64);
    let (h0, d0) = (snapshot(&host), snapshot(&device));
    let b = request("b", 100, 40);
    let args = AllocateArgs {
        num_encoder_tokens: crate::limits::MAX_TOKENS,
        ..AllocateArgs::new(8)
    };
    let mut out = NewBlocks::new();
    let host_args = HiSparsePair::host_args(&args);
    assert!(host
        .allocate_request(&b, &host_args, None, &mut out)
        .unwrap());
    assert!(device.allocate_request(&b, &args, None, &mut out).is_err());
    assert_eq!(snapshot(&device), d0);
    assert_ne!(snapshot(&host), h0, "the two-call path changed the host");
    let pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    assert!(pair.check_invariants().is_err(), "host alone tracks b");
}

#[test]
fn a_host_failure_leaves_both_halves_as_they_were() {
    // The host pool cannot hold 40 tokens where the device can.
    let (mut host, mut device) = warmed(8, 64);
    let args = AllocateArgs::new(40);
    assert_refused_unchanged(&mut host, &mut device, &args, None, None, false);
    // A host hit the host pool has no such block for.
    let (mut host, mut device) = warmed(64, 64);
    let bad = [BlockId(999)];
    let small = AllocateArgs::new(8);
    assert_refused_unchanged(&mut host, &mut device, &small, Some(&bad), None, true);
}

#[test]
fn without_the_host_plan_a_host_failure_leaves_the_device_changed() {
    // Negative control of the test above: with the plan skipped, the
    // device half allocates before the host half refuses.
    let (mut host, mut device) = warmed(8, 64);
    let (h0, d0) = (snapshot(&host), snapshot(&device));
    let b = request("b", 100, 40);
    let mut pair = HiSparsePair::new(&mut host, &mut device)
        .unwrap()
        .without_host_plan();
    let mut out = NewBlocks::new();
    let got = pair.allocate(&b, &AllocateArgs::new(40), None, None, &mut out);
    assert!(matches!(got, Err(KvError::Invariant(_))), "{got:?}");
    assert!(pair.check_invariants().is_err(), "device alone tracks b");
    assert_eq!(snapshot(&host), h0);
    assert_ne!(snapshot(&device), d0, "the device half changed");
}

#[test]
fn the_host_admission_count_is_zero_or_a_sure_refusal() {
    let (mut host, mut device) = halves(8, 64);
    let pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    let b = request("b", 0, 40);
    // 7 free host blocks (one is the null block): 28 tokens fit, 40 not.
    assert_eq!(
        pair.host_admission_blocks(&b, None, &PredictArgs::new(28)),
        Ok(0)
    );
    assert_eq!(
        pair.host_admission_blocks(&b, None, &PredictArgs::new(40)),
        Ok(65)
    );
    let device_only = pair
        .device()
        .num_blocks_to_allocate(&b, &[], &PredictArgs::new(40))
        .unwrap();
    assert_eq!(
        pair.num_blocks_to_allocate(&b, None, &[], &PredictArgs::new(40)),
        Ok(device_only + 65)
    );
}

#[test]
fn max_admission_blocks_is_the_groups_rule() {
    let (mut host, mut device) = halves(8, 64);
    let pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    // Group 2 is the resident group: the in-flight window's pages.
    assert_eq!(pair.max_admission_blocks(GroupId(2), 10), Ok(Some(3)));
    assert_eq!(pair.max_admission_blocks(GroupId(2), 1000), Ok(Some(64)));
    assert_eq!(pair.max_admission_blocks(GroupId(0), 10), Ok(None));
    assert_eq!(
        pair.max_admission_blocks(GroupId(4), 10),
        Err(KvError::UnknownGroup(GroupId(4)))
    );
}

#[test]
fn the_pairs_shape_is_checked() {
    let (mut host, mut device) = halves(8, 64);
    assert!(HiSparsePair::new(&mut device, &mut host).is_err());
    let mut two = CoordinatorConfig::new(
        vec![GroupSpec::full_attention(BS), GroupSpec::full_attention(BS)],
        8,
        true,
        256,
    );
    two.group_id_base = 0;
    let mut two = CoordinatorCore::new(two).unwrap();
    assert!(HiSparsePair::new(&mut two, &mut device).is_err());
    let (mut host, _) = halves(8, 64);
    let cfg = CoordinatorConfig::new(vec![GroupSpec::full_attention(BS)], 8, true, 256);
    let mut based_at_zero = CoordinatorCore::new(cfg).unwrap();
    assert!(HiSparsePair::new(&mut host, &mut based_at_zero).is_err());
}

/// Whether each half can still find request "a"'s cached prefix.
fn cached(host: &CoordinatorCore, device: &CoordinatorCore) -> (bool, bool) {
    (
        host.pool().num_cached_keys() > 0,
        device.pool().num_cached_keys() > 0,
    )
}

#[test]
fn reset_prefix_cache_resets_each_pool_with_no_block_in_use() {
    let (mut host, mut device) = warmed(16, 32);
    let mut pair = HiSparsePair::new(&mut host, &mut device).unwrap();
    let got = pair.reset_prefix_cache();
    assert_eq!(
        got,
        super::PrefixReset {
            host: true,
            device: true
        }
    );
    assert!(got.both());
    pair.check_invariants().unwrap();
    assert_eq!(cached(&host, &device), (false, false));
}

#[test]
fn a_block_in_use_keeps_only_its_own_pools_cache() {
    // A block held in one pool: the other still resets (vLLM resets every
    // pool it can), the holder keeps its cache, and the answer is false.
    for device_holds in [true, false] {
        let (mut host, mut device) = warmed(16, 32);
        let holder = if device_holds { &mut device } else { &mut host };
        let mut held = Vec::new();
        holder.get_caller_blocks(1, &mut held).unwrap();
        let got = HiSparsePair::new(&mut host, &mut device)
            .unwrap()
            .reset_prefix_cache();
        let want = super::PrefixReset {
            host: device_holds,
            device: !device_holds,
        };
        assert_eq!(got, want);
        assert!(!got.both());
        assert_eq!(cached(&host, &device), (!device_holds, device_holds));
        let holder = if device_holds { &mut device } else { &mut host };
        holder.free_caller_blocks(&held).unwrap();
        HiSparsePair::new(&mut host, &mut device)
            .unwrap()
            .check_invariants()
            .unwrap();
    }
}
