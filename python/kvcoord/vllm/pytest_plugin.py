"""``pytest -p kvcoord.vllm.pytest_plugin``: runs vLLM's own tests with kvcoord
as the KV-cache manager. This module is the plugin's name on the command
line; pytest loads the plugin itself, :mod:`kvcoord.vllm.testing.pytest_plugin`,
through ``pytest_plugins``."""

pytest_plugins = ["kvcoord.vllm.testing.pytest_plugin"]
