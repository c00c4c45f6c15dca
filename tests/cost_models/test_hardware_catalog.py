"""Hardware catalog: the --hw grammar, cluster files, calibrated JSON, sources, errors."""

import json
from dataclasses import asdict

import pytest

from autosp.contract.specs import HardwareSpec
from autosp.errors import UsageError
from autosp.cost_models.catalog.hardware import (GIB, catalog_entry, catalog_names, common_sources, describe_grammar,
                                     list_hardware, resolve_hardware)

REQUIRED = ["a100-40g", "a100-80g", "h100", "h200", "b200", "mi300x", "gh200"]
FIGURES = ["peak_flops", "memory_gib", "memory_bandwidth", "devices_per_node", "intra_node_bandwidth",
           "intra_node_latency", "inter_node_bandwidth", "inter_node_latency", "host_bandwidth", "host_memory_gib",
           "host_memory_bandwidth", "matmul_efficiency", "attention_efficiency", "comm_efficiency", "usable_memory_fraction"]


def test_required_accelerators_present():
    assert set(REQUIRED) <= set(catalog_names())


@pytest.mark.parametrize("name", REQUIRED)
def test_every_figure_cites_a_source(name):
    entry = catalog_entry(name)
    sources = {**common_sources(), **entry["sources"]}
    for figure in FIGURES:
        assert figure in entry, figure
        assert sources.get(figure, "").strip(), f"{name}.{figure} has no source"


def test_datasheet_numbers_of_h100():
    hw = resolve_hardware("h100x8")
    assert hw.accelerator.peak_flops == pytest.approx(989.4e12)  # dense bf16, no sparsity
    assert hw.accelerator.memory_bytes == 80 * GIB
    assert hw.accelerator.memory_bandwidth == pytest.approx(3.35e12)
    assert hw.intra_node_bandwidth == pytest.approx(450e9)  # NVLink 900 GB/s bidirectional
    assert hw.inter_node_bandwidth == pytest.approx(50e9)  # 400 Gb/s NDR per GPU
    assert hw.intra_node_bandwidth > 5 * hw.inter_node_bandwidth
    assert hw.inter_node_latency > hw.intra_node_latency
    assert hw.host_memory_bytes == 2048 * GIB


@pytest.mark.parametrize("arg, nodes, per_node, world", [
    ("h100", 1, 1, 1),
    ("h100x8", 1, 8, 8),
    ("h100x4", 1, 4, 4),
    ("H100X32", 4, 8, 32),
    ("h100*16", 2, 8, 16),
    ("mi300xx8", 1, 8, 8),
    ("a100-80gx64", 8, 8, 64),
    ("gh200x4", 4, 1, 4),
    ("h100-sxm", 1, 1, 1),
])
def test_grammar(arg, nodes, per_node, world):
    hw = resolve_hardware(arg)
    assert (hw.nodes, hw.devices_per_node, hw.world_size) == (nodes, per_node, world)


def test_nodes_multiplies_a_one_node_spec():
    hw = resolve_hardware("h100x8", nodes=4)
    assert (hw.nodes, hw.devices_per_node, hw.world_size) == (4, 8, 32)
    assert hw == resolve_hardware("h100x32")
    assert resolve_hardware("h100x4", nodes=2).world_size == 8
    with pytest.raises(UsageError, match="already spans 4 nodes"):
        resolve_hardware("h100x32", nodes=2)


@pytest.mark.parametrize("arg, expected", [
    ("h100x12", "do not fill whole h100 nodes of 8; use h100x8 or h100x16"),
    ("h10x8", "did you mean 'h100'"),
    ("tpu-v5", "unknown hardware"),
    ("h100x0", "at least 1"),
])
def test_bad_hardware_is_a_one_line_usage_error(arg, expected):
    with pytest.raises(UsageError) as err:
        resolve_hardware(arg)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_cluster_toml_with_base_and_overrides(tmp_path):
    path = tmp_path / "rack.toml"
    path.write_text('base = "h100"\nnodes = 2\ninter_node_bandwidth = 25e9\nmatmul_efficiency = 0.5\n'
                    'memory_gib = 94\n')
    hw = resolve_hardware(str(path))
    assert (hw.nodes, hw.devices_per_node) == (2, 8)
    assert hw.inter_node_bandwidth == 25e9 and hw.matmul_efficiency == 0.5
    assert hw.accelerator.memory_bytes == 94 * GIB
    assert hw.accelerator.peak_flops == resolve_hardware("h100").accelerator.peak_flops
    with pytest.raises(UsageError, match="already says nodes = 2"):
        resolve_hardware(str(path), nodes=3)


def test_cluster_toml_without_base(tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text('name = "lab"\ndevices_per_node = 4\npeak_flops = 100e12\nmemory_bytes = 24e9\n'
                    'memory_bandwidth = 1e12\nintra_node_bandwidth = 32e9\ninter_node_bandwidth = 12.5e9\n')
    hw = resolve_hardware(str(path), nodes=2)
    assert hw.world_size == 8 and hw.accelerator.memory_bytes == 24e9 and hw.name == "labx8"
    missing = tmp_path / "missing.toml"
    missing.write_text("devices_per_node = 4\npeak_flops = 1e12\n")
    with pytest.raises(UsageError, match="missing 'memory_gib'|missing 'memory_bandwidth'"):
        resolve_hardware(str(missing))
    typo = tmp_path / "typo.toml"
    typo.write_text('base = "h100"\ninter_node_bandwith = 1e9\n')
    with pytest.raises(UsageError, match="did you mean 'inter_node_bandwidth'"):
        resolve_hardware(str(typo))
    broken = tmp_path / "broken.toml"
    broken.write_text("base = \n")
    with pytest.raises(UsageError, match="not valid TOML"):
        resolve_hardware(str(broken))
    with pytest.raises(UsageError, match="does not exist"):
        resolve_hardware(str(tmp_path / "none.toml"))


def test_calibrated_json_round_trips(tmp_path):
    hw = resolve_hardware("h200x8")
    path = tmp_path / "calibrated.json"
    path.write_text(json.dumps(asdict(hw)))
    assert resolve_hardware(str(path)) == hw
    assert resolve_hardware(str(path), nodes=2).world_size == 16
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x"}))
    with pytest.raises(UsageError, match="not a HardwareSpec"):
        resolve_hardware(str(bad))


def test_list_hardware_and_grammar_help():
    specs = list_hardware()
    assert all(isinstance(h, HardwareSpec) for h in specs)
    assert {h.accelerator.name for h in specs} >= set(REQUIRED)
    text = describe_grammar()
    assert "NAMExN" in text and "--nodes" in text and ".toml" in text and "h100" in text
