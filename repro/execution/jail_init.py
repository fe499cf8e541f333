"""``python -I jail_init.py SPEC_FILE -- CMD...``: the first process inside a rollout's jail (run by
:mod:`repro.execution.jail` under ``unshare``: new user, mount, PID, network, IPC and UTS namespaces).

It builds a new root from nothing (a tmpfs): the system's read-only directories, the paths the spec names read-only
(the harness's own environment) and read-write (the rollout's working copy and output folder), a fresh ``/proc``
(this PID namespace's processes only), a minimal ``/dev``, a private ``/tmp``; pivots into it and detaches the old
root, so nothing else of the host's file system exists for what runs next. The network namespace has only loopback;
when the spec names a relay socket, this process listens on the proxy's port on that loopback and pipes each
connection to the socket (bound in from the host, where :class:`repro.execution.jail.ProxyRelay` forwards it to the
proxy and nowhere else). Then it forks the command and waits for it; its exit code is the command's.

Standard library only, and only its cheapest modules at import (it runs before every jailed command, under the
job's interpreter with ``-I -S``: no ``pathlib``, ``json``, ``socket`` or ``threading`` until a relay needs them;
the spec is ``marshal``'s).
"""

from __future__ import annotations

import ctypes
import fcntl
import marshal
import os
import struct
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs ~12 ms before every jailed command
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from typing import Any

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


def _mkdirs(path: str) -> None:
    os.makedirs(path, exist_ok=True)


def _under(root: str, path: str) -> str:
    """``path`` (absolute) at the same place under ``root``."""
    return root + "/" + path.lstrip("/")


def bind(source: str, root: str, read_only: bool, bound: list[str]) -> None:
    """``source`` at the same path under ``root`` (a file or a folder; a missing source is skipped; a top-level
    symlink such as ``/bin -> usr/bin`` is recreated as a link; a read-only path inside one already bound is
    visible through it). ``bound``: what is bound so far (appended to)."""
    if os.path.islink(source) and os.path.dirname(source.rstrip("/")) == "/":
        link = _under(root, source)
        if not os.path.lexists(link):
            os.symlink(os.readlink(source), link)
        return
    src = os.path.realpath(source)
    if not os.path.exists(src) or (read_only and any(src == b or src.startswith(b.rstrip("/") + "/")
                                                     for b in bound)):
        return
    target = _under(root, src)
    if os.path.isdir(src):
        _mkdirs(target)
    else:
        _mkdirs(os.path.dirname(target))
        if not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    mount(src, target, None, MS_BIND | MS_REC)
    if read_only:
        mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_REC)
    bound.append(src)


def _depth(path: str) -> int:
    return os.path.realpath(path).rstrip("/").count("/")


def build_root(spec: dict) -> str:
    """The new root (a tmpfs at ``spec["root"]``) with what the spec allows; returns it."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    root = spec["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    bound: list[str] = []
    for path in SYSTEM_DIRS:
        bind(path, root, read_only=True, bound=bound)
    private = spec.get("private", {})  # path in the jail -> the host folder behind it (kept across commands)
    for name in ("/tmp", "/run"):  # before the binds: a working copy under /tmp stays visible
        _mkdirs(_under(root, name))
        if name in private:
            mount(private[name], _under(root, name), None, MS_BIND | MS_REC)
        else:
            mount("tmpfs", _under(root, name), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path in sorted(spec.get("read_only", []), key=_depth):  # folders first
        bind(path, root, read_only=True, bound=bound)
    for path in spec.get("read_write", []):
        bind(path, root, read_only=False, bound=bound)
    for source, target in spec.get("moved", {}).items():  # a working copy at a fixed place (e.g. /testbed)
        _mkdirs(_under(root, target))
        mount(source, _under(root, target), None, MS_BIND | MS_REC)
    for target, source in private.items():
        if target not in ("/tmp", "/run"):
            _mkdirs(_under(root, target))
            mount(source, _under(root, target), None, MS_BIND | MS_REC)
    _mkdirs(_under(root, "/proc"))
    mount("proc", _under(root, "/proc"), "proc", MS_NOSUID | MS_NODEV)
    _mkdirs(_under(root, "/dev"))
    mount("tmpfs", _under(root, "/dev"), "tmpfs", MS_NOSUID, "mode=755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            bind(f"/dev/{name}", root, read_only=False, bound=bound)
    mount_ptys(root)
    return root


def mount_ptys(root: str) -> None:
    """Pseudo-terminals of the jail's own (a new devpts instance at ``/dev/pts``, ``/dev/ptmx`` into it): tmux and
    terminal tools need them. A kernel that refuses devpts in a user namespace (before 4.7) leaves the jail
    without, said on stderr."""
    os.mkdir(_under(root, "/dev/pts"))
    try:
        mount("devpts", _under(root, "/dev/pts"), "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620")
    except OSError as exc:
        sys.stderr.write(f"jail: no pseudo-terminals ({exc})\n")
        return
    os.symlink("pts/ptmx", _under(root, "/dev/ptmx"))


HOLD = ["/bin/sh", "-c", "echo up; exec sleep infinity"]  # a held jail's command: say it is up, then wait
ENTER = ["-U", "-m", "-p", "-n", "-i", "-u", "--preserve-credentials", "-r", "-w"]  # nsenter: all, its root and cwd


def hold(launch: list[str], cwd: str) -> tuple[Any, list[str]]:
    """Start a jail that stays up (``launch``: its command line up to ``--``, run in ``cwd`` in a session of its
    own; its PID 1 waits) and return (its process, the prefix that runs a command inside it: util-linux
    ``nsenter`` into its namespaces, root and cwd). A few ms a command instead of a jail's start; ``/tmp``, HOME and
    background processes last until the process is killed, as in a container. OSError when it does not come up."""
    import shutil
    import subprocess

    proc = subprocess.Popen([*launch, *HOLD], cwd=cwd, env={"PATH": os.defpath}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    if proc.stdout is None or proc.stdout.readline().strip() != "up":
        proc.kill()
        raise OSError(f"the rollout's jail did not come up: {proc.communicate()[1][-500:]}")
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as handle:
        init = handle.read().split()[0]
    return proc, [shutil.which("nsenter") or "nsenter", "-t", init, *ENTER]


def read_spec(path: str) -> dict[str, Any]:
    """A spec as :class:`repro.execution.jail.Jail` writes it (``marshal``: no import to read it)."""
    with open(path, "rb") as handle:
        return marshal.load(handle)


def inside(spec: dict, path: str) -> str:
    """Where the host ``path`` is in the jail: under a folder the spec moves, at its new place; else the same."""
    for source, target in spec.get("moved", {}).items():
        if path == source or path.startswith(source + "/"):
            return target + path[len(source):]
    return path


def pivot(root: str) -> None:
    """Make ``root`` the file system's root and detach the host's."""
    old = _under(root, "/.old-root")
    os.mkdir(old)
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no syscall number known for {os.uname().machine}")
    _check(_libc.syscall(number, root.encode(), old.encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old-root", MNT_DETACH), "umount the old root")
    os.rmdir("/.old-root")


def loopback_up() -> None:
    """``ip link set lo up`` (SIOCGIFFLAGS / SIOCSIFFLAGS on a datagram socket)."""
    import _socket  # the C module: ``socket`` would import enum, selectors...

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock.fileno(), 0x8913, request))[1]
        fcntl.ioctl(sock.fileno(), 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b"\0" * 14))
    finally:
        sock.close()


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy ``a`` to ``b`` until ``a`` ends; then shut both down (one direction of a relayed connection)."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for end in (a, b):
            try:  # noqa: SIM105 (contextlib costs an import before every jailed command)
                end.shutdown(2)  # SHUT_RDWR
            except OSError:
                pass


def connection(client: socket.socket, upstream: socket.socket) -> None:
    """One relayed connection both ways; both sockets closed once both directions ended (closed here, after the
    other direction's thread is joined, so no thread uses a descriptor number the process may have reused)."""
    import threading

    back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
    back.start()
    pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def relay(port: int, socket_path: str) -> None:
    """Listen on 127.0.0.1:``port`` (this namespace's loopback); pipe each connection to ``socket_path``."""
    import socket
    import threading

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
    import threading

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
        threading.Thread(target=connection, args=(client, upstream), daemon=True).start()


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
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    child = os.fork()
    if child:
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):  # die of the same signal, so the caller sees what it would have seen
            import signal

            try:  # noqa: SIM105
                signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            except (OSError, ValueError):  # SIGKILL has no handler to reset
                pass
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    _libc.prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL
    spec = read_spec(spec_file)
    cwd = inside(spec, os.getcwd())
    move_in(spec)
    os.chdir(cwd)


def move_in(spec: dict) -> None:
    """Into the spec's new root, with loopback up and, where the spec names one, the relay to the proxy."""
    pivot(build_root(spec))
    loopback_up()
    if spec.get("relay_socket"):
        relay(int(spec["relay_port"]), spec["relay_socket"])


def main(argv: list[str]) -> int:
    split = argv.index("--")
    spec_file, cmd = argv[0], argv[split + 1:]
    spec = read_spec(spec_file)
    if not spec.get("reusable"):
        os.unlink(spec_file)
    cwd = spec.get("cwd") or inside(spec, os.getcwd())  # a reusable spec: the caller's cwd, where the jail has it
    move_in(spec)
    env = spec["env"] if spec.get("env") is not None else dict(os.environ)  # reusable: the caller's environment
    try:  # noqa: SIM105
        os.chdir(cwd)  # PID 1 too: ``nsenter -w`` into a held jail takes its cwd
    except OSError:
        pass
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
