"""The ``runs`` fixture of the composition test files: one launch per world size over the runs that the
selected tests of the requesting file registered with :func:`tests.parallel._plans.plan`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._launch import launch_partial
from ._plans import PLANS, Runs


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> Runs:
    """One launch per world size over the planned runs of every selected test of this file."""
    here = Path(request.module.__file__)
    tmp = tmp_path_factory.mktemp(here.stem)
    by_world: dict[int, dict[str, list[str]]] = {}
    for item in request.session.items:
        fn = PLANS.get(getattr(item, "originalname", ""))
        if fn is None or Path(item.path) != here:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for size, named in fn(tmp, **params).items():
            by_world.setdefault(size, {}).update(named)
    results, failures, world_of = {}, {}, {}
    for size, named in sorted(by_world.items()):
        got, failure = launch_partial(size, named, tmp / f"launch{size}", 900 + 60 * len(named))
        results.update(got)
        world_of.update(dict.fromkeys(named, size))
        if failure:
            failures[size] = failure
    return Runs(tmp, results, failures, world_of)
