"""What a vLLM engine runs on kvcoord: the ``KVCacheManager`` drop-in, its
construction (serve or fall back), the patch that switches it on, and the
translation of vLLM's objects (requests, hashes, blocks, events, views of the
pool, coordinator and single-type managers).

Nothing here imports :mod:`kvcoord.vllm.hisparse` or
:mod:`kvcoord.vllm.testing` (``tests/test_module_cycles.py`` checks it).
"""
