"""Every failure of ``kvcoord replay`` / ``kvcoord sweep`` is one line on stderr and an
exit status, never a traceback, a hang or a partial output file (issue 11, class 9).

The cases run the installed entry point in a subprocess: the ``kvcoord`` console
script beside this interpreter, or ``python -m kvcoord`` where there is none.
Exit statuses: 2 for bad flags, layouts and traces (refused before the replay
starts), 1 for failures while running, 130 for Ctrl-C.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_small.jsonl"
_SCRIPT = Path(sys.executable).with_name("kvcoord")
KVCOORD = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "kvcoord"]
posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX pipes and signals")
_HAS_PROC_CHILDREN = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").is_file()
linux_only = pytest.mark.skipif(not _HAS_PROC_CHILDREN, reason="needs Linux /proc children lists")


def _run(argv: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVCOORD, *argv], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def _one_error(res: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The run failed with ``code`` and exactly one stderr line holding every needle."""
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr[-3000:]
    line = lines[0]
    assert line.startswith(("kvcoord replay: ", "kvcoord sweep: ")), line
    for needle in needles:
        assert needle in line, line
    return line


def _write(path: Path, records: list[object]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records),
        encoding="utf-8",
    )
    return path


def _long_trace_lines(n: int = 64, output_length: int = 100_000) -> str:
    """A trace that replays for tens of seconds with ``--max-running 1`` (one decode step
    per output token), from a few lines."""
    return "".join(
        json.dumps(
            {"timestamp": 0, "input_length": 16, "output_length": output_length, "hash_ids": [i]}
        )
        + "\n"
        for i in range(n)
    )


LONG_RUN = ["--num-blocks", "20000", "--max-running", "1", "--no-progress"]


@pytest.fixture
def long_trace(tmp_path: Path) -> Path:
    p = tmp_path / "long.jsonl"
    p.write_text(_long_trace_lines())
    return p


# --------------------------------------------------------------------------- trace contents


def test_deeply_nested_json_line(tmp_path: Path) -> None:
    # was: RecursionError traceback
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt_token_ids": [1]}\n{"prompt_token_ids": ' + "[" * 100_000 + "}\n")
    _one_error(_run(["replay", "--trace", str(p)]), 2, f"{p}:2:", "nested too deeply")


def test_huge_number_json_line(tmp_path: Path) -> None:
    # was: ValueError traceback ("Exceeds the limit (4300 digits)")
    p = _write(tmp_path / "t.jsonl", ['{"prompt_token_ids": [' + "9" * 5000 + "]}"])
    _one_error(_run(["replay", "--trace", str(p)]), 2, f"{p}:1:", "number is out of range")
    # a big but parseable integer where a time goes (float() of it overflows)
    q = _write(tmp_path / "q.jsonl", [f'{{"prompt_token_ids": [1], "timestamp": {10**400}}}'])
    _one_error(_run(["replay", "--trace", str(q)]), 2, f"{q}:1:", "'timestamp' must be a finite")


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"prompt_token_ids": [1, 2**32]}, "'prompt_token_ids' must be"),
        # was: OverflowError traceback in the middle of the run
        ({"prompt_token_ids": [1, 2], "output_token_ids": [2**64]}, "'output_token_ids' must be"),
        ({"prompt_token_ids": [1], "output_token_ids": [5, -1]}, "'output_token_ids' must be"),
        # was: IndexError traceback in the middle of the run
        ({"prompt_token_ids": [1], "output_token_ids": []}, "'output_token_ids' must be"),
        ({"prompt_token_ids": [1], "output_length": 2**40}, "'output_length' must be <="),
        (
            {"timestamp": 0, "input_length": 10, "output_length": 2**62, "hash_ids": [1]},
            "'output_length' must be <=",
        ),
        (
            {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [2**64]},
            "'hash_ids' must be",
        ),
        (
            {"timestamp": 0, "input_length": 512, "output_length": 2**24, "hash_ids": [1]},
            "more than the 16,777,216 a request may have",
        ),
    ],
)
def test_out_of_range_trace_values_refused_when_loading(
    tmp_path: Path, record: dict[str, object], problem: str
) -> None:
    p = _write(tmp_path / "t.jsonl", [record])
    res = _run(["replay", "--trace", str(p)])
    _one_error(res, 2, "--trace: ", f"{p}:1:", problem)
    assert res.stdout == ""  # refused before the replay, not in it


@pytest.mark.parametrize(
    "line",
    [
        '{"prompt_token_ids": [1], "arrival_time": 1e400}',
        '{"prompt_token_ids": [1], "arrival_time": Infinity}',
        '{"prompt_token_ids": [1], "timestamp": NaN}',
        '{"timestamp": 1e400, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
    ],
)
def test_non_finite_timestamps_neither_hang_nor_reach_the_run(tmp_path: Path, line: str) -> None:
    # was: `--time-scale 0` looped forever on 1e400 (inf * 0 is NaN)
    p = _write(tmp_path / "t.jsonl", ['{"prompt_token_ids": [2]}', line])
    for scale in ("0", "1"):
        res = _run(["replay", "--trace", str(p), "--time-scale", scale], timeout=60)
        _one_error(res, 2, f"{p}:2:")


def test_json_output_is_always_valid_json(tmp_path: Path) -> None:
    # was: a 1e400 timestamp wrote "simulated_seconds": Infinity; the largest finite
    # times stay finite, and a time scale that would overflow them is refused
    p = _write(
        tmp_path / "t.jsonl",
        [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4], "timestamp": 1.7e308}],
    )
    out = tmp_path / "r.json"
    res = _run(["replay", "--trace", str(p), "--num-blocks", "64", "--json", str(out)])
    assert res.returncode == 0, res.stderr

    def no_constants(name: str) -> object:
        raise AssertionError(f"--json wrote {name}")

    doc = json.loads(out.read_text(), parse_constant=no_constants)
    assert doc["simulated_seconds"] >= 1e305
    res = _run(["replay", "--trace", str(p), "--time-scale", "1e10", "--json", str(out)])
    _one_error(res, 2, "--time-scale 1e+10", "beyond any finite time")


# --------------------------------------------------------------------------- flags and layouts


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["replay", "--num-blocks", "99999999999999999999"], "argument --num-blocks: expected at"),
        (["replay", "--num-blocks", "9" * 5000], "argument --num-blocks: expected a positive"),
        (["replay", "--block-size", str(2**32)], "argument --block-size: expected at most"),
        (["replay", "--capacity-tokens", str(10**14)], "more than a h100 holds"),
        (["replay", "--token-budget", str(2**63)], "argument --token-budget"),
        (["replay", "--max-running", str(2**40)], "argument --max-running"),
        (["replay", "--time-scale", "1e400"], "argument --time-scale"),
        (["sweep", "--sizes", f"100,{2**40}"], "argument --sizes: expected at most"),
        (["sweep", "--capacities", f"{2**60}"], "more than a h100 holds"),
        (["sweep", "--max-blocks", f"{2**40}"], "argument --max-blocks"),
        (["sweep", "--points", "1000000"], "argument --points: expected at most 1,000"),
        (["sweep", "--jobs", "100000"], "argument --jobs: expected at most 256"),
        (["replay", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_out_of_range_sizes(argv: list[str], needle: str) -> None:
    _one_error(_run(argv), 2, needle)


def test_pool_the_gpu_holds_but_the_cli_does_not_build(tmp_path: Path) -> None:
    # a model so small that 2**24 blocks (16 tokens of 1 layer, 32 bytes a token) fit
    cfg = tmp_path / "tiny.json"
    cfg.write_text(
        json.dumps(
            {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 8,
             "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 100}
        )
    )  # fmt: skip
    res = _run(["replay", "--model-config", str(cfg), "--capacity-tokens", str(2**28)])
    _one_error(
        res, 2, "--capacity-tokens: a pool of 16,777,217 blocks is larger than the 16,777,216"
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"groups": ' + "[" * 100_000 + "]" * 100_000 + "}", "invalid JSON"),
        ('{"groups": [{"type": "full_attention", "block_size": ' + "9" * 5000 + "}]}", "JSON"),
        ('{"groups": [{"type": "full_attention", "block_size": 1099511627776}]}', "--layout"),
        (
            '{"groups": [{"type": "full_attention", "block_size": 16}, {"type": '
            '"sliding_window", "block_size": 16, "sliding_window": 1' + "0" * 30 + "}]}",
            "--layout",
        ),
    ],
)
def test_layout_file_out_of_range(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "l.json"
    p.write_text(text)
    _one_error(_run(["replay", "--layout", str(p)]), 2, needle)


# --------------------------------------------------------------------------- output paths


def _unwritable_cases(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    yield "--json", str(tmp_path / "missing" / "r.json"), "does not exist"
    yield "--json", str(a_file / "r.json"), "is not a directory"
    yield "--json", str(tmp_path), "is a directory"
    yield "--plot", str(tmp_path / "missing" / "r.png"), "does not exist"
    yield "--json", str(tmp_path / ("n" * 300 + ".json")), "File name too long"
    if Path("/proc/self").is_dir():  # a file system nobody can create files in
        yield "--json", "/proc/kvcoord-test.json", "cannot write in"
        yield "--plot", "/proc/kvcoord-test.png", "cannot write in"
    if getattr(os, "geteuid", lambda: 0)() != 0:  # permission bits do not bind root
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        yield "--json", str(ro / "r.json"), "cannot write in"


def test_unwritable_outputs_refused_before_a_long_run(tmp_path: Path, long_trace: Path) -> None:
    for i, (flag, path, needle) in enumerate(_unwritable_cases(tmp_path)):
        sweep = ["sweep", "--sizes", "20000,30000"]
        for cmd in (["replay"], sweep) if i < 2 else (["replay"],):  # one check serves both
            res = _run([*cmd, "--trace", str(long_trace), *LONG_RUN[2:], flag, path])
            _one_error(res, 2, f"{flag} {path!r}", needle)
            assert res.stdout == ""


# --------------------------------------------------------------------------- sweep workers


def test_sweep_worker_failure_is_one_line(tmp_path: Path) -> None:
    # one 8,193-token request: 800 blocks pass the planner's estimate, but the first
    # 8192-token chunk needs blocks in both groups at once, which only the replay finds out
    p = _write(
        tmp_path / "t.jsonl",
        [{"timestamp": 0, "input_length": 8192, "output_length": 1, "hash_ids": list(range(16))}],
    )
    argv = ["sweep", "--trace", str(p), "--layout", "sliding-window", "--sizes", "800,1100"]
    _one_error(_run([*argv, "--jobs", "2"]), 1, "pool of 800 blocks: request mc-0", "larger pool")
    _one_error(_run([*argv, "--jobs", "1"]), 1, "request mc-0", "larger pool")


# --------------------------------------------------------------------------- Ctrl-C and pipes


def _start_on_fifo(tmp_path: Path, argv: list[str]) -> tuple[subprocess.Popen[str], Path]:
    """Start ``kvcoord argv --trace FIFO`` and feed it the long trace; returns once the
    command has opened the trace (so it is inside ``main``) and read all of it."""
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [*KVCOORD, *argv, "--trace", str(fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the whole group
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            assert e.errno == errno.ENXIO, e
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"kvcoord never opened the trace: {proc.communicate()}") from e
            time.sleep(0.01)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "w") as f:
        f.write(_long_trace_lines())
    return proc, fifo


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _workers(pid: int, n: int) -> list[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [
            c for c in _children(pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()
        ]
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise AssertionError("the sweep workers never started")


@posix_only
@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_ctrl_c_exits_130_with_one_line_and_no_files(tmp_path: Path, command: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = [command, *LONG_RUN, "--json", str(out / "r.json"), "--plot", str(out / "r.png")]
    if command == "sweep":
        argv = [
            "sweep",
            *LONG_RUN[2:],
            "--sizes",
            "20000,30000",
            "--jobs",
            "2",
            "--json",
            str(out / "r.json"),
        ]
    proc, _ = _start_on_fifo(tmp_path, argv)
    workers = _workers(proc.pid, 2) if command == "sweep" and _HAS_PROC_CHILDREN else []
    time.sleep(0.5)  # well inside the replay (it runs for tens of seconds)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [f"kvcoord {command}: interrupted"]
    assert stdout == ""
    assert list(out.iterdir()) == []  # no partial outputs, no temporary files
    assert all(_gone(w) for w in workers)


@linux_only
def test_sweep_worker_killed_is_one_line(tmp_path: Path) -> None:
    # a worker killed from outside (the OOM killer, _say): was a hang or a traceback
    argv = ["sweep", *LONG_RUN[2:], "--sizes", "20000,30000", "--jobs", "2"]
    proc, _ = _start_on_fifo(tmp_path, argv)
    workers = _workers(proc.pid, 2)
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert stderr.splitlines() == [
        "kvcoord sweep: error: a sweep worker process died (killed, or out of memory?)"
    ]
    assert all(_gone(w) for w in workers)


# --------------------------------------------------------------------------- gzip traces


@pytest.mark.parametrize("name", ["t.jsonl.gz", "t.jsonl"])  # detected by content, not name
def test_gzip_trace_replays_like_the_plain_one(tmp_path: Path, name: str) -> None:
    gz = tmp_path / name
    gz.write_bytes(gzip.compress(MOONCAKE.read_bytes()))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for trace, out in ((MOONCAKE, a), (gz, b)):
        res = _run(["replay", "--trace", str(trace), "--num-blocks", "600", "--json", str(out)])
        assert res.returncode == 0, res.stderr
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    for key in ("num_requests", "prompt_tokens", "prefix_hit_tokens", "evictions", "steps"):
        assert x[key] == y[key]


def test_broken_gzip_trace_is_one_line(tmp_path: Path) -> None:
    whole = gzip.compress(MOONCAKE.read_bytes())
    cut = tmp_path / "cut.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    _one_error(_run(["replay", "--trace", str(cut)]), 2, f"{cut}:", "corrupt gzip data")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    _one_error(_run(["replay", "--trace", str(bad)]), 2, f"{bad}:", "corrupt gzip data")
    binary = tmp_path / "bin.gz"
    binary.write_bytes(gzip.compress(b"\xff\xfe\x00\x01" * 100))
    _one_error(_run(["replay", "--trace", str(binary)]), 2, f"{binary}:1:", "not UTF-8")


# --------------------------------------------------------------------------- in-process


def test_unexpected_failure_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvcoord.replay.scheduler as scheduler
    from kvcoord.cli import main

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(scheduler, "simulate", boom)
    monkeypatch.delenv("KVCOORD_TRACEBACK", raising=False)
    assert main(["replay", "--limit", "3", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "kvcoord replay: error: unexpected RuntimeError: first line second line "
        "(KVCOORD_TRACEBACK=1 shows where)"
    ]
    monkeypatch.setenv("KVCOORD_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="first line"):
        main(["replay", "--limit", "3", "--no-progress"])


def test_memory_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvcoord.replay.scheduler as scheduler
    from kvcoord.cli import main

    def oom(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(scheduler, "simulate", oom)
    monkeypatch.delenv("KVCOORD_TRACEBACK", raising=False)
    assert main(["sweep", "--limit", "3", "--sizes", "4000", "--no-progress"]) == 1
    assert capsys.readouterr().err.splitlines() == ["kvcoord sweep: error: out of memory"]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_outputs_are_written_whole_or_not_at_all(
    tmp_path: Path, failure: type[BaseException]
) -> None:
    from kvcoord._cli_base import _write_output

    target = tmp_path / "r.json"

    def partial(name: str) -> None:
        Path(name).write_text('{"half": ')
        raise failure()

    with pytest.raises(failure):
        _write_output(str(target), partial)
    assert list(tmp_path.iterdir()) == []
    target.write_text("old")
    with pytest.raises(failure):
        _write_output(str(target), partial)
    assert list(tmp_path.iterdir()) == [target]
    assert target.read_text() == "old"
    _write_output(str(target), lambda name: Path(name).write_text("new"))
    assert target.read_text() == "new"
    assert list(tmp_path.iterdir()) == [target]
    longest = tmp_path / ("x" * 250 + ".json")  # the temporary name must fit as well
    _write_output(str(longest), lambda name: Path(name).write_text("{}"))
    assert sorted(tmp_path.iterdir()) == sorted([target, longest])


def test_entry_points_agree() -> None:
    """The console script (when installed) and ``python -m kvcoord`` are the same command."""
    res = subprocess.run(
        [sys.executable, "-m", "kvcoord", "replay", "--num-blocks", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    _one_error(res, 2, "argument --num-blocks: expected a positive integer, got 0")
    _one_error(
        _run(["replay", "--num-blocks", "0"]),
        2,
        "argument --num-blocks: expected a positive integer, got 0",
    )


# --------------------------------------------------------------------------- adversarial inputs

_CFG = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # was: a hang (a layout of 10**8 layer names built)
        ({"num_hidden_layers": 10**8}, "'num_hidden_layers' must be an integer in [1, 65,536]"),
        # was: "unexpected TypeError" / "unexpected OverflowError", exit 1
        ({"num_key_value_heads": [1]}, "'num_key_value_heads' must be an integer"),
        ({"num_key_value_heads": 1e400}, "'num_key_value_heads' must be an integer"),
        # was: an error naming neither the file nor the key
        ({"vocab_size": "big"}, "'vocab_size' must be an integer"),
        # was: accepted (no KV bytes at all, or a float dimension)
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be an integer in [1,"),
        ({"head_dim": 1e300}, "'head_dim' must be an integer"),
        # was: a pattern of the wrong length silently ignored (every layer full attention)
        ({"layer_types": ["sliding_attention", 5]}, "'layer_types' must be a list of 4 strings"),
        (
            {"attention_chunk_size": 8192, "no_rope_layers": [1] * 8},
            "'no_rope_layers' must be a list of 4 integers",
        ),
        # was: "invalid SlidingWindowSpec.sliding_window=-5", naming no file
        (
            {"sliding_window": -5, "layer_types": ["sliding_attention", "full_attention"] * 2},
            "'sliding_window' must be an integer in [0,",
        ),
    ],
)
def test_model_config_values_are_checked(
    tmp_path: Path, extra: dict[str, object], needle: str
) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**_CFG, **extra}))
    res = _run(["replay", "--model-config", str(p), "--num-blocks", "2000"], timeout=60)
    _one_error(res, 2, f"--model-config: {p}: ", needle)


@pytest.mark.parametrize(
    "groups",
    [
        [{"type": "full_attention", "layers": 10**8}],  # was: a hang
        [{"type": "full_attention", "layers": 40_000}] * 2,
    ],
)
def test_layout_file_with_too_many_layers(tmp_path: Path, groups: list[object]) -> None:
    p = tmp_path / "l.json"
    p.write_text(json.dumps({"groups": groups}))
    _one_error(_run(["replay", "--layout", str(p)], timeout=60), 2, "more than 65,536 layers")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # were: silently the default GPU / model
        (["--gpu", ""], "--gpu: unknown GPU ''"),
        (["--model", ""], "--model: unknown model ''"),
        # were: "'.': is a directory" and the like
        (["--trace", ""], "argument --trace: expected a file name, got ''"),
        (["--model-config", ""], "argument --model-config: expected a file name"),
        (["--json", ""], "argument --json: expected a file name"),
        (["--plot", ""], "argument --plot: expected a file name"),
    ],
)
def test_empty_names_are_refused(argv: list[str], needle: str) -> None:
    _one_error(_run(["replay", "--trace", str(MOONCAKE), *argv]), 2, needle)


def test_sweep_duplicate_axis_values_are_replayed_once(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    base = ["sweep", "--trace", str(MOONCAKE), "--sizes", "200", "--jobs", "1", "--no-progress"]
    # was: two identical rows
    res = _run([*base, "--models", "llama-3.1-8b,llama-3.1-8b,", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    assert [r["variant"] for r in json.loads(out.read_text())["rows"]] == ["llama-3.1-8b"]
    # was: two rows both labelled "host 1 GiB"
    res = _run([*base, "--host-memories", "1GiB,1.5GiB,1024MiB", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    variants = [r["variant"] for r in json.loads(out.read_text())["rows"]]
    assert variants == ["llama-3.1-8b + host 1 GiB", "llama-3.1-8b + host 1.5 GiB"]
    # two layouts that would share a label
    (tmp_path / "full.json").write_text(json.dumps({"groups": [{"type": "full"}]}))
    res = _run([*base, "--layouts", f"full,{tmp_path / 'full.json'}"])
    _one_error(res, 2, "sweep axis 'layout' has two values labelled 'full'")
    # was: --model silently ignored
    _one_error(_run([*base, "--model", "llama-3.1-8b", "--models", "deepseek-v3"]), 2, "give one")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_write_failure_names_the_file() -> None:
    # was: "kvcoord replay: error: No space left on device"
    res = _run(["replay", "--trace", str(MOONCAKE), "--no-progress", "--json", "/dev/full"])
    _one_error(res, 1, "error: /dev/full: No space left on device")


def test_generated_request_ids_never_clash_with_given_ones(tmp_path: Path) -> None:
    # was: "duplicate request_id 'req-1'" on line 2, which has no request_id
    p = _write(
        tmp_path / "t.jsonl",
        [
            {"prompt_token_ids": [1, 2], "request_id": "req-1"},
            {"prompt_token_ids": [3, 4]},
            {"prompt_token_ids": [5, 6], "request_id": "req-2.1"},
            {"prompt_token_ids": [7, 8]},
        ],
    )
    from kvcoord.replay.workloads import read_token_trace

    ids = [r.request_id for r in read_token_trace(p).requests]
    assert ids[0] == "req-1" and ids[2] == "req-2.1" and len(set(ids)) == 4
    res = _run(["replay", "--trace", str(p), "--no-progress"])
    assert res.returncode == 0, res.stderr
    bad = _write(tmp_path / "b.jsonl", [{"prompt_token_ids": [1]}, {"prompt_token_ids": [2]}])
    bad.write_text(bad.read_text() + '{"prompt_token_ids": [3], "request_id": "x"}\n' * 2)
    _one_error(_run(["replay", "--trace", str(bad)]), 2, f"{bad}:4:41: duplicate request_id 'x'")


def test_output_naming_an_input_file_is_refused(tmp_path: Path) -> None:
    # was: the trace overwritten by the summary
    p = tmp_path / "t.jsonl"
    p.write_bytes(MOONCAKE.read_bytes())
    res = _run(["replay", "--trace", str(p), "--json", str(tmp_path / "." / "t.jsonl")])
    _one_error(res, 2, "is the --trace file: it would be overwritten")
    assert p.read_bytes() == MOONCAKE.read_bytes()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # were: "--kv-memory: ...", "--num-blocks: ...", "--capacity-tokens: ...": replay's flags
        (["--max-blocks", "2"], "--min-blocks/--max-blocks (llama-3.1-8b): 2 blocks"),
        (["--sizes", "1"], "--sizes (llama-3.1-8b): a pool needs at least 2 blocks"),
        (["--capacities", "1"], "--capacities (llama-3.1-8b): 2 blocks"),
        (["--kv-memories", "1MiB"], "--kv-memories (llama-3.1-8b): a pool needs"),
    ],
)
def test_sweep_size_errors_name_the_sweep_flag(argv: list[str], needle: str) -> None:
    _one_error(_run(["sweep", "--trace", str(MOONCAKE), "--jobs", "1", *argv]), 2, needle)


def test_sweep_zero_size_in_any_unit_means_none(tmp_path: Path) -> None:
    # was: "0" accepted but "0GiB" refused ("expected a positive size")
    out = tmp_path / "s.json"
    base = ["sweep", "--trace", str(MOONCAKE), "--sizes", "200", "--jobs", "1", "--no-progress"]
    res = _run([*base, "--host-memories", "0,0GiB,1GiB", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    variants = [r["variant"] for r in json.loads(out.read_text())["rows"]]
    assert variants == ["llama-3.1-8b", "llama-3.1-8b + host 1 GiB"]
    _one_error(_run(["replay", "--host-memory", "0GiB"]), 2, "expected a positive size")


# --------------------------------------------------------------------------- issue 31.6 / 32.3-4


def test_version_is_the_package_version() -> None:
    # was: taken as a replay ("unrecognized arguments: --version")
    from kvcoord import __version__

    for argv in (["--version"], ["-V"], ["replay", "--version"], ["sweep", "--version"]):
        res = _run(argv)
        assert (res.returncode, res.stdout, res.stderr) == (0, f"kvcoord {__version__}\n", "")


def test_layer_name_repeated_in_a_group_exits_2(tmp_path: Path) -> None:
    # was: exit 1 ("KVCacheGroup.layer_names must be distinct")
    p = tmp_path / "l.json"
    p.write_text(json.dumps({"groups": [{"type": "full_attention", "layers": ["a", "b", "a"]}]}))
    for argv in (["replay", "--layout", str(p)], ["sweep", "--layouts", f"full,{p}"]):
        _one_error(_run(argv), 2, f"{p}: groups[0]:", "must be distinct")


def test_bad_trace_lines_via_the_cli(tmp_path: Path) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]})
    p = tmp_path / "t.jsonl"
    p.write_bytes(((good + "\n") * 499).encode() + b'{"timestamp": 0, "x\xff": 1}\n')
    _one_error(_run(["replay", "--trace", str(p)]), 2, f"{p}:500:20: not UTF-8 text")
    p.write_text(good + "\nnull\n")
    _one_error(_run(["replay", "--trace", str(p)]), 2, f"{p}:2:1: expected a JSON object, got null")
    zero = good.replace('"output_length": 1', '"output_length": 0')
    p.write_text(zero + "\n")
    col = zero.index('"output_length"') + len('"output_length": ') + 1
    _one_error(_run(["replay", "--trace", str(p)]), 2, f"{p}:1:{col}: 'output_length' must be >= 1")


def test_unknown_trace_field_and_lenient_fields(tmp_path: Path) -> None:
    # was: a typo ignored, so the request arrived at 0
    p = _write(tmp_path / "t.jsonl", [{"prompt_token_ids": [1, 2], "arival_time": 5}])
    res = _run(["replay", "--trace", str(p), "--no-progress"])
    _one_error(
        res,
        2,
        f"{p}:1:30: unknown field 'arival_time' (did you mean 'arrival_time'?)",
        "--lenient-fields ignores fields",
    )
    res = _run(["replay", "--trace", str(p), "--no-progress", "--lenient-fields"])
    assert res.returncode == 0, res.stderr
    sweep = ["sweep", "--trace", str(p), "--sizes", "64", "--jobs", "1", "--no-progress"]
    assert _run([*sweep, "--lenient-fields"]).returncode == 0
    _one_error(_run(sweep), 2, "unknown field 'arival_time'")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # was: "--model: unknown model" for a sweep's --models
        (
            ["sweep", "--models", "llama-3.1-8b,lama-3.1-70b"],
            "--models: unknown model 'lama-3.1-70b'",
        ),
        (["sweep", "--layouts", "full,slidingwindow"], "--layouts: unknown layout 'slidingwindow'"),
        (["sweep", "--host-memories", "0,1kB"], "--host-memories 1,000 B: smaller than one"),
        (["sweep", "--disk-memories", "1kB"], "--disk-memories 1,000 B: smaller than one"),
        (["sweep", "--kv-memories", "1GiB,8TiB"], "--kv-memories (llama-3.1-8b): "),
        (["sweep", "--kv-memory", "1GiB"], "unrecognized arguments: --kv-memory 1GiB"),
    ],
)
def test_sweep_errors_name_the_flag_typed(argv: list[str], needle: str) -> None:
    _one_error(_run([*argv, "--trace", str(MOONCAKE), "--jobs", "1"]), 2, needle)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["replay", "--model", "llama-3.1-7b"], "(did you mean 'llama-3.1-70b'?)"),
        (["replay", "--gpu", "H10"], "(did you mean 'h100'?)"),
        (["replay", "--layout", "sliding_window"], "(did you mean 'sliding-window'?)"),
        (["replay", "--kv-dtype", "fp9"], "(did you mean 'fp8'?)"),
        (["replay", "--router", "prefix-awar"], "(did you mean 'prefix-aware'?)"),
        (["replay", "--policy", "lfuu"], "(did you mean 'lfu'?)"),
        (["replay", "--format", "token"], "(did you mean 'tokens'?)"),
        (["sweep", "--executor", "rey"], "(did you mean 'ray'?)"),
        (["sweep", "--policies", "lru,prefix_depth"], "(did you mean 'prefix-depth'?)"),
        (["sweep", "--routers", "least-load"], "(did you mean 'least-loaded'?)"),
        (["replay", "--kv-memry", "4GiB"], "(did you mean '--kv-memory'?)"),
        (["replay", "--kv-mem", "4GiB"], "(did you mean '--kv-memory'?)"),  # no abbreviations
        (["replay", "--trace", "tests/data/mooncake_smal.jsonl"], "(did you mean 'mooncake_small"),
        (["replay", "--layout", "fulll.json"], "no such layout file"),
    ],
)
def test_misspelt_names_get_a_suggestion(argv: list[str], needle: str) -> None:
    if "--format" in argv:
        argv = [*argv, "--trace", str(MOONCAKE)]
    res = _run(argv, cwd=Path(__file__).parent.parent)
    _one_error(res, 2, needle)


def test_misspelt_command_gets_a_suggestion() -> None:
    res = _run(["sweeep"])
    assert res.returncode == 2 and "(did you mean 'sweep'?)" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # was: 40 bytes
        (["replay", "--kv-memory", "40"], "a size needs a unit, got '40': did you mean 40GiB?"),
        (["replay", "--host-memory", "256"], "did you mean 256GiB?"),
        (["replay", "--disk-memory", "2"], "did you mean 2GiB?"),
        (["sweep", "--kv-memories", "16,32GiB"], "did you mean 16GiB?"),
        (["sweep", "--host-memories", "0,64"], "did you mean 64GiB?"),
        (["replay", "--kv-memory", "40Gb"], None),  # units are case-insensitive: accepted
        (["replay", "--kv-memory", "40 GiBs"], "unknown size unit 'GiBs'"),
    ],
)
def test_sizes_need_a_unit(argv: list[str], needle: str | None) -> None:
    res = _run([*argv, "--trace", str(MOONCAKE), "--no-progress", "--jobs", "1"][: len(argv) + 3])
    if needle is None:
        assert res.returncode == 0, res.stderr
    else:
        _one_error(res, 2, needle)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # was: accepted
        (["--kv-memory", "8TiB", "--gpu", "h100"], "more than a h100 holds: 79.19 GiB of memory"),
        (["--kv-memory", "66GiB"], "leaves 63.14 GiB for the KV cache"),
        (["--num-blocks", "40000"], "--num-blocks: 40,000 blocks are 78.12 GiB"),
        (["--capacity-tokens", "1000000"], "--capacity-tokens: "),
        (["--model", "llama-3.1-70b", "--tp", "2", "--kv-memory", "20GiB"], "(TP 2) - 1.03 GiB"),
    ],
)
def test_a_pool_larger_than_the_gpu_is_refused(argv: list[str], needle: str) -> None:
    _one_error(_run(["replay", "--trace", str(MOONCAKE), *argv]), 2, needle)
    # what fits is accepted: 63 GiB beside Llama-3.1-8B's 15 GiB of weights, 0.84 GiB of
    # activation and 0.25 GiB of non-torch memory on an H100's 79.19 GiB
    assert _run(["replay", "--trace", str(MOONCAKE), "--kv-memory", "63GiB"]).returncode == 0


def test_summaries_know_about_instances(tmp_path: Path) -> None:
    # was: "54.72 GiB per GPU (54.72 GiB total)", "on 1x h100", "per step p50 0.0 us"
    out = tmp_path / "c.json"
    argv = ["replay", "--instances", "4", "--tp", "2", "--no-progress", "--json", str(out)]
    res = _run([*argv, "--host-memory", "10GiB"])
    assert res.returncode == 0, res.stderr
    s = json.loads(out.read_text())
    assert s["instances"] == 4 and s["num_gpus"] == 8
    assert s["kv_memory_gib_total"] == pytest.approx(s["kv_memory_gib_per_gpu"] * 8)
    assert "on 8x h100 (4 engines of TP 2)" in res.stdout
    per_gpu, total = s["kv_memory_gib_per_gpu"], s["kv_memory_gib_total"]
    assert f"{per_gpu:,.2f} GiB per GPU ({total:,.2f} GiB total on 8 GPUs)" in res.stdout
    assert "token slots per engine" in res.stdout
    assert "10.0 GiB per engine (40.0 GiB total)" in res.stdout
    # every step calls the manager, so every step's time is a measurement
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("manager time")]
    assert " 0.0 us" not in line and " 0 ns" not in line, line
    assert s["manager_us_per_step_p50"] > 0
    one = _run(["replay", "--no-progress", "--tp", "2"])
    assert "on 2x h100, KV" in one.stdout and "total on 2 GPUs" in one.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--layout", "LAYOUT_DUP"],
        ["replay", "--layout", "LAYOUT_BAD_WINDOW"],
        ["replay", "--model-config", "CFG_NOT_OBJECT"],
        ["replay", "--trace", "TRACE_DUP_KEY"],
        ["replay", "--trace", "TRACE_SURROGATE"],
        ["replay", "--trace", "TRACE_EMPTY"],
        ["replay", "--format", "tokens"],
        ["replay", "--lenient-fields"],
        ["replay", "--policy", "priority:retention=99999999999"],
        ["replay", "--router", "prefix-aware:balance=x"],
        ["replay", "--block-size", "7", "--model", "jamba-1.5-mini"],
        ["replay", "--instances", "2", "--plot", "x.png"],
        ["sweep", "--layouts", "full", "--layout", "full"],
        ["sweep", "--routers", "least-loaded"],
        ["sweep", "--address", "auto"],
        ["sweep", "--sizes", "100", "--min-blocks", "10"],
        ["sweep", "--min-blocks", "5000", "--max-blocks", "4000"],
    ],
)
def test_every_bad_input_exits_2_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    """The class of #32.4: whatever is wrong with the flags, the layout, the model
    config or the trace, the command says so in one line and exits 2."""
    files = {
        "LAYOUT_DUP": ("l.json", '{"groups": [{"type": "full", "layers": ["x", "x"]}]}'),
        "LAYOUT_BAD_WINDOW": (
            "w.json",
            '{"groups": [{"type": "full"}, {"type": "swa", "sliding_window": 0}]}',
        ),
        "CFG_NOT_OBJECT": ("config.json", "[1, 2]"),
        "TRACE_DUP_KEY": ("d.jsonl", '{"prompt_token_ids": [1], "prompt_token_ids": [2]}\n'),
        "TRACE_SURROGATE": ("s.jsonl", '{"prompt_token_ids": [1], "request_id": "\\udc00"}\n'),
        "TRACE_EMPTY": ("e.jsonl", "\n\n"),
    }
    args = []
    for a in argv:
        if a in files:
            name, text = files[a]
            (tmp_path / name).write_text(text)
            a = str(tmp_path / name)
        args.append(a)
    if "--trace" not in args and "--lenient-fields" not in args and "--format" not in args:
        args += ["--trace", str(MOONCAKE)]
    res = _run([*args, "--jobs", "1"] if args[0] == "sweep" else args, cwd=tmp_path)
    _one_error(res, 2)
    assert "Traceback" not in res.stderr and res.stdout == ""
