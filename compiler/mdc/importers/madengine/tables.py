"""What madengine's additional context may hold, the environment its preset layers add, and
why mdc drops the keys it does not carry over (madengine.md §2-§7)."""

from __future__ import annotations

# --- what madengine's context may hold (madengine.md §2, §7) -----------------------------

#: top-level keys only madengine uses (an mdc spec never has them)
OWN_TOP = (
    "gpu_vendor",
    "guest_os",
    "k8s",
    "env_vars",
    "docker_env_vars",
    "docker_mounts",
    "docker_build_arg",
    "docker_gpus",
    "deploy",
    "tools",
    "pre_scripts",
    "post_scripts",
    "encapsulate_script",
    "debug",
    "timeout",
    "MAD_CONTAINER_IMAGE",
    "context",
    "shared_data",
    "deployment_config",
    "launcher",
    "gpus_per_node",
    "gpu_count",
    "n_gpus",
    "num_gpus",
    "ngpus",
)
#: top-level keys madengine shares with mdc's table names
SHARED_TOP = ("distributed", "slurm", "kubernetes", "vllm")
TOP_KEYS = OWN_TOP + SHARED_TOP
K8S_KEYS = (
    "gpu_count",
    "memory",
    "memory_limit",
    "cpu",
    "cpu_limit",
    "namespace",
    "image_pull_policy",
    "node_selector",
    "backoff_limit",
    "tolerations",
    "kubeconfig",
    "gpu_resource_name",
    "host_ipc",
    "results_pvc",
    "data_pvc",
    "output_dir",
    "recreate_shared_data_pvc",
    "ttl_seconds_after_finished",
    "allow_privileged_profiling",
    "storage_class",
    "nfs_storage_class",
    "multi_node_results_storage_class",
    "results_storage_size",
    "secrets",
)
SLURM_KEYS = (
    "partition",
    "nodes",
    "gpus_per_node",
    "time",
    "exclusive",
    "output_dir",
    "account",
    "qos",
    "constraint",
    "nodelist",
    "exclude",
    "reservation",
    "network_interface",
    "modules",
    "shared_workspace",
    "enable_node_check",
    "auto_cleanup_nodes",
    "verbose_node_check",
    "allow_submit_without_clean_nodes",
    "mem",
    "results_dir",
)
DISTRIBUTED_KEYS = (
    "launcher",
    "nnodes",
    "nproc_per_node",
    "master_port",
    "port",
    "backend",
    "enabled",
    "sglang_disagg",
    "primus",
)
LAUNCHER_KEYS = ("type", "nnodes", "nproc_per_node", "master_port")
SGLANG_DISAGG_KEYS = ("prefill_nodes", "decode_nodes")
PRIMUS_KEYS = ("config_path", "cli_extra", "backend")
#: madengine keys only madengine's *distributed* or *slurm* blocks have (mdc's do not)
OWN_DISTRIBUTED = ("port", "enabled", "sglang_disagg", "primus")
OWN_K8S = (
    "gpu_count",
    "memory_limit",
    "cpu_limit",
    "kubeconfig",
    "gpu_resource_name",
    "host_ipc",
    "results_pvc",
    "data_pvc",
    "output_dir",
    "recreate_shared_data_pvc",
    "secrets",
)
OWN_SLURM = (
    "nodes",
    "output_dir",
    "network_interface",
    "shared_workspace",
    "enable_node_check",
    "auto_cleanup_nodes",
    "verbose_node_check",
    "results_dir",
    "reservation",
)
#: blocks madengine's CLI requires to be objects ("Invalid additional context: key K must be ...")
OBJECT_KEYS = (
    "k8s",
    "kubernetes",
    "slurm",
    "distributed",
    "env_vars",
    "docker_env_vars",
    "launcher",
)
#: the top-level GPU-count keys madengine's resolve_runtime_gpus tries first, in order
GPU_COUNT_KEYS = ("gpus_per_node", "gpu_count", "n_gpus", "num_gpus", "ngpus")

#: madengine launcher names -> mdc launcher plugins
LAUNCHERS = {
    "torchrun": "torchrun",
    "deepspeed": "deepspeed",
    "megatron": "megatron",
    "megatron-lm": "megatron",
    "megatron_lm": "megatron",
    "torchtitan": "torchtitan",
    "primus": "primus",
    "vllm": "vllm",
    "sglang": "sglang",
    "sglang-disagg": "sglang_disagg",
    "sglang_disagg": "sglang_disagg",
    "slurm_multi": "basic",
    "slurm-multi": "basic",
}
TARGETS = {
    "k8s": "kubernetes",
    "kubernetes": "kubernetes",
    "slurm": "slurm",
    "local": "local",
    "docker": "local",
}
DEFAULT_PORT = 29500
#: madengine's Primus config when distributed.primus.config_path is not given (§4.1)
PRIMUS_DEFAULT_CONFIG = "examples/torchtitan/configs/MI300X/qwen3_1.7B-pretrain.yaml"
PLACEHOLDER = "REPLACE_ME"

#: the program each launcher runs when madengine's model card (not in the context) is unknown
COMMANDS: dict[str, list[str]] = {
    "torchrun": ["python3", "train.py"],
    "deepspeed": ["python3", "train.py"],
    "basic": ["python3", "train.py"],
    "megatron": ["python3", "pretrain_gpt.py"],
    "torchtitan": ["python3", "-m", "torchtitan.train"],
    "primus": ["bash", "examples/run_pretrain.sh"],
    "vllm": ["vllm", "serve"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
    "sglang_disagg": ["python3"],
}
#: the launchers madengine's Kubernetes Job template gives JOB_COMPLETION_INDEX, and on
#: several nodes POD_INDEX (job.yaml.j2)
NATIVE_LAUNCHERS = ("torchrun", "deepspeed", "megatron", "torchtitan", "primus")
#: k8s keys whose null is madengine's own preset value (k8s/defaults.json): not reported
NULL_DEFAULTS = ("ttl_seconds_after_finished", "allow_privileged_profiling")
#: nulls madengine's CLI accepts as "not set" (``timeout``: a number or None): not reported
QUIET_NULLS = ("/timeout",)
#: the ttlSecondsAfterFinished mdc's Kubernetes backends write unless the table says (a
#: week); madengine writes none, so its Jobs stay until deleted
MDC_DEFAULT_TTL_SECONDS = 7 * 24 * 3600
#: serving launchers: the table and key naming the model
MODEL_KEYS = {"vllm": "model", "sglang": "model", "sglang_disagg": "model_path"}

# --- madengine's preset layers (madengine.md §2.3) ----------------------------------------

K8S_DEFAULT_ENV = {"OMP_NUM_THREADS": "8"}
K8S_NVIDIA_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_P2P_DISABLE": "0",
    "NCCL_P2P_LEVEL": "NVL",
    "OMP_NUM_THREADS": "12",
}
AMD_MULTI_GPU_ENV = {
    "NCCL_DEBUG": "WARN",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_IFNAME": "eth0",
    "TORCH_NCCL_HIGH_PRIORITY": "1",
    "GPU_MAX_HW_QUEUES": "2",
    "HSA_ENABLE_SDMA": "0",
    "MIOPEN_FIND_MODE": "1",
    "MIOPEN_USER_DB_PATH": "/tmp/.miopen",
    "HSA_FORCE_FINE_GRAIN_PCIE": "1",
    "RCCL_ENABLE_HIPGRAPH": "0",
}
K8S_MULTI_NODE_ENV = {
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_TIMEOUT": "600",
}
#: the Job template adds it to every pod's env when the config does not set it (§4)
K8S_TEMPLATE_ENV = {"HSA_NO_SCRATCH_RECLAIM": "1"}
SLURM_DEFAULT_ENV = {"OMP_NUM_THREADS": "8", "MIOPEN_FIND_MODE": "1"}
SLURM_MULTI_NODE_ENV = {
    "NCCL_DEBUG": "WARN",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_IFNAME": "eth0",
    "TORCH_NCCL_HIGH_PRIORITY": "1",
    "GPU_MAX_HW_QUEUES": "2",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_TIMEOUT": "600",
    "HSA_ENABLE_SDMA": "0",
    "HSA_FORCE_FINE_GRAIN_PCIE": "1",
    "RCCL_ENABLE_HIPGRAPH": "0",
}
SLURM_SINGLE_NODE_ENV = {"NCCL_DEBUG": "WARN"}
#: env names mdc's backends and every launcher set themselves (MDC240 refuses them in [job] env)
MANAGED_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "NODE_HOSTS",
    "MDC_OUT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)
#: ... and those each launcher sets (its role env and worker env)
LAUNCHER_ENV: dict[str, tuple[str, ...]] = {
    "torchrun": ("MAD_MULTI_NODE_RUNNER", "MAD_RUNTIME_NGPUS", "NNODES", "NPROC_PER_NODE"),
    "deepspeed": (
        "CROSS_RANK",
        "CROSS_SIZE",
        "LOCAL_SIZE",
        "DS_ACCELERATOR",
        "MDC_DEEPSPEED_CONFIG",
        "MAD_MULTI_NODE_RUNNER",
        "NNODES",
        "NPROC_PER_NODE",
        "CUDA_VISIBLE_DEVICES",
    ),
    "megatron": (
        "TENSOR_MODEL_PARALLEL_SIZE",
        "PIPELINE_MODEL_PARALLEL_SIZE",
        "CONTEXT_PARALLEL_SIZE",
        "MAD_MULTI_NODE_RUNNER",
        "NNODES",
        "NPROC_PER_NODE",
    ),
    "torchtitan": (
        "TORCHTITAN_TENSOR_PARALLEL_SIZE",
        "TORCHTITAN_PIPELINE_PARALLEL_SIZE",
        "TORCHTITAN_FSDP_ENABLED",
        "TORCHTITAN_CONTEXT_PARALLEL_SIZE",
        "MAD_MULTI_NODE_RUNNER",
        "NNODES",
        "NPROC_PER_NODE",
    ),
    "primus": (
        "BACKEND",
        "EXP",
        "GPUS_PER_NODE",
        "MAD_RUNTIME_NGPUS",
        "NNODES",
        "PRIMUS_CLI_EXTRA",
        "PRIMUS_CONFIG_PATH",
        "PRIMUS_ROOT",
    ),
    "vllm": (
        "NNODES",
        "NPROC_PER_NODE",
        "VLLM_DISTRIBUTED_BACKEND",
        "VLLM_PIPELINE_PARALLEL_SIZE",
        "VLLM_TENSOR_PARALLEL_SIZE",
        "VLLM_HOST_IP",
    ),
    "sglang": (
        "NCCL_INIT_ADDR",
        "NNODES",
        "NPROC_PER_NODE",
        "SGLANG_PIPELINE_PARALLEL_SIZE",
        "SGLANG_TENSOR_PARALLEL_SIZE",
        "SGLANG_HOST_IP",
    ),
    "sglang_disagg": (
        "DECODE_COUNT",
        "MODEL_PATH",
        "PREFILL_COUNT",
        "SGLANG_DISAGG_DECODE_NODES",
        "SGLANG_DISAGG_MODE",
        "SGLANG_DISAGG_PREFILL_NODES",
        "SGLANG_DISAGG_ROLE",
        "SGLANG_DISAGG_TOTAL_NODES",
        "SGLANG_DISAGG_TRANSFER_BACKEND",
        "POD_INDEX",
        "POD_IP",
        "SGLANG_NODE_IPS",
        "TOTAL_PODS",
        "SGLANG_NODE_RANK",
        "SGLANG_TP_SIZE",
        "TP_SIZE",
    ),
}

# --- why keys are dropped ------------------------------------------------------------------

_BUILD = "madengine's image build setting; mdc compiles launch artifacts and builds no image"
_RUNNER = (
    "madengine's container runner (tools, profiling wrappers, data providers); mdc "
    "runs [job] command as it is"
)
DROPPED: dict[str, str] = {
    "/guest_os": _BUILD + " (the container's OS family)",
    "/docker_build_arg": _BUILD,
    "/docker_mounts": "docker -v mounts of madengine's local container run; mdc does not run "
    "docker (mount volumes with [kubernetes] volumes or [slurm] container "
    "mounts)",
    "/docker_gpus": "docker --gpus selection of madengine's local run; mdc derives device "
    "visibility from nproc_per_node",
    "/tools": _RUNNER,
    "/pre_scripts": _RUNNER,
    "/post_scripts": _RUNNER,
    "/encapsulate_script": _RUNNER,
    "/shared_data": _RUNNER,
    "/debug": "madengine's own verbosity; it changes no launch artifact",
    "/deployment_config": "the build manifest's internal copy of the context; write its "
    "blocks at the top level",
    "/context": "madengine never reads a 'context' block (its env_vars and pre_scripts are "
    "silently dropped there); mdc keeps that meaning",
    "/vllm": "passed through by madengine to its deployment untouched; mdc's [vllm] table has "
    "its own keys (model, port, mode, args)",
    "/k8s/kubeconfig": "mdc writes manifests; kubectl applies them with your own kubeconfig",
    "/k8s/host_ipc": "madengine ignores it (hostIPC is on for every multi-node Job)",
    "/k8s/results_pvc": "madengine ignores it (it always creates <job>-results)",
    "/k8s/output_dir": "madengine uses it only for debug copies of the manifests",
    "/k8s/recreate_shared_data_pvc": "madengine's data-provider PVC; mdc creates no PVCs",
    "/k8s/storage_class": "madengine's results/data PVCs; mdc creates no PVCs",
    "/k8s/nfs_storage_class": "madengine's results/data PVCs; mdc creates no PVCs",
    "/k8s/multi_node_results_storage_class": "madengine's results PVC; mdc creates no PVCs",
    "/k8s/results_storage_size": "madengine's results PVC; mdc creates no PVCs",
    "/k8s/secrets": "madengine's registry/runtime credential Secrets; mdc creates no Secrets "
    "(name existing pull Secrets in [kubernetes] image_pull_secrets)",
    "/k8s/allow_privileged_profiling": "madengine's profiling tools (SYS_PTRACE); mdc runs "
    "no tools",
    "/k8s/memory_limit": "mdc requests k8s.memory (the request madengine schedules on) with no "
    'limit; qos = "guaranteed" makes the limit equal to the request, and a larger limit has '
    "no mdc key",
    "/k8s/cpu_limit": "mdc requests k8s.cpu (the request madengine schedules on) with no "
    'limit; qos = "guaranteed" makes the limit equal to the request, and a larger limit has '
    "no mdc key",
    "/slurm/mem": "madengine ignores slurm.mem (no --mem is written); set [slurm] mem if you "
    "want it",
    "/slurm/results_dir": "madengine ignores it",
    "/slurm/shared_workspace": "madengine's workspace staging on the compute nodes; mdc's tree "
    "is the workspace (put it on a shared filesystem)",
    "/slurm/enable_node_check": "madengine's srun health preflight before sbatch, which makes "
    "the submitted script depend on cluster state; mdc's sbatch is "
    "deterministic",
    "/slurm/auto_cleanup_nodes": "madengine's preflight node cleanup; mdc has no preflight",
    "/slurm/verbose_node_check": "madengine's preflight output; mdc has no preflight",
    "/slurm/allow_submit_without_clean_nodes": "madengine's preflight policy; mdc has no preflight",
    "/slurm/reservation": "madengine passes --reservation only for its slurm_multi launcher; "
    "mdc keeps that meaning (use [slurm] sbatch_args = "
    '["--reservation=NAME"])',
    "/distributed/enabled": "only selects madengine's multi-GPU preset profile (applied above); "
    "mdc has no switch",
    "/distributed/backend": "madengine exports it as DISTRIBUTED_BACKEND only in the SLURM batch "
    "shell, which never reaches the container; torch picks NCCL/RCCL "
    "itself",
}
