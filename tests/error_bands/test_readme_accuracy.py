"""The README's accuracy table repeats docs/validation.md (written by ``make validate``): rerun
``make validate`` after a cost-model change and copy its all / dense / MoE rows and Blackwell
errors into the README, or this fails."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _validation_rows() -> dict[str, tuple[str, str, str]]:
    text = (ROOT / "docs" / "validation.md").read_text()
    rows = {}
    for name, key in (("all", "all"), ("dense", "model: dense"), ("MoE", "model: moe")):
        m = re.search(rf"^\| {re.escape(key)} \| (\d+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
        assert m, key
        rows[name] = (m.group(1), f"{m.group(2)}%", f"{m.group(3)}%")
    return rows


def test_the_readme_accuracy_table_is_the_validation_reports() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, (count, median, p90) in _validation_rows().items():
        assert f"| {name} | {count} | {median} | {p90} |" in readme, name
    blackwell = re.search(r"^- Blackwell rows .*?: (.*)$", (ROOT / "docs" / "validation.md").read_text(), re.M)
    assert blackwell
    line = next(x for x in readme.splitlines() if x.startswith("| Blackwell"))
    assert sorted(re.findall(r"[+-][\d.]+%", line)) == sorted(re.findall(r"[+-][\d.]+%", blackwell.group(1)))
