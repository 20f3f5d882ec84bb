"""Playbooks: a small Ansible-like task list, loaded and validated (:mod:`.load`) before
any host is contacted, then run over hosts (:mod:`.run`)."""

from mlxops.playbook.load import (
    Play,
    PlayTask,
    load_playbook,
    parse_playbook,
    parse_tag_list,
    selected,
)
from mlxops.playbook.run import (
    Callbacks,
    PlayResult,
    TaskReport,
    evaluate_when,
    outcome_of,
    run_play,
    when_context,
)

__all__ = ["Callbacks", "Play", "PlayResult", "PlayTask", "TaskReport", "evaluate_when",
           "load_playbook", "outcome_of", "parse_playbook", "parse_tag_list", "run_play",
           "selected", "when_context"]
