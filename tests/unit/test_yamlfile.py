"""The one YAML reader (mlxops.yamlfile), cases as data under data/yaml/.

``good/X.yml`` loads to ``good/X.json``; each ``bad/X.yml`` says on its first line the one
message it gives (``# expect: X.yml: KEY: what is wrong``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxops.errors import UserError
from mlxops.yamlfile import read_yaml

DATA = Path(__file__).parent / "data" / "yaml"
GOOD = sorted((DATA / "good").glob("*.yml"))
BAD = sorted((DATA / "bad").glob("*.yml"))


@pytest.mark.parametrize("case", GOOD, ids=lambda p: p.stem)
def test_good_files_load_as_expected(case: Path) -> None:
    assert read_yaml(case) == json.loads(case.with_suffix(".json").read_text())


@pytest.mark.parametrize("case", BAD, ids=lambda p: p.stem)
def test_bad_files_give_one_line_naming_file_and_key(case: Path) -> None:
    expect = case.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(UserError) as info:
        read_yaml(case)
    assert str(info.value) == f"{case.parent}/{expect}"


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"/nope\.yml: no such file$"):
        read_yaml(tmp_path / "nope.yml")
    with pytest.raises(UserError, match=r": is a directory, not a playbook$"):
        read_yaml(tmp_path, "a playbook")
    (tmp_path / "latin1.yml").write_bytes(b"a: \xe9\n")
    with pytest.raises(UserError, match=r"latin1\.yml: cannot read: "):
        read_yaml(tmp_path / "latin1.yml")
