"""KV events on the wire (kvcoord.events): a real ZeroMQ subscriber decodes
a manager's published stream with plain msgpack and must end up knowing
exactly what the manager has cached; replay fills gaps; vLLM's own decoder
reads kvcoord's bytes (when its virtualenv exists)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

from kvcoord import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KVCacheManagerOptions,
    Request,
    SlidingWindowSpec,
)
from kvcoord.events import (  # noqa: E402
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
    ZmqEventSubscriber,
    decode_batch,
    encode_batch,
    make_batch,
)

B = 16
#: An interpreter with vLLM: this one inside an engine virtualenv (``make
#: test-engine`` runs this file there, on each supported release), else the
#: 0.33 engine virtualenv when it was built.
VLLM_PYTHON = (
    Path(sys.executable)
    if importlib.util.find_spec("vllm") is not None
    else Path(__file__).resolve().parents[1] / ".venv-engine-0.33" / "bin" / "python"
)


def manager(num_blocks: int, *specs: Any) -> KVCacheManager:
    groups = tuple(KVCacheGroup(s) for s in (specs or (FullAttentionSpec(B),)))
    return KVCacheManager(
        KVCacheConfig(num_blocks, groups),
        max_model_len=4096,
        options=KVCacheManagerOptions(enable_events=True),
    )


def cached_keys(mgr: KVCacheManager) -> Counter[tuple[int, int]]:
    """(integer hash, group) -> number of blocks cached under it."""
    pool = mgr.block_pool
    out: Counter[tuple[int, int]] = Counter()
    for b in pool.cached_mask().nonzero()[0].tolist():
        key = pool.block_hash(b)
        assert key is not None
        out[int.from_bytes(key[0][-8:], "big"), key[1]] += 1
    return out


def workload(mgr: KVCacheManager, seed: int, steps: int, publish: Any) -> list[list[Any]]:
    """Random admissions (shared prefixes, some salted), decode steps, frees
    and resets; ``publish(events)`` after every step, as vLLM's scheduler
    does. Returns the ops as run (``vllm_event_driver.py`` replays them)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(8, 70))] for _ in range(4)]
    running: list[Request] = []
    ops: list[list[Any]] = []
    for step in range(steps):
        op = rng.random()
        if op < 0.4 or not running:
            tokens = rng.choice(prefixes) + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 40))
            ]
            salt = "salt" if rng.random() < 0.1 else None
            lora = ("ad", "/a") if rng.random() < 0.15 else None
            req = Request(f"r{step}", tokens, hash_block_size=B, cache_salt=salt, lora=lora)
            ops.append(["add", req.request_id, tokens, salt, lora is not None])
            hit_blocks, hit = mgr.get_computed_blocks(req)
            if mgr.allocate_slots(req, req.num_tokens - hit, hit, hit_blocks) is not None:
                req.num_computed_tokens = req.num_tokens
                running.append(req)
        elif op < 0.8:
            new = [rng.randrange(1000) for _ in running]
            ops.append(["decode", [[r.request_id, t] for r, t in zip(running, new, strict=True)]])
            for req, tok in zip(running, new, strict=True):
                req.append_output_token_ids(tok)
                if mgr.allocate_slots(req, 1) is not None:
                    req.num_computed_tokens += 1
        elif op < 0.98:
            req = running.pop(rng.randrange(len(running)))
            ops.append(["free", req.request_id])
            mgr.free(req)
        else:
            ops.append(["reset"])
            for req in running:
                mgr.free(req)
            running.clear()
            assert mgr.reset_prefix_cache()
        publish(mgr.take_events())
    return ops


def apply_plain(model: Counter[tuple[int, int]], payload: bytes) -> int:
    """Apply one batch decoded with plain msgpack (no kvcoord or vLLM types)
    to ``model``; returns the number of events. Checks each event's shape."""
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert isinstance(ts, float) and rank == 0
    for ev in events:
        kind = ev["type"]
        if kind == "BlockStored":
            hashes = ev["block_hashes"]
            assert ev["medium"] == "GPU" and ev["block_size"] == B
            assert ev["kv_cache_spec_kind"] == "full_attention"
            # Full attention skips no block: the tokens are exactly the blocks'.
            assert len(ev["token_ids"]) == len(hashes) * B
            assert len(ev["extra_keys"]) == len(hashes)
            assert ev["lora_name"] in (None, "ad") and ev["lora_id"] is None
            for h in hashes:
                model[h, ev["group_idx"]] += 1
        elif kind == "BlockRemoved":
            (h,) = ev["block_hashes"]
            key = (h, ev["group_idx"])
            assert model[key] > 0, "removed a block that was never stored"
            model[key] -= 1
            if not model[key]:
                del model[key]
        else:
            assert kind == "AllBlocksCleared" and set(ev) == {"type"}
            model.clear()
    return len(events)


@pytest.mark.parametrize("seed", [0, 1])
def test_subscriber_rebuilds_the_manager_state(seed: int) -> None:
    mgr = manager(48)
    with ZmqEventPublisher("tcp://127.0.0.1:0", bind=True, topic="kv") as pub:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(pub.endpoint)
        # PUB drops messages until the subscription has arrived: probe first.
        while not sub.poll(20):
            pub.publish([])
        sub.recv_multipart()
        while sub.poll(50):
            sub.recv_multipart()
        first = pub.next_seq
        workload(mgr, seed, 300, pub.publish)
        assert pub.flush()
        model: Counter[tuple[int, int]] = Counter()
        expected_seq, n_events = first, 0
        while expected_seq < pub.next_seq:
            assert sub.poll(5000), f"batch {expected_seq} never arrived"
            topic, seq, payload = sub.recv_multipart()
            if int.from_bytes(seq, "big") < first:
                continue  # a late probe
            assert topic == b"kv" and int.from_bytes(seq, "big") == expected_seq
            n_events += apply_plain(model, payload)
            expected_seq += 1
        sub.close(linger=0)
    assert n_events > 50
    # Every stored block was removed or is still cached, and nothing cached
    # is missing from the stream.
    assert model == cached_keys(mgr)


def test_duplicate_keys_and_sliding_window_events() -> None:
    mgr = manager(40, FullAttentionSpec(B), SlidingWindowSpec(B, 2 * B))
    tokens = list(range(5 * B + 3))
    for rid in ("a", "b"):  # no lookup: two blocks per key
        req = Request(rid, tokens, hash_block_size=B, cache_salt="s")
        assert mgr.allocate_slots(req, req.num_tokens) is not None
    events = mgr.take_events()
    stored = [e for e in events if e.group_idx == 1]
    assert stored and stored[0].kv_cache_spec_kind == "sliding_window"
    assert stored[0].kv_cache_spec_sliding_window == 2 * B
    # The tokens of the whole range are sent (skipped blocks' included).
    assert stored[0].token_ids.tolist() == tokens[: 5 * B]
    full = next(e for e in events if e.group_idx == 0)
    assert full.extra_keys == [("s",)] + [None] * 4
    wire = decode_batch(encode_batch(make_batch(events, ts=0.0)))
    assert isinstance(wire.events[0], BlockStored)
    mgr.free(Request("a", tokens, hash_block_size=B))
    mgr.free(Request("b", tokens, hash_block_size=B))
    mgr.take_events()
    mgr.evict_blocks(mgr.block_pool.cached_mask().nonzero()[0])
    removed = [e for e in make_batch(mgr.take_events()).events if isinstance(e, BlockRemoved)]
    per_key = Counter((e.block_hashes[0], e.group_idx) for e in removed)
    # Each of the two blocks under a key is reported, as vLLM reports them.
    assert set(per_key.values()) == {2}


def test_replay_fills_gaps_and_answers_ranges() -> None:
    with ZmqEventPublisher(
        "tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", bind=True, buffer_steps=5
    ) as pub:
        assert pub.replay_endpoint is not None
        for i in range(8):  # nobody listens yet: these are lost on the PUB side
            pub.publish([], ts=float(i))
        assert pub.flush()
        with ZmqEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint) as sub:
            # Only the last 5 are kept.
            assert [s for s, _ in sub.replay(0)] == [3, 4, 5, 6, 7]
            assert [b.ts for _, b in sub.replay(6)] == [6.0, 7.0]
            assert sub.replay(100) == []
            sub.last_seq = 4  # pretend 0..4 were received
            got: list[tuple[int, KVEventBatch]] = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                pub.publish([], ts=99.0)
                got = sub.recv(100)
            seqs = [s for s, _ in got]
            # The gap 5..7 comes from the replay socket, in order, then the live one.
            assert seqs[:3] == [5, 6, 7] and seqs == list(range(5, 5 + len(seqs)))
            assert got[-1][1].ts == 99.0
    with pytest.raises(RuntimeError, match="shut down"):
        pub.publish([])


def test_publisher_rejects_bad_config_and_bad_events() -> None:
    with pytest.raises(ValueError):
        ZmqEventPublisher("tcp://127.0.0.1:0", bind=True, buffer_steps=0)
    with pytest.raises(TypeError, match="not a kvcoord KV event"):
        make_batch([object()])  # type: ignore[list-item]
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x93\x01")


def run_in_vllm(args: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("PYTHONHASHSEED", None)  # vLLM's fixed sha256 seed, as kvcoord's default
    out = subprocess.run(
        [str(VLLM_PYTHON), *args], capture_output=True, text=True, timeout=900, env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM virtualenv")


@needs_vllm
@pytest.mark.slow
def test_same_events_as_vllm(tmp_path: Path) -> None:
    """vLLM's own KVCacheManager, run on the same workload with events on,
    emits the same events, field for field (hashes, tokens, kinds, salts,
    LoRA name and id)."""
    windows = [None, 2 * B]
    mgr = manager(40, FullAttentionSpec(B), SlidingWindowSpec(B, 2 * B))
    ours: list[Any] = []
    ops = workload(mgr, 3, 120, lambda ev: ours.append(ev))
    spec = {"block_size": B, "windows": windows, "num_blocks": 40, "max_model_len": 4096}
    (tmp_path / "ops.json").write_text(json.dumps({**spec, "ops": ops}))
    driver = Path(__file__).with_name("vllm_event_driver.py")
    theirs = json.loads(run_in_vllm([str(driver), str(tmp_path / "ops.json")]))
    # Through JSON as vLLM's side came (tuples become lists).
    mine = json.loads(
        json.dumps(
            [msgspec.to_builtins(make_batch(ev, ts=0.0, lora_ids={"ad": 1}).events) for ev in ours]
        )
    )
    assert len(theirs) == len(mine)
    for step, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        assert a == b, f"step {step} ({ops[step][0]})"
    kinds = Counter(e["type"] for s in mine for e in s)
    assert kinds["BlockStored"] > 50 and kinds["BlockRemoved"] > 50, kinds
    assert any(e.get("lora_id") == 1 for s in mine for e in s)
    assert any(e.get("extra_keys") and ["salt"] in e["extra_keys"] for s in mine for e in s)


@needs_vllm
def test_vllm_decoder_reads_kvcoord_bytes(tmp_path: Path) -> None:
    """vLLM's own KVEventBatch decoder reads kvcoord's payloads, and vLLM's
    encoder writes back the same bytes where its ``BlockStored`` has the
    fields of kvcoord's (0.33's); on 0.32, which lacks
    ``lookahead_token_ids``, the same events (msgspec then writes a struct
    of fewer than 16 fields with a shorter map header)."""
    mgr = manager(48, FullAttentionSpec(B), SlidingWindowSpec(B, 2 * B))
    payloads: list[bytes] = []

    def publish(events: list[Any]) -> None:
        payloads.append(encode_batch(make_batch(events, ts=1.0, data_parallel_rank=0)))

    workload(mgr, 7, 150, publish)
    src = tmp_path / "payloads.msgpack"
    src.write_bytes(msgspec.msgpack.encode(payloads))
    script = (
        "import sys, json, msgspec\n"
        "from vllm.distributed.kv_events import KVEventBatch, BlockStored\n"
        "dec = msgspec.msgpack.Decoder(KVEventBatch)\n"
        "enc = msgspec.msgpack.Encoder()\n"
        "n = same = stored = 0\n"
        "for p in msgspec.msgpack.decode(open(sys.argv[1], 'rb').read()):\n"
        "    b = dec.decode(p)\n"
        "    n += len(b.events)\n"
        "    stored += sum(isinstance(e, BlockStored) for e in b.events)\n"
        "    again = enc.encode(b)\n"
        "    same += again == p\n"
        "    equal += msgspec.msgpack.decode(again) == msgspec.msgpack.decode(p)\n"
        "fields = list(BlockStored.__struct_fields__)\n"
        "print(json.dumps({'events': n, 'stored': stored, 'identical': same, 'equal': equal,\n"
        "                  'fields': fields}))\n"
    )
    script = script.replace("n = same = stored = 0", "n = same = stored = equal = 0")
    result = json.loads(run_in_vllm(["-c", script, str(src)]))
    total = sum(len(decode_batch(p).events) for p in payloads)
    fields = result.pop("fields")
    same_classes = fields == list(BlockStored.__struct_fields__)
    # Only the field 0.32 lacks may differ.
    assert same_classes or fields == [
        f for f in BlockStored.__struct_fields__ if f != "lookahead_token_ids"
    ], fields
    assert result == {
        "events": total,
        "stored": sum(isinstance(e, BlockStored) for p in payloads for e in decode_batch(p).events),
        "identical": len(payloads) if same_classes else result["identical"],
        "equal": len(payloads),
    }, fields
    assert total > 50 and sys.version_info >= (3, 10)


def test_replay_answer_malformed_is_skipped_and_counted() -> None:
    """A replay answer that is not (empty, topic, 8-byte seq, batch) is
    skipped and counted (was: a DecodeError that dropped the whole answer);
    the good ones around it are returned."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    good = encode_batch(make_batch([], ts=1.0))
    end = (b"", b"", (-1).to_bytes(8, "big", signed=True), b"")
    try:
        with ZmqEventSubscriber(
            "tcp://127.0.0.1:1", replay_endpoint=f"tcp://127.0.0.1:{port}"
        ) as sub:
            answers = [
                ((b"", b"t", (3).to_bytes(8, "big")), "expected 4 frames"),
                ((b"", b"t", (3).to_bytes(8, "big"), b"\xc1"), "batch 3"),
                ((b"", b"t", b"\x03", good), "must be 8 bytes"),
            ]
            for n, (frames, needle) in enumerate(answers, 1):
                good_one = (b"", b"t", (4).to_bytes(8, "big"), good)
                got = _answer(router, sub, [frames, good_one, end])
                assert [s for s, _ in got] == [4]
                assert sub.num_undecodable == n and needle in str(sub.last_decode_error)
            with pytest.raises(ValueError, match="start_seq"):
                sub.replay(-1)
    finally:
        router.close(linger=0)


def _answer(router: Any, sub: ZmqEventSubscriber, frames: list[tuple[bytes, ...]]) -> Any:
    """``sub.replay(0)`` answered with ``frames`` by a hand-driven ROUTER."""
    import threading

    def serve() -> None:
        ident, _empty, _start = router.recv_multipart()
        for f in frames:
            router.send_multipart((ident, *f))

    t = threading.Thread(target=serve)
    t.start()
    try:
        return sub.replay(0, timeout_ms=5000)
    finally:
        t.join(10)


def _stored_event(**fields: Any) -> dict[str, Any]:
    ev = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1] * B,
        "block_size": B,
        "lora_id": None,
        "medium": None,
        "lora_name": None,
    }
    return {**ev, **fields}


@pytest.mark.parametrize(
    ("batch", "where"),
    [
        # were: decoded as given
        ([float("nan"), [], None], r"\$\[0\]"),
        ([float("inf"), [], None], r"\$\[0\]"),
        ([-1.0, [], None], r"\$\[0\]"),
        ([1.0, [], -1], r"\$\[2\]"),
        ([1.0, [_stored_event(block_size=-16)], None], r"\$\[1\]\[0\]\.block_size"),
        ([1.0, [_stored_event(token_ids=[1, -5])], None], r"\$\[1\]\[0\]\.token_ids\[1\]"),
        ([1.0, [_stored_event(group_idx=-1)], None], r"\$\[1\]\[0\]\.group_idx"),
        # already refused: wrong types and counts
        ([1.0], "at least length 2"),
        (["x", [], None], r"\$\[0\]"),
        ([1.0, [{"type": "Nope"}], None], "Invalid value 'Nope'"),
        ([1.0, [_stored_event(block_hashes="x")], None], "block_hashes"),
    ],
)
def test_decode_batch_refuses_out_of_range_and_mistyped_fields(
    batch: list[Any], where: str
) -> None:
    payload = msgspec.msgpack.encode(batch)
    with pytest.raises(msgspec.DecodeError, match=where):
        decode_batch(payload)
    for cut in (1, len(payload) // 2):  # truncated frames
        with pytest.raises(msgspec.DecodeError):
            decode_batch(payload[:cut])
