"""Fuzz issue 25's surfaces (a fixed seed, a short budget): the planner and RL APIs, the plan,
rl, export, trace and validate-speed commands and `--from` files with odd keys, and a team's own
GPU list on every page. The long run is `benchmarks/fuzz.py --surface plan,rl,commands,team`."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from tests.fuzz.conftest import APP_RUNS, SEED
from tests.fuzz.more_surfaces import (
    ALL_PAGES,
    check_plan,
    check_rl,
    command_argv,
    plan_inputs,
    rl_inputs,
    run_command,
    run_team_page,
    team_input,
    team_list,
)

FUZZ = settings.get_profile("fuzz")


@settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 6))  # a plan is dozens of estimates
@given(value=plan_inputs())
def test_plan_api(value: tuple) -> None:
    check_plan(value)


@FUZZ
@given(value=rl_inputs())
def test_rl_api(value: tuple) -> None:
    check_rl(value)


@pytest.mark.parametrize("n", range(40))
def test_commands(n: int) -> None:
    run_command(command_argv(random.Random(f"{SEED}-commands-{n}")))


@pytest.mark.parametrize("page", ALL_PAGES)
@pytest.mark.parametrize("n", range(APP_RUNS))
def test_team_gpu_list_on_every_page(page: str, n: int, warm_app: None) -> None:
    rng = random.Random(f"{SEED}-team-{page}-{n}")
    kind, path = team_list(rng)
    run_team_page(kind, path, page, {"plan": "1"} if page == "app.py" else {})


@pytest.mark.parametrize("n", range(3 * APP_RUNS))
def test_team_gpu_lists_with_links(n: int, warm_app: None) -> None:
    run_team_page(*team_input(random.Random(f"{SEED}-team-link-{n}")))
