"""mdc's rank groups against megatron-core's own ``RankGenerator`` and validation.

For every case of a grid of (world, tp, pp, cp, ep, etp, order), megatron-core's real
``initialize_model_parallel`` decides whether the sizes are accepted (torch.distributed is
faked and the run stops at the first process group it would create, i.e. after all of its
size and order checks). Accepted cases must give exactly megatron's groups for every kind;
rejected ones must be rejected by mdc's plan with the matching diagnostic.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import warnings
from collections.abc import Iterator
from math import gcd
from typing import NamedTuple
from unittest import mock

import pytest

from mdc.convert import structure_spec
from mdc.errors import Diagnostic, SourceLocation
from mdc.plan import GROUP_KINDS, Plan, build_plan

with warnings.catch_warnings():
    # megatron-core warns at import about Transformer Engine/Apex and torch.jit deprecations.
    warnings.simplefilter("ignore")
    pytest.importorskip(
        "megatron.core",
        reason="conformance needs megatron-core==0.16.1 and torch==2.13.0: run scripts/test",
    )
    import torch.distributed
    from megatron.core import parallel_state
    from megatron.core.parallel_state import RankGenerator

pytestmark = pytest.mark.torch

#: mdc group kind -> (megatron generator, get_ranks token), written out independently of
#: mdc's own GROUP_KINDS table.
MEGATRON_TOKENS = {
    "tp": ("dense", "tp"),
    "cp": ("dense", "cp"),
    "dp": ("dense", "dp"),
    "pp": ("dense", "pp"),
    "dp-cp": ("dense", "dp-cp"),
    "tp-pp": ("dense", "tp-pp"),
    "ep": ("expert", "ep"),
    "expert-tp": ("expert", "tp"),
    "expert-dp": ("expert", "dp"),
}

WORLDS = (1, 2, 4, 6, 8, 12, 16, 24)
#: Megatron's default, its --use-tp-pp-dp-mapping order, short orders leaving out size-1
#: axes, and permutations with pp first, in the middle, and not last.
ORDERS = (
    "tp-cp-ep-dp-pp",
    "tp-cp-ep-pp-dp",
    "tp-pp-dp",
    "tp-dp-pp",
    "cp-tp-ep-dp-pp",
    "tp-ep-cp-dp-pp",
    "dp-tp-cp-ep-pp",
    "tp-cp-pp-ep-dp",
    "tp-cp-dp-pp-ep",
    "pp-tp-cp-ep-dp",
)
#: Cases taken from each (world, order) bucket of the full divisor grid (~26,000 cases).
PER_BUCKET = 8
#: ... and from each bucket's cases whose order leaves out an axis of size > 1.
PER_BUCKET_UNPLACED = 2


class Case(NamedTuple):
    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    order: str

    @property
    def id(self) -> str:
        return (
            f"w{self.world}-tp{self.tp}-pp{self.pp}-cp{self.cp}-ep{self.ep}"
            f"-etp{self.etp}-{self.order}"
        )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def divisor_grid() -> Iterator[Case]:
    """Every case whose sizes divide the world (tp*pp*cp and etp*ep*pp), in every order."""
    for world in WORLDS:
        for tp in divisors(world):
            for pp in divisors(world // tp):
                for cp in divisors(world // (tp * pp)):
                    for etp in divisors(world // pp):
                        for ep in divisors(world // (pp * etp)):
                            for order in ORDERS:
                                yield Case(world, tp, pp, cp, ep, etp, order)


def non_dividing_grid() -> Iterator[Case]:
    """Small sizes where tp*pp*cp or etp*ep*pp does not divide the world (all axes ordered)."""
    sizes = (1, 2, 3, 4)
    for world in (4, 6, 8, 12):
        for tp, pp, cp, ep, etp in itertools.product(sizes, repeat=5):
            if (world % (tp * pp * cp) == 0) != (world % (etp * ep * pp) == 0):
                for order in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"):
                    yield Case(world, tp, pp, cp, ep, etp, order)


def places_its_axes(case: Case) -> bool:
    """Whether the order names every axis of size > 1 (used only to balance the sample)."""
    big = {
        axis
        for axis, size in (
            ("tp", case.tp),
            ("cp", case.cp),
            ("ep", case.ep),
            ("tp", case.etp),
            ("pp", case.pp),
        )
        if size > 1
    }
    dense_dp = case.world // (case.tp * case.pp * case.cp)
    expert_dp = case.world // (case.etp * case.ep * case.pp)
    if dense_dp > 1 or expert_dp > 1:
        big.add("dp")
    return big <= set(case.order.split("-"))


def spread(cases: list[Case], count: int) -> list[Case]:
    """``count`` cases evenly spaced through ``cases`` (all of them if fewer)."""
    step = max(1, len(cases) // count)
    return cases[::step][:count]


def sample() -> list[Case]:
    buckets: dict[tuple[int, str, bool], list[Case]] = {}
    for case in divisor_grid():
        buckets.setdefault((case.world, case.order, places_its_axes(case)), []).append(case)
    chosen = [
        case
        for (_, _, placed), cases in buckets.items()
        for case in spread(cases, PER_BUCKET if placed else PER_BUCKET_UNPLACED)
    ]
    return chosen + spread(list(non_dividing_grid()), 60)


class _Validated(Exception):
    """Raised instead of creating megatron's first process group: every check has passed."""


def _stop(*args: object, **kwargs: object) -> None:
    raise _Validated


def megatron_verdict(case: Case) -> str | None:
    """None if megatron-core's initialize_model_parallel accepts the case, else its error."""
    with contextlib.ExitStack() as stack:
        for name, fake in (
            ("is_initialized", lambda: True),
            ("get_world_size", lambda group=None: case.world),
            ("get_rank", lambda group=None: 0),
        ):
            stack.enter_context(mock.patch.object(torch.distributed, name, fake))
        stack.enter_context(mock.patch.object(parallel_state, "create_group", _stop))
        try:
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=case.tp,
                pipeline_model_parallel_size=case.pp,
                context_parallel_size=case.cp,
                expert_model_parallel_size=case.ep,
                expert_tensor_parallel_size=case.etp,
                order=case.order,
            )
        except _Validated:
            return None
        except (RuntimeError, AssertionError) as exc:
            return str(exc)
    raise AssertionError("initialize_model_parallel returned without creating a group")


#: megatron's error text -> the code mdc gives for the same rule.
EXPECTED_CODE = (
    (r"^world_size \(\d+\) is not divisible by \d+$", "MDC201"),
    (r"expert_tensor_model_pipeline_parallel size", "MDC203"),
    (r"but you haven'tspecified the order", "MDC204"),
    (r"When not using pp-last rank ordering", "MDC205"),
    (r"Pipeline parallel groups are expected to be the same", "MDC205"),
)


def expected_code(error: str) -> str:
    for pattern, code in EXPECTED_CODE:
        if re.search(pattern, error):
            return code
    raise AssertionError(f"unexpected megatron error: {error}")


def _classify() -> tuple[list[Case], list[tuple[Case, str]]]:
    accepted, rejected = [], []
    for case in sample():
        error = megatron_verdict(case)
        if error is None:
            accepted.append(case)
        else:
            rejected.append((case, error))
    return accepted, rejected


ACCEPTED, REJECTED = _classify()


def mdc_plan(case: Case) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
    nproc = gcd(case.world, 8)
    data = {
        "job": {"name": "conformance", "command": "train.py"},
        "distributed": {
            "launcher": "torchrun",
            "nnodes": case.world // nproc,
            "nproc_per_node": nproc,
        },
        "parallelism": {
            "tp": case.tp,
            "pp": case.pp,
            "cp": case.cp,
            "ep": case.ep,
            "etp": case.etp,
            "order": case.order,
        },
    }
    return build_plan(
        structure_spec(data, {}),
        parallelism="data",
        disaggregated=False,
        locate=lambda pointer: SourceLocation(path="job.toml", pointer=pointer),
    )


def megatron_groups(case: Case) -> dict[str, list[list[int]]]:
    dp = case.world // (case.tp * case.pp * case.cp)
    edp = case.world // (case.etp * case.ep * case.pp)
    generators = {
        "dense": RankGenerator(tp=case.tp, ep=1, dp=dp, pp=case.pp, cp=case.cp, order=case.order),
        "expert": RankGenerator(
            tp=case.etp, ep=case.ep, dp=edp, pp=case.pp, cp=1, order=case.order
        ),
    }
    return {
        kind: generators[grid].get_ranks(token) for kind, (grid, token) in MEGATRON_TOKENS.items()
    }


def test_every_kind_is_compared() -> None:
    assert set(MEGATRON_TOKENS) == set(GROUP_KINDS)


def test_grid_is_large_and_varied() -> None:
    assert len(set(ACCEPTED)) >= 200
    assert {c.order for c in ACCEPTED} == set(ORDERS)
    assert {c.world for c in ACCEPTED} == set(WORLDS)
    assert {expected_code(error) for _, error in REJECTED} == {
        "MDC201",
        "MDC203",
        "MDC204",
        "MDC205",
    }


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.id)
def test_groups_match_megatron(case: Case) -> None:
    plan, diagnostics = mdc_plan(case)
    assert plan is not None, [d.render() for d in diagnostics]
    for kind, expected in megatron_groups(case).items():
        got = [list(group) for group in plan.layout.groups(kind)]
        assert got == expected, kind


def crossing_groups(groups: list[list[int]], block: int) -> list[int]:
    """Brute force: the groups with ranks in more than one block of consecutive ranks."""
    return [i for i, group in enumerate(groups) if len({rank // block for rank in group}) > 1]


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.id)
def test_group_set_queries_match_enumeration(case: Case) -> None:
    """``index_of`` and ``group_crossing`` answer without enumerating; check them against it."""
    plan, _ = mdc_plan(case)
    assert plan is not None
    for kind, expected in megatron_groups(case).items():
        groups = plan.layout.groups(kind)
        for index, group in enumerate(expected):
            assert [groups.index_of(rank) for rank in group] == [index] * len(group), kind
        for block in range(1, case.world + 2):
            crossing = crossing_groups(expected, block)
            found = groups.group_crossing(block)
            if crossing:
                assert found in crossing, (kind, block)
            else:
                assert found is None, (kind, block)


@pytest.mark.parametrize(
    ("case", "error"), [pytest.param(case, error, id=case.id) for case, error in REJECTED]
)
def test_megatron_rejections_are_mdc_errors(case: Case, error: str) -> None:
    plan, diagnostics = mdc_plan(case)
    assert plan is None
    errors = [d for d in diagnostics if d.is_error]
    assert [d.code for d in errors] == [expected_code(error)], error
    assert all(d.location.pointer.startswith("/") for d in errors)
