"""A team on one server for weeks: thousands of distinct sessions, and the server's memory.

Each session is what `benchmarks/load.py` does (it reuses its client): a websocket to
``/_stcore/stream``, the page for a link, then one slider move. Here every session's link is
a state the server has not seen (a catalog model x method x sequence x optimizer; one in ten
a bare parameter count, a new model; one in twenty an uploaded config.json of its own, packed
into the link; one in ten with "Make it fit" open; one in ten with the what-if's buckets
compressed; one in ten sharded over 8 GPUs with tensor, pipeline or context parallel), and its
slider move is one more.
Sessions run a few at a time, as people come and go. After every ``--every`` sessions the
server's resident memory (VmRSS) is sampled; at the end, after ``--idle`` seconds with no
session, once more.

The summary: RSS at the end of the warm-up (the caches fill with the first few hundred
states), the lowest and highest sample after it, and the growth ``(highest - warm) / warm``;
the target is at most 10 % over 5,000 sessions (issue 25). ``--burst N`` then runs load.py's
two waves of N sessions at once on the soaked server (its report lines, and the highest RSS
while they run). ``--limit-mib`` checks the peak of both against a shipped memory limit with
25 % headroom (peak <= 0.75 x limit).

    nice -n 10 python benchmarks/soak.py --sessions 5000 --burst 100 --limit-mib 512
    python benchmarks/soak.py --sessions 200 --every 50 --warmup 100   # a quick look

Bounded like load.py: every wait has a timeout, loopback only, a server it starts it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import load
from ui import urlpack
from vram.model.catalog import model_catalog
from vram.paths import data_dir

METHODS = ("full", "lora", "qlora")
SEQS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
OPTIMIZERS = ("adamw", "adamw-8bit", "sgd", "lion")
#: One session in PLAN_EVERY opens "Make it fit"; one in SIZE_EVERY asks for a bare size;
#: one in UPLOAD_EVERY links an uploaded config.json.
PLAN_EVERY = 10
SIZE_EVERY = 10
UPLOAD_EVERY = 20
#: One session in WHAT_IF_EVERY opens the what-if with buckets compressed (its result and the
#: limits' searches are cached per state); one in PARALLEL_EVERY shards over 8 GPUs with tensor,
#: pipeline or context parallel.
WHAT_IF_EVERY = 10
PARALLEL_EVERY = 10
COMPRESS = ("optimizer=4", "weights=2,activations=4", "gradients=2")
PARALLEL = ("tp=2", "pp=2", "cp=2", "tp=4")


def uploaded_config(i: int) -> str:
    """A config.json no other session has (Llama 3.2 1B with its own layer count and MLP
    width), packed as the app packs an upload into its link."""
    config = json.loads((data_dir() / "models" / "llama-3.2-1b.json").read_text())
    config["num_hidden_layers"] = 1 + i % 32
    config["intermediate_size"] = 4096 + 16 * (i // 32)
    config["_name_or_path"] = f"soak/upload-{i}"
    return urlpack.pack(json.dumps(config))


def distinct_query(i: int, slugs: Sequence[str]) -> str:
    """The link of session `i`: a state no other session of the run asks for.

    Mixed radix over (model, method, sequence, optimizer): 77 x 3 x 8 x 4 = 7,392 states with
    the shipped catalog; a bare size (0.1 B + i M parameters) is new for every i.
    """
    n = len(slugs)
    slug = slugs[i % n]
    method = METHODS[(i // n) % len(METHODS)]
    seq = SEQS[(i // (n * len(METHODS))) % len(SEQS)]
    opt = OPTIMIZERS[(i // (n * len(METHODS) * len(SEQS))) % len(OPTIMIZERS)]
    if i % SIZE_EVERY == SIZE_EVERY - 1:
        model = f"model=params&size={0.1 + i / 1000:g}"
    elif i % UPLOAD_EVERY == 3:
        model = f"model=upload&config={uploaded_config(i)}"
    else:
        model = f"model={slug}"
    plan = "&plan=1" if i % PLAN_EVERY == PLAN_EVERY // 2 else ""
    if i % WHAT_IF_EVERY == 7:
        plan += f"&whatif=1&compress={COMPRESS[(i // WHAT_IF_EVERY) % len(COMPRESS)]}"
    if i % PARALLEL_EVERY == 1:
        plan += f"&gpus=8&shard=zero3&{PARALLEL[(i // PARALLEL_EVERY) % len(PARALLEL)]}"
    return f"{model}&method={method}&seq={seq}&opt={opt}{plan}"


def slider_value(i: int) -> int:
    """The micro-batch session `i` moves to (2..128), one more state of its own."""
    return 2 + (7 * i) % 127


@dataclass
class Sample:
    sessions: int
    elapsed_s: float
    rss_mib: float
    errors: int
    cpu_ms_per_run: float


@dataclass
class Soak:
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    idle_rss_mib: float | None = None
    #: The highest RSS during a burst of concurrent sessions after the soak (--burst).
    burst_peak_mib: float | None = None


async def _chunk(url: str, queries: Sequence[tuple[str, int]], concurrency: int,
                 ) -> list[load.SessionResult]:
    gate = asyncio.Semaphore(concurrency)

    async def one(query: str, batch: int) -> load.SessionResult:
        async with gate:
            return await load.session(url, query, batch)

    return list(await asyncio.gather(*(one(q, b) for q, b in queries)))


async def soak(url: str, pid: int, sessions: int, every: int, concurrency: int,
               idle_s: float, log: bool = True) -> Soak:
    slugs = [e.slug for e in model_catalog()]
    out = Soak()
    t0 = time.perf_counter()
    done = 0
    while done < sessions:
        todo = range(done, min(sessions, done + every))
        cpu0 = load.cpu_seconds([pid])
        results = await _chunk(url, [(distinct_query(i, slugs), slider_value(i)) for i in todo],
                               concurrency)
        cpu = load.cpu_seconds([pid]) - cpu0
        done = todo.stop
        out.errors += [r.error for r in results if r.error]
        runs = sum((r.first_s is not None) + (r.change_s is not None) for r in results)
        sample = Sample(done, time.perf_counter() - t0, load.rss_mib(pid), len(out.errors),
                        1000 * cpu / runs if runs else float("nan"))
        out.samples.append(sample)
        if log:
            print(f"{sample.sessions:6d} sessions {sample.elapsed_s:8.0f} s  RSS "
                  f"{sample.rss_mib:6.0f} MiB  errors {sample.errors}  server CPU "
                  f"{sample.cpu_ms_per_run:5.1f} ms/run", flush=True)
    if idle_s > 0:
        await asyncio.sleep(idle_s)
        out.idle_rss_mib = load.rss_mib(pid)
    return out


async def burst(url: str, pid: int, n: int) -> tuple[list[str], float, list[str]]:
    """`n` sessions at once, the same change then each its own (load.py's waves), on the
    soaked server: each wave's report line, the highest RSS sampled while they ran, and the
    sessions' errors."""
    peak = load.rss_mib(pid)
    running = True

    async def sample() -> None:
        nonlocal peak
        while running:
            peak = max(peak, load.rss_mib(pid))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    waves = [await load.wave(url, [pid], n, mode, index)
             for index, mode in enumerate(("same", "distinct"))]
    running = False
    await sampler
    return ([load.report(w) for w in waves], max(peak, load.rss_mib(pid)),
            [e for w in waves for e in w.errors])


@dataclass(frozen=True)
class Summary:
    warm_mib: float
    low_mib: float
    high_mib: float
    final_mib: float
    peak_mib: float

    @property
    def growth(self) -> float:
        """(highest after the warm-up - at its end) / at its end."""
        return (self.high_mib - self.warm_mib) / self.warm_mib


def summarize(samples: Sequence[Sample], warmup: int) -> Summary:
    """RSS at the last sample within the warm-up, and the extremes after it."""
    warm = [s for s in samples if s.sessions <= warmup] or list(samples[:1])
    after = [s for s in samples if s.sessions > warmup] or list(samples[-1:])
    return Summary(warm[-1].rss_mib, min(s.rss_mib for s in after),
                   max(s.rss_mib for s in after), samples[-1].rss_mib,
                   max(s.rss_mib for s in samples))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=5000)
    ap.add_argument("--every", type=int, default=250, help="sessions between RSS samples")
    ap.add_argument("--warmup", type=int, default=1000,
                    help="sessions that fill the caches before the flatness is judged")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds idle before the last RSS")
    ap.add_argument("--burst", type=int, default=0,
                    help="then N sessions at once (load.py's two waves), in the peak")
    ap.add_argument("--limit-mib", type=float, default=None,
                    help="a memory limit the peak must stay 25 %% under")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of a server this starts (e.g. MALLOC_ARENA_MAX=2)")
    ap.add_argument("--url", help="ws://host:port of a running server (loopback only)")
    ap.add_argument("--pid", type=int, help="its process id, with --url")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not 1 <= args.sessions <= 100_000 or not 1 <= args.every <= args.sessions:
        raise SystemExit("--sessions: 1 to 100000; --every: 1 to --sessions")
    if not 1 <= args.concurrency <= 100 or not 0 <= args.burst <= 500:
        raise SystemExit("--concurrency: 1 to 100; --burst: 0 to 500")
    env = dict(kv.split("=", 1) for kv in args.env)

    def run(url: str, pid: int) -> Soak:
        print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {url}, server pid "
              f"{pid}, {args.sessions} sessions, {args.concurrency} at a time"
              f"{', env ' + ' '.join(args.env) if args.env else ''}", flush=True)
        # The first page and the imports, before the first sample (as in load.py).
        asyncio.run(load.session(url, "", 2))
        print(f"     0 sessions        0 s  RSS {load.rss_mib(pid):6.0f} MiB  (started)",
              flush=True)
        result = asyncio.run(soak(url, pid, args.sessions, args.every, args.concurrency,
                                  args.idle))
        if args.burst:
            lines, result.burst_peak_mib, errors = asyncio.run(burst(url, pid, args.burst))
            result.errors += errors
            print("\n".join(lines), flush=True)
        return result

    if args.url:
        if args.pid is None:
            raise SystemExit("--url needs --pid")
        url = args.url.rstrip("/")
        url = url if url.endswith("/_stcore/stream") else url + "/_stcore/stream"
        load.loopback_only(url)
        result = run(url, args.pid)
    else:
        port = load.free_port()
        with load.served(port, env) as pid:
            result = run(f"ws://127.0.0.1:{port}/_stcore/stream", pid)
    s = summarize(result.samples, args.warmup)
    idle = f"; after {args.idle:.0f} s idle {result.idle_rss_mib:.0f} MiB" if (
        result.idle_rss_mib is not None) else ""
    peak = max(s.peak_mib, result.burst_peak_mib or 0.0)
    at_once = (f"; {args.burst} at once after it: peak {result.burst_peak_mib:.0f} MiB"
               if result.burst_peak_mib is not None else "")
    print(f"RSS at {args.warmup} sessions (warm) {s.warm_mib:.0f} MiB; after: low "
          f"{s.low_mib:.0f}, high {s.high_mib:.0f}, final {s.final_mib:.0f} MiB; growth "
          f"{100 * s.growth:+.1f} %; peak {s.peak_mib:.0f} MiB{idle}{at_once}; errors "
          f"{len(result.errors)}")
    failed = bool(result.errors) or s.growth > 0.10
    if args.limit_mib is not None:
        headroom = 1 - peak / args.limit_mib
        print(f"limit {args.limit_mib:.0f} MiB: headroom {100 * headroom:.0f} % (at least 25 %)")
        failed |= headroom < 0.25
    for kind in sorted({e.split(":")[0] for e in result.errors}):
        print(f"error: {kind} x{sum(e.startswith(kind) for e in result.errors)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
