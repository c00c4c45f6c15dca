"""Hybrid linear attention: what a Gated DeltaNet layer (Qwen3-Next, Qwen3.5) costs as autosp runs it.

Pure functions of plain numbers (no torch): shapes.py builds a :class:`LinearShape` for a model with
``ModelSpec.linear_layers`` and memory.py, flops.py, step_time.py and comm.py call the functions below through small
hooks (None for a model without linear layers: nothing changes). docs/cost_model.md, "Linear-attention layers",
derives every term.

What the compiler runs (compiler/linear_attention.py), per linear layer and rank (U Ulysses ranks; no ring and no
sequence chunks: the compiler refuses both, and so does the planner, planner/search/space.py):

1. the projections on the rank's s local tokens: q, k (n_k x d_k each), v and the output gate z (n_v x d_v each),
   b and a (n_v each);
2. one all-to-all of q/k/v/b/a (the "slots") to this rank's heads over the whole sequence (q/k heads copied U / n_k
   times when U > n_k, as Ulysses copies K/V heads);
3. ``autosp_ops::gated_delta_core``: the causal conv1d and the chunked gated delta rule on those heads, run in
   pieces of :data:`PIECE_TOKENS` with the recurrent state carried; it saves its inputs and the fp32 state entering
   each piece, and its backward re-runs each piece's forward under autograd, one piece at a time;
4. the output all-to-all back, the gated RMSNorm and the output projection on the local tokens.

Per local token (s tokens x every head, or S / U tokens x this rank's heads: the same element count) the widths are
:attr:`LinearShape.slots` (the all-to-all in), ``value`` = n_v x d_v (out), ``conv`` = the op's q/k/v channels.

**FLOPs** (the chunked algorithm transformers' ``torch_chunk_gated_delta_rule`` and flash-linear-attention's
``chunk_gated_delta_rule`` both implement, chunk C = :data:`CHUNK`): per value head and token,
C x (5 d_k + 3 d_v) + 6 d_k d_v (:func:`core_flops_per_head_token`), linear in the sequence; the backward re-runs
the forward inside the op and differentiates it (:data:`BWD_FACTOR` = 3 forwards).

**Memory**: the layer's saved set (:func:`kept`) holds the all-to-all output (the op's input), the gates, z, the
returned output and the norm's statistics, plus the fp32 states entering the pieces (:func:`state_bytes`, per
sequence: d_k x d_v x 4 B per value head every PIECE_TOKENS tokens). The op's backward holds the gradients of its
inputs over the whole sequence and one piece's recompute (:func:`piece_bytes`), whose size depends on the kernel:
:data:`KERNELS` -- flash-linear-attention's (``fla``: what a GPU plan prices; read from its source, not measured
here) or transformers' torch fallback (``torch``: CPU; ``python -m studies.linear_attention_memory`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BWD_FACTOR", "CHUNK", "KERNELS", "LinearShape", "PIECE_TOKENS", "a2a_buffer_bytes",
           "all_to_all_widths", "attention_pointwise_elems", "core_flops_forward", "core_flops_per_head_token", "kept", "kept_bytes",
           "TORCH_FALLBACK_ELEMS", "kernel_bytes_per_head_token", "layout", "mixer_phase_bytes", "piece_bytes", "plan_reason",
           "pointwise_elems", "recompute_mlp_phase", "split_reason", "state_bytes"]

PIECE_TOKENS = 4096
"""The compiler's piece length (compiler/linear_attention.py ``PIECE_TOKENS``; tests/cost_models/test_linear_attention.py
checks they agree): the op's backward recomputes this many tokens of a document at a time."""

CHUNK = 64
"""The chunk length of the chunked gated delta rule in both kernels (transformers' ``chunk_size=64``, FLA's BT)."""

BWD_FACTOR = 3.0
"""The op's backward in forwards: it re-runs each piece's forward under autograd (1) and differentiates it (2, the
matmuls' input and weight-side products)."""

KERNELS = ("fla", "torch")
"""``fla``: flash-linear-attention's Triton kernels (what transformers binds on a GPU with the ``kernels`` hub: the
kernel a GPU plan prices); ``torch``: transformers' torch fallback (CPU)."""

STATE_BYTES = 4
"""The recurrent state is fp32 in both kernels and in the op's saved states."""


@dataclass(frozen=True)
class LinearShape:
    """The numbers a model's linear-attention layers cost under one candidate (element counts per local token
    unless named otherwise)."""

    layers: int          # linear-attention layers
    n_layers: int        # all layers
    nk: int
    nv: int
    dk: int
    dv: int
    kernel_taps: int     # conv1d kernel
    U: int               # Ulysses degree (the SP degree: no ring)
    replicas: int        # copies of each q/k head sent (U / n_k when U > n_k, else 1)
    h: int
    e: int               # bytes per activation element
    s: float             # local tokens (micro-batch x S_pad / U)
    S_pad: int
    b: int               # sequences per micro-batch
    q: int               # the softmax-attention layers' q width (what a linear layer does without)
    k_eff: int           # their replicated K/V width
    gate: bool           # their output gate
    kernel: str = "fla"

    @property
    def value(self) -> int:
        return self.nv * self.dv

    @property
    def qk(self) -> int:
        """q and k channels per local token after the all-to-all (replicated heads counted)."""
        return 2 * self.nk * self.dk * self.replicas

    @property
    def conv(self) -> int:
        """The op's q/k/v input channels per local token (its conv channels)."""
        return self.qk + self.value

    @property
    def slots(self) -> int:
        """What the input all-to-all carries per local token: q, k, v, b and a."""
        return self.conv + 2 * self.nv

    @property
    def share(self) -> float:
        """The linear layers' share of the model's layers."""
        return self.layers / self.n_layers


def split_reason(nk: int, nv: int, ulysses: int) -> str | None:
    """Why ``ulysses`` ranks cannot split a Gated DeltaNet layer's heads, or None: the value heads must divide; the
    q/k heads must divide or divide the ranks (each then copied); the compiler's rule
    (compiler/linear_attention.py ``split_reason``), in the same words."""
    if nv % ulysses:
        return f"{ulysses} Ulysses ranks do not divide the {nv} linear value heads"
    if nk % ulysses and ulysses % nk:
        return f"{ulysses} Ulysses ranks and the {nk} linear key heads: one must divide the other"
    return None


def plan_reason(model, ring: int, sequence_chunks: int, ulysses: int) -> str | None:
    """Why a hybrid ``model`` cannot run a candidate with this ring, chunking and Ulysses degree, or None (always
    None without linear layers): what the compiler refuses before it builds anything."""
    if not model.linear_layers:
        return None
    if ring > 1:
        return (f"ring={ring}: the model's Gated DeltaNet linear-attention layers carry a recurrent state along the "
                "sequence that autosp does not pass around a ring; use ring=1 (Ulysses only: sp must divide the "
                "linear value heads)")
    if sequence_chunks > 1:
        return (f"sequence_chunks={sequence_chunks}: the model's Gated DeltaNet linear-attention layers carry a "
                "recurrent state from chunk to chunk, which sequence-chunked layers do not; use sequence_chunks=1")
    return split_reason(model.linear_num_key_heads, model.linear_num_value_heads, ulysses)


def layout(model, cand, s: float, S_pad: int, e: int, q: int, k_eff: int, kernel: str = "fla") -> LinearShape | None:
    """The linear-attention shape of ``model`` under ``cand`` (None without linear layers); ValueError (the
    compiler's words) for a ring, sequence chunks or a Ulysses degree that cannot split the heads."""
    if not model.linear_layers:
        return None
    reason = plan_reason(model, cand.ring, cand.sequence_chunks, cand.ulysses)
    if reason:
        raise ValueError(reason)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    U, nk = cand.ulysses, model.linear_num_key_heads
    return LinearShape(layers=len(model.linear_layers), n_layers=model.n_layers, nk=nk,
                       nv=model.linear_num_value_heads, dk=model.linear_key_head_dim, dv=model.linear_value_head_dim,
                       kernel_taps=model.linear_conv_kernel_dim, U=U, replicas=U // nk if U > nk else 1,
                       h=model.hidden, e=e, s=s, S_pad=S_pad, b=cand.micro_batch, q=q, k_eff=k_eff,
                       gate=model.attn_output_gate, kernel=kernel)


# --- FLOPs -------------------------------------------------------------------------------------------------------

def core_flops_per_head_token(dk: int, dv: int, chunk: int = CHUNK) -> float:
    """Forward FLOPs of the chunked gated delta rule per value head and token. Per chunk of C tokens: the two
    C x C x d_k products (k_beta k^T, q k^T: 4 C^2 d_k), the triangular solves of the UT transform for v_beta and
    the decayed k_beta (C^2 d_v + C^2 d_k), the intra-chunk attention times the new values (2 C^2 d_v) and three
    C x d_k x d_v products against the state (read by the keys and by the queries, and the update: 6 C d_k d_v)."""
    return chunk * (5 * dk + 3 * dv) + 6 * dk * dv


def core_flops_forward(ls: LinearShape | None) -> float:
    """Forward FLOPs of every linear layer's op in one micro-batch on one GPU: its n_v / U value heads over the
    whole padded sequence (s x n_v head-tokens), and the depthwise conv's 2 x taps per channel."""
    if ls is None:
        return 0.0
    per_token = ls.nv * core_flops_per_head_token(ls.dk, ls.dv) + 2 * ls.kernel_taps * ls.conv
    return ls.layers * ls.s * per_token


def pointwise_elems(ls: LinearShape) -> float:
    """Elements one linear layer's memory-bound forward reads and writes per local token beyond the norms, SiLU and
    residuals it shares with a softmax-attention layer: the gates (a + dt_bias, softplus, decay, sigmoid: 6 n_v),
    the layout copies around the two all-to-alls (2 slots + 2 v), the conv and its SiLU (4 conv), q/k's L2 norm
    (2 qk) and the gated RMSNorm (read the output and z, write: 3 v)."""
    return 6 * ls.nv + 2 * ls.slots + 2 * ls.value + 4 * ls.conv + 2 * ls.qk + 3 * ls.value


def attention_pointwise_elems(ls: LinearShape, rope_k: float) -> float:
    """Elements of a softmax-attention layer's pointwise forward a linear layer does not do: RoPE on q and k
    (2 q + ``rope_k``, the analytic profile's replicated K part), the layout copies around its four all-to-alls
    (2 (2 q + 2 k_eff)) and, with the output gate, its sigmoid and product (3 q)."""
    return 2 * ls.q + rope_k + 2 * (2 * ls.q + 2 * ls.k_eff) + (3 * ls.q if ls.gate else 0)


# --- communication ------------------------------------------------------------------------------------------------

def all_to_all_widths(ls: LinearShape) -> tuple[int, int]:
    """(in, out) elements per local token of a linear layer's two all-to-alls: q/k/v/b/a to the heads, the output
    back. The backward runs both on the gradients; a full recompute repeats the forward's."""
    return ls.slots, ls.value


def a2a_buffer_bytes(ls: LinearShape | None) -> float:
    """Send + receive copies of the larger all-to-all of a linear layer (0 without one: no linear layers, U = 1)."""
    if ls is None or ls.U <= 1:
        return 0.0
    return 2.0 * ls.s * max(all_to_all_widths(ls)) * ls.e


# --- memory -------------------------------------------------------------------------------------------------------

def state_bytes(ls: LinearShape) -> float:
    """The fp32 recurrent states one linear layer's op saves on one GPU: the state of each of its n_v / U value heads
    entering every piece after the first, per sequence ((S_pad - 1) // PIECE_TOKENS of them; the op's shape)."""
    pieces = (ls.S_pad - 1) // PIECE_TOKENS
    return ls.b * pieces * ls.nv / ls.U * ls.dk * ls.dv * STATE_BYTES


def kept(ls: LinearShape, policy: str) -> tuple[float, float]:
    """(elements, fixed bytes) per local token one linear layer keeps for its backward, the layer input and norms
    included (like the profile's ``kept_attn`` of a softmax layer; the MLP side is the same for both):

    none:      x, n1, h1, n2 | slots (the op's q/k/v input is a view of the all-to-all output), beta, z, the
               output after its all-to-all, the out projection's input | fp32: the decay g and softplus's input,
               the gated norm's inverse RMS (4 n_v each), the two RMSNorms' (8 B)
    selective: x, out-projection output | slots, z (a matmul output), the output after its all-to-all
    sequence: x | slots, the output after its all-to-all (collectives are never recomputed)
    full:      x
    The states (:func:`state_bytes`) come on top under every policy but full."""
    h, nv, v = ls.h, ls.nv, ls.value
    if policy == "none":
        return 4 * h + ls.slots + nv + 3 * v, 12.0 * nv + 8
    if policy == "selective":
        return 2 * h + ls.slots + 2 * v, 0.0
    if policy == "sequence":
        return h + ls.slots + v, 0.0
    return float(h), 0.0


def kept_bytes(ls: LinearShape, policy: str) -> float:
    """Bytes one linear layer keeps on one GPU under ``policy``: :func:`kept` over the local tokens plus the states
    (recomputed with the layer under full)."""
    elems, fixed = kept(ls, policy)
    return ls.s * (elems * ls.e + fixed) + (0.0 if policy == "full" else state_bytes(ls))


def recompute_mlp_phase(ls: LinearShape, policy: str) -> tuple[float, float]:
    """(elements, fixed bytes) per local token a linear layer's recompute leaves alive during its MLP backward
    (the profile's ``recompute_mlp_phase`` of a softmax layer): selective and sequence recompute the norms (n1, h1,
    n2: 3 h) as for attention; full rebuilds the whole layer's :func:`kept` set of ``none`` but x."""
    if policy == "none":
        return 0.0, 0.0
    if policy == "full":
        elems, fixed = kept(ls, "none")
        return elems - ls.h, fixed
    return 3.0 * ls.h, 0.0


TORCH_FALLBACK_ELEMS = (12.6, 8.7, 7.4, 1.5)
"""fp32 elements per value head and token that one piece's backward holds with transformers' torch fallback:
a x d_k + b x d_v + c x C + d x d_k d_v / C. A least-squares fit of the op's allocated backward peak (less its
whole-sequence input gradients) over nine shapes (d_k, d_v from 32 to 128, 1-4 value heads), residuals within 5%:
``python -m studies.linear_attention_memory``, "fit". Counting the fallback's tensors gives a similar form: fp32
copies and products of q and k (its transposed copies, L2 norms, scaled, padded, beta-weighted, decayed and
UT-transformed keys: ~12 d_k), of v (~10 d_v), seven C-wide rows of the C x C chunk matrices and three states per
chunk (3 d_k d_v / C); what is freed before the backward's peak makes the fit smaller."""


def kernel_bytes_per_head_token(ls: LinearShape) -> float:
    """Bytes per value head and token the kernel holds at the peak of one piece's backward (the op's conv and the
    piece's input gradients included).

    ``fla`` (flash-linear-attention's ``chunk_gated_delta_rule``, bf16 inputs; read from its ``chunk.py`` and
    ``chunk_delta_h.py``: what its forward saves and its backward allocates, not measured here): saved q, k
    (L2-normalised, 2 x 2 d_k), their inverse norms (8), v (2 d_v), the cumulated decay (4), beta (2) and the UT
    matrix A (64 x 2); in the backward w (2 d_k), u, v_new, dv and its second buffer, do's dv (5 x 2 d_v), the
    per-chunk states h and dh (2 x 2 d_k d_v / 64), dq, dk, dw and dk2 in fp32 (16 d_k), dv (2 d_v), db and dg
    (10): 22 d_k + 12 d_v + d_k d_v / 16 + 152.

    ``torch`` (transformers' ``torch_chunk_gated_delta_rule``, fp32 throughout): :data:`TORCH_FALLBACK_ELEMS`."""
    dk, dv = ls.dk, ls.dv
    if ls.kernel == "fla":
        return 22 * dk + 12 * dv + dk * dv / 16 + 152
    a, b, c, d = TORCH_FALLBACK_ELEMS
    return 4.0 * (a * dk + b * dv + c * CHUNK + d * dk * dv / CHUNK)


def piece_bytes(ls: LinearShape) -> float:
    """Bytes one piece's backward holds on one GPU: the kernel's (:func:`kernel_bytes_per_head_token`) for the
    rank's n_v / U value heads over min(PIECE_TOKENS, S_pad) tokens of each sequence."""
    tokens = ls.b * min(PIECE_TOKENS, ls.S_pad)
    return tokens * ls.nv * kernel_bytes_per_head_token(ls) / ls.U


def mixer_phase_bytes(ls: LinearShape, policy: str) -> float:
    """Bytes alive on top of the kept set while one linear layer's op runs its backward (the softmax layer's
    "attention phase"): the gradient of the layer's output before and after its all-to-all (2 v), the projections'
    gradient buffer the compiled backward allocates before it (q/k/v/z/b/a: 2 n_k d_k + 2 v + 2 n_v, z's written
    already), the gradients of the op's inputs over the whole sequence (conv, beta: the op allocates them first; the
    decay's in fp32) and the residual gradient (h); what the policy recomputed (selective and sequence: n1, beta and
    the fp32 decay; full: also the slots, and the states); and one piece's recompute (:func:`piece_bytes`). The
    backward's other moments (the norm's, the projections') hold less. Measured on the CPU by allocation events:
    ``python -m studies.linear_attention_memory``."""
    projections = 2 * ls.nk * ls.dk + 2 * ls.value + 2 * ls.nv
    grads = 2 * ls.value + projections + ls.conv + ls.nv + ls.h
    grads_fixed = 4.0 * ls.nv
    if policy == "none":
        re, re_fixed = 0.0, 0.0
    elif policy == "full":
        re, re_fixed = ls.h + ls.slots + ls.nv, 8.0 * ls.nv
    else:
        re, re_fixed = ls.h + ls.nv, 8.0 * ls.nv
    states = state_bytes(ls) if policy == "full" else 0.0
    return ls.s * ((grads + re) * ls.e + grads_fixed + re_fixed) + piece_bytes(ls) + states
