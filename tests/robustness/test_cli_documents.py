"""The CLI on malformed documents: exit 2 with a one-line message within 5 s, never a traceback.

The 5 s are CPU seconds of the CLI process (most of them its imports), so that the bound holds
on a machine busy with other work; the wall time is only checked against a loose limit.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPTH = 100_000


def _alias_bomb() -> str:
    """Nine levels of nine aliases each: 9**9 (387 million) leaves once expanded."""
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, 10):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    lines.append("model: {preset: *a9}")
    lines.append("training: {seq_len: 2048, global_batch_size: 64}")
    lines.append("cluster: {preset: dgx-h100, num_gpus: 16}")
    return "\n".join(lines) + "\n"


DOCUMENTS: dict[str, tuple[str, bytes]] = {
    "deep-json": ("plan.json", ("[" * DEPTH + "]" * DEPTH).encode()),
    "deep-json-object": ("plan.json", ('{"a":' * DEPTH + "1" + "}" * DEPTH).encode()),
    "deep-yaml-flow": ("plan.yaml", ("[" * DEPTH + "]" * DEPTH).encode()),
    "deep-yaml-block": ("plan.yaml", "".join(f"{' ' * i}- \n" for i in range(0, 2000, 2)).encode()),
    "alias-bomb": ("plan.yaml", _alias_bomb().encode()),
    "not-utf8": ("plan.json", b"\xff\xfe{\x00}"),
    "not-a-mapping": ("plan.yaml", b"- 1\n- 2\n"),
    "syntax-error": ("plan.json", b'{"model": '),
    "unknown-suffix-garbage": ("plan.txt", b"\x00\x01: [\n"),
    "empty": ("plan.yaml", b""),
    "huge": ("plan.json", b" " * (9 << 20) + b"{}"),
    "huge-integer-yaml": ("plan.yaml", b"cluster: {num_gpus: " + b"9" * 5000 + b"}\n"),
    "huge-integer-json": ("plan.json", b'{"cluster": {"num_gpus": ' + b"9" * 5000 + b"}}"),
}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize("name", DOCUMENTS)
def test_a_malformed_document_exits_2_with_one_line(name: str, tmp_path: Path) -> None:
    filename, content = DOCUMENTS[name]
    path = tmp_path / filename
    path.write_bytes(content)
    started = time.monotonic()
    cpu_before = _children_cpu_s()
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "plan", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    wall_s = time.monotonic() - started
    cpu_s = _children_cpu_s() - cpu_before
    assert result.returncode == 2, result.stderr[-2000:]
    assert cpu_s < 5.0, cpu_s
    assert wall_s < 30.0, wall_s
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pplan: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
