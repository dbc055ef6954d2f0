"""A real vLLM engine on vLLM's own KV-cache manager and on kvcoord, interleaved.

    .venv-engine-0.33/bin/python benches/bench_engine.py [--pairs 3] [--json out.json]

Each pair runs the same workload on vLLM's manager, then on kvcoord
(``KVCOORD_VLLM=1``, strict), each in a fresh process, alternating so that
drift in the machine's speed hits both alike. Reported per manager: output
tokens per second of generation (start-up excluded), and the time the
scheduler spends per step in ``schedule`` + ``update_from_output`` (where
the KV-cache manager's cost shows; the model's forward pass is not in it).
The token ids of every pair are compared too: a benchmark of a manager that
gives other tokens would be meaningless.

On a CPU (default) it writes the tiny seeded Llama of the engine tests; with
``--device cuda --model PATH`` it runs a real model on a GPU build of vLLM
(``--engine-arg load_format=dummy`` for random weights of a real shape).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "engine"))

from engine_run import RunSettings, Workload, run_engine
from tiny_models import write_checkpoint


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--engine-arg wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def tokens_per_s(result: dict[str, Any]) -> float:
    """Output tokens per second of generation (start-up excluded)."""
    return float(result["generated_tokens"] / result["generate_s"])


def scheduler_us(result: dict[str, Any]) -> float:
    """Microseconds per step in ``schedule`` + ``update_from_output``."""
    return float(1e6 * result["scheduler_s"] / result["scheduler_steps"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="vLLM/kvcoord run pairs")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", help="checkpoint directory (default: the tiny Llama)")
    ap.add_argument("--num-blocks", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--prompts-per-round", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--engine-arg", type=_engine_arg, action="append", default=[])
    ap.add_argument("--json", type=Path, help="write the per-run figures here")
    args = ap.parse_args()
    if args.device == "cuda" and not args.model:
        ap.error("--device cuda needs --model")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_checkpoint(Path(tmp) / "tiny-llama"))
        settings = RunSettings(
            model=model,
            device=args.device,
            num_blocks=args.num_blocks,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=2048,
            time_scheduler=True,
            engine_args=dict(args.engine_arg),
            workload=Workload(
                prompts_per_round=args.prompts_per_round,
                rounds=args.rounds,
                max_tokens=args.max_tokens,
            ),
        )
        runs: dict[str, list[dict[str, Any]]] = {"vllm": [], "kvcoord": []}
        for pair in range(args.pairs):
            for name in ("vllm", "kvcoord"):
                result = run_engine(replace(settings, manager=name), kvcoord=name == "kvcoord")
                result.pop("log")
                runs[name].append(result)
                print(
                    f"pair {pair + 1}/{args.pairs} {name:8s} {tokens_per_s(result):9.1f} tok/s  "
                    f"scheduler {scheduler_us(result):8.1f} us/step "
                    f"({result['scheduler_steps']} steps)",
                    flush=True,
                )
            ours, theirs = runs["kvcoord"][-1]["outputs"], runs["vllm"][-1]["outputs"]
            differing = sum(a != b for a, b in zip(ours, theirs, strict=True))
            if differing:
                print(f"pair {pair + 1}: {differing} outputs differ", file=sys.stderr)
                return 1

    def median(name: str, figure: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(figure(r) for r in runs[name])

    print(f"\nmedians over {args.pairs} pairs ({runs['vllm'][0]['vllm_version']}, {args.device}):")
    for name in ("vllm", "kvcoord"):
        print(
            f"  {name:8s} {median(name, tokens_per_s):9.1f} tok/s   "
            f"scheduler {median(name, scheduler_us):8.1f} us/step"
        )
    throughput = median("kvcoord", tokens_per_s) / median("vllm", tokens_per_s)
    scheduler = median("kvcoord", scheduler_us) / median("vllm", scheduler_us)
    print(f"  kvcoord/vLLM: throughput x{throughput:.3f}, scheduler time per step x{scheduler:.3f}")
    if args.json:
        for results in runs.values():
            for r in results:
                r.pop("outputs")
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
