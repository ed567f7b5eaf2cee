"""Fixtures every test folder shares."""

from __future__ import annotations

import os
from typing import Callable

import pytest


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def needs() -> Callable[[bool, str, str], None]:
    """``needs(available, what_is_missing, how_to_get_it)`` for tests that need a real
    service (Slurm, MPI): with the environment variable ``CI`` set (CI runs ``.ci/run``,
    which provides them) a missing one FAILS the test, since a CI run that silently skipped
    those tests would prove nothing; elsewhere (a developer's machine) the test is skipped
    with the hint."""

    def check(available: bool, missing: str, hint: str) -> None:
        if available:
            return
        if _in_ci():
            pytest.fail(f"{missing}. CI is set, so these tests must not be skipped: {hint}", pytrace=False)
        pytest.skip(f"{missing}; {hint}")

    return check


#: marker -> the fixture that provides (or fails/skips for) what tests with that marker need
_MARKER_FIXTURES = {"slurm": "slurm_cluster", "mpi": "mpiexec"}


@pytest.fixture(autouse=True)
def _services_for_markers(request: pytest.FixtureRequest) -> None:
    for marker, fixture in _MARKER_FIXTURES.items():
        if request.node.get_closest_marker(marker) is not None:
            request.getfixturevalue(fixture)
