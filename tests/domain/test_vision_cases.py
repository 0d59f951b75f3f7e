"""The vision-language inputs as case-file columns (issue 22): `vram validate` reads them from
the project's case file of VLM runs (`benchmarks/vlm/cases.csv`), empty cells the defaults."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vram.io.knobs import KnobError
from vram.io.validate import report_lines, run_cases, setup_from_row

VLM = Path(__file__).resolve().parents[2] / "benchmarks" / "vlm"


def _rows() -> dict[str, dict[str, str]]:
    with (VLM / "cases.csv").open(newline="", encoding="utf-8") as handle:
        return {row["id"]: row for row in csv.DictReader(handle)}


def test_the_image_columns_reach_the_setup() -> None:
    setup = setup_from_row(_rows()["swift-vlm-01"])  # ms-swift ocr.sh: MAX_PIXELS=1003520
    assert (setup.images_per_sample, setup.max_pixels, setup.freeze_vision) == (1, 1_003_520, True)
    assert (setup.image_height, setup.image_width, setup.min_pixels) == (None, None, None)


def test_the_video_columns_reach_the_setup() -> None:
    setup = setup_from_row(_rows()["swift-vlm-02"])  # VIDEO_MAX_PIXELS=50176, 12 frames
    assert (setup.video_frames, setup.video_max_pixels, setup.freeze_vision) == (12, 50_176, False)
    assert setup.images_per_sample == 0


def test_the_columns_move_the_estimate() -> None:
    """Half the video frames: fewer tokens through the trained tower, a lower estimate."""
    row = _rows()["swift-vlm-02"]
    fewer = {**row, "video_frames": "6"}
    assert _predicted(fewer) < _predicted(row)


def _predicted(row: dict[str, str]) -> int:
    import vram

    model = vram.load_model(str(VLM / row["model"]))
    return vram.estimate(model, setup_from_row(row)).reserved_peak_bytes


@pytest.mark.parametrize(("cells", "column"), [
    ({"max_pixels": "0"}, "max_pixels"),
    ({"images_per_sample": "many"}, "images_per_sample"),
    ({"freeze_vision": "perhaps"}, "freeze_vision"),
])
def test_a_bad_vision_cell_names_its_column(cells: dict[str, str], column: str) -> None:
    with pytest.raises(KnobError) as info:
        setup_from_row({**_rows()["swift-vlm-01"], **cells})
    assert str(info.value).startswith(f"{column}: ")


def test_validate_reads_the_vlm_cases_as_recorded() -> None:
    """`vram validate benchmarks/vlm/cases.csv` is benchmarks/vlm/validation.txt (a lock)."""
    lines = report_lines(run_cases(VLM / "cases.csv"))
    assert "\n".join(lines) + "\n" == (VLM / "validation.txt").read_text(encoding="utf-8")
