"""A team's own GPU list (`VRAM_GPUS_CSV`) on every page and command (issue 25).

Each list is valid but unlike the shipped one: other ids for the same cards, consumer cards
only, the required columns only, one card. With each: `plan` prints a plan (its speed says
which figures it rests on), "Make it fit" computes one, the RL page starts on a GPU of the
list without blaming a parameter nobody gave, and every page shows the operator's GPU names
as text (no link, image or HTML rendered from them).
"""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import PAGES, ROOT
from tests.fuzz.more_surfaces import operator_markup
from ui.text import shown
from vram.cli import main as cli_main
from vram.paths import data_dir

HOSTILE_NAME = "Lab [{n}](https://evil.example/x) ![t](http://127.0.0.1:9/t.png) <b>x</b>"


def _shipped() -> list[dict[str, str]]:
    with (data_dir() / "gpus.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _lists(tmp: Path) -> dict[str, Path]:
    shipped = _shipped()
    renamed = [{**row, "id": "our-" + row["id"], "name": "Ours: " + row["name"]}
               for row in shipped]
    consumer = [{**row, "id": f"lab-{n}", "name": HOSTILE_NAME.format(n=n)}
                for n, row in enumerate(r for r in shipped if r["segment"] == "consumer")]
    minimal = [{"id": "box", "name": "**Box** `A100` $x$ :red[a]", "segment": "datacenter",
                "memory_bytes": "85899345920"}]
    one = [{**next(r for r in shipped if r["id"] == "h100-sxm"), "id": "h100",
            "name": "[H100](javascript:alert(1))"}]
    return {name: _write(tmp / f"{name}.csv", rows) for name, rows in
            (("renamed", renamed), ("consumer", consumer), ("minimal", minimal),
             ("one", one))}


@pytest.fixture(params=["renamed", "consumer", "minimal", "one"])
def team_list(request: pytest.FixtureRequest, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[dict[str, str]]]:
    path = _lists(tmp_path)[request.param]
    monkeypatch.setenv("VRAM_GPUS_CSV", str(path))
    with path.open(newline="", encoding="utf-8") as handle:
        return request.param, list(csv.DictReader(handle))


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_plan_runs_on_a_team_list_and_says_what_its_speed_rests_on(
        team_list: tuple[str, list[dict[str, str]]]) -> None:
    _, rows = team_list
    gpu = rows[0]["id"]
    code, out, err = _cli("plan", "--model", "llama-3.2-1b", "--method", "lora",
                          "--gpu", gpu, "--tokens", "1e8")
    assert code == 0, err
    speed = next(line for line in out.splitlines() if line.startswith("speed: "))
    assert speed.startswith(f"speed: {gpu}: ")
    if rows[0].get("bf16_dense_tflops"):
        assert "not among the measured GPUs: timed by its kind" in speed
        assert "MFU 0." in speed
    else:
        assert "no bf16_dense_tflops" in speed
    code, out, err = _cli("plan", "--model", "llama-3.2-1b", "--method", "lora", "--json")
    assert code == 0, err
    assert '"speed_basis"' in out


def test_validate_speed_reads_the_shipped_catalog_whatever_the_team_list(
        team_list: tuple[str, list[dict[str, str]]]) -> None:
    code, out, err = _cli("validate-speed")
    assert code == 0, err
    assert out.splitlines()[-1].startswith("rows=")


def _texts(app: AppTest) -> list[str]:
    """Every body Streamlit renders as Markdown."""
    bodies: list[str] = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "title",
                 "header", "subheader"):
        bodies += [str(e.value) for e in app.get(kind)]
    for metric in app.metric:
        bodies += [str(metric.label), str(metric.value), str(metric.proto.delta),
                   str(metric.proto.help)]
    return bodies


def _check(app: AppTest, what: object) -> None:
    assert not app.exception, (what, [e.value for e in app.exception][:1])
    for body in _texts(app):
        assert operator_markup(body) == [], (what, body[:300])


def test_make_it_fit_computes_a_plan_on_a_team_list(
        team_list: tuple[str, list[dict[str, str]]]) -> None:
    name, rows = team_list
    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    app.query_params.update({"plan": "1", "model": "llama-3.2-1b", "method": "lora"})
    app.run()
    _check(app, name)
    assert not app.error, [e.value for e in app.error]
    speed = [shown(c.value) for c in app.caption if shown(c.value).startswith("Speed: ")]
    assert len(speed) == 1 and any(r["id"] in speed[0] for r in rows)
    # the same with the team's first GPU chosen
    app.query_params["mygpu"] = rows[0]["id"]
    app.run()
    _check(app, name)
    assert not app.error, [e.value for e in app.error]


def test_rl_page_starts_on_a_gpu_of_the_team_list_and_blames_no_parameter(
        team_list: tuple[str, list[dict[str, str]]]) -> None:
    name, rows = team_list
    ids = [r["id"] for r in rows]
    app = AppTest.from_file(str(ROOT / "pages" / "4_RL.py"), default_timeout=60)
    app.run()
    _check(app, name)
    assert not app.error, [e.value for e in app.error]
    assert app.selectbox(key="rl_gpu").value == ("h100-sxm" if "h100-sxm" in ids else ids[0])
    summary = " ".join(shown(m.value) for m in app.markdown)
    shown_name = " ".join(rows[0]["name"].split())
    if app.selectbox(key="rl_gpu").value == ids[0]:
        assert shown_name in summary  # the name as typed, as text
    # a GPU the link names that the list lacks is named, and the page still renders
    app = AppTest.from_file(str(ROOT / "pages" / "4_RL.py"), default_timeout=60)
    app.query_params["rl_gpu"] = "not-in-the-list"
    app.run()
    _check(app, name)
    assert any("rl_gpu" in shown(e.value) for e in app.error)


@pytest.mark.parametrize("page", ["app.py", *PAGES])
def test_every_page_shows_a_team_lists_names_as_text(
        page: str, team_list: tuple[str, list[dict[str, str]]]) -> None:
    name, _ = team_list
    app = AppTest.from_file(str(ROOT / page), default_timeout=60)
    # a small run: every GPU of every list holds it, so the cheapest is one of the team's
    query: dict[str, Any] = {"model": "llama-3.2-1b", "method": "lora"}
    if page == "app.py":
        query["plan"] = "1"
    app.query_params.update(query)
    app.run()
    _check(app, (page, name))
