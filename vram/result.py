"""What an estimate returns: buckets of bytes, each made of line items that show their work.

Every figure is bytes per GPU, an integer. The five buckets sum to `device_peak_bytes`:

    weights + gradients + optimizer + activations   = allocated_peak_bytes
    allocated_peak_bytes + allocator slack           = reserved_peak_bytes
    reserved_peak_bytes + CUDA context (+ NCCL)      = device_peak_bytes
    (overhead = slack + context)

A bucket holds what is alive *at the peak moment* of the step; `phase` says when that is.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import Annotated, Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from vram.setup import TrainingSetup

NonNegativeInt = Annotated[int, Field(ge=0)]
InputValue = int | float | str | bool

_Model = TypeVar("_Model", bound=BaseModel)


def _slot_setters() -> tuple[Any, Any, Any, Any] | None:
    """The setters of the slots pydantic's own `model_construct` fills (it bypasses frozen),
    through their descriptors (C calls, no attribute lookup by name); None where a pydantic
    release has moved them, and `_assembled` then calls the public `model_construct`."""
    slots = BaseModel.__dict__
    names = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__",
             "__pydantic_private__")
    if not all(hasattr(slots.get(name), "__set__") for name in names):
        return None
    set_dict, set_fields, set_extra, set_private = (slots[name].__set__ for name in names)
    return set_dict, set_fields, set_extra, set_private


_SETTERS = _slot_setters()


def _assembled(kind: type[_Model], fields: dict[str, object]) -> _Model:
    """An instance of `kind` from every field's value, without validation: what
    `model_construct` builds (`pydantic/main.py@v2.14.4` `BaseModel.model_construct`), without
    its per-field Python loop, which is slower than validating. Only for values `vram` computed
    itself, of the fields' exact types (the `assemble` methods below; a test compares them
    with validated instances); input from people is always validated."""
    if _SETTERS is None:
        return kind.model_construct(None, **fields)
    set_dict, set_fields_set, set_extra, set_private = _SETTERS
    instance = kind.__new__(kind)
    set_dict(instance, fields)
    # every field is given; one set per class can be shared: these models are frozen, and
    # pydantic copies the set before `model_copy(update=...)` adds to it
    set_fields_set(instance, _all_fields(kind))
    set_extra(instance, None)
    set_private(instance, None)
    return instance


@cache
def _all_fields(kind: type[BaseModel]) -> set[str]:
    return set(kind.model_fields)


def _refuse_negative(what: str, value: int) -> None:
    """The one check validation makes on computed bytes (`NonNegativeInt`), kept."""
    if value < 0:
        raise ValueError(f"{what}: bytes must be >= 0, got {value}")


class BucketName(StrEnum):
    WEIGHTS = "weights"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    OVERHEAD = "overhead"


BUCKET_ORDER: tuple[BucketName, ...] = tuple(BucketName)


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer step"


class MomentId(StrEnum):
    """The candidate peaks of a step (`vram.step.moments`); each value is the moment's label,
    which `MomentBytes.label` and every report show. Code keys on the member, never the text."""

    #: FSDP2: the last block all-gathered, the blocks before it saved.
    LAST_BLOCK_ALL_GATHER = "the last block's all-gather"
    LAST_LAYER_FORWARD = "the last layer's forward"
    FORWARD_END = "end of forward"
    #: Right after a stack casts the model's output to fp32 (Lightning Fabric).
    OUTPUT_CAST = "the output cast to fp32"
    LOSS = "the loss"
    #: The final RMSNorm's backward, after the loss's and the head's (its fp32 temporaries).
    FINAL_NORM_BACKWARD = "the final norm's backward"
    TOP_LAYER_BACKWARD = "the top layer's backward"
    #: FSDP2: the two ends of the run of middle blocks.
    BLOCK_BELOW_TOP_BACKWARD = "the block below the top's backward"
    SECOND_LAYER_BACKWARD = "the second layer's backward"
    FIRST_LAYER_BACKWARD = "the first layer's backward"
    #: A vision-language model's tower, after every language-model layer's backward.
    VISION_BACKWARD = "the vision tower's backward"
    EMBEDDING_BACKWARD = "the embedding's backward"
    OPTIMIZER_STEP = "the optimizer step"


class LineItem(BaseModel):
    """One term of a bucket: what it is, the formula, its inputs, and its bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    label: str
    formula: str
    inputs: dict[str, InputValue] = Field(default_factory=dict)
    bytes: NonNegativeInt
    source: str = ""
    note: str = ""

    @classmethod
    def assemble(cls, key: str, label: str, formula: str, inputs: dict[str, InputValue],
                 bytes: int, source: str = "", note: str = "") -> LineItem:
        """A `LineItem` of values the estimate computed (an estimate builds a dozen per call:
        validating them was a third of its time); `bytes` must be a non-negative int."""
        if bytes < 0:
            _refuse_negative(key, bytes)
        return _assembled(cls, {"key": key, "label": label, "formula": formula,
                                "inputs": inputs, "bytes": bytes, "source": source,
                                "note": note})



class Bucket(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: BucketName
    items: tuple[LineItem, ...] = ()

    @classmethod
    def assemble(cls, name: BucketName, items: tuple[LineItem, ...]) -> Bucket:
        """A `Bucket` of items built by `vram` (validated or `LineItem.assemble`d)."""
        return _assembled(cls, {"name": name, "items": items})

    @property
    def bytes(self) -> int:
        return sum(item.bytes for item in self.items)


class ParamCounts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    total: NonNegativeInt
    trainable: NonNegativeInt
    quantized: NonNegativeInt = 0


class InferenceEstimate(BaseModel):
    """Serving the same model: weights + KV cache for batch x sequence + working memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: tuple[LineItem, ...]

    @classmethod
    def assemble(cls, items: tuple[LineItem, ...]) -> InferenceEstimate:
        return _assembled(cls, {"items": items})

    @property
    def total_bytes(self) -> int:
        return sum(item.bytes for item in self.items)


class MomentBytes(BaseModel):
    """One candidate peak of the step: what the allocator holds at that moment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase
    label: MomentId
    allocated_bytes: NonNegativeInt
    gradient_bytes: NonNegativeInt
    activation_bytes: NonNegativeInt
    #: What FSDP2 holds unsharded at this moment (gathered parameters, unsharded gradients,
    #: reduce buffers; `vram.sharding.fsdp2`); in `allocated_bytes`, in neither of the two above.
    in_flight_bytes: NonNegativeInt = 0

    @classmethod
    def assemble(cls, phase: Phase, label: MomentId, allocated_bytes: int, gradient_bytes: int,
                 activation_bytes: int, in_flight_bytes: int) -> MomentBytes:
        """A `MomentBytes` of sums the estimate made (ints; each part checked >= 0)."""
        if gradient_bytes < 0 or activation_bytes < 0 or in_flight_bytes < 0:
            raise ValueError(f"{label}: bytes must be >= 0")
        return _assembled(cls, {"phase": phase, "label": label,
                                "allocated_bytes": allocated_bytes,
                                "gradient_bytes": gradient_bytes,
                                "activation_bytes": activation_bytes,
                                "in_flight_bytes": in_flight_bytes})



def figure_name(metric: str) -> str:
    """The figure a tool's metric reads: allocated, reserved or device (the active peak is
    the allocated figure: blocks in use, counted alike)."""
    if metric == "active":
        return "allocated"
    if metric in ("allocated", "reserved", "device"):
        return metric
    raise ValueError(
        f"metric: unknown {metric!r}; allowed: allocated, active, reserved, device")


class Band(NamedTuple):
    """The low and high bound of one figure (`vram.step.bounds`)."""

    low_bytes: int
    high_bytes: int


class Bounds(BaseModel):
    """Where each figure lies, at the rate the calibration measured on held-out runs
    (`vram.step.bounds`, `data/bounds.toml`): the measured figure falls in the band in about
    `rate` of runs. `allocated`, `reserved` and `device` give each figure's `Band`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate: float
    allocated_low_bytes: NonNegativeInt
    allocated_high_bytes: NonNegativeInt
    reserved_low_bytes: NonNegativeInt
    reserved_high_bytes: NonNegativeInt
    device_low_bytes: NonNegativeInt
    device_high_bytes: NonNegativeInt
    #: The CUDA context's share of the device band (below, above): dropped where the GPU's own
    #: context is known (`vram.gpus`).
    context_low_bytes: NonNegativeInt = 0
    context_high_bytes: NonNegativeInt = 0

    @classmethod
    def assemble(cls, rate: float, allocated_low_bytes: int, allocated_high_bytes: int,
                 reserved_low_bytes: int, reserved_high_bytes: int, device_low_bytes: int,
                 device_high_bytes: int, context_low_bytes: int,
                 context_high_bytes: int) -> Bounds:
        """Bounds `vram.step.bounds` computed (ints, 0 <= low <= high, checked there)."""
        return _assembled(cls, {
            "rate": rate, "allocated_low_bytes": allocated_low_bytes,
            "allocated_high_bytes": allocated_high_bytes,
            "reserved_low_bytes": reserved_low_bytes, "reserved_high_bytes": reserved_high_bytes,
            "device_low_bytes": device_low_bytes, "device_high_bytes": device_high_bytes,
            "context_low_bytes": context_low_bytes, "context_high_bytes": context_high_bytes})

    @property
    def allocated(self) -> Band:
        return Band(self.allocated_low_bytes, self.allocated_high_bytes)

    @property
    def reserved(self) -> Band:
        return Band(self.reserved_low_bytes, self.reserved_high_bytes)

    @property
    def device(self) -> Band:
        return Band(self.device_low_bytes, self.device_high_bytes)

    def band(self, metric: str) -> Band:
        """The band of the figure a tool reports: allocated (or active), reserved or device."""
        name = figure_name(metric)
        return Band(getattr(self, f"{name}_low_bytes"), getattr(self, f"{name}_high_bytes"))


class PeakBytes(BaseModel):
    """The peaks of one training step, per GPU, as `estimate` reports them, without the
    breakdown (`vram.estimate_peaks`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase
    allocated_peak_bytes: NonNegativeInt
    reserved_peak_bytes: NonNegativeInt
    device_peak_bytes: NonNegativeInt
    bounds: Bounds

    @classmethod
    def assemble(cls, *, phase: Phase, allocated_peak_bytes: int, reserved_peak_bytes: int,
                 device_peak_bytes: int, bounds: Bounds) -> PeakBytes:
        return _assembled(cls, {"phase": phase, "allocated_peak_bytes": allocated_peak_bytes,
                                "reserved_peak_bytes": reserved_peak_bytes,
                                "device_peak_bytes": device_peak_bytes, "bounds": bounds})


class VisionTokens(BaseModel):
    """A vision-language model's images and video in one sample, as its processor makes them
    (`vram.memory.vision`), and the vision side's share of the peak's activations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    images_per_sample: NonNegativeInt
    #: Each image (and video frame) before the processor, and after it (one tile's size for
    #: tiled processors).
    image_height: NonNegativeInt
    image_width: NonNegativeInt
    resized_height: NonNegativeInt = 0
    resized_width: NonNegativeInt = 0
    tiles_per_image: NonNegativeInt = 0
    #: Tokens the vision tower runs over for one image (every tile), and the language
    #: model's tokens for it.
    tower_tokens_per_image: NonNegativeInt = 0
    tokens_per_image: NonNegativeInt = 0
    video_frames: NonNegativeInt = 0
    video_tokens: NonNegativeInt = 0
    #: Image and video tokens of one sample; the rest of `seq_len` is text.
    image_tokens_per_sample: NonNegativeInt
    text_tokens_per_sample: NonNegativeInt
    #: At the peak: the vision tower's, projector's and pixel values' activations.
    vision_activation_bytes: NonNegativeInt = 0


class Estimate(BaseModel):
    """Per-GPU memory of one training step, by bucket, with the peaks tools would report."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str
    setup: TrainingSetup
    params: ParamCounts
    buckets: tuple[Bucket, ...]
    phase: Phase
    allocated_peak_bytes: NonNegativeInt
    reserved_peak_bytes: NonNegativeInt
    device_peak_bytes: NonNegativeInt
    #: The low and high bound of each of the three figures (`vram.step.bounds`).
    bounds: Bounds
    host_bytes: NonNegativeInt = 0
    paged_bytes: NonNegativeInt = 0
    #: Weights + every gradient + every optimizer state (paged included), per GPU: the model
    #: state of the step, whatever the moment of the peak.
    state_bytes: NonNegativeInt = 0
    inference: InferenceEstimate
    approximate: bool = False
    notes: tuple[str, ...] = ()
    #: Every candidate peak the estimate compared, in step order (the peak is the largest).
    moments: tuple[MomentBytes, ...] = ()
    #: A vision-language model's images (None without any).
    vision: VisionTokens | None = None

    @classmethod
    def assemble(cls, *, model_name: str, setup: TrainingSetup, params: ParamCounts,
                 buckets: tuple[Bucket, ...], phase: Phase, allocated_peak_bytes: int,
                 reserved_peak_bytes: int, device_peak_bytes: int, bounds: Bounds,
                 host_bytes: int, paged_bytes: int, state_bytes: int,
                 inference: InferenceEstimate,
                 approximate: bool, notes: tuple[str, ...],
                 moments: tuple[MomentBytes, ...], vision: VisionTokens | None = None,
                 ) -> Estimate:
        """An `Estimate` of parts `vram` built (a validated setup, `assemble`d or validated
        parts): validating it again re-ran the setup's own checks on every call."""
        return _assembled(cls, {
            "model_name": model_name, "setup": setup, "params": params, "buckets": buckets,
            "phase": phase, "allocated_peak_bytes": allocated_peak_bytes,
            "reserved_peak_bytes": reserved_peak_bytes, "device_peak_bytes": device_peak_bytes,
            "bounds": bounds, "host_bytes": host_bytes, "paged_bytes": paged_bytes,
            "state_bytes": state_bytes,
            "inference": inference, "approximate": approximate, "notes": notes,
            "moments": moments, "vision": vision})

    def bucket(self, name: BucketName | str) -> Bucket:
        wanted = BucketName(name)
        for bucket in self.buckets:
            if bucket.name is wanted:
                return bucket
        raise KeyError(wanted)

    @property
    def bucket_bytes(self) -> dict[str, int]:
        return {bucket.name.value: bucket.bytes for bucket in self.buckets}

    @property
    def gradient_bytes_total(self) -> int:
        """Every gradient at once (they all exist at the optimizer step), per GPU."""
        return max((m.gradient_bytes for m in self.moments), default=0)

    @property
    def activation_bytes_max(self) -> int:
        """The most the activation side holds at any moment of the step."""
        return max((m.activation_bytes for m in self.moments), default=0)

    @property
    def training_to_inference(self) -> float:
        """How many times more memory training needs than serving the same batch."""
        return self.device_peak_bytes / max(1, self.inference.total_bytes)

    def figure(self, metric: str) -> int:
        """The figure a given tool reports: allocated, active, reserved or device."""
        peak: int = getattr(self, f"{figure_name(metric)}_peak_bytes")
        return peak
