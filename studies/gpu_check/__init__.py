"""A one-command GPU check of the cost model: ``python -m studies.gpu_check`` (studies/README.md).

On one CUDA GPU, within a time budget (default 420 s, compiles included), it trains a randomly
initialised model of Llama-3.2-1B's shape with the compiled autosp path at SP=1 in bf16 at several
sequence lengths, the rows together exercising every plan knob the compiler builds at SP=1
(:mod:`.rows`), and prints each row's measured peak memory and step time next to the cost model's
prediction (:mod:`.report`). Without CUDA (or with ``--dry-run``) the same rows run on the CPU at tiny
sizes through the same code. Runs from a bare checkout: autosp need not be installed
(:mod:`studies.bootstrap`).
"""

from studies.bootstrap import ensure_autosp

ensure_autosp()
