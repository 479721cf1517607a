"""How long each test file takes, so the suite's workers start the longest files first.

``--dist loadfile`` hands whole files to the xdist workers in the order the suite is collected; when one long
file starts last, one worker runs alone at the end. :func:`order` puts the files of ``tests/file_durations.json``
first, longest first (files not in it keep their order after them): the longest-processing-time-first rule,
which keeps two workers' finishing times within about one file of each other.

Refresh the table after adding or changing a long test (a full run, then the conversion)::

    python -m pytest -q --junitxml /tmp/suite.xml
    python tests/file_durations.py /tmp/suite.xml      # writes tests/file_durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_durations.json")


def measured() -> dict[str, float]:
    """``{path relative to the repository: seconds}`` from the stored table (empty when there is none)."""
    return json.loads(TABLE.read_text()) if TABLE.is_file() else {}


def order(items: list, root: Path) -> None:
    """Sort pytest ``items`` in place: measured files longest first, then the others in collection order
    (the sort is stable, so the tests within a file keep their order)."""
    seconds = measured()

    def key(item) -> float:
        try:
            rel = Path(item.path).resolve().relative_to(root).as_posix()
        except ValueError:
            return 0.0
        return -seconds.get(rel, 0.0)

    items.sort(key=key)


def from_junit(xml_path: str) -> dict[str, float]:
    """Per-file seconds (setup + call + teardown of every test case) from a pytest ``--junitxml`` report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml_path).iter("testcase"):
        module = case.get("classname", "").split("::")[0]
        parts = module.split(".")
        # classname is the dotted module (plus a class name for class-based tests): find the file it names
        for cut in range(len(parts), 0, -1):
            path = Path(*parts[:cut]).with_suffix(".py")
            if (TABLE.parent.parent / path).is_file():
                totals[path.as_posix()] += float(case.get("time", 0.0))
                break
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    table = from_junit(sys.argv[1])
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values()):.0f} s in all; longest: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in list(table.items())[:5]))
