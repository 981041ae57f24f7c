"""Warm spares forked from one warmed process: a fork server per arm.

A spare started as a new interpreter imports torch, gymnasium and dsec and warms them up:
a few CPU-seconds, which at the workers' low priority behind a host's trainers becomes a
minute or more, so deaths in quick succession used up the spares faster than new ones got
ready. The fork server does that work once; each spare is a fork of it, ready in
milliseconds and sharing its memory until written, as a launcher's pool of pre-started
ranks would be on a real cluster.

The protocol, all through files beside the supervisor's ready file so neither side ever
blocks on the other:
- a request is one JSON line on the server's stdin: ``{"ready_file": ..., "log": ...}``;
- the spare writes its pid into the ready file once it can take over;
- the supervisor assigns it by writing the assignment (one JSON line) to
  ``<ready_file>.assignment``;
- the server reaps the spare when it ends and writes its exit status (as ``Popen``'s
  ``returncode``) to ``<ready_file>.exit``.

An unassigned spare whose server is gone ends itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from dsec.actuators.snapshot_store import write_atomically

REAP_INTERVAL_S = 0.05
ASSIGNMENT_POLL_S = 0.02
# The return code of a spare that ended after its server did: no one reaped it for us.
EXIT_UNKNOWN = -255


def assignment_file(ready_file: Path) -> Path:
    return ready_file.with_name(ready_file.name + ".assignment")


def exit_file(ready_file: Path) -> Path:
    return ready_file.with_name(ready_file.name + ".exit")


def new_ready_file(log_path: Path) -> Path:
    """A fresh path, beside the log, that a worker creates once it can take over."""
    ready_dir = log_path.parent / "ready"
    ready_dir.mkdir(exist_ok=True)
    return ready_dir / f"{time.monotonic_ns()}"


class ForkedWorker:
    """The supervisor's handle on a forked spare, with the part of ``Popen``'s interface
    the supervisor uses: ``poll``, ``kill``, ``wait``, ``ready_file``."""

    def __init__(self, server: subprocess.Popen, ready_file: Path) -> None:
        self.server = server
        self.ready_file = ready_file
        self.returncode: int | None = None
        self._pid: int | None = None
        self._pidfd: int | None = None

    @property
    def pid(self) -> int | None:
        """None until the spare is ready (the ready file is read until then)."""
        if self._pid is None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                self._pid = int(self.ready_file.read_text())
        return self._pid

    def _open_pidfd(self) -> int | None:
        if self._pidfd is None and (pid := self.pid) is not None:
            try:
                self._pidfd = os.pidfd_open(pid)
            except ProcessLookupError:  # gone before we looked; its exit file follows
                return None
        return self._pidfd

    def _ended(self) -> bool:
        pidfd = self._open_pidfd()
        return pidfd is not None and bool(select.select([pidfd], [], [], 0)[0])

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            self.returncode = int(exit_file(self.ready_file).read_text())
        except FileNotFoundError:
            if self.server.poll() is not None and (self.pid is None or self._ended()):
                self.returncode = EXIT_UNKNOWN  # unassigned spares end with their server
        if self.returncode is not None and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL through a pidfd, which cannot reach another process that took the pid;
        a spare not ready yet ends itself once its server is gone."""
        if self.poll() is not None or (pidfd := self._open_pidfd()) is None:
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"spare {self.ready_file.name}", timeout or 0)
            time.sleep(REAP_INTERVAL_S)
        return code

    def assign(self, line: str) -> None:
        write_atomically(assignment_file(self.ready_file), line.encode())


def fork_spare(server: subprocess.Popen, log_path: Path) -> ForkedWorker:
    """Asks ``server`` (a process running this module) for a spare that logs to
    ``log_path``; returns at once, the spare forked as soon as the server gets to it."""
    ready_file = new_ready_file(log_path)
    assert server.stdin is not None
    server.stdin.write((json.dumps({"ready_file": str(ready_file),
                                    "log": str(log_path)}) + "\n").encode())
    server.stdin.flush()
    return ForkedWorker(server, ready_file)


def _spare(request: dict, cpu_slowdown: float, server_pid: int) -> None:
    """In the forked child: its own log, ready, its assignment awaited, the worker run."""
    from dsec.experiment.slow_host import SlowHost
    from dsec.experiment.worker import run_assigned

    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    ready_file = Path(request["ready_file"])
    write_atomically(ready_file, str(os.getpid()).encode())
    assigned = assignment_file(ready_file)
    while not assigned.exists():
        if os.getppid() != server_pid:  # the run is over, or its supervisor is gone
            return
        time.sleep(ASSIGNMENT_POLL_S)
    run_assigned(assigned.read_text(), SlowHost(cpu_slowdown))


def _fork(request: dict, cpu_slowdown: float) -> int:
    server_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        _spare(request, cpu_slowdown, server_pid)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)
    return 0  # not reached


def _reap(children: dict[int, Path]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ready_file = children.pop(pid, None)
        if ready_file is not None:
            write_atomically(exit_file(ready_file),
                             str(os.waitstatus_to_exitcode(status)).encode())


def serve(ready_file: Path | None, cpu_slowdown: float) -> int:
    """The fork server's loop: warm up, say so, then fork a spare per request and reap
    the spares. Once stdin closes it ends the spares not assigned yet and returns when
    the others have ended; it returns at once when the supervisor is gone."""
    from dsec.experiment.worker import warm_up

    warm_up()
    if ready_file is not None:
        ready_file.touch()
    supervisor = os.getppid()
    children: dict[int, Path] = {}
    pending = b""
    closed = False
    while os.getppid() == supervisor:
        readable = select.select([] if closed else [0], [], [], REAP_INTERVAL_S)[0]
        _reap(children)
        if closed:
            if not children:
                return 0
            continue
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            closed = True
            for pid, spare_ready in children.items():
                if not assignment_file(spare_ready).exists():
                    os.kill(pid, signal.SIGKILL)  # a child not reaped yet: its pid is ours
            continue
        *lines, pending = (pending + chunk).split(b"\n")
        for line in filter(None, (raw.strip() for raw in lines)):
            request = json.loads(line)
            children[_fork(request, cpu_slowdown)] = Path(request["ready_file"])
    return 0


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]) if len(sys.argv) > 1 else None,
                   float(sys.argv[2]) if len(sys.argv) > 2 else 1.0))
