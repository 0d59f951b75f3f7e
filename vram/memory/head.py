"""The model's head: the final norm, the logits and the loss, per token.

HF: logits (e·V) → `.float()` (4·V) → log_softmax kept (4·V); backward holds the kept
log-probabilities, their gradient and the logits' gradient at once (12·V bytes).
LitGPT: chunked head and chunked cross-entropy; torchtune: chunked loss upcast per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vram.model.params import head_targeted
from vram.model.spec import HeadKind, ModelSpec, NormKind
from vram.setup import Method, TrainingSetup
from vram.setup.liger import (
    LIGER_ADDMM_OUT_DTYPE,
    LIGER_ALIASES_GRAD,
    LIGER_FP32_PRODUCT,
    LIGER_NO_UPCAST,
    liger_release,
)
from vram.stacks.profile import StackProfile
from vram.stacks.resolve import torch_at_most
from vram.units import FP32_BYTES as FP32

#: torchtune's CEWithChunkedOutputLoss splits the output projection and loss in 8 chunks.
TORCHTUNE_CHUNKS = 8


@dataclass(frozen=True, slots=True)
class HeadActivations:
    """The final norm, the logits and the loss, per token."""

    #: Alive at the end of the forward (the head's output and what it keeps).
    saved_per_token: int
    #: The most alive while the loss runs forward and backward.
    loss_peak_per_token: int
    formula: str
    label: str
    #: Alive while the layers run their backward (None until `head_activations` sets it).
    kept_per_token: int | None = None
    #: Alive right after the training stack casts the model's output (0: no cast).
    cast_per_token: int = 0
    #: One of the unchunked loss's vocabulary-wide blocks (the upcast logits, their
    #: log-softmax), per token; 0 for chunked, fused and compiled losses.
    loss_block_per_token: int = 0
    #: The final norm's backward at its largest, per token (`final_norm_backward_per_token`).
    norm_backward_per_token: int = 0


def head_activations(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                     ) -> HeadActivations:
    """Logits and loss per token, and what of them the layers' backward still sees.

    Once the loss and the head have run their backward, their saved tensors are freed; what
    remains is the gradient of the last hidden state, and the logits themselves where the
    training loop still holds them (LitGPT). The trace showed HF's logits gone by then.
    """
    head = replace(_head_activations(model, setup, profile),
                   norm_backward_per_token=final_norm_backward_per_token(model, profile))
    if head.kept_per_token is not None:
        return head
    n = profile.precision
    grad_hidden = n.compute * model.hidden_size
    logits = n.compute * model.vocab_size if profile.keeps_logits else 0
    return replace(head, kept_per_token=grad_hidden + logits)


#: fp32 [tokens, H] tensors alive at the RMSNorm backward's largest: the input's fp32 copy
#: and five temporaries (see `final_norm_backward_per_token`).
RMS_NORM_BACKWARD_FP32_COPIES = 6


def final_norm_backward_per_token(model: ModelSpec, profile: StackProfile) -> int:
    """The final RMSNorm's backward, after the loss's and the head's: autograd runs
    `hidden.to(fp32)`, `pow(2).mean(-1)`, `* rsqrt(var + eps)` backwards
    (transformers/models/llama/modeling_llama.py@v5.24.0 LlamaRMSNorm.forward;
    torch/csrc/autograd/FunctionsManual.cpp@v2.13.0 pow_backward: `grad * 2 * self.pow(1)`).
    At its largest the saved fp32 input, the rsqrt branch's gradient (grad · rstd), the mean's
    expanded gradient, `self.pow(1)`, its doubling and their product are alive: six fp32
    [tokens, H] tensors (the trace, llama-3.2-1b and qwen2.5-0.5b, every method and precision);
    the head's input, output and their 16-bit gradients are freed by then. torchtune's
    RMSNorm is the same graph (torchtune/modules/rms_norm.py@v0.3.0). A LayerNorm's fused
    backward, or a compiled norm, holds none of these; T5's norm scales the 16-bit input by an
    fp32 rstd (modeling_t5.py T5LayerNorm), another graph, not traced: left out. Sequence
    parallel: 1 / tp of the tokens."""
    if model.head_kind is HeadKind.CLASSIFIER or profile.compiled or model.is_encoder_decoder:
        return 0
    if model.decoder.norm_kind is not NormKind.RMS or not profile.norm_keeps_fp32_input:
        return 0
    return RMS_NORM_BACKWARD_FP32_COPIES * FP32 * model.hidden_size // profile.seq_split


def _head_activations(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                      ) -> HeadActivations:
    """Logits and loss per token.

    HF: logits (e·V) → `.float()` (4·V) → log_softmax kept (4·V); backward holds the kept
    log-probabilities, their gradient and the logits' gradient at once (12·V bytes).
    LitGPT: chunked head and chunked cross-entropy in 16 bits: logits (2·V) and their
    log-softmax (2·V) alive, the gradients replace them chunk by chunk.
    torchtune's chunked loss upcasts per chunk: 16-bit logits + fp32 log-probabilities.
    """
    n = profile.precision
    vocab = model.vocab_size
    if model.head_kind is HeadKind.CLASSIFIER:
        return HeadActivations(saved_per_token=0, loss_peak_per_token=0,
                               formula="a few values per sequence",
                               label="classification head", kept_per_token=0)
    full = setup.method is Method.FULL
    # Under sequence parallel the final norm runs on the rank's s / tp tokens (`SequenceParallel`)
    # and the head's input is all-gathered whole (`ColwiseParallel(input_layouts=Shard(1))`:
    # torchtitan/models/llama3/infra/parallelize.py@v0.2.2 apply_tp; the trace at tp 8, 32k:
    # the gathered bf16 input and a 1/8 fp32 norm shard at the loss)
    norm = (FP32 + (n.compute if full else 0)) * model.hidden_size // profile.seq_split
    if full or (profile.quantizes_head and profile.quantized_linear_keeps_input):
        norm += n.compute * model.hidden_size  # the lm_head input
    elif head_targeted(setup):
        norm += (profile.adapter_bytes + 1) * model.hidden_size
    logits = (2 if n.autocast else n.compute) * vocab  # autocast: the head matmul is 16-bit
    if profile.fused_linear_loss and profile.fused_loss_is_cce:
        stored = n.weights if full else n.frozen_weights  # the head as stored
        return _cce_head(model, setup, norm, x=n.residual, e=2 if n.autocast else n.residual,
                         full=full, casts_head=n.autocast and not n.half_model and stored == FP32,
                         head_weight_bytes=stored if n.autocast else n.compute)
    if profile.fused_linear_loss:
        return _fused_linear_head(model, setup, norm, 2 if n.autocast else n.compute,
                                  x=n.residual, head_weight_bytes=(
                                      (n.weights if n.casts_weights else n.compute)
                                      if full else 0),
                                  casts_head=full and n.casts_weights,
                                  liger=liger_release(setup.liger_version),
                                  addmm_out_dtype=not torch_at_most(setup, (2, 7)))
    if profile.casts_output_to_fp32 and n.compute != FP32 and not profile.compiled_loss:
        return _fabric_head(norm, vocab, n.compute, setup, profile.chunked_loss)
    if profile.compiled_loss:
        # A compiled cross-entropy keeps the 16-bit logits and a logsumexp per token. Its
        # backward frees each chunk's logits as it writes that chunk's gradient, so chunked
        # losses peak at one extra chunk (torchtune: 8 chunks); unchunked at a full copy.
        saved = norm + logits + FP32
        extra = logits // TORCHTUNE_CHUNKS if profile.chunked_loss else logits
        return HeadActivations(saved, saved + extra, "16-bit logits + logsumexp (compiled)",
                               "logits and compiled cross-entropy")
    if profile.chunked_loss and not profile.upcasts_logits:
        saved = norm + 2 * logits
        return HeadActivations(saved, saved + logits // 4,
                               "16-bit logits + 16-bit log-softmax, in chunks",
                               "logits and chunked cross-entropy")
    if profile.chunked_loss:
        saved = norm + logits + FP32 * vocab
        return HeadActivations(saved, saved + logits,
                               "16-bit logits + fp32 log-softmax per chunk",
                               "logits and chunked fp32 cross-entropy")
    if model.final_softcap:
        norm += logits  # tanh(logits / cap) is kept for its backward (Gemma 2)
    # autocast runs cross_entropy (log_softmax) in fp32 whatever the stack does
    up = FP32 * vocab if profile.upcasts_logits or n.autocast else logits
    # The loss's forward still runs inside autocast (its cached casts alive): the 16-bit
    # logits, their fp32 copy and the log-softmax (the trace: 10 bytes per token and entry).
    loss_forward = norm + (logits if up != logits else 0) + 2 * up
    loss_peak = norm + 3 * up + (logits if profile.keeps_logits else 0)
    if profile.loss_parallel:
        # torch's loss_parallel log-softmax on vocabulary shards subtracts the max and then
        # the log-sum-exp (two fp32 shards, both alive), and its backward scatters the target
        # into a zeros_like shard beside exp's output: one more fp32 shard in each
        # (torch/distributed/tensor/parallel/loss.py@v2.13.0 `_log_softmax`,
        # `_nll_loss_and_log_softmax_backward`; traced: forward 3.5, backward 4 x 4·V/tp)
        loss_forward += up
        loss_peak += up
    return HeadActivations(loss_forward, max(loss_peak, loss_forward),
                           "logits (e·V) → fp32 (4·V) → log-softmax (4·V); backward 3 × 4·V",
                           "logits and cross-entropy (fp32)",
                           loss_block_per_token=up)


def _next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def _fused_linear_head(model: ModelSpec, setup: TrainingSetup, norm: int, e: int, *, x: int,
                       head_weight_bytes: int, casts_head: bool, liger: tuple[int, int, int],
                       addmm_out_dtype: bool) -> HeadActivations:
    """Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py@v0.3.0
    lines 15-140, called by liger_kernel/transformers/model/llama.py@v0.3.0 lines 101-109 on
    the shifted hidden states copied contiguous: x bytes per entry, the final norm's dtype).
    The head and the loss run on chunks of next_power_of_2(ceil(tokens / ceil(V / H))) tokens;
    the forward already builds the gradient of the hidden states (`grad_input`, x·H per token),
    an fp32 loss per token and, when the head trains, the head's whole gradient
    (`grad_weight = zeros_like(weight)`, the weight's dtype), all kept for backward.
    A chunk's worst moment follows the version (`vram.setup.liger`): `_chunk_bytes`. Under
    autocast over an fp32 head, `weight.t()` is a view and autocast caches only leaves' casts:
    each chunk's logits matmul casts the whole head afresh (the trace: llama-3.2-1b). Per
    token here: the fixed-size terms are spread over the micro-batch's tokens.
    """
    tokens = max(1, setup.micro_batch * setup.seq_len)
    vocab, hidden = model.vocab_size, model.hidden_size
    chunk_tokens = min(tokens, _next_power_of_2(-(-tokens // -(-vocab // hidden))))
    head_cast = vocab * hidden * 2 if casts_head else 0
    product = liger_head_product_bytes(vocab * hidden, e, head_weight_bytes, liger,
                                       addmm_out_dtype=addmm_out_dtype)
    chunk = -(-_chunk_bytes(chunk_tokens * vocab, e, head_cast, product, liger) // tokens)
    grad_weight = -(-(vocab * hidden * head_weight_bytes) // tokens)
    saved = norm + x * hidden + FP32 + grad_weight
    return HeadActivations(
        saved_per_token=saved,
        loss_peak_per_token=saved + x * hidden + chunk,
        kept_per_token=x * hidden,
        formula="grad of hidden (x·H) + fp32 loss (+ the head's gradient); in the loss the "
                "shifted hidden copy (x·H) and a chunk (by the Liger version)",
        label="fused linear cross-entropy (Liger)")


def _chunk_bytes(entries: int, e: int, head_cast: int, product: int,
                 liger: tuple[int, int, int]) -> int:
    """One chunk's worst moment, its c·V `entries` at e bytes. Up to v0.4.2 the previous
    chunk's gradient, this chunk's logits and their fp32 upcast, or three e-byte chunks
    (`logits_chunk * alpha`) (@v0.3.0 lines 63-117); v0.5.0-v0.5.2 no upcast, three e-byte
    chunks (@v0.5.0 lines 65-114); from v0.5.3 `grad_logits_chunk = logits_chunk` (@v0.5.3
    line 122): the previous chunk and this one, then this one beside the head's gradient
    product (`liger_head_product_bytes`)."""
    if liger < LIGER_NO_UPCAST:
        return entries * max(3 * e, 2 * e + FP32) + head_cast
    if liger < LIGER_ALIASES_GRAD:
        return entries * 3 * e + head_cast
    return max(2 * e * entries + head_cast, e * entries + product)


def liger_head_product_bytes(matrix: int, m: int, w: int, liger: tuple[int, int, int], *,
                             addmm_out_dtype: bool) -> int:
    """From v0.6.2 a trained head's gradient is accumulated per chunk as
    `grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()` (@v0.6.2 line 134,
    @v0.8.2 line 257): the V·H product in the chunk's m-byte dtype and its fp32 copy (none
    when it is already fp32). From v0.8.1 an fp32 `grad_weight` (w = 4) over 16-bit logits
    takes `addmm(..., out_dtype=torch.float32, out=grad_weight)` on PyTorch >= 2.8
    (@v0.8.2 lines 18, 243-256): nothing. Before v0.6.2 an in-place `addmm`: nothing."""
    if w == 0 or liger < LIGER_FP32_PRODUCT:
        return 0
    if liger >= LIGER_ADDMM_OUT_DTYPE and addmm_out_dtype and w == FP32 and m < FP32:
        return 0
    return matrix * (m + (FP32 if m != FP32 else 0))


def _cce_head(model: ModelSpec, setup: TrainingSetup, norm: int, *, x: int, e: int, full: bool,
              casts_head: bool, head_weight_bytes: int) -> HeadActivations:
    """Apple's Cut Cross-Entropy (cut_cross_entropy/cce.py@d42911f lines 48-235): no logits
    and no gradient in the forward. It saves the hidden states as the kernel reads them
    (e·H: a 16-bit copy under autocast over x-byte hidden states, else the norm's output
    itself, already counted for a trained head), the head (a 16-bit copy under autocast over
    an fp32 head), an fp32 logsumexp and an int64 index per token, and an fp32 mean logit per
    vocabulary entry (filter_eps="auto"). Its backward allocates `de = zeros_like(e)` and, for a
    trained head, `dc = zeros_like(c)`, each cast back to its input's dtype
    (cce_backward.py@d42911f lines 385-521). Fixed-size terms are spread over the tokens.
    """
    tokens = max(1, setup.micro_batch * setup.seq_len)
    vocab, hidden = model.vocab_size, model.hidden_size
    matrix = vocab * hidden
    e_copy = e != x
    c = 2 if casts_head else head_weight_bytes  # the head as the kernel reads it
    saved_hidden = e * hidden if e_copy or not full else 0
    head_copy = -(-(matrix * 2) // tokens) if casts_head else 0
    saved = norm + saved_hidden + head_copy + FP32 + 8 + -(-(vocab * FP32) // tokens)
    de = e * hidden + (x * hidden if e_copy else 0)
    dc = -(-(matrix * (c + (head_weight_bytes if casts_head else 0))) // tokens) if full else 0
    return HeadActivations(
        saved_per_token=saved, loss_peak_per_token=saved + de + dc, kept_per_token=x * hidden,
        formula="hidden (e·H) + fp32 logsumexp + int64 index; backward de (e·H) + dc (V·H)",
        label="fused linear cross-entropy (Cut Cross-Entropy)")


#: LitGPT's fine-tuning scripts run the lm_head on 128-token chunks (lm_head_chunk_size=128).
LITGPT_HEAD_CHUNK = 128


def _fabric_head(norm: int, vocab: int, e: int, setup: TrainingSetup,
                 chunked: bool) -> HeadActivations:
    """LitGPT under Lightning Fabric: `_FabricModule.forward` passes the model's output through
    the precision plugin's `convert_output`, which casts floating tensors to the default dtype
    (fp32) (lightning/fabric/wrappers.py; plugins/precision/half.py, bitsandbytes.py). The
    logits the loss sees are fp32 copies of the e-byte chunks, and the loss runs in fp32.

    Per token: at the head, the previous step's fp32 logits (the loop still holds them, unless
    that step was shorter: `longest_batch_repeats`) and the new e-byte chunks; right after
    the cast, the new fp32 copies too; in the loss, the fp32 logits and their fp32
    log-softmax, plus one chunk's nll gradient and log-softmax gradient; in the layers'
    backward, the fp32 logits the loop keeps.
    """
    new, f32 = e * vocab, FP32 * vocab
    s = setup.seq_len
    share = min(LITGPT_HEAD_CHUNK, s) / s if chunked else 1.0
    previous = f32 if setup.longest_batch_repeats else 0  # the loop still holds them
    at_head = norm + previous + new
    loss = norm + 2 * f32 + int(2 * f32 * share)
    return HeadActivations(
        saved_per_token=at_head, loss_peak_per_token=loss, kept_per_token=norm + f32,
        cast_per_token=at_head + f32,
        formula="e·V (new logits) + 4·V (previous step's) → 4·V cast; loss 2 × 4·V + a chunk",
        label="logits cast to fp32 by Fabric, chunked fp32 cross-entropy" if chunked
        else "logits cast to fp32 by Fabric, fp32 cross-entropy")


