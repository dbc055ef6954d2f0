"""``kvcoord replay`` / ``kvcoord sweep``: a KV-cache capacity planner.

* :mod:`~kvcoord.replay.workloads` -- the bundled synthetic chat workload and trace readers;
* :mod:`~kvcoord.replay.loads` -- random loads like ``vllm bench serve``'s (closed loops
  with ``SimConfig.max_concurrency``);
* :mod:`~kvcoord.replay.layouts` -- layout presets and layout files;
* :mod:`~kvcoord.replay.models` -- the model table, HF config reading, bytes per token/block;
* :mod:`~kvcoord.replay.hardware` -- the GPU table;
* :mod:`~kvcoord.replay.timing` -- the roofline step-time model;
* :mod:`~kvcoord.replay.tiers` -- the host-memory tier;
* :mod:`~kvcoord.replay.plan` -- flags to one set-up (model, GPU, pool size, tiers);
* :mod:`~kvcoord.replay.bestcase` -- best possible hit rate with an unbounded cache;
* :mod:`~kvcoord.replay.sim` -- a replay's configuration and raw result;
* :mod:`~kvcoord.replay.scheduler` -- the simulated scheduler and
  :mod:`~kvcoord.replay.pool` its manager (the only modules that touch
  ``KVCacheManager``); :mod:`~kvcoord.replay.running` -- the running
  requests' per-step bookkeeping in arrays;
* :mod:`~kvcoord.replay.sweep` -- the sweep's variants: named axes and their product;
* :mod:`~kvcoord.replay.report` / :mod:`~kvcoord.replay.plots` -- metrics, tables, plots;
  :mod:`~kvcoord.replay.overload` -- whether the deployment keeps up with its load.
"""
