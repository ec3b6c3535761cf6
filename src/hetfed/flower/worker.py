"""A SuperNode's persistent worker: the process that keeps torch, the node's data and its method between messages.

A deployment's SuperNode starts a fresh ``flwr-clientapp`` process for every message (Flower has no persistent
ClientApp: flwr#3670). hetfed's steps need torch, whose import alone is most of a round on a small machine
(7–8 s with four nodes on two cores, against ~0.05 s of training). So the ClientApp that deployments run
(:mod:`hetfed.flower.lean_app`) imports only Flower and this module, and hands each message — its content and the
node's context, in Flower's own protobuf encoding — over a Unix socket to this worker, which runs hetfed's
ClientApp handlers (:mod:`hetfed.flower.client_app`) on them and hands back the reply and the records of the
context the step wrote. The first message of a node (the run's first step, with the set-up question) starts it.

The worker is a cache, never the keeper of anything: the clients' states stay in Flower's ``context.state``,
which travels with every message both ways, so a worker that dies, or is stopped, loses nothing — the next
message starts another. It serves one node (the key: its node config, this Python and hetfed, the process that
starts the ClientApps, hetfed's ``HETFED_*`` environment), one message at a time, and exits when that process is
gone (the SuperNode stopped), after ``HETFED_WORKER_IDLE`` seconds without a message (default 600), or when
another worker took its socket.

Where: its pid, lock and log files in ``$HETFED_WORKER_DIR`` (a :class:`~hetfed.flower.deploy.LocalDeployment`
sets its own, and stops the workers in it with its nodes), else ``hetfed-workers-<uid>`` in the temporary directory;
its socket in ``/tmp/hetfed-sockets-<uid>`` (:func:`socket_dir`: short, as a socket's path must be). Both must
belong to this user and be closed to others (0700), and the worker serves only connections from its own user (the
peer's credentials); nothing is unpickled: the messages are Flower's protobufs. ``HETFED_FLOWER_WORKER=0`` runs every
message in the ClientApp's own process instead (what the Simulation Engine always does: its workers persist).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetfed.environment import positive, switch
from hetfed.processes import process_alive

#: the handlers of :mod:`hetfed.flower.client_app` a message may be forwarded to
HANDLERS = ("query", "train", "personalise", "evaluate")
#: how long a ClientApp waits for a worker it started to listen (its imports: torch, hetfed's registries)
START_TIMEOUT = 300.0
#: seconds a worker waits for a message before it exits
IDLE = "HETFED_WORKER_IDLE"
_HEADER = struct.Struct("!Q")


class WorkerError(RuntimeError):
    """The worker could not serve a message (its traceback, or why it could not be reached)."""


def enabled() -> bool:
    """Whether messages go to the node's worker (``HETFED_FLOWER_WORKER``, default on)."""
    return switch("HETFED_FLOWER_WORKER", True, "off: every step in the ClientApp's own process")


def worker_dir() -> Path:
    """The directory of this user's workers' pid, lock and log files, made 0700 if missing; refused when another
    user could reach it."""
    return _private(Path(os.environ.get("HETFED_WORKER_DIR") or
                         Path(tempfile.gettempdir()) / f"hetfed-workers-{os.getuid()}"), "HETFED_WORKER_DIR")


def socket_dir() -> Path:
    """Where the workers' sockets are: a short path (a Unix socket's is at most ~104 bytes, which a deployment
    directory deep in a project or a test's temporary directory passes), private like :func:`worker_dir`."""
    base = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    return _private(base / f"hetfed-sockets-{os.getuid()}", "the workers' socket directory")


def _private(path: Path, what: str) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WorkerError(f"{what}={str(path)!r} must belong to this user and be closed to others "
                          f"(owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)}); expected uid {os.getuid()}, "
                          "mode 0700")
    return path


def _code_stamp() -> list:
    """hetfed's own source files, by size and time: an edited or upgraded hetfed gets a fresh worker."""
    root = Path(__file__).resolve().parents[1]
    return [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(root.rglob("*.py"))]


def worker_key(node_config: dict, parent: int) -> str:
    """Which worker serves this node: its config, this Python, hetfed's code, the ClientApps' parent process and
    hetfed's environment."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("HETFED_", "OMP_", "MKL_"))}
    text = json.dumps([sorted((str(k), str(v)) for k, v in node_config.items()), sys.executable, _code_stamp(),
                       parent, sorted(env.items())], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# ----------------------------------------------------------------------------------------------- the wire


def _send(conn: socket.socket, header: dict, *blobs: bytes) -> None:
    head = json.dumps({**header, "blobs": [len(b) for b in blobs]}).encode()
    conn.sendall(_HEADER.pack(len(head)) + head + b"".join(blobs))


def _exactly(conn: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise WorkerError("the worker closed the connection mid-message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(conn: socket.socket) -> tuple[dict, list[bytes]]:
    (size,) = _HEADER.unpack(_exactly(conn, _HEADER.size))
    header = json.loads(_exactly(conn, size))
    return header, [_exactly(conn, n) for n in header.pop("blobs")]


# --------------------------------------------------------------------------------------- the ClientApp side


def forward(handler: str, message, context, timing: dict | None = None):
    """Run ``handler`` of :mod:`hetfed.flower.client_app` on ``message`` in the node's worker (started if none
    listens); the records the step wrote into the context come back into ``context.state``. Returns the reply's
    content (a ``RecordDict``)."""
    from flwr.common.serde import context_to_proto, message_to_proto, recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

    key = worker_key(dict(context.node_config), os.getppid())
    path, files = socket_dir() / f"{key}.sock", worker_dir() / key
    header = {"handler": handler, "timing": timing or {}}
    blobs = (message_to_proto(message).SerializeToString(), context_to_proto(context).SerializeToString())
    with _connect(path, files) as conn:
        _send(conn, header, *blobs)
        reply, (content, written) = _receive(conn)
    if "error" in reply:
        raise WorkerError(f"hetfed's worker for this node failed on a {handler!r} message:\n{reply['error']}")
    state = recorddict_from_proto(RecordDictProto.FromString(written))
    for name in state:
        context.state[name] = state[name]
    return recorddict_from_proto(RecordDictProto.FromString(content))


def _connect(path: Path, files: Path) -> socket.socket:
    """A connection to the worker at socket ``path``, starting it first when none listens (one starter at a time;
    ``files``: where its lock, pid and log files are, less their suffixes)."""
    conn = _try(path)
    if conn is not None:
        return conn
    with open(files.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _try(path)
        if conn is None:
            _start(path, files)
            conn = _wait(path, files)
    return conn


def _try(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    return conn


def _start(path: Path, files: Path) -> None:
    positive(IDLE, 600.0)  # refused here, in the ClientApp's process, rather than in the worker's log
    log = open(files.with_suffix(".log"), "ab")  # noqa: SIM115 (the worker's, kept open by it)
    proc = subprocess.Popen([sys.executable, "-m", "hetfed.flower.worker", str(path), str(os.getppid())],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            close_fds=True, cwd=files.parent)  # not the ClientApp's directory: nothing there shadows
    log.close()
    files.with_suffix(".pid").write_text(str(proc.pid))


def _wait(path: Path, files: Path) -> socket.socket:
    pid = int(files.with_suffix(".pid").read_text())
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        conn = _try(path)
        if conn is not None:
            return conn
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            log = files.with_suffix(".log")
            raise WorkerError(f"hetfed's worker exited with status {status >> 8} before it listened; its log "
                              f"({log}) ends:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.02)
    raise WorkerError(f"hetfed's worker did not listen at {path} within {START_TIMEOUT:g} s")


# ------------------------------------------------------------------------------------------ the worker side


def serve(path: Path, parent: int) -> None:
    """Answer messages at ``path`` until ``parent`` is gone, the socket is another's, or the worker idled."""
    # torch, the registries: imported once, before the socket listens
    from hetfed.flower import client_app

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped: leave through the clean-up below
    idle = positive(IDLE, 600.0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead worker's socket (the starter holds the lock: no live worker is there)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(8)
    listener.settimeout(0.5)
    mine = path.stat().st_ino
    last = time.monotonic()
    try:
        while process_alive(parent) and time.monotonic() - last < idle and _ours(path, mine):
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                if _peer_uid(conn) == os.getuid():
                    with contextlib.suppress(OSError):  # a ClientApp that left (Flower's timeout) gets no answer
                        _answer(conn, client_app)
            last = time.monotonic()
    finally:
        listener.close()
        if _ours(path, mine):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _answer(conn: socket.socket, client_app) -> None:
    """Run one message's step and send its reply and the context records it wrote (or the step's traceback)."""
    import traceback

    from flwr.app import RecordDict
    from flwr.common.serde import context_from_proto, message_from_proto, recorddict_to_proto
    from flwr.proto.message_pb2 import Context as ContextProto
    from flwr.proto.message_pb2 import Message as MessageProto

    try:
        header, (message_blob, context_blob) = _receive(conn)
    except (WorkerError, ValueError):  # a peer that sent no whole message: nothing to answer
        return
    try:
        message = message_from_proto(MessageProto.FromString(message_blob))
        context = context_from_proto(ContextProto.FromString(context_blob))
        before = {name: id(record) for name, record in context.state.items()}
        client_app.CALLER = header.get("timing") or None
        if header["handler"] not in HANDLERS:  # the peer names a step; nothing else of the module is callable
            raise WorkerError(f"handler = {header['handler']!r} is not allowed; expected one of {', '.join(HANDLERS)}")
        reply = getattr(client_app, header["handler"])(message, context)
        written = {name: record for name, record in context.state.items() if before.get(name) != id(record)}
        blobs = (recorddict_to_proto(reply.content).SerializeToString(),
                 recorddict_to_proto(RecordDict(written)).SerializeToString())
    except Exception:  # the ClientApp raises it: Flower records the message as failed, as in process
        _send(conn, {"error": traceback.format_exc()[-4000:]}, b"", b"")
        return
    finally:
        client_app.CALLER = None
    _send(conn, {}, *blobs)


def _ours(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except FileNotFoundError:
        return False


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def stop_workers(directory: Path, grace: float = 5.0) -> None:
    """Stop the workers whose pid files are in ``directory`` (a deployment's own) and wait for them."""
    pids = []
    for pid_file in directory.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            if _is_worker(pid):  # a pid file outlives its worker, and a pid can be reused by another process
                pids.append(pid)
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _is_worker(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _is_worker(pid: int) -> bool:
    """Whether ``pid`` is a live hetfed worker (its command line), on Linux; elsewhere whether it is alive."""
    if not Path("/proc/self").exists():
        return process_alive(pid)
    try:
        return b"hetfed.flower.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
