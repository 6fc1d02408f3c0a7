"""A fake sysfs root for NUMA logic on a machine that has one node: a second node can only be faked.

``nodes`` {node: cpulist} become devices/system/node/nodeN/cpulist; ``gpus`` {PCI address: node}
become NVIDIA 3D controllers under bus/pci/devices; beside them sits a network card (another
vendor and class), as on any real host, which GPU placement must pass over."""
from __future__ import annotations


def fake_sysfs(root, nodes: dict[int, str], gpus: dict[str, int]) -> str:
    for node, cpulist in nodes.items():
        path = root / "devices/system/node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpulist + "\n")
    for address, node in gpus.items():
        path = root / "bus/pci/devices" / address
        path.mkdir(parents=True)
        (path / "vendor").write_text("0x10de\n")
        (path / "class").write_text("0x030200\n")
        (path / "numa_node").write_text(f"{node}\n")
    nic = root / "bus/pci/devices/0000:05:00.0"
    nic.mkdir(parents=True)
    (nic / "vendor").write_text("0x15b3\n")
    (nic / "class").write_text("0x020000\n")
    return str(root)
