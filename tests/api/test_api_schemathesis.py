"""Property-based API testing: schemathesis generates requests from the OpenAPI schema.

Whatever a client sends, the answer is never a 5xx, and every answer passes every check
schemathesis has (``--checks all``): documented status codes, content types, headers and response
schemas, invalid data rejected (strict types: no numeric strings, no coercion to or from
booleans), schema-valid data accepted (or a 422 for a rule the schema cannot express, such as an
unknown preset id or a layout whose sizes do not multiply to ``num_gpus``), unsupported methods
answered 405 with ``Allow``. Everything is real (validation, catalogs,
planner); requests go in-process (ASGI) one at a time, so the bounded pool never saturates.

Schemathesis derives many valid requests from the request examples of the schema (its
examples and coverage phases), and each valid POST /plan runs a search. To keep the run under
three minutes, the fuzzed app clamps the search time limit to 0.1 s (a search that runs out
answers 200 with what it found; a call still gets at least ``api.pool.MIN_WAIT_S`` to reach a
thread, so the short limit causes no 503) and its POST /plan examples are small jobs (8 GPUs)
instead of the production-sized ones shown in /docs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig

from api.main import create_app
from api.settings import Settings

# slow: the module runs first, at the head of the first xdist worker's queue (make test uses
# --dist worksteal, which steals from the tail), so test_enough_requests_were_generated sees the
# requests of every test_no_server_errors case in its process
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

EXAMPLES_PER_OPERATION = 60
"""12 operations x 60 = 720 generated requests in the fuzzing phase alone (>= 500 required)."""
MIN_TOTAL_REQUESTS = 500
REQUEST_TIMEOUT_S = 30

SMALL_PLAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "preset": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 2048, "global_batch_size": 64, "precision": "bf16"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "search": {
            "top_k": 2,
            "time_limit_s": 0.5,
            "fix": {"tp": 2},
            "allow": {"recompute": ["selective"]},
        },
    },
    "explicit-moe-mla": {
        "model": {
            "name": "tiny-moe",
            "num_layers": 4,
            "hidden_size": 512,
            "num_attention_heads": 8,
            "num_kv_heads": 8,
            "vocab_size": 1000,
            "mla": {
                "q_lora_rank": 64,
                "kv_lora_rank": 32,
                "qk_nope_head_dim": 32,
                "qk_rope_head_dim": 16,
                "v_head_dim": 32,
            },
            "moe": {
                "num_experts": 8,
                "top_k": 2,
                "expert_ffn_hidden_size": 256,
                "num_shared_experts": 1,
            },
        },
        "training": {"seq_len": 1024, "global_batch_tokens": 65536, "precision": "fp8"},
        "cluster": {"gpu": "gb200", "num_gpus": 8, "network": "roce-400"},
        "search": {"top_k": 2, "time_limit_s": 0.5},
    },
}


def fuzzed_app() -> FastAPI:
    app = create_app(Settings(max_time_limit_s=0.1, default_time_limit_s=0.1, solver_workers=2, log_level="warning"))
    body = app.openapi()["paths"]["/plan"]["post"]["requestBody"]["content"]["application/json"]
    body["examples"] = {name: {"summary": name, "value": value} for name, value in SMALL_PLAN_EXAMPLES.items()}
    return app


CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "422"]},
            "negative_data_rejection": {"expected-statuses": ["400", "404", "413", "422"]},
        }
    }
)
"""Schema-valid data may still break a cross-field rule (a 422 naming it) or name an unknown
catalog id (a 404 on the catalog routes). Schema-violating data is refused with a 422, or a 413
when the generated body is over the size limit (a list past its maxItems can be)."""
schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app(), config=CONFIG)

load_all_checks()
ALL_CHECKS = CHECKS.get_all()
"""Every check schemathesis registers (``--checks all``)."""

calls: Counter[str] = Counter()


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case: schemathesis.Case) -> None:
    response = case.call_and_validate(checks=ALL_CHECKS, timeout=REQUEST_TIMEOUT_S)
    calls[case.operation.label] += 1
    assert response.status_code < 500, response.text


def test_enough_requests_were_generated() -> None:
    operations = len(list(schema.get_all_operations()))
    if len(calls) < operations:
        pytest.skip("run together with test_no_server_errors for every operation")
    assert sum(calls.values()) >= MIN_TOTAL_REQUESTS, dict(calls)
