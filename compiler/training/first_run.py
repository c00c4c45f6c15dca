"""Saying on screen what the first ``autosp-train`` run spends minutes on, before it starts.

Two one-time costs make a first run look hung (issue 19: 268 s with nothing on screen):

- DeepSpeed compiles C++ ops on first use into torch's extension directory (``$TORCH_EXTENSIONS_DIR``,
  default ``~/.cache/torch_extensions``): its shared-memory collectives on CPU (``deepspeed_shm_comm``,
  built when the process group starts) and, with ZeRO-Offload on a GPU, its CPU Adam (``cpu_adam``). We
  look for the built library where torch would put it (or an op DeepSpeed was installed with) and speak
  only when it is missing;
- Inductor compiles the model's graphs into kernels at the first step, caching them
  (``torch._inductor``'s cache directory) for later runs of the same shapes; ``aot_eager`` compiles no
  kernels and needs no notice.

The durations are what this project measured on its machines (DeepSpeed's shm op: ~70 s on 2 cores;
Inductor for the reference Llama: ~40 s), said as rough figures, not promises.
"""

from __future__ import annotations

import os

OP_BUILD_SECONDS = 70
INDUCTOR_SECONDS = 40


def _op_built(name: str) -> bool:
    """Whether DeepSpeed's op ``name`` loads without compiling: installed prebuilt, or a JIT build present."""
    try:
        from deepspeed.git_version_info import installed_ops

        if installed_ops.get(name, False):
            return True
        from torch.utils.cpp_extension import _get_build_directory

        directory = _get_build_directory(name, verbose=False)
    except Exception:  # noqa: BLE001 - a private torch helper; unknown means "say it"
        return False
    return os.path.isfile(os.path.join(directory, f"{name}.so"))


def ops_to_build(cuda: bool, offload_optimizer: bool) -> list[str]:
    """The DeepSpeed ops this run will compile first (none when built already)."""
    wanted = []
    if not cuda:
        import deepspeed.ops

        if deepspeed.ops.__compatible_ops__.get("deepspeed_shm_comm", False):
            wanted.append("deepspeed_shm_comm")
    elif offload_optimizer:
        wanted.append("cpu_adam")
    return [name for name in wanted if not _op_built(name)]


def inductor_cached() -> bool:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        directory = cache_dir()
    except Exception:  # noqa: BLE001 - private torch API moved: assume a first compile
        return False
    return os.path.isdir(directory) and any(os.scandir(directory))


def op_notice(cuda: bool, offload_optimizer: bool) -> str | None:
    names = ops_to_build(cuda, offload_optimizer)
    if not names:
        return None
    return (f"autosp-train: building DeepSpeed's {'CPU ' if not cuda else ''}ops ({', '.join(names)}), once: "
            f"~{OP_BUILD_SECONDS} s")


def compile_notice(backend: str) -> str | None:
    if backend != "inductor":
        return None
    if inductor_cached():
        return "autosp-train: compiling the model with Inductor (kernels cached by an earlier run are reused)"
    return f"autosp-train: compiling the model with Inductor: ~{INDUCTOR_SECONDS} s the first time"


__all__ = ["compile_notice", "inductor_cached", "op_notice", "ops_to_build"]
