"""Jobs that several test folders use, as request documents.

Each is a plain dict for ``PlanRequest``/``EvaluateRequest.model_validate``; a test file takes its
own copy with ``job_copy(...)`` so that no test can change another's job.
"""

from __future__ import annotations

import copy
from typing import Any

LLAMA3_70B_ON_1024_H100: dict[str, Any] = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 8192, "global_batch_size": 1024, "precision": "bf16"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
}
GPT3_175B_ON_1024_H100: dict[str, Any] = {
    "model": {"preset": "gpt3-175b"},
    "training": {"seq_len": 2048, "global_batch_size": 1536},
    "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
}
LLAMA3_8B_ON_8_H100: dict[str, Any] = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
}


def job_copy(doc: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``doc`` with whole sections (``search=...``, ``config=...``) added or replaced."""
    return copy.deepcopy({**doc, **sections})
