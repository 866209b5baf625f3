"""The findings reference (docs/reference/findings.md), generated from the rule registry.

An MkDocs hook (mkdocs.yml ``hooks:``): the page holds the marker ``<!-- findings -->`` and
the build replaces it with one entry per registered rule and advisor -- its ids, severity,
what it measures (the rule's docstring), the thresholds it reads (each module's
``THRESHOLDS`` record's fields with the comment written above them) and its fix -- then every
module's thresholds in full. What the code holds is read from the code; only the severity
and the fix, which rules compute per run, are summarised here in ``NOTES``, and
tests/test_docs.py fails when a registered id has no note (or a note names no registered id).

Run it alone to print the generated Markdown: ``python scripts/findings_reference.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import textwrap
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MARKER = "<!-- findings -->"
PAGE = "reference/findings.md"
ROOT = Path(__file__).resolve().parent.parent

#: id -> (severity, fix): the two things a rule decides per run, summarised.
NOTES: dict[str, tuple[str, str]] = {
    "grad-scaler-config": (
        "medium when ≥ 5% of the steps are skipped at a scale no lower than the largest that "
        "held, after the scale grew again; high from 25%",
        "`torch.amp.GradScaler(device, init_scale=<held scale>, growth_interval=2000, "
        "growth_factor=2.0)`",
    ),
    "grads-not-zeroed": (
        "high when ≥ 2 backwards, and half of those checked, began on the last step's gradients",
        "`optimizer.zero_grad(set_to_none=True)` once per optimizer step",
    ),
    "dataloader-bound": (
        "medium ≥ 10%, high ≥ 30% (the interval's lower end); info when the interval straddles "
        "10% or only one step of ≥ 5% was profiled",
        "more `DataLoader` workers (`num_workers`), `pin_memory=True`, `persistent_workers=True`",
    ),
    "no-step-boundary": ("low", "mark the steps by hand: `d.step()` after each update"),
    "profiler-no-steps": (
        "info",
        "run more steps than `profile_skip + profile_warmup + 1`, or lower those settings",
    ),
    "straggler-rank": (
        "medium ≥ 25%, high ≥ 50% of the median step spent waiting for the late rank",
        "look at the late rank's own time: data loading, host work, its GPU",
    ),
    "redundant-allreduce": (
        "medium; high when the extra all-reduces are ≥ 20% of the step",
        "`with model.no_sync():` on all but the last micro-batch (Accelerate: `accumulate()`)",
    ),
    "fsdp-mixed-precision": ("info", "none: states FSDP2's `MixedPrecisionPolicy`"),
    "gpu-idle": (
        "medium ≥ 20%, high ≥ 50%",
        "feed the device: see `tune-input-pipeline` and `increase-batch-size`",
    ),
    "fp32-kernels-dominant": (
        "medium ≥ 50%, high ≥ 80%",
        "autocast to BF16/FP16 (or TF32 matmuls) in the device's terms",
    ),
    "launch-bound": (
        "medium / high (host wait ≥ 20% / ≥ 40% of the span)",
        "fewer, larger kernels: a larger batch, `torch.compile`, CUDA graphs",
    ),
    "comm-not-overlapped": (
        "medium / high (exposed ≥ 10% / ≥ 30% of the span)",
        "overlap communication: DDP bucket size, FSDP prefetch, fewer collectives",
    ),
    "fp32-ops-in-autocast": (
        "medium; high when FP32 FLOPs ≥ 30% (the op time share is stated, never a finding alone)",
        "run the named ops under autocast (no user casts to float32 inside the region)",
    ),
    "low-precision-inactive": (
        "high (low when the run diverged for a reason no precision fixes)",
        "enter autocast around the forward so matmuls and convolutions run in BF16/FP16",
    ),
    "amp-off": ("info", "autocast in the precision the device runs, if FP32 was not deliberate"),
    "fp16-grad-underflow": (
        "medium ≥ 5%, high ≥ 20%",
        "a GradScaler at the recommended `init_scale`; BF16 when no scale reaches 1%",
    ),
    "grad-scaler-missing": ("high", "`scaler = torch.amp.GradScaler(device)` around the step"),
    "grad-scaler-disabled": ("high", "enable the GradScaler (`enabled=True`), or use BF16"),
    "loss-scale-collapse": (
        "high < 1, medium ≤ 2^-10 × the initial scale",
        "find the overflow (`nonfinite-origin`), or use BF16",
    ),
    "skipped-steps": (
        "low any, medium ≥ 5%, high ≥ 25% of steps",
        "a GradScaler `init_scale` and `growth_interval` that settle, or BF16",
    ),
    "activation-overflow": (
        "high ≥ 65504 in an FP16 run, low ≥ 16376; info what-if in a BF16/FP32 run",
        "keep the named module in FP32, or use BF16",
    ),
    "nonfinite-origin": (
        "high (forward, loss) / medium (backward)",
        "fix the named module's computation at the named step (or BF16 where it is an FP16 "
        "overflow FP32 holds)",
    ),
    "clip-before-unscale": (
        "high",
        "`scaler.unscale_(optimizer)` before `clip_grad_norm_`",
    ),
    "scaler-step-bypassed": ("high", "`scaler.step(optimizer)` instead of `optimizer.step()`"),
    "low-precision-params": (
        "high ≥ 25%, medium ≥ 5%, low below (medium when unmeasured)",
        "FP32 weights under autocast, or FP32 master copies in the optimizer",
    ),
    "grad-accumulation-broken": (
        "high",
        "`optimizer.zero_grad()` once per optimizer step, not per micro-batch",
    ),
    "accumulation-loss-not-averaged": ("medium", "`(loss / accumulation_steps).backward()`"),
    "memory-near-capacity": (
        "medium ≥ 85%, high ≥ 95%",
        "smaller micro-batch with accumulation, activation checkpointing, autocast",
    ),
    "use-grad-accumulation": (
        "medium (or the memory finding's)",
        "the micro-batch and accumulation steps that fit the target batch, as code",
    ),
    "no-micro-batch-fits": (
        "high",
        "reduce what does not scale with the batch: model state first (sharding, 8-bit "
        "optimizer state)",
    ),
    "amp-memory-not-reduced": (
        "low",
        "model state dominates: shard it or keep optimizer state lower; autocast alone will not",
    ),
    "allocator-fragmentation": (
        "medium",
        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`",
    ),
    "out-of-memory": ("high", "what held the memory, then the memory fixes above"),
    "autocast-slower": (
        "medium ≥ 1.10x (lower end of the interval), never high; info when it straddles "
        "1.10x or the A/B timed the run's precision as fast as the fastest",
        "the precision the A/B measured fastest and safe",
    ),
    "nothing-measured": ("high", "train at least one step inside the block (`--fail-on` fails)"),
    "fp8-readiness": ("info", "torchao's `module_filter_fn` listing the FP8-safe layers"),
    "diverged": (
        "high",
        "from the cause the FP32/BF16 replay measured: precision advice only when precision "
        "caused it, else the learning rate or the batch",
    ),
    "stalled": ("high", "the same cause-based fix as `diverged`"),
    "prefer-bf16": (
        "worst of merged; own: medium ≥ 1.1x at the speed-up's lower end (never high on speed)",
        "the training step in BF16, in the run's framework's terms",
    ),
    "prefer-fp32": ("as `prefer-bf16`", "the training step in FP32 (TF32 matmuls on CUDA)"),
    "prefer-fp16": ("as `prefer-bf16`", "the training step in FP16 with a GradScaler"),
    "tune-grad-scaler": (
        "worst of merged",
        "`GradScaler(init_scale=..., growth_interval=...)` from the measured underflow and skips",
    ),
    "tune-input-pipeline": ("worst of merged", "`num_workers` = ceil(data / compute) + 1"),
    "increase-batch-size": ("worst of merged", "a batch multiplier to reach 10% idle, ≤ 8x"),
}


def _threshold_tables() -> dict[str, dict[str, tuple[Any, str]]]:
    """Every module-level ``THRESHOLDS`` in the package: module -> key -> (value, comment)."""
    tables: dict[str, dict[str, tuple[Any, str]]] = {}
    for path in sorted((ROOT / "ampdiag").rglob("*.py")):
        source = path.read_text()
        if "\nTHRESHOLDS" not in source:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        record = getattr(importlib.import_module(name), "THRESHOLDS", None)
        values = dataclasses.asdict(record) if dataclasses.is_dataclass(record) else None
        if not values:
            continue
        comments = _comments_above_fields(source)
        tables[name] = {k: (v, comments.get(k, "")) for k, v in values.items()}
    return tables


def _comments_above_fields(source: str) -> dict[str, str]:
    """The comment lines written right above each field of the module's `Thresholds` record."""
    node = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Thresholds"
    )
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    for field in node.body:
        if not isinstance(field, ast.AnnAssign) or not isinstance(field.target, ast.Name):
            continue
        lines, line = [], field.lineno - 1
        while line in comments:
            lines.insert(0, comments[line])
            line -= 1
        out[field.target.id] = " ".join(lines)
    return out


def _keys_read(func: Callable[..., Any]) -> list[str]:
    """The thresholds a function reads by name (``THRESHOLDS.name``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    keys = []
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "THRESHOLDS"
            and n.attr not in keys
        ):
            keys.append(n.attr)
    return keys


def _value(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1024:
        return f"{int(v):,}"
    return repr(v)


def entries() -> Iterator[tuple[str, tuple[str, ...], str, Callable[..., Any]]]:
    """(kind, ids, doc, function) for every registered rule, then every advisor."""
    from ampdiag.analysis.advisors import advisors
    from ampdiag.analysis.registry import rules

    for r in rules():
        yield "rule", r.ids, r.doc, r.func
    for a in advisors():
        yield "advisor", a.ids, a.doc, a.func


def registered_ids() -> set[str]:
    """Every finding id a registered rule or advisor may emit, and the registry's own."""
    return {i for _, ids, _, _ in entries() for i in ids} | {"analysis-error"}


def generate() -> str:
    """The reference's Markdown: one entry per registered rule and advisor, then every table."""
    tables = _threshold_tables()
    out: list[str] = []
    for kind, ids, doc, func in entries():
        module = func.__module__
        out.append(f"### {', '.join(f'`{i}`' for i in ids)}\n")
        out.append(f"*{kind}* `{module.removeprefix('ampdiag.')}.{func.__name__}`\n")
        for i in ids:
            severity, fix = NOTES.get(i, ("(undocumented)", "(undocumented)"))
            label = f"`{i}` " if len(ids) > 1 else ""
            out.append(f"- {label}**severity:** {severity}; **fix:** {fix}")
        out.append("")
        out.append(inspect.cleandoc(doc) + "\n")
        keys = _keys_read(func)
        table = tables.get(module, {})
        read = [k for k in keys if k in table]
        if read:
            out.append("| threshold | value | meaning |\n|---|---|---|")
            for k in read:
                value, comment = table[k]
                out.append(f"| `{k}` | {_value(value)} | {comment} |")
            out.append("")
    out.append("## `analysis-error`\n")
    out.append(
        "- **severity:** info; **fix:** none (report the rule's error): a rule or advisor "
        "failed, its findings are missing and the rest of the report stands.\n"
    )
    out.append("## Every threshold, by module\n")
    for module, table in tables.items():
        out.append(f"### `{module}`\n")
        out.append("| threshold | value | meaning |\n|---|---|---|")
        for k, (value, comment) in table.items():
            out.append(f"| `{k}` | {_value(value)} | {comment} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: fills the findings page's marker with the generated reference."""
    if page.file.src_uri == PAGE:
        return markdown.replace(MARKER, generate())
    return markdown


if __name__ == "__main__":
    print(generate())
