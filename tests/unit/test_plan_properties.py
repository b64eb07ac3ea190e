"""Properties of the plan pass over random sizes (no torch needed)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdc.convert import structure_spec
from mdc.errors import SourceLocation
from mdc.plan import GROUP_KINDS, Plan, build_plan

AXES = ("tp", "cp", "ep", "dp", "pp")
#: Plenty for properties of integer arithmetic, and quick on a 2-core CI runner.
FEW = settings(max_examples=80, deadline=None)


def locate(pointer: str) -> SourceLocation:
    return SourceLocation(path="job.toml", pointer=pointer)


def plan_for(
    data: dict[str, Any], parallelism: str = "data", disaggregated: bool = False
) -> tuple[Plan | None, tuple[Any, ...]]:
    spec = structure_spec(data, {})
    return build_plan(spec, parallelism=parallelism, disaggregated=disaggregated, locate=locate)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def valid_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """Sizes that divide the world, in an order with pp last (so dp and expert dp may differ)."""
    nnodes = draw(st.integers(1, 16))
    nproc = draw(st.sampled_from((1, 2, 3, 4, 8)))
    world = nnodes * nproc
    tp = draw(st.sampled_from(divisors(world)))
    pp = draw(st.sampled_from(divisors(world // tp)))
    cp = draw(st.sampled_from(divisors(world // (tp * pp))))
    etp = draw(st.sampled_from(divisors(world // pp)))
    ep = draw(st.sampled_from(divisors(world // (etp * pp))))
    order = "-".join([*draw(st.permutations(["tp", "cp", "ep", "dp"])), "pp"])
    dp = world // (tp * pp * cp)
    micro = draw(st.integers(1, 8))
    gas = draw(st.integers(1, 8))
    return {
        "job": {"name": "prop", "command": "train.py"},
        "distributed": {"launcher": "torchrun", "nnodes": nnodes, "nproc_per_node": nproc},
        "parallelism": {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "order": order},
        "batch": {"micro_batch_size": micro, "global_batch_size": gas * micro * dp},
    }


@pytest.mark.slow
@FEW
@given(valid_jobs())
def test_valid_sizes_give_a_plan_whose_groups_partition_the_world(data: dict[str, Any]) -> None:
    plan, diagnostics = plan_for(data)
    assert plan is not None, [d.render() for d in diagnostics]
    world = plan.world_size
    for kind in GROUP_KINDS:
        groups = plan.layout.groups(kind)
        listed = [list(group) for group in groups]
        assert groups.group_size * groups.count == world
        assert all(len(group) == groups.group_size for group in listed)
        assert sorted(rank for group in listed for rank in group) == list(range(world))


@FEW
@given(valid_jobs())
def test_sizes_multiply_to_the_world(data: dict[str, Any]) -> None:
    plan, _ = plan_for(data)
    assert plan is not None
    s = plan.sizes
    assert s.tp * s.pp * s.cp * s.dp == plan.world_size
    assert s.etp * s.ep * s.edp * s.pp == plan.world_size
    assert plan.layout.groups("tp").group_size == s.tp
    assert plan.layout.groups("dp-cp").group_size == s.dp * s.cp
    assert plan.layout.groups("ep").group_size == s.ep
    assert plan.layout.groups("expert-dp").group_size == s.edp


@FEW
@given(valid_jobs())
def test_accumulation_steps_times_micro_times_dp_is_the_global_batch(data: dict[str, Any]) -> None:
    plan, _ = plan_for(data)
    assert plan is not None and plan.batch is not None
    batch = plan.batch
    assert batch.grad_accum_steps >= 1
    assert (
        batch.grad_accum_steps * batch.micro_batch_size * plan.sizes.dp
        == batch.global_batch_size
        == data["batch"]["global_batch_size"]
    )


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def table(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A table with each field either left out or drawn."""
    return st.fixed_dictionaries({}, optional=fields)


SMALL = st.integers(1, 12)
#: Any order the schema's pattern allows: one to five axis names, repeats included.
ORDERS = st.lists(st.sampled_from(AXES), min_size=1, max_size=5).map("-".join)

ANY_JOB = st.fixed_dictionaries(
    {
        "job": st.just({"name": "fuzz", "command": "train.py"}),
        "distributed": st.fixed_dictionaries(
            {"launcher": st.just("torchrun")},
            optional={
                "nnodes": st.integers(1, 24),
                "nproc_per_node": st.integers(1, 16),
                "min_nnodes": st.integers(1, 24),
                "master_port": st.integers(1, 65535),
                "prefill_nodes": st.integers(1, 12),
                "decode_nodes": st.integers(1, 12),
            },
        ),
    },
    optional={
        "parallelism": table(
            tp=SMALL,
            pp=SMALL,
            cp=SMALL,
            ep=SMALL,
            etp=SMALL,
            vpp=SMALL,
            dp=st.integers(1, 64),
            order=ORDERS,
        ),
        "batch": table(global_batch_size=st.integers(1, 4096), micro_batch_size=st.integers(1, 64)),
        "model": table(
            num_layers=st.integers(1, 128),
            num_attention_heads=st.integers(1, 128),
            num_query_groups=st.integers(1, 64),
            seq_length=st.integers(1, 8192),
            num_experts=st.integers(1, 128),
        ),
    },
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(ANY_JOB, st.sampled_from(("model", "data")), st.booleans())
def test_build_plan_never_raises(
    data: dict[str, Any], parallelism: str, disaggregated: bool
) -> None:
    plan, diagnostics = plan_for(data, parallelism, disaggregated)
    for diagnostic in diagnostics:
        assert re.fullmatch(r"MDC\d{3}", diagnostic.code)
        assert diagnostic.location.pointer.startswith("/")
        assert diagnostic.message
        diagnostic.render()
    errors = [d for d in diagnostics if d.is_error]
    if plan is None:
        assert errors
    else:
        assert not errors
        assert plan.warnings == diagnostics
