"""Arithmetic that takes numbers or numpy arrays alike.

The cost model's composition functions run on single layouts (numbers) and on many layouts at
once (numpy arrays: the search's bounds, ``cost.columns``). These helpers are the branches and
extrema they need, written once for both: a Python ``max`` / ``min`` / conditional on numbers,
the elementwise numpy function on arrays, the same floats either way.
"""

from __future__ import annotations

import numpy as np

Num = float | np.ndarray
"""A number, or numpy arrays that broadcast (whole blocks of layouts at once)."""


def maximum(a: Num, b: Num) -> Num:
    """``max`` of two numbers, elementwise when either is a numpy array."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def minimum(a: Num, b: Num) -> Num:
    """``min`` of two numbers, elementwise when either is a numpy array."""
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def select(condition: bool | np.ndarray, a: Num, b: Num) -> Num:
    """``a if condition else b``, elementwise when ``condition`` is a numpy array."""
    return np.where(condition, a, b) if isinstance(condition, np.ndarray) else (a if condition else b)
