"""``kvcoord plan``: the cheapest deployment that meets latency targets on a workload.

A candidate is one deployment: a GPU preset, a tensor-parallel degree, a
replica count, KV and weight dtypes, a host tier, a router and an eviction
policy (:mod:`.space`), priced per GPU-hour (:mod:`.prices`). The search
(:mod:`.search`) prunes in three stages, cheapest first:

1. **memory**: the weights, activation and a pool that holds the longest
   request fit on each GPU (the replay's own set-up,
   :func:`kvcoord.replay.plan.make_plan`);
2. **bounds** (:mod:`.bounds`): lower bounds on every request's TTFT and
   TPOT, and on the compute the workload needs, from the step-time model
   with the best possible (unbounded) prefix cache; a candidate whose bound
   already misses a target cannot meet it;
3. **replays** (:mod:`.evaluate`): exact replays of the survivors in cost
   order, in parallel processes (or Ray), each stopped as soon as so many
   requests have missed a target that the percentile must miss it; the
   search stops at the first candidate that meets every target, the
   cheapest that does.

:mod:`.report` words the answer (with the ``kvcoord replay`` command that
reproduces it), the table and the JSON; :mod:`.pareto` draws cost against
TTFT p90.
"""
