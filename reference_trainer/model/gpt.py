"""A small decoder-only GPT, one module per idea, in the manner of nanoGPT."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from reference_trainer.errors import ConfigError
from reference_trainer.model.stable_embedding import StableEmbedding


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    """Shape of the model."""

    vocab_size: int
    """Tokens in the vocabulary (the tokenizer is trained to this size)."""
    block_size: int
    """Longest context, in tokens."""
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True
    """Biases in linear layers and norms."""
    stable_embedding: bool | None = None
    """A layer norm after the token lookup and xavier-initialized rows
    (`stable_embedding.StableEmbedding`); unset: on for the optimizers that want it
    (adamw8bit), off otherwise (`TrainConfig.model_config` settles it)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value > 0):
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be a multiple of model.n_head ({self.n_head})"
            )
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.stable_embedding not in (None, True, False):
            raise ConfigError(
                f"model.stable_embedding must be true, false or null, got {self.stable_embedding!r}"
            )


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention that sees only earlier positions."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        out: torch.Tensor = self.resid_drop(self.proj(y))
        return out


class MLP(nn.Module):
    """The feed-forward sublayer: expand four times, GELU, project back."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.drop(self.proj(F.gelu(self.fc(x))))
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        #: Run this block in fp32 even under low-precision autocast (precision switching).
        self.fp32 = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if self.fp32 and torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                return self._forward(x.float())
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class GPT(nn.Module):
    """Token and position embeddings, a stack of blocks, a final norm and a tied head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        # The head below shares this weight, stable or not (docs/stability.md, 8-bit AdamW).
        self.wte = (
            StableEmbedding(config.vocab_size, config.n_embd)
            if config.stable_embedding
            else nn.Embedding(config.vocab_size, config.n_embd)
        )
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        if isinstance(self.wte, StableEmbedding):
            self.wte.reset_parameters()  # its xavier rows, which the tied head's init drew over
        # Residual projections start smaller so the residual stream does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for token ids (B, T)."""
        _, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return logits

    def num_parameters(self) -> int:
        """Distinct parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32 whatever the autocast dtype."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
