"""studies.measure.memory.attributed_peak: the optimizer step's allocations are reported apart from the
forward and backward's, so a study comparing activations with a prediction reads the right peak."""

from __future__ import annotations

import torch

from studies.measure.memory import attributed_peak


def test_a_step_that_allocates_more_than_the_backward_does_not_become_the_activation_peak():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    x = torch.randn(32, 64)
    big = 4 * 2**20  # bytes the step allocates: far above this backward's working set (a few 10 KiB)
    held = []

    def forward():
        return module(x).square().mean()

    def step():
        held.append(torch.empty(big // 4, dtype=torch.float32).fill_(1.0))
        held.clear()

    dyn = attributed_peak(forward, lambda loss: loss.backward(), step, module, None, vocab=10,
                          device=torch.device("cpu"))
    assert dyn["peak"] >= big
    before = dyn["before_step"]
    assert 0 < before["peak"] < big / 8, before
    assert before["at_peak"]["activations"] > 0 or before["at_peak"]["gradients"] > 0, before


def test_the_activation_peak_counts_what_the_forward_keeps_even_after_it_is_freed():
    """The backward frees what the forward saved before the gradients come: the activation peak is the most
    alive at once (here the 4 MiB a forward keeps), whatever is alive at the moment of the total peak."""
    torch.manual_seed(0)
    module = torch.nn.Linear(256, 256)
    x = torch.randn(4096, 256)  # 4 MiB of input, saved by the matmul's backward
    big = 4096 * 256 * 4

    def forward():
        return torch.tanh(module(x.clone().requires_grad_(False))).sum()

    dyn = attributed_peak(forward, lambda loss: loss.backward(), lambda: None, module, None, vocab=10,
                          device=torch.device("cpu"))
    assert dyn["before_step"]["activation_peak"] >= big  # the clone of x and tanh's output, alive together
    assert dyn["before_step"]["activation_peak"] <= dyn["before_step"]["peak"] + big

