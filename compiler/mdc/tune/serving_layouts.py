"""What each serving launcher can run on the spec's GPUs, and how a deployment is written in
its keys: the server layouts :class:`~mdc.tune.serving_search.ServingTuner` searches
(:data:`WRITERS`), the engine memory share in each engine's own words
(:func:`write_share`), and TensorRT-LLM's CUDA graphs where the spec leaves them to the
default (:func:`write_graphs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mdc.api.flags import FlagTable, KnownFlag, drop_flags
from mdc.tune.serving_records import Role


def _sizes(gpus: int, nproc: int) -> list[int]:
    """Server sizes: powers of two up to a node, then whole nodes (powers of two of them)."""
    out = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= nproc and nproc % s == 0]
    nodes = 2
    while nodes * nproc <= gpus:
        out.append(nodes * nproc)
        nodes *= 2
    return [s for s in out if s <= gpus]


def _server_roles(size: int, experts: int, name: str, servers: int) -> Iterator[Role]:
    """One server's layouts of ``size`` GPUs: tp over them all, with the experts over tp
    (ep = tp, where it divides the experts) and attention data parallel."""
    yield Role(name=name, servers=servers, gpus=size, tp=size)
    if _ep(experts, size):
        yield Role(name=name, servers=servers, gpus=size, tp=size, ep=size)
        yield Role(name=name, servers=servers, gpus=size, tp=size, ep=size, dp=size)


def _ep(experts: int, size: int) -> bool:
    """Whether ``size`` GPUs can split the experts evenly (expert parallel over them)."""
    return experts > 0 and size > 1 and experts % size == 0


def trtllm_deployments(gpus: int, nproc: int, experts: int) -> Iterator[tuple[Role, ...]]:
    """Aggregated replicas over every GPU, and context/generation servers packed over them
    (the prefill and decode templates: the search chooses their counts)."""
    for size in _sizes(gpus, nproc):
        if gpus % size == 0:
            yield from ((r,) for r in _server_roles(size, experts, "server", gpus // size))
    if gpus < 2:
        return
    for prefill_size in _sizes(gpus, nproc):
        for decode_size in _sizes(gpus, nproc):
            for p in _server_roles(prefill_size, experts, "prefill", 0):
                for d in _server_roles(decode_size, experts, "decode", 0):
                    yield p, d


def trtllm_write(data: dict[str, Any], roles: tuple[Role, ...]) -> None:
    table = data.setdefault("trtllm", {})
    for role in ("context", "generation"):
        table.pop(role, None)
    table.pop("enable_attention_dp", None)
    parallelism = data.setdefault("parallelism", {})
    for key in ("tp", "pp", "ep", "dp"):
        parallelism.pop(key, None)
    if len(roles) == 1:
        (r,) = roles
        parallelism.update({"tp": r.tp, "pp": r.pp, **({"ep": r.ep} if r.ep > 1 else {})})
        if r.dp > 1:
            table["enable_attention_dp"] = True
        if r.max_batch is not None:
            table["max_batch_size"] = r.max_batch
        if r.step_tokens is not None:
            table["max_num_tokens"] = r.step_tokens
        return
    if not parallelism:
        data.pop("parallelism")
    for r, name in zip(roles, ("context", "generation"), strict=True):
        table[name] = {
            "servers": r.servers,
            "tp_size": r.tp,
            **({"pp_size": r.pp} if r.pp > 1 else {}),
            **({"ep_size": r.ep} if r.ep > 1 else {}),
            **({"enable_attention_dp": True} if r.dp > 1 else {}),
            **({"max_batch_size": r.max_batch} if r.max_batch is not None else {}),
            **({"max_num_tokens": r.step_tokens} if r.step_tokens is not None else {}),
        }


def vllm_deployments(gpus: int, nproc: int, experts: int) -> Iterator[tuple[Role, ...]]:
    """vLLM behind one API server: dp engines of tp GPUs (experts over all of them)."""
    for tp in _sizes(gpus, nproc):
        if gpus % tp:
            continue
        dp = gpus // tp
        yield (Role(name="server", servers=1, gpus=gpus, tp=tp, dp=dp),)
        if _ep(experts, gpus):
            yield (Role(name="server", servers=1, gpus=gpus, tp=tp, dp=dp, ep=gpus),)


#: vLLM's per-step limits as the search writes them into [vllm] args (each engine's)
VLLM_LIMITS = FlagTable(
    [
        KnownFlag(name="--max-num-seqs", source="[vllm] args", key="max_batch", nargs=1),
        KnownFlag(
            name="--max-num-batched-tokens", source="[vllm] args", key="step_tokens", nargs=1
        ),
    ]
)


def vllm_write(data: dict[str, Any], roles: tuple[Role, ...]) -> None:
    (r,) = roles
    data["parallelism"] = {"tp": r.tp, "dp": r.dp, **({"ep": r.ep} if r.ep > 1 else {})}
    _write_limits(data.setdefault("vllm", {}), r)


def _write_limits(table: dict[str, Any], r: Role, flags: FlagTable = VLLM_LIMITS) -> None:
    """The role's per-step limits as the engine's ``flags`` at the end of ``table``'s args
    (the copies there replaced); SGLang's per DP attention rank, times the ranks (it divides
    them by --dp-size)."""
    args = list(table.get("args", []))
    _, uses = flags.read(args)
    args = drop_flags(args, uses)
    sglang = flags is SGLANG_LIMITS
    ranks = r.dp if sglang else 1
    names = (
        ("--max-running-requests", "--chunked-prefill-size")
        if sglang
        else ("--max-num-seqs", "--max-num-batched-tokens")
    )
    for name, value in zip(names, (r.max_batch, r.step_tokens), strict=True):
        if value is not None:
            args += [name, str(value * ranks)]
    if args:
        table["args"] = args


def _pd_sizes(gpus: int, nproc: int, nnodes: int) -> list[int]:
    """Server sizes of a launcher whose roles take whole nodes from 3 nodes on (the router
    has node 0): up to 2 nodes the servers share the nodes' GPUs."""
    if nnodes <= 2:
        return [s for s in _sizes(gpus, nproc) if s <= nproc]
    return [s for s in _sizes(gpus, nproc) if s % nproc == 0]


def sglang_disagg_deployments(gpus: int, nproc: int, experts: int) -> Iterator[tuple[Role, ...]]:
    """Prefill and decode server templates (their counts are searched): tp over the
    server, the experts over it (--ep-size) and DP attention (--dp-size = tp)."""
    nnodes = gpus // nproc
    sizes = _pd_sizes(gpus, nproc, nnodes)
    for ps in sizes:
        for ds in sizes:
            for p in _server_roles(ps, experts, "prefill", 0):
                for d in _server_roles(ds, experts, "decode", 0):
                    yield p, d


def vllm_disagg_deployments(gpus: int, nproc: int, experts: int) -> Iterator[tuple[Role, ...]]:
    """Prefill and decode server templates: tp engines inside a node, or dp engines of one
    GPU each with the experts over the server (--enable-expert-parallel)."""
    nnodes = gpus // nproc
    sizes = _pd_sizes(gpus, nproc, nnodes)

    def shapes(size: int, name: str) -> Iterator[Role]:
        if size <= nproc:
            yield Role(name=name, servers=0, gpus=size, tp=size)
            if _ep(experts, size):
                yield Role(name=name, servers=0, gpus=size, tp=size, ep=size)
        if _ep(experts, size):
            yield Role(name=name, servers=0, gpus=size, tp=1, dp=size, ep=size)

    for ps in sizes:
        for ds in sizes:
            for p in shapes(ps, "prefill"):
                for d in shapes(ds, "decode"):
                    yield p, d


def _split_keys(data: dict[str, Any], roles: tuple[Role, ...]) -> None:
    """[distributed] prefill_/decode_ nodes (3 nodes or more) or GPUs (up to 2)."""
    dist = data["distributed"]
    nproc = dist.get("nproc_per_node", 1)
    for key in ("prefill_nodes", "decode_nodes", "prefill_gpus", "decode_gpus"):
        dist.pop(key, None)
    whole = dist.get("nnodes", 1) >= 3
    for r in roles:
        gpus = r.servers * r.gpus
        if whole:
            dist[f"{r.name}_nodes"] = gpus // nproc
        else:
            dist[f"{r.name}_gpus"] = gpus


#: SGLang's per-step limits as the search writes them into a role's args
SGLANG_LIMITS = FlagTable(
    [
        KnownFlag(name="--max-running-requests", source="args", key="max_batch", nargs=1),
        KnownFlag(name="--chunked-prefill-size", source="args", key="step_tokens", nargs=1),
    ]
)


def _write_roles(
    data: dict[str, Any],
    launcher: str,
    roles: tuple[Role, ...],
    keys: Callable[[Role], dict[str, Any]],
    limits: FlagTable,
) -> None:
    """A split written in a disaggregated launcher's role tables: each role's sizes in its
    ``keys``, its limits as ``limits``' flags in its args."""
    _split_keys(data, roles)
    table = data.setdefault(launcher, {})
    for r in roles:
        own = table.setdefault(r.name, {})
        own.update(keys(r))
        _write_limits(own, r, limits)


def sglang_disagg_write(data: dict[str, Any], roles: tuple[Role, ...]) -> None:
    def keys(r: Role) -> dict[str, Any]:
        return {"tp_size": r.tp, "dp_size": r.dp, "enable_dp_attention": r.dp > 1, "ep_size": r.ep}

    _write_roles(data, "sglang_disagg", roles, keys, SGLANG_LIMITS)


def vllm_disagg_write(data: dict[str, Any], roles: tuple[Role, ...]) -> None:
    def keys(r: Role) -> dict[str, Any]:
        return {
            "tensor_parallel_size": r.tp,
            "data_parallel_size": r.dp,
            "enable_expert_parallel": r.ep > 1,
        }

    _write_roles(data, "vllm_disagg", roles, keys, VLLM_LIMITS)


#: each launcher's flag of its engine's memory share, written in a role's (or [vllm]'s) args
SHARE_FLAGS = {
    "vllm": "--gpu-memory-utilization",
    "vllm_disagg": "--gpu-memory-utilization",
    "sglang_disagg": "--mem-fraction-static",
}
#: TensorRT-LLM's names of the roles
TRTLLM_ROLES = {"server": None, "prefill": "context", "decode": "generation"}


def write_share(launcher: str, data: dict[str, Any], r: Role) -> None:
    """The role's engine memory share in the launcher's own words: vLLM's
    --gpu-memory-utilization and SGLang's --mem-fraction-static in the role's args (the
    copies there replaced); TensorRT-LLM's kv_cache_free_gpu_memory_fraction in [trtllm] or
    the role's table, or free_gpu_memory_fraction in the kv_cache_config of its LLM API
    options where the spec writes one (which replaces the command line's)."""
    assert r.share is not None
    if launcher == "trtllm":
        _write_trtllm_share(data.setdefault("trtllm", {}), TRTLLM_ROLES[r.name], r.share)
        return
    flag = SHARE_FLAGS[launcher]
    table = data.setdefault(launcher, {})
    if r.name != "server":
        table = table.setdefault(r.name, {})
    flags = FlagTable([KnownFlag(name=flag, source="args", key="share", nargs=1)])
    args = list(table.get("args", []))
    _, uses = flags.read(args)
    table["args"] = [*drop_flags(args, uses), flag, f"{r.share:g}"]


def _write_trtllm_share(table: dict[str, Any], role: str | None, share: float) -> None:
    own = table if role is None else table.setdefault(role, {})
    shared = (table.get("extra_llm_api_options") or {}).get("kv_cache_config")
    mine = (own.get("extra_llm_api_options") or {}).get("kv_cache_config")
    if isinstance(mine, dict) or isinstance(shared, dict):
        # a role's kv_cache_config replaces [trtllm]'s whole (its options file's update)
        config = {**(shared or {}), **(mine or {}), "free_gpu_memory_fraction": share}
        own.setdefault("extra_llm_api_options", {})["kv_cache_config"] = config
        return
    own["kv_cache_free_gpu_memory_fraction"] = share


#: (GPUs, GPUs per node, the model's experts) -> deployments (disaggregated: templates)
Generate = Callable[[int, int, int], Iterator[tuple[Role, ...]]]
Write = Callable[[dict[str, Any], tuple[Role, ...]], None]
#: launcher -> (its deployments of the GPUs, how a deployment is written in its keys)
WRITERS: Mapping[str, tuple[Generate, Write]] = {
    "trtllm": (trtllm_deployments, trtllm_write),
    "vllm": (vllm_deployments, vllm_write),
    "sglang_disagg": (sglang_disagg_deployments, sglang_disagg_write),
    "vllm_disagg": (vllm_disagg_deployments, vllm_disagg_write),
}


#: the flags that hand trtllm-serve an LLM API options file of the user's own
TRTLLM_OPTION_FILES = ("--extra_llm_api_options", "--config")
#: the least TensorRT-LLM's padded graphs the search writes reach: CudaGraphConfig's own
#: default largest batch
TRTLLM_GRAPHS_AT_LEAST = 128


def searches_graphs(launcher: str, data: object) -> bool:
    """Whether the search writes TensorRT-LLM's CUDA graphs itself: the spec runs its
    PyTorch backend and leaves ``cuda_graph_config`` to the default in [trtllm]'s and each
    role's LLM API options (graphs replayed only up to 32 requests a rank, unpadded), with
    no options file of its own in their args (whose settings mdc does not read)."""
    table = data.get("trtllm") if isinstance(data, Mapping) else None
    if launcher != "trtllm" or not isinstance(table, Mapping):
        return False
    roles = [table.get(role) for role in ("context", "generation")]
    tables = [table, *(t for t in roles if isinstance(t, Mapping))]
    for t in tables:
        args = [str(a).split("=", 1)[0] for a in t.get("args", [])]
        if "cuda_graph_config" in (t.get("extra_llm_api_options") or {}) or any(
            a in TRTLLM_OPTION_FILES or a == "--backend" for a in args
        ):
            return False
    return table.get("backend") in (None, "pytorch")


def write_graphs(data: dict[str, Any], roles: tuple[Role, ...], batch: Mapping[str, int]) -> None:
    """TensorRT-LLM's CUDA graphs padded up to the decode batch a rank the deployment runs
    (``batch``: each role's server's, as predicted; at least :data:`TRTLLM_GRAPHS_AT_LEAST`),
    in [trtllm]'s LLM API options, which each role's own options update: every decode step
    replays one."""
    decode = roles[-1]
    largest = max(TRTLLM_GRAPHS_AT_LEAST, -(-batch.get(decode.name, 0) // decode.dp))
    options = data.setdefault("trtllm", {}).setdefault("extra_llm_api_options", {})
    options["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": largest}
