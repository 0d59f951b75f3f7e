"""The planner (issue 10): solver proofs, levers as differences of estimates, the worked
example, the throughput model against published measurements."""

from __future__ import annotations

import statistics

import pytest

import vram
from vram.gpus import load_gpus, setup_on
from vram.plan.calibration import calibrate, check_runs, read_runs
from vram.plan.flops import (
    attention_flops_per_token_forward,
    flops_per_token,
    matmul_params_per_token,
)
from vram.plan.hardware import find_gpu
from vram.plan.levers import LEVERS, applied
from vram.plan.planner import _apply_all
from vram.plan.report import plan_json, plan_text
from vram.plan.solve import largest_fitting, smallest_fitting

GPUS = load_gpus()
RTX_4090 = find_gpu("rtx-4090", GPUS)


@pytest.fixture(scope="module")
def llama8b() -> vram.ModelSpec:
    return vram.load_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def worked(llama8b: vram.ModelSpec) -> vram.Plan:
    """The issue's new user: Llama-3.1-8B QLoRA r16, 4,096 tokens, batch 4, one 24 GB card
    (checkpointing on, as the app's default)."""
    setup = vram.TrainingSetup(method="qlora", lora_rank=16, seq_len=4096, micro_batch=4,
                               grad_ckpt=True)
    return vram.plan(llama8b, setup, hardware=vram.Hardware(gpu="rtx-4090"), tokens=1e9)


def _peak(model: vram.ModelSpec, setup: vram.TrainingSetup) -> int:
    return vram.estimate(model, setup).device_peak_bytes


def _high(model: vram.ModelSpec, setup: vram.TrainingSetup) -> int:
    """The device band's high bound: a sure fit is one where it is within the memory."""
    return vram.estimate(model, setup).bounds.device_high_bytes


def test_worked_example_does_not_fit_and_the_path_does(
        llama8b: vram.ModelSpec, worked: vram.Plan) -> None:
    usable = RTX_4090.memory_bytes
    assert not worked.fits
    assert worked.device_peak_bytes == _peak(llama8b, worked.run_setup) > usable
    assert worked.headroom_bytes == usable - worked.device_peak_bytes
    assert worked.path and worked.path_fits
    # every step is verified on the combined setup: its peak is the estimate of that setup
    final = vram.estimate(llama8b, worked.path_setup).device_peak_bytes
    assert final == worked.path[-1].device_peak_bytes <= usable
    assert _high(llama8b, worked.path_setup) == worked.path[-1].device_high_bytes <= usable
    assert sum(step.saved_bytes for step in worked.path) == worked.device_peak_bytes - final
    assert worked.path_summary.endswith(f"fits, {worked.path[-1].headroom_bytes / 1e9:.1f} GB "
                                        "headroom")
    # the path changes no more than needed: without any one of its steps it does not surely fit
    specs = {spec.name: spec for spec in LEVERS}
    for left_out in worked.path:
        rest = [specs[step.name] for step in worked.path if step is not left_out]
        trial = _apply_all(worked.run_setup, rest)
        assert trial is None or _high(llama8b, trial) > usable
    assert worked.hours is not None and worked.usd_per_run is not None
    assert worked.usd_per_run == pytest.approx(worked.hours * RTX_4090.usd_per_hour)  # type: ignore[operator]


def test_solver_answers_fit_and_one_past_does_not(
        llama8b: vram.ModelSpec, worked: vram.Plan) -> None:
    usable = RTX_4090.memory_bytes
    base = worked.run_setup
    seq = worked.max_seq_len
    assert seq.value > 0 and seq.past == seq.value + 1
    # proved on the band's high bound (a sure fit), the estimate shown beside it
    assert _high(llama8b, base.model_copy(update={"seq_len": seq.value})) <= usable
    assert _high(llama8b, base.model_copy(update={"seq_len": seq.value + 1})) > usable
    assert seq.value_peak_bytes == _peak(llama8b, base.model_copy(update={"seq_len": seq.value}))
    assert seq.value_high_bytes == _high(llama8b, base.model_copy(update={"seq_len": seq.value}))
    # the largest micro-batch surely fits and one more does not (0: not even batch 1 does).
    batch = worked.max_micro_batch
    assert batch.past == batch.value + 1
    if batch.value:
        assert _high(llama8b, base.model_copy(update={"micro_batch": batch.value})) <= usable
    assert _high(llama8b, base.model_copy(update={"micro_batch": batch.past})) > usable


def test_longest_sequence_under_context_parallel_is_one_cp_splits(
        llama8b: vram.ModelSpec) -> None:
    """Under cp = 4 the answer and the length past it are multiples of 4 (each rank holds
    s / cp tokens; `check_layout` refuses the rest), both proved on the band's top."""
    setup = vram.TrainingSetup(method="full", seq_len=8192, grad_ckpt=True, n_gpus=4, cp=4,
                               sharding="zero3", attention="flash")
    usable = find_gpu("h100-sxm", GPUS).memory_bytes
    result = vram.plan(llama8b, setup, hardware=vram.Hardware(gpu="h100-sxm", count=4))
    seq = result.max_seq_len
    assert seq.value > 8192 and seq.value % 4 == 0 and seq.past == seq.value + 4
    vram.TrainingSetup.model_validate(setup.model_dump() | {"seq_len": seq.value})
    assert _high(llama8b, setup.model_copy(update={"seq_len": seq.value})) <= usable
    assert _high(llama8b, setup.model_copy(update={"seq_len": seq.past})) > usable


def test_largest_micro_batch_on_a_card_that_holds_several(llama8b: vram.ModelSpec) -> None:
    setup = vram.TrainingSetup(method="qlora", seq_len=1024, grad_ckpt=True, loss="chunked")
    result = vram.plan(llama8b, setup, hardware=vram.Hardware(gpu="a100-80gb-sxm"))
    proof = result.max_micro_batch
    assert proof.value >= 2 and proof.past == proof.value + 1
    at = setup.model_copy(update={"micro_batch": proof.value})
    past = setup.model_copy(update={"micro_batch": proof.value + 1})
    assert _high(llama8b, at) <= proof.usable_bytes < _high(llama8b, past)


def test_fewest_gpus_is_exact_with_zero3(llama8b: vram.ModelSpec) -> None:
    model = vram.load_model("llama-3.1-70b")
    setup = vram.TrainingSetup(method="full", grad_ckpt=True, seq_len=2048)
    result = vram.plan(model, setup, tokens=1e8)
    by_gpu = {option.gpu: option for option in result.options}
    h100 = by_gpu["h100-sxm"]
    assert h100.fits and h100.count > 1
    assert _high(model, setup_on(setup, h100.count)) <= h100.usable_bytes
    assert _high(model, setup_on(setup, h100.count - 1)) > h100.usable_bytes
    # the cheapest whole run comes first
    priced = [o.usd_per_run for o in result.options if o.fits and o.usd_per_run is not None]
    assert priced == sorted(priced)
    # without my hardware, the target is the cheapest option that fits
    assert not result.hardware_given and result.fits
    assert result.hardware.gpu == result.options[0].gpu


def test_generic_solvers_on_a_curve_with_steps() -> None:
    def peak(v: int) -> int:
        return 1000 * v + (v % 7) * 300

    for usable in (0, 999, 1000, 5_300, 77_777, 10**6):
        for start in (1, 3, 50, 4000):
            proof = largest_fitting(peak, usable, start, 4096)
            if proof.value:
                assert peak(proof.value) <= usable
            if proof.past is not None:
                assert peak(proof.past) > usable and proof.past == max(proof.value, 0) + 1
    count = smallest_fitting(lambda n: 10_000 // n, 700, 64)
    assert count.value == 15 and count.past == 14  # 10000 // 15 = 666, 10000 // 14 = 714


def test_each_lever_saves_the_difference_of_two_estimates(
        llama8b: vram.ModelSpec, worked: vram.Plan) -> None:
    base = worked.run_setup
    by_name = {lever.name: lever for lever in worked.levers}
    checked = 0
    for spec in LEVERS:
        change = spec.change(base)
        changed = applied(base, change) if change is not None else None
        if changed is None or spec.name not in by_name:
            continue
        assert by_name[spec.name].saved_bytes == _peak(llama8b, base) - _peak(llama8b, changed)
        checked += 1
    assert checked >= 8
    ckpt_off = worked.run_setup.model_copy(update={"grad_ckpt": False})
    plan_off = vram.plan(llama8b, ckpt_off, hardware=vram.Hardware(gpu="rtx-4090"))
    lever = next(x for x in plan_off.levers if x.name == "activation checkpointing")
    assert lever.saved_bytes == _peak(llama8b, ckpt_off) - _peak(llama8b, worked.run_setup)
    # recompute costs one more forward: 8N / 6N-ish for QLoRA's 4N + attention
    assert 1.2 < lever.time_factor < 1.6
    assert "Chen et al. 2016" in lever.quality_note


def test_quality_notes_cite_their_sources(worked: vram.Plan) -> None:
    every = (*worked.levers, *worked.costly_levers)
    notes = {lever.name: lever.quality_note for lever in every}
    assert "Dettmers et al. 2022" in notes["8-bit AdamW"]
    assert "Zamirai et al. 2020" in notes["bf16-true instead of mixed"]
    assert all(lever.quality_note for lever in every)


def test_a_lever_that_costs_memory_is_no_saving(llama8b: vram.ModelSpec) -> None:
    """70B QLoRA: pure bf16 loses the fused attention kernel and keeps the s x s scores, so
    it holds 142 GB more; it is listed apart, as a cost, never as a saving of -142 GB (and a
    lever that saves exactly nothing is not a saving either)."""
    model = vram.load_model("llama-3.1-70b")
    plan = vram.plan(model, vram.TrainingSetup(method="qlora"),
                     hardware=vram.Hardware(gpu="h100-sxm"))
    assert all(lever.saved_bytes > 0 for lever in plan.levers)
    costly = {lever.name: lever for lever in plan.costly_levers}
    assert round(-costly["bf16-true instead of mixed"].saved_bytes / 1e9, 1) == 141.9
    payload = plan_json(plan)
    assert all(lever["saved_bytes"] > 0 for lever in payload["levers"])
    assert {lever["name"]: lever["costs_bytes"] for lever in payload["costly_levers"]}[
        "bf16-true instead of mixed"] == -costly["bf16-true instead of mixed"].saved_bytes
    text = plan_text(plan)
    assert "bf16-true instead of mixed" in text and "costs 141.9 GB" in text
    assert "-141.9" not in text
    assert plan.cheapest_run is None or plan.cheapest_run.fits


def test_flops_per_token_counts(llama8b: vram.ModelSpec) -> None:
    n = matmul_params_per_token(llama8b)
    # Llama 3.1 8B: 8.03e9 parameters less the 0.525e9 embedding lookup, head counted
    assert n == pytest.approx(7.50e9, rel=0.01)
    full = vram.TrainingSetup(method="full", seq_len=2048)
    attention = attention_flops_per_token_forward(llama8b, 2048)
    assert attention == 32 * 4 * 4096 * 2048
    assert flops_per_token(llama8b, full, 0) == 6 * n + 3 * attention
    ckpt = full.model_copy(update={"grad_ckpt": True})
    assert flops_per_token(llama8b, ckpt, 0) - flops_per_token(llama8b, full, 0) == \
        2 * n + attention
    lora = vram.TrainingSetup(method="lora", seq_len=2048)
    assert flops_per_token(llama8b, lora, 42_000_000) == 4 * n + 6 * 42_000_000 + 3 * attention


def test_time_model_error_on_published_throughputs() -> None:
    runs = read_runs()
    assert len(runs) >= 20 and all("@" in run.source for run in runs)
    checks = check_runs(runs)
    errors = [abs(c.error_pct) for c in checks]
    held_out = [abs(c.loo_error_pct) for c in checks]
    assert statistics.median(errors) <= 25.0
    assert statistics.median(held_out) <= 25.0
    table = calibrate(runs)
    assert 0.2 < table.overall < 0.8


def test_options_cost_is_hours_times_price(llama8b: vram.ModelSpec) -> None:
    setup = vram.TrainingSetup(method="qlora", seq_len=2048, grad_ckpt=True)
    result = vram.plan(llama8b, setup, tokens=2e9)
    for option in result.options:
        if option.hours is not None and option.usd_per_hour is not None:
            assert option.usd_per_run == pytest.approx(option.hours * option.usd_per_hour)
            assert option.usd_per_million_tokens == pytest.approx(
                option.usd_per_run / 2e9 * 1e6)  # type: ignore[operator]
            assert option.hours == pytest.approx(2e9 / option.tokens_per_second / 3600)  # type: ignore[operator]


def test_unknown_gpu_names_the_field(llama8b: vram.ModelSpec) -> None:
    with pytest.raises(vram.VramError, match="gpu: unknown GPU 'rtx-9999'; allowed: t4"):
        vram.plan(llama8b, vram.TrainingSetup(), hardware=vram.Hardware(gpu="rtx-9999"))


@pytest.mark.parametrize("tokens", [0, -1, -1e9, float("nan"), float("inf"), 1e17, True, "1e9"])
def test_tokens_are_checked_by_name(llama8b: vram.ModelSpec, tokens: object) -> None:
    with pytest.raises(vram.VramError, match=r"^tokens: "):
        vram.plan(llama8b, vram.TrainingSetup(method="qlora"), tokens=tokens)  # type: ignore[arg-type]


def test_a_team_list_with_other_ids_is_timed_by_kind(llama8b: vram.ModelSpec) -> None:
    """The measured rows name shipped ids; a team's H100 under another id gets the same
    kind's MFU, from its own figures, and the plan says so."""
    shipped = {g.id: g for g in load_gpus()}
    ours = shipped["h100-sxm"].model_copy(update={"id": "our-h100", "usd_per_hour": 1.0})
    setup = vram.TrainingSetup(method="qlora", seq_len=2048)
    hw = vram.Hardware(gpu="our-h100", count=1)
    mine = vram.plan(llama8b, setup, hardware=hw, tokens=1e9, gpus=[ours])
    theirs = vram.plan(llama8b, setup, hardware=vram.Hardware(gpu="h100-sxm", count=1),
                       tokens=1e9)
    assert mine.hours == pytest.approx(theirs.hours)
    assert "our-h100" in mine.speed_basis and "not among the measured GPUs" in mine.speed_basis
    assert "h100-sxm" in theirs.speed_basis and "a measured GPU" in theirs.speed_basis
    bare = ours.model_copy(update={"bf16_dense_tflops": None})
    nothing = vram.plan(llama8b, setup, hardware=hw, tokens=1e9, gpus=[bare])
    assert nothing.hours is None and "no bf16_dense_tflops" in nothing.speed_basis
