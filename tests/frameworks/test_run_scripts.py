"""``ampdiag run`` on unmodified Lightning and HF Trainer scripts (subprocesses, as a user would).

Truth: each script writes the framework's own step counter and its exit status to a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

LIGHTNING = """
import json, sys
import torch
import lightning as L
from torch import nn

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    def training_step(self, batch, i):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

if __name__ == "__main__":
    steps = int(sys.argv[2])
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(M(), torch.utils.data.DataLoader(data, batch_size=8))
    json.dump({"global_step": trainer.global_step}, open(sys.argv[1], "w"))
"""

HF = """
import json, sys
import torch
import transformers

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}

if __name__ == "__main__":
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                  bos_token_id=0, eos_token_id=0)
    args = transformers.TrainingArguments(output_dir=sys.argv[3], use_cpu=True, bf16=True,
        max_steps=int(sys.argv[2]), per_device_train_batch_size=4, save_strategy="no",
        report_to=[], disable_tqdm=True, logging_steps=1000)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=args,
                                   train_dataset=Tokens())
    trainer.train()
    json.dump({"global_step": trainer.state.global_step}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize(
    ("name", "source", "framework"),
    [("lightning", LIGHTNING, "lightning"), ("hf", HF, "transformers")],
)
def test_ampdiag_run_a_framework_script(
    tmp_path: Path, name: str, source: str, framework: str
) -> None:
    pytest.importorskip(framework)
    script = tmp_path / f"train_{name}.py"
    script.write_text(source)
    out, record = tmp_path / "out", tmp_path / "record.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ampdiag",
            "run",
            "--out",
            str(out),
            "--no-report",
            "--no-tensorboard",
            "--no-console",
            "--no-speed-probe",
            "--profile-skip",
            "0",
            "--profile-active",
            "1",
            str(script),
            str(record),
            "3",
            str(tmp_path / "hf"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    truth = json.loads(record.read_text())
    session = json.loads((out / "session.json").read_text())
    assert session["status"] == "ok"
    assert truth["global_step"] == 3 == len(session["steps"])
    assert session["run"]["autocast_seen"] == {"cpu:bfloat16": 3}
    assert session["environment"]["autocast"] == "cpu:bfloat16"
