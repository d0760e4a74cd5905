"""What a server (or an NVLink domain such as NVL72) is: devices, scale-up fabric, NICs, host."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.measured_comm import AlphaBeta, CommOp, read_measured_comm
from clustersim.hardware_specs.units import Quantity


class ScaleUpKind(enum.Enum):
    NVSWITCH = "nvswitch"
    NVLINK_MESH = "nvlink_mesh"
    XGMI = "xgmi"
    PCIE = "pcie"
    SHARED_MEMORY = "shared_memory"


class NicKind(enum.Enum):
    IB_EDR = "ib_edr"
    IB_HDR = "ib_hdr"
    IB_NDR = "ib_ndr"
    IB_XDR = "ib_xdr"
    ROCE = "roce"
    EFA = "efa"
    """AWS Elastic Fabric Adapter (SRD transport; NCCL runs it through the aws-ofi-nccl plugin)."""
    OMNI_PATH = "omni_path"
    """Intel (now Cornelis) Omni-Path Architecture; NCCL reaches it through a libfabric plugin."""
    ETHERNET = "ethernet"
    LOOPBACK = "loopback"


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeSpec:
    """One scale-up domain: the devices that talk over NVLink/NVSwitch/xGMI, and its NICs."""

    name: str
    device: str
    """Catalog name of the device a node normally carries."""
    devices_per_node: int
    scale_up_kind: ScaleUpKind
    scale_up_bandwidth: float
    """Per device, per direction, bytes/s, through the scale-up fabric."""
    scale_up_latency_s: float
    """One hop through the scale-up fabric (a device-to-device write becoming visible)."""
    nvls: bool
    """NVLink SHARP (in-switch reduction) is available."""
    devices_per_host: int = 0
    """Devices per host (one OS image; a compute tray of an NVL72 rack holds 4): schedulers
    hand out whole hosts, so a job uses a scale-up domain in multiples of this. 0: the whole
    node is one host."""
    nvls_efficiency: float = 0.67
    """NVLS all-reduce algorithm bandwidth as a fraction of a GPU's scale-up bandwidth per
    direction (every GPU sends and receives the buffer once; the switch reduces), before the
    per-loop overhead of ``simulator/cost/collectives.py``. Default fitted with that overhead to
    an 8x H100 nccl-tests sweep (0.667); an 8x B200 node's 838 GB/s gives 0.674 on its own."""
    nic_count: int
    nic_bandwidth: float
    """Per NIC, per direction, bytes/s."""
    nic_kind: NicKind
    nic_latency_s: float
    """One network hop end to end, NIC to NIC through one switch."""
    pcie_generation: int
    pcie_bandwidth: float
    """Per device to the host, per direction, bytes/s."""
    host_memory: str
    """Catalog name of the node's host DRAM tier."""
    local_storage: str
    """Catalog name of the node's local NVMe tier."""
    scale_up_efficiency: float = 0.85
    """Fraction of scale-up bandwidth NCCL's large transfers reach. Default from nccl-tests on
    DGX A100 (NVLink3, 300 GB/s per direction): all-gather busbw 253.6 GB/s (Azure NDm A100 v4,
    microsoft/mscclpp docs/performance-ndmv4.md) = 0.85."""
    nic_efficiency: float = 0.92
    """Fraction of NIC line rate NCCL's large transfers reach. Default from nccl-tests on two
    NDm A100 v4 nodes (8 x 200 Gb/s HDR): all-reduce busbw 183.8-188.2 GB/s of 200 = 0.92-0.94."""
    net_post_overhead_s: float = 1e-6
    """CPU time NCCL's proxy thread spends posting one network send or receive: 1 us on Intel
    x86 hosts, 2 us on AMD x86, 1 us elsewhere (NCCL ``src/graph/tuning.cc``,
    ``getNetOverhead``). Every step of a ring that crosses nodes waits for one (three with the
    Simple protocol), and an all-to-all posts one send and one receive per remote peer."""
    eager_issue_s: float = 13.48e-6
    """Host CPU time to issue one kernel from eager PyTorch (module call, dispatcher, CUDA
    launch), charged where kernels run outside CUDA graphs (``simulator/cost/host.py``).
    Default: one BF16 ``torch.nn.Linear`` forward (one GEMM) on a DGX H100's Xeon Platinum
    8480C, 13.48 us (TransformerEngine issue #2053); the same issue measured 33.17 us on
    GH200's and 37.08 us on GB200's Grace hosts."""
    net_simple_protocol_only: bool = False
    """The network transport carries only NCCL's Simple protocol (no LL/LL128 across nodes):
    AWS EFA, where the aws-ofi-nccl plugin sets ``NCCL_PROTO=simple`` on its platforms, and
    GCP's GPUDirect-TCPXO, whose NCCL profile sets ``NCCL_PROTO=Simple``."""
    net_plugin_latency_s: float = 0.0
    """Network latency the node's NCCL net plugin reports (``ncclNetProperties.latency``), which
    NCCL's tuner adds to every network hop of its latency model, twice with Simple ("the flush
    extra latency"; ``tuning.cc``, ``graph->latencyInter`` from ``search.cc``). A tuning input,
    not a cost: NCCL's own InfiniBand and socket transports report 0 ("Not set"); aws-ofi-nccl
    reports 75 us on p4d, p4de, p5 and p5e and 35 us on p5en and p6 (``platform-aws``)."""
    nccl_buffer_bytes: int = 1 << 22
    """NCCL's Simple-protocol buffer per connection (``NCCL_BUFFSIZE``; NCCL's default 4 MiB,
    ``init.cc``), a step being an eighth of it: the chunk of a tree all-reduce and so its
    pipeline's fill (``chunk_pipeline.py``). aws-ofi-nccl sets 8 MiB on p4d, p4de, p5 and later
    (``platform-aws.cpp`` platform environment, 1.16 on; "values that we recommend to users to
    set anyway")."""
    collective_latency_s: float = 0.0
    """Measured per-step latency of a collective inside this node (e.g. gloo over shared
    memory, from calibration); 0 means NCCL's own latency model (``src/graph/tuning.cc``)."""
    measured_comm: Mapping[CommOp, AlphaBeta] = field(default_factory=dict)
    """Calibrated alpha-beta fits by operation for groups inside this node (see
    ``measured_comm.py``); operations not listed use the analytic model."""
    comm_in_training: float = 1.0
    """How much longer a ``measured_comm`` collective takes inside a training step than where
    it was measured (after a GEMM): calibration's tensor-parallel reference step."""
    source: str = ""

    @property
    def host_size(self) -> int:
        """Devices per host (the whole node when the catalog gives no host size)."""
        return self.devices_per_host or self.devices_per_node

    @property
    def network_bandwidth(self) -> float:
        """All NICs of the node together, per direction."""
        return self.nic_count * self.nic_bandwidth


def read_node(f: Fields) -> NodeSpec:
    spec = NodeSpec(
        name=f.path.rsplit(".", 1)[-1],
        device=f.text("device"),
        devices_per_node=f.integer("devices_per_node", minimum=1),
        scale_up_kind=f.choice("scale_up_kind", ScaleUpKind),
        scale_up_bandwidth=f.quantity("scale_up_bandwidth", Quantity.BANDWIDTH),
        scale_up_latency_s=f.quantity("scale_up_latency", Quantity.TIME),
        nvls=f.boolean("nvls", False),
        devices_per_host=f.integer("devices_per_host", 0, minimum=0),
        nvls_efficiency=f.number("nvls_efficiency", 0.67, minimum=0.05, maximum=1.0),
        nic_count=f.integer("nic_count", minimum=0),
        nic_bandwidth=f.quantity("nic_bandwidth", Quantity.BANDWIDTH),
        nic_kind=f.choice("nic_kind", NicKind),
        nic_latency_s=f.quantity("nic_latency", Quantity.TIME),
        pcie_generation=f.integer("pcie_generation", minimum=1),
        pcie_bandwidth=f.quantity("pcie_bandwidth", Quantity.BANDWIDTH),
        host_memory=f.text("host_memory"),
        local_storage=f.text("local_storage"),
        scale_up_efficiency=f.number("scale_up_efficiency", 0.85, minimum=0.05, maximum=1.0),
        nic_efficiency=f.number("nic_efficiency", 0.92, minimum=0.05, maximum=1.0),
        net_post_overhead_s=f.quantity("net_post_overhead", Quantity.TIME, 1e-6),
        eager_issue_s=f.quantity("eager_issue_time", Quantity.TIME, 13.48e-6),
        net_simple_protocol_only=f.boolean("net_simple_protocol_only", False),
        net_plugin_latency_s=f.quantity("net_plugin_latency", Quantity.TIME, 0.0, positive=False),
        nccl_buffer_bytes=int(f.quantity("nccl_buffsize", Quantity.BYTES, float(1 << 22))),
        collective_latency_s=f.quantity("collective_latency", Quantity.TIME, 0.0, positive=False),
        measured_comm=read_measured_comm(f.sub("measured_comm")),
        comm_in_training=f.number("comm_in_training", 1.0, minimum=0.5, maximum=4.0),
        source=f.text("source", ""),
    )
    f.done()
    return spec
