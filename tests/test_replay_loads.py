"""Synthetic loads (``kvcoord.replay.loads``) and the clients' concurrency cap
(``SimConfig.max_concurrency``): closed loops driven by completions inside the
simulated scheduler, Poisson arrivals, the length grammar, the CLI flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcoord.cli import main
from kvcoord.errors import InvalidArgumentError
from kvcoord.replay.layouts import PRESETS
from kvcoord.replay.loads import LengthDist, parse_lengths, random_load
from kvcoord.replay.report import latency_metrics
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.sim import SimResult
from kvcoord.replay.workloads import MAX_REQUEST_TOKENS, Workload, WorkloadRequest

DATA = Path(__file__).parent / "data"


def _cfg(**kw: Any) -> SimConfig:
    kw.setdefault("num_blocks", 4096)
    return SimConfig(PRESETS["full"], track_best=False, **kw)


def _arrays(res: SimResult) -> tuple[np.ndarray, ...]:
    return tuple(
        np.asarray(getattr(res, f"req_{name}"), dtype=np.float64)
        for name in ("offered", "arrival", "admit", "first", "finish", "output")
    )


def _max_in_flight(arrival: np.ndarray, finish: np.ndarray) -> int:
    """Most requests sent and not finished just after any request is sent."""
    return max(int(((arrival <= a) & (finish > a)).sum()) for a in arrival)


# --------------------------------------------------------------------------- lengths


@pytest.mark.parametrize(
    ("text", "kind", "a", "b"),
    [
        ("1024", "fixed", 1024, 0),
        (" 7 ", "fixed", 7, 0),
        ("uniform:512:1536", "uniform", 512, 1536),
        ("UNIFORM:3:3", "uniform", 3, 3),
        ("normal:1024:128", "normal", 1024, 128),
        ("normal:10.5:0", "normal", 10.5, 0),
    ],
)
def test_length_specs(text: str, kind: str, a: float, b: float) -> None:
    d = parse_lengths(text)
    assert (d.kind, d.a, d.b) == (kind, a, b)
    assert parse_lengths(d.describe()) == d  # the spec round-trips


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a token count (1024), uniform:LO:HI"),
        ("x", "got 'x'"),
        ("0", "in [1, 16,777,216]"),
        ("-5", "in [1, 16,777,216]"),
        ("1.5", "got '1.5'"),
        ("16777217", "in [1, 16,777,216]"),
        ("uniform:5", "uniform takes two numbers"),
        ("uniform:1:2:3", "uniform takes two numbers"),
        ("uniform:9:3", "LO <= HI"),
        ("uniform:0:3", "LO <= HI, both in [1,"),
        ("uniform:1.5:3", "got 'uniform:1.5:3'"),
        ("normal:x:1", "got 'normal:x:1'"),
        ("normal:100:-1", "standard deviation must be >= 0"),
        ("normal:0:10", "the mean must be in [1,"),
        ("normal:nan:1", "got 'normal:nan:1'"),
        ("normal:100:inf", "got 'normal:100:inf'"),
        ("unifrom:1:2", "unknown length distribution 'unifrom' (did you mean 'uniform'?)"),
        ("zipf:1:2", "unknown length distribution 'zipf'"),
        (":1:2", "expected a token count"),
    ],
)
def test_bad_length_specs(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as ei:
        parse_lengths(text)
    assert message in str(ei.value)
    assert isinstance(ei.value, ValueError)


@settings(max_examples=60, deadline=None)
@given(
    lo=st.integers(1, 5000),
    width=st.integers(0, 5000),
    mean=st.floats(1, 5000),
    std=st.floats(0, 3000),
    seed=st.integers(0, 2**32),
)
def test_samples_stay_in_range(lo: int, width: int, mean: float, std: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    u = LengthDist("uniform", lo, lo + width).sample(rng, 200)
    assert u.min() >= lo and u.max() <= lo + width
    nd = LengthDist("normal", mean, std)
    x = nd.sample(rng, 200)
    assert x.min() >= 1 and x.max() <= nd.high
    assert LengthDist("fixed", lo).sample(rng, 5).tolist() == [lo] * 5


# --------------------------------------------------------------------------- the load


def test_random_prompts_share_nothing_unless_a_prefix_is_asked() -> None:
    wl = random_load(
        num_requests=50, input_len=parse_lengths("64"), output_len=LengthDist("fixed", 2)
    )
    res = simulate(wl, _cfg())
    assert res.hit_tokens == 0
    prompts = [wl.requests[i].prompt_tokens() for i in range(3)]
    assert all(len(p) == 64 for p in prompts) and prompts[0][:16] != prompts[1][:16]
    wl = random_load(
        num_requests=50, input_len=parse_lengths("64"), output_len=LengthDist("fixed", 2),
        prefix_len=100, request_rate=1.0,
    )  # fmt: skip
    a, b = (wl.requests[i].prompt_tokens() for i in (0, 1))
    assert len(a) == 164 and a[:100] == b[:100] and a[100:116] != b[100:116]
    res = simulate(wl, _cfg())
    assert res.hit_tokens == 49 * 96  # every later request hits the six full prefix blocks


def test_same_seed_same_load_and_poisson_rate() -> None:
    kw: dict[str, Any] = {
        "num_requests": 2000,
        "input_len": parse_lengths("uniform:10:20"),
        "output_len": parse_lengths("normal:8:3"),
        "request_rate": 4.0,
    }
    a, b, c = random_load(**kw), random_load(**kw), random_load(**kw, seed=1)
    key = [(r.arrival_s, r.prompt_len, r.output_len) for r in a.requests]
    assert key == [(r.arrival_s, r.prompt_len, r.output_len) for r in b.requests]
    assert key != [(r.arrival_s, r.prompt_len, r.output_len) for r in c.requests]
    assert a.requests[0].prompt_tokens() == b.requests[0].prompt_tokens()
    t = np.array([r.arrival_s for r in a.requests])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert 1999 / t[-1] == pytest.approx(4.0, rel=0.1)
    lens = [r.prompt_len for r in a.requests]
    assert min(lens) >= 10 and max(lens) <= 20
    assert all(r.output_len >= 1 for r in a.requests)
    assert all(r.arrival_s == 0 for r in random_load(num_requests=5).requests)  # rate inf


def test_load_refuses_requests_beyond_the_limit() -> None:
    with pytest.raises(InvalidArgumentError, match="at most 16,777,216 fit one request"):
        random_load(
            num_requests=1,
            input_len=parse_lengths(str(MAX_REQUEST_TOKENS)),
            output_len=parse_lengths("1"),
        )
    for bad in (
        {"num_requests": 0},
        {"num_requests": True},
        {"prefix_len": -1},
        {"request_rate": 0.0},
        {"request_rate": float("nan")},
        {"request_rate": "5"},
        {"seed": -1},
        {"input_len": 0},
        {"input_len": 2.5},
        {"output_len": "uniform:3:1"},
        {"output_len": LengthDist("fixed", 0, minimum=0)},
    ):
        with pytest.raises(InvalidArgumentError):
            random_load(**bad)


def test_lengths_as_counts_or_specs() -> None:
    a = random_load(num_requests=20, input_len=300, output_len="uniform:2:9", seed=3)
    b = random_load(
        num_requests=20, input_len=LengthDist("fixed", 300),
        output_len=LengthDist("uniform", 2, 9), seed=3,
    )  # fmt: skip
    assert [(r.prompt_len, r.output_len) for r in a.requests] == [
        (r.prompt_len, r.output_len) for r in b.requests
    ]


@pytest.mark.parametrize("cap", [0, -1, True, 2.0, "4"])
def test_bad_concurrency_cap_is_refused(cap: Any) -> None:
    # 0 would hold every request back for ever
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        _cfg(max_concurrency=cap)


# --------------------------------------------------------------------------- closed loop


def test_closed_loop_request_n_plus_k_starts_when_the_kth_finishes() -> None:
    wl = random_load(
        num_requests=40, input_len=parse_lengths("uniform:20:200"),
        output_len=parse_lengths("uniform:1:30"),
    )  # fmt: skip
    n = 6
    res = simulate(wl, _cfg(max_concurrency=n))
    offered, arrival, _admit, _first, finish, out = _arrays(res)
    assert res.num_finished == 40 and res.leaked_blocks == 0
    assert np.all(offered == 0) and np.all(arrival[:n] == 0)
    # each finish frees a slot and the next request is sent at that moment
    assert sorted(arrival[n:]) == sorted(finish)[: 40 - n]
    assert _max_in_flight(arrival, finish) == n
    assert out.tolist() == [r.output_len for r in wl.requests]  # exactly, ignore_eos


@settings(max_examples=40, deadline=None)
@given(
    n_req=st.integers(1, 25),
    cap=st.integers(1, 8),
    prompts=st.lists(st.integers(1, 300), min_size=25, max_size=25),
    outs=st.lists(st.integers(1, 40), min_size=25, max_size=25),
    gaps=st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.1]), min_size=25, max_size=25),
    budget=st.sampled_from([32, 256, 8192]),
)
def test_cap_holds_and_every_request_gets_its_output(
    n_req: int, cap: int, prompts: list[int], outs: list[int], gaps: list[float], budget: int
) -> None:
    times = np.cumsum(gaps[:n_req]).tolist()
    wl = Workload(
        "w",
        [
            WorkloadRequest(f"r{i}", times[i], prompts[i], outs[i],
                            lambda i=i: range(i * 1000, i * 1000 + prompts[i]))
            for i in range(n_req)
        ],
    )  # fmt: skip
    res = simulate(wl, _cfg(max_concurrency=cap, token_budget=budget, num_blocks=2048))
    offered, arrival, _admit, first, finish, out = _arrays(res)
    assert res.num_finished == n_req and res.leaked_blocks == 0
    assert _max_in_flight(arrival, finish) <= cap
    assert out.tolist() == outs[:n_req] and res.output_tokens == sum(outs[:n_req])
    assert offered.tolist() == [r.arrival_s for r in wl.requests]
    # sent at its own time, or held back until a request finished
    held = arrival > offered
    assert np.all(arrival >= offered)
    assert all(a in set(finish.tolist()) for a in arrival[held])
    assert np.all(first >= arrival) and np.all(finish >= first)


def test_uncapped_replay_sends_every_request_at_its_time() -> None:
    wl = random_load(num_requests=30, input_len=parse_lengths("100"), request_rate=50.0)
    res = simulate(wl, _cfg())
    offered, arrival, *_ = _arrays(res)
    assert arrival.tolist() == offered.tolist() == [r.arrival_s for r in wl.requests]


def test_closed_loop_occupancy_samples_stay_few() -> None:
    wl = random_load(
        num_requests=30, input_len=parse_lengths("16"), output_len=parse_lengths("200")
    )
    res = simulate(wl, _cfg(max_concurrency=2))
    assert res.steps > 2000
    assert 150 <= len(res.occupancy_samples) < 400
    times = [s[0] for s in res.occupancy_samples]
    assert times == sorted(times) and times[-1] > 0.5 * res.sim_seconds


# --------------------------------------------------------------------------- metrics


def test_tpot_is_vllm_bench_formula_by_hand() -> None:
    res = SimResult(num_requests=3, num_finished=3, output_tokens=12)
    res.req_arrival.extend([0.0, 1.0, 2.0])
    res.req_admit.extend([0.0, 1.0, 2.0])
    res.req_first.extend([0.1, 1.3, 2.2])
    res.req_finish.extend([1.0, 1.3, 3.2])  # 9 gaps in 0.9 s; 1 token; 1 gap in 1.0 s
    res.req_output.extend([10, 1, 2])
    m = latency_metrics(res)
    assert m["tpot_mean_ms"] == pytest.approx((100 + 1000) / 2)
    assert m["tpot_median_ms"] == pytest.approx(550)
    assert m["tpot_p99_ms"] == pytest.approx(100 + 0.99 * 900)
    assert m["itl_mean_ms"] == pytest.approx(1900 / 10)  # every gap of every request
    assert m["ttft_mean_ms"] == pytest.approx(200)
    assert m["ttft_p90_ms"] == pytest.approx(m["ttft_p90_s"] * 1e3)
    assert m["ttft_std_ms"] == pytest.approx(np.std([100, 300, 200]))
    assert m["e2e_median_ms"] == pytest.approx(1000)
    assert m["requests_per_s"] == pytest.approx(3 / 3.2)
    assert m["output_tokens_per_s"] == pytest.approx(12 / 3.2)


def test_one_request_alone_decodes_at_the_step_time() -> None:
    wl = random_load(num_requests=1, input_len=parse_lengths("64"), output_len=parse_lengths("50"))
    cfg = _cfg(max_concurrency=1)
    m = latency_metrics(simulate(wl, cfg))
    step = cfg.step_base_s + cfg.step_token_s  # one decode token per step
    assert m["tpot_mean_ms"] == pytest.approx(step * 1e3)
    assert m["ttft_mean_ms"] == pytest.approx((cfg.step_base_s + 64 * cfg.step_token_s) * 1e3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_percentiles_are_those_of_the_repeated_values(seed: int) -> None:
    from kvcoord.replay.report import _weighted_percentiles

    rng = np.random.default_rng(seed)
    values, weights = rng.random(40), rng.integers(0, 5, 40)
    want = [np.percentile(np.repeat(values, weights), q, method="lower") for q in (50, 90, 99)]
    assert _weighted_percentiles(values, weights, (50, 90, 99)) == pytest.approx(want)
    assert _weighted_percentiles(values, np.zeros(40, dtype=np.int64), (50,)) == [None]


def test_itl_percentiles_by_hand() -> None:
    """A (64-token prompt, 6 tokens out) alone, then B's 64-token prefill joins
    A's third step: A's gaps are one decode step, the shared step (65 tokens),
    a two-request step, two one-request steps; B's one gap is a two-request step."""
    cfg = _cfg()
    b, t = cfg.step_base_s, cfg.step_token_s
    a_toks, b_toks = list(range(64)), list(range(1000, 1064))
    b_arrives = (b + 64 * t) + (b + t) - 1e-6  # during A's first decode step
    wl = Workload("two", [
        WorkloadRequest("a", 0.0, 64, 6, lambda: a_toks),
        WorkloadRequest("b", b_arrives, 64, 2, lambda: b_toks),
    ])  # fmt: skip
    m = latency_metrics(simulate(wl, cfg))
    gaps = sorted([b + t, b + 65 * t, b + 2 * t, b + t, b + t, b + 2 * t])
    assert m["itl_mean_ms"] == pytest.approx(sum(gaps) / 6 * 1e3)
    for q in (50, 90, 99):
        want = gaps[int(np.floor(q / 100 * 5))] * 1e3
        assert m[f"itl_p{q}_ms"] == pytest.approx(want)
    # negative control: without B, every gap of A is one decode step
    alone = latency_metrics(simulate(Workload("one", wl.requests[:1]), cfg))
    assert alone["itl_p99_ms"] == pytest.approx((b + t) * 1e3) != m["itl_p90_ms"]


# --------------------------------------------------------------------------- the CLI


def test_cli_closed_loop_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    argv = [
        "replay", "--concurrency", "4", "--input-len", "uniform:32:96", "--output-len", "12",
        "--num-requests", "24", "--num-blocks", "4096", "--no-progress", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "closed loop, 4 clients" in text and "at most 4 in flight" in text
    s = json.loads(out.read_text())
    assert s["max_concurrency"] == 4 and s["num_finished"] == 24
    assert s["output_tokens"] == 24 * 12
    assert s["workload"].startswith("random(24 requests, input uniform:32:96, output 12")
    for k in ("ttft", "tpot", "e2e"):
        for stat in ("mean", "median", "std", "p90", "p99"):
            assert isinstance(s[f"{k}_{stat}_ms"], float)
        assert s[f"{k}_median_ms"] == pytest.approx(s[f"{k}_p50_s"] * 1e3)
    # inter-token latency: prefills of the clients' next requests stretch some gaps
    assert 0 < s["itl_p50_ms"] <= s["itl_p90_ms"] <= s["itl_p99_ms"]
    assert s["itl_p99_ms"] > s["itl_p50_ms"]
    assert s["requests_per_s"] == pytest.approx(24 / s["makespan_seconds"])
    assert s["overload"]["regime"] == "closed loop" and not s["overload"]["overloaded"]


def test_cli_concurrency_caps_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    argv = ["--trace", str(DATA / "mooncake_small.jsonl"), "--concurrency", "2",
            "--no-progress", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(out.read_text())["max_concurrency"] == 2


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--input-len", "uniform:9:3"], ("argument --input-len:", "LO <= HI")),
        (["--output-len", "normal:x:1"], ("argument --output-len:", "normal:MEAN:STD")),
        (["--input-len", "gauss:1:2"], ("argument --input-len:", "unknown length distribution")),
        (["--output-len", "0"], ("argument --output-len:", "in [1, 16,777,216]")),
        (["--request-rate", "0"], ("argument --request-rate:", "rate > 0")),
        (["--request-rate", "nan"], ("argument --request-rate:", "rate > 0")),
        (["--request-rate", "fast"], ("argument --request-rate:", "requests per second")),
        (["--prefix-len", "-1"], ("argument --prefix-len:", "token count in [0,")),
        (["--concurrency", "0"], ("argument --concurrency/--max-concurrency:", "positive")),
        (["--num-requests", "0"], ("argument --num-requests:", "positive integer")),
        (["--seed", "-1"], ("argument --seed:", "seed in [0, 2**63)")),
        (["--seed", "3"], ("--seed seeds a synthetic load",)),
        (["--input-len", "5", "--trace", "x.jsonl"], ("--input-len makes a synthetic load",
                                                      "--trace is for a trace")),
        (["--num-requests", "5", "--limit", "2"], ("use --num-requests",)),
        (["--concurrency", "4", "--instances", "2"], ("--concurrency caps the clients",
                                                      "--instances 2")),
        (["--input-len", "16000000", "--output-len", "1000000"],
         ("--input-len, --output-len:", "at most 16,777,216 fit one request")),
    ],
)  # fmt: skip
def test_cli_load_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: tuple[str, ...]
) -> None:
    _fails(capsys, ["replay", *argv, "--no-progress"], *needles)


def test_sweep_refuses_concurrency_with_instances(capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["sweep", "--concurrency", "2", "--instances", "1,2"], "--instances 2")


def test_cli_subprocess_bad_distribution_exits_2() -> None:
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "kvcoord", "replay", "--input-len", "uniform:1:x"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 2
    (line,) = res.stderr.splitlines()
    assert line.startswith("kvcoord replay: error: argument --input-len:"), line
    assert "uniform:LO:HI" in line
