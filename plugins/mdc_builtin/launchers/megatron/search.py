"""What mdc tune may set in [megatron] besides the sizes: its search space.

The switches (sequence parallel, the optimizer's sharding, recompute, and the gradient and
parameter overlaps Megatron-LM leaves off by default) and its uneven pipeline splits.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from mdc.api import SearchSpace

#: the [megatron] keys that place layers on pipeline stages unevenly
SPLIT_KEYS = (
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)

#: selective recompute's module sets tried beside Megatron-Core's default (core_attn): each
#: reruns one more kind of GEMM for its activations; mdc tune keeps those that apply to the
#: model (mlp: dense MLP layers; moe, shared_experts: experts; mla_up_proj: multi-latent
#: attention). moe_act and layernorm rerun only elementwise kernels, which the model does
#: not charge: offered, they would look free, so they are held as written, never searched
RECOMPUTE_MODULE_SETS: tuple[tuple[str, ...], ...] = (
    ("core_attn", "mla_up_proj"),
    ("core_attn", "shared_experts"),
    ("core_attn", "mlp"),
    ("core_attn", "moe"),
)

OPTIMIZERS: tuple[dict[str, Any], ...] = (
    {"use_distributed_optimizer": True},
    {
        "use_distributed_optimizer": True,
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
    },
)


def switches(tp: int, chunk_layers: int, held: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The [megatron] training switches to try: sequence parallel, the optimizer's sharding
    (distributed optimizer or Megatron-FSDP) and recompute (none, selective with Megatron-
    Core's default modules or one more module (:data:`RECOMPUTE_MODULE_SETS`), full over
    every layer, or full over the first N layers of each model chunk), each with the overlaps
    Megatron-LM offers for free (off by default there).

    Dominated settings are not generated: without sequence parallel a layout moves the same
    tensor-parallel bytes and keeps more activations; without the distributed optimizer it
    moves the same gradient bytes (an all-reduce is a reduce-scatter and an all-gather) and
    keeps the whole optimizer state. A spec that holds them keeps them.
    """
    sps: list[bool | None] = [None]
    if tp > 1:
        sp = held.get("sequence_parallel")
        sps = [True if sp is None else sp]
    fixed = {
        k: held[k]
        for k in ("use_distributed_optimizer", "use_megatron_fsdp")
        if held.get(k) is not None
    }
    optimizers = [o for o in OPTIMIZERS if all(o.get(k, False) == v for k, v in fixed.items())]
    if fixed and not optimizers:
        optimizers = [fixed]
    full = {"recompute_granularity": "full", "recompute_method": "uniform"}
    recomputes: list[dict[str, Any]] = [
        {},
        {"recompute_granularity": "selective"},
        *(
            {"recompute_granularity": "selective", "recompute_modules": list(modules)}
            for modules in RECOMPUTE_MODULE_SETS
            if held.get("recompute_modules") is None
        ),
        {**full, "recompute_num_layers": 1},
    ]
    for part in sorted({chunk_layers // 4, chunk_layers // 2, 3 * chunk_layers // 4}):
        if 0 < part < chunk_layers:
            recomputes.append(
                {
                    "recompute_granularity": "full",
                    "recompute_method": "block",
                    "recompute_num_layers": part,
                }
            )
    if held.get("recompute_granularity") is not None:
        recomputes = [{}]  # held as written
    for sp, optimizer, recompute in itertools.product(sps, optimizers, recomputes):
        setting = {**optimizer, **recompute}
        if sp is not None:
            setting["sequence_parallel"] = sp
        setting["overlap_grad_reduce"] = True
        if gathers_params({**held, **setting}):
            setting["overlap_param_gather"] = True
        yield setting


def gathers_params(options: Mapping[str, Any]) -> bool:
    """Whether Megatron gathers sharded parameters itself, which --overlap-param-gather
    overlaps: the distributed optimizer and Megatron-FSDP do; PyTorch's FSDP2 gathers in its
    own hooks, and Megatron-LM refuses the flag beside it (MDC321)."""
    if options.get("use_megatron_fsdp"):
        return True
    return bool(options.get("use_distributed_optimizer")) and not options.get("use_torch_fsdp2")


def uneven_splits(layers: int, pp: int) -> list[dict[str, Any]]:
    """Megatron-LM's splits for layers that do not divide by pp: the embedding and/or the
    loss counted as a layer (--account-for-embedding/loss-in-pipeline-split) where that
    divides, and the middle stages at ceil(layers / pp) each with the rest on the first and
    last (--decoder-first/last-pipeline-num-layers)."""
    found: list[dict[str, Any]] = []
    for embedding, loss in ((True, True), (True, False), (False, True)):
        if (layers + embedding + loss) % pp == 0:
            found.append(
                {
                    k: True
                    for k, on in (
                        ("account_for_embedding_in_pipeline_split", embedding),
                        ("account_for_loss_in_pipeline_split", loss),
                    )
                    if on
                }
            )
            break
    middle = -(-layers // pp)
    if pp == 2:
        first, last = middle, layers - middle
    else:
        rest = layers - middle * (pp - 2)
        first, last = rest // 2, rest - rest // 2
    if first >= 1 and last >= 1 and max(first, last) <= middle:
        found.append(
            {
                "decoder_first_pipeline_num_layers": first,
                "decoder_last_pipeline_num_layers": last,
            }
        )
    return found


def interleaves(pp: int, vpp: int, held: Mapping[str, Any]) -> bool:
    """Megatron-LM runs the interleaved schedule on 2 stages only with the send overlap
    (MDC321), which is on unless overlap_p2p_comm = false."""
    return vpp == 1 or pp > 2 or held.get("overlap_p2p_comm") is not False


SEARCH = SearchSpace(
    switches=switches,
    split_keys=SPLIT_KEYS,
    uneven_splits=uneven_splits,
    interleaves=interleaves,
)
