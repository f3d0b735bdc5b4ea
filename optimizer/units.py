"""Unit conventions: SI base units inside (bytes, seconds, FLOP, FLOP/s, bytes/s).

Every conversion to or from a display unit goes through the constants here; no other module
hard-codes 1e9 or 2**30. Names carry their unit as a suffix (``_s``, ``_bytes``, ``_gib``,
``_bytes_per_s``, ``_flops``).
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KIB = 2.0**10
MIB = 2.0**20
GIB = 2.0**30
TFLOPS = 1e12
US = 1e-6
MS = 1e-3
BITS_PER_BYTE = 8.0


def to_gib(num_bytes: float) -> float:
    """Bytes -> GiB (2**30 bytes)."""
    return num_bytes / GIB


def gib_to_bytes(gib: float) -> float:
    """GiB -> bytes."""
    return gib * GIB


def bits_to_bytes_per_s(bits_per_s: float) -> float:
    """Link rate in bit/s -> bytes/s (400 Gb/s -> 50 GB/s)."""
    return bits_per_s / BITS_PER_BYTE


def to_tflops(flops_per_s: float) -> float:
    """FLOP/s -> TFLOP/s."""
    return flops_per_s / TFLOPS
