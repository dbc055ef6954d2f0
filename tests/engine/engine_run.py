"""One real vLLM engine run of a prefix-sharing workload, in its own process.

    python engine_run.py '<json settings>'      # prints one JSON line
    run_engine(settings, kvcoord=True)          # the same, from another process

The settings (:class:`RunSettings` fields) pick the checkpoint, the KV-cache
manager (``"vllm"``: vLLM's own; ``"kvcoord"``: ``KVCOORD_VLLM=1`` set by the
caller, nothing else), prefix caching and its hash, the engine-core mode,
and the cache size. The workload is greedy generation over rounds of
shuffled prompts that share long prefixes; with a small cache it forces
prefix-cache eviction and preemption. The result holds every output's token
ids and the engine's own counters (preemptions, prefix-cache queries and
hits), plus what kvcoord reports about itself when it is loaded here.

Each run is a fresh process: kvcoord's switch is process-wide, and a vLLM
engine does not give all of its memory and threads back when it is dropped.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: Environment every CPU engine run needs (see docs/vllm.md, "Engine tests").
CPU_ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}


@dataclass(frozen=True)
class Workload:
    """Rounds of prompts made of a shared prefix and a unique suffix."""

    num_prefixes: int = 6
    prefix_len: int = 160
    prompts_per_round: int = 32
    rounds: int = 3
    min_suffix: int = 8
    max_suffix: int = 72
    max_tokens: int = 24
    seed: int = 0

    def prompts(self, vocab_size: int) -> list[list[list[int]]]:
        """Token ids of each round's prompts (ids 3 and above)."""
        rng = random.Random(self.seed)
        prefixes = [
            [rng.randrange(3, vocab_size) for _ in range(self.prefix_len)]
            for _ in range(self.num_prefixes)
        ]
        base = [
            prefixes[i % self.num_prefixes]
            + [
                rng.randrange(3, vocab_size)
                for _ in range(rng.randint(self.min_suffix, self.max_suffix))
            ]
            for i in range(self.prompts_per_round)
        ]
        rounds = []
        for _ in range(self.rounds):
            order = list(base)
            rng.shuffle(order)
            rounds.append(order)
        return rounds


@dataclass(frozen=True)
class RunSettings:
    model: str
    manager: str = "kvcoord"  # "vllm" or "kvcoord" (informational: the caller sets the env)
    prefix_caching: bool = True
    hash_algo: str = "sha256_cbor"
    multiprocess: bool = False
    block_size: int = 32
    num_blocks: int = 64
    max_model_len: int = 1024
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    vocab_size: int = 4096
    #: Negative control: in every prefix hit of two or more blocks that
    #: kvcoord's manager returns, the first block's id is replaced by the
    #: second's (in-process only). Attention reads a set of keys, so only a
    #: wrong block, not a reordering, changes what the model computes.
    corrupt_hits: bool = False
    #: Time the scheduler's ``schedule`` and ``update_from_output`` calls
    #: (in-process only; what the KV-cache manager's speed shows in).
    time_scheduler: bool = False
    #: ``"cpu"`` (the CPU build's settings) or ``"cuda"``.
    device: str = "cpu"
    #: Further ``vllm.LLM`` keyword arguments (a hybrid model's cache mode).
    engine_args: dict[str, Any] = field(default_factory=dict)
    workload: Workload = field(default_factory=Workload)

    @classmethod
    def from_json(cls, text: str) -> RunSettings:
        raw = json.loads(text)
        raw["workload"] = Workload(**raw.get("workload", {}))
        return cls(**raw)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _corrupt_kvcoord_hits() -> None:
    """Make kvcoord's manager hand the scheduler a wrong block id in every
    prefix hit of two or more blocks (the second block's id twice)."""
    from kvcoord.vllm import KVCacheManager

    original = KVCacheManager.get_computed_blocks

    def get_computed_blocks(self: Any, request: Any, max_cache_hit_length: Any = None) -> Any:
        blocks, hit, boundary = original(self, request, max_cache_hit_length)
        groups = [list(g) for g in blocks.get_block_ids()]
        if len(groups[0]) >= 2:
            groups[0][0] = groups[0][1]
            blocks = type(blocks)(groups, blocks._pool)
        return blocks, hit, boundary

    KVCacheManager.get_computed_blocks = get_computed_blocks  # type: ignore[method-assign]


class SchedulerClock:
    """Seconds spent in the scheduler's per-step calls, and the step count."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0

    def install(self) -> None:
        from vllm.v1.core.sched.scheduler import Scheduler

        for name in ("schedule", "update_from_output"):
            original = getattr(Scheduler, name)

            def timed(*args: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _original(*args, **kw)
                finally:
                    self.seconds += time.perf_counter() - start
                    self.steps += _name == "schedule"

            setattr(Scheduler, name, timed)


def _counters(llm: Any) -> dict[str, float]:
    """The engine's own counters so far (its Prometheus metrics)."""
    wanted = {"vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"}
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name in wanted:
            out[metric.name.removeprefix("vllm:")] = float(getattr(metric, "value", 0))
        elif metric.name == "vllm:kv_block_lifetime_seconds":  # kv_cache_metrics on
            out["kv_block_lives"] = float(metric.count)
    return out


def _kvcoord_status() -> dict[str, Any] | None:
    """What kvcoord reports in this process (None: not loaded)."""
    if "kvcoord.vllm" not in sys.modules:
        return None
    status: dict[str, Any] = sys.modules["kvcoord.vllm"].status()
    return status


def _hit_alignment(llm: Any) -> dict[str, int | None] | None:
    """Where prefix-cache hits land: the engine's resolved
    ``cache_hit_alignment_tokens`` and the alignment kvcoord's core derives
    (None when the manager is vLLM's). In-process engine core only."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        return None
    engine = core.scheduler.kv_cache_config.cache_hit_alignment_tokens
    inner = getattr(core.scheduler.kv_cache_manager, "_core", None)
    return {"engine": engine, "kvcoord": None if inner is None else int(inner.hit_alignment)}


def run(settings: RunSettings) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if settings.multiprocess else "0"
    if settings.corrupt_hits:
        if settings.multiprocess:
            raise ValueError("corrupt_hits needs the in-process engine core")
        _corrupt_kvcoord_hits()
    clock = SchedulerClock()
    if settings.time_scheduler:
        if settings.multiprocess:
            raise ValueError("time_scheduler needs the in-process engine core")
        clock.install()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=settings.model,
        skip_tokenizer_init=True,
        enforce_eager=settings.device == "cpu",
        dtype="bfloat16",
        seed=0,
        block_size=settings.block_size,
        num_gpu_blocks_override=settings.num_blocks,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.prefix_caching,
        prefix_caching_hash_algo=settings.hash_algo,
        disable_log_stats=False,
        **settings.engine_args,
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=settings.workload.max_tokens, ignore_eos=True
    )
    rounds = settings.workload.prompts(settings.vocab_size)
    outputs: list[list[int]] = []
    counters = []
    clock.seconds, clock.steps = 0.0, 0  # the generation only, not start-up
    start = time.perf_counter()
    for prompts in rounds:
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs += [list(r.outputs[0].token_ids) for r in results]
        counters.append(_counters(llm))
    elapsed = time.perf_counter() - start
    return {
        "outputs": outputs,
        "prompt_lens": [len(p) for prompts in rounds for p in prompts],
        # Cumulative, after each round.
        "counters": counters,
        "generate_s": elapsed,
        "generated_tokens": sum(len(o) for o in outputs),
        "scheduler_s": clock.seconds if settings.time_scheduler else None,
        "scheduler_steps": clock.steps if settings.time_scheduler else None,
        "vllm_version": __import__("vllm").__version__,
        # The scheduler's process: this one unless the engine core has its own
        # (then its log lines say what kvcoord did).
        "kvcoord": None if settings.multiprocess else _kvcoord_status(),
        "hit_alignment": _hit_alignment(llm),
    }


def engine_env(kvcoord: bool, strict: bool = True, device: str = "cpu") -> dict[str, str]:
    """The environment of one engine process: the CPU settings (on a CPU),
    and kvcoord switched on by ``KVCOORD_VLLM=1`` alone (strict unless
    asked) or off. kvcoord comes from the interpreter's own install."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCOORD_VLLM")}
    env.pop("PYTHONPATH", None)
    if device == "cpu":
        env.update(CPU_ENGINE_ENV)
    if kvcoord:
        env["KVCOORD_VLLM"] = "1"
        if strict:
            env["KVCOORD_VLLM_STRICT"] = "1"
    return env


class EngineFailed(RuntimeError):
    """An engine process failed; ``log`` holds its output."""

    def __init__(self, returncode: int, log: str) -> None:
        self.returncode, self.log = returncode, log
        tail = "\n".join(log.splitlines()[-40:])
        super().__init__(f"engine process exited with {returncode}:\n{tail}")


def run_engine(
    settings: RunSettings, kvcoord: bool, strict: bool = True, python: str = sys.executable
) -> dict[str, Any]:
    """One engine run in a process of its own; the result holds its ``log``
    (vLLM logs to stdout, tracebacks go to stderr: both). Raises
    :class:`EngineFailed`."""
    proc = subprocess.run(
        [python, __file__, settings.to_json()],
        env=engine_env(kvcoord, strict, settings.device),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise EngineFailed(proc.returncode, log)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["log"] = log
    return result


def main() -> None:
    settings = RunSettings.from_json(sys.argv[1])
    result = run(settings)
    # The last line of stdout is the result (vLLM's log lines come before it).
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's slow interpreter-exit teardown


if __name__ == "__main__":
    main()
