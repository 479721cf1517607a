"""Data-dependent tests skip only when their own data is missing, and fail instead under CI (``CI=true``)."""

from __future__ import annotations

import pytest

from tests.conftest import need_data
from tests.recipe_data import recipe_data_args


def test_missing_data_skips_locally_and_fails_in_ci(tmp_path, monkeypatch):
    missing = tmp_path / "nothing" / "ETTh1.csv"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as e:
        need_data(missing, "ETTh1")
    assert str(e.value) == f"ETTh1 not found at {missing} (see ../shared/data/README.md)"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as e:
        need_data(missing, "ETTh1")
    assert str(e.value) == f"ETTh1 not found at {missing} (see ../shared/data/README.md); CI=true, so this is a failure, not a skip"
    (tmp_path / "here.csv").write_text("x\n")
    assert need_data(tmp_path / "here.csv", "a file") == (tmp_path / "here.csv").resolve()


def test_recipes_without_data_needs_do_not_ask_for_data():
    """quickstart and tabular_wine read bundled scikit-learn data: no ../shared/data path, so they always run."""
    assert recipe_data_args("quickstart") == [] and recipe_data_args("tabular_wine") == []
