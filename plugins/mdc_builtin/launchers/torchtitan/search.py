"""What mdc tune may set in [torchtitan] besides the sizes: its search space.

FSDP2 always shards (TorchTitan's data_parallel_shard_degree takes the remaining ranks) and
tensor parallelism always splits the sequence, so the switch left to choose is activation
checkpointing ([torchtitan.config.activation_checkpoint] mode). The local batch (mdc's
[batch] micro_batch_size) runs as pipeline microbatches, so larger ones are tried than for
a launcher whose micro batch is the pipeline's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mdc.api import SearchSpace
from mdc_builtin.launchers.torchtitan.schedules import SINGLE_STAGE, V_SHAPED

MODE = "config.activation_checkpoint.mode"
OPTION = "config.activation_checkpoint.selective_ac_option"

#: none; per-op selective (the attention core and the matmuls it lists are kept); full
CHECKPOINTING: tuple[dict[str, Any], ...] = (
    {MODE: "none"},
    {MODE: "selective", OPTION: "op"},
    {MODE: "full"},
)


def switches(tp: int, chunk_layers: int, held: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The activation-checkpointing modes (held as written when the spec sets one)."""
    if held.get(MODE) is not None:
        yield {}
        return
    for setting in CHECKPOINTING:
        yield dict(setting)


def interleaves(pp: int, vpp: int, held: Mapping[str, Any]) -> bool:
    """A held schedule fixes the stages per rank: one for 1F1B and GPipe, two for the
    V-shaped ones (MDC336)."""
    schedule = held.get("pipeline_schedule")
    if schedule in SINGLE_STAGE:
        return vpp == 1
    if schedule in V_SHAPED:
        return vpp in (1, 2)
    return True


SEARCH = SearchSpace(switches=switches, interleaves=interleaves, micro_batches=(1, 2, 4, 8, 16, 32))
