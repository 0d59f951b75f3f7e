"""Read the training config a user already has: axolotl, torchtune, LLaMA-Factory, TRL,
ms-swift (its config file or its `swift sft ...` launch script).

    >>> loaded = vram.load_training_config("examples/llama-3/qlora.yml")
    >>> loaded.model.name, loaded.setup.method, loaded.setup.seq_len
    >>> print("\\n".join(loaded.report.lines()))

Files are parsed as data only (YAML's safe subset, size- and alias-capped; see `safe_yaml`);
a launch script is read as text and never run (`swift_command`).
A DeepSpeed JSON that the config names is read only when it lies beside the config and
`allow_file_reads` is on; nothing is fetched. A key the file leaves out takes the tool's own
default at the version each reader names, and the report lists it with its source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from vram.errors import FileReadError, TrainingConfigError, VramError, shown_name
from vram.files import read_limited
from vram.io.readers import axolotl, llamafactory, swift, torchtune, trl
from vram.io.readers.detect import infer_format
from vram.io.readers.mapper import setup_from_fields, split_fields
from vram.io.readers.report import FORMATS, Format, MappingReport, ReadResult
from vram.io.readers.safe_yaml import MAX_TEXT_BYTES, parse_mapping
from vram.io.readers.swift_command import looks_like_command, parse_command
from vram.model.architecture import ModelSpec
from vram.model.catalog import load_model
from vram.setup import TrainingSetup

__all__ = [
    "FORMATS",
    "NOT_IN_CATALOG",
    "LoadedTrainingConfig",
    "MappingReport",
    "ReadResult",
    "infer_format",
    "load_training_config",
    "read_training_config",
    "setup_from_fields",
    "split_fields",
]


class LoadedTrainingConfig(BaseModel):
    """A training config read into vram's terms."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    format: Format
    model_ref: str | None
    #: The catalog entry the file's model resolved to, if any.
    model_slug: str | None
    #: None when the file's model is not in the catalog: `model_problem` says what to give.
    model: ModelSpec | None
    model_problem: str | None
    setup: TrainingSetup
    #: Every field the file set, in the case-file vocabulary, including ones not modelled yet.
    fields: dict[str, Any]
    report: MappingReport

    def setup_json(self) -> dict[str, Any]:
        return self.setup.model_dump(mode="json")


def read_training_config(data: Mapping[str, Any], *, format: Format | None = None,
                         overrides: Sequence[str] = (), base_dir: Path | None = None,
                         file_name: str | None = None) -> ReadResult:
    """Map an already-parsed config (a mapping) with the reader for its format."""
    plain = dict(data)
    fmt = format or infer_format(plain)
    if overrides and fmt != "torchtune":
        raise TrainingConfigError("overrides", "key=value overrides are for torchtune recipes; "
                                  "use flags for other formats")
    if fmt == "axolotl":
        return axolotl.read(plain, base_dir=base_dir)
    if fmt == "torchtune":
        return torchtune.read(plain, overrides=overrides, file_name=file_name)
    if fmt == "llamafactory":
        return llamafactory.read(plain, base_dir=base_dir)
    if fmt == "trl":
        return trl.read(plain, base_dir=base_dir)
    if fmt == "ms-swift":
        return swift.read(plain, base_dir=base_dir)
    raise TrainingConfigError("format", f"{format!r}: one of {', '.join(FORMATS)}")


def _is_file(text: str) -> bool:
    try:
        return "\n" not in text and len(text) < 4096 and Path(text).is_file()
    except OSError:  # a name too long for the file system is text, not a path
        return False


def _source_text(source: str | Path) -> tuple[str | bytes, Path | None]:
    if isinstance(source, Path) or _is_file(source):
        path = Path(source)
        try:  # a regular file, never read past the cap (vram.files)
            return read_limited(path, MAX_TEXT_BYTES, what="training config"), path
        except FileReadError as exc:
            raise TrainingConfigError("file", f"{exc.path}: {exc.reason}") from None
    return source, None


def _read_text(text: str | bytes, *, format: Format | None, overrides: Sequence[str],
               base_dir: Path | None, file_name: str | None) -> ReadResult:
    """A YAML/JSON config, or an ms-swift launch script (its `swift sft` line tells it)."""
    if format in (None, "ms-swift") and looks_like_command(text):
        if overrides:
            raise TrainingConfigError("overrides", "key=value overrides are for torchtune "
                                      "recipes; use flags for other formats")
        return swift.read_command(parse_command(text), base_dir=base_dir)
    return read_training_config(parse_mapping(text), format=format, overrides=overrides,
                                base_dir=base_dir, file_name=file_name)


#: What a model reference that names no catalog entry gets when no file may be looked at.
NOT_IN_CATALOG = "not in the catalog: upload its config.json"


def load_training_config(source: str | Path, *, format: Format | None = None,
                         overrides: Sequence[str] = (), gpus: int | None = None,
                         allow_file_reads: bool = True,
                         filesystem: bool = True) -> LoadedTrainingConfig:
    """The model and setup of a training config file (a path) or its text.

    `overrides` are torchtune's `key=value`s; `gpus` is the GPU count the launcher would give
    (no config holds it). `allow_file_reads=False` reads no DeepSpeed JSON beside the file.
    `filesystem=False` looks at nothing on the file system at all (the app, which must not
    let a pasted config map the server's files): `source` is the config's text, never a
    path; the model reference resolves to a catalog slug or Hub id, and anything else is
    `NOT_IN_CATALOG`, whether or not such a file exists. Raises `TrainingConfigError` naming
    the key that cannot be used.
    """
    if filesystem:
        text, path = _source_text(source)
    else:
        text, path = (str(source), None)
    base_dir = path.parent if (path is not None and allow_file_reads) else None
    result = _read_text(text, format=format, overrides=overrides, base_dir=base_dir,
                        file_name=path.name if path else None)
    extra = {"n_gpus": gpus} if gpus is not None else {}
    try:
        setup = setup_from_fields(result.fields, extra)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "gpus"
        raise TrainingConfigError(field, str(error["msg"]).removeprefix("Value error, ")) from None
    model: ModelSpec | None = None
    problem: str | None = None
    reference = result.model_slug or result.model_ref
    if reference is None:
        problem = "the file names no model: give one (--model)"
    elif result.model_slug is None and not filesystem:
        problem = f"{shown_name(reference, 200)!r}: {NOT_IN_CATALOG}"
    else:
        try:
            model = load_model(reference)
        except VramError as exc:
            problem = str(exc)
    return LoadedTrainingConfig(
        format=result.format, model_ref=result.model_ref, model_slug=result.model_slug,
        model=model, model_problem=problem,
        setup=setup, fields=result.fields, report=result.report)

