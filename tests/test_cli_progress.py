"""Progress when stderr is not a terminal: plain lines, not a silent run."""

from __future__ import annotations

import io

import pytest

from kvcoord import _cli_setup


def _run(total: int, steps: int, monkeypatch: pytest.MonkeyPatch, disable: bool = False) -> str:
    err = io.StringIO()  # not a terminal
    monkeypatch.setattr(_cli_setup.sys, "stderr", err)
    with _cli_setup._progress(total, disable, "sweep") as bar:
        for _ in range(steps):
            bar.update(1)
    return err.getvalue()


def test_lines_at_each_tenth_and_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _run(20, 20, monkeypatch).splitlines()
    assert lines[0].startswith("sweep: 2/20 (10%), ")
    assert len(lines) == 10  # 9 tenths below the total, then the closing line
    assert lines[-1].startswith("sweep: done, 20 in ")


def test_nothing_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(20, 20, monkeypatch, disable=True) == ""


def test_a_slow_run_reports_between_tenths(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(0, 10_000, 40))  # 40 s between updates
    monkeypatch.setattr(_cli_setup.time, "monotonic", lambda: next(clock))
    lines = _run(1000, 3, monkeypatch).splitlines()
    assert [x.split(" (")[0] for x in lines[:3]] == [
        "sweep: 1/1,000",
        "sweep: 2/1,000",
        "sweep: 3/1,000",
    ]
