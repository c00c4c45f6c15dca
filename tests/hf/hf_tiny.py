"""Tiny models, data and tokenizer for the Hugging Face trainer tests (built from configs; nothing downloaded)."""

from __future__ import annotations

import torch

VOCAB = 96


def tiny_llama(seed: int = 0, tied: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=tied)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def tiny_moe(seed: int = 0):
    """A tiny Qwen3-MoE (4 experts, top-2) whose forward adds its router's load-balancing loss (coef 0.5), the
    router drawn large enough to route unevenly."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
                            max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                            output_router_logits=True, router_aux_loss_coef=0.5)
    config._attn_implementation = "sdpa"
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.5)
    return model


def examples(n: int, seed: int, low: int = 9, high: int = 24) -> list[dict]:
    """Sequences of uneven lengths (odd ones: S % 2 != 0), labels = input ids."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(low, high, (1,), generator=gen))
        ids = torch.randint(3, VOCAB, (length,), generator=gen).tolist()
        out.append({"input_ids": ids, "labels": list(ids)})
    return out


def pad_collate(rows: list[dict]) -> dict:
    """Right padding with an attention mask and ignored labels at the pads."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def tokenizer():
    """A word-level tokenizer over the tiny vocabulary ("w3" .. "w95"), made with the tokenizers library."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


__all__ = ["VOCAB", "examples", "pad_collate", "tiny_llama", "tiny_moe", "tokenizer"]
