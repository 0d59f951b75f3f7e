"""URL state: parsing, error messages that name the parameter, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ui import params
from vram.setup import TrainingSetup

VENDORS, SEGMENTS = ("AMD", "NVIDIA"), ("consumer", "datacenter", "workstation")
REG = params.registry(("llama-3.2-1b", "llama-3.1-8b"), "llama-3.1-8b",
                      gpu_vendors=VENDORS, gpu_segments=SEGMENTS)


def test_defaults_make_a_valid_setup() -> None:
    setup, errors = params.build_setup(REG.defaults())
    assert errors == [] and setup is not None
    assert setup.method.value == "qlora" and setup.micro_batch == 1 and setup.seq_len == 2048


def test_the_app_starts_from_the_library_defaults() -> None:
    """One source of defaults: the app's first view is `TrainingSetup()`, as the CLI's is."""
    setup, _ = params.build_setup(REG.defaults())
    assert setup == TrainingSetup()


def test_every_knob_is_a_control_with_a_url_key() -> None:
    """Each `TrainingSetup` field has an app key; each value the control offers survives the
    link (dump, then parse) and reaches the setup."""
    assert {knob.name for knob in params.KNOBS.values()} == set(TrainingSetup.model_fields)
    for key in params.KNOBS:
        param = REG[key]
        for option in params.options(key):
            value = [option] if key == "targets" else option  # a multiselect holds a list
            values, errors = params.parse_query(REG, {key: param.dump(value)})
            assert errors == [] and values[key] == value, (key, value)


def test_bad_parameters_are_named_and_ignored() -> None:
    values, errors = params.parse_query(
        REG, {"batch": "lots", "seq": "1000", "method": "magic", "zzz": "1", "ckpt": "1"}
    )
    assert values == {"ckpt": True}
    text = " ".join(errors)
    for key in ("parameter batch ", "parameter seq ", "parameter method ", "parameter zzz "):
        assert key in text
    assert "`" not in text  # messages are plain text: a backtick would show as it is


@pytest.mark.parametrize(("text", "message"), [
    ("9999", "9999 is outside 1 to 128"), ("256", "256 is outside 1 to 128"),
    ("0", "0 is outside 1 to 128"), ("lots", "'lots' is not a whole number")])
def test_one_range_per_url_key(text: str, message: str) -> None:
    """A batch past the library's bound and one past the control's get the same range, the
    control's: `batch=9999` and `batch=256` both say "1 to 128"."""
    _, errors = params.parse_query(REG, {"batch": text})
    assert len(errors) == 1 and message in errors[0], errors
    if text.isdigit():
        assert "4,096" not in errors[0]
    _, errors = params.parse_query(REG, {"seq": "99999999"})
    assert "is not one of: 128, 256," in errors[0]


def test_every_memory_knob_reaches_the_setup() -> None:
    """The controls beyond the sliders: accumulation, dropout, the longest-batch protocol,
    compile and the loss's compile land in the TrainingSetup, and a bad value names its
    parameter."""
    state = {**REG.defaults(), "method": "lora", "accum": 8, "dropout": 0.0, "once": True,
             "compile": True, "closs": False}
    setup, errors = params.build_setup(state)
    assert errors == [] and setup is not None
    assert (setup.grad_accum, setup.lora_dropout, setup.longest_batch_repeats,
            setup.compile, setup.compile_loss) == (8, 0.0, False, True, False)
    _, errors = params.parse_query(REG, {"accum": "3", "dropout": "0.5", "compile": "maybe",
                                         "closs": "lossy"})
    text = " ".join(errors)
    assert "parameter accum " in text and "parameter dropout " in text and "compile (" in text
    assert "closs (" in text


def test_gpu_page_filters_are_in_the_url() -> None:
    """A shared link keeps the GPU page's filters; an unknown vendor is named, not used."""
    state = {**REG.defaults(), "vendor": ["NVIDIA"], "segment": ["datacenter"], "fits": True}
    query = params.to_query(REG, state)
    assert (query["vendor"], query["segment"], query["fits"]) == ("NVIDIA", "datacenter", "1")
    values, errors = params.parse_query(REG, {"vendor": "NVIDIA,Acme"})
    assert values == {} and "parameter vendor " in " ".join(errors) and "Acme" in " ".join(errors)


def test_setup_errors_name_the_control() -> None:
    state = {**REG.defaults(), "gpus": 8, "shard": "none"}
    setup, errors = params.build_setup(state)
    assert setup is None
    assert any("Sharding (shard)" in e for e in errors)


def test_sharding_follows_the_gpu_count() -> None:
    assert params.sharding_for(8, "none") == "ddp"
    assert params.sharding_for(1, "zero2") == "none"
    assert params.sharding_for(1, "zero3") == "zero3"


states = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["llama-3.2-1b", "llama-3.1-8b"]),
        "method": st.sampled_from(["full", "lora", "qlora"]),
        "batch": st.sampled_from(params.options("batch")),
        "seq": st.sampled_from(params.options("seq")),
        "rank": st.sampled_from(params.options("rank")),
        "targets": st.sampled_from([["all-linear"], ["q_proj", "v_proj"]]),
        "ckpt": st.booleans(),
        "accum": st.sampled_from(params.options("accum")),
        "dropout": st.sampled_from(params.options("dropout")),
        "once": st.booleans(),
        "compile": st.sampled_from(params.options("compile")),
        "closs": st.sampled_from(params.options("closs")),
        "quant": st.sampled_from(params.options("quant")),
        "loss": st.sampled_from(params.options("loss")),
        "stack": st.sampled_from(params.options("stack")),
        "vendor": st.sampled_from([[], ["NVIDIA"], ["AMD", "NVIDIA"]]),
        "segment": st.sampled_from([[], ["datacenter"], ["consumer", "workstation"]]),
        "fits": st.booleans(),
        "unit": st.sampled_from(["GB", "GiB"]),
    }
)


@given(states)
def test_query_round_trip(state: dict[str, object]) -> None:
    full = {**REG.defaults(), **state}
    query = params.to_query(REG, full)
    parsed, errors = params.parse_query(REG, query)
    assert errors == []
    assert {**REG.defaults(), **parsed} == full


@given(st.lists(states, max_size=4))
def test_pins_round_trip(pins: list[dict[str, object]]) -> None:
    full = [{**REG.defaults(), **pin, "unit": "GB"} for pin in pins]
    texts = [params.dump_pin(REG, pin) for pin in full]
    parsed, errors = params.parse_pins(REG, texts, limit=4)
    assert errors == [] and parsed == full


def test_bad_pins_are_reported() -> None:
    pins, errors = params.parse_pins(REG, ["not json", '{"batch": "x"}', "{}"], limit=4)
    assert len(pins) == 1 and len(errors) == 2


@pytest.mark.parametrize(("query", "named"), [
    ({"pp": "2", "gpus": "8", "shard": "zero3"}, "Pipeline parallel (pp): hf-trainer runs no "
                                                 "pipeline parallel ("),
    ({"cp": "2", "gpus": "8", "shard": "zero1", "stack": "litgpt"},
     "Context parallel (cp): litgpt runs no context parallel ("),
    ({"ep": "2", "gpus": "8", "shard": "zero3"}, "Expert parallel (ep): hf-trainer runs no "
                                                 "expert parallel ("),
])
def test_a_layout_the_stack_does_not_run_is_a_setup_error(query: dict[str, str],
                                                          named: str) -> None:
    """`vram.estimate` refuses a parallel layout the stack does not run (vram.stacks.support);
    the app says so by the control, as for any bad setup, instead of its error box (issue 25:
    ?pp=2&gpus=8&shard=zero3 with the default stack raised on every page)."""
    state, errors = params.parse_query(REG, query)
    assert errors == []
    setup, errors = params.build_setup({**REG.defaults(), **state})
    assert setup is None and len(errors) == 1 and errors[0].startswith(named), errors
