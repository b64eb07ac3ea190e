"""The rank map as SVG (placeholder: being written)."""

from __future__ import annotations

from mdc.plan.model import Plan


def rank_map_svg(plan: Plan) -> str:
    raise NotImplementedError
