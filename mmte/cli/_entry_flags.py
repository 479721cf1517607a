"""``--model.tokenizers.<name>.<option>`` / ``--model.heads.<name>.<option>`` flags, merged into the recipe's entry.

The parser treats ``model.tokenizers`` and ``model.heads`` as whole dicts, so such a flag given to it
directly would replace the recipe's entry with ``{option: value}``, dropping its ``name`` and every
other option. :func:`split_entry_flags` takes them out of the command line; :func:`apply_entry_flags`
sets them inside the parsed entries and returns flags that pass the merged sections whole.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError
from ._util import plain

__all__ = ["apply_entry_flags", "split_entry_flags"]

_ENTRY_FLAG = re.compile(r"^--model\.(tokenizers|heads)\.([^.=\s]+)\.([^=\s]+)(?:=(.*))?$", re.DOTALL)

#: one flag: (section, entry key, option path, YAML value)
EntryFlag = tuple[str, str, list[str], str]


def split_entry_flags(argv: list[str]) -> tuple[list[str], list[EntryFlag]]:
    """Take ``--model.heads.<name>.<option> v`` / ``--model.tokenizers.<key>.<option> v`` out of ``argv``.

    Returns:
        the other arguments, and the flags as ``(section, key, option path, value)``.
    """
    rest: list[str] = []
    flags: list[EntryFlag] = []
    i = 0
    while i < len(argv):
        m = _ENTRY_FLAG.match(argv[i])
        if m is None:
            rest.append(argv[i])
            i += 1
            continue
        section, key, option, value = m.groups()
        if value is None:
            if i + 1 >= len(argv):
                raise UsageError(f"{argv[i]} needs a value", "expected --model.<tokenizers|heads>.<name>.<option> <value>")
            value, i = argv[i + 1], i + 1
        flags.append((section, key, option.split("."), value))
        i += 1
    return rest, flags


def apply_entry_flags(config: Any, flags: list[EntryFlag]) -> list[str]:
    """Set each flag inside the parsed ``model.<section>.<key>`` of ``config``.

    Returns:
        ``--model.<section>=<JSON>`` flags that pass each merged section whole.
    """
    import json

    import yaml

    sub = config.get("subcommand")
    model = config[sub]["model"] if sub else config["model"]
    for section, key, path, raw in flags:
        entries = dict(model.get(section) or {})
        entry = entries.get(key)
        if entry is None:
            if section == "heads":
                known = ", ".join(entries) or "none"
                raise UsageError(f"--model.heads.{key}.{'.'.join(path)}: the model has no head {key!r}", f"expected one of: {known}")
            entry = {}
        entry = {"name": entry} if isinstance(entry, str) else plain(entry)
        node = entry
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"--model.{section}.{key}.{'.'.join(path)}: {part!r} is not a mapping", "expected a nested option")
        try:
            node[path[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise UsageError(f"--model.{section}.{key}.{'.'.join(path)}: {raw!r} is not a YAML value ({e.problem})",
                             "expected a number, string, list or mapping") from None
        entries[key] = entry
        model[section] = entries
    return [f"--model.{section}={json.dumps(plain(model[section]))}" for section in dict.fromkeys(f[0] for f in flags)]
