"""Writing the translated spec as TOML, YAML or JSON text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .tables import PLACEHOLDER

TABLE_ORDER = ("job", "distributed", "parallelism")


def _ordered(data: Mapping[str, Any]) -> dict[str, Any]:
    first = [k for k in TABLE_ORDER if k in data]
    return {k: data[k] for k in [*first, *sorted(k for k in data if k not in TABLE_ORDER)]}


def render_spec(data: Mapping[str, Any], fmt: str, source: str) -> str:
    """The spec as TOML, YAML or JSON text, with a header saying where it came from."""
    header = [
        f"Imported from madengine's additional context {source} by `mdc import madengine`.",
        f"Edit the {PLACEHOLDER} placeholders, [job] name and [job] command (madengine takes",
        "them from its model card and build manifest), then `mdc compile` it.",
    ]
    ordered = _ordered(data)
    if fmt == "json":
        return json.dumps(ordered, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import io

        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
        stream = io.StringIO()
        yaml.dump(ordered, stream)
        return "".join(f"# {line}\n" for line in header) + stream.getvalue()
    import tomlkit

    doc = tomlkit.document()
    for line in header:
        doc.add(tomlkit.comment(line))
    for key, value in ordered.items():
        doc.add(tomlkit.nl())
        doc.add(key, _toml_table(value))
    return tomlkit.dumps(doc)


def _toml_table(value: Mapping[str, Any]) -> Any:
    import tomlkit

    table = tomlkit.table()
    nested = []
    for key, item in value.items():
        if (
            isinstance(item, dict)
            and item
            and (key == "env" or all(not isinstance(v, dict) for v in item.values()))
            and key in ("env", "node_selector")
        ):
            nested.append((key, item))
        elif isinstance(item, list) and any(isinstance(v, dict) for v in item):
            array = tomlkit.array()
            array.multiline(True)
            for entry in item:
                if isinstance(entry, dict):
                    inline = tomlkit.inline_table()
                    inline.update(entry)
                    array.append(inline)
                else:
                    array.append(entry)
            table.add(key, array)
        elif isinstance(item, dict):
            inline = tomlkit.inline_table()
            inline.update(item)
            table.add(key, inline)
        else:
            table.add(key, item)
    for key, item in nested:
        sub = tomlkit.table()
        for name, v in item.items():
            if isinstance(v, dict):  # an explicit [job] env form: { ref = "NODE_RANK" }
                inline = tomlkit.inline_table()
                inline.update(v)
                sub.add(name, inline)
            else:
                sub.add(name, v)
        table.add(key, sub)
    return table
