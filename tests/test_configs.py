from pathlib import Path

import pytest

from hetfed.config import Config, load_config

CONFIG_DIR = Path(__file__).parent.parent / "configs"
CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))  # configs/paper/ too


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(CONFIG_DIR).as_posix())
def test_every_shipped_config_validates(path):
    load_config(path)


def test_default_config_file_is_the_builtin_default():
    """`hetfed run` with no arguments and configs/default.yaml are the same job."""
    from_file = load_config(Path(__file__).parent.parent / "configs" / "default.yaml")
    assert from_file.model_dump() == Config().model_dump()
