"""Where each recipe under recipes/ finds its data in ../shared/data, as command-line flags: shared by the
recipe tests (tests/test_recipes.py) and the data-gate tests (tests/test_data_gate.py)."""

from __future__ import annotations

from tests.conftest import SHARED_DATA, need_data


def recipe_data_args(name: str) -> list[str]:
    """The flags pointing recipe ``name`` at its data in ../shared/data; a recipe whose data is missing skips
    (fails under CI: tests.conftest.need_data), and one that needs none (quickstart, tabular_wine) always runs."""
    if name in ("fsdd_audio", "fsdd_speakers"):
        return ["--data.init_args.data_dir", str(need_data(SHARED_DATA / "fsdd" / "recordings", "FSDD recordings"))]
    if name in ("audio_image_joint", "audio_image_retrieval"):
        return ["--data.init_args.first.init_args.data_dir", str(need_data(SHARED_DATA / "fsdd" / "recordings", "FSDD recordings"))]
    if name == "etth1_forecast":
        return ["--data.init_args.path", str(need_data(SHARED_DATA / "ett" / "ETTh1.csv", "ETTh1.csv"))]
    if name == "diamonds_tabular":
        return ["--data.init_args.path", str(need_data(SHARED_DATA / "tabular" / "diamonds.csv", "diamonds.csv"))]
    return []
