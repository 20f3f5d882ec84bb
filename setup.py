"""Ship the top-level templates/ and playbooks/ inside the wheel, as mlxops/_data/.

The repository keeps them at the top of the checkout (docs/architecture.md), where a person
finds them; an installed mlxops finds them through mlxops.paths either way.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithData(build_py):
    def run(self):
        super().run()
        for name in ("templates", "playbooks"):
            target = Path(self.build_lib) / "mlxops" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(HERE / name, target)


setup(cmdclass={"build_py": BuildWithData})
