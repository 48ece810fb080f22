"""The training loop: build, optionally resume, train to the target step, journal it all."""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.journal import JournalWriter
from reference_trainer import checkpoint as ckpt
from reference_trainer import distributed
from reference_trainer.config import TrainConfig
from reference_trainer.corpus import Corpus
from reference_trainer.data import ShardedLoader, TokenLayout, TokenStream
from reference_trainer.distributed import Topology
from reference_trainer.errors import CheckpointError
from reference_trainer.model import GPT, next_token_loss
from reference_trainer.optim import build_optimizer, lr_at, peak_lr
from reference_trainer.precision import Precision, build_precision
from reference_trainer.run_dir import check_fresh, check_resumable
from reference_trainer.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one process saw of its run."""

    steps: int
    final_loss: float
    seconds: float


@dataclass(slots=True)
class Trainer:
    """The pieces of a run, built once; `step` advances them by one optimizer step."""

    cfg: TrainConfig
    topo: Topology
    model: GPT
    wrapped: torch.nn.Module
    optimizer: torch.optim.AdamW
    precision: Precision
    stream: TokenStream
    loader: ShardedLoader
    max_lr: float

    def step(self, step: int) -> dict[str, Any]:
        """Train step ``step`` (1-based); returns its observations for the journal."""
        t0 = time.perf_counter()
        lr = lr_at(
            step - 1,
            max_lr=self.max_lr,
            warmup_steps=self.cfg.optim.warmup_steps,
            total_steps=self.cfg.steps,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.loader.next_step().to(self.topo.device)
        accum = self.cfg.grad_accum
        local = torch.zeros((), device=self.topo.device)
        scaler = self.precision.scaler
        for micro in range(accum):
            x, y = batch[micro, :, :-1], batch[micro, :, 1:]
            sync = micro == accum - 1 or not isinstance(self.wrapped, DDP)
            with contextlib.nullcontext() if sync else self.wrapped.no_sync():  # type: ignore[operator]
                with self.precision.autocast():
                    loss = next_token_loss(self.wrapped(x), y)
                scaler.scale(loss / accum).backward()  # type: ignore[no-untyped-call]
            local += loss.detach() / accum
        scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        loss_scale = self.precision.loss_scale()
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        mean_loss = distributed.mean_over_ranks(local, self.topo)
        return {
            "loss": float(mean_loss),
            "local_loss": float(local),
            "grad_norm": float(grad_norm),
            "lr": lr,
            "loss_scale": loss_scale,
            "tokens": self.loader.tokens_per_step(),
            "step_time": time.perf_counter() - t0,
        }

    def state_dict(self, step: int) -> dict[str, Any]:
        """What a checkpoint keeps of the shared state (RNG states are saved per rank)."""
        return {
            "step": step,
            "world_size": self.topo.world_size,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "data": self.stream.state_dict(),
        }

    def load(self, path: Path) -> int:
        """Restore everything from the checkpoint at ``path``; returns its step."""
        state = ckpt.load_state(path)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.precision.scaler.load_state_dict(state["scaler"])
            self.stream.load_state_dict(state["data"])
        except (RuntimeError, KeyError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0]
            raise CheckpointError(f"checkpoint {path} does not fit this run: {reason}") from exc
        rng = ckpt.load_rng(path, self.topo.rank)
        step = int(state["step"])
        if rng is not None:
            ckpt.set_rng_state(rng)
        else:  # a rank that did not exist when the checkpoint was taken
            _seed_everything(self.cfg.seed + 1 + self.topo.rank + step * 1009)
        return step


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _tokenizer(cfg: TrainConfig, run_dir: Path, corpus: Corpus, topo: Topology) -> Any:
    if topo.is_main and not (run_dir / "tokenizer.json").exists():
        texts = (corpus.document(i).text for i in range(cfg.data.tokenizer_docs))
        save_tokenizer(train_tokenizer(texts, cfg.model.vocab_size), run_dir)
    distributed.barrier(topo)
    return load_tokenizer(run_dir, cfg.model.vocab_size)


def build(cfg: TrainConfig, run_dir: Path, topo: Topology) -> Trainer:
    """Model, optimizer, precision and data stream of a fresh run (seeded by ``cfg.seed``)."""
    corpus = Corpus(cfg.data.source_weights, cfg.data.seed)
    tokenizer = _tokenizer(cfg, run_dir, corpus, topo)

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    layout = TokenLayout.from_config(cfg.data, eot_id=0)
    stream = TokenStream(corpus, encode, layout, window=cfg.model.block_size + 1)
    loader = ShardedLoader(
        stream,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        rank=topo.rank,
        world_size=topo.world_size,
    )
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = GPT(cfg.model).to(topo.device)
    # Dropout and any other draw differ per rank, as they would on a real cluster.
    _seed_everything(cfg.seed + 1 + topo.rank)
    optimizer = build_optimizer(model, cfg.optim)
    wrapped: torch.nn.Module = model
    if topo.distributed:
        ids = [topo.local_rank] if topo.device.type == "cuda" else None
        wrapped = DDP(model, device_ids=ids)
    return Trainer(
        cfg=cfg,
        topo=topo,
        model=model,
        wrapped=wrapped,
        optimizer=optimizer,
        precision=build_precision(cfg.precision, topo.device),
        stream=stream,
        loader=loader,
        max_lr=peak_lr(cfg, topo.world_size),
    )


def _print(topo: Topology, message: str) -> None:
    if topo.is_main:
        print(message, flush=True)


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    device: str = "auto",
    stop_after: int | None = None,
) -> RunResult:
    """Train ``cfg`` in ``run_dir`` (fresh, or from its latest checkpoint) to ``cfg.steps``.

    ``stop_after`` ends the run early, with a checkpoint, as a preempted job would; the
    learning-rate schedule still spans ``cfg.steps``. Every rank runs this; under torchrun
    the process group comes from the environment.
    """
    run_dir = Path(run_dir)
    # Every check reads only: no rank may write before all have looked at the same disk.
    resume_from = check_resumable(run_dir) if resume else None
    if not resume:
        check_fresh(run_dir)
    topo = distributed.init(device)
    try:
        return _train(cfg, run_dir, topo, resume_from, stop_after or cfg.steps)
    finally:
        distributed.shutdown(topo)


def _train(
    cfg: TrainConfig, run_dir: Path, topo: Topology, resume_from: Path | None, last: int
) -> RunResult:
    if topo.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_from is None:
            cfg.save(run_dir)
    distributed.barrier(topo)
    trainer = build(cfg, run_dir, topo)
    start_step = trainer.load(resume_from) if resume_from is not None else 0
    started = time.monotonic()
    journal = JournalWriter(run_dir, rank=topo.rank, restart=topo.restart)
    journal.emit(
        "run_start",
        start_step,
        world_size=topo.world_size,
        pid=os.getpid(),
        host=socket.gethostname(),
        target_steps=cfg.steps,
        preset=cfg.preset,
        seed=cfg.seed,
        precision=cfg.precision,
        device=topo.device.type,
        resumed_from=str(resume_from) if resume_from else None,
        config=cfg.to_dict(),
    )
    if resume_from is not None:
        journal.emit("checkpoint_loaded", start_step, path=str(resume_from))
    _print(
        topo,
        f"tightrope reference trainer: preset {cfg.preset}, "
        f"{trainer.model.num_parameters() / 1e6:.2f}M parameters, "
        f"{topo.world_size} rank(s) x {cfg.batch_size * cfg.grad_accum} x "
        f"{cfg.model.block_size} tokens, {cfg.precision} on {topo.device.type}, "
        f"steps {start_step + 1}..{last} of {cfg.steps}, run dir {run_dir}",
    )
    loss = math.nan
    done = start_step
    status, reason = "failed", "interrupted"
    try:
        for step in range(start_step + 1, last + 1):
            observed = trainer.step(step)
            loss, done = observed["loss"], step
            journal.emit("step", step, **observed)
            if step % cfg.checkpoint_every == 0 or step == last:
                _checkpoint(trainer, run_dir, step, journal)
            if step % cfg.log_every == 0 or step == last:
                _print(
                    topo,
                    f"step {step:>6}/{cfg.steps}  loss {loss:8.4f}  lr {observed['lr']:.2e}  "
                    f"{observed['step_time'] * 1e3:7.1f} ms/step",
                )
        if done == cfg.steps:
            status, reason = "completed", ""
        else:
            status, reason = "stopped", f"stopped after step {done} as asked"
    except KeyboardInterrupt:
        status, reason = "stopped", "interrupted by the user"
        raise
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        seconds = time.monotonic() - started
        extra = {"reason": reason} if reason else {}
        journal.emit("run_end", done, status=status, seconds=seconds, **extra)
        journal.close()
    return RunResult(steps=done, final_loss=loss, seconds=seconds)


def _checkpoint(trainer: Trainer, run_dir: Path, step: int, journal: JournalWriter) -> None:
    t0 = time.perf_counter()
    state = trainer.state_dict(step) if trainer.topo.is_main else None
    path = ckpt.save_checkpoint(
        run_dir,
        step,
        state,
        rank=trainer.topo.rank,
        barrier=lambda: distributed.barrier(trainer.topo),
    )
    if trainer.topo.is_main:
        size = sum(f.stat().st_size for f in path.iterdir())
        journal.emit(
            "checkpoint_saved", step, path=str(path), bytes=size, seconds=time.perf_counter() - t0
        )
        ckpt.prune_checkpoints(run_dir, trainer.cfg.keep_checkpoints)
