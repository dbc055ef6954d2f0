"""kvcoord under vLLM's own tests: the pytest plugin
(``pytest -p kvcoord.vllm.pytest_plugin``), the rule deciding which tests get
kvcoord's stand-ins (``_lending``), and the stand-ins themselves: vLLM's
``BlockPool`` (``_pool``) and the hit search of its single-type managers
(``_hit_search``). An engine never imports this package.
"""
