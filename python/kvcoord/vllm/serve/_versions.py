"""The vLLM releases ``kvcoord.vllm`` serves, and every difference between
them that kvcoord sees, each named by what differs.

The installed vLLM is read once (:func:`installed`); the rest of
``kvcoord.vllm`` asks the returned :class:`VllmApi` instead of comparing
version numbers. A release outside :data:`SUPPORTED` is refused with a
reason (:func:`unsupported_reason`); ``tests/kvcoord_vllm/test_api_drift.py``
checks each fact here against the installed vLLM's own signatures.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass

__all__ = ["MISSING", "SUPPORTED", "VllmApi", "available", "installed", "unsupported_reason"]

#: Release series served (``major.minor``), oldest first.
SUPPORTED: tuple[str, ...] = ("0.32", "0.33")

# vLLM 0.32's KVCacheManager constructor, by position.
_MANAGER_ARGS_032 = (
    "kv_cache_config",
    "max_model_len",
    "scheduler_block_size",
    "hash_block_size",
    "max_in_flight_tokens",
    "enable_caching",
    "use_eagle",
    "num_prefill_lookahead",
    "log_stats",
    "enable_kv_cache_events",
    "dcp_world_size",
    "pcp_world_size",
    "metrics_collector",
    "watermark",
    "enable_mamba_shared_prefix_checkpoint",
)
# vLLM 0.33 added hash lookahead after use_eagle.
_MANAGER_ARGS_033 = (*_MANAGER_ARGS_032[:7], "num_hash_lookahead_tokens", *_MANAGER_ARGS_032[7:])


@dataclass(frozen=True)
class VllmApi:
    """What kvcoord relies on that differs between served vLLM releases."""

    #: The installed release, as vLLM reports it (``vllm.__version__``).
    version: str
    #: ``KVCacheManager.__init__``'s parameters in order (0.33 added
    #: ``num_hash_lookahead_tokens``).
    manager_arg_names: tuple[str, ...]
    #: ``get_request_block_hasher`` takes ``num_hash_lookahead_tokens`` as a
    #: third argument (0.33); 0.32's takes two.
    hasher_takes_lookahead: bool
    #: EAGLE groups drop their last hit block only when ``use_eagle`` is set
    #: (0.33: hash lookahead clears it); in 0.32 every EAGLE group drops it.
    eagle_drop_needs_use_eagle: bool
    #: A Mamba state already keyed at the prompt's last hash-unit boundary
    #: is keyed there again (0.32; 0.33 skips it), so it counts as cached
    #: this step (``MambaManager._cache_partial_tail_block``).
    rekeys_keyed_prompt_tail: bool
    #: Under a retention interval EAGLE groups also retain the block below
    #: the shared-prefix junction (0.33, ``cache_blocks``; not 0.32).
    eagle_retains_block_below_junction: bool
    #: ``pop_blocks_for_free`` hands back a request's table as it is, its
    #: null blocks included (0.32; 0.33 trims the leading ones,
    #: ``trim_null_head``), and the caller frees them too.
    pops_null_blocks: bool
    #: ``get_computed_blocks`` takes ``max_cache_hit_length`` (0.33; 0.32's
    #: takes the request alone).
    lookup_takes_max_cache_hit_length: bool

    @property
    def series(self) -> str:
        return ".".join(self.version.split(".")[:2])


_API = {
    "0.32": dict(
        manager_arg_names=_MANAGER_ARGS_032,
        hasher_takes_lookahead=False,
        eagle_drop_needs_use_eagle=False,
        rekeys_keyed_prompt_tail=True,
        eagle_retains_block_below_junction=False,
        pops_null_blocks=True,
        lookup_takes_max_cache_hit_length=False,
    ),
    "0.33": dict(
        manager_arg_names=_MANAGER_ARGS_033,
        hasher_takes_lookahead=True,
        eagle_drop_needs_use_eagle=True,
        rekeys_keyed_prompt_tail=False,
        eagle_retains_block_below_junction=True,
        pops_null_blocks=False,
        lookup_takes_max_cache_hit_length=True,
    ),
}
assert tuple(_API) == SUPPORTED


def _series(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


#: What a caller is told when vLLM is not installed.
MISSING = "kvcoord.vllm needs vLLM 0.32.x or 0.33.0: pip install 'kvcoord[vllm]'"


def available() -> bool:
    """Whether vLLM can be imported here."""
    return importlib.util.find_spec("vllm") is not None


@functools.cache
def installed() -> VllmApi:
    """The installed vLLM's facts (read once). An unsupported release gets
    the newest supported release's facts; :func:`unsupported_reason` says
    it is not served. Without vLLM: ``ModuleNotFoundError`` saying so."""
    if not available():
        raise ModuleNotFoundError(MISSING, name="vllm")
    version = str(importlib.import_module("vllm").__version__)
    facts = _API.get(_series(version), _API[SUPPORTED[-1]])
    return VllmApi(version=version, **facts)  # type: ignore[arg-type]


def unsupported_reason() -> str | None:
    """Why the installed vLLM is not served, or None."""
    version = installed().version
    if _series(version) in SUPPORTED:
        return None
    return f"vLLM {version} (kvcoord.vllm serves {', '.join(s + '.x' for s in SUPPORTED)})"
