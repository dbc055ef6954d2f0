"""What KV-cache events cost the scheduler: instructions per step with
``enable_events`` off and on (callgrind), and what the ZeroMQ publisher
sustains (events per second, wall clock).

    .venv/bin/python benches/instructions_events.py [--iterations N] [--no-publisher]

Two steps are counted, each with ``take_events()`` once per step when events
are on (what a publishing scheduler does):

* decode: 32 running requests each append one token and call
  ``allocate_slots`` (a block fills every 16 steps: one ``BlockStored``);
* churn: a 200-token request with a fresh prompt is admitted into a full
  pool (evicting 13 cached blocks: 13 ``BlockRemoved``) and the oldest is
  freed.

Each case runs the loop N times and 0 times and divides the difference, so
start-up and set-up cancel out.
"""

from __future__ import annotations

import argparse
import time

from callgrind import count, require_valgrind

SETUP = """
import sys, kvcoord
events = {events}
group = kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(16))
m = kvcoord.KVCacheManager(
    kvcoord.KVCacheConfig(num_blocks={blocks}, groups=(group,)),
    max_model_len=1 << 20, options=kvcoord.KVCacheManagerOptions(enable_events=events))
alloc = m.allocate_slots
"""

DECODE = """
reqs = [kvcoord.Request(f"r{{i}}", list(range(i * 1000, i * 1000 + 100)), hash_block_size=16)
        for i in range(32)]
for r in reqs:
    alloc(r, 100)
    r.num_computed_tokens = 100
m.take_events()
for step in range(int(sys.argv[1])):
    for r in reqs:
        r.append_output_token_ids(step)
        alloc(r, 1)
        r.num_computed_tokens += 1
    if events:
        m.take_events()
"""

CHURN = """
from collections import deque
live = deque()
def admit(i):
    r = kvcoord.Request(f"c{{i}}", list(range(i * 200, i * 200 + 200)), hash_block_size=16)
    alloc(r, 200)
    r.num_computed_tokens = 200
    live.append(r)
for i in range(30):  # fill the pool: 30 x 13 blocks, the rest cached once freed
    admit(i)
    if len(live) > 20:
        m.free(live.popleft())
m.take_events()
for step in range(int(sys.argv[1])):
    admit(100 + step)
    m.free(live.popleft())
    if events:
        m.take_events()
"""


def instructions(iterations: int) -> None:
    require_valgrind()
    print("instructions per step (callgrind), events off -> on (take_events each step)")
    for name, body, blocks, per_step in (
        ("decode, 32 requests", DECODE, 8192, 32),
        ("churn, 13 evictions", CHURN, 400, 1),
    ):
        res = []
        for events in (False, True):
            code = SETUP.format(events=events, blocks=blocks) + body.format()
            n = count(code, iterations) - count(code, 0)
            res.append(n / (iterations * per_step))
        unit = "per request-step" if per_step > 1 else "per step"
        print(f"  {name:22s} {res[0]:9,.0f} -> {res[1]:9,.0f} {unit} ({res[1] / res[0] - 1:+.1%})")


def publisher_throughput(num_steps: int = 2000) -> None:
    import zmq

    import kvcoord
    from kvcoord.events import ZmqEventPublisher

    m = kvcoord.KVCacheManager(
        kvcoord.KVCacheConfig(
            num_blocks=400, groups=(kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(16)),)
        ),
        max_model_len=1 << 20,
        options=kvcoord.KVCacheManagerOptions(enable_events=True),
    )
    batches = []
    live = []
    for i in range(num_steps):
        r = kvcoord.Request(f"c{i}", list(range(i * 200, i * 200 + 200)), hash_block_size=16)
        m.allocate_slots(r, 200)
        r.num_computed_tokens = 200
        live.append(r)
        if len(live) > 20:
            m.free(live.pop(0))
        batches.append(m.take_events())
    n_events = sum(len(b) for b in batches)
    with ZmqEventPublisher("tcp://127.0.0.1:0", bind=True, buffer_steps=num_steps) as pub:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        while not sub.poll(20):
            pub.publish([])
        while sub.poll(50):
            sub.recv_multipart()
        t0 = time.perf_counter()
        for b in batches:
            pub.publish(b)
        publish_s = time.perf_counter() - t0
        got = 0
        while got < num_steps and sub.poll(5000):
            sub.recv_multipart()
            got += 1
        total_s = time.perf_counter() - t0
        sub.close(linger=0)
    print(
        f"publisher: {num_steps} batches, {n_events} events "
        f"({n_events / num_steps:.1f}/batch): publish() {publish_s / num_steps * 1e6:.1f} us/batch "
        f"in the caller; received by a SUB socket over tcp at {n_events / total_s:,.0f} events/s "
        f"({num_steps / total_s:,.0f} batches/s); {got} batches received"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--no-publisher", action="store_true")
    parser.add_argument("--no-callgrind", action="store_true")
    args = parser.parse_args()
    if not args.no_callgrind:
        instructions(args.iterations)
    if not args.no_publisher:
        publisher_throughput()


if __name__ == "__main__":
    main()
