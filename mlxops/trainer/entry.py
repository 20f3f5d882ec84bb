"""The command line of a rank's program: ``--config FILE [--set KEY=VALUE ...] [--resume]
[--print-config]``, the same for the bundled trainer and the fine-tuning loop.

Exit codes, the contract the watchdog reads (docs/trainer.md): 0 all steps done; 2 a bad
config or argument (said in one line); 1 any other failure. mlx (and mlx-lm) are imported
only once the config is good: ``--help`` and a config error never pay for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any


def run(argv: list[str] | None, *, prog: str, description: str, epilog: str, what: str,
        set_example: str, load_config: Callable[[str, list[str]], Any],
        config_error: type[Exception], start: Callable[[Any, bool], None]) -> int:
    """Parse ``argv``, load the config, and ``start(config, resume)``; the exit code.

    ``start`` imports what it runs itself (late, see the module's docstring).
    """
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, metavar="FILE",
                   help=f"{what} config (JSON, or YAML when PyYAML is importable)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help=f"override a config key, e.g. {set_example} (value parsed as JSON "
                        "when it parses; repeatable)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in out (starts at step "
                        "0 if there is none); without it an out holding checkpoints is refused")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config as JSON and exit")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except config_error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from .distributed import DistributedError
    from .errors import TrainerError

    try:
        start(cfg, args.resume)
    except config_error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (DistributedError, TrainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
