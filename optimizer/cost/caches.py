"""The per-request caches of the cost model and the search: one typed memo per cached function.

Each cached function declares, next to itself, a key type (a ``NamedTuple`` of exactly what it
reads of the layout and the rank order's group geometries, built by one key function beside
it) and a ``Memo[K, V]`` naming its cache. The job's own facts (model, hardware, calibration)
are fixed for a context, so they are not part of any key.

A context's ``caches`` (``Caches``) holds one entry table per memo, made on first use.
``build_context`` hands every call a new, empty ``Caches``: the tables live as long as the
request's context (one search, one evaluation) and are never shared between requests.

    HEAD_TIME = Memo[HeadKey, float]("head_time_s")
    table = ctx.caches[HEAD_TIME]  # dict[HeadKey, float]
    t = table.get(key)

Key functions make their ``NamedTuple`` as ``tuple.__new__(Key, (...))``: the same object as
``Key(...)`` without the Python-level ``__new__`` (the search makes hundreds of thousands of
keys per request, and this keeps a typed key within ~0.1 us of a plain tuple).
``tests/search/test_caches.py`` checks that no key leaves out something its function reads.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MEMOS: list[Memo[Any, Any]] = []
"""Every memo declared, in import order (the tests walk them)."""


class Memo(Generic[K, V]):
    """The name and the key and value types of one cached function's table. Compared and hashed
    by identity: declare each once, at module level, next to the function it caches."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name
        MEMOS.append(self)

    def __repr__(self) -> str:
        return f"Memo({self.name!r})"


class Caches(dict["Memo[Any, Any]", "dict[Any, Any]"]):
    """One request's cache tables, one per ``Memo``: ``caches[memo]`` is ``memo``'s table of
    ``K -> V``, empty on first use. (A ``dict`` subclass so that the lookup on the cost model's
    hot paths stays a C-level ``dict`` access; only ``Memo`` objects are its keys.)"""

    __slots__ = ()

    if TYPE_CHECKING:

        def __getitem__(self, memo: Memo[K, V], /) -> dict[K, V]: ...

    def __missing__(self, memo: Memo[Any, Any]) -> dict[Any, Any]:
        table: dict[Any, Any] = {}
        self[memo] = table
        return table

    def entries(self) -> int:
        """Cached values over every table."""
        return sum(len(t) for t in self.values())
