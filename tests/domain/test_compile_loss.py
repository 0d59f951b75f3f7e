"""What torch.compile covers: the model's layers (`compile`) and the loss (`compile_loss`).

torchtitan@9dec370 compiled the blocks and left the loss eager (train.py: `# loss_fn =
torch.compile(loss_fn)`); torchtitan@6404b93 compiles both (components/loss.py
`build_cross_entropy_loss`); torchtune@v0.3.0's recipes compile a chunked loss in place and drop
the compiled standard loss `training.compile_loss` returns, except the single-device LoRA
recipe; Transformers' model computes the loss in its compiled forward;
DeepSpeed's `engine.compile()` and LitGPT's pretrain.py compile the module, not a loss computed
outside it.
"""

from __future__ import annotations

import pytest

import vram
from vram import TrainingSetup
from vram.io.knobs import KnobError, setup_from_texts, setup_record
from vram.io.validate import setup_from_row
from vram.memory.head import head_activations
from vram.stacks.profile import profile_for

#: Llama 3.1 8B pre-training as torchtitan's December 2024 runs: full, bf16 autocast over
#: fp32 parameters, one GPU's 1 x 32,768 tokens, compiled blocks.
TITAN = dict(method="full", precision="bf16-mixed", micro_batch=1, seq_len=32768,
             grad_ckpt=True, framework="torchtitan", optimizer="adamw", compile=True)
V, H = 128256, 4096


def _compiled(**fields: object) -> tuple[bool, bool]:
    profile = profile_for(TrainingSetup.model_validate(fields))
    return profile.compiled, profile.compiled_loss


@pytest.mark.parametrize(("fields", "expected"), [
    ({"framework": "torchtitan", "compile": True}, (True, True)),      # 6404b93: both
    ({"framework": "torchtitan"}, (False, False)),                     # compile off: neither
    ({"framework": "torchtitan", "compile": True, "compile_loss": False}, (True, False)),
    ({"framework": "torchtitan", "compile_loss": True}, (False, True)),  # components ["loss"]
    ({"framework": "torchtune"}, (True, True)),                        # chunked: in place
    ({"framework": "torchtune", "loss": "standard"}, (True, False)),   # result dropped
    ({"framework": "torchtune", "loss": "standard", "method": "lora"}, (True, True)),
    ({"framework": "torchtune", "loss": "standard", "method": "lora", "n_gpus": 2,
      "sharding": "zero3"}, (True, False)),                            # lora_..._distributed
    ({"framework": "hf-trainer", "compile": True}, (True, True)),      # loss inside forward
    ({"framework": "axolotl", "compile": True}, (True, True)),         # HF's TrainingArguments
    ({"framework": "deepspeed", "compile": True}, (True, False)),      # engine.compile: module
    ({"framework": "litgpt", "compile": True}, (True, False)),         # pretrain.py: the model
])
def test_each_stack_compiles_what_it_compiles(fields: dict[str, object],
                                              expected: tuple[bool, bool]) -> None:
    assert _compiled(**{"method": "full", "optimizer": "adamw", "precision": "bf16-mixed",
                        **fields}) == expected


def test_a_compiled_model_with_an_eager_loss_keeps_the_fp32_loss_by_hand() -> None:
    """Per token at 8B (H 4,096, V 128,256), bf16 autocast: the final norm's fp32 input and
    bf16 output (6·H) and the head's bf16 input (2·H) = 8·H = 32,768 B. An eager loss: bf16
    logits (2·V) then `.float()` (4·V) and the log-softmax (4·V) in the forward, and in the
    backward three fp32 blocks (12·V). A compiled loss: bf16 logits + an fp32 logsumexp kept,
    one more copy of the logits in its backward."""
    model = vram.load_model("llama-3.1-8b")
    eager = TrainingSetup.model_validate({**TITAN, "compile_loss": False})
    head = head_activations(model, eager, profile_for(eager))
    assert head.saved_per_token == 32768 + 2 * V + 2 * 4 * V == 1_315_328
    assert head.loss_peak_per_token == 32768 + 3 * 4 * V == 1_571_840
    assert head.loss_block_per_token == 4 * V
    compiled = TrainingSetup.model_validate(TITAN)
    head = head_activations(model, compiled, profile_for(compiled))
    assert head.saved_per_token == 32768 + 2 * V + 4 == 289_284
    assert head.loss_peak_per_token == 32768 + 2 * V + 4 + 2 * V == 545_796


def test_the_layers_follow_the_model_and_not_the_loss() -> None:
    """Compiling only the loss leaves the layers' saved set as eager; compiling only the
    model leaves the loss as eager: the estimate's parts move apart."""
    model = vram.load_model("llama-3.1-8b")
    base = {**TITAN, "grad_ckpt": False, "seq_len": 2048, "compile": False}

    def activations(**fields: object) -> int:
        return vram.estimate(model, TrainingSetup.model_validate({**base, **fields})
                             ).activation_bytes_max

    eager = activations()
    assert activations(compile_loss=True) < eager  # the loss alone
    assert activations(compile=True, compile_loss=False) < eager  # the layers alone
    assert activations(compile=True) < min(activations(compile_loss=True),
                                           activations(compile=True, compile_loss=False))


def test_the_knob_round_trips_through_flag_column_and_record() -> None:
    def by_flag(texts: dict[str, str]) -> TrainingSetup:
        return setup_from_texts(texts, lambda knob: knob.flag, lambda knob: knob.flag)

    assert by_flag({"--compile-loss": "false"}).compile_loss is False
    assert by_flag({"--compile-loss": "auto"}).compile_loss is None
    row = {"method": "full", "framework": "torchtitan", "compile": "true",
           "compile_loss": "false"}
    setup = setup_from_row(row)
    assert (setup.compile, setup.compile_loss) == (True, False)
    assert setup_from_row({**row, "compile_loss": ""}).compile_loss is None
    record = setup_record(setup)
    assert (record["compile"], record["compile_loss"]) == (True, False)
    assert setup_record(setup_from_row({**row, "compile_loss": ""}))["compile_loss"] is True


@pytest.mark.parametrize("text", ["maybe", "2", "loss"])
def test_a_hostile_value_names_the_column_in_one_line(text: str) -> None:
    with pytest.raises(KnobError) as caught:
        setup_from_row({"method": "full", "compile_loss": text})
    message = str(caught.value)
    assert message.startswith("compile_loss: ") and "\n" not in message
    assert "true or false or auto" in message
