"""Many people at once: concurrent sessions speaking Streamlit's websocket protocol, no browser.

Each session does what a person opening a shared link and moving one control does: it opens
``/_stcore/stream``, asks for the page (a ``BackMsg.rerun_script`` with the link's query
string), reads ``ForwardMsg`` frames until ``script_finished``, then moves the micro-batch
slider (a ``rerun_script`` carrying that widget's new state) and reads until
``script_finished`` again. All sessions of a wave start together.

Reported per wave: the latency of the first render and of the widget change (median, p95),
errors (a refused connection, a timeout, an exception element in the page, a run that did not
finish successfully), the server's CPU time per script run (utime + stime of the server
processes, from /proc, over the wave, divided by the script runs), and their resident memory.

Two kinds of change: ``same`` (every session moves the slider to the same value: the state
caches answer all but the first) and ``distinct`` (each session moves it to its own value, on a
link whose sequence length is new to the wave: every change is a state the server never saw).

    python benchmarks/load.py --sessions 10 50 100             # starts its own server
    python benchmarks/load.py --url ws://127.0.0.1:8080 --pid 123 --pid 456 --sessions 50

Bounded: every wait has a timeout, each wave ends when its sessions do, and only loopback
addresses are accepted. A server it starts, it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
#: The slider each session moves, found by its key in the element ids of the first render.
SLIDER_KEY = "batch"
#: Sequence lengths on the link of a `distinct` wave: one per wave, so no state repeats.
WAVE_SEQ = (512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCH_VALUES = range(2, 129)
STEP_TIMEOUT_S = 120.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class SessionResult:
    first_s: float | None = None
    change_s: float | None = None
    error: str | None = None


@dataclass
class Wave:
    sessions: int
    mode: str
    wall_s: float
    cpu_s: float
    rss_mib: list[float]
    loadavg: float
    results: list[SessionResult] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return sum((r.first_s is not None) + (r.change_s is not None) for r in self.results)

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.results if r.error]


def loopback_only(url: str) -> None:
    host = urlsplit(url).hostname
    if host not in LOOPBACK:
        raise SystemExit(f"--url: only loopback addresses are allowed ({sorted(LOOPBACK)}).")


async def read_run(ws: websockets.ClientConnection) -> list[ForwardMsg]:
    """Frames up to and including this run's `script_finished`."""
    msgs: list[ForwardMsg] = []
    while True:
        msg = ForwardMsg()
        msg.ParseFromString(await ws.recv())
        msgs.append(msg)
        if msg.WhichOneof("type") == "script_finished":
            return msgs


def problem(msgs: Sequence[ForwardMsg]) -> str | None:
    """An exception element, or a run that did not finish successfully."""
    for msg in msgs:
        kind = msg.WhichOneof("type")
        if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            element = msg.delta.new_element
            if element.WhichOneof("type") == "exception":
                return f"exception in page: {element.exception.message[:120]}"
        if kind == "script_finished" and msg.script_finished != ForwardMsg.FINISHED_SUCCESSFULLY:
            return f"script finished with status {msg.script_finished}"
    return None


def slider_id(msgs: Sequence[ForwardMsg], key: str) -> str | None:
    for msg in msgs:
        if msg.WhichOneof("type") == "delta" and msg.delta.WhichOneof("type") == "new_element":
            element = msg.delta.new_element
            if element.WhichOneof("type") == "slider" and element.slider.id.endswith(f"-{key}"):
                return str(element.slider.id)
    return None


def rerun(query: str, page_hash: str, widgets: Sequence[WidgetState] = ()) -> bytes:
    back = BackMsg()
    back.rerun_script.query_string = query
    back.rerun_script.page_script_hash = page_hash
    back.rerun_script.widget_states.widgets.extend(widgets)
    return back.SerializeToString()


async def session(url: str, query: str, batch: int) -> SessionResult:
    res = SessionResult()
    try:
        async with websockets.connect(
            url, subprotocols=[websockets.Subprotocol("streamlit")], max_size=2**26,
            open_timeout=STEP_TIMEOUT_S, compression=None,
            # No keepalive pings: a starved server answers them late, and the client would
            # then close a session the server is still serving (every wait is bounded anyway).
            ping_interval=None,
        ) as ws:
            start = time.perf_counter()
            await ws.send(rerun(query, ""))
            first = await asyncio.wait_for(read_run(ws), STEP_TIMEOUT_S)
            res.first_s = time.perf_counter() - start
            if err := problem(first):
                res.error = err
                return res
            page_hash = next(
                (m.new_session.page_script_hash for m in first
                 if m.WhichOneof("type") == "new_session"), "")
            wid = slider_id(first, SLIDER_KEY)
            if wid is None:
                res.error = f"no '{SLIDER_KEY}' slider in the first render"
                return res
            state = WidgetState(id=wid)
            state.double_array_value.data.append(batch)
            start = time.perf_counter()
            await ws.send(rerun(query, page_hash, [state]))
            change = await asyncio.wait_for(read_run(ws), STEP_TIMEOUT_S)
            res.change_s = time.perf_counter() - start
            res.error = problem(change)
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:160]
    return res


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the processes and their reaped children (fields 14-17 of stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15])
    return total / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def wave(url: str, pids: Sequence[int], n: int, mode: str, index: int) -> Wave:
    if mode == "same":
        query, batches = "", [2] * n
    else:
        query = f"seq={WAVE_SEQ[index % len(WAVE_SEQ)]}"
        batches = [BATCH_VALUES[i % len(BATCH_VALUES)] for i in range(n)]
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    results = await asyncio.gather(*(session(url, query, b) for b in batches))
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
    return Wave(n, mode, wall, cpu, [rss_mib(p) for p in pids], os.getloadavg()[0], list(results))


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(w: Wave) -> str:
    first = [r.first_s for r in w.results if r.first_s is not None]
    change = [r.change_s for r in w.results if r.change_s is not None]

    def ms(xs: list[float]) -> str:
        if not xs:
            return "-"
        return f"median {1000 * statistics.median(xs):6.0f} ms, p95 {1000 * pct(xs, 0.95):6.0f} ms"

    rss = " + ".join(f"{r:.0f}" for r in w.rss_mib)
    kinds = sorted({e.split(":")[0] for e in w.errors})
    per_run = 1000 * w.cpu_s / w.runs if w.runs else float("nan")
    return (
        f"{w.sessions:4d} sessions, {w.mode:8s}: first render {ms(first)}; "
        f"widget change {ms(change)}; errors {len(w.errors)}"
        f"{' (' + ', '.join(kinds) + ')' if kinds else ''}; "
        f"server CPU {per_run:5.1f} ms per script run ({w.runs} runs, {w.wall_s:.1f} s wall); "
        f"RSS {rss} MiB; load average {w.loadavg:.1f}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(port: int, extra_env: Mapping[str, str] | None = None) -> Iterator[int]:
    """`streamlit run app.py` on loopback (with `extra_env` added to its environment); yields
    its pid and stops it afterwards."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
         "--server.address=127.0.0.1", f"--server.port={port}", "--server.headless=true"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        health = f"http://127.0.0.1:{port}/_stcore/health"
        for _ in range(120):
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(health, timeout=2).read().strip() == b"ok":
                    break
            time.sleep(0.5)
        else:
            raise SystemExit("the server did not become healthy within 60 s")
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


async def run(url: str, pids: Sequence[int], sizes: Sequence[int], modes: Sequence[str]) -> None:
    # Imports and the first page, outside the measurement; behind a proxy each replica needs
    # its own, and the proxy picks them at random (8 per replica miss one with p < 1 %).
    for warm in await asyncio.gather(*(session(url, "", 2) for _ in range(8 * max(1, len(pids))))):
        if warm.error:
            raise SystemExit(f"warm-up session failed: {warm.error}")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {url}, "
          f"{len(pids)} server process(es)", flush=True)
    index = 0
    for mode in modes:
        for n in sizes:
            print(report(await wave(url, pids, n, mode, index)), flush=True)
            index += 1


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[10, 50, 100])
    ap.add_argument("--mode", choices=["same", "distinct"], action="append",
                    help="default: both")
    ap.add_argument("--url", help="ws://host:port/_stcore/stream of a running server "
                    "(loopback only); default: start one")
    ap.add_argument("--pid", type=int, action="append", default=[],
                    help="server process(es) to measure with --url")
    args = ap.parse_args(argv)
    # Stopped from outside: unwind, so that a server this client started is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if any(n < 1 or n > 500 for n in args.sessions):
        raise SystemExit("--sessions: each between 1 and 500")
    modes = args.mode or ["same", "distinct"]
    if args.url:
        url = args.url if args.url.endswith("/_stcore/stream") else (
            args.url.rstrip("/") + "/_stcore/stream")
        loopback_only(url)
        asyncio.run(run(url, args.pid, args.sessions, modes))
        return
    port = free_port()
    with served(port) as pid:
        asyncio.run(run(f"ws://127.0.0.1:{port}/_stcore/stream", [pid], args.sessions, modes))


if __name__ == "__main__":
    main()
