"""``kvcoord plan --goodput``: the answer's goodput, recomputed by hand from a
full replay, meets the target and every cheaper candidate misses it; a
target just above the answer's goodput flips the answer; the bounds and a
stopped replay's figure are upper bounds; bad flags are one line naming them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcoord.cli import main
from test_plan import LOAD, SPACE

GOODPUT = ["--goodput", "ttft:300ms", "tpot:40ms"]


def _plan(tmp_path: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "plan.json"
    rc = main(["plan", *LOAD, *SPACE, *flags, "--json", str(out)])
    return rc, json.loads(out.read_text())


def _survivors(*flags: str) -> tuple[Any, Any, dict[str, Any]]:
    from kvcoord._cli_parser import _parser
    from kvcoord._cli_plan import _targets
    from kvcoord._cli_setup import _setup
    from kvcoord.planner.prices import load_prices
    from kvcoord.planner.search import prune, space_of

    args = _parser().parse_args(["plan", *LOAD, *SPACE, *flags])
    where, prices = load_prices()
    st = _setup(args)
    pruned = prune(args, st, _targets(args), prices, where, space_of(args, ["h100", "a100"]))
    return args, st, {c.label(): c for c in pruned.survivors}


def _good_by_hand(args: Any, st: Any, cand: Any, ttft: float, tpot: float) -> tuple[int, int]:
    """Good requests and all requests of a full replay, counted one by one."""
    from kvcoord._cli_setup import _plan, _sim_config
    from kvcoord.replay.cluster import simulate_cluster
    from kvcoord.replay.scheduler import simulate

    plan = _plan(args, st, **cand.plan_options())
    cfg = replace(_sim_config(args, plan, cand.eviction), track_best=False)
    if cand.replicas == 1:
        res = simulate(st.workload, cfg)
    else:
        res = simulate_cluster(
            st.workload, cfg, cand.replicas, cand.router, track_global_best=False
        ).total
    good = 0
    for a, f, e, n in zip(res.req_arrival, res.req_first, res.req_finish, res.req_output,
                          strict=True):  # fmt: skip
        ok = f - a <= ttft and (n <= 1 or (e - f) / (n - 1) <= tpot)
        good += bool(ok)
    return good, res.num_requests


def test_goodput_answer_meets_and_every_cheaper_candidate_misses(tmp_path: Path) -> None:
    rc, doc = _plan(tmp_path, *GOODPUT, "--goodput-min", "90%")
    assert rc == 0
    assert doc["targets"]["goodput"] == {"limits_s": {"ttft": 0.3, "tpot": 0.04}, "min_share": 0.9}
    chosen = doc["chosen"]
    args, st, cands = _survivors(*GOODPUT, "--goodput-min", "90%")
    good, n = _good_by_hand(args, st, cands[chosen["label"]], 0.3, 0.04)
    assert good / n >= 0.9
    assert chosen["replay"]["goodput"] == pytest.approx(good / n, abs=1e-12)
    cheaper = [c for c in doc["candidates"] if c["usd_per_hour"] < chosen["usd_per_hour"]]
    assert any(c["stage"] == "replayed" for c in cheaper), "the load is sized so some miss"
    for c in cheaper:
        assert c["stage"] in ("bounds", "replayed", "rate"), c
        if c["stage"] == "replayed":
            assert c["replay"]["status"] != "meets"
    # a stopped replay's goodput is an upper bound of the full replay's
    stopped = [c for c in cheaper if c.get("replay", {}).get("status") == "stopped"]
    assert stopped
    for c in stopped[:2]:
        good, n = _good_by_hand(args, st, cands[c["label"]], 0.3, 0.04)
        assert good / n <= c["replay"]["goodput_at_most"] + 1e-12
        assert good / n <= c["bounds"]["goodput_at_most"] + 1e-12
        assert good / n < 0.9


def test_a_goodput_just_out_of_reach_flips_the_answer(tmp_path: Path) -> None:
    """Negative control: asking for a little more than the answer's goodput
    rules it out (and nothing cheaper comes in); a little less keeps it."""
    rc, doc = _plan(tmp_path, *GOODPUT, "--goodput-min", "90%")
    assert rc == 0
    first = doc["chosen"]
    g = 100 * first["replay"]["goodput"]
    assert g < 99.9, "the load is sized so the answer is not perfect"
    rc, doc = _plan(tmp_path, *GOODPUT, "--goodput-min", f"{g - 0.05:.4f}%")
    assert rc == 0 and doc["chosen"]["label"] == first["label"]
    rc, doc = _plan(tmp_path, *GOODPUT, "--goodput-min", f"{g + 0.05:.4f}%")
    assert rc == 0  # the space has a costlier deployment that does better
    assert doc["chosen"]["label"] != first["label"]
    assert doc["chosen"]["usd_per_hour"] >= first["usd_per_hour"]
    assert 100 * doc["chosen"]["replay"]["goodput"] >= g + 0.05


def test_goodput_as_a_rate_of_good_requests(tmp_path: Path) -> None:
    rc, doc = _plan(tmp_path, *GOODPUT, "--goodput-min", "10req/s")
    assert rc == 0
    r = doc["chosen"]["replay"]
    assert doc["targets"]["goodput"]["min_requests_per_s"] == 10
    assert 10 <= r["goodput"] <= 300 / r["makespan_seconds"] * (1 + 1e-12)
    rc, doc = _plan(tmp_path, *GOODPUT, "--goodput-min", "1000req/s")  # 300 requests, 25 s
    assert rc != 0 and doc["chosen"] is None
    assert all(c["stage"] == "bounds" for c in doc["candidates"])


def test_goodput_parsers() -> None:
    from kvcoord.planner.goodput import Goodput, parse_goodput_limit, parse_goodput_min

    assert parse_goodput_limit("TTFT:2s") == ("ttft", 2.0)
    assert parse_goodput_limit("e2el:1.5min") == ("e2el", 90.0)
    assert parse_goodput_min("95%") == ("share", 0.95)
    assert parse_goodput_min("2.5 req/s") == ("rate", 2.5)
    g = Goodput({"ttft": 1.0, "tpot": 0.1}, "share", 0.5)
    nan = float("nan")
    arrival = np.array([0.0, 0.0, 0.0, 0.0])
    first = np.array([0.5, 2.0, 0.5, nan])
    finish = np.array([1.0, 3.0, 9.0, nan])
    out = np.array([6, 2, 6, 0])
    assert g.good(arrival, first, finish, out).tolist() == [True, False, False, False]
    # at clock 1.5: request 1 missed TTFT, 2 finished over TPOT, 3 waited past TTFT
    bad = g.certainly_bad(arrival, first, finish, out, 1.5)
    assert bad.tolist() == [False, True, True, True]
    assert g.certainly_bad(arrival, first, finish, out, 0.9).tolist()[3] is False


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--goodput", "ttft:2s"], "--goodput needs --goodput-min"),
        (["--goodput-min", "95%"], "--goodput-min needs --goodput"),
        (["--goodput", "ttft=2s", "--goodput-min", "95%"], "expected METRIC:DURATION"),
        (["--goodput", "ttfb:2s", "--goodput-min", "95%"], "(did you mean 'ttft'?)"),
        (["--goodput", "ttft:2", "--goodput-min", "95%"], "did you mean 2s?"),
        (["--goodput", "ttft:2s", "--goodput-min", "95"], "did you mean 95% or 95req/s?"),
        (["--goodput", "ttft:2s", "--goodput-min", "150%"], "at most 100%"),
        (["--goodput", "ttft:2s", "ttft:1s", "--goodput-min", "95%"], "ttft given twice"),
    ],
)
def test_bad_goodput_flags_are_one_line_naming_them(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", *LOAD, "--no-progress", *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kvcoord plan: error: "), err
    assert message in err, err
