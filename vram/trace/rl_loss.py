"""The GRPO log-prob and loss step on fake tensors, every live byte counted.

TRL's own code path, re-typed here because TRL is not a dependency (huggingface/trl@v1.9.0:
`selective_log_softmax` in trl/trainer/utils.py, the loss in GRPOTrainer `_compute_loss`):
the LM head projects the completion's hidden states, the logits are upcast to fp32 and divided
by the temperature, log-probs are gathered with a per-row logsumexp, and the clipped-ratio loss
with the k3 KL term (beta > 0) is averaged over tokens. The reference's log-probs come in
precomputed (its forward runs under no_grad before this step). Needs the `trace` extra.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossTrace:
    #: Live bytes at the step's peak, less what was alive before it (hidden states, head).
    peak_above_inputs_bytes: int
    #: The same, in the forward only (what TRL issue #3678 measured).
    forward_above_inputs_bytes: int
    #: sequences × completion × vocab: the logits' element count.
    logit_elements: int


def trace_grpo_loss(sequences: int, completion: int, hidden: int, vocab: int,
                    beta: float = 0.04, temperature: float = 1.0,
                    fp32_logits: bool = False) -> LossTrace:
    """Trace TRL's GRPO log-prob + loss forward and backward for one micro-batch.

    `fp32_logits`: the model computes in fp32 (or upcasts its logits); else the logits stay
    in bf16 and TRL takes its bf16 branch (a log-softmax per row, then gather)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vram.trace.tracker import StorageTracker

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = StorageTracker()
    with mode:
        states = torch.empty(sequences, completion, hidden, dtype=torch.bfloat16,
                             requires_grad=True)
        head = torch.empty(vocab, hidden, dtype=torch.bfloat16)
        ids = torch.randint(0, vocab, (sequences, completion))
        old = torch.empty(sequences, completion)
        ref = torch.empty(sequences, completion)
        adv = torch.empty(sequences)
        mask = torch.ones(sequences, completion)
        for t in (states, head, ids, old, ref, adv, mask):
            tracker.register(t, "input")
        before = tracker.live_bytes
        with tracker:
            tracker.recording = True
            tracker.set_phase("forward")
            logits = states @ head.T
            if fp32_logits:
                logits = logits.float()
            logits = logits / temperature
            if fp32_logits:
                selected = torch.gather(logits, dim=-1, index=ids.unsqueeze(-1)).squeeze(-1)
                lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
                logps = selected - lse
            else:
                logps = torch.stack([
                    torch.log_softmax(row, dim=-1).gather(-1, label.unsqueeze(-1)).squeeze(-1)
                    for row, label in zip(logits, ids, strict=True)]).float()
                selected = lse = logps
            ratio = torch.exp(logps - old)
            clipped = torch.clamp(ratio, 1 - 0.2, 1 + 0.2)
            loss_tok = -torch.min(ratio * adv.unsqueeze(1), clipped * adv.unsqueeze(1))
            if beta > 0:
                delta = ref - logps
                loss_tok = loss_tok + beta * (torch.exp(delta) - delta - 1)
            loss = (loss_tok * mask).sum() / mask.sum()
            del logits, selected, lse, logps, ratio, clipped, loss_tok
            tracker.set_phase("backward")
            with tracker.watching_backward(loss):
                loss.backward()
            del loss
            tracker.sample()
            tracker.recording = False
        peak = max(p.live for p in tracker.peaks.values())
        forward = max(p.live for k, p in tracker.peaks.items() if k[0] == "forward")
    return LossTrace(peak_above_inputs_bytes=peak - before,
                     forward_above_inputs_bytes=forward - before,
                     logit_elements=sequences * completion * vocab)
