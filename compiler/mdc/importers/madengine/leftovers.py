"""The report on what is left once every block is translated: known keys dropped with
madengine's reason, unknown keys, keys that have no effect on the target.
"""

from __future__ import annotations

from typing import Any

from .builder import escape_token
from .context import Context
from .tables import (
    DISTRIBUTED_KEYS,
    DROPPED,
    GPU_COUNT_KEYS,
    K8S_KEYS,
    LAUNCHER_KEYS,
    SLURM_KEYS,
    TOP_KEYS,
)


class Leftovers(Context):
    """The keys nothing carried over, each reported with why."""

    # what is left: known keys dropped with a reason, unknown keys
    def leftovers(self) -> None:
        b = self.b
        for key in self.ctx:
            pointer = f"/{escape_token(key)}"
            if key.startswith(("_", "log_error_")):
                if key.startswith("log_error_"):
                    b.note(
                        "MDC500",
                        pointer,
                        "madengine's log scan for failure patterns; mdc does not run the job",
                    )
                continue
            if key not in TOP_KEYS:
                self.unknown_keys("", {key: None}, TOP_KEYS)
        self.unknown_keys("/distributed", self.dist, DISTRIBUTED_KEYS)
        if self.target == "kubernetes":
            self.unknown_keys("/launcher", self.launcher_block, LAUNCHER_KEYS)
        for pointer, reason in DROPPED.items():
            actual = pointer.replace("/k8s/", f"/{self.k8s_key}/") if self.k8s_key else pointer
            if b.has(actual) and actual not in b.handled:
                b.note("MDC500", actual, f"dropped: {reason}")
        if "timeout" in self.ctx and self.target != "kubernetes":
            b.note(
                "MDC500",
                "/timeout",
                "madengine's limit on its own model run ("
                + (
                    "madengine run --timeout on the compute node); mdc's limit is slurm.time"
                    if self.target == "slurm"
                    else "docker run); mdc's local backend has none"
                ),
            )
        for key in (
            "gpu_vendor",
            "MAD_CONTAINER_IMAGE",
            "env_vars",
            "docker_env_vars",
            "deploy",
            "k8s",
            "kubernetes",
            "slurm",
            "distributed",
            "launcher",
            "timeout",
            "guest_os",
        ):
            b.handled.add(f"/{key}")
        for key in GPU_COUNT_KEYS:
            pointer = f"/{key}"
            if key in self.ctx and pointer not in b.handled:
                b.note(
                    "MDC500",
                    pointer,
                    "madengine uses only the first of gpus_per_node, "
                    "gpu_count, n_gpus, num_gpus, ngpus; this one is shadowed",
                )
        self.unhandled()

    def unhandled(self) -> None:
        """Known madengine keys that nothing above carried over or reported."""
        b = self.b
        blocks: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
            ("/distributed", self.dist, DISTRIBUTED_KEYS)
        ]
        if self.k8s_key:
            blocks.append((f"/{self.k8s_key}", self.k8s, K8S_KEYS))
        if "slurm" in self.ctx:
            blocks.append(("/slurm", self.slurm, SLURM_KEYS))
        if self.target == "kubernetes":
            blocks.append(("/launcher", self.launcher_block, LAUNCHER_KEYS))
        for where, block, known in blocks:
            for key in block:
                pointer = f"{where}/{escape_token(key)}"
                if key in known and pointer not in b.handled:
                    b.note(
                        "MDC500",
                        pointer,
                        f"{key!r} has no effect on madengine's "
                        f"{self.target} deployment with launcher {self.launcher!r}; dropped",
                    )
