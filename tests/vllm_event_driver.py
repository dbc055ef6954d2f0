"""Run a recorded workload on vLLM 0.33.0's own KVCacheManager with KV
events on and print every step's events as plain msgpack-able data (JSON).

Runs inside the vLLM virtualenv (test_events_wire.py starts it there):
``python vllm_event_driver.py ops.json``. Not a test module. The op format
is written by ``test_events_wire.workload_ops``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request


def main(path: str) -> None:
    with open(path) as f:
        spec = json.load(f)
    bs, windows = spec["block_size"], spec["windows"]
    init_none_hash(sha256_cbor)
    specs: list[Any] = [
        FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
        if w is None
        else SlidingWindowSpec(
            block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=w
        )
        for w in windows
    ]
    cfg = KVCacheConfig(
        num_blocks=spec["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
    )
    mgr = KVCacheManager(
        cfg,
        max_model_len=spec["max_model_len"],
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_kv_cache_events=True,
    )
    hasher = get_request_block_hasher(bs, sha256_cbor)
    running: dict[str, Request] = {}
    steps = []
    for op in spec["ops"]:
        if op[0] == "add":
            _, rid, tokens, salt = op
            params = SamplingParams(max_tokens=100_000)
            params.update_from_generation_config({}, eos_token_id=None)
            req = Request(
                request_id=rid,
                prompt_token_ids=tokens,
                sampling_params=params,
                pooling_params=None,
                block_hasher=hasher,
                cache_salt=salt,
            )
            got = mgr.get_computed_blocks(req)
            blocks, hit = got[0], got[1]
            if mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None:
                req.num_computed_tokens = req.num_tokens
                running[rid] = req
        elif op[0] == "decode":
            for rid, tok in op[1]:
                req = running[rid]
                req.append_output_token_ids(tok)
                if mgr.allocate_slots(req, 1) is not None:
                    req.num_computed_tokens += 1
        elif op[0] == "free":
            mgr.free(running.pop(op[1]))
        else:
            for req in running.values():
                mgr.free(req)
            running.clear()
            assert mgr.reset_prefix_cache()
        steps.append(msgspec.to_builtins(mgr.take_events()))
    print(json.dumps(steps))


if __name__ == "__main__":
    main(sys.argv[1])
