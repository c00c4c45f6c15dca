#!/usr/bin/env bash
# On the development machine, before a GPU session: what studies/gpu_session/run.sh needs there and cannot make
# there (no network, no optuna): the wheels (.gpu_wheels/) and the plans it trains (.gpu_run/), both ignored by git.
#
#   studies/gpu_session/prepare.sh          # from the repository root, after the venv is set up
#
# The plans: Llama-3.2-1B on one H200, each with an attention kernel pinned (--attention-kernel): flash3, which
# the machine lacks (autosp-train must warn and name the kernel that runs), and flash2 and cudnn, trained at
# the same shape so that their step times compare the kernels inside the compiled step.
set -euo pipefail
cd "$(dirname "$0")/../.."
PLAN=${PLAN:-.venv/bin/autosp-plan}
bash studies/gpu_session/wheels.sh
mkdir -p .gpu_run
"$PLAN" --model llama-3.2-1b --ctx 4k --hw h200 --attention-kernel flash3 --no-cache --plan-out .gpu_run/plan_flash3.json >/dev/null
for kernel in flash2 cudnn; do
  "$PLAN" --model llama-3.2-1b --ctx 32k --hw h200 --attention-kernel $kernel --fix micro_batch=1 \
    --fix checkpointing=none --no-cache --plan-out .gpu_run/plan_$kernel.json >/dev/null
done
ls -l .gpu_run
