"""bench/_doc.py: a benchmark's section of BENCHMARKS.md is replaced between its markers, appended when absent,
and the rest of the document is left as it was."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def doc():
    from tests.conftest import load_bench

    return load_bench("_doc")


MACHINE = "Machine: test box."


def test_replaces_only_the_text_between_its_markers(doc, tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nheader\n\n## FP8\n\n<!-- bench:fp8 -->\nold table\n<!-- /bench:fp8 -->\n\nnote after\n\n"
                  "## Pipeline\n\n<!-- bench:pipeline -->\npipeline table\n<!-- /bench:pipeline -->\n\n## History\n\n- a\n")
    doc.update_doc("fp8", "| a |\n|---|\n| 1 |\n", "python bench/fp8.py --update-doc", md, machine=MACHINE)
    text = md.read_text()
    assert "old table" not in text and text.count("<!-- bench:fp8 -->") == 1 and text.count("<!-- /bench:fp8 -->") == 1
    assert "<!-- bench:fp8 -->\n\n`python bench/fp8.py --update-doc`\n\nMachine: test box.\n\n| a |\n|---|\n| 1 |\n\n<!-- /bench:fp8 -->" in text
    assert text.startswith("# Benchmarks\n\nheader\n\n## FP8\n\n") and "<!-- /bench:fp8 -->\n\nnote after\n\n## Pipeline" in text
    assert "pipeline table" in text and text.endswith("## History\n\n- a\n")
    # a second write gives the same text
    doc.update_doc("fp8", "| a |\n|---|\n| 1 |\n", "python bench/fp8.py --update-doc", md, machine=MACHINE)
    assert md.read_text() == text


def test_appends_a_missing_section_before_the_history(doc, tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## History\n\n- a\n")
    doc.update_doc("kernels", "table", "python bench/kernels.py", md, machine=MACHINE, title="Triton kernels")
    text = md.read_text()
    assert text.index("## Triton kernels\n\n<!-- bench:kernels -->") < text.index("## History") and text.endswith("- a\n")
    doc.update_doc("gpu", "t2", "python bench/gpu.py", md, machine=MACHINE)
    assert md.read_text().index("## gpu\n") > md.read_text().index("<!-- /bench:kernels -->")
    fresh = tmp_path / "new.md"
    doc.update_doc("fp8", "t", "c", fresh, machine=MACHINE)
    assert fresh.read_text().startswith("# Benchmarks\n\n## fp8\n\n<!-- bench:fp8 -->")


def test_bad_markers_and_names_are_refused(doc, tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("<!-- bench:fp8 -->\nonly the start\n")
    with pytest.raises(ValueError, match="holds only one of <!-- bench:fp8 --> / <!-- /bench:fp8 -->; expected both"):
        doc.update_doc("fp8", "t", "c", md, machine=MACHINE)
    with pytest.raises(ValueError, match="section name 'a b' must be a plain word"):
        doc.update_doc("a b", "t", "c", md, machine=MACHINE)


def test_machine_line_names_the_cpu_flags_cores_and_torch(doc):
    import torch

    from mmte.device import cpu_info

    line = doc.machine_line(note="2 torch threads")
    assert line.startswith(f"Machine: {cpu_info().model} (flags: ") and f"torch {torch.__version__}" in line
    assert f"{cpu_info().logical_cores} logical" in line and line.endswith("2 torch threads.")


def test_md_table_checks_its_rows(doc):
    assert doc.md_table(["a", "b"], [[1, 2.5]], align="lr") == "| a | b |\n| --- | ---: |\n| 1 | 2.5 |"
    with pytest.raises(ValueError, match=r"table row \['1'\] has 1 cells; expected 2"):
        doc.md_table(["a", "b"], [[1]])


def test_the_command_line_leaves_out_update_doc(doc):
    assert doc.command_line("bench/fp8.py", ["--rounds", "5", "--update-doc", "/tmp/B.md", "--threads", "1"]) == (
        "python bench/fp8.py --rounds 5 --threads 1")
    assert doc.command_line("bench/x.py", ["--update-doc", "--steps", "3", "--note", "a b"]) == "python bench/x.py --steps 3 --note 'a b'"


def test_benchmarks_md_sections_are_paired_and_cite_no_issue():
    """BENCHMARKS.md holds each bench script's section once, every start marker with its end; the page and its history
    cite no issue numbers, and the history links resolve."""
    import re

    from tests.conftest import REPO

    text = (REPO / "BENCHMARKS.md").read_text()
    names = set(re.findall(r"<!-- bench:([\w-]+) -->", text))
    assert names >= {"backbone", "predict", "fp8", "strategies", "pipeline", "kernels", "gpu", "speech_probe",
                     "generalisation-audio", "generalisation-forecast", "generalisation-tabular"}
    for name in names:
        assert text.count(f"<!-- bench:{name} -->") == 1 and text.count(f"<!-- /bench:{name} -->") == 1, name
        assert text.index(f"<!-- bench:{name} -->") < text.index(f"<!-- /bench:{name} -->"), name
    pages = [REPO / "BENCHMARKS.md", *sorted((REPO / "docs" / "experiments").glob("*.md"))]
    for page in pages:
        assert not re.search(r"\bissues? ?#?\d+", page.read_text(), re.IGNORECASE), page
    for link in re.findall(r"\]\((docs/experiments/[^)]+)\)", text):
        assert (REPO / link).exists(), link
