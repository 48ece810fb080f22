"""A DDP trainer in the style of PyTorch's ``multigpu_torchrun.py`` tutorial (fault-tolerant DDP
with torchrun), on CPU with gloo.

A ``Trainer`` with ``_load_snapshot``/``_save_snapshot``/``_run_epoch``/``train``; rank 0 writes
``{MODEL_STATE, OPTIMIZER_STATE, EPOCHS_RUN}`` (plus the last ``LOSS``, so a run resumed after
its last epoch still prints it) to ``--snapshot`` (relative to the working directory) every
``--save-every`` epochs, and a (re)started run resumes from it.

``torchrun --nproc-per-node 2 tests/trainers/ddp_snapshot.py --steps 60`` (or plain ``python``: one
process, no process group). ``--verify`` keeps the previous snapshot as ``<snapshot>.prev``, writes
a ``<snapshot>.sha256`` digest, and on load falls back to ``.prev`` (then to scratch) when a
snapshot fails its check. Prints ``step N loss X`` every 10 steps and ``final loss <repr>``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, WIDTH, SEQ, BATCH = 32, 16, 12, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.tanh(self.attn(x))
        return x + torch.relu(self.mlp(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Trainer:
    def __init__(self, model: nn.Module, train_data: DataLoader, args: argparse.Namespace) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.model = model
        self.train_data = train_data
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        self.save_every = args.save_every
        self.snapshot_path = args.snapshot
        self.verify = args.verify
        self.epochs_run = 0
        self.loss = float("nan")
        self._load_snapshot()
        if dist.is_initialized():
            self.model = DDP(self.model)

    def _try_load(self, path: str) -> dict | None:
        if not self.verify:
            return torch.load(path, map_location="cpu")
        try:
            with open(path + ".sha256") as f:
                if f.read().strip() != sha256_of(path):
                    return None
            return torch.load(path, map_location="cpu")
        except Exception:
            return None

    def _load_snapshot(self) -> None:
        path, prev = self.snapshot_path, self.snapshot_path + ".prev"
        candidates = [p for p in ([path, prev] if self.verify else [path]) if os.path.exists(p)]
        for candidate in candidates:
            snapshot = self._try_load(candidate)
            if snapshot is None:
                then = f"trying {prev}" if candidate != prev else "no older snapshot"
                print(f"snapshot {candidate} failed its check; {then}", flush=True)
                continue
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
            self.loss = snapshot.get("LOSS", self.loss)
            print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)
            return
        if candidates:
            print("no valid snapshot; starting training from scratch", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        raw_model = self.model.module if isinstance(self.model, DDP) else self.model
        snapshot = {
            "MODEL_STATE": raw_model.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
            "LOSS": self.loss,
        }
        path = self.snapshot_path
        if self.verify:
            for suffix in ("", ".sha256"):
                if os.path.exists(path + suffix):
                    os.replace(path + suffix, path + ".prev" + suffix)
        torch.save(snapshot, path)
        if self.verify:
            with open(path + ".sha256", "w") as f:
                f.write(sha256_of(path) + "\n")
        print(f"Epoch {epoch} | Training snapshot saved at {path}", flush=True)

    def _run_epoch(self, epoch: int) -> None:
        steps = len(self.train_data)
        print(f"[RANK{self.rank}] Epoch {epoch} | Batchsize: {BATCH} | Steps: {steps}", flush=True)
        self.train_data.sampler.set_epoch(epoch)
        for i, (source, targets) in enumerate(self.train_data):
            self.optimizer.zero_grad()
            output = self.model(source)
            loss = nn.functional.cross_entropy(output.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            self.optimizer.step()
            self.loss = loss.item()
            step = epoch * steps + i + 1
            if self.rank == 0 and step % 10 == 0:
                print(f"step {step} loss {self.loss:.6f}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if (epoch + 1) % self.save_every == 0:
                if self.rank == 0:
                    self._save_snapshot(epoch)
                if dist.is_initialized():
                    dist.barrier()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="total iterations (all epochs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batches-per-epoch", type=int, default=4)
    parser.add_argument("--save-every", type=int, default=2, help="epochs between snapshots")
    parser.add_argument("--snapshot", default="snapshot.pt", help="relative to the cwd")
    parser.add_argument("--verify", action="store_true", help="keep .prev, check sha256 on load")
    args = parser.parse_args()

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    n = args.batches_per_epoch * BATCH * world
    start = torch.randint(0, VOCAB, (n, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB  # each token follows the last
    dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
    train_data = DataLoader(dataset, batch_size=BATCH, shuffle=False, sampler=sampler)

    trainer = Trainer(TinyLM(), train_data, args)
    trainer.train(max_epochs=args.steps // args.batches_per_epoch)
    if rank == 0:
        print(f"final loss {trainer.loss!r}", flush=True)
    if distributed:
        # Without this, torch 2.13 + gloo aborts at interpreter exit in ~1 run of 4 ("terminate
        # called without an active exception"): free DDP's leftover reference cycles first;
        # and the group's destructor can deadlock with gloo's threads on the GIL unless they
        # are left idle first: a barrier, and a moment for them to free it (docs/frameworks.md).
        gc.collect()
        dist.barrier()
        time.sleep(0.1)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
