"""``mlxops selftest``: the suite's scenarios run on the user's own nodes, one summary to
paste into a bug report (:mod:`~mlxops.selftest.run` the steps, :mod:`~mlxops.selftest.job`
the job with its killed rank, :mod:`~mlxops.selftest.summary` the record and its text)."""
