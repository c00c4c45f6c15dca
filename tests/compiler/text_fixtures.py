"""Text data for the autosp-train tests: a word-level tokenizer made with the ``tokenizers`` library (nothing
downloaded) saved as a Hugging Face tokenizer directory, and documents in every format ``--data`` reads."""

from __future__ import annotations

import json
import random

WORDS = 90
TINY_FLAGS = ["--model", "llama-3.2-1b", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
              "--ffn", "128", "--vocab", "97"]


def make_tokenizer(directory, extra_words: int = 0) -> str:
    """``<unk>`` 0, ``<pad>`` 1, ``<eos>`` 2, then words ``w0 ... w89``: 93 tokens (the tiny model has 97);
    ``extra_words`` more words make another tokenizer."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2}
    vocab.update({f"w{i}": 3 + i for i in range(WORDS + extra_words)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                                unk_token="<unk>")
    fast.save_pretrained(str(directory))
    return str(directory)


def documents(n: int, seed: int = 0, longest: int = 40) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(rng.randrange(1, longest))) for _ in range(n)]


def write_all_formats(directory, docs: list[str]) -> dict:
    """The same documents as .jsonl (field ``body``), .txt (paragraphs), .parquet and a save_to_disk directory."""
    import datasets

    paths = {"jsonl": directory / "docs.jsonl", "txt": directory / "docs.txt", "parquet": directory / "docs.parquet",
             "disk": directory / "docs_disk"}
    paths["jsonl"].write_text("".join(json.dumps({"body": d, "n": i}) + "\n" for i, d in enumerate(docs)))
    paths["txt"].write_text("\n\n".join(d.replace(" ", " \n", 3) for d in docs) + "\n")  # paragraphs span lines
    table = datasets.Dataset.from_dict({"body": docs})
    table.to_parquet(str(paths["parquet"]))
    table.save_to_disk(str(paths["disk"]))
    return {k: str(v) for k, v in paths.items()}
