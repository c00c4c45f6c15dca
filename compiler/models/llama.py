"""A small, readable Llama: the project's own reference causal LM.

Everything a Llama-family decoder has and nothing else: token embedding, pre-norm decoder layers
(RMSNorm, rotary self-attention with grouped-query heads through ``F.scaled_dot_product_attention``,
SwiGLU MLP), a final RMSNorm and an LM head (tied to the embedding or not). ``forward`` computes the
causal-LM loss itself the way current Hugging Face models do (labels shifted with
``pad(labels, (0, 1), value=-100)[..., 1:]``) and derives ``position_ids`` from the sequence length
when none are given, so the SP compiler meets the same patterns as on an HF model.

It is written for clarity, not speed; nothing in it knows about sequence parallelism.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from autosp.contract.specs import ModelSpec

IGNORE_INDEX = -100


class LlamaOutput(NamedTuple):
    loss: torch.Tensor | None
    logits: torch.Tensor


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the given positions: [B, s, head_dim] each."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype):
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        bias = spec.qkv_bias
        self.q_proj = nn.Linear(spec.hidden, spec.n_heads * spec.head_dim, bias=bias)
        self.k_proj = nn.Linear(spec.hidden, spec.n_kv_heads * spec.head_dim, bias=bias)
        self.v_proj = nn.Linear(spec.hidden, spec.n_kv_heads * spec.head_dim, bias=bias)
        self.o_proj = nn.Linear(spec.n_heads * spec.head_dim, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.gated_mlp
        if self.gated:
            self.gate_proj = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden)
        self.attn = Attention(spec)
        self.post_attention_norm = RMSNorm(spec.hidden)
        self.mlp = MLP(spec)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attention_norm(x))


class LlamaModel(nn.Module):
    """The decoder stack: embedding, rotary tables, layers, final norm -> hidden states."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.n_layers))
        self.norm = RMSNorm(spec.hidden)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        cos, sin = self.rotary(position_ids, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama(nn.Module):
    """Decoder-only causal LM built from a :class:`ModelSpec`: the decoder stack, an LM head, the loss.

    (Like Hugging Face's ``*ForCausalLM``, the loss is computed outside the module that loops over the
    layers; under ZeRO-3, where every layer is a graph break, that keeps the loss in a compiled graph.)
    """

    def __init__(self, spec: ModelSpec, init_std: float = 0.02):
        super().__init__()
        if spec.norm != "rmsnorm":
            raise ValueError(f"the reference Llama uses RMSNorm, not {spec.norm!r}")
        if spec.head_dim % 2:
            raise ValueError("rotary embeddings need an even head_dim")
        self.spec = spec
        self.model = LlamaModel(spec)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.init_weights(init_std)
        if spec.tied_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_spec(cls, spec: ModelSpec, **kwargs) -> "Llama":
        return cls(spec, **kwargs)

    def init_weights(self, std: float) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> LlamaOutput:
        logits = self.lm_head(self.model(input_ids, position_ids))
        loss = None
        if labels is not None:
            # Token t predicts token t+1: shift the labels left and ignore the last position.
            shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shift_labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return LlamaOutput(loss, logits)


__all__ = ["IGNORE_INDEX", "MLP", "Attention", "DecoderLayer", "Llama", "LlamaModel", "LlamaOutput", "RMSNorm",
           "RotaryEmbedding", "rotate_half"]
