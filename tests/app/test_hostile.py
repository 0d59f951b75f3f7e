"""Issue 13's app breaks: what a person typed is shown as text on every page, a bad team GPU
list is named and fails the script health check, and links carry configs compressed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from tests.app.conftest import PAGES, ROOT
from ui import params, urlpack
from ui.text import plain, shown
from vram.paths import data_dir

LINK = "[Fix](https://evil.example/x)"
IMAGE = "![t](http://127.0.0.1:9/t.png)"
HTML = "<img src=x onerror=alert(1)>"
LATEX_AND_DIRECTIVES = "$x^2$ :red[alarm] :material/home: www.evil.example a@evil.example"
_MD = MarkdownIt("commonmark").enable("table")


def _active_markup(markdown: str) -> list[str]:
    """Links, images and HTML a Markdown body would render (CommonMark tokens), and bare
    URLs or emails GitHub-flavoured autolinking would turn into links."""
    found: list[str] = []
    for token in _MD.parse(markdown):
        for child in [token, *(token.children or [])]:
            if child.type in {"link_open", "image", "html_inline", "html_block"}:
                found.append(child.type)
    for pattern in ("://", "www.", "@evil"):
        if pattern in markdown:
            found.append(pattern)
    return found


@given(st.text(max_size=200))
def test_plain_text_renders_as_exactly_itself(text: str) -> None:
    markdown = plain(text)
    assert _active_markup(markdown) == []
    assert shown(markdown) == " ".join(text.split())
    rendered = _MD.renderInline(markdown)
    assert "<a " not in rendered and "<img" not in rendered


def _bodies(app: AppTest) -> list[str]:
    return [e.value for e in app.error]


@pytest.mark.parametrize("page", ["app.py", *PAGES])
def test_url_text_is_shown_as_text_on_every_page(page: str) -> None:
    app = AppTest.from_file(str(ROOT / page), default_timeout=60)
    app.query_params.update({"method": LINK, "opt": IMAGE, HTML: "1",
                             "targets": LATEX_AND_DIRECTIVES, "pin": IMAGE})
    app.run()
    assert not app.exception
    bodies = _bodies(app)
    assert bodies
    text = " ".join(shown(b) for b in bodies)
    for typed in (LINK, IMAGE, HTML[:40]):
        assert typed in text
    for body in bodies:
        assert _active_markup(body) == [], body


def _upload(content: bytes) -> AppTest:
    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    app.query_params["model"] = "upload"
    app.run()
    app.file_uploader(key="upload").set_value(("config.json", content, "application/json"))
    return app.run()


def test_an_uploaded_model_type_is_shown_as_text() -> None:
    app = _upload(json.dumps({"model_type": IMAGE + LINK}).encode())
    assert not app.exception
    body = " ".join(_bodies(app))
    assert "model_type" in shown(body) and "![t](http" in shown(body)
    assert _active_markup(body) == []


def test_an_uploaded_configs_name_is_shown_as_text() -> None:
    config = json.loads((data_dir() / "models" / "llama-3.2-1b.json").read_text())
    config["_name_or_path"] = "team/" + LINK
    app = _upload(json.dumps(config).encode())
    assert not app.exception and not app.error
    caption = app.caption[0].value
    assert shown(caption).startswith("team/" + LINK + ": ")
    assert _active_markup(caption) == []


def test_a_link_carries_the_config_compressed() -> None:
    text = (data_dir() / "models" / "llama-3.2-1b.json").read_text()
    compact = json.dumps(json.loads(text), separators=(",", ":"))
    packed = urlpack.pack(compact)
    assert packed[0] == "z" and packed == urllib.parse.quote(packed)  # URL-safe as is
    assert len(packed) < len(urllib.parse.quote(compact)) * 0.6
    labels = {str(i): f"LABEL_{i}" for i in range(11_000)}  # a classifier's id2label map
    big = json.dumps({**json.loads(text), "id2label": labels}, separators=(",", ":"))
    assert 200_000 < len(big) <= params.MAX_CONFIG_BYTES
    assert len(urllib.parse.quote(big)) > 300_000 and len(urlpack.pack(big)) < 20_000
    assert urlpack.unpack(urlpack.pack(big), params.MAX_CONFIG_BYTES) == big
    assert urlpack.unpack(packed, params.MAX_CONFIG_BYTES) == compact
    assert urlpack.unpack(compact, params.MAX_CONFIG_BYTES) == compact  # older links
    app = _upload(text.encode())
    assert app.query_params["config"] == packed
    again = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    again.query_params.update({"model": "upload", "config": app.query_params["config"]})
    again.run()
    assert not again.error and again.metric[0].value == app.metric[0].value


@pytest.mark.parametrize(("packed", "fragment"), [
    (urlpack.pack("{" + " " * 5_000_000 + "}"), "more than"),  # a decompression bomb
    ("z!!notbase64", "not a packed config"),
    (urlpack.pack('{"a": 1}')[:-4], "cut short"),
])
def test_a_bad_packed_config_is_named(packed: str, fragment: str) -> None:
    values, errors = params.parse_query(
        params.registry(("llama-3.2-1b",), "llama-3.2-1b"), {"config": packed})
    assert values == {} and fragment in " ".join(errors)
    assert len(urlpack.pack(" " * 5_000_000)) < 10_000  # the bomb's link is small


def test_a_bad_team_gpu_list_is_named_on_every_page(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "gpus.csv"
    bad.write_text("id,name,segment,memory_bytes\nx,[Fix](https://e.x),datacenter,lots\n")
    monkeypatch.setenv("VRAM_GPUS_CSV", str(bad))
    for page in ("app.py", *PAGES):
        app = AppTest.from_file(str(ROOT / page), default_timeout=60).run()
        bodies = _bodies(app)
        assert len(bodies) == 1 and "GPU list cannot be used" in bodies[0]
        assert "gpus.csv line 2" in shown(bodies[0]) and _active_markup(bodies[0]) == []
        assert not app.metric


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _script_health(gpus_csv: str | None) -> tuple[int, int]:
    """(status of /_stcore/health, status of /_stcore/script-health-check) from a real server."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VRAM_GPUS_CSV", None)
    if gpus_csv:
        env["VRAM_GPUS_CSV"] = gpus_csv
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
         f"--server.port={port}", "--server.address=127.0.0.1",
         "--server.scriptHealthCheckEnabled=true"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = status("/_stcore/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        return health, status("/_stcore/script-health-check")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_bad_team_gpu_list_fails_the_script_health_check(tmp_path: Path) -> None:
    """What docs/app.md tells an orchestrator to probe: 503 for a bad list, 200 for a good one.
    (`/_stcore/health` only says the server is up; it stays 200 either way.)"""
    bad = tmp_path / "gpus.csv"
    bad.write_bytes(b"\xff\xfe not a csv")
    assert _script_health(str(bad)) == (200, 503)
    assert _script_health("/dev/zero") == (200, 503)
    assert _script_health(None) == (200, 200)


def test_a_pin_with_a_5000_digit_number_is_named_not_raised() -> None:
    """Found by benchmarks/fuzz.py: `?pin=999...9` made json.loads raise ValueError."""
    reg = params.registry(("llama-3.2-1b",), "llama-3.2-1b")
    for text in ("9" * 5000, '{"batch": ' + "9" * 5000 + "}"):
        pins, errors = params.parse_pins(reg, [text], 4)
        assert pins == [] and "pin #1" in " ".join(errors)
    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    app.query_params["pin"] = "9" * 5000
    app.run()
    assert not app.exception and "pin" in shown(" ".join(_bodies(app)))
