"""How ``benches/sample_vllm_scheduler.py`` reads py-spy's stacks: which
samples are decode-step samples, and which of those are the KV manager's
or hashing's, on each engine. (The figures it reports are only as right as
this reading.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHES = Path(__file__).resolve().parent.parent / "benches"
sys.path.insert(0, str(BENCHES))
_spec = importlib.util.spec_from_file_location(
    "sample_vllm_scheduler", BENCHES / "sample_vllm_scheduler.py"
)
assert _spec is not None and _spec.loader is not None
sampler = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sampler)

SITE = "/venv/lib/python3.11/site-packages"
OUTER = (
    "0x7f00 (/usr/lib/libc.so.6);<module> (/b/sample_vllm_scheduler.py:240);"
    "child (/b/sample_vllm_scheduler.py:112);_decode_step (/b/sample_vllm_scheduler.py:68)"
)
SCHEDULE = f"Scheduler.schedule ({SITE}/vllm/v1/core/sched/scheduler.py:914)"
UPDATE = f"Scheduler.update_from_output ({SITE}/vllm/v1/core/sched/scheduler.py:2512)"
APPEND = (
    f"Request.append_output_token_ids ({SITE}/vllm/v1/request.py:287);"
    f"Request.update_block_hashes ({SITE}/vllm/v1/request.py:288)"
)
KVCOORD_SO = "/repo/python/kvcoord/_core.cpython-311-x86_64-linux-gnu.so"


def raw(*stacks: tuple[str, int]) -> str:
    return "\n".join(f"{s} {n}" for s, n in stacks) + "\n"


def test_kvcoord_native_frames_count_and_other_extensions_named_core_do_not() -> None:
    counts = sampler.classify(
        "kvcoord",
        raw(
            (f"{OUTER};{SCHEDULE};_core::vllm::allocate_slots ({KVCOORD_SO})", 3),
            # msgspec's extension is also called _core: the scheduler's, not kvcoord's.
            (f"{OUTER};{UPDATE};Struct_vectorcall ({SITE}/msgspec/_core.cpython-311.so)", 5),
            (f"{OUTER};{SCHEDULE}", 11),
        ),
    )
    assert counts == {"step": 19, "kv": 3}


def test_hashing_is_engine_code_below_the_requests_hasher_call() -> None:
    hasher = f"request_block_hasher ({SITE}/vllm/v1/core/kv_cache_utils.py:980)"
    vllm = sampler.classify(
        "vllm",
        raw(
            (f"{OUTER};{UPDATE};{APPEND};get_request_block_hasher.<locals>.{hasher}", 2),
            (
                f"{OUTER};{SCHEDULE};KVCacheManager.allocate_slots"
                f" ({SITE}/vllm/v1/core/kv_cache_manager.py:300)",
                7,
            ),
            # vLLM's append itself (not the hasher) is the scheduler's work.
            (f"{OUTER};{UPDATE};{APPEND}", 4),
        ),
    )
    assert vllm == {"step": 13, "hashing": 2, "kv": 7}
    kvcoord = sampler.classify(
        "kvcoord",
        raw(
            # Native frames below the gate, the gate's own frame lost by the unwinder.
            (f"{OUTER};{UPDATE};{APPEND};sha2::compress ({KVCOORD_SO})", 6),
            (
                f"{OUTER};{SCHEDULE};KVCacheBlocks.get_block_ids"
                " (/repo/python/kvcoord/vllm/_blocks.py:170)",
                1,
            ),
        ),
    )
    assert kvcoord == {"step": 7, "hashing": 6, "kv": 1}


def test_only_the_two_scheduler_calls_of_a_decode_step_are_step_samples() -> None:
    counts = sampler.classify(
        "vllm",
        raw(
            # The synthetic model output built inside _decode_step.
            (f"{OUTER};model_output (/b/bench_vllm_scheduler.py:229)", 9),
            # Admission and request creation happen outside _decode_step.
            (f"0x7f00 (/usr/lib/libc.so.6);child (/b/s.py:100);{SCHEDULE}", 8),
            (f"{OUTER};{SCHEDULE}", 1),
        ),
    )
    assert counts == {"step": 1}


def test_without_native_frames_a_call_line_into_the_manager_is_the_managers(
    tmp_path: Path,
) -> None:
    scheduler = tmp_path / "scheduler.py"
    scheduler.write_text(
        "def schedule(self):\n"
        "    new_blocks = self.kv_cache_manager.allocate_slots(\n"
        "        request, n)\n"
        "    budget -= n\n"
    )
    request = tmp_path / "request.py"
    request.write_text(
        "def update_block_hashes(self):\n    self.block_hashes.extend(self._block_hasher(self))\n"
    )
    outer = OUTER.replace("/b/", f"{tmp_path}/")
    in_call = f"Scheduler.schedule ({scheduler}:2)"
    elsewhere = f"Scheduler.schedule ({scheduler}:4)"
    hashing = f"{UPDATE};Request.update_block_hashes ({request}:2)"
    stacks = raw((f"{outer};{in_call}", 5), (f"{outer};{elsewhere}", 7), (f"{outer};{hashing}", 2))
    assert sampler.classify("kvcoord", stacks, native=False) == {"step": 14, "kv": 5, "hashing": 2}
    # With native frames, a callee's time has frames of its own: the line is the caller's.
    assert sampler.classify("kvcoord", stacks, native=True) == {"step": 14}
