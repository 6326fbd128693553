"""A small GPT-style character-level language model (nanoGPT-like) plus data helpers.

The model is written with plain, shape-static ops so that it traces cleanly on a
lazy/XLA backend:
  * explicit attention (matmul, masked_fill, softmax) instead of
    F.scaled_dot_product_attention,
  * no ops whose output shape depends on tensor values (nonzero, masked_select,
    boolean indexing),
  * positions built with torch.arange, causal mask kept as a buffer.

The output head is tied to the token embedding by computing
``F.linear(x, tok_emb.weight)`` directly instead of sharing a Parameter between
two modules: ``module.to(device)`` may replace Parameters with new objects on
some backends, which would silently untie the weights.

Batches are sampled on the CPU with a ``torch.Generator``, so the data stream is
identical whatever device the model runs on; callers move (x, y) to the device.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny_corpus.txt")


# ----------------------------------------------------------------------------- model


@dataclass
class GPTConfig:
    vocab_size: int = 128  # set from the corpus vocabulary in practice
    block_size: int = 64  # maximum context length
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v projections in one matmul
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        # Causal mask: True strictly above the diagonal, i.e. where a query would see
        # a future key. Built from torch.tril; kept as a buffer, not in the state_dict.
        allowed = torch.tril(torch.ones(cfg.block_size, cfg.block_size))
        future = (allowed == 0).view(1, 1, cfg.block_size, cfg.block_size)
        self.register_buffer("future_mask", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)

        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att.masked_fill(self.future_mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = torch.matmul(att, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # re-assemble heads
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer decoder block."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.apply(self._init_weights)
        # GPT-2 style scaled init of the residual output projections.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx, targets: (B, T) int64. Returns (logits (B, T, V), loss or None)."""
        B, T = idx.shape
        assert T <= self.cfg.block_size, f"sequence length {T} > block_size {self.cfg.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.tok_emb.weight)  # head tied to the token embedding
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Autoregressive sampling. Meant for the CPU: the context length changes
        every step, which on a lazy backend would mean a new graph per step."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.cfg.block_size:]
            logits, _ = self(ctx)
            probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


# ----------------------------------------------------------------------------- data


class CharVocab:
    """Character-level vocabulary built from a text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def load_corpus(path: str = DEFAULT_CORPUS):
    """Returns (text, vocab, data) where data is the whole corpus as a 1-D LongTensor."""
    with open(path, "r", encoding="ascii") as f:
        text = f.read()
    vocab = CharVocab(text)
    return text, vocab, vocab.encode(text)


def get_batch(data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator):
    """Samples `batch_size` random windows of `data` on the CPU.

    Returns CPU LongTensors x, y of shape (batch_size, block_size) where y is x
    shifted by one character (the next-token targets).
    """
    starts = torch.randint(0, data.numel() - block_size - 1, (batch_size, 1), generator=generator)
    offsets = starts + torch.arange(block_size).unsqueeze(0)  # (B, T) indices into data
    return data[offsets], data[offsets + 1]


def make_model(vocab_size: int, **overrides) -> GPT:
    """Builds a GPT on the CPU with default config, `vocab_size` and any overrides."""
    return GPT(GPTConfig(vocab_size=vocab_size, **overrides))
