"""NCCL's device memory: one communicator per process group a rank talks in (issue 21).

NCCL allocates its buffers itself (`cudaMalloc`/`cuMem*`), outside PyTorch's caching allocator,
so `memory_reserved()` never holds them and nvidia-smi does: they belong to the device figure
only. PyTorch's ProcessGroupNCCL makes one communicator per process group, at the group's first
collective (`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp` `getNCCLComm`), and NCCL connects
an algorithm's peers at its first use (`NCCL_RUNTIME_CONNECT` 1, `src/init.cc@v2.30.7-1` line
61, 1552-1559), so every group a step uses counts. `TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK`
(off by default) registers the caching allocator's segments with `ncclCommRegister` for
zero-copy; it does not move NCCL's own buffers into the cache.

What one connection holds (a peer, a channel, both directions), NCCL v2.30.7-1:
- the receiver: `ncclRecvMem` + the LL (8 lines x 512 threads x 8 steps x 16 B = 512 KiB),
  LL128 (120 x 640 x 8 x 8 B = 4.69 MiB) and SIMPLE (`NCCL_BUFFSIZE` 4 MiB) buffers
  (`src/init.cc` lines 810-827; `src/include/device.h` lines 26, 97-115), rounded up to
  `CUDA_IPC_MIN` 2 MiB (`src/transport/p2p.cc` lines 486-491; `src/include/comm.h` line 46):
  10 MiB; the sender: `ncclSendMem` rounded up to 2 MiB (`p2p.cc` lines 407-410; with P2P read
  SIMPLE moves to the sender: 6 + 6 MiB, the same 12). NCCL's allocation log shows the pair,
  10,485,760 and 2,097,152 bytes per channel and peer (NVIDIA/nccl#1685, 8 x H100).

The topology is the estimate's conservative case, because a setup does not name its machine:
an HGX node of 8 NVSwitch-connected sm90 GPUs (H100/H200), where NCCL takes the most channels
and adds NVLink SHARP (NVLS) buffers. A100 nodes have no NVLS and PCIe machines take 2-4
channels: there the line is high (one communicator with `NCCL_MAX_NCHANNELS=1` held 10 MiB on
an RTX 3060, against 388 MiB by default: sgl-project/sglang#35538).

    >>> from vram.setup import TrainingSetup
    >>> [c.kind for c in communicators(TrainingSetup(n_gpus=64, tp=8, pp=2, sharding="zero3"))]
    ['tensor-parallel', 'data-parallel', 'pipeline-parallel', 'world']
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from vram.result import InputValue, LineItem
from vram.setup import TrainingSetup
from vram.setup.enums import ContextParallel
from vram.setup.layout import shard_group
from vram.units import MIB

#: One connection, receive side (LL + LL128 + SIMPLE + ncclRecvMem, 2 MiB-aligned: 10 MiB) plus
#: send side (ncclSendMem, 2 MiB-aligned): the allocations NCCL logs per channel and peer
#: (`src/transport/p2p.cc@v2.30.7-1` lines 407-491; NVIDIA/nccl#1685).
CONNECTION_BYTES = 12 * MIB

#: GPUs on one node, the HGX/DGX baseboard (`max_per_node` 8 in data/gpus.csv for datacenter GPUs).
NODE_GPUS = 8

#: Collective channels: NCCL doubles the channels its ring search finds (at most
#: `MAXCHANNELS / 2` = 32: `src/init.cc@v2.30.7-1` line 1177; `src/graph/connect.cc` line 460).
#: 32 is what the measurements show: a one-rank communicator's 388 MiB on an RTX 3060 is
#: 32 x 12 MiB + 4 MiB (sgl-project/sglang#35538), and NCCL opens 32 channels per pair on an
#: 8 x H100 node (NVIDIA/nccl#1685); a search finding more than 16 would give up to 64.
RING_CHANNELS = 32

#: NVLS channels on sm90 (`NVLS_NCHANNELS_SM90`, `src/transport/nvls.cc@v2.30.7-1` line 155).
NVLS_CHANNELS = 16

#: One NVLS buffer: `NCCL_NVLS_CHUNKSIZE` 128 KiB x `NCCL_STEPS` 8 (`nvls.cc` lines 160, 428).
NVLS_BUFFER_BYTES = 128 * 1024 * 8

#: The tree's peers on other nodes of a channel's head rank: its parent and a child across
#: nodes (of one parent and up to `NCCL_MAX_TREE_ARITY` 3 children, the third the chain's next
#: GPU: `src/include/device.h@v2.30.7-1` line 192).
REMOTE_TREE_PEERS = 2

#: Send/receive channels to a peer over NVLink: `2 x (path bandwidth / one link's)` rounded to a
#: power of two and capped by the p2p channels, 32 on an H100 node (`src/graph/paths.cc@v2.30.7-1`
#: `ncclTopoGetNchannels` lines 920-953, `ncclTopoComputeP2pChannels` lines 976-1004;
#: NVIDIA/nccl#1685: 32 channels per pair for an all-to-all on 8 x H100).
P2P_NVLINK_CHANNELS = 32

#: Send/receive channels to a peer over the network: `max(NICs, NIC GB/s / 14)`, 4 for one
#: 400 Gb/s NIC per GPU (`ncclTopoGetNchannels`, `NCCL_P2P_PER_CHANNEL_NET_BW` 14, line 918); a
#: communicator takes the least over its peers (line 969).
P2P_NET_CHANNELS = 4


class Pattern(StrEnum):
    """How a group talks, which decides the peers NCCL connects."""

    ALL_REDUCE = "all-reduce"  # ring, tree across nodes, NVLS on a node
    GATHER_SCATTER = "all-gather/reduce-scatter"  # ring, NVLS on a node (no tree)
    SEND_RECV = "send/recv"  # the pipeline's neighbours
    ALL_TO_ALL = "all-to-all"  # every other rank
    BARRIER = "barrier"  # a one-element all-reduce: its ring only


@dataclass(frozen=True)
class Communicator:
    """One process group as one rank sees it: its ranks, the GPUs between two neighbouring ranks
    (`stride`: the product of the mesh dimensions inside it), and how it talks."""

    kind: str
    ranks: int
    stride: int
    pattern: Pattern

    @property
    def local_ranks(self) -> int:
        """Its ranks on one node: mesh dimensions fill a node innermost first (tp, then cp and
        data, then pp: torchtitan `parallel_dims.py@v0.2.2` `build_mesh`)."""
        return min(self.ranks, max(1, NODE_GPUS // self.stride))

    @property
    def spans_nodes(self) -> bool:
        return self.ranks > self.local_ranks


def ring_bytes(channels: int) -> int:
    """A ring rank receives from one neighbour and sends to the other on every channel:
    `channels x connection`."""
    return channels * CONNECTION_BYTES


def tree_bytes(channels: int, local: int) -> int:
    """The tree's connections beyond the ring's, which connect both ways with each tree peer
    (`ncclTransportTreeConnect`, `src/transport/generic.cc@v2.30.7-1` lines 49-57): the node's
    chain backwards on every channel (when the node has more than one of the group's GPUs),
    and two peers on other nodes on the channels this rank heads, one in `local`:
    `channels x connection + ceil(channels / local) x remote peers x connection`."""
    chain = channels if local > 1 else 0
    heads = -(-channels // local)
    return chain * CONNECTION_BYTES + heads * REMOTE_TREE_PEERS * CONNECTION_BYTES


def nvls_bytes(heads: int) -> int:
    """NVLS unicast buffers: `channels x 2 x chunk x steps x heads`, one head per GPU of the node
    (`ncclNvlsBufferSetup`, `nvls.cc@v2.30.7-1` lines 426-430; physical memory 2 MiB-aligned)."""
    return NVLS_CHANNELS * 2 * NVLS_BUFFER_BYTES * heads


def p2p_bytes(peers: int, channels_per_peer: int) -> int:
    """Send/receive connections: `peers x channels per peer x connection`."""
    return peers * channels_per_peer * CONNECTION_BYTES


def _p2p_peers_channels(comm: Communicator) -> tuple[int, int]:
    """A send/receive group's peers (a pipeline stage's two neighbours, every other rank for an
    all-to-all) and the channels to each (fewer over the network)."""
    peers = min(2, comm.ranks - 1) if comm.pattern is Pattern.SEND_RECV else comm.ranks - 1
    return peers, P2P_NET_CHANNELS if comm.spans_nodes else P2P_NVLINK_CHANNELS


@dataclass(frozen=True)
class _Term:
    """One part of a communicator's buffers: its formula, its inputs and its bytes."""

    formula: str
    inputs: dict[str, int]
    bytes: int


def _terms(comm: Communicator) -> list[_Term]:
    """The parts NCCL connects for this communicator's pattern (none under two ranks): a
    send/receive or all-to-all group its peers; the others a ring, plus the tree across nodes
    for an all-reduce and NVLS on a node (a barrier: its ring only)."""
    if comm.ranks < 2:
        return []
    if comm.pattern in (Pattern.SEND_RECV, Pattern.ALL_TO_ALL):
        peers, channels = _p2p_peers_channels(comm)
        return [_Term("peers × channels per peer × connection",
                      {"peers": peers, "channels_per_peer": channels,
                       "connection_bytes": CONNECTION_BYTES}, p2p_bytes(peers, channels))]
    terms = [_Term("channels × connection",
                   {"channels": RING_CHANNELS, "connection_bytes": CONNECTION_BYTES,
                    "node_gpus": comm.local_ranks}, ring_bytes(RING_CHANNELS))]
    if comm.pattern is Pattern.BARRIER:
        return terms
    if comm.spans_nodes and comm.pattern is Pattern.ALL_REDUCE:
        terms.append(_Term("tree: (channels if node GPUs > 1) × connection + ⌈channels ÷ node "
                           "GPUs⌉ × remote peers × connection",
                           {"remote_tree_peers": REMOTE_TREE_PEERS},
                           tree_bytes(RING_CHANNELS, comm.local_ranks)))
    if comm.local_ranks > 1:
        terms.append(_Term("NVLS channels × 2 × NVLS buffer × GPUs on the node",
                           {"nvls_channels": NVLS_CHANNELS,
                            "nvls_buffer_bytes": NVLS_BUFFER_BYTES},
                           nvls_bytes(comm.local_ranks)))
    return terms


def communicator_bytes(comm: Communicator) -> int:
    """One communicator's device buffers on the busiest rank (`vram.memory.nccl`)."""
    return sum(term.bytes for term in _terms(comm))


def communicators(setup: TrainingSetup) -> tuple[Communicator, ...]:
    """The process groups a rank communicates in, one communicator each (torchtitan
    `parallel_dims.py@v0.2.2` `build_mesh`: a group per mesh dimension above 1; DeepSpeed and
    Accelerate build the same data, tensor, pipeline and expert groups)."""
    tp, pp, cp, ep = setup.tp, setup.pp, setup.cp, setup.ep
    data = shard_group(setup)  # data x context parallel: FSDP's "fsdp" mesh
    found = [
        Communicator("tensor-parallel", tp, 1, Pattern.ALL_REDUCE),
        Communicator("context-parallel", cp, tp, Pattern.ALL_TO_ALL
                     if setup.cp_kind is ContextParallel.ULYSSES else Pattern.GATHER_SCATTER),
        # ZeRO-2/3 and FSDP reduce-scatter gradients and gather weights; DDP and ZeRO-1
        # all-reduce them
        Communicator("data-parallel", data, tp, Pattern.GATHER_SCATTER
                     if setup.sharding.shards_gradients else Pattern.ALL_REDUCE),
        Communicator("expert-parallel", ep, 1, Pattern.ALL_TO_ALL),
        # the experts' own FSDP group (torchtitan's "efsdp": data x context x tp / ep)
        Communicator("expert data-parallel", data * tp // ep if ep > 1 else 1, ep,
                     Pattern.GATHER_SCATTER),
        Communicator("pipeline-parallel", pp, setup.n_gpus // pp, Pattern.SEND_RECV),
    ]
    groups = [c for c in found if c.ranks > 1]
    if groups and any(c.ranks < setup.n_gpus for c in groups):
        # the default group, apart from the mesh's once it is split: a barrier connects its
        # ring (torchtitan `distributed/utils.py@v0.2.2` line 386 `set_pg_timeouts`)
        groups.append(Communicator("world", setup.n_gpus, 1, Pattern.BARRIER))
    return tuple(groups)


def communicator_item(comm: Communicator) -> LineItem:
    """One communicator as a line item of the overhead bucket."""
    terms = _terms(comm)
    inputs: dict[str, InputValue] = {"gpus": comm.ranks}
    for term in terms:
        inputs |= term.inputs
    where = "across nodes" if comm.spans_nodes else "on one node"
    return LineItem.assemble(
        f"overhead.nccl.{comm.kind.replace(' ', '-')}",
        f"NCCL: {comm.kind} group ({comm.ranks} GPUs {where}, {comm.pattern.value})",
        " + ".join(term.formula for term in terms), inputs, sum(t.bytes for t in terms),
        "NCCL v2.30.7-1 src/transport/p2p.cc, nvls.cc, graph/paths.cc; one communicator per "
        "process group (PyTorch ProcessGroupNCCL); see vram.memory.nccl",
        note="buffers NCCL allocates outside the caching allocator; sized for an 8-GPU "
             "NVSwitch node (H100/H200), the largest of NCCL's defaults")


def nccl_items(setup: TrainingSetup) -> tuple[LineItem, ...]:
    """A line item per communicator the rank holds (none on one GPU)."""
    return tuple(communicator_item(comm) for comm in communicators(setup))


def nccl_bytes(setup: TrainingSetup) -> int:
    """NCCL's device buffers on one rank: the sum over its communicators."""
    return sum(communicator_bytes(comm) for comm in communicators(setup))
