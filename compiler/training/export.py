"""``autosp-export CHECKPOINT --out HF_DIR``: an autosp checkpoint as a Hugging Face model directory.

Writes ``config.json``, the weights as safetensors (``model.safetensors``, or ``model-0000i-of-0000N.safetensors``
shards and ``model.safetensors.index.json`` beyond ``SHARD_BYTES``) and, when the run used a tokenizer, its
files: ``transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)`` loads it. The checkpoint holds every
parameter's fp32 weight as ranges written by the saving ranks, whatever the plan and ZeRO stage; the export asks
torch.distributed.checkpoint for whole tensors, a group of about 1 GiB at a time, in one process
(``dcp.load(..., no_dist=True)``, :mod:`.checkpoint_read`), and holds at most that group and one output shard: no
GPU, no process group, no full model in memory. It needs no transformers either; only loading the result does.
Checkpoints of format version 1 (safetensors shards) are read one tensor at a time.

- A Hugging Face model (trained from a config.json): the checkpoint's ``config.json`` and parameter names.
- autosp's reference Llama (a preset, :mod:`autosp.compiler.models.llama`): written as ``LlamaForCausalLM``
  (``Qwen2ForCausalLM`` when it has q/k/v biases: Llama's ``attention_bias`` would add an o_proj bias the
  reference model does not have), its parameters renamed to transformers' names and its config written from
  the preset's shape; same RMSNorm epsilon, rotary convention and SwiGLU MLP, so the loss is the same.

Written atomically: into ``.HF_DIR.partial`` and renamed; an existing non-empty HF_DIR is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from autosp.errors import UsageError

__all__ = ["build_parser", "check_out_dir", "export_hf", "hf_config_for_reference", "main", "reference_name"]

SHARD_BYTES = 2 << 30
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")
_REFERENCE_NAMES = (("model.layers.{}.input_norm.", "model.layers.{}.input_layernorm."),
                    ("model.layers.{}.post_attention_norm.", "model.layers.{}.post_attention_layernorm."),
                    ("model.layers.{}.attn.", "model.layers.{}.self_attn."))
RMS_NORM_EPS = 1e-6  # autosp.compiler.models.llama.RMSNorm's default


def check_out_dir(path: str, flag: str = "--out") -> None:
    """HF_DIR must be new or an empty directory (an export never overwrites a model)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(f"{flag} {path} exists and is not a directory")
        if os.listdir(path):
            raise UsageError(f"{flag} {path} is not empty; choose a new directory (an export never overwrites)")
    ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):  # missing parents are created
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"{flag} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK):
        raise UsageError(f"{flag} {path}: {ancestor} is not writable")


def reference_name(name: str) -> str:
    """transformers' name of a reference-Llama parameter (model.layers.3.attn.q_proj.weight ->
    model.layers.3.self_attn.q_proj.weight)."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
        index = parts[2]
        for ours, theirs in _REFERENCE_NAMES:
            prefix = ours.format(index)
            if name.startswith(prefix):
                return theirs.format(index) + name[len(prefix):]
    return name


def hf_config_for_reference(spec: dict, dtype: str) -> dict:
    """The config.json of transformers' Llama (or Qwen2) equal to a reference-Llama spec."""
    if not spec.get("gated_mlp", True):
        raise UsageError(f"{spec.get('name')} has a plain GELU MLP; transformers has no Llama-family class with one, "
                         "so it cannot be exported as a Hugging Face model")
    qwen = bool(spec.get("qkv_bias"))
    config = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": spec["hidden"], "intermediate_size": spec["ffn_hidden"],
        "num_hidden_layers": spec["n_layers"], "num_attention_heads": spec["n_heads"],
        "num_key_value_heads": spec["n_kv_heads"], "head_dim": spec["head_dim"], "vocab_size": spec["vocab"],
        "hidden_act": "silu", "rms_norm_eps": RMS_NORM_EPS, "tie_word_embeddings": bool(spec["tied_embeddings"]),
        "max_position_embeddings": spec.get("max_position") or 131072,
        "rope_theta": spec["rope_theta"], "rope_parameters": {"rope_type": "default", "rope_theta": spec["rope_theta"]},
        "dtype": dtype, "use_cache": True,
    }
    if not qwen:
        config.update(attention_bias=False, mlp_bias=False)
    else:
        config.update(use_sliding_window=False)
    return config


def _resolve(checkpoint: str) -> str:
    """A checkpoint directory, or a --save-dir (its newest complete checkpoint)."""
    if os.path.isdir(checkpoint) and not os.path.exists(os.path.join(checkpoint, "meta.json")):
        from autosp.compiler.training.save_dir import complete_checkpoints, find_resume

        if complete_checkpoints(checkpoint) or os.path.exists(os.path.join(checkpoint, "latest")):
            return find_resume(checkpoint)
    return checkpoint


def export_hf(checkpoint: str, out: str, dtype: str = "fp32") -> str:
    """Write the Hugging Face model directory ``out`` from the autosp checkpoint ``checkpoint``; returns ``out``."""
    import torch
    from safetensors.torch import save as safetensors_bytes

    from autosp.compiler.training.checkpoint import fsync_dir, read_meta, write_file

    check_out_dir(out)
    checkpoint = _resolve(checkpoint)
    meta = read_meta(checkpoint)
    model = meta["model"]
    torch_dtype = getattr(torch, DTYPES[dtype])
    if model.get("kind") == "reference":
        config = hf_config_for_reference(model["spec"], DTYPES[dtype])
        rename = reference_name
    elif model.get("kind") == "hf":
        try:
            with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as err:
            raise UsageError(f"checkpoint {checkpoint} is corrupt: its config.json is unreadable ({err})") from None
        config["dtype"] = DTYPES[dtype]
        config.pop("torch_dtype", None)
        config["use_cache"] = True
        rename = str
    else:
        raise UsageError(f"checkpoint {checkpoint} holds a {model.get('class')}, neither a Hugging Face model nor "
                         "autosp's reference Llama: there is no Hugging Face config to export it with")

    out = os.path.abspath(out)
    partial = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        os.makedirs(partial)  # and the missing parents
        shards, pending, pending_bytes = [], {}, 0

        def flush():
            nonlocal pending, pending_bytes
            if pending:
                name = f"shard-{len(shards):05d}"
                write_file(os.path.join(partial, name), safetensors_bytes(pending, metadata={"format": "pt"}))
                shards.append((name, list(pending)))
                pending, pending_bytes = {}, 0

        for name, weight in _weights(checkpoint, meta):  # the model's order, a few tensors read at a time
            tensor = weight.to(torch_dtype).contiguous()
            pending[rename(name)] = tensor
            pending_bytes += tensor.numel() * tensor.element_size()
            if pending_bytes >= SHARD_BYTES:
                flush()
        flush()
        if len(shards) == 1:
            os.rename(os.path.join(partial, shards[0][0]), os.path.join(partial, "model.safetensors"))
        else:
            weight_map = {}
            for i, (name, tensors) in enumerate(shards):
                final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                os.rename(os.path.join(partial, name), os.path.join(partial, final))
                weight_map.update({t: final for t in tensors})
            index = {"metadata": {"total_size": sum(os.path.getsize(os.path.join(partial, f))
                                                    for f in set(weight_map.values()))},
                     "weight_map": weight_map}
            write_file(os.path.join(partial, "model.safetensors.index.json"), json.dumps(index, indent=1).encode())
        write_file(os.path.join(partial, "config.json"), (json.dumps(config, indent=2) + "\n").encode())
        _copy_tokenizer(meta, partial)
        fsync_dir(partial)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.rename(partial, out)
        fsync_dir(os.path.dirname(out))
    except UsageError:  # a damaged checkpoint
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except OSError as err:
        shutil.rmtree(partial, ignore_errors=True)
        raise UsageError(f"cannot write {out}: {err.strerror or err}; nothing was exported") from None
    return out


def _weights(checkpoint: str, meta: dict):
    """(name, fp32 weight) of every parameter; a damaged data file is one line."""
    from autosp.compiler.training.checkpoint_read import full_weights

    try:
        yield from full_weights(checkpoint, meta)
    except Exception as err:  # noqa: BLE001 - DCP's and safetensors' errors on a damaged file
        raise UsageError(f"checkpoint {checkpoint} is corrupt ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:160] if str(err) else ''}); export an earlier one") from None


def _copy_tokenizer(meta: dict, partial: str) -> None:
    tokenizer = meta.get("client_state", {}).get("tokenizer")
    if not tokenizer:
        return
    if not os.path.isdir(tokenizer):
        print(f"autosp-export: the run's tokenizer {tokenizer} no longer exists; the export has no tokenizer "
              "(copy its files into the output yourself)", file=sys.stderr, flush=True)
        return
    for name in TOKENIZER_FILES:
        source = os.path.join(tokenizer, name)
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(partial, name))


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see autosp-export --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autosp-export",
                     description="Write an autosp checkpoint (saved under any plan and ZeRO stage) as a Hugging Face "
                                 "model directory: safetensors weights, config.json and the run's tokenizer, loadable "
                                 "with transformers.AutoModelForCausalLM.from_pretrained(HF_DIR).",
                     epilog="example: autosp-export runs/ckpt --out my-model   (runs/ckpt: a --save-dir, whose newest "
                            "checkpoint is exported, or one step-N directory)")
    parser.add_argument("checkpoint", help="a checkpoint directory (DIR/step-N) or a --save-dir (its newest)")
    parser.add_argument("--out", required=True, metavar="HF_DIR", help="new (or empty) output directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                        help="weights' dtype in the export (default fp32: the checkpoint's master weights)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not os.path.exists(args.checkpoint):
        raise UsageError(f"checkpoint {args.checkpoint} does not exist")
    out = export_hf(args.checkpoint, args.out, args.dtype)
    print(f"autosp-export: wrote {out} (transformers.AutoModelForCausalLM.from_pretrained({out!r}))")
    return 0

