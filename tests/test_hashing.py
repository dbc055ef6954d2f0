"""Block hashing through kvcoord.Request: vLLM 0.33.0 vectors, properties,
error paths and GIL release."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcoord
from gil import ticks_during
from kvcoord import (
    ConfigError,
    InvalidTokenError,
    KvCoordError,
    LoRA,
    MultiModalFeature,
    Request,
    compute_block_hashes,
    none_hash,
)

VECTORS_PATH = Path(__file__).parent / "data" / "conformance" / "hashes.jsonl"
VECTORS = [json.loads(line) for line in VECTORS_PATH.read_text().splitlines() if line.strip()]
ALGOS = ("sha256_cbor", "xxhash_cbor", "xxh3_native")


def _kwargs(v: dict) -> dict:
    lora = v["lora"]
    mm = v.get("mm_features")
    return {
        "hash_block_size": v["block_size"],
        "hash_algo": v["algo"],
        "hash_seed": v["none_hash_seed"],
        "cache_salt": v["cache_salt"],
        "lora": None if lora is None else (lora["name"], lora["path"]),
        "mm_features": None
        if mm is None
        else [(m["identifier"], m["offset"], m["length"]) for m in mm],
    }


# ---------------------------------------------------------------- vectors


def test_vector_file_is_complete() -> None:
    assert len(VECTORS) == 32
    assert {v["algo"] for v in VECTORS} == {"sha256_cbor", "xxhash_cbor"}
    assert any(v.get("mm_features") for v in VECTORS)
    assert any(v["lora"] for v in VECTORS)


@pytest.mark.parametrize("i", range(len(VECTORS)))
def test_vector_none_hash(i: int) -> None:
    v = VECTORS[i]
    assert none_hash(v["algo"], v["none_hash_seed"]).hex() == v["none_hash"]


@pytest.mark.parametrize("i", range(len(VECTORS)))
def test_vector_request(i: int) -> None:
    v = VECTORS[i]
    req = Request(f"r{i}", v["tokens"], **_kwargs(v))
    assert [h.hex() for h in req.block_hashes] == v["block_hashes"]
    assert req.num_prompt_tokens == len(v["tokens"])
    d = 32 if v["algo"] == "sha256_cbor" else 16
    arr = req.block_hashes_array()
    assert arr.shape == (len(v["block_hashes"]), d) and arr.dtype == np.uint8
    assert [bytes(row).hex() for row in arr] == v["block_hashes"]
    assert req.block_hashes_bytes().hex() == "".join(v["block_hashes"])


@pytest.mark.parametrize("i", range(len(VECTORS)))
def test_vector_incremental_and_named_types(i: int) -> None:
    """Prompt of the first token only, then every other token appended one
    by one (ints) or in chunks (numpy), named tuples for the extra keys."""
    v = VECTORS[i]
    kw = _kwargs(v)
    if kw["lora"] is not None:
        kw["lora"] = LoRA(*kw["lora"])
    if kw["mm_features"] is not None:
        kw["mm_features"] = [MultiModalFeature(*m) for m in kw["mm_features"]]
    toks = v["tokens"]
    a = Request("a", toks[:1], **kw)
    for t in toks[1:]:
        a.append_output_token_ids(t)
    b = Request("b", np.array(toks[:3], dtype=np.int64), **kw)
    rest = np.array(toks[3:], dtype=np.uint32)
    for k in range(0, len(rest), 5):
        b.append_output_token_ids(rest[k : k + 5])
    for req in (a, b):
        assert [h.hex() for h in req.block_hashes] == v["block_hashes"]
        assert req.all_token_ids == toks


def test_compute_block_hashes_matches_vectors() -> None:
    for v in VECTORS:
        got = compute_block_hashes(v["tokens"], **_kwargs(v))
        assert [h.hex() for h in got] == v["block_hashes"]


def test_default_seeds() -> None:
    assert none_hash("sha256_cbor").hex() == VECTORS[0]["none_hash"]  # "vllm-none-hash"
    a = Request("a", list(range(32)), hash_block_size=16)
    assert a.block_hashes == compute_block_hashes(
        list(range(32)), hash_block_size=16, hash_seed="vllm-none-hash"
    )
    # Random per process for the non-cryptographic algorithms: never the
    # vLLM default, but stable within the process.
    for algo in ("xxhash_cbor", "xxh3_native"):
        assert none_hash(algo) != none_hash(algo, "vllm-none-hash")
        assert none_hash(algo) == none_hash(algo)
        x = Request("x", list(range(32)), hash_block_size=16, hash_algo=algo)
        y = Request("y", list(range(32)), hash_block_size=16, hash_algo=algo)
        assert list(x.block_hashes) == list(y.block_hashes)


def test_native_digests_pinned() -> None:
    """xxh3_native format v1 is stable (same values as the Rust unit test)."""
    assert none_hash("xxh3_native", "kvcoord").hex() == "de2688cf3de81f83ca80bb15cec258bc"
    got = compute_block_hashes(
        [1, 2, 3, 4, 5, 6, 7, 8], hash_block_size=4, hash_algo="xxh3_native", hash_seed="kvcoord"
    )
    assert [h.hex() for h in got] == [
        "eec51e83b8741f5b95744442e51a8cdd",
        "6e4b85306cbccb9cc6f9f33600ebad07",
    ]


# ---------------------------------------------------------------- Request surface


def test_request_surface() -> None:
    r = Request(
        "req-1",
        list(range(20)),
        hash_block_size=8,
        cache_salt="salt",
        lora=("ad", "/p"),
        mm_features=[("img", 2, 3)],
    )
    assert r.request_id == "req-1"
    assert (r.num_prompt_tokens, r.num_tokens, r.num_output_tokens) == (20, 20, 0)
    assert r.hash_block_size == 8 and r.hash_algo == "sha256_cbor" and r.digest_len == 32
    assert r.cache_salt == "salt" and r.lora == ("ad", "/p") and r.mm_features == [("img", 2, 3)]
    assert len(r.block_hashes) == r.num_block_hashes == 2
    assert r.num_computed_tokens == 0
    r.num_computed_tokens = 16
    assert r.num_computed_tokens == 16
    with pytest.raises(ValueError):
        r.num_computed_tokens = -1
    view = r.block_hashes
    r.append_output_token_ids([1, 2, 3, 4])
    assert len(view) == 3  # live view
    assert r.output_token_ids == [1, 2, 3, 4] and r.num_tokens == 24
    assert r.prompt_token_ids == list(range(20))
    assert r.token_ids_array().dtype == np.uint32
    assert view[-1] == view[2] and view[0:2] == [view[0], view[1]]
    with pytest.raises(IndexError):
        view[3]
    assert "req-1" in repr(r)
    assert isinstance(r.block_hashes, kvcoord.BlockHashes)


@pytest.mark.parametrize("algo", ALGOS)
def test_partial_block_hashed_only_when_full(algo: str) -> None:
    r = Request("r", [1, 2, 3], hash_block_size=4, hash_algo=algo, hash_seed="s")
    assert len(r.block_hashes) == 0
    r.append_output_token_ids(4)
    assert len(r.block_hashes) == 1
    r.append_output_token_ids([5, 6, 7])
    assert len(r.block_hashes) == 1
    r.append_output_token_ids(())
    assert len(r.block_hashes) == 1
    r.append_output_token_ids([8, 9])
    assert len(r.block_hashes) == 2


def test_empty_salt_is_no_salt() -> None:
    a = compute_block_hashes([1, 2], hash_block_size=2, cache_salt="")
    b = compute_block_hashes([1, 2], hash_block_size=2)
    assert a == b


# ---------------------------------------------------------------- properties

token_lists = st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=80)


@settings(max_examples=60, deadline=None)
@given(
    toks=token_lists,
    bs=st.integers(1, 9),
    algo=st.sampled_from(ALGOS),
    cuts=st.lists(st.integers(0, 80), max_size=6),
    salt=st.one_of(st.none(), st.text(max_size=5)),
    lora=st.one_of(st.none(), st.tuples(st.text(max_size=4), st.text(max_size=4))),
    mm=st.lists(st.tuples(st.text(max_size=3), st.integers(0, 60), st.integers(0, 20)), max_size=3),
)
def test_any_split_equals_one_shot(toks, bs, algo, cuts, salt, lora, mm) -> None:
    kw = {
        "hash_block_size": bs,
        "hash_algo": algo,
        "hash_seed": "prop",
        "cache_salt": salt,
        "lora": lora,
        "mm_features": sorted(mm, key=lambda m: m[1]),
    }
    one = compute_block_hashes(toks, **kw)
    assert len(one) == len(toks) // bs
    bounds = sorted({min(c, len(toks)) for c in cuts})
    first = bounds[0] if bounds else len(toks)
    r = Request("r", toks[:first], **kw)
    prev = first
    for b in [*bounds[1:], len(toks)]:
        r.append_output_token_ids(toks[prev:b])
        prev = b
    assert list(r.block_hashes) == one


@settings(max_examples=60, deadline=None)
@given(
    toks=st.lists(st.integers(0, 200_000), min_size=4, max_size=64),
    bs=st.integers(1, 8),
    algo=st.sampled_from(ALGOS),
    data=st.data(),
)
def test_token_change_propagates_forward_only(toks, bs, algo, data) -> None:
    kw = {"hash_block_size": bs, "hash_algo": algo, "hash_seed": "prop"}
    base = compute_block_hashes(toks, **kw)
    pos = data.draw(st.integers(0, len(toks) - 1))
    changed = list(toks)
    changed[pos] = (changed[pos] + 1) % 2**32
    after = compute_block_hashes(changed, **kw)
    blk = pos // bs
    assert after[:blk] == base[:blk]
    assert all(a != b for a, b in zip(after[blk:], base[blk:], strict=True))


@settings(max_examples=40, deadline=None)
@given(
    toks=st.lists(st.integers(0, 200_000), min_size=2, max_size=48),
    bs=st.integers(1, 8),
    algo=st.sampled_from(ALGOS),
    salts=st.tuples(st.text(min_size=1, max_size=5), st.text(min_size=1, max_size=5)),
    loras=st.tuples(
        st.tuples(st.text(max_size=4), st.text(max_size=4)),
        st.tuples(st.text(max_size=4), st.text(max_size=4)),
    ),
)
def test_salt_and_lora_change_every_block(toks, bs, algo, salts, loras) -> None:
    kw = {"hash_block_size": bs, "hash_algo": algo, "hash_seed": "prop"}
    base = compute_block_hashes(toks, **kw)
    if salts[0] != salts[1]:
        a = compute_block_hashes(toks, cache_salt=salts[0], **kw)
        b = compute_block_hashes(toks, cache_salt=salts[1], **kw)
        # The salt enters block 0 only, but the chain carries it to all.
        assert all(x != y for x, y in zip(a, b, strict=True))
        assert all(x != y for x, y in zip(a, base, strict=True))
    if loras[0] != loras[1]:
        a = compute_block_hashes(toks, lora=loras[0], **kw)
        b = compute_block_hashes(toks, lora=loras[1], **kw)
        assert all(x != y for x, y in zip(a, b, strict=True))
        assert all(x != y for x, y in zip(a, base, strict=True))


def test_mm_identifier_changes_only_overlapped_and_later_blocks() -> None:
    toks = list(range(40))
    kw = {"hash_block_size": 8, "hash_seed": "s"}
    a = compute_block_hashes(toks, mm_features=[("img-a", 17, 10)], **kw)
    b = compute_block_hashes(toks, mm_features=[("img-b", 17, 10)], **kw)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "bad, pos",
    [([1, -1], 1), ([2**32], 0), ([0, 1, 2**70], 2), (np.array([5, -3]), 1)],
)
def test_invalid_tokens(bad, pos) -> None:
    with pytest.raises(InvalidTokenError, match=f"position {pos}") as e:
        Request("r", bad, hash_block_size=1)
    assert isinstance(e.value, ValueError) and isinstance(e.value, KvCoordError)
    with pytest.raises(InvalidTokenError):
        compute_block_hashes(bad, hash_block_size=1)


def test_append_invalid_token_is_all_or_nothing() -> None:
    r = Request("r", [1, 2, 3], hash_block_size=2)
    with pytest.raises(InvalidTokenError, match="position 4"):
        r.append_output_token_ids([4, -5])
    assert r.num_tokens == 3 and len(r.block_hashes) == 1
    with pytest.raises(InvalidTokenError, match="position 3"):
        r.append_output_token_ids(2**32)
    with pytest.raises(TypeError):
        r.append_output_token_ids(["x"])
    with pytest.raises(TypeError):
        r.append_output_token_ids("abc")
    assert r.num_tokens == 3


def test_bad_algo_name_lists_allowed() -> None:
    with pytest.raises(ConfigError, match="sha256_cbor, xxhash_cbor, xxh3_native") as e:
        Request("r", [1], hash_block_size=1, hash_algo="sha256")
    assert isinstance(e.value, ValueError)
    with pytest.raises(ConfigError):
        none_hash("md5")


@pytest.mark.parametrize("bs", [0, -4])
def test_bad_block_size(bs: int) -> None:
    with pytest.raises(ConfigError, match="hash_block_size"):
        Request("r", [1], hash_block_size=bs)


def test_bad_extra_keys() -> None:
    with pytest.raises(TypeError):
        Request("r", [1], hash_block_size=1, lora=("only-name",))
    with pytest.raises(TypeError):
        Request("r", [1], hash_block_size=1, mm_features=[("id", 1)])
    with pytest.raises(ValueError, match="mm_features"):
        Request("r", [1], hash_block_size=1, mm_features=[("id", -1, 2)])
    with pytest.raises(TypeError):
        Request("r", [1], hash_block_size=1, cache_salt=b"bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- GIL


def test_long_prompt_releases_gil() -> None:
    """Another Python thread runs *during* one long hashing call."""
    toks = np.random.default_rng(0).integers(0, 200_000, size=1 << 20, dtype=np.uint32)
    inside, seconds = ticks_during(
        lambda: Request("long", toks, hash_block_size=16, hash_algo="sha256_cbor")
    )
    assert inside >= 5, (seconds, inside)


def test_supplied_hashes_are_the_callers_and_checked_all_or_nothing() -> None:
    """``hash_algo="supplied"``: kvcoord keys blocks by the caller's digests
    (e.g. vLLM's pickle ``sha256`` or hash-lookahead digests)."""
    r = kvcoord.Request("a", list(range(40)), hash_block_size=16, hash_algo="supplied")
    assert (r.hash_algo, r.num_block_hashes) == ("supplied", 0)
    r.supply_block_hashes([b"\x01" * 32])
    assert list(r.block_hashes) == [b"\x01" * 32] and r.digest_len == 32
    with pytest.raises(kvcoord.InvalidArgumentError, match="32 bytes"):
        r.supply_block_hashes([b"\x02" * 16])
    with pytest.raises(kvcoord.InvalidArgumentError, match="full blocks"):
        r.supply_block_hashes([b"\x02" * 32] * 2)
    with pytest.raises(kvcoord.InvalidHashError):
        r.supply_block_hashes([b"\x02" * 5])
    assert r.num_block_hashes == 1
    r.append_output_token_ids(list(range(8)))
    r.supply_block_hashes(np.full((2, 32), 3, dtype=np.uint8))
    assert r.block_hashes_bytes() == b"\x01" * 32 + b"\x03" * 64
    computed = kvcoord.Request("b", list(range(40)), hash_block_size=16)
    with pytest.raises(kvcoord.ConfigError, match="supplied"):
        computed.supply_block_hashes([b"\x01" * 32])
    assert computed.num_block_hashes == 2


def test_one_shot_hashing_refuses_supplied_digests() -> None:
    # Regression: compute_block_hashes(hash_algo="supplied") returned [] and
    # none_hash a meaningless root; nothing computes "supplied" digests.
    with pytest.raises(kvcoord.ConfigError, match="supplied"):
        kvcoord.compute_block_hashes(list(range(32)), hash_block_size=16, hash_algo="supplied")
    with pytest.raises(kvcoord.ConfigError, match="supplied"):
        kvcoord.none_hash("supplied")
