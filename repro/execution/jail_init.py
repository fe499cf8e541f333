"""``python -I jail_init.py SPEC_FILE -- CMD...``: the first process inside a rollout's jail (run by
:mod:`repro.execution.jail` under ``unshare``: new user, mount, PID, network, IPC and UTS namespaces).

It builds a new root from nothing (a tmpfs): the system's read-only directories, the paths the spec names read-only
(the harness's own environment) and read-write (the rollout's working copy and output folder), a fresh ``/proc``
(this PID namespace's processes only), a minimal ``/dev``, a private ``/tmp``; pivots into it and detaches the old
root, so nothing else of the host's file system exists for what runs next. The network namespace has only loopback;
when the spec names a relay socket, this process listens on the proxy's port on that loopback and pipes each
connection to the socket (bound in from the host, where :class:`repro.execution.jail.ProxyRelay` forwards it to the
proxy and nowhere else). Then it forks the command and waits for it; its exit code is the command's.

Standard library only (it runs before the command, under the job's interpreter).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # SYS_pivot_root by machine (glibc exports no wrapper)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {source} -> {target}")


def bind(source: str, root: Path, read_only: bool, bound: list[Path]) -> None:
    """``source`` at the same path under ``root`` (a file or a folder; a missing source is skipped; a top-level
    symlink such as ``/bin -> usr/bin`` is recreated as a link; a read-only path inside one already bound is
    visible through it). ``bound``: what is bound so far (appended to)."""
    src = Path(source)
    if src.is_symlink() and src.parent == Path("/"):
        link = root / src.relative_to("/")
        if not os.path.lexists(link):
            link.symlink_to(os.readlink(src))
        return
    src = src.resolve()
    if not src.exists() or (read_only and any(src == b or b in src.parents for b in bound)):
        return
    target = root / src.relative_to("/")
    if src.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    mount(str(src), str(target), None, MS_BIND | MS_REC)
    if read_only:
        mount("none", str(target), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_REC)
    bound.append(src)


def build_root(spec: dict) -> Path:
    """The new root (a tmpfs at ``spec["root"]``) with what the spec allows; returns it."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    root = Path(spec["root"])
    mount("tmpfs", str(root), "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    bound: list[Path] = []
    for path in SYSTEM_DIRS:
        bind(path, root, read_only=True, bound=bound)
    private = spec.get("private", {})  # path in the jail -> the host folder behind it (kept across commands)
    for name in ("tmp", "run"):  # before the binds: a working copy under /tmp stays visible
        (root / name).mkdir(exist_ok=True)
        if f"/{name}" in private:
            mount(private[f"/{name}"], str(root / name), None, MS_BIND | MS_REC)
        else:
            mount("tmpfs", str(root / name), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    by_depth = sorted(spec.get("read_only", []), key=lambda p: len(Path(p).resolve().parts))  # folders first
    for path in by_depth:
        bind(path, root, read_only=True, bound=bound)
    for path in spec.get("read_write", []):
        bind(path, root, read_only=False, bound=bound)
    for source, target in spec.get("moved", {}).items():  # a working copy at a fixed place (e.g. /testbed)
        (root / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
        mount(source, str(root / target.lstrip("/")), None, MS_BIND | MS_REC)
    for target, source in private.items():
        if target not in ("/tmp", "/run"):
            (root / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
            mount(source, str(root / target.lstrip("/")), None, MS_BIND | MS_REC)
    (root / "proc").mkdir(exist_ok=True)
    mount("proc", str(root / "proc"), "proc", MS_NOSUID | MS_NODEV)
    (root / "dev").mkdir(exist_ok=True)
    mount("tmpfs", str(root / "dev"), "tmpfs", MS_NOSUID, "mode=755")
    for name in DEVICES:
        if Path(f"/dev/{name}").exists():
            bind(f"/dev/{name}", root, read_only=False, bound=bound)
    mount_ptys(root)
    return root


def mount_ptys(root: Path) -> None:
    """Pseudo-terminals of the jail's own (a new devpts instance at ``/dev/pts``, ``/dev/ptmx`` into it): tmux and
    terminal tools need them. A kernel that refuses devpts in a user namespace (before 4.7) leaves the jail
    without, said on stderr."""
    (root / "dev" / "pts").mkdir()
    try:
        mount("devpts", str(root / "dev" / "pts"), "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620")
    except OSError as exc:
        sys.stderr.write(f"jail: no pseudo-terminals ({exc})\n")
        return
    (root / "dev" / "ptmx").symlink_to("pts/ptmx")


def inside(spec: dict, path: str) -> str:
    """Where the host ``path`` is in the jail: under a folder the spec moves, at its new place; else the same."""
    for source, target in spec.get("moved", {}).items():
        if path == source or path.startswith(source + "/"):
            return target + path[len(source):]
    return path


def pivot(root: Path) -> None:
    """Make ``root`` the file system's root and detach the host's."""
    old = root / ".old-root"
    old.mkdir()
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no syscall number known for {os.uname().machine}")
    _check(_libc.syscall(number, str(root).encode(), str(old).encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old-root", MNT_DETACH), "umount the old root")
    os.rmdir("/.old-root")


def loopback_up() -> None:
    """``ip link set lo up`` (SIOCGIFFLAGS / SIOCSIFFLAGS on a datagram socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, 0x8913, request))[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b"\0" * 14))


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy ``a`` to ``b`` until ``a`` ends; then shut both down (one direction of a relayed connection)."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for end in (a, b):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def relay(port: int, socket_path: str) -> None:
    """Listen on 127.0.0.1:``port`` (this namespace's loopback); pipe each connection to ``socket_path``."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)

    def connect() -> socket.socket:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(socket_path)
        except OSError:
            upstream.close()
            raise
        return upstream

    threading.Thread(target=serve_relay, args=(server, connect), daemon=True).start()


def serve_relay(server: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept on ``server`` until it closes; pipe each connection both ways to a new ``connect()`` (a connection
    that cannot be made is dropped)."""
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            return
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()


CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG = 1


def enter(spec_file: str) -> None:
    """Move this process into a new jail, as ``unshare`` and :func:`main` would put a command there, for a harness
    that forks its rollouts from a warm process instead of starting a command: new namespaces (this process must be
    single-threaded), the root, loopback and relay of the (reusable) spec. It returns in a child that is PID 1 of
    the jail's PID namespace (it dies with this process); this process waits for it and exits as it did."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    _check(_libc.unshare(flags), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        Path(f"/proc/self/{name}").write_text(text)
    child = os.fork()
    if child:
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):  # die of the same signal, so the caller sees what it would have seen
            with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
                signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    spec = json.loads(Path(spec_file).read_text())
    cwd = inside(spec, os.getcwd())
    pivot(build_root(spec))
    loopback_up()
    if spec.get("relay_socket"):
        relay(int(spec["relay_port"]), spec["relay_socket"])
    os.chdir(cwd)


def main(argv: list[str]) -> int:
    split = argv.index("--")
    spec_file, cmd = Path(argv[0]), argv[split + 1:]
    spec = json.loads(spec_file.read_text())
    if not spec.get("reusable"):
        spec_file.unlink()
    cwd = spec.get("cwd") or inside(spec, os.getcwd())  # a reusable spec: the caller's cwd, where the jail has it
    root = build_root(spec)
    pivot(root)
    loopback_up()
    if spec.get("relay_socket"):
        relay(int(spec["relay_port"]), spec["relay_socket"])
    env = spec["env"] if spec.get("env") is not None else dict(os.environ)  # reusable: the caller's environment
    with contextlib.suppress(OSError):
        os.chdir(cwd)  # PID 1 too: ``nsenter -w`` into a held jail takes its cwd
    child = os.fork()
    if child == 0:
        try:
            os.chdir(cwd)
            os.execvpe(cmd[0], cmd, env)
        except OSError as exc:
            sys.stderr.write(f"could not start {cmd[0]} in the jail: {exc}\n")
            os._exit(127)
    while True:  # PID 1 of the namespace: reap every orphan, return the command's status
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
