"""The app's links and the shipped proxy agree on length (issue 25).

nginx answers 414 to a request line longer than `large_client_header_buffers`; the app's
links carry an uploaded config.json packed into the query string. The app keeps a link's
query under `urlpack.MAX_QUERY_CHARS` (leaving the config out, and saying so, when it would
be longer), and `deploy/nginx/vram.conf` accepts the longest link the app makes: this test
builds that link with the app itself and sends it through the shipped config to a real server.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import socket
import string
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from streamlit.testing.v1 import AppTest

from benchmarks.load import free_port, served
from tests.app.conftest import ROOT
from ui import params, urlpack
from ui.text import shown
from vram.paths import data_dir

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None)


def _config(labels: int) -> bytes:
    """A classifier's config.json: a small model with `labels` random (incompressible)
    labels, as large label maps are what make a packed config long."""
    config = json.loads((data_dir() / "models" / "llama-3.2-1b.json").read_text())
    rng = random.Random(25)
    names = ["".join(rng.choice(string.ascii_letters) for _ in range(12)) for _ in range(labels)]
    config["id2label"] = {str(i): name for i, name in enumerate(names)}
    config["label2id"] = {name: i for i, name in enumerate(names)}
    return json.dumps(config).encode()


def _uploaded(content: bytes) -> AppTest:
    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    app.query_params["model"] = "upload"
    app.run()
    app.file_uploader(key="upload").set_value(("config.json", content, "application/json"))
    app.run()
    assert not app.exception
    return app


def _query(app: AppTest) -> dict[str, str | list[str]]:
    return {k: app.query_params[k] for k in app.query_params}


def _longest_labels() -> int:
    """The most labels whose packed config still fits the link (searched on `short_link`,
    the function the page calls, with the page's other parameters)."""
    others: dict[str, str | list[str]] = {"model": "upload"}
    low, high = 1, 4000
    while low < high:
        mid = (low + high + 1) // 2
        text = _config(mid).decode()
        query = {**others, "config": urlpack.pack(text)}
        if params.short_link(query)[1] is None:
            low = mid
        else:
            high = mid - 1
    return low


@pytest.fixture(scope="module")
def longest() -> tuple[str, int]:
    """The query string of the longest link the app makes, and its label count."""
    labels = _longest_labels()
    app = _uploaded(_config(labels))
    query = _query(app)
    assert "config" in query, "the app left out a config that fits"
    assert not [i for i in app.info if "leaves out" in i.value]
    line = urlencode(query, doseq=True)
    assert urlpack.MAX_QUERY_CHARS - 200 < len(line) <= urlpack.MAX_QUERY_CHARS
    return line, labels


def test_a_link_over_the_limit_leaves_the_config_out_and_says_so(
        longest: tuple[str, int]) -> None:
    _, labels = longest
    app = _uploaded(_config(labels + 40))
    query = _query(app)
    assert "config" not in query and query["model"] == "upload"
    assert len(urlencode(query, doseq=True)) <= urlpack.MAX_QUERY_CHARS
    notes = [shown(i.value) for i in app.info if "leaves out the uploaded config.json" in
             shown(i.value)]
    assert len(notes) == 1
    assert app.metric  # the page itself still shows the uploaded model's estimate


def test_short_link_drops_pinned_configs_too() -> None:
    big = urlpack.pack(_config(3000).decode())
    pin = json.dumps({"model": "upload", "config": big, "method": "lora"},
                     separators=(",", ":"), sort_keys=True)
    query, note = params.short_link({"model": "upload", "config": big, "pin": [pin, pin]})
    assert note and "config" not in query
    assert [json.loads(p) for p in query["pin"]] == [{"method": "lora", "model": "upload"}] * 2
    small = {"model": "llama-3.1-8b", "seq": "4096"}
    assert params.short_link(small) == (small, None)


@contextlib.contextmanager
def _proxy(app_port: int, tmp: Path) -> Iterator[int]:
    """Debian's nginx with the shipped vram.conf and locations.conf, as compose runs them."""
    assert NGINX is not None
    port = free_port()
    (tmp / "tmp").mkdir()
    conf = tmp / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
    client_body_temp_path {tmp}/tmp/body;
    proxy_temp_path {tmp}/tmp/proxy;
    fastcgi_temp_path {tmp}/tmp/fastcgi;
    uwsgi_temp_path {tmp}/tmp/uwsgi;
    scgi_temp_path {tmp}/tmp/scgi;
    include {ROOT}/deploy/nginx/vram.conf;
    upstream vram_app {{
        hash $vram_route consistent;
        server 127.0.0.1:{app_port};
    }}
    server {{
        listen 127.0.0.1:{port};
        access_log {tmp}/access.log vram;
        include {ROOT}/deploy/nginx/locations.conf;
    }}
}}
""")
    subprocess.run([NGINX, "-t", "-q", "-c", str(conf), "-p", str(tmp)], check=True,
                   timeout=30)
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp), "-g", "daemon off;"])
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _status(url: str) -> int:
    request = urllib.request.Request(url, headers={"Cookie": "vram_route=test"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (scripts/test.sh installs "
                    "Debian's nginx when it can: apt-get install nginx)")
def test_the_shipped_proxy_passes_the_longest_link_the_app_makes(
        longest: tuple[str, int], tmp_path: Path) -> None:
    line, _ = longest
    app_port = free_port()
    with served(app_port), _proxy(app_port, tmp_path) as proxy:
        assert _status(f"http://127.0.0.1:{app_port}/?{line}") == 200  # the app itself
        assert _status(f"http://127.0.0.1:{proxy}/?{line}") == 200  # through the proxy
        # and the proxy's limit is real: a link the app would never make is refused
        too_long = "config=x" + "A" * (4 * urlpack.MAX_QUERY_CHARS)
        assert _status(f"http://127.0.0.1:{proxy}/?{too_long}") == 414
