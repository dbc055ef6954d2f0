"""``kvcoord replay`` / ``kvcoord sweep``: a KV-cache capacity planner.

* :mod:`~kvcoord.replay.workloads` -- the bundled synthetic chat workload and trace readers;
* :mod:`~kvcoord.replay.layouts` -- layout presets and layout files;
* :mod:`~kvcoord.replay.models` -- the model table, HF config reading, bytes per token/block;
* :mod:`~kvcoord.replay.hardware` -- the GPU table;
* :mod:`~kvcoord.replay.timing` -- the roofline step-time model;
* :mod:`~kvcoord.replay.tiers` -- the host-memory tier;
* :mod:`~kvcoord.replay.plan` -- flags to one set-up (model, GPU, pool size, tiers);
* :mod:`~kvcoord.replay.bestcase` -- best possible hit rate with an unbounded cache;
* :mod:`~kvcoord.replay.scheduler` -- the simulated scheduler (the only module that
  touches ``KVCacheManager``);
* :mod:`~kvcoord.replay.report` / :mod:`~kvcoord.replay.plots` -- metrics, tables, plots.
"""
