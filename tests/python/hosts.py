"""Hosts simulated on one machine: network namespaces joined by a veth pair, each host's processes
also in an IPC namespace of their own (two machines share no memory). Used by conftest.py's `nodes`
fixture (test_multinode.py, test_scale_model.py) and bench/link.py. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); `unavailable()` says why not elsewhere.
Addresses are 10.213.x.{1,2} inside the namespaces made here, never on the machine's own network."""

import os
import shutil
import signal
import subprocess


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

    def shape(self, gbit):
        """Limits each end's sending to `gbit` Gbit/s with a token bucket (`tc ... tbf`), or lifts the
        limit (None). The bucket holds 1 ms of the rate and at least 256 KiB: a veth hands the qdisc
        segments of up to 64 KiB, and a smaller bucket would cap the rate below the one asked for. The
        queue holds 5 ms of the rate, as a NIC's default queue of 1000 packets does at 2.5 Gbit/s."""
        for ns, dev in zip(self.ns, self.dev):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
            if gbit is None:
                continue
            burst = max(256 << 10, int(gbit * 1e9 / 8 * 1e-3))
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
