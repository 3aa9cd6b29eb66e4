"""Hosts simulated on one machine: network namespaces joined by a veth pair, each host's processes
also in an IPC namespace of their own (two machines share no memory). Used by conftest.py's `nodes`
fixture (test_multinode.py, test_scale_model.py) and bench/link.py. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); `unavailable()` says why not elsewhere.
Addresses are 10.213.x.{1,2} inside the namespaces made here, never on the machine's own network."""

import os
import shutil
import signal
import socket
import subprocess
import sys


def ip(*args, netns=None, check=True):
    cmd = ["ip"] + (["netns", "exec", netns, "ip"] if netns else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def unavailable(tools=("ip",)):
    """Why namespaces (and `tools`) cannot be used here, or None."""
    for tool in tools:
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    probe = f"cnccl-probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed (missing CAP_NET_ADMIN/CAP_SYS_ADMIN?): {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


class Nodes:
    """`hosts` namespaces (cnccl-a-*, cnccl-b-*, ...) on 10.213.<n>.1, .2, ...; removed on close. Two are
    joined by one veth pair; more, each by a veth to a bridge in a namespace of its own (a switch)."""

    def __init__(self, hosts=2):
        tag = os.getpid() % 1000 * 10 + hosts  # two sets of hosts of one process are apart
        names = "abcdefgh"[:hosts]
        self.ns = [f"cnccl-{c}-{tag}" for c in names]
        self.dev = [f"cn{c}{tag}" for c in names]
        self.addr = [f"10.213.{tag % 250}.{i + 1}" for i in range(hosts)]
        self.switch = f"cnccl-sw-{tag}" if hosts > 2 else None
        self.procs = []
        try:
            for ns in self.ns + ([self.switch] if self.switch else []):
                ip("netns", "add", ns)
            if self.switch:
                ip("link", "add", "br0", "type", "bridge", netns=self.switch)
                ip("link", "set", "br0", "up", netns=self.switch)
                for i, dev in enumerate(self.dev):
                    port = f"sw{i}{tag}"
                    ip("link", "add", dev, "type", "veth", "peer", "name", port)
                    ip("link", "set", port, "netns", self.switch)
                    ip("link", "set", port, "master", "br0", netns=self.switch)
                    ip("link", "set", port, "up", netns=self.switch)
            else:
                ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
            for ns, dev, addr in zip(self.ns, self.dev, self.addr):
                ip("link", "set", dev, "netns", ns)
                ip("addr", "add", f"{addr}/24", "dev", dev, netns=ns)
                ip("link", "set", dev, "up", netns=ns)
                ip("link", "set", "lo", "up", netns=ns)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def burst_bytes(gbit):
        """The token bucket shape() gives each end at `gbit` Gbit/s: what the link lets through at once."""
        return max(256 << 10, int(gbit * 1e9 / 8 * 1e-3))

    def shape(self, gbit):
        """Limits each end's sending to `gbit` Gbit/s with a token bucket (`tc ... tbf`), or lifts the
        limit (None). The bucket holds 1 ms of the rate and at least 256 KiB: a veth hands the qdisc
        segments of up to 64 KiB, and a smaller bucket would cap the rate below the one asked for. The
        queue holds 5 ms of the rate, as a NIC's default queue of 1000 packets does at 2.5 Gbit/s."""
        for ns, dev in zip(self.ns, self.dev):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
            if gbit is None:
                continue
            burst = self.burst_bytes(gbit)
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                            f"{int(gbit * 1000)}mbit", "burst", str(burst), "latency", "5ms"],
                           capture_output=True, text=True, check=True)

    def bytes_through(self, node):
        """Bytes the node's veth end has sent and received."""
        stats = f"/sys/class/net/{self.dev[node]}/statistics/"
        out = subprocess.run(["ip", "netns", "exec", self.ns[node], "cat", stats + "tx_bytes", stats + "rx_bytes"],
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]) + int(out[1])

    def start(self, node, cmd, env, log):
        # Each node in its own IPC namespace as well, as on two machines: cnccl then finds that the
        # nodes cannot share memory and runs over UCX between them.
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[node], "unshare", "--ipc"] + cmd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def torchrun(self, per_host, args, logdir, timeout, node_env=lambda node: {}):
        """`python -m torch.distributed.run ... args` on every host, `per_host` ranks each (c10d rendezvous on
        the first host's address, UCX over TCP), waited for; returns the exit codes (None on a timeout) and
        the logs' paths. `node_env(node)` adds variables for one host's ranks."""
        # The store listens inside the first host's namespace, where the last job's ranks may still hold
        # ephemeral ports (32768-60999 on Linux: a UCX or gloo listener): a port below that range, varied by
        # an ephemeral one of this process's, cannot meet them (one from 20000-39999 failed with EADDRINUSE).
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = 20000 + probe.getsockname()[1] % 12000
        hosts = len(self.ns)
        procs, logs = [], []
        for node in range(hosts):
            # A UCX_NET_DEVICES naming the machine's own devices would match nothing inside a namespace.
            env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}
            env.update(GLOO_SOCKET_IFNAME=self.dev[node], UCX_TLS="tcp", OMP_NUM_THREADS="1", **node_env(node))
            logs.append(os.path.join(logdir, f"host{node}.log"))
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={hosts}", f"--nproc_per_node={per_host}",
                   "--rdzv_backend=c10d", f"--rdzv_id=cnccl-{port}", f"--rdzv_endpoint={self.addr[0]}:{port}",
                   f"--local_addr={self.addr[node]}",
                   # The namespaces share the machine's host name: say which one hosts the store.
                   f"--rdzv_conf=is_host={int(node == 0)}"] + list(args)
            with open(logs[-1], "w") as log:
                procs.append(self.start(node, cmd, env, log))
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        except subprocess.TimeoutExpired:
            codes = None
        return codes, logs

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for ns in self.ns + ([self.switch] if self.switch else []):
            # Anything still inside (a stray rank) dies with it.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", ns, check=False)
