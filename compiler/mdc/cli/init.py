"""``mdc init --launcher L --backend B``: an annotated starter spec that compiles as written.

Each built-in launcher has a starting point (program, image, sizes and the table it needs)
and each backend the table it needs; the two are joined into one TOML file whose comments
say what to edit. A launcher or backend mdc does not know here (a third-party plugin) gets
the generic job and a pointer at ``mdc schema`` for its table.
"""

from __future__ import annotations

import json
from typing import NamedTuple


class LauncherStart(NamedTuple):
    command: list[str]
    image: str
    nnodes: int
    nproc_per_node: int
    #: the launcher's own tables (annotated TOML), after [distributed]
    tables: str = ""
    #: a one-line note on what the command is
    command_note: str = "your program and its arguments (EDIT)"


PYTORCH_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"

LAUNCHERS: dict[str, LauncherStart] = {
    "torchrun": LauncherStart(
        ["python", "train.py"],
        PYTORCH_IMAGE,
        2,
        8,
        """\
[batch]                             # optional: checked against dp
global_batch_size = 256
micro_batch_size = 4                # gradient accumulation = 256 / (4 * dp)

[torchrun]
rdzv_backend = "static"             # node ranks fixed by the backend; "c10d" to join in any order
""",
        "python SCRIPT args: runs as torchrun's script (EDIT)",
    ),
    "deepspeed": LauncherStart(
        ["python", "train.py"],
        PYTORCH_IMAGE,
        2,
        8,
        """\
[batch]                             # becomes ds_config.json's batch triad
global_batch_size = 256
micro_batch_size = 4

[deepspeed]
zero_stage = 2                      # 0-3
precision = "bf16"                  # bf16 | fp16 | fp32
""",
        "your script; it gets --deepspeed --deepspeed_config (EDIT)",
    ),
    "megatron": LauncherStart(
        ["python", "pretrain_gpt.py", "--mock-data"],
        PYTORCH_IMAGE,
        2,
        8,
        """\
[parallelism]                       # default: tp = nproc_per_node, pp = nnodes
tp = 8
pp = 2

[batch]
global_batch_size = 64
micro_batch_size = 1

[model]                             # the shape checks and the memory estimate read it
num_layers = 32
hidden_size = 4096
num_attention_heads = 32
seq_length = 4096
vocab_size = 32000
dtype = "bf16"

[megatron]
extra_args = []                     # any other Megatron-LM flags, e.g. ["--lr", "3e-4"]
""",
        "Megatron-LM's pretrain script; mdc appends the sizes and shape flags (EDIT)",
    ),
    "torchtitan": LauncherStart(
        ["python", "-m", "torchtitan.train"],
        PYTORCH_IMAGE,
        2,
        8,
        """\
[parallelism]
tp = 2
pp = 1

[batch]
global_batch_size = 64
micro_batch_size = 8                # TorchTitan's local_batch_size

[torchtitan]
model = "llama3"
flavor = "8B"
steps = 100
seq_len = 4096
""",
        "TorchTitan's trainer module",
    ),
    "primus": LauncherStart(
        ["bash", "examples/run_pretrain.sh"],
        "rocm/primus:v25.9",
        2,
        8,
        """\
[primus]
config_path = "examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml"   # EDIT
""",
        "Primus's run script, started once per node (it starts torchrun itself)",
    ),
    "basic": LauncherStart(
        ["python", "train.py"],
        PYTORCH_IMAGE,
        2,
        4,
        "",
        "your program; each copy gets --world_size W --rank R (EDIT)",
    ),
    "vllm": LauncherStart(
        ["vllm", "serve"],
        "vllm/vllm-openai:v0.11.0",
        2,
        8,
        """\
[parallelism]
tp = 8
pp = 2

[vllm]
model = "meta-llama/Llama-3.1-70B-Instruct"   # EDIT
port = 8000
""",
        "the vLLM server; mdc appends the model and its flags",
    ),
    "sglang": LauncherStart(
        ["python3", "-m", "sglang.launch_server"],
        "lmsysorg/sglang:v0.5.4",
        2,
        8,
        """\
[parallelism]
tp = 8                              # one server over all nnodes x nproc_per_node GPUs:
pp = 2                              # tp x pp = 16, tp within a node

[sglang]
model = "deepseek-ai/DeepSeek-V3"   # EDIT
""",
        "the SGLang server; mdc appends the model and its flags",
    ),
    "sglang_disagg": LauncherStart(
        ["python3"],
        "lmsysorg/sglang:v0.5.4",
        3,
        8,
        """\
[sglang_disagg]                     # node 0: router; then prefill, then decode nodes
model_path = "Qwen/Qwen3-32B"       # EDIT
""",
        "the Python interpreter every node runs the servers with",
    ),
    "trtllm": LauncherStart(
        ["trtllm-serve"],
        "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
        1,
        8,
        """\
[parallelism]                       # one server of tp x pp GPUs; more GPUs: replicas
tp = 8
pp = 1

[trtllm]
model = "meta-llama/Llama-3.3-70B-Instruct"   # EDIT
max_batch_size = 256
max_num_tokens = 8192
kv_cache_free_gpu_memory_fraction = 0.9
""",
        "TensorRT-LLM's server; mdc appends the model and its options",
    ),
    "vllm_disagg": LauncherStart(
        ["vllm", "serve"],
        "vllm/vllm-openai:v0.11.0",
        3,
        8,
        """\
[vllm_disagg]                       # node 0: the proxy; then prefill, then decode nodes
model = "meta-llama/Llama-3.3-70B-Instruct"   # EDIT
tensor_parallel_size = 8
router_command = ["python3", "toy_proxy_server.py"]   # EDIT: vLLM's toy proxy, in the image
""",
        "the vLLM server of every prefill and decode node; mdc appends the model and its flags",
    ),
}

#: on the local backend, the serving launchers run one node (nodes there share its GPUs)
LOCAL: dict[str, LauncherStart] = {
    "vllm": LAUNCHERS["vllm"]._replace(
        nnodes=1, tables=LAUNCHERS["vllm"].tables.replace("pp = 2", "pp = 1")
    ),
    "sglang": LAUNCHERS["sglang"]._replace(
        nnodes=1, tables=LAUNCHERS["sglang"].tables.replace("pp = 2 ", "pp = 1 ")
    ),
    "vllm_disagg": LAUNCHERS["vllm_disagg"]._replace(
        nnodes=1,
        tables=LAUNCHERS["vllm_disagg"].tables.replace(
            "tensor_parallel_size = 8", "tensor_parallel_size = 4"
        ),
    ),
}

#: each backend's table: annotated TOML, or "" when it needs none
BACKENDS: dict[str, str] = {
    "local": "",
    "slurm": """\
[slurm]
partition = "batch"                 # EDIT
time = "04:00:00"
""",
    "ssh": "",  # the hosts depend on nnodes: see _ssh_table
    "kubernetes": """\
[kubernetes]
namespace = "default"               # EDIT
""",
    "leaderworkerset": """\
[leaderworkerset]
namespace = "default"               # EDIT
replicas = 1                        # serving copies
""",
    "pytorchjob": """\
[pytorchjob]
namespace = "default"               # EDIT
""",
    "trainjob": """\
[trainjob]
namespace = "default"               # EDIT
""",
    "jobset": """\
[jobset]
namespace = "default"               # EDIT
""",
    "kuberay": """\
[kuberay]
namespace = "default"               # EDIT
""",
}

#: backends whose nodes run the host's own software (an image there is only a warning)
NO_CONTAINER = {"local", "slurm", "ssh"}


def _ssh_table(nnodes: int) -> str:
    hosts = ", ".join(json.dumps(f"node-{i:02d}") for i in range(nnodes))
    return (
        f'[ssh]\nhosts = [{hosts}]   # EDIT: one host per node, node 0 first\n# user = "trainer"\n'
    )


def _words(words: list[str]) -> str:
    return "[" + ", ".join(json.dumps(w) for w in words) + "]"


def _line(assignment: str, comment: str) -> str:
    return f"{assignment:<35} # {comment}" if comment else assignment


def starter(launcher: str, backend: str) -> str:
    """The annotated starter spec for ``launcher`` on ``backend``."""
    start = LAUNCHERS.get(launcher)
    known = start is not None
    if start is None:
        start = LauncherStart(["python", "train.py"], PYTORCH_IMAGE, 2, 8)
    accelerator = "amd" if launcher == "primus" else "nvidia"
    if backend == "local":
        # one machine: the serving launchers on one node's GPUs, the others on CPU processes
        start = LOCAL.get(launcher, start)
        accelerator = "nvidia" if launcher in LOCAL else "cpu"
    nnodes, nproc, tables = start.nnodes, start.nproc_per_node, start.tables
    name = f"{launcher}-{backend}".replace("_", "-")[:40]
    image_line = _line(f"image = {json.dumps(start.image)}", "the container image")
    if backend in NO_CONTAINER:
        image_line = f"# {image_line} (not used by the {backend} backend)"
    lines = [
        f"# A starter mdc spec: the {launcher} launcher on the {backend} backend.",
        "# Edit the values marked EDIT, then:",
        "#   mdc validate THIS_FILE            every finding at once, with file:line:col",
        "#   mdc explain THIS_FILE             the plan in words: ranks, groups, batch, env",
        "#   mdc compile THIS_FILE -o out/     write the launch files",
        "# Every key and its default: `mdc schema`, or the spec reference in the docs.",
        "",
        "[job]",
        _line(f"name = {json.dumps(name)}", "a DNS-1123 label, at most 40 characters"),
        image_line,
        _line(f"command = {_words(start.command)}", start.command_note),
        '# env = { NCCL_DEBUG = "WARN" }    # passed verbatim: quoted, never expanded',
        "",
        "[distributed]",
        _line(f"launcher = {json.dumps(launcher)}", ""),
        _line(f"backend = {json.dumps(backend)}", ""),
        _line(f"nnodes = {nnodes}", "nodes"),
        _line(f"nproc_per_node = {nproc}", "processes per node, one per GPU"),
        _line(f"accelerator = {json.dumps(accelerator)}", "nvidia | amd | cpu"),
    ]
    text = "\n".join(lines) + "\n"
    if tables:
        text += "\n" + tables
    elif not known:
        text += (
            f"\n# [{launcher}]                        # the launcher's table: see `mdc schema`\n"
        )
    table = _ssh_table(nnodes) if backend == "ssh" else BACKENDS.get(backend)
    if table is None:
        table = f"# [{backend}]                        # the backend's table: see `mdc schema`\n"
    if table:
        text += "\n" + table
    return text
