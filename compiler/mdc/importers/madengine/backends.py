"""The backends' tables: [kubernetes] and [slurm] from madengine's k8s and slurm blocks and
the presets madengine applies on each target (§4, §5, §2.3).
"""

from __future__ import annotations

import json

from .builder import env_value
from .context import Context
from .tables import K8S_KEYS, MDC_DEFAULT_TTL_SECONDS, NATIVE_LAUNCHERS, SLURM_KEYS


class Backends(Context):
    """[kubernetes] and [slurm], with madengine's presets on each target."""

    # [kubernetes] (§4, §2.3)
    def kubernetes(self) -> None:
        b, k8s, src = self.b, self.k8s, f"/{self.k8s_key}"
        table = ("kubernetes",)
        b.table(table, src)
        multi_node = self.k8s_multi_node()
        multi = multi_node or self.k8s_multi_gpu()
        self.k8s_presets(multi)
        if multi_node:
            b.put((*table, "host_ipc"), True, None)
            b.note(
                "MDC503",
                src,
                "madengine's multi-node Jobs run their pods with hostIPC: true (whatever "
                "k8s.host_ipc says); mdc keeps it: [kubernetes] host_ipc = true",
                hint="remove host_ipc if your processes do not share memory across pods",
            )
        if self.launcher in NATIVE_LAUNCHERS:
            self.pod_index(src, multi_node)
        self.ttl(src)
        if "node_selector" in k8s:
            selector = k8s["node_selector"]
            if isinstance(selector, dict):
                selector = {k: env_value(v) for k, v in selector.items()}
            b.put((*table, "node_selector"), selector, f"{src}/node_selector")
        if "tolerations" in k8s:
            self.tolerations(k8s["tolerations"], f"{src}/tolerations")
        if "gpu_resource_name" in k8s:
            b.put((*table, "gpu_resource"), k8s["gpu_resource_name"], f"{src}/gpu_resource_name")
        gpus = self.gpu_override() or (
            (k8s["gpu_count"], f"{src}/gpu_count") if "gpu_count" in k8s else None
        )
        if gpus is not None:
            if gpus[0] != self.nproc:
                b.put((*table, "gpus_per_node"), gpus[0], gpus[1])
            else:
                b.handled.add(gpus[1])
        if "data_pvc" in k8s:
            b.put(
                (*table, "volumes"),
                [{"name": "data", "mount_path": "/data", "claim": k8s["data_pvc"]}],
                None,
            )
            b.locate_only((*table, "volumes", 0, "claim"), f"{src}/data_pvc")
            b.note(
                "MDC504",
                f"{src}/data_pvc",
                "madengine mounts the data PVC at /data; mdc "
                "does the same with a [kubernetes] volume named 'data'",
            )
        timeout = self.ctx.get("timeout")
        if "timeout" in self.ctx:
            if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
                b.put((*table, "active_deadline_seconds"), int(timeout), "/timeout")
                b.note(
                    "MDC504",
                    "/timeout",
                    f"madengine stops the model run after {timeout} s; "
                    "mdc makes it the Job's activeDeadlineSeconds",
                )
            else:
                b.note("MDC500", "/timeout", f"timeout {timeout!r}: no limit")
        self.unknown_keys(src, k8s, K8S_KEYS)

    def k8s_presets(self, multi: bool) -> None:
        """The namespace, pull policy, retries and requests madengine's presets give."""
        b, k8s, src = self.b, self.k8s, f"/{self.k8s_key}"
        table = ("kubernetes",)
        b.put(
            (*table, "namespace"),
            k8s.get("namespace", "default"),
            f"{src}/namespace" if "namespace" in k8s else None,
        )
        defaults = ['namespace "default"'] if "namespace" not in k8s else []
        policy = k8s.get("image_pull_policy", "Always")
        b.put(
            (*table, "image_pull_policy"),
            policy,
            f"{src}/image_pull_policy" if "image_pull_policy" in k8s else None,
        )
        if "image_pull_policy" not in k8s:
            defaults.append('image_pull_policy "Always"')
        b.put(
            (*table, "backoff_limit"),
            k8s.get("backoff_limit", 3),
            f"{src}/backoff_limit" if "backoff_limit" in k8s else None,
        )
        if "backoff_limit" not in k8s:
            defaults.append(
                "backoff_limit 3 (mdc's own default is 0: a distributed job whose "
                "pod failed cannot continue)"
            )
        memory, cpu = ("64Gi", 16) if multi else ("16Gi", 8)
        for key, preset in (("memory", memory), ("cpu", cpu)):
            if key in k8s:
                b.put((*table, key), k8s[key], f"{src}/{key}")
            else:
                b.put((*table, key), preset, None)
                defaults.append(
                    f"{key} {json.dumps(preset)} (the "
                    f"{'multi' if multi else 'single'}-GPU profile's request)"
                )
        if defaults:
            b.note(
                "MDC503",
                src,
                "madengine's Kubernetes presets give " + "; ".join(defaults),
                hint="set them in k8s to change them",
            )

    def tolerations(self, value: object, origin: str) -> None:
        b = self.b
        if not isinstance(value, list):
            b.put(("kubernetes", "tolerations"), value, origin)
            return
        renamed = {"tolerationSeconds": "toleration_seconds"}
        items: list[object] = []
        for item in value:
            items.append(
                {renamed.get(k, k): v for k, v in item.items()} if isinstance(item, dict) else item
            )
        b.put(("kubernetes", "tolerations"), items, origin)
        for index, item in enumerate(value):
            if isinstance(item, dict) and "tolerationSeconds" in item:
                b.locate_only(
                    ("kubernetes", "tolerations", index, "toleration_seconds"),
                    f"{origin}/{index}/tolerationSeconds",
                )

    def pod_index(self, src: str, multi_node: bool) -> None:
        """madengine's Job exports POD_INDEX (= JOB_COMPLETION_INDEX) only on several nodes."""
        if multi_node:
            self.b.put(("job", "env", "POD_INDEX"), {"ref": "NODE_RANK"}, None)
            self.b.note(
                "MDC503",
                src,
                "madengine's pods export POD_INDEX (= JOB_COMPLETION_INDEX) for the "
                f"{self.launcher} launcher on several nodes; mdc's NODE_RANK is the same "
                'index, so [job] env has POD_INDEX = { ref = "NODE_RANK" }',
            )
        else:
            self.b.note(
                "MDC503",
                src,
                f"madengine exports POD_INDEX for the {self.launcher} launcher only when "
                "nnodes > 1; this job has one node, so POD_INDEX is not set (as in madengine)",
            )

    def ttl(self, src: str) -> None:
        """ttlSecondsAfterFinished: madengine's preset is null (none written); mdc's is a week."""
        key = "ttl_seconds_after_finished"
        value = self.k8s.get(key)
        if value is not None:
            self.b.put(("kubernetes", key), value, f"{src}/{key}")
            return
        self.b.handled.add(f"{src}/{key}")
        self.b.note(
            "MDC504",
            f"{src}/{key}" if self.b.has(f"{src}/{key}") else src,  # a null is madengine's
            "madengine writes no ttlSecondsAfterFinished, so its finished Jobs and pods "
            "stay until deleted; mdc's Kubernetes backend deletes them "
            f"{MDC_DEFAULT_TTL_SECONDS} s (a week) after the job finishes",
            hint=f"set {key} = -1 in [kubernetes] to keep them, as madengine does",
        )

    # [slurm] (§5, §2.3)
    def slurm_table(self) -> None:
        b, slurm = self.b, self.slurm
        table = ("slurm",)
        b.table(table, "/slurm")
        raw = self.dist.get("launcher")
        reservation = slurm.get("reservation")
        if str(raw).replace("-", "_") == "slurm_multi" and isinstance(reservation, str):
            # the one launcher madengine passes --reservation for
            b.put((*table, "sbatch_args"), [f"--reservation={reservation}"], None)
            b.locate_only((*table, "sbatch_args", 0), "/slurm/reservation")
        multi = self.nnodes > 1
        defaults = []
        for key, preset in (
            ("partition", "amd-rccl"),
            ("time", "24:00:00" if multi else "12:00:00"),
            ("exclusive", True),
        ):
            if key in slurm:
                b.put((*table, key), slurm[key], f"/slurm/{key}")
            else:
                b.put((*table, key), preset, None)
                defaults.append(f"{key} {json.dumps(preset)}")
        if defaults:
            b.note(
                "MDC503",
                "/slurm",
                "madengine's SLURM presets give " + ", ".join(defaults),
                hint="set them in slurm"
                + (
                    " (amd-rccl is a partition of madengine's own cluster)"
                    if "partition" not in slurm
                    else ""
                ),
            )
        for key in ("account", "qos", "constraint", "exclude"):
            if key in slurm:
                b.put((*table, key), slurm[key], f"/slurm/{key}")
        if "nodelist" in slurm:
            nodes = slurm["nodelist"]
            if isinstance(nodes, list) and all(isinstance(n, str) for n in nodes):
                b.put((*table, "nodelist"), ",".join(nodes), "/slurm/nodelist")
            else:
                b.put((*table, "nodelist"), nodes, "/slurm/nodelist")
        if "modules" in slurm:
            b.put((*table, "modules"), slurm["modules"], "/slurm/modules")
        gpus = self.gpu_override() or (
            (slurm["gpus_per_node"], "/slurm/gpus_per_node")
            if "gpus_per_node" in slurm
            else (8, None)
        )
        if gpus[0] != self.nproc:
            b.put((*table, "gpus_per_node"), gpus[0], gpus[1])
        elif gpus[1] is not None:
            b.handled.add(gpus[1])
        if "output_dir" in slurm:
            out = slurm["output_dir"]
            if isinstance(out, str):
                b.put((*table, "output"), f"{out.rstrip('/')}/%x_%j.out", "/slurm/output_dir")
                b.put((*table, "error"), f"{out.rstrip('/')}/%x_%j.err", "/slurm/output_dir")
                b.note(
                    "MDC504",
                    "/slurm/output_dir",
                    f"madengine writes its logs under "
                    f"{out!r} and creates it; mdc writes the batch output there as "
                    "%x_%j.out/.err, and SLURM does not create the directory",
                    hint=f"mkdir -p {out} before sbatch",
                )
            else:
                b.put((*table, "output"), out, "/slurm/output_dir")
        if "network_interface" in slurm:
            iface = slurm["network_interface"]
            self.env["NCCL_SOCKET_IFNAME"] = (iface, "/slurm/network_interface")
            self.env["GLOO_SOCKET_IFNAME"] = (iface, "/slurm/network_interface")
            b.note(
                "MDC504",
                "/slurm/network_interface",
                "madengine exports it as "
                "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME; mdc puts both in [job] env",
            )
        self.unknown_keys("/slurm", slurm, SLURM_KEYS)
