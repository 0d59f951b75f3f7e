"""Honest bounds on every figure: the band the measured figure falls in, at a stated rate.

Each source of uncertainty the estimate knows it has is a named term: a share (`low`, `high`)
of a quantity the estimate already computed, switched on by the setup or the model, never by a
stack's name. A term enters the figure it belongs to and every figure built on it:

    allocated band = allocated peak  -/+ the allocated terms
    reserved band  = reserved peak   -/+ the allocated terms + the allocator's
    device band    = device peak     -/+ all of them + the device's

The terms' sizes live in `data/bounds.toml`, written by `benchmarks/bounds_calibration.py`
from the measured runs (the shared case file's scored rows and the H200 steps), held out one
run at a time; each row there says where its size came from. The band is read as the
`rate` interval of a two-piece normal centred on the estimate, which gives the probability
that a run fits a given memory (`judge`).

    >>> from vram import load_model, TrainingSetup, estimate
    >>> b = estimate(load_model("llama-3.1-8b"), TrainingSetup()).bounds
    >>> b.device.low_bytes <= b.device.high_bytes
    True
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from statistics import NormalDist
from typing import Any, NamedTuple

from vram.errors import CatalogError
from vram.memory.allocator.conf import parse_alloc_conf
from vram.model.spec import ModelSpec
from vram.paths import data_dir
from vram.result import Bounds
from vram.setup import Method, TrainingSetup
from vram.stacks.resolve import resolve

BOUNDS_FILE = "bounds.toml"

#: Tokens a collator pads a sequence to a multiple of, at most: axolotl pads every batch to
#: a multiple of 64 unless told otherwise (`src/axolotl/core/builders/causal.py@271c0d8e`,
#: `HFCausalTrainerBuilder.build`: `multiple = 64`); Transformers' collators take
#: `pad_to_multiple_of` (8 or 64 in common recipes). The sequence length a person gives is the
#: longest before that padding.
PAD_MULTIPLE = 64


def padding_share(seq_len: int) -> float:
    """The padded tokens' share of the padded sequence, (P - s) / P with P = s rounded up to
    PAD_MULTIPLE: what the activations grow by, read against the padded length so the band
    stays within one more set of activations at any length (at 1 token the activations hold
    more than tokens: weight copies, workspaces) and rises with the sequence between
    multiples."""
    padded = -(-seq_len // PAD_MULTIPLE) * PAD_MULTIPLE
    return (padded - seq_len) / padded


class Figure(StrEnum):
    """The three figures an estimate reports, in the order they are built on each other."""

    ALLOCATED = "allocated"
    RESERVED = "reserved"
    DEVICE = "device"


#: What a term can be a share of, in the order `bounds_from` multiplies them: three for the
#: allocated figure, three for the allocator (reserved), three for the device.
QUANTITIES: tuple[str, ...] = ("allocated", "activations", "padding", "slack", "churn", "state",
                               "context", "paged", "device")


def bare_size(model: ModelSpec) -> bool:
    """A model built from a bare parameter count (`ModelSpec.approximate_why` is empty only
    there: `vram.model.architecture.model_from_param_count`)."""
    return model.approximate and not model.approximate_why


def _always(model: ModelSpec, setup: TrainingSetup) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class TermSpec:
    """What one term is: the figure it enters, the quantity it is a share of, and when it is
    on (`on`, read from the setup's knobs or the model, never a stack's name)."""

    name: str
    figure: Figure
    quantity: str
    share_of: str
    when: str
    on: Callable[[ModelSpec, TrainingSetup], bool] = _always


#: Every term. `data/bounds.toml` gives each a size (`benchmarks/bounds_calibration.py`).
TERMS: tuple[TermSpec, ...] = (
    TermSpec("model", Figure.ALLOCATED, "allocated", "the allocated peak", "always"),
    TermSpec("activations", Figure.ALLOCATED, "activations", "the activations at the peak",
             "always"),
    TermSpec("versions", Figure.ALLOCATED, "allocated", "the allocated peak",
             "torch_version is not given", lambda m, s: s.torch_version is None),
    TermSpec("bitsandbytes", Figure.ALLOCATED, "activations", "the activations at the peak",
             "the base is quantized (qlora) and bitsandbytes_version is not given",
             lambda m, s: s.method is Method.QLORA and s.bitsandbytes_version is None),
    TermSpec("multi_gpu", Figure.ALLOCATED, "allocated", "the allocated peak", "n_gpus > 1",
             lambda m, s: s.n_gpus > 1),
    TermSpec("moe_routing", Figure.ALLOCATED, "activations", "the activations at the peak",
             "the model routes tokens to experts", lambda m, s: m.is_moe),
    TermSpec("padding", Figure.ALLOCATED, "padding",
             "the activations at the peak x the tokens up to the next multiple of "
             f"{PAD_MULTIPLE}, over that padded length",
             f"seq_len is not a multiple of {PAD_MULTIPLE}"),
    TermSpec("approximate", Figure.ALLOCATED, "allocated", "the allocated peak",
             "the architecture is approximate (an unknown Llama-shaped type, a part not "
             "modelled yet)", lambda m, s: m.approximate and not bare_size(m)),
    TermSpec("bare_size", Figure.ALLOCATED, "allocated", "the allocated peak",
             "the model is a bare parameter count", lambda m, s: bare_size(m)),
    TermSpec("allocator_slack", Figure.RESERVED, "slack",
             "the estimated slack (reserved - allocated)",
             "always (x expandable_segments when the allocator maps them)"),
    TermSpec("allocator_churn", Figure.RESERVED, "churn",
             "the most the activations hold in the step", "always (x expandable_segments)"),
    TermSpec("allocator_state", Figure.RESERVED, "state",
             "the allocated peak less its activations", "always (x expandable_segments)"),
    TermSpec("cuda_context", Figure.DEVICE, "context", "the CUDA context constant",
             "context_mib is not given", lambda m, s: s.context_mib is None),
    TermSpec("paged_state", Figure.DEVICE, "paged", "the paged optimizer state",
             "the optimizer pages its state (unified memory)"),
    TermSpec("device", Figure.DEVICE, "device", "the device peak", "always"),
)
TERM_NAMES: tuple[str, ...] = tuple(t.name for t in TERMS)


@dataclass(frozen=True, slots=True)
class TermSize:
    """One term's size: the share of its quantity below and above the estimate."""

    low: float
    high: float
    source: str


@dataclass(frozen=True, slots=True)
class BoundsTable:
    """`data/bounds.toml`: the rate the band covers, each term's size, and the factor the
    allocator's terms take under expandable segments."""

    rate: float
    sizes: tuple[TermSize, ...]
    expandable_segments: float
    expandable_source: str


def _share(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 10:
        raise CatalogError(f"{BOUNDS_FILE} {where}: a share from 0 to 10, got {value!r}")
    return float(value)


def table_from(data: Mapping[str, Any]) -> BoundsTable:
    """A validated table from the TOML's contents; an error names the entry."""
    rate = data.get("rate")
    if isinstance(rate, bool) or not isinstance(rate, float) or not 0.5 <= rate < 1.0:
        raise CatalogError(f"{BOUNDS_FILE} rate: a share from 0.5 to 1, got {rate!r}")
    rows = data.get("term")
    if not isinstance(rows, list):
        raise CatalogError(f"{BOUNDS_FILE}: no [[term]] entries")
    by_name: dict[str, TermSize] = {}
    for row in rows:
        name = row.get("name") if isinstance(row, dict) else None
        if name not in TERM_NAMES or name in by_name:
            raise CatalogError(f"{BOUNDS_FILE} term {name!r}: unknown or repeated; "
                               f"allowed: {', '.join(TERM_NAMES)}")
        by_name[name] = TermSize(_share(row.get("low"), f"{name}.low"),
                                 _share(row.get("high"), f"{name}.high"),
                                 str(row.get("source", "")))
    missing = [name for name in TERM_NAMES if name not in by_name]
    if missing:
        raise CatalogError(f"{BOUNDS_FILE}: no size for term {missing[0]!r}")
    expandable = data.get("expandable_segments", {})
    return BoundsTable(rate=rate, sizes=tuple(by_name[name] for name in TERM_NAMES),
                       expandable_segments=_share(expandable.get("factor"),
                                                  "expandable_segments.factor"),
                       expandable_source=str(expandable.get("source", "")))


@cache
def bounds_table() -> BoundsTable:
    """The committed calibration (`data/bounds.toml`), read once."""
    with (data_dir() / BOUNDS_FILE).open("rb") as file:
        return table_from(tomllib.load(file))


def expandable_segments(setup: TrainingSetup) -> bool:
    """Whether the caching allocator maps expandable segments: the `alloc_conf` knob, else the
    stack's setting (`resolve(setup).run.alloc_conf`, from `data/stacks.toml`), parsed as
    PyTorch parses `PYTORCH_CUDA_ALLOC_CONF` (`vram.memory.allocator.conf`)."""
    return parse_alloc_conf(resolve(setup).run.alloc_conf).expandable_segments


class Peaks(NamedTuple):
    """What the bounds are built from: the estimate's figures, per GPU, in bytes."""

    allocated: int
    reserved: int
    device: int
    #: The activations at the allocated peak, and the most they hold at any moment.
    activations: int
    activations_max: int
    paged: int
    #: The CUDA context the device figure counts.
    context: int


def quantity_values(setup: TrainingSetup, p: Peaks) -> tuple[float, ...]:
    """Each of `QUANTITIES`, in bytes."""
    a, act = p.allocated, p.activations
    return (a, act, act * padding_share(setup.seq_len),
            max(0, p.reserved - a), p.activations_max, max(0, a - act),
            p.context, p.paged, p.device)


def quantities(model: ModelSpec, setup: TrainingSetup, p: Peaks,
               allocator: float = 1.0) -> tuple[float, ...]:
    """Each term's quantity in bytes, in `TERMS` order (0 where the term is off), the
    allocator's times `allocator`: the terms one by one (the calibration fits them so)."""
    values = dict(zip(QUANTITIES, quantity_values(setup, p), strict=True))
    return tuple(
        (values[t.quantity] * (allocator if t.figure is Figure.RESERVED else 1.0))
        if t.on(model, setup) else 0.0 for t in TERMS)


@dataclass(frozen=True, slots=True)
class Shares:
    """The sizes of the terms that are on for one model and setup, summed by quantity
    (`QUANTITIES` order), below and above: what `bounds_from` multiplies."""

    rate: float
    low: tuple[float, ...]
    high: tuple[float, ...]
    #: The CUDA context term's own share, below and above (`Bounds.context_*_bytes`).
    context_low: float
    context_high: float


def shares_for(model: ModelSpec, setup: TrainingSetup, table: BoundsTable | None = None,
               ) -> Shares:
    """The terms that are on, summed by quantity (depends on neither batch nor sequence:
    the estimate keeps it with the setup's structure)."""
    table = table or bounds_table()
    allocator = table.expandable_segments if expandable_segments(setup) else 1.0
    low = dict.fromkeys(QUANTITIES, 0.0)
    high = dict.fromkeys(QUANTITIES, 0.0)
    for term, size in zip(TERMS, table.sizes, strict=True):
        if term.on(model, setup):
            factor = allocator if term.figure is Figure.RESERVED else 1.0
            low[term.quantity] += size.low * factor
            high[term.quantity] += size.high * factor
    context = table.sizes[TERM_NAMES.index("cuda_context")]
    on = setup.context_mib is None
    return Shares(rate=table.rate, low=tuple(low.values()), high=tuple(high.values()),
                  context_low=context.low if on else 0.0,
                  context_high=context.high if on else 0.0)


def bounds_from(shares: Shares, setup: TrainingSetup, p: Peaks) -> Bounds:
    """The bands of the three figures: a few products of what the estimate computed, in
    `QUANTITIES` order (`quantity_values`, written out: this runs in every estimate)."""
    lo, hi = shares.low, shares.high
    a, act, r, d = p.allocated, p.activations, p.reserved, p.device
    pad = act * padding_share(setup.seq_len)
    slack, state = max(0, r - a), max(0, a - act)
    a_low = lo[0] * a + lo[1] * act + lo[2] * pad
    a_high = hi[0] * a + hi[1] * act + hi[2] * pad
    r_low = a_low + lo[3] * slack + lo[4] * p.activations_max + lo[5] * state
    r_high = a_high + hi[3] * slack + hi[4] * p.activations_max + hi[5] * state
    d_low = r_low + lo[6] * p.context + lo[7] * p.paged + lo[8] * d
    d_high = r_high + hi[6] * p.context + hi[7] * p.paged + hi[8] * d
    allocated_low = max(0, round(a - a_low))
    reserved_low = max(allocated_low, round(r - r_low))
    return Bounds.assemble(
        shares.rate, allocated_low, round(a + a_high), reserved_low, round(r + r_high),
        max(reserved_low, round(d - d_low)), round(d + d_high),
        round(shares.context_low * p.context), round(shares.context_high * p.context))


def bounds_of(model: ModelSpec, setup: TrainingSetup, p: Peaks) -> Bounds:
    """`bounds_from` with the shares worked out afresh (the estimate keeps them per setup
    structure instead)."""
    return bounds_from(shares_for(model, setup), setup, p)


# --------------------------------------------------------------------------------------------
# The verdict: fits, borderline (with a probability), does not fit
# --------------------------------------------------------------------------------------------


class Verdict(StrEnum):
    FITS = "fits"
    BORDERLINE = "borderline"
    DOES_NOT_FIT = "does not fit"


@dataclass(frozen=True, slots=True)
class FitVerdict:
    """How a band sits against a memory: `probability` that the run fits, from the band."""

    verdict: Verdict
    probability: float

    @property
    def fits(self) -> bool:
        """The high bound is within the memory: the only state the planner counts as a fit."""
        return self.verdict is Verdict.FITS

    def text(self) -> str:
        """'fits', 'borderline, 72 % likely to fit' or 'does not fit'."""
        if self.verdict is Verdict.BORDERLINE:
            return f"borderline, {self.probability * 100:.0f} % likely to fit"
        return self.verdict.value


#: The standard normal distribution.
STANDARD_NORMAL = NormalDist()


@cache
def _z(rate: float) -> float:
    """How many standard deviations a `rate` band's edge lies from its middle."""
    return STANDARD_NORMAL.inv_cdf((1.0 + rate) / 2.0)


def fit_probability(low: int, point: int, high: int, memory: int, rate: float) -> float:
    """The chance the measured figure is within `memory`, reading [low, high] as the `rate`
    interval of a two-piece normal centred on `point` (each side its own spread)."""
    spread = (point - low if memory < point else high - point) / _z(rate)
    if spread <= 0:
        return 1.0 if memory >= point else 0.0
    return STANDARD_NORMAL.cdf((memory - point) / spread)


def judge(low: int, point: int, high: int, memory: int, rate: float) -> FitVerdict:
    """Fits when the high bound is within `memory`, does not fit when the low bound is over
    it, borderline between, with the chance of fitting from the band."""
    probability = fit_probability(low, point, high, memory, rate)
    if high <= memory:
        return FitVerdict(Verdict.FITS, probability)
    if low > memory:
        return FitVerdict(Verdict.DOES_NOT_FIT, probability)
    return FitVerdict(Verdict.BORDERLINE, probability)


class DeviceBand(NamedTuple):
    """The device figure per GPU and its band: what a verdict holds against a GPU's memory.
    `context_low` and `context_high` are the CUDA context term's share of the band."""

    low: int
    point: int
    high: int
    rate: float
    context_low: int = 0
    context_high: int = 0

    @classmethod
    def of(cls, device_peak_bytes: int, bounds: Bounds) -> DeviceBand:
        """The device figure of an estimate (`Estimate` or `PeakBytes`) and its band."""
        return cls(bounds.device_low_bytes, device_peak_bytes, bounds.device_high_bytes,
                   bounds.rate, bounds.context_low_bytes, bounds.context_high_bytes)

    def judged(self, memory: int) -> FitVerdict:
        return judge(self.low, self.point, self.high, memory, self.rate)

    def fits(self, memory: int) -> bool:
        """The high bound is within `memory` (a sure fit; borderline is not one)."""
        return self.high <= memory

    def with_context(self, difference: int, known: bool) -> DeviceBand:
        """On a GPU whose CUDA context differs from the estimate's by `difference`; `known`:
        the GPU's context was measured, so the context term leaves the band."""
        low = self.low + difference + (self.context_low if known else 0)
        high = self.high + difference - (self.context_high if known else 0)
        point = self.point + difference
        return DeviceBand(min(low, point), point, max(high, point), self.rate,
                          0 if known else self.context_low, 0 if known else self.context_high)

    def scaled(self, point: int) -> DeviceBand:
        """The same band, relative to its figure, around another figure (a what-if's)."""
        if self.point <= 0:
            return DeviceBand(point, point, point, self.rate)
        ratio = point / self.point
        return DeviceBand(round(self.low * ratio), point, round(self.high * ratio), self.rate,
                          round(self.context_low * ratio), round(self.context_high * ratio))


__all__ = [
    "QUANTITIES",
    "TERMS",
    "BoundsTable",
    "DeviceBand",
    "FitVerdict",
    "Peaks",
    "Shares",
    "TermSize",
    "Verdict",
    "bounds_from",
    "bounds_of",
    "bounds_table",
    "fit_probability",
    "judge",
    "quantities",
    "shares_for",
    "table_from",
]
