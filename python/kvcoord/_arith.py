"""Integer arithmetic the package shares, each rule written once."""

from __future__ import annotations

__all__ = ["cdiv"]


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up, for ``b > 0`` (vLLM's ``cdiv``): how many
    blocks of ``b`` tokens hold ``a`` tokens."""
    return -(-a // b)
