"""Hand-checkable specs the cost-model tests share: a tiny Llama-shaped model and a cluster with round figures."""

from autosp.contract.specs import AcceleratorSpec, HardwareSpec, ModelSpec

GIB = 1024 ** 3

# tiny: L=2, h=64, 4 heads x 16 (q = 64), 2 KV heads (k = 32), ffn 128, vocab 256
TINY = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden=128, vocab=256)
# two nodes of two devices: NVLink-like 1e10 B/s (10 us), network 1e9 B/s (20 us); round efficiencies
ROUND = HardwareSpec(
    name="round", accelerator=AcceleratorSpec(name="round", peak_flops=1e12, memory_bytes=8 * GIB,
                                              memory_bandwidth=1e11),
    devices_per_node=2, nodes=2, intra_node_bandwidth=1e10, intra_node_latency=1e-5, inter_node_bandwidth=1e9,
    inter_node_latency=2e-5, host_bandwidth=1e10, host_memory_bytes=64 * GIB, matmul_efficiency=0.5,
    attention_efficiency=0.5, comm_efficiency=1.0, usable_memory_fraction=1.0)
