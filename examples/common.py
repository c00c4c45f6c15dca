"""What the three examples share: the model (a Hugging Face name or directory; a directory holding only a
config.json, like docs/examples/tiny-llama, is built from that config with random weights, for CPU runs),
its tokenizer (a word-level one made with the tokenizers library when the model directory has none) and the
options every example takes."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "examples", "tiny-llama")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=TINY, help="a Hugging Face model name or directory (default: a tiny Llama "
                                                 "built from docs/examples/tiny-llama/config.json)")
    p.add_argument("--sp-size", type=int, default=2, help="sequence-parallel degree (default 2)")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    p.add_argument("--output-dir", default=default_output_dir(),
                   help="where the trained model is saved (default: %(default)s)")
    return p


def default_output_dir() -> str:
    """Where an example saves its model unless told: the system's temporary folder (``$TMPDIR``), one directory
    per script, the same on every rank of a machine; never the directory it is run from (the checkout)."""
    script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    return os.path.join(tempfile.gettempdir(), "autosp-examples", script)


def save(trainer, output_dir: str) -> None:
    """Save the trained model (rank 0 writes it) and say where."""
    trainer.save_model(output_dir)
    if trainer.is_world_process_zero():
        print(f"saved the trained model to {output_dir}")


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def backend() -> str:
    """inductor on GPUs; aot_eager on CPU (same graphs, no C++ compiler needed)."""
    return "inductor" if on_gpu() else "aot_eager"


def _only_config(name: str) -> bool:
    return os.path.isdir(name) and not any(f.endswith((".safetensors", ".bin")) for f in os.listdir(name))


def load_model(name: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if on_gpu() else torch.float32
    if _only_config(name):
        torch.manual_seed(0)
        config = AutoConfig.from_pretrained(name)
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa", dtype=dtype)


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def load_tokenizer(name: str, vocab_size: int | None = None):
    """The model's tokenizer, or for a config-only directory a word-level one over ``w3 .. w{vocab-1}``,
    ``user:`` and ``assistant:`` (with a chat template)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not _only_config(name):
        tok = AutoTokenizer.from_pretrained(name)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "user:": 3, "assistant:": 4,
             **{f"w{i}": i for i in range(5, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def words(gen, n: int, vocab_size: int) -> str:
    """``n`` random vocabulary words: stand-in text for the tiny model (real runs bring their own data)."""
    import torch

    return " ".join(f"w{int(i)}" for i in torch.randint(5, min(vocab_size, 1000), (n,), generator=gen))
