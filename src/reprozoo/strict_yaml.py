"""YAML that refuses duplicate keys.

PyYAML keeps the last of two equal keys without a word; in a spec that once turned a claim's
``op: "<="`` into an orphaned ``op: ">"`` with threshold 0 (rex's SDE claim), a claim that could not
fail. Every spec and method config is read through :func:`load`, which names the file and line of
the second key.
"""
from __future__ import annotations

from pathlib import Path

import yaml


class DuplicateKeyError(yaml.YAMLError):
    pass


class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where present
    pass


def _mapping_without_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            mark = key_node.start_mark
            raise DuplicateKeyError(
                f"{getattr(loader, 'source_name', mark.name)}:{mark.line + 1}: duplicate key {key!r} (first at line {seen[key] + 1}); "
                "YAML would silently keep the last one")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def loads(text: str, name: str = "<string>"):
    loader = StrictLoader(text)
    loader.source_name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load(path: Path):
    return loads(Path(path).read_text(), str(path))
