"""autosp.hf.SFTTrainer on packed chat data: TRL packs conversations into rows (position_ids restart per
document); autosp shards each row over the SP group and attention never crosses a conversation.

CPU, tiny model, 2 processes:   .venv/bin/torchrun --nproc-per-node 2 examples/sft_packed.py
GPUs, a real model:             .venv/bin/torchrun --nproc-per-node 8 examples/sft_packed.py \\
                                    --model Qwen/Qwen2.5-7B-Instruct --sp-size 4 --seq 32768
The model is saved to --output-dir (default: a folder under the system's temporary one, printed at the end).
"""

from __future__ import annotations

import torch
from common import backend, load_model, load_tokenizer, on_gpu, parser, save, words
from datasets import Dataset
from trl import SFTConfig

import autosp.hf


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    model = load_model(args.model)
    tok = load_tokenizer(args.model, model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def turn(role):
        return {"role": role, "content": words(gen, int(torch.randint(4, args.seq // 6, (1,), generator=gen)), vocab)}

    chats = Dataset.from_list([{"messages": [turn("user"), turn("assistant")]} for _ in range(6 * args.steps)])
    config = SFTConfig(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=1,
                       gradient_accumulation_steps=1, learning_rate=1e-4, logging_steps=1, packing=True,
                       padding_free=True, max_length=args.seq, bf16=on_gpu(), use_cpu=not on_gpu(),
                       save_strategy="no", report_to=[], disable_tqdm=True)
    trainer = autosp.hf.SFTTrainer(model=model, args=config, train_dataset=chats, processing_class=tok,
                                   sp_size=args.sp_size, backend=backend())
    trainer.train()
    save(trainer, args.output_dir)


if __name__ == "__main__":
    main()
