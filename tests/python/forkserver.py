"""Starts the ranks of the harness's jobs and of the fault tests by forking a process that has already
imported torch and cnccl, instead of starting a fresh interpreter for each: importing torch costs a
rank about 3 s of CPU, which on a 2-core machine was most of what a fault test or a job's start cost.
multiprocessing's "forkserver" start method exists for the same reason and works the same way.

A forked rank is a whole interpreter: it runs its script as `python script args` would (`__main__`,
its own environment, working folder, stdout and stderr), exits through the interpreter's normal
finalization with the script's exit code, and is the launcher's child (so `wait`, `kill` and exit
codes read as with `subprocess.Popen`). What it shares with the server is what importing torch and
cnccl did, so a launch whose environment differs in a variable read at import, or a test of process
exit itself, starts a fresh interpreter instead (`harness.launch`).

Protocol, over a SOCK_SEQPACKET Unix socket whose fd is argv[1]: a request is one message, JSON
{"argv", "env", "cwd"}, carrying the caller's stdout and stderr (SCM_RIGHTS); the reply is the rank's
pid. The server first replies "ready" or "refused: <why>" (it refuses when importing left a thread
running: forking a process with threads can copy a held lock). Each rank is forked twice, so that it
is reparented to the launcher, which has made itself a child subreaper (PR_SET_CHILD_SUBREAPER); the
reply is sent once that has happened.
"""

import json
import os
import runpy
import socket
import sys


def _threads():
    return len(os.listdir("/proc/self/task"))


def _become_rank(sock, request, fds):
    sock.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    script = os.path.abspath(argv[1])
    sys.argv = argv[1:]
    sys.path[0] = os.path.dirname(script)
    # Python's `random` reseeds itself in a forked child; numpy's global generator does not, and a
    # fresh process would have seeded it anew.
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def serve(sock):
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        except OSError:
            return
        if not data:
            return
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        read_pid, write_pid = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(read_pid)
            rank = os.fork()
            if rank == 0:
                os.close(write_pid)
                _become_rank(sock, request, fds)
            os.write(write_pid, str(rank).encode())
            os._exit(0)
        os.close(write_pid)
        pid = int(os.read(read_pid, 64))
        os.close(read_pid)
        os.waitpid(middle, 0)  # the rank is the launcher's child from here on
        for fd in fds:
            os.close(fd)
        sock.send(str(pid).encode())


def main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    import torch  # noqa: F401 - what every rank imports; cnccl comes with it (torch's backend autoload)
    import torch.distributed  # noqa: F401

    import cnccl  # noqa: F401

    threads = _threads()
    if threads != 1:
        sock.send(f"refused: {threads} threads after importing torch and cnccl".encode())
        return
    sock.send(b"ready")
    serve(sock)


if __name__ == "__main__":
    main()
