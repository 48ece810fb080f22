"""Every piece of a fresh run, seeded and wired to the agent: corpus, tokenizer, data
pipeline, model, optimizer, and each stability mechanism's state."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.inside.agent import Agent
from harness.run_layout import RunLayout
from reference_trainer.config import TrainConfig
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.model.gpt import GPT
from reference_trainer.model.optim import build_optimizer, peak_lr
from reference_trainer.processes import distributed
from reference_trainer.processes.distributed import Topology
from reference_trainer.stability.layer_stats import layer_name
from reference_trainer.stability.loss_scale import DynamicLossScaler
from reference_trainer.stability.mechanism import BuildContext
from reference_trainer.stability.oom_retry import MicroBatchSplit
from reference_trainer.stability.precision import Precision
from reference_trainer.stability.registry import build_mechanisms
from reference_trainer.stages.dedup import DedupStage, DuplicateFilter
from reference_trainer.stages.embeddings import SentenceEmbedder
from reference_trainer.stages.semantic_dedup import SemanticDedupStage
from reference_trainer.stages.stage import DocumentStage
from reference_trainer.stages.toxicity import ToxicityStage
from reference_trainer.step import Trainer
from reference_trainer.stream.batching import PackedLoader, PackedStream
from reference_trainer.stream.data import (
    DocumentPipeline,
    ShardedLoader,
    TokenLayout,
    TokenStream,
)
from reference_trainer.tokenizer import cache as tokenizer_cache
from reference_trainer.tokenizer.bpe import (
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)
from reference_trainer.tokenizer.fallback import (
    FallbackProbe,
    TokenFallback,
    encodable,
)
from reference_trainer.tokenizer.keep_whole import keep_whole


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _tokenizer(cfg: TrainConfig, run_dir: Path, corpus: Corpus, topo: Topology) -> Any:
    path = RunLayout(run_dir).tokenizer
    if topo.is_main and not path.exists():
        folder, key = tokenizer_cache.cache_folder(), tokenizer_cache.cache_key(cfg)
        data = tokenizer_cache.cached(folder, key) if folder else None
        if data is not None:
            tokenizer_cache.restore(data, path)
        else:
            texts = [corpus.document(i).text for i in range(cfg.data.tokenizer_docs)]
            trained = train_tokenizer(texts, cfg.model.vocab_size)
            whole, _ = keep_whole(trained, texts, cfg.model.vocab_size, cfg.data.tokenizer)
            save_tokenizer(whole, run_dir)
            if folder:
                tokenizer_cache.store(folder, key, path.read_bytes())
    distributed.barrier(topo)
    return load_tokenizer(run_dir, cfg.model.vocab_size)


def document_stages(
    cfg: TrainConfig,
    run_dir: Path | None = None,
    *,
    is_main: bool = True,
    embedder: SentenceEmbedder | None = None,
) -> list[DocumentStage]:
    """The stages switched on, in the order a document meets them (``run_dir``: where the
    toxicity filter's review files are; rank 0 alone writes its queue). ``embedder``: the
    one embedding model every stage that needs one shares, loaded on the first use of any."""
    stages: list[DocumentStage] = []
    embedder = embedder or SentenceEmbedder()
    if cfg.stability.dedup.enabled:
        stages.append(DedupStage(DuplicateFilter(cfg.stability.dedup)))
    if cfg.stability.semantic_dedup.enabled:
        stages.append(SemanticDedupStage(cfg.stability.semantic_dedup, embedder))
    if cfg.stability.toxicity.enabled:
        toxicity = cfg.stability.toxicity
        stages.append(
            ToxicityStage(toxicity, run_dir=run_dir, writes_queue=is_main, embedder=embedder)
        )
    return stages


@dataclass(frozen=True, slots=True)
class DataPieces:
    """The data side of a run: documents through their stages, tokens, batches."""

    documents: DocumentPipeline
    stream: TokenStream | PackedStream
    loader: ShardedLoader | PackedLoader
    probe: FallbackProbe | None
    embedder: SentenceEmbedder


def build_data(cfg: TrainConfig, run_dir: Path, topo: Topology, agent: Agent) -> DataPieces:
    """Corpus, tokenizer, document stages, token stream and this rank's loader."""
    corpus = Corpus(cfg.data.source_weights, cfg.data.seed)
    tokenizer = _tokenizer(cfg, run_dir, corpus, topo)

    def encode(texts: list[str]) -> list[list[int]]:
        safe = [encodable(t) for t in texts]
        return [e.ids for e in tokenizer.encode_batch(safe, add_special_tokens=False)]

    fallback_cfg = cfg.stability.tokenizer_fallback
    probe = FallbackProbe.of(tokenizer, fallback_cfg.max_digit_run)
    fallback = TokenFallback(fallback_cfg, probe) if fallback_cfg.enabled else None

    embedder = SentenceEmbedder()
    documents = DocumentPipeline(
        corpus,
        wrap=agent.document_wrapper(),
        stages=document_stages(cfg, run_dir, is_main=topo.is_main, embedder=embedder),
    )
    layout = TokenLayout.from_config(cfg.data, eot_id=0)
    stream: TokenStream | PackedStream
    loader: ShardedLoader | PackedLoader
    batching = cfg.data.batching
    if batching.enabled:  # whole documents under a token budget (docs/data.md)
        stream = PackedStream(
            documents,
            encode,
            layout,
            max_len=cfg.model.block_size + 1,
            budget=batching.budget(cfg.batch_size, cfg.model.block_size),
            sort_pool=batching.sort_pool,
            seed=cfg.data.seed,
            fallback=fallback,
        )
        loader = PackedLoader(
            stream, grad_accum=cfg.grad_accum, rank=topo.rank, world_size=topo.world_size
        )
    else:
        stream = TokenStream(
            documents,
            encode,
            layout,
            window=cfg.model.block_size + 1,
            fallback=fallback,
            tag_sources=cfg.stability.quality_sampling.enabled,
        )
        loader = ShardedLoader(
            stream,
            batch_size=cfg.batch_size,
            grad_accum=cfg.grad_accum,
            rank=topo.rank,
            world_size=topo.world_size,
        )
    return DataPieces(documents, stream, loader, probe, embedder)


def build(cfg: TrainConfig, run_dir: Path, topo: Topology, agent: Agent) -> Trainer:
    """Every piece of a fresh run (seeded by ``cfg.seed``), wired to the agent."""
    data = build_data(cfg, run_dir, topo, agent)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = GPT(cfg.model_config()).to(topo.device)
    # Dropout and any other draw differ per rank, as they would on a real cluster.
    seed_everything(cfg.seed + 1 + topo.rank)
    optimizer = build_optimizer(model, cfg.optim)
    wrapped: torch.nn.Module = model
    if topo.distributed:
        ids = [topo.local_rank] if topo.device.type == "cuda" else None
        wrapped = DDP(model, device_ids=ids)
    scaler = DynamicLossScaler(cfg.stability.loss_scale, active=cfg.precision == "fp16")
    context = BuildContext(
        stability=cfg.stability,
        precision=cfg.precision,
        warmup_steps=cfg.optim.warmup_steps,
        steps=cfg.steps,
        global_batch=cfg.global_batch(topo.world_size),
        optimizer=cfg.optim.name,
        source_weights=cfg.data.source_weights,
        seed=cfg.seed,
        model=model,
        topo=topo,
        scaler=scaler,
        documents=data.documents,
        loader=data.loader,
    )
    mechanisms = build_mechanisms(context)
    retry = cfg.stability.oom_retry
    agent.model, agent.optimizer = model, optimizer
    agent.name_layers(layer_name)  # its own diagnosis's names: embedding, blocks.N, ln_f
    if wrapped is not model:
        agent.watch_data_parallel(wrapped)
    return Trainer(
        cfg=cfg,
        topo=topo,
        embedder=data.embedder,
        model=model,
        wrapped=wrapped,
        optimizer=optimizer,
        precision=Precision(cfg.precision, topo.device.type),
        scaler=scaler,
        mechanisms=mechanisms,
        documents=data.documents,
        stream=data.stream,
        loader=data.loader,
        agent=agent,
        max_lr=peak_lr(cfg, topo.world_size),
        probe=data.probe,
        micro_split=MicroBatchSplit(retry, topo.rank) if retry.enabled else None,
    )
