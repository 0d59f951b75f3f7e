"""What FSDP2 (`fully_shard`) holds unsharded on each GPU, moment by moment.

FSDP2 as Accelerate applies it: one unit per decoder block and a root unit (the embedding,
final norm and head); with `fsdp_embedding_units` (torchtune's `custom_sharded_layers`,
torchtitan's `apply_fsdp`) the embedding and an untied head are units of their own and the
root keeps the final norm only. A unit's parameters are all-gathered before its forward and
its backward, into a flat all-gather buffer, then copied out into unsharded parameters; after
its backward its gradients (made in the all-gather dtype) are cast to the reduce dtype into a
reduce-scatter buffer and scattered to the shards. What that leaves alive (read in
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0, and measured by the exact
trace of rank 0, `vram.trace.sharded`):

* forward: the root unit stays unsharded for the whole step (the root never reshards after
  forward); a block's all-gather buffer is kept until the next block's copy-out (implicit
  prefetch: `wait_for_unshard` saves it in `all_gather_state`, #L417-L489), so while the next
  block is gathered three blocks' worth of 16-bit parameters are alive: the last buffer, the
  new buffer and its copy-out; with the root layout the last block's buffer stays through the
  head and the loss (both run inside the root's forward in Transformers' models) and is freed
  by the root's post-forward (_fsdp_state.py@v2.13.0 _post_forward #L333-L342);
* `reshard_after_forward=True` frees a block's unsharded parameters after its forward (`False`
  keeps every block's to its backward);
* backward: the block running is unsharded and the next one's all-gather is prefetched
  (`pre_backward` -> `_backward_prefetch`, #L576-L585); the previous block's reduce-scatter
  buffer stays until this block's post-backward (`reduce_scatter_states`, #L647-L658); the
  root's gradients (the head's) wait unsharded until the root's post-backward, at the end.
* with the embedding and head as units: the embedding is gathered for its forward (resharded
  after it) and again, prefetched by the first block, for its backward; the head is gathered
  after the blocks and again when the logits' gradient is made; its gradient is reduced right
  after its backward, and its reduce-scatter buffer waits for the top block's post-backward.
  Measured by the trace on untied models (`benchmarks/trace_grid_sharded_units.txt`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.model.architecture import ModelSpec
from vram.model.params import STORAGE_BYTES, ParamGroup
from vram.result import LineItem
from vram.setup import TrainingSetup
from vram.stacks.profile import StackProfile
from vram.stacks.resolve import resolve
from vram.units import BF16_BYTES, FP32_BYTES

#: Parameter groups in the root unit (`fully_shard(model)` after every block).
ROOT_KEYS = ("embedding", "embedding_extra", "head")
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
    #: The embedding and the untied head are units of their own (`fsdp_embedding_units`): the
    #: root unit holds nothing of size; these are their all-gathered sizes.
    embedding_unit: int = 0
    head_unit: int = 0
    #: The head unit's reduce-scatter buffer (reduce dtype), kept to the top block's
    #: post-backward.
    head_unit_reduce: int = 0

    @property
    def separate(self) -> bool:
        return bool(self.head_unit)


def reshards_after_forward(setup: TrainingSetup) -> bool:
    """`fully_shard(reshard_after_forward=...)` for the blocks: the setup's, else FSDP2's
    default True (_fully_shard.py@v2.13.0 fully_shard #L246-L260)."""
    return True if setup.fsdp_reshard_after_forward is None else setup.fsdp_reshard_after_forward


def embedding_units(model: ModelSpec, setup: TrainingSetup, groups: list[ParamGroup]) -> bool:
    """The embedding and the head are units of their own: the setup's or the stack's
    `fsdp_embedding_units`, with an untied head (a tied one shares the embedding's matrix and
    stays in the root with it: torchtune's tied models list no custom_sharded_layers)."""
    return (bool(resolve(setup).run.fsdp_embedding_units) and not model.tied_embeddings
            and any(g.key == "head" for g in groups))


def units(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
          groups: list[ParamGroup]) -> Fsdp2Units:
    """The unsharded sizes FSDP2 moves, from the run's parameter groups."""
    layers = max(1, model.n_layers)
    block = [g for g in groups if g.key in LAYER_KEYS]
    root = [g for g in groups if g.key in ROOT_KEYS]
    head = [g for g in root if g.key == "head" and g.trainable]
    per_block = {
        "block_params": sum(g.n_params * gather_bytes(g, profile) for g in block) // layers,
        "block_grads": sum(g.n_params * gather_bytes(g, profile) for g in block
                           if g.trainable) // layers,
        "block_reduce": sum(g.n_params * reduce_bytes(g, profile) for g in block
                            if g.trainable) // layers,
    }
    if embedding_units(model, setup, groups):
        heads = [g for g in root if g.key == "head"]
        return Fsdp2Units(
            **per_block,
            root_params=0, head_grad=0, n_layers=layers, reshards=reshards_after_forward(setup),
            embedding_unit=sum(g.n_params * gather_bytes(g, profile) for g in root
                               if g.key != "head"),
            head_unit=sum(g.n_params * gather_bytes(g, profile) for g in heads),
            head_unit_reduce=sum(g.n_params * reduce_bytes(g, profile) for g in head),
        )
    return Fsdp2Units(
        **per_block,
        root_params=sum(g.n_params * gather_bytes(g, profile) for g in root),
        head_grad=sum(g.n_params * gather_bytes(g, profile) for g in head),
        n_layers=layers, reshards=reshards_after_forward(setup),
    )


def tied_pending_bytes(model: ModelSpec, groups: list[ParamGroup],
                       profile: StackProfile) -> int:
    """A tied embedding's head gradient waits in autograd's input buffer unsharded, in the
    all-gather dtype (not a shard: the unsharded parameter is what autograd sees)."""
    embedding = next((g for g in groups if g.key == "embedding" and g.trainable), None)
    if embedding is None or not model.lm_head_tied:
        return 0
    return embedding.n_params * gather_bytes(embedding, profile)


def _item(key: str, label: str, formula: str, bytes_: int, source: str) -> LineItem:
    return LineItem(key=key, label=label, formula=formula, inputs={}, bytes=bytes_,
                    source=f"{SOURCE} {source}")


def _root(u: Fsdp2Units) -> list[LineItem]:
    if u.separate:  # the root keeps only the final norm
        return []
    return [_item("weights.fsdp2_root", "root unit unsharded (embedding, norm, head)",
                  "root params × all-gather bytes", u.root_params,
                  "lazy_init: the root does not reshard after forward")]


def _blocks(u: Fsdp2Units, count: int, why: str) -> LineItem:
    return _item("weights.fsdp2_blocks", f"{count} block(s) of parameters all-gathered ({why})",
                 f"{count} × one block's params × all-gather bytes", count * u.block_params,
                 "unshard / wait_for_unshard")


def _embedding_unit(u: Fsdp2Units, why: str) -> list[LineItem]:
    return [_item("weights.fsdp2_embedding", f"embedding unit all-gathered ({why})",
                  "vocab × hidden × all-gather bytes", u.embedding_unit,
                  "unshard / wait_for_unshard")]


def _head_unit(u: Fsdp2Units, count: int, why: str) -> list[LineItem]:
    return [_item("weights.fsdp2_head", f"head unit all-gathered ({why})",
                  f"{count} × vocab × hidden × all-gather bytes", count * u.head_unit,
                  "unshard / wait_for_unshard")]


def _kept_before(u: Fsdp2Units) -> list[LineItem]:
    """Without resharding, the units before the last block keep their parameters into
    backward: the earlier blocks, and the embedding unit."""
    if u.reshards:
        return []
    return [*(_embedding_unit(u, "kept to backward") if u.separate else [])]


def forward_gather(u: Fsdp2Units) -> list[LineItem]:
    """While the last block is all-gathered: the previous block's buffer (kept for overlap),
    the new buffer and its copy-out; without resharding every earlier block too."""
    kept = 0 if u.reshards else u.n_layers - 1
    return [*_root(u), *_kept_before(u),
            _blocks(u, 3 + kept, "last buffer, new buffer, copy-out"
                    + ("" if u.reshards else ", earlier blocks kept"))]


def forward_block(u: Fsdp2Units) -> list[LineItem]:
    """Inside a block's forward: its buffer and its parameters."""
    kept = 0 if u.reshards else u.n_layers - 1
    return [*_root(u), *_kept_before(u), _blocks(u, 2 + kept, "buffer and parameters")]


def _kept(u: Fsdp2Units) -> list[LineItem]:
    """Without resharding, every block's parameters are kept to its backward (with the head a
    unit of its own, the embedding unit too)."""
    if u.reshards:
        return []
    if u.separate:
        return [*_kept_before(u), _blocks(u, u.n_layers, "kept to backward")]
    return [_blocks(u, u.n_layers, "kept to backward")]


def forward_end(u: Fsdp2Units) -> list[LineItem]:
    """After the blocks, inside the root's forward (the head and the loss): the root, the last
    block's all-gather buffer (no later unit's copy-out freed it: #L429-L432), and without
    resharding every block. With a head unit: its parameters and its all-gather buffer (saved
    until the root's post-forward); the head's copy-out freed the last block's buffer."""
    if u.separate:
        return [*_root(u), *_kept(u), *_head_unit(u, 2, "parameters and buffer")]
    kept = 0 if u.reshards else u.n_layers
    return [*_root(u), _blocks(u, 1 + kept, "the last block's buffer"
                               + ("" if u.reshards else ", every block kept to backward"))]


def after_forward(u: Fsdp2Units) -> list[LineItem]:
    """After the root's forward returned (a stack casting the output): with the root layout
    its post-forward freed the last block's all-gather buffer (_fsdp_state.py@v2.13.0
    _post_forward #L333-L342); with a head unit, as at the end of the forward."""
    if u.separate:
        return forward_end(u)
    return [*_root(u), *_kept(u)]


def _head_grad(u: Fsdp2Units) -> list[LineItem]:
    if not u.head_grad:
        return []
    return [_item("gradients.fsdp2_head", "head gradient, unsharded until the root reduces",
                  "vocab × hidden × all-gather bytes", u.head_grad,
                  "post_backward runs for the root after every block")]


def loss_backward(u: Fsdp2Units) -> list[LineItem]:
    """The loss's backward: the root's pre-backward has prefetched the top block (its
    all-gather buffer; the copy-out waits for the block's own pre-backward); without
    resharding every block is still unsharded. With a head unit: one head matrix in flight
    when the logits' gradient is made (the trace: the head's all-gather buffer, its
    pre-backward hook firing on that gradient); without resharding its parameters and every
    earlier unit's kept, and the end of forward's second head matrix. The head's own
    backward, later, is below the loss's in every traced setup. With the root layout the
    root's post-forward has freed the last block's all-gather buffer (#L333-L342 of
    _fsdp_state.py), and the head's gradient is not made yet: the logits' gradient is at its
    largest before the head's backward runs."""
    if u.separate:
        if u.reshards:
            return _head_unit(u, 1, "its all-gather buffer")
        return [*_kept(u), *_head_unit(u, 2, "parameters kept and buffer")]
    if not u.reshards:
        return [*_root(u), *_kept(u)]
    return [*_root(u), _blocks(u, 1, "the top block's prefetch")]


def _building(u: Fsdp2Units) -> LineItem:
    return _item("gradients.fsdp2_block_grads", "the block's gradients, unsharded",
                 "one block's trained params × all-gather bytes", u.block_grads,
                 "post_backward reduces them after the block's backward")


def _reduce_buffer(u: Fsdp2Units) -> LineItem:
    return _item("gradients.fsdp2_reduce_scatter", "the previous block's reduce-scatter buffer",
                 "one block's trained params × reduce bytes", u.block_reduce,
                 "reduce_scatter_states keeps it to the next post_backward")


def _head_reduce_buffer(u: Fsdp2Units) -> list[LineItem]:
    if not u.head_unit_reduce:
        return []
    return [_item("gradients.fsdp2_head_reduce", "the head unit's reduce-scatter buffer",
                  "vocab × hidden × reduce bytes", u.head_unit_reduce,
                  "reduce_scatter_states keeps it to the next post_backward")]


def top_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The top block's backward: it and the prefetched next block (every block without
    resharding), its gradients being made; with a head unit, the head's reduce-scatter
    buffer until this block's post-backward."""
    if u.separate:
        blocks = _kept(u) if not u.reshards else [_blocks(u, 2, "this block and prefetch")]
        return [*blocks, _building(u), *_head_reduce_buffer(u)]
    if not u.reshards:
        return [*_root(u), *_kept(u), *_head_grad(u), _building(u)]
    return [*_root(u), _blocks(u, 2, "this block and prefetch"), *_head_grad(u),
            _building(u)]


def first_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The first block's backward: nothing left to prefetch (with an embedding unit: its
    all-gather buffer, prefetched), the second block's reduce-scatter buffer, its gradients
    being made."""
    prefetch = _embedding_unit(u, "prefetched") if u.separate else []
    return [*_root(u), _blocks(u, 1, "this block"), *prefetch, *_head_grad(u), _building(u),
            _reduce_buffer(u)]


def second_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The second block's backward (the root layout): it and the first block (prefetched by
    its pre-backward, `_backward_prefetch` #L576-L585; kept from the forward without
    resharding), its gradients being made, the third block's reduce-scatter buffer. One block
    more than the first block's backward, which has nothing left to prefetch."""
    return [*_root(u), _blocks(u, 2, "this block and the first, prefetched"), *_head_grad(u),
            _building(u), _reduce_buffer(u)]


def below_top_block_backward(u: Fsdp2Units) -> list[LineItem]:
    """The backward of the block below the top (the root layout): it and the next one down
    prefetched (without resharding every block but the top, resharded after its backward),
    its gradients being made, and the top block's reduce-scatter buffer (#L647-L658), which
    the top block's own backward does not have."""
    count = 2 if u.reshards else u.n_layers - 1
    return [*_root(u), _blocks(u, count, "this block and the next one down"
                               + ("" if u.reshards else ", every block below the top kept")),
            *_head_grad(u), _building(u), _reduce_buffer(u)]


def embedding_backward(u: Fsdp2Units) -> list[LineItem]:
    """The root's backward after every block (or the embedding unit's): the first block's
    reduce-scatter buffer."""
    own = _embedding_unit(u, "its backward") if u.separate else []
    return [*_root(u), *own, *_head_grad(u), _reduce_buffer(u)]
