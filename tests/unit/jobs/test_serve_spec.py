"""A job's ``serve:`` section (jobs/servespec.py): every key checked at load, one line naming
the file and the key; what the ranks run (jobs/serving.py); the record keeps it."""

from __future__ import annotations

import shlex

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.jobs.placement import NodePaths, Rank, rank_script
from mlxops.jobs.record import JobRecord, launched_job
from mlxops.jobs.servespec import check_hosts
from mlxops.jobs.serving import prepare_lines, server_argv
from mlxops.jobs.spec import load_job

INVENTORY = {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"}}}}
SERVE = {"name": "chat", "inventory": "inv.yml", "serve": {"model": "/models/tiny"}}


def write(tmp_path, serve=None, **top):
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(INVENTORY))
    job = {**SERVE, **top}
    if serve is not None:
        job["serve"] = serve
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_defaults_a_loopback_server_on_8080(tmp_path):
    spec = load_job(write(tmp_path)).workload.spec
    assert (spec.model, spec.model_job, spec.port, spec.bind) == ("/models/tiny", None, 8080,
                                                                  "127.0.0.1")
    assert (spec.parallel, spec.probe_timeout, spec.start_timeout) == (None, 30.0, 300.0)
    assert spec.options == {} and spec.export_arch == "llama"


def test_a_training_jobs_checkpoint_and_the_servers_options(tmp_path):
    spec = load_job(write(tmp_path, {"model": {"job": "run1", "step": 200}, "port": 9000,
                                     "parallel": "pipeline", "max_tokens": 64, "temp": 0,
                                     "use_default_chat_template": True})).workload.spec
    assert (spec.model, spec.model_job, spec.model_step) == (None, "run1", 200)
    assert spec.options == {"max_tokens": 64, "temp": 0.0, "use_default_chat_template": True}
    assert spec.export_arch == "qwen2"  # mlx-lm's llama cannot pipeline


BAD = [
    ({"model": "/m", "modle": 1}, "serve.modle: unknown key"),
    ({"port": 8080}, "serve.model: required"),
    ({"model": ""}, "serve.model: must be a directory"),
    ({"model": {"job": "x", "stpe": 3}}, "serve.model.stpe: unknown key"),
    ({"model": {"job": 3}}, "serve.model.job: must name a job"),
    ({"model": {"job": "x", "step": 0}}, "serve.model.step: must be a checkpoint's step"),
    ({"model": {"job": "x", "best": "yes"}}, "serve.model.best: must be true or false"),
    ({"model": {"job": "x", "best": True, "step": 3}}, "serve.model.best: goes without"),
    ({"model": "/m", "parallel": "data"}, "serve.parallel: must be pipeline or tensor"),
    ({"model": "/m", "port": 80}, "serve.port: must be a port number from 1024"),
    ({"model": "/m", "port": True}, "serve.port: must be a port number"),
    ({"model": "/m", "bind": "localhost"}, "serve.bind: must be an IP address"),
    ({"model": "/m", "probe_timeout": 0}, "serve.probe_timeout: must be a positive number"),
    ({"model": "/m", "start_timeout": "soon"}, "serve.start_timeout: must be a positive"),
    ({"model": "/m", "max_tokens": "many"}, "serve.max_tokens: must be of kind int"),
    ({"model": "/m", "max_tokens": 0}, "serve.max_tokens: must be positive"),
    ({"model": "/m", "temp": "hot"}, "serve.temp: must be of kind float"),
    ({"model": "/m", "log_level": "LOUD"}, "serve.log_level: must be one of DEBUG"),
    ("just a string", "serve: must be a mapping"),
]


@pytest.mark.parametrize("serve, message", BAD, ids=[m for _, m in BAD])
def test_bad_serve_sections_are_one_line_naming_the_key(tmp_path, serve, message):
    path = write(tmp_path, serve)
    with pytest.raises(UserError) as err:
        load_job(path)
    assert err.value.exit_code == 2
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)
    assert "\n" not in str(err.value)


def test_serve_is_instead_of_a_trainer_or_a_command(tmp_path):
    with pytest.raises(UserError, match="give exactly one of 'trainer:'"):
        load_job(write(tmp_path, command=["python", "x.py"]))


def test_parallel_goes_with_several_hosts(tmp_path):
    one = load_job(write(tmp_path, {"model": "/m"})).workload.spec
    check_hosts(tmp_path / "job.yml", one, ["a"])
    with pytest.raises(UserError, match="serve.parallel: required with 2 hosts"):
        check_hosts(tmp_path / "job.yml", one, ["a", "b"])
    piped = load_job(write(tmp_path, {"model": "/m", "parallel": "tensor"})).workload.spec
    with pytest.raises(UserError, match="serve.parallel: goes with several hosts"):
        check_hosts(tmp_path / "job.yml", piped, ["a"])


def test_a_pipeline_job_may_go_on_with_one_of_its_hosts(tmp_path):
    """``parallel`` is checked against the job's hosts, not those a restart with
    ``exclude_unreachable`` (or ``resume --exclude``) goes on with."""
    from mlxops.jobs.selection import select_hosts

    path = write(tmp_path, {"model": "/m", "parallel": "pipeline"}, hosts="a,b")
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(
        {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"},
                           "b": {"ansible_host": "10.0.0.2"}}}}))
    spec = load_job(path)
    assert [h.name for h in select_hosts(spec, exclude=["b"])] == ["a"]
    alone = load_job(write(tmp_path, {"model": "/m", "parallel": "pipeline"}, hosts="a"))
    with pytest.raises(UserError, match="serve.parallel: goes with several hosts"):
        select_hosts(alone)


def test_the_server_command_line_quotes_what_the_user_wrote(tmp_path):
    spec = load_job(write(tmp_path, {"model": "/models/my model; rm -rf ~", "max_tokens": 32,
                                     "chat_template": "{{ x }} $(id)"})).workload.spec
    paths = NodePaths("/home/u/.mlxops", "chat")
    argv = server_argv(spec, "/venv/bin/python", paths, Rank(0, "a", "10.0.0.1", 20000, 0),
                       world_size=1)
    assert argv == ["/venv/bin/python", "-m", "mlx_lm", "server", "--model",
                    "/models/my model; rm -rf ~", "--host", "127.0.0.1", "--port", "8080",
                    "--chat-template", "{{ x }} $(id)", "--max-tokens", "32"]
    script = rank_script(env={}, argv=argv, paths=paths, cwd=paths.run_dir, rank=0,
                         prepare=prepare_lines(spec, "/venv/bin/python", paths))
    line = next(x for x in script.splitlines() if "mlx_lm" in x)
    # The script's line splits back into exactly these words (after the cache mkdir).
    assert shlex.split(line.split(" && ", 1)[1]) == argv


def test_a_checkpoint_is_exported_on_the_node_before_the_server_starts(tmp_path):
    job = write(tmp_path, {"model": {"job": "run1"}, "parallel": "pipeline"})
    spec = load_job(job).workload.spec
    paths = NodePaths("/r", "chat")
    lines = prepare_lines(spec, "/py", paths)
    assert shlex.split(lines[1]) == ["/py", "-m", "mlxops.trainer.export", "--run-dir",
                                     "/r/runs/run1", "--arch", "qwen2", "--out",
                                     "/r/runs/chat/model"]
    argv = server_argv(spec, "/py", paths, Rank(1, "b", "10.0.0.2", 20001, 0), world_size=2)
    assert argv[argv.index("--model") + 1] == "/r/runs/chat/model" and "--pipeline" in argv
    # Alone after a restart without the other host, the server holds the whole model.
    alone = server_argv(spec, "/py", paths, Rank(0, "a", "10.0.0.1", 20000, 0), world_size=1)
    assert "--pipeline" not in alone and alone == [w for w in argv if w != "--pipeline"]


def test_the_best_checkpoint_is_exported_with_best(tmp_path):
    spec = load_job(write(tmp_path, {"model": {"job": "run1", "best": True}})).workload.spec
    words = shlex.split(prepare_lines(spec, "/py", NodePaths("/r", "chat"))[1])
    assert "--best" in words and "--step" not in words


def test_the_record_keeps_the_serve_section(tmp_path):
    spec = load_job(write(tmp_path, {"model": {"job": "run1"}, "port": 9001, "top_k": 5}))
    record = JobRecord(name="chat", job_file=str(spec.path), inventory=str(spec.inventory),
                       backend="ring", hosts=[], ranks=[], job=launched_job(spec))
    again = JobRecord.from_dict(record.to_dict())
    assert again.workload == spec.workload and again.job_spec().workload == spec.workload
