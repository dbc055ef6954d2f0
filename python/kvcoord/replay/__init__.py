"""``kvcoord replay``: a KV-cache workload simulator.

* :mod:`~kvcoord.replay.workloads` -- the bundled synthetic chat workload and trace readers;
* :mod:`~kvcoord.replay.layouts` -- layout presets and layout files;
* :mod:`~kvcoord.replay.bestcase` -- best possible hit rate with an unbounded cache;
* :mod:`~kvcoord.replay.scheduler` -- the simulated scheduler (the only module that
  touches ``KVCacheManager``);
* :mod:`~kvcoord.replay.report` -- metrics, tables, plots.
"""
