"""A stand-in for "your model and your text" in the README's fine-tuning walk-through, small enough for a CPU.

    python -m studies.walkthrough_model out/walk

writes ``out/walk/model/`` (a 2-layer Llama ``config.json`` with its randomly initialised weights and a word-level
tokenizer made with the ``tokenizers`` library: nothing is downloaded), ``out/walk/corpus.jsonl`` and
``out/walk/heldout.jsonl`` (documents of random words, field ``text``). On a GPU cluster put your own model
directory and text in their place; every later command of the walk-through stays the same.
"""

from __future__ import annotations

import argparse
import json
import os
import random

WORDS = 200


def write_tokenizer(directory: str) -> None:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, **{f"w{i}": 3 + i for i in range(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                         unk_token="<unk>").save_pretrained(directory)


def write_documents(path: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            words = " ".join(f"w{rng.randrange(WORDS)}" for _ in range(rng.randrange(20, 400)))
            f.write(json.dumps({"text": words}) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write model/, corpus.jsonl and heldout.jsonl into")
    args = parser.parse_args(argv)
    import torch
    import transformers

    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    write_tokenizer(model_dir)
    config = transformers.LlamaConfig(vocab_size=WORDS + 3, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                                      eos_token_id=2, pad_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
    write_documents(os.path.join(args.out, "corpus.jsonl"), 400, seed=0)
    write_documents(os.path.join(args.out, "heldout.jsonl"), 40, seed=1)
    print(f"wrote {model_dir} (tiny Llama + tokenizer), {args.out}/corpus.jsonl, {args.out}/heldout.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
