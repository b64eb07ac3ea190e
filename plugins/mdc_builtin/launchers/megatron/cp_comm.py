"""--cp-comm-type and --hierarchical-context-parallel-sizes: how context parallelism's
attention exchanges K and V (p2p ring, the default; a2a; all_gather; a2a+p2p, one type or
one per layer). Megatron-LM core_v0.16.1 refuses them on the conditions below, with these
texts (validate_args in megatron/training/arguments.py; TransformerConfig.__post_init__).
Transformer Engine checks more at run time (a2a's heads per tp rank divisible by cp, the
type's name); mdc does not, having no text of theirs to cite."""

from __future__ import annotations

import math
from collections.abc import Iterator

from mdc.api import Finding, Plan
from mdc_builtin.launchers.megatron.options import MegatronOptions, pointer_of

TYPES_KEY = "cp_comm_type"
SIZES_KEY = "hierarchical_context_parallel_sizes"


def cp_comm_rules(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    types, sizes, cp = (
        opts.cp_comm_type or (),
        opts.hierarchical_context_parallel_sizes,
        plan.sizes.cp,
    )
    if sizes and math.prod(sizes) != cp:
        yield Finding(
            code="MDC321",
            pointer=pointer_of(opts, SIZES_KEY),
            message=f"{SIZES_KEY} = {list(sizes)} whose product {math.prod(sizes)} is not "
            f"cp = {cp} (Megatron-LM: 'assert args.context_parallel_size == "
            "prod(args.hierarchical_context_parallel_sizes)')",
            hint=f"give sizes whose product is {cp} (a2a+p2p: the a2a size, then the p2p size)",
        )
    if "a2a+p2p" in types and not sizes:
        yield Finding(
            code="MDC321",
            pointer=pointer_of(opts, TYPES_KEY),
            message="cp_comm_type a2a+p2p without hierarchical_context_parallel_sizes "
            "(Megatron-LM: '--hierarchical-context-parallel-sizes must be set when a2a+p2p "
            "is used in cp comm')",
            hint=f"set {SIZES_KEY} (the a2a size, then the p2p size; product cp)",
        )
    layers = plan.model.num_layers if plan.model else None
    # one type is passed as a string; several are a list, one per layer (only with cp > 1)
    if cp > 1 and len(types) > 1 and layers is not None and len(types) != layers:
        yield Finding(
            code="MDC321",
            pointer=pointer_of(opts, TYPES_KEY),
            message=f"cp_comm_type has {len(types)} types for {layers} layers (Megatron-Core: "
            f"'Length of cp_comm_type ({len(types)}) should equal to the total number of "
            f"transformer layers ({layers})!')",
            hint="give one type for every layer, or a single type for all",
        )
