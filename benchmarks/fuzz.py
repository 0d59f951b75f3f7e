"""The fuzz suite with a long budget: many inputs per surface, failures counted, not stopped at.

Surfaces (generators and checks from `tests/fuzz/surfaces.py`, the same the CI suite uses):
  api      a mutated or random config.json dict with a random TrainingSetup (hypothesis)
  text     a model string (slugs, sizes, special files, hostile text) with a setup (hypothesis)
  fit      a random TrainingSetup on real models, estimated and fitted to every GPU (hypothesis)
  cli      a generated argument list, `vram.cli.main(argv)` in-process (hypothesis)
  process  a generated argument list, `python -m vram` as a real process
  url      URL parameters for a random page, under Streamlit's AppTest
  upload   a hostile uploaded file in the calculator, under AppTest
  file     a hostile file through both uploaders' own callbacks (config.json, and a training
           config import: YAML bombs, tags, keys that are not text, mutated real
           axolotl/torchtune/LLaMA-Factory/TRL files), without rendering the page around
           them, then estimated
  plan     `vram.plan` with a random setup, hardware and tokens (hypothesis; issue 25)
  rl       `vram.rl.estimate` with random RL fields and GPU memory (hypothesis)
  commands plan, rl, export --out, trace flags (--reserved on tiny configs), validate-speed
           tables and special files, `--from` files with odd keys, estimate and plan with the
           parallel flags, --compress and --alloc-conf, plan --max-seq: `vram.cli.main(argv)`
           in-process
  team     a team's own GPU list (other ids, hostile names, required columns only, one GPU,
           or broken) on a random page of the app, under AppTest

Each input must pass: no uncaught exception or traceback, no more than 5 s of CPU (and no
hang: a wall-clock alarm at 30 s catches code that blocks without burning CPU), buckets that are
non-negative integers summing to the device peak. Results merge into `benchmarks/fuzz.json`
(one entry per surface, so surfaces can run in separate processes) and `benchmarks/fuzz.txt`.

    python benchmarks/fuzz.py --surface api,text,fit,cli --inputs 10000
    python benchmarks/fuzz.py --surface plan,rl,commands,team --inputs 2000
    python benchmarks/fuzz.py --surface url,upload --inputs 10000 --minutes 60
    python benchmarks/fuzz.py --surface upload --seed 14 --results /tmp/fuzz-b.json   # beside it
    python benchmarks/fuzz.py --render notes.txt --combine /tmp/fuzz-b.json            # summed
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz import more_surfaces, surfaces  # noqa: E402

RESULTS = ROOT / "benchmarks" / "fuzz.json"
REPORT = ROOT / "benchmarks" / "fuzz.txt"


class Tally:
    """Inputs, outcomes, failures (first few kept), the slowest input, for one surface."""

    def __init__(self, name: str, deadline: float) -> None:
        self.name = name
        self.deadline = deadline
        self.inputs = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.failures: list[str] = []
        self.failed = 0
        self.slow = 0
        self.max_seconds = 0.0
        self.max_cpu_seconds = 0.0
        self.start = time.monotonic()

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def run(self, check: Callable[[], object], what: object) -> None:
        started, started_cpu = time.monotonic(), surfaces.cpu_seconds()
        try:
            outcome = check()
            self.outcomes[str(outcome if outcome is not None else "ok")] += 1
        except surfaces.Slow as exc:
            self.slow += 1
            self.failed += 1
            self._keep(f"SLOW {exc}")
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.failed += 1
            self._keep(f"{type(exc).__name__}: {str(exc)[:300]} <- {str(what)[:300]!r}\n"
                       + "".join(traceback.format_exception(exc)[-3:])[:800])
        self.inputs += 1
        self.max_seconds = max(self.max_seconds, time.monotonic() - started)
        self.max_cpu_seconds = max(self.max_cpu_seconds, surfaces.cpu_seconds() - started_cpu)

    def _keep(self, text: str) -> None:
        if len(self.failures) < 10:
            self.failures.append(text)

    def result(self) -> dict[str, Any]:
        wall = time.monotonic() - self.start
        return {
            "inputs": self.inputs, "failures": self.failed, "over_5_s": self.slow,
            "max_seconds": round(self.max_seconds, 2),
            "max_cpu_seconds": round(self.max_cpu_seconds, 2), "wall_seconds": round(wall, 1),
            "inputs_per_second": round(self.inputs / wall, 2) if wall else 0.0,
            "outcomes": dict(self.outcomes.most_common()), "first_failures": self.failures,
        }


def _hypothesis(tally: Tally, n: int, seed: int, strategy: st.SearchStrategy[Any],
                check: Callable[[Any], object]) -> None:
    @settings(max_examples=n, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(value=strategy)
    def body(value: Any) -> None:
        if not tally.out_of_time():
            tally.run(lambda: check(value), value)

    random.seed(seed)
    body._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    body()


def run_surface(name: str, n: int, seed: int, deadline: float) -> dict[str, Any]:
    tally = Tally(name, deadline)
    if name == "api":
        _hypothesis(tally, n, seed, st.tuples(surfaces.configs(), surfaces.setup_fields()),
                    lambda v: surfaces.check_api(v[0], v[1]))
    elif name == "text":
        _hypothesis(tally, n, seed, st.tuples(surfaces.MODEL_TEXT, surfaces.setup_fields()),
                    lambda v: surfaces.check_api(v[0], v[1]))
    elif name == "fit":
        slugs = st.sampled_from([e.slug for e in surfaces.vram.model_catalog()] + ["7B", "70B"])
        _hypothesis(tally, n, seed, st.tuples(slugs, surfaces.setup_fields()),
                    lambda v: surfaces.check_api(v[0], v[1], with_fit=True))
    elif name == "cli":
        _hypothesis(tally, n, seed, surfaces.cli_argv(), surfaces.run_cli)
    elif name == "process":
        _hypothesis(tally, n, seed, surfaces.cli_argv(), _run_process)
    elif name == "url":
        rng = random.Random(seed)
        surfaces.run_url("app.py", {}, seconds=120)  # warm: imports, untimed
        while tally.inputs < n and not tally.out_of_time():
            page, query = rng.choice(surfaces.PAGES), surfaces.url_query(rng)
            tally.run(lambda p=page, q=query: surfaces.run_url(p, q), (page, query))
    elif name == "upload":
        rng = random.Random(seed)
        surfaces.run_url("app.py", {}, seconds=120)
        while tally.inputs < n and not tally.out_of_time():
            kind, content = surfaces.upload_bytes(rng)
            tally.run(lambda c=content, k=kind: surfaces.run_upload(c, what=k), kind)
    elif name == "file":
        rng = random.Random(seed)
        while tally.inputs < n and not tally.out_of_time():
            uploader = rng.choice(["model", "import"])
            kind, content = (surfaces.upload_bytes(rng) if uploader == "model"
                             else surfaces.import_bytes(rng))
            tally.run(lambda u=uploader, c=content, k=kind: surfaces.run_file(u, c, (u, k)),
                      (uploader, kind))
    elif name == "plan":
        _hypothesis(tally, n, seed, more_surfaces.plan_inputs(), more_surfaces.check_plan)
    elif name == "rl":
        _hypothesis(tally, n, seed, more_surfaces.rl_inputs(), more_surfaces.check_rl)
    elif name == "commands":
        rng = random.Random(seed)
        while tally.inputs < n and not tally.out_of_time():
            argv = more_surfaces.command_argv(rng)
            tally.run(lambda a=argv: more_surfaces.run_command(a), argv)
    elif name == "team":
        rng = random.Random(seed)
        surfaces.run_url("app.py", {}, seconds=120)
        while tally.inputs < n and not tally.out_of_time():
            value = more_surfaces.team_input(rng)
            tally.run(lambda v=value: more_surfaces.run_team_page(*v), value)
    else:
        raise SystemExit(f"unknown surface {name!r}")
    result = tally.result()
    result.update({"seed": seed, "asked": n})
    return result


def _run_process(argv: list[str]) -> int:
    """`python -m vram` as a real process: exit 0 or 2, never a traceback, within 5 s."""
    if any("\x00" in a for a in argv):  # the OS refuses NUL in arguments before vram runs
        argv = [a.replace("\x00", "") for a in argv]
    with surfaces.within(surfaces.MAX_SECONDS + 3, argv):  # + interpreter start-up
        done = subprocess.run([sys.executable, "-m", "vram", *argv], cwd=ROOT, timeout=60,
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode in (0, 2), (argv, done.returncode, done.stderr[-400:])
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    return done.returncode


def render(results: dict[str, Any], notes: str = "") -> str:
    lines = ["# benchmarks/fuzz.py: hostile inputs per surface (counts from the last long run)",
             f"# {platform.python_version()}, {platform.machine()}, "
             f"{os.cpu_count()} CPUs (shared with other jobs while it ran)",
             *(f"# {line}" for line in notes.splitlines()), "",
             f"{'surface':<8} {'inputs':>7} {'failures':>8} {'over 5 s':>8} {'max CPU s':>9} "
             f"{'max wall s':>10} {'inputs/s':>8}  outcomes"]
    for name in ("api", "text", "fit", "cli", "process", "url", "upload", "file", "plan", "rl",
                 "commands", "team"):
        r = results.get(name)
        if r is None:
            continue
        outcomes = ", ".join(f"{k} {v}" for k, v in r["outcomes"].items())
        lines.append(f"{name:<8} {r['inputs']:>7,} {r['failures']:>8} {r['over_5_s']:>8} "
                     f"{r.get('max_cpu_seconds', float('nan')):>9.2f} {r['max_seconds']:>10.2f} "
                     f"{r['inputs_per_second']:>8.2f}  {outcomes}")
    failures = [(n, f) for n, r in results.items() for f in r.get("first_failures", [])]
    lines += ["", f"failures shown: {len(failures)}"]
    lines += [f"[{n}] {f}" for n, f in failures]
    return "\n".join(lines) + "\n"


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of one surface (different seeds, run side by side) as one row."""
    if len(runs) == 1:
        return runs[0]
    total: dict[str, Any] = {
        "inputs": sum(r["inputs"] for r in runs), "failures": sum(r["failures"] for r in runs),
        "over_5_s": sum(r["over_5_s"] for r in runs),
        "max_seconds": max(r["max_seconds"] for r in runs),
        "max_cpu_seconds": max(r.get("max_cpu_seconds", 0.0) for r in runs),
        "wall_seconds": max(r["wall_seconds"] for r in runs),
        "seed": [r["seed"] for r in runs], "asked": sum(r["asked"] for r in runs),
        "first_failures": [f for r in runs for f in r["first_failures"]][:10],
    }
    outcomes: collections.Counter[str] = collections.Counter()
    for r in runs:
        outcomes.update(r["outcomes"])
    total["outcomes"] = dict(outcomes.most_common())
    total["inputs_per_second"] = round(sum(r["inputs_per_second"] for r in runs), 2)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--surface", default="api,text,fit,cli",
                        help="comma-separated: api,text,fit,cli,process,url,upload,file,plan,rl,"
                             "commands,team")
    parser.add_argument("--inputs", type=int, default=10_000, help="per surface")
    parser.add_argument("--minutes", type=float, default=60.0, help="per surface, at most")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where this process keeps its counts (one file per process when "
                             "several run the same surface with different seeds)")
    parser.add_argument("--render", metavar="NOTES_FILE",
                        help="only rewrite fuzz.txt from the results files, notes on top")
    parser.add_argument("--combine", type=Path, nargs="*", default=[],
                        help="with --render: more results files, summed per surface")
    args = parser.parse_args()
    if args.render:
        notes = Path(args.render).read_text()
        files = [json.loads(f.read_text()) for f in (args.results, *args.combine)]
        merged = {name: combine([f[name] for f in files if name in f])
                  for name in dict.fromkeys(n for f in files for n in f)}
        RESULTS.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
        REPORT.write_text(render(merged, notes))
        return
    for name in args.surface.split(","):
        deadline = time.monotonic() + 60 * args.minutes
        result = run_surface(name, args.inputs, args.seed, deadline)
        results = json.loads(args.results.read_text()) if args.results.exists() else {}
        results[name] = result
        args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        if args.results == RESULTS:
            REPORT.write_text(render(results))
        print(f"{name}: {result['inputs']} inputs, {result['failures']} failures, "
              f"{result['inputs_per_second']}/s", flush=True)
    sys.exit(1 if any(r["failures"] for r in results.values()) else 0)


if __name__ == "__main__":
    main()
