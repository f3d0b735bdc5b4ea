"""Megatron-Bridge overrides that a recipe or Bridge's own setup would otherwise undo
(``NVIDIA-NeMo/Megatron-Bridge`` v0.1.0rc4): ``comm_overlap.setup`` rewrites the data-parallel
overlap from the data-parallel size, some recipes turn TP overlap on (others have no
``comm_overlap`` section and refuse its keys), the Llama 3.1 405B recipe counts the embedding and
loss as pipeline layers, and ``fp16_mixed`` reduces gradients in fp16."""

from __future__ import annotations

from optimizer.service import plan
from optimizer.specs import PlanRequest
from tests.launch.test_launch import comm_overlap_fields, nemo_overrides


def _first_plan(raw: dict) -> tuple:
    response = plan(PlanRequest.model_validate(raw))
    assert response.plans, response.explanation
    return response.plans[0], nemo_overrides(response.plans[0].launch.nemo)


def test_zero2_with_only_context_parallel_ranks_keeps_the_overlap_megatron_fsdp_asserts() -> None:
    # dp 1, cp 8: Bridge's comm_overlap.setup would turn overlap_grad_reduce off (data-parallel size 1)
    # and Megatron-FSDP's optim_grads asserts it on
    p, over = _first_plan({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 65536, "global_batch_size": 16, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "search": {"fix": {"cp": 8, "zero_stage": 2}},
    })  # fmt: skip
    assert (p.config.dp, p.config.cp, p.config.zero_stage) == (1, 8, 2)
    assert over["comm_overlap.overlap_grad_reduce"] == "true" == over["ddp.overlap_grad_reduce"]
    assert over["comm_overlap.overlap_param_gather"] == "true"


def test_blocking_data_parallel_stays_blocking_and_tp_overlap_off() -> None:
    p, over = _first_plan({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 512, "framework": "megatron-bridge",
                     "dp_comm_overlap": False},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"fix": {"tp": 4, "zero_stage": 1}},
    })  # fmt: skip
    assert p.config.dp > 1
    assert over["comm_overlap.overlap_grad_reduce"] == "false" == over["comm_overlap.overlap_param_gather"]
    # the Llama 3 recipe's section turns TP overlap on, which the plan does not cost: named off
    assert over["comm_overlap.tp_comm_overlap"] == "false"
    assert not any("add comm_overlap.tp_comm_overlap=false" in n for n in p.notes)


def test_the_dp_overlap_keys_only_where_bridge_would_set_otherwise() -> None:
    # a default plan with dp > 1: Bridge's setup turns the overlap on, as planned, so no
    # comm_overlap key (the Qwen recipes have no comm_overlap section and refuse them)
    p, over = _first_plan({
        "model": {"preset": "qwen3-30b-a3b"},
        "training": {"seq_len": 4096, "global_batch_size": 256, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    })  # fmt: skip
    assert p.config.dp > 1 and p.config.zero_stage >= 1
    assert not [k for k in over if k.startswith("comm_overlap.")]


def test_pipelined_plans_turn_off_the_recipes_embedding_and_loss_layers() -> None:
    p, over = _first_plan({
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
        "search": {"fix": {"pp": 16}},
    })  # fmt: skip
    assert p.config.pp == 16
    assert over["model.account_for_embedding_in_pipeline_split"] == "false"
    assert over["model.account_for_loss_in_pipeline_split"] == "false"


def test_fp16_plans_cost_the_fp16_gradients_fp16_mixed_reduces() -> None:
    job = {
        "model": {"preset": "gpt3-175b"},
        "cluster": {"preset": "dgx-a100", "num_gpus": 768},
        "search": {"fix": {"tp": 4, "pp": 8, "vpp": 12, "zero_stage": 1, "micro_batch_size": 1}},
    }
    training = {"seq_len": 2048, "global_batch_size": 1536, "precision": "fp16", "framework": "megatron-bridge"}
    fp16, over = _first_plan({**job, "training": training})
    assert over["mixed_precision"] == "fp16_mixed" and fp16.frameworks == ["megatron-bridge"]
    bf16, _ = _first_plan({**job, "training": {**training, "precision": "bf16"}})
    # 175e9 / (tp 4 x pp 8) parameters a GPU: 2 bytes each in fp16, 4 in fp32
    assert bf16.memory_gib.gradients == 2 * fp16.memory_gib.gradients
    assert 10.2 < fp16.memory_gib.gradients < 10.6
    # fp16 with fp32 gradients is not a Bridge recipe: the plan runs nowhere and says why
    forced = plan(PlanRequest.model_validate({**job, "training": {**training, "grad_reduce_in_fp32": True}}))
    assert forced.plans and forced.plans[0].frameworks == []
    assert any("fp16_mixed" in n for n in forced.plans[0].notes), forced.plans[0].notes


def test_recipes_without_a_comm_overlap_section_get_it_whole() -> None:
    p, over = _first_plan({
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 2048, "framework": "megatron-bridge",
                     "ep_comm_overlap": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    })  # fmt: skip
    # Qwen3's recipe has no comm_overlap section: the overrides build it whole, so no note
    section = comm_overlap_fields(over)
    assert section["overlap_moe_expert_parallel_comm"] == "true" == section["delay_wgrad_compute"]
    assert section["tp_comm_overlap"] == "false"
    assert not any("comm_overlap.* overrides" in n for n in p.notes)
    assert any(
        n.startswith("Megatron-Bridge: comm_overlap.delay_wgrad_compute needs Transformer Engine 2.7") for n in p.notes
    )
    plain, plain_over = _first_plan({
        "model": {"preset": "qwen3-30b-a3b"},
        "training": {"seq_len": 4096, "global_batch_size": 256, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    })  # fmt: skip
    assert not any(k.startswith("comm_overlap.") for k in plain_over)
    assert not any("comm_overlap.* overrides" in n for n in plain.notes)


def test_custom_models_writing_comm_overlap_keys_say_the_recipe_needs_the_section() -> None:
    """No recipe is known for a model without a preset: the fields go one by one, with the note."""
    p, over = _first_plan({
        "model": {"name": "moe-custom", "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
                  "num_kv_heads": 4, "ffn_hidden_size": 6144, "vocab_size": 151936,
                  "moe": {"num_experts": 64, "top_k": 4, "expert_ffn_hidden_size": 768}},
        "training": {"seq_len": 4096, "global_batch_size": 512, "framework": "megatron-bridge",
                     "ep_comm_overlap": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "search": {"fix": {"ep": 8}},
    })  # fmt: skip
    assert over["comm_overlap.overlap_moe_expert_parallel_comm"] == "true"
    assert any(n.startswith("Megatron-Bridge: the comm_overlap.* overrides need the recipe's") for n in p.notes)


def test_section_recipes_do_not_defer_the_embedding_gradient_where_megatron_refuses_it() -> None:
    """The Llama 3 recipes defer the embedding's weight gradient; Megatron-Core refuses that with
    pp 1 and without gradient-accumulation fusion (Megatron-FSDP), so those plans turn it off."""
    p, over = _first_plan({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 512, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"top_k": 1, "fix": {"zero_stage": 3}},
    })  # fmt: skip
    assert p.config.pp == 1
    assert over["comm_overlap.defer_embedding_wgrad_compute"] == "false"
    piped, piped_over = _first_plan({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 512, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"top_k": 1, "fix": {"pp": 4, "zero_stage": 1}},
    })  # fmt: skip
    assert "comm_overlap.defer_embedding_wgrad_compute" not in piped_over
