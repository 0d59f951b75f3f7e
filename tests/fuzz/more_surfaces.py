"""Issue 25's surfaces for the fuzz suite: the planner and RL APIs, the commands added since the
first suite (plan, rl, export, trace, validate-speed, `--from` files with odd keys), and a
team's own GPU list (`VRAM_GPUS_CSV`) on every page.

Shared by `tests/fuzz/test_fuzz_more.py` (a fixed seed, a short budget, in CI) and
`benchmarks/fuzz.py` (surfaces `plan`, `rl`, `commands`, `team`; counts in fuzz.txt). The
contract is the suite's (`surfaces.py`): no uncaught exception or traceback, no input over 5 s
of CPU and no hang, one line and exit status 2 for bad input, and nothing an operator or a
person typed rendered as a link, image or HTML.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from pydantic import ValidationError

import vram
import vram.rl as rl
from tests.fuzz.surfaces import (
    HOSTILE_TEXT,
    MAX_SECONDS,
    ROOT,
    SPECIAL,
    SPECIAL_PATHS,
    setup_fields,
    url_query,
    within,
)
from vram.cli import main as cli_main
from vram.paths import data_dir

#: Every page of the app (the first suite's PAGES predate the RL and accuracy pages).
ALL_PAGES = ("app.py", *sorted(f"pages/{p.name}" for p in (ROOT / "pages").glob("*.py")))

# --------------------------------------------------------------------------------------------
# The planner and RL APIs
# --------------------------------------------------------------------------------------------

_NUMBERS = st.sampled_from([0, -1, 1, 0.5, 1e9, 1e16, 1e17, float("nan"), float("inf"),
                            -float("inf"), True, "1e9", None, 10**30, 2**50, 80 * 2**30])
_SMALL_MODELS = ["llama-3.2-1b", "qwen2.5-0.5b-instruct", "gpt2", "70B", "mixtral-8x7b-v0.1",
                 "t0_3b", "phi-2"]


#: A setup a person would ask for (most inputs), beside `setup_fields`' hostile ones.
PERSON_SETUP = st.fixed_dictionaries({
    "method": st.sampled_from(["full", "lora", "qlora"]),
    "optimizer": st.sampled_from(["adamw", "adamw-8bit", "sgd", "adafactor", "lion"]),
    "precision": st.sampled_from(["bf16-mixed", "bf16-true", "fp32"]),
    "micro_batch": st.sampled_from([1, 2, 8, 64]),
    "seq_len": st.sampled_from([512, 2048, 8192, 131072]),
    "grad_ckpt": st.booleans(),
})


@st.composite
def plan_inputs(draw: st.DrawFn) -> tuple[str, dict[str, Any], dict[str, Any] | None, Any]:
    """(model, setup fields, hardware fields or None, tokens)."""
    hardware = None
    if draw(st.booleans()):
        gpus = [g.id for g in vram.load_gpus()]
        hostile = draw(st.integers(0, 4)) == 0
        hardware = {"gpu": draw(st.sampled_from(["nope", "", "H100-SXM"] if hostile else gpus)),
                    "count": draw(st.sampled_from([0, 65, True] if hostile else [1, 2, 8, 64])),
                    "nodes": draw(st.sampled_from([0, 65] if hostile else [1, 1, 2]))}
    fields = draw(PERSON_SETUP if draw(st.integers(0, 3)) else setup_fields())
    tokens = draw(st.floats(1e3, 1e12) if draw(st.integers(0, 2)) else _NUMBERS)
    return draw(st.sampled_from(_SMALL_MODELS)), fields, hardware, tokens


def check_plan(value: tuple[str, dict[str, Any], dict[str, Any] | None, Any]) -> str:
    """`vram.plan`: a plan whose figures are finite and non-negative, or an error naming why."""
    model_name, fields, hardware_fields, tokens = value
    with within(what=value):
        try:
            setup = vram.TrainingSetup.model_validate(fields)
            hardware = (vram.Hardware.model_validate(hardware_fields)
                        if hardware_fields is not None else None)
        except ValidationError:
            return "setup refused"
        try:
            result = vram.plan(vram.load_model(model_name), setup, hardware=hardware,
                               tokens=tokens)
        except vram.VramError as exc:
            assert "\n" not in str(exc), str(exc)[:300]
            return "refused"
    for figure in (result.hours, result.usd_per_run, result.usd_per_million_tokens,
                   result.tokens_per_second):
        assert figure is None or (math.isfinite(figure) and figure >= 0), (figure, value)
    assert result.max_micro_batch.value >= 0 and result.max_seq_len.value >= 0
    for option in result.options:
        assert option.hours is None or (math.isfinite(option.hours) and option.hours > 0)
    return "planned"


@st.composite
def rl_inputs(draw: st.DrawFn) -> tuple[str, dict[str, Any], Any]:
    """(model, RLSetup fields, gpu_memory_bytes): valid, odd and hostile values."""
    fields: dict[str, Any] = {}
    choices: dict[str, list[Any]] = {
        "algo": [a.value for a in rl.Algo] + ["nope"],
        "num_generations": [1, 8, 64, 1024, 1025, 0, -1, True],
        "prompt_len": [1, 512, 131072, 2**20, 2**20 + 1, 0],
        "completion_len": [1, 1024, 2**20, 0],
        "batch": [1, 8, 512, 513, 2048, 4096, 4097, 0],
        "beta": [0.0, 0.04, 100.0, -1.0, float("nan"), float("inf")],
        "rollout": [r.value for r in rl.Rollout], "engine": [e.value for e in rl.Engine],
        "reference": [r.value for r in rl.Reference],
        "gpu_memory_utilization": [0.05, 0.3, 1.0, 0.0, 1.5, float("nan")],
        "sleep": [0, 1, 2, 3], "rollout_gpus": [1, 8, 0], "reward_model": [False, True],
    }
    hostile = draw(st.integers(0, 3)) == 0
    for name, values in choices.items():
        if draw(st.integers(0, 2)) == 0:
            fields[name] = draw(st.sampled_from(values if hostile else values[:2]))
    if draw(st.booleans()):
        fields["policy"] = draw(setup_fields() if hostile else PERSON_SETUP)
    memory = draw(_NUMBERS if hostile else st.sampled_from([24 * 2**30, 80 * 2**30]))
    return draw(st.sampled_from(_SMALL_MODELS)), fields, memory


def check_rl(value: tuple[str, dict[str, Any], Any]) -> str:
    """`vram.rl.estimate`: phases whose bytes are non-negative ints, or an error naming why."""
    model_name, fields, memory = value
    with within(what=value):
        try:
            setup = rl.RLSetup.model_validate(fields)
        except ValidationError:
            return "setup refused"
        try:
            result = rl.estimate(vram.load_model(model_name), setup, memory)
        except vram.VramError as exc:
            assert "\n" not in str(exc), str(exc)[:300]
            return "refused"
    for phase in (result.generation, result.training):
        assert all(isinstance(b, int) and b >= 0 for b in phase.buckets.values()), phase
        assert phase.device_peak_bytes == sum(phase.buckets.values())
    assert result.device_peak_bytes == max(result.generation.device_peak_bytes,
                                           result.training.device_peak_bytes)
    return "estimated"


# --------------------------------------------------------------------------------------------
# The commands added since the first suite
# --------------------------------------------------------------------------------------------

_FILES = Path(tempfile.mkdtemp(prefix="vram-fuzz-25-"))
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 128}
TINY_MOE = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128}


def _file(name: str, content: str | bytes) -> str:
    path = _FILES / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


TINY_PATH = _file("tiny.json", json.dumps(TINY))
TINY_MOE_PATH = _file("tiny-moe.json", json.dumps(TINY_MOE))
_THROUGHPUT = list(csv.DictReader((data_dir() / "throughput.csv").open(encoding="utf-8")))


def throughput_table(rng: random.Random) -> str:
    """A throughput table a person might point `validate-speed` at: real rows, some mutated."""
    rows = [dict(r) for r in rng.sample(_THROUGHPUT, rng.randint(0, 3))]
    for row in rows:
        if rng.random() < 0.3:
            key = rng.choice(sorted(row))
            row[key] = rng.choice(["0", "-1", "inf", "nan", "1e400", "", "x" * 200_000,
                                   "9" * 5000, "our-gpu", "/dev/zero", "sometimes",
                                   rng.choice(HOSTILE_TEXT[:20]).replace("\x00", "")])
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(_THROUGHPUT[0]))
    if rng.random() < 0.9:
        writer.writeheader()
    writer.writerows(rows)
    return _file(f"throughput-{rng.randrange(10**9)}.csv", out.getvalue())


def odd_yaml(rng: random.Random) -> str:
    """A training config with keys YAML allows and no reader can name: null, numbers,
    booleans, nested ones; or a real-looking config around them."""
    key = rng.choice(["~", "null", "1", "2.5", "true", "no", "[a, b]", "? [a]", "''", "\"\""])
    where = rng.choice(["top", "nested", "list"])
    body = "base_model: llama-3.1-8b\nsequence_len: 1024\n"
    if where == "top":
        body += f"{key}: 1\n"
    elif where == "nested":
        body += f"deepspeed:\n  zero_optimization:\n    {key}: 3\n"
    else:
        body += f"datasets:\n  - path: x\n    {key}: y\n"
    return _file(f"odd-{rng.randrange(10**9)}.yml", body)


_MODELS_FOR_COMMANDS = ["llama-3.2-1b"] * 6 + ["70B", "mixtral-8x7b-v0.1", "qwen2.5-7b-instruct",
                                                *SPECIAL_PATHS[:3], SPECIAL["fifo"], "nope"]


_ALLOC_CONFS = ["expandable_segments:True", "max_split_size_mb:128",
                "garbage_collection_threshold:0.6,max_split_size_mb:256", "x:y",
                "max_split_size_mb:-1", "garbage_collection_threshold:2",
                "roundup_power2_divisions:[256:1,>:4]", "roundup_power2_divisions:[x]"]
#: Main's parallel flags (issue 23) and what each takes, hostile values among them.
_PARALLEL = {"--tp": ["1", "2", "4", "8", "3"], "--pp": ["1", "2", "4", "8"],
             "--cp": ["1", "2", "4", "8"], "--ep": ["1", "2", "4", "8"],
             "--pp-virtual": ["1", "2", "4"], "--pp-schedule": ["gpipe", "1f1b", "interleaved"],
             "--cp-kind": ["ring", "ulysses"], "--fp8": ["tensorwise", "rowwise", "blockwise",
                                                          "te", "none"],
             "--framework": ["torchtitan", "deepspeed", "hf-trainer", "litgpt", "axolotl"],
             "--alloc-conf": _ALLOC_CONFS, "--context-mib": ["0", "500", "4096"],
             "--seq": ["2048", "32768", "131072"]}


def _parallel_argv(rng: random.Random, command: str, model: str,
                   value: Callable[[list[str]], str]) -> list[str]:
    """estimate or plan with main's parallel layout, float8, allocator settings and
    `--compress`; or `plan --max-seq` on a GPU (the longest context, each lever)."""
    if command == "max-seq":
        argv = ["plan", "--model", model, "--max-seq",
                "--gpu", rng.choice(["h100-sxm", "rtx-4090", "a100-80gb-sxm", "nope"]),
                "--gpu-count", value(["1", "2", "8"])]
    else:
        argv = [rng.choice(["estimate", "estimate", "plan"]), "--model", model]
    gpus = value(["8", "16", "64", "2"])
    argv += ["--gpus", gpus, "--sharding", rng.choice(["ddp", "zero1", "zero3"])]
    for flag in rng.sample(sorted(_PARALLEL), rng.randint(1, 5)):
        argv += [flag, value(_PARALLEL[flag])]
    if rng.random() < 0.3:
        argv += ["--sequence-parallel"]
    if argv[0] == "estimate" and rng.random() < 0.4:
        for _ in range(rng.randint(1, 2)):
            argv += ["--compress", value(["optimizer=4", "weights=2", "activations=8",
                                          "gradients=1024", "weights=1025", "x=2", "=4"])]
    return argv + (["--json"] if rng.random() < 0.5 else [])


def command_argv(rng: random.Random) -> list[str]:
    """An argument list for plan, rl, export, trace, validate-speed, a `--from` file, main's
    parallel flags (estimate, plan) or `plan --max-seq`."""
    command = rng.choice(["plan", "plan", "rl", "rl", "export", "trace", "validate-speed",
                          "from", "parallel", "parallel", "max-seq"])
    model = rng.choice(_MODELS_FOR_COMMANDS)

    def value(values: list[str]) -> str:  # mostly a value a person would give
        if rng.random() < 0.2:
            return rng.choice(["0", "-1", "1e400", "nan", "inf", "9" * 40, "", "x"])
        return rng.choice(values)

    if command in ("parallel", "max-seq"):
        return _parallel_argv(rng, command, model, value)
    if command == "plan":
        argv = ["plan", "--model", model, "--method", rng.choice(["full", "lora", "qlora"])]
        for flag, values in (("--gpu", ["h100-sxm", "rtx-4090", "a100-80gb-sxm"]),
                             ("--gpu-count", ["1", "8", "64"]),
                             ("--tokens", ["1e9", "1e12", "1e16"]),
                             ("--seq", ["2048", "131072"])):
            if rng.random() < 0.3:
                argv += [flag, value(values)]
        return argv + (["--json"] if rng.random() < 0.3 else [])
    if command == "rl":
        argv = ["rl", "--model", model]
        for flag, values in (("--algo", ["grpo", "dpo", "ppo", "rloo"]),
                             ("--batch", ["1", "8", "512", "513", "4096"]),
                             ("--num-generations", ["8", "64", "1024"]),
                             ("--prompt-len", ["512", "4096"]), ("--beta", ["0", "0.04"]),
                             ("--gpu-memory-utilization", ["0.3", "0.9"]),
                             ("--rollout", ["colocate", "server", "shared"]),
                             ("--sleep", ["1", "2"]), ("--gpu", ["h100-sxm", "rtx-4090"])):
            if rng.random() < 0.25:
                argv += [flag, value(values)]
        return argv + (["--json"] if rng.random() < 0.3 else [])
    if command == "export":
        out = rng.choice([SPECIAL["fifo"], "/dev/null", SPECIAL["folder"],
                          str(_FILES / "out.yml"), str(_FILES / "missing" / "x.yml")])
        return ["export", "--to", rng.choice(["trl", "axolotl", "nope"]), "--model", model,
                "--out", out]
    if command == "trace":
        argv = ["trace", "--model", rng.choice([TINY_PATH, TINY_MOE_PATH, TINY_PATH, model]),
                "--method", rng.choice(["full", "lora"])]
        if rng.random() < 0.6:
            argv += ["--layers", value(["1", "2", "2", "3", "0", "-1", "100000"])]
        if rng.random() < 0.4:
            argv += ["--optimizer", rng.choice(["adamw", "galore-adamw8bit-per-layer",
                                                "adamw-4bit", "sgd"])]
        if rng.random() < 0.3:
            argv += ["--lora-dropout", rng.choice(["0", "0.05"])]
        if rng.random() < 0.2:  # the allocator replay: tiny configs only (full depth)
            argv[2] = rng.choice([TINY_PATH, TINY_MOE_PATH])
            argv += ["--reserved", "--alloc-conf", value(_ALLOC_CONFS)]
        return argv
    if command == "validate-speed":
        path = rng.choice([*SPECIAL_PATHS[:4], SPECIAL["fifo"], SPECIAL["folder"],
                           throughput_table(rng), throughput_table(rng)])
        return ["validate-speed", path] if path else ["validate-speed"]
    return [rng.choice(["estimate", "plan", "rl", "export"]), "--from", odd_yaml(rng)]


def run_command(argv: list[str]) -> int:
    """`main(argv)` in-process: exit 0, or 2 with one line; never a traceback or a hang."""
    if argv[0] == "export" and "--to" not in argv:
        argv = [*argv, "--to", "trl"]
    out, err = io.StringIO(), io.StringIO()
    limit = MAX_SECONDS * (3 if argv[0] == "trace" else 1)  # a trace builds the model first
    with within(limit, what=argv), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    text = err.getvalue()
    assert code in (0, 2), (argv, code, text[-500:])
    assert "Traceback" not in text, text[-500:]
    if code == 2:
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines and (len(lines) == 1 or lines[0].startswith("usage:")), (argv, text[-500:])
    if code == 0 and "--json" in argv:

        def refuse(name: str) -> None:
            raise AssertionError(f"{argv}: JSON with {name}")

        assert isinstance(json.loads(out.getvalue(), parse_constant=refuse), dict | list)
    return code


# --------------------------------------------------------------------------------------------
# A team's own GPU list on every page
# --------------------------------------------------------------------------------------------

_SHIPPED = list(csv.DictReader((data_dir() / "gpus.csv").open(encoding="utf-8")))
_NAMES = ["Lab [GPU](https://evil.example/x)", "![t](http://127.0.0.1:9/t.png)", "<b>x</b>",
          "**Box** `A100` $x$ :red[a]", "[H100](javascript:alert(1))", "Ours: H100 80GB"]


def team_list(rng: random.Random) -> tuple[str, str]:
    """(kind, path) of a team's GPU list: other ids, hostile names, the required columns
    only, one GPU; or a broken one (inf, nan, a missing column) that every page must name."""
    kind = rng.choice(["renamed", "renamed", "minimal", "one", "consumer", "broken"])
    rows = [dict(r) for r in rng.sample(_SHIPPED, rng.randint(1, 6))]
    for n, row in enumerate(rows):
        row["id"] = f"team-{n}-{rng.randrange(1000)}"
        row["name"] = rng.choice(_NAMES) + f" {n}"
    if kind == "minimal":
        rows = [{k: r[k] for k in ("id", "name", "segment", "memory_bytes")} for r in rows]
    elif kind == "one":
        rows = rows[:1]
    elif kind == "consumer":
        for row in rows:
            row["segment"] = "consumer"
    elif kind == "broken":
        row = rng.choice(rows)
        column = rng.choice(["bf16_dense_tflops", "usd_per_hour", "memory_bytes"])
        row[column] = rng.choice(["inf", "nan", "1e99999", "-1", "x"])
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return kind, _file(f"gpus-{kind}-{rng.randrange(10**9)}.csv", out.getvalue())


_TARGETS = ("evil.example", "127.0.0.1:9", "javascript:")
_RAW = ("**Box**", "`A100`", "$x$", ":red[a]", "<b>x</b>", "[H100](javascript")


def operator_markup(body: str) -> list[str]:
    """What of a GPU list's names a body would render as markup (the app's own links and
    HTML, such as the bucket legend's coloured squares, are allowed; see
    tests/app/test_team_gpus.py): a name's raw markup left as it is, or a link, image or HTML
    that carries a name's target."""
    from markdown_it import MarkdownIt

    found = [raw for raw in _RAW if raw in body]
    for token in MarkdownIt("commonmark").enable("table").parse(body):
        for child in [token, *(token.children or [])]:
            target = str(child.attrs.get("href") or child.attrs.get("src") or "")
            if child.type in {"html_inline", "html_block"}:
                target = child.content
            if any(t in target for t in _TARGETS):
                found.append(f"{child.type} {target}")
    return found


def run_team_page(kind: str, path: str, page: str, query: dict[str, Any]) -> str:
    """One page with a team's GPU list: no exception, no name rendered as markup; a broken
    list is named on the page."""
    from streamlit.testing.v1 import AppTest

    previous = os.environ.get("VRAM_GPUS_CSV")
    os.environ["VRAM_GPUS_CSV"] = path
    try:
        app = AppTest.from_file(str(ROOT / page), default_timeout=30)
        for key, value in query.items():
            app.query_params[key] = value
        with within(MAX_SECONDS, what=(kind, page, query)):
            app.run()
    finally:
        if previous is None:
            os.environ.pop("VRAM_GPUS_CSV", None)
        else:
            os.environ["VRAM_GPUS_CSV"] = previous
    assert not app.exception, (kind, page, [e.value for e in app.exception][:1])
    bodies = [str(e.value) for kind_ in ("markdown", "caption", "error", "warning", "info")
              for e in app.get(kind_)]
    for metric in app.metric:
        bodies += [str(metric.label), str(metric.value), str(metric.proto.delta),
                   str(metric.proto.help)]
    for body in bodies:
        assert operator_markup(body) == [], (kind, page, body[:300])
    if kind == "broken":
        assert any("GPU list" in str(e.value) for e in app.error), (page, path)
        return "named"
    return "shown"


def team_input(rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
    kind, path = team_list(rng)
    page = rng.choice(ALL_PAGES)
    query: dict[str, Any] = url_query(rng) if rng.random() < 0.3 else {}
    if page == "app.py" and rng.random() < 0.5:
        query["plan"] = "1"
    if page in ("app.py", "pages/1_Learn.py") and rng.random() < 0.3:  # main's what-if, lessons
        query.update({"whatif": "1", "compress": rng.choice(["optimizer=4", "weights=2"]),
                      "present": rng.choice(["1", "0"])})
        if rng.random() < 0.5:
            query["wgpu"] = rng.choice(["h100-sxm", "team-0-1", "nope"])
    if page == "pages/4_RL.py" and rng.random() < 0.3:
        query["rl_gpu"] = rng.choice(["h100-sxm", "team-0-1", "nope"])
    return kind, path, page, query
