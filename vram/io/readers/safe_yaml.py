"""Parse a training config as data only: YAML's safe subset, size-, depth- and alias-capped.

`yaml.SafeLoader` already refuses `!!python/object` and every other tag that would build an
object; on top of it this loader caps the text size, the nesting depth, the number of aliases,
and the size of the document once aliases are expanded (the "billion laughs" bomb is a few
hundred bytes that expand to 10⁹ nodes).
"""

from __future__ import annotations

import json
import math
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from vram.errors import TrainingConfigError

MAX_TEXT_BYTES = 512_000
MAX_DEPTH = 32
MAX_ALIASES = 64
MAX_EXPANDED_NODES = 100_000


class _CappedLoader(yaml.SafeLoader):
    """SafeLoader that counts what it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        """Refuse `[[[[…` before the scanner sees it: the composer's depth cap comes too late.

        PyYAML's scanner keeps one possible simple key per open flow level and re-checks all of
        them on every token (`scanner.py` `stale_possible_simple_keys`), so 50,000 nested `[`
        (100 KB) took minutes of CPU before the composer's depth check ever ran.
        """
        if self.flow_level >= MAX_DEPTH:
            raise TrainingConfigError("file", f"nested deeper than {MAX_DEPTH} levels")
        super().fetch_flow_collection_start(TokenClass)

    # `index` is typed as types-PyYAML types it (PyYAML passes a key node for mappings too).
    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise TrainingConfigError(
                    "file", f"more than {MAX_ALIASES} YAML aliases; a training config needs few"
                )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise TrainingConfigError("file", f"nested deeper than {MAX_DEPTH} levels")
        try:
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node: Node | None = super().compose_document()
        if node is not None:
            _check_expanded_size(node)
        return node


def _check_expanded_size(root: Node) -> None:
    """Nodes the document would have with every alias copied out (memoized per node)."""
    sizes: dict[int, int] = {}

    def size(node: Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_EXPANDED_NODES:
            raise TrainingConfigError(
                "file", f"expands to more than {MAX_EXPANDED_NODES:,} values through YAML "
                "aliases (an alias bomb?)"
            )
        sizes[id(node)] = total
        return total

    size(root)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")


def parse_mapping(text: str | bytes) -> dict[str, Any]:
    """The top-level mapping of a YAML or JSON training config; raises TrainingConfigError."""
    if len(text) > MAX_TEXT_BYTES:
        raise TrainingConfigError(
            "file", f"too large ({len(text):,} bytes; a training config is at most "
            f"{MAX_TEXT_BYTES:,})"
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise TrainingConfigError("file", "not UTF-8 text") from None
    try:
        if text.lstrip().startswith("{"):
            data = json.loads(text, parse_constant=_reject_constant)
        else:
            data = yaml.load(text, Loader=_CappedLoader)
    except TrainingConfigError:
        raise
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrainingConfigError("file", f"not valid YAML ({first[:120]})") from None
    except (ValueError, RecursionError) as exc:
        raise TrainingConfigError("file", f"cannot be read as data ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise TrainingConfigError("file", "must be a mapping of keys to values at the top level")
    _text_keys(data, "")
    return data


def _text_keys(data: object, where: str) -> None:
    """Every key of every mapping is text: YAML also allows `~` (null), numbers, booleans and
    even lists as keys, which no training config uses and no reader can name."""
    stack = [(data, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    shown = "~ (null)" if key is None else repr(key)[:40]
                    raise TrainingConfigError(
                        f"{path}{shown}", "a key must be text (quote it, or remove the line)")
                stack.append((value, f"{path}{key}."))
        elif isinstance(node, list):
            stack.extend((item, path) for item in node)


def finite(value: object) -> bool:
    return not (isinstance(value, float) and not math.isfinite(value))
