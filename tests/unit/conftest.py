"""Keeps tests/unit's shared helpers importable from its sub-folders.

The unit tests sit in sub-folders that mirror the package (tests/unit/jobs/ for
mlxops/jobs/, ...; the rule is in docs/testing.md). pytest runs with its default
``--import-mode=prepend`` and there is no ``__init__.py`` under tests/, so each test file's
own folder goes on ``sys.path`` and helpers are imported by bare name
(``from node_answers import ...``). A conftest is collected before the folders below it and
prepend mode puts its own folder on ``sys.path`` first: this file is what puts tests/unit/
there, so a test in tests/unit/jobs/ still finds tests/unit/node_answers.py. Adding
``__init__.py`` files instead would make these folders packages (``tests.unit.jobs``) and
break every bare-name import.
"""
