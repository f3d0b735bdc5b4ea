"""Launch settings: exact Megatron-LM and Megatron-Bridge strings; torchtitan, DeepSpeed parse."""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib

import pytest

from optimizer.cost.rules import ResolvedLayout
from optimizer.errors import InvalidLayout
from optimizer.launch import MEGATRON_FLAGS, build_launch, default_stage_layers
from optimizer.params import layer_params
from optimizer.results import LaunchArgs
from optimizer.specs import ClusterSpec, JobSpec, Layout, ModelSpec, MoEConfig, TrainingSpec

LLAMA3_70B = ModelSpec(
    name="llama3-70b",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    vocab_size=128256,
    ffn_hidden_size=28672,
)
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    vocab_size=32000,
    ffn_hidden_size=14336,
    moe=MoEConfig(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
)
DENSE_8B = ModelSpec(
    name="dense-8b",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    vocab_size=128256,
    ffn_hidden_size=14336,
)
DENSE_40L = ModelSpec(
    name="t", num_layers=40, hidden_size=4096, num_attention_heads=32, vocab_size=32000,
    ffn_hidden_size=11008,
)  # fmt: skip


def llama_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    training = TrainingSpec(seq_len=8192, global_batch_size=1024, precision="bf16")
    layout = Layout(
        tp=8, pp=4, vpp=5, cp=1, dp=32, micro_batch_size=1, num_micro_batches=32,
        zero_stage=1, recompute="selective",
    )  # fmt: skip
    return LLAMA3_70B, training, layout


def mixtral_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    training = TrainingSpec(seq_len=4096, global_batch_size=256, precision="bf16")
    layout = Layout(
        tp=2, pp=4, ep=8, dp=8, micro_batch_size=1, num_micro_batches=32, zero_stage=1,
        recompute="full",
    )  # fmt: skip
    return MIXTRAL_8X7B, training, layout


def zero3_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    training = TrainingSpec(seq_len=8192, global_batch_size=512, precision="fp8")
    layout = Layout(tp=1, pp=1, dp=64, micro_batch_size=2, num_micro_batches=4, zero_stage=3, recompute="none")
    return DENSE_8B, training, layout


def uneven_case(stage_layers: list[int], vpp: int = 1) -> tuple[ModelSpec, TrainingSpec, Layout]:
    training = TrainingSpec(seq_len=4096, global_batch_size=64, precision="bf16")
    layout = Layout(
        tp=2, pp=4, vpp=vpp, dp=8, micro_batch_size=1, num_micro_batches=8, zero_stage=1,
        recompute="selective", stage_layers=stage_layers,
    )  # fmt: skip
    return DENSE_40L, training, layout


def mixtral_moe_recompute_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    model, training, layout = mixtral_case()
    return model, training, layout.model_copy(update={"recompute": "moe"})


def mixtral_moe_recompute_fp8_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    """The whole-MoE-block recompute in fp8: its modules include ``layernorm``, which Megatron-Core
    refuses with fp8 delayed scaling."""
    model, training, layout = mixtral_moe_recompute_case()
    return model, training.model_copy(update={"precision": "fp8"}), layout


def tp_overlap_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    model, training, layout = llama_case()
    return model, training.model_copy(update={"tp_comm_overlap": True}), layout


def ep_overlap_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    model, training, layout = mixtral_case()
    return model, training.model_copy(update={"ep_comm_overlap": True}), layout


def deepep_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    """DeepEP through the flex dispatcher, experts padded to 1.25x their share."""
    model, training, layout = mixtral_case()
    return model, training.model_copy(update={"moe_dispatcher": "deepep", "moe_capacity_factor": 1.25}), layout


def fp4_case() -> tuple[ModelSpec, TrainingSpec, Layout]:
    model, training, layout = llama_case()
    return model, training.model_copy(update={"precision": "fp4"}), layout


ALL_CASES = {
    "llama3-70b": llama_case(),
    "llama3-70b-pp-inside-dp": (*llama_case(), True),  # the rank order tp-cp-ep-pp-dp
    "llama3-70b-fp4": fp4_case(),
    "mixtral-ep-overlap": ep_overlap_case(),
    "llama3-70b-tp-overlap": tp_overlap_case(),
    "mixtral-ep8": mixtral_case(),
    "mixtral-deepep": deepep_case(),  # the flex dispatcher's backend and capacity flags
    "mixtral-moe-recompute": mixtral_moe_recompute_case(),
    "mixtral-moe-recompute-fp8": mixtral_moe_recompute_fp8_case(),
    "zero3": zero3_case(),
    "uneven-first-last": uneven_case([9, 10, 10, 11]),
    "uneven-layout": uneven_case([10, 9, 10, 11]),
    "vpp-first-last": uneven_case([4, 5, 5, 6, 4, 5, 5, 6], vpp=2),
    "vpp-layout": uneven_case([5, 5, 5, 5, 4, 6, 5, 5], vpp=2),
    "zero2-fp16": (
        DENSE_8B,
        TrainingSpec(seq_len=2048, global_batch_size=128, precision="fp16"),
        Layout(tp=4, pp=2, cp=2, dp=4, micro_batch_size=4, num_micro_batches=8, zero_stage=2),
    ),
    "zero2-fp16-fp32-grads": (
        DENSE_8B,
        TrainingSpec(seq_len=2048, global_batch_size=128, precision="fp16", grad_reduce_in_fp32=True),
        Layout(tp=4, pp=2, cp=2, dp=4, micro_batch_size=4, num_micro_batches=8, zero_stage=2),
    ),
    "zero0-dp-only": (
        DENSE_8B,
        TrainingSpec(seq_len=4096, global_batch_size=64, precision="bf16"),
        Layout(tp=1, pp=1, dp=16, micro_batch_size=2, num_micro_batches=2, zero_stage=0),
    ),
    "llama3-70b-blocking-pp": (
        LLAMA3_70B,
        TrainingSpec(seq_len=8192, global_batch_size=1024, precision="bf16", pp_comm_overlap=False),
        llama_case()[2],
    ),
}


def resolved(model: ModelSpec, training: TrainingSpec, layout: Layout) -> ResolvedLayout:
    """The layout value of ``layout`` on as many H100s as its sizes need."""
    assert layout.dp is not None
    num_gpus = layout.tp * layout.pp * layout.dp * layout.cp
    job = JobSpec(model=model, training=training, cluster=ClusterSpec(preset="dgx-h100", num_gpus=num_gpus))
    return ResolvedLayout.from_spec(layout, job)


def launch(case: tuple) -> LaunchArgs:
    """Launch arguments of ``(model, training, layout)``, or of ``(..., pp_inside_dp)``."""
    model, training, layout, *order = case
    return build_launch(model, training, resolved(model, training, layout), pp_inside_dp=bool(order and order[0]))


def megatron_flags(args: str) -> list[str]:
    return [tok for tok in shlex.split(args) if tok.startswith("--")]


def megatron_value(args: str, flag: str) -> str:
    toks = shlex.split(args)
    return toks[toks.index(flag) + 1]


def nemo_overrides(args: str) -> dict[str, str]:
    out = {}
    for tok in shlex.split(args):
        key, _, value = tok.partition("=")
        assert key and value, tok
        assert key not in out, f"duplicate override {key}"
        out[key] = value
    return out


def comm_overlap_fields(over: dict[str, str]) -> dict[str, str]:
    """The ``comm_overlap`` fields a plan's overrides set, given field by field
    (``comm_overlap.<field>=<value>``) or as one whole section (``comm_overlap={_target_:...,<field>:<value>}``,
    for recipes without one); a plan never gives both."""
    fields = {k.removeprefix("comm_overlap."): v for k, v in over.items() if k.startswith("comm_overlap.")}
    whole = over.get("comm_overlap")
    if whole is None:
        return fields
    assert not fields and whole.startswith("{") and whole.endswith("}"), whole
    pairs = dict(item.split(":", 1) for item in whole[1:-1].split(","))
    assert pairs.pop("_target_") == "megatron.bridge.training.comm_overlap.CommOverlapConfig"
    assert "tp_comm_overlap" in pairs  # CommOverlapConfig's one field without a default
    return pairs


def parse_megatron_layout(layout: str) -> list[list[str]]:
    """Megatron-Core's PipelineParallelLayerLayout.parse_str_to_list, restated."""
    layout = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        layout = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), layout)
    return [list(stage) for stage in layout.split("|")]


# ---------------------------------------------------------------------------------------------
# Megatron-LM: exact strings
# ---------------------------------------------------------------------------------------------


def test_megatron_llama3_70b_interleaved():
    assert launch(llama_case()).megatron == (
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
        "--context-parallel-size 1 --num-virtual-stages-per-pipeline-rank 5 "
        "--micro-batch-size 1 --global-batch-size 1024 --seq-length 8192 --sequence-parallel "
        "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
        "--recompute-granularity selective --hidden-dropout 0.0 --attention-dropout 0.0 --attention-backend fused --bf16 --grad-reduce-in-bf16"
    )


def test_megatron_mixtral_ep8_full_recompute():
    assert launch(mixtral_case()).megatron == (
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
        "--context-parallel-size 1 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
        "--moe-token-dispatcher-type alltoall --moe-grouped-gemm --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --sequence-parallel "
        "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
        "--recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1 --hidden-dropout 0.0 --attention-dropout 0.0 --attention-backend fused --bf16 --grad-reduce-in-bf16"
    )


def test_megatron_dense_model_has_no_moe_flags():
    flags = megatron_flags(launch(llama_case()).megatron)
    assert "--moe-token-dispatcher-type" not in flags and "--moe-grouped-gemm" not in flags
    assert "model.moe_token_dispatcher_type" not in nemo_overrides(launch(llama_case()).nemo)


def test_megatron_zero3_uses_megatron_fsdp_and_fp8():
    assert launch(zero3_case()).megatron == (
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
        "--context-parallel-size 1 --micro-batch-size 2 --global-batch-size 512 "
        "--seq-length 8192 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
        "--use-megatron-fsdp "
        "--data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion "
        "--ckpt-format fsdp_dtensor --ddp-average-in-collective --hidden-dropout 0.0 --attention-dropout 0.0 --attention-backend fused --bf16 --grad-reduce-in-bf16 --fp8-format hybrid"
    )


def test_megatron_zero2_shards_optimizer_and_grads():
    args = launch(ALL_CASES["zero2-fp16"]).megatron
    assert megatron_value(args, "--data-parallel-sharding-strategy") == "optim_grads"
    assert "--use-distributed-optimizer" in megatron_flags(args)
    assert "--fp16" in megatron_flags(args) and "--bf16" not in megatron_flags(args)
    assert megatron_value(args, "--context-parallel-size") == "2"


def test_megatron_zero0_has_no_optimizer_sharding():
    args = launch(ALL_CASES["zero0-dp-only"]).megatron
    flags = megatron_flags(args)
    assert "--use-distributed-optimizer" not in flags
    assert "--use-megatron-fsdp" not in flags
    assert "--sequence-parallel" not in flags  # tp = 1
    assert "--recompute-granularity" not in flags  # the Layout default: none


def test_megatron_uneven_first_last():
    args = launch(uneven_case([9, 10, 10, 11])).megatron
    assert args == (
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
        "--context-parallel-size 1 --decoder-first-pipeline-num-layers 9 "
        "--decoder-last-pipeline-num-layers 11 --micro-batch-size 1 --global-batch-size 64 "
        "--seq-length 4096 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce "
        "--overlap-param-gather --recompute-granularity selective --hidden-dropout 0.0 --attention-dropout 0.0 --attention-backend fused --bf16 --grad-reduce-in-bf16"
    )


def test_megatron_split_not_expressible_by_first_last_uses_exact_layout():
    args = launch(uneven_case([10, 9, 10, 11])).megatron
    assert "--decoder-first-pipeline-num-layers" not in args
    assert "--pipeline-model-parallel-layout 'Et*10|t*9|t*10|t*11L'" in args
    stages = parse_megatron_layout(megatron_value(args, "--pipeline-model-parallel-layout"))
    assert [s.count("t") for s in stages] == [10, 9, 10, 11]
    assert stages[0][0] == "E" and stages[-1][-1] == "L"


def test_megatron_embedding_only_and_loss_only_chunks_use_the_exact_layout():
    """Megatron's account-for-embedding/loss split: the first chunk holds only the embedding and
    the last only the output layer and loss (zero decoder layers each)."""
    launch_args = launch(uneven_case([0, 20, 20, 0]))
    args = launch_args.megatron
    assert "--decoder-first-pipeline-num-layers" not in args
    assert "--pipeline-model-parallel-layout 'E|t*20|t*20|L'" in args
    stages = parse_megatron_layout(megatron_value(args, "--pipeline-model-parallel-layout"))
    assert [s.count("t") for s in stages] == [0, 20, 20, 0]
    assert "E|t*20|t*20|L" in launch_args.nemo


def test_megatron_interleaved_uneven_first_last():
    # Chunks in schedule order: rank r holds chunks r and r + pp.
    flags_args = launch(uneven_case([4, 5, 5, 6, 4, 5, 5, 6], vpp=2)).megatron
    assert megatron_value(flags_args, "--num-virtual-stages-per-pipeline-rank") == "2"
    assert megatron_value(flags_args, "--decoder-first-pipeline-num-layers") == "8"
    assert megatron_value(flags_args, "--decoder-last-pipeline-num-layers") == "12"


def test_megatron_interleaved_layout_is_exclusive_with_vpp_flag():
    args = launch(uneven_case([5, 5, 5, 5, 4, 6, 5, 5], vpp=2)).megatron
    flags = megatron_flags(args)
    assert "--num-virtual-stages-per-pipeline-rank" not in flags
    stages = parse_megatron_layout(megatron_value(args, "--pipeline-model-parallel-layout"))
    assert len(stages) == 4 * 2  # pp * vpp: Megatron derives vpp from the stage count
    assert [s.count("t") for s in stages] == [5, 5, 5, 5, 4, 6, 5, 5]


def test_megatron_default_split_when_layers_do_not_divide():
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    model = DENSE_40L.model_copy(update={"num_layers": 30})
    layout = Layout(tp=1, pp=4, dp=8, micro_batch_size=1, num_micro_batches=8)
    args = launch((model, training, layout)).megatron
    assert megatron_value(args, "--decoder-first-pipeline-num-layers") == "7"
    assert megatron_value(args, "--decoder-last-pipeline-num-layers") == "7"


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_every_megatron_flag_is_in_verified_allow_list(name):
    flags = megatron_flags(launch(ALL_CASES[name]).megatron)
    assert flags
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS


def test_allow_list_is_exactly_what_can_be_emitted():
    emitted = set()
    for case in ALL_CASES.values():
        emitted |= set(megatron_flags(launch(case).megatron))
    # Flags only some layouts need: all of them are exercised by ALL_CASES.
    assert emitted == MEGATRON_FLAGS


# ---------------------------------------------------------------------------------------------
# torchtitan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n in ALL_CASES if ALL_CASES[n][1].precision != "fp4"))
def test_torchtitan_toml_parses_with_right_degrees(name):
    _model, training, layout, *_ = ALL_CASES[name]
    cfg = tomllib.loads(launch(ALL_CASES[name]).torchtitan)
    par = cfg["parallelism"]
    assert par["tensor_parallel_degree"] == layout.tp
    assert par["pipeline_parallel_degree"] == layout.pp
    assert par["context_parallel_degree"] == layout.cp
    assert par["expert_parallel_degree"] == layout.ep
    assert "expert_tensor_parallel_degree" not in par  # no such key at the profile's commit
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == layout.dp
    if layout.zero_stage >= 1:  # FSDP2: DDP would keep the whole optimizer state on every rank
        assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (
            layout.dp,
            1,
        )
    else:
        assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (
            1,
            layout.dp,
        )
    keeps_gathered = layout.zero_stage in (1, 2) and layout.pp == 1
    assert par.get("fsdp_reshard_after_forward") == ("never" if keeps_gathered else None)
    expected_mode = "full" if layout.recompute == "moe" else layout.recompute  # no MoE-block AC
    assert cfg["activation_checkpoint"]["mode"] == expected_mode
    tr = cfg["training"]
    assert tr["global_batch_size"] == training.global_batch_size
    assert tr["seq_len"] == training.seq_len
    # torchtitan: grad accumulation = global / (local * dp); pp micro-batches = local / pp_mbs.
    accum = tr["global_batch_size"] // (tr["local_batch_size"] * layout.dp)
    if layout.pp > 1:
        assert accum == 1
        mbs = par["pipeline_parallel_microbatch_size"]
        assert mbs == layout.micro_batch_size
        assert tr["local_batch_size"] // mbs == layout.num_micro_batches
    else:
        assert "pipeline_parallel_schedule" not in par
        assert tr["local_batch_size"] == layout.micro_batch_size
        assert accum == layout.num_micro_batches


def test_torchtitan_llama3_70b_interleaved_split():
    cfg = tomllib.loads(launch(llama_case()).torchtitan)
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 4 * 5
    assert parts[0][:2] == ["tok_embeddings", "layers.0"]
    assert parts[-1][-2:] == ["norm", "output"]
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [4] * 20
    assert cfg["activation_checkpoint"]["selective_ac_option"] == "op"
    assert cfg["training"]["mixed_precision_param"] == "bfloat16"


def test_torchtitan_uneven_split_follows_plan():
    par = tomllib.loads(launch(uneven_case([10, 9, 10, 11])).torchtitan)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "1F1B"
    layers = [[m for m in p if m.startswith("layers.")] for p in par["module_fqns_per_model_part"]]
    assert [len(p) for p in layers] == [10, 9, 10, 11]
    assert [name for part in layers for name in part] == [f"layers.{i}" for i in range(40)]


def test_torchtitan_precision():
    fp8 = tomllib.loads(launch(zero3_case()).torchtitan)
    assert fp8["model"]["converters"] == ["float8"]
    # bf16 says so too: torchtitan's own configs (llama3_405b.toml) turn float8 on
    assert tomllib.loads(launch(llama_case()).torchtitan)["model"]["converters"] == []
    fp16 = launch(ALL_CASES["zero2-fp16"]).torchtitan
    assert "mixed_precision_param" not in tomllib.loads(fp16)["training"]
    assert "# fp16 has no torchtitan setting" in fp16


# ---------------------------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------------------------

DEEPSPEED_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "data_types",
    "communication_data_type",
    "activation_checkpointing",
}
DEEPSPEED_AC_KEYS = {
    "partition_activations",
    "cpu_checkpointing",
    "contiguous_memory_optimization",
    "number_checkpoints",
    "synchronize_checkpoint_boundary",
    "profile",
}


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_deepspeed_json_parses_and_batch_adds_up(name):
    _model, training, layout, *_ = ALL_CASES[name]
    text = launch(ALL_CASES[name]).deepspeed
    cfg = json.loads(text)
    assert text == json.dumps(cfg, indent=2, sort_keys=True)
    assert set(cfg) <= DEEPSPEED_KEYS
    assert cfg["train_batch_size"] == (
        cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * layout.dp
    )
    assert cfg["train_batch_size"] == training.global_batch_size
    assert cfg["train_micro_batch_size_per_gpu"] == layout.micro_batch_size
    assert cfg["gradient_accumulation_steps"] == layout.num_micro_batches
    zero = cfg["zero_optimization"]
    assert zero["stage"] == layout.zero_stage
    # stage 0 builds no ZeRO optimizer to read overlap_comm (engine.py zero_enabled): not written
    assert zero.get("overlap_comm") is (
        None if layout.zero_stage == 0 else training.dp_comm_overlap or layout.zero_stage == 3
    )
    if layout.zero_stage == 3 and training.dp_comm_overlap:  # a whole layer gathered ahead, as costed
        on_rank = max(sum(layer_params(_model, i).on_rank(layout.tp, layout.ep)) for i in range(_model.num_layers))
        prefetch = max(50_000_000, math.ceil(on_rank))
        assert zero["stage3_prefetch_bucket_size"] == prefetch
        # room for it beside the current layer, and no layer kept gathered for reuse
        assert zero["stage3_max_live_parameters"] == max(1_000_000_000, 2 * prefetch)
        assert zero["stage3_max_reuse_distance"] == prefetch
    else:
        assert not {"stage3_prefetch_bucket_size", "stage3_max_live_parameters"} & set(zero)
    if layout.zero_stage >= 1:  # the plan's two 160 MB gradient buckets (DeepSpeed's default: 5e8 elements)
        elements = 160e6 / (4 if training.grad_reduce_in_fp32 else 2)
        assert zero["reduce_bucket_size"] == elements
        # stage 3 gathers by its prefetch bucket: only stages 1 and 2 read allgather_bucket_size
        assert zero.get("allgather_bucket_size") == (elements if layout.zero_stage <= 2 else None)
    # stage 3 steps one sub group at a time, as costed (memory.DEEPSPEED_SUB_GROUP_ELEMS)
    assert zero.get("sub_group_size") == (1_000_000_000 if layout.zero_stage == 3 else None)
    assert set(zero) <= {"stage", "overlap_comm", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                         "stage3_max_reuse_distance", "reduce_bucket_size", "allgather_bucket_size",
                         "sub_group_size"}  # fmt: skip
    assert cfg["bf16"]["enabled"] == (training.precision in ("bf16", "fp8", "fp4"))
    assert cfg["fp16"]["enabled"] == (training.precision == "fp16")
    # a ZeRO plan's gradient dtype as costed: fp32 with training.grad_reduce_in_fp32, else the
    # 16-bit dtype; without ZeRO DeepSpeed's default (fp32 for bf16 at the profile's commit)
    half = "fp16" if training.precision == "fp16" else "bf16"
    if layout.zero_stage >= 1:
        assert cfg["data_types"] == {"grad_accum_dtype": "fp32" if training.grad_reduce_in_fp32 else half}
    else:
        assert "data_types" not in cfg
    # fp32 gradients are reduced in fp32, as costed (DeepSpeed's default is the 16-bit dtype)
    assert cfg.get("communication_data_type") == ("fp32" if training.grad_reduce_in_fp32 else None)
    if layout.recompute == "none":
        assert "activation_checkpointing" not in cfg
    else:
        assert set(cfg["activation_checkpointing"]) <= DEEPSPEED_AC_KEYS
        # never partitioned: DeepSpeed's partitioning is wrong under sequence parallelism
        assert cfg["activation_checkpointing"]["partition_activations"] is False


def test_deepspeed_zero3_prefetch_holds_one_layer_of_this_rank():
    """Mixtral 8x7B layer: 41,943,040 attention (GQA), 8 experts x 176,160,768, 32,768 router and
    8,192 norm parameters. With TP 2 and EP 4 a rank holds half the attention, the router and norms
    whole (as the cost model holds them) and two experts, not all eight (a bucket of every expert
    would prefetch several layers)."""
    model, training, _ = mixtral_case()
    layout = Layout(tp=2, pp=1, dp=64, ep=4, micro_batch_size=1, num_micro_batches=4, zero_stage=3,
                    recompute="full")  # fmt: skip
    zero = json.loads(launch((model, training, layout)).deepspeed)["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == 41_943_040 // 2 + 32_768 + 8_192 + 2 * 176_160_768


def test_deepspeed_zero3_prefetches_one_llama3_8b_layer():
    # one Llama 3 8B layer: 41,943,040 attention + 176,160,768 MLP + 8,192 norm parameters
    zero = json.loads(launch(zero3_case()).deepspeed)["zero_optimization"]
    assert zero == {"stage": 3, "overlap_comm": True, "stage3_prefetch_bucket_size": 218_112_000,
                    "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 218_112_000,
                    "sub_group_size": 1_000_000_000, "reduce_bucket_size": 80_000_000}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# training.dp_comm_overlap
# ---------------------------------------------------------------------------------------------


def _blocking_dp(case: tuple[ModelSpec, TrainingSpec, Layout]) -> tuple[ModelSpec, TrainingSpec, Layout]:
    model, training, layout = case
    return model, training.model_copy(update={"dp_comm_overlap": False}), layout


def test_megatron_overlap_flags_follow_dp_comm_overlap():
    flags = megatron_flags(launch(_blocking_dp(llama_case())).megatron)
    assert "--overlap-grad-reduce" not in flags and "--overlap-param-gather" not in flags
    # ZeRO-0 has no distributed optimizer: the gradient reduction overlaps, no parameter gather
    flags = megatron_flags(launch(ALL_CASES["zero0-dp-only"]).megatron)
    assert "--overlap-grad-reduce" in flags and "--overlap-param-gather" not in flags


def test_megatron_no_overlap_flags_without_data_parallelism():
    model, training, _ = llama_case()
    one = Layout(tp=8, pp=4, vpp=5, dp=1, micro_batch_size=1, num_micro_batches=1024, zero_stage=1,
                 recompute="selective")  # fmt: skip
    assert "--overlap-grad-reduce" not in megatron_flags(launch((model, training, one)).megatron)


def test_blocking_dp_in_deepspeed_nemo_and_torchtitan():
    # ZeRO-3 without the overlap gathers weights on demand and still reduces gradients under
    # backward (DeepSpeed's stage-3 default overlap_comm), as the cost model has it. (Megatron-FSDP
    # always overlaps at ZeRO-2/3, so no plan names Megatron-LM or Megatron-Bridge for them here.)
    case = _blocking_dp(zero3_case())
    buckets = {"reduce_bucket_size": 80_000_000, "allgather_bucket_size": 80_000_000}
    zero3 = {"stage": 3, "overlap_comm": True, "sub_group_size": 1_000_000_000, "reduce_bucket_size": 80_000_000}
    assert json.loads(launch(case).deepspeed)["zero_optimization"] == zero3
    over = nemo_overrides(launch(case).nemo)
    assert over["ddp.overlap_grad_reduce"] == "false" and over["ddp.overlap_param_gather"] == "false"
    model, training, layout = _blocking_dp(zero3_case())
    zero1 = (model, training, layout.model_copy(update={"zero_stage": 1}))
    assert json.loads(launch(zero1).deepspeed)["zero_optimization"] == {"stage": 1, "overlap_comm": False, **buckets}
    over = nemo_overrides(launch(zero1).nemo)
    assert over["ddp.overlap_grad_reduce"] == "false" and over["ddp.overlap_param_gather"] == "false"
    # Bridge's comm_overlap.setup rewrites the ddp fields from the data-parallel size (on with
    # dp > 1) unless its own fields say otherwise (comm_overlap.py _get_optimizer_overlap_cfgs)
    assert over["comm_overlap.overlap_grad_reduce"] == "false"
    assert over["comm_overlap.overlap_param_gather"] == "false"
    assert "# torchtitan always overlaps data-parallel collectives" in launch(case).torchtitan
    assert "always overlaps" not in launch(zero3_case()).torchtitan


# ---------------------------------------------------------------------------------------------
# Megatron-Bridge (NeMo)
# ---------------------------------------------------------------------------------------------


def test_nemo_llama3_70b_exact():
    assert launch(llama_case()).nemo == (
        "model.tensor_model_parallel_size=8 model.pipeline_model_parallel_size=4 "
        "model.virtual_pipeline_model_parallel_size=5 model.context_parallel_size=1 "
        "model.overlap_p2p_comm=true model.batch_p2p_comm=false "
        "model.sequence_parallel=true model.seq_length=8192 dataset.sequence_length=8192 "
        "train.micro_batch_size=1 train.global_batch_size=1024 mixed_precision=bf16_mixed model.attention_backend=fused "
        "ddp.use_distributed_optimizer=true optimizer.use_distributed_optimizer=true "
        "ddp.overlap_grad_reduce=true ddp.overlap_param_gather=true "
        "model.hidden_dropout=0.0 model.attention_dropout=0.0 "
        "model.recompute_granularity=selective model.recompute_method=null "
        "model.recompute_num_layers=null model.num_layers_in_first_pipeline_stage=null "
        "model.num_layers_in_last_pipeline_stage=null "
        "model.account_for_embedding_in_pipeline_split=false model.account_for_loss_in_pipeline_split=false "
        "model.mtp_num_layers=null model.pipeline_model_parallel_layout=null"
    )


def test_nemo_mixtral_ep_and_full_recompute():
    over = nemo_overrides(launch(mixtral_case()).nemo)
    assert over["model.expert_model_parallel_size"] == "8"
    assert over["model.expert_tensor_parallel_size"] == "1"  # experts whole, as costed
    # the expert all-to-all and grouped expert GEMMs the cost model assumes (Megatron-Core's
    # defaults are an all-gather dispatcher and a loop of per-expert GEMMs)
    assert over["model.moe_token_dispatcher_type"] == "alltoall"
    assert over["model.moe_grouped_gemm"] == "true"
    assert over["model.virtual_pipeline_model_parallel_size"] == "null"
    assert over["model.recompute_granularity"] == "full"
    assert over["model.recompute_method"] == "uniform"
    assert over["model.recompute_num_layers"] == "1"


def test_nemo_zero3_fsdp_and_fp8():
    over = nemo_overrides(launch(zero3_case()).nemo)
    assert over["ddp.use_megatron_fsdp"] == "true"
    assert over["dist.use_megatron_fsdp"] == "true"
    assert over["ddp.data_parallel_sharding_strategy"] == "optim_grads_params"
    assert over["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert over["mixed_precision"] == "bf16_with_fp8_delayed_scaling_mixed"
    assert over["model.recompute_granularity"] == "null"
    assert "model.expert_model_parallel_size" not in over  # dense model
    assert "model.expert_tensor_parallel_size" not in over


def test_nemo_uneven_splits():
    over = nemo_overrides(launch(uneven_case([9, 10, 10, 11])).nemo)
    assert over["model.num_layers_in_first_pipeline_stage"] == "9"
    assert over["model.num_layers_in_last_pipeline_stage"] == "11"
    assert over["model.pipeline_model_parallel_layout"] == "null"
    over = nemo_overrides(launch(uneven_case([10, 9, 10, 11])).nemo)
    assert over["model.num_layers_in_first_pipeline_stage"] == "null"
    # Hydra needs the '|' characters quoted; the shell keeps the inner single quotes.
    assert over["model.pipeline_model_parallel_layout"] == "'Et*10|t*9|t*10|t*11L'"


def test_nemo_fp16_precision():
    assert nemo_overrides(launch(ALL_CASES["zero2-fp16"]).nemo)["mixed_precision"] == "fp16_mixed"


# ---------------------------------------------------------------------------------------------
# Splits, validation, purity
# ---------------------------------------------------------------------------------------------


def test_default_stage_layers():
    assert default_stage_layers(80, 4, 5) == [4] * 20
    assert default_stage_layers(30, 4) == [7, 8, 8, 7]
    assert default_stage_layers(31, 4) == [8, 8, 8, 7]
    assert default_stage_layers(29, 4) == [7, 8, 7, 7]
    assert default_stage_layers(5, 1) == [5]
    for layers, pp, vpp in [(61, 8, 4), (1, 2, 1), (95, 6, 2)]:
        split = default_stage_layers(layers, pp, vpp)
        assert len(split) == pp * vpp and sum(split) == layers
        assert max(split) - min(split) <= 1


def test_launch_takes_the_layout_values_derived_numbers():
    """``build_launch`` takes the layout value: its data-parallel size, micro-batch count and layer
    split are the rules' (``ResolvedLayout.from_spec``), which reject an inconsistent batch or split."""
    model, training, layout = llama_case()
    assert launch((model, training, layout.model_copy(update={"num_micro_batches": None}))) == launch(
        (model, training, layout)
    )
    with pytest.raises(InvalidLayout, match="global_batch_size"):
        resolved(model, training, layout.model_copy(update={"num_micro_batches": 31}))
    model, training, layout = uneven_case([10, 10, 10, 9])
    with pytest.raises(InvalidLayout, match="stage_layers"):
        resolved(model, training, layout)
    model, training, layout = uneven_case([10, 10, 20])
    with pytest.raises(InvalidLayout, match="stage_layers"):
        resolved(model, training, layout)


def test_build_launch_is_pure():
    model, training, layout = mixtral_case()
    lay = resolved(model, training, layout)
    assert build_launch(model, training, lay) == build_launch(model, training, lay)
    assert lay == resolved(model, training, layout)


# ---------------------------------------------------------------------------------------------
# recompute="moe" (whole MoE block) in every framework
# ---------------------------------------------------------------------------------------------


def test_moe_recompute_megatron_modules():
    args = shlex.split(launch(mixtral_moe_recompute_case()).megatron)
    i = args.index("--recompute-modules")
    assert args[i - 2 : i] == ["--recompute-granularity", "selective"]
    assert args[i + 1 : i + 4] == ["core_attn", "layernorm", "moe"]
    assert "--recompute-method" not in args


def _mla_case(recompute: str) -> tuple[ModelSpec, TrainingSpec, Layout]:
    """A small MLA + MoE model (DeepSeek-V3's attention shapes, fewer layers)."""
    model = ModelSpec(
        name="mla-moe", num_layers=8, hidden_size=7168, num_attention_heads=128, num_kv_heads=128,
        vocab_size=129280, ffn_hidden_size=18432,
        mla={"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128},
        moe=MoEConfig(num_experts=64, top_k=8, expert_ffn_hidden_size=2048),
    )  # fmt: skip
    training = TrainingSpec(seq_len=4096, global_batch_size=64, precision="bf16")
    layout = Layout(
        tp=1, pp=2, ep=8, dp=8, micro_batch_size=1, num_micro_batches=8, zero_stage=1, recompute=recompute,
    )  # fmt: skip
    return model, training, layout


@pytest.mark.parametrize(
    ("recompute", "modules"),
    [("selective", ["core_attn", "mla_up_proj"]), ("moe", ["core_attn", "layernorm", "moe", "mla_up_proj"])],
)
def test_mla_recompute_names_the_up_projection_module(recompute, modules):
    """The cost model's selective and moe recompute re-make MLA's per-head q, k, v from the
    latents (``cost.layer.MLA_UP_RECOMPUTED``): Megatron and Bridge are told so."""
    out = launch(_mla_case(recompute))
    args = shlex.split(out.megatron)
    i = args.index("--recompute-modules")
    assert args[i + 1 : i + 1 + len(modules)] == modules
    assert nemo_overrides(out.nemo)["model.recompute_modules"] == "[" + ",".join(modules) + "]"
    assert "--recompute-modules" not in launch(_mla_case("none")).megatron
    assert "--recompute-modules" not in launch(_mla_case("op")).megatron  # op keeps q, k, v
    assert "--recompute-modules" not in launch(llama_case()).megatron  # no MLA: Megatron's default


def test_moe_recompute_nemo_modules():
    over = nemo_overrides(launch(mixtral_moe_recompute_case()).nemo)
    assert over["model.recompute_granularity"] == "selective"
    assert over["model.recompute_modules"] == "[core_attn,layernorm,moe]"
    assert "model.recompute_modules" not in nemo_overrides(launch(mixtral_case()).nemo)


def test_moe_recompute_torchtitan_falls_back_to_full_and_says_so():
    text = launch(mixtral_moe_recompute_case()).torchtitan
    section = text.split("[activation_checkpoint]")[1].split("[")[0]
    assert 'mode = "full"' in section
    assert "no MoE-block recompute" in section


# ---------------------------------------------------------------------------------------------
# training.tp_comm_overlap in every framework
# ---------------------------------------------------------------------------------------------


def test_tp_comm_overlap_flags():
    on, off = launch(tp_overlap_case()), launch(llama_case())
    assert "--tp-comm-overlap" in megatron_flags(on.megatron)
    assert "--tp-comm-overlap" not in megatron_flags(off.megatron)
    cfg = tomllib.loads(on.torchtitan)
    assert cfg["parallelism"]["enable_async_tensor_parallel"] is True
    assert cfg["training"]["compile"] is True  # async TP only takes effect when compiled
    assert tomllib.loads(off.torchtitan)["parallelism"]["enable_async_tensor_parallel"] is False  # always said
    assert nemo_overrides(on.nemo)["comm_overlap.tp_comm_overlap"] == "true"
    assert "comm_overlap.tp_comm_overlap" not in nemo_overrides(off.nemo)  # Qwen recipes refuse the key


def test_tp_comm_overlap_needs_sequence_parallel():
    model, training, layout = tp_overlap_case()
    out = launch((model, training, layout.model_copy(update={"sequence_parallel": False})))
    assert "--tp-comm-overlap" not in megatron_flags(out.megatron)
    assert tomllib.loads(out.torchtitan)["parallelism"]["enable_async_tensor_parallel"] is False
    assert "comm_overlap.tp_comm_overlap" not in nemo_overrides(out.nemo)


# ---------------------------------------------------------------------------------------------
# training.ep_comm_overlap in every framework
# ---------------------------------------------------------------------------------------------


def test_ep_comm_overlap_flags():
    on, off = launch(ep_overlap_case()), launch(mixtral_case())
    for flag in ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"):
        assert flag in megatron_flags(on.megatron)
        assert flag not in megatron_flags(off.megatron)
    assert nemo_overrides(on.nemo)["comm_overlap.overlap_moe_expert_parallel_comm"] == "true"
    assert nemo_overrides(on.nemo)["comm_overlap.delay_wgrad_compute"] == "true"
    assert "comm_overlap.overlap_moe_expert_parallel_comm" not in nemo_overrides(off.nemo)
    section = on.torchtitan.split("[parallelism]")[1].split("[")[0]
    assert "no batch-level all-to-all overlap" in section
    assert "all-to-all overlap" not in off.torchtitan


def test_ep_comm_overlap_needs_expert_parallelism():
    model, training, layout = ep_overlap_case()
    out = launch((model, training, layout.model_copy(update={"ep": 1})))
    assert "--overlap-moe-expert-parallel-comm" not in megatron_flags(out.megatron)
    assert "comm_overlap.overlap_moe_expert_parallel_comm" not in nemo_overrides(out.nemo)


# ---------------------------------------------------------------------------------------------
# training.fused_kernels: torch.compile in torchtitan
# ---------------------------------------------------------------------------------------------


def test_torchtitan_compiles_unless_the_job_runs_eager():
    model, training, layout = llama_case()
    assert tomllib.loads(launch((model, training, layout)).torchtitan)["training"]["compile"] is True
    eager = training.model_copy(update={"fused_kernels": False})
    assert tomllib.loads(launch((model, eager, layout)).torchtitan)["training"]["compile"] is False
    eager_async = eager.model_copy(update={"tp_comm_overlap": True})  # async TP needs compile
    assert tomllib.loads(launch((model, eager_async, layout)).torchtitan)["training"]["compile"] is True


# ---------------------------------------------------------------------------------------------
# precision fp4 (NVFP4)
# ---------------------------------------------------------------------------------------------


def test_fp4_flags_in_every_framework():
    out = launch(fp4_case())
    flags = megatron_flags(out.megatron)
    assert "--bf16" in flags and "--fp4-format" in flags and "--fp4-recipe" in flags
    assert "--fp4-format e2m1 --fp4-recipe nvfp4" in out.megatron
    assert "--fp8-format" not in flags
    assert out.nemo == "" and out.nemo_env == {}  # no NVFP4 recipe in Megatron-Bridge v0.1.0rc4
    assert out.torchtitan == ""  # nor in torchtitan 6404b932 (float8 and MXFP8 converters)
    assert json.loads(out.deepspeed)["bf16"]["enabled"] is True


# ---------------------------------------------------------------------------------------------
# training.attention_kernel
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kernel", "backend"), [("flash3", "fused"), ("flash2", "flash"), ("unfused", "unfused")])
def test_attention_kernel_selects_the_te_backend(kernel: str, backend: str):
    model, training, layout = llama_case()
    out = launch((model, training.model_copy(update={"attention_kernel": kernel}), layout))
    assert f"--attention-backend {backend}" in out.megatron
    assert nemo_overrides(out.nemo)["model.attention_backend"] == backend
    # Bridge hands that override on as a string Megatron-Core 0.14 ignores: TE's variables select it
    chosen = {"flash": "NVTE_FLASH_ATTN", "fused": "NVTE_FUSED_ATTN", "unfused": "NVTE_UNFUSED_ATTN"}[backend]
    assert out.nemo_env == {
        name: str(int(name == chosen)) for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
    }
    # torchtitan's SDPA defaults to FlashAttention-2: only the flash3 plan needs a warning
    assert ("SDPA's cuDNN backend" in out.torchtitan) == (kernel == "flash3")
    assert ("materialised scores" in out.torchtitan) == (kernel == "unfused")
    tomllib.loads(out.torchtitan)


# ---------------------------------------------------------------------------------------------
# training.pp_comm_overlap
# ---------------------------------------------------------------------------------------------


def test_pp_comm_overlap_flags():
    model, training, layout = llama_case()  # pp 4, vpp 5: Megatron and Bridge overlap by default
    out = launch((model, training, layout))
    assert "--no-overlap-p2p-communication" not in megatron_flags(out.megatron)
    assert "comm_overlap.overlap_p2p_comm" not in nemo_overrides(out.nemo)
    blocking_training = training.model_copy(update={"pp_comm_overlap": False})
    blocking = launch((model, blocking_training, layout))
    assert "--no-overlap-p2p-communication" in megatron_flags(blocking.megatron)
    assert nemo_overrides(blocking.nemo)["comm_overlap.overlap_p2p_comm"] == "false"
    # Megatron never overlaps without interleaving, and refuses to turn it off with pp = 2
    one_chunk = launch((model, blocking_training, layout.model_copy(update={"vpp": 1})))
    assert "--no-overlap-p2p-communication" not in megatron_flags(one_chunk.megatron)
    two = launch((model, blocking_training, layout.model_copy(update={"pp": 2, "dp": 64, "num_micro_batches": 16})))
    assert "--no-overlap-p2p-communication" not in megatron_flags(two.megatron)


def test_op_level_recompute_in_every_framework():
    model, training, layout = llama_case()
    out = launch((model, training, layout.model_copy(update={"recompute": "op"})))
    assert "--recompute-granularity selective" in out.megatron  # Megatron's nearest
    cfg = tomllib.loads(out.torchtitan)
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "attention-core-only" not in out.torchtitan  # exact for torchtitan: no comment
    assert nemo_overrides(out.nemo)["model.recompute_granularity"] == "selective"
    assert "activation_checkpointing" in json.loads(out.deepspeed)
    sel = launch((model, training, layout.model_copy(update={"recompute": "selective"})))
    assert "attention-core-only" in sel.torchtitan  # torchtitan runs op-level SAC for it


# ---------------------------------------------------------------------------------------------
# experts kept whole (expert tensor parallelism 1), as the cost model keeps them
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("update", "runs"),
    [
        ({"etp": 2}, True),  # FSDP (zero 1): ep 8 divides data_parallel_shard_degree 8 x cp 1
        ({}, False),  # experts whole (etp 1): torchtitan splits them over tp = 2
        ({"etp": 2, "zero_stage": 0}, False),  # DDP: no shard ranks for ep to borrow (1 x 1)
        ({"etp": 2, "zero_stage": 3}, True),
        ({"etp": 2, "cp": 4, "dp": 2, "ep": 2, "num_micro_batches": 128}, False),  # cp 4 does not divide ep 2
    ],
)
def test_torchtitan_expert_parallel_limits_are_flagged(update, runs):
    model, training, layout = mixtral_case()
    layout = layout.model_copy(update=update)
    text = launch((model, training, layout)).torchtitan
    par = tomllib.loads(text)["parallelism"]
    assert "expert_tensor_parallel_degree" not in par
    assert ("does not run there" in text) is not runs


def test_megatron_keeps_experts_whole_only_for_moe_models():
    assert megatron_value(launch(mixtral_case()).megatron, "--expert-tensor-parallel-size") == "1"
    assert "--expert-tensor-parallel-size" not in megatron_flags(launch(zero3_case()).megatron)


@pytest.mark.parametrize(
    ("case", "update", "expected"),
    [
        # DDP refuses a second parallel dimension ("DDP has not supported > 1D parallelism")
        ("llama3-70b", {"zero_stage": 0}, "DDP (zero_stage 0) runs only when"),
        ("zero0-dp-only", {}, None),
        # pp > 1: gathered weights and unsharded gradients until the step's last backward
        ("llama3-70b", {"zero_stage": 3}, "(ZeRO-1 memory): expect more memory per GPU than this ZeRO-3 plan"),
        ("llama3-70b", {"zero_stage": 2}, "than this ZeRO-2 plan"),
        ("llama3-70b", {}, None),  # ZeRO-1 is what the pipeline schedule does
        # pp = 1, ZeRO-1/2: FSDP2 gathers and reduces per micro-batch
        (
            "zero3",
            {"zero_stage": 2},
            "gathers them for each of the 4 micro-batches where the plan gathers once per step:",
        ),
        ("zero3", {"zero_stage": 1}, "gathers once per step and reduce-scatters gradients once per step"),
        ("zero3", {"zero_stage": 1, "micro_batch_size": 8, "num_micro_batches": 1}, None),
        ("zero3", {}, None),  # ZeRO-3 is FSDP2's default
    ],
)
def test_torchtitan_says_where_its_sharding_differs_from_the_plan(case, update, expected):
    model, training, layout = ALL_CASES[case]
    text = launch((model, training, layout.model_copy(update=update))).torchtitan
    comments = [
        line for line in text.splitlines() if line.startswith("#") and ("ZeRO" in line or "DDP (zero_stage" in line)
    ]
    if expected is None:
        assert comments == []
    else:
        assert len(comments) == 1 and expected in comments[0], comments


# ---------------------------------------------------------------------------------------------
# training.grad_reduce_in_fp32
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "fp32", "present", "absent"),
    [
        # --bf16 keeps fp32 gradients unless told otherwise (validate_args)
        ("llama3-70b", False, "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"),
        ("llama3-70b", True, None, "--grad-reduce-in-bf16"),
        # --fp16 keeps fp16 gradients unless told otherwise
        ("zero2-fp16", False, None, "--accumulate-allreduce-grads-in-fp32"),
        ("zero2-fp16-fp32-grads", True, "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16"),
    ],
)
def test_megatron_gradient_precision_follows_the_plan(case, fp32, present, absent):
    model, training, layout = ALL_CASES[case]
    flags = megatron_flags(launch((model, training.model_copy(update={"grad_reduce_in_fp32": fp32}), layout)).megatron)
    assert present is None or present in flags
    assert absent not in flags


def test_torchtitan_says_it_reduces_gradients_in_fp32():
    model, training, layout = zero3_case()
    half = launch((model, training, layout)).torchtitan
    fp32 = launch((model, training.model_copy(update={"grad_reduce_in_fp32": True}), layout)).torchtitan
    assert tomllib.loads(half)["training"]["mixed_precision_reduce"] == "float32"  # its only value
    assert "twice the gradient bytes of this plan" in half
    assert "gradient bytes" not in fp32
    ddp = launch(ALL_CASES["zero0-dp-only"]).torchtitan  # DDP: fp32 parameters under autocast
    assert "DDP keeps fp32 parameters" in ddp


def test_torchtitan_says_its_loss_holds_more_than_a_fused_one():
    model, training, layout = zero3_case()
    fused = launch((model, training, layout)).torchtitan
    unfused = launch((model, training.model_copy(update={"cross_entropy": "unfused"}), layout)).torchtitan
    assert "12 bytes per logit on the last stage where this plan has 6" in fused
    assert "bytes per logit" not in unfused
    tp2 = launch((model, training, layout.model_copy(update={"tp": 2, "dp": 32, "num_micro_batches": 8}))).torchtitan
    assert "16 bytes per logit on the last stage" in tp2  # PyTorch's loss_parallel


def test_layernorm_recompute_in_fp8_asks_for_current_scaling():
    """Megatron-Core's TransformerConfig refuses ``layernorm`` and ``moe_act`` recompute with fp8
    delayed scaling: an fp8 plan whose recompute modules include them (the whole-MoE-block
    recompute: core_attn, layernorm, moe) launches with per-tensor current scaling."""
    out = launch(mixtral_moe_recompute_fp8_case())
    args = shlex.split(out.megatron)
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    assert nemo_overrides(out.nemo)["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    # no such module: the default delayed scaling stays
    assert "--fp8-recipe" not in launch(zero3_case()).megatron
    assert nemo_overrides(launch(zero3_case()).nemo)["mixed_precision"] == "bf16_with_fp8_delayed_scaling_mixed"


def test_pipeline_stages_inside_data_parallelism_launch_with_the_mapping() -> None:
    """A plan costed with pipeline stages inside data parallelism (the order only Megatron lays out)
    launches with Megatron-LM's --use-tp-pp-dp-mapping and Bridge's dist.use_tp_pp_dp_mapping; the
    default order adds neither."""
    inside, default = launch(ALL_CASES["llama3-70b-pp-inside-dp"]), launch(ALL_CASES["llama3-70b"])
    assert megatron_flags(inside.megatron) == [*megatron_flags(default.megatron), "--use-tp-pp-dp-mapping"]
    assert inside.nemo.split() == [*default.nemo.split(), "dist.use_tp_pp_dp_mapping=true"]
    assert "use_tp_pp_dp_mapping" not in default.nemo and "tp-pp-dp" not in default.megatron
