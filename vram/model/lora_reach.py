"""What LoRA adapts in one run: the nn.Linear modules its targets name, and the MoE expert banks.

Transformers 5 holds each expert bank as one 3-D parameter, not as nn.Linear modules, so
PEFT's `target_modules` never wraps it; `target_parameters` does (`ParamWrapper`: a rank-r
adapter per expert, peft/tuners/lora/layer.py@v0.21.2 `ParamWrapper.update_layer`). A run
reaches the banks two ways:

- the `lora_experts` knob: the banks a run names in `target_parameters` (axolotl's
  `lora_target_parameters`), at the run's rank;
- PEFT's own rewrite of transformers-4 names: for the model types transformers 5 fused
  (`ModelSpec.v4_expert_names`), targets that name the old expert projections become
  `target_parameters` (gate_proj + up_proj -> the fused gate_up bank at twice the rank,
  down_proj -> the down bank) and leave `target_modules`, so the model's other Linears of
  those names (dense layers, shared experts) lose their adapters; PEFT's 'all-linear' string
  names them all and the router too (peft/utils/transformers_weight_conversion.py@v0.21.2
  `_convert_peft_config_moe`, `_resolve_string_target_modules`). A stack that lists the
  model's nn.Linear names for 'all-linear' (`StackProfile.all_linear_by_module_name`) names
  the experts only where other Linears carry those names.

A stack whose experts are nn.Linear modules (LitGPT) reaches them through its targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Final, Literal

from vram.errors import VramError
from vram.model.spec import FUSED_PARTS, TARGET_ROLES, Linear, ModelSpec, Role, V4ExpertNames
from vram.setup import ALL_LINEAR, ExpertBanks, TrainingSetup
from vram.stacks.profile import StackProfile, runs_transformers_code


class _Every(Enum):
    LINEAR = "every Linear"


#: LoRA adapts every Linear of the decoder ('all-linear'); beside it, a set of roles (an empty
#: set: none at all).
EVERY_LINEAR: Final = _Every.LINEAR
#: What LoRA adapts: EVERY_LINEAR, or these roles.
Roles = frozenset[Role] | Literal[_Every.LINEAR]


def targeted_roles(setup: TrainingSetup) -> Roles:
    """The roles LoRA adapts: EVERY_LINEAR for 'all-linear', else the targets' roles."""
    if setup.lora_targets == ALL_LINEAR:
        return EVERY_LINEAR
    roles: set[Role] = set()
    for name in setup.lora_targets:
        roles |= TARGET_ROLES.get(name, frozenset())
    return frozenset(roles)


def is_targeted(linear: Linear, roles: Roles) -> bool:
    if linear.role is Role.ROUTER:
        return False
    if roles is EVERY_LINEAR:
        return True
    if linear.role in FUSED_PARTS:
        return bool(FUSED_PARTS[linear.role] & roles)
    return linear.role in roles


def is_bank_parameter(linear: Linear, profile: StackProfile) -> bool:
    """An MoE expert bank held as one 3-D parameter (Transformers 5), not nn.Linear modules:
    bitsandbytes' replacement of Linears passes it by (it stays in the frozen dense dtype), and
    PEFT's `target_modules` never wraps it (`vram.model.lora_reach`)."""
    return linear.is_bank and not profile.quantizes_expert_banks



#: The MLP roles whose transformers-4 names PEFT rewrites into the banks.
_MLP_ROLES = frozenset({Role.GATE, Role.UP, Role.DOWN})
#: The banks each `lora_experts` choice names (a non-gated expert's up bank is its first).
_KNOB_BANKS: dict[ExpertBanks, frozenset[Role]] = {
    ExpertBanks.NONE: frozenset(),
    ExpertBanks.GATE_UP: frozenset({Role.GATE_UP, Role.UP}),
    ExpertBanks.DOWN: frozenset({Role.DOWN}),
    ExpertBanks.ALL: frozenset({Role.GATE_UP, Role.UP, Role.DOWN}),
}
REWRITE_SOURCE = "peft/utils/transformers_weight_conversion.py@v0.21.2 _convert_peft_config_moe"


@dataclass(frozen=True, slots=True)
class LoraReach:
    """What LoRA adapts: nn.Linear modules by role, expert banks by role with the factor of the
    run's rank their adapters have, and whether the router's weight is adapted."""

    roles: Roles
    banks: Mapping[Role, int] = field(default_factory=lambda: MappingProxyType({}))
    router: bool = False
    #: PEFT rewrote targets that name the experts' transformers-4 projections into the banks.
    rewritten: bool = False


NO_LORA = LoraReach(frozenset())


def module_adapted(linear: Linear, reach: LoraReach, profile: StackProfile) -> bool:
    """Whether LoRA wraps this nn.Linear (a branch B·A·x beside it)."""
    return not is_bank_parameter(linear, profile) and is_targeted(linear, reach.roles)


def bank_rank_factor(linear: Linear, reach: LoraReach, profile: StackProfile) -> int:
    """The factor of the run's rank of this expert bank's adapter (0: not adapted)."""
    if not is_bank_parameter(linear, profile):
        return 0
    return reach.banks.get(linear.role, 0)


def _named_by_targets(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                      roles: Roles) -> tuple[frozenset[Role], bool]:
    """The MLP roles whose transformers-4 names reach PEFT, and whether the router's does."""
    if model.v4_expert_names is V4ExpertNames.NONE or not runs_transformers_code(profile):
        return frozenset(), False
    if roles is EVERY_LINEAR and not profile.all_linear_by_module_name:
        return _MLP_ROLES, True  # PEFT's 'all-linear' adds every v4 expert name
    if model.v4_expert_names is V4ExpertNames.W1_W3_W2:
        return frozenset(), False  # w1/w2/w3 are no target name vram reads, nor a v5 module's
    if roles is EVERY_LINEAR:  # the names of the model's other nn.Linear modules
        named = {ln.role for st in model.stacks for ln in st.linears
                 if not is_bank_parameter(ln, profile)}
        return frozenset(named) & _MLP_ROLES, False
    return roles & _MLP_ROLES, False


def lora_reach(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> LoraReach:
    """What LoRA adapts in this run (see the module docstring)."""
    if not setup.trains_adapters:
        return NO_LORA
    roles = targeted_roles(setup)
    named, router = _named_by_targets(model, setup, profile, roles)
    banks: dict[Role, int] = {}
    if named:
        if (Role.GATE in named) != (Role.UP in named):
            raise VramError("lora_targets: on this model PEFT turns gate_proj and up_proj into "
                            "one expert bank (gate_up_proj); target both or neither "
                            f"({REWRITE_SOURCE})")
        if Role.GATE in named:
            banks[Role.GATE_UP] = 2  # two adapters of rank r fused: rank 2r (rank_pattern)
        if Role.DOWN in named:
            banks[Role.DOWN] = 1
        # the names left target_modules: the model's other Linears of those names lose LoRA
        roles = (_every_role(model) if roles is EVERY_LINEAR else roles) - _MLP_ROLES
    for role in _KNOB_BANKS[setup.lora_experts]:
        banks.setdefault(role, 1)
    return LoraReach(roles, MappingProxyType(banks), router, rewritten=bool(named))


def _every_role(model: ModelSpec) -> frozenset[Role]:
    """Every role of the model's Linears, a fused projection's parts included."""
    roles = {ln.role for st in model.stacks for ln in st.linears}
    return frozenset(roles.union(*(FUSED_PARTS.get(role, frozenset()) for role in roles)))


def expert_lora_notes(model: ModelSpec, setup: TrainingSetup,
                      profile: StackProfile) -> tuple[str, ...]:
    """What a person should know about LoRA on this model's expert banks."""
    reach = lora_reach(model, setup, profile)
    notes = []
    if reach.rewritten:
        notes.append(
            "PEFT (>= 0.19, on transformers 5) turns LoRA targets that name this model's expert "
            "projections into LoRA on its expert banks: a rank-r adapter per expert (2r on the "
            "fused gate/up bank), and each forward a bank-sized adapted copy per layer; the "
            f"dense MLPs of those names lose their adapters ({REWRITE_SOURCE}).")
    if (reach.banks or reach.router) and setup.lora_dropout > 0:
        notes.append(
            "PEFT's LoRA on a parameter (ParamWrapper) refuses lora_dropout > 0 "
            "(peft/tuners/lora/layer.py@v0.21.2): run with --lora-dropout 0, or on a stack that "
            "drops it for the banks only (axolotl); estimated without dropout on the banks.")
    if setup.trains_adapters and setup.lora_experts is not ExpertBanks.NONE and not any(
            is_bank_parameter(ln, profile) for st in model.stacks for ln in st.linears):
        notes.append("lora_experts: this model has no expert banks; it adapts nothing more.")
    return tuple(notes)


def adapter_params_of(linear: Linear, rank: int, factor: int) -> int:
    """A bank's `ParamWrapper` adapter: lora_A `Linear(in, r·E)` and lora_B `Linear(r·E, out)`,
    r·E·(in + out) (peft/tuners/lora/layer.py@v0.21.2 `ParamWrapper.update_layer`)."""
    return rank * factor * linear.copies * (linear.d_in + linear.d_out)


def uses_rewrite(reach: LoraReach) -> bool:
    """PEFT rewrote (or the knob named) expert banks: ParamWrapper, which refuses dropout."""
    return bool(reach.banks) or reach.router
