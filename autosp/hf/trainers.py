"""``autosp.hf.Trainer`` and ``autosp.hf.SFTTrainer``: the Hugging Face and TRL trainers, sequence-parallel
through autosp (:mod:`autosp.hf.mixin`). They take the same arguments plus ``plan=`` (a plan file, a Plan or
a Candidate), ``sp_size=`` / ``ring_size=`` (a hand-made plan), ``plan_hw=`` / ``plan_ctx=`` (what to plan
for when neither is given), ``backend=`` (``inductor`` or ``aot_eager``) and ``pad_to_multiple_of=``."""

from __future__ import annotations

import transformers

from autosp.hf.mixin import SPTrainerMixin


class Trainer(SPTrainerMixin, transformers.Trainer):
    """A ``transformers.Trainer`` that trains the model sequence-parallel through autosp."""


def _sft_trainer():
    import trl

    from autosp.hf.token_metrics import TokenSums, record

    class SFTTrainer(SPTrainerMixin, trl.SFTTrainer):
        """A ``trl.SFTTrainer`` that trains the model sequence-parallel through autosp (packing and
        padding-free batches included: documents attend only within themselves), logging TRL's token metrics."""

        def _sp_loss(self, model, inputs):
            """The micro-batch's loss, and TRL's metrics of it over the whole sequence (token_metrics.py)."""
            mode = "train" if self.model.training else "eval"
            with TokenSums(ignore_index=-100).observing(self._sp_target) as seen:
                loss = super()._sp_loss(model, inputs)
            record(self, mode, seen, inputs)
            return loss

        def _sp_aux_weight(self, step_scaled, scale, model_coef):
            """TRL's weight of the load-balancing loss (``trl.SFTTrainer.compute_loss``): its own
            ``router_aux_loss_coef`` (not the model's), divided by the gradient accumulation when the loss is
            normalised by the step's tokens (else the whole loss is scaled by ``scale``)."""
            coef = self.router_aux_loss_coef
            return coef / self.current_gradient_accumulation_steps if step_scaled else coef * scale

    SFTTrainer.__module__ = __name__
    return SFTTrainer


__all__ = ["Trainer"]
