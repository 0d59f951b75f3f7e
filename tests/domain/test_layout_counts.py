"""GPU counts under a parallel layout (issue 25, found by fuzzing main's parallel knobs): the fit,
the planner and the what-if's limits price only counts the layout runs on, and say so when a
model cannot take it, instead of estimating an impossible setup or raising a pydantic error."""

from __future__ import annotations

import pytest

import vram
from vram.errors import InputError
from vram.gpus import fit, load_gpus
from vram.plan.compressed import compressed_limits
from vram.plan.hardware import Hardware
from vram.plan.planner import plan
from vram.setup import TrainingSetup
from vram.setup.layout import check_layout, gpu_step

MODEL = vram.load_model("llama-3.1-8b")
LAYOUTS = [
    dict(n_gpus=8, sharding="zero3", tp=4, framework="torchtitan", method="full"),
    dict(n_gpus=8, sharding="zero3", pp=4, framework="torchtitan", method="full"),
    dict(n_gpus=8, sharding="zero1", tp=2, cp=2, framework="torchtitan", method="full"),
]


def _setup(fields: dict[str, object]) -> TrainingSetup:
    return TrainingSetup.model_validate(fields)


def test_gpu_step_is_the_fewest_gpus_a_layout_runs_on() -> None:
    assert gpu_step(_setup(LAYOUTS[0])) == 4 and gpu_step(_setup(LAYOUTS[2])) == 4
    assert gpu_step(TrainingSetup()) == 1
    moe = _setup(dict(n_gpus=12, sharding="zero3", tp=2, cp=2, ep=3, framework="torchtitan",
                      method="full"))
    assert gpu_step(moe) == 12  # 2 x 1 x lcm(2, 3)


@pytest.mark.parametrize("fields", LAYOUTS)
def test_the_fit_tries_only_counts_the_layout_runs_on(fields: dict[str, object]) -> None:
    setup = _setup(fields)
    report = fit(MODEL, setup, load_gpus())
    assert report.fits
    for option in (*report.fits, *report.misses):
        assert option.count % gpu_step(setup) == 0, (option.gpu.id, option.count)
        check_layout(setup.model_copy(update={"n_gpus": option.count}))


@pytest.mark.parametrize("fields", LAYOUTS)
def test_a_plan_without_hardware_runs_the_layout(fields: dict[str, object]) -> None:
    """It used to pick 1 GPU (tp=4 on one card) and fail with pydantic's 'tp x pp x cp = 4
    must divide gpus (1)' from inside the planner."""
    setup = _setup(fields)
    found = plan(MODEL, setup, tokens=1e9)
    check_layout(found.run_setup)
    assert found.hardware.total % gpu_step(setup) == 0
    for option in found.options:
        assert option.count % gpu_step(setup) == 0


def test_hardware_the_layout_cannot_run_on_is_named() -> None:
    with pytest.raises(InputError, match=r"^hardware: 6 GPUs: the parallel layout runs on "
                                         r"multiples of 4"):
        plan(MODEL, _setup(LAYOUTS[0]), hardware=Hardware(gpu="h100-sxm", count=6))


def test_the_largest_model_is_not_searched_where_tp_cannot_split_its_shapes() -> None:
    """Llama shapes on the way (22 heads near 1.2B) have head counts tp=4 does not divide: the
    batch and sequence limits stand, the model size says it was not searched (it raised
    VramError)."""
    setup = _setup(dict(n_gpus=16, sharding="zero1", tp=4, framework="torchtitan",
                        method="full"))
    gpu = next(g for g in load_gpus() if g.id == "h100-sxm")
    limits = compressed_limits(vram.load_model("llama-3.2-1b"), setup, {"optimizer": 4}, gpu)
    assert limits.micro_batch.value >= 1 and limits.seq_len.value >= setup.seq_len
    assert limits.model_steps is None and limits.model_params is None
