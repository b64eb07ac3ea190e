"""[job] env: madengine's preset layers, then env_vars, then docker_env_vars, less what
mdc's launcher and backend set themselves (§2.3, §4, §5).
"""

from __future__ import annotations

import json

from .builder import env_value, escape_token
from .context import Context
from .tables import (
    AMD_MULTI_GPU_ENV,
    K8S_DEFAULT_ENV,
    K8S_MULTI_NODE_ENV,
    K8S_NVIDIA_ENV,
    K8S_TEMPLATE_ENV,
    LAUNCHER_ENV,
    MANAGED_ENV,
    SLURM_DEFAULT_ENV,
    SLURM_MULTI_NODE_ENV,
    SLURM_SINGLE_NODE_ENV,
)


class Environment(Context):
    """[job] env, layer by layer as madengine builds it."""

    # [job] env: presets, then env_vars, then docker_env_vars (§2.3, §4, §5)
    def environment(self) -> None:
        b = self.b
        preset: dict[str, str] = {}
        names: list[str] = []
        for name, layer in self.preset_layers():
            preset.update(layer)
            names.append(name)
        given = self.given_env()
        applied = sorted(k for k in preset if k not in given)
        if applied:
            b.note(
                "MDC503",
                f"/{self.k8s_key}" if self.k8s_key else "/slurm",
                "madengine's "
                f"presets ({', '.join(names)}) add "
                + ", ".join(f"{k}={preset[k]}" for k in applied)
                + "; mdc keeps them in "
                "[job] env",
                hint="override one in env_vars",
            )
        env: dict[str, tuple[object, str | None]] = {k: (preset[k], None) for k in applied}
        env.update(given)
        if self.target == "slurm" and "env_vars" in self.ctx:
            b.note(
                "MDC505",
                "/env_vars",
                "on SLURM, madengine exports env_vars in the batch "
                "shell unquoted, and only a whitelist reaches the container; mdc gives every "
                "process all of them, quoted",
            )
        for key in sorted(env):
            b.put(("job", "env", key), env[key][0], env[key][1])
        for block in ("env_vars", "docker_env_vars"):
            if block in self.ctx:
                b.handled.add(f"/{block}")

    def preset_layers(self) -> list[tuple[str, dict[str, str]]]:
        """madengine's preset env for the target, layer by layer (name, variables)."""
        layers: list[tuple[str, dict[str, str]]] = []
        amd = self.vendor[0] == "amd"
        if self.target == "kubernetes":
            layers.append(("k8s/defaults.json", K8S_DEFAULT_ENV))
            if self.vendor[0] == "nvidia":
                layers.append(("k8s/gpu-vendors/nvidia.json", K8S_NVIDIA_ENV))
            if amd and (self.k8s_multi_gpu() or self.k8s_multi_node()):
                layers.append(("k8s/amd-multi-gpu.json", AMD_MULTI_GPU_ENV))
            if self.k8s_multi_node():
                layers.append(("the multi-node profile", K8S_MULTI_NODE_ENV))
            layers.append(("the Job template", K8S_TEMPLATE_ENV))
        elif self.target == "slurm":
            layers.append(("slurm/defaults.json", SLURM_DEFAULT_ENV))
            layers.append(
                ("the multi-node profile", SLURM_MULTI_NODE_ENV)
                if self.nnodes > 1
                else ("the single-node profile", SLURM_SINGLE_NODE_ENV)
            )
        return layers

    def given_env(self) -> dict[str, tuple[object, str | None]]:
        """env_vars, then docker_env_vars (value, origin), noting what mdc drops or reads
        otherwise than madengine."""
        b = self.b
        given: dict[str, tuple[object, str | None]] = dict(self.env)
        for block in ("env_vars", "docker_env_vars"):
            values = self.ctx.get(block)
            if not isinstance(values, dict):
                continue
            b.table(("job", "env"), f"/{block}")
            for key, value in values.items():
                origin = f"/{block}/{escape_token(key)}"
                if key.startswith("_"):
                    b.note(
                        "MDC504",
                        origin,
                        f"{key!r} is a comment; madengine's SLURM script "
                        "exports it anyway, mdc drops it",
                    )
                    continue
                if key in self.managed_env():
                    b.note(
                        "MDC504",
                        origin,
                        f"{key} is set by mdc's {self.launcher} launcher "
                        "or its backend; madengine's value is dropped",
                    )
                    continue
                if (
                    block == "docker_env_vars"
                    and key in given
                    and given[key][1]
                    and given[key][0] != value
                ):
                    b.note(
                        "MDC504",
                        origin,
                        f"{key} is in env_vars and docker_env_vars; the "
                        "docker value is what madengine's container sees, so mdc keeps it",
                    )
                if not isinstance(value, str) and isinstance(value, bool | int | float):
                    b.note(
                        "MDC504",
                        origin,
                        f"{key} = {json.dumps(value)} is exported as the "
                        f"string {env_value(value)!r} (madengine renders it with str())",
                    )
                given[key] = (env_value(value), origin)
        return given

    def managed_env(self) -> set[str]:
        names = {*MANAGED_ENV, *LAUNCHER_ENV.get(str(self.launcher), ())}
        tp = self.b.data.get("parallelism", {}).get("tp", self.nproc)
        if self.launcher == "megatron" and tp > 1 and self.vendor[0] != "cpu":
            names.add("CUDA_DEVICE_MAX_CONNECTIONS")  # mdc's megatron sets it to 1 then
        return names
