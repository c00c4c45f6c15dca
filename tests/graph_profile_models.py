"""A small causal LM that is not a Hugging Face model, for the graph-profile tests.

``tiny_lm(num_layers=3)`` is the entry point ``graph_profile_models:tiny_lm`` (importable when tests/ is
on sys.path, as under pytest): pre-LayerNorm blocks, multi-head causal SDPA with a fused qkv projection
and biases, a plain GELU MLP 4x wide, tied embeddings; ``forward(input_ids, labels=None)`` returns
logits [batch, seq, vocab] (the profiler computes the causal-LM loss itself).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

HIDDEN, HEADS, VOCAB = 96, 3, 500


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, num_layers: int, hidden: int = HIDDEN, heads: int = HEADS, vocab: int = VOCAB):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids, labels=None):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tiny_lm(num_layers: int = 3) -> TinyLM:
    return TinyLM(num_layers)
