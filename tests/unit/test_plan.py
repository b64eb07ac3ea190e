"""The plan pass's rules, with the expected numbers worked out here rather than read back."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mdc.convert import structure_spec
from mdc.errors import Diagnostic, Severity, SourceLocation
from mdc.plan import Plan, build_plan
from mdc.runtime import PORT_RANGE


def job(
    *,
    nnodes: int | None = None,
    nproc: int | None = None,
    name: str = "unit",
    parallelism: dict[str, Any] | None = None,
    batch: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    **distributed: Any,
) -> dict[str, Any]:
    """Spec data as a loader hands it over: only the keys given are written."""
    dist = {"launcher": "torchrun", **distributed}
    if nnodes is not None:
        dist["nnodes"] = nnodes
    if nproc is not None:
        dist["nproc_per_node"] = nproc
    data: dict[str, Any] = {"job": {"name": name, "command": "train.py"}, "distributed": dist}
    for key, value in (("parallelism", parallelism), ("batch", batch), ("model", model)):
        if value is not None:
            data[key] = value
    return data


def plan_of(
    data: dict[str, Any],
    *,
    parallelism: str = "data",
    disaggregated: bool = False,
    serving: bool = False,
    scale_up_domain: int | None = None,
) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
    spec = structure_spec(data, {})
    return build_plan(
        spec,
        parallelism=parallelism,
        disaggregated=disaggregated,
        serving=serving,
        scale_up_domain=scale_up_domain,
        locate=lambda pointer: SourceLocation(path="job.toml", pointer=pointer),
    )


def built(data: dict[str, Any], **traits: Any) -> Plan:
    plan, diagnostics = plan_of(data, **traits)
    assert plan is not None, [d.render() for d in diagnostics]
    return plan


def codes(diagnostics: tuple[Diagnostic, ...]) -> list[str]:
    return [d.code for d in diagnostics]


def only(code: str, data: dict[str, Any], **traits: Any) -> Diagnostic:
    """The one diagnostic the spec gets (it must have exactly one, with this code)."""
    plan, diagnostics = plan_of(data, **traits)
    assert codes(diagnostics) == [code], [d.render() for d in diagnostics]
    if diagnostics[0].is_error:
        assert plan is None
    return diagnostics[0]


def listing(values: list[int]) -> str:
    return ", ".join(map(str, values))


def divisors_of(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- sizes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parallelism", "nnodes", "nproc", "tp", "pp"),
    [
        ("model", 2, 4, 4, 2),
        ("model", 4, 8, 8, 4),
        ("model", None, None, 1, 1),
        ("data", 2, 4, 1, 1),
        ("data", 4, 8, 1, 1),
    ],
)
def test_launcher_defaults(
    parallelism: str, nnodes: int | None, nproc: int | None, tp: int, pp: int
) -> None:
    plan = built(job(nnodes=nnodes, nproc=nproc), parallelism=parallelism)
    world = (nnodes or 1) * (nproc or 1)
    s = plan.sizes
    assert (s.tp, s.pp, s.cp, s.ep) == (tp, pp, 1, 1)
    assert s.dp == world // (tp * pp)
    assert s.etp == tp  # expert tp defaults to tp
    assert s.edp == world // (tp * pp)
    assert s.vpp is None


def test_written_sizes_override_the_model_parallel_defaults() -> None:
    plan = built(job(nnodes=2, nproc=8, parallelism={"tp": 2, "pp": 1}), parallelism="model")
    assert (plan.sizes.tp, plan.sizes.pp, plan.sizes.dp) == (2, 1, 16 // 2)


@pytest.mark.parametrize(
    ("nnodes", "nproc", "tp", "pp", "cp"),
    [
        (2, 8, 2, 2, 2),
        (4, 8, 8, 2, 1),
        (3, 4, 2, 3, 2),
        (1, 6, 1, 1, 3),
    ],
)
def test_dp_is_the_world_over_tp_pp_cp(nnodes: int, nproc: int, tp: int, pp: int, cp: int) -> None:
    dp = nnodes * nproc // (tp * pp * cp)
    par = {"tp": tp, "pp": pp, "cp": cp}
    assert built(job(nnodes=nnodes, nproc=nproc, parallelism=par)).sizes.dp == dp
    # writing the derived value is allowed
    assert built(job(nnodes=nnodes, nproc=nproc, parallelism={**par, "dp": dp})).sizes.dp == dp


def test_written_dp_must_agree() -> None:
    d = only("MDC202", job(nnodes=2, nproc=8, parallelism={"tp": 2, "pp": 2, "dp": 3}))
    assert d.location.pointer == "/parallelism/dp"
    assert "dp = 3" in d.message and "= 4" in d.message  # 16 / (2 * 2 * 1)
    assert d.hint is not None and "dp = 4" in d.hint


def test_world_not_divisible_lists_the_divisors_that_work() -> None:
    d = only("MDC201", job(nnodes=3, nproc=4, parallelism={"tp": 5}))
    assert d.location.pointer == "/parallelism/tp"
    assert "world size (12)" in d.message and "= 5" in d.message
    assert d.hint is not None and listing(divisors_of(12)) in d.hint


def test_world_not_divisible_blames_the_first_written_size() -> None:
    d = only("MDC201", job(nnodes=2, nproc=8, parallelism={"pp": 3, "tp": 2, "cp": 2}))
    # tp is blamed (first written); with pp * cp = 6 not dividing 16 there is no list
    assert d.location.pointer == "/parallelism/tp"
    assert d.hint is not None and "can be one of" not in d.hint


def test_world_not_divisible_names_the_launcher_defaults() -> None:
    d = only("MDC201", job(nnodes=2, nproc=4, parallelism={"cp": 3}), parallelism="model")
    assert d.location.pointer == "/parallelism/cp"
    assert d.hint is not None
    assert "tp = 4 (nproc_per_node)" in d.hint and "pp = 2 (nnodes)" in d.hint


# --- expert parallelism -------------------------------------------------------------------


def test_ep_need_not_divide_dp() -> None:
    plan = built(job(nproc=8, parallelism={"tp": 2, "cp": 2, "ep": 4, "etp": 1}))
    s = plan.sizes
    assert s.dp == 8 // (2 * 2) == 2
    assert s.ep % s.dp == 0 and s.dp % s.ep != 0
    assert s.edp == 8 // (1 * 4 * 1)
    # expert grid etp1 ep4 edp2: ep varies fastest, so EP groups are consecutive ranks
    assert list(plan.layout.groups("ep")) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert list(plan.layout.groups("expert-dp")) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_ep_with_etp_defaulting_to_tp() -> None:
    plan = built(job(nproc=16, parallelism={"tp": 2, "pp": 2, "cp": 2, "ep": 2}))
    s = plan.sizes
    assert s.etp == 2 and s.edp == 16 // (2 * 2 * 2)
    # rank = etp + 2 * (ep + 2 * (edp + 2 * pp)): EP groups have stride 2, like CP groups
    assert list(plan.layout.groups("ep")) == list(plan.layout.groups("cp"))


def test_expert_sizes_must_divide_the_world() -> None:
    d = only("MDC203", job(nproc=8, parallelism={"tp": 2, "ep": 3}))
    assert d.location.pointer == "/parallelism/ep"
    assert "etp * ep * pp = 2 * 3 * 1 = 6" in d.message
    assert d.hint is not None and listing(divisors_of(8 // 2)) in d.hint


def test_expert_sizes_hint_names_the_defaults_they_took() -> None:
    """ep = 8 on one node of 8 under a model-parallel launcher: tp took nproc_per_node and
    etp took tp, which the spec wrote neither of."""
    d = only("MDC203", job(nnodes=1, nproc=8, parallelism={"ep": 8}), parallelism="model")
    assert d.hint is not None
    assert "etp = 8 follows tp, tp = 8 is this launcher's default (nproc_per_node)" in d.hint
    written = only("MDC203", job(nproc=8, parallelism={"tp": 8, "etp": 8, "ep": 8}))
    assert written.hint is not None and "default" not in written.hint


def test_expert_tp_alone_not_dividing_points_at_etp() -> None:
    d = only("MDC203", job(nproc=8, parallelism={"etp": 3}))
    assert d.location.pointer == "/parallelism/etp"


# --- order --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("par", "axis"),
    [
        ({"tp": 2, "cp": 2, "order": "tp-dp-pp"}, "cp = 2"),
        ({"tp": 2, "ep": 2, "order": "tp-cp-dp-pp"}, "ep = 2"),
        ({"pp": 2, "order": "tp-cp-ep-dp"}, "pp = 2"),
        ({"tp": 8, "order": "cp-pp"}, "tp = 8"),
    ],
)
def test_order_must_place_every_axis_above_one(par: dict[str, Any], axis: str) -> None:
    d = only("MDC204", job(nproc=8, parallelism=par))
    assert d.location.pointer == "/parallelism/order"
    assert axis in d.message


def test_order_may_leave_out_size_one_axes() -> None:
    plan = built(job(nproc=8, parallelism={"tp": 2, "pp": 2, "order": "tp-pp-dp"}))

    # rank = tp + 2 * (pp + 2 * dp)
    def rank(tp: int, pp: int, dp: int) -> int:
        return tp + 2 * (pp + 2 * dp)

    expected_pp = [tuple(rank(t, p, d) for p in range(2)) for d in range(2) for t in range(2)]
    expected_dp = [tuple(rank(t, p, d) for d in range(2)) for p in range(2) for t in range(2)]
    assert list(plan.layout.groups("pp")) == expected_pp
    assert list(plan.layout.groups("dp")) == expected_dp


def test_order_must_not_repeat_an_axis() -> None:
    d = only("MDC212", job(nproc=8, parallelism={"tp": 2, "order": "tp-dp-tp-pp"}))
    assert d.location.pointer == "/parallelism/order"
    assert "'tp'" in d.message


@pytest.mark.parametrize(
    "par",
    [
        # pp not last and dp (8 / 4 = 2) != expert dp (8 / 2 = 4): megatron-core's pp-last assertion
        {"tp": 2, "pp": 2, "etp": 1, "order": "tp-cp-ep-pp-dp"},
        # the same when pp is followed only by a size-1 axis (the pipeline groups would agree)
        {"tp": 2, "pp": 2, "etp": 1, "order": "tp-cp-dp-pp-ep"},
        {"tp": 2, "pp": 2, "etp": 1, "order": "pp-tp-cp-ep-dp"},
    ],
)
def test_pp_not_last_needs_equal_data_parallel_sizes(par: dict[str, Any]) -> None:
    d = only("MDC205", job(nproc=8, parallelism=par))
    assert d.location.pointer == "/parallelism/order"
    assert "dp = 2" in d.message and "expert dp" in d.message and "= 4" in d.message


def test_pp_not_last_needs_the_same_pipeline_groups() -> None:
    # dp = expert dp = 2, but tp*ep = 2 precede pp in the dense layout and etp*ep = 4 in the
    # expert one, so the pipeline groups differ (megatron-core's second assertion)
    par = {"tp": 2, "cp": 2, "pp": 2, "ep": 2, "order": "tp-ep-pp-cp-dp"}
    d = only("MDC205", job(nproc=16, parallelism=par))
    assert "multiply to 2" in d.message and "to 4" in d.message


@pytest.mark.parametrize("order", ["tp-cp-ep-pp-dp", "tp-cp-dp-pp-ep"])
def test_pp_not_last_is_fine_when_both_layouts_agree(order: str) -> None:
    # etp * ep = tp * cp, so dp = expert dp and the same sizes precede pp
    plan = built(job(nproc=16, parallelism={"tp": 2, "cp": 2, "pp": 2, "etp": 4, "order": order}))
    assert list(plan.layout.groups("pp")) == [tuple(g) for g in plan.layout.expert.groups("pp")]


def test_vpp_needs_pipeline_parallelism() -> None:
    d = only("MDC206", job(nproc=8, parallelism={"vpp": 2}))
    assert d.location.pointer == "/parallelism/vpp"
    assert built(job(nproc=8, parallelism={"vpp": 1})).sizes.vpp is None
    assert built(job(nproc=8, parallelism={"pp": 2, "vpp": 2})).sizes.vpp == 2


# --- model shape --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("par", "model", "code", "pointer"),
    [
        ({"tp": 4}, {"num_attention_heads": 6}, "MDC220", "/model/num_attention_heads"),
        (
            {"tp": 4},
            {"num_attention_heads": 24, "num_query_groups": 6},
            "MDC221",
            "/model/num_query_groups",
        ),
        ({"pp": 4}, {"num_layers": 10}, "MDC222", "/model/num_layers"),
        ({"pp": 2, "vpp": 3}, {"num_layers": 8}, "MDC223", "/parallelism/vpp"),
        ({"ep": 2}, {"num_layers": 8}, "MDC224", "/model"),
        ({"ep": 4}, {"num_experts": 6}, "MDC224", "/model/num_experts"),
        ({"cp": 2}, {"seq_length": 4098}, "MDC225", "/model/seq_length"),
        (
            {},
            {"num_attention_heads": 12, "num_query_groups": 5},
            "MDC226",
            "/model/num_query_groups",
        ),
    ],
)
def test_model_rules(par: dict[str, Any], model: dict[str, Any], code: str, pointer: str) -> None:
    d = only(code, job(nproc=8, parallelism=par, model=model))
    assert d.location.pointer == pointer


@pytest.mark.parametrize(
    ("par", "model"),
    [
        ({"pp": 4}, {"num_layers": 10}),
        ({"pp": 2, "vpp": 3}, {"num_layers": 8}),
    ],
)
def test_serving_engines_split_layers_unevenly(par: dict[str, Any], model: dict[str, Any]) -> None:
    """The layers-per-stage rules (MDC222/223) are training's; a serving plan has none."""
    assert not plan_of(job(nproc=8, parallelism=par, model=model), serving=True)[1]
    assert plan_of(job(nproc=8, parallelism=par, model=model))[1]


@pytest.mark.parametrize(
    ("par", "model"),
    [
        ({"tp": 4}, {"num_attention_heads": 32, "num_query_groups": 8}),  # groups a multiple
        ({"tp": 4}, {"num_attention_heads": 32, "num_query_groups": 2}),  # groups a divisor
        ({"pp": 4}, {"num_layers": 12}),
        ({"pp": 2, "vpp": 3}, {"num_layers": 12}),  # 6 per stage
        ({"ep": 4}, {"num_experts": 8}),
        ({"cp": 2}, {"seq_length": 4096}),
        ({"cp": 1}, {"seq_length": 4097}),  # only checked for cp > 1
    ],
)
def test_model_shapes_that_fit(par: dict[str, Any], model: dict[str, Any]) -> None:
    plan, diagnostics = plan_of(job(nproc=8, parallelism=par, model=model))
    assert plan is not None and codes(diagnostics) == []


def test_model_rule_hints_list_what_would_fit() -> None:
    d = only("MDC220", job(nproc=8, parallelism={"tp": 4}, model={"num_attention_heads": 6}))
    assert d.hint is not None and listing(divisors_of(6)) in d.hint
    d = only("MDC223", job(nproc=8, parallelism={"pp": 2, "vpp": 3}, model={"num_layers": 8}))
    assert "8 / 2 = 4" in d.message
    assert d.hint is not None and listing([2, 4]) in d.hint


# --- batch --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nproc", "par", "micro", "total"),
    [
        (8, {}, 2, 64),
        (8, {"tp": 2, "cp": 2}, 4, 8),
        (16, {"tp": 4, "pp": 2}, 1, 6),
    ],
)
def test_accumulation_steps(nproc: int, par: dict[str, Any], micro: int, total: int) -> None:
    plan = built(
        job(
            nproc=nproc,
            parallelism=par,
            batch={"micro_batch_size": micro, "global_batch_size": total},
        )
    )
    dp = nproc // (par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1))
    assert plan.batch is not None
    assert plan.batch.grad_accum_steps == total // (micro * dp)
    assert plan.batch.grad_accum_steps * micro * dp == total


def test_global_batch_defaults_to_one_step() -> None:
    plan = built(job(nproc=8, parallelism={"tp": 2}, batch={"micro_batch_size": 3}))
    assert plan.batch is not None
    assert (plan.batch.global_batch_size, plan.batch.grad_accum_steps) == (3 * 4, 1)
    assert built(job(nproc=8)).batch is None


@pytest.mark.parametrize(
    ("micro", "total", "nearest"),
    [
        (2, 20, "16 or 32"),  # micro * dp = 16
        (1, 4, "8"),  # below one step: only the step itself
    ],
)
def test_global_batch_must_be_whole_steps(micro: int, total: int, nearest: str) -> None:
    d = only("MDC207", job(nproc=8, batch={"micro_batch_size": micro, "global_batch_size": total}))
    assert d.location.pointer == "/batch/global_batch_size"
    assert f"= {micro} * 8 = {micro * 8}" in d.message
    assert d.hint is not None and f"nearest valid global_batch_size is {nearest}" in d.hint


def test_with_sizes_invalid_only_micro_against_global_is_checked() -> None:
    batch = {"micro_batch_size": 4, "global_batch_size": 10}
    plan, diagnostics = plan_of(job(nproc=8, parallelism={"tp": 3}, batch=batch))
    assert plan is None
    assert sorted(codes(diagnostics)) == ["MDC201", "MDC207"]
    gas = next(d for d in diagnostics if d.code == "MDC207")
    assert "(10)" in gas.message and "(4)" in gas.message
    assert gas.hint is not None and listing(divisors_of(10)) in gas.hint
    # micro divides global: nothing more can be said without dp
    batch = {"micro_batch_size": 4, "global_batch_size": 12}
    _, diagnostics = plan_of(job(nproc=8, parallelism={"tp": 3}, batch=batch))
    assert codes(diagnostics) == ["MDC201"]


# --- nodes --------------------------------------------------------------------------------


def test_min_nnodes_above_nnodes() -> None:
    d = only("MDC208", job(nnodes=2, min_nnodes=3))
    assert d.location.pointer == "/distributed/min_nnodes"
    assert "(3)" in d.message and "(2)" in d.message


def test_elastic_range() -> None:
    plan = built(job(nnodes=4, min_nnodes=2))
    assert (plan.min_nnodes, plan.nnodes, plan.elastic) == (2, 4, True)
    assert built(job(nnodes=4)).elastic is False


def roles_by_node(plan: Plan) -> list[str]:
    return [plan.role_of(node).name for node in range(plan.nnodes)]


@pytest.mark.parametrize(
    ("nnodes", "prefill", "decode"),
    [
        # madengine's numbers (3: 1+1, 5: 1+3, 7: 2+4, 11: 4+6) on the servers' nodes, its
        # node count less the proxy's node: the router runs beside a server
        (4, 1, 3),
        (6, 2, 4),
        (10, 4, 6),
        (3, 1, 2),
    ],
)
def test_automatic_disaggregated_split(nnodes: int, prefill: int, decode: int) -> None:
    plan = built(job(nnodes=nnodes, nproc=8), disaggregated=True)
    assert plan.disagg is not None
    assert (plan.disagg.prefill, plan.disagg.decode, plan.disagg.origin) == (
        prefill,
        decode,
        "auto",
    )
    assert roles_by_node(plan) == ["prefill"] * prefill + ["decode"] * decode


def test_custom_disaggregated_split() -> None:
    plan = built(job(nnodes=5, prefill_nodes=3, decode_nodes=2), disaggregated=True)
    assert plan.disagg is not None and plan.disagg.origin == "spec"
    assert roles_by_node(plan) == ["prefill", "prefill", "prefill", "decode", "decode"]
    assert plan.role_of_name("decode").nodes == range(3, 5)


def test_disaggregated_on_one_or_two_nodes_splits_the_gpus() -> None:
    """Up to two nodes the servers share the nodes with the router; one GPU is too few."""
    plan, diagnostics = plan_of(job(nnodes=2, nproc=8), disaggregated=True)
    assert plan is not None and plan.disagg is not None and not diagnostics
    # 40% of the 16 GPUs rounded down prefill, the rest decode
    assert (plan.disagg.prefill, plan.disagg.decode, plan.disagg.unit) == (6, 10, "gpus")
    assert [(r.name, r.first_node, r.count) for r in plan.roles] == [("disagg", 0, 2)]
    d = only("MDC209", job(nnodes=1, nproc=1), disaggregated=True)
    assert d.location.pointer == "/distributed/nproc_per_node" and "= 1" in d.message
    plan, diagnostics = plan_of(job(nnodes=1, nproc=8), disaggregated=True)
    assert plan is not None and plan.disagg is not None and not diagnostics
    # 40% of the 8 GPUs rounded down prefill, the rest decode, every role on node 0
    assert (plan.disagg.prefill, plan.disagg.decode, plan.disagg.unit) == (3, 5, "gpus")
    assert [(r.name, r.first_node, r.count) for r in plan.roles] == [("disagg", 0, 1)]


@pytest.mark.parametrize("key", ["prefill_nodes", "decode_nodes"])
def test_disaggregated_split_needs_both_counts(key: str) -> None:
    counts: dict[str, Any] = {key: 2}
    d = only("MDC210", job(nnodes=5, **counts), disaggregated=True)
    assert d.location.pointer == f"/distributed/{key}"


def test_custom_split_must_add_up() -> None:
    d = only("MDC210", job(nnodes=6, prefill_nodes=2, decode_nodes=2), disaggregated=True)
    assert "prefill_nodes (2)" in d.message and "decode_nodes (2)" in d.message
    assert "nnodes (6)" in d.message and "got 4" in d.message
    assert d.location.pointer == "/distributed/prefill_nodes"
    # the layout that gave the router a node: nnodes is the one to change
    d = only("MDC210", job(nnodes=5, prefill_nodes=2, decode_nodes=2), disaggregated=True)
    assert d.location.pointer == "/distributed/nnodes" and "nnodes = 4" in (d.hint or "")


def test_split_keys_need_a_disaggregated_launcher() -> None:
    plan, diagnostics = plan_of(job(nnodes=4, prefill_nodes=1, decode_nodes=2))
    assert plan is None
    assert sorted((d.code, d.location.pointer) for d in diagnostics) == [
        ("MDC211", "/distributed/decode_nodes"),
        ("MDC211", "/distributed/prefill_nodes"),
    ]
    assert roles_by_node(built(job(nnodes=4))) == ["worker"] * 4


# --- rendezvous ---------------------------------------------------------------------------


def test_derived_master_port() -> None:
    names = ["alpha", "beta", "llama-70b", "llama-70b-2", "x"]
    ports = [built(job(name=name)).rendezvous for name in names]
    assert all(r.port_origin == "derived" for r in ports)
    assert all(PORT_RANGE[0] <= r.master_port < PORT_RANGE[1] for r in ports)
    assert PORT_RANGE == (20000, 30000)
    assert len({r.master_port for r in ports}) == len(names)
    # stable: the same name gives the same port on every build
    assert [built(job(name=name)).rendezvous for name in names] == ports


def test_explicit_master_port_is_kept() -> None:
    rendezvous = built(job(master_port=29500)).rendezvous
    assert (rendezvous.master_port, rendezvous.port_origin) == (29500, "spec")


# --- placement warnings -------------------------------------------------------------------


def spanned(diagnostic: Diagnostic) -> tuple[list[int], list[int]]:
    """The ranks and nodes a span warning names."""
    found = re.search(r"ranks ([\d, ]+)\) spans nodes ([\d, ]+):", diagnostic.message)
    assert found, diagnostic.message
    return ([int(r) for r in found[1].split(", ")], [int(n) for n in found[2].split(", ")])


@pytest.mark.parametrize(("nnodes", "nproc", "tp"), [(2, 4, 8), (3, 4, 3), (2, 8, 16)])
def test_tp_spanning_nodes_warns(nnodes: int, nproc: int, tp: int) -> None:
    plan, diagnostics = plan_of(job(nnodes=nnodes, nproc=nproc, parallelism={"tp": tp}))
    assert plan is not None
    (d,) = diagnostics
    assert (d.code, d.severity, d.location.pointer) == (
        "MDC250",
        Severity.WARNING,
        "/parallelism/tp",
    )
    assert plan.warnings == (d,)
    ranks, nodes = spanned(d)
    assert ranks == list(range(ranks[0], ranks[0] + tp)) and ranks[0] % tp == 0
    assert nodes == sorted({r // nproc for r in ranks}) and len(nodes) > 1


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_within_a_node_does_not_warn(tp: int) -> None:
    plan, diagnostics = plan_of(job(nnodes=2, nproc=4, parallelism={"tp": tp}))
    assert plan is not None and diagnostics == ()


def test_ep_spanning_nodes_warns() -> None:
    # expert grid etp8 ep2: an EP group is {r, r + 8}, on two nodes of 8
    plan, diagnostics = plan_of(job(nnodes=2, nproc=8, parallelism={"tp": 8, "ep": 2}))
    assert plan is not None
    (d,) = diagnostics
    assert (d.code, d.severity, d.location.pointer) == (
        "MDC251",
        Severity.WARNING,
        "/parallelism/ep",
    )
    ranks, nodes = spanned(d)
    assert ranks[1] - ranks[0] == 8 and nodes == [0, 1]


def test_groups_within_an_nvl72_rack_do_not_warn() -> None:
    # GB200 NVL72: 4 GPUs a node, 72 on one NVLink network; tp 8 and ep 72 span nodes
    # but not the rack, nor does ep 72, so their traffic stays on NVLink
    data = job(nnodes=18, nproc=4, parallelism={"tp": 8})
    assert plan_of(data)[1] and plan_of(data, scale_up_domain=72)[1] == ()
    data = job(nnodes=18, nproc=4, parallelism={"ep": 72})
    assert plan_of(data, scale_up_domain=72)[1] == ()


def test_a_group_wider_than_the_rack_warns_by_domain() -> None:
    # 36 nodes of 4 = two racks of 72; an ep group of 144 ranks covers both
    plan, diagnostics = plan_of(
        job(nnodes=36, nproc=4, parallelism={"ep": 144}), scale_up_domain=72
    )
    assert plan is not None
    (d,) = diagnostics
    assert d.code == "MDC251" and "spans scale-up domains (72 GPUs each) 0, 1:" in d.message


def test_a_domain_of_one_node_is_the_node_boundary() -> None:
    data = job(nnodes=2, nproc=8, parallelism={"tp": 16})
    assert plan_of(data, scale_up_domain=8)[1] == plan_of(data)[1] != ()


# --- scale --------------------------------------------------------------------------------


def test_a_million_ranks_without_enumerating() -> None:
    nnodes, nproc, TP, PP, CP = 131072, 8, 8, 16, 2
    world = nnodes * nproc
    DP = world // (TP * PP * CP)
    plan = built(
        job(nnodes=nnodes, nproc=nproc, parallelism={"tp": TP, "pp": PP, "cp": CP}),
        parallelism="model",
    )
    assert plan.world_size == world and plan.sizes.dp == DP == 4096
    assert plan.warnings == ()

    def rank(t: int, c: int, d: int, p: int) -> int:
        return t + TP * (c + CP * (d + DP * p))

    tp_groups, dp_groups, pp_groups = (plan.layout.groups(k) for k in ("tp", "dp", "pp"))
    assert (len(tp_groups), len(dp_groups), len(pp_groups)) == (
        world // TP,
        world // DP,
        world // PP,
    )
    for r in (0, 1, 9, 12345, 524287, 777777, world - 1):
        t, c, d, p = r % TP, r // TP % CP, r // (TP * CP) % DP, r // (TP * CP * DP)
        assert rank(t, c, d, p) == r
        tp_index = c + CP * (d + DP * p)
        assert tp_groups.index_of(r) == tp_index
        assert tp_groups[tp_index] == tuple(rank(i, c, d, p) for i in range(TP))
        dp_index = t + TP * (c + CP * p)
        assert dp_groups.index_of(r) == dp_index
        assert dp_groups[dp_index] == tuple(rank(t, c, i, p) for i in range(DP))
        pp_index = t + TP * (c + CP * d)
        assert pp_groups.index_of(r) == pp_index
        assert pp_groups[pp_index] == tuple(rank(t, c, d, i) for i in range(PP))


def test_a_serving_servers_tp_over_nodes_is_no_warning() -> None:
    """tp 16 on 2 x 8: training is warned (MDC250); a serving engine spans nodes by design
    (SGLang's --nnodes servers, vLLM over Ray)."""
    data = job(nnodes=2, nproc=8, parallelism={"tp": 16, "pp": 1})
    _, trained = plan_of(data, parallelism="model")
    assert "MDC250" in codes(trained)
    plan, served = plan_of(data, parallelism="model", serving=True)
    assert plan is not None and "MDC250" not in codes(served)


def test_a_serving_ep_below_tp_must_divide_it() -> None:
    """A serving engine splits an MoE layer's tp GPUs into ep x (tp / ep): ep 3 of tp 8 is
    refused as the engines refuse it (TensorRT-LLM's Mapping, SGLang's moe_tp_size), with the
    ep values that divide tp, not as a world size that etp x ep does not divide."""
    spec = job(nnodes=1, nproc=8, parallelism={"tp": 8, "ep": 3})
    d = only("MDC203", spec, parallelism="model", serving=True)
    assert d.location.pointer == "/parallelism/ep"
    assert "ep (3) does not divide tp (8)" in d.message and "moe_ep_size" in d.message
    assert (d.hint or "").startswith("ep can be one of 1, 2, 4, 8")
    # ep 4 of tp 8: moe_tp 2 x moe_ep 4 = 8, accepted
    assert built(job(nnodes=1, nproc=8, parallelism={"tp": 8, "ep": 4}), serving=True)
