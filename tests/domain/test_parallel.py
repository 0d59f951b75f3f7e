"""Tensor, pipeline and context parallel in the closed form (issue 23): the layout's rules,
each stack's support, one rank's slice of the model, the schedules' micro-batches in flight,
and the estimates held to the exact traces of the same setups (benchmarks/PARALLEL_NOTES.md).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from pydantic import ValidationError

from vram import TrainingSetup, estimate, load_model
from vram.errors import VramError
from vram.setup.layout import data_parallel, rank_seq_len, shard_group
from vram.sharding.pipeline import stage_model, stage_plans
from vram.sharding.tensor_parallel import tp_local
from vram.step.estimate import _rank_peak


def _error(**fields: object) -> str:
    with pytest.raises(ValidationError) as info:
        TrainingSetup(**fields)  # type: ignore[arg-type]
    return str(info.value.errors()[0]["msg"])


@pytest.mark.parametrize(("fields", "starts"), [
    ({"n_gpus": 8, "tp": 3}, "Value error, tp × pp × cp = 3 × 1 × 1 = 3 must divide gpus (8)"),
    ({"n_gpus": 8, "ep": 3, "sharding": "zero3"}, "Value error, ep: 3 must divide"),
    ({"cp_kind": "ring"}, "Value error, cp_kind:"),
    ({"sequence_parallel": True}, "Value error, sequence_parallel:"),
    ({"n_gpus": 2, "pp": 2, "pp_schedule": "interleaved"}, "Value error, pp_virtual:"),
    ({"pp_schedule": "1f1b"}, "Value error, pp_schedule:"),
    ({"n_gpus": 2, "cp": 2, "sharding": "zero3", "attention": "eager"}, "Value error, attention:"),
    ({"n_gpus": 2, "cp": 2, "sharding": "zero3", "seq_len": 1001}, "Value error, seq_len:"),
    ({"fp8": "rowwise"}, "Value error, fp8:"),  # the default method is QLoRA
])
def test_a_bad_layout_names_its_fields(fields: dict[str, object], starts: str) -> None:
    assert _error(**fields).startswith(starts)


def test_the_shard_group_is_data_times_context_parallel() -> None:
    run = TrainingSetup(n_gpus=64, tp=8, pp=4, sharding="zero3", method="full")
    assert (shard_group(run), data_parallel(run)) == (2, 2)
    cp = TrainingSetup(n_gpus=8, cp=8, sharding="zero3", seq_len=131072)
    assert (shard_group(cp), data_parallel(cp), rank_seq_len(cp)) == (8, 1, 16384)
    # tp x pp using every GPU: no data parallel, no sharding needed
    assert TrainingSetup(n_gpus=8, tp=8, method="full").sharding.value == "none"


@pytest.mark.parametrize(("fields", "message"), [
    ({"framework": "torchtune", "n_gpus": 2, "pp": 2, "method": "full"},
     "pp: torchtune runs no pipeline parallel"),
    ({"framework": "torchtitan", "n_gpus": 2, "cp": 2, "cp_kind": "ulysses",
      "sharding": "zero3", "method": "full"},
     "cp_kind: torchtitan runs ring context parallel, not ulysses"),
    ({"framework": "litgpt", "n_gpus": 2, "tp": 2, "method": "full"},
     "tp: litgpt runs no tensor parallel"),
    ({"framework": "torchtitan", "fp8": "te", "method": "full"},
     "fp8: torchtitan trains float8 with tensorwise, rowwise, not te"),
])
def test_a_stack_that_cannot_run_it_says_so(fields: dict[str, object], message: str) -> None:
    with pytest.raises(VramError, match=message):
        estimate(load_model("llama-3.1-8b"), TrainingSetup(**fields))  # type: ignore[arg-type]


def test_one_tensor_parallel_rank_holds_its_slice_of_every_matrix() -> None:
    """Llama 3.1 8B over 8 ranks: q/k/v/gate/up split by output, o/down by input, embedding
    and head by vocabulary, norms whole: the parameters one rank of torchtitan's layout has."""
    model = load_model("llama-3.1-8b")
    local = tp_local(model, 8)
    h, inter, vocab, layers = 4096, 14336, 128256, 32
    per_layer = (h * h * 2 + 2 * h * 1024 + 3 * h * inter) // 8 + 2 * h
    assert local.n_params == layers * per_layer + 2 * (vocab // 8) * h + h
    assert local.decoder.n_heads == 4 and local.decoder.n_kv_heads == 1


def test_tensor_parallel_needs_whole_heads() -> None:
    with pytest.raises(VramError, match="tp: 16 must divide the 32 query and 8 key/value"):
        estimate(load_model("llama-3.1-8b"), TrainingSetup(
            n_gpus=16, tp=16, method="full", framework="torchtitan"))


@pytest.mark.parametrize(("schedule", "virtual", "expected"), [
    ("gpipe", 1, [8, 8, 8, 8]),
    ("1f1b", 1, [4, 3, 2, 1]),
    # interleaved, 2 chunks per rank: ((4 - r - 1) * 2 + 4 + 1) chunk-forwards / 2
    ("interleaved", 2, [Fraction(11, 2), Fraction(9, 2), Fraction(7, 2), Fraction(5, 2)]),
])
def test_each_schedule_keeps_its_micro_batches_in_flight(schedule: str, virtual: int,
                                                         expected: list[Fraction]) -> None:
    run = TrainingSetup(n_gpus=4, pp=4, pp_schedule=schedule, pp_virtual=virtual,
                        grad_accum=8, method="full")
    plans = stage_plans(run, 32)
    assert [p.in_flight for p in plans] == expected
    assert [p.blocks for p in plans] == [8, 8, 8, 8]
    assert plans[0].first and plans[-1].last


def test_a_middle_stage_holds_neither_embedding_nor_head() -> None:
    model = load_model("llama-3.1-8b")
    run = TrainingSetup(n_gpus=4, pp=4, grad_accum=8, method="full")
    first, middle, _, last = (stage_model(model, p) for p in stage_plans(run, 32))
    block = model.decoder.params_per_layer
    assert middle.n_params == 8 * block
    assert first.n_params == 8 * block + 128256 * 4096
    assert last.n_params == 8 * block + 128256 * 4096 + 4096  # the head and the final norm


#: The exact traces (benchmarks/PARALLEL_NOTES.md, vram.trace.parallel / .pipeline).
CP_TRACE = 36_413_075_456  # Llama 3.1 8B LoRA, 131,072 tokens, cp 8 ring, FSDP2 over 8
PP_TRACES = {  # Llama 3.1 8B full, bf16, pp 4, 1F1B, 8 micro-batches, 2,048 tokens
    (0, True): 19_836_616_704, (3, True): 22_176_133_632,
    (0, False): 31_705_923_584, (3, False): 25_349_239_296,
}


def test_context_parallel_holds_a_ranks_tokens() -> None:
    run = TrainingSetup(
        method="lora", lora_rank=16, lora_targets="all-linear", precision="bf16-mixed",
        seq_len=131072, cp=8, grad_ckpt=True, framework="hf-trainer", sharding="zero3",
        fsdp_version=2, n_gpus=8, lora_base_16bit=False)
    peak = estimate(load_model("llama-3.1-8b"), run).allocated_peak_bytes
    assert abs(peak - CP_TRACE) / CP_TRACE < 0.01


@pytest.mark.parametrize(("rank", "ckpt"), list(PP_TRACES))
def test_each_pipeline_rank_agrees_with_its_trace(rank: int, ckpt: bool) -> None:
    model = load_model("llama-3.1-8b")
    run = TrainingSetup(method="full", precision="bf16-true", seq_len=2048, grad_ckpt=ckpt,
                        framework="torchtitan", n_gpus=4, pp=4, grad_accum=8)
    stage = stage_plans(run, model.n_layers)[rank]
    peak = _rank_peak(stage_model(model, stage), run, [], stage).allocated
    assert abs(peak - PP_TRACES[rank, ckpt]) / PP_TRACES[rank, ckpt] < 0.05


def test_the_estimate_names_the_peak_pipeline_rank() -> None:
    run = TrainingSetup(method="full", precision="bf16-true", seq_len=2048,
                        framework="torchtitan", n_gpus=4, pp=4, grad_accum=8)
    notes = estimate(load_model("llama-3.1-8b"), run).notes
    assert any(n.startswith("Pipeline rank 0 of 4 (the first stage") for n in notes)


def test_the_longest_context_grows_with_context_parallel() -> None:
    from vram.plan.context import max_context

    model = load_model("llama-3.1-8b")
    run = TrainingSetup(method="lora", lora_targets="all-linear", grad_ckpt=True)
    one, eight = (max_context(model, run, gpu="h100-sxm", count=n) for n in (1, 8))
    assert one.best.lever == "offload activations"
    cp = next(r for r in eight.rows if r.lever == "add CP")
    assert cp.max_seq_len > 7 * next(r for r in one.rows if r.lever == "as set").max_seq_len
    assert cp.peer_bytes > 0 and "torchtitan" in cp.stacks and "torchtune" not in cp.stacks
