"""`Knob`: how people meet one setup field (flag, app control, URL key, case-file column)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Knob:
    """How people meet one setup field, declared once on the field (`Annotated` metadata).

    `vram.io.knobs` reads it, with the field's type, default and range, to build the CLI flag,
    the app control and its URL key, the case-file reader, and error messages that name what
    the person typed. The library's default is the only default.
    """

    #: The app control's title.
    label: str
    #: The app's widget key and URL parameter (short: it is in every shared link).
    key: str
    #: The command-line flag.
    flag: str
    help: str = ""
    #: The case-file column (validation/README.md) that `validate` reads; None: not in cases.
    column: str | None = None
    #: Labels of the choices in the app, by their text ("auto" is the None choice).
    labels: tuple[tuple[str, str], ...] = ()
    #: The values the app offers (sliders and lists); empty: every allowed value.
    app_options: tuple[object, ...] = ()
    flag_aliases: tuple[str, ...] = ()
    #: Other names accepted for a choice (sharding's fsdp-full, ...).
    aliases: tuple[str, ...] = ()
    #: Flag, URL and column state the opposite of the field (longest_batch_once).
    inverse: bool = False
    #: Drawn above the app's Advanced section.
    basic: bool = False
    #: The methods it means something for (the app disables it for the others); empty: all.
    only_for: tuple[str, ...] = ()
