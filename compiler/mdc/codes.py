"""The catalogue of mdc's own diagnostic codes: what each means and how to fix it.

``docs/reference/diagnostics.md`` is generated from this table, with a real example of each
code taken from the golden diagnostics (``golden/diagnostics/<case>/expected.txt``). A test
holds the table to the code base: every ``"MDCnnn"`` literal in ``compiler/`` and
``plugins/`` has an entry here, and every entry is used. Third-party plugins (MDC900 and up)
document their own codes.
"""

from __future__ import annotations

from typing import NamedTuple


class Code(NamedTuple):
    #: what the finding says is wrong (or, for a warning, worth knowing)
    meaning: str
    #: what to change
    fix: str


#: the sections of the catalogue: (first code, last code, title), in order
RANGES: tuple[tuple[int, int, str], ...] = (
    (1, 99, "Reading the file"),
    (100, 199, "Schema"),
    (200, 299, "The plan"),
    (300, 309, "torchrun"),
    (310, 319, "deepspeed"),
    (320, 329, "megatron"),
    (330, 339, "torchtitan"),
    (340, 349, "primus"),
    (350, 353, "basic"),
    (354, 359, "megatron: memory options"),
    (360, 369, "vllm"),
    (370, 379, "sglang"),
    (380, 389, "sglang_disagg"),
    (390, 399, "Pipeline stages (TorchTitan) and framework models"),
    (400, 409, "local"),
    (410, 429, "slurm"),
    (430, 439, "ssh"),
    (440, 449, "kubernetes"),
    (450, 459, "Kubernetes backends: networks, queues, gangs, GPU sharing"),
    (460, 469, "Kubernetes backends (shared)"),
    (470, 471, "pytorchjob"),
    (472, 473, "Kubernetes backends (more)"),
    (474, 479, "megatron: optimizer, bf16 layers, DeepSeek-V4, attention backend"),
    (480, 489, "trainjob"),
    (500, 599, "mdc import madengine"),
    (600, 609, "Accelerator models"),
    (610, 629, "mdc tune"),
    (700, 719, "trtllm"),
    (720, 739, "vllm_disagg"),
    (740, 749, "jobset"),
    (750, 759, "kuberay"),
)

CODES: dict[str, Code] = {
    # reading
    "MDC001": Code(
        "the file is not valid TOML, YAML or JSON (or not UTF-8)",
        "fix the syntax at the position shown",
    ),
    "MDC002": Code("a key appears twice in one table", "keep one of the two"),
    "MDC003": Code(
        "the file cannot be read: missing, unreadable, not a regular file (a FIFO, a device,"
        " a folder), too large, or of an unknown format",
        "give an existing .toml, .yaml/.yml or .json file of at most 4 MiB",
    ),
    "MDC004": Code(
        "a YAML document expands (through aliases) to too many values",
        "write the values out, or use fewer aliases",
    ),
    "MDC005": Code(
        "a folder given to `mdc validate` holds no spec (no .toml, .yaml, .yml or .json file"
        " outside compiled trees)",
        "give the spec files, or the folder that holds them",
    ),
    "MDC020": Code(
        "a number no spec can hold: NaN or an infinity (`nan`, `inf`, `.inf`, `1e999`), or an"
        " integer of more than 4,300 digits (Python's limit)",
        "give a finite number of a sensible size, or quote the value if it is text",
    ),
    "MDC021": Code(
        "a YAML key that is null (`~:`, `null:`, or nothing before the `:`)",
        "write the key's name, or quote it if the name is the word null",
    ),
    "MDC040": Code(
        "[model] name is not in mdc's catalogue of published models",
        "name a catalogue model (docs/model.md), point hf_config at its config.json, or"
        " write its keys",
    ),
    "MDC041": Code(
        "[model] hf_config names a config.json mdc cannot read as [model] keys",
        "write the model's keys under [model] (docs/model.md maps config.json keys to them)",
    ),
    # schema
    "MDC100": Code("the value breaks a schema rule not listed below", "follow the message"),
    "MDC101": Code("an unknown key", "fix its spelling (the hint suggests one) or remove it"),
    "MDC102": Code("a value of the wrong type", "give the type the message names"),
    "MDC103": Code("a required key is missing", "add it"),
    "MDC104": Code(
        "a value that is not one of the allowed ones (a launcher, backend or enum value)",
        "use one of the values listed; `mdc plugins` lists the installed launchers and backends",
    ),
    "MDC105": Code("a number or list out of its range", "give a value within the bounds shown"),
    "MDC106": Code(
        "a string of the wrong form (a name, a pattern) or holding a NUL character",
        "follow the pattern shown; remove NUL characters",
    ),
    "MDC107": Code(
        "the launcher or backend the spec names is not installed (and is no misspelling of one"
        " that is)",
        "install the distribution that provides it (`mdc plugins` lists what is installed), or"
        " unblock it (-p no:NAME, MDC_BLOCK_PLUGINS)",
    ),
    # plan
    "MDC201": Code(
        "the world size is not divisible by tp * pp * cp",
        "choose tp, pp, cp from the divisors the hint lists",
    ),
    "MDC202": Code(
        "the given dp disagrees with world / (tp * pp * cp)", "remove dp: it is derived"
    ),
    "MDC203": Code(
        "the world size is not divisible by etp * ep * pp (the expert layout)",
        "choose ep and etp so that etp * ep * pp divides the world size",
    ),
    "MDC204": Code(
        "a parallel size > 1 whose axis the order does not name",
        "add the axis to `order`",
    ),
    "MDC205": Code(
        "the dense and expert layouts disagree on dp for an order not ending in pp",
        "end the order with pp, or pick sizes where expert-dp = dp",
    ),
    "MDC206": Code("vpp > 1 needs pp > 1", "remove vpp, or set pp > 1"),
    "MDC207": Code(
        "global_batch_size is not a multiple of micro_batch_size * dp",
        "pick a global batch the hint lists, or another micro batch",
    ),
    "MDC208": Code("min_nnodes is larger than nnodes", "set min_nnodes to at most nnodes"),
    "MDC209": Code(
        "disaggregated serving on one node needs at least 2 GPUs (1 prefill + 1 decode)",
        "set nproc_per_node to 2 or more",
    ),
    "MDC210": Code(
        "prefill_nodes and decode_nodes (up to 2 nodes: prefill_gpus and decode_gpus) are not "
        "both given, do not add up to nnodes (the job's GPUs), or do not fit the node count",
        "give both so that they add up, or neither for the automatic split",
    ),
    "MDC211": Code(
        "prefill_nodes, decode_nodes, prefill_gpus or decode_gpus on a launcher that is not "
        "disaggregated serving",
        "remove the key",
    ),
    "MDC212": Code("the order names an axis twice", "use each axis once"),
    "MDC213": Code(
        "a command string that does not split into words as a shell would (an open quote)",
        "write the command as a list of words, or close the quote",
    ),
    "MDC220": Code("num_attention_heads is not a multiple of tp", "pick tp from the hint"),
    "MDC221": Code(
        "num_query_groups is neither a multiple nor a divisor of tp",
        "pick tp or num_query_groups so that one divides the other",
    ),
    "MDC222": Code(
        "num_layers (plus the embedding and loss when Megatron counts them) is not divisible by pp",
        "pick pp from the hint, or (megatron) an uneven split: the account_for_* keys or "
        "first/last stage layer counts",
    ),
    "MDC223": Code(
        "the layers per pipeline stage are not divisible by vpp",
        "pick vpp dividing the layers per stage",
    ),
    "MDC224": Code(
        "ep > 1 without num_experts, or num_experts not divisible by ep",
        "set num_experts (a multiple of ep), or ep = 1 for a dense model",
    ),
    "MDC225": Code("seq_length is not a multiple of 2 * cp when cp > 1", "pick cp or seq_length"),
    "MDC226": Code(
        "num_attention_heads is not a multiple of num_query_groups",
        "pick num_query_groups from the hint",
    ),
    "MDC227": Code(
        "Megatron refuses the uneven pipeline split: first/last stage layer counts with the "
        "embedding/loss accounting, counts not divisible by vpp, middle layers that do not "
        "divide over the middle stages, or a stage left without layers (a warning when "
        "megatron-core builds fewer layers than num_layers)",
        "follow the hint: change the first/last stage counts, vpp, or the accounting keys",
    ),
    "MDC228": Code(
        "Megatron refuses the pipeline_model_parallel_layout: it does not parse, its stage "
        "count is not a multiple of pp, it disagrees with vpp or num_layers, it is combined "
        "with other split keys, or it misplaces the embedding, loss or MTP layers",
        "write E, t, m, L stages separated by |, pp * vpp of them, holding num_layers t's",
    ),
    "MDC231": Code(
        "the backend does not run this launcher",
        "pick a backend that runs it (every launcher runs on local, slurm, ssh, kubernetes)",
    ),
    "MDC240": Code(
        "[job] env sets a variable the launcher or backend sets",
        "remove it from [job] env; set the spec key that controls it",
    ),
    "MDC250": Code(
        "warning: a tensor-parallel group crosses a node (or NVLink-rack) boundary",
        "make tp divide nproc_per_node (or the accelerator's scale-up domain), or change the order",
    ),
    "MDC251": Code(
        "warning: an expert-parallel group crosses a node (or NVLink-rack) boundary",
        "make ep (times etp) fit in a node, or change the order",
    ),
    "MDC252": Code(
        "warning: [job] command is a shell script run by torchrun as every worker process",
        "give the program the script starts as [job] command, its exports as [job] env",
    ),
    "MDC253": Code(
        "warning: a plugin table that neither the chosen launcher nor the backend reads",
        "remove the table, or choose the plugin it belongs to",
    ),
    "MDC254": Code(
        "warning: a [job] env value looks like a reference ($VAR); it is passed literally",
        'write { prepend = "..." }, { append = "..." } or { ref = "NAME" }, or keep the text',
    ),
    "MDC255": Code(
        "warning: a [job] env ref names a variable mdc does not set",
        "make sure the nodes' environment has it, or refer to one mdc sets",
    ),
    "MDC256": Code(
        "a [job] env table has not exactly one of prepend, append and ref",
        "keep one of them",
    ),
    "MDC260": Code(
        "the model state (weights, gradients, optimizer) alone exceeds accelerator_memory_gib",
        "apply one of the changes the hint prices (more tp/pp/cp, ZeRO, recompute, ...)",
    ),
    "MDC261": Code(
        "warning: accelerator_memory_gib is set but no estimate can be made",
        "complete the [model] table, or remove accelerator_memory_gib",
    ),
    "MDC262": Code(
        "warning: the estimate with activations is above 90% of accelerator_memory_gib (or over it)",
        "leave headroom for what the estimate leaves out (context, buffers, fragmentation)",
    ),
    "MDC270": Code(
        "hybrid_override_pattern does not have one symbol per layer",
        "write one symbol per layer, or set num_layers to the pattern's length",
    ),
    "MDC271": Code(
        "moe_layer_freq does not list one entry per layer",
        "give one 0 (dense) or 1 (MoE) per layer",
    ),
    "MDC272": Code(
        "multi_latent_attention with grouped-query attention (num_query_groups)",
        "remove num_query_groups: multi-latent attention compresses keys and values itself",
    ),
    "MDC273": Code(
        "shared experts with bias = true (Megatron-Core builds them without biases)",
        "set bias = false",
    ),
    "MDC274": Code(
        "hybrid_override_pattern has MoE layers (E) but num_experts is not set",
        "set num_experts",
    ),
    "MDC275": Code(
        "multi-token prediction (mtp_num_layers) with learned position embeddings",
        'set position_embedding = "rope" (or "none")',
    ),
    "MDC276": Code(
        "mamba_num_heads is not a multiple of mamba_num_groups",
        "pick mamba_num_groups dividing mamba_num_heads",
    ),
    "MDC277": Code(
        "a Mamba size (heads, groups) is not a multiple of tp",
        "pick tp dividing it",
    ),
    "MDC280": Code(
        "a serving engine's weights alone exceed one GPU's memory (estimate)",
        "spread them over more GPUs (tp, pp, ep) or serve a quantized model",
    ),
    "MDC281": Code(
        "warning: the estimated KV cache holds less than one full-length sequence",
        "raise the memory share, shard the weights more, use an fp8 KV cache, or a "
        "shorter maximum length",
    ),
    # torchrun
    "MDC301": Code(
        "static rendezvous cannot run an elastic job",
        'use rdzv_backend = "c10d", or remove min_nnodes',
    ),
    "MDC302": Code(
        "an rdzv_conf value torchrun cannot pass (a comma, or blank)",
        "remove the comma or the blank value",
    ),
    "MDC303": Code(
        "warning: MAD_MULTI_NODE_RUNNER holds a value that needs shell quoting",
        "use values without spaces or quotes in log_dir / rdzv_conf",
    ),
    # deepspeed
    "MDC310": Code("ZeRO stage 2 or 3 with pp > 1", "use zero_stage 0 or 1 with pipelines"),
    "MDC311": Code(
        "[deepspeed] config sets a key mdc derives (a warning when it repeats mdc's value)",
        "remove it and set the spec key it comes from",
    ),
    "MDC312": Code("a config value JSON cannot hold (NaN, infinity)", "give a finite number"),
    "MDC313": Code("a ds_config key DeepSpeed 0.19.8 removed", "remove it"),
    "MDC314": Code(
        "an unknown zero_optimization key, which DeepSpeed refuses (a warning when its value"
        ' is "auto": DeepSpeed drops such a key unread)',
        "fix its spelling",
    ),
    "MDC315": Code("DeepSpeed cannot run an elastic job", "remove min_nnodes"),
    "MDC316": Code(
        "[model] dtype = fp8 without [deepspeed] precision",
        "set [deepspeed] precision (bf16 or fp16)",
    ),
    "MDC317": Code(
        "the command repeats the launcher or --deepspeed_config, or local_rank_argument under"
        " torchrun",
        "give only the program and its own arguments",
    ),
    "MDC318": Code(
        "warning: a [torchrun] table the deepspeed runner does not use",
        'remove it, or use runner = "torchrun"',
    ),
    "MDC319": Code(
        "warning: tp or cp > 1 needs an mpu for DeepSpeed's batch check",
        "pass an mpu to deepspeed.initialize",
    ),
    # megatron
    "MDC320": Code(
        "an order Megatron-LM's command line cannot express",
        "use tp-cp-ep-dp-pp or tp-cp-ep-pp-dp",
    ),
    "MDC321": Code(
        "a combination of [megatron] options Megatron-LM refuses (e.g. FSDP2 with the"
        " distributed optimizer)",
        "drop one of the two options",
    ),
    "MDC322": Code(
        "recompute settings Megatron-LM refuses (full without a method, ...)",
        "set the missing recompute key the message names",
    ),
    "MDC323": Code(
        "the command or extra_args passes a flag whose value disagrees with its spec key,"
        " with the value mdc writes from another key, or with the same flag elsewhere"
        " (Megatron-LM would keep the last); or one mdc cannot read as a key",
        "remove the flag, or make the two agree (an agreeing flag is read as its key)",
    ),
    "MDC324": Code("fp16 with expert parallelism", "train in bf16, or ep = 1"),
    "MDC325": Code("warning: sequence_parallel with tp = 1 has no effect", "remove it"),
    "MDC326": Code("max_position_embeddings below seq_length", "raise max_position_embeddings"),
    "MDC327": Code(
        "no micro batch size: no [batch] table and none in the command",
        "add a [batch] table",
    ),
    "MDC328": Code(
        "[job] env sets CUDA_DEVICE_MAX_CONNECTIONS against Megatron-LM's assertion for the"
        " GPU (1 for tp or cp > 1 before Blackwell; not 1 with FSDP)",
        "remove it from [job] env: mdc sets it where Megatron-LM needs it",
    ),
    # torchtitan
    "MDC330": Code("an order TorchTitan cannot run", "use TorchTitan's order"),
    "MDC331": Code("dp_replicate does not divide dp", "pick dp_replicate dividing dp"),
    "MDC332": Code("etp is neither tp nor 1 with ep > 1", "set etp = tp or etp = 1"),
    "MDC333": Code(
        "ep * etp does not divide dp_shard * cp * tp",
        "pick ep and etp dividing that product",
    ),
    "MDC334": Code("seq_len not divisible by tp * 2 * cp", "pick seq_len or the sizes"),
    "MDC335": Code(
        "local batch not divisible by the pipeline microbatch size",
        "pick micro_batch_size or pipeline_microbatch_size",
    ),
    "MDC336": Code(
        "a pipeline schedule that does not match vpp",
        "use an interleaved schedule with vpp > 1, a single-stage one without",
    ),
    "MDC337": Code("fp16 training, which TorchTitan does not have", "use bf16 or fp32"),
    "MDC338": Code(
        "[torchtitan.config] or the command sets a key the launcher derives",
        "remove it; set the spec key it comes from",
    ),
    "MDC339": Code("seq_len disagrees with [model] seq_length", "make them equal"),
    # primus
    "MDC340": Code("no [primus] table or config_path", "add [primus] config_path"),
    "MDC341": Code("Primus cannot run an elastic job", "remove min_nnodes"),
    "MDC342": Code(
        "warning: [parallelism] is checked but not passed to Primus",
        "set the sizes in the Primus experiment config",
    ),
    "MDC343": Code(
        "warning: [batch] is checked but not passed to Primus",
        "set the batch in the Primus experiment config",
    ),
    "MDC344": Code("two sources of BACKEND disagree", "make backend, model and config_path agree"),
    "MDC345": Code("warning: model names no backend", "set [primus] backend"),
    "MDC346": Code("warning: a backend Primus's scripts are not known to take", "check its name"),
    "MDC347": Code(
        "warning: cli_extra words that need shell quoting",
        "give a string, or words without spaces or quotes",
    ),
    "MDC348": Code("warning: config_path is not a .yaml file", "point it at the experiment YAML"),
    "MDC349": Code(
        "warning: the command runs once per node (Primus starts the workers itself)",
        "run Primus's own script",
    ),
    # basic
    "MDC350": Code("basic cannot run an elastic job", "remove min_nnodes"),
    "MDC351": Code("rendezvous_file is not an absolute path", "give an absolute shared path"),
    "MDC352": Code("rendezvous_file cannot be a file:// URL", "use plain characters"),
    "MDC353": Code(
        "warning: the command already passes --world_size/--rank/--init_method",
        "remove them from the command",
    ),
    # megatron (memory options)
    "MDC354": Code(
        "Megatron-FSDP options that Megatron-LM refuses or ignores (a sharding strategy without"
        " it, another --ckpt-format, torch FSDP2 beside it)",
        "follow the hint: enable use_megatron_fsdp, or remove the option",
    ),
    "MDC355": Code(
        "fp8 and gradient-precision options that need another precision or the distributed"
        " optimizer",
        'set [model] dtype = "fp8" (or the optimizer), or remove the option',
    ),
    "MDC356": Code(
        "precision-aware or offloaded optimizer options without what they need",
        "enable use_precision_aware_optimizer / the distributed optimizer, or remove the option",
    ),
    "MDC357": Code(
        "activation offloading or recompute_modules that Megatron-LM refuses (layers, pp,"
        " granularity, or a module the model lacks)",
        "follow the hint: change the recompute settings, or remove the option",
    ),
    "MDC358": Code(
        "MoE dispatcher options that need another option or have no effect on a dense model",
        "set the option the hint names, or remove it",
    ),
    "MDC359": Code(
        "a memory flag in the arguments: a value Megatron-LM refuses in extra_args, a "
        "TorchTitan override of a memory key with a value TorchTitan refuses, or "
        "(warning) a Megatron-LM flag the estimate does not model",
        "set the spec key the hint names instead, or compare the estimate with a measured run",
    ),
    # vllm
    "MDC360": Code("no [vllm] model", "set [vllm] model"),
    "MDC361": Code("warning: [vllm] mode has no effect on 1 node", "remove mode"),
    "MDC362": Code(
        "the servers' tp * pp does not fit the mode: ray needs tp * pp = the world size, dp "
        "and replicas need tp * pp to divide nproc_per_node",
        "change tp and pp, or the mode",
    ),
    "MDC363": Code("context parallelism with vLLM", "remove cp"),
    "MDC364": Code(
        "the command or [vllm] args pass a flag whose value disagrees with its spec key or"
        " with the value mdc writes (vLLM would keep the last), or one mdc sets per node",
        "remove the flag, or make the two agree (an agreeing flag is read as its key)",
    ),
    "MDC365": Code("warning: the command does not look like a vLLM server", "run `vllm serve`"),
    "MDC366": Code("vLLM cannot run an elastic job", "remove min_nnodes"),
    "MDC367": Code("multi-node vLLM over Ray on a cpu job", "use GPUs, or one node"),
    "MDC368": Code(
        "ep is not vLLM's expert-parallel size (tp * dp of one server), or etp is not 1",
        "set ep = tp * dp, or remove ep",
    ),
    "MDC369": Code(
        "[vllm] args has a flag vLLM refuses on --headless nodes (--api-server-count)",
        "move it to [vllm] head_args",
    ),
    # sglang
    "MDC370": Code("no [sglang] model", "set [sglang] model"),
    "MDC371": Code("tp * pp is not the world size", "set tp * pp = nnodes * nproc_per_node"),
    "MDC372": Code("context parallelism with SGLang", "remove cp"),
    "MDC373": Code(
        "the command or [sglang] args pass a flag whose value disagrees with its spec key or"
        " with the value mdc writes (SGLang would keep the last), or one mdc sets per node",
        "remove the flag, or make the two agree (an agreeing flag is read as its key)",
    ),
    "MDC374": Code(
        "warning: the command does not look like an SGLang server",
        "run `python -m sglang.launch_server`",
    ),
    "MDC375": Code("SGLang cannot run an elastic job", "remove min_nnodes"),
    # sglang_disagg
    "MDC380": Code("no [sglang_disagg] model_path", "set [sglang_disagg] model_path"),
    "MDC381": Code("a node's port exceeds 65535", "lower port or bootstrap_port"),
    "MDC382": Code("HTTP and bootstrap port ranges overlap", "move one of the ranges"),
    "MDC383": Code(
        "a server's GPUs exceed one node without being whole nodes, or pp/cp is set",
        "make tp_size a multiple of nproc_per_node (or at most it); remove pp and cp",
    ),
    "MDC384": Code(
        "warning: the command is not a Python interpreter",
        'set [job] command = "python3"',
    ),
    "MDC385": Code("disaggregated serving cannot run elastic", "remove min_nnodes"),
    "MDC386": Code(
        "warning: mini_lb with nodes sharing a host: bootstrap ports collide",
        'use router = "sglang_router"',
    ),
    "MDC387": Code(
        "a role's node count is not a multiple of the nodes one of its servers spans",
        "set prefill_nodes / decode_nodes to multiples of tp_size / nproc_per_node",
    ),
    "MDC389": Code(
        "server_args or a role's args pass a flag whose value disagrees with its"
        " [sglang_disagg] key or with the value mdc writes (SGLang would keep the last),"
        " or one mdc sets per node or role",
        "remove the flag, or make the two agree (an agreeing flag is read as its key)",
    ),
    # local
    "MDC390": Code(
        "TorchTitan cannot split the layers over pp * vpp stages: more stages than layers plus "
        "the first/last stage weights, or a weight above the smallest share",
        "use fewer pipeline stages, or smaller pipeline_parallel_*_stage_less_layers",
    ),
    "MDC393": Code(
        "a [model] value contradicts the model the framework builds (TorchTitan's flavor)",
        "remove the key (it is taken from the flavor) or write the flavor's value",
    ),
    "MDC394": Code(
        "Megatron-LM refuses the FP4 options: fp4_format with dtype fp8, fp4_param_gather "
        "without fp4_format, or the custom fp4_recipe without fp4_quantizer_factory",
        'train in one precision: dtype = "bf16" with fp4_format, or dtype = "fp8" without it',
    ),
    "MDC395": Code(
        "warning: an FP4 option (fp4_recipe, fp4_quantizer_factory) without fp4_format",
        'set fp4_format = "e2m1", or remove the option',
    ),
    "MDC396": Code(
        "Megatron-LM refuses use_torch_fsdp2 with pipeline or expert parallelism, gradient "
        "accumulation fusion, a checkpoint format other than torch_dist/torch_dcp, tied "
        "embeddings or fp16",
        "change the setting the message names, or remove use_torch_fsdp2",
    ),
    "MDC401": Code("warning: [job] image is not used on the local backend", "remove it"),
    "MDC402": Code(
        "warning: several nodes on one machine share its GPUs",
        'use accelerator = "cpu" for a local rehearsal',
    ),
    # slurm
    "MDC410": Code("[slurm] container without [job] image", "set [job] image"),
    "MDC411": Code(
        "warning: [job] image without [slurm] container", "add container, or drop image"
    ),
    "MDC412": Code(
        "an #SBATCH value with whitespace, quotes, # or a backslash",
        "remove those characters",
    ),
    "MDC413": Code("sbatch_args sets a directive mdc writes or is malformed", "use its own key"),
    "MDC414": Code("srun_args sets the task layout or is malformed", "remove it"),
    "MDC415": Code("time is not a SLURM time limit", "use minutes, HH:MM:SS or D-HH:MM:SS"),
    "MDC416": Code("mem is not a SLURM memory size", "use MB or a size like 480G"),
    "MDC417": Code("gpus_per_node is not a GPU count", "use COUNT or TYPE:COUNT"),
    "MDC418": Code("a container mount is not /SRC[:/DST[:FLAGS]]", "fix the mount"),
    "MDC419": Code(
        "warning: fewer GPUs per node than processes",
        "match gpus_per_node to nproc_per_node",
    ),
    "MDC420": Code(
        "each node's task (which runs every rank of the node) gets fewer CPUs than ranks",
        "set cpus_per_task to at least nproc_per_node, or leave exclusive at its default",
    ),
    # ssh
    "MDC430": Code("[ssh] hosts do not name nnodes hosts", "list exactly nnodes hosts"),
    "MDC431": Code("a host is not a host name or address", "fix it"),
    "MDC432": Code("warning: one host runs two nodes", "list each machine once"),
    "MDC433": Code("an ssh_options entry is not Key=Value", "write Key=Value"),
    "MDC434": Code("remote_dir is not absolute", "give an absolute path"),
    "MDC435": Code("forward_env names a variable launch.sh sets", "remove it"),
    "MDC436": Code("warning: [job] image is not used on ssh", "remove it"),
    "MDC437": Code("master_addr is not a host name or address", "fix it"),
    "MDC438": Code("user is not a login name", "fix it"),
    # kubernetes
    "MDC441": Code("an elastic job on an Indexed Job", "remove min_nnodes"),
    "MDC442": Code(
        "[job] image begins or ends with whitespace, which the apiserver refuses in a pod",
        "remove the whitespace",
    ),
    "MDC443": Code(
        "more nodes than the apiserver lets an Indexed Job run at once (100000)",
        "run at most 100000 nodes",
    ),
    "MDC444": Code(
        "warning: the ConfigMap of launch files is larger than kubectl apply's last-applied "
        "annotation can be (the apiserver holds annotations to 256 KiB)",
        "apply with kubectl apply --server-side or kubectl create, or ship large files in "
        "the image",
    ),
    # Kubernetes: networks, queues, gangs, GPU sharing
    "MDC450": Code(
        "a pod annotation the apiserver refuses (a key that is not a qualified name, more "
        "than 256 KiB in all) or that another key of the table sets",
        "write the key as PREFIX/NAME, or drop the other key",
    ),
    "MDC451": Code(
        "an extended_resources entry the apiserver refuses: not an extended resource name, "
        "not a whole number, or the GPU resource itself",
        "name the device plugin's resource (rdma/ib, vpc.amazonaws.com/efa) with a whole count",
    ),
    "MDC452": Code(
        "a Multus network entry that is not one network; warning: networks with "
        "host_network, where Multus attaches none",
        "one network per entry; use either host_network or networks",
    ),
    "MDC453": Code(
        "a Volcano gang sent to another scheduler, or gang_queue without a gang",
        'remove scheduler_name, or set gang = "volcano"',
    ),
    "MDC454": Code(
        "a gpu_memory or gpu_cores the GPU-sharing plugin cannot take: no gpu_sharing, "
        "a memory that is not whole units of it, cores outside 1-100, no GPUs to share",
        "set gpu_sharing and gpus_per_node, and write the plugin's units",
    ),
    # shared Kubernetes
    "MDC460": Code("no [job] image for pods", "set [job] image"),
    "MDC461": Code("a name that is not a valid Kubernetes name", "follow the rule shown"),
    "MDC462": Code("an invalid label key", "fix the key"),
    "MDC463": Code("a toleration with operator Exists and a value", "remove the value"),
    "MDC464": Code(
        "a resource the apiserver refuses: not a Kubernetes quantity (ASCII digits), a "
        "negative one, or a gpu_resource that is not an extended resource name",
        "use a quantity such as 64Gi or 500m, and a name such as nvidia.com/gpu",
    ),
    "MDC465": Code(
        "a volume the apiserver refuses or that hides another: a name used twice, a mount "
        "path taken (/mdc, /dev/shm, once resolved), a hostPath with '..'",
        "rename it, mount it at its own path, or write the hostPath without '..'",
    ),
    "MDC466": Code("gpus_per_node on a cpu job", "remove it, or set the accelerator"),
    "MDC467": Code("the launch files exceed a ConfigMap's 1 MiB", "make the launch files smaller"),
    "MDC468": Code(
        "a Service would be named <job>, which does not start with a letter (DNS-1035)",
        "start the job name with a letter",
    ),
    "MDC469": Code(
        "the job's Service or Job name is one another job's backend derives (<job>-leader, ...)",
        "rename the job so it does not end in the derived suffix",
    ),
    # pytorchjob
    "MDC470": Code("pod names the operator derives would be too long", "shorten the job name"),
    "MDC471": Code("a launcher with several roles on a PyTorchJob", "use the kubernetes backend"),
    "MDC472": Code(
        "a fractional GPU quantity (extended resources are whole numbers)",
        "write a whole number of GPUs",
    ),
    "MDC473": Code(
        "[kubernetes] cluster_domain is not a DNS domain", "the kubelet's --cluster-domain"
    ),
    # megatron (optimizer and bf16 layers)
    "MDC474": Code(
        "num_distributed_optimizer_instances does not divide dp * cp or the expert "
        "data-parallel size (Megatron-Core asserts it)",
        "set it to a divisor of both",
    ),
    "MDC475": Code(
        "first_last_layers_bf16 that Megatron-Core refuses (fp8's delayed recipe, a count "
        "outside 0..num_layers // pp), or (warning) a bf16-layer key that has no effect",
        "follow the hint: change fp8_recipe or the count, or remove the key",
    ),
    "MDC476": Code(
        "optimizer = muon or dist_muon with what Megatron-LM refuses beside it (the "
        "distributed optimizer, overlapped reduce or gather, FSDP, fp16, another checkpoint "
        "format)",
        "remove the option the message names, or use another optimizer",
    ),
    "MDC477": Code(
        "DeepSeek-V4 attention keys Megatron-Core refuses (without multi_latent_attention, "
        "too few csa_compress_ratios, no indexer sizes, o_groups not dividing the heads, "
        "tp > 1), or such a key without experimental_attention_variant",
        "follow the hint: set the key it names",
    ),
    "MDC478": Code(
        "hash-routed MoE layers with pp > 1 and no pipeline_model_parallel_layout "
        "(Megatron-Core asserts it)",
        "set [megatron] pipeline_model_parallel_layout",
    ),
    "MDC479": Code(
        "--attention-backend in the arguments disagrees with [model] flash_attention "
        "(eager unfused/local attention keeps the seq x seq scores, a fused kernel does not)",
        "set [model] flash_attention as the hint says",
    ),
    # trainjob
    "MDC480": Code("pod names the Trainer derives would be too long", "shorten the job name"),
    "MDC481": Code("an elastic TrainJob", "remove min_nnodes"),
    "MDC482": Code("a launcher with several roles on a TrainJob", "use the kubernetes backend"),
    "MDC483": Code("a field a TrainJob cannot set", "remove it from [trainjob]"),
    # mdc import madengine
    "MDC500": Code("warning: a madengine key dropped, with the reason", "nothing; read the reason"),
    "MDC501": Code("warning: not a madengine key", "fix its spelling (did-you-mean)"),
    "MDC502": Code(
        "warning: a value madengine takes from its model card: a placeholder",
        "edit the placeholder in the spec",
    ),
    "MDC503": Code("warning: a madengine default applied", "nothing; set it to change it"),
    "MDC504": Code("warning: a key reinterpreted", "check the new meaning"),
    "MDC505": Code("warning: a madengine bug mdc does not copy", "nothing"),
    "MDC530": Code("both k8s and slurm blocks", "keep one"),
    "MDC531": Code("deploy contradicts the blocks", "make them agree"),
    "MDC532": Code("a block that must be an object is not", "make it an object"),
    "MDC533": Code("not a madengine additional context", "give madengine's context JSON"),
    # accelerator models
    "MDC600": Code(
        "accelerator_model names no entry of the hardware catalogue",
        "use an id the hint lists (mdc's own, or one a plugin adds with mdc_register_hardware)",
    ),
    "MDC601": Code(
        "accelerator names another vendor than accelerator_model's",
        "remove accelerator (the model sets it) or make the two agree",
    ),
    "MDC602": Code(
        "the GEMMs run in fp8 or fp4 (or MXFP8's block scaling), which accelerator_model has "
        "no tensor cores for",
        "train in bf16, or name an accelerator that has them",
    ),
    # mdc tune
    "MDC603": Code(
        "warning: [distributed] network is set without accelerator_model, whose predictions it"
        " changes",
        "set accelerator_model, or remove network",
    ),
    "MDC610": Code(
        "mdc tune does not search this launcher's layouts: its plugin declares no search space",
        "use a launcher whose plugin declares one (megatron and torchtitan do)",
    ),
    "MDC611": Code(
        "mdc tune needs a known accelerator_model to predict throughput",
        "set [distributed] accelerator_model",
    ),
    "MDC612": Code("mdc tune needs a complete [model] table", "add the [model] keys it lists"),
    "MDC613": Code("mdc tune needs [batch] global_batch_size", "set global_batch_size"),
    # mdc tune: serving
    "MDC620": Code(
        "warning: [workload] is set for a training launcher, which does not read it",
        "remove [workload], or use a serving launcher",
    ),
    "MDC621": Code(
        "mdc tune on a serving launcher needs [workload]",
        "add [workload] input_tokens, output_tokens and concurrency (or request_rate)",
    ),
    "MDC622": Code(
        "mdc tune does not search this serving launcher's deployments",
        "use a launcher it searches (trtllm, vllm, sglang_disagg, vllm_disagg)",
    ),
    "MDC623": Code(
        "[workload] gives both concurrency and request_rate, or neither",
        "keep one: concurrency (a closed loop) or request_rate (Poisson arrivals)",
    ),
    "MDC624": Code(
        '[model] dtype = "fp4" is an FP4 checkpoint to serve; a training launcher does not '
        "train from one",
        'serve it (vllm, sglang, trtllm, ...), or train in FP4 from dtype = "bf16" with the '
        "launcher's FP4 recipe (Megatron's fp4_format)",
    ),
    "MDC625": Code(
        "the step budget --max-num-batched-tokens is below vLLM's --max-num-seqs, which it "
        "refuses (every running request takes a token of each step)",
        "raise --max-num-batched-tokens to --max-num-seqs or more, or lower --max-num-seqs",
    ),
    # trtllm, trtllm_disagg
    "MDC700": Code("no [trtllm] model", "set [trtllm] model"),
    "MDC701": Code(
        "a server's tp x pp GPUs neither divide a node's GPUs nor are whole nodes, or do not "
        "divide the job's",
        "set tp and pp so that tp x pp divides nproc_per_node or is whole nodes",
    ),
    "MDC702": Code(
        "ep does not divide tp, or etp is not tp / ep (TensorRT-LLM's Mapping)",
        "set ep to a divisor of tp; remove etp",
    ),
    "MDC703": Code(
        "a flag in args contradicts the key (or plan size) it stands for, or has no usable value",
        "keep one of the two, or make them agree",
    ),
    "MDC704": Code("context parallelism with the trtllm launchers", "remove cp"),
    "MDC705": Code(
        "a server over several nodes on a backend with no MPI launcher across its nodes",
        "use the slurm backend, or servers inside one node",
    ),
    "MDC706": Code("warning: the command does not end in trtllm-serve", 'use ["trtllm-serve"]'),
    "MDC707": Code("a TensorRT-LLM server cannot run an elastic job", "remove min_nnodes"),
    "MDC708": Code(
        "args pass --extra_llm_api_options while mdc writes that file",
        "move its options into extra_llm_api_options",
    ),
    "MDC709": Code(
        "warning: kv_cache_config in the LLM API options replaces the command line's "
        "--kv_cache_free_gpu_memory_fraction",
        "set free_gpu_memory_fraction inside kv_cache_config",
    ),
    "MDC710": Code(
        "a disaggregated trtllm job lacks [trtllm.context] or [trtllm.generation]",
        "give both role tables",
    ),
    "MDC711": Code(
        "a context or generation server would cross a node's edge",
        "give each role's tp_size x pp_size a divisor of nproc_per_node, or whole nodes",
    ),
    "MDC712": Code(
        "the context and generation servers do not use exactly the job's GPUs",
        "set each role's servers and sizes to use every GPU",
    ),
    "MDC713": Code("a role's ep_size does not divide its tp_size", "set ep_size to a divisor"),
    "MDC715": Code("a server port exceeds 65535 or is router_port", "move port or router_port"),
    "MDC717": Code(
        "a context or generation server over several nodes on a backend with no MPI launcher",
        "use the slurm backend, or servers inside one node",
    ),
    # vllm_disagg
    "MDC720": Code("no [vllm_disagg] table with model", "add [vllm_disagg] model"),
    "MDC721": Code(
        "a role's engine spans nodes (tensor_parallel_size above nproc_per_node), a server "
        "over nodes is not whole nodes of whole engines, or a server crosses a node's edge",
        "tensor_parallel_size at most nproc_per_node; tp x dp a multiple of it, or inside a node",
    ),
    "MDC722": Code(
        "a role's nodes (GPUs) do not hold whole servers of that role",
        "set prefill_/decode_ nodes (gpus) to multiples of one server's",
    ),
    "MDC723": Code("vllm_disagg servers take no pp or cp", "remove pp and cp from [parallelism]"),
    "MDC724": Code("disaggregated serving cannot run elastic", "remove min_nnodes"),
    "MDC725": Code(
        "warning: the command does not look like a vLLM server", 'use command = ["vllm", "serve"]'
    ),
    "MDC726": Code("a server, proxy or NIXL port exceeds 65535", "lower the port keys"),
    "MDC727": Code(
        "the proxy's, the servers' HTTP and the NIXL side-channel ports overlap",
        "keep router_port, port and side_channel_port apart",
    ),
    "MDC728": Code(
        "the command passes a flag the vllm_disagg launcher writes, or an args list one whose "
        "value disagrees with its key or with the value mdc writes (vLLM would keep the last)",
        "remove the flag, or make the two agree (an agreeing flag is read as its key)",
    ),
    "MDC729": Code(
        "a size flag in args has a value vLLM refuses",
        "give it a whole number of at least 1",
    ),
    "MDC730": Code(
        "a role's tensor_parallel_size does not divide the model's attention heads (vLLM "
        "refuses it)",
        "pick a tensor_parallel_size from the hint",
    ),
    "MDC731": Code(
        "--api-server-count in the args of a role whose servers span nodes (vLLM refuses it "
        "on the --headless nodes)",
        "move it to the role's head_args",
    ),
    # jobset
    "MDC740": Code("an elastic job on a JobSet", "remove min_nnodes, or use pytorchjob"),
    # kuberay
    "MDC750": Code(
        "a job on the kuberay backend that is not one vLLM server over Ray on two nodes or more",
        "run vLLM over Ray across the nodes, or use the kubernetes or leaderworkerset backend",
    ),
}


def section(code: str) -> str:
    """The catalogue section a code belongs to."""
    number = int(code[3:])
    for first, last, title in RANGES:
        if first <= number <= last:
            return title
    raise ValueError(f"{code} is in no range of mdc.codes.RANGES")
