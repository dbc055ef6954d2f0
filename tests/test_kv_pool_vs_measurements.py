"""The KV pool the memory model predicts against the pools vLLM logged.

Every row of ``kvcoord/replay/data/vllm_measurements.csv`` with a measured pool
whose model and GPU are presets is predicted and must be within 3% (GiB and
tokens); rows whose notes exclude them say why. ``pytest -s`` prints the table
(``python -m kvcoord.replay.validate --memory`` prints the same).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcoord.replay.hardware import load_gpu
from kvcoord.replay.hf_config import load_model, read_hf_config
from kvcoord.replay.memory import (
    CALIBRATION_ROWS,
    NON_TORCH_BYTES,
    TP_COMM_BYTES,
    vllm_kv_memory,
    vllm_serve_batch,
)
from kvcoord.replay.validate import (
    EXCLUDED_MARK,
    KV_POOL_TOLERANCE,
    PoolRow,
    format_pool_table,
    kv_pool_rows,
    main,
    measurement_rows,
)

GiB = float(1 << 30)
ROWS = kv_pool_rows()
CHECKED = [r for r in ROWS if r.checked]


def test_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    table = format_pool_table(ROWS)
    print("\n" + table)
    for r in ROWS:
        assert r.id in table
    assert f"{len(CHECKED)} rows checked" in table


def test_every_preset_row_is_checked_or_excluded_with_a_reason() -> None:
    # the presets cover these rows; none may silently drop out of the check
    covered = {r.id for r in ROWS if r.status != "not covered"}
    assert {f"llmdplanner-kv-0{i}" for i in range(1, 10)} <= covered
    assert set(CALIBRATION_ROWS) <= {r.id for r in CHECKED}
    assert len([r for r in CHECKED if r.status == "held out"]) >= 7
    for r in ROWS:
        if r.status == "excluded":
            assert len(r.reason) > 40, r  # a reason, not a bare mark
        elif r.status == "not covered":
            assert r.reason and r.predicted_gib is None
        else:
            assert r.predicted_gib is not None and r.predicted_tokens is not None


@pytest.mark.parametrize("row", CHECKED, ids=[r.id for r in CHECKED])
def test_predicted_pool_within_3_percent(row: PoolRow) -> None:
    assert row.error is not None and abs(row.error) <= KV_POOL_TOLERANCE, (
        f"{row.id}: predicted {row.predicted_gib:.2f} GiB, measured {row.measured_gib:.2f}"
    )
    if row.measured_tokens:
        assert row.tokens_error is not None and abs(row.tokens_error) <= KV_POOL_TOLERANCE


def test_the_check_bites() -> None:
    # the same row, measured 5% smaller, fails; excluded only through its notes
    raw = next(r for r in measurement_rows() if r["id"] == "llmdplanner-kv-07")
    off = dict(raw, kv_cache_gib=f"{float(raw['kv_cache_gib']) * 0.95:.2f}")
    (row,) = kv_pool_rows([off])
    assert row.status == "held out" and not row.within_tolerance
    (row,) = kv_pool_rows([dict(off, notes=f"{off['notes']}; {EXCLUDED_MARK} a test")])
    assert row.status == "excluded" and row.reason == "a test"


def test_calibration_rows_reproduce_their_logged_terms() -> None:
    """llmdplanner-kv-01 logs activation 1.89 GiB and non-torch 0.25 GiB for
    Llama-3.1-8B BF16 on one H100 at vllm serve's defaults; -05 logs 2.07 GiB
    of non-torch memory at TP 2."""
    gpu = load_gpu("h100")
    seqs, tokens = vllm_serve_batch(gpu)
    assert (seqs, tokens) == (1024, 8192)
    m = vllm_kv_memory(
        load_model("llama-3.1-8b"),
        gpu,
        gpu_memory_utilization=0.95,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
    )
    assert abs(m.activation_bytes / GiB - 1.89) < 0.005
    assert m.sampler_bytes > m.forward_bytes  # the sampler sets the peak here
    assert m.non_torch_bytes == NON_TORCH_BYTES
    assert abs(m.weight_bytes / GiB - 14.96) < 0.01  # vLLM logs 14.99 (RoPE caches)
    m2 = vllm_kv_memory(load_model("llama-3.1-8b"), gpu, 2, max_num_seqs=seqs)
    assert abs((m2.non_torch_bytes - NON_TORCH_BYTES - TP_COMM_BYTES) / GiB) < 1e-9
    assert abs(m2.non_torch_bytes / GiB - 2.07) < 0.005
    # the activation does not shrink with TP: the logits span the whole vocabulary
    assert abs(m2.activation_bytes - m.activation_bytes) < 0.001 * GiB


def _config(tmp_path: Path, cfg: dict[str, object]) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def _llama_70b(quantization: dict[str, object] | None) -> dict[str, object]:
    cfg: dict[str, object] = {
        "_name_or_path": "Llama-3.3-70B-Instruct",
        "model_type": "llama",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if quantization is not None:
        cfg["quantization_config"] = quantization
    return cfg


#: A compressed-tensors FP8-dynamic config as RedHatAI's checkpoints carry it.
FP8_DYNAMIC = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
        }
    },
}


@pytest.mark.parametrize("row_id", ["llmdplanner-kv-07", "llmdplanner-kv-08"])
def test_rows_predicted_from_the_checkpoints_config(tmp_path: Path, row_id: str) -> None:
    """The FP8 Llama-3.3-70B rows again, from a config.json: its
    quantization_config makes the weights fp8 with no --weight-dtype."""
    raw = next(r for r in measurement_rows() if r["id"] == row_id)
    spec = read_hf_config(_config(tmp_path, _llama_70b(FP8_DYNAMIC)))
    assert spec.weight_dtype == "fp8" and spec.kv_dtype == "bf16"
    gpu = load_gpu(raw["gpu"])
    seqs, tokens = vllm_serve_batch(gpu)
    m = vllm_kv_memory(
        spec,
        gpu,
        int(raw["tp"]),
        gpu_memory_utilization=float(raw["gpu_memory_utilization"]),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
    )
    assert abs(m.kv_bytes / GiB / float(raw["kv_cache_gib"]) - 1) <= KV_POOL_TOLERANCE
    # the same config without quantization is planned with twice the layer weights
    plain = read_hf_config(_config(tmp_path, _llama_70b(None)))
    assert plain.weight_dtype == "bf16"
    assert plain.weight_bytes > 1.9 * spec.weight_bytes


def test_validate_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--memory"]) == 0
    out = capsys.readouterr().out
    assert "llmdplanner-kv-01" in out and "calibration" in out and "held out" in out
    assert "TTFT" not in out  # --memory alone: no latency check
    with pytest.raises(SystemExit) as ei:
        main(["--memory", "--max-requests", "0"])
    assert ei.value.code == 2


def test_docs_table_is_the_validated_one() -> None:
    """docs/replay.md's predicted-vs-measured table shows what the model predicts."""
    docs = (Path(__file__).parents[1] / "docs" / "replay.md").read_text(encoding="utf-8")
    by_id = {r.id: r for r in ROWS}
    shown = 0
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("llmdplanner-"):
            continue
        row = by_id[cells[0].split()[0]]
        assert row.checked and ("calibration" in cells[0]) == (row.status == "calibration")
        assert cells[2] == f"{row.measured_gib:.2f} GiB"
        assert cells[3] == f"{row.predicted_gib:.2f} GiB", cells
        assert row.error is not None and cells[4] == f"{100 * row.error:+.2f}%"
        shown += 1
    assert shown == len(CHECKED)
