"""`PYTORCH_CUDA_ALLOC_CONF`: the caching allocator's settings, parsed as PyTorch parses them.

The text is `key:value` pairs separated by commas, a list in square brackets
(`roundup_power2_divisions:[256:4,>:1]`), as `c10/core/AllocatorConfig.h@v2.13.0`
(`ConfigTokenizer`, `AcceleratorAllocatorConfig::parseArgs`) and `c10/cuda/CUDAAllocatorConfig.h`
read it. `PYTORCH_ALLOC_CONF` is the newer name of the same variable. Empty text is the default:

    >>> parse_alloc_conf("expandable_segments:True").expandable_segments
    True
    >>> parse_alloc_conf("") == AllocConf()
    True

Keys that change no figure the model computes (pinned host memory, locking, IPC handles) are
accepted and ignored; an unknown key is an error, as it is for PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.allocator.rules import LARGE_BUFFER, POWER2_INTERVALS
from vram.units import MIB

#: Keys PyTorch accepts that do not change what the model computes.
IGNORED_KEYS = frozenset({
    "pinned_use_background_threads", "pinned_max_round_threshold", "pinned_max_cached_size",
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
    "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom",
})

NO_POWER2_ROUNDING = (0,) * POWER2_INTERVALS


@dataclass(frozen=True, slots=True)
class AllocConf:
    """The settings the model follows (defaults: PyTorch's, AllocatorConfig.h@v2.13.0:340-353)."""

    expandable_segments: bool = False
    #: `max_split_size_mb`: blocks of this size or more are never split (None: no limit).
    max_split_size_bytes: int | None = None
    #: `max_non_split_rounding_mb`: how much larger an oversize cached block may be.
    max_non_split_rounding_bytes: int = LARGE_BUFFER
    #: `large_segment_size_mb`: the segment a request of 1-10 MiB carves from.
    large_segment_bytes: int = LARGE_BUFFER
    #: `roundup_power2_divisions`, one entry per power-of-two interval from 1 MiB (0: none).
    roundup_power2_divisions: tuple[int, ...] = NO_POWER2_ROUNDING
    #: `garbage_collection_threshold`: active only with a memory fraction set.
    garbage_collection_threshold: float = 0.0
    #: `per_process_memory_fraction` (or `torch.cuda.set_per_process_memory_fraction`).
    memory_fraction: float | None = None

    @property
    def gc_active(self) -> bool:
        """PyTorch collects only when a fraction is set (`set_fraction && threshold > 0`)."""
        return self.memory_fraction is not None and self.garbage_collection_threshold > 0.0

    def text(self) -> str:
        """The settings that differ from the default, in `PYTORCH_CUDA_ALLOC_CONF` form."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size_bytes is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_bytes // MIB}")
        if self.max_non_split_rounding_bytes != LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_bytes // MIB}")
        if self.large_segment_bytes != LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_bytes // MIB}")
        table = self.roundup_power2_divisions
        if len(set(table)) == 1 and table[0]:
            parts.append(f"roundup_power2_divisions:{table[0]}")
        elif table != NO_POWER2_ROUNDING:
            listed = ",".join(f"{1 << i}:{d}" for i, d in enumerate(table) if d)
            parts.append(f"roundup_power2_divisions:[{listed}]")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        if self.memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.memory_fraction}")
        return ",".join(parts)


def tokenize(text: str) -> list[str]:
    """`ConfigTokenizer`: keys, values and the characters `: , [ ]`; whitespace dropped."""
    tokens: list[str] = []
    word = ""
    for ch in text:
        if ch in ",:[]":
            if word:
                tokens.append(word)
                word = ""
            tokens.append(ch)
        elif not ch.isspace():
            word += ch
    if word:
        tokens.append(word)
    return tokens


def _fail(key: str, why: str) -> ValueError:
    return ValueError(f"alloc_conf: {key}: {why}")


def _expect(tokens: list[str], i: int, token: str, key: str) -> None:
    if i >= len(tokens) or tokens[i] != token:
        raise _fail(key, f"expected {token!r}")


def _value(tokens: list[str], i: int, key: str) -> str:
    if i >= len(tokens) or tokens[i] in ",:[]":
        raise _fail(key, "missing value")
    return tokens[i]


def _uint(text: str, key: str) -> int:
    if not text.isdigit():
        raise _fail(key, f"{text!r} is not a whole number")
    return int(text)


def _power_of_two(value: int, key: str, what: str) -> int:
    if value <= 0 or value & (value - 1):
        raise _fail(key, f"the {what} must be a power of 2, got {value}")
    return value


def _divisions_list(tokens: list[str], i: int, key: str) -> tuple[tuple[int, ...], int]:
    """`[size_mb:div, ..., >:div]`: the first entry also fills the intervals below it; `>`
    fills every interval after the last one named (`parseRoundUpPower2Divisions`)."""
    table = [0] * POWER2_INTERVALS
    first, last = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        bound = _value(tokens, i, key)
        _expect(tokens, i + 1, ":", key)
        div = _power_of_two(_uint(_value(tokens, i + 2, key), key), key, "divisions")
        if bound == ">":
            table[last + 1:] = [div] * (POWER2_INTERVALS - last - 1)
        else:
            size_mb = _power_of_two(_uint(bound, key), key, "interval")
            index = min(size_mb.bit_length() - 1, POWER2_INTERVALS - 1)
            if first:
                table[:index] = [div] * index
                first = False
            table[index] = div
            last = index
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise _fail(key, "the list has no closing ']'")
    return tuple(table), i


def _threshold(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(key, f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise _fail(key, f"must be in (0, 1), got {value}")
    return value


def _fraction(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(key, f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise _fail(key, f"must be in (0, 1], got {value}")
    return value


def _bool(text: str, key: str) -> bool:
    if text not in ("True", "False", "true", "false"):
        raise _fail(key, f"expected True or False, got {text!r}")
    return text in ("True", "true")


def parse_alloc_conf(text: str | None) -> AllocConf:
    """The settings of a `PYTORCH_CUDA_ALLOC_CONF` string; ValueError naming the key if bad."""
    tokens = tokenize(text or "")
    fields: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i]
        _expect(tokens, i + 1, ":", key)
        if tokens[i + 2:i + 3] == ["["]:
            if key != "roundup_power2_divisions":
                raise _fail(key, "takes no list")
            fields["roundup_power2_divisions"], i = _divisions_list(tokens, i + 2, key)
        else:
            _set(fields, key, _value(tokens, i + 2, key))
            i += 2
        i += 1
        if i < len(tokens):
            _expect(tokens, i, ",", key)
            i += 1
    conf = AllocConf(**fields)  # type: ignore[arg-type]
    return _checked(conf)


def _set(fields: dict[str, object], key: str, value: str) -> None:
    if key == "expandable_segments":
        fields[key] = _bool(value, key)
    elif key == "max_split_size_mb":
        fields["max_split_size_bytes"] = _uint(value, key) * MIB
    elif key == "max_non_split_rounding_mb":
        fields["max_non_split_rounding_bytes"] = _uint(value, key) * MIB
    elif key == "large_segment_size_mb":
        fields["large_segment_bytes"] = max(1, _uint(value, key)) * MIB
    elif key == "roundup_power2_divisions":
        div = _power_of_two(_uint(value, key), key, "divisions")
        fields[key] = (div,) * POWER2_INTERVALS
    elif key == "garbage_collection_threshold":
        fields[key] = _threshold(value, key)
    elif key == "per_process_memory_fraction":
        fields["memory_fraction"] = _fraction(value, key)
    elif key == "backend":
        if value != "native":
            raise _fail(key, f"only the native caching allocator is modelled, not {value!r}")
    elif key not in IGNORED_KEYS:
        raise _fail(key, "unknown setting (PyTorch rejects it too)")


def _checked(conf: AllocConf) -> AllocConf:
    """`max_split_size_mb` must be at least `large_segment_size_mb` (AllocatorConfig.cpp)."""
    limit = conf.max_split_size_bytes
    if limit is not None and limit < conf.large_segment_bytes:
        raise _fail("max_split_size_mb",
                    f"must be at least {conf.large_segment_bytes // MIB} (large_segment_size_mb)")
    return conf
