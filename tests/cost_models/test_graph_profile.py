"""Graph-derived model profiles (docs/graph_profile.md).

- fits recover exact coefficients from synthetic data and flag what is not of their form;
- a tiny Llama config (real head/KV/FFN ratios of Llama-3.1-8B: 4 query heads per KV head, FFN 3.5x) traced
  under FakeTensorMode matches the analytic profile field by field: exactly, or by the documented
  difference (HF's eager RMSNorm keeps an fp32 copy of its input; the rotary tables; the measured
  backward working set), within the tolerances stated in docs/graph_profile.md;
- the profile drives estimate() and the cache round-trips; a cache hit imports no torch (subprocess);
- a GPT-2 config and a non-HF nn.Module factory profile without error and differ from the Llama
  formulas where their architecture does (plain GELU MLP, biases, LayerNorm, learned positions).
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autosp.cost_models import estimate, memory_only
from autosp.profiling.graph import describe_model_arg, fingerprint, load_or_build
from autosp.profiling.graph.compare import comparison
from autosp.profiling.graph.fit import fit_flops, fit_linear
from autosp.cost_models.profile import Elems, ModelProfile, analytic_profile
from autosp.contract.specs import CHECKPOINTING_POLICIES, Candidate, Workload
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import model_from_hf_config

TESTS = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "tests"  # graph_profile_models.py
H, F, A, KV, D, V, L = 256, 896, 8, 2, 32, 1000, 4   # Llama-3.1-8B ratios: q = h, 4 query heads per KV head, f = 3.5h
LLAMA_CONFIG = {"model_type": "llama", "hidden_size": H, "intermediate_size": F, "num_attention_heads": A,
                "num_key_value_heads": KV, "head_dim": D, "num_hidden_layers": L, "vocab_size": V,
                "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                "hidden_act": "silu", "rope_theta": 500000.0}
GH, GV, GL = 128, 1000, 3
GPT2_CONFIG = {"model_type": "gpt2", "n_embd": GH, "n_head": 4, "n_layer": GL, "n_positions": 1024, "vocab_size": GV,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "activation_function": "gelu_new",
               "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("autosp-cache")
    old = os.environ.get("AUTOSP_CACHE_DIR")
    os.environ["AUTOSP_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AUTOSP_CACHE_DIR", None)
    else:
        os.environ["AUTOSP_CACHE_DIR"] = old


def _write_config(tmp_path_factory, name, config) -> str:
    folder = tmp_path_factory.mktemp(name)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder / "config.json")


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return _write_config(tmp_path_factory, "tiny-llama", LLAMA_CONFIG)


@pytest.fixture(scope="module")
def llama(cache, llama_path):
    return load_or_build(llama_path, quiet=True)


@pytest.fixture(scope="module")
def llama_analytic(llama_path):
    return analytic_profile(model_from_hf_config(llama_path))


# --------------------------------------------------------------------------------------------------
# Fits
# --------------------------------------------------------------------------------------------------

def test_fits_are_exact_on_synthetic_data():
    xs = [333, 667, 1001]
    lin = fit_linear(xs, [7.0 + 3.5 * x for x in xs])
    assert lin.coef == pytest.approx((7.0, 3.5), rel=1e-12) and lin.residual < 1e-12
    const = fit_linear(xs, [42.0] * 3)
    assert const.coef == (42.0, 0.0) and const.residual == 0
    # Llama-3.1-8B scale: 2 x 218M matmul FLOPs per token plus 2 S^2 q attention
    flops = fit_flops(xs, [436_207_616 * x + 8192 * x * x for x in xs])
    assert flops.coef == pytest.approx((436_207_616, 8192), rel=1e-12) and flops.residual < 1e-12
    # a quadratic memory term (an S x S tensor kept for backward) shows up as a residual of the linear fit
    assert fit_linear(xs, [100 * x + 2 * x * x for x in xs]).residual > 1e-3
    with pytest.raises(ValueError):
        fit_linear([512, 512], [1.0, 2.0])


# --------------------------------------------------------------------------------------------------
# Tiny Llama: graph vs analytic, field by field
# --------------------------------------------------------------------------------------------------

def test_tiny_llama_profile_is_clean(llama):
    assert llama.source == "graph" and llama.fit_residual < 1e-9
    d = dict(llama.details)
    # module attribution and 1-vs-2-layer differencing agree on saved bytes, FLOPs and parameters
    for key in ("check_saved_bytes", "check_fwd_flops", "check_bwd_flops", "check_params"):
        attributed, differenced = d[key]
        assert attributed == differenced, key
    assert d["sdpa_causal"] and not d["sdpa_mask"] and d["sdpa_calls"] == 1
    assert d["gated_mlp"] and not d["qkv_bias"] and not d["tied_embeddings"] and d["ffn_hidden"] == F
    assert (llama.n_layers, llama.hidden, llama.n_heads, llama.n_kv_heads, llama.head_dim, llama.vocab) == (L, H, A, KV, D, V)


EXACT = ("n_params", "layer_params", "layer_small_params", "other_small_params", "largest_other_params",
         "layer_matmul", "mlp_matmul", "head_matmul", "qproj_matmul", "attn_width", "matmul_bwd_factor",
         "attn_bwd_factor", "logits", "loss_peak", "loss_hidden_grad")


@pytest.mark.parametrize("field", EXACT)
def test_tiny_llama_exact_fields(llama, llama_analytic, field):
    assert getattr(llama, field) == getattr(llama_analytic, field)


def test_tiny_llama_mlp_backward_eager_against_fused(llama, llama_analytic):
    """The eager trace's MLP backward holds gate, SiLU, up and product (4f) and three gradients (3f); the
    analytic model prices the compiled, fused SwiGLU (docs/cost_model.md section 12): gate, up and the down
    projection's input (3f) and one gradient (f), the gate/up gradients overwriting their inputs."""
    assert llama.mlp_inner == Elems(4 * F) and llama.mlp_grads == Elems(3 * F)
    assert llama_analytic.mlp_inner == Elems(3 * F) and llama_analytic.mlp_grads == Elems(F)


def test_tiny_llama_kept_sets_per_policy(llama, llama_analytic):
    """The policies derived from the graph keep exactly the analytic sets (selective: x, q, k, v, O, O',
    o_proj output, gate, up, logsumexp; ...), except that with no checkpointing HF's eager RMSNorm keeps
    an fp32 copy of its input (4h bytes per norm, two norms) where the analytic model keeps x/h1 in bf16
    (the same element count: HF keeps the normalised input before the weight instead)."""
    g, a = llama, llama_analytic
    for i, policy in enumerate(CHECKPOINTING_POLICIES):
        assert g.kept_mlp[i] == a.kept_mlp[i], policy
        # what the MLP's recomputed tensors hold at the MLP phase's peak: eager recomputes SiLU as a tensor of its
        # own but frees the down projection's input before the three gradients exist (gate, SiLU, up under full
        # and sequence; SiLU under selective), as many elements as the fused kernel's gate, up and product
        assert g.mlp_live[i] == a.mlp_live[i], policy
        if policy == "none":
            assert g.kept_attn[i] == a.kept_attn[i] + Elems(0, 0, 8 * H)
        else:
            assert g.kept_attn[i] == a.kept_attn[i], policy


def test_tiny_llama_recompute_and_working_set(llama, llama_analytic):
    """Backward working set (docs/graph_profile.md, "Backward working set"): the eager MLP phase's gradients
    are 3f (the fused analytic model: f); the gradient alive with them is the incoming h (the analytic model
    books 2h); recomputed norms bring HF's extra bf16 pre-weight tensor (h) and the fp32 copies."""
    g, a = llama, llama_analytic
    assert g.mlp_phase_grads == Elems(H) and a.mlp_phase_grads == Elems(2 * H)
    for policy in ("selective", "sequence"):
        i = CHECKPOINTING_POLICIES.index(policy)
        assert g.recompute_mlp_phase[i] == a.recompute_mlp_phase[i] + Elems(H, 0, 8 * H + 8), policy
    full = CHECKPOINTING_POLICIES.index("full")
    assert g.recompute_mlp_phase[full] == a.recompute_mlp_phase[full] + Elems(H, 0, 8 * H)
    # attention phase: its peak is in the input norm's eager fp32 backward, not in SDPA's: five fp32
    # h-wide temporaries and two bf16 gradients (24h bytes) against the analytic dO, dq, dk, dv, fp32 dq
    # accumulator and residual gradient (2(4q + 2k + h) bytes)
    assert g.attn_grads == Elems(2 * H, 0, 20 * H)
    for policy in ("selective", "sequence"):
        i = CHECKPOINTING_POLICIES.index(policy)
        assert g.recompute_attn_phase[i] == a.recompute_attn_phase[i] + Elems(0, 0, 8 * H + 4), policy
    for i, policy in enumerate(CHECKPOINTING_POLICIES):
        ga = (g.recompute_attn_phase[i] + g.attn_grads).bytes(2)
        aa = (a.recompute_attn_phase[i] + a.attn_grads).bytes(2)
        assert aa <= ga <= 3 * aa, policy


def _replayed_mlp_phase_per_token(config_path: str) -> float:
    """The peak of the last layer's MLP backward replayed from eager traces at two lengths, bytes per token: that
    layer's saved tensors (what a full recompute rebuilds) and the backward's other storages, alive as the eager
    autograd engine holds them (the incoming gradient included, parameters and their gradients not)."""
    from autosp.profiling.graph import liveness as live
    from autosp.profiling.graph.layer import LayerAnalysis
    from autosp.profiling.graph.trace import hf_builder, load_hf_config, trace_step

    build, peaks = hf_builder(load_hf_config(config_path)), []
    for s in (333, 667):
        tr = trace_step(build, 2, s)
        la = LayerAnalysis(tr)
        start, split = la.bwd[0].idx, max(o.idx for o in la.bwd if la.in_mlp(o.module))
        others_saved = set(tr.saved) - set(la.saved)
        include = lambda sid: sid not in la.excluded and sid not in tr.grad_sids and sid not in others_saved  # noqa: E731
        before = sum(live.alive_before(tr, include, start))   # the working set the layer's backward inherits
        saved_then = sum(la.st[sid].nbytes for sid in la.saved if sid in tr.storages
                         and la.st[sid].alloc < start and (la.st[sid].free < 0 or la.st[sid].free > start))
        # the attention output's Ulysses layout O' is a storage the analysis adds (no trace allocates it), alive
        # until the output projection's backward, after the MLP's
        virtual = sum(la.st[sid].nbytes for sid in la.saved if sid not in tr.storages)
        _, dtype_bytes, other_bytes = live.peak(live.live_curve(tr, include, start, split))
        peaks.append(dtype_bytes + other_bytes + virtual
                     - (before - saved_then - tr.layer_grad_in.get(la.name, 0)))
    return (peaks[1] - peaks[0]) / (667 - 333)


def test_eager_mlp_phase_is_the_replayed_peak(llama, llama_path):
    """Under full checkpointing the cost model's MLP phase of an eager profile (recomputed attention side + MLP
    tensors alive at the peak + gradients + the incoming gradient) is the peak an eager trace of that layer's
    backward reaches: the down projection's input is freed before the SiLU and up gradients exist, so the phase is
    gate, SiLU, up and three gradients (6f), not all four recomputed tensors plus three gradients (7f)."""
    full = CHECKPOINTING_POLICIES.index("full")
    composed = (llama.recompute_mlp_phase[full] + llama.mlp_live[full] + llama.mlp_grads + llama.mlp_phase_grads)
    assert composed.bytes(2) == pytest.approx(_replayed_mlp_phase_per_token(llama_path), rel=1e-9)
    assert llama.mlp_live[full] == Elems(3 * F) and llama.mlp_grads == Elems(3 * F)


def test_tiny_llama_outside_the_layers(llama, llama_analytic):
    """Kept outside the layers: the analytic final norm input and output (2h), plus HF's fp32 copy and
    inverse RMS of the final norm (4h + 4 bytes) and the rotary cos/sin tables the layers share (2d)."""
    assert llama.final == llama_analytic.final + Elems(2 * D, 0, 4 * H + 4)


def test_tiny_llama_pointwise_traffic_within_band(llama, llama_analytic):
    """Memory-bound traffic: fused-region model vs the analytic per-op counts; documented band."""
    g, a = llama, llama_analytic
    assert 0.8 <= g.pw_layer_fwd.bytes(2) / a.pw_layer_fwd.bytes(2) <= 1.25
    assert 1.0 <= g.pw_bwd_factor <= 2.0
    assert 0.5 <= (g.loss_pw_fwd + g.loss_pw_bwd) / (a.loss_pw_fwd + a.loss_pw_bwd) <= 1.0


def test_estimate_with_the_graph_profile(llama, llama_path, llama_analytic):
    """The cost model runs on the graph profile; against the analytic profile: step time within 5%,
    total memory within 15% (the eager norms' extra bytes and the unfused MLP backward), at every policy."""
    spec = model_from_hf_config(llama_path)
    hw = resolve_hardware("h100x8")
    work = Workload(seq_len=65_536)
    for policy in CHECKPOINTING_POLICIES:
        for cand in (Candidate(sp=2, zero_stage=3, checkpointing=policy),
                     Candidate(sp=8, zero_stage=3, checkpointing=policy, mlp_chunks=4, loss_chunks=8)):
            g = estimate(spec, hw, work, cand, profile=llama)
            a = estimate(spec, hw, work, cand, profile=llama_analytic)
            assert g.time.step == pytest.approx(a.time.step, rel=0.05), cand.short()
            assert g.memory.total == pytest.approx(a.memory.total, rel=0.15), cand.short()
            assert g.memory.total >= a.memory.total * 0.999   # eager keeps more, never less
    # the analytic profile passed explicitly is the default
    cand = Candidate(sp=8, zero_stage=2, checkpointing="selective")
    assert estimate(spec, hw, work, cand, profile=llama_analytic) == estimate(spec, hw, work, cand)
    assert memory_only(spec, hw, work, cand, profile=llama).activations > 0


def test_comparison_table_rows(llama, llama_analytic):
    rows = {r.field: r for r in comparison(llama, llama_analytic)}
    assert rows["kept, selective"].rel == 0 and rows["matmul FLOPs fwd, layer"].rel == 0
    assert rows["kept, none"].graph - rows["kept, none"].analytic == 8 * H
    assert "fp32" in rows["kept, none"].why


# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------

def test_profile_json_round_trips(llama, llama_analytic):
    assert ModelProfile.from_json(llama.to_json()) == llama
    assert ModelProfile.from_json(llama_analytic.to_json()) == llama_analytic
    with pytest.raises(ValueError, match="unknown ModelProfile field"):
        ModelProfile.from_dict({**llama.to_dict(), "bogus": 1})


def test_cache_hit_reads_the_file_and_imports_no_torch(cache, llama, llama_path):
    path = cache / "profiles" / f"{llama.fingerprint}.json"
    assert path.is_file() and llama.fingerprint == fingerprint(llama_path)
    assert load_or_build(llama_path, quiet=True) == llama
    code = ("import sys\n"
            "from autosp.profiling.graph import load_or_build\n"
            "from autosp.cost_models import estimate\n"
            "from autosp.contract.specs import Candidate, Workload\n"
            "from autosp.cost_models.catalog.hardware import resolve_hardware\n"
            f"p = load_or_build({llama_path!r})\n"
            "e = estimate(p.model_spec(), resolve_hardware('h100x8'), Workload(seq_len=8192), Candidate(sp=2), profile=p)\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'\n"
            "print(p.fingerprint, e.memory.total)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "AUTOSP_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == llama.fingerprint
    assert "tracing" not in out.stderr   # no progress message: nothing was traced


def test_fingerprint_follows_the_config(tmp_path, llama_path):
    other = dict(LLAMA_CONFIG, intermediate_size=F + 64)
    (tmp_path / "config.json").write_text(json.dumps(other))
    assert fingerprint(str(tmp_path)) != fingerprint(llama_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG, indent=4))   # same content, other layout
    assert fingerprint(str(tmp_path)) == fingerprint(llama_path)


def test_model_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="neither"):
        describe_model_arg("not a model")
    with pytest.raises(ValueError, match="does not exist"):
        describe_model_arg(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="without a config.json"):
        describe_model_arg(str(tmp_path))
    assert describe_model_arg("pkg.mod:make_model") == ("entry", "pkg.mod:make_model")


def test_cli_prints_the_comparison_as_json(cache, llama, llama_path):
    out = subprocess.run([sys.executable, "-m", "autosp.profiling.graph", llama_path, "--json", "--quiet"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "AUTOSP_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["profile"]["fingerprint"] == llama.fingerprint
    fields = {row["field"]: row for row in data["comparison"]}
    assert fields["parameters (model)"]["rel"] == 0 and len(data["end_to_end"]) == 3


# --------------------------------------------------------------------------------------------------
# Other architectures
# --------------------------------------------------------------------------------------------------

def test_gpt2_profiles_and_differs_from_the_llama_formulas(cache, tmp_path_factory):
    """GPT-2: LayerNorm, fused qkv with biases, plain 4h GELU(tanh) MLP, learned positions, tied head."""
    path = _write_config(tmp_path_factory, "tiny-gpt2", GPT2_CONFIG)
    g = load_or_build(path, quiet=True)
    d = dict(g.details)
    h = GH
    assert g.fit_residual < 1e-9 and all(v[0] == v[1] for k, v in d.items() if k.startswith("check_"))
    assert not d["gated_mlp"] and d["qkv_bias"] and d["tied_embeddings"] and d["ffn_hidden"] == 4 * h
    # parameters: ln_1, c_attn (3h^2 + 3h), c_proj (h^2 + h), ln_2, c_fc (4h^2 + 4h), c_proj (4h^2 + h)
    assert g.layer_params == 12 * h * h + 13 * h and g.layer_small_params == 13 * h
    assert g.n_params == GL * g.layer_params + GV * h + 1024 * h + 2 * h   # tied wte, wpe, ln_f
    assert g.mlp_matmul == 8 * h * h and g.layer_matmul == 12 * h * h   # two MLP matrices, not three
    # saved for backward, no checkpointing: the tanh-GELU keeps five 4h-wide tensors (its input, tanh,
    # 0.5x, 1 + tanh, its output) where a SwiGLU keeps four; LayerNorm keeps its input (no fp32 copy)
    none = CHECKPOINTING_POLICIES.index("none")
    assert g.kept_mlp[none] == Elems(5 * 4 * h)
    # selective keeps the only MLP matmul output (c_fc), not gate and up
    assert g.kept_mlp[CHECKPOINTING_POLICIES.index("selective")] == Elems(4 * h)
    llama_like = analytic_profile(g.model_spec())
    assert g.kept_mlp[none] != llama_like.kept_mlp[none] and g.n_params != llama_like.n_params
    assert g.attn_width == h and g.kept_attn[CHECKPOINTING_POLICIES.index("sequence")] == \
        llama_like.kept_attn[CHECKPOINTING_POLICIES.index("sequence")]


def test_nn_module_factory_entry_point(cache, monkeypatch):
    """A non-HF model given as package.module:function; the layer count comes from the factory's default."""
    monkeypatch.syspath_prepend(str(TESTS))
    import graph_profile_models as m

    p = load_or_build("graph_profile_models:tiny_lm", quiet=True)
    h = m.HIDDEN
    assert (p.n_layers, p.hidden, p.n_heads, p.n_kv_heads, p.vocab) == (3, h, m.HEADS, m.HEADS, m.VOCAB)
    assert p.layer_params == 12 * h * h + 13 * h and p.n_params == 3 * p.layer_params + m.VOCAB * h + 2 * h
    assert p.fit_residual < 1e-9 and dict(p.details)["tied_embeddings"]
    est = estimate(p.model_spec(), resolve_hardware("h100x8"), Workload(seq_len=16_384),
                   Candidate(sp=1, checkpointing="selective"), profile=p)
    assert est.memory.total > 0 and est.time.step > 0


def test_sp_validation_uses_the_traced_heads(llama, llama_path):
    spec = replace(model_from_hf_config(llama_path), n_heads=16, n_kv_heads=16)   # a wrong spec...
    with pytest.raises(ValueError, match="query heads"):
        estimate(spec, resolve_hardware("h100x16"), Workload(seq_len=4096), Candidate(sp=16), profile=llama)


def test_preset_config_reads_back_as_the_preset(cache):
    """--preset writes a config.json that the planner's reader turns back into the same ModelSpec."""
    from autosp.profiling.graph import preset_config
    from autosp.cost_models.catalog.models import resolve_model

    for name in ("llama-3.1-8b", "qwen2.5-0.5b"):
        spec = resolve_model(name)
        back = model_from_hf_config(preset_config(name))
        assert replace(back, source="") == replace(spec, source=""), name
        assert replace(analytic_profile(back), fingerprint="") == replace(analytic_profile(spec), fingerprint="")
