from pathlib import Path

import pytest

from hetfed.config import Config, load_config

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    load_config(path)


def test_default_config_file_is_the_builtin_default():
    """`hetfed run` with no arguments and configs/default.yaml are the same job."""
    from_file = load_config(Path(__file__).parent.parent / "configs" / "default.yaml")
    assert from_file.model_dump() == Config().model_dump()
