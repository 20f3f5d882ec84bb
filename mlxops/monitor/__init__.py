"""Monitoring a run: the controller's metrics mirror of a job and the three views on it.

* :mod:`~mlxops.monitor.files`: the mirror's files beside the job record, read
  incrementally;
* :mod:`~mlxops.monitor.mirror`: feeding it, one ``sample`` node command per host (the
  watchdog's :class:`~mlxops.monitor.mirror.Feeder`, and on demand);
* :mod:`~mlxops.monitor.data`: the mirror as one job document (``mlxops report --json``);
  :mod:`~mlxops.monitor.alerts` (the job file's ``alerts:``) and
  :mod:`~mlxops.monitor.bench` (the last ``mlxops bench``) for it;
* :mod:`~mlxops.monitor.live`: ``mlxops monitor``, the terminal view;
* :mod:`~mlxops.monitor.server`: ``mlxops dashboard``, the local web server; its page,
  scripts and style are ``static/`` (shipped in the wheel);
* :mod:`~mlxops.monitor.report`: ``mlxops report``, one self-contained HTML file.

For people: README.md, "Watching a run"; docs/cli.md; docs/formats.md, "The metrics
mirror".
"""
