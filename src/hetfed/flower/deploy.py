"""A real Flower deployment on this machine: one SuperLink and K SuperNodes.

Node P is started with ``--node-config 'partition-id=P num-partitions=K'`` — it holds
the P-th of K blocks of a simulated federation's clients
(:func:`hetfed.flower.node.node_clients`: one client each when K equals the clients)
— or with a node config of the caller's (``node_configs``: a node's own data).

:class:`LocalDeployment` starts ``flower-superlink`` and ``flower-supernode``
processes (each in its own process group, so their ``flwr-serverapp`` /
``flwr-clientapp`` children go with them), records their PIDs in
``deployment.json``, and stops them all — also when a test fails. Runtime
dependency installation is disabled on the SuperLink: the machines already have
hetfed and torch, and ``uv sync`` would pull multi-GB CUDA wheels.

Secure by default: the SuperLink serves TLS with a certificate from the
deployment's own CA (``credentials/``, made by :mod:`hetfed.flower.security`, or
the CA already there) and admits only SuperNodes whose keys were registered
(``--enable-supernode-auth`` + ``flwr supernode register``). ``secure=False`` is
the explicit opt-out, refused on an address other than loopback unless
``allow_insecure_remote`` says the user means it.

:func:`run_on_deployment` submits a hetfed config with ``flwr run`` to a
SuperLink (this one, or one named in a Flower config file). The Flower App it
submits is written by :func:`write_app`: a ``pyproject.toml`` naming hetfed's
ServerApp and ClientApp (no code is copied: every machine has hetfed installed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hetfed.errors import ConfigError, RunError
from hetfed.flower.security import WILDCARD, ensure_credentials
from hetfed.processes import descendants, process_alive, signal_all

APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "hetfed-flower-app"
version = "1.0.0"
description = "hetfed's algorithms as a Flower App (hetfed must be installed where it runs)"
license = "Apache-2.0"
# empty on purpose: hetfed and torch are installed on every machine; a SuperLink that
# installed dependencies at run time would pull CUDA builds of torch
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "hetfed"

[tool.flwr.app.components]
serverapp = "hetfed.flower.server_app:app"
clientapp = "hetfed.flower.lean_app:app"

[tool.flwr.app.config]
config-yaml = ""
out = ""
resume = false
report = true
"""

CONNECTION = "hetfed-local"
#: how often Flower's SuperExec — the process a SuperLink or SuperNode starts to launch a ServerApp or ClientApp
#: process per task — looks for new tasks, in seconds (``flwr/supercore/superexec/run_superexec.py``: 1 s unless
#: this environment variable says otherwise) and the range Flower accepts. A deployment passes
#: :attr:`LocalDeployment.superexec_poll` when given; left to Flower's 1 s otherwise, the fastest measured on a
#: 2-core machine (4 SuperNodes: Flower's own minimal round 5.2 s at 1 s, 6.3 s at 0.1 s, 7.9 s at 0.01 s — the
#: polling processes take the cores the ClientApps need; docs/flower.md).
SUPEREXEC_POLL, SUPEREXEC_POLL_RANGE = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL", (0.01, 60.0)


def write_app(directory: str | Path) -> Path:
    """Write the hetfed Flower App (a pyproject.toml) into ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text(APP_PYPROJECT)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listened_on(host: str, port: int) -> bool:
    """Whether a process accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        return s.connect_ex((host, port)) == 0


def _bin(name: str) -> str:
    """A Flower executable next to this Python (the venv's), else on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def _wait_for_port(port: int, timeout: float, proc: subprocess.Popen, what: str, log: Path,
                   host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunError(f"{what} exited with status {proc.returncode}; see {log}")
        if _listened_on(host, port):
            return
        time.sleep(0.2)
    raise RunError(f"{what} did not listen on {host}:{port} within {timeout:g} s; see {log}")


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def read_node_configs(path: str | Path) -> list[str]:
    """Each SuperNode's ``--node-config`` from a file of one line a node — as ``hetfed partition --export`` writes
    ``nodes.txt``: ``--node-config '<config>'`` (shell-quoted), or the config alone; blank lines and lines that start
    with ``#`` skipped."""
    import shlex

    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"--node-configs {str(p)!r} cannot be read ({err.strerror}): expected a file of one "
                          "--node-config a SuperNode, such as the nodes.txt of hetfed partition --export") from None
    configs = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if not text.startswith("--node-config"):  # the config alone, as flower-supernode is given it
            configs.append(text)
            continue
        try:
            words = shlex.split(text)
        except ValueError as err:
            raise ConfigError(f"--node-configs {str(p)!r} line {number}: {err}") from None
        if len(words) != 2:
            raise ConfigError(f"--node-configs {str(p)!r} line {number} is {text!r}: expected one node config, "
                              "--node-config 'data=\"FILE\" label=\"y\" …' (quoted)")
        configs.append(words[1])
    if not configs:
        raise ConfigError(f"--node-configs {str(p)!r} holds no node config: expected one line a SuperNode")
    return configs


@dataclass
class LocalDeployment:
    """SuperLink + ``n_nodes`` SuperNodes on this machine, started and stopped by PID."""

    directory: Path
    n_nodes: int
    port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    #: TLS + registered SuperNode keys (the default); False runs every process with ``--insecure``
    secure: bool = True
    #: where the SuperLink listens (the SuperNodes here reach it on loopback)
    host: str = "127.0.0.1"
    allow_insecure_remote: bool = False
    #: each node's ``--node-config`` (default: ``partition-id=P num-partitions=K``)
    node_configs: list[str] | None = None
    #: seconds between the SuperExecs' looks for new tasks (:data:`SUPEREXEC_POLL`; None: the environment's
    #: value, else Flower's 1 s)
    superexec_poll: float | None = None

    @property
    def flwr_home(self) -> Path:
        return self.directory / "flwr-home"

    @property
    def credentials_dir(self) -> Path:
        return self.directory / "credentials"

    @property
    def reach(self) -> str:
        """The host this machine's SuperNodes and ``flwr`` connect to (loopback when listening everywhere)."""
        if self.host in (*WILDCARD, *LOOPBACK):
            return "127.0.0.1"
        return self.host

    @property
    def address(self) -> str:
        return f"{self.reach}:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment ``flwr`` commands need: this deployment (``FLWR_HOME``), and Flower's own
        executables on PATH — the SuperLink and SuperNodes start ``flower-superexec`` and
        ``flwr-clientapp`` by name, which fails when the venv is used without being activated; the deployment's
        own ``flwr-clientapp`` first (:meth:`write_clientapp`) — and, when given, how often their SuperExecs look
        for a message to start a process for (:data:`SUPEREXEC_POLL`)."""
        path = os.pathsep.join([str(self.bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        poll = {} if self.superexec_poll is None else {SUPEREXEC_POLL: f"{self.superexec_poll:g}"}
        return {**os.environ, **poll, "FLWR_HOME": str(self.flwr_home), "PATH": path,
                "HETFED_WORKER_DIR": str(self.workers_dir)}

    @property
    def bin_dir(self) -> Path:
        """Where this deployment's own ``flwr-clientapp`` is (:meth:`write_clientapp`), first on its ``PATH``."""
        return self.directory / "bin"

    def write_clientapp(self) -> None:
        """A ``flwr-clientapp`` that runs Flower's own with this Python, without importing the SuperNode's command
        line it never runs (:mod:`hetfed.flower.clientapp_process`: ~0.55 CPU-s less a message on 2 cores)."""
        from hetfed.flower import clientapp_process

        self.bin_dir.mkdir(exist_ok=True)
        shim = self.bin_dir / "flwr-clientapp"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{clientapp_process.__file__}" "$@"\n')
        shim.chmod(0o755)

    @property
    def workers_dir(self) -> Path:
        """Where this deployment's SuperNodes keep their persistent workers (:mod:`hetfed.flower.worker`)."""
        return self.directory / "workers"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.directory / f"{name}.log"
        proc = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                env=self.env(), start_new_session=True)
        self.pids[name] = proc.pid
        self._save()
        return proc

    def _save(self) -> None:
        (self.directory / "deployment.json").write_text(json.dumps(
            {"port": self.port, "n_nodes": self.n_nodes, "pids": self.pids, "connection": CONNECTION,
             "secure": self.secure, "host": self.host}, indent=2))

    def check(self) -> None:
        """Refuse an unencrypted SuperLink that other machines can reach, unless asked for explicitly, a SuperExec
        poll Flower would refuse, and a port that is not one or that something listens on already (the SuperLink
        would fail to bind it, and the wait for its port would find the other listener: a deployment reported
        started with no SuperLink)."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not allowed: expected a TCP port from 1 to 65535 (or none: a "
                              "free one is chosen)")
        if self.port and _listened_on(self.reach, self.port):
            raise ConfigError(f"--port {self.port} is not allowed: something on {self.reach} listens on it already; "
                              "expected a free port (or none: a free one is chosen)")
        low, high = SUPEREXEC_POLL_RANGE
        if self.superexec_poll is not None and not low <= self.superexec_poll <= high:
            raise ConfigError(f"--superexec-poll {self.superexec_poll:g} is not allowed: expected seconds between "
                              f"{low:g} and {high:g} (Flower's {SUPEREXEC_POLL})")
        if not self.secure and self.host not in LOOPBACK and not self.allow_insecure_remote:
            raise ConfigError(
                f"--insecure with --host {self.host!r} is not allowed: every model update would cross the network "
                "unencrypted and any machine could join as a SuperNode; expected a loopback host "
                f"({', '.join(LOOPBACK)}), or drop --insecure (TLS and SuperNode keys are made for you), or pass "
                "--allow-insecure-remote if this network is trusted")

    def start(self, timeout: float = 60) -> LocalDeployment:
        self.check()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(exist_ok=True)
        self.workers_dir.mkdir(mode=0o700, exist_ok=True)
        self.write_clientapp()
        self.port = self.port or free_port()
        creds = None
        if self.secure:
            names = [self.host, *LOOPBACK]
            if self.host in WILDCARD:  # listening everywhere: other machines use this machine's names
                names += [socket.gethostname(), socket.getfqdn()]
            creds = ensure_credentials(self.credentials_dir, self.n_nodes, names)
            trust = f'root-certificates = "{creds.ca_cert.resolve()}"\n'
        else:
            trust = "insecure = true\n"
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{self.address}"\n{trust}')
        try:
            security = (["--ssl-ca-certfile", str(creds.ca_cert), "--ssl-certfile", str(creds.server_cert),
                         "--ssl-keyfile", str(creds.server_key),
                         "--enable-supernode-auth"] if creds else ["--insecure"])
            link = self._spawn("superlink", [_bin("flower-superlink"), *security,
                                             "--disable-runtime-dependency-installation",
                                             "--host", self.host, "--port", str(self.port)])
            _wait_for_port(self.port, timeout, link, "flower-superlink", self.directory / "superlink.log", self.reach)
            if self.node_configs is not None and len(self.node_configs) != self.n_nodes:
                raise ValueError(f"{len(self.node_configs)} node configs for {self.n_nodes} SuperNodes")
            for k in range(self.n_nodes):
                if creds:
                    self.register(creds.node_keys[k][1])
                    node_security = ["--root-certificates", str(creds.ca_cert),
                                     "--auth-supernode-private-key", str(creds.node_keys[k][0])]
                else:
                    node_security = ["--insecure"]
                self._spawn(f"supernode-{k}", [
                    _bin("flower-supernode"), *node_security, "--superlink", self.address, "--port", str(free_port()),
                    "--node-config", self.node_configs[k] if self.node_configs else f"partition-id={k} "
                                                                                    f"num-partitions={self.n_nodes}",
                ])
        except BaseException:
            self.stop()
            raise
        return self

    def register(self, public_key: Path) -> None:
        """Admit a SuperNode's key (``flwr supernode register``): without it the SuperLink refuses the node."""
        done = subprocess.run([_bin("flwr"), "supernode", "register", str(public_key), CONNECTION], env=self.env(),
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or "registered successfully" not in done.stdout:
            tail = " ".join((done.stdout + done.stderr).strip().splitlines()[-2:])
            raise RunError(f"registering SuperNode key {public_key} with the SuperLink failed (exit "
                           f"{done.returncode}): {tail}")

    def kill_node(self, k: int) -> None:
        """Kill one SuperNode (and its ClientApp processes) — to test failures."""
        pid = self.pids.pop(f"supernode-{k}", None)
        if pid is not None:
            _kill_group(pid, signal.SIGKILL)
            self._save()

    def stop(self, grace: float = 5.0) -> None:
        """Stop every process this deployment started (whole process groups, and every process below them: Flower's
        SuperExecs run in groups of their own, and a ServerApp one of them started for a run in progress outlived
        the deployment, training on), then forget them."""
        below = {d for pid in self.pids.values() for d in descendants(pid)}
        for pid in self.pids.values():
            _kill_group(pid, signal.SIGTERM)
        signal_all(below, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(process_alive(p) for p in (*self.pids.values(), *below)):
            time.sleep(0.1)
        signal_all(below, signal.SIGKILL)
        for pid in self.pids.values():
            _kill_group(pid, signal.SIGKILL)
            _reap(pid)
        self.pids.clear()
        if self.workers_dir.is_dir():  # the nodes' workers leave with their nodes anyway; this is not left to chance
            from hetfed.flower.worker import stop_workers

            stop_workers(self.workers_dir, grace)
        meta = self.directory / "deployment.json"
        if meta.exists():
            meta.unlink()

    @classmethod
    def load(cls, directory: str | Path) -> LocalDeployment:
        meta = Path(directory) / "deployment.json"
        if not meta.is_file():
            raise RunError(f"{str(directory)!r} holds no running deployment (no deployment.json): start one with "
                           "`hetfed flower start DIR --nodes K`")
        data = json.loads(meta.read_text())
        return cls(Path(directory), int(data.get("n_nodes", data.get("n_clients", 0))), int(data["port"]),
                   {k: int(v) for k, v in data["pids"].items()},
                   secure=bool(data.get("secure", False)), host=data.get("host", "127.0.0.1"))

    def __enter__(self) -> LocalDeployment:
        return self.start() if not self.pids else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _reap(pid: int) -> None:
    """Collect a child's exit status (no zombie left); not ours to collect otherwise."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@dataclass(frozen=True)
class SubmittedRun:
    """A finished ``flwr run``: its exit status, its whole output (stdout and stderr, in order) and where
    that output is kept."""

    returncode: int
    stdout: str
    log: Path
    stderr: str = ""  # merged into stdout


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FLOWER_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:")


def flower_level(line: str) -> str | None:
    """The level of one of Flower's own log lines (``INFO :      [ROUND 1]``), None for any other line
    (hetfed's progress and results, which the ServerApp prints and ``flwr run --stream`` relays)."""
    m = _FLOWER_LEVEL.match(_ANSI.sub("", line))
    return m.group(1) if m else None


#: lines of ``flwr run`` itself (no level) that say nothing a user acts on
_FLOWER_CHATTER = ("Successfully installed ",)


def shown(line: str) -> bool:
    """Whether a streamed line belongs on the user's console: hetfed's lines and Flower's errors; the rest
    (Flower's INFO/DEBUG/WARNING chatter) goes to the log file only."""
    if _ANSI.sub("", line).startswith(_FLOWER_CHATTER):
        return False
    return flower_level(line) in (None, "ERROR", "CRITICAL")


def run_log(out: str | Path, app_dir: Path) -> Path:
    """Where ``flwr run``'s whole output is kept while the run lives (moved into ``out`` when it is here)."""
    return app_dir / f"{Path(out).name}.flwr-run.log"


def stop_submitted(lines: list[str], env: dict[str, str], connection: str, proc: subprocess.Popen,
                   wait: float = 60.0) -> None:
    """The run that ``flwr run`` (``proc``, its output so far in ``lines``) started, stopped on its SuperLink with
    Flower's own ``flwr stop``: Flower's ``flwr run --stream`` stops only streaming on Ctrl-C, and the ServerApp would
    go on training the federation, writing the run directory that the user was told had stopped. The ServerApp marks
    its run failed on the way out; ``proc`` ends with the run (killed after ``wait`` seconds)."""
    started = next((m for line in lines if (m := re.search(r"Successfully started run (\d+)", line))), None)
    if started is not None:
        sys.stderr.write(f"stopping Flower run {started[1]} on the SuperLink (flwr stop) …\n")
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run([_bin("flwr"), "stop", started[1], connection], env=env, capture_output=True,
                           timeout=wait)
    try:
        proc.wait(timeout=wait if started is not None else 0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_on_deployment(config, out: str | Path, env: dict[str, str], connection: str = CONNECTION,
                      app_dir: str | Path | None = None, timeout: float | None = None,
                      on_line: Callable[[str], object] | None = None, resume: bool = False,
                      report: bool = True) -> SubmittedRun:
    """Submit ``config`` with ``flwr run`` to a SuperLink; the ServerApp writes the run directory ``out``.

    Every line ``flwr run --stream`` relays is written to a log file as it comes (``flwr-run.log`` in
    ``out`` at the end, when ``out`` is on this machine) and passed to ``on_line`` (the CLI shows hetfed's
    lines and Flower's errors). ``resume``: ``out`` is a killed run of ``config``; the ServerApp continues it
    from its last checkpoint (``train.checkpoint_every``). ``report``: the ServerApp draws the run's figures and
    report.html at the end (False: ``hetfed flower run --no-report``; ``hetfed report DIR`` draws them later).
    """
    from hetfed.config import dump_config

    workdir = Path(app_dir) if app_dir else Path(out).parent / ".hetfed-flower-app"
    write_app(workdir)
    overrides = workdir / "run-config.toml"
    overrides.write_text(f"config-yaml = {json.dumps(dump_config(config))}\nout = "
                         f"{json.dumps(str(Path(out).resolve()))}\n"
                         f"resume = {'true' if resume else 'false'}\nreport = {'true' if report else 'false'}\n")
    cmd = [_bin("flwr"), "run", str(workdir), connection, "--run-config", str(overrides), "--stream"]
    log_path = run_log(out, workdir) if not resume else Path(out) / "flwr-run.resumed.log"
    lines: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                log.write(line)
                log.flush()
                if on_line is not None:
                    on_line(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (hetfed's Terminated): the run on the federation stops too
            stop_submitted(lines, env, connection, proc)
            raise
        finally:
            reader.join(timeout=10)
    if Path(out).is_dir() and not resume:
        log_path = Path(shutil.move(str(log_path), Path(out) / "flwr-run.log"))
    return SubmittedRun(rc, "".join(lines), log_path)
