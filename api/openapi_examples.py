"""Worked request examples shown in the OpenAPI docs (``/docs``) for POST /plan and POST /evaluate.

Each ``value`` is a complete, valid request; a test validates every one of them against the
request models.
"""

from __future__ import annotations

from typing import Any

from fastapi.openapi.models import Example

_LLAMA3_70B_JOB: dict[str, Any] = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 8192, "global_batch_size": 1024, "precision": "bf16"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
}

PLAN_EXAMPLES: dict[str, Example] = {
    "llama3-70b": {
        "summary": "Llama 3 70B on 1024 H100 (DGX H100 preset)",
        "description": "Preset model and cluster; the five fastest layouts.",
        "value": {**_LLAMA3_70B_JOB, "search": {"top_k": 5, "time_limit_s": 10}},
    },
    "pinned-search": {
        "summary": "Pin TP, restrict recompute and ZeRO",
        "description": "`fix` pins layout fields; `allow` restricts the candidates of others.",
        "value": {
            **_LLAMA3_70B_JOB,
            "search": {
                "top_k": 3,
                "time_limit_s": 10,
                "fix": {"tp": 8},
                "allow": {"recompute": ["core_attn", "full"], "zero_stage": [1]},
            },
        },
    },
    "deepseek-v3-nvl72": {
        "summary": "DeepSeek-V3 (MoE + MLA) on GB200 NVL72",
        "value": {
            "model": {"preset": "deepseek-v3"},
            "training": {"seq_len": 4096, "global_batch_tokens": 62914560, "precision": "fp8"},
            "cluster": {"preset": "gb200-nvl72", "num_gpus": 2304},
            "search": {"top_k": 5, "time_limit_s": 10},
        },
    },
    "custom-architecture": {
        "summary": "Explicit architecture on an explicit cluster",
        "description": "No presets: every architecture field, and the hardware by catalog id.",
        "value": {
            "model": {
                "name": "dense-13b",
                "num_layers": 40,
                "hidden_size": 5120,
                "ffn_hidden_size": 13824,
                "num_attention_heads": 40,
                "num_kv_heads": 40,
                "vocab_size": 32000,
                "activation": "swiglu",
                "tied_embeddings": False,
            },
            "training": {"seq_len": 4096, "global_batch_size": 512, "precision": "bf16"},
            "cluster": {
                "num_gpus": 64,
                "gpu": "a100-sxm-80gb",
                "gpus_per_node": 8,
                "nvlink_domain_size": 8,
                "network": "ib-hdr-200",
                "nics_per_node": 8,
            },
            "search": {"top_k": 5, "time_limit_s": 5},
        },
    },
}

EVALUATE_EXAMPLES: dict[str, Example] = {
    "llama3-70b-tp8-pp4": {
        "summary": "Llama 3 70B, TP 8 x PP 4 x DP 32 on 1024 H100",
        "description": "Unstated knobs take defaults; `dp` is derived; the best placement is used.",
        "value": {
            **_LLAMA3_70B_JOB,
            "config": {
                "tp": 8,
                "pp": 4,
                "cp": 1,
                "vpp": 5,
                "micro_batch_size": 1,
                "zero_stage": 1,
                "recompute": "core_attn",
            },
        },
    },
    "llama3-70b-no-recompute": {
        "summary": "Same job, no activation recompute (may not fit: fits_memory tells)",
        "value": {
            **_LLAMA3_70B_JOB,
            "config": {
                "tp": 8,
                "pp": 8,
                "micro_batch_size": 1,
                "zero_stage": 1,
                "recompute": "none",
            },
        },
    },
}

COMPARE_EXAMPLES: dict[str, Example] = {
    "tp8-vs-tp4-vpp": {
        "summary": "Llama 3 70B on 1024 H100: TP8 PP4 against TP8 PP4 VPP5",
        "description": "Each layout scored as /evaluate scores it; deltas against the first.",
        "value": {
            **_LLAMA3_70B_JOB,
            "layouts": [
                {"tp": 8, "pp": 4, "zero_stage": 1, "recompute": "core_attn"},
                {"tp": 8, "pp": 4, "vpp": 5, "zero_stage": 1, "recompute": "core_attn"},
            ],
        },
    },
}
