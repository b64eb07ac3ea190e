"""mdc tune against published runs: the issue's targets, computed over tests/published.

* throughput: predicted model TFLOP/s per GPU within +-20 % of the measured value
  (bench/tune_fit.py builds each measured row's case; target: 80 % of the rows), and held
  out by source family (each family's rows predicted by constants fitted without it, every
  constant the family informs started neutral: 80 % of all rows, 70 % of the MoE rows, 75 %
  of the FSDP-style rows, mean error 15 %);
* Narayanan et al. 2021, Table 1: the searched best (tp, pp) equals the paper's
  (bench/tune_targets.py; target: 8 of 10 rows), also read with each row's data-parallel
  size held;
* NVIDIA's recipes that compile: the published layout ranks in the top 5 (target: 70 %),
  read as its parallel sizes (tp, pp, cp, ep) and as the whole layout (with its virtual
  stages and micro batch), and no published layout is discarded as not fitting (target: all).

Each target is asserted where it is met. Where it is not met yet, the test asserts the
level reached today (so the model cannot slide back) and a strict expected failure holds
the issue's threshold: it turns into an error the day the threshold is reached.
"""

from __future__ import annotations

from typing import Any

import pytest
from bench import tune_fit, tune_targets

from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc.tune.perf import DEFAULT

# one worker computes the fixtures (a tune search per published recipe) once, under
# pytest-xdist; they are session-scoped because a worker may run other modules' tests between
# this module's, which would tear a module-scoped fixture down and search again
pytestmark = pytest.mark.xdist_group("tune-targets")


@pytest.fixture(scope="session")
def accuracy(fitted_cases: list[tune_fit.Case]) -> float:
    return float(tune_fit.within(fitted_cases, DEFAULT))


@pytest.fixture(scope="session")
def targets() -> dict[str, Any]:
    compiler = Compiler(load_plugins(autoload=False))
    return {
        "table1": tune_targets.table1(compiler),
        "table1_dp_held": tune_targets.table1(compiler, hold_dp=True),
        "recipes": tune_targets.recipes(compiler),
    }


def test_throughput_within_20_percent_target(accuracy: float) -> None:
    # The issue's target is 80 %; the bound holds what the model reaches today. 67 % before latent MoE was counted, Mamba's kernels charged and the overlapped
    # collectives taxed (and each source's TFLOP/s converted by its own FLOP count); 69 %
    # while the norms and residual adds were charged as a share of the fitted passes; 73 %
    # before the expert gradients crossed the NIC of their expert-data-parallel group, the
    # local expert weights were streamed every micro batch and Nemotron 3 ran its MTP layers;
    # 76 % before the backward tp collectives hid behind the weight-gradient GEMM and
    # tp_exposed was set where the recipes' own tp ranks best; 78 % before the last pipeline
    # stage was charged its own layers (one fewer where the loss counts as a layer); 79.8 %
    # (99 of 124) with AMD's three MI325X rows, compared by their tokens/s; 81.5 % (101 of
    # 124) once the Llama 3 paper's rows ran its interleaved one-layer model chunks and were
    # compared by its own count of attention (every key); 82.6 % (109 of 132) with
    # Megatron-LM's README weak-scaling rows, their unstated micro batch and virtual stages
    # read at the model's best that compiles and fits (81.1 % at Megatron-LM's defaults);
    # 83.7 % (118 of 141) with NeMo's long-sequence Llama 2 7B rows (4k to 1M tokens); 78.0 %
    # (145 of 186) with Megatron-Bridge's 26.06 and 26.06.01 rows, whose releases sped the
    # small MoE models up by kernels and CUDA graphs no setting names; 80.6 % (150 of 186)
    # once the all-to-alls of overlap_moe_expert_parallel_comm hid behind compute and the
    # constants were fitted again (held out: 75.8 %; three-fold cross-validation: 79.0 %);
    # 80.1 % (149 of 186; held out 74.2 %, cross-validated 78.5 %) once selective recompute
    # charged what recompute_modules rerun and eleven rows carried their recipes' modules;
    # 74.4 % (221 of 297) at those constants with Megatron-Bridge's 26.02, 26.02.01 and
    # 26.04 rows (the model then ran NVFP4 GEMMs at the share of their peak that bf16 and
    # fp8 reach); 80.1 % (238 of 297; held out 76.8 %, cross-validated 80.1 %) with
    # fp4_peak fitted beside the other constants; 81.8 % (243 of 297; held out 80.8 %,
    # cross-validated 80.8 %) once every local expert costs a fixed time per MoE layer and
    # pass (expert_overhead_us, fitted with ep_exposed and moe_passes, the rest held); 83.5 %
    # (248 of 297; held out 82.8 %, cross-validated 83.8 %) once 136 MoE rows carry the token
    # dispatcher their recipes ran and the flex dispatcher sends a token once to each other
    # domain holding one of its experts (the three MoE constants fitted again); 80.8 % (256
    # of 317) with NeMo Framework's 25.02, 25.04 and 25.07 rows and each row's gradients
    # reduced in bf16 where its recipe says so; 82.0 % (260 of 317; held out 81.9 %,
    # cross-validated 81.7 %) once each model chunk of the interleaved schedule syncs its
    # data-parallel buffers on its own (gemm_peak fitted again); 82.0 % still (held out
    # 81.9 %, cross-validated 83.0 %) once a dense GEMM's weight widths saturate sharply
    # (width_knee) and all eleven constants were fitted again; 82.8 % (260 of 314) once each
    # row is compiled and predicted as mdc explain predicts its spec (the three rows mdc
    # refuses left out; DeepSeek-V3's and Kimi K2's last stages as their layouts place
    # them), and 84.7 % (266 of 314; held out 83.7 %, cross-validated 84.7 %) with the three
    # MoE constants fitted again; 85.4 % (268 of 314; held out 84.6 %) once attention's kernels
    # run at the measured sequence knee (attention_seq_knee, fitted to kernels.toml's curve);
    # 87.3 % (held out 85.6 %) once GEMMs run at each accelerator's measured level
    # (kernels.toml's [gemm]) and the eleven constants were fitted again; 87.3 % (274 of 314;
    # held out 86.5 %) once the collectives run at NCCL's measured share of each link and
    # the other ten were fitted again; 86.9 % (273 of 314; held out 86.5 %) once Mamba's
    # layers run their counted SSD work at the measured SSD kernels' rate and NVFP4 its
    # measured GEMM level, the constants fitted again (mamba_overhead for mamba_passes; held
    # out by source 60.7 % to 64.1 %); 86.9 % still (held out 87.5 %) once a local expert's
    # fixed time is measured (kernels.toml's [grouped_gemm]) and the other nine were fitted
    # again; 84.7 % (266 of 314; held out 84.6 %) once the permutation's HBM passes are
    # counted from Megatron-Core's kernels instead of fitted (moe_passes 1.42 fitted, 5 to
    # 17 counted), the dense constants held: refitted, elementwise fell from 2.44 to 1.64
    # and the rows in the fit rose to 85.7 %, but held out by source the dense rows fell from
    # 89.3 % to 88.6 % and TorchTitan's from 58.3 % to 50.0 %. The floor holds that level
    # 86.9 % (273 of 314) once NVFP4's casts are counted and the constants fitted again;
    # 86.9 % still once the Mamba layer's kernels are counted as mamba_ssm runs them
    # (mamba_overhead fitted again alone); 86.6 % (272 of 314) once the B300's NVFP4 GEMMs
    # run at their measured rate (kernels.toml's [[fp4_layer]], 5,094 TFLOP/s, for the 8,055
    # the B200's NVFP4-over-fp8 ratio lent it): its three Nemotron 3 Super rows move from
    # -3/-8/-16 % to -9/-14/-21 % at the shipped constants, none refitted; held out by
    # source no row crosses 20 %; 86.6 % still once Mamba's SSD runs at the Triton forward's
    # measured rate (mamba_overhead fitted again alone); 86.3 % (271 of 314; held out every
    # third row 85.6 %, mean error 15.0 % -> 14.3 %) once attention runs at each
    # accelerator's measured level (kernels.toml's [attention_level], none refitted):
    # Qwen3-30B-A3B's 26.08 GB200 row, 19 % slow before, passes 20 % as GB200's attention
    # slows to its measured 0.91 of the H200's share, while held out by source 266 of 326
    # rows are within 20 % where 260 were
    assert accuracy >= 0.863 >= 0.80


@pytest.fixture(scope="session")
def fitted_cases() -> list[tune_fit.Case]:
    return tune_fit.cases()


@pytest.fixture(scope="session")
def by_source(fitted_cases: list[tune_fit.Case]) -> list[tuple[tune_fit.Case, float]]:
    """Each fitted row predicted by constants fitted without its source family, TorchTitan's
    rows at the shipped constants (bench/tune_fit.py --by-source)."""
    return tune_fit.held_out_pairs(fitted_cases, tune_fit.cases(("torchtitan",)))


def test_held_out_fold_starts_neutral_where_its_family_informs(
    fitted_cases: list[tune_fit.Case],
) -> None:
    # The shipped constants were fitted on every family: a fold that holds NVIDIA's
    # summaries out must not start from them where those rows moved them, or the MoE,
    # Mamba and NVFP4 constants (informed by no other family) carry the held-out rows'
    # fit into their own prediction
    nvidia = [c for c in fitted_cases if c.family == "NVIDIA performance summaries"]
    start, reset = tune_fit.fold_start(nvidia)
    assert set(reset) == set(tune_fit.FITTED)
    for name in ("mamba_overhead", "fp4_peak", "gemm_peak"):
        assert getattr(start, name) == tune_fit.NEUTRAL[name] != getattr(DEFAULT, name)
    # a measured constant (kernels.toml) is no fit's: every fold keeps it; the permutation's
    # passes are counted (terms.permute_passes), no constant at all
    assert "expert_overhead_us" not in tune_fit.FITTED
    assert "moe_passes" not in tune_fit.FITTED
    assert start.expert_overhead_us == DEFAULT.expert_overhead_us
    # a dense family's fold keeps the constants its rows never move where they were
    paper = [c for c in fitted_cases if c.family == "Megatron-LM paper (2021)"]
    start, reset = tune_fit.fold_start(paper)
    assert {"mamba_overhead", "fp4_peak"}.isdisjoint(reset)
    assert start.mamba_overhead == DEFAULT.mamba_overhead
    assert "gemm_peak" in reset


def _within(pairs: list[tuple[tune_fit.Case, float]]) -> float:
    return sum(abs(p / c.measured - 1) <= 0.2 for c, p in pairs) / len(pairs)


def _error(pairs: list[tuple[tune_fit.Case, float]]) -> float:
    return sum(abs(p / c.measured - 1) for c, p in pairs) / len(pairs)


def test_held_out_by_source_floors(by_source: list[tuple[tune_fit.Case, float]]) -> None:
    # The issue's targets, judged on rows whose source the fit did not see: 80 % of all rows
    # within 20 %, 70 % of the MoE rows, 75 % of the FSDP-style ones, mean error <= 15 %.
    # Read with each fold starting from the shipped constants, they were met: 82.8 %, MoE
    # 74.0 %, FSDP-style 83.3 %, 14.6 % (73.0 %, 59.9 %, 73.3 % and 16.4 % before the
    # measured GEMM levels and link shares). That reading leaked: the constants only
    # NVIDIA's summaries inform (the MoE, Mamba and NVFP4 ones) kept, in the fold that holds
    # those summaries out, the values fitted on them. With every constant a held-out family
    # informs started neutral (bench.tune_fit.fold_start), 60.7 % (198 of 326), MoE 42.4 %
    # (75 of 177), FSDP-style 76.7 % (23 of 30), 29.2 %; 64.1 % (209 of 326), MoE 42.9 % (76
    # of 177), FSDP-style 80.0 % (24 of 30), 26.9 % once Mamba's SSD and NVFP4's GEMMs run
    # at measured rates, so that their constants' neutral values are those rates; 73.9 %
    # (241 of 326), MoE 61.0 % (108 of 177), FSDP-style 80.0 % (24 of 30), 18.9 % once a
    # local expert's fixed time is measured (no fold then predicts the MoE rows at a neutral
    # 5 us per expert): the floors hold that level, the FSDP-style target still met. With
    # TorchTitan's eager kernels, torchao's float8 casts and all-gather and async TP counted
    # (no fitted row or constant moves), TorchTitan's rows 21.7 % -> 16.7 % mean error
    # (58.3 % within 20 % either way), FSDP-style 15.4 % -> 13.4 %, all 18.9 % -> 18.7 %;
    # 75.2 % (245 of 326), MoE 63.3 % (112 of 177), FSDP-style 80.0 % (13.3 %), 17.6 % once
    # the permutation's passes are counted from Megatron-Core's kernels (no fold then
    # predicts the MoE rows at a neutral one pass)
    moe = [(c, p) for c, p in by_source if c.moe]
    fsdp = [(c, p) for c, p in by_source if c.fsdp]
    titan = [(c, p) for c, p in by_source if c.launcher == "torchtitan"]
    # 76.1 % (248 of 326), MoE 63.8 % (113 of 177), 16.7 % once NVFP4's casts are counted
    # (FSDP-style 13.5 % and TorchTitan's rows 17.3 %: they moved with the refit dense
    # constants, never fitted); 79.1 % (258 of 326), MoE 69.5 % (123 of 177), 15.8 % once
    # the Mamba layer's kernels are counted as mamba_ssm runs them in training (the hybrid
    # rows 23 of 52 within 20 %, 14 before; mamba_overhead 7.92 to 3.84, fitted alone);
    # 79.8 % (260 of 326), MoE 70.6 % (125 of 177, the target met), 15.4 % once the SSD runs
    # at the Triton forward's measured rate (the hybrid rows 25 of 52; mamba_overhead 3.09);
    # 81.6 % (266 of 326), MoE 72.3 % (128 of 177), 14.9 %, FSDP-style 12.4 % once attention
    # runs at each accelerator's measured level (cuDNN's forward kernel, kernels.toml's
    # [attention_level]: GB300 1.16, GB200 0.91, B200 0.96 of the H200's share), every target met
    assert _within(by_source) >= 0.815 >= 0.80
    assert _within(moe) >= 0.723 >= 0.70
    assert _within(fsdp) >= 0.80 >= 0.75
    assert _error(by_source) <= 0.149 <= 0.15
    assert _error(fsdp) <= 0.124
    assert _within(titan) >= 0.58
    assert _error(titan) <= 0.174


def test_held_out_by_source_targets(by_source: list[tuple[tune_fit.Case, float]]) -> None:
    moe = [(c, p) for c, p in by_source if c.moe]
    fsdp = [(c, p) for c, p in by_source if c.fsdp]
    assert _within(by_source) >= 0.80
    assert _within(moe) >= 0.70
    assert _within(fsdp) >= 0.75
    assert _error(by_source) <= 0.15


def test_table1_floor(targets: dict[str, Any]) -> None:
    rows = targets["table1"]
    assert len(rows) == 10
    # 3 before the search tried uneven pipeline splits (76.1B's 60 layers then also went on
    # pp 8 with tp 4); 3 again since the norms and residual adds that tp 8 without sequence
    # parallelism runs unsplit are charged by their bytes; 2 since an fp16 model's gradients
    # take 2 bytes as Megatron-LM keeps them (1T then fits on 32 stages, which the model
    # predicts 5 % faster than the paper's 64; 76.1B keeps tp 8 once the optimizer step's
    # fp32 copy of them is counted); 3 since the rows' pipeline sends are not overlapped with
    # compute, as Megatron-LM did not before 2023 (145.6B then goes to the paper's tp 8, pp 8);
    # 2 since the interleaved schedule's chunks sync their data-parallel buffers on their own
    # and gemm_peak was fitted again (145.6B then a dead heat, tp 4 x pp 16 0.13 % ahead);
    # 4 since a dense GEMM's weight widths saturate sharply (width_knee): tp 8 no longer
    # narrows wide layers' GEMMs, and 145.6B and 18.4B go to the paper's tp 8 by about 3 %;
    # 3 since the collectives run at NCCL's measured share of each link and the GEMM
    # constants were fitted again (width_knee 641 to 766: 18.4B's 768-wide tp 8 splits lose
    # to tp 2 x pp 4). The table is no longer a target (its layouts follow from 2021
    # software); the floor holds the reading
    assert sum(1 for _, paper, mine in rows if paper == mine) >= 3


@pytest.mark.xfail(reason="the searched (tp, pp) is the paper's in 3 of 10 rows", strict=True)
def test_table1_target(targets: dict[str, Any]) -> None:
    assert sum(1 for _, paper, mine in targets["table1"] if paper == mine) >= 8


def test_table1_with_the_papers_data_parallel_size_held(targets: dict[str, Any]) -> None:
    # The table grows the GPUs with the model at 32 data-parallel replicas from 1.7B to
    # 76.1B: with that size held, GPUs / dp fixes tp x pp and the search splits it as the
    # paper did (tp up to the node first) in all but 39.1B, which it runs at tp 4 x pp 4
    # (4.3 % ahead of the paper's tp 8 x pp 2): 9 of 10, the issue's 8 met, since a dense
    # GEMM's weight widths saturate sharply (width_knee; 7 before, 18.4B then on tp 2 with
    # more stages and 145.6B a dead heat); 8 of 10 since the collectives run at NCCL's
    # measured share of each link and the constants were fitted again (18.4B on tp 2 x pp 4,
    # width_knee 641 to 766). Left open, dp is what the search trades (3 of 10).
    rows = targets["table1_dp_held"]
    assert len(rows) == 10
    assert sum(1 for _, paper, mine in rows if paper == mine) >= 8


def test_no_published_recipe_layout_is_discarded_as_not_fitting(targets: dict[str, Any]) -> None:
    recipes = targets["recipes"]
    assert recipes, "no NVIDIA recipe row compiles"
    assert [r["id"] for r in recipes if not r["fits"]] == []


def test_recipes_top5_floor(targets: dict[str, Any]) -> None:
    recipes = targets["recipes"]
    # 36 of 101 in the top 5 (23 of 83 before the overlapped-collective tax made Megatron-FSDP
    # pay for gathering every micro batch, and before uneven pipeline splits were searched;
    # 38 while NVFP4 recipes were searched at the bf16 peak, which hid their communication);
    # 39 of 101 since the interleaved schedule hides its sends and block recompute is
    # charged per model chunk; 55 of 103 with the expert weights streamed every micro batch
    # and the expert gradients over their own group's NICs; 56 with the backward tensor-
    # parallel collectives hidden behind the weight-gradient GEMM; 58 with tp_exposed set
    # at 0.3; 57 since the last pipeline stage is charged its own layers and the output layer
    # (one layer fewer where the loss counts as a layer): 4 Llama 3.1 405B rows on B200 and
    # H100 and a DeepSeek-V3 drop out, 3 on GB200 and a Qwen3-235B come in; 59 since the
    # top rows show each layout once with its best virtual stages; 65 of 112 with NeMo's
    # long-sequence rows (their unstated micro batch and virtual stages not compared); 81 of
    # 157 with Megatron-Bridge's 26.06 and 26.06.01 rows (16 of their 45 in the top 5: on
    # 256 NVL72 GPUs the model prefers Qwen3-235B-A22B on ep 64 without pipeline stages to
    # the recipes' ep 32 with 4-8, Nemotron 3 Super on tp 1 to tp 2, Nemotron 3 Nano without
    # expert parallelism); 119 of 268 with Megatron-Bridge's 26.02, 26.02.01 and 26.04 rows
    # (38 of their 111; the 157 earlier rows still 81); 153 of 268 once every local expert
    # costs a fixed time per MoE layer and pass (ep 1 then no longer beats the recipes' ep 8);
    # 142 of 268 once the rows carry the token dispatcher their recipes ran and the flex
    # dispatcher's one copy per other domain is counted: the refitted ep_exposed (0.58 to
    # 0.95) puts Qwen3-30B-A3B and Nemotron 3 Nano on 8 GPUs back on ep 1 at micro batch 8,
    # a few percent ahead of the recipes' ep 8 (whose sizes stay in the top 5); 154 of 288
    # with NeMo Framework's 20 rows (12 of them), 155 once the interleaved schedule's chunks
    # sync their data-parallel buffers on their own, 156 with the dense GEMMs' width_knee,
    # 151 once the MoE constants were fitted again on the rows as mdc explain predicts them
    # (expert_overhead_us 11.2 to 32.6 us); 152 once attention's kernels run at the measured
    # sequence knee (attention_seq_knee) and a layout that splits the same tokens per rank
    # over cp instead of the micro batch counts as the faster one's variant (137 with the
    # knee alone: those cp variants, no longer exact ties, crowded the top 5); 152 still with
    # the measured GEMM levels and link shares; 147 once a local expert's fixed time is
    # measured (its parallel sizes 222, from 221); 147 still once the permutation's passes
    # are counted (its parallel sizes 225); 99 once the top rows show each parallel layout
    # once, at its best micro batch (the whole layout is then in the top 5 only where mdc's
    # best micro batch for the published sizes is the recipe's; their sizes 229)
    assert sum(1 for r in recipes if r["rank"] is not None) / len(recipes) >= 0.34


@pytest.mark.xfail(reason="the published layout is in the top 5 for 34 % of recipes", strict=True)
def test_recipes_top5_target(targets: dict[str, Any]) -> None:
    recipes = targets["recipes"]
    assert sum(1 for r in recipes if r["rank"] is not None) / len(recipes) >= 0.70


def test_recipes_parallel_sizes_top5_floor(targets: dict[str, Any]) -> None:
    # The published parallel sizes (tp, pp, cp, ep), whatever its virtual stages and micro
    # batch: 75 of 103 (67 while the top rows listed one layout's virtual stages apart); 81
    # of 112 with NeMo's long-sequence rows; 99 of 157 with Megatron-Bridge's 26.06 and
    # 26.06.01 rows (18 of their 45); 101 once selective recompute charged what the
    # recompute modules rerun; 171 of 268 with Megatron-Bridge's 26.02, 26.02.01 and 26.04
    # rows (70 of their 111; the 157 earlier rows still 101); 205 of 268 (the issue's 70 %)
    # once every local expert costs a fixed time per MoE layer and pass: the MoE recipes'
    # sizes rank in the top 5 for 135 of 175 (101 before), the dense ones unchanged; 205
    # still once the rows carry their recipes' token dispatchers and the flex dispatcher's
    # deduplication is counted (without the copies a remote domain fans out over its own
    # links, 198: the search then crossed nodes on B300 and NVL72 racks where recipes do not);
    # 221 of 288 with NeMo Framework's 20 rows (16 of them), 222 once the interleaved
    # schedule's chunks sync their data-parallel buffers on their own; 228 with the dense
    # GEMMs' width_knee; 222 once the MoE constants were fitted again on the rows as mdc
    # explain predicts them; 219 once attention runs at the measured sequence knee and a
    # layout that splits the same tokens per rank over cp instead of the micro batch counts
    # as the faster one's variant (191 with the knee alone): the GB300 Llama 3.1 405B
    # recipes' cp 2 falls behind tp 4 x pp 4 at cp 1; 221 with the measured GEMM levels and
    # link shares; 222 with a local expert's fixed time measured; 225 with the permutation's
    # passes counted from Megatron-Core's kernels; 224 once NVFP4's casts are counted; 225
    # once cp is searched past 16 (NeMo's 1M-token Llama 2 7B run on cp 32); 229 once the top
    # rows show each parallel layout once, at its best micro batch (Qwen3-30B-A3B's ep 16 on
    # 16 H100s in three releases and GPT-3 175B's tp 4 x pp 8 on 128 H100s come in: their
    # slots had held a faster layout again at another micro batch)
    recipes = targets["recipes"]
    assert sum(1 for r in recipes if r["parallel_rank"] is not None) / len(recipes) >= 0.79


@pytest.mark.xfail(reason="the published parallel sizes are in the top 5 for 79.5 %", strict=True)
def test_recipes_parallel_sizes_top5_issue_36_target(targets: dict[str, Any]) -> None:
    """Issue 36: the published parallel sizes in mdc's top 5 for at least 80 % of runs."""
    recipes = targets["recipes"]
    assert sum(1 for r in recipes if r["parallel_rank"] is not None) / len(recipes) >= 0.80


def test_recipes_best_at_most_5_percent_faster_on_the_median(targets: dict[str, Any]) -> None:
    """Issue 36: mdc's best predicted at most 5 % faster than the published layout on the
    median (3.1 % with cp searched past 16)."""
    assert tune_targets.faster(targets["recipes"]) <= 0.05


def test_faster_reads_the_gap_as_best_over_published() -> None:
    # a published layout predicted 20 % slower than the best: the best is 1 / 0.8 = 1.25
    # times as fast; 0 and 50 % slower: 1 and 2 times; a row without a gap is left out
    found: list[dict[str, Any]] = [{"gap": 0.0}, {"gap": 0.5}, {"gap": None}, {"gap": 0.2}]
    assert tune_targets.faster(found) == pytest.approx(0.25)


def _row(
    ident: str, want: dict[str, int], best: dict[str, int], rank: int | None
) -> dict[str, Any]:
    stated = tuple(want)
    full = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "mbs": 1}
    return {"id": ident, "parallel_rank": rank, "want": {**full, **want},
            "stated": stated, "best_sizes": {**full, **best}}  # fmt: skip


def test_recipe_misses_grouped_by_the_settings_that_differ() -> None:
    found = [
        _row(
            "a",
            {"tp": 2, "pp": 8, "ep": 32, "mbs": 1},
            {"tp": 2, "pp": 1, "ep": 64, "mbs": 1},
            None,
        ),
        _row("b", {"tp": 1, "pp": 4, "ep": 32}, {"tp": 1, "pp": 1, "ep": 64, "mbs": 2}, None),
        _row("c", {"tp": 4, "pp": 8}, {"tp": 4, "pp": 4}, None),
        _row("d", {"tp": 4, "pp": 8}, {"tp": 4, "pp": 4}, 3),  # sizes in the top 5
    ]
    # b leaves its micro batch open: mdc's 2 is not a difference
    assert tune_targets.misses(found) == {("pp", "ep"): ["a", "b"], ("pp",): ["c"]}


def test_recipe_misses_cover_every_row_outside_the_top_5(targets: dict[str, Any]) -> None:
    recipes = targets["recipes"]
    groups = tune_targets.misses(recipes)
    outside = sorted(r["id"] for r in recipes if r["parallel_rank"] is None)
    assert sorted(i for ids in groups.values() for i in ids) == outside
    by_id = {r["id"]: r for r in recipes}
    for differ, ids in groups.items():
        for ident in ids:
            want, best = by_id[ident]["want"], by_id[ident]["best_sizes"]
            assert any(want[k] != best[k] for k in ("tp", "pp", "cp", "ep")), ident
            assert all(want[k] != best[k] for k in differ), ident
