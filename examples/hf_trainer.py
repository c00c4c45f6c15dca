"""autosp.hf.Trainer: a Hugging Face Trainer that trains sequence-parallel through autosp.

CPU, tiny model, 2 processes:   .venv/bin/torchrun --nproc-per-node 2 examples/hf_trainer.py
GPUs, a real model:             .venv/bin/torchrun --nproc-per-node 8 examples/hf_trainer.py \\
                                    --model meta-llama/Llama-3.1-8B --sp-size 8 --seq 65536
The model is saved to --output-dir (default: a folder under the system's temporary one, printed at the end).
Every rank loads the whole batch; autosp shards each sequence over the SP group (docs/hf-trainers.md).
"""

from __future__ import annotations

import torch
from common import backend, load_model, load_tokenizer, on_gpu, parser, save, words
from transformers import TrainingArguments

import autosp.hf


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    model = load_model(args.model)
    tok = load_tokenizer(args.model, model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    # documents of uneven lengths (autosp pads each batch to a multiple of the SP degree itself)
    texts = [words(gen, int(torch.randint(args.seq // 2, args.seq, (1,), generator=gen)), model.config.vocab_size)
             for _ in range(8 * args.steps)]
    encoded = tok(texts, truncation=True, max_length=args.seq)["input_ids"]
    train = [{"input_ids": ids, "labels": list(ids)} for ids in encoded]

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        pad = lambda seq, value: seq + [value] * (width - len(seq))  # noqa: E731
        return {"input_ids": torch.tensor([pad(r["input_ids"], tok.pad_token_id) for r in rows]),
                "labels": torch.tensor([pad(r["labels"], -100) for r in rows]),
                "attention_mask": torch.tensor([pad([1] * len(r["input_ids"]), 0) for r in rows])}

    training = TrainingArguments(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=2, learning_rate=1e-4, logging_steps=1,
                                 per_device_eval_batch_size=1, bf16=on_gpu(), use_cpu=not on_gpu(),
                                 save_strategy="no", report_to=[], disable_tqdm=True)
    trainer = autosp.hf.Trainer(model=model, args=training, train_dataset=train, eval_dataset=train[:4],
                                data_collator=collate, sp_size=args.sp_size, backend=backend())
    trainer.train()
    print("eval loss", trainer.evaluate()["eval_loss"])
    save(trainer, args.output_dir)  # loads with AutoModelForCausalLM.from_pretrained(args.output_dir)


if __name__ == "__main__":
    main()
