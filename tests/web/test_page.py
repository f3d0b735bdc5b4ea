"""The web page in headless Chromium: plans, charts and errors show what the API answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from browser import foreign_urls, requested_urls
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 120
JOBS = {
    "llama3-8b on 64 H100": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 256, "precision": "bf16"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "search": {"top_k": 3},
    },
    "llama3.1-405b on 1,024 H100": {
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
        "search": {"top_k": 3},
    },
}
PIPELINED = {"llama3.1-405b on 1,024 H100"}  # best plan has several pipeline stages
LLAMA3_8B_HF_CONFIG = {  # config.json of meta-llama/Meta-Llama-3-8B (architecture keys)
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def post_plan(base_url: str, job: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}/plan", json=job, timeout=WAIT_S)


def wait_state(driver: WebDriver, *states: str) -> str:
    script = "return document.body.dataset.state"
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(script) in states)
    return str(driver.execute_script(script))


def open_page(driver: WebDriver, url: str) -> None:
    requested_urls(driver)  # drain what earlier tests logged
    driver.get(url)


def chart(driver: WebDriver, testid: str) -> dict[str, Any]:
    """A plotly chart's traces (name, x, y), shapes and title, and how many bars it drew."""
    return driver.execute_script(
        """const gd = document.querySelector(`[data-testid="${arguments[0]}"]`);
        return {traces: gd.data.map(t => ({name: t.name, x: t.x, y: t.y})),
                shapes: gd.layout.shapes || [], title: gd.layout.title.text,
                bars: gd.querySelectorAll('.barlayer .point path').length};""",
        testid,
    )


def cell(row: WebElement, field: str) -> str:
    return row.find_element(By.CSS_SELECTOR, f'td[data-field="{field}"]').text


def assert_row_shows(row: WebElement, plan: dict[str, Any]) -> None:
    config, memory = plan["config"], plan["memory_gib"]
    assert f"TP{config['tp']} PP{config['pp']} DP{config['dp']}" in cell(row, "layout")
    assert cell(row, "step_time_s") == f"{plan['step_time_s']:.3f} s"
    assert cell(row, "tokens_per_s_per_gpu") == f"{int(plan['tokens_per_s_per_gpu'] + 0.5):,}"
    assert cell(row, "mfu") == f"{100 * plan['mfu']:.1f}%"
    assert cell(row, "memory") == f"{memory['total']:.1f} / {memory['capacity'] - memory['headroom']:.1f}"
    assert cell(row, "bottleneck") == plan["bottleneck"]


def assert_memory_chart_shows(driver: WebDriver, plan: dict[str, Any], rank: int) -> None:
    memory = chart(driver, "memory-chart")
    stages = plan["memory_gib"]["per_stage"]
    assert len(stages) == plan["config"]["pp"]
    assert f"plan #{rank}" in memory["title"]
    by_name = {t["name"]: t for t in memory["traces"]}
    for part in ("weights", "gradients", "optimizer", "activations", "buffers"):
        assert by_name[part]["x"] == [f"stage {s}" for s in range(len(stages))]
        assert by_name[part]["y"] == pytest.approx([st[part] for st in stages], rel=1e-12)
    peak = max(st["total"] for st in stages)
    assert peak == pytest.approx(plan["memory_gib"]["total"], rel=1e-12)
    assert memory["shapes"][0]["y0"] == pytest.approx(plan["memory_gib"]["capacity"], rel=1e-12)
    assert memory["bars"] >= len(stages)


@pytest.mark.parametrize("name", list(JOBS))
def test_job_link_renders_the_plans_and_charts_of_plan(driver: WebDriver, base_url: str, name: str) -> None:
    job = JOBS[name]
    expected = post_plan(base_url, job).json()
    plans = expected["plans"]
    assert len(plans) >= 2
    assert (plans[0]["config"]["pp"] > 1) == (name in PIPELINED)
    open_page(driver, f"{base_url}/?job={quote(json.dumps(job))}")
    assert wait_state(driver, "done", "error") == "done"

    rows = driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]')
    assert len(rows) == len(plans)
    for row, plan in zip(rows, plans, strict=True):
        assert_row_shows(row, plan)

    time_chart = chart(driver, "time-chart")
    for trace in time_chart["traces"]:
        parts = [p["time_breakdown_s"][trace["name"]] for p in plans]
        assert trace["y"] == pytest.approx(parts, rel=1e-12)
    stacked = [sum(t["y"][i] for t in time_chart["traces"]) for i in range(len(plans))]
    assert stacked == pytest.approx([p["step_time_s"] for p in plans], rel=1e-9)
    assert time_chart["bars"] >= len(plans)
    assert_memory_chart_shows(driver, plans[0], 1)

    rows[1].click()  # expands plan #2 and charts its memory
    assert_memory_chart_shows(driver, plans[1], 2)
    detail = driver.find_elements(By.CSS_SELECTOR, "tr.detail")[1]
    assert detail.is_displayed()
    launch = [pre.text for pre in detail.find_elements(By.CSS_SELECTOR, ".launch pre")]
    # each framework's arguments, after the export lines of its environment (``<name>_env``) in a box of their own
    env = [f"export {k}={v}" for k, v in plans[1]["launch"]["megatron_env"].items()]
    assert launch == (["\n".join(env)] if env else []) + [plans[1]["launch"]["megatron"]]
    assert detail.find_elements(By.CSS_SELECTOR, "button.copy")
    assert foreign_urls(requested_urls(driver)) == []


@pytest.mark.parametrize(("field", "value"), [("training.seq_len", "0"), ("cluster.num_gpus", "0")])
def test_bad_form_shows_the_422_message_next_to_the_field(
    driver: WebDriver, base_url: str, field: str, value: str
) -> None:
    open_page(driver, f"{base_url}/")
    wait_state(driver, "idle")
    box = driver.find_element(By.CSS_SELECTOR, f'[name="{field}"]')
    box.clear()
    box.send_keys(value)
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "error"

    job = json.loads(driver.execute_script("return JSON.stringify(formToJob())"))
    answer = post_plan(base_url, job)
    assert answer.status_code == 422
    (item,) = answer.json()["detail"]
    assert ".".join(map(str, item["loc"][1:])) == field
    errors = driver.find_elements(By.CSS_SELECTOR, '[data-testid="error"]')
    shown = [e for e in errors if e.is_displayed()]
    assert [e.text for e in shown] == [item["msg"]]
    assert shown[0].get_attribute("data-for") == field
    beside = driver.execute_script(
        "return arguments[0].previousElementSibling.querySelector(`[name='${arguments[1]}']`) !== null",
        shown[0],
        field,
    )
    assert beside
    assert foreign_urls(requested_urls(driver)) == []


@pytest.mark.parametrize("how", ["paste", "upload"])
def test_imported_hugging_face_config_plans_like_the_preset(
    driver: WebDriver, base_url: str, how: str, tmp_path: Path
) -> None:
    job = JOBS["llama3-8b on 64 H100"]
    open_page(driver, f"{base_url}/?job={quote(json.dumps(job))}")
    wait_state(driver, "done", "error")
    driver.find_element(By.CSS_SELECTOR, "#custom-model summary").click()
    if how == "paste":
        text = json.dumps(LLAMA3_8B_HF_CONFIG)
        driver.execute_script("document.querySelector('#hf-config').value = arguments[0]", text)
    else:
        config = tmp_path / "config.json"
        config.write_text(json.dumps(LLAMA3_8B_HF_CONFIG))
        driver.find_element(By.ID, "hf-file").send_keys(str(config))  # imports on choosing
    if how == "paste":
        driver.find_element(By.ID, "hf-import").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element(By.ID, "hf-status").text == "imported llama")
    form_job = json.loads(driver.execute_script("return JSON.stringify(formToJob())"))
    assert form_job["model"] == {
        "name": "llama",
        "num_layers": 32,
        "hidden_size": 4096,
        "ffn_hidden_size": 14336,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "vocab_size": 128256,
        "activation": "swiglu",
        "tied_embeddings": False,
    }
    driver.execute_script("document.body.dataset.state = 'submitted'")
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"
    expected = post_plan(base_url, job).json()["plans"]
    rows = driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]')
    assert len(rows) == len(expected)
    for row, plan in zip(rows, expected, strict=True):
        assert_row_shows(row, plan)
    assert "%22num_layers%22%3A32" in driver.current_url  # the link carries the imported model


@pytest.mark.parametrize(
    ("path", "rendered"),
    [
        ("/docs", "return document.querySelectorAll('.opblock').length"),
        ("/redoc", "return document.querySelectorAll('[data-section-id^=\"operation/\"]').length"),
    ],
)
def test_api_docs_render_without_network(driver: WebDriver, base_url: str, path: str, rendered: str) -> None:
    schema = httpx.get(f"{base_url}/openapi.json").json()
    operations = sum(len(methods) for methods in schema["paths"].values())
    open_page(driver, f"{base_url}{path}")
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(rendered) >= operations)
    assert "Search ranked layouts for a job" in driver.find_element(By.TAG_NAME, "body").text
    urls = requested_urls(driver)
    assert any(u.endswith(".js") for u in urls)
    assert foreign_urls(urls) == []


def test_a_link_whose_job_is_not_json_says_so(driver: WebDriver, base_url: str) -> None:
    open_page(driver, f"{base_url}/?job={quote('{not json')}")
    assert wait_state(driver, "idle") == "idle"
    error = driver.find_element(By.ID, "form-error")
    assert error.is_displayed()
    assert error.get_attribute("data-testid") == "error"
    assert error.text.startswith("the job in the link is not JSON")
    assert driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]') == []


def test_an_error_at_a_field_the_form_lacks_goes_above_the_results(driver: WebDriver, base_url: str) -> None:
    """``training.moe_capacity_factor`` has no box: its 422 is shown above the results, not next
    to the first training field."""
    job = {
        "model": {"preset": "mixtral-8x7b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "moe_capacity_factor": 0.5},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    }
    open_page(driver, f"{base_url}/?job={quote(json.dumps(job))}")
    assert wait_state(driver, "done", "error") == "error"
    (item,) = post_plan(base_url, job).json()["detail"]
    assert item["loc"] == ["body", "training", "moe_capacity_factor"]
    assert driver.find_elements(By.CSS_SELECTOR, "[data-for]") == []  # no message next to a field
    error = driver.find_element(By.ID, "form-error")
    assert error.is_displayed() and error.text == f"training.moe_capacity_factor: {item['msg']}"


def test_the_forms_job_keeps_the_links_fields_the_form_lacks(driver: WebDriver, base_url: str) -> None:
    """What *Plan* and *Sweep* send: the form's fields over the link's job (dp_comm_overlap has no box)."""
    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 256, "dp_comm_overlap": False},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "search": {"top_k": 2},
    }
    open_page(driver, f"{base_url}/?job={quote(json.dumps(job))}")
    wait_state(driver, "done")
    box = driver.find_element(By.CSS_SELECTOR, '[name="cluster.num_gpus"]')
    box.clear()
    box.send_keys("16")
    sent = driver.execute_script("return formToJob()")
    assert sent["training"]["dp_comm_overlap"] is False
    assert sent["cluster"]["num_gpus"] == 16 and sent["search"]["top_k"] == 2


LLAMA4_MAVERICK_HF_CONFIG = {  # config.json of meta-llama/Llama-4-Maverick-17B-128E (text_config keys)
    "model_type": "llama4",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama4_text", "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 202048, "num_local_experts": 128, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2, "attention_chunk_size": 8192, "tie_word_embeddings": False,
    },
}  # fmt: skip
GPT_OSS_120B_HF_CONFIG = {  # config.json of openai/gpt-oss-120b (architecture keys)
    "model_type": "gpt_oss", "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 201088, "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "tie_word_embeddings": False,
}  # fmt: skip
QWEN3_8B_HF_CONFIG = {  # config.json of Qwen/Qwen3-8B: a window that is not used
    "model_type": "qwen3", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "sliding_window": None, "use_sliding_window": False, "max_window_layers": 36,
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "config", "expected"),
    [
        ("llama4-maverick", LLAMA4_MAVERICK_HF_CONFIG,
         {"ffn_hidden_size": 16384, "moe": {"num_experts": 128, "top_k": 1, "expert_ffn_hidden_size": 8192,
          "num_shared_experts": 1, "shared_expert_ffn_hidden_size": 8192, "layer_frequency": 2,
          "first_dense_layers": 1}}),
        ("gpt-oss-120b", GPT_OSS_120B_HF_CONFIG, {"sliding_window": 128, "sliding_window_every": 2}),
    ],
)  # fmt: skip
def test_imported_moe_and_windowed_configs_score_as_their_presets(
    driver: WebDriver, base_url: str, preset: str, config: dict[str, Any], expected: dict[str, Any]
) -> None:
    """Llama 4's interleaved MoE layers (dense FFN intermediate_size_mlp, one shared expert) and
    gpt-oss's alternating 128-token windows import as the presets have them: the same step time."""
    open_page(driver, base_url)
    model = driver.execute_script("return hfToModel(arguments[0])", config)
    assert {k: model[k] for k in expected} == expected
    job = {"training": {"seq_len": 4096, "global_batch_size": 256}, "cluster": {"preset": "dgx-h100", "num_gpus": 64},
           "config": {"tp": 1, "pp": 4, "ep": 8, "zero_stage": 1, "recompute": "full"}}  # fmt: skip
    scored = [
        httpx.post(f"{base_url}/evaluate", json={**job, "model": m}, timeout=WAIT_S)
        for m in (model, {"preset": preset})
    ]
    assert [r.status_code for r in scored] == [200, 200], scored[0].text
    assert scored[0].json()["step_time_s"] == pytest.approx(scored[1].json()["step_time_s"], rel=1e-9)


def test_an_unused_window_is_not_imported(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    model = driver.execute_script("return hfToModel(arguments[0])", QWEN3_8B_HF_CONFIG)
    assert "sliding_window" not in model and model["num_layers"] == 36


@pytest.mark.parametrize(
    ("config", "window", "note"),
    [
        ({"model_type": "mistral", "num_hidden_layers": 32, "sliding_window": 4096}, (4096, 1), False),
        ({"model_type": "gemma2", "num_hidden_layers": 42, "sliding_window": 4096}, (4096, 2), False),
        ({"model_type": "gemma3_text", "num_hidden_layers": 34, "sliding_window": 1024, "sliding_window_pattern": 6},
         None, True),
        ({"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512,
          "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2}, None, True),
        ({"model_type": "qwen2", "num_hidden_layers": 28, "sliding_window": 32768, "use_sliding_window": False},
         None, False),
    ],
)  # fmt: skip
def test_sliding_window_patterns_import_or_are_named(
    driver: WebDriver, base_url: str, config: dict[str, Any], window: tuple[int, int] | None, note: bool
) -> None:
    """Windows on every layer (Mistral) or every other one (Gemma 2) import; Gemma 3's five of six
    cannot be said as 'every k-th from the first' and import without the window, with a note."""
    open_page(driver, base_url)
    got = driver.execute_script(
        "const m = hfToModel(arguments[0]); return [m.sliding_window ?? null, m.sliding_window_every ?? null, "
        "m.importNote ?? null]",
        {**config, "hidden_size": 2048, "num_attention_heads": 16, "intermediate_size": 8192, "vocab_size": 32000},
    )
    assert (tuple(got[:2]) if got[0] is not None else None) == window
    assert (got[2] is not None) == note
    if note:
        assert "follows a pattern the planner does not model" in got[2]


def test_qwen2_moe_shared_expert_imports(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    model = driver.execute_script("return hfToModel(arguments[0])", {
        "model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "intermediate_size": 5632,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
        "num_experts_per_tok": 4, "num_attention_heads": 16, "vocab_size": 151936,
    })  # fmt: skip
    assert model["moe"] == {"num_experts": 60, "top_k": 4, "expert_ffn_hidden_size": 1408, "num_shared_experts": 1,
                            "shared_expert_ffn_hidden_size": 5632}  # fmt: skip
