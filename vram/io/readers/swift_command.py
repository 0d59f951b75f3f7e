"""An ms-swift launch script (`NPROC_PER_NODE=2 MAX_PIXELS=1003520 swift sft --model ...`)
read as text: never run, nothing expanded but a literal assignment.

ms-swift is started from the shell (`swift/cli/main.py@3602360a` `cli_main`): environment
variables set in front of `swift sft|pt|rlhf` choose the launch (`NPROC_PER_NODE`, `NNODES`:
torchrun) and the images' bounds (`MAX_PIXELS`, ...), and the flags are HfArgumentParser's
(`--key value`, a list as several values, a bare boolean flag meaning true). This module turns
such a script into the same mapping ms-swift's own config file holds (`swift sft x.yaml`: its
keys plus an `ENV` mapping, `parse_yaml_args`), so that one reader reads both.

The shell's rules that matter are kept: backslash-newline joins lines, `#` at the start of a
word begins a comment, quotes group words (`shlex`, POSIX mode). A value that needs the shell
to run (`$(...)`, backquotes, `$VAR` of anything but a literal `VAR=value` line earlier in
the same script) is kept as a `ShellExpansion` marker: the reader reports its key as not read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from vram.errors import TrainingConfigError, shown_name
from vram.io.readers.safe_yaml import MAX_TEXT_BYTES

#: The `swift` subcommands that train (`swift/cli/main.py@3602360a` ROUTE_MAPPING).
TRAINING_COMMANDS = ("sft", "pt", "rlhf")
#: Words that may stand before `swift` and only change how it is started.
_WRAPPERS = frozenset({"nohup", "env", "exec", "time"})
#: ms-swift's entry scripts, as its multi-GPU examples start them with a launcher
#: (`accelerate launch ... swift/cli/sft.py --model ...`).
_SCRIPT = re.compile(r"(?:^|/)swift/cli/(sft|pt|rlhf)\.py$")
_LAUNCHERS = frozenset({"accelerate", "torchrun", "python", "python3", "deepspeed"})
#: Launchers that start one process per GPU (a plain `python` starts one).
_DISTRIBUTED = frozenset({"accelerate", "torchrun", "deepspeed", "torch.distributed.run",
                          "torch.distributed.launch"})
#: A launcher's flags that set the process count -> the variable ms-swift's own launch reads.
_LAUNCHER_COUNTS = {"nproc_per_node": "NPROC_PER_NODE", "nnodes": "NNODES",
                    "num_processes": "NPROC_PER_NODE", "num_gpus": "NPROC_PER_NODE"}
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_REFERENCE = re.compile(r"^\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})$")
#: A token that ends the command: a separator, a pipe, a redirection.
_END = re.compile(r"^(?:[;&|]+|[0-9]*[<>].*)$")
#: A line that starts a training command, after `VAR=value` prefixes and wrappers.
_PREFIX_VALUE = r"(?:\$\([^)\n]*\)|[^\s$]|\$(?!\())*"  # alternatives never overlap: no backtracking
_COMMAND = re.compile(rf"^[ \t]*(?:(?:[A-Za-z_][A-Za-z0-9_]*={_PREFIX_VALUE}|nohup|env|exec|time)"
                      r"[ \t]+)*swift[ \t]+(?:sft|pt|rlhf)(?:[ \t]|\\?$)", re.MULTILINE)
#: A command line, continuations joined (ms-swift's longest example is under 2,000).
MAX_LINE_CHARS = 64_000
#: Numbers longer than this stay text (Python refuses to parse ints of over 4,300 digits).
_MAX_DIGITS = 400


@dataclass(frozen=True)
class ShellExpansion:
    """A value the shell would compute (`$(...)`, `$VAR`, backquotes): never evaluated."""

    text: str


@dataclass
class SwiftCommand:
    """The training command of a script: its subcommand, flags and environment."""

    subcommand: str
    #: Flags as ms-swift's config file holds them, with `ENV` for the environment.
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    #: Whether a launcher that starts one process per GPU runs it (accelerate, torchrun).
    distributed_launcher: bool = False


def looks_like_command(text: str | bytes) -> bool:
    """Whether the text holds a `swift sft|pt|rlhf` command line (or a launcher running
    `swift/cli/sft.py`)."""
    sample = text[:MAX_TEXT_BYTES]
    if isinstance(sample, bytes):
        sample = sample.decode("utf-8", errors="replace")
    if _COMMAND.search(sample) is not None:
        return True
    for line in re.sub(r"\\\r?\n", " ", sample).splitlines():
        words = line.split()
        while words and (_ASSIGNMENT.match(words[0]) or words[0] in _WRAPPERS):
            words = words[1:]
        if words and words[0].rsplit("/", 1)[-1] in _LAUNCHERS and any(
                _SCRIPT.search(word) for word in words):
            return True
    return False


def _logical_lines(text: str) -> list[str]:
    """Lines as the shell sees them: continuations joined, comments dropped, quotes kept."""
    lines: list[str] = []
    current: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        char = text[i]
        pair = text[i:i + 2]
        if quote != "'" and pair in ("\\\n", "\\\r"):
            i += 3 if text[i:i + 3] == "\\\r\n" else 2  # a continuation: the lines join
            continue
        if quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            current.append(pair if len(pair) == 2 else "")  # a last `\` continues to nothing
            i += 2
            continue
        elif quote == '"':
            quote = "" if char == '"' else quote
        elif char == "`" or text.startswith("$(", i):
            end = _substitution_end(text, i)
            # One word, as the shell keeps it; single-quoted so that shlex keeps it whole.
            current.append("'" + text[i:end].replace("'", "'\\''") + "'")
            i = end
            continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (not current or current[-1][-1:] in " \t;&|("):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif char in ";|&":
            current.append(f" {char} ")  # an operator even when written against a word
            i += 1
            continue
        elif char == "\n":
            lines.append("".join(current))
            current = []
            i += 1
            continue
        current.append(char)
        i += 1
    if quote:
        raise TrainingConfigError("file", f"a {quote} quote is never closed: not a command "
                                  "line vram can read")
    lines.append("".join(current))
    return [line for line in lines if line.strip()]


def _substitution_end(text: str, start: int) -> int:
    """Where a `$(...)` or backquoted command substitution starting at `start` ends."""
    if text[start] == "`":
        end = text.find("`", start + 1)
        if end < 0:
            raise TrainingConfigError("file", "a ` quote is never closed: not a command line "
                                      "vram can read")
        return end + 1
    depth = 0
    for index in range(start + 1, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index + 1
    raise TrainingConfigError("file", "a $( is never closed: not a command line vram can read")


def _words(line: str) -> list[str]:
    # shlex grows a word a character at a time (quadratic): refuse what no script holds.
    if len(line) > MAX_LINE_CHARS:
        raise TrainingConfigError("file", f"a command longer than {MAX_LINE_CHARS:,} "
                                  "characters: not a launch script")
    try:
        return shlex.split(line, comments=False, posix=True)
    except ValueError as exc:
        raise TrainingConfigError("file", f"not a command line vram can read ({exc})") from None


def _value(word: str, variables: dict[str, str], notes: list[str], key: str) -> Any:
    """A word as ms-swift would receive it: a literal, or a marker for a shell expansion."""
    if word.isdigit() and len(word) > _MAX_DIGITS:
        raise TrainingConfigError(key, f"a number of {len(word):,} digits is not a setting")
    reference = _REFERENCE.match(word)
    if reference is not None:
        name = reference.group(1) or reference.group(2)
        if name in variables:
            notes.append(f"{word} read as {shown_name(variables[name])} (assigned literally "
                         "earlier in the script)")
            return _scalar(variables[name])
    if "$" in word or "`" in word:
        return ShellExpansion(word)
    return _scalar(word)


def _scalar(word: str) -> Any:
    """A number where the text is one (HfArgumentParser converts by the field's type; the
    reader checks types), else the text."""
    if re.fullmatch(r"-?[0-9]+", word) and len(word) <= _MAX_DIGITS:
        return int(word)
    if re.fullmatch(r"-?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+)", word):
        number = float(word)
        return number
    return word


def _flags(words: list[str], variables: dict[str, str],
           notes: list[str]) -> dict[str, Any]:
    """`--key v`, `--key v1 v2` (a list), `--key` (true), `--key=v`."""
    data: dict[str, Any] = {}
    key: str | None = None
    values: list[Any] = []

    def close() -> None:
        if key is None:
            return
        if key in data:
            notes.append(f"--{key} is given twice: the last one counts, as in argparse")
        data[key] = True if not values else values[0] if len(values) == 1 else list(values)

    for word in words:
        if word.startswith("--") and len(word) > 2:
            close()
            name, _, inline = word[2:].partition("=")
            key, values = name, []
            if inline:
                values.append(_value(inline, variables, notes, name))
        elif key is None:
            data.setdefault("(arguments)", []).append(word)
        else:
            values.append(_value(word, variables, notes, key))
    close()
    return data


def _split_command(words: list[str]) -> list[str]:
    for index, word in enumerate(words):
        if _END.match(word):
            return words[:index]
    return words


@dataclass
class _Command:
    env: dict[str, str]
    subcommand: str
    flags: list[str]
    #: The launcher's words before `swift/cli/sft.py` (empty for `swift sft`).
    launcher: list[str]


def _training_command(words: list[str]) -> _Command | None:
    """The command when the line runs `swift sft|pt|rlhf` or a launcher runs its script."""
    env: dict[str, str] = {}
    start: int | None = None
    for index, word in enumerate(words):
        if start is not None:
            script = _SCRIPT.search(word)
            if script is not None:
                return _Command(env, script.group(1), _split_command(words[index + 1:]),
                                words[start:index])
            if _END.match(word):
                return None
            continue
        assignment = _ASSIGNMENT.match(word)
        if assignment is not None:
            env[assignment.group(1)] = assignment.group(2)
        elif word in _WRAPPERS:
            continue
        elif word == "swift" and index + 1 < len(words):
            sub = words[index + 1].replace("_", "-")
            if sub in TRAINING_COMMANDS:
                return _Command(env, sub, _split_command(words[index + 2:]), [])
            return None
        elif word.rsplit("/", 1)[-1] in _LAUNCHERS:
            start = index
        else:
            return None
    return None


def _launcher_counts(launcher: list[str], env: dict[str, str], notes: list[str]) -> None:
    """`torchrun --nproc_per_node 4`, `accelerate launch --num_processes 4`: the count that
    `swift sft` would take from NPROC_PER_NODE (which only `swift` itself reads)."""
    for index, word in enumerate(launcher):
        name, _, inline = word.lstrip("-").replace("-", "_").partition("=")
        variable = _LAUNCHER_COUNTS.get(name) if word.startswith("--") else None
        value = inline or (launcher[index + 1] if index + 1 < len(launcher) else "")
        if variable is None or not value:
            continue
        before = f" (instead of {variable}={env[variable]}, which only `swift` reads)" if (
            variable in env and env[variable] != value) else ""
        env[variable] = value
        notes.append(f"{word.split('=', 1)[0]} {value} of {launcher[0]} read as {variable}"
                     + before)


def parse_command(text: str | bytes) -> SwiftCommand:
    """The first `swift sft|pt|rlhf` command of a script. Raises TrainingConfigError."""
    if len(text) > MAX_TEXT_BYTES:
        raise TrainingConfigError("file", f"too large ({len(text):,} bytes; a launch script is "
                                  f"at most {MAX_TEXT_BYTES:,})")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise TrainingConfigError("file", "not UTF-8 text") from None
    control = next((c for c in text if not c.isprintable() and c not in "\n\r\t"), None)
    if control is not None:
        raise TrainingConfigError("file", f"holds the control character {control!r}: not a "
                                  "launch script")
    variables: dict[str, str] = {}
    exported: dict[str, str] = {}
    found: SwiftCommand | None = None
    others = 0
    for line in _logical_lines(text):
        words = _words(line)
        if words[:1] == ["export"]:
            words = words[1:]
            target = exported
        else:
            target = variables
        if words and all(_ASSIGNMENT.match(w) for w in words):
            for word in words:  # `name=value` lines: literal variables for a later `$name`
                name, value = word.split("=", 1)
                variables[name] = value
                target[name] = value
            continue
        command = _training_command(words)
        if command is None:
            continue
        if found is not None:
            others += 1
            continue
        notes: list[str] = []
        env = {**exported, **command.env}
        if command.launcher:
            own_config = any(w.startswith(("--config_file", "--config-file"))
                             for w in command.launcher)
            notes.append(f"started by `{shown_name(' '.join(command.launcher), 120)}`"
                         + (": its config file is not read" if own_config else ""))
            _launcher_counts(command.launcher, env, notes)
        data = _flags(command.flags, variables, notes)
        data["ENV"] = {name: _value(value, variables, notes, name) for name, value in env.items()}
        distributed = any(w.rsplit("/", 1)[-1] in _DISTRIBUTED for w in command.launcher)
        found = SwiftCommand(subcommand=command.subcommand, data=data, notes=notes,
                             distributed_launcher=distributed)
    if found is None:
        raise TrainingConfigError("file", "no `swift sft`, `swift pt` or `swift rlhf` command "
                                  "found (a YAML/JSON config is read as such)")
    if others:
        found.notes.append(f"the script runs {others} more swift training command(s): "
                           "only the first is read")
    return found
