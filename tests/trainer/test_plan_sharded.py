"""The memory plan's sharded terms (ZeRO-1, trainer/plan.py) and the all_gather's cost
predicted from the bench (planning.py)."""

from __future__ import annotations

from trainer_procs import TINY

from mlxops.bench.results import all_gather_us, gather_source
from mlxops.trainer import plan
from mlxops.trainer.config import load_config


def _cfg(**train) -> object:
    return load_config({**TINY, "train": {**TINY["train"], **train}})


def test_sharded_terms_divide_the_moments_and_bfloat16_master_over_the_ranks():
    cfg = _cfg(dtype="float32")
    p = plan.count_params(cfg)
    z = plan.sharded_terms(cfg, 3)
    assert (z.weights, z.master, z.optimizer, z.gathered) == (4 * p, 0, -(-8 * p // 3), 4 * p)
    assert z.saved == 12 * p - z.state
    zb = plan.sharded_terms(_cfg(dtype="bfloat16"), 4)
    assert (zb.weights, zb.master, zb.optimizer, zb.gathered) == (2 * p, p, 2 * p, 2 * p)


def test_the_peak_falls_by_at_least_the_state_saved_and_the_plan_says_sharded():
    for cfg in (_cfg(dtype="float32"), _cfg(dtype="bfloat16")):
        unsharded, sharded = plan.estimate(cfg, 2, 1, 4), plan.estimate(cfg, 2, 1, 4, shard=True)
        saved = plan.sharded_terms(cfg, 4).saved
        assert sharded.state == unsharded.state - saved
        assert sharded.compute <= unsharded.compute - saved
        assert sharded.update <= unsharded.update - saved
        mp = plan.plan_memory(cfg, 64 * 1024**3, 4, shard=True)
        assert mp.sharded and mp.optimizer_bytes == plan.sharded_terms(cfg, 4).optimizer
        assert not plan.plan_memory(cfg, 64 * 1024**3, 4).sharded


def test_a_job_that_fits_only_sharded_is_planned_to_fit_sharded():
    cfg = load_config({**TINY, "model": {**TINY["model"], "dims": 512, "layers": 8,
                                         "vocab_size": 32000},
                       "train": {**TINY["train"], "micro_batch": 1, "global_batch": 8}})
    sharded = plan.estimate(cfg, 1, 1, 8, grad_checkpoint=True, shard=True).total
    unsharded = plan.estimate(cfg, 1, 1, 8, grad_checkpoint=True).total
    memory = int((sharded + unsharded) / 2 / plan.CPU_FRACTION)  # a budget between the two
    assert not plan.plan_memory(cfg, memory, 8).fits
    assert plan.plan_memory(cfg, memory, 8, shard=True).fits


def test_the_all_gather_is_predicted_from_the_bench_s_own_gather_sweep():
    old = {"fit": {"a_us": 100.0, "b_us_per_byte": 0.001}, "ranks": 2}
    new = {**old, "all_gather_fit": {"a_us": 40.0, "b_us_per_byte": 0.0004}}
    # its own fit, b scaled by what a link carries per byte gathered, (n-1)/n against the
    # bench's 1/2; one call, one a
    assert all_gather_us(new, 1_000_000, 2) == 40.0 + 400
    assert all_gather_us(new, 1_000_000, 4) == 40.0 + 400 * 0.75 / 0.5
    assert gather_source(new) == "all_gather"
    # a bench saved before the gather sweep: from its all-reduce fit, half its bus factor
    assert all_gather_us(old, 1_000_000, 2) == 100.0 + 1000 * 0.5
    assert all_gather_us(old, 1_000_000, 4) == 100.0 + 1000 * 0.75
    assert gather_source(old) == "all_sum"
    assert all_gather_us(new, 10, 1) == 0.0
    assert all_gather_us({"fit": None, "ranks": 2}, 10, 2) is None
    assert gather_source({"fit": None, "ranks": 2}) is None


def _job(tmp_path, dims: int) -> object:
    import yaml

    from mlxops.jobs.spec import load_job

    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "a": {"ansible_host": "10.0.0.1"}, "b": {"ansible_host": "10.0.0.2"},
        "c": {"ansible_host": "10.0.0.3"}, "d": {"ansible_host": "10.0.0.4"}}}}))
    (tmp_path / "job.yml").write_text(yaml.safe_dump({
        "name": "big", "inventory": "inv.yml", "trainer": {
            "model": {"dims": dims, "layers": 8, "heads": 8, "vocab_size": 32000,
                      "seq_len": 64},
            "train": {"global_batch": 4, "micro_batch": 1, "grad_checkpoint": True}}}))
    return load_job(tmp_path / "job.yml")


def _planned(tmp_path, monkeypatch, spec, gb: float):
    from dataclasses import replace

    from mlxops.hostfacts import HostFacts
    from mlxops.planning import plan_job
    from mlxops.tasks.facts import save_facts
    from mlxops.transport import Connector

    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    for host in "abcd":  # illustrative sizes, cached as provision would
        save_facts(host, replace(HostFacts.unknown(), memory_bytes=int(gb * 2**30),
                                 system="Linux"))
    with Connector() as connector:  # every host's facts are cached: nothing is asked
        plans, results = plan_job(spec, connector)
    assert results.exit_code == 0
    return plans


def test_mlxops_plan_says_sharding_makes_a_job_fit_and_what_its_all_gather_costs(
        tmp_path, monkeypatch):
    from mlxops.bench.results import save
    from mlxops.cli.plan import sharded_notes
    from mlxops.planning import step_estimate

    spec = _job(tmp_path, 1024)
    cfg = spec.workload.config
    sharded = plan.estimate(cfg, 1, 1, 4, grad_checkpoint=True, shard=True).total
    unsharded = plan.estimate(cfg, 1, 1, 4, grad_checkpoint=True).total
    plans = _planned(tmp_path, monkeypatch, spec,
                     (sharded + unsharded) / 2 / plan.CPU_FRACTION / 2**30)
    assert not any(p.plan.fits for p in plans)
    assert all(p.sharded.fits and p.sharded.sharded for p in plans)
    step = step_estimate(spec, plans)
    assert step["all_gather"] == {"bytes": 4 * plans[0].plan.params, "predicted_us": None,
                                  "fit_of": None}
    notes = sharded_notes(plans, step)
    assert notes[0].startswith("fits with the optimizer state sharded over the ranks "
                               "(ZeRO-1): rank peak "), notes
    assert "no 'mlxops bench' of these hosts yet" in notes[1]
    # with a bench of these hosts saved before its gather sweep: from its all-reduce fit,
    # and the note says to rerun it
    from types import SimpleNamespace
    info = {"ranks": 4, "fit": {"a_us": 100.0, "b_us_per_byte": 0.001}}
    _save_bench(SimpleNamespace(hosts=list("abcd"), allreduce_info=info), save)
    step = step_estimate(spec, plans)
    want = all_gather_us(info, 4 * plans[0].plan.params, 4)
    assert step["all_gather"]["predicted_us"] == want
    assert step["all_gather"]["fit_of"] == "all_sum"
    assert (f"~{want / 1e3:.3g} ms a step (from the bench's all-reduce: no all_gather sweep "
            "in it, rerun 'mlxops bench')") in sharded_notes(plans, step)[1]
    # a newer bench with its all_gather sweep: from that
    info = {**info, "all_gather_fit": {"a_us": 50.0, "b_us_per_byte": 0.0004}}
    _save_bench(SimpleNamespace(hosts=list("abcd"), allreduce_info=info), save)
    step = step_estimate(spec, plans)
    want = all_gather_us(info, 4 * plans[0].plan.params, 4)
    assert step["all_gather"] == {"bytes": 4 * plans[0].plan.params, "predicted_us": want,
                                  "fit_of": "all_gather"}
    assert sharded_notes(plans, step)[1].endswith(f"~{want / 1e3:.3g} ms a step (from the "
                                                  "bench)")
    doc = plans[0].to_dict()
    assert doc["sharded"] is False and doc["sharded_plan"]["sharded"] is True


def _save_bench(bench, save) -> None:
    """A bench result of these hosts, as mlxops bench saves it."""
    from mlxops.bench.results import BenchResult

    saved = BenchResult(inventory="inv.yml", hosts=bench.hosts, options={}, time=1.8e9)
    saved.allreduce_info = bench.allreduce_info
    save(saved)


def test_a_job_that_fits_unsharded_is_not_sharded(tmp_path, monkeypatch):
    from mlxops.cli.plan import sharded_notes
    from mlxops.planning import step_estimate

    spec = _job(tmp_path, 256)
    plans = _planned(tmp_path, monkeypatch, spec, 64)
    assert all(p.plan.fits and p.sharded is None for p in plans)
    assert step_estimate(spec, plans)["all_gather"] is None
    assert sharded_notes(plans, step_estimate(spec, plans)) == []
