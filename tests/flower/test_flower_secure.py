"""A Flower deployment is secure by default: TLS from the deployment's own CA, only registered SuperNodes (#26 §4)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time

import pytest

pytest.importorskip("flwr")


def test_credentials_chain_and_keys(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtensionOID

    from hetfed.flower.security import ensure_credentials

    creds = ensure_credentials(tmp_path / "c", 2, ["10.0.0.7", "node.example", "0.0.0.0"])
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises when the CA did not sign it
    san = server.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"10.0.0.7"}  # 0.0.0.0 is no name
    assert san.get_values_for_type(x509.DNSName) == ["node.example"]
    for private, public in creds.node_keys:  # what flower-supernode and `flwr supernode register` load
        key = serialization.load_ssh_private_key(private.read_bytes(), None)
        pub = serialization.load_ssh_public_key(public.read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
        assert pub.public_numbers() == key.public_key().public_numbers()
        assert oct(private.stat().st_mode & 0o777) == "0o600"
    assert oct(creds.server_key.stat().st_mode & 0o777) == "0o600"
    # a second deployment in the same directory keeps the CA and the node keys (a CA given by the user is used)
    before = creds.ca_cert.read_bytes(), creds.node_keys[0][0].read_bytes()
    again = ensure_credentials(tmp_path / "c", 3)
    assert (again.ca_cert.read_bytes(), again.node_keys[0][0].read_bytes()) == before and len(again.node_keys) == 3
    (tmp_path / "c" / "ca.key").unlink()
    from hetfed.errors import RunError

    with pytest.raises(RunError, match="only one of ca.crt and ca.key"):
        ensure_credentials(tmp_path / "c", 1)


def _online(dep) -> set[int]:
    from hetfed.flower.deploy import CONNECTION, _bin

    out = subprocess.run([_bin("flwr"), "supernode", "list", CONNECTION, "--format", "json"], env=dep.env(),
                         capture_output=True, text=True, timeout=60).stdout
    nodes = json.loads(out[out.index("{"):]).get("nodes", [])
    return {int(n["node-id"]) for n in nodes if n.get("status") == "online"}


@pytest.mark.slow
def test_secure_deployment_speaks_tls_and_refuses_an_unregistered_node(tmp_path):
    from hetfed.flower.deploy import LocalDeployment
    from hetfed.flower.security import make_node_key

    with LocalDeployment(tmp_path / "dep", 2) as dep:
        assert dep.secure
        deadline = time.monotonic() + 90
        while len(_online(dep)) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert len(_online(dep)) == 2  # both registered nodes are admitted
        # the SuperLink speaks TLS with a certificate from the deployment's CA …
        ctx = ssl.create_default_context(cafile=str(dep.credentials_dir / "ca.crt"))
        with socket.create_connection(("127.0.0.1", dep.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
        # … which nobody else trusts, and it does not answer plain HTTP
        with socket.create_connection(("127.0.0.1", dep.port),
                                      timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
        with socket.create_connection(("127.0.0.1", dep.port), timeout=10) as plain:
            plain.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert not plain.recv(64).startswith(b"HTTP/")
        # a SuperNode whose key was never registered is refused: it exits, and never comes online
        private, _ = make_node_key(tmp_path, "stranger")
        _assert_refused(dep, tmp_path / "stranger.log", ["--root-certificates", str(dep.credentials_dir / "ca.crt"),
                                                         "--auth-supernode-private-key", str(private)])
        # and an insecure SuperNode cannot talk to it at all
        _assert_refused(dep, tmp_path / "plain.log", ["--insecure", "--max-retries", "2"])


def _assert_refused(dep, log_path, security: list[str]) -> None:
    """Start one more SuperNode with ``security`` flags: it must exit with an error, and the SuperLink must still
    list only the deployment's own nodes."""
    from hetfed.flower.deploy import _bin, free_port

    with open(log_path, "w") as log:
        node = subprocess.Popen([_bin("flower-supernode"), *security, "--superlink", dep.address, "--port",
                                 str(free_port())],
                                env=dep.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert node.wait(timeout=120) != 0
    finally:
        if node.poll() is None:
            os.killpg(node.pid, 9)
    assert len(_online(dep)) == 2


def test_insecure_on_a_network_address_is_refused(tmp_path, capsys):
    from hetfed.cli import main

    target = tmp_path / "dep"
    assert main(["flower", "start", str(target), "--clients", "1", "--insecure", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--insecure with --host '0.0.0.0' is not allowed" in err and "--allow-insecure-remote" in err
    assert len(err.strip().splitlines()) == 1
    assert not target.exists()  # nothing half-written


def test_a_superexec_poll_flower_would_refuse_is_refused_before_anything_starts(tmp_path, capsys):
    from hetfed.cli import main

    target = tmp_path / "dep"
    assert main(["flower", "start", str(target), "--nodes", "1", "--superexec-poll", "0"]) == 2
    err = capsys.readouterr().err
    assert "--superexec-poll 0 is not allowed: expected seconds between 0.01 and 60" in err
    assert len(err.strip().splitlines()) == 1
    assert not target.exists()  # nothing half-written


@pytest.mark.parametrize("port", ["99999", "-1", "taken"])
def test_a_port_that_is_not_one_or_is_taken_is_refused_before_anything_starts(tmp_path, capsys, port):
    """`hetfed flower start DIR --port 99999` ended in a traceback (exit 1) after writing DIR; with a port another
    process listened on, it reported the deployment started while its SuperLink had failed to bind."""
    from hetfed.cli import main

    target = tmp_path / "dep"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        given = str(other.getsockname()[1]) if port == "taken" else port
        assert main(["flower", "start", str(target), "--nodes", "1", "--insecure", "--port", given]) == 2
    err = capsys.readouterr().err
    expected = "listens on it already" if port == "taken" else "expected a TCP port from 1 to 65535"
    assert f"error: --port {given} is not allowed: " in err and expected in err, err
    assert len(err.strip().splitlines()) == 1
    assert not target.exists()  # nothing half-written
