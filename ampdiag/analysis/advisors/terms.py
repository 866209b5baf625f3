"""Fixes in the user's own terms: the framework's setting first, then the plain loop's code.

A user who trains through the Hugging Face Trainer, Accelerate, Lightning or a script with
mixed-precision flags (timm's ``train.py --amp --amp-dtype ...``) changes precision with a
flag, not by editing a loop they never wrote. The session records the framework the run came
through (``environment.framework``: its name, what precision it asked for, the command line's
mixed-precision flags); every fix that changes precision, the loss scaler or the accumulation
is written here, so that all of them name the same setting the same way:

=============  =====================================  ==========================================
framework      precision                              accumulation, loss scaler
=============  =====================================  ==========================================
hf-trainer     ``TrainingArguments(bf16=True)``,      ``gradient_accumulation_steps=N``
               ``--bf16`` on the command line
accelerate     ``Accelerator(mixed_precision="bf16")`` ``Accelerator(gradient_accumulation_steps``
                                                      ``=N)``; ``GradScalerKwargs(...)``
lightning      ``Trainer(precision="bf16-mixed")``    ``Trainer(accumulate_grad_batches=N)``;
                                                      ``MixedPrecision(..., scaler=...)``
script (timm)  ``--amp --amp-dtype bfloat16``         ``--grad-accum-steps N``
=============  =====================================  ==========================================

A fix is code or a setting: the numbers it rests on stay in the finding's evidence. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ampdiag.session import Session

PLAIN = "# In a plain training loop:"

#: Each precision's name in timm's ``--amp-dtype`` and in Lightning's ``precision``.
AMP_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
LIGHTNING = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true", "tf32": "32-true"}
ACCELERATE = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "tf32": "no"}


@dataclass(frozen=True)
class Framework:
    """The framework the run came through (``environment.framework``).

    Attributes:
        name: "hf-trainer", "accelerate", "lightning", "script" (a command line with
            mixed-precision flags), or "" for a plain loop.
        precision: What it asked for, in its own words ("fp16", "bf16-mixed", "no"), if known.
        flags: The command line's mixed-precision flags, with their values.
        via: An installed library's trainer that builds the Accelerator itself ("Trainer
            (denoising_diffusion_pytorch)"), whose arguments are then the lever; "" if none.
        via_args: That trainer's arguments that set precision or accumulation.
        config_overrides: The value of ``--config_overrides`` (HF ``run_clm.py`` and its
            siblings: the model's config settings when it trains from scratch), if given.
    """

    name: str = ""
    precision: str | None = None
    flags: tuple[str, ...] = ()
    via: str = ""
    via_args: tuple[str, ...] = ()
    config_overrides: str | None = None

    @property
    def label(self) -> str:
        """Its name in a sentence."""
        if self.via:
            return f"{self.via}, which builds the Accelerator"
        return {
            "hf-trainer": "the Hugging Face Trainer",
            "accelerate": "Accelerate",
            "lightning": "Lightning",
            "script": "on the script's command line",
        }.get(self.name, "a plain loop")


def framework(session: Session) -> Framework:
    """The session's framework; a plain loop (name "") where it recorded none."""
    raw: Any = session.environment.get("framework")
    if not isinstance(raw, dict) or not raw.get("name"):
        return Framework()
    precision = raw.get("precision")
    flags, args = raw.get("flags"), raw.get("via_args")
    return Framework(
        name=str(raw["name"]),
        precision=str(precision) if precision is not None else None,
        flags=tuple(str(f) for f in flags) if isinstance(flags, list) else (),
        via=str(raw.get("via") or ""),
        via_args=tuple(str(a) for a in args) if isinstance(args, list) else (),
        config_overrides=(
            str(raw["config_overrides"]) if raw.get("config_overrides") is not None else None
        ),
    )


def _trainer_call(fw: Framework, **kwargs: object) -> str:
    """A call of the library trainer that builds the Accelerator, with these arguments."""
    given = ", ".join(f"{k}={v!r}".replace("'", '"') for k, v in kwargs.items())
    return f"{fw.via.split(' ')[0]}(..., {given})"


def _trainer_precision(fw: Framework, precision: str) -> str | None:
    """The library trainer's own arguments for ``precision``, where its signature has them."""
    low = precision in ("bf16", "fp16")
    if {"amp", "mixed_precision_type"} <= set(fw.via_args):  # lucidrains' trainers
        if low:
            return _trainer_call(fw, amp=True, mixed_precision_type=precision)
        return _trainer_call(fw, amp=False)
    if "mixed_precision" in fw.via_args:
        return _trainer_call(fw, mixed_precision=ACCELERATE[precision])
    return None


def _flag_style(fw: Framework) -> str:
    """Which family of flags the command line uses: "timm", "hf", "mixed", "precision" or ""."""
    flags = set(fw.flags)
    if flags & {"--amp", "--amp-dtype", "--amp-impl", "--native-amp", "--apex-amp", "--no-amp"}:
        return "timm"
    if flags & {"--bf16", "--fp16", "--half"}:
        return "hf"
    if flags & {"--mixed_precision", "--mixed-precision"}:
        return "mixed"
    return "precision" if "--precision" in flags else ""


def _command_line(fw: Framework, precision: str) -> str | None:
    """The command-line flags that train in ``precision``, in the script's own flag family."""
    style = _flag_style(fw)
    low = precision in ("bf16", "fp16")
    if style == "timm":
        return f"--amp --amp-dtype {AMP_DTYPE[precision]}" if low else "(no --amp)"
    if style == "hf":
        other = "--fp16" if precision == "bf16" else "--bf16"
        return (
            f"--{precision} (instead of {other})"
            if low and other in fw.flags
            else (f"--{precision}" if low else "neither --bf16 nor --fp16")
        )
    if style == "mixed":
        flag = next(f for f in fw.flags if f in ("--mixed_precision", "--mixed-precision"))
        return f"{flag} {ACCELERATE[precision]}"
    if style == "precision":
        return f"--precision {LIGHTNING[precision]}"
    return None


def precision_setting(session: Session, precision: str) -> str | None:
    """The framework's setting that trains in ``precision`` ("bf16", "fp16", "fp32", "tf32").

    None for a plain loop: its code is the fix.
    """
    fw = framework(session)
    cli = _command_line(fw, precision)
    if fw.name == "hf-trainer":
        args = {
            "bf16": "bf16=True, fp16=False",
            "fp16": "fp16=True, bf16=False",
            "fp32": "bf16=False, fp16=False",
            "tf32": "bf16=False, fp16=False, tf32=True",
        }[precision]
        flag = cli or {"bf16": "--bf16", "fp16": "--fp16", "tf32": "--tf32 True"}.get(precision)
        return f"TrainingArguments(..., {args})" + (
            f"   # {flag} on the command line" if flag else ""
        )
    if fw.name == "accelerate" and fw.via:
        own = _trainer_precision(fw, precision)
        if own is not None:
            return own
    if fw.name == "accelerate":
        return f'Accelerator(mixed_precision="{ACCELERATE[precision]}")' + (
            f"   # or accelerate launch --mixed_precision {ACCELERATE[precision]}"
            if cli is None
            else f"   # {cli} on the command line"
        )
    if fw.name == "lightning":
        return f'Trainer(..., precision="{LIGHTNING[precision]}")' + (
            f"   # {cli} on the command line" if cli else ""
        )
    return cli


def with_setting(session: Session, setting: str | None, loop: str) -> str:
    """A fix: the framework's setting first, then the plain loop's code; the code alone else."""
    if not setting:
        return loop
    label = framework(session).label
    return f"# {label[0].upper()}{label[1:]}:\n{setting}\n{PLAIN}\n{loop}"


def precision_fix(session: Session, precision: str, loop: str) -> str:
    """Train in ``precision``: the framework's setting, then ``loop`` (the plain loop's code)."""
    return with_setting(session, precision_setting(session, precision), loop)


def training_step(
    precision: str,
    device: str,
    *,
    init_scale: float | None = None,
    growth_interval: int | None = None,
    unscale: bool = False,
) -> str:
    """The plain loop's training step in ``precision`` ("bf16", "fp16", "fp32", "tf32").

    The one snippet of each precision that every fix shows (after the framework's setting:
    `precision_fix`); FP16's GradScaler takes the settings a fix computed, and ``unscale``
    the ``unscale_`` a clipping loop needs.
    """
    if precision == "bf16":
        return (
            f"with torch.autocast(device_type={device!r}, dtype=torch.bfloat16):\n"
            "    loss = loss_fn(model(x), y)\n"
            "loss.backward()        # no GradScaler: BF16 neither underflows nor overflows\n"
            "optimizer.step()\n"
            "optimizer.zero_grad(set_to_none=True)"
        )
    if precision == "fp16":
        settings = "".join(
            f", {k}={v:.0f}"
            for k, v in (("init_scale", init_scale), ("growth_interval", growth_interval))
            if v is not None
        )
        return (
            f"scaler = torch.amp.GradScaler({device!r}{settings})\n"
            f"with torch.autocast(device_type={device!r}, dtype=torch.float16):\n"
            "    loss = loss_fn(model(x), y)\n"
            "scaler.scale(loss).backward()\n"
            + ("scaler.unscale_(optimizer)   # before clipping, if you clip\n" if unscale else "")
            + "scaler.step(optimizer)\n"
            "scaler.update()"
        )
    tf32 = (
        "torch.backends.cuda.matmul.allow_tf32 = True   # TF32 matmuls (measured fastest)\n"
        "torch.backends.cudnn.allow_tf32 = True\n"
        if precision == "tf32"
        else ""
    )
    return (
        tf32
        + "# Train in FP32 here: no autocast, no GradScaler\n"
        + (
            "use_amp = device.type == 'cuda'   # keep autocast for the GPU\n"
            if device == "cpu"
            else "use_amp = False\n"
        )
        + f"with torch.autocast(device_type={device!r}, enabled=use_amp):\n"
        "    loss = loss_fn(model(x), y)\n"
        "loss.backward()\n"
        "optimizer.step()"
    )


def accumulation_loop(steps: int, autocast: str | None, loader_batch: int | str | None) -> str:
    """The plain loop accumulating ``steps`` micro-batches, in the run's own precision.

    A fix of the batch (`use-grad-accumulation`, a broken accumulation) changes the batch, not
    the precision: ``autocast`` is the run's (`computes_in`), so a BF16 run needs no scaler, an
    FP32 run no autocast, and an FP16 run keeps its GradScaler. ``loader_batch`` is stated
    beside the loader when the fix changes it.
    """
    dtype = autocast.rsplit(":", 1)[-1] if autocast else None
    fp16 = dtype == "float16"
    body = "loss = loss_fn(model(x), y) / accum"
    note = f"  # loader batch_size={loader_batch}" if loader_batch is not None else ""
    lines = [
        f"accum = {steps}",
        "optimizer.zero_grad(set_to_none=True)",
        f"for i, (x, y) in enumerate(loader):{note}",
    ]
    if dtype:
        lines += [f"    with torch.autocast(device_type, dtype=torch.{dtype}):", f"        {body}"]
    else:
        lines.append(f"    {body}")
    lines.append("    scaler.scale(loss).backward()" if fp16 else "    loss.backward()")
    lines.append("    if (i + 1) % accum == 0:")
    step = "scaler.step(optimizer); scaler.update()" if fp16 else "optimizer.step()"
    lines += [f"        {step}", "        optimizer.zero_grad(set_to_none=True)"]
    return "\n".join(lines)


def fp32_module(device: str) -> str:
    """One module kept in FP32 inside an autocast region: its forward and backward."""
    return f"with torch.autocast('{device}', enabled=False):\n    y = module(x.float())"


def scaler_setting(session: Session, init_scale: float, growth_interval: int) -> str | None:
    """The framework's way to give its GradScaler these settings (None: a plain loop's code).

    The Trainer, timm's ``train.py`` and a library trainer that builds its own Accelerator make
    their scaler with torch's defaults and expose no setting for it: their lever is the
    precision (BF16 needs no scaler), said by the caller.
    """
    fw = framework(session)
    kwargs = f"init_scale={init_scale:.0f}, growth_interval={growth_interval}"
    if fw.name == "accelerate" and not fw.via:
        return (
            "from accelerate.utils import GradScalerKwargs\n"
            'accelerator = Accelerator(mixed_precision="fp16",\n'
            f"                          kwargs_handlers=[GradScalerKwargs({kwargs})])"
        )
    if fw.name == "lightning":
        return (
            "from lightning.pytorch.plugins import MixedPrecision\n"
            'Trainer(..., plugins=[MixedPrecision("16-mixed", "cuda",\n'
            f'    scaler=torch.amp.GradScaler("cuda", {kwargs}))])'
        )
    return None


def accumulation_setting(session: Session, steps: int) -> str | None:
    """The framework's setting that accumulates gradients over ``steps`` micro-batches."""
    fw = framework(session)
    accum = [a for a in fw.via_args if "accum" in a]
    if fw.name == "accelerate" and accum:
        return _trainer_call(fw, **{accum[0]: steps})
    if fw.name == "hf-trainer":
        return (
            f"TrainingArguments(..., gradient_accumulation_steps={steps})"
            f"   # --gradient_accumulation_steps {steps}"
        )
    if fw.name == "accelerate":
        return (
            f"accelerator = Accelerator(gradient_accumulation_steps={steps})\n"
            "with accelerator.accumulate(model):   # around each micro-batch's step"
        )
    if fw.name == "lightning":
        return f"Trainer(..., accumulate_grad_batches={steps})"
    if _flag_style(fw) == "timm":
        return f"--grad-accum-steps {steps}"
    return None


def cuda_amp_on_cpu(session: Session) -> bool:
    """Whether a CPU run made its GradScaler for CUDA (``torch.cuda.amp.GradScaler()``).

    The pattern many AMP tutorials teach: ``torch.cuda.amp.autocast()`` and
    ``torch.cuda.amp.GradScaler()`` are built for CUDA; on a CPU torch disables both (with a
    warning), so the run trains in FP32 with a scaler that does nothing.
    """
    env = session.environment
    if str(env.get("device_type") or "cpu") != "cpu":
        return False
    scaler = session.section("run").get("scaler")
    return isinstance(scaler, dict) and scaler.get("device") == "cuda"


def inactive_autocast(session: Session, device: str, precision: str) -> tuple[str | None, str]:
    """Why autocast never ran where the run asked for it, and the fix that applies.

    Returns ``(why, fix)``: ``why`` is a clause for the finding's title (None when the session
    knows no cause beyond "autocast was not active"). Accelerate asked for FP16 on a CPU enters
    no autocast at all: its lever is ``mixed_precision="bf16"``. ``torch.cuda.amp`` on a CPU:
    ``torch.autocast("cpu", dtype=torch.bfloat16)``, with no GradScaler. Otherwise the
    framework's setting, then the plain loop's autocast.
    """
    env = session.environment
    asked = env.get("framework_precision")
    loop = training_step(precision, device)
    if device == "cpu" and isinstance(asked, dict) and asked.get("accelerate") == "fp16":
        fw = framework(session)
        via = (
            f"{fw.via} (through Accelerate) "
            if fw.via
            else ("" if fw.name in ("", "accelerate") else f"{fw.label} (through Accelerate) ")
        )
        why = (
            f"{via or 'Accelerate '}was asked for FP16, which on a CPU enters no autocast: "
            "the run trains in FP32"
        )
        why = why[0].upper() + why[1:]
        return why, precision_fix(session, "bf16", training_step("bf16", "cpu"))
    if device == "cpu" and cuda_amp_on_cpu(session):
        # what the session saw: a CUDA GradScaler, and no autocast on the CPU (whether the
        # script entered torch.cuda.amp.autocast, off here, or none: nanoGPT's CPU branch)
        why = (
            "torch.cuda.amp.GradScaler() is built for CUDA: on this CPU torch disabled it, and "
            "no autocast ran on the CPU, so the run trains in FP32"
        )
        loop = "# torch.autocast, not torch.cuda.amp.autocast():\n" + training_step("bf16", "cpu")
        return why, precision_fix(session, "bf16", loop)
    return None, precision_fix(session, precision, loop)


def mask_fill_fix() -> str:
    """A mask filled with a large negative constant (-1e9, -1e4) overflows FP16 (max 65504).

    For the numerics advisors (cause34): the mask value of the scores' own dtype.
    """
    return (
        "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)   # not -1e9: "
        "FP16's range ends at 65504"
    )


def custom_function_fix(device: str) -> str:
    """A custom ``autograd.Function`` fed FP16 by autocast: run it in FP32 (numerics advisors)."""
    return (
        "class MyFunction(torch.autograd.Function):\n"
        "    @staticmethod\n"
        f"    @torch.amp.custom_fwd(device_type={device!r}, cast_inputs=torch.float32)\n"
        "    def forward(ctx, x): ...\n"
        "    @staticmethod\n"
        f"    @torch.amp.custom_bwd(device_type={device!r})\n"
        "    def backward(ctx, grad): ..."
    )


def sdpa_dropout_setting(session: Session) -> str | None:
    """Attention dropout 0 in the script's own flag, where its command line sets the config.

    ``run_clm.py --model_type gpt2 --config_overrides n_embd=64,...``: the model is built from
    the command line, so the lever is one more override there (GPT-2's name for the attention
    dropout; most other configs call it ``attention_dropout``). None elsewhere.
    """
    given = framework(session).config_overrides
    if given is None:
        return None
    kept = [kv for kv in given.split(",") if kv and not kv.startswith("attn_pdrop=")]
    return (
        f"--config_overrides {','.join([*kept, 'attn_pdrop=0.0'])}   # on the command line "
        "(GPT-2; attention_dropout=0.0 for most other model types)"
    )
