"""The cost model against ALST's and TRL's published H100 runs (studies/published_gpu.py, docs/cost_model.md
section 12): every run that ran is predicted to fit, from 1M tokens its iteration time within 10% of the published
one, and TRL's published allocated peak within 5%."""

import os
import sys
from pathlib import Path

import pytest

sys.path.append(str(next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())))

from studies import published_gpu as study  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def profile_cache(tmp_path_factory):
    """TRL's rows are priced with the graph profile of transformers' Qwen3 (traced once, ~6 s): cached here."""
    old = os.environ.get("AUTOSP_CACHE_DIR")
    os.environ["AUTOSP_CACHE_DIR"] = str(tmp_path_factory.mktemp("autosp-cache"))
    yield
    if old is None:
        os.environ.pop("AUTOSP_CACHE_DIR", None)
    else:
        os.environ["AUTOSP_CACHE_DIR"] = old


@pytest.mark.parametrize("run", study.RUNS, ids=lambda r: f"{r.hardware}-{r.seq_len}")
def test_published_run_fits_and_long_runs_take_the_published_time(run):
    cand, est = study.price(run)
    assert est.fits, (cand.short(), est.memory.total / 2**30)
    # the pinned knobs are the recipe's
    assert (cand.sp, cand.ring, cand.zero_stage, cand.checkpointing, cand.offload_optimizer) == \
        (run.sp, run.ring, 3, "full", run.offload_optimizer)
    assert cand.offload_activations == run.offload_activations and cand.offload_param == run.offload_param
    assert (cand.mlp_chunks > 1) == run.mlp_tiled and (cand.loss_chunks > 1) == run.loss_tiled
    if run.seq_len >= study.LONG_ROW:
        assert est.time.step / run.published_s == pytest.approx(1.0, abs=study.TIME_TARGET)
    if run.published_memory_gb:
        low, high = study.MEMORY_TARGET
        assert low <= study.memory_ratio(run, est) - 1 <= high


def test_each_system_is_priced_with_its_attention_kernel_and_one_set_of_constants():
    """ALST ran FlashAttention-2; TRL the H100 default (cuDNN SDPA). Only the kernel differs between them: with
    FlashAttention-2 forced on every row the TRL rows come out about 1.5x too slow (the model before kernels)."""
    kernels = {run.system: study.run_hardware(run).attention_kernel for run in study.RUNS}
    assert kernels == {"ALST": "flash2", "TRL": "cudnn"}
    trl = next(run for run in study.RUNS if run.system == "TRL")
    assert study.price(trl, kernel="flash2")[1].time.step / trl.published_s > 1.4


def test_trl_is_priced_with_its_own_loss_tiles_whose_peak_is_the_layers_backward():
    """TRL's chunked_nll tiles its loss at 256 tokens (priced as the planner's smallest tile): the loss phase is then
    small and the layers' backward is the peak, as in TRL's run. Left to the search, the fastest tiling (few large
    tiles) priced a loss phase TRL never had."""
    for run in (r for r in study.RUNS if r.system == "TRL"):
        cand, est = study.price(run)
        assert cand.loss_chunks == run.seq_len // run.sp // study.MIN_TILE_TOKENS
        assert est.memory.logits_loss == 0.0 and est.memory.gradients > 0  # the backward phase is the peak


def test_trl_1m_allocated_peak_is_the_published_one():
    """TRL's Qwen3-8B at 1,048,576 tokens on 8 H100s: 56.2 GB, torch.cuda.max_memory_allocated. Priced as TRL ran it
    (transformers' Qwen3 eagerly: its graph profile) and compared without the reserve, the allocated peak is within
    5% (1.019; issue 36 read 1.20 from the graph profile and the total, and the study's analytic profile 0.86). The
    peak is a layer's MLP backward under full recompute: its eager working set (every RMSNorm's fp32 copy, q/k
    norms, gate, SiLU and up with three gradients, 33-34 GiB), not the final norm's tensors (freed before any
    layer's backward) and not the sum of the recomputed MLP tensors and the gradients' peak."""
    from autosp.cost_models import memory
    from autosp.cost_models.shapes import Shapes
    from autosp.contract.specs import Workload

    run = next(r for r in study.RUNS if r.system == "TRL" and r.published_memory_gb)
    cand, est = study.price(run)
    assert 0.95 <= study.memory_ratio(run, est) <= 1.05
    assert not any("loss phase" in n for n in est.notes)
    prof = study.run_profile(run)
    assert prof.source == "graph" and dict(prof.details)["sdpa_calls"] == 1
    sh = Shapes(study.resolve_model(run.model), Workload(seq_len=run.seq_len, compile_backend="eager"), cand, prof)
    kept, transient, per_layer, _ = memory.activation_bytes(sh, cand)
    assert est.memory.activations == kept - memory.outside_layers_bytes(sh) + transient
    assert 33 * 2**30 < transient < 35 * 2**30 and per_layer == 2**30  # one layer input: 131,072 x 4,096 x 2 B
    terms = dict(study.peak_terms(run, cand, est))                      # the study's breakdown sums to the total
    assert sum(terms.values()) == pytest.approx(est.memory.total, rel=1e-12)
    assert terms["kept outside the layers"] == 0 and terms["MLP phase: MLP tensors alive"] == 9 * 2**30  # gate, SiLU, up


def test_results_file_keeps_one_section_per_label(tmp_path):
    path = tmp_path / "published.txt"
    study.write_section("a", "## a\n\nfirst\n", path)
    study.write_section("b", "## b\n\nsecond\n", path)
    study.write_section("a", "## a\n\nagain\n", path)
    text = path.read_text()
    assert text.startswith("# ") and text.count("## a") == 1 and "again" in text and "first" not in text
    assert text.index("## a") < text.index("## b")


def test_hms():
    assert study.hms("1:47:35") == 6455 and study.hms("2:03") == 123 and study.hms("17") == 17
