"""The tiny models and data every fine-tuning test uses, built once per session."""

import pytest

from mlxops.devtools.tinymodels import TinySet, build_all


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinySet:
    return build_all(tmp_path_factory.mktemp("tiny"))
