"""Rule modules, one per concern.

Add a module here and list it in RULE_MODULES; each module documents its
thresholds in a module-level ``THRESHOLDS`` record (a frozen dataclass ``Thresholds``) that the
findings reference (scripts/findings_reference.py) lists.
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
