"""A tiny DeepSpeed check for CPU runs: deepspeed.initialize, one training step, an all-reduce.

Run by the deepspeed examples under either runner (the deepspeed launcher or
torchrun). The script takes DeepSpeed's own flags (``deepspeed.add_config_arguments``:
``--deepspeed --deepspeed_config PATH``) and ``--local_rank``, which only the
deepspeed launcher passes. Every rank prints one JSON line: what the launcher
gave it, what DeepSpeed made of ds_config.json, and the all-reduce result; if
DDP_CHECK_DIR is set it also writes that line to DDP_CHECK_DIR/rank-<RANK>.json.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import deepspeed
import deepspeed.comm as dist
import torch

ENV_INTS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_PORT",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--local_rank",
        type=int,
        default=None,
        help="set by the deepspeed launcher (not by torchrun)",
    )
    deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    local_rank_argument = args.local_rank

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # the config comes from --deepspeed_config (args), as DeepSpeed's own examples take it
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    rank, world = dist.get_rank(), dist.get_world_size()

    dtype = (
        torch.bfloat16
        if engine.bfloat16_enabled()
        else (torch.float16 if engine.fp16_enabled() else torch.float32)
    )
    inputs = torch.full((engine.train_micro_batch_size_per_gpu(), 4), float(rank), dtype=dtype)
    for _ in range(engine.gradient_accumulation_steps()):  # one optimizer step
        loss = engine(inputs.to(engine.device)).float().sum()
        engine.backward(loss)
        engine.step()

    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    assert total.item() == world * (world - 1) / 2, total

    report = {name: int(os.environ[name]) for name in ENV_INTS if name in os.environ}
    report.update(
        dist_rank=rank,
        dist_world_size=world,
        allreduce=total.item(),
        local_rank_argument=local_rank_argument,
        config_argument=args.deepspeed_config,
        deepspeed_flag=args.deepspeed,
        config_variable=os.environ.get("MDC_DEEPSPEED_CONFIG"),
        train_batch_size=engine.train_batch_size(),
        micro_batch_size=engine.train_micro_batch_size_per_gpu(),
        grad_accum_steps=engine.gradient_accumulation_steps(),
        dp_world_size=engine.dp_world_size,
        zero_stage=int(engine.zero_optimization_stage()),
        bf16=engine.bfloat16_enabled(),
        fp16=engine.fp16_enabled(),
        global_steps=engine.global_steps,
    )
    line = json.dumps(report, sort_keys=True)
    print(line, flush=True)
    if os.environ.get("DDP_CHECK_DIR"):
        Path(os.environ["DDP_CHECK_DIR"], f"rank-{rank}.json").write_text(line + "\n")
    # every rank is done before any closes its gloo connections: a peer still tearing
    # down when another's sockets close aborts ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.13's gloo can still abort the same way in interpreter finalization, after
    # everything is written (seen under load, with no Python frame left): skip it
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
