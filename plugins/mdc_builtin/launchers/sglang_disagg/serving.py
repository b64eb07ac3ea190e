"""What the serving memory check reads: the tighter role's servers and the engine settings
in the servers' arguments."""

from __future__ import annotations

from typing import Any

import attrs

from mdc.api import Plan, ServingSetup, SglangServer, StepLimits
from mdc_builtin.launchers import sglang
from mdc_builtin.launchers.sglang_disagg.options import SglangDisaggOptions
from mdc_builtin.launchers.sglang_disagg.servers import Server, server


def step_limits(options: SglangDisaggOptions, shape: Server) -> StepLimits:
    """One role's per-step limits per DP attention rank: with DP attention SGLang divides
    --max-running-requests and --chunked-prefill-size by --dp-size (server_args.py). Its
    share as written, else its servers as SGLang's own share reads them."""
    values, _ = sglang.MEMORY_FLAGS.read([*options.server_args, *shape.args])
    ranks = shape.dp if shape.dp_attention else 1

    def per_rank(key: str) -> int | None:
        value = values.get(key)
        return None if value is None else max(1, value // ranks)

    share = values.get("share")
    return StepLimits(
        max_batch=per_rank("max_batch"),
        step_tokens=per_rank("step_tokens"),
        share=share,
        sglang=None if share is not None else sglang_server(shape, values),
    )


def sglang_server(shape: Server, values: dict[str, Any]) -> SglangServer:
    """A role's servers as SGLang's automatic --mem-fraction-static reads them: the sizes,
    DP attention ranks, and the limits as the flags write them."""
    return SglangServer(
        role=shape.role,
        tp=shape.tp,
        dp=shape.dp if shape.dp_attention else 1,
        chunked_prefill=values.get("step_tokens"),
        max_running=values.get("max_batch"),
    )


def serving(plan: Plan, options: SglangDisaggOptions | None) -> ServingSetup | None:
    """The tighter role's servers (fewer GPUs; decode on a tie) for the memory check."""
    if options is None or plan.disagg is None:
        return None
    shapes = [server(plan, options, role) for role in ("decode", "prefill")]
    shape = min(shapes, key=lambda s: s.gpus)
    values, _ = sglang.MEMORY_FLAGS.read([*options.server_args, *shape.args])
    decode, _ = sglang.MEMORY_FLAGS.read([*options.server_args, *shapes[0].args])
    share = values.get("share")
    ep = shape.expert_ranks
    setup = ServingSetup(
        engine=f"SGLang ({shape.role})",
        tp=shape.tp,
        ep=ep,
        etp=max(1, shape.tp // ep),
        kv_dtype=values.get("kv_dtype", "auto"),
        max_len=values.get("max_len"),
        roles={each.role: step_limits(options, each) for each in shapes},
        # the decode servers' (shapes[0]) steps are the ones a token waits for
        cuda_graphs=not decode.get("eager", False),
        graph_batch=sglang.graph_batch(decode),
    )
    if share is None:  # the estimate takes the share SGLang picks for these servers
        return attrs.evolve(setup, sglang=sglang_server(shape, values))
    return attrs.evolve(setup, share=share, share_source="--mem-fraction-static")
