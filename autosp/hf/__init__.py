"""autosp inside the trainers people use: ``autosp.hf.Trainer`` (a ``transformers.Trainer``) and
``autosp.hf.SFTTrainer`` (a ``trl.SFTTrainer``), sequence-parallel through autosp's compiler, exact.
``pip install 'autosp[hf]'``; docs/hf-trainers.md. transformers and TRL are imported on first use."""

__all__ = ["SFTTrainer", "Trainer"]


def __getattr__(name):
    if name == "Trainer":
        from autosp.hf.trainers import Trainer

        return Trainer
    if name == "SFTTrainer":
        from autosp.hf import trainers

        if not hasattr(trainers, "SFTTrainer"):
            trainers.SFTTrainer = trainers._sft_trainer()
        return trainers.SFTTrainer
    raise AttributeError(f"module 'autosp.hf' has no attribute {name!r}")
