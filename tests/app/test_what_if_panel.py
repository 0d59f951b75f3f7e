"""The calculator's "What if a bucket were compressed?": the panel agrees with the CLI's
--compress to the byte, presets set the buckets, and what then fits one GPU is shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui import data, results
from ui.charts import format_bytes
from ui.text import shown

ROOT = Path(__file__).resolve().parents[2]


def _cli(*flags: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VRAM_GPUS_CSV", None)
    return subprocess.run([sys.executable, "-m", "vram", "estimate", *flags, "--json"],
                          capture_output=True, text=True, check=True, cwd=ROOT,
                          env=env).stdout


def test_the_apps_what_if_is_the_clis_to_the_byte() -> None:
    """`?method=full&compress=optimizer=4,activations=2` downloads exactly what
    `estimate --method full --compress optimizer=4 --compress activations=2 --json` prints."""
    state = {**data.registry().defaults(), "model": "llama-3.1-8b", "method": "full",
             "compress": "optimizer=4,activations=2"}
    app_text = results.download_json(state)
    cli = _cli("--model", "llama-3.1-8b", "--method", "full", "--compress", "optimizer=4",
               "--compress", "activations=2")
    assert cli == app_text
    what = json.loads(app_text)["what_if"]
    found = results.what_if_result(state)
    assert found is not None and what["device_peak_bytes"] == found.what.device_peak_bytes


def test_a_link_opens_the_panel_with_its_numbers(app: AppTest) -> None:
    app.query_params.update({"method": "full", "ckpt": "1",
                             "compress": "optimizer=4,activations=2"})
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.toggle(key="whatif").value is True
    state = {**data.registry().defaults(), "method": "full", "ckpt": True,
             "compress": "optimizer=4,activations=2"}
    found, limits = results.what_if_result(state), results.limits(state)
    assert found is not None and limits is not None
    values = {m.label: m.value for m in app.metric}
    assert values["Peak with compression"] == format_bytes(found.what.device_peak_bytes, "GB")
    # on the lesson's H100: 8B full does not fit as it is, with the optimizer ÷4 it does
    assert limits.micro_batch_before.value == 0 < limits.micro_batch.value
    assert values["Largest micro-batch"] == f"{limits.micro_batch.value:,}"
    assert app.select_slider(key="cmp_optimizer").value == 4.0
    assert app.query_params["compress"] in ("optimizer=4,activations=2",
                                            ["optimizer=4,activations=2"])


def test_a_preset_sets_its_bucket_and_names_its_paper(app: AppTest) -> None:
    app.query_params.update({"method": "full", "whatif": "1"})
    app.run()
    assert not [m for m in app.metric if m.label == "Peak with compression"]  # nothing yet
    app.pills(key="cmp_presets").set_value(["optimizer-8bit"]).run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["compress"].startswith("optimizer=3.93")
    text = " ".join(shown(m.value) for m in app.markdown)
    assert "arXiv:2110.02861" in text and "8-bit optimizer states" in text
    app.pills(key="cmp_presets").set_value([]).run()
    assert app.session_state["compress"] == ""


def test_closed_panel_computes_nothing(app: AppTest) -> None:
    app.run()
    assert app.toggle(key="whatif").value is False
    assert not [s for s in app.select_slider if s.key and s.key.startswith("cmp_")]
