"""A key given twice in one object is a 422 (HTTP) or a document error (CLI): JSON and YAML
parsers keep the last value silently, so ``"num_gpus": 8, "num_gpus": 16`` planned 16 GPUs."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.cli import InputError, load_document

BODY = (
    '{"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 256},'
    ' "cluster": {"preset": "dgx-h100", "num_gpus": 8, "num_gpus": 16}}'
)


def test_a_repeated_key_in_a_body_is_a_422(client: TestClient) -> None:
    r = client.post("/plan", content=BODY, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {
            "loc": ["body"],
            "msg": "key 'num_gpus' is given twice in one object (the last would silently win)",
            "type": "json_duplicate_key",
        }
    ]
    once = BODY.replace(', "num_gpus": 16', "")
    assert client.post("/plan", content=once, headers={"content-type": "application/json"}).status_code == 200


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("job.json", BODY),
        ("job.yaml", "training:\n  seq_len: 4096\n  global_batch_size: 256\n  global_batch_size: 512\n"),
    ],
)
def test_a_repeated_key_in_a_document_is_refused(tmp_path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError, match="is given twice in one object"):
        load_document(str(path))


def test_yaml_merge_keys_are_not_repeats(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("base: &b {seq_len: 4096}\ntraining:\n  <<: *b\n  global_batch_size: 256\n")
    assert load_document(str(path))["training"] == {"seq_len": 4096, "global_batch_size": 256}


def test_yaml_keys_of_different_types_are_two_keys(tmp_path) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text("labels:\n  1: a\n  '1': b\n")
    assert load_document(str(path))["labels"] == {1: "a", "1": "b"}
