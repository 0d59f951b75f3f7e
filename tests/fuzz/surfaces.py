"""Hostile inputs for every surface (API, setup, CLI, URL, upload) and the checks they must pass.

Shared by `tests/fuzz/` (a fixed seed and a short budget, in CI) and `benchmarks/fuzz.py` (a
long budget, counts in `benchmarks/fuzz.txt`). The contract checked everywhere: no uncaught
exception, no input over 5 s, and every estimate's buckets are non-negative integers that sum
to the device peak (weights + gradients + optimizer + activations = the allocated peak).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import string
import tempfile
import threading
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from pydantic import ValidationError

import vram
from tests.streamlit_speed import scan_components_once
from vram.cli import main as cli_main
from vram.paths import data_dir
from vram.setup import TrainingSetup

scan_components_once()  # AppTest otherwise rescans every installed package per run

MAX_SECONDS = 5.0
ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((data_dir() / "models").glob("*.json"))
CATALOG_CONFIGS = [json.loads(p.read_text()) for p in CONFIGS if p.stem != "catalog"]

#: Text a person could paste: injections, control characters, huge and odd numbers.
HOSTILE_TEXT: tuple[str, ...] = (
    "", " ", "0", "-1", "1e400", "1e309", "1e99999999", "nan", "inf", "-inf", "9" * 5000,
    "[Fix](https://evil.example/x)", "![t](http://127.0.0.1:9/t.png)",
    "<script>alert(1)</script>", "$x$ :red[a] :material/home:", "a\x00b", "\u202e\u200b",
    "../../etc/passwd", "/dev/zero", "/dev/urandom", "/proc/self/mem", "/tmp", "%00",
    "{\"model_type\": \"llama\"}", "x" * 300_000, "😀" * 100, "__import__('os')",
)
#: Paths that are not regular files.
SPECIAL_PATHS: tuple[str, ...] = ("/dev/zero", "/dev/urandom", "/dev/null", "/tmp", "/",
                                  "/proc/self/mem", "/etc/passwd", "a\x00.json", "")


class Slow(AssertionError):
    """An input took longer than MAX_SECONDS."""


#: A real hang is cut off at this many times the limit (SIGALRM, main thread only), so a fuzz
#: run reports it instead of stalling.
HANG_FACTOR = 6


@contextlib.contextmanager
def within(seconds: float = MAX_SECONDS, what: object = "") -> Iterator[None]:
    """Fail with Slow if the block takes over `seconds`; interrupt it if it hangs."""
    def hung(*_: object) -> None:
        raise Slow(f"hung (> {seconds * HANG_FACTOR} s) on {str(what)[:300]!r}")

    alarm = threading.current_thread() is threading.main_thread()
    if alarm:
        previous = signal.signal(signal.SIGALRM, hung)
        signal.setitimer(signal.ITIMER_REAL, seconds * HANG_FACTOR)
    start = cpu_seconds()
    try:
        yield
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    took = cpu_seconds() - start
    if took > seconds:
        raise Slow(f"{took:.1f} CPU s (> {seconds} s) for {str(what)[:300]!r}")


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: the code's own cost.

    Wall clock on a shared 2-core box counts the time an input waited for a CPU, not the time
    it needed; a hang that burns no CPU (a FIFO read) is caught by the wall-clock alarm above.
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def special_files() -> dict[str, str]:
    """A FIFO and a symlink loop in a private folder (created once per process)."""
    folder = Path(tempfile.mkdtemp(prefix="vram-fuzz-"))
    fifo = folder / "fifo.json"
    os.mkfifo(fifo)
    loop = folder / "loop.json"
    os.symlink(loop, loop)
    return {"fifo": str(fifo), "loop": str(loop), "folder": str(folder)}


SPECIAL = special_files()


# --------------------------------------------------------------------------------------------
# Invariants
# --------------------------------------------------------------------------------------------


def check_estimate(est: vram.Estimate) -> None:
    """Buckets: non-negative ints, each the sum of its items, summing to the device peak."""
    buckets = est.bucket_bytes
    assert set(buckets) == {"weights", "gradients", "optimizer", "activations", "overhead"}
    for name, value in buckets.items():
        assert isinstance(value, int) and not isinstance(value, bool), (name, value)
        assert value >= 0, (name, value)
    for bucket in est.buckets:
        assert bucket.bytes == sum(item.bytes for item in bucket.items)
    assert sum(buckets.values()) == est.device_peak_bytes
    allocated = sum(v for k, v in buckets.items() if k != "overhead")
    assert allocated == est.allocated_peak_bytes
    assert est.allocated_peak_bytes <= est.reserved_peak_bytes <= est.device_peak_bytes
    assert est.inference.total_bytes >= 0


def check_estimate_json(payload: dict[str, Any]) -> None:
    buckets = payload["buckets"]
    assert all(isinstance(v, int) and v >= 0 for v in buckets.values()), buckets
    assert sum(buckets.values()) == payload["device_peak_bytes"]


# --------------------------------------------------------------------------------------------
# The API and TrainingSetup (hypothesis strategies)
# --------------------------------------------------------------------------------------------

_ODD_NUMBERS = st.sampled_from([0, -1, 1, 2, 3, 7, 10**9, 10**12, 10**18, 10**30, 10**4000,
                                -(10**4000), 0.5, -0.0, 1e308, float("inf"), float("nan"),
                                2**63, 2**64 + 1])
_JSON_LEAF = (st.none() | st.booleans() | st.integers(-(10**6), 10**7) | _ODD_NUMBERS
              | st.floats(allow_nan=True) | st.text(max_size=30)
              | st.sampled_from(HOSTILE_TEXT[:20]))
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A catalog config with some keys changed, dropped or added (sometimes pure noise)."""
    if draw(st.integers(0, 9)) == 0:
        noise = draw(st.dictionaries(st.text(max_size=12), _JSON, max_size=8))
        return noise
    config = dict(draw(st.sampled_from(CATALOG_CONFIGS)))
    keys = sorted(config)
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.integers(0, 3))
        key = draw(st.sampled_from(keys))
        if action == 0:
            config.pop(key, None)
        elif action == 1 and isinstance(config.get(key), int):
            config[key] = draw(st.integers(-3, 3) | _ODD_NUMBERS
                               | st.integers(1, 2 * max(1, abs(int(config[key])))))
        elif action == 2:
            config[key] = draw(_JSON)
        else:
            config[draw(st.text(max_size=20))] = draw(_JSON)
    if draw(st.booleans()):
        config["_name_or_path"] = draw(st.sampled_from(HOSTILE_TEXT[:20]) | st.text(max_size=40))
    return config


def _field_values(name: str, default: Any, annotation: Any,
                  hostile: bool) -> st.SearchStrategy[Any]:
    garbage = st.sampled_from([None, "", "x", -1, 0, 10**9, 1.5, "nan", [], {}, True])
    enum_type = next((a for a in (annotation, *getattr(annotation, "__args__", ()))
                      if isinstance(a, type) and issubclass(a, Enum)), None)
    if enum_type is not None:
        valid: st.SearchStrategy[Any] = st.sampled_from([m.value for m in enum_type])
    elif default is None:
        valid = st.booleans() | st.none()
    elif isinstance(default, bool):
        valid = st.booleans()
    elif isinstance(default, int):
        valid = st.integers(1, max(8, 4 * default)) | st.sampled_from([1, 2, 8, 64, 4096])
    elif isinstance(default, float):
        valid = st.floats(0.0, 0.99)
    elif name == "lora_targets":
        valid = st.sampled_from(["all-linear", ("q_proj", "v_proj"), ("o_proj",),
                                 ("gate_proj", "up_proj", "down_proj")])
    else:
        return st.just(default)
    return st.one_of(valid, valid, valid, garbage) if hostile else valid


@st.composite
def setup_fields(draw: st.DrawFn) -> dict[str, Any]:
    """TrainingSetup arguments: each field left out, valid, or (in a third of the setups)
    garbage; every field of TrainingSetup is covered, new ones included."""
    fields: dict[str, Any] = {}
    hostile = draw(st.integers(0, 2)) == 0
    for name, info in TrainingSetup.model_fields.items():
        if draw(st.integers(0, 2)) == 0:
            continue
        fields[name] = draw(_field_values(name, info.default, info.annotation, hostile))
    if not hostile and draw(st.integers(0, 3)):  # mostly coherent: most setups get estimated
        _make_coherent(fields)
    return fields


def _make_coherent(fields: dict[str, Any]) -> None:
    """Settle the cross-field rules a person would: sharding for the GPU count, offload for
    the sharding, a quantized base exactly for QLoRA."""
    gpus = fields.get("n_gpus", 1)
    if isinstance(gpus, int) and gpus > 1 and fields.get("sharding", "none") == "none":
        fields["sharding"] = "zero3"
    if gpus == 1 and fields.get("sharding") in ("ddp", "zero1", "zero2"):
        fields["sharding"] = "none"
    if fields.get("sharding", "none") in ("none", "ddp"):
        fields["offload"] = "none"
    qlora = fields.get("method", "qlora") == "qlora"
    if qlora and fields.get("quant") in ("none", None):
        fields["quant"] = "nf4"
    elif not qlora:
        fields["quant"] = "none"


MODEL_TEXT = st.one_of(
    st.sampled_from([c.slug for c in vram.model_catalog()]),
    st.sampled_from(["7B", "70b", "1.5e9", "13e9", "1e400", "1e309", "1e99999999", "0B",
                     "999999999999999999999T", "3.0.1B"]),
    st.sampled_from([*SPECIAL_PATHS, SPECIAL["fifo"], SPECIAL["loop"], SPECIAL["folder"]]),
    st.sampled_from(HOSTILE_TEXT),
    st.text(max_size=40),
)


def check_api(model_input: Any, fields: dict[str, Any], with_fit: bool = False) -> str:
    """load_model + TrainingSetup + estimate (+ fit): a result obeying the invariants, or a
    documented error (VramError for models, pydantic's ValidationError for setups)."""
    with within(what=(str(model_input)[:200], fields)):
        try:
            model = vram.load_model(model_input)
        except vram.VramError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)[:300]
            return "model refused"
        try:
            setup = TrainingSetup.model_validate(fields)
        except ValidationError:
            return "setup refused"
        try:
            est = vram.estimate(model, setup)
        except vram.VramError:
            return "setup refused for this model"
        check_estimate(est)
        if with_fit:
            report = vram.fit(model, setup)
            for option in (*report.fits, *report.misses):
                assert option.device_peak_bytes >= 0 and isinstance(option.count, int)
    return "estimated"


# --------------------------------------------------------------------------------------------
# The CLI (generated argument lists)
# --------------------------------------------------------------------------------------------

FLAG_VALUES: dict[str, list[str]] = {
    "--method": ["full", "lora", "qlora"], "--optimizer": ["adamw", "sgd", "lion", "adafactor",
                                                             "paged-adamw-8bit"],
    "--precision": ["fp32", "bf16-mixed", "bf16-true", "fp16-mixed"],
    "--batch": ["1", "4", "128"], "--seq": ["128", "2048", "131072"],
    "--lora-rank": ["8", "64"], "--lora-targets": ["all-linear", "q_proj,v_proj"],
    "--quant": ["none", "nf4", "int8"], "--attention": ["sdpa", "eager", "flash"],
    "--gpus": ["1", "8", "64"], "--sharding": ["none", "ddp", "zero3", "fsdp-full"],
    "--offload": ["none", "optimizer"], "--framework": ["hf-trainer", "litgpt", "torchtune"],
    "--grad-accum": ["1", "8"], "--lora-dropout": ["0", "0.1"], "--loss": ["chunked"],
    "--liger-version": ["0.3.0", "v0.8.2", "0.6", "auto", "0.3.0.post1", "1e400"],
}
SWITCHES = ("--grad-ckpt", "--json", "--compile", "--no-compile", "--compile-loss",
            "--no-compile-loss", "--single-longest-batch")


@st.composite
def cli_argv(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["estimate"] * 6 + ["gpus", "models", "validate", "nope",
                                                       "--help", ""]))
    argv = [command] if command else []
    if command == "validate":
        argv.append(draw(st.sampled_from([*SPECIAL_PATHS, SPECIAL["fifo"], SPECIAL["loop"],
                                          "/etc/hostname", *HOSTILE_TEXT[:12]])))
    elif command in ("gpus", "models") and draw(st.booleans()):
        argv.append("--json")
    clean = command == "estimate" and draw(st.booleans())  # half: a run a person would ask for
    if clean:
        argv += ["--model", draw(st.sampled_from(["llama-3.2-1b", "llama-3.1-8b", "70B",
                                                  "mixtral-8x7b", "t5-base", "gemma-2-9b"]))]
        for flag in draw(st.lists(st.sampled_from(list(FLAG_VALUES)), max_size=6, unique=True)):
            argv += [flag, draw(st.sampled_from(FLAG_VALUES[flag]))]
        argv += draw(st.lists(st.sampled_from(SWITCHES[:3]), max_size=2, unique=True))
        return argv
    if command == "estimate" and draw(st.integers(0, 9)):
        argv += ["--model", draw(MODEL_TEXT)]
    for _ in range(draw(st.integers(0, 6))):
        flag = draw(st.sampled_from([*FLAG_VALUES, *SWITCHES, "--bogus", "-x"]))
        argv.append(flag)
        if flag in FLAG_VALUES and draw(st.integers(0, 9)):
            argv.append(draw(st.sampled_from(FLAG_VALUES[flag]) | st.sampled_from(HOSTILE_TEXT)
                             | st.integers(-(10**20), 10**20).map(str)))
    return argv


def run_cli(argv: list[str]) -> int:
    """`main(argv)` in-process: exit 0 (with a well-formed result) or 2 (one-line message)."""
    out, err = io.StringIO(), io.StringIO()
    with within(what=argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
            code = exc.code if isinstance(exc.code, int) else 2
    assert code in (0, 2), (argv, code, err.getvalue()[-500:])
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().strip(), argv
    if code == 0 and argv[:1] == ["estimate"] and "--json" in argv and "--help" not in argv:
        check_estimate_json(json.loads(out.getvalue()))
    return code


# --------------------------------------------------------------------------------------------
# The app: URL parameters and uploads (plain random generators; AppTest is slow)
# --------------------------------------------------------------------------------------------

PAGES = ("app.py", *sorted(f"pages/{p.name}" for p in (ROOT / "pages").glob("*.py")))
URL_VALUES: dict[str, list[str]] = {
    "model": ["llama-3.2-1b", "llama-3.1-70b", "upload", "params", "gpt2", "nope"],
    "method": ["full", "lora", "qlora"], "opt": ["adamw", "sgd", "lion"],
    "batch": ["1", "4", "128", "129", "0"], "seq": ["128", "2048", "131072", "1000"],
    "prec": ["fp32", "bf16-true"], "rank": ["8", "512", "513"], "targets": ["q_proj,v_proj"],
    "quant": ["nf4", "int8"], "ckpt": ["1", "0"], "accum": ["1", "8", "3"],
    "dropout": ["0.0", "0.1"], "repeats": ["0"], "compile": ["on", "off", "auto"],
    "closs": ["on", "off", "auto", "maybe"], "attn": ["eager", "flash"], "loss": ["chunked"],
    "liger": ["0.3.0", "0.8.2", "auto", "v0.6", "0.6.2.dev0", "banana"],
    "gpus": ["1", "8", "1024", "1025"],
    "shard": ["zero3", "ddp", "none"], "offload": ["optimizer", "params+optimizer"],
    "stack": ["litgpt", "torchtune"], "vendor": ["NVIDIA", "AMD,Acme"],
    "segment": ["datacenter"], "fits": ["1"], "math": ["1"], "unit": ["GiB", "GB"],
    "size": ["7", "0.001", "1e400", "70"], "config": ["{}", "z!!", "x" * 10, "{\"a\":"],
    "plan": ["1", "0", "2"], "mygpu": ["rtx-4090", "any", "nope"], "mycount": ["2", "0", "65"],
    "tokens": ["1000", "0", "1e400"],
    # main's parallelism knobs, the allocator's settings and the what-if / presentation keys
    "tp": ["1", "2", "8", "0", "3", "4097"], "pp": ["1", "2", "4", "0", "-1"],
    "ppsched": ["gpipe", "1f1b", "interleaved", "nope"], "ppv": ["1", "2", "65", "0"],
    "cp": ["1", "2", "4", "3", "0"], "cpkind": ["ring", "ulysses", "nope"],
    "ep": ["1", "2", "8", "3"], "sp": ["1", "0", "maybe"],
    "fp8": ["tensorwise", "rowwise", "blockwise", "te", "none", "fp4"],
    "alloc": ["expandable_segments:True", "max_split_size_mb:128", "max_split_size_mb:nan",
              "garbage_collection_threshold:2", "x:y", "roundup_power2_divisions:[x]"],
    "ctx": ["500", "0", "-1", "1e400"], "sac": ["1", "0"],
    "present": ["1", "0"], "whatif": ["1", "0"], "wgpu": ["h100-sxm", "rtx-4090", "nope"],
    "compress": ["optimizer=4", "weights=2,activations=8", "weights=0", "activations=nan",
                 "x=2", "optimizer=1e400", "optimizer=4,optimizer=8", "=", ","],
    # the RL page's own parameters
    "rl_model": ["qwen2.5-7b-instruct", "llama-3.2-1b", "nope"], "rl_gpu": ["h100-sxm", "nope"],
    "rl_algo": ["grpo", "dpo", "ppo"], "rl_gens": ["8", "1024", "1025", "0"],
    "rl_batch": ["1", "512", "513", "4096"], "rl_util": ["0.3", "0.3000000000junk", "nan"],
    "rl_beta": ["0.04", "-1", "inf"], "rl_rollout": ["server", "shared"], "rl_sleep": ["1", "3"],
    "rl_plen": ["512", "0"], "rl_clen": ["1024", "1048577"], "rl_ckpt": ["off"],
}


def url_query(rng: random.Random) -> dict[str, str | list[str]]:
    """Some URL parameters: mostly real keys with real or hostile values, some unknown keys."""
    query: dict[str, str | list[str]] = {}
    for _ in range(rng.randint(0, 6)):
        roll = rng.random()
        unknown = roll < 0.1
        key = (rng.choice(HOSTILE_TEXT[10:20]) or "k") if unknown else rng.choice(list(URL_VALUES))
        if roll < 0.6 and key in URL_VALUES:
            query[key] = rng.choice(URL_VALUES[key])
        else:
            query[key] = rng.choice(HOSTILE_TEXT[:25])
    if rng.random() < 0.2:
        pins = [json.dumps({k: rng.choice(v) for k, v in rng.sample(sorted(URL_VALUES.items()),
                                                                     3)})
                for _ in range(rng.randint(1, 5))]
        query["pin"] = pins + ([rng.choice(HOSTILE_TEXT[:12])] if rng.random() < 0.5 else [])
    return query


def upload_bytes(rng: random.Random) -> tuple[str, bytes]:
    """(kind, content) of a hostile upload: huge, deep, binary, special, or a mutated config."""
    kind = rng.choice(["huge", "deep", "binary", "urandom", "zero", "digits", "nan",
                       "mutated", "mutated", "mutated", "empty", "bom", "not-object"])
    config = dict(rng.choice(CATALOG_CONFIGS))
    if kind == "huge":
        return kind, b'{"model_type": "llama", "pad": "' + b"x" * rng.choice(
            [200_000, 300_000, 2_000_000]) + b'"}'
    if kind == "deep":
        depth = rng.choice([1000, 100_000])
        return kind, b"[" * depth + b"]" * depth
    if kind == "binary":
        return kind, bytes(rng.randrange(256) for _ in range(rng.choice([10, 1000, 50_000])))
    if kind == "urandom":
        return kind, os.urandom(rng.choice([16, 4096]))
    if kind == "zero":
        return kind, b"\x00" * rng.choice([1, 100_000])
    if kind == "digits":
        config[rng.choice(sorted(config))] = "__digits__"  # written as JSON text: no int() limit
        digits = "9" * rng.choice([19, 4000, 4400, 100_000])
        return kind, json.dumps(config).replace('"__digits__"', digits).encode()
    if kind == "nan":
        config[rng.choice(sorted(config))] = float(rng.choice(["nan", "inf"]))
        return kind, json.dumps(config).encode()
    if kind == "empty":
        return kind, b""
    if kind == "bom":
        return kind, b"\xef\xbb\xbf" + json.dumps(config).encode()
    if kind == "not-object":
        return kind, rng.choice([b"[1,2]", b'"llama"', b"null", b"1e400"])
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(sorted(config))
        config[key] = rng.choice([0, -1, 10**6, "[Fix](https://evil.example/x)", None,
                                  [1], {"a": 1}, 3.5, True, rng.choice(HOSTILE_TEXT[:20])])
    if rng.random() < 0.5:
        config["_name_or_path"] = rng.choice(HOSTILE_TEXT[:20])
    return kind, json.dumps(config).encode()


def random_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(string.printable) for _ in range(size))


def active_markup(markdown: str) -> list[str]:
    """Links, images and HTML a Markdown body would render (CommonMark tokens), and bare URLs
    or e-mail addresses GitHub-flavoured autolinking would turn into links."""
    from markdown_it import MarkdownIt

    found: list[str] = []
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        for child in [token, *(token.children or [])]:
            if child.type in {"link_open", "image", "html_inline", "html_block"}:
                found.append(child.type)
    found += [p for p in ("://", "www.", "@evil") if p in markdown.lower()]
    return found


def _check_page(app: Any, what: object) -> None:
    assert not app.exception, (what, [e.value for e in app.exception][:1])
    for element in (*app.error, *app.warning, *app.caption):
        assert active_markup(element.value) == [], (what, element.value[:300])


def run_url(page: str, query: dict[str, str | list[str]], seconds: float = MAX_SECONDS) -> None:
    """One page opened with these URL parameters: no exception, no rendered markup from them."""
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_file(str(ROOT / page), default_timeout=30)
    for key, value in query.items():
        app.query_params[key] = value
    with within(seconds, what=(page, query)):
        app.run()
    _check_page(app, (page, query))


def run_upload(content: bytes, what: object = "") -> None:
    """The calculator with an uploaded file: estimated or a message, never an exception."""
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    app.query_params["model"] = "upload"
    app.run()
    app.file_uploader(key="upload").set_value(("config.json", content, "application/json"))
    with within(what=what):
        app.run()
    _check_page(app, what)
    assert app.error or app.metric, what  # either an estimate or a message naming why


#: Real training configs (axolotl, torchtune, LLaMA-Factory, TRL, ms-swift and its launch
#: scripts) that the import surface mutates.
TRAINING_CONFIGS = sorted(p for p in (ROOT / "tests" / "data" / "configs").rglob("*")
                          if p.suffix in {".yaml", ".yml", ".json", ".sh"})


def import_bytes(rng: random.Random) -> tuple[str, bytes]:
    """(kind, content) of a hostile training-config import: bombs, tags, mutated real files."""
    kind = rng.choice(["bomb", "deep", "tag", "anchor", "binary", "huge", "digits",
                       "mutated", "mutated", "mutated", "mutated", "json", "empty", "real",
                       "real", "oddkeys"])
    if kind == "oddkeys":  # keys YAML allows and no reader can name (issue 25)
        key = rng.choice(["~", "null", "1", "2.5", "true", "no", "''", "? [a, b]"])
        lines = rng.choice(TRAINING_CONFIGS).read_text().splitlines()
        lines.insert(rng.randrange(len(lines) + 1), f"{key}: 1")
        return kind, "\n".join(lines).encode()
    if kind == "bomb":
        lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        for level in "bcdefghi"[: rng.randint(2, 8)]:
            lines.append(f"{level}: &{level} [" + ",".join([f"*{chr(ord(level) - 1)}"] * 9) + "]")
        return kind, "\n".join(lines).encode()
    if kind == "deep":
        depth = rng.choice([100, 1000, 50_000])
        return kind, (b"a: " + b"[" * depth + b"]" * depth)
    if kind == "tag":
        return kind, rng.choice([b"x: !!python/name:os.system\n",
                                 b"x: !!python/object/new:subprocess.Popen [[ls]]\n",
                                 b"base_model: !!binary aGVsbG8=\nx: 1\n"])
    if kind == "anchor":
        return kind, b"base: &b {learning_rate: 1}\nmerged:\n  <<: *b\n  micro_batch_size: 4\n"
    if kind == "binary":
        return kind, bytes(rng.randrange(256) for _ in range(rng.choice([10, 1000, 50_000])))
    if kind == "huge":
        return kind, b"base_model: x\npad: " + b"y" * rng.choice([100_000, 2_000_000]) + b"\n"
    if kind == "digits":
        return kind, ("micro_batch_size: " + "9" * rng.choice([19, 4400, 100_000])).encode()
    if kind == "json":
        return kind, json.dumps({"model_name_or_path": rng.choice(HOSTILE_TEXT[:20]),
                                 "per_device_train_batch_size": rng.choice([1, -1, 10**9]),
                                 "max_seq_length": rng.choice([512, 0, "x"])}).encode()
    if kind == "empty":
        return kind, b""
    if kind == "real":  # the accepting path too: a real file, one line dropped at most
        lines = rng.choice(TRAINING_CONFIGS).read_text().splitlines()
        if lines and rng.random() < 0.5:
            del lines[rng.randrange(len(lines))]
        return kind, "\n".join(lines).encode()
    lines = rng.choice(TRAINING_CONFIGS).read_text().splitlines()
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines)) if lines else 0
        if lines and ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            value = rng.choice(["-1", "0", "1e400", "9" * 30, "[1, 2]", "{a: 1}", "null",
                                "'[Fix](https://evil.example/x)'", "/dev/zero", "true", "\"\""])
            lines[i] = f"{key}: {value}"
        else:
            lines.insert(i, rng.choice(HOSTILE_TEXT[:20]).replace("\n", " "))
    return kind, "\n".join(lines).encode()


class _Upload:
    """What `st.file_uploader` hands a callback: `.size` and `.getvalue()`."""

    def __init__(self, content: bytes) -> None:
        self.size = len(content)
        self._content = content

    def getvalue(self) -> bytes:
        return self._content


def run_file(uploader: str, content: bytes, what: object = "") -> str:
    """A file through an uploader's own callback (no page render), then estimated as the page would.

    `model`: `ui.inputs._on_upload` (a config.json), then `vram.estimate` of the model it keeps.
    `import`: `ui.import_config._on_import` (a training config), then the setup it loaded.
    The callbacks read `st.session_state`; a plain dict stands in for it.
    """
    import ui.import_config
    import ui.inputs

    session: dict[str, Any] = {}
    fake_st = type("FakeStreamlit", (), {"session_state": session})
    with within(what=what):
        if uploader == "model":
            session["upload"] = _Upload(content)
            real, ui.inputs.st = ui.inputs.st, fake_st  # type: ignore[assignment]
            try:
                ui.inputs._on_upload()
            finally:
                ui.inputs.st = real
            if "_upload_error" in session:
                message = str(session["_upload_error"])
                assert message and "Traceback" not in message, message
                return "refused"
            return check_api(json.loads(session["config"]), {})
        session.update({"import_file": _Upload(content), "import_format": "auto"})
        real, ui.import_config.st = ui.import_config.st, fake_st  # type: ignore[assignment]
        try:
            ui.import_config._on_import()
        finally:
            ui.import_config.st = real
        error = session.get(ui.import_config._ERROR)
        if error:
            assert "Traceback" not in str(error), error
            return "refused"
        assert session.get(ui.import_config._REPORT), what
        return "imported"
