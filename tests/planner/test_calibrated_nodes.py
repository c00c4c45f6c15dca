"""A profile calibrated on one node, planned for several (issue 10, item 4).

``autosp-calibrate`` on one node measures no inter-node link; ``--nodes 2`` used to divide by its zero
inter-node bandwidth. Now a GPU the catalog knows gets the catalog's inter-node figures, with a note on
stderr and in the plan's hardware source; any other device gets one line asking for the figures.
"""

import json
from pathlib import Path

import pytest

from autosp.cli import plan_main
from autosp.errors import UsageError
from autosp.cost_models.catalog.hardware import catalog_entry, resolve_hardware
from autosp.cost_models.catalog.hardware_checks import catalog_twin

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
CPU_PROFILE = REPO / "studies" / "results" / "calibrated-cpux2.json"  # measured on one node of 2 CPU ranks


def _gpu_profile(tmp_path) -> Path:
    data = json.loads(CPU_PROFILE.read_text())
    data["accelerator"].update(name="NVIDIA H100 80GB HBM3, measured bf16", peak_flops=7e14,
                               memory_bytes=80 * 2**30, memory_bandwidth=3e12)
    data.update(devices_per_node=8, intra_node_bandwidth=3e11)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(data))
    return path


def test_a_gpu_profile_borrows_the_catalog_inter_node_link_and_says_so(tmp_path, capsys):
    hw = resolve_hardware(str(_gpu_profile(tmp_path)), nodes=2)
    h100 = catalog_entry("h100")
    assert hw.nodes == 2 and hw.inter_node_bandwidth == h100["inter_node_bandwidth"]
    assert hw.inter_node_latency == h100["inter_node_latency"]
    assert "catalog entry h100" in hw.source and "measured one node only" in hw.source
    note, = capsys.readouterr().err.strip().splitlines()
    assert note.startswith("autosp-plan: note: inter-node figures") and "h100" in note


def test_planning_it_on_two_nodes_gives_a_plan_that_records_the_borrowing(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = plan_main(["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", str(_gpu_profile(tmp_path)), "--nodes", "2",
                    "--no-cache", "--trials", "10", "--plan-out", str(out)])
    assert rc == 0, capsys.readouterr().err
    plan = json.loads(out.read_text())
    assert plan["hardware"]["nodes"] == 2 and "catalog entry h100" in plan["hardware"]["source"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_cpu_profile_asks_for_the_inter_node_figures(tmp_path):
    with pytest.raises(UsageError) as err:
        resolve_hardware(str(CPU_PROFILE), nodes=2)
    text = str(err.value)
    assert "measured on one node" in text and "inter_node_bandwidth" in text and "torchrun --nnodes" in text


def test_check_reprices_a_calibrated_plan_on_more_nodes(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert plan_main(["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", str(_gpu_profile(tmp_path)), "--no-cache",
                      "--trials", "10", "--plan-out", str(plan)]) == 0
    capsys.readouterr()
    assert plan_main(["check", str(plan), "--nodes", "2", "--no-cache", "--trials", "10"]) == 3  # 8 GPUs of 16: invalid there
    captured = capsys.readouterr()
    assert "nodes 1 -> 2" in captured.out and "Traceback" not in captured.err


@pytest.mark.parametrize("device, memory_gib, twin", [
    ("NVIDIA H100 80GB HBM3", 80, "h100"), ("NVIDIA H200", 141, "h200"), ("NVIDIA GH200 480GB", 96, "gh200"),
    ("NVIDIA A100-SXM4-80GB", 80, "a100-80g"), ("NVIDIA A100-SXM4-40GB", 40, "a100-40g"),
    ("AMD Instinct MI300X", 192, "mi300x"), ("Intel(R) Xeon(R) Platinum 8480+", 16, None),
])
def test_catalog_twin_of_a_measured_device(device, memory_gib, twin):
    assert catalog_twin(f"{device}, measured bf16", memory_gib * 2**30) == twin
