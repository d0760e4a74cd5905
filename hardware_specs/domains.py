"""How many devices of each scale-up domain a job uses.

An 8-GPU server is used whole. A rack-scale NVLink domain (GB200/GB300 NVL72: 72 GPUs in 18
compute trays of 4) is not: jobs sized in powers of two leave part of each rack idle, and
NVIDIA's published recipes run 256 GPUs as 4 racks of 64 (16 of the 18 trays, via SLURM's
``--segment`` so that a segment never straddles two racks). The job spreads evenly over as few
domains as it can, in whole hosts, keeping its innermost groups (TP x CP x EP) inside one domain
so that their collectives stay on NVLink.
"""

from __future__ import annotations

from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.node import NodeSpec


def devices_per_domain(num_devices: int, node: NodeSpec, keep_together: int = 1,
                       path: str = "cluster") -> int:
    """Devices of each domain the job uses: all of them for a job within one domain; otherwise
    the largest even share that is a whole number of hosts, preferring one that holds whole
    ``keep_together`` groups. A job that cannot be spread evenly is an error naming
    ``num_gpus``."""
    size, host = node.devices_per_node, node.host_size
    if num_devices <= size:
        return num_devices
    for group in dict.fromkeys((max(1, keep_together), 1)):
        for used in range(size - size % host, 0, -host):
            if num_devices % used == 0 and used % group == 0:
                return used
    if host == size:
        raise SpecError(f"{path}.num_gpus", f"{num_devices} is not a whole number of "
                        f"{node.name} nodes ({size} devices each)")
    raise SpecError(f"{path}.num_gpus", f"{num_devices} GPUs cannot be spread evenly over "
                    f"{node.name} domains ({size} devices, hosts of {host}); use a multiple of "
                    f"{host} or set {path}.gpus_per_node")
