"""The job form in headless Chromium: what is planned is what the form shows, and a box the
browser cannot read as a number stops the request."""

from __future__ import annotations

import json

import httpx
import pytest
from pagekit import SMALL_JOB, box, open_page, plan_requests, post_plan, shown_errors, type_into, wait_state
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select

MIXTRAL_HF_CONFIG = {  # config.json of mistralai/Mixtral-8x7B-v0.1 (architecture keys)
    "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False,
}  # fmt: skip


def custom_values(driver: WebDriver) -> dict[str, str]:
    return driver.execute_script(
        "return Object.fromEntries(fields().filter(f => f.name.startsWith('model.') && f.name !== 'model.preset')"
        ".filter(f => f.value !== '').map(f => [f.name, f.value]))"
    )


def planned_header(driver: WebDriver) -> str:
    return driver.find_element(By.CSS_SELECTOR, '[data-testid="planned"]').text


def test_choosing_a_preset_after_an_import_plans_the_preset(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    driver.find_element(By.CSS_SELECTOR, "#custom-model summary").click()
    driver.execute_script("document.querySelector('#hf-config').value = arguments[0]", json.dumps(MIXTRAL_HF_CONFIG))
    driver.find_element(By.ID, "hf-import").click()
    assert custom_values(driver)["model.moe.num_experts"] == "8"

    Select(box(driver, "model.preset")).select_by_value("llama3-8b")
    assert custom_values(driver) == {}
    type_into(driver, "training.global_batch_size", "256")
    type_into(driver, "cluster.num_gpus", "64")
    assert driver.execute_script("return formToJob().model") == {"preset": "llama3-8b"}
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"

    expected = post_plan(base_url, {**SMALL_JOB, "training": {"seq_len": 8192, "global_batch_size": 256}})
    first = driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"] td[data-field="step_time_s"]')
    assert first.text == f"{expected['plans'][0]['step_time_s']:.3f} s"
    planned = expected["planned"]
    header = planned_header(driver)
    for text in ("Planned: Llama 3 8B", f"{billions(planned['total_params'])} parameters", "64 × h100-sxm-80gb"):
        assert text in header, header
    assert "active" not in header  # dense: every parameter is active
    assert header.endswith("bf16, framework: any"), header


def billions(params: int) -> str:
    return f"{float(f'{params / 1e9:.3g}'):g}B"


def test_the_planned_line_is_the_servers_for_a_custom_model(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    Select(box(driver, "model.preset")).select_by_value("")
    driver.find_element(By.CSS_SELECTOR, "#custom-model summary").click()
    driver.execute_script("document.querySelector('#hf-config').value = arguments[0]", json.dumps(MIXTRAL_HF_CONFIG))
    driver.find_element(By.ID, "hf-import").click()
    type_into(driver, "training.global_batch_size", "256")
    type_into(driver, "cluster.num_gpus", "64")
    Select(box(driver, "training.precision")).select_by_visible_text("fp8")
    planned = post_plan(base_url, driver.execute_script("return formToJob()"))["planned"]
    assert planned["active_params"] < planned["total_params"]
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"
    assert planned_header(driver) == (
        f"Planned: {planned['model']} (custom architecture), {billions(planned['total_params'])} parameters "
        f"({billions(planned['active_params'])} active), on 64 × {planned['gpu']} (dgx-h100), fp8, framework: any"
    )


def test_a_field_typed_under_a_preset_shows_as_an_override(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    note = driver.find_element(By.CSS_SELECTOR, '[data-testid="preset-note"]')
    assert not note.is_displayed()
    type_into(driver, "model.num_layers", "40")
    assert note.is_displayed()
    assert note.text == "1 preset field overridden: num_layers"

    type_into(driver, "training.global_batch_size", "256")
    type_into(driver, "cluster.num_gpus", "64")
    Select(box(driver, "training.framework")).select_by_visible_text("megatron-lm")
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"
    header = planned_header(driver)
    planned = post_plan(base_url, driver.execute_script("return formToJob()"))["planned"]
    preset = next(m for m in httpx.get(f"{base_url}/models").json() if m["id"] == "llama3-70b")
    assert billions(planned["total_params"]) != billions(preset["published_total_params"])  # 40 layers, not 80
    assert header.startswith(
        f"Planned: Llama 3 70B with 1 preset field overridden (num_layers 40), {billions(planned['total_params'])} "
        "parameters, on 64 × h100-sxm-80gb"
    ), header
    assert header.endswith("framework: megatron-lm"), header


@pytest.mark.parametrize(("field", "text"), [("search.fix.tp", "8e"), ("training.global_batch_size", "2048e")])
def test_text_that_is_not_a_number_is_marked_and_not_sent(
    driver: WebDriver, base_url: str, field: str, text: str
) -> None:
    open_page(driver, base_url)
    type_into(driver, "cluster.num_gpus", "64")
    type_into(driver, field, text)
    assert driver.execute_script("return arguments[0].validity.badInput", box(driver, field))
    plan_requests(driver)
    for button in ("plan-button", "sweep-start"):
        driver.find_element(By.ID, button).click()
        errors = shown_errors(driver)
        assert [(e.text, e.get_attribute("data-for")) for e in errors if e.get_attribute("data-for")] == [
            ("not a number", field)
        ]
        assert plan_requests(driver) == []
    assert driver.execute_script("return document.body.dataset.state") == "error"
    assert driver.find_element(By.ID, "sweep-error").text == "fix the marked fields of the form first"
    type_into(driver, field, "2")  # fixed: the plan runs
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"
    assert driver.find_elements(By.CSS_SELECTOR, "[data-for]") == []


def test_the_token_budget_box_shows_every_digit_and_its_unit(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    field = type_into(driver, "training.total_tokens", "15000000000000")
    width = driver.execute_script("return [arguments[0].scrollWidth, arguments[0].clientWidth]", field)
    assert width[0] <= width[1], width  # no digit hidden
    label = field.find_element(By.XPATH, "ancestor::label")
    assert label.find_element(By.CSS_SELECTOR, ".unit").text == "tokens"
    echo = label.find_element(By.CSS_SELECTOR, '[data-testid="tokens-echo"]')
    assert echo.text == "= 15 trillion tokens"
    type_into(driver, "training.total_tokens", "100000000000")
    assert echo.text == "= 100 billion tokens"
    field.clear()
    assert echo.text == ""


@pytest.mark.parametrize(
    ("emptied", "at", "message"),
    [
        ("training.global_batch_size", "training.global_batch_size", None),  # 422 at the training section
        ("cluster.num_gpus", "cluster.num_gpus", "required unless cluster.topology is given"),
    ],
)
def test_a_422_goes_to_the_field_it_names_without_repeating_it(
    driver: WebDriver, base_url: str, emptied: str, at: str, message: str | None
) -> None:
    open_page(driver, base_url)
    type_into(driver, "cluster.num_gpus", "64")
    box(driver, emptied).clear()
    answer = httpx.post(f"{base_url}/plan", json=driver.execute_script("return formToJob()"))
    assert answer.status_code == 422
    (item,) = answer.json()["detail"]
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "error"
    shown = [(e.get_attribute("data-for"), e.text) for e in shown_errors(driver)]
    assert shown == [(at, message or item["msg"])], item


TOKENIZER_CONFIG = {  # tokenizer_config.json of a Llama 3 repository: no architecture keys
    "add_bos_token": True, "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True,
    "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
}  # fmt: skip


def form_values(driver: WebDriver) -> dict[str, str]:
    return driver.execute_script("return Object.fromEntries(fields().map(f => [f.name, f.value]))")


@pytest.mark.parametrize(
    ("pasted", "said"),
    [
        (TOKENIZER_CONFIG, "cannot import: no architecture keys (such as num_hidden_layers, hidden_size)"),
        ([1, 2], "cannot import: not a JSON object"),
    ],
)
def test_importing_a_json_without_architecture_keys_says_so_and_changes_nothing(
    driver: WebDriver, base_url: str, pasted: object, said: str
) -> None:
    open_page(driver, base_url)
    type_into(driver, "model.num_layers", "40")  # an override, kept
    before = form_values(driver)
    driver.execute_script("document.querySelector('#hf-config').value = arguments[0]", json.dumps(pasted))
    driver.find_element(By.ID, "hf-import").click()
    assert driver.find_element(By.ID, "hf-status").text.startswith(said)
    assert form_values(driver) == before
    assert before["model.preset"] == "llama3-70b"
