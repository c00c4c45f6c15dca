"""Fitting the per-length measurements of :func:`autosp.profiling.graph.analyze.measure` in the
sequence length and assembling the :class:`~autosp.cost_models.profile.ModelProfile`."""

from __future__ import annotations

from autosp.profiling.graph.fit import clean, clean_ratio, fit_flops, fit_linear
from autosp.profiling.graph.layer import CLASSES
from autosp.cost_models.profile import Elems, ModelProfile
from autosp.cost_models.specs import CHECKPOINTING_POLICIES


FLOP_KEYS = ("mm_fwd", "mlp_mm_fwd", "attn_fwd", "mm_bwd", "attn_bwd", "qproj_fwd", "head_mm_fwd")
STRUCTURE_KEYS = ("n_heads", "n_kv_heads", "head_dim", "v_head_dim", "sdpa_calls", "sdpa_causal", "sdpa_mask",
                  "hidden", "vocab", "mlp_matmuls", "ffn_hidden")


def fit_measurements(seq_lens, measurements) -> tuple[dict, dict]:
    """({key: Fit}, {key: value}) over the traced sequence lengths: FLOPs as a*s + c*s^2, structure keys
    must agree across lengths, everything else as a + b*s."""
    fits, structure = {}, {}
    keys = measurements[0].keys()
    for key in keys:
        ys = [m[key] for m in measurements]
        if key in STRUCTURE_KEYS:
            if len(set(ys)) != 1:
                raise ValueError(f"{key} changes with the sequence length: {ys}")
            structure[key] = ys[0]
        elif key in FLOP_KEYS:
            fits[key] = fit_flops(seq_lens, ys)
        else:
            fits[key] = fit_linear(seq_lens, ys)
    return fits, structure


def _slope(fits, key) -> float:
    return clean(fits[key].coef[1])


def _elems(fits, prefix) -> Elems:
    return Elems(_slope(fits, prefix + ".other"), _slope(fits, prefix + ".kv"), _slope(fits, prefix + ".fixed"))


def build_profile(name: str, seq_lens, measurements, params: dict, n_layers: int, *, fingerprint: str = "",
                  versions: tuple = (), notes: tuple = (), checks: dict | None = None) -> ModelProfile:
    """Assemble a graph ModelProfile from per-sequence-length measurements of one layer."""
    fits, st = fit_measurements(seq_lens, measurements)
    h = int(st["hidden"])
    a, n_kv, d = int(st["n_heads"]), int(st["n_kv_heads"]), int(st["head_dim"])
    mm_lin, mm_quad = fits["mm_fwd"].coef
    attn_lin, attn_quad = fits["attn_fwd"].coef
    quad_fwd = mm_quad + attn_quad
    quad_bwd = fits["mm_bwd"].coef[1] + fits["attn_bwd"].coef[1]
    attn_bwd_factor = quad_bwd / quad_fwd if quad_fwd > 0 else 2.5
    mm_bwd_lin = fits["mm_bwd"].coef[0] + fits["attn_bwd"].coef[0]
    fwd_lin = mm_lin + attn_lin
    pw_fwd = _slope(fits, "pw_fwd")
    pw_bwd = _slope(fits, "pw_bwd")
    grads_mlp = _elems(fits, "grads_mlp")
    # the MLP phase's gradient working set, split the way the cost model scales it: the gradient arriving
    # at the layer (not shrunk by MLP tiling) and the rest (MLP tiling keeps 1/N of it)
    grad_in = Elems(_slope(fits, "grad_in") / 2)
    mlp_grads = Elems(grads_mlp.other - grad_in.other, grads_mlp.kv, grads_mlp.fixed)
    attn_grads = _elems(fits, "grads_attn")
    pols = CHECKPOINTING_POLICIES
    worst = max(fits.items(), key=lambda kv: kv[1].residual)
    fit_summary = tuple(sorted(((k, f.residual) for k, f in fits.items() if f.residual > 1e-12),
                               key=lambda kv: -kv[1]))
    n_params = n_layers * params["layer"] + params["other"]
    details = {
        "ffn_hidden": int(st["ffn_hidden"]), "gated_mlp": st["mlp_matmuls"] >= 3, "tied_embeddings": params["tied"],
        "qkv_bias": params["qkv_bias"], "v_head_dim": int(st["v_head_dim"]), "sdpa_calls": int(st["sdpa_calls"]),
        "sdpa_causal": bool(st["sdpa_causal"]), "sdpa_mask": bool(st["sdpa_mask"]),
        "seq_lens": tuple(seq_lens),
        "saved_by_class": tuple((c, _slope(fits, f"class.{c}")) for c in CLASSES),
        "shared_saved_bytes_per_token": _slope(fits, "shared_saved_bytes"),
        "norm_fp32_upcast": _slope(fits, "norm_fp32_bytes") > 0,
        "pointwise_eager_fwd_bytes_per_token": 2 * _slope(fits, "pw_fwd_eager"),
        "pointwise_eager_bwd_bytes_per_token": 2 * _slope(fits, "pw_bwd_eager"),
        "mm_bwd_over_fwd": clean_ratio(mm_bwd_lin / fwd_lin) if fwd_lin else 0.0,
    }
    if checks:
        details.update(checks)
    return ModelProfile(
        name=name, source="graph", n_layers=n_layers, hidden=h, n_heads=a, n_kv_heads=n_kv, head_dim=d,
        vocab=int(st["vocab"]),
        n_params=int(n_params), layer_params=int(params["layer"]), layer_small_params=int(params["layer_small"]),
        other_small_params=int(params["other_small"]), largest_other_params=int(params["largest_other"]),
        layer_matmul=clean(mm_lin / 2), mlp_matmul=clean(fits["mlp_mm_fwd"].coef[0] / 2),
        head_matmul=clean(fits["head_mm_fwd"].coef[0] / 2), qproj_matmul=clean(fits["qproj_fwd"].coef[0] / 2),
        attn_width=clean(quad_fwd / 2),
        kept_attn=tuple(_elems(fits, f"kept_attn.{p}") for p in pols),
        kept_mlp=tuple(_elems(fits, f"kept_mlp.{p}") for p in pols),
        recompute_mlp_phase=tuple(_elems(fits, f"recompute_mlp_phase.{p}") for p in pols),
        recompute_attn_phase=tuple(_elems(fits, f"recompute_attn_phase.{p}") for p in pols),
        mlp_live=tuple(_elems(fits, f"mlp_live.{p}") for p in pols),
        mlp_inner=_elems(fits, "mlp_inner"), mlp_grads=mlp_grads, mlp_phase_grads=grad_in, attn_grads=attn_grads,
        final=_elems(fits, "final"),
        logits=_elems(fits, "logits"), loss_peak=_elems(fits, "loss_peak"), loss_hidden_grad=Elems(float(h)),
        pw_layer_fwd=Elems(pw_fwd),
        pw_recompute=tuple(Elems(_slope(fits, f"pw_recompute.{p}")) for p in pols),
        pw_mlp_recompute=Elems(_slope(fits, "pw_mlp")),
        loss_pw_fwd=_slope(fits, "loss_pw_fwd"), loss_pw_bwd=_slope(fits, "loss_pw_bwd"),
        matmul_bwd_factor=clean_ratio(fits["mm_bwd"].coef[0] / mm_lin) if mm_lin else 2.0,
        attn_bwd_factor=clean_ratio(attn_bwd_factor),
        pw_bwd_factor=clean_ratio(pw_bwd / pw_fwd) if pw_fwd else 2.0,
        fingerprint=fingerprint, versions=tuple(versions), fit_residual=worst[1].residual, fit=fit_summary,
        notes=tuple(notes), details=tuple(sorted(details.items())),
    )


__all__ = ["FLOP_KEYS", "STRUCTURE_KEYS", "build_profile", "fit_measurements"]
