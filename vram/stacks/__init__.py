"""Training stacks: each stack's cited defaults and behaviours (`STACKS`), the precision
policy, and every "the knob, else the stack's default" rule, resolved once per setup."""
