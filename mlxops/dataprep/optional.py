"""The optional dependencies of ``mlxops data prepare``: the ``data`` extra.

``pip install 'mlxops[data]'`` brings them: ``tokenizers`` (a ``tokenizer.json``,
``--train-bpe``), ``pyarrow`` (Parquet and ``datasets.save_to_disk`` inputs, read as the
Arrow files they are) and ``tiktoken``. Byte-level tokens of text and JSONL need none. A
missing one is a one-line error naming the extra, never an ImportError's traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mlxops.errors import UserError

EXTRA = "data"
PACKAGES = {"tokenizers": "tokenizers", "pyarrow": "pyarrow", "tiktoken": "tiktoken"}


def need(module: str, what: str) -> ModuleType:
    """``module`` imported, or a UserError: ``{what} needs tokenizers: pip install ...``."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{what} needs the {PACKAGES.get(top, top)} package: "
                        f"pip install 'mlxops[{EXTRA}]'") from None
