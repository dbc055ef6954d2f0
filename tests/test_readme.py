"""The README's Python examples run as written, and its `kvcoord` commands
run (on a small trace) and end on a sentence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})


def _commands() -> list[list[str]]:
    """The README's `.venv/bin/kvcoord ...` commands, continuation lines joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            words = cmd.split()
            if words and words[0] == ".venv/bin/kvcoord":
                out.append(words[1:])
    return out


def test_readme_commands_run_and_end_on_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each README command, on a small trace of the same format, runs and ends
    on the sentence a user acts on (its flags are the CLI's)."""
    from kvcoord.cli import main

    small = str(Path(__file__).parent / "data" / "mooncake_small.jsonl")
    cmds = _commands()
    assert {c[0] for c in cmds} == {"replay", "sweep", "plan"}
    for cmd in cmds:
        args = [
            small
            if a == "conversation_trace.jsonl"
            else str(tmp_path / a)
            if a.endswith((".json", ".png"))
            else a
            for a in cmd
        ]
        jobs = ["--jobs", "1"] if cmd[0] in ("sweep", "plan") else []
        assert main([*args, "--limit", "40", "--no-progress", *jobs]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        if cmd[0] == "plan":  # the answer, and the replay that reproduces it
            assert re.search(
                r"^The cheapest deployment that meets .* Replay it: kvcoord replay ", last
            ), last
        else:
            assert re.search(r"(needs|smallest pool swept|no pool swept) .*\.$", last), last
