"""The one YAML loader for input from people: policies (the API and the CLI), the server's
`--config` file and the simulator's cluster and queue-map files.

It is PyYAML's safe loader (or, for `text_only`, its base loader, every scalar as written)
with what a hostile file could use refused, each as a `yaml.YAMLError` that names the problem
and where (`describe` puts it on one line):

- **Aliases.** An alias (`*name`) repeats the node its anchor (`&name`) marks; nested aliases
  let a few hundred bytes stand for a document of billions of nodes, which every walk over the
  loaded data (validation, dumping, hashing) then pays for. No input warden reads needs them,
  so the first alias ends the load, naming it. Without aliases the loaded data holds no more
  nodes than the text has characters, so every bound on the size of the text
  (`limits.max_body_bytes` on a request) bounds the loaded data too. Anchors alone are
  harmless and accepted.
- **Nesting deeper than `MAX_DEPTH`.** PyYAML composes nested collections recursively: some
  thousand `[` would end in a `RecursionError` (a crash, not a refusal), and every walk over the
  loaded data recurses as deep. No file warden reads nests a tenth as deep.
- **Duplicate keys.** PyYAML keeps the last of them silently, so a setting given twice would
  lose the first without a word. `load_yaml` refuses the first; the policy loader collects them
  all (`SafeLoader.duplicates`) to report with the policy's other problems.
- **Values Python cannot build or print**: an integer of more than 4300 digits, a date like
  `2024-13-45`, a time zone offset of 99 hours raise `ValueError` inside PyYAML, and a hex
  integer of 5000 digits loads but cannot be printed in decimal; here they are refused as YAML
  errors at the scalar that holds them (integers wider than `INT_BITS`).
"""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML ships without type hints

__all__ = [
    "INT_BITS",
    "MAX_DEPTH",
    "REFUSALS",
    "AliasRefused",
    "DepthRefused",
    "DuplicateKey",
    "SafeLoader",
    "TextLoader",
    "ValueRefused",
    "describe",
    "load_yaml",
]

MAX_DEPTH = 100
"""Collections nested in one another, at most (a policy's deepest queue tree of 40 levels
nests some 80)."""

INT_BITS = 1024
"""The widest integer taken (`0x` and `0o` integers escape Python's 4300-digit limit, and one
beyond it could not even be printed in a refusal); no number warden reads comes near."""

MERGE_TAG = "tag:yaml.org,2002:merge"


class AliasRefused(yaml.composer.ComposerError):  # type: ignore[misc, unused-ignore]
    """The text holds an alias; `problem` says which, `problem_mark` where."""

    def __init__(self, anchor: str, mark: Any) -> None:
        super().__init__(None, None, f"YAML aliases (*{anchor}) are not accepted", mark)
        self.anchor = anchor


class DepthRefused(yaml.composer.ComposerError):  # type: ignore[misc, unused-ignore]
    """Collections nest deeper than `MAX_DEPTH`; `problem_mark` is where the first too deep one starts."""

    def __init__(self, mark: Any) -> None:
        super().__init__(None, None, f"collections nested more than {MAX_DEPTH} deep are not accepted", mark)


class DuplicateKey(yaml.constructor.ConstructorError):  # type: ignore[misc, unused-ignore]
    """A mapping gives `key` twice; `problem_mark` is the second."""

    def __init__(self, key: Any, mark: Any) -> None:
        super().__init__(None, None, f"duplicate key {key!r}: given twice", mark)
        self.key = key
        self.where = f"line {mark.line + 1}, column {mark.column + 1}"


class ValueRefused(yaml.constructor.ConstructorError):  # type: ignore[misc, unused-ignore]
    """A scalar Python cannot hold as the type YAML resolves it to (`ValueError`, `OverflowError`)."""

    def __init__(self, value: str, why: str, mark: Any) -> None:
        shown = value if len(value) <= 40 else f"{value[:37]}..."
        super().__init__(None, None, f"{shown!r} is not a value Python can hold: {why}", mark)


class _Guarded:
    """What both loaders add to PyYAML's: aliases and deep nesting refused as they are
    composed (before anything is built), duplicate keys noted, values that fail refused."""

    duplicates: list[DuplicateKey]
    _depth: int

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            event = self.peek_event()  # type: ignore[attr-defined]
            raise AliasRefused(event.anchor, event.start_mark)
        depth = getattr(self, "_depth", 0)
        if depth >= MAX_DEPTH and self.check_event(yaml.CollectionStartEvent):  # type: ignore[attr-defined]
            raise DepthRefused(self.peek_event().start_mark)  # type: ignore[attr-defined]
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth = depth

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        value = node.value if isinstance(node.value, str) else node.tag
        try:
            data = super().construct_object(node, deep)  # type: ignore[misc]
        except (ValueError, OverflowError) as err:
            raise ValueRefused(value, str(err), node.start_mark) from None
        if isinstance(data, int) and data.bit_length() > INT_BITS:
            raise ValueRefused(value, f"an integer of more than {INT_BITS} bits", node.start_mark)
        return data

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if not hasattr(self, "duplicates"):
            self.duplicates = []
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: PyYAML's construct_mapping refuses it
                continue
            if duplicate:
                self.duplicates.append(DuplicateKey(key, key_node.start_mark))
        return super().construct_mapping(node, deep)  # type: ignore[misc]


class SafeLoader(_Guarded, yaml.SafeLoader):  # type: ignore[misc, unused-ignore]  # Any, without the hints
    """`yaml.SafeLoader` with aliases, deep nesting and failing values refused and duplicate
    keys noted in `duplicates`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates = []


class TextLoader(_Guarded, yaml.BaseLoader):  # type: ignore[misc, unused-ignore]  # Any, without the hints
    """`yaml.BaseLoader` (every scalar as text, names as written) guarded as `SafeLoader` is."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates = []


def load_yaml(text: str, text_only: bool = False) -> Any:
    """The one document in `text`, as `yaml.safe_load` reads it (with `text_only`, every
    scalar a string) but with aliases, nesting deeper than `MAX_DEPTH`, duplicate keys and
    values Python cannot hold refused, each a `yaml.YAMLError`."""
    loader = (TextLoader if text_only else SafeLoader)(text)
    try:
        data = loader.get_single_data()
        if loader.duplicates:
            raise loader.duplicates[0]
        return data
    finally:
        loader.dispose()


REFUSALS = (AliasRefused, DepthRefused, DuplicateKey, ValueRefused)
"""What this loader refuses of a text PyYAML itself would load."""


def describe(err: yaml.YAMLError) -> str:
    """`err` on one line: its problem and the line and column it names (PyYAML's own text
    spans several lines, with a copy of the offending line); what PyYAML itself refuses is
    called a syntax error."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem is None:
        text = " ".join(str(err).split())
    else:
        context = getattr(err, "context", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        text = f"{context}: {problem}{where}" if context else f"{problem}{where}"
    return text if isinstance(err, REFUSALS) else f"YAML syntax error: {text}"
