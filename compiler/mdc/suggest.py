"""Did-you-mean for a value or key that is not one of the allowed ones.

A user writes what other tools call the thing: ``SLURM``, ``k8s``, ``bfloat16``,
``megatron-lm``. Case, ``-``/``_`` and a few well-known other names are matched before
falling back to spelling distance.
"""

from __future__ import annotations

from collections.abc import Iterable

#: other names users give mdc's values (normalized: lowercase, no "-", "_" or spaces)
ALIASES: dict[str, str] = {
    "k8s": "kubernetes",
    "kube": "kubernetes",
    "lws": "leaderworkerset",
    "kubeflow": "pytorchjob",
    "trainerv2": "trainjob",
    "megatronlm": "megatron",
    "megatroncore": "megatron",
    "mcore": "megatron",
    "titan": "torchtitan",
    "torchdistributed": "torchrun",
    "ddp": "torchrun",
    "ds": "deepspeed",
    "slurmmulti": "basic",
    "bfloat16": "bf16",
    "bfloat": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "single": "fp32",
    "float8": "fp8",
    "cuda": "nvidia",
    "rocm": "amd",
    "hip": "amd",
}


def _normal(word: str) -> str:
    return "".join(c for c in word.lower() if c not in "-_ ")


def did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.75) -> str | None:
    """The choice ``word`` most likely means, or None.

    Same letters up to case and ``-``/``_``, then a known other name, then the closest
    spelling (difflib, case-insensitive) at ``cutoff``: high enough that "gpu" does not
    suggest "cpu".
    """
    options = list(choices)
    normal = {_normal(c): c for c in options}
    key = _normal(word)
    if key in normal:
        return normal[key]
    alias = ALIASES.get(key)
    if alias is not None and alias in options:
        return alias
    lowered = {c.lower(): c for c in options}
    import difflib  # only a spec with a mistake gets this far

    near = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[near[0]] if near else None
