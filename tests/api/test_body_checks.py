"""The body checks the middleware runs before the app parses JSON: linear in the body's size,
UTF-8 only, depth and repeated keys (docs/api.md, error locations)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.documents import JSON_STRING, MAX_DEPTH, json_depth

JSON = {"content-type": "application/json"}
PLAN = (
    '{"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 256},'
    ' "cluster": {"preset": "dgx-h100", "num_gpus": 8}}'
)


def test_an_unterminated_string_is_one_match_to_the_end() -> None:
    """The string pattern required its closing quote: in an unterminated string of escaped quotes
    a match was tried from every quote to the end (quadratic: a 40 KB body held the server's event
    loop 8 s, 80 KB 30 s). Each match now ends where its string does, the end of the text at
    worst, so the scan reads each character once."""
    text = '"' + '\\"' * 20_000
    match = JSON_STRING.match(text)
    assert match is not None and match.end() == len(text)
    assert JSON_STRING.match('"a\\"b" ,"c"').group() == '"a\\"b"'  # a terminated string stops at its quote
    assert json_depth('{"a": "[[[", "b": [[1]]}') == 3
    assert json_depth('"' + '\\"' * 500_000 + "[" * 40) == 0  # 1 MB: all string


def test_the_pathological_body_is_answered_422(client: TestClient) -> None:
    body = '"' + '\\"' * 200_000  # 400 KB, not JSON
    response = client.post("/plan", content=body, headers=JSON)
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


def test_a_body_that_is_not_utf8_is_a_422_even_when_it_is_json(client: TestClient) -> None:
    """UTF-16 passed: the depth check read the bytes as latin-1, where the bytes of the escaped
    quote hid the string's end, so a 2,000-deep body got past it to the repeated-key check's
    parser (a RecursionError: a 500), and a valid UTF-16 request was planned, though the API
    takes UTF-8."""
    deep = '{"x": "\\"", "y": ' + "[" * 2000 + "]" * 2000 + ', "z": "a"}'
    for text in (deep, PLAN):
        response = client.post("/plan", content=text.encode("utf-16"), headers=JSON)
        assert response.status_code == 422, response.text
        [item] = response.json()["detail"]
        assert item["loc"] == ["body"] and item["type"] == "json_invalid"
        assert item["msg"].startswith("request body is not UTF-8")
    assert client.post("/plan", content=PLAN.encode(), headers=JSON).status_code == 200
    # the body of a request no route takes is not read: 404 and 405 as for any body
    assert client.post("/nowhere", content=PLAN.encode("utf-16"), headers=JSON).status_code == 404
    assert client.put("/plan", content=b"[" * 2000, headers=JSON).status_code == 405
    assert client.post("/static/app.js", content=PLAN.encode("utf-16"), headers=JSON).status_code == 405


def test_depth_is_counted_outside_strings(client: TestClient) -> None:
    too_deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    response = client.post("/evaluate", content=too_deep, headers=JSON)
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_too_deep"
    in_a_string = PLAN.replace('"llama3-8b"', '"' + "[" * 100 + '"')
    response = client.post("/plan", content=in_a_string, headers=JSON)
    assert response.status_code == 422 and "model" in str(response.json()["detail"][0]["loc"])


def test_a_byte_order_mark_does_not_hide_a_repeated_key(client: TestClient) -> None:
    """The UTF-8 check decoded the body keeping its byte order mark; the repeated-key check's
    parser then refused the text and found no key, while the app's parser skipped the mark and
    planned with the last value."""
    twice = PLAN.replace('"seq_len": 4096', '"seq_len": 4096, "seq_len": 8192')
    response = client.post("/plan", content=b"\xef\xbb\xbf" + twice.encode(), headers=JSON)
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_duplicate_key"
    assert client.post("/plan", content=b"\xef\xbb\xbf" + PLAN.encode(), headers=JSON).status_code == 200
