"""Fixtures every test folder shares.

Test folders mirror the packages (``cost/``, ``search/``, ``api/``, ``catalog/``, ``capacity/``,
``placement/``, ``launch/``, ``error_bands/``, ``web/``); shared jobs live in ``jobs.py``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

from api.main import create_app
from api.settings import Settings

# Under pytest-xdist each worker keeps its own example database, so parallel workers never write
# the same files; a plain run keeps Hypothesis's default one.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    settings.register_profile("xdist", database=DirectoryBasedExampleDatabase(f".hypothesis/examples-{_WORKER}"))
    settings.load_profile("xdist")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: runs while no other test does under pytest-xdist (wall-time bounds)")


@pytest.fixture(autouse=True)
def _serial_tests_run_alone(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-xdist, a test marked ``serial`` (wall-time bounds) runs while no other test
    does: every test holds a shared lock on one file of the run, a ``serial`` one an exclusive
    lock. A plain run needs no lock."""
    if not _WORKER:
        yield
        return
    exclusive = request.node.get_closest_marker("serial") is not None
    path = tmp_path_factory.getbasetemp().parent / "serial.lock"  # the workers' common parent
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def client() -> Iterator[TestClient]:
    """The app with default settings, in process, started and stopped around one test."""
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def module_client() -> Iterator[TestClient]:
    """The app with default settings, shared by the tests of one module."""
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the ``serial`` tests first, then the ``slow`` ones (each group keeps its order): under
    ``make test`` (pytest-xdist, ``--dist worksteal``) the first worker starts with the serial
    tests, which wait only for the other worker's first test (a short one) instead of a long one
    midway; the long tests then start early and the short ones fill the gaps, instead of one
    worker finishing a long test alone at the end."""
    items.sort(key=lambda item: (item.get_closest_marker("serial") is None, item.get_closest_marker("slow") is None))
