"""Which attention kernel the compiler runs (compiler/attention_kernel.py), on CPU: the selection logic for CUDA
machines described by their capability, cuDNN version and packages, and the warning when the plan assumed a
kernel the machine lacks."""

from autosp.compiler.attention_kernel import CUDNN_PREFERRED_FROM, Machine, available, choose, machine, sdpa_backends
from autosp.cost_models.catalog.attention_kernels import default_kernel

H100 = Machine(device="cuda", capability=(9, 0), cudnn_version=CUDNN_PREFERRED_FROM)
A100 = Machine(device="cuda", capability=(8, 0), cudnn_version=CUDNN_PREFERRED_FROM)
OLD_CUDNN_H100 = Machine(device="cuda", capability=(9, 0), cudnn_version=91002)


def test_the_compiler_default_is_the_planner_default():
    assert available(H100)[0] == "cudnn" == default_kernel("h100")
    assert available(A100)[0] == "flash2" == default_kernel("a100-80g")
    assert available(OLD_CUDNN_H100)[0] == "flash2"  # SDPA prefers cuDNN only from 9.15.1
    assert available(Machine(device="cpu")) == ("cpu",)


def test_a_planned_kernel_that_runs_here_is_used_and_one_that_does_not_is_a_warning_naming_what_runs():
    assert choose("flash2", H100) == ("flash2", None)
    assert choose(None, H100) == ("cudnn", None)
    kernel, warning = choose("flash3", H100)  # no flash_attn_interface package
    assert kernel == "cudnn" and "flash3" in warning and "cudnn will run" in warning
    assert choose("flash3", Machine(device="cuda", capability=(9, 0), flash3_package=True)) == ("flash3", None)
    kernel, warning = choose("cudnn", Machine(device="cpu"))
    assert kernel == "cpu" and "cudnn" in warning and "cpu will run" in warning


def test_sdpa_backend_order_per_kernel_and_this_machine():
    assert sdpa_backends("cudnn")[0] == "CUDNN_ATTENTION" and sdpa_backends("flash2")[0] == "FLASH_ATTENTION"
    assert sdpa_backends("flex") is None  # not an SDPA backend
    from torch.nn.attention import SDPBackend

    for kernel in ("cudnn", "flash2", "efficient", "cpu"):
        assert all(hasattr(SDPBackend, name) for name in sdpa_backends(kernel))
    assert machine().device in ("cpu", "cuda")
