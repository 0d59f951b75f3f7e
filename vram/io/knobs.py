"""The setup's knobs, each declared once on its `TrainingSetup` field, resolved for every surface.

A field's `Knob` metadata (vram.setup) plus its type, default and range give everything the
command line, the app, its URLs and the case-file reader need:

    >>> knob = knob_for("micro_batch")
    >>> knob.flag, knob.key, knob.column, knob.default, (knob.low, knob.high)
    ('--batch', 'batch', 'micro_batch', 1, (1, 4096))
    >>> knob.parse("8")
    8

Adding a knob is one annotated field in `TrainingSetup` plus its physics; the flag, the app
control, the URL key, the case-file column and the error names follow from it.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import ValidationError

from vram.errors import VramError
from vram.setup import LORA_TARGETS, Knob, TrainingSetup, parse_lora_targets
from vram.stacks.resolve import resolve

Kind = Literal["bool", "int", "float", "choice", "targets", "text"]
#: A vision-language model's knobs that default to the stack's: resolved in the setup record
#: when the run has images or video (otherwise they do nothing).
VISION_STACK_KNOBS = ("max_pixels", "min_pixels", "crop_images", "video_max_pixels",
                      "freeze_vision")
#: What a None value is called on every surface ("the stack's default").
AUTO = "auto"
#: Longer number texts are refused before conversion (int() of 4,300+ digits raises).
MAX_NUMBER_CHARS = 32
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class SetupKnob:
    """One `TrainingSetup` field with its `Knob`: kind, choices, range and default resolved."""

    name: str
    meta: Knob
    kind: Kind
    #: None is allowed and means the stack's default.
    optional: bool
    #: The library's default, as the field holds it (the one source of defaults).
    default: object
    #: Allowed values of a choice, as the field holds them (enum text or literal values).
    choices: tuple[object, ...] = ()
    low: int | float | None = None
    high: int | float | None = None
    #: Whether `high` itself is excluded (dropout < 1).
    high_open: bool = False
    #: The enum its choices come from (`Optimizer`), if any.
    enum_name: str = ""

    @property
    def flag(self) -> str:
        return self.meta.flag

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def column(self) -> str | None:
        return self.meta.column

    @property
    def label(self) -> str:
        return self.meta.label

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.meta.labels)

    def range_text(self) -> str:
        """The allowed values, for messages: ``1..4096``, ``one of: a, b``, ``true or false``."""
        if self.kind == "bool":
            return "true or false" + (" or auto" if self.optional else "")
        if self.kind == "choice":
            names = [str(c) for c in self.choices] + ([AUTO] if self.optional else [])
            return "one of: " + ", ".join(names)
        if self.kind == "targets":
            return ", ".join(LORA_TARGETS) + ", or all-linear"
        if self.low is not None and self.high is not None:
            low, high = _num(self.low), _num(self.high)
            return f"at least {low} and below {high}" if self.high_open else f"{low} to {high}"
        examples = [str(o) for o in self.meta.app_options[:1]]
        return "text" + (f" such as {examples[0]}" if examples else "")

    def outer(self, value: object) -> object:
        """The field's value as people state it (inverse knobs state the opposite)."""
        return (not value) if self.meta.inverse and isinstance(value, bool) else value

    def parse(self, text: str) -> object:
        """Text typed on any surface (flag, URL, case-file cell) -> the field's value.

        Raises ValueError saying what is allowed; the caller adds the name the person used.
        """
        value = text.strip()
        if self.optional and value.lower() in ("", AUTO):
            return None
        if self.kind == "bool":
            lowered = value.lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(f"{_shown(text)} is not {self.range_text()}")
            return self.outer(lowered in _TRUE)
        if self.kind in ("int", "float"):
            return self._number(value)
        if self.kind == "choice":
            return self._choice(value)
        if self.kind == "targets":
            return parse_lora_targets(value)
        return value

    def text(self, value: object) -> str:
        """The field's value as text on every surface (`parse` reads it back)."""
        value = self.outer(value)
        if value is None:
            return AUTO
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, Enum):
            return str(value.value)
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    def _number(self, value: str) -> int | float:
        if len(value) > MAX_NUMBER_CHARS:
            raise ValueError(f"{_shown(value)} is not a number in {self.range_text()}")
        try:
            number: int | float = int(value) if self.kind == "int" else float(value)
        except ValueError:
            noun = "a whole number" if self.kind == "int" else "a number"
            raise ValueError(f"{_shown(value)} is not {noun} ({self.range_text()})") from None
        if not math.isfinite(number) or not self.within(number):
            raise ValueError(f"{_num(number)} is outside {self.range_text()}")
        return number

    def within(self, number: float) -> bool:
        if self.low is not None and number < self.low:
            return False
        if self.high is not None:
            return number < self.high if self.high_open else number <= self.high
        return True

    def _choice(self, value: str) -> object:
        lowered = value.lower()
        for choice in self.choices:
            if str(choice) == lowered:
                return choice
        if lowered in self.meta.aliases:
            return lowered  # the field's validator maps it
        raise ValueError(f"{_shown(value)} is not {self.range_text()}")


def _num(number: float) -> str:
    return f"{number:,.0f}" if float(number).is_integer() else f"{number:g}"


def _shown(text: str) -> str:
    return repr(text[:40])


def _bound(value: object) -> int | float:
    """A range bound from pydantic's metadata (`Field(ge=...)`)."""
    if isinstance(value, int | float):
        return value
    raise TypeError(f"a knob's bound must be a number, not {value!r}")


def _strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    metadata: list[Any] = []
    while get_origin(annotation) is Annotated:
        inner, *extra = get_args(annotation)
        metadata.extend(extra)
        annotation = inner
    return annotation, metadata


def _resolve(name: str) -> SetupKnob:
    info = TrainingSetup.model_fields[name]
    metas = [m for m in info.metadata if isinstance(m, Knob)]
    if len(metas) != 1:
        raise TypeError(f"TrainingSetup.{name} needs exactly one Knob in its metadata")
    annotation, metadata = _strip_annotated(info.annotation)
    metadata = [*info.metadata, *metadata]
    optional = False
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(members) < len(get_args(annotation))
        if len(members) == 1:
            annotation, more = _strip_annotated(members[0])
            metadata += more
    kind: Kind
    choices: tuple[object, ...] = ()
    enum_name = ""
    if name == "lora_targets":
        kind = "targets"
    elif annotation is bool:
        kind = "bool"
    elif annotation is int:
        kind = "int"
    elif annotation is float:
        kind = "float"
    elif isinstance(annotation, type) and issubclass(annotation, Enum):
        kind, choices = "choice", tuple(member.value for member in annotation)
        enum_name = annotation.__name__
    elif get_origin(annotation) is Literal:
        kind, choices = "choice", get_args(annotation)
    elif annotation is str:
        kind = "text"
    else:
        raise TypeError(f"TrainingSetup.{name}: no knob kind for {annotation!r}")
    low: int | float | None = None
    high: int | float | None = None
    high_open = False
    for item in metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt):
            low = _bound(item.ge if isinstance(item, annotated_types.Ge) else item.gt)
        elif isinstance(item, annotated_types.Le):
            high = _bound(item.le)
        elif isinstance(item, annotated_types.Lt):
            high, high_open = _bound(item.lt), True
    default = info.default.value if isinstance(info.default, Enum) else info.default
    return SetupKnob(name=name, meta=metas[0], kind=kind, optional=optional, default=default,
                     choices=choices, low=low, high=high, high_open=high_open,
                     enum_name=enum_name)


@cache
def setup_knobs() -> tuple[SetupKnob, ...]:
    """Every `TrainingSetup` field's knob, in field order."""
    return tuple(_resolve(name) for name in TrainingSetup.model_fields)


def knob_for(name: str) -> SetupKnob:
    """The knob of one field."""
    for knob in setup_knobs():
        if knob.name == name:
            return knob
    raise KeyError(name)


def setup_from_texts(texts: Mapping[str, str], name_of: Callable[[SetupKnob], str],
                     by: Callable[[SetupKnob], str | None]) -> TrainingSetup:
    """A setup from text values keyed by each knob's `by` name (a column, a URL key).

    Empty and absent values take the library's default. A bad value raises `KnobError` naming
    the knob as `name_of` says (the column, the flag, the control).
    """
    fields: dict[str, object] = {}
    for knob in setup_knobs():
        outer = by(knob)
        text = texts.get(outer, "") if outer else ""
        if not (text or "").strip():
            continue
        try:
            fields[knob.name] = knob.parse(text)
        except ValueError as exc:
            raise KnobError(f"{name_of(knob)}: {exc}") from None
    return build_setup(fields, name_of)


class KnobError(VramError):
    """A setup value that cannot be used; each line starts with the name the person used."""


def build_setup(fields: Mapping[str, object], name_of: Callable[[SetupKnob], str]) -> TrainingSetup:
    """`TrainingSetup(**fields)`, or `KnobError` whose lines name the knobs as `name_of` says."""
    try:
        return TrainingSetup.model_validate(dict(fields))
    except ValidationError as exc:
        raise KnobError("\n".join(error_lines(exc, name_of))) from None


def error_lines(exc: ValidationError, name_of: Callable[[SetupKnob], str]) -> list[str]:
    """One line per problem: the knob's name as the person knows it, then what is allowed."""
    by_field = {knob.name: knob for knob in setup_knobs()}
    lines: list[str] = []
    for error in exc.errors():
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        loc = error.get("loc") or ()
        field = str(loc[0]) if loc else ""
        if not field and ": " in message:  # cross-field rules start with their field's name
            field, message = message.split(": ", 1)
        knob = by_field.get(field)
        if knob is None:
            lines.append(message)
            continue
        if str(error.get("type", "")).startswith(("greater_than", "less_than")):
            message = f"{str(error.get('input'))[:40]} is outside {knob.range_text()}"
        elif str(error.get("type", "")).endswith(("_type", "enum", "literal_error")):
            message = f"{str(error.get('input'))[:40]!r} is not {knob.range_text()}"
        lines.append(f"{name_of(knob)}: {message}")
    return lines


def _resolved(setup: TrainingSetup) -> dict[str, object]:
    """Fields whose None means "the stack's default", as the run has them
    (`vram.stacks.resolve`); a knob that does nothing in this run stays None."""
    resolved = resolve(setup)
    run = resolved.run
    return {
        "sharding_engine": run.sharding_engine,
        "quant": setup.effective_quant,
        "loss": run.loss,
        "compile": run.compile,
        "compile_loss": run.compile_loss,
        "ckpt_reentrant": run.ckpt_reentrant if setup.grad_ckpt else None,
        "fsdp_version": run.fsdp_version if setup.sharding.shards_gradients else None,
        "fsdp_embedding_units": run.fsdp_embedding_units if resolved.fsdp2 else None,
        "torch_autocast": run.torch_autocast,
        **({name: getattr(run, name) for name in VISION_STACK_KNOBS}
           if setup.images_per_sample or setup.video_frames else {}),
    }


def setup_record(setup: TrainingSetup) -> dict[str, object]:
    """The resolved setup in the case-file vocabulary (validation/README.md): each knob under
    its column (or field name), defaults of the stack resolved, JSON-ready values. This is the
    `setup` of `estimate --json` (design.md), so a run can be written back as a case row."""
    resolved = _resolved(setup)
    record: dict[str, object] = {}
    for knob in setup_knobs():
        value = resolved.get(knob.name, getattr(setup, knob.name))
        value = knob.outer(value)
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = ";".join(value)
        record[knob.column or knob.name] = value
    return record


def markdown_table() -> str:
    """Every knob with its surfaces and default, as docs/knobs.md shows it (a test keeps the
    two equal)."""
    lines = ["| field | CLI flag | URL key | case-file column | default | allowed |",
             "|---|---|---|---|---|---|"]
    for knob in setup_knobs():
        default = (knob.labels.get(AUTO, "the stack's") if knob.default is None
                   else f"`{knob.text(knob.default)}`")
        flags = ", ".join(f"`{f}`" for f in (knob.flag, *knob.meta.flag_aliases))
        column = f"`{knob.column}`" if knob.column else ""
        # An enum's members grow with the estimator (stacks, optimizers): name the enum.
        allowed = (f"a `vram.{knob.enum_name}` value" + (" or auto" if knob.optional else "")
                   if knob.enum_name else knob.range_text())
        lines.append(f"| `{knob.name}` | {flags} | `{knob.key}` | {column} | {default} | "
                     f"{allowed} |")
    return "\n".join(lines)
