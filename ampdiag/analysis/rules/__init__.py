"""Rule modules, one per concern.

Add a module here and list it in RULE_MODULES; each module documents its
thresholds in a module-level ``THRESHOLDS`` dict that the README's findings table reflects.
"""

RULE_MODULES: tuple[str, ...] = (
    "step_time",
    "timeline",
    "precision",
    "numerics",
    "weights",
    "memory",
    "accumulation",
    "autocast_speed",
    "distributed",
    "coverage",
    "fp8",
)
