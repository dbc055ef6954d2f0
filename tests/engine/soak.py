"""A serving soak under faults: ``vllm serve`` on kvcoord (strict, checking
its invariants after every release) driven by many OpenAI clients at once.

The clients share long prompt prefixes, and the cache is small enough that
the scheduler preempts all the time. Each client draws, request after
request, one of the :data:`ACTIONS`: a streamed or plain completion, a
stream it drops part way (the server aborts the request), a request it gives
up on after a random short timeout (likewise), one token, a generation up to
the model's length limit, one whose ``max_tokens`` runs past that limit
(served up to it), or a prompt the server must refuse (too long). Part way
through, the server is stopped and started again while the clients keep
going.

What a run records (:class:`SoakResult`): every request's outcome, the
tokens of every completed or dropped stream, the unexpected errors, the
server's memory over time, and what the server says at the end (no request
left, no block held, a prefix-cache reset that succeeds). :func:`reference`
serves each prompt alone with vLLM's own manager and no prefix cache, and
:func:`divergences` lists every request whose tokens differ from that.

    python soak.py <checkpoint> [seconds]     # a run and its verdict
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine_run import engine_env
from serving import MODEL, Server

#: What a client does for one request, with its weight.
ACTIONS = {
    "stream": 30,
    "plain": 15,
    "drop_stream": 15,
    "give_up": 10,
    "one_token": 8,
    "to_model_limit": 6,
    "prompt_too_long": 8,
    "tokens_past_limit": 8,
}
#: Actions whose request the server must refuse (HTTP 400). (A prompt that
#: fits with a ``max_tokens`` that does not is served up to the limit.)
REFUSED = ("prompt_too_long",)
#: Outcomes whose tokens are checked against the reference (all of them for
#: "completed", as far as they got for the others).
CHECKED = ("completed", "dropped", "cut")


@dataclass(frozen=True)
class SoakSettings:
    seconds: float = 60.0
    clients: int = 10
    #: When, as a fraction of the run, the server is stopped and started
    #: again under load (None: never).
    restart_at: float | None = 0.2
    block_size: int = 32
    num_blocks: int = 40
    max_model_len: int = 512
    max_num_seqs: int = 12
    num_prefixes: int = 4
    #: Distinct prompts (see _Prompts).
    distinct: int = 160
    prefix_len: tuple[int, int] = (64, 224)
    suffix_len: tuple[int, int] = (1, 64)
    #: How far below the length limit the prompts of limit-length generations end.
    near_limit: tuple[int, int] = (8, 72)
    max_tokens: tuple[int, int] = (2, 48)
    vocab_size: int = 4096
    sample_every_s: float = 2.0
    seed: int = 0

    def server_args(self) -> list[str]:
        return [
            "--dtype", "bfloat16", "--enforce-eager",
            "--block-size", str(self.block_size),
            "--num-gpu-blocks-override", str(self.num_blocks),
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--enable-prefix-caching",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip


@dataclass
class Record:
    """One request: what was asked, what happened, the tokens received."""

    action: str
    prompt: list[int]
    max_tokens: int
    #: completed | dropped | cut | gave_up | refused | outage | unexpected
    #: ("cut": the server ended it early because it was shutting down).
    outcome: str = "pending"
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    detail: str = ""


@dataclass
class SoakResult:
    settings: SoakSettings
    records: list[Record]
    #: (seconds since start, resident bytes of the server's processes by
    #: role (see Server.rss_bytes), server start number)
    memory: list[tuple[float, dict[str, int], int]]
    #: The engine's counters, summed over the server's lifetimes.
    counters: dict[str, float]
    #: What the server said once the load stopped.
    end: dict[str, Any]
    starts: int
    log: str

    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.records)

    def unexpected(self) -> list[Record]:
        return [r for r in self.records if r.outcome == "unexpected"]


class _Outage:
    """Whether the server is (or was, during a request) being restarted."""

    def __init__(self) -> None:
        self.down = False
        self.generation = 0
        self.lock = threading.Lock()

    def begin(self) -> None:
        with self.lock:
            self.down, self.generation = True, self.generation + 1

    def end(self) -> None:
        with self.lock:
            self.down, self.generation = False, self.generation + 1

    def mark(self) -> int:
        return self.generation

    def overlapped(self, mark: int) -> bool:
        return self.down or self.generation != mark


class _Prompts:
    """A fixed set of distinct prompts, drawn again and again (so whole
    prompts hit the prefix cache too, and the reference serves each once):
    ``distinct`` made of a shared prefix and a suffix of their own, and an
    eighth as many within ``near_limit`` tokens of the model's length limit
    for the generations that run up to it."""

    def __init__(self, s: SoakSettings) -> None:
        self.s = s
        rng = random.Random(s.seed)
        prefixes = [self._tokens(rng, rng.randint(*s.prefix_len)) for _ in range(s.num_prefixes)]
        self.common = [
            rng.choice(prefixes) + self._tokens(rng, rng.randint(*s.suffix_len))
            for _ in range(s.distinct)
        ]
        limit = s.max_model_len
        self.long = []
        for _ in range(max(1, s.distinct // 8)):
            prompt = rng.choice(prefixes)
            want = limit - rng.randint(*s.near_limit)
            self.long.append(prompt + self._tokens(rng, max(0, want - len(prompt))))

    def _tokens(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(3, self.s.vocab_size) for _ in range(n)]

    def draw(self, rng: random.Random, action: str) -> tuple[list[int], int]:
        """A prompt and its ``max_tokens`` for ``action``."""
        limit = self.s.max_model_len
        if action == "prompt_too_long":
            prompt = rng.choice(self.common)
            return prompt + self._tokens(rng, limit + 1 - len(prompt) + rng.randint(0, 64)), 4
        if action in ("to_model_limit", "tokens_past_limit"):
            prompt = rng.choice(self.long)
            past = rng.randint(1, 64) if action == "tokens_past_limit" else 0
            return prompt, limit - len(prompt) + past
        prompt = rng.choice(self.common)
        if action == "one_token":
            return prompt, 1
        return prompt, rng.randint(*self.s.max_tokens)


def _client_loop(
    server: Server,
    prompts: _Prompts,
    outage: _Outage,
    stop_at: float,
    seed: int,
    out: list[Record],
) -> None:
    import httpx
    import openai

    rng = random.Random(seed)
    names, weights = list(ACTIONS), list(ACTIONS.values())
    client = openai.OpenAI(
        base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    while time.monotonic() < stop_at:
        if outage.down:  # wait for the restart
            time.sleep(0.5)
            continue
        action = rng.choices(names, weights)[0]
        prompt, max_tokens = prompts.draw(rng, action)
        rec = Record(action, prompt, max_tokens)
        out.append(rec)
        mark = outage.mark()
        body = {"ignore_eos": True, "return_token_ids": True}
        try:
            if action in ("stream", "drop_stream", "to_model_limit"):
                keep = rng.randint(1, max(1, max_tokens - 1)) if action == "drop_stream" else None
                stream = client.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                    stream=True, extra_body=body,
                )  # fmt: skip
                for chunk in stream:
                    for choice in chunk.choices:
                        rec.tokens += list(getattr(choice, "token_ids", None) or ())
                        rec.finish_reason = choice.finish_reason or rec.finish_reason
                    if keep is not None and len(rec.tokens) >= keep:
                        stream.close()
                        rec.outcome = "dropped"
                        break
                else:
                    rec.outcome = "completed"
            else:
                timeout = rng.uniform(0.05, 1.0) if action == "give_up" else 300
                done = client.with_options(timeout=timeout).completions.create(
                    model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                    extra_body=body,
                )  # fmt: skip
                rec.tokens = list(getattr(done.choices[0], "token_ids", None) or ())
                rec.finish_reason = done.choices[0].finish_reason
                rec.outcome = "completed"
        except openai.BadRequestError as e:
            rec.outcome, rec.detail = "refused", str(e)[:300]
        except openai.APITimeoutError as e:
            expected = action == "give_up" or outage.overlapped(mark)
            rec.outcome, rec.detail = ("gave_up" if expected else "unexpected"), repr(e)[:300]
        except (openai.APIError, httpx.HTTPError, OSError) as e:
            rec.outcome = "outage" if outage.overlapped(mark) else "unexpected"
            rec.detail = repr(e)[:300]
        judge(rec, outage.overlapped(mark), prompts.s.max_model_len)


def judge(rec: Record, across_restart: bool, max_model_len: int) -> None:
    """Settle ``rec``'s outcome once its request is over: whether what the
    server did is what it must do for ``rec.action``.

    The server generates up to the model's length limit, no further, so a
    completion is exactly ``min(max_tokens, limit - prompt)`` tokens long,
    with one exception: a server shutting down ends the requests it still
    holds early (vLLM finishes them with ``finish_reason`` "abort"), so a
    shorter completion is "cut" if the restart overlapped it, and
    unexpected otherwise. The tokens of completed, dropped and cut requests
    are all checked against the reference (:func:`divergences`)."""
    asked = rec.max_tokens
    rec.max_tokens = min(asked, max_model_len - len(rec.prompt))
    if rec.outcome in ("completed", "dropped") and across_restart:
        rec.detail = "crossed a restart"  # its tokens are still checked
    if rec.outcome == "completed" and len(rec.tokens) != rec.max_tokens:
        short = len(rec.tokens) < rec.max_tokens
        rec.outcome = "cut" if short and across_restart else "unexpected"
        rec.detail = (
            f"{len(rec.tokens)} tokens for max_tokens {asked} (finish_reason {rec.finish_reason})"
        )
    if rec.action in REFUSED and rec.outcome not in ("refused", "outage"):
        rec.detail = f"expected a refusal, got {rec.outcome}: {rec.detail}"
        rec.outcome = "unexpected"
    elif rec.action not in REFUSED and rec.outcome == "refused":
        rec.outcome = "unexpected"


def _wait_idle(server: Server, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = not m.get("vllm:num_requests_running") and not m.get("vllm:num_requests_waiting")
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.5)


_COUNTERS = ("vllm:num_preemptions_total", "vllm:prefix_cache_hits_total",
             "vllm:prefix_cache_queries_total", "vllm:request_success_total")  # fmt: skip


def run_soak(checkpoint: str, settings: SoakSettings, log: Path) -> SoakResult:
    """One soak run of ``settings`` against a fresh server of ``checkpoint``."""
    prompts = _Prompts(settings)
    outage = _Outage()
    records: list[list[Record]] = [[] for _ in range(settings.clients)]
    memory: list[tuple[float, dict[str, int], int]] = []
    counters: Counter[str] = Counter()
    server = Server(checkpoint, settings.server_args(), log, check=True, dev_mode=True)
    with server:
        server.start()
        t0 = time.monotonic()
        stop_at = t0 + settings.seconds
        threads = [
            threading.Thread(
                target=_client_loop,
                args=(server, prompts, outage, stop_at, settings.seed * 1000 + i, records[i]),
                daemon=True,
            )
            for i in range(settings.clients)
        ]
        for t in threads:
            t.start()
        restart_at = (
            None if settings.restart_at is None else t0 + settings.restart_at * settings.seconds
        )
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            if server.running():
                memory.append((now - t0, server.rss_bytes(), server.starts))
            if restart_at is not None and now >= restart_at:
                restart_at = None
                counters.update(_counter_values(server))
                outage.begin()
                server.stop()
                server.start()
                outage.end()
            for t in threads:
                t.join(timeout=settings.sample_every_s / len(threads))
        end_metrics = _wait_idle(server)
        counters.update(_counter_values(server))
        end = {
            "running": end_metrics.get("vllm:num_requests_running", -1.0),
            "waiting": end_metrics.get("vllm:num_requests_waiting", -1.0),
            "kv_cache_usage": end_metrics.get("vllm:kv_cache_usage_perc", -1.0),
            "reset_prefix_cache": json.loads(server.post("/reset_prefix_cache")),
            "kv_cache_usage_after_reset": server.metrics().get("vllm:kv_cache_usage_perc", -1.0),
            "health": server.get("/health") == "",
        }
        starts = server.starts
    return SoakResult(
        settings=settings,
        records=[r for rs in records for r in rs],
        memory=memory,
        counters=dict(counters),
        end=end,
        starts=starts,
        log=log.read_text(errors="replace"),
    )


def _counter_values(server: Server) -> dict[str, float]:
    m = server.metrics()
    return {k.removeprefix("vllm:"): m.get(k, 0.0) for k in _COUNTERS}


# ---- the reference: each prompt alone, vLLM's own manager, no prefix cache


def reference(
    checkpoint: str, settings: SoakSettings, records: list[Record]
) -> dict[tuple[int, ...], list[int]]:
    """The tokens vLLM's own manager generates for each prompt served alone
    (greedy, no prefix cache), as many as any record of it asked for."""
    want: dict[tuple[int, ...], int] = {}
    for r in records:
        if r.outcome in CHECKED:
            key = tuple(r.prompt)
            want[key] = max(want.get(key, 0), r.max_tokens)
    job = {
        "checkpoint": checkpoint,
        "settings": asdict(settings),
        "requests": [[list(k), n] for k, n in want.items()],
    }
    proc = subprocess.run(
        [sys.executable, __file__, "--reference"],
        input=json.dumps(job),
        env=engine_env(kvcoord=False),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    outputs = json.loads(proc.stdout.strip().splitlines()[-1])
    return {tuple(p): o for (p, _), o in zip(job["requests"], outputs, strict=True)}


def _serve_alone(job: dict[str, Any]) -> list[list[int]]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    s = job["settings"]
    llm = LLM(
        model=job["checkpoint"], skip_tokenizer_init=True, enforce_eager=True,
        dtype="bfloat16", seed=0, block_size=s["block_size"],
        max_model_len=s["max_model_len"], enable_prefix_caching=False,
    )  # fmt: skip
    out = []
    for prompt, n in job["requests"]:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        result = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        out.append(list(result[0].outputs[0].token_ids))
    return out


def divergences(records: list[Record], ref: dict[tuple[int, ...], list[int]]) -> list[str]:
    """Every completed request whose tokens differ from the reference, and
    every dropped stream or cut request whose tokens are not a prefix of it."""
    bad = []
    for i, r in enumerate(records):
        if r.outcome not in CHECKED:
            continue
        expected = ref[tuple(r.prompt)][: r.max_tokens]
        got = r.tokens
        ok = got == expected if r.outcome == "completed" else got == expected[: len(got)]
        if not ok:
            pairs = enumerate(zip(got, expected, strict=False))
            at = next((j for j, (a, b) in pairs if a != b), min(len(got), len(expected)))
            bad.append(
                f"request {i} ({r.action}, {r.outcome}, prompt {len(r.prompt)} tokens): "
                f"{len(got)} tokens, first difference at token {at} of {len(expected)}"
            )
    return bad


def log_problems(log: str) -> list[str]:
    """Lines of the server's log that no fault of this soak explains: any
    error or traceback before a server's shutdown began, except the one line
    vLLM logs per refused request; and a start that kvcoord did not serve
    strictly with its invariant checks on."""
    problems = []
    for n, life in enumerate(log.split("==== start ")[1:], start=1):
        running = life.split("[shutdown]", 1)[0]
        served = [ln for ln in life.splitlines() if "kvcoord.vllm: serving the KV cache" in ln]
        if len(served) != 1 or "strict, checking invariants" not in served[0]:
            problems.append(f"start {n}: kvcoord served lines {served}")
        for line in running.splitlines():
            if ("ERROR" in line or "Traceback" in line) and "Exception caught." not in line:
                problems.append(f"start {n}: {line.strip()[:300]}")
    return problems


def memory_growth(result: SoakResult, role: str, warmup: float = 0.3) -> tuple[int, int]:
    """Resident memory of the last server's ``role`` process(es): the mean
    of the first and of the last quarter of its samples after ``warmup`` (a
    fraction of its lifetime); (0, 0) with too few samples."""
    last = [(t, m.get(role, 0)) for t, m, start in result.memory if start == result.starts]
    if len(last) < 8:
        return 0, 0
    span = last[-1][0] - last[0][0]
    steady = [b for t, b in last if t >= last[0][0] + warmup * span]
    q = max(1, len(steady) // 4)
    return sum(steady[:q]) // q, sum(steady[-q:]) // q


def _main() -> None:
    if sys.argv[1:2] == ["--reference"]:
        out = _serve_alone(json.loads(sys.stdin.read()))
        sys.stdout.write("\n" + json.dumps(out) + "\n")
        sys.stdout.flush()
        os._exit(0)
    checkpoint = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    settings = SoakSettings(seconds=seconds)
    result = run_soak(checkpoint, settings, Path("soak-server.log"))
    print("outcomes", dict(result.outcomes()), "counters", result.counters, "end", result.end)
    for r in result.unexpected()[:10]:
        print("unexpected", r.action, r.detail)
    for role in ("api_server", "engine_core", "worker"):
        print(role, "MiB", [round(m[1].get(role, 0) / 2**20) for m in result.memory])
    ref = reference(checkpoint, settings, result.records)
    bad = divergences(result.records, ref)
    print(f"{len(bad)} divergent of {sum(1 for r in result.records if r.tokens)}")
    for line in bad[:10]:
        print(line)


if __name__ == "__main__":
    _main()
