"""Rules a scheduler must follow for some KV kinds (vLLM 0.33.0's scheduler
side), written once so that every driver of :class:`kvcoord.KVCacheManager`
(``kvcoord replay``, the conformance replayer, your own scheduler) splits
work the same way.

Mamba ``"align"`` mode caches a state only where a prefill chunk ends (or,
with prefill checkpoint blocks, in the reserved checkpoint block), so the
number of tokens scheduled for a request still in prefill must be clipped
with :func:`mamba_aligned_chunk` before calling ``allocate_slots``.
"""

from __future__ import annotations

from kvcoord._arith import cdiv
from kvcoord.config import KVCacheConfig, MambaSpec, as_arg
from kvcoord.errors import ArgumentTypeError

__all__ = ["MambaChunkRule", "mamba_aligned_chunk", "mamba_chunk_rule"]


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _checkpoint_position(num_tokens: int, unit: int) -> int:
    """The last multiple of ``unit`` strictly below ``num_tokens``."""
    return max(num_tokens - 1, 0) // unit * unit


def _checkpoint_valid(
    start: int, end: int, checkpoint: int, hash_block_size: int, block_size: int, alignment: int
) -> bool:
    """Whether the chunk ``[start, end)`` can export the state at
    ``checkpoint`` into the reserved block."""
    initial_col = (start - 1) // block_size  # -1 for a chunk starting at 0
    checkpoint_col = cdiv(end, block_size) - 2
    return (
        start % hash_block_size == 0
        and checkpoint_col > initial_col
        and start + hash_block_size <= checkpoint
        and start < checkpoint < end
        and (checkpoint - start) % alignment == 0
    )


def mamba_aligned_chunk(
    num_new_tokens: int,
    *,
    start: int,
    num_tokens: int,
    num_prompt_tokens: int,
    block_size: int,
    hash_block_size: int | None = None,
    checkpoint_blocks: bool = False,
    checkpoint_alignment: int | None = None,
    shared_prefix_boundary: int = 0,
    max_chunk_tokens: int | None = None,
) -> int:
    """Clip a chunk of ``num_new_tokens`` so that it ends where a Mamba
    ``"align"`` state must be cached (vLLM 0.33.0's block-aligned split).

    Args:
        num_new_tokens: tokens the request would get this step (its remaining
            tokens, capped by the step's token budget).
        start: the request's computed tokens plus the prefix-cache hit being
            admitted with this chunk.
        num_tokens: the request's tokens (prompt and outputs so far).
        num_prompt_tokens: its prompt length.
        block_size: the Mamba block size.
        hash_block_size: tokens per hash unit (default: ``block_size``).
        checkpoint_blocks: the Mamba spec has prefill checkpoint blocks.
        checkpoint_alignment: its ``prefill_checkpoint_alignment``.
        shared_prefix_boundary: the request's boundary from its last lookup
            (``request.shared_prefix_boundary``).
        max_chunk_tokens: the most tokens one prefill chunk may have; a block
            wider than that advances sub-block (default: no limit).

    Returns:
        The tokens to schedule, at most ``num_new_tokens``. 0 means: skip a
        running request this step, or stop admitting when it is a waiting one.
    """
    num_new_tokens = as_arg(num_new_tokens, "num_new_tokens")
    start = as_arg(start, "start")
    num_tokens = as_arg(num_tokens, "num_tokens")
    num_prompt_tokens = as_arg(num_prompt_tokens, "num_prompt_tokens")
    block_size = as_arg(block_size, "block_size", minimum=1, kind="u32")
    if hash_block_size is not None:
        hash_block_size = as_arg(hash_block_size, "hash_block_size", minimum=1, kind="u32")
    checkpoint_blocks = _flag(checkpoint_blocks, "checkpoint_blocks")
    if checkpoint_alignment is not None:
        checkpoint_alignment = as_arg(
            checkpoint_alignment, "checkpoint_alignment", minimum=1, kind="u32"
        )
    shared_prefix_boundary = as_arg(shared_prefix_boundary, "shared_prefix_boundary")
    if max_chunk_tokens is not None:
        max_chunk_tokens = as_arg(max_chunk_tokens, "max_chunk_tokens")
    unit = block_size if hash_block_size is None else hash_block_size
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    end = start + num_new_tokens
    last_cache_position = _checkpoint_position(num_tokens, block_size)
    checkpoint = _checkpoint_position(prefill_end, block_size)
    internal = (
        checkpoint_blocks
        and checkpoint_alignment is not None
        and end >= prefill_end
        and _checkpoint_valid(start, end, checkpoint, unit, block_size, checkpoint_alignment)
    )
    if internal:
        last_cache_position = 0
    if end < prefill_end:
        aligned_end = end // block_size * block_size
        if aligned_end > start or max_chunk_tokens is None or block_size <= max_chunk_tokens:
            end = aligned_end
    junction = shared_prefix_boundary
    stops = (
        (start // block_size + 1) * block_size if start % block_size and not internal else 0,
        last_cache_position,
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


class MambaChunkRule:
    """:func:`mamba_aligned_chunk` bound to one model's Mamba spec."""

    __slots__ = ("block_size", "checkpoint_alignment", "checkpoint_blocks", "hash_block_size")

    def __init__(self, spec: MambaSpec, hash_block_size: int) -> None:
        if not isinstance(spec, MambaSpec):
            raise ArgumentTypeError(f"spec must be a MambaSpec, got {type(spec).__name__}")
        self.block_size = spec.block_size
        self.hash_block_size = as_arg(hash_block_size, "hash_block_size", minimum=1, kind="u32")
        self.checkpoint_blocks = spec.num_prefill_checkpoint_blocks > 0
        self.checkpoint_alignment = spec.prefill_checkpoint_alignment

    def __call__(
        self,
        num_new_tokens: int,
        *,
        start: int,
        num_tokens: int,
        num_prompt_tokens: int,
        shared_prefix_boundary: int = 0,
        max_chunk_tokens: int | None = None,
    ) -> int:
        return mamba_aligned_chunk(
            num_new_tokens,
            start=start,
            num_tokens=num_tokens,
            num_prompt_tokens=num_prompt_tokens,
            block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            checkpoint_blocks=self.checkpoint_blocks,
            checkpoint_alignment=self.checkpoint_alignment,
            shared_prefix_boundary=shared_prefix_boundary,
            max_chunk_tokens=max_chunk_tokens,
        )


def mamba_chunk_rule(config: KVCacheConfig, hash_block_size: int) -> MambaChunkRule | None:
    """The chunk rule a scheduler must apply for this configuration: bound to
    its Mamba ``"align"`` group, or ``None`` when no group needs one."""
    if not isinstance(config, KVCacheConfig):
        raise ArgumentTypeError(f"config must be a KVCacheConfig, got {type(config).__name__}")
    hash_block_size = as_arg(hash_block_size, "hash_block_size", minimum=1, kind="u32")
    for g in config.groups:
        if isinstance(g.spec, MambaSpec) and g.spec.mamba_cache_mode == "align":
            return MambaChunkRule(g.spec, hash_block_size)
    return None
