"""The RL policy step's own moments: the SFT step's, with TRL's log-prob code in place of HF's
cross-entropy head, and the no-grad log-prob forwards (old and reference) before it.

Read from the trace of TRL 1.9.0's own code on fake tensors (vram/trace/rl_step.py), per
micro-batch of N sequences, vocabulary V, logits of e bytes (2 for bf16 and mixed recipes,
whose LM head runs in bf16; 4 for an fp32 policy):

* GRPO / RLOO (`GRPOTrainer._compute_loss`): the model keeps K = C + 1 rows per sequence
  (`logits_to_keep + 1`), TRL drops the last and divides the C rows by the temperature *in
  place* (`logits.div_`, on a view). Forward peak, at the entropy: the logits (N·K·V·e), the
  per-row `log_softmax` outputs saved for backward (bf16 branch of `selective_log_softmax`;
  the fp32 branch saves nothing new), the copy `entropy_from_logits` makes of the
  non-contiguous view to flatten it (N > 1) and three 128-row chunk temporaries. Backward
  peak, at the in-place division's `CopySlices`: the incoming gradient and its copy, both
  N·K·V·e, and the view's clone and its quotient, both N·C·V·e.
* DPO (`DPOTrainer._compute_loss`): the whole sequence's logits (S rows) for chosen and
  rejected; the reference's logits stay alive until the loss returns. Forward peak, at the
  entropy metric: policy and reference logits (2·N·S·V·e), the saved `log_softmax` (bf16),
  the entropy's flattening copy and its chunk temporaries. Backward: the stacked per-row
  gradient and the slice's (2·N·S·V·e), and for fp32 the logits that `logsumexp` saved and the
  gather's scatter.
* The no-grad forwards (`_get_per_token_logps_and_entropies` without entropy): the logits and
  one row's `log_softmax`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.activations import plan as activation_plan
from vram.model.architecture import ModelSpec
from vram.result import Estimate, MomentId
from vram.rl.setup import OFFLINE, Reference, RLSetup
from vram.setup import Precision, TrainingSetup
from vram.stacks.profile import profile_for
from vram.units import BF16_BYTES, FP32_BYTES

#: Rows `entropy_from_logits` handles at once (trl/trainer/utils.py@v1.9.0, chunk_size=128);
#: each chunk's log_softmax, exp and product are alive together.
ENTROPY_CHUNK_ROWS = 128
ENTROPY_CHUNK_COPIES = 3


@dataclass(frozen=True)
class StepMoment:
    """One candidate peak of the policy step: activations (of which the logits' share) and
    the gradients alive."""

    label: MomentId
    activation_bytes: int
    logits_bytes: int
    gradient_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.gradient_bytes


def logit_element_bytes(setup: RLSetup) -> int:
    """bf16 logits unless the policy computes in fp32 (autocast runs the head in bf16)."""
    return FP32_BYTES if setup.policy.precision is Precision.FP32 else BF16_BYTES


def _rows(setup: RLSetup) -> tuple[int, int]:
    """(rows the model's head computes, rows with a log-prob) per sequence."""
    if setup.algo in OFFLINE:
        return setup.seq_len, setup.seq_len - 1
    return setup.completion_len + 1, setup.completion_len


def chunked_loss_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """Liger's chunked GRPO/DPO loss (not traced here): one sequence's logits at a time,
    6 B per element in bf16 (logits, log-softmax, gradient), 16 B in fp32."""
    per_element = 16 if logit_element_bytes(setup) == FP32_BYTES else 6
    return per_element * _rows(setup)[1] * model.vocab_size


def loss_forward_logits_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """The loss's forward peak over the logits (module docstring)."""
    if setup.chunked_loss:
        return chunked_loss_bytes(model, setup)
    n, v, e = setup.sequences_per_gpu, model.vocab_size, logit_element_bytes(setup)
    kept, rows = _rows(setup)
    bf16 = e == BF16_BYTES
    total = n * kept * v * e  # the policy's logits
    if setup.algo in OFFLINE and setup.effective_reference in (Reference.MODEL,
                                                              Reference.ADAPTER_OFF):
        total += n * kept * v * e  # the reference's, alive until the loss returns
    if bf16:
        total += n * rows * v * e  # log_softmax outputs saved for backward
    if n > 1:
        total += n * rows * v * e  # entropy_from_logits flattens a non-contiguous view
    return total + ENTROPY_CHUNK_COPIES * min(ENTROPY_CHUNK_ROWS, n * rows) * v * e


def loss_backward_logits_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """The loss's backward peak over the logits (module docstring)."""
    if setup.chunked_loss:
        return chunked_loss_bytes(model, setup)
    n, v, e = setup.sequences_per_gpu, model.vocab_size, logit_element_bytes(setup)
    kept, rows = _rows(setup)
    if setup.algo in OFFLINE:
        saved = 2 * n * kept * v * e if e == FP32_BYTES else 0  # logsumexp's input, scatter
        return n * rows * v * e + n * kept * v * e + saved
    return 2 * n * kept * v * e + 2 * n * rows * v * e  # CopySlices of the in-place div_


def no_grad_logits_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """A no-grad log-prob forward: the logits and one sequence's log_softmax (bf16)."""
    n, v, e = setup.sequences_per_gpu, model.vocab_size, logit_element_bytes(setup)
    kept, rows = _rows(setup)
    return n * kept * v * e + (rows * v * e if e == BF16_BYTES else 0)


def policy_moments(model: ModelSpec, setup: RLSetup, policy: TrainingSetup,
                   sft: Estimate) -> list[StepMoment]:
    """The SFT step's moments with the HF head's logits replaced by TRL's."""
    plan = activation_plan(model, policy, profile_for(policy))
    forward = loss_forward_logits_bytes(model, setup)
    backward = loss_backward_logits_bytes(model, setup)
    head = {MomentId.FORWARD_END: (plan.head_saved_bytes, forward),
            MomentId.OUTPUT_CAST: (plan.head_cast_bytes, forward),
            MomentId.LOSS: (plan.head_peak_bytes, backward),
            MomentId.TOP_LAYER_BACKWARD: (plan.head_kept_bytes, 0)}
    moments = []
    for m in sft.moments:
        # the head's own items live in these four moments; the others hold none of them
        sft_head, rl_logits = head.get(m.label, (0, 0))
        layers = max(m.activation_bytes - sft_head, 0)
        moments.append(StepMoment(m.label, layers + rl_logits, rl_logits, m.gradient_bytes))
    return moments


__all__ = ["StepMoment", "chunked_loss_bytes", "loss_backward_logits_bytes",
           "loss_forward_logits_bytes", "no_grad_logits_bytes", "policy_moments"]
