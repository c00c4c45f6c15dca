"""The files the bad-input cases point at, each made on first use in a case's directory.

A case writes ``@name`` for a fixture; :func:`materialize` makes ``name`` (and what it depends on) in
the directory and returns its path. Every fixture says in :data:`DESCRIPTIONS` what it is, for the table
in docs/bad-inputs.md. Special files (a named pipe, a socket, a device node) are made here, in the
temporary directory, never taken from the system: the device node is a new node of the null device
(``mknod c 1 3``), or a named pipe where this process may not make device nodes.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

__all__ = ["DESCRIPTIONS", "materialize", "special_kind"]

REPO = Path(__file__).resolve().parents[2]
TINY_TRAIN = ["--model", "llama-3.2-1b", "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
              "--ffn", "128", "--vocab", "97", "--sp", "1", "--ctx", "64", "--steps", "1", "--backend", "aot_eager",
              "--dtype", "fp32"]
"""A reference Llama small enough that building it takes no time (vocabulary 97)."""

GEMMA2_TINY = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh",
               "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 8192,
               "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
               "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-06, "sliding_window": 4096, "vocab_size": 97}
LLAMA_TINY = json.loads((REPO / "docs" / "examples" / "tiny-llama" / "config.json").read_text())

DESCRIPTIONS: dict[str, str] = {}
_MAKERS: dict[str, object] = {}


def fixture(name: str, description: str):
    def register(make):
        DESCRIPTIONS[name] = description
        _MAKERS[name] = make
        return make
    return register


def materialize(name: str, directory: Path) -> str:
    """The path of fixture ``name`` in ``directory``, made if it is not there yet."""
    path = directory / name
    if not os.path.lexists(path):
        _MAKERS[name](path, directory)
    return str(path)


def special_kind(path: str) -> str:
    """What a special-file fixture turned out to be (for the table)."""
    mode = os.lstat(path).st_mode
    return "device node" if stat.S_ISCHR(mode) else "named pipe" if stat.S_ISFIFO(mode) else "socket"


def _text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _json(path: Path, data) -> None:
    _text(path, json.dumps(data, indent=1))


def _edited_plan(edit):
    def make(path: Path, directory: Path) -> None:
        data = json.loads(Path(materialize("plan.json", directory)).read_text())
        edit(data)
        _json(path, data)
    return make


def _edited_ds(edit):
    def make(path: Path, directory: Path) -> None:
        data = json.loads(Path(materialize("ds.json", directory)).read_text())
        edit(data)
        _json(path, data)
    return make


def _toml(text: str):
    return lambda path, directory: _text(path, text)


def _hw_json(edit):
    def make(path: Path, directory: Path) -> None:
        data = json.loads((REPO / "studies" / "results" / "calibrated-cpux2.json").read_text())
        edit(data)
        _json(path, data)
    return make


def _config(edit):
    def make(path: Path, directory: Path) -> None:
        data = dict(LLAMA_TINY)
        edit(data)
        _json(path, data)
    return make


def _tokens(values, dtype: str):
    def make(path: Path, directory: Path) -> None:
        import numpy as np

        np.save(path, np.asarray(values, dtype=dtype))
    return make


# -- plans and DeepSpeed configs ----------------------------------------------------------------------

@fixture("plan.json", "a valid plan: llama-3.2-1b at 8k tokens on h100x8 (sp x dp = 8 processes)")
def _plan(path: Path, directory: Path) -> None:
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest
    from autosp.planner.ds_config import write_outputs

    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100x8", trials=20), cache=None)
    write_outputs(plan, str(path), str(directory / "ds.json"))


@fixture("off.json", "a plan that offloads activations: llama-3.1-8b at 1M tokens on h100x8")
def _offload_plan(path: Path, directory: Path) -> None:
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest
    from autosp.contract.plan import save_plan

    plan = plan_for(PlanRequest(model="llama", ctx="1M", hw="h100x8", trials=20), cache=None)
    assert plan.candidate.offload_activations, "the offloading fixture needs a plan that offloads"
    save_plan(plan, str(path))


@fixture("ds.json", "the DeepSpeed config written with plan.json (--ds-config)")
def _ds(path: Path, directory: Path) -> None:
    materialize("plan.json", directory)


fixture("plan-bom.json", "plan.json saved with a UTF-8 byte-order mark")(
    lambda path, d: path.write_bytes(b"\xef\xbb\xbf" + Path(materialize("plan.json", d)).read_bytes()))
fixture("plan-v99.json", "plan.json claiming schema_version 99")(_edited_plan(lambda p: p.update(schema_version=99)))
fixture("plan-v-str.json", "plan.json with schema_version \"2\" (a string)")(
    _edited_plan(lambda p: p.update(schema_version="2")))
fixture("plan-nocand.json", "plan.json without its candidate")(_edited_plan(lambda p: p.pop("candidate")))
fixture("plan-sp0.json", "plan.json with candidate.sp = 0")(_edited_plan(lambda p: p["candidate"].update(sp=0)))
fixture("plan-ckpt.json", "plan.json with checkpointing \"everything\"")(
    _edited_plan(lambda p: p["candidate"].update(checkpointing="everything")))
fixture("plan-peak0.json", "plan.json whose hardware has peak_flops 0")(
    _edited_plan(lambda p: p["hardware"]["accelerator"].update(peak_flops=0)))
fixture("plan-extra.json", "plan.json with an unknown top-level field")(_edited_plan(lambda p: p.update(colour="red")))
fixture("plan-unknown-cand.json", "plan.json with an unknown candidate field")(
    _edited_plan(lambda p: p["candidate"].update(turbo=True)))
fixture("plan-seqchunks.json", "plan.json with sequence_chunks = 2 and overlap head_pipeline (chunked layers need "
                               "one attention per layer)")(
    _edited_plan(lambda p: p["candidate"].update(sequence_chunks=2, overlap="head_pipeline")))
fixture("plan-param-z2.json", "plan.json with offload_param at ZeRO stage 2")(
    _edited_plan(lambda p: p["candidate"].update(zero_stage=2, offload_param=True)))
fixture("plan-param-str.json", "plan.json with offload_param \"yes\" (a string)")(
    _edited_plan(lambda p: p["candidate"].update(offload_param="yes")))
fixture("plan-objective.json", "plan.json with objective \"fastest\"")(
    _edited_plan(lambda p: p.update(objective="fastest")))
fixture("plan-graph.json", "plan.json recorded as priced by a graph profile")(
    _edited_plan(lambda p: p["search"].update(model_profile="graph 0123456789abcdef")))
fixture("plan-dp3.json", "plan.json with candidate.dp edited from 8 to 3")(
    _edited_plan(lambda p: p["candidate"].update(dp=3)))
fixture("plan-zero-true.json", "plan.json with zero_stage true (a JSON boolean)")(
    _edited_plan(lambda p: p["candidate"].update(zero_stage=True)))
fixture("plan-nan.json", "plan.json whose hardware memory_bandwidth is NaN")(
    _edited_plan(lambda p: p["hardware"]["accelerator"].update(memory_bandwidth=float("nan"))))
fixture("ds-batch.json", "ds.json with train_batch_size edited by hand")(
    _edited_ds(lambda d: d.update(train_batch_size=3)))
fixture("ds-nokey.json", "ds.json whose autosp section lacks sp")(_edited_ds(lambda d: d["autosp"].pop("sp")))
fixture("plan-chunkoff.json", "plan.json with offload_chunks on and sequence_chunks 1")(
    _edited_plan(lambda p: p["candidate"].update(sequence_chunks=1, offload_chunks=True)))
fixture("plan-chunks0.json", "plan.json with sequence_chunks 0")(
    _edited_plan(lambda p: p["candidate"].update(sequence_chunks=0)))
fixture("ds-chunkoff.json", "ds.json with offload_chunks \"yes\" (a string)")(
    _edited_ds(lambda d: d["autosp"].update(sequence_chunks=4, offload_chunks="yes")))
fixture("ds-chunks-str.json", "ds.json with sequence_chunks \"4\" (a string)")(
    _edited_ds(lambda d: d["autosp"].update(sequence_chunks="4")))
fixture("empty.json", "an empty file")(lambda path, d: _text(path, ""))
fixture("null.json", "a JSON null")(lambda path, d: _text(path, "null"))
fixture("array.json", "a JSON array")(lambda path, d: _text(path, "[1, 2]"))
fixture("object.json", "a JSON object that is neither a plan nor a config")(lambda path, d: _text(path, '{"a": 1}'))
fixture("deep.json", "100,000 nested JSON arrays")(lambda path, d: _text(path, "[" * 100_000 + "]" * 100_000))
fixture("bigint.json", "a JSON integer of 10,000 digits")(lambda path, d: _text(path, "1" * 10_000))
fixture("bin.json", "600 random bytes named .json")(lambda path, d: path.write_bytes(bytes(range(200, 256)) * 11))
fixture("big.json", "a 65 MiB file named .json")(lambda path, d: path.write_bytes(b" " * (65 * 2**20)))
fixture("cands", "a directory holding plan.json and bin.json")(
    lambda path, d: (path.mkdir(), (path / "a.json").write_bytes(Path(materialize("plan.json", d)).read_bytes()),
                     (path / "b.json").write_bytes(Path(materialize("bin.json", d)).read_bytes())))
fixture("emptydir", "an empty directory")(lambda path, d: path.mkdir())
fixture("afile", "a regular file (used as a directory in paths below it)")(lambda path, d: _text(path, "x"))
fixture("existing.json", "an existing regular file, mode 0640")(
    lambda path, d: (_text(path, "old"), os.chmod(path, 0o640)))
fixture("link.json", "a symbolic link to existing.json")(
    lambda path, d: os.symlink(materialize("existing.json", d), path))


@fixture("fifo.json", "a named pipe (mkfifo)")
def _fifo(path: Path, directory: Path) -> None:
    os.mkfifo(path)


@fixture("sock.json", "a Unix socket")
def _sock(path: Path, directory: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


@fixture("dev.json", "a device node made here (mknod c 1 3, a null device; a named pipe without the right)")
def _dev(path: Path, directory: Path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        os.mkfifo(path)


# -- cluster files and hardware files --------------------------------------------------------------

for _name, _what, _body in [
    ("zero.toml", "base h100, peak_flops = 0", 'base = "h100"\npeak_flops = 0\n'),
    ("huge.toml", "base h100, memory_gib = 1e308", 'base = "h100"\nmemory_gib = 1e308\n'),
    ("negmem.toml", "base h100, memory_gib = -80", 'base = "h100"\nmemory_gib = -80\n'),
    ("strmem.toml", "base h100, memory_gib = \"80\"", 'base = "h100"\nmemory_gib = "80"\n'),
    ("boolmem.toml", "base h100, memory_gib = true", 'base = "h100"\nmemory_gib = true\n'),
    ("typo.toml", "base h100, inter_node_bandwith (typo)", 'base = "h100"\ninter_node_bandwith = 1e9\n'),
    ("nodpn.toml", "no base and no devices_per_node", "peak_flops = 1e12\nmemory_gib = 8\nmemory_bandwidth = 1e11\n"),
    ("nodes0.toml", "base h100, nodes = 0", 'base = "h100"\nnodes = 0\n'),
    ("nodes-float.toml", "base h100, nodes = 1.5", 'base = "h100"\nnodes = 1.5\n'),
    ("dpn-huge.toml", "base h100, devices_per_node = 100000", 'base = "h100"\ndevices_per_node = 100000\n'),
    ("base-unknown.toml", "base = \"h1000\"", 'base = "h1000"\n'),
    ("base-count.toml", "base = \"h100x8\"", 'base = "h100x8"\n'),
    ("nodes2.toml", "base h100, nodes = 2", 'base = "h100"\nnodes = 2\n'),
    ("eff0.toml", "base h100, matmul_efficiency = 0", 'base = "h100"\nmatmul_efficiency = 0\n'),
    ("eff2.toml", "base h100, comm_efficiency = 2", 'base = "h100"\ncomm_efficiency = 2\n'),
    ("nan.toml", "base h100, peak_flops = nan", 'base = "h100"\npeak_flops = nan\n'),
    ("inf.toml", "base h100, memory_bandwidth = inf", 'base = "h100"\nmemory_bandwidth = inf\n'),
    ("peak-huge.toml", "base h100, peak_flops = 1e30", 'base = "h100"\npeak_flops = 1e30\n'),
    ("latency.toml", "base h100, inter_node_latency = 100 (seconds)", 'base = "h100"\ninter_node_latency = 100\n'),
    ("bw-neg.toml", "base h100, intra_node_bandwidth = -1", 'base = "h100"\nintra_node_bandwidth = -1\n'),
    ("nointra.toml", "8 devices per node, no intra_node_bandwidth",
     "devices_per_node = 8\npeak_flops = 1e15\nmemory_gib = 80\nmemory_bandwidth = 3e12\n"),
    ("nointer.toml", "2 nodes, no inter_node_bandwidth",
     "devices_per_node = 8\nnodes = 2\npeak_flops = 1e15\nmemory_gib = 80\nmemory_bandwidth = 3e12\n"
     "intra_node_bandwidth = 4.5e11\n"),
    ("nohost.toml", "base h100, host_bandwidth = 0", 'base = "h100"\nhost_bandwidth = 0\n'),
    ("bad.toml", "malformed TOML", "base = \n"),
    ("table.toml", "a TOML table where a number belongs", 'base = "h100"\npeak_flops = {a = 1}\n'),
    ("smallhost.toml", "base h100, host_memory_gib = 1", 'base = "h100"\nhost_memory_gib = 1\n'),
    ("mib.toml", "base h100, memory_gib = 81920 (MiB by mistake)", 'base = "h100"\nmemory_gib = 81920\n'),
    ("gbps.toml", "base h100, intra_node_bandwidth = 450 (GB/s by mistake)",
     'base = "h100"\nintra_node_bandwidth = 450\n'),
    ("inter-gbps.toml", "base h100, inter_node_bandwidth = 50 (GB/s by mistake)",
     'base = "h100"\ninter_node_bandwidth = 50\n'),
    ("host-gbps.toml", "base h100, host_bandwidth = 64 (GB/s by mistake)", 'base = "h100"\nhost_bandwidth = 64\n'),
    ("hbm-gbps.toml", "base h100, memory_bandwidth = 3350 (GB/s by mistake)",
     'base = "h100"\nmemory_bandwidth = 3350\n'),
    ("usec.toml", "base h100, intra_node_latency = 3 (microseconds by mistake)",
     'base = "h100"\nintra_node_latency = 3\n'),
    ("tflops.toml", "base h100, peak_flops = 989 (TFLOP/s by mistake)", 'base = "h100"\npeak_flops = 989\n'),
    ("host-mib.toml", "base h100, host_memory_gib = 2097152 (MiB by mistake)",
     'base = "h100"\nhost_memory_gib = 2097152\n'),
    ("host-dram-gbps.toml", "base h100, host_memory_bandwidth = 369 (GB/s by mistake)",
     'base = "h100"\nhost_memory_bandwidth = 369\n'),
]:
    fixture(_name, _what)(_toml(_body))

# -- document lengths (--doc-lens) --------------------------------------------------------------------

for _name, _what, _body in [
    ("docs.txt", "document lengths, one per line, with a comment", "# lengths\n16000\n900\n  40000  \n"),
    ("docs-list.json", "a JSON list of document lengths", "[16000, 900, 40000]"),
    ("docs-hist.json", "a JSON histogram {length: count}", '{"16000": 3, "900": 10}'),
    ("docs-empty.txt", "an empty --doc-lens file", ""),
    ("docs-comment.txt", "a --doc-lens file with only a comment", "# no documents\n"),
    ("docs-word.txt", "a --doc-lens file with a word among the lengths", "16000\nabc\n"),
    ("docs-neg.txt", "a negative document length", "16000\n-5\n"),
    ("docs-zero.json", "a document length of 0 in a JSON list", "[16000, 0]"),
    ("docs-float.json", "a fractional document length", "[16000.5]"),
    ("docs-count.json", "a histogram with a negative count", '{"16000": -1}'),
    ("docs-key.json", "a histogram whose key is not a length", '{"long": 3}'),
    ("docs-zero-counts.json", "a histogram whose counts are all 0", '{"16000": 0}'),
    ("docs-bad.json", "malformed JSON", "[16000, "),
    ("docs-str.json", "a JSON string", '"16000"'),
    ("docs-huge.txt", "a document longer than autosp supports", "99999999999999999999\n"),
]:
    fixture(_name, _what)(lambda path, d, body=_body: _text(path, body))

fixture("bin.toml", "random bytes named .toml")(lambda path, d: path.write_bytes(bytes(range(128, 256)) * 4))
fixture("bom.toml", "base h100 with a UTF-8 byte-order mark")(
    lambda path, d: path.write_bytes(b'\xef\xbb\xbfbase = "h100"\n'))
fixture("hw.yaml", "a file that is neither .toml nor .json")(lambda path, d: _text(path, "base: h100\n"))
fixture("cpu1node.json", "a one-node CPU profile from autosp-calibrate (studies/results/calibrated-cpux2.json)")(
    _hw_json(lambda h: None))
fixture("gpu1node.json", "that profile as if measured on one node of H100s (device name 'NVIDIA H100 80GB HBM3')")(
    _hw_json(lambda h: (h["accelerator"].update(name="NVIDIA H100 80GB HBM3, measured bf16", peak_flops=7e14,
                                                memory_bytes=80 * 2**30, memory_bandwidth=3e12),
                        h.update(devices_per_node=8, intra_node_bandwidth=3e11))))
fixture("hw-missing.json", "a profile without memory_bandwidth")(
    _hw_json(lambda h: h["accelerator"].pop("memory_bandwidth")))
fixture("hw-extra.json", "a profile with an unknown field")(_hw_json(lambda h: h.update(colour="red")))
fixture("hw-acc-str.json", "a profile whose accelerator is a string")(_hw_json(lambda h: h.update(accelerator="x")))
fixture("hw-dpn0.json", "a profile with devices_per_node = 0")(_hw_json(lambda h: h.update(devices_per_node=0)))
fixture("hw-peak0.json", "a profile with peak_flops = 0")(
    _hw_json(lambda h: h["accelerator"].update(peak_flops=0)))
fixture("hw-str.json", "a profile with peak_flops = \"fast\"")(
    _hw_json(lambda h: h["accelerator"].update(peak_flops="fast")))


# -- model configs ----------------------------------------------------------------------------------

fixture("cfg/config.json", "docs/examples/tiny-llama/config.json (a valid Llama config)")(_config(lambda c: None))
fixture("cfg-bom.json", "the tiny Llama config with a UTF-8 byte-order mark")(
    lambda path, d: path.write_bytes(b"\xef\xbb\xbf" + json.dumps(LLAMA_TINY).encode()))
fixture("cfg-hidden0.json", "hidden_size = 0")(_config(lambda c: c.update(hidden_size=0)))
fixture("cfg-heads-neg.json", "num_attention_heads = -4")(_config(lambda c: c.update(num_attention_heads=-4)))
fixture("cfg-nohead.json", "hidden 100, 3 heads and no head_dim")(
    _config(lambda c: (c.update(hidden_size=100, num_attention_heads=3, num_key_value_heads=3), c.pop("head_dim"))))
fixture("cfg-kv.json", "8 heads, 3 key/value heads")(
    _config(lambda c: c.update(num_attention_heads=8, num_key_value_heads=3)))
fixture("cfg-moe.json", "a mixture-of-experts config (num_local_experts = 8)")(
    _config(lambda c: c.update(num_local_experts=8)))
fixture("cfg-hybrid.json", "a Jamba config (Mamba layers)")(
    _config(lambda c: c.update(model_type="jamba", architectures=["JambaForCausalLM"],
                               layer_types=["mamba"] * (c["num_hidden_layers"] - 1) + ["full_attention"])))
fixture("cfg-llama4.json", "a Llama-4 text config (attention_chunk_size 8192 on 3 of every 4 layers)")(
    _config(lambda c: c.update(model_type="llama4_text", architectures=["Llama4ForCausalLM"],
                               attention_chunk_size=8192)))
fixture("cfg-llava.json", "a LLaVA config (the tiny Llama config as its text_config)")(
    lambda path, d: path.write_text(json.dumps({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
                                                "text_config": LLAMA_TINY, "vision_config": {"hidden_size": 32}})))
fixture("cfg-t5.json", "a T5 config (encoder-decoder)")(
    _config(lambda c: c.update(model_type="t5", architectures=["T5ForConditionalGeneration"], is_encoder_decoder=True)))
fixture("cfg-vl.json", "a Qwen2.5-VL config (vision_config)")(
    _config(lambda c: c.update(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"],
                               vision_config={"depth": 2})))
fixture("cfg-mla.json", "a DeepSeek-V2 config (multi-head latent attention, kv_lora_rank = 16)")(
    _config(lambda c: c.update(model_type="deepseek_v2", kv_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32)))
fixture("cfg-vocab-str.json", "vocab_size = \"big\"")(_config(lambda c: c.update(vocab_size="big")))
fixture("cfg-layers-float.json", "num_hidden_layers = 2.5")(_config(lambda c: c.update(num_hidden_layers=2.5)))
fixture("cfg-unknown-type.json", "model_type = \"nosuchmodel\"")(_config(lambda c: c.update(model_type="nosuchmodel")))
fixture("cfg-huge.json", "a Llama config with 10,000 layers of width 65,536")(
    _config(lambda c: c.update(num_hidden_layers=10_000, hidden_size=65_536, intermediate_size=262_144,
                               num_attention_heads=512, num_key_value_heads=512, head_dim=128)))
fixture("gemma2/config.json", "a tiny Gemma-2 config (logit soft-capping; transformers has no SDPA path for it)")(
    lambda path, d: _json(path, GEMMA2_TINY))
fixture("cfgdir", "a directory without a config.json")(lambda path, d: path.mkdir())


# -- token files and checkpoints ----------------------------------------------------------------------

fixture("tok.npy", "1,000 int64 token ids in 0..96")(_tokens([i % 97 for i in range(1000)], "int64"))
fixture("neg.npy", "int64 ids with a -1")(_tokens([-1] + [1] * 999, "int64"))
fixture("big.npy", "int64 ids with a 5000 (vocabulary 97)")(_tokens([5000] + [1] * 999, "int64"))
fixture("float.npy", "float32 values")(_tokens([0.5 * (i % 97) for i in range(1000)], "float32"))
fixture("short.npy", "10 token ids")(_tokens(list(range(10)), "int64"))
fixture("ones.npy", "1,000 int64 token ids, all 1 (no document separator)")(_tokens([1] * 1000, "int64"))
fixture("bool.npy", "a boolean array")(_tokens([True] * 1000, "bool"))
fixture("text.npy", "a text file named .npy")(lambda path, d: _text(path, "hello world\n"))
fixture("tok.txt", "token ids as text")(lambda path, d: _text(path, " ".join(map(str, range(1000)))))
fixture("odd.bin", "3 bytes (not whole uint16 tokens)")(lambda path, d: path.write_bytes(b"abc"))
fixture("empty.bin", "an empty .bin")(lambda path, d: path.write_bytes(b""))
fixture("tok.bin", "1,000 uint16 token ids in 0..96")(
    lambda path, d: path.write_bytes(b"".join((i % 97).to_bytes(2, "little") for i in range(1000))))
fixture("docs.jsonl", "3 JSON-lines documents with a text field")(
    lambda path, d: _text(path, "".join(json.dumps({"text": t}) + "\n" for t in ("w1 w2", "w3", "w4 w5 w6"))))
fixture("empty.jsonl", "an empty .jsonl")(lambda path, d: _text(path, ""))
fixture("bad.jsonl", "a .jsonl whose lines are not JSON")(lambda path, d: _text(path, "not json\n{oops\n"))
fixture("docs.csv", "text in a .csv (not a format --data reads)")(lambda path, d: _text(path, "text\nw1 w2\n"))


@fixture("tokdir", "a word-level Hugging Face tokenizer (w0..w89, <eos>) made with the tokenizers library")
def _tokdir(path: Path, directory: Path) -> None:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, **{f"w{i}": 3 + i for i in range(90)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                         unk_token="<unk>").save_pretrained(str(path))


fixture("junk.ckpt", "random bytes as a checkpoint")(lambda path, d: path.write_bytes(bytes(range(256)) * 4))


@fixture("dict.pt", "a torch.save'd dict instead of a tensor")
def _dict_pt(path: Path, directory: Path) -> None:
    import torch

    torch.save({"ids": torch.arange(10)}, path)


@fixture("float.pt", "a torch.save'd float tensor")
def _float_pt(path: Path, directory: Path) -> None:
    import torch

    torch.save(torch.rand(1000), path)
