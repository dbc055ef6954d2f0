"""``vllm serve`` with kvcoord on, driven by a real OpenAI client over loopback.

One server of the tiny Llama (tokenizer included) with ``KVCOORD_VLLM=1
KVCOORD_VLLM_STRICT=1``: completions and chat, streamed and not, concurrent
requests sharing a prefix, prefix-cache hits visible in the server's
``/metrics``, and kvcoord's own log line saying it serves the engine.
"""

from __future__ import annotations

import concurrent.futures
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import MODEL, Server
from tiny_models import words

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(
    checkpoints: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    args = [
        "--dtype", "bfloat16", "--enforce-eager",
        "--block-size", "32", "--num-gpu-blocks-override", "64",
        "--max-model-len", "1024", "--max-num-seqs", "16",
        "--enable-prefix-caching",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with Server(checkpoints["llama"], args, log) as srv:
        srv.start()
        yield srv.base, log


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


SYSTEM = words(list(range(100, 260)))  # a 160-token shared prefix


def test_completions_chat_streaming_and_shared_prefix_hits(server: tuple[str, Path]) -> None:
    base, log = server
    client = _client(base)

    first = client.completions.create(
        model=MODEL, prompt=SYSTEM + " w7 w8", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert first.choices[0].text.split() and first.usage.completion_tokens == 8

    # The same request streamed gives the same text.
    pieces = client.completions.create(
        model=MODEL, prompt=SYSTEM + " w7 w8", max_tokens=8, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    streamed = "".join(c.choices[0].text for c in pieces if c.choices)
    assert streamed.split() == first.choices[0].text.split()

    # Concurrent requests sharing the prefix.
    def complete(i: int) -> str:
        out = client.completions.create(
            model=MODEL, prompt=f"{SYSTEM} w{300 + i} w{400 + i}", max_tokens=12,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return out.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(complete, range(16)))
    assert all(t.split() for t in texts)

    # Chat, streamed.
    chunks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": SYSTEM + " w9"}], max_tokens=6,
        temperature=0, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reply.split()

    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    hits = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    ]
    assert hits and sum(hits) >= 16 * 128, hits  # each concurrent request hit >= 4 blocks

    text = log.read_text()
    assert "kvcoord.vllm: serving the KV cache of this engine" in text
    assert (
        "strict"
        in text.split("kvcoord.vllm: serving the KV cache of this engine")[1].split("\n")[0]
    )
    assert "is not served by kvcoord" not in text
