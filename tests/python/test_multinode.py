"""Two nodes on one machine: network namespaces joined by a veth pair, each node also in an IPC
namespace of its own (as two machines share no memory), `torchrun --nnodes=2 --nproc_per_node=2` in
each, DDP on cnccl. cnccl's allreduces are then hierarchical: shared memory inside each node, UCX
between them. The trained parameters must equal those of the same job on two simulated hosts without
the veth (two IPC namespaces on this machine's own network, the same path and rounding), and the
bytes through the veth must be what the hierarchical allreduce sends between nodes, less than a
flat ring over all four ranks would.

Network namespaces do not isolate UCX's own shared memory, so the jobs run with UCX_TLS=tcp: every
byte UCX carries goes through a socket, and bytes between the nodes through the veth. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) for `ip netns`; skips naming that
elsewhere. CI sets CNCCL_REQUIRE_NETNS=1, which turns that skip into a failure.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "train_ddp.py")
STEPS = 8
TIMEOUT = 420


def ip(*args, netns=None, check=True):
    cmd = ["ip"] + (["netns", "exec", netns, "ip"] if netns else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def unavailable():
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    probe = f"cnccl-probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed (missing CAP_NET_ADMIN/CAP_SYS_ADMIN?): {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


class Nodes:
    """Namespaces `a` and `b`, joined by veth devices on 10.213.<n>.1 and .2; removed on close."""

    def __init__(self):
        tag = os.getpid() % 10000
        self.ns = [f"cnccl-a-{tag}", f"cnccl-b-{tag}"]
        self.dev = [f"cna{tag}", f"cnb{tag}"]
        self.addr = [f"10.213.{tag % 250}.1", f"10.213.{tag % 250}.2"]
        self.procs = []
        try:
            for ns in self.ns:
                ip("netns", "add", ns)
            ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
            for ns, dev, addr in zip(self.ns, self.dev, self.addr):
                ip("link", "set", dev, "netns", ns)
                ip("addr", "add", f"{addr}/24", "dev", dev, netns=ns)
                ip("link", "set", dev, "up", netns=ns)
                ip("link", "set", "lo", "up", netns=ns)
        except BaseException:
            self.close()
            raise

    def bytes_through(self, node):
        """Bytes the node's veth end has sent and received."""
        stats = f"/sys/class/net/{self.dev[node]}/statistics/"
        out = subprocess.run(["ip", "netns", "exec", self.ns[node], "cat", stats + "tx_bytes", stats + "rx_bytes"],
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]) + int(out[1])

    def start(self, node, cmd, env, log):
        # Each node in its own IPC namespace as well, as on two machines: cnccl then finds that the
        # nodes cannot share memory and runs over UCX between all ranks.
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[node], "unshare", "--ipc"] + cmd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for ns in self.ns:
            # Anything still inside (a stray rank) dies with it.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", ns, check=False)


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args, SCRIPT, "--steps", str(STEPS)]


def env_for(**extra):
    # A UCX_NET_DEVICES naming the machine's own devices would match nothing inside a namespace,
    # which has only lo and its veth end.
    env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}
    return dict(env, OMP_NUM_THREADS="1", **extra)


def wait_all(procs, logs):
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    if codes != [0] * len(procs):
        text = "\n".join(f"--- {path}\n" + open(path).read()[-4000:] for path in logs)
        pytest.fail(f"job failed (exit codes {codes}, timeout {TIMEOUT} s):\n{text}")


@pytest.fixture(scope="module")
def nodes():
    why = unavailable()
    if why:
        if os.environ.get("CNCCL_REQUIRE_NETNS") == "1":
            pytest.fail(f"CNCCL_REQUIRE_NETNS=1 but {why}")
        pytest.skip(why)
    n = Nodes()
    yield n
    n.close()


def test_two_nodes_over_veth_train_like_one_node(nodes, tmp_path):
    two, one = tmp_path / "two-nodes.pt", tmp_path / "one-node.pt"
    logs = [str(tmp_path / f"node{i}.log") for i in range(2)]
    before = nodes.bytes_through(0)
    procs = []
    for node in range(2):
        cmd = torchrun("--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_id=cnccl-two-nodes",
                       f"--rdzv_endpoint={nodes.addr[0]}:29411", f"--local_addr={nodes.addr[node]}",
                       # Both namespaces share the machine's host name: say which one hosts the store.
                       f"--rdzv_conf=is_host={int(node == 0)}")
        with open(logs[node], "w") as log:
            procs.append(nodes.start(node, cmd + ["--save", str(two)], env_for(UCX_TLS="tcp"), log))
    wait_all(procs, logs)
    crossed = nodes.bytes_through(0) - before

    said = "CPU transport shm within each host, ucx across 2 hosts"
    assert any(said in open(path).read() for path in logs), f"rank 0 did not report {said!r}"
    ref_logs = [str(tmp_path / f"one-machine{i}.log") for i in range(2)]
    ref = []
    with socket.socket() as probe:  # a port the machine has free: this store is in the host's namespace
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for node in range(2):
        cmd = torchrun("--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_id=cnccl-one-machine",
                       f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_conf=is_host={int(node == 0)}")
        with open(ref_logs[node], "w") as log:
            ref.append(subprocess.Popen(["unshare", "--ipc"] + cmd + ["--save", str(one)], env=env_for(UCX_TLS="tcp"),
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    nodes.procs += ref
    wait_all(ref, ref_logs)

    trained, reference = torch.load(two), torch.load(one)
    assert trained.keys() == reference.keys()
    for name in reference:
        assert torch.equal(trained[name], reference[name]), f"{name} differs from the same job on one machine"
    # Per step, each rank's part (half the fp16 gradients, params bytes) goes once around a ring of
    # the two nodes: 4 ranks x params bytes cross the veth, counted once sent and once received at
    # node 0's end: 4 x params in all (a flat ring over the four ranks: 6 x params). DDP's initial
    # broadcast of fp32 parameters (rank 0 to the other node's two ranks) adds 8 x params once.
    params = sum(t.numel() for t in reference.values())
    hierarchical, flat = (STEPS * 4 + 8) * params, (STEPS * 6 + 8) * params
    print(f"{crossed} bytes crossed the veth ({params} parameters, {STEPS} steps); hierarchical {hierarchical}, "
          f"flat ring {flat}")
    assert hierarchical <= crossed < (hierarchical + flat) / 2, f"{crossed} bytes crossed the veth"
