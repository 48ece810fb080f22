"""A torchrun script that checkpoints with ``torch.distributed.checkpoint`` (DCP), following the
"Getting Started with Distributed Checkpoint" recipe: the state dict from
``torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)``, ``dcp.save`` into
one folder per save (``OUT/ckpt/step-N``), and on a new start the newest folder loaded in
place (build model and optimizer, ``get_state_dict``, ``dcp.load(state_dict,
checkpoint_id=...)``, ``set_state_dict``).

``python -m torch.distributed.run --standalone --nproc-per-node 2
tests/frameworks/dcp_trainer.py --steps 30 --save-every 8 [--out DIR] [--guard] [--fsdp]
[--final-weights PATH]``: DDP by default, FSDP2 (``torch.distributed.fsdp.fully_shard`` on every
block, then the model) with ``--fsdp``; gloo on CPU, NCCL when CUDA is there. ``--guard`` skips
``optimizer.step()`` when the clipped gradient norm is not finite (the norm is global, so every
rank agrees). Prints ``final loss <repr> at step N`` on rank 0; with ``--final-weights`` rank 0
also writes the full (unsharded) model weights there as safetensors (``final_weights.py``), for
a crash-point comparison.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from final_weights import save_final_weights  # beside this script, first on sys.path
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, WIDTH, SEQ, BATCH, BATCHES_PER_EPOCH = 64, 32, 16, 4, 10


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)
        )
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.tanh(self.attn(self.norm(x)))
        return x + self.mlp(x)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # (B, T, vocab)


def newest_checkpoint(ckpt_dir: Path) -> tuple[Path, int] | None:
    """The folder of the highest step that holds DCP's ``.metadata`` (written last)."""
    done = [p for p in ckpt_dir.glob("step-*") if (p / ".metadata").exists()]
    if not done:
        return None
    path = max(done, key=lambda p: int(p.name.split("-")[1]))
    return path, int(path.name.split("-")[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--out", default=".", help="step-N/ folders go to OUT/ckpt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--guard", action="store_true", help="skip steps with a non-finite grad norm"
    )
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    parser.add_argument("--final-weights", help="write the final weights here (safetensors)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")

    torch.manual_seed(args.seed)
    model = TinyLM().to(device)
    if args.fsdp:
        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    generator = torch.Generator().manual_seed(args.seed)
    start = torch.randint(0, VOCAB, (BATCHES_PER_EPOCH * BATCH * world, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    ckpt_dir = Path(args.out) / "ckpt"
    step = 0
    newest = newest_checkpoint(ckpt_dir)
    if newest is not None:
        path, step = newest
        model_state, optim_state = get_state_dict(model, optimizer)
        state_dict = {"model": model_state, "optim": optim_state}
        dcp.load(state_dict, checkpoint_id=path)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if rank == 0:
            print(f"resumed from {path} at step {step}", flush=True)

    loss = torch.tensor(float("nan"))
    while step < args.steps:
        epoch, done = divmod(step, len(loader))
        sampler.set_epoch(epoch)
        for inputs, targets in itertools.islice(loader, done, None):
            inputs, targets = inputs.to(device), targets.to(device)
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if args.guard and not torch.isfinite(grad_norm):
                if rank == 0:
                    print(f"non-finite grad norm at step {step + 1}; step skipped", flush=True)
            else:
                optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % args.save_every == 0:
                model_state, optim_state = get_state_dict(model, optimizer)
                dcp.save(
                    {"model": model_state, "optim": optim_state},
                    checkpoint_id=ckpt_dir / f"step-{step}",
                )
            if step >= args.steps:
                break

    if rank == 0:
        print(f"final loss {loss.item()!r} at step {step}", flush=True)
    if args.final_weights:  # a collective under FSDP: every rank takes part, rank 0 writes
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=options)
        if rank == 0:
            save_final_weights(full, args.final_weights)
    # torch 2.13 + gloo can deadlock as the process group is freed: its destructor joins
    # gloo's worker threads holding the GIL while one of them frees a finished collective
    # and needs the GIL (docs/frameworks.md). So every rank's collectives end (barrier), and
    # gloo's threads get a moment without the GIL to free them, before the group goes.
    # Forked runs here: 3 of 28 hung with gc.collect() + destroy_process_group() alone, none
    # of 40 with this ending.
    gc.collect()
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
