"""Hub ids resolve offline to catalog entries; an unknown id asks for its config.json; the
optional Hub fetch reads JSON as data only and is off unless the host turns it on."""

from __future__ import annotations

import io
from typing import Any

import pytest

import vram
from vram.errors import ConfigError
from vram.model import catalog


@pytest.mark.parametrize(("hub_id", "name"), [
    ("meta-llama/Llama-3.1-8B", "Llama 3.1 8B"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama 3.1 8B Instruct"),
    ("NousResearch/Meta-Llama-3-8B", "Llama 3 8B"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5 7B Instruct"),
    ("Qwen/Qwen2.5-7B", "Qwen2.5 7B Instruct"),
    ("mistralai/Mistral-7B-v0.1", "Mistral 7B v0.1"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral 7B v0.3"),
    ("https://huggingface.co/meta-llama/Llama-3.2-1B", "Llama 3.2 1B"),
    ("META-LLAMA/llama-3.1-70b", "Llama 3.1 70B"),
])
def test_hub_ids_resolve_offline(hub_id: str, name: str) -> None:
    assert vram.load_model(hub_id).name == name


def test_every_catalog_entry_knows_its_hub_ids() -> None:
    repos = [entry.hf_repo for entry in vram.model_catalog()]
    for entry in vram.model_catalog():
        ids = catalog.ids_for(entry.slug)
        assert ids[0] == entry.hf_repo
        if repos.count(entry.hf_repo) > 1:  # a repository of example code, not a model id
            assert catalog.resolve_hub_id(entry.hf_repo) is None
            ids = ids[1:]
        assert all(catalog.resolve_hub_id(i) == entry.slug for i in ids)
    assert len(catalog.hub_ids()) >= 50


def test_unknown_hub_id_asks_for_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(catalog.HUB_FETCH_ENV, raising=False)

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("fetched without the host setting")

    monkeypatch.setattr(catalog.urllib.request, "urlopen", no_network)
    with pytest.raises(ConfigError, match=r"^model: 'acme/Widget-7B' is not in vram's catalog"):
        vram.load_model("acme/Widget-7B")
    with pytest.raises(ConfigError, match=r"config\.json"):
        vram.load_model("acme/Widget-7B")


class _Response(io.BytesIO):
    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()


def test_hub_fetch_is_data_only_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(catalog.HUB_FETCH_ENV, "1")
    config = (catalog.data_dir() / "models" / "llama-3.2-1b.json").read_bytes()
    seen: list[str] = []

    def fake_urlopen(request: Any, timeout: float) -> _Response:
        seen.append(request.full_url)
        return _Response(config)

    monkeypatch.setattr(catalog.urllib.request, "urlopen", fake_urlopen)
    model = vram.load_model("acme/Tiny-1B")
    assert model.name == "acme/Tiny-1B"
    assert seen == ["https://huggingface.co/acme/Tiny-1B/resolve/main/config.json"]

    monkeypatch.setattr(catalog.urllib.request, "urlopen",
                        lambda request, timeout: _Response(b" " * 2_000_000))
    with pytest.raises(ConfigError, match="too large"):
        vram.load_model("acme/Huge-1B")
