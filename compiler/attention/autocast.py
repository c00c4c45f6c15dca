"""Autocast for autosp's attention ops, as for the SDPA call they replace.

Under ``torch.autocast`` PyTorch runs ``scaled_dot_product_attention`` in the autocast dtype (it is on the
lower-precision list of CPU and CUDA autocast), whatever mix of dtypes its inputs have: with Hugging Face's
rotary embeddings in fp32, q and k arrive in fp32 and v in bf16. A ``torch.library.custom_op`` has no autocast
rule of its own, so without one the attention ops the passes put in SDPA's place would receive that mix and
fail ("expected scalar type Float but found BFloat16"). :func:`cast_like_sdpa` gives an op the rule SDPA has:
every floating tensor argument cast to the dtype of the active autocast region (read at call time, unlike
``torch.library.register_autocast``, which fixes one dtype), the cast recorded by autograd, so gradients flow
back in the inputs' own dtypes.
"""

from __future__ import annotations

import torch

_LIB = torch.library.Library("autosp_ops", "FRAGMENT")
DEVICE_TYPES = ("cpu", "cuda")


def _cast(value, device_type: str, dtype: torch.dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == device_type:
        return value.to(dtype)
    return value


def cast_like_sdpa(op: torch._ops.OpOverload) -> None:
    """Register the autocast rule of SDPA for ``op`` (an ``autosp_ops`` overload) on CPU and CUDA."""
    name = op._schema.name.split("::", 1)[1]
    for device_type in DEVICE_TYPES:
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

        def kernel(_keys, *args, _device_type=device_type, _excluded=excluded):
            dtype = torch.get_autocast_dtype(_device_type)
            with torch._C._ExcludeDispatchKeyGuard(_excluded):
                return op(*(_cast(a, _device_type, dtype) for a in args))

        _LIB.impl(name, kernel, key, with_keyset=True)


__all__ = ["cast_like_sdpa"]
