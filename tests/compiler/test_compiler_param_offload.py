"""ZeRO-3 parameter offload (plan knob ``offload_param``) through ``autosp.compile`` on CPU and gloo.

DeepSpeed 0.19.8 runs ``zero_optimization.offload_param: {device: cpu}`` with the CPU accelerator: the test trains
the reference Llama at SP=2 with a plan that asks for parameter and optimizer offload and checks the loss,
gradients and weights against one process on the full sequence (fp32, 1e-5), and that DeepSpeed really runs
with its parameters offloaded (the engine's ``offload_param`` flag, read from its ZeRO-3 optimizer). On a CPU
"host" and "device" are the same memory, so this checks the config path and exactness, not the transfer cost.
"""

from __future__ import annotations

import pytest

from test_compiler_exact import TOL, Z3, make_batches, reference_llama, sgd  # noqa: E402

from autosp.compiler.testing import assert_within

PLAN = dict(sp=2, micro_batch=2, zero_stage=3, offload_optimizer=True, offload_param=True)


def _train(rank, world):
    from autosp.compiler import testing
    from autosp.compiler.api import compile_model
    from autosp.compiler.options import CompileOptions
    from autosp.contract.specs import Candidate

    model = reference_llama()
    batches = make_batches(seq=31)
    got = testing.sp_run(model, batches, sgd, plan=Candidate(**PLAN), backend="aot_eager", ds_config=Z3)
    probe = compile_model(reference_llama(), Candidate(**PLAN),
                          options=CompileOptions(backend="aot_eager", optimizer=sgd, ds_config=Z3))
    zero = probe.ds_engine.optimizer
    flags = {"offload_param": bool(getattr(zero, "offload_param", False)),
             "offload_optimizer": bool(getattr(zero, "offload_optimizer", False)),
             "config": probe.ds_engine.config["zero_optimization"].get("offload_param")}
    if rank == 0:
        ref = testing.reference_run(model, batches, sgd)
        return {"errors": testing.compare(got, ref), "flags": flags}
    return None


@pytest.mark.slow
def test_param_offload_trains_exactly_under_zero3():
    from autosp.compiler import testing

    result = testing.spawn(_train, 2)
    assert_within(result, TOL)
    assert result["flags"]["offload_param"] and result["flags"]["offload_optimizer"], result["flags"]
    assert result["flags"]["config"]["device"] == "cpu"
