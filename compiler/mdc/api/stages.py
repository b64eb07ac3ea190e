"""Helpers for plugins: the pipeline-split rules mdc applies, for a launcher's search.

Not part of the contract (:mod:`mdc.api`). The rules live with the plan
(:mod:`mdc.plan.stages`), which checks every split with them; a launcher asks the same
rule where it names the layouts ``mdc tune`` may try.
"""

from __future__ import annotations

from mdc.plan.stages import torchtitan_shares

__all__ = ["torchtitan_shares"]
