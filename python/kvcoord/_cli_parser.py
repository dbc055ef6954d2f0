"""The ``kvcoord`` command's whole parser: ``replay`` and ``sweep``
(:mod:`kvcoord._cli_args`) and ``plan`` (:mod:`kvcoord._cli_plan_args`)."""

from __future__ import annotations

from kvcoord._cli_args import _add_version, _replay_sweep_parser
from kvcoord._cli_base import _Parser
from kvcoord._cli_plan_args import add_plan_parser

__all__ = ["_parser"]


def _parser() -> _Parser:
    p, sub = _replay_sweep_parser()
    plan = add_plan_parser(sub)
    p.commands["plan"] = plan
    _add_version(plan)
    return p
