"""What a reader found in a training config: the mapped setup and the mapping report.

Every key a reader looked at ends up in exactly one place: a `MappedKey` (it set a setup field,
or was read and recorded), an `IgnoredKey` (with the reason), or, for a key the file leaves out,
an `AppliedDefault` naming the tool's own default and the source file at a version.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Format = Literal["axolotl", "torchtune", "llamafactory", "trl", "ms-swift"]
FORMATS: tuple[Format, ...] = ("axolotl", "torchtune", "llamafactory", "trl", "ms-swift")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MappedKey(_Frozen):
    """One key of the file, its value, and what it set (`field=value`, or a note)."""

    key: str
    value: str
    sets: str


class IgnoredKey(_Frozen):
    key: str
    reason: str


class AppliedDefault(_Frozen):
    """A setup field the file leaves out, filled with the tool's own default."""

    field: str
    value: str
    source: str


class NotModelled(_Frozen):
    """Read from the file and kept, but the current `TrainingSetup` cannot hold it yet."""

    field: str
    value: str
    note: str


class MappingReport(_Frozen):
    format: Format
    tool_version: str
    mapped: tuple[MappedKey, ...]
    ignored: tuple[IgnoredKey, ...]
    defaults: tuple[AppliedDefault, ...]
    not_modelled: tuple[NotModelled, ...]
    notes: tuple[str, ...]

    def lines(self) -> list[str]:
        """A plain-text table for the terminal."""
        out = [f"Read as {self.format} ({self.tool_version})", "", "key -> value -> sets"]
        width = max((len(row.key) for row in self.mapped), default=10)
        out += [f"  {row.key:<{width}}  {row.value:<20}  {row.sets}" for row in self.mapped]
        if self.defaults:
            out += ["", "defaults applied (the file leaves these out):"]
            out += [f"  {d.field} = {d.value}  ({d.source})" for d in self.defaults]
        if self.not_modelled:
            out += ["", "read, not yet modelled:"]
            out += [f"  {n.field} = {n.value}  ({n.note})" for n in self.not_modelled]
        if self.ignored:
            out += ["", "ignored:"]
            out += [f"  {i.key}: {i.reason}" for i in self.ignored]
        if self.notes:
            out += ["", "notes:"] + [f"  {note}" for note in self.notes]
        return out


class ReadResult(_Frozen):
    """A reader's answer: the model as the file names it, and the setup fields it implies.

    `fields` is everything the file implies, in the case-file vocabulary; `setup_fields` is
    the part `TrainingSetup` holds, ready for `TrainingSetup.model_validate`.
    """

    format: Format
    model_ref: str | None
    model_slug: str | None
    fields: dict[str, Any]
    setup_fields: dict[str, Any]
    report: MappingReport
