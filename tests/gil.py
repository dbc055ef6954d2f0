"""Checks that a call releases the GIL: another Python thread must run while
the call is in progress (it could not if the GIL were held throughout)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def ticks_during(call: Callable[[], object]) -> tuple[int, float]:
    """Run `call` while a second thread records timestamps; return how many
    it recorded strictly inside the call (edges excluded, where the main
    thread is still in Python) and the call's duration in seconds."""
    stamps: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.01)
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
    finally:
        stop.set()
        t.join()
    margin = (t1 - t0) * 0.1
    return sum(t0 + margin < s < t1 - margin for s in stamps), t1 - t0
