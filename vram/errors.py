"""Errors a person can act on: each names the field and what is allowed."""

from __future__ import annotations


class VramError(ValueError):
    """Base class for every error `vram` raises on bad input."""


def one_line(exc: BaseException) -> str:
    """An error as one line a person can act on: a pydantic ValidationError's first error as
    `field: message` (a nested field joined with dots), anything else its first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except (IndexError, TypeError):  # an `errors` that is not pydantic's
            first = None
        if isinstance(first, dict):
            where = ".".join(str(x) for x in first.get("loc", ()))
            message = shown_name(str(first.get("msg", "")).removeprefix("Value error, "), 300)
            return f"{shown_name(where)}: {message}" if where else message
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def shown_name(name: str, limit: int = 60) -> str:
    """A key or path as one line of plain text: control characters escaped (a config key can
    hold a newline), cut to `limit` characters. Error messages are one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)[:limit]


class ConfigError(VramError):
    """A model config (config.json or a dict) cannot be read as an architecture."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{shown_name(field)}: {message}")


class CatalogError(VramError):
    """A data file (the GPU list, the model catalog) has a bad row."""


class FileReadError(VramError):
    """A file a person named cannot be read: missing, a folder, a device, a loop, too large."""

    def __init__(self, what: str, path: str, reason: str) -> None:
        self.what = what
        self.path = path
        self.reason = reason
        super().__init__(f"{what} {shown_name(path, 300)}: {reason}")


class FileWriteError(FileReadError):
    """A file a person named for output cannot be written: a FIFO, a device, a folder, ...
    (the same message as a file that cannot be read: what, the path, the reason)."""


class TrainingConfigError(VramError):
    """A training config (axolotl, torchtune, LLaMA-Factory, TRL, ms-swift) has a key that cannot
    be used."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{shown_name(key)}: {message}")


class InputError(VramError):
    """An argument of the Python API is out of its range (the message names the argument)."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(f"{shown_name(name)}: {message}")
