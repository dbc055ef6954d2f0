"""``--weight-dtype``, ``--gpu-memory-utilization`` and the memory terms of the
default pool: weights in their dtype, activation, non-torch memory, in the
summary's "size from" line and in ``--json``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvcoord.cli import main
from kvcoord.replay.dtypes import DTYPE_BYTES, WEIGHT_DTYPES
from kvcoord.replay.hardware import load_gpu
from kvcoord.replay.hf_config import load_model, read_hf_config
from kvcoord.replay.memory import vllm_kv_memory
from kvcoord.replay.models import MODELS, ModelError
from kvcoord.replay.plan import GiB, PlanError, make_plan
from kvcoord.replay.workloads import read_mooncake

MOONCAKE = str(Path(__file__).parent / "data" / "mooncake_small.jsonl")


def _replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[str, dict]:
    out = tmp_path / "r.json"
    assert main(["replay", "--trace", MOONCAKE, "--no-progress", "--json", str(out), *argv]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["replay", "--trace", MOONCAKE, "--no-progress", *argv])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


# --------------------------------------------------------------------------- the summary


def test_size_from_line_and_json_show_every_term(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text, s = _replay(capsys, tmp_path)
    line = next(x for x in text.splitlines() if "size from" in x)
    for term in ("79.19 GiB x 0.9 utilization", "weights 14.96 GiB (bf16)", "activation 0.84 GiB"):
        assert term in line, line
    assert "non-torch 0.25 GiB" in line and line.endswith("= 55.22 GiB per GPU")
    m = s["memory"]
    assert m["gpu_memory_utilization"] == 0.9 and m["weight_dtype"] == "bf16"
    assert m["kv_budget_gib"] == pytest.approx(
        m["gpu_total_gib"] * 0.9 - m["weights_gib"] - m["activation_gib"] - m["non_torch_gib"]
    )
    assert m["activation_gib"] == max(m["activation_forward_gib"], m["activation_sampler_gib"])
    assert s["kv_memory_gib_per_gpu"] <= m["kv_budget_gib"]
    # a pool given by size still reports the terms of the default one
    _, s = _replay(capsys, tmp_path, "--kv-memory", "8GiB")
    assert s["memory"]["kv_budget_gib"] == pytest.approx(m["kv_budget_gib"])


def test_sweep_rows_carry_the_memory_terms(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    argv = ["sweep", "--trace", MOONCAKE, "--sizes", "2000", "--no-progress", "--json", str(out)]
    assert main([*argv, "--weight-dtype", "fp8"]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["memory"]["weight_dtype"] == "fp8"


def test_activation_follows_the_replays_batch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--max-running is vLLM's max_num_seqs: at 1,024 the sampler's logits set
    the peak (1.89 GiB, as vLLM 0.19.0 logs for Llama-3.1-8B on an H100)."""
    text, s = _replay(capsys, tmp_path, "--max-running", "1024")
    assert "activation 1.89 GiB (sampling 1,024 requests)" in text
    assert s["memory"]["max_num_seqs"] == 1024
    _, small = _replay(capsys, tmp_path, "--token-budget", "2048")
    assert small["memory"]["activation_gib"] < s["memory"]["activation_gib"]


# ------------------------------------------------------------------ --gpu-memory-utilization


def test_utilization_scales_the_default_pool(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, base = _replay(capsys, tmp_path)
    text, half = _replay(capsys, tmp_path, "--gpu-memory-utilization", "0.5")
    assert "x 0.5 utilization" in text
    drop = base["memory"]["requested_gib"] - half["memory"]["requested_gib"]
    assert drop == pytest.approx(0.4 * base["memory"]["gpu_total_gib"])
    assert half["kv_memory_gib_per_gpu"] == pytest.approx(
        base["kv_memory_gib_per_gpu"] - drop, abs=0.01
    )
    _, full = _replay(capsys, tmp_path, "--gpu-memory-utilization", "1")
    assert full["memory"]["requested_gib"] == full["memory"]["gpu_total_gib"]


@pytest.mark.parametrize("bad", ["0", "-0.5", "1.5", "nan", "inf", "x", ""])
def test_utilization_out_of_range_exits_2(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    _fails(capsys, ["--gpu-memory-utilization", bad], "--gpu-memory-utilization", "(0, 1]")


def test_utilization_out_of_range_in_make_plan() -> None:
    for bad in (0.0, 1.01, math.nan):
        with pytest.raises(PlanError, match=r"--gpu-memory-utilization .*\(0, 1\]"):
            make_plan(read_mooncake(MOONCAKE), gpu_memory_utilization=bad)


def test_low_utilization_leaves_no_pool_and_says_which_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _fails(
        capsys,
        ["--gpu-memory-utilization", "0.1"],
        "leave no KV memory",
        "x 0.1 utilization",
        "--gpu-memory-utilization",
    )


# --------------------------------------------------------------------------- --weight-dtype


def test_fp8_weights_halve_the_layer_weights(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ("--model", "llama-3.1-70b", "--tp", "4")
    _, bf16 = _replay(capsys, tmp_path, *argv)
    text, fp8 = _replay(capsys, tmp_path, *argv, "--weight-dtype", "fp8")
    assert "(fp8)" in text and fp8["kv_dtype"] == "bf16"  # the KV cache keeps its dtype
    # 70.6e9 parameters, of which the embedding and head (2 x 128256 x 8192) stay bf16
    embed = 2 * 128256 * 8192
    assert fp8["memory"]["weights_gib"] == pytest.approx(((70.6e9 - embed) + 2 * embed) / 4 / GiB)
    gained = bf16["memory"]["weights_gib"] - fp8["memory"]["weights_gib"]
    assert fp8["kv_memory_gib_per_gpu"] == pytest.approx(
        bf16["kv_memory_gib_per_gpu"] + gained, abs=0.01
    )


def test_fp32_weights_keep_an_fp32_kv_cache_unless_told() -> None:
    spec = load_model("llama-3.1-8b", weight_dtype="fp32")
    assert spec.kv_dtype == "fp32" and spec.compute_dtype == "fp32"
    assert spec.weight_bytes == pytest.approx(8.03e9 * 4)
    assert load_model("llama-3.1-8b", "fp8", "fp32").kv_dtype == "fp8"
    assert load_model("llama-3.1-8b", weight_dtype="bfloat16").weight_dtype == "bf16"


def test_presets_load_their_checkpoints_dtype() -> None:
    ds, oss = MODELS["deepseek-v3"], MODELS["gpt-oss-120b"]
    assert ds.weight_dtype == "fp8" and oss.weight_dtype == "mxfp4"
    # DeepSeek-V3: 671e9 parameters at one byte, the embeddings at two
    assert ds.weight_bytes == pytest.approx(671e9 + ds.embedding_params, rel=1e-9)
    # gpt-oss-120b: MXFP4 experts (hidden 2880 padded to 3072), the rest bf16;
    # vLLM loads 64.38 GiB on an H100 (llmdbench-kv-02's notes)
    assert oss.weight_bytes / GiB == pytest.approx(64.38, rel=0.005)
    assert load_model("gpt-oss-120b", weight_dtype="bf16").weight_bytes > 3 * oss.weight_bytes
    assert all(m.weight_dtype in WEIGHT_DTYPES for m in MODELS.values())


def test_each_weight_dtype_sizes_its_scope() -> None:
    dense = MODELS["llama-3.1-70b"]
    sizes = {
        w: load_model(dense.name, weight_dtype=w).weight_bytes
        for w in WEIGHT_DTYPES
        if w != "mxfp4"
    }
    assert sizes["fp32"] == 2 * sizes["bf16"] == 2 * sizes["fp16"]
    assert sizes["bf16"] > sizes["fp8"] == sizes["int8"] > sizes["nvfp4"] > sizes["int4"]
    embed = dense.embedding_params * 2
    assert sizes["int4"] == pytest.approx(
        embed + (dense.params - dense.embedding_params) * DTYPE_BYTES["int4"]
    )


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--weight-dtype", "bf17"], ("--weight-dtype: unknown weight dtype 'bf17'", "'bf16'")),
        (["--weight-dtype", "fp4"], ("--weight-dtype", "did you mean", "one of bf16")),
        (["--weight-dtype", "mxfp4"], ("--weight-dtype: vLLM's MXFP4 format", "llama-3.1-8b")),
        (["--kv-dtype", "fp9"], ("--kv-dtype: unknown KV dtype 'fp9'", "did you mean 'fp8'")),
        (["--kv-dtype", "mxfp4"], ("--kv-dtype: unknown KV dtype 'mxfp4'",)),
    ],
)
def test_bad_dtype_exits_2_with_a_suggestion(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: tuple[str, ...]
) -> None:
    _fails(capsys, argv, *needles)


def test_sweep_names_weight_dtype_for_a_model_it_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sweep", "--trace", MOONCAKE, "--models", "gpt-oss-120b,llama-3.1-8b"]
    with pytest.raises(SystemExit) as ei:
        main([*argv, "--weight-dtype", "mxfp4", "--sizes", "2000", "--no-progress"])
    assert ei.value.code == 2
    assert "--weight-dtype: vLLM's MXFP4 format" in capsys.readouterr().err


# --------------------------------------------------------------------------- config.json


def _config(tmp_path: Path, **extra: object) -> str:
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        **extra,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize(
    ("extra", "dtype"),
    [
        ({}, "bf16"),
        ({"torch_dtype": "float16"}, "fp16"),
        ({"torch_dtype": "float32"}, "fp32"),
        ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, "fp8"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}, "int4"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "int4"),
        ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "nvfp4"),
        (
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
                }
            },
            "int4",
        ),
    ],
)
def test_config_weight_dtype(tmp_path: Path, extra: dict[str, object], dtype: str) -> None:
    spec = read_hf_config(_config(tmp_path, **extra))
    assert spec.weight_dtype == dtype
    assert spec.kv_dtype == (dtype if dtype in ("fp16", "fp32") else "bf16")
    # --weight-dtype overrides the file
    assert read_hf_config(_config(tmp_path, **extra), weight_dtype="fp8").weight_dtype == "fp8"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "give --weight-dtype"),
        ({"quantization_config": "fp8"}, "must be a JSON object"),
        ({"torch_dtype": "float8"}, "'torch_dtype' 'float8'"),
        ({"quantization_config": {"quant_method": "mxfp4"}}, "mixture-of-experts layers only"),
    ],
)
def test_config_weight_dtype_errors(tmp_path: Path, extra: dict[str, object], needle: str) -> None:
    path = _config(tmp_path, **extra)
    with pytest.raises(ModelError, match=r"config\.json") as ei:
        read_hf_config(path)
    assert needle in str(ei.value)
    with pytest.raises(PlanError, match=r"^--model-config: .*config\.json"):
        make_plan(read_mooncake(MOONCAKE), model_config=path)


def test_config_moe_sizes(tmp_path: Path) -> None:
    """An MXFP4 MoE config (gpt-oss-120b's) sizes as the preset does."""
    path = _config(
        tmp_path,
        num_hidden_layers=36,
        hidden_size=2880,
        intermediate_size=2880,
        num_attention_heads=64,
        head_dim=64,
        vocab_size=201088,
        num_local_experts=128,
        experts_per_token=4,
        quantization_config={"quant_method": "mxfp4"},
    )
    spec, preset = read_hf_config(path), MODELS["gpt-oss-120b"]
    assert spec.weight_dtype == "mxfp4" and spec.expert_params == preset.expert_params
    assert spec.weight_bytes == pytest.approx(preset.weight_bytes, rel=0.01)
    gpu = load_gpu("h100")
    a, b = vllm_kv_memory(spec, gpu), vllm_kv_memory(preset, gpu)
    assert a.activation_bytes == pytest.approx(b.activation_bytes)


def test_mxfp4_for_a_moe_config_is_not_checked_against_the_default_model(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        num_hidden_layers=24,
        hidden_size=2880,
        intermediate_size=2880,
        num_local_experts=32,
        experts_per_token=4,
        vocab_size=201088,
    )
    plan = make_plan(read_mooncake(MOONCAKE), model_config=path, weight_dtype="mxfp4")
    assert plan.model.weight_dtype == "mxfp4"
    with pytest.raises(PlanError, match=r"^--weight-dtype: unknown weight dtype 'fp5'"):
        make_plan(read_mooncake(MOONCAKE), model_config=path + ".missing", weight_dtype="fp5")
