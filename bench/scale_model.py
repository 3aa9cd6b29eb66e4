"""An allreduce's schedules at scale, modelled: for N ranks, L of them a host, what each schedule cnccl has
(or could have) puts through memory and across hosts, how many messages a rank sends, how many roundings
an element goes through, and an alpha-beta time at a stated link. The byte counts are checked against the
veth's counters at 2 hosts x 1 and x 2 ranks (tests/python/test_scale_model.py); the times are a model.

Schedules (n elements, b bytes an element on the wire, H = N / L hosts):
- ring: a flat ring in the wire type (NCCL's ring on the CUDA path's 16-bit copy; the host path's
  reduce_scatter across hosts): 2(N-1) steps of n/N elements; every add rounds to the wire.
- alltoall: the fp32-sum all-to-all (reduce_chunked: every rank's part p to rank p, summed in fp32 in rank
  order and rounded once, the owners' results back to every rank), flat over all N ranks. The host path's
  allreduce across hosts for MX blocks and power-of-two frames, and with one rank a host above 256 KiB of
  wire bytes (the chunked exchange).
- alltoall+ring: accumulate=fp32 without frames across hosts: the all-to-all's first phase, then a ring
  allgather of the owners' results (N-1 steps in sequence).
- direct: with one rank a host, at most 256 KiB of wire bytes: every rank's whole tensor to every peer.
- hierarchical: the host path's allreduce across hosts of several ranks (16-bit wire or none): a
  reduce-scatter through shared memory (fp32 sums, rounded once), the H owners of each part exchange it in
  the wire type by the all-to-all (each chunk to its owner, added in the wire type in host order, the sums
  back), and an allgather through shared memory; pipelined as hierarchical-a2a is.
- hierarchical-a2a: the same with the fp32-sum all-to-all among the H owners: a wire per level
  (inter_host_wire, backend/host/reductions/level_reductions.cpp), the cross-host bytes of the hierarchical ring in the
  wire across, H-1 messages a phase instead of N-1, three roundings. Pipelined: a chunk crosses hosts while
  the next is summed inside the host and the last is restored and shared, so its time is the longer of the
  two levels plus a chunk's worth of the shorter (chunks of 256 KiB across, at most 64 a part).
- tree: NCCL's double binary tree on the CUDA path's 16-bit copy, approximately: a chain inside each host,
  a binary tree across hosts, 2 n b across each host's link, 2 log2(H) latency steps; its roundings are an
  upper bound (a node with two children adds twice).

Usage: python3 bench/scale_model.py [--ranks 64,256,1024] [--per-host 8] [--size 64M] [--wire fp16]
                                    [--gbit 100] [--latency-us 5] [--overhead-us 2] [--memory-gbps 20]
"""

import argparse
import math

# Bytes an element on each wire (an MX block of 32 carries one scale byte, an NVFP4 block of 16 one; frames'
# headers are per part and left out).
WIRE_BYTES = {"none": 4.0, "fp16": 2.0, "bf16": 2.0, "e4m3": 1.0, "e5m2": 1.0, "mxfp8": 33 / 32,
              "mxfp8_e5m2": 33 / 32, "mxfp4": 17 / 32, "nvfp4": 9 / 16}
SCHEDULES = ("ring", "alltoall", "alltoall+ring", "hierarchical", "hierarchical-a2a", "tree")
# Up to this many wire bytes the host path exchanges directly (backend/policy.h, kDirectAllreduceMaxBytes):
# a tensor with one rank a host, an owner's part between hosts in the hierarchical allreduce.
DIRECT_MAX_BYTES = 256 * 1024
# Tensors under this many bytes go uncompressed (Options.min_bytes' default).
MIN_BYTES = 64 * 1024


def cnccl_schedule(wire, accumulate, scaling, ranks, per_host, nbytes, min_bytes=MIN_BYTES, inter_host_wire=None):
    """The schedule cnccl's host path runs for a fp32 allreduce of `nbytes` (backend/policy.cpp,
    choose_allreduce, with reductions.cpp's steps): None on one host (shared memory, nothing crosses)."""
    if ranks == per_host:
        return None
    if nbytes < min_bytes:
        wire, accumulate, scaling, inter_host_wire = "none", "fp16", "none", None
    if inter_host_wire not in (None, wire) and per_host > 1:
        return "hierarchical-a2a"
    framed = wire.startswith("mx") or wire == "nvfp4" or scaling == "pow2"
    fp32_sum = wire != "none" and accumulate == "fp32"
    if framed:
        return "alltoall"
    if fp32_sum:
        return "alltoall+ring"
    if per_host > 1:
        return "hierarchical"
    return "alltoall" if nbytes * WIRE_BYTES[wire] / 4 > DIRECT_MAX_BYTES else "direct"


# The pieces of a pipelined exchange (backend/host/algorithms/reduce_chunked.cpp: at most kMaxChunks a part
# of about kChunkBytes; level_reductions.cpp's kLevelChunkBytes across hosts).
CHUNK_BYTES = {"alltoall": 1 << 20, "hierarchical": 256 << 10, "hierarchical-a2a": 256 << 10}
MAX_CHUNKS = 64


def chunks(schedule, ranks, per_host, n, b):
    """How many chunks a rank's part of a pipelined schedule goes in (1: not pipelined). A ring's steps
    overlap a step's adds with the next step's transfer: 2(N-1) chunks."""
    if schedule == "ring":
        return 2 * (ranks - 1)
    if schedule not in CHUNK_BYTES:
        return 1
    part = n / (ranks if schedule == "alltoall" else per_host * max(ranks // per_host, 1)) * b
    return max(1, min(MAX_CHUNKS, math.ceil(part / CHUNK_BYTES[schedule])))


def pipelined(link_s, cores_s, pieces):
    """A pipeline's time of two stages that overlap chunk by chunk: the longer, plus one chunk of the
    shorter, which nothing overlaps (the first chunk's cast, the last one's restore)."""
    return max(link_s, cores_s) + min(link_s, cores_s) / pieces


def predict(schedule, ranks, per_host, n, b, gbit, cores_s, burst_bytes=0):
    """An allreduce's time on a link of `gbit` when its ranks' CPU work takes `cores_s` of the cores (their
    CPU seconds over the cores they share): the link's time of the schedule's bytes and the cores' time,
    overlapped as the schedule pipelines them. A shaped link lets its first `burst_bytes` through at once
    (a token bucket's)."""
    link_s = max(cross_host_bytes(schedule, ranks, per_host, n, b) - burst_bytes, 0) * 8 / (gbit * 1e9)
    return pipelined(link_s, cores_s, chunks(schedule, ranks, per_host, n, b))


def cross_host_bytes(schedule, ranks, per_host, n, b):
    """Bytes each host's link carries in each direction for one allreduce of n elements."""
    N, L = ranks, per_host
    H = N // L
    if H < 2:
        return 0.0
    if schedule == "ring":
        return 2 * (N - 1) / N * n * b  # one edge of the ring leaves each host
    if schedule == "alltoall":
        return L * 2 * (N - L) / N * n * b  # each rank's parts to the remote owners, their results back
    if schedule == "alltoall+ring":
        return L * (N - L) / N * n * b + (N - 1) / N * n * b
    if schedule in ("hierarchical", "hierarchical-a2a"):
        return 2 * (H - 1) / H * n * b  # each of L owners: 2(H-1)/H of its n/L elements
    if schedule == "tree":
        return 2 * n * b
    if schedule == "direct":
        return L * (N - L) * n * b  # every rank's whole tensor to every remote rank
    raise ValueError(schedule)


def model(schedule, ranks, per_host, n, b, gbit, latency, overhead, memory_gbps):
    """Bytes, messages, roundings and an alpha-beta time (seconds) of one allreduce."""
    N, L = ranks, per_host
    H = max(N // L, 1)
    link = gbit * 1e9 / 8
    across = cross_host_bytes(schedule, N, L, n, b)
    hier = schedule.startswith("hierarchical")
    # Bytes a rank moves through memory inside its host: the hierarchical ones' shared-memory phases;
    # the flat ones' messages to the L-1 ranks of its own host.
    if hier or schedule == "tree":
        inside = 2 * (L - 1) / L * n * b
    elif schedule == "ring":
        inside = 2 * (N - 1) / N * n * b * (L - 1) / L
    elif schedule == "alltoall+ring":
        inside = (L - 1) / N * n * b + (L - 1) / L * (N - 1) / N * n * b  # the ring's edges inside a host
    elif schedule == "direct":
        inside = (L - 1) * n * b
    else:
        inside = 2 * (L - 1) / N * n * b
    if schedule == "ring":
        messages, roundings = 2 * (N - 1), N
        seconds = 2 * (N - 1) * (latency + overhead + n * b / N / link)
    elif schedule == "alltoall":
        messages, roundings = 2 * (N - 1), 2
        seconds = 2 * (latency + (N - 1) * overhead) + across / link
    elif schedule == "alltoall+ring":
        messages, roundings = 2 * (N - 1), 2
        first = L * (N - L) / N * n * b
        seconds = latency + (N - 1) * overhead + first / link + (N - 1) * (latency + overhead + n * b / N / link)
    elif schedule == "direct":
        messages, roundings = N - 1, N
        seconds = latency + (N - 1) * overhead + across / link
    elif hier:
        # The owners' all-to-all, its chunks overlapping the levels inside the host; the hosts' sums add in
        # the wire type (H - 1 roundings) unless the wire across differs (fp32 sums, rounded once).
        messages, roundings = 2 * (H - 1), H + 1 if schedule == "hierarchical" else 3
        pieces = chunks(schedule, N, L, n, b)
        messages *= pieces
        # The levels overlap: the inside's memory time is hidden but for a chunk's worth, added below.
        seconds = 2 * (latency + (H - 1) * pieces * overhead) + pipelined(across / link, inside / (memory_gbps * 1e9),
                                                                         pieces) - inside / (memory_gbps * 1e9)
    elif schedule == "tree":
        steps = 2 * math.ceil(math.log2(H)) if H > 1 else 0
        messages, roundings = steps, 1 + (L - 1) + 2 * math.ceil(math.log2(H)) if H > 1 else L
        seconds = steps * (latency + overhead) + across / link
    else:
        raise ValueError(schedule)
    seconds += inside / (memory_gbps * 1e9)
    bandwidth = across / link + inside / (memory_gbps * 1e9)
    if hier:
        bandwidth = pipelined(across / link, inside / (memory_gbps * 1e9), chunks(schedule, N, L, n, b))
    return {"inside": inside, "across_per_host": across, "messages": messages,
            "roundings": roundings, "seconds": seconds, "latency_share": max(0.0, 1 - bandwidth / seconds)}


def latency_bound_from(schedule, per_host, n, b, *link):
    """The fewest ranks (a power of two hosts) at which the schedule's time is mostly latency, or None."""
    hosts = 2
    while hosts <= 1 << 20:
        if model(schedule, hosts * per_host, per_host, n, b, *link)["latency_share"] > 0.5:
            return hosts * per_host
        hosts *= 2
    return None


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="64,256,1024")
    p.add_argument("--per-host", type=int, default=8)
    p.add_argument("--size", default="64M", help="bytes of the fp32 tensor")
    p.add_argument("--wire", default="fp16", choices=sorted(WIRE_BYTES))
    p.add_argument("--gbit", type=float, default=100.0, help="each host's link, Gbit/s each way")
    p.add_argument("--latency-us", type=float, default=5.0, help="one message's latency across hosts")
    p.add_argument("--overhead-us", type=float, default=2.0, help="a rank's cost to post one message")
    p.add_argument("--memory-gbps", type=float, default=20.0, help="a rank's copy bandwidth inside a host, GB/s")
    a = p.parse_args()
    n, b = parse_size(a.size) // 4, WIRE_BYTES[a.wire]
    print(f"allreduce of {a.size} fp32 on a {a.wire} wire ({b:g} bytes an element), {a.per_host} ranks a host, "
          f"{a.gbit:g} Gbit/s a host, latency {a.latency_us:g} us, {a.overhead_us:g} us a message, "
          f"{a.memory_gbps:g} GB/s inside a host")
    print(f"{'ranks':>6} {'schedule':>17} {'inside MB':>10} {'across MB/host':>15} {'msgs/rank':>10} "
          f"{'roundings':>10} {'ms':>8} {'latency':>8}")
    for ranks in (int(r) for r in a.ranks.split(",")):
        for s in SCHEDULES:
            m = model(s, ranks, a.per_host, n, b, a.gbit, a.latency_us * 1e-6, a.overhead_us * 1e-6, a.memory_gbps)
            print(f"{ranks:>6} {s:>17} {m['inside'] / 1e6:>10.1f} {m['across_per_host'] / 1e6:>15.1f} "
                  f"{m['messages']:>10} {m['roundings']:>10} {m['seconds'] * 1e3:>8.2f} {m['latency_share']:>7.0%}")
    link = (a.gbit, a.latency_us * 1e-6, a.overhead_us * 1e-6, a.memory_gbps)
    print("mostly latency (over half the modelled time) from: " + ", ".join(
        f"{s} {latency_bound_from(s, a.per_host, n, b, *link) or 'never'}" for s in SCHEDULES) + " ranks")


if __name__ == "__main__":
    main()
