"""What FSDP2 (`fully_shard`) holds unsharded on each GPU, moment by moment.

FSDP2 as torchtitan and torchtune apply it: one unit per decoder block and a root unit (the
embedding, final norm and head). A unit's parameters are all-gathered before its forward and
its backward, into a flat all-gather buffer, then copied out into unsharded parameters; after
its backward its gradients (made in the all-gather dtype) are cast to the reduce dtype into a
reduce-scatter buffer and scattered to the shards. What that leaves alive (read in
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0, and measured by the exact
trace of rank 0, `vram.trace.sharded`):

* forward: the root unit stays unsharded for the whole step (the root never reshards after
  forward); a block's all-gather buffer is kept until the next block's copy-out (implicit
  prefetch: `wait_for_unshard` saves it in `all_gather_state`, #L417-L489), so while the next
  block is gathered three blocks' worth of 16-bit parameters are alive: the last buffer, the
  new buffer and its copy-out; the last block's buffer stays through the head and the loss
  (both run inside the root's forward in Transformers' models) and is freed by the root's
  post-forward (_fsdp_state.py@v2.13.0 _post_forward #L333-L342);
* `reshard_after_forward=True` frees a block's unsharded parameters after its forward (`False`
  keeps every block's to its backward);
* backward: the block running is unsharded and the next one's all-gather is prefetched
  (`pre_backward` -> `_backward_prefetch`, #L576-L585); the previous block's reduce-scatter
  buffer stays until this block's post-backward (`reduce_scatter_states`, #L647-L658); the
  root's gradients (the head's) wait unsharded until the root's post-backward, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.architecture import ModelSpec
from vram.params import STORAGE_BYTES, ParamGroup
from vram.result import LineItem
from vram.setup import Framework, TrainingSetup
from vram.stack import StackProfile
from vram.units import BF16_BYTES, FP32_BYTES

#: Parameter groups in the root unit (`fully_shard(model)` after every block).
ROOT_KEYS = ("embedding", "embedding_extra", "head")
#: Stacks that shard the embedding and the head as units of their own, so the root holds
#: nothing across the step (not traced yet: they keep the ZeRO-3 rule of `vram.estimate`, two
#: gathered blocks, and DeepSpeed's 16-bit model with an fp32 master): torchtitan
#: (torchtitan/models/llama3/infra/parallelize.py@6404b93 apply_fsdp: tok_embeddings, each
#: block, [norm, output], then the model) and torchtune
#: (recipes/configs/llama3_1/70B_full.yaml@30b8519e8 custom_sharded_layers: tok_embeddings,
#: output). Accelerate's FSDP2 (the HF stacks) wraps the blocks and the model: the embedding
#: and head are the root's (accelerate/utils/fsdp_utils.py@v1.13.0 fsdp2_prepare_model).
SEPARATE_EMBEDDING_UNITS = frozenset({Framework.TORCHTITAN, Framework.TORCHTUNE})
#: Parameter groups spread over the blocks.
LAYER_KEYS = ("linears", "norms", "lora")
SOURCE = "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0"


def gather_bytes(group: ParamGroup, profile: StackProfile) -> int:
    """A parameter all-gathered: the policy's 16-bit `param_dtype` under a mixed recipe, else
    its own dtype (_fsdp_param.py@v2.13.0 init_dtype_attrs)."""
    if profile.precision.gathers_16bit:
        return BF16_BYTES
    return int(STORAGE_BYTES[group.storage])


def reduce_bytes(group: ParamGroup, profile: StackProfile) -> int:
    """A gradient in the reduce-scatter buffer: fp32 (`reduce_dtype`) under a mixed recipe,
    else the gradient's own dtype (_fsdp_collectives.py@v2.13.0 foreach_reduce)."""
    if profile.precision.gathers_16bit:
        return FP32_BYTES
    return gather_bytes(group, profile)


@dataclass(frozen=True, slots=True)
class Fsdp2Units:
    """One block's and the root's unsharded sizes, in bytes."""

    block_params: int  # one block's parameters, all-gathered
    block_grads: int  # one block's unsharded gradients (the all-gather dtype)
    block_reduce: int  # one block's reduce-scatter buffer (the reduce dtype)
    root_params: int  # the root unit's parameters, all-gathered, alive through the step
    head_grad: int  # an untied trained head's unsharded gradient, alive through backward
    n_layers: int
    reshards: bool  # reshard_after_forward


def reshards_after_forward(setup: TrainingSetup) -> bool:
    """`fully_shard(reshard_after_forward=...)` for the blocks: the setup's, else FSDP2's
    default True (_fully_shard.py@v2.13.0 fully_shard #L246-L260)."""
    return True if setup.fsdp_reshard_after_forward is None else setup.fsdp_reshard_after_forward


def units(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
          groups: list[ParamGroup]) -> Fsdp2Units:
    """The unsharded sizes FSDP2 moves, from the run's parameter groups."""
    layers = max(1, model.n_layers)
    block = [g for g in groups if g.key in LAYER_KEYS]
    root = [g for g in groups if g.key in ROOT_KEYS]
    head = [g for g in root if g.key == "head" and g.trainable]
    return Fsdp2Units(
        block_params=sum(g.n_params * gather_bytes(g, profile) for g in block) // layers,
        block_grads=sum(g.n_params * gather_bytes(g, profile) for g in block
                        if g.trainable) // layers,
        block_reduce=sum(g.n_params * reduce_bytes(g, profile) for g in block
                         if g.trainable) // layers,
        root_params=sum(g.n_params * gather_bytes(g, profile) for g in root),
        head_grad=sum(g.n_params * gather_bytes(g, profile) for g in head),
        n_layers=layers, reshards=reshards_after_forward(setup),
    )


def tied_pending_bytes(model: ModelSpec, groups: list[ParamGroup],
                       profile: StackProfile) -> int:
    """A tied embedding's head gradient waits in autograd's input buffer unsharded, in the
    all-gather dtype (not a shard: the unsharded parameter is what autograd sees)."""
    embedding = next((g for g in groups if g.key == "embedding" and g.trainable), None)
    if embedding is None or not model.tied_embeddings or model.head_kind.value != "lm":
        return 0
    return embedding.n_params * gather_bytes(embedding, profile)


def _item(key: str, label: str, formula: str, bytes_: int, source: str) -> LineItem:
    return LineItem(key=key, label=label, formula=formula, inputs={}, bytes=bytes_,
                    source=f"{SOURCE} {source}")


def _root(u: Fsdp2Units) -> LineItem:
    return _item("weights.fsdp2_root", "root unit unsharded (embedding, norm, head)",
                 "root params × all-gather bytes", u.root_params,
                 "lazy_init: the root does not reshard after forward")


def _blocks(u: Fsdp2Units, count: int, why: str) -> LineItem:
    return _item("weights.fsdp2_blocks", f"{count} block(s) of parameters all-gathered ({why})",
                 f"{count} × one block's params × all-gather bytes", count * u.block_params,
                 "unshard / wait_for_unshard")


def forward_gather(u: Fsdp2Units) -> list[LineItem]:
    """While the last block is all-gathered: the previous block's buffer (kept for overlap),
    the new buffer and its copy-out; without resharding every earlier block too."""
    kept = 0 if u.reshards else u.n_layers - 1
    return [_root(u), _blocks(u, 3 + kept, "last buffer, new buffer, copy-out"
                              + ("" if u.reshards else ", earlier blocks kept"))]


def forward_block(u: Fsdp2Units) -> list[LineItem]:
    """Inside a block's forward: its buffer and its parameters."""
    kept = 0 if u.reshards else u.n_layers - 1
    return [_root(u), _blocks(u, 2 + kept, "buffer and parameters")]


def _kept(u: Fsdp2Units) -> list[LineItem]:
    """Without resharding, every block's parameters are kept to its backward."""
    return [] if u.reshards else [_blocks(u, u.n_layers, "kept to backward")]


def forward_end(u: Fsdp2Units) -> list[LineItem]:
    """After the blocks, inside the root's forward (the head and the loss): the root, the last
    block's all-gather buffer (no later block's copy-out freed it: #L429-L432), and without
    resharding every block."""
    kept = 0 if u.reshards else u.n_layers
    return [_root(u), _blocks(u, 1 + kept, "the last block's buffer"
                              + ("" if u.reshards else ", every block kept to backward"))]


def after_forward(u: Fsdp2Units) -> list[LineItem]:
    """After the root's forward returned (a stack casting the output): its post-forward freed
    the last block's all-gather buffer (_fsdp_state.py@v2.13.0 _post_forward #L333-L342)."""
    return [_root(u), *_kept(u)]


def _head_grad(u: Fsdp2Units) -> list[LineItem]:
    if not u.head_grad:
        return []
    return [_item("gradients.fsdp2_head", "head gradient, unsharded until the root reduces",
                  "vocab × hidden × all-gather bytes", u.head_grad,
                  "post_backward runs for the root after every block")]


def loss_backward(u: Fsdp2Units) -> list[LineItem]:
    """The loss's backward: the root's post-forward has freed the last block's all-gather
    buffer (_fsdp_state.py@v2.13.0 #L333-L342); the root's pre-backward has prefetched the top
    block (its all-gather buffer; the copy-out waits for the block's own pre-backward);
    without resharding every block is still unsharded. The head's gradient is not made yet:
    the logits' gradient is at its largest before the head's backward runs."""
    if not u.reshards:
        return [_root(u), *_kept(u)]
    return [_root(u), _blocks(u, 1, "the top block's prefetch")]


def _building(u: Fsdp2Units) -> LineItem:
    return _item("gradients.fsdp2_block_grads", "the block's gradients, unsharded",
                 "one block's trained params × all-gather bytes", u.block_grads,
                 "post_backward reduces them after the block's backward")


def _reduce_buffer(u: Fsdp2Units) -> LineItem:
    return _item("gradients.fsdp2_reduce_scatter", "the previous block's reduce-scatter buffer",
                 "one block's trained params × reduce bytes", u.block_reduce,
                 "reduce_scatter_states keeps it to the next post_backward")


def top_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The top block's backward: it and the prefetched next block (every block without
    resharding), its gradients being made."""
    if not u.reshards:
        return [_root(u), *_kept(u), *_head_grad(u), _building(u)]
    return [_root(u), _blocks(u, 2, "this block and prefetch"), *_head_grad(u),
            _building(u)]


def first_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The first block's backward: nothing left to prefetch, the second block's reduce-scatter
    buffer, its gradients being made."""
    return [_root(u), _blocks(u, 1, "this block"), *_head_grad(u), _building(u),
            _reduce_buffer(u)]


def second_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The second block's backward: it and the first block (prefetched by its pre-backward,
    `_backward_prefetch` #L576-L585; kept from the forward without resharding), its gradients
    being made, the third block's reduce-scatter buffer. One block more than the first
    block's backward, which has nothing left to prefetch."""
    return [_root(u), _blocks(u, 2, "this block and the first, prefetched"), *_head_grad(u),
            _building(u), _reduce_buffer(u)]


def below_top_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The backward of the block below the top: it and the next one down prefetched (without
    resharding every block but the top, resharded after its backward), its gradients being
    made, and the top block's reduce-scatter buffer (#L647-L658), which the top block's own
    backward does not have."""
    count = 2 if u.reshards else u.n_layers - 1
    return [_root(u), _blocks(u, count, "this block and the next one down"
                              + ("" if u.reshards else ", every block below the top kept")),
            *_head_grad(u), _building(u), _reduce_buffer(u)]


def embedding_backward(u: Fsdp2Units) -> list[LineItem]:
    """The root's backward after every block: the first block's reduce-scatter buffer."""
    return [_root(u), *_head_grad(u), _reduce_buffer(u)]
