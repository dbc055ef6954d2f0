"""The search of ``kvcoord plan``: memory, then bounds, then exact replays in
cost order until the cheapest candidate that meets the targets is confirmed
(see :mod:`kvcoord.planner`)."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcoord._cli_base import UsageError
from kvcoord.planner.bounds import Targets, WorkloadFacts, candidate_bounds, workload_facts
from kvcoord.planner.evaluate import EvalShared, replay_candidate, verdict
from kvcoord.planner.prices import GpuPrice, price_of
from kvcoord.planner.space import Candidate, Engine, candidates_of

#: Replicas searched without --replicas: 1 to this.
DEFAULT_MAX_REPLICAS = 16

__all__ = ["Outcome", "Pruned", "SearchResult", "Space", "prune", "replay_survivors", "space_of"]


@dataclass
class Outcome:
    """A candidate and how far it got: ``stage`` is ``memory`` (does not fit),
    ``bounds`` (cannot meet the targets), ``rate`` (its engine set-up's measured
    service rate cannot carry the load), ``replayed`` (``result`` says how it
    did) or ``not replayed`` (costs more than the answer)."""

    candidate: Candidate | None
    stage: str
    reason: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    #: For a ``memory`` outcome: the engine that does not fit, and its candidates.
    engine: Engine | None = None
    count: int = 1


@dataclass
class SearchResult:
    targets: Targets
    outcomes: list[Outcome]
    chosen: Outcome | None
    facts: WorkloadFacts
    considered: int

    def of_stage(self, stage: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.stage == stage]


@dataclass
class Space:
    engines: list[Engine]
    replicas: list[int]
    hosts: list[float]
    routers: list[str]
    evictions: list[str]


def space_of(args: argparse.Namespace, gpus: list[str]) -> Space:
    """The search space the flags ask for (``gpus`` already checked and priced)."""
    kvs = args.kv_dtype or [None]
    wds = args.weight_dtype or [None]
    engines = [
        Engine(g, tp, kv, wd) for g, tp, kv, wd in itertools.product(gpus, args.tp, kvs, wds)
    ]
    replicas = args.replicas or list(range(1, DEFAULT_MAX_REPLICAS + 1))
    if args.concurrency is not None:
        if args.replicas is not None and max(args.replicas) > 1:
            raise UsageError(
                "--concurrency caps the clients of one engine; --replicas puts engines behind "
                "a router (a cap over a cluster is not modelled): give one or the other"
            )
        replicas = [1]
    return Space(engines, replicas, list(args.host_memory), list(args.router), list(args.eviction))


@dataclass
class Pruned:
    """The search after the memory and bound stages."""

    outcomes: list[Outcome]
    #: Candidates that may meet the targets, in the order they are replayed.
    survivors: list[Candidate]
    facts: WorkloadFacts
    considered: int

    def describe(self, targets: Targets) -> str:
        n_mem = sum(1 for o in self.outcomes if o.stage == "memory" and o.candidate is not None)
        n_mem += sum(o.count for o in self.outcomes if o.stage == "memory" and o.candidate is None)
        return (
            f"plan: {self.considered:,} candidates; {self.considered - n_mem:,} fit in memory "
            f"(weights, activation and the longest request); {len(self.survivors):,} can meet "
            f"{targets.describe()} by the bounds; replaying them cheapest first"
        )


def prune(
    args: argparse.Namespace,
    st: Any,
    targets: Targets,
    prices: dict[str, GpuPrice],
    price_source: str,
    space: Space,
) -> Pruned:
    """The memory and bound stages; the survivors sorted by cost, then by how
    far their bounds are from the targets, then as enumerated."""
    from kvcoord._cli_setup import _plan

    outcomes: list[Outcome] = []
    survivors: list[Candidate] = []
    facts: dict[int, WorkloadFacts] = {}  # by the layout's block size
    considered = 0
    closed = args.concurrency is not None

    def facts_for(block_size: int) -> WorkloadFacts:
        if block_size not in facts:
            facts[block_size] = workload_facts(st.workload, block_size, args.time_scale, closed)
        return facts[block_size]

    for engine in space.engines:
        usd = price_of(prices, engine.gpu, price_source).usd_per_gpu_hour
        try:
            plan = _plan(args, st, **engine.plan_options())
        except UsageError as e:
            n = len(candidates_of(engine, space.replicas, space.hosts, space.routers,
                                  space.evictions, usd, ("", ""), 0))  # fmt: skip
            considered += n
            outcomes.append(Outcome(None, "memory", str(e), engine=engine, count=n))
            continue
        names = (plan.model.kv_dtype, plan.model.weight_dtype)
        cands = candidates_of(engine, space.replicas, space.hosts, space.routers,
                              space.evictions, usd, names, considered)  # fmt: skip
        considered += len(cands)
        for host in space.hosts:
            if host:
                try:
                    _plan(args, st, **{**engine.plan_options(), "host_memory": host})
                except UsageError as e:
                    outcomes += [
                        Outcome(c, "memory", str(e)) for c in cands if c.host_bytes == host
                    ]
                    cands = [c for c in cands if c.host_bytes != host]
        wf = facts_for(plan.layout.block_size)
        for c in cands:
            b = candidate_bounds(wf, plan.step_model, c.replicas, targets)
            c.bound.update(b)
            if b["misses"] is not None:
                outcomes.append(Outcome(c, "bounds", b["misses"]))
            else:
                survivors.append(c)
    survivors.sort(key=lambda c: (round(c.usd_per_hour, 9), c.bound["ratio"], c.order))
    wf = next(iter(facts.values())) if facts else facts_for(16)
    return Pruned(outcomes, survivors, wf, considered)


#: A candidate is not replayed when its replicas times the best service rate
#: measured on the same engine set-up (any replica count), times this, is still
#: below the offered rate: more replicas share a trace's prefixes differently,
#: so the rate per replica may grow with their count, but not by this much.
RATE_SLACK = 1.25


def _engine_key(c: Candidate) -> tuple[Any, ...]:
    return (c.engine, c.host_bytes, c.eviction)


def replay_survivors(
    pruned: Pruned,
    args: argparse.Namespace,
    st: Any,
    targets: Targets,
    executor: Any,
    say: Callable[[str], None],
    bar: Callable[[int], Any] | None = None,
) -> SearchResult:
    """The replays, cheapest first, up to the first that meets every target;
    before each, a candidate whose engine set-up's measured service rate
    (from the replays before it) cannot carry the offered load is set aside
    (:data:`RATE_SLACK`). ``say`` gets a line per replay, ``bar`` a count.

    The outcome is that of replaying one candidate after another; the
    executor's session (``jobs`` at a time) runs the candidates after the
    one awaited ahead of their turn (as many as it has slots), and a result is taken in its turn:
    one that the rates measured before it would have set aside is dropped,
    and nothing after a candidate known to meet the targets is started."""
    outcomes = list(pruned.outcomes)
    chosen: Outcome | None = None
    facts = pruned.facts
    span = float(facts.arrival.max() - facts.arrival.min()) if facts.n else 0.0
    offered = (facts.n - 1) / span if span > 0 and not facts.closed_loop else None
    # measured rates of the candidates taken so far (a rate only grows, so a
    # candidate set aside now is set aside in its turn too)
    rates: dict[tuple[Any, ...], float] = {}
    cands = pruned.survivors

    def rate_short(c: Candidate) -> str | None:
        mu = rates.get(_engine_key(c))
        if offered is None or mu is None or c.replicas * mu * RATE_SLACK >= offered:
            return None
        return (
            f"sustains about {c.replicas * mu:,.3g} req/s ({mu:,.3g} per replica, "
            f"measured), below the offered {offered:,.3g} req/s"
        )

    turn = 0  # the candidate whose outcome is next
    ahead = 0  # the next candidate to start ahead of its turn
    started: set[int] = set()
    running = 0
    finished: dict[int, dict[str, Any]] = {}
    first_meets = len(cands)  # the first candidate known to meet the targets
    session = executor.session(replay_candidate, EvalShared(args, st, targets))
    try:
        while turn < len(cands):
            c = cands[turn]
            short = rate_short(c)
            if short is not None:
                outcomes.append(Outcome(c, "rate", short))
                finished.pop(turn, None)
                turn += 1
                if bar is not None:
                    bar(1)
                continue
            if turn in finished:
                r = finished.pop(turn)
                say(f"plan: {c.label()} at ${c.usd_per_hour:,.2f}/h: {verdict(r)}")
                if bar is not None:
                    bar(1)
                o = Outcome(c, "replayed", r.get("missed"), r)
                outcomes.append(o)
                mu = r.get("capacity_rps_per_replica")
                if mu is not None:
                    key = _engine_key(c)
                    rates[key] = max(rates.get(key, 0.0), mu)
                turn += 1
                if r["status"] == "meets":
                    chosen = o
                    break
                continue
            if turn not in started:
                session.submit(turn, c)
                started.add(turn)
                running += 1
            ahead = max(ahead, turn + 1)
            while running < session.slots and ahead < first_meets:
                if rate_short(cands[ahead]) is None:
                    session.submit(ahead, cands[ahead])
                    started.add(ahead)
                    running += 1
                ahead += 1
            key, r = session.wait()
            running -= 1
            finished[key] = r
            if r["status"] == "meets":
                first_meets = min(first_meets, key)
    finally:
        session.close()
    for c in cands[turn:]:
        outcomes.append(Outcome(c, "not replayed", "costs more than the deployment chosen"))
    return SearchResult(targets, outcomes, chosen, pruned.facts, pruned.considered)
