"""``kvcoord`` argument validation through the real entry point (no manager needed).

Every case here is rejected before the simulator starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcoord.cli import main

DATA = Path(__file__).parent / "data"
MOONCAKE = str(DATA / "mooncake_small.jsonl")


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.splitlines()) == 1, err  # one line, no usage block, no traceback


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "--num-blocks", "0"], "expected a positive integer, got 0"),
        (["replay", "--num-blocks", "x"], "expected a positive integer, got 'x'"),
        (["replay", "--num-blocks", "10", "--capacity-tokens", "100"], "not allowed with argument"),
        (["replay", "--block-size", "-16"], "expected a positive integer"),
        (["replay", "--max-running", "0"], "expected a positive integer"),
        (["replay", "--token-budget", "0"], "expected a positive integer"),
        (["replay", "--limit", "0"], "expected a positive integer"),
        (["replay", "--time-scale", "-1"], "finite number >= 0"),
        (["replay", "--time-scale", "nan"], "finite number >= 0"),
        (["replay", "--format", "csv"], "invalid choice: 'csv'"),
        (["replay", "--format", "mooncake"], "--format needs --trace FILE"),
        (["replay", "--layout", "nope"], "unknown layout 'nope'"),
        (["replay", "--trace", "/nonexistent/t.jsonl"], "/nonexistent/t.jsonl: no such file"),
        (["replay", "--plot", "out.jpg"], "must end in .png"),
        (["replay", "--json", "/nonexistent/dir/x.json"], "does not exist"),
        (["replay", "--num-blocks", "1"], "at least 2 blocks"),
        (["replay", "--num-blocks", "20"], "cannot hold the longest request"),
        (["replay", "--bogus"], "unrecognized arguments: --bogus"),
        (["sweep", "--sizes", "10,x"], "expected a positive integer, got 'x'"),
        (["sweep", "--sizes", "100", "--capacities", "1000"], "not allowed with argument"),
        (["sweep", "--jobs", "0"], "expected a positive integer"),
        (["sweep", "--points", "0"], "expected a positive integer"),
        (["sweep", "--sizes", "5000", "--min-blocks", "10"], "do not combine"),
        (["sweep", "--min-blocks", "9000", "--max-blocks", "8000"], "larger than --max-blocks"),
        (["sweep", "--plot", "a.svg"], "must end in .png"),
    ],
)
def test_flag_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    _fails(capsys, argv, message)


def test_malformed_trace_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        json.dumps({"prompt_token_ids": [1, 2]}) + "\n" + '{"prompt_token_ids": [1, "a"]}\n'
    )
    _fails(capsys, ["replay", "--trace", str(p)], f"{p}:2:26: 'prompt_token_ids' must be")
    _fails(
        capsys,
        ["replay", "--trace", MOONCAKE, "--format", "tokens"],
        "mooncake_small.jsonl:1:18: unknown field 'input_length' of the tokens format: the "
        "line is in the mooncake format (--format mooncake)",
    )
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    _fails(
        capsys, ["replay", "--trace", str(empty), "--format", "tokens"], "the trace has no requests"
    )


def test_bad_layout_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "l.json"
    p.write_text(json.dumps({"groups": [{"type": "sliding_window"}]}))
    _fails(capsys, ["replay", "--layout", str(p)], "needs 'sliding_window'")


def test_help_through_console_entry_point() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kvcoord.cli import main; sys.exit(main())",
            "sweep",
            "--help",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--jobs" in out and "--sizes" in out
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kvcoord.cli import main; sys.exit(main())",
            "replay",
            "--layout",
            "x",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "kvcoord replay: error: --layout: unknown layout 'x'" in bad.stderr


def test_bare_flags_mean_replay(capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["--num-blocks", "0"], "kvcoord replay: error: argument --num-blocks")


def test_geometric_sweep_range() -> None:
    from kvcoord._cli_sweep import _geometric

    assert _geometric(100, 1600, 5) == [100, 200, 400, 800, 1600]
    assert _geometric(100, 100, 4) == [100]
    assert _geometric(10, 1000, 1) == [1000]
