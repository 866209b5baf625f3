"""An HF ``Trainer`` run in the style of ``run_clm.py --bf16 --use_cpu`` (written here).

A tiny GPT-2 built from a config (no download) on a synthetic token stream cut into blocks,
``TrainingArguments(bf16=True, use_cpu=True, gradient_accumulation_steps=2, max_steps=20)``,
no saving, no reporting; a callback prints each optimizer step's time.

    python hf_trainer_like.py [--steps 20] [--accum 2]

Prints ``BLOCK_START``/``LOOP_START``/``STEP i``/``BLOCK_END <time.time()> <process CPU>``
and a digest of the trained weights.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)


class Blocks(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, block: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(vocab, (n, block), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Stamp(TrainerCallback):
    def on_train_begin(self, *a: Any, **k: Any) -> None:
        print(f"LOOP_START {time.time():.6f}", flush=True)

    def on_step_end(self, args: Any, state: Any, *a: Any, **k: Any) -> None:
        print(f"STEP {state.global_step - 1} {time.time():.6f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    args = p.parse_args()
    print(f"BLOCK_START {time.time():.6f}", flush=True)
    set_seed(42)
    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(cfg)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            bf16=True,
            use_cpu=True,
            gradient_accumulation_steps=args.accum,
            per_device_train_batch_size=4,
            max_steps=args.steps,
            learning_rate=5e-4,
            save_strategy="no",
            report_to=[],
            logging_steps=5,
            dataloader_num_workers=0,
            seed=42,
        )
        trainer = Trainer(
            model=model, args=targs, train_dataset=Blocks(256, 64, 512), callbacks=[Stamp()]
        )
        result = trainer.train()
    print(f"train_runtime {result.metrics['train_runtime']:.3f} loss {result.training_loss:.6f}")
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.parameters()))
    print(f"DIGEST {digest.hexdigest()[:16]}")
    print(f"BLOCK_END {time.time():.6f} {time.process_time():.6f}", flush=True)


if __name__ == "__main__":
    main()
