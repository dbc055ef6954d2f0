"""The KV kinds added after the first six layouts: MLA, sliding-window MLA,
R-SWA and Mamba "align" (spec validation, manager behaviour on the worked
examples of the conformance README and the behaviour spec), the Mamba chunk
rule, shared_prefix_boundary and the per-group common-prefix counts."""

from __future__ import annotations

import pytest

import kvcoord
from kvcoord import (
    ConfigError,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    mamba_aligned_chunk,
)


def manager(*specs: object, num_blocks: int = 100, caching: bool = True) -> KVCacheManager:
    config = KVCacheConfig(num_blocks=num_blocks, groups=tuple(KVCacheGroup(s) for s in specs))  # type: ignore[arg-type]
    return KVCacheManager(
        config, max_model_len=4096, options=kvcoord.KVCacheManagerOptions(enable_caching=caching)
    )


def run_prefill(m: KVCacheManager, req: Request, chunks: list[int]) -> None:
    """Admit ``req`` (with its hit) and compute its prompt in ``chunks``,
    one step each, the way vLLM's scheduler does."""
    m.new_step_starts()
    blocks, hit = m.get_computed_blocks(req)
    assert m.allocate_slots(req, chunks[0], hit, blocks) is not None
    req.num_computed_tokens = hit + chunks[0]
    for n in chunks[1:]:
        m.new_step_starts()
        assert m.allocate_slots(req, n) is not None
        req.num_computed_tokens += n


# ---- specs -----------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: MLAAttentionSpec(0),
        lambda: SlidingWindowMLASpec(16, 0),
        lambda: SlidingWindowMLASpec(16, True),  # type: ignore[arg-type]
        lambda: RSWASpec(16, 0),
        lambda: RSWASpec(16, -3),
        lambda: MambaSpec(16, mamba_cache_mode="full"),  # type: ignore[arg-type]
        lambda: MambaSpec(16, mamba_cache_mode="align", num_speculative_blocks=-1),
        lambda: MambaSpec(16, mamba_cache_mode="align", prefill_checkpoint_alignment=0),
        lambda: MambaSpec(16, num_prefill_checkpoint_blocks=1),  # mode "none"
        lambda: MambaSpec(16, mamba_cache_mode="align", num_prefill_checkpoint_blocks=-1),
    ],
)
def test_bad_spec_values_raise_config_error(build: object) -> None:
    with pytest.raises(ConfigError):
        build()  # type: ignore[operator]


def test_specs_are_exported_and_distinct() -> None:
    for name in ("MLAAttentionSpec", "SlidingWindowMLASpec", "RSWASpec", "mamba_aligned_chunk"):
        assert name in kvcoord.__all__
    assert MLAAttentionSpec(16) != FullAttentionSpec(16)
    assert SlidingWindowMLASpec(16, 64) != SlidingWindowSpec(16, 64)
    assert MambaSpec(16, mamba_cache_mode="align").prefix_cacheable
    assert not MambaSpec(16).prefix_cacheable


def test_mamba_prefix_caching_needs_align_mode() -> None:
    with pytest.raises(ConfigError, match="align"):
        manager(FullAttentionSpec(16), MambaSpec(16))
    manager(FullAttentionSpec(16), MambaSpec(16, mamba_cache_mode="align"))


def test_mamba_align_needs_hash_unit_equal_to_block_size() -> None:
    config = KVCacheConfig(
        num_blocks=50,
        groups=(
            KVCacheGroup(FullAttentionSpec(8)),
            KVCacheGroup(MambaSpec(16, mamba_cache_mode="align")),
        ),
    )
    with pytest.raises(ConfigError, match="hash_block_size"):
        KVCacheManager(
            config, max_model_len=1000, options=kvcoord.KVCacheManagerOptions(hash_block_size=8)
        )


# ---- MLA and sliding-window MLA ----------------------------------------------


def test_mla_hits_like_full_attention() -> None:
    m = manager(MLAAttentionSpec(64), num_blocks=20)
    prompt = list(range(200))
    a = Request("a", prompt, hash_block_size=64)
    run_prefill(m, a, [200])
    b = Request("b", [*prompt[:190], 7, 8, 9], hash_block_size=64)
    blocks, hit = m.get_computed_blocks(b)
    assert (hit, blocks.get_block_ids()) == (128, ([1, 2],))
    assert b.shared_prefix_boundary == 0


def test_swa_mla_hybrid_boundary_when_window_blocks_are_gone() -> None:
    """MLA + SWA-MLA (window 128 = 2 blocks of 64): when the sliding group
    lost the block before the full hit's end, the hit shrinks to the last
    run of two cached window blocks and the boundary reports the longer
    MLA prefix."""
    m = manager(MLAAttentionSpec(64), SlidingWindowMLASpec(64, 128), num_blocks=40)
    prompt = list(range(512))
    a = Request("a", prompt, hash_block_size=64)
    run_prefill(m, a, [512])
    mla, swa = m.get_block_ids("a")
    b = Request("b", [*prompt, 5], hash_block_size=64)
    blocks, hit = m.get_computed_blocks(b)
    assert (hit, b.shared_prefix_boundary) == (512, 0)
    m.evict_blocks([swa[7]])
    blocks, hit = m.get_computed_blocks(b)
    assert (hit, b.shared_prefix_boundary) == (448, 512)
    assert blocks.get_block_ids() == (mla[:7], [0] * 5 + swa[5:7])
    # Accepted by the next allocation like any other hit.
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None
    m.check_invariants()


# ---- R-SWA --------------------------------------------------------------------


def test_rswa_frees_the_decode_gap_and_gap_blocks_stay_hittable() -> None:
    """Behaviour spec §6.6: B 4, window 8, an 8-token prompt + 20 decoded
    tokens leaves [1, 2, null, null, 5, 6, 7]; a follow-up whose prompt
    covers the gap hits all seven blocks."""
    m = manager(RSWASpec(4, 8), num_blocks=30)
    prompt = list(range(100, 108))
    r = Request("r", prompt, hash_block_size=4)
    run_prefill(m, r, [8])
    outputs = list(range(500, 520))
    for t in outputs:
        r.append_output_token_ids(t)
        m.new_step_starts()
        assert m.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
    assert m.get_block_ids("r") == ([1, 2, 0, 0, 5, 6, 7],)
    m.check_invariants()
    follow = Request("f", [*prompt, *outputs, 9], hash_block_size=4)
    blocks, hit = m.get_computed_blocks(follow)
    assert (hit, blocks.get_block_ids()) == (28, ([1, 2, 3, 4, 5, 6, 7],))
    m.free(r)
    assert m.block_pool.num_free_blocks == 29


def test_rswa_without_caching_keeps_decoding_in_bounded_memory() -> None:
    m = manager(RSWASpec(16, 64), num_blocks=12, caching=False)
    r = Request("r", list(range(32)), hash_block_size=16)
    run_prefill(m, r, [32])
    for t in range(400):
        r.append_output_token_ids(t)
        assert m.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
    real = [b for b in m.get_block_ids("r")[0] if b]
    # 2 prompt blocks + at most the window (64 tokens, 5 blocks with the one
    # being filled) are held after 400 decoded tokens.
    assert len(real) <= 2 + 6


# ---- Mamba align ----------------------------------------------------------------


def hybrid_mamba(**mamba: object) -> KVCacheManager:
    return manager(
        FullAttentionSpec(16),
        MambaSpec(16, mamba_cache_mode="align", **mamba),  # type: ignore[arg-type]
        num_blocks=100,
    )


def test_mamba_chunk_rule_readme_examples() -> None:
    rule = kvcoord.mamba_chunk_rule(
        KVCacheConfig(
            num_blocks=10,
            groups=(
                KVCacheGroup(FullAttentionSpec(16)),
                KVCacheGroup(MambaSpec(16, mamba_cache_mode="align")),
            ),
        ),
        16,
    )
    assert rule is not None
    assert rule(100, start=0, num_tokens=100, num_prompt_tokens=100) == 96
    assert rule(4, start=96, num_tokens=100, num_prompt_tokens=100) == 4
    assert rule(96, start=0, num_tokens=96, num_prompt_tokens=96) == 80
    # Budget-capped chunks end on a block boundary; a mid-block start stops
    # at the next boundary; a shared-prefix junction is a stop (floored).
    assert rule(50, start=0, num_tokens=300, num_prompt_tokens=300) == 48
    assert rule(100, start=40, num_tokens=300, num_prompt_tokens=300) == 8
    assert (
        rule(200, start=0, num_tokens=300, num_prompt_tokens=300, shared_prefix_boundary=70) == 64
    )
    # Decoding is never clipped.
    assert rule(1, start=300, num_tokens=301, num_prompt_tokens=300) == 1
    ckpt = dict(block_size=16, checkpoint_blocks=True, checkpoint_alignment=1)
    assert mamba_aligned_chunk(100, start=0, num_tokens=100, num_prompt_tokens=100, **ckpt) == 100  # type: ignore[arg-type]
    assert kvcoord.mamba_chunk_rule(KVCacheConfig(num_blocks=10, groups=()), 16) is None


def test_mamba_align_one_chunk_caches_nothing_split_chunks_do() -> None:
    prompt = list(range(1000, 1100))
    m = hybrid_mamba()
    a = Request("a", prompt, hash_block_size=16)
    run_prefill(m, a, [100])
    m.new_step_starts()
    _, hit = m.get_computed_blocks(Request("b", [*prompt, 1], hash_block_size=16))
    assert hit == 0

    m = hybrid_mamba()
    a = Request("a", prompt, hash_block_size=16)
    run_prefill(m, a, [96, 4])
    m.new_step_starts()
    b = Request("b", [*prompt, 1], hash_block_size=16)
    blocks, hit = m.get_computed_blocks(b)
    assert hit == 96
    assert blocks.get_block_ids()[1][:5] == [0] * 5 and blocks.get_block_ids()[1][5] != 0
    m.check_invariants()


def test_mamba_align_checkpoint_block_and_same_step_refusal() -> None:
    prompt = list(range(2000, 2100))
    m = hybrid_mamba(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    a = Request("a", prompt, hash_block_size=16)
    m.new_step_starts()
    new = m.allocate_slots(a, 100)
    assert new is not None
    mamba_table = m.get_block_ids("a")[1]
    assert mamba_table[:5] == [0] * 5 and all(mamba_table[5:])
    assert new.get_block_ids()[1] == mamba_table  # the padding nulls are returned too
    a.num_computed_tokens = 100
    # Same step: the state at 96 is only written by this step's forward.
    b = Request("b", [*prompt, 5], hash_block_size=16)
    blocks, hit = m.get_computed_blocks(b)
    assert hit == 96
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is None
    m.new_step_starts()
    blocks, hit = m.get_computed_blocks(b)
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None
    m.check_invariants()


# ---- per-group counts ------------------------------------------------------------


def test_common_prefix_blocks_per_group() -> None:
    m = manager(FullAttentionSpec(16), SlidingWindowSpec(16, 32), num_blocks=50)
    prompt = list(range(64))
    for rid in ("a", "b"):
        req = Request(rid, [*prompt, ord(rid)], hash_block_size=16)
        blocks, hit = m.get_computed_blocks(req)
        assert m.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
    # "b" shares a's four full-attention blocks; sliding-window groups never
    # report a shared prefix (their leading entries are released).
    assert m.get_num_common_prefix_blocks("b") == [4, 0]


# ---- replay presets ------------------------------------------------------------


def test_replay_hybrid_mamba_preset_splits_prefill_chunks() -> None:
    """The replay scheduler applies the chunk rule: a 100-token prompt runs
    as 96 + 4, so a later request with the same first 96 tokens hits them
    (in one 100-token chunk no Mamba state would be cached at all)."""
    from kvcoord.replay.layouts import PRESETS
    from kvcoord.replay.scheduler import SimConfig, simulate
    from kvcoord.replay.workloads import Workload, WorkloadRequest

    def req(rid: str, prompt: list[int], t: float) -> WorkloadRequest:
        out = tuple(range(30000, 30004))
        return WorkloadRequest(rid, t, len(prompt), 4, lambda p=tuple(prompt): p, None, out)

    p = list(range(100, 200))
    wl = Workload("w", [req("a", p, 0.0), req("b", [*p[:96], 7, 7, 7, 7, 7], 10.0)])
    res = simulate(wl, SimConfig(PRESETS["hybrid-mamba"], num_blocks=64))
    assert (res.num_finished, res.leaked_blocks) == (2, 0)
    assert res.hit_tokens == 96
    for name in ("mla", "hybrid-swa-mla", "rswa", "hybrid-mamba2"):
        res = simulate(wl, SimConfig(PRESETS[name], num_blocks=64))
        assert (res.num_finished, res.leaked_blocks) == (2, 0), name


def test_mamba_align_alone_uses_the_unitary_lookup() -> None:
    """A model of Mamba layers only (one group): the unitary coordinator asks
    the Mamba finder directly; the split prompt leaves a state at 96."""
    m = manager(MambaSpec(16, mamba_cache_mode="align"), num_blocks=40)
    prompt = list(range(3000, 3100))
    run_prefill(m, Request("a", prompt, hash_block_size=16), [96, 4])
    m.new_step_starts()
    b = Request("b", [*prompt, 1], hash_block_size=16)
    blocks, hit = m.get_computed_blocks(b)
    (ids,) = blocks.get_block_ids()
    assert hit == 96 and ids[:5] == [0] * 5 and ids[5] != 0
    assert m.allocate_slots(b, b.num_tokens - hit, hit, blocks) is not None
    m.check_invariants()
