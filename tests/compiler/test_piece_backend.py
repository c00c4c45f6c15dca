"""The blockwise/ring pieces on CUDA run the SDPA backend that the compiler's kernel selection allows (issue 23):
:func:`cuda_backend` follows torch's backend priority order and enabled flags, as SDPA does. No GPU here, so the
rule is checked with torch's flags and capability checks stood in for; the kernels themselves are not run."""

from __future__ import annotations

import pytest
import torch
from torch.backends import cuda as sdp

from autosp.compiler.attention.kernels import cuda_backend

FLASH, EFFICIENT, MATH, CUDNN = 1, 2, 0, 3


@pytest.fixture
def machine(monkeypatch):
    state = {"order": [FLASH, EFFICIENT, MATH, CUDNN], "enabled": {"flash", "efficient", "cudnn"},
             "usable": {"flash", "efficient", "cudnn"}}
    monkeypatch.setattr(torch._C, "_get_sdp_priority_order", lambda: list(state["order"]))
    for name, enabled, usable in (("flash", "flash_sdp_enabled", "can_use_flash_attention"),
                                  ("efficient", "mem_efficient_sdp_enabled", "can_use_efficient_attention"),
                                  ("cudnn", "cudnn_sdp_enabled", "can_use_cudnn_attention")):
        monkeypatch.setattr(sdp, enabled, (lambda n: lambda: n in state["enabled"])(name))
        monkeypatch.setattr(sdp, usable, (lambda n: lambda params, debug=False: n in state["usable"])(name))
    return state


def test_the_first_enabled_usable_backend_of_the_priority_order_runs(machine):
    q = torch.randn(1, 4, 64, 16)
    assert cuda_backend(q, q, q, True) == "flash"  # torch's default order
    machine["order"] = [CUDNN, FLASH, EFFICIENT, MATH]  # sdpa_kernel([...CUDNN first...], set_priority=True)
    assert cuda_backend(q, q, q, True) == "cudnn"
    machine["usable"].discard("cudnn")  # e.g. a head size cuDNN refuses
    assert cuda_backend(q, q, q, True) == "flash"
    machine["enabled"].discard("flash")  # sdpa_kernel without FLASH_ATTENTION
    assert cuda_backend(q, q, q, True) == "efficient"
    machine["enabled"].clear()  # only MATH allowed: it returns no log-sum-exp, so the efficient kernel runs
    assert cuda_backend(q, q, q, True) == "efficient"


def test_the_compilers_kernel_contexts_set_the_order_the_pieces_follow():
    from torch.nn.attention import SDPBackend

    from autosp.compiler.attention_kernel import sdpa_backends

    assert sdpa_backends("cudnn")[0] == SDPBackend.CUDNN_ATTENTION.name
    assert sdpa_backends("flash2")[0] == SDPBackend.FLASH_ATTENTION.name
    assert sdpa_backends("flash3") is None and sdpa_backends("flex") is None
