"""Case-insensitive names for catalog entries: every entry's own name and its ``aliases`` (the model and the
hardware catalogs both let a user write ``llama`` for ``llama-3.1-8b`` or ``H100`` for ``h100``)."""

from __future__ import annotations


def alias_table(entries: dict) -> dict[str, str]:
    """{lower-case name or alias: the entry's name} for a catalog table ``{name: {..., "aliases": [...]}}``."""
    table = {}
    for name, entry in entries.items():
        table[name.lower()] = name
        for alias in entry.get("aliases", ()):
            table[alias.lower()] = name
    return table


__all__ = ["alias_table"]
