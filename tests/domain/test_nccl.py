"""NCCL's device buffers per communicator (`vram.memory.nccl`), by hand from NCCL v2.30.7-1.

One connection (a peer, a channel): the receiver's LL + LL128 + SIMPLE buffers and
`ncclRecvMem`, 2 MiB-aligned, = 10 MiB; the sender's `ncclSendMem`, 2 MiB-aligned, = 2 MiB.
"""

from __future__ import annotations

from vram import TrainingSetup, estimate, load_model
from vram.memory.nccl import CONNECTION_BYTES, communicators, nccl_bytes, nccl_items
from vram.memory.overhead import cuda_context_bytes
from vram.units import MIB

CUDA_IPC_MIN = 2 * MIB  # src/include/comm.h line 46


def _aligned(size: int) -> int:
    return -(-size // CUDA_IPC_MIN) * CUDA_IPC_MIN


def _mib(setup: TrainingSetup) -> dict[str, int]:
    return {item.key: item.bytes // MIB for item in nccl_items(setup)}


def test_one_connection_from_nccls_buffer_sizes() -> None:
    """src/init.cc lines 810-813 and src/include/device.h lines 26, 97-115: the three
    protocols' buffers; the two control structures are a few KiB, under the alignment."""
    ll = 8 * 512 * 8 * 16  # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x line
    ll128 = 120 * 640 * 8 * 8  # ELEMS_PER_THREAD x MAX_NTHREADS x NCCL_STEPS x uint64
    simple = 1 << 22  # DEFAULT_BUFFSIZE
    control = 4096
    assert _aligned(ll + ll128 + simple + control) == 10_485_760  # nccl#1685's receive size
    assert _aligned(control) == 2_097_152  # and its send size
    assert CONNECTION_BYTES == 10_485_760 + 2_097_152


def test_fsdp_on_one_nvswitch_node() -> None:
    """8-GPU FSDP: one data-parallel group, ring 32 x 12 MiB = 384 MiB, NVLS 16 channels x 2 x
    1 MiB x 8 heads = 256 MiB; 640 MiB (the flat constant it replaces was 512)."""
    setup = TrainingSetup(n_gpus=8, sharding="zero3")
    assert _mib(setup) == {"overhead.nccl.data-parallel": 384 + 256}
    assert nccl_bytes(setup) == 671_088_640


def test_tensor_parallel_8_by_data_parallel_4_over_4_nodes() -> None:
    """tp 8 fills a node (ring 384 + NVLS 256 MiB); the 4 data-parallel ranks sit one per node
    (ring only: no NVLS heads to share, no tree for reduce-scatter); the world group, split
    into the mesh, connects its ring for a barrier (384). DDP instead all-reduces across the
    nodes: the tree adds two remote peers on every channel (32 x 2 x 12 = 768 MiB)."""
    zero3 = TrainingSetup(n_gpus=32, tp=8, sharding="zero3")
    assert _mib(zero3) == {"overhead.nccl.tensor-parallel": 640,
                           "overhead.nccl.data-parallel": 384, "overhead.nccl.world": 384}
    ddp = TrainingSetup(n_gpus=32, tp=8, sharding="ddp")
    assert _mib(ddp)["overhead.nccl.data-parallel"] == 384 + 768


def test_pipeline_stages_connect_their_neighbours() -> None:
    """pp 4 on one node: a middle stage sends to and receives from 2 neighbours on 32 channels
    each, 2 x 32 x 12 = 768 MiB. pp 4 over 4 nodes of dp 8: the neighbours are on other nodes,
    4 channels each (2 x 4 x 12 = 96 MiB), the data group a node's ring + NVLS (640), the world
    its ring (384)."""
    assert _mib(TrainingSetup(n_gpus=4, pp=4)) == {"overhead.nccl.pipeline-parallel": 768}
    assert _mib(TrainingSetup(n_gpus=32, pp=4, sharding="zero3")) == {
        "overhead.nccl.data-parallel": 640, "overhead.nccl.pipeline-parallel": 96,
        "overhead.nccl.world": 384}


def test_ddp_over_two_nodes_adds_the_tree() -> None:
    """16 GPUs DDP: ring 384, the chain backwards on 32 channels (384), a head's 2 remote peers
    on 32 / 8 = 4 channels (96), NVLS over the node's 8 GPUs (256): 1,120 MiB."""
    assert _mib(TrainingSetup(n_gpus=16, sharding="ddp")) == {
        "overhead.nccl.data-parallel": 384 + 384 + 96 + 256}


def test_all_to_all_groups_connect_every_peer() -> None:
    """ep 8 on a node: 7 peers x 32 channels x 12 MiB = 2,688 MiB (NCCL's own count for an
    8 x H100 all-to-all, nccl#1685: 32 channels per pair, 10 + 2 MiB each); Ulysses cp 4:
    3 peers, 1,152 MiB."""
    assert _mib(TrainingSetup(n_gpus=8, ep=8, sharding="zero3")) == {
        "overhead.nccl.data-parallel": 640, "overhead.nccl.expert-parallel": 2688}
    ulysses = TrainingSetup(n_gpus=8, cp=4, cp_kind="ulysses", sharding="zero3")
    assert _mib(ulysses) == {"overhead.nccl.context-parallel": 1152,
                             "overhead.nccl.data-parallel": 640, "overhead.nccl.world": 384}


def test_one_gpu_holds_no_communicator() -> None:
    assert communicators(TrainingSetup()) == ()


def test_the_estimate_lists_a_line_per_communicator() -> None:
    """The device figure carries them and the reserved figure does not (NCCL allocates
    outside the caching allocator): device = reserved + CUDA context + NCCL."""
    setup = TrainingSetup(n_gpus=32, tp=8, sharding="zero3")
    result = estimate(load_model("llama-3.1-8b"), setup)
    nccl = [item.bytes for bucket in result.buckets for item in bucket.items
            if item.key.startswith("overhead.nccl.")]
    assert sum(nccl) == nccl_bytes(setup) == (640 + 384 + 384) * MIB
    assert result.device_peak_bytes == (result.reserved_peak_bytes + cuda_context_bytes(setup)
                                        + sum(nccl))
