"""PEFT LoRA under autosp: only the adapters train, their gradients exact under sequence parallelism.

CPU, tiny model, 2 processes:   .venv/bin/torchrun --nproc-per-node 2 examples/lora.py
GPUs, a real model:             .venv/bin/torchrun --nproc-per-node 8 examples/lora.py \\
                                    --model meta-llama/Llama-3.1-8B --sp-size 8 --seq 65536
The adapter is saved to --output-dir (default: a folder under the system's temporary one, printed at the end).
"""

from __future__ import annotations

import torch
from common import backend, load_model, load_tokenizer, on_gpu, parser, save, words
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling, TrainingArguments

import autosp.hf


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    model = load_model(args.model)
    tok = load_tokenizer(args.model, model.config.vocab_size)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model.print_trainable_parameters()
    gen = torch.Generator().manual_seed(0)
    texts = [words(gen, args.seq, model.config.vocab_size) for _ in range(4 * args.steps)]
    train = [{"input_ids": ids} for ids in tok(texts, truncation=True, max_length=args.seq)["input_ids"]]
    training = TrainingArguments(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=1, learning_rate=1e-3, logging_steps=1,
                                 bf16=on_gpu(), use_cpu=not on_gpu(), save_strategy="no", report_to=[],
                                 disable_tqdm=True)
    trainer = autosp.hf.Trainer(model=model, args=training, train_dataset=train,
                                data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
                                sp_size=args.sp_size, backend=backend())
    trainer.train()
    save(trainer, args.output_dir)  # the adapter: PeftModel.from_pretrained(base_model, args.output_dir)


if __name__ == "__main__":
    main()
