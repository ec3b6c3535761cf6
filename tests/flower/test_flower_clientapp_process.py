"""A local deployment's ``flwr-clientapp`` (:mod:`hetfed.flower.clientapp_process`): Flower's own command, found first
on the SuperNodes' ``PATH``, without the SuperNode's command line that Flower's entry point imports for nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytest.importorskip("flwr")


def test_the_deployments_flwr_clientapp_is_flowers_command_without_the_supernodes_imports(tmp_path):
    from hetfed.flower.deploy import LocalDeployment

    dep = LocalDeployment(tmp_path / "dep", 1)
    dep.directory.mkdir()
    dep.write_clientapp()
    found = shutil.which("flwr-clientapp", path=dep.env()["PATH"])
    assert found == str(dep.bin_dir / "flwr-clientapp")
    ours = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=120)
    flowers = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'flwr-clientapp'; "
                              "from flwr.supernode.cli import flwr_clientapp; flwr_clientapp()", "--help"],
                             capture_output=True, text=True, timeout=120)
    assert ours.returncode == flowers.returncode == 0, ours.stderr
    # the same arguments: Flower's own parser, from its usage line on (wrapped after the program's name)
    assert ours.stdout.split("[-h]", 1)[1].split() == flowers.stdout.split("[-h]", 1)[1].split()
    check = ("import runpy, sys; path, sys.argv = sys.argv[1], ['flwr-clientapp', '--help']\n"
             "try:\n    runpy.run_path(path, run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic', 'uvicorn', 'hetfed'}),"
             " 'flwr.supernode.cli.flwr_clientapp' in sys.modules)")
    from hetfed.flower import clientapp_process

    imported = subprocess.run([sys.executable, "-c", check, clientapp_process.__file__], capture_output=True, text=True,
                              timeout=120)
    assert imported.stdout.strip().splitlines()[-1] == "[] True", imported.stdout + imported.stderr
