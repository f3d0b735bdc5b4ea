"""The connection cap and listen backlog fit the open-file limit, whatever it is."""

from __future__ import annotations

import pytest

from api.server import FD_MARGIN, fd_budget
from api.settings import Settings


@pytest.mark.parametrize("limit", [300, 600, 1024, 4096, 8448, 20_000, 1 << 20])
def test_sockets_open_at_once_stay_under_the_limit(limit: int) -> None:
    settings = Settings()
    backlog, cap = fd_budget(settings, limit)
    assert 16 <= backlog <= settings.backlog and 16 <= cap <= settings.max_connections
    if limit >= 512:
        assert cap + 2 * backlog + FD_MARGIN <= limit
    if limit >= settings.max_connections + 2 * settings.backlog + FD_MARGIN:
        assert (backlog, cap) == (settings.backlog, settings.max_connections)
