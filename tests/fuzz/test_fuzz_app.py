"""Fuzz every page's URL parameters and the calculator's upload with AppTest (a fixed seed):
no exception, nothing a person typed rendered as a link, image or HTML, within 5 s."""

from __future__ import annotations

import random

import pytest

from tests.fuzz.conftest import APP_RUNS, SEED
from tests.fuzz.surfaces import PAGES, run_upload, run_url, upload_bytes, url_query


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("n", range(APP_RUNS))
def test_url_parameters(page: str, n: int, warm_app: None) -> None:
    rng = random.Random(f"{SEED}-{page}-{n}")
    run_url(page, url_query(rng))


@pytest.mark.parametrize("n", range(2 * APP_RUNS))
def test_uploads(n: int, warm_app: None) -> None:
    kind, content = upload_bytes(random.Random(f"{SEED}-upload-{n}"))
    run_upload(content, what=(kind, content[:100]))
