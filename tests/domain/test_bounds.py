"""Bounds on every figure (issue 21 item 5): the committed calibration covers the measured
runs at the rate it claims, the bands keep their invariants, and the verdict has three
states.

The coverage checks read the committed table (`data/bounds.toml`) through the estimate itself,
on the shared case file's scored rows and the H200 steps; they fail when the figures move
without a recalibration (`python benchmarks/bounds_calibration.py`) or when the table is
edited by hand. The held-out coverage is the calibration's own report (benchmarks/bounds.txt).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

import vram
from benchmarks import bounds_calibration as cal
from vram.errors import CatalogError
from vram.gpus import Gpu, fit
from vram.model.architecture import model_from_config, model_from_param_count
from vram.model.catalog import load_config
from vram.rl import estimate as rl_estimate
from vram.rl.result import RLEstimate
from vram.rl.setup import RLSetup
from vram.step import bounds as b
from vram.step.bounds import Figure, Verdict, judge

ROOT = Path(__file__).resolve().parents[2]
HAS_CASES = cal.CASES.exists()
RATE = b.bounds_table().rate


@pytest.fixture(scope="module")
def measured() -> list[cal.Measured]:
    return cal.measured_runs() if HAS_CASES else cal.h200_setups()


@pytest.fixture(scope="module")
def checked(measured: list[cal.Measured]) -> list[tuple[Figure, int, int, int, int]]:
    """(figure, low, estimate, high, measured) of every measured figure, from the committed
    table through `estimate`."""
    out = []
    for m in measured:
        est = vram.estimate(m.model, m.setup)
        for figure, value in m.measured.items():
            low, high = est.bounds.band(figure.value)
            out.append((figure, low, est.figure(figure.value), high, value))
    return out


@pytest.mark.parametrize("figure", list(Figure))
def test_the_committed_bands_cover_the_measured_runs_at_their_rate(
        checked: list[tuple[Figure, int, int, int, int]], figure: Figure) -> None:
    """In sample, each figure's coverage is within 5 points of the claimed rate, and the
    median band is no wider than +-12 % of the estimate."""
    rows = [row for row in checked if row[0] is figure]
    assert len(rows) >= 60
    covered = sum(1 for _, low, _, high, value in rows if low <= value <= high) / len(rows)
    assert abs(covered - RATE) <= cal.COVERAGE_SLACK, (figure, covered)
    half = statistics.median((high - low) / 2 / point for _, low, point, high, _ in rows)
    assert half <= cal.MAX_MEDIAN_HALF_WIDTH, (figure, half)


def test_the_held_out_report_meets_its_targets() -> None:
    """benchmarks/bounds.txt: every figure's held-out coverage within 5 points of the rate and
    its median band within +-12 % (the calibration writes 'met' only then)."""
    report = (ROOT / "benchmarks" / "bounds.txt").read_text().splitlines()
    rows = [line.split() for line in report if line.split()[:1] in
            (["allocated"], ["reserved"], ["device"]) and line.split()[-1] in ("met", "MET")]
    assert [row[0] for row in rows] == ["allocated", "reserved", "device"]
    for row in rows:
        held_out, half = float(row[2].rstrip("%")), float(row[4].rstrip("%"))
        assert abs(held_out / 100 - RATE) <= cal.COVERAGE_SLACK, row
        assert half / 100 <= cal.MAX_MEDIAN_HALF_WIDTH, row
        assert row[-1] == "met"


@pytest.mark.skipif(not HAS_CASES, reason="the shared case file is not beside the project")
def test_the_committed_table_is_the_calibration_of_todays_figures(
        measured: list[cal.Measured]) -> None:
    """The table is what the calibration writes from the figures as they stand: a change that
    moves them (the allocator's reserved figure) reruns benchmarks/bounds_calibration.py."""
    text, _ = cal.table_for(cal.runs_of(measured))
    assert (ROOT / "data" / "bounds.toml").read_text() == text


def test_the_band_is_the_sum_of_its_terms() -> None:
    """Computed two ways: the estimate's bands (terms summed once per setup, then a few
    products) against each term's share of its quantity, one by one (the calibration's)."""
    table = b.bounds_table()
    sizes = cal.Sizes(low={t.name: s.low for t, s in zip(b.TERMS, table.sizes, strict=True)},
                      high={t.name: s.high for t, s in zip(b.TERMS, table.sizes, strict=True)})
    for slug, fields in [("llama-3.1-8b", {"method": "qlora", "seq_len": 1000}),
                         ("mixtral-8x7b-v0.1", {"method": "lora", "n_gpus": 4,
                                                "sharding": "zero3"}),
                         ("llama-3.1-8b", {"method": "full", "optimizer": "paged-adamw",
                                           "context_mib": 700, "torch_version": "2.4"}),
                         PARALLEL[0]]:
        model = vram.load_model(slug)
        setup = vram.TrainingSetup(**fields)
        run = cal.runs_of([cal.Measured("x", "cases", model, setup, {})])[0]
        est = vram.estimate(model, setup)
        for figure in Figure:
            low, high = cal.band(run, figure, sizes)
            got = est.bounds.band(figure.value)
            assert got.low_bytes == pytest.approx(max(0, low), abs=2)
            assert got.high_bytes == pytest.approx(high, abs=2)


#: Layouts of issue 23: the band is built on the rank that holds the peak (a pipeline stage,
#: a tensor-parallel slice, a context-parallel share of the sequence).
PARALLEL = [
    ("llama-3.1-70b", {"method": "full", "framework": "torchtitan", "n_gpus": 64, "tp": 8,
                       "pp": 4, "sharding": "fsdp", "fsdp_version": 2}),
    ("llama-3.1-8b", {"method": "full", "framework": "torchtitan", "n_gpus": 8, "cp": 4,
                      "sharding": "fsdp", "fsdp_version": 2, "seq_len": 32768}),
    ("llama-3.1-70b", {"method": "full", "n_gpus": 8, "tp": 8}),
]

SETUPS = [
    ("llama-3.1-8b", {"method": "qlora"}),
    ("llama-3.1-8b", {"method": "full", "grad_ckpt": True, "seq_len": 4000}),
    ("llama-3.1-70b", {"method": "full", "n_gpus": 16, "sharding": "zero3"}),
    ("mixtral-8x7b-v0.1", {"method": "qlora", "optimizer": "paged-adamw-8bit"}),
    ("qwen2.5-0.5b-instruct", {"method": "lora", "context_mib": 500}),
    *PARALLEL,
]


@pytest.mark.parametrize(("slug", "fields"), SETUPS)
def test_low_estimate_high_and_the_figures_nest(slug: str, fields: dict[str, object]) -> None:
    est = vram.estimate(vram.load_model(slug), vram.TrainingSetup(**fields))
    bounds = est.bounds
    for figure in ("allocated", "reserved", "device"):
        low, high = bounds.band(figure)
        assert 0 <= low <= est.figure(figure) <= high
    # each figure is built on the one below: so are its bounds
    assert bounds.allocated_low_bytes <= bounds.reserved_low_bytes <= bounds.device_low_bytes
    assert bounds.allocated_high_bytes <= bounds.reserved_high_bytes <= bounds.device_high_bytes
    assert bounds.rate == RATE


@pytest.mark.parametrize(("slug", "fields"), SETUPS)
def test_the_bounds_rise_with_the_figure(slug: str, fields: dict[str, object]) -> None:
    """More sequences per step: a larger figure, and neither bound falls."""
    model = vram.load_model(slug)
    previous = None
    for batch in (1, 2, 3, 4, 6, 8):
        est = vram.estimate(model, vram.TrainingSetup(**fields, micro_batch=batch))
        now = [*est.bounds.allocated, *est.bounds.reserved, *est.bounds.device]
        if previous is not None:
            assert all(a <= c for a, c in zip(previous, now, strict=True)), batch
        previous = now


@pytest.mark.parametrize(("slug", "fields"), PARALLEL)
def test_a_parallel_layout_has_its_band_on_every_path(slug: str, fields: dict[str, object]
                                                      ) -> None:
    """The peaks alone carry the same bands as the estimate, and the several-GPU term is on
    (a band as wide below as the single-GPU one's, at least)."""
    model = vram.load_model(slug)
    setup = vram.TrainingSetup(**fields)
    est = vram.estimate(model, setup)
    assert vram.estimate_peaks(model, setup).bounds == est.bounds
    assert next(t for t in b.TERMS if t.name == "multi_gpu").on(model, setup)
    single = vram.estimate(model, vram.TrainingSetup(**{
        **fields, "n_gpus": 1, "tp": 1, "pp": 1, "cp": 1, "sharding": "none"}))
    share = 1 - est.bounds.allocated_low_bytes / est.allocated_peak_bytes
    assert share > 1 - single.bounds.allocated_low_bytes / single.allocated_peak_bytes


def _half_width(est: vram.Estimate) -> float:
    low, high = est.bounds.device
    return (high - low) / 2 / est.device_peak_bytes


def test_an_approximate_model_has_a_wider_band_than_the_exact_one() -> None:
    setup = vram.TrainingSetup(method="lora", grad_ckpt=True)
    config = load_config("qwen2.5-7b-instruct")
    exact = vram.estimate(vram.load_model("qwen2.5-7b-instruct"), setup)
    shaped = vram.estimate(model_from_config(dict(config, model_type="not-known-here"), "x"),
                           setup)
    bare = vram.estimate(model_from_param_count(exact.params.total), setup)
    assert shaped.approximate and bare.approximate and not exact.approximate
    assert _half_width(exact) < _half_width(shaped) < _half_width(bare)


def test_stating_what_was_left_unstated_narrows_the_band() -> None:
    model = vram.load_model("llama-3.1-8b")
    loose = vram.estimate(model, vram.TrainingSetup(method="qlora"))
    versions = vram.estimate(model, vram.TrainingSetup(
        method="qlora", torch_version="2.8", bitsandbytes_version="0.48.2"))
    context = vram.estimate(model, vram.TrainingSetup(method="qlora", context_mib=1024))
    assert versions.device_peak_bytes == loose.device_peak_bytes
    assert _half_width(versions) < _half_width(loose)
    assert context.device_peak_bytes == loose.device_peak_bytes
    assert _half_width(context) < _half_width(loose)
    # the CUDA context term is the device figure's alone
    assert context.bounds.allocated == loose.bounds.allocated
    assert context.bounds.context_low_bytes == context.bounds.context_high_bytes == 0


def test_padding_to_64_tokens_widens_only_the_top() -> None:
    model = vram.load_model("llama-3.1-8b")
    whole = vram.estimate(model, vram.TrainingSetup(seq_len=1024))
    short = vram.estimate(model, vram.TrainingSetup(seq_len=1000))  # padded to 1024
    assert b.padding_share(1024) == 0 and b.padding_share(1000) == 24 / 1024
    share = b.bounds_table().sizes[b.TERM_NAMES.index("padding")]
    assert (share.low, share.high) == (0.0, 1.0)
    act = short.bucket("activations").bytes
    up = short.bounds.allocated_high_bytes - short.allocated_peak_bytes
    without = (whole.bounds.allocated_high_bytes - whole.allocated_peak_bytes) \
        * short.allocated_peak_bytes / whole.allocated_peak_bytes
    assert up - without == pytest.approx(act * 24 / 1024, rel=0.02)


def test_expandable_segments_are_read_from_the_alloc_conf_knob() -> None:
    """The `alloc_conf` knob decides, else the stack's setting (data/stacks.toml: axolotl
    sets expandable_segments:True, HF Trainer sets nothing)."""
    def on(**knobs: object) -> bool:
        return b.expandable_segments(vram.TrainingSetup(method="full", **knobs))

    assert on(alloc_conf="expandable_segments:True,max_split_size_mb:128")
    assert not on(alloc_conf="max_split_size_mb:128")
    assert not on(alloc_conf="default")
    assert not on(framework="hf-trainer")
    assert on(framework="axolotl")
    assert not on(framework="axolotl", alloc_conf="default")


def test_expandable_segments_scale_only_the_allocator_terms(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    model = vram.load_model("llama-3.1-8b")
    setup = vram.TrainingSetup(method="full")
    assert not b.expandable_segments(setup)
    table = b.bounds_table()
    half = b.BoundsTable(table.rate, table.sizes, 0.5, "test")
    plain = b.shares_for(model, setup, half)
    monkeypatch.setattr(b, "expandable_segments", lambda _setup: True)
    scaled = b.shares_for(model, setup, half)
    allocator = {b.QUANTITIES.index(q) for q in ("slack", "churn", "state")}
    for i in range(len(b.QUANTITIES)):
        factor = 0.5 if i in allocator else 1.0
        assert scaled.low[i] == pytest.approx(plain.low[i] * factor)
        assert scaled.high[i] == pytest.approx(plain.high[i] * factor)


# --------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------


def test_judge_has_three_states_and_reads_the_band_as_its_rate() -> None:
    low, point, high = 8000, 10000, 13000
    assert judge(low, point, high, 13000, 0.9).verdict is Verdict.FITS
    assert judge(low, point, high, 7999, 0.9).verdict is Verdict.DOES_NOT_FIT
    edge = judge(low, point, high, 12999, 0.9)  # a byte short of the band's top
    assert edge.verdict is Verdict.BORDERLINE
    assert judge(low, point, high, 13000, 0.9).probability == pytest.approx(0.95)
    assert judge(low, point, high, 10000, 0.9).probability == pytest.approx(0.5)
    assert judge(low, point, high, 8000, 0.9).probability == pytest.approx(0.05)
    # each side its own spread: halfway up the top half (1,500 of 3,000) mirrors halfway
    # down the bottom half (1,000 of 2,000)
    up, down = judge(low, point, high, 11500, 0.9), judge(low, point, high, 9000, 0.9)
    assert up.probability == pytest.approx(1 - down.probability)
    assert edge.text() == "borderline, 95 % likely to fit"
    assert judge(low, point, high, 20000, 0.9).text() == "fits"
    assert judge(low, point, high, 10, 0.9).text() == "does not fit"


def _gpus(memories: dict[str, int]) -> list[Gpu]:
    return [Gpu(id=name, name=name, vendor="test", segment="consumer", memory_bytes=memory,
                usd_per_hour=1.0, max_per_node=1) for name, memory in memories.items()]


def test_fit_sorts_the_catalog_into_fits_borderline_and_misses() -> None:
    """Three crafted cards around one run's band: above its top, between the estimate and
    its top, below its bottom."""
    model = vram.load_model("llama-3.1-8b")
    setup = vram.TrainingSetup(method="qlora")
    low, high = vram.estimate(model, setup).bounds.device
    point = vram.estimate(model, setup).device_peak_bytes
    report = fit(model, setup, _gpus({"roomy": high, "tight": (point + high) // 2,
                                      "small": low - 1}))
    assert [o.gpu.id for o in report.fits] == ["roomy"]
    assert report.fits[0].verdict is Verdict.FITS and report.fits[0].fits
    assert [o.gpu.id for o in report.borderline] == ["tight"]
    tight = report.borderline[0]
    assert tight.verdict is Verdict.BORDERLINE and not tight.fits and tight.likely
    assert 0.5 < tight.fit_probability < 0.95
    assert tight.verdict_text == f"borderline, {tight.fit_probability * 100:.0f} % likely to fit"
    assert {o.gpu.id for o in report.misses} == {"tight", "small"}
    small = next(o for o in report.misses if o.gpu.id == "small")
    assert small.verdict is Verdict.DOES_NOT_FIT


def test_a_gpu_with_a_measured_context_drops_the_context_term() -> None:
    model = vram.load_model("llama-3.1-8b")
    setup = vram.TrainingSetup(method="qlora")
    est = vram.estimate(model, setup)
    measured = Gpu(id="m", name="m", vendor="t", segment="consumer", memory_bytes=10**12,
                   cuda_context_mib=1024, max_per_node=1)
    option = fit(model, setup, [measured]).fits[0]
    assert option.device_peak_bytes == est.device_peak_bytes
    assert option.device_high_bytes == est.bounds.device_high_bytes \
        - est.bounds.context_high_bytes
    assert option.device_low_bytes == est.bounds.device_low_bytes + est.bounds.context_low_bytes


def test_plan_says_borderline_and_proves_sure_fits() -> None:
    model = vram.load_model("llama-3.1-8b")
    setup = vram.TrainingSetup(method="qlora", grad_ckpt=True)
    est = vram.estimate(model, setup)
    point, (low, high) = est.device_peak_bytes, est.bounds.device
    gpus = _gpus({"tight": (point + high) // 2, "roomy": high + 2**30, "small": low - 1})
    tight = vram.plan(model, setup, hardware=vram.Hardware(gpu="tight"), gpus=gpus)
    assert tight.verdict is Verdict.BORDERLINE and not tight.fits
    assert tight.headroom_bytes >= 0 and 0.5 < tight.fit_probability < 0.95
    assert (tight.device_low_bytes, tight.device_high_bytes) == (low, high)
    # the largest batch is proved on the band's top; the path ends in a sure fit
    proof = tight.max_micro_batch
    assert proof.value_high_bytes is None or proof.value_high_bytes <= tight.usable_bytes
    assert proof.past_high_bytes is not None and proof.past_high_bytes > tight.usable_bytes
    if tight.path:
        assert tight.path_fits and tight.path[-1].device_high_bytes <= tight.usable_bytes
    roomy = vram.plan(model, setup, hardware=vram.Hardware(gpu="roomy"), gpus=gpus)
    assert roomy.fits and roomy.verdict is Verdict.FITS
    assert roomy.path_summary.startswith("fits as it is")
    small = vram.plan(model, setup, hardware=vram.Hardware(gpu="small"), gpus=gpus)
    assert small.verdict is Verdict.DOES_NOT_FIT
    # the cheapest option is a sure fit
    assert all(o.fits == (o.device_peak_bytes is not None) for o in tight.options if o.fits)
    assert tight.cheapest_run is not None and tight.cheapest_run.gpu == "roomy"


def test_the_rl_verdict_reads_the_policys_band() -> None:
    model = vram.load_model("qwen2.5-0.5b-instruct")
    setup = RLSetup(algo="grpo", policy=vram.TrainingSetup(method="lora"), num_generations=4,
                    prompt_len=256, completion_len=256, batch=2, rollout="server")
    result = rl_estimate(model, setup, 10**12)
    assert result.band_below_bytes > 0 and result.band_above_bytes > 0
    peak = result.device_peak_bytes

    def at(memory: int) -> RLEstimate:
        return result.model_copy(update={"gpu_memory_bytes": memory})

    assert at(result.device_high_bytes).verdict.verdict is Verdict.FITS
    assert at(result.device_high_bytes).fits
    between = at((peak + result.device_high_bytes) // 2)
    assert between.verdict.verdict is Verdict.BORDERLINE and not between.fits
    assert at(result.device_low_bytes - 1).verdict.verdict is Verdict.DOES_NOT_FIT
    assert between.to_json()["verdict"] == "borderline"


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _table_data() -> dict[str, object]:
    return {"rate": 0.9, "expandable_segments": {"factor": 1.0},
            "term": [{"name": name, "low": 0.1, "high": 0.2} for name in b.TERM_NAMES]}


@pytest.mark.parametrize(("change", "named"), [
    (lambda d: d["term"].append({"name": "astrology", "low": 0, "high": 0}), "astrology"),
    (lambda d: d["term"].pop(), b.TERM_NAMES[-1]),
    (lambda d: d["term"][0].update(low=-1), "model.low"),
    (lambda d: d["term"][1].update(high="wide"), "activations.high"),
    (lambda d: d.update(rate=1.5), "rate"),
])
def test_a_bad_table_names_its_entry(change, named: str) -> None:  # type: ignore[no-untyped-def]
    data = _table_data()
    change(data)
    with pytest.raises(CatalogError, match=named):
        b.table_from(data)


def test_every_term_in_the_table_says_where_its_size_came_from() -> None:
    table = b.bounds_table()
    assert len(table.sizes) == len(b.TERMS)
    assert all(size.source for size in table.sizes)
    assert table.expandable_source
