"""The capacity planner: model bytes, HF configs, roofline arithmetic, tiers, sizes, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvcoord.cli import main
from kvcoord.config import MambaSpec, SlidingWindowSpec
from kvcoord.replay.hardware import GPUS, load_gpu
from kvcoord.replay.hf_config import load_model, read_hf_config
from kvcoord.replay.latency_report import TPOT_TARGET
from kvcoord.replay.models import MODELS, model_layout
from kvcoord.replay.plan import GiB, PlanError, make_plan, parse_bytes
from kvcoord.replay.tiers import HostTier
from kvcoord.replay.timing import StepTimeModel, attention_pairs, prefill_gpu_seconds_saved
from kvcoord.replay.workloads import read_mooncake, synthetic_chat

DATA = Path(__file__).parent / "data"
MOONCAKE = str(DATA / "mooncake_small.jsonl")


# --------------------------------------------------------------------------- models


def test_bytes_per_token_of_presets() -> None:
    # 2 (K and V) x KV heads x head size x 2 bytes (bf16) x layers
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token_layer() * 32 == 2 * 8 * 128 * 2 * 32
    _, fp = model_layout(MODELS["llama-3.1-70b"], tp=4)
    assert fp.token_bytes_per_gpu == 2 * 2 * 128 * 2 * 80  # 8 KV heads over 4 GPUs
    assert fp.token_bytes == 4 * fp.token_bytes_per_gpu
    assert fp.page_bytes_per_gpu == 16 * 80 * 2 * 2 * 128 * 2
    # MLA: one 512 + 64 latent per token per layer, replicated on every GPU
    _, fp = model_layout(MODELS["deepseek-v3"], tp=8)
    assert fp.token_bytes_per_gpu == 61 * 576 * 2
    fp8 = model_layout(load_model("deepseek-v3", kv_dtype="fp8"), tp=8)[1]
    assert fp8.token_bytes_per_gpu == 61 * 576


def test_hybrid_layouts_group_layers_like_vllm() -> None:
    lay, fp = model_layout(MODELS["gpt-oss-120b"])
    assert fp.group_size == 18 and len(lay.groups) == 2
    assert isinstance(lay.groups[1].spec, SlidingWindowSpec)
    assert lay.groups[1].spec.sliding_window == 128
    lay, fp = model_layout(MODELS["gemma-3-27b"])  # 10 full, 52 sliding -> groups of 10
    assert fp.group_size == 10 and len(lay.groups) == 1 + 6
    assert len(lay.groups[-1].layer_names) == 2
    lay, fp = model_layout(MODELS["llama-4-scout"])
    assert [g.spec.kind for g in lay.groups] == ["full_attention"] + ["chunked_local"] * 3
    lay, fp = model_layout(MODELS["jamba-1.5-mini"])
    assert not lay.enable_caching  # Mamba prefix caching is not available: caching off
    assert sum(isinstance(g.spec, MambaSpec) for g in lay.groups) == 7
    # attention block raised until a page holds a Mamba group's state (4 layers x 8192 x 19 x 2 B)
    assert fp.block_size % 16 == 0
    assert fp.block_size * 4 * 4096 >= 4 * 8192 * 19 * 2 > (fp.block_size - 16) * 4 * 4096


def _write(tmp_path: Path, cfg: dict[str, object]) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_hf_config_llama_matches_preset(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "model_type": "llama",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "torch_dtype": "bfloat16",
        },
    )
    spec = read_hf_config(path)
    assert spec.kv_bytes_per_token_layer() == MODELS["llama-3.1-8b"].kv_bytes_per_token_layer()
    assert spec.layer_kinds == (("full_attention", 32),)
    assert abs(spec.params - 8.03e9) / 8.03e9 < 0.01  # the estimate is within 1% here


def test_hf_config_patterns(tmp_path: Path) -> None:
    gemma = {
        "text_config": {
            "num_hidden_layers": 62,
            "hidden_size": 5376,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
        }
    }
    spec = read_hf_config(_write(tmp_path, gemma))
    assert dict(spec.layer_kinds) == {"full_attention": 10, "sliding_window": 52}
    ds = {
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
    }
    spec = read_hf_config(_write(tmp_path, ds), kv_dtype="fp8")
    assert spec.kv_bytes_per_token_layer(tp=8) == 576
    assert spec.active_params < spec.params / 10


def test_hf_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        read_hf_config(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="num_hidden_layers"):
        read_hf_config(_write(tmp_path, {"hidden_size": 8}))


# --------------------------------------------------------------------------- roofline


def test_attention_pairs() -> None:
    assert attention_pairs(0, 4) == 1 + 2 + 3 + 4
    assert attention_pairs(10, 1) == 11
    # window 4: positions 0..9 attend 1, 2, 3, 4, 4, 4, 4, 4, 4, 4 keys
    assert attention_pairs(0, 10, 4) == 34
    assert attention_pairs(6, 4, 4) == 16
    assert attention_pairs(2, 3, 4) == 3 + 4 + 4


#: Round constants for the by-hand checks of the formulas (not the fitted ones).
_BY_HAND = {
    "compute_efficiency": 0.6,
    "bandwidth_efficiency": 0.8,
    "overhead_s": 0.5e-3,
    "cpu_scale": 0.0,
    "moe_efficiency": 1.0,
    "frontend_request_s": 0.0,
    "frontend_output_s": 0.0,
}


def _llama8b_h100(tp: int = 1, name: str = "llama-3.1-8b") -> StepTimeModel:
    spec = MODELS[name]
    return StepTimeModel(spec, GPUS["h100"], tp, model_layout(spec, tp)[1], **_BY_HAND)


def test_cpu_between_steps_by_hand() -> None:
    """The scheduler's CPU time adds to the GPU's, or overlaps it with async scheduling."""
    gpu_only = _llama8b_h100()
    m = replace(gpu_only, cpu_scale=2.0, scheduler_step_s=1e-3, scheduler_seq_s=1e-5)
    t_gpu = gpu_only.step_seconds(100, 100 * 1001, 0, 100 * 1001, 0, 100)
    cpu = 2.0 * (1e-3 + 1e-5 * 100)
    assert m.cpu_seconds(100) == pytest.approx(cpu)
    assert m.step_seconds(100, 100 * 1001, 0, 100 * 1001, 0, 100) == pytest.approx(t_gpu + cpu)
    overlapped = replace(m, async_scheduling=True)
    assert overlapped.step_seconds(100, 100 * 1001, 0, 100 * 1001, 0, 100) == pytest.approx(
        max(t_gpu, cpu)
    )
    slow_cpu = replace(overlapped, cpu_scale=100.0)
    assert slow_cpu.step_seconds(1, 1001, 0, 1001, 0, 1) == pytest.approx(100 * (1e-3 + 1e-5))
    # the per-step arrays the calibration uses give the same numbers
    many = m.step_seconds(*(np.array([v, v]) for v in (100, 100 * 1001, 0, 100 * 1001, 0, 100)))
    assert many.tolist() == pytest.approx([t_gpu + cpu] * 2)


def test_roofline_prefill_llama8b_h100_by_hand() -> None:
    """1000-token prefill from empty, Llama-3.1-8B, 1x H100 (compute-bound).

    The layers: 8.03e9 parameters less the embedding and the output head
    (2 x 128,256 x 4096 = 1.050673152e9) = 6.979326848e9; GEMMs 2 x that x 1000
    tokens = 1.3958653696e13 FLOPs. The head once (one request): 2 x 525,336,576 =
    1.050673152e9. Attention: 2 x 32 heads x (128 + 128) = 16384 FLOPs per pair x
    32 layers x 500,500 pairs = 2.62406144e11. Total 1.4222110513152e13 / (989e12 x
    0.6 = 5.934e14) = 23.967156 ms, + 0.5 ms = 24.467156 ms. Memory side: 1.606e10 B
    of weights less the input embedding's 1.050673152e9 + 32 x 4096 B x 2000 tokens
    (read + write) = 1.5271470848e10 B / 2.68e12 B/s = 5.6983 ms (smaller, so
    compute-bound).
    """
    m = _llama8b_h100()
    t = m.step_seconds(1000, 500_500, 0, 1000, 0, 1)
    assert t == pytest.approx(0.024467156, rel=1e-6)


def test_roofline_fp8_linear_layers_by_hand() -> None:
    """The same prefill with FP8 weights: the layers' GEMMs at the FP8 peak,
    attention and the output head still at the BF16 one.

    Layers: 1.3958653696e13 / (1979e12 x 0.6) = 11.755646 ms; head and attention:
    (1.050673152e9 + 2.62406144e11) / 5.934e14 = 0.443978 ms; + 0.5 ms.
    """
    spec = replace(MODELS["llama-3.1-8b"], weight_dtype="fp8")
    m = StepTimeModel(spec, GPUS["h100"], 1, model_layout(spec)[1], **_BY_HAND)
    t = m.step_seconds(1000, 500_500, 0, 1000, 0, 1)
    assert t == pytest.approx(11.755646e-3 + 0.443978e-3 + 0.5e-3, rel=1e-6)
    # the A100 has no FP8 tensor cores: FP8 weights run at the BF16 peak and share
    a100 = StepTimeModel(spec, GPUS["a100"], 1, model_layout(spec)[1], **_BY_HAND)
    assert a100.flops_per_second == a100.compute_flops_per_second == 312e12 * 0.6


def test_roofline_decode_llama8b_h100_by_hand() -> None:
    """One decode token at context 1000 (memory-bound).

    Bytes: 1.5009326848e10 of weights (all but the input embedding, whose one row
    is looked up) + 32 x 4096 x (1001 read + 1 written) = 1.5140660992e10 B
    / 2.68e12 B/s = 5.649500 ms, + 0.5 ms = 6.149500 ms.
    """
    m = _llama8b_h100()
    assert m.step_seconds(1, 1001, 0, 1001, 0, 1) == pytest.approx(0.0061495004, rel=1e-6)


def test_roofline_tp_communication_by_hand() -> None:
    """Llama-3.1-70B, 4x H100, one decode token: two all-reduces per layer.

    Comm: 2 x 80 x (4e-6 + 1 x 8192 x 2 B x 2 x 3/4 / 450e9 = 5.4613e-8) = 0.6487381 ms.
    Memory: (70.6e9 x 2 - 128,256 x 8192 x 2 input embedding) / 4 = 3.4774663424e10 B
    weights + 80 x 1024 B x 2 = 163,840 B (KV of one token at context 1: 2 KV heads x
    128 x 2 B x 2 (K,V) = 1024 B per layer per GPU) = 3.4774827264e10 / 2.68e12 =
    12.975682 ms. Total 12.975682 + 0.648738 + 0.5.
    """
    m = _llama8b_h100(tp=4, name="llama-3.1-70b")
    assert m.comm_seconds(1) == pytest.approx(6.487381e-4, rel=1e-6)
    assert m.step_seconds(1, 1, 0, 1, 0, 1) == pytest.approx(
        12.975682e-3 + 6.487381e-4 + 0.5e-3, rel=1e-5
    )


def test_calibration_against_published_a100_decode() -> None:
    """docs/replay.md: Llama-3.1-8B BF16 on one A100 40GB, 1024-token prompts, one request
    at a time, about 75 output tokens/s (vLLM 0.23.0; johnmusgrave.com), not among the
    calibration rows. The model's decode at the mean context of that run (1024 + 64)
    is within the TPOT target of it."""
    spec = MODELS["llama-3.1-8b"]
    m = StepTimeModel(spec, load_gpu("a100-40gb"), 1, model_layout(spec)[1])
    tpot = m.step_seconds(1, 1088, 0, 1088, 0, 1)
    assert abs(1 / tpot - 75) / 75 < TPOT_TARGET


def test_moe_reads_a_share_of_the_weights() -> None:
    m = _llama8b_h100(name="gpt-oss-120b")
    spec = m.model
    experts, other = spec.expert_weight_bytes, spec.weight_bytes - spec.expert_weight_bytes
    touched = 1 - (1 - 4 / 128) ** 64  # 4 of 128 experts per token
    assert m.expert_share(64) == pytest.approx(touched)
    embed = spec.vocab_size * spec.hidden_size * 2  # the input embedding, BF16: not read
    want = (other - embed + experts * touched) / spec.weight_bytes
    assert m.weight_share(64) == pytest.approx(want)
    assert m.weight_share(1) < m.weight_share(64) < 1.0
    dense = _llama8b_h100()
    assert dense.weight_share(1) == pytest.approx(1 - 128256 * 4096 * 2 / 16.06e9)


def test_prefill_saved_matches_prefill_flops() -> None:
    m = _llama8b_h100()
    hits = np.array([0, 1000, 4096])
    want = sum(m.prefill_gpu_seconds(int(h)) for h in hits)
    assert prefill_gpu_seconds_saved(m, hits) == pytest.approx(want)
    w = _llama8b_h100(name="gpt-oss-120b")
    assert prefill_gpu_seconds_saved(w, np.array([5000])) == pytest.approx(
        w.prefill_gpu_seconds(5000)
    )


# --------------------------------------------------------------------------- tiers, plan


def test_host_tier_is_lru_over_prefix_chunks() -> None:
    t = HostTier(3 * 256, 256)
    a = np.array([1, 2, 3], dtype=np.uint64)
    assert t.lookup(a) == 0
    t.insert(a)
    assert t.lookup(a) == 768
    assert t.lookup(np.array([1, 9], dtype=np.uint64)) == 256  # a prefix only
    t.insert(np.array([1, 7], dtype=np.uint64))  # 1 touched; 2 is least recent -> evicted
    assert len(t) == 3 and t.evictions == 1
    assert t.lookup(a) == 256


def test_parse_bytes() -> None:
    assert parse_bytes("40GiB") == 40 * GiB
    assert parse_bytes("1.5 TB") == 1.5e12
    assert parse_bytes("4096B") == 4096
    assert parse_bytes("0", allow_zero=True) == parse_bytes("0GiB", allow_zero=True) == 0
    for bad in ("x", "-1GiB", "4 parsecs", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    # a number without a unit is refused with a hint, not read as bytes
    with pytest.raises(ValueError, match=r"a size needs a unit, got '40': did you mean 40GiB\?"):
        parse_bytes("40")
    with pytest.raises(ValueError, match=r"unknown size unit 'Gi' .*did you mean 'GiB'"):
        parse_bytes("40Gi")


def test_default_size_from_gpu_and_trace() -> None:
    wl = read_mooncake(MOONCAKE)
    plan = make_plan(wl, model="llama-3.1-70b", gpu="h100", tp=4)
    # vLLM's total (nvidia-smi's 81,559 MiB less the driver's 468 MiB) x 0.9 - weights
    # - activation (an 8,192-token forward at TP 4: 3 x 8192 hidden + 3 x 28672 / 4 MLP
    # values per token, 2 B each; more than sampling 256 requests) - non-torch (0.25 GiB
    # + 1.82 GiB of TP buffers)
    act = 8192 * 2 * (3 * 8192 + 3 * 28672 / 4)
    free = (81559 - 468) * 2**20 * 0.9 - 70.6e9 * 2 / 4 - act - 2.07 * GiB
    assert plan.num_blocks == int(free // (16 * 80 * 1024))
    assert plan.size_flag == "default"
    for term in ("x 0.9 utilization", "weights 32.88 GiB (bf16)", "activation 0.70 GiB"):
        assert term in plan.size_note, plan.size_note
    assert "non-torch 2.07 GiB" in plan.size_note
    plan = make_plan(wl, model="llama-3.1-8b", kv_memory=1 * GiB)
    assert plan.num_blocks == GiB // (16 * 32 * 4096)
    assert plan.kv_bytes_per_gpu <= GiB


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"model": "gpt-9"}, "--model: unknown model 'gpt-9'"),
        ({"gpu": "tpu"}, "--gpu: unknown GPU 'tpu'"),
        ({"kv_dtype": "int3"}, "--kv-dtype: unknown KV dtype"),
        ({"kv_memory": 1 << 20}, "--kv-memory: "),
        ({"num_blocks": 20}, "--num-blocks: 20 blocks"),
        ({"capacity_tokens": 100}, "--capacity-tokens: "),
        ({"model": "llama-3.1-70b", "gpu": "l40s"}, "--tp 1: llama-3.1-70b's weights"),
        ({"model": "jamba-1.5-mini", "tp": 2, "host_memory": 1e12}, "--host-memory: "),
        ({"host_memory": 1000.0}, "--host-memory 1,000 B"),
    ],
)
def test_plan_errors_name_the_flag(kw: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as ei:
        make_plan(read_mooncake(MOONCAKE), **kw)  # type: ignore[arg-type]
    assert message in str(ei.value)


# --------------------------------------------------------------------------- end to end


def test_replay_prints_and_writes_planner_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    argv = ["replay", "--trace", MOONCAKE, "--model", "llama-3.1-70b", "--gpu", "h100"]
    assert main([*argv, "--tp", "4", "--no-progress", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for words in ("GiB per GPU", "TTFT", "p90", "time per output token", "prefill compute"):
        assert words in text
    s = json.loads(out.read_text())
    for key in (
        "kv_memory_gib_per_gpu",
        "kv_memory_gib_total",
        "kv_bytes_per_token",
        "prefix_hit_rate",
        "host_hit_rate",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "queue_p90_s",
        "output_tokens_per_s",
        "throughput_tokens_per_s",
        "prefill_gpu_seconds_saved",
        "occupancy_cached_free_mean",
        "size_source",
    ):
        assert s[key] is not None, key
    assert s["tp"] == 4 and s["model"] == "llama-3.1-70b"
    assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]
    assert 0 < s["prefill_gpu_seconds_saved"] < s["prefill_gpu_seconds"]


def test_host_tier_serves_what_the_gpu_pool_evicted() -> None:
    from kvcoord.replay.scheduler import SimConfig, simulate

    wl = synthetic_chat(num_conversations=24)
    small = make_plan(wl, capacity_tokens=wl.max_sequence_len + 64)
    host = make_plan(wl, capacity_tokens=wl.max_sequence_len + 64, host_memory=64 * GiB)

    def run(p: object) -> object:
        return simulate(
            wl,
            SimConfig(
                layout=p.layout,  # type: ignore[attr-defined]
                num_blocks=p.num_blocks,  # type: ignore[attr-defined]
                step_model=p.step_model,  # type: ignore[attr-defined]
                host_tier=p.host_tier(),  # type: ignore[attr-defined]
                token_bytes_per_gpu=p.footprint.token_bytes_per_gpu,  # type: ignore[attr-defined]
            ),
        )

    a, b = run(small), run(host)
    assert a.host_hit_tokens == 0 and b.host_hit_tokens > 0  # type: ignore[attr-defined]
    assert b.host_transfer_seconds > 0  # type: ignore[attr-defined]
    total = b.hit_tokens + b.host_hit_tokens  # type: ignore[attr-defined]
    assert total > a.hit_tokens  # type: ignore[attr-defined]
    assert total <= b.best.hit_tokens  # type: ignore[attr-defined]
    assert b.leaked_blocks == 0  # type: ignore[attr-defined]


def test_sweep_over_models_and_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.json"
    argv = ["sweep", "--trace", MOONCAKE, "--models", "llama-3.1-8b,gpt-oss-120b"]
    argv += ["--host-memories", "0,1GiB", "--kv-memories", "256MiB,1GiB", "--jobs", "1"]
    assert main([*argv, "--no-progress", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2
    assert {r["variant"] for r in rows} == {
        "llama-3.1-8b",
        "llama-3.1-8b + host 1 GiB",
        "gpt-oss-120b",
        "gpt-oss-120b + host 1 GiB",
    }
    assert "KV GiB/GPU" in capsys.readouterr().out


def test_scheduler_charges_the_roofline_step_times() -> None:
    """One 1000-token request with 2 output tokens: TTFT is the prefill step plus the
    request's time outside the engine, TPOT the decode step, exactly as the
    hand-pinned step model gives them."""
    from kvcoord.replay.report import latency_metrics
    from kvcoord.replay.scheduler import SimConfig, simulate
    from kvcoord.replay.workloads import Workload, WorkloadRequest

    toks = list(range(1000))
    wl = Workload("one", [WorkloadRequest("r", 0.0, 1000, 2, lambda: toks)])
    plan = make_plan(wl, capacity_tokens=4096)
    step = replace(plan.step_model, request_latency_s=0.25, **_BY_HAND)
    cfg = SimConfig(layout=plan.layout, num_blocks=plan.num_blocks, step_model=step)
    m = latency_metrics(simulate(wl, cfg))
    assert m["ttft_p50_s"] == pytest.approx(0.25 + 0.024467156, rel=1e-6)  # roofline_prefill
    assert m["tpot_p50_s"] == pytest.approx(0.0061495004, rel=1e-6)  # test_roofline_decode
    assert m["queue_p50_s"] == 0.0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_preset_replays(name: str) -> None:
    """Each preset's layout runs through the real manager; Mamba hybrids with caching off."""
    from kvcoord.replay.report import summarize
    from kvcoord.replay.scheduler import SimConfig, simulate

    wl = read_mooncake(MOONCAKE)
    plan = make_plan(wl, model=name, gpu="h200", tp=8, kv_memory=float(GiB))
    cfg = SimConfig(layout=plan.layout, num_blocks=plan.num_blocks, step_model=plan.step_model)
    res = simulate(wl, cfg)
    s = summarize(res, res.best, cfg, wl.name, plan)
    assert res.num_finished == len(wl.requests) and res.leaked_blocks == 0
    assert s["kv_memory_gib_per_gpu"] <= 1.0
    if plan.layout.enable_caching:
        assert 0 < s["prefix_hit_rate"] <= s["best_possible_hit_rate"]
    else:
        assert name == "jamba-1.5-mini" and s["prefix_hit_rate"] == 0


def test_hf_config_layer_types_and_chunked(tmp_path: Path) -> None:
    oss = {
        "num_hidden_layers": 4,
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "num_local_experts": 128,
        "experts_per_token": 4,
    }
    spec = read_hf_config(_write(tmp_path, oss))
    assert dict(spec.layer_kinds) == {"sliding_window": 2, "full_attention": 2}
    assert spec.window == 128 and spec.active_params < spec.params
    scout = {
        "text_config": {
            "num_hidden_layers": 8,
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "attention_chunk_size": 8192,
            "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],
        }
    }
    spec = read_hf_config(_write(tmp_path, scout))
    assert dict(spec.layer_kinds) == {"full_attention": 2, "chunked_local": 6}
    lay, _ = model_layout(spec)
    assert [g.spec.kind for g in lay.groups] == ["full_attention"] + ["chunked_local"] * 3


def test_model_config_and_kv_dtype_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(
        tmp_path,
        {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8},
    )  # fmt: skip
    out = tmp_path / "r.json"
    argv = ["replay", "--trace", MOONCAKE, "--model-config", cfg, "--kv-dtype", "fp8"]
    assert main([*argv, "--kv-memory", "1GiB", "--no-progress", "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["kv_dtype"] == "fp8" and s["kv_bytes_per_token"] == 32 * 2 * 8 * 128


def test_occupancy_splits_the_pool_exactly() -> None:
    """Referenced + cached-but-free + empty = every usable block, at every sample; a
    small pool under reuse is mostly cache, not empty."""
    from kvcoord.replay.report import occupancy_metrics
    from kvcoord.replay.scheduler import SimConfig, simulate

    wl = synthetic_chat(num_conversations=16)
    plan = make_plan(wl, capacity_tokens=wl.max_sequence_len * 4)
    res = simulate(
        wl, SimConfig(layout=plan.layout, num_blocks=plan.num_blocks, step_model=plan.step_model)
    )
    assert res.occupancy_samples
    for _, ref, cached_free, empty in res.occupancy_samples:
        assert ref + cached_free + empty == plan.num_blocks - 1
    m = occupancy_metrics(res)
    assert m["occupancy_cached_free_mean"] > m["occupancy_empty_mean"]
    assert m["occupancy_referenced_peak"] == pytest.approx(max(res.step_usage))
