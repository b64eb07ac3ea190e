"""The plan pass and the resolved plan."""

from mdc.plan.build import auto_split, build_plan, derived_port
from mdc.plan.model import GROUP_KINDS, BatchPlan, DisaggSplit, NodeRole, Plan, RankLayout, Sizes

__all__ = [
    "GROUP_KINDS",
    "BatchPlan",
    "DisaggSplit",
    "NodeRole",
    "Plan",
    "RankLayout",
    "Sizes",
    "auto_split",
    "build_plan",
    "derived_port",
]
