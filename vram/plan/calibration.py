"""MFU per method and GPU class, calibrated on published measured throughputs.

`data/throughput.csv` holds one measured run per row (tokens per second per GPU) with the
setup it was measured under and its source (`file@commit`). For each row the achieved MFU is

    FLOPs per token x tokens/s / (dense bf16 FLOP/s x measured speed factors)

and a cell's MFU is the median over its rows (method x desktop/datacenter), falling back to
its GPU class's median scaled by the method's (classes: desktop, datacenter, compute-heavy
datacenter; `vram.plan.throughput.GpuClass`). Rows measured with CPU offload of parameters or
optimizer, and rows marked `calibrate=no` (the notes say why), are predicted but not used to
calibrate.

A row names the GPU it was measured on by its id in the shipped catalog (`data/gpus.csv`),
whose figures (dense bf16 rate, bandwidth, segment) are that GPU's, whatever list a team
points `VRAM_GPUS_CSV` at: the table is read by GPU kind (class), and a team's GPU is timed
with its own figures and its kind's MFU (`MfuTable.basis` says which, issue 25).

    python -m vram validate-speed      # the time model's error on every row
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from vram.errors import CatalogError, FileReadError, one_line
from vram.files import read_csv_rows
from vram.gpus import Gpu, load_gpus, shipped_gpus_path
from vram.model.catalog import load_model
from vram.paths import data_dir
from vram.plan.flops import Recompute
from vram.plan.throughput import (
    GpuClass,
    Workload,
    gpu_class,
    offload_bytes_per_step,
    offloaded_activations,
    peak_flops,
    seconds_per_token,
    time_multiplier,
)
from vram.setup import Framework, Method, Offload, Sharding, TrainingSetup
from vram.step.estimate import estimate

#: Used only when no row at all could be read (a team's empty table).
DEFAULT_MFU = 0.35


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    id: str
    work: Workload
    tokens_per_second_per_gpu: float
    source: str
    #: False for rows kept to check the model but not to calibrate it (the notes say why).
    use_for_calibration: bool = True

    @property
    def calibrates(self) -> bool:
        offloaded = self.work.setup.offload in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER)
        return self.use_for_calibration and not offloaded

    def achieved_mfu(self) -> float:
        peak = peak_flops(self.work.gpu)
        assert peak is not None
        return (self.work.flops_per_token * self.tokens_per_second_per_gpu
                * time_multiplier(self.work.setup) / peak)


@dataclass(frozen=True, slots=True)
class MfuTable:
    """MFU by (method, GPU class). A cell without rows takes its class's median scaled by how
    the method compares with all methods (method median / overall median)."""

    cells: dict[tuple[Method, GpuClass], float]
    by_class: dict[GpuClass, float]
    by_method: dict[Method, float]
    overall: float
    #: Rows behind each cell and each class, and the GPUs (catalog ids) they were measured on.
    cell_rows: dict[tuple[Method, GpuClass], int] = field(default_factory=dict)
    class_rows: dict[GpuClass, int] = field(default_factory=dict)
    measured_gpus: frozenset[str] = frozenset()

    def mfu(self, method: Method, cls: GpuClass) -> float:
        if (method, cls) in self.cells:
            return self.cells[(method, cls)]
        method_ratio = self.by_method.get(method, self.overall) / self.overall
        return self.by_class.get(cls, self.overall) * method_ratio

    def basis(self, method: Method, cls: GpuClass) -> str:
        """Where `mfu(method, cls)` comes from, in words (the plan shows it)."""
        value = self.mfu(method, cls)
        if (method, cls) in self.cells:
            n = self.cell_rows.get((method, cls), 0)
            return (f"MFU {value:.2f}: the median of {n} measured {method.value} run(s) on "
                    f"{cls.value} GPUs")
        if not self.class_rows:
            return f"MFU {value:.2f}: no measured run to calibrate on (a default)"
        if cls in self.by_class:
            return (f"MFU {value:.2f}: no measured {method.value} run on {cls.value} GPUs: "
                    f"their median ({self.class_rows[cls]} runs) scaled by {method.value}'s "
                    "ratio to all methods")
        return (f"MFU {value:.2f}: no measured run on {cls.value} GPUs: the median of all "
                f"{sum(self.class_rows.values())} runs scaled by {method.value}'s ratio")


def _whole(row: dict[str, str], key: str) -> int:
    text = row[key].strip()
    if not text.isdigit() or len(text) > 12:
        raise ValueError(f"{key}: {text[:20]!r} is not a whole number")
    return int(text)


def _setup_from_row(row: dict[str, str]) -> tuple[TrainingSetup, Recompute]:
    text = row["recompute"].strip()
    if text not in {r.value for r in Recompute}:
        raise ValueError(f"recompute: {text[:20]!r}; allowed: "
                         f"{', '.join(r.value for r in Recompute)}")
    recompute = Recompute(text)
    n_gpus = _whole(row, "n_gpus")
    offload = row["offload"].strip() or "none"
    method = row["method"].strip()
    setup = TrainingSetup(
        method=method, optimizer=row["optimizer"].strip(), precision="bf16-true",
        micro_batch=_whole(row, "micro_batch"), seq_len=_whole(row, "seq_len"),
        grad_ckpt=recompute is not Recompute.NONE,
        compile=row["compile"].strip().lower() == "true", loss=row["loss"].strip(),
        n_gpus=n_gpus,
        sharding=Sharding.ZERO3 if (n_gpus > 1 or offload in ("optimizer", "params+optimizer"))
        else Sharding.NONE,
        offload=offload, framework=Framework.TORCHTUNE if method != "full" else "other",
        lora_rank=16,
    )
    return setup, recompute


#: The columns a throughput table must have (`calibrate`, `source` and `notes` may be left out).
COLUMNS = ("id", "model", "method", "gpu", "n_gpus", "seq_len", "micro_batch", "recompute",
           "compile", "optimizer", "offload", "loss", "tokens_per_second_per_gpu")
#: A throughput table is a few dozen rows of published runs: 1 MB is far more than enough.
MAX_TABLE_BYTES = 1_000_000
#: Tokens per second per GPU a measured run can have: above 0, below 10 million.
MAX_TOKENS_PER_SECOND = 1e7


def _measured(row: dict[str, str]) -> float:
    text = row["tokens_per_second_per_gpu"].strip()
    value = float(text) if len(text) <= 32 else math.nan
    if not (math.isfinite(value) and 0 < value < MAX_TOKENS_PER_SECOND):
        raise ValueError(f"tokens_per_second_per_gpu: {text[:40]!r} must be a number above 0 "
                         f"and below {MAX_TOKENS_PER_SECOND:.0e}")
    return value


def read_runs(path: str | Path | None = None, gpus: Sequence[Gpu] | None = None,
              ) -> tuple[MeasuredRun, ...]:
    """The measured table, each row turned into a workload (an error names the row).

    The file is read as `vram.files` reads every file a person names: a regular UTF-8 CSV of
    at most `MAX_TABLE_BYTES` (a FIFO or a device is refused before it is read). A row's
    `gpu` is looked up in `gpus`, by default the shipped catalog: the GPU it was measured on,
    never a team's list (`VRAM_GPUS_CSV`), whose ids and figures are its own."""
    csv_path = Path(path) if path is not None else data_dir() / "throughput.csv"
    listed = gpus if gpus is not None else load_gpus(shipped_gpus_path())
    by_id = {gpu.id: gpu for gpu in listed}
    try:
        rows = read_csv_rows(csv_path, what="throughput table", required=COLUMNS,
                             max_bytes=MAX_TABLE_BYTES)
    except FileReadError as exc:
        raise CatalogError(str(exc)) from None
    if not rows:
        raise CatalogError(f"throughput table {csv_path.name}: no rows")
    runs: list[MeasuredRun] = []
    for line, row in rows:
        try:
            setup, recompute = _setup_from_row(row)
            model = load_model(row["model"].strip())
            gpu_id = row["gpu"].strip()
            if gpu_id not in by_id:
                raise ValueError(f"gpu {gpu_id[:40]!r} is not in the GPU catalog")
            gpu = by_id[gpu_id]
            result = estimate(model, setup)
            measured = _measured(row)
            calibrate = (row.get("calibrate") or "yes").strip().lower()
            if calibrate not in ("yes", "no"):
                raise ValueError(f"calibrate: {calibrate[:20]!r}; allowed: yes, no")
        except (KeyError, ValueError) as exc:
            raise CatalogError(f"{csv_path.name} line {line}: {one_line(exc)}") from None
        runs.append(MeasuredRun(
            id=row["id"].strip()[:80],
            work=Workload(model=model, setup=setup, gpu=gpu,
                          trainable_params=result.params.trainable, recompute=recompute,
                          offloaded_activation_bytes=offloaded_activations(setup, result)),
            tokens_per_second_per_gpu=measured, source=row.get("source", ""),
            use_for_calibration=calibrate == "yes"))
    return tuple(runs)


def calibrate(runs: Sequence[MeasuredRun]) -> MfuTable:
    """Median achieved MFU per (method, GPU class), per method, and overall."""
    usable = [run for run in runs if run.calibrates and peak_flops(run.work.gpu)]
    if not usable:
        return MfuTable(cells={}, by_class={}, by_method={}, overall=DEFAULT_MFU)
    cells: dict[tuple[Method, GpuClass], list[float]] = {}
    classes: dict[GpuClass, list[float]] = {}
    methods: dict[Method, list[float]] = {}
    for run in usable:
        value = run.achieved_mfu()
        cls = gpu_class(run.work.gpu)
        cells.setdefault((run.work.setup.method, cls), []).append(value)
        classes.setdefault(cls, []).append(value)
        methods.setdefault(run.work.setup.method, []).append(value)
    return MfuTable(
        cells={key: statistics.median(values) for key, values in cells.items()},
        by_class={key: statistics.median(values) for key, values in classes.items()},
        by_method={key: statistics.median(values) for key, values in methods.items()},
        overall=statistics.median(run.achieved_mfu() for run in usable),
        cell_rows={key: len(values) for key, values in cells.items()},
        class_rows={key: len(values) for key, values in classes.items()},
        measured_gpus=frozenset(run.work.gpu.id for run in usable),
    )


@cache
def default_mfu_table() -> MfuTable:
    """The table calibrated on the shipped `data/throughput.csv` (computed once)."""
    return calibrate(read_runs())


def predicted_tokens_per_second(run: MeasuredRun, table: MfuTable) -> float:
    mfu = table.mfu(run.work.setup.method, gpu_class(run.work.gpu))
    seconds = seconds_per_token(run.work, mfu)
    assert seconds is not None
    return 1.0 / seconds


@dataclass(frozen=True, slots=True)
class SpeedCheck:
    id: str
    predicted: float
    measured: float
    leave_one_out: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured

    @property
    def loo_error_pct(self) -> float:
        return 100.0 * (self.leave_one_out - self.measured) / self.measured


def check_runs(runs: Sequence[MeasuredRun]) -> list[SpeedCheck]:
    """Each row predicted by the table calibrated on all rows, and on all rows but itself."""
    table = calibrate(runs)
    checks = []
    for run in runs:
        if peak_flops(run.work.gpu) is None:
            continue
        others = calibrate([other for other in runs if other is not run])
        checks.append(SpeedCheck(
            id=run.id, predicted=predicted_tokens_per_second(run, table),
            measured=run.tokens_per_second_per_gpu,
            leave_one_out=predicted_tokens_per_second(run, others)))
    return checks


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[index]


def summary_line(label: str, errors: list[float]) -> str:
    absolute = [abs(e) for e in errors]
    return (f"{label}rows={len(absolute)} median_abs_pct={statistics.median(absolute):.1f} "
            f"p90_abs_pct={_percentile(absolute, 0.9):.1f} max_abs_pct={max(absolute):.1f}")


def report_lines(runs: Sequence[MeasuredRun]) -> list[str]:
    """One line per row (predicted vs measured tokens/s per GPU), the MFU table, summaries."""
    checks = check_runs(runs)
    if not checks:
        raise CatalogError("throughput table: no row's GPU has a dense bf16 rate "
                           "(bf16_dense_tflops), so no row can be predicted")
    used = {run.id for run in runs if run.calibrates}
    lines = [f"{'id':<28} {'predicted':>10} {'measured':>10} {'error':>8} {'held-out':>9}"]
    for check in checks:
        lines.append(f"{check.id:<28} {check.predicted:10.1f} {check.measured:10.1f} "
                     f"{check.error_pct:+7.1f}% {check.loo_error_pct:+8.1f}%"
                     + ("" if check.id in used else "  (check only)"))
    table = calibrate(runs)
    lines.append("MFU by method and GPU class (median of the rows):")
    for (method, cls), value in sorted(table.cells.items()):
        lines.append(f"  {method.value:<6} {cls.value:<11} {value:.3f}")
    lines.append(summary_line("held-out (each row predicted without itself): ",
                              [c.loo_error_pct for c in checks]))
    lines.append(summary_line("", [c.error_pct for c in checks]))
    return lines


__all__ = [
    "MeasuredRun",
    "MfuTable",
    "SpeedCheck",
    "calibrate",
    "check_runs",
    "default_mfu_table",
    "offload_bytes_per_step",
    "read_runs",
    "report_lines",
]
