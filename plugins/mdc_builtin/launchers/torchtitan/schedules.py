"""The torch.distributed.pipelining schedules TorchTitan runs, by how many stages each rank
holds (its checks and mdc tune's search space read them)."""

#: one stage per rank, or several ("looped")
SINGLE_STAGE = ("1F1B", "GPipe")
MULTI_STAGE = (
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
#: these need exactly two stages per rank ("ZBV requires exactly 2 stages per rank")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
