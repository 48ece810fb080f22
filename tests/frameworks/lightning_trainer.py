"""A Lightning script as its docs show one: the ``LightningTransformer`` of
``lightning.pytorch.demos`` (its ``Transformer``, small), a ``Trainer`` with
``gradient_clip_val`` (so every step runs inside ``optimizer.step(closure)``), a
``ModelCheckpoint(save_last=True, every_n_train_steps=K)``, and the documented resume,
``trainer.fit(model, ckpt_path="last")`` when ``last.ckpt`` exists.

``python tests/frameworks/lightning_trainer.py --steps 30 --save-every 8 [--out DIR] [--guard]
[--final-weights PATH]``. ``--guard`` drops the update of a step whose gradients are not finite,
in ``on_before_optimizer_step`` (the gradients are set to None, so Adam leaves every parameter
as it was). An epoch is ``--save-every`` batches, so every checkpoint ends an epoch and a
resumed run sees the batches an uninterrupted one would. Prints ``final loss <repr> at step N``
at the end; with ``--final-weights`` also writes the model's weights there as safetensors
(``final_weights.py``), for a crash-point comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from final_weights import save_final_weights  # beside this script, first on sys.path
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, TensorDataset

VOCAB, SEQ, BATCH = 64, 16, 4


class LightningTransformer(L.LightningModule):
    def __init__(self, vocab_size: int, guard: bool = False) -> None:
        super().__init__()
        self.model = Transformer(
            vocab_size=vocab_size, ninp=32, nhead=2, nhid=64, nlayers=1, dropout=0.0
        )
        self.guard = guard

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.model(inputs, target)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        inputs, target = batch
        output = self(inputs, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.guard:
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not all(torch.isfinite(g).all() for g in grads):
            print(f"non-finite gradients at step {self.global_step + 1}; update skipped")
            optimizer.zero_grad(set_to_none=True)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        print(f"resuming at step {checkpoint['global_step']}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.model.parameters(), lr=3e-3)


def counting_data(batches: int, seed: int) -> TensorDataset:
    """Sequences in which each token follows the last (mod VOCAB); targets shifted by one."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (batches * BATCH, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--out", default=".", help="default_root_dir; checkpoints in OUT/ckpt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guard", action="store_true", help="skip steps with non-finite grads")
    parser.add_argument("--final-weights", help="write the final weights here (safetensors)")
    args = parser.parse_args()

    L.seed_everything(args.seed)
    loader = DataLoader(counting_data(args.save_every, args.seed), batch_size=BATCH)
    model = LightningTransformer(vocab_size=VOCAB, guard=args.guard)
    ckpt_dir = Path(args.out) / "ckpt"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, save_last=True, every_n_train_steps=args.save_every
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        gradient_clip_val=1.0,
        callbacks=[checkpoint],
        default_root_dir=args.out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    resume = "last" if (ckpt_dir / "last.ckpt").exists() else None
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    # A resume from the last step's checkpoint trains no step, and logs no loss.
    logged = trainer.callback_metrics.get("train_loss")
    loss = float("nan") if logged is None else logged.item()
    print(f"final loss {loss!r} at step {trainer.global_step}", flush=True)
    if args.final_weights:
        save_final_weights(model.state_dict(), args.final_weights)
    return 0


if __name__ == "__main__":
    sys.exit(main())
