"""A ``trainer.stages: auto`` job on three sandbox nodes whose memory limits
(mlxops/sandbox/cgroups.py) forbid one node to hold the run: launch reads each node's
memory from its facts (the limit), refuses the job on the largest node alone (exit 2, the
plan's numbers; nothing trained), splits the layers by budget over the three (the middle
node, the smallest, gets fewer), the ranks train as pipeline stages through the run loop,
stop at ``stop_at`` and resume, and resume on the two large nodes; the losses equal one
process holding every layer (the same trainer, ``train.stages: [6]``) bit for bit. On bash
and zsh nodes.

The model is sized to the limits and kept cheap a step (trainer/plan.py, float32): 384
wide, 6 layers, vocabulary 8192, 8 tokens a sequence, 4 micro-batches of one sequence:
16.9M parameters (AdamW's state with them) and few tokens. Planned: 0.44 GiB on one
node, more than the 460 MiB node's budget (80%: 0.36 GiB; one process measured a 479 MiB
MLX peak and 567 MiB resident at this config, above that node's limit too); 3 stages
``[2, 1, 3]`` plan 179, 47 and 226 MiB against budgets of 304, 144 and 368 MiB; the two
large nodes ``[3, 3]`` 226 MiB each. A rank's process holds ~110 MiB beside MLX's arrays,
which each limit leaves room for.

The fine-tuning scenario does the same for a LoRA on an mlx-lm llama (limits 280, 210
and 345 MiB): refused on node3 alone, split ``[2, 1, 3]`` over the three; a kill -9 of a
stage on bash, ``mlxops stop`` + resume and a resume on 2 stages on zsh. Its model is
wide in bytes (331 MB of frozen float32 weights) and cheap a step because a step has 8
tokens: a step costs tokens x parameters, not bytes (docs/pipeline.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import yaml
from job_helpers import BackgroundWatchdog, Hold, run_dir, wait_for_step

from mlxops.errors import UserError
from mlxops.jobs.export import export_run
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.watch import supervise
from mlxops.sandbox import cgroups

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
LIMITS = {"node1": 380 * MiB, "node2": 180 * MiB, "node3": 460 * MiB}
TRAINER = {
    "model": {"dims": 384, "layers": 6, "heads": 4, "vocab_size": 8192, "seq_len": 8,
              "tie_embeddings": False},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 6, "global_batch": 4, "micro_batch": 1, "lr": 1e-2,
              "schedule": "constant", "checkpoint_every": 3, "log_every": 1},
}
#: The longest job's steps: the one-process reference runs them once for the module.
STEPS = 9


@pytest.fixture(autouse=True)
def memory_cgroups():
    why = cgroups.memory_usable()
    if why:
        pytest.skip(f"memory limits: {why}")


def write_job(tmp_path: Path, box, restart: dict | None = None,
              hosts: str = "node1,node2,node3", **train) -> Path:
    trainer = json.loads(json.dumps(TRAINER))
    trainer["train"].update(train)
    trainer["stages"] = "auto"
    job = {"name": "t-pipe", "inventory": str(box.inventory_path),
           "hosts": hosts, "backend": "ring", "trainer": trainer,
           # MLX's own BLAS, as the reference process has: OpenBLAS's kernels sum in
           # another order (the losses then differ from step 2 by ~1e-6)
           "blas": "off",
           "restart": restart or {"max_restarts": 0, "stall_timeout": 180}}
    path = tmp_path / "t-pipe.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def step_losses(metrics: Path) -> dict[int, float]:
    """Step -> loss, from a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in map(json.loads, metrics.read_text().splitlines())}


class OneProcess:
    """One process holding every layer, started beside the job (which waits on its nodes
    more than it computes) and waited for once: ``losses()`` its step -> loss."""

    def __init__(self, out: Path, module: str, config: dict) -> None:
        self.out = out
        path = out.with_suffix(".json")
        path.write_text(json.dumps({**config, "out": str(out)}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--config", str(path)],
            cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._losses: dict[int, float] | None = None

    def losses(self) -> dict[int, float]:
        if self._losses is None:
            _, err = self.proc.communicate(timeout=300)
            assert self.proc.returncode == 0, err[-2000:]
            self._losses = step_losses(self.out / "metrics.jsonl")
        return self._losses


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-process references of the module, each made once for the bash and the zsh
    runs (the same trainer, interpreter and mlx compute the same losses whichever shell the
    node user logs in to): ``reference()`` the trainer's :data:`TRAINER` over
    :data:`STEPS` steps with ``train.stages: [6]`` (its schedule is constant, so a shorter
    job's losses are its first steps'), ``reference("mlxops.finetune", config)`` that
    module on ``config``. Each starts at its first use and is killed at teardown if left."""
    root = tmp_path_factory.mktemp("one-process")
    made: dict[str, OneProcess] = {}

    def start(module: str = "mlxops.trainer", config: dict | None = None) -> OneProcess:
        if module not in made:
            if config is None:
                config = json.loads(json.dumps(TRAINER))
                config["train"].update(steps=STEPS, stages=[6])
            made[module] = OneProcess(root / module.rsplit(".", 1)[-1], module, config)
        return made[module]

    yield start
    for one in made.values():
        if one.proc.poll() is None:
            one.proc.kill()
            one.proc.wait()


def refused_at_load(path: Path, connector) -> str:
    """The one-line error launching job file ``path`` is refused with (exit 2, bad input:
    before any host is touched)."""
    with pytest.raises(UserError) as refused:
        launch(load_job(path), connector, fresh=True)
    assert refused.value.exit_code == 2, refused.value
    return str(refused.value)


def losses(box) -> dict[int, float]:
    return step_losses(run_dir(box, "node1", "t-pipe") / "metrics.jsonl")


@pytest.mark.slow
def test_stages_auto_split_by_memory_train_stop_resume_and_resume_on_two_stages(
        login_sandbox_mut, tmp_path, connector, reference):
    """Refused on node3 alone (the largest node), then on three nodes stopped at 3 and
    resumed on the same split to 6 (nothing copied), then resumed without node2 on 2
    stages: node2's stage checkpoint is copied to node1 and node3 before the ranks start
    (jobs/ckptmove.py) and the 9 steps are one process's losses bit for bit."""
    box = login_sandbox_mut
    for node, limit in LIMITS.items():
        box.set_memory_limit(node, limit)
    steps = {"steps": STEPS}
    one = reference()
    alone = write_job(tmp_path, box, hosts="node3", **steps)
    assert refused_at_load(alone, connector) == (
        f"{alone}: trainer.stages: the model does not fit on 1 hosts even split by memory: "
        "node3: layers 0-5 0.44 of 0.36 GiB")
    spec = load_job(write_job(tmp_path, box, stop_at=3, **steps))
    record = launch(spec, connector, fresh=True)
    split = record.workload.config.train.stages   # what the ranks were given
    assert sum(split) == 6 and split[1] < split[0] and split[1] < split[2], split
    assert record.world_size == 3
    assert supervise(record, connector).state == "finished"
    assert sorted(losses(box)) == [1, 2, 3]

    resumed = launch(load_job(write_job(tmp_path, box, stop_at=6, **steps)), connector,
                     resume=True, previous=load_record("t-pipe"))
    assert resumed.workload.config.train.stages == split
    assert resumed.message == "resumed from step 3"   # the node counts ckpt/stage-<s>/
    assert supervise(resumed, connector).state == "finished"
    for s, node in enumerate(LIMITS):   # each node holds its own stage's checkpoints
        assert [p.name for p in (run_dir(box, node, "t-pipe") / "ckpt").iterdir()
                if p.name.startswith("stage-")] == [f"stage-{s}"]

    copied: list[str] = []
    two = launch(load_job(write_job(tmp_path, box, **steps)), connector, resume=True,
                 exclude=["node2"], previous=load_record("t-pipe"), on_warning=copied.append)
    assert two.workload.config.train.stages == [3, 3] and two.world_size == 2
    assert two.message == "resumed from step 6"
    # node2 held stage 1 (layer 2): node1 takes layer 2 from it, node3 finds its step in
    # stage-1/ (it is stage 1 now); stages 0 and 2 stay where they are.
    assert copied == ["checkpoint part stage-1/step-00000006: node2 -> node1, node3 "
                      "(copied before the ranks start)"]
    assert supervise(two, connector).state == "finished"
    assert losses(box) == one.losses()
    for node in ("node1", "node3"):
        ckpt = run_dir(box, node, "t-pipe") / "ckpt"
        assert (ckpt / "stage-1" / "step-00000006" / "state.json").is_file()
        assert not [p for p in ckpt.iterdir() if p.name.startswith(".")]  # no temporary

    # export: node3's stage of step 9 copied to node1 (rank 0's), merged by name there.
    done = export_run("t-pipe", tmp_path / "exported", connector)
    assert done.step == 9
    exported = mx.load(str(tmp_path / "exported" / "model.safetensors"))
    last = mx.load(str(run_dir(box, "node3", "t-pipe") / "ckpt" / "stage-1" /
                       "step-00000009" / "model.safetensors"))
    assert np.array_equal(exported["model.layers.5.mlp.down_proj.weight"],
                          last["blocks.5.mlp.down.weight"])
    assert np.array_equal(exported["lm_head.weight"], last["head.weight"])


def test_kill_9_of_a_stage_restarts_and_ends_as_one_process(login_sandbox_mut, tmp_path,
                                                           connector, reference):
    """The middle stage's trainer killed with SIGKILL while the job is held after step 5
    (a checkpoint every 3): one restart of the job, from step 3, and the losses of one
    process holding every layer bit for bit."""
    box = login_sandbox_mut
    for node, limit in LIMITS.items():
        box.set_memory_limit(node, limit)
    longer = {"steps": 6, "checkpoint_every": 3}
    one = reference()
    hold = Hold(box, "t-pipe", list(LIMITS), at=5)
    path = write_job(tmp_path, box, restart={"max_restarts": 1, "stall_timeout": 180},
                     **longer)
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "env": hold.env}))
    record = launch(load_job(path), connector, fresh=True)
    watchdog = BackgroundWatchdog(record, connector)
    with hold:
        wait_for_step(record, connector, 5, timeout=240)
        # The middle stage's trainer (the rank's process group leads its wrapper).
        pgid = int((run_dir(box, "node2", "t-pipe") / "rank-1.pid").read_text())
        child = subprocess.run(["pgrep", "-P", str(pgid)], capture_output=True, text=True)
        os.kill(int(child.stdout.split()[0]), signal.SIGKILL)
        hold.release()
    final = watchdog.result(timeout=300)
    assert final.state == "finished", final.to_dict()
    restarts = load_record("t-pipe").restarts
    # Its neighbours fail too (their send/recv lost the peer): one restart of the job.
    assert len(restarts) == 1, restarts
    assert losses(box) == {s: loss for s, loss in one.losses().items() if s <= 6}


#: The fine-tuning scenario's model: mlxops/devtools/tinymodels.py's llama made wide
#: enough in bytes that no one limited node holds it: 6 blocks of 13.6M parameters (1024
#: wide, MLP 3584, 8 heads over 2 key-value heads), untied, float32, 331 MB on disk, all
#: frozen under the LoRA. A step is cheap because it has few tokens (the text data cut to
#: 4 tokens, 2 micro-batches of one example: 8 tokens), not because the model is small:
#: its cost is tokens x parameters.
FT_SIZES = {"num_hidden_layers": 6, "hidden_size": 1024, "intermediate_size": 3584,
            "num_attention_heads": 8, "num_key_value_heads": 2, "tie_word_embeddings": False}
FINETUNE = {
    "method": {"type": "lora", "rank": 4, "num_layers": -1, "dropout": 0.1},
    "train": {"lr": 1e-3, "steps": 3, "global_batch": 2, "micro_batch": 1,
              "max_seq_len": 4, "eval_every": 0, "checkpoint_every": 1, "log_every": 1},
}
#: Planned (finetune/stageplan.py; budgets 80% of the limits): the whole model 0.32 GiB
#: on one node, more than node3's 0.27 GiB; 3 stages [2, 1, 3] 111, 55 and 165 MiB
#: against 224, 168 and 276 (MLX's measured peaks 111, 55 and 165 MiB on 3 local ranks).
#: A stage's process holds ~125 MiB beside MLX's arrays (python, mlx, mlx-lm, the
#: tokenizer; 235, 180 and 290 MiB resident at its peak there), which each limit leaves
#: room for with ~30 MiB or more to spare. The middle node, the smallest, gets one block:
#: at 218 MiB or more it would get two ([2, 2, 2], within 5% of the best ratio).
FT_LIMITS = {"node1": 280 * MiB, "node2": 210 * MiB, "node3": 345 * MiB}


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory) -> tuple[Path, Path]:
    """The model and the text data, made once for the bash and the zsh run."""
    from mlxops.devtools.tinymodels import build_model, write_dataset

    root = tmp_path_factory.mktemp("wide-llama")
    return (build_model(root / "llama6", "llama", sizes=FT_SIZES),
            write_dataset(root / "text", "text"))


def test_finetune_stages_auto_trains_as_one_process_and_its_fetched_adapters_generate(
        login_sandbox_mut, tmp_path, connector, reference, wide_llama):
    """A LoRA on a 6-block llama no one of the three limited nodes can hold,
    ``finetune.stages: auto``: refused on node3 alone (the largest) at load, exit 2, with
    the plan's numbers; over the three split unequally by their limits. On bash nodes the
    middle stage is killed with SIGKILL after step 2 (held there) and the job restarted
    from the stages' newest checkpoint (one a step). On zsh nodes the job is stopped
    (``mlxops stop``) while held after step 1, resumed on the same split to step 2
    (``train.stop_at``), then resumed without node2 on 2 stages ``[3, 3]`` (node2's stage
    checkpoint copied to node1 and node3 first) to the end. Either way the losses are
    those of one process holding every block bit for bit, and ``mlxops fetch`` assembles
    the stages' adapters (the last run's: 3 stages on bash, 2 on zsh) into one set
    ``mlx_lm.generate`` loads. The kill on bash only: the trainer's stage kill above
    restarts on zsh nodes already (46 s spared there)."""
    from mlxops.jobs.fetch import fetch

    box = login_sandbox_mut
    for node, limit in FT_LIMITS.items():
        box.set_memory_limit(node, limit)
    model, data = wide_llama
    section = json.loads(json.dumps(FINETUNE))
    section["model"], section["data"] = {"path": str(model)}, {"path": str(data)}
    kill = box.login_shell == "bash"
    hold = Hold(box, "ft-pipe", list(FT_LIMITS), at=2 if kill else 1)

    def job_file(hosts: str, stop_at: int = 0) -> Path:
        train = {**section["train"], "stop_at": stop_at}
        job = {"name": "ft-pipe", "inventory": str(box.inventory_path), "hosts": hosts,
               "backend": "ring", "blas": "off",
               "finetune": {**section, "train": train, "stages": "auto"},
               "restart": {"max_restarts": 1, "stall_timeout": 180}, "env": hold.env}
        path = tmp_path / f"ft-pipe-{hosts.count(',') + 1}.yml"
        path.write_text(yaml.safe_dump(job))
        return path

    alone = job_file("node3")
    assert refused_at_load(alone, connector) == (
        f"{alone}: finetune.stages: the model does not fit on 1 hosts even split by "
        "memory: node3: layers 0-5 0.32 of 0.27 GiB")

    record = launch(load_job(job_file("node1,node2,node3")), connector, fresh=True)
    one = reference("mlxops.finetune", {**section, "train": {**section["train"],
                                                             "stages": [6]}})
    split = record.workload.config.train.stages
    assert split == [2, 1, 3], split
    if kill:
        watchdog = BackgroundWatchdog(record, connector)
        with hold:
            wait_for_step(record, connector, 2, timeout=240)
            pgid = int((run_dir(box, "node2", "ft-pipe") / "rank-1.pid").read_text())
            child = subprocess.run(["pgrep", "-P", str(pgid)], capture_output=True,
                                   text=True)
            os.kill(int(child.stdout.split()[0]), signal.SIGKILL)
        final = watchdog.result(timeout=300)
        assert final.state == "finished", final.to_dict()
        assert len(load_record("ft-pipe").restarts) == 1
    else:
        stop_resume_and_resume_on_two_stages(box, connector, record, hold, job_file)
    assert step_losses(run_dir(box, "node1", "ft-pipe") / "metrics.jsonl") == one.losses()

    out = tmp_path / "adapters"
    fetched = fetch(load_record("ft-pipe"), connector, out)
    assert fetched.step == 3
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json",
                                                     "adapters.safetensors"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["model"] == str(model) and config["num_layers"] == 6
    generate = Path(sys.executable).with_name("mlx_lm.generate")
    proc = subprocess.run([str(generate), "--model", str(model), "--adapter-path", str(out),
                           "--prompt", "What does json do?", "--max-tokens", "8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tokens-per-sec" in proc.stdout, proc.stdout


def stop_resume_and_resume_on_two_stages(box, connector, record, hold: Hold,
                                         job_file: Callable[..., Path]) -> None:
    """The fine-tuning scenario's zsh run: ``mlxops stop`` while held after step 1, a
    resume on the same split to step 2, a resume without node2 on 2 stages to the end.
    The two large nodes hold 3 blocks each: planned 165 MiB against budgets of 224 and
    276 (finetune/stageplan.py)."""
    from mlxops.jobs.stop import stop_job

    with hold:
        wait_for_step(record, connector, 1, timeout=240)
        assert stop_job(record, connector).exit_code == 0
    assert load_record("ft-pipe").state == "stopped"
    assert sorted(step_losses(run_dir(box, "node1", "ft-pipe") / "metrics.jsonl")) == [1]

    resumed = launch(load_job(job_file("node1,node2,node3", stop_at=2)), connector,
                     resume=True, previous=load_record("ft-pipe"))
    assert resumed.workload.config.train.stages == [2, 1, 3]
    assert resumed.message == "resumed from step 1"
    assert supervise(resumed, connector).state == "finished"

    copied: list[str] = []
    two = launch(load_job(job_file("node1,node2,node3")), connector, resume=True,
                 exclude=["node2"], previous=load_record("ft-pipe"),
                 on_warning=copied.append)
    assert two.workload.config.train.stages == [3, 3] and two.world_size == 2
    assert two.message == "resumed from step 2"
    # node2 held stage 1 (block 2): node1 takes block 2 from it, node3 (stage 1 now)
    # finds its step in stage-1/; stages 0 and 2 stay where they are.
    assert copied == ["checkpoint part stage-1/step-00000002: node2 -> node1, node3 "
                      "(copied before the ranks start)"]
    assert supervise(two, connector).state == "finished"
    assert load_record("ft-pipe").restarts == []
