"""The op tables the graph-derived cost model and the compiler share (autosp.cost_models.op_classes): one
definition, read the same way by both, so what the cost model predicts a checkpointing policy keeps is what
the compiler tags the partitioner to keep."""

from __future__ import annotations

import operator

import torch

from autosp.compiler.passes import checkpointing
from autosp.compiler.passes.check import _product_of_two
from autosp.cost_models import op_classes
from autosp.profiling.graph import layer, trace
from autosp.cost_models.specs import CHECKPOINTING_POLICIES

aten = torch.ops.aten


def test_one_keep_table_for_every_policy():
    assert tuple(op_classes.KEEP_CLASSES) == CHECKPOINTING_POLICIES
    assert checkpointing.KEEP_CLASSES is op_classes.KEEP_CLASSES
    assert layer.KEEP_CLASSES is op_classes.KEEP_CLASSES


def test_cost_model_and_compiler_classify_real_aten_ops_alike():
    ops = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.matmul.default,
           aten.mv.default, aten.dot.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
           aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
           aten._scaled_dot_product_efficient_attention.default, aten._flash_attention_forward.default,
           aten._efficient_attention_forward.default, aten.add.Tensor, aten.mul.Tensor, aten.silu.default,
           aten.embedding.default]
    as_compiler = {"matmul": "matmul", "attention": "attention", "attention_backward": "attention"}
    for op in ops:
        predicted = trace._op_kind(op._opname)
        compiled = checkpointing._class_of_target(op)
        assert as_compiler.get(predicted, "other") == compiled, (op, predicted, compiled)
    assert trace._op_kind("mm") == "matmul" and trace._op_kind("_scaled_dot_product_flash_attention") == "attention"


class _Node:
    def __init__(self, target, n_inputs=2):
        self.target, self.all_input_nodes = target, [object()] * n_inputs


def test_the_check_pass_reads_the_same_matmul_table_at_the_torch_level():
    for fn in (torch.matmul, operator.matmul, torch.bmm, torch.einsum, torch.baddbmm):
        assert _product_of_two(_Node(fn)), fn
    assert not _product_of_two(_Node(torch.nn.functional.linear))  # times a weight by construction
    assert not _product_of_two(_Node(torch.add))
    assert not _product_of_two(_Node(torch.matmul, n_inputs=1))
