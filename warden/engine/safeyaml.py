"""The one YAML loader for input from people: policies (the API and the CLI), the server's
`--config` file and the simulator's cluster files.

It is PyYAML's safe loader with aliases refused. An alias (`*name`) repeats the node its anchor
(`&name`) marks; nested aliases let a few hundred bytes stand for a document of billions of
nodes, which every walk over the loaded data (validation, dumping, hashing) then pays for. No
input warden reads needs them, so the first alias ends the load, naming it. Without aliases the
loaded data holds no more nodes than the text has characters, so every bound on the size of the
text (`limits.max_body_bytes` on a request) bounds the loaded data too. Anchors alone are
harmless and accepted.
"""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML ships without type hints

__all__ = ["AliasRefused", "SafeLoader", "load_yaml"]


class AliasRefused(yaml.composer.ComposerError):  # type: ignore[misc, unused-ignore]
    """The text holds an alias; `problem` says which, `problem_mark` where."""

    def __init__(self, anchor: str, mark: Any) -> None:
        super().__init__(None, None, f"YAML aliases (*{anchor}) are not accepted", mark)
        self.anchor = anchor


class SafeLoader(yaml.SafeLoader):  # type: ignore[misc, unused-ignore]  # Any, without the hints
    """`yaml.SafeLoader` refusing every alias before it is composed into the document."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call, unused-ignore]
            raise AliasRefused(event.anchor, event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """The one document in `text`, as `yaml.safe_load` reads it but with aliases refused
    (`AliasRefused`, a `yaml.YAMLError` like every other refusal)."""
    return yaml.load(text, Loader=SafeLoader)
