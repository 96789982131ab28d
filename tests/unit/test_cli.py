"""The entry points as a user runs them: bad input is one clear line and exit status 1, before Ray
starts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT
from raydp_llm.cli.common import cli_errors
from raydp_llm.core.errors import InputError, RunFailure

RAY_LATEST = "/tmp/ray/session_latest"


def ray_session_dir() -> str | None:
    return os.readlink(RAY_LATEST) if os.path.islink(RAY_LATEST) else None


BAD_INPUT = [
    ("data.path=/no/such/corpus.txt", "data.path=/no/such/corpus.txt: no such file or directory"),
    # what data.path=$CORPUS gives with the variable unset: it read the working directory
    ("data.path=", "data.path='' is empty: give a file, directory, glob or URI, or null"),
    ("model.n_head=3", "model.n_embd=128 is not divisible by model.n_head=3"),
    ("train.batch_size=13", "train.batch_size=13 is not divisible by train.num_workers=2"),
    (
        "data.val_fraction=1.5",
        "data.val_fraction=1.5 is not allowed: use a fraction strictly between 0 and 1",
    ),
    ("data.split=random", "data.split=random is not allowed: use tail | hash"),
    (
        "tokenizer=bpe tokenizer.path=/no/tokenizer.json",
        "tokenizer.path=/no/tokenizer.json: no such file",
    ),
]
BAD_SETTINGS = [
    (
        "train.grad_accum=4",
        "train.batch_size=12 is not divisible by train.num_workers=2 × train.grad_accum=4",
    ),
    (
        "train.checkpoint_interval=300",
        "train.checkpoint_interval=300 is not a multiple of train.eval_interval=250",
    ),
    (
        "train.resume=/no/checkpoint",
        "train.resume=/no/checkpoint: not a training checkpoint (no train_state.json)",
    ),
    ("train.precision=fp8", "train.precision=fp8 is not allowed: use auto | fp32 | bf16"),
    ("data.query=x", "data.query is set but data.format=text reads data.path's files"),
    ("data.format=sql", "data.format=sql needs data.query: add data.query="),
    ("train.strategy=zero3", "train.strategy=zero3 is not allowed: use ddp | fsdp"),
    (
        "model=lstm train.strategy=fsdp",
        "train.strategy=fsdp works on a transformer's blocks and model=lstm has none",
    ),
    (
        "+experiment=shakespeare_char",
        "data.path is missing: the shakespeare_char configuration needs it; add data.path=...",
    ),
    (
        "+experiment=emr data.path=s3://b/corpus/",
        "train.storage_path is missing: the emr configuration needs it",
    ),
    (
        "s3.endpoint_url=127.0.0.1:9000",
        "s3.endpoint_url=127.0.0.1:9000 is not allowed: use null or an http:// or https:// URL",
    ),
    (
        "cluster.executor_ray_cpus=1.5",
        "cluster.executor_ray_cpus=1.5 is not allowed: use a number in (0, 1] or a whole number",
    ),
    (
        "cluster.placement=spread",
        "cluster.placement=spread is not allowed: use null or PACK | SPREAD | STRICT_SPREAD",
    ),
    ("optim.lr=0", "optim.lr=0.0 is not allowed: use a number > 0"),
    (
        "optim.min_lr=0.01",
        "optim.min_lr=0.01 is above optim.lr=0.001; the decay ends at min_lr ≤ lr",
    ),
    ("data.stride=0", "data.stride=0 is not allowed: use null or a number ≥ 1"),
    ("model.dropout=1.0", "model.dropout=1.0 is not allowed: use a number in [0, 1)"),
    ("model=lstm model.n_layer=0", "model.n_layer=0 is not allowed: use a number ≥ 1"),
    (
        "tokenizer=bpe tokenizer.vocab_size=100",
        "tokenizer.vocab_size=100 is not allowed: use an integer ≥ 257",
    ),
    (
        "train.cpus_per_worker=64",
        "CPUs (cluster.num_cpus) but the job needs 128: "
        "cluster.executors=1 × cluster.executor_ray_cpus=0.5 and "
        "train.num_workers=2 × train.cpus_per_worker=64; lower them",
    ),
    (
        "cluster.keep_executors=true cluster.num_cpus=2",
        "the embedded Ray has 2 CPUs (cluster.num_cpus) but the job needs 2.5: "
        "cluster.executors=1 × cluster.executor_ray_cpus=0.5 + "
        "train.num_workers=2 × train.cpus_per_worker=1; lower them",
    ),
    (
        "model.init_embeddings=/no/vectors.npy",
        "model.init_embeddings=/no/vectors.npy: no such file",
    ),
    (
        "train.min_workers=3",
        "train.min_workers=3 is above train.num_workers=2; it is the fewest "
        "workers of an elastic group",
    ),
    (
        "train.objective=dpo",
        "train.objective=dpo needs preference pairs and data.format=text has none; set "
        "data.format=preference",
    ),
    (
        "data.format=preference",
        "data.format=preference: train.objective=lm does not train on pairs; set "
        "train.objective=dpo",
    ),
    ("dpo.beta=0", "dpo.beta=0.0 is not allowed: use a number > 0"),
    (
        "train.num_workers=4 train.min_workers=1 train.batch_size=8",
        "train.batch_size=8 is not divisible by 3 workers (train.min_workers=1) × "
        "train.grad_accum=1",
    ),
    (
        "train.max_failures=-2",
        "train.max_failures=-2 is not allowed: use -1 (no limit) or a number ≥ 0",
    ),
    ("s3.max_attempts=0", "s3.max_attempts=0 is not allowed: use a number ≥ 1"),
    ("data.dedup=fuzzy", "data.dedup=fuzzy is not allowed: use none | exact | near"),
    ("data.filters.max_score=3", "data.filters.max_score needs data.filters.score_path"),
    ("data.filters.score_path=/no/scores.parquet data.filters.max_score=3",
     "data.filters.score_path=/no/scores.parquet: no such file"),
]
# what Hydra refuses, as the project's one line and exit status 2 (cli/preflight.py), still saying
# what Hydra said (issue 67: 4-8 lines and exit 1; following Hydra's hint crashed)
HYDRA_ERRORS = [
    ("train.max_steps=abc", "Value 'abc' of type 'str' could not be converted to "
                            "Integer"),  # the schema's type
    ("model.n_heads=3", "model.n_heads is not a setting; did you mean model.n_head? (--cfg job "
                        "--package model lists model's settings"),  # a typo
    ("+model.n_heads=3", "model.n_heads is not a setting; did you mean model.n_head?"),  # its hint
    ("model=lstm model.n_head=2", "model.n_head is not a setting (--cfg job --package model"),
    ("+model.n_head=3", "An item is already at 'model.n_head'; Either remove + prefix: "
                        "'model.n_head=3'"),
    ("data.path=~/x", "data.path=~/x: Hydra's override grammar refuses it (LexerNoViableAlt"
                      "Exception: data.path=~/x); quote a value that holds special characters: "
                      "'data.path=\"~/x\"'"),
    ("model=gpt_huge", "Could not find 'model/gpt_huge'; the options: base_gpt, base_hf, "),
]
# a sweep none of whose jobs could run is refused before Ray starts, on every launcher (issue 67:
# Ray and Tune started, every trial failed, exit 0); Optuna's search space's mistakes
BAD_SWEEPS = [
    ("-m hydra/launcher=ray sweep.scheduler=ashaa optim.lr=1e-3,2e-3",
     "sweep.scheduler=ashaa is not allowed: use none | asha (in every job of the sweep: refused "
     "before Ray starts)"),
    # ASHA where the jobs run one after another: it would stop nothing (issue 71)
    ("-m sweep.scheduler=asha optim.lr=1e-3,2e-3",
     "sweep.scheduler=asha: it stops trials that run side by side, and these jobs run one after "
     "another (the default launcher on the embedded Ray, or concurrent=false); add "
     "hydra/launcher=ray"),
    ("-m model.n_head=3,5 optim.lr=1e-3", "model.n_embd=128 is not divisible by model.n_head=3; "
                                          "pick a divisor (in every job of the sweep"),
    ("-m hydra/sweeper=optuna optim.lr=tag(lgo,interval(1e-4,1e-2)) hydra.sweep.dir={d}/optuna",
     "optim.lr=tag(lgo,interval(1e-4,1e-2)): tag lgo means nothing to the search; "
     "tag(log,interval(a,b)) samples on a log scale"),
    ("-m hydra/sweeper=optuna optim.lr=interval(1e-2,1e-4) hydra.sweep.dir={d}/optuna",
     "the interval's start is not below its end; give interval(0.0001,0.01)"),
]
EACH_JOB = ("-m", "optim.lr=1e-3,2e-3", "--cfg", "job", "--package", "optim")

# learning from rewards: each refused at the door ({d}: the fixture's files, grpo_files)
GRPO = ("train.objective=grpo data.format=prompts tokenizer=bpe tokenizer.path={d}/tokenizer.json "
        "data.path={d}/prompts.jsonl grpo.max_new_tokens=16")
BAD_GRPO = [
    (f"{GRPO} grpo.rewards=[last_number] grpo.max_new_tokens=64",
     "grpo.max_new_tokens=64 leaves no room for a prompt in model.block_size=64"),
    (f"{GRPO} grpo.rewards=[{{d}}/rewards.py:vowels] data.path={{d}}/no_prompt.jsonl",
     "data.prompt_column=prompt: no such column in"),
    (f"{GRPO} grpo.rewards=[{{d}}/none.py:vowels]", "/none.py does not exist"),
    (f"{GRPO} grpo.rewards=[{{d}}/rewards.py:nope]", "rewards.py has no function 'nope'"),
    (f"{GRPO} grpo.rewards=[{{d}}/rewards.py:wrong]",
     "rewards.py:wrong must take (prompts, completions, **columns); it takes (texts)"),
    (f"{GRPO} grpo.rewards=[{{d}}/rewards.py:wants_solution]",
     "asks for the column 'solution', which the data lacks (it has ['answer', 'id'])"),
    (f"{GRPO} grpo.rewards=[]", "grpo.rewards is empty"),
    ("+experiment=grpo", "model.path is missing: model=hf trains a Hugging Face directory"),
    # this project's own GPT where a Hugging Face model is asked for: which command makes one
    ("+experiment=grpo model.path={d}/own_gpt",
     "own_gpt: a raydp_llm model (its config.json names no model_type), not a Hugging Face one; "
     "export a GPT to one (python -m raydp_llm.export model_dir="),
    (f"{GRPO} grpo.rewards=[last_number] data.format=text",
     "train.objective=grpo answers prompts and data.format=text has none"),
    ("data.format=prompts", "data.format=prompts: train.objective=lm does not learn from prompts"),
    ("train.objective=grpo data.format=prompts grpo.rewards=[last_number]",
     "train.objective=grpo answers with the model's own tokenizer"),
    (f"{GRPO} grpo.rewards=[last_number] grpo.reward_weights=[1,2]",
     "grpo.reward_weights has 2 weights for 1 grpo.rewards"),
    # a reward file that does not import: its line, not a traceback (issue 67)
    (f"{GRPO} grpo.rewards=[{{d}}/syntax.py:f]", "syntax.py:1: invalid syntax"),
    (f"{GRPO} grpo.rewards=[{{d}}/raises.py:f]",
     "raises.py:f): RuntimeError: no network here"),
    # what needs no engine is checked before one starts (issue 67: after Ray and Spark had)
    ("data.path={d}/binary.txt", "binary.txt looks binary (NUL bytes in its first 21 bytes): "
                                 "remove it from data.path or set data.skip_binary=true"),
    ("data.path={d}/utf16.txt", "utf16.txt is UTF-16 LE text: convert it to UTF-8"),
]
# a GPU asked for on a machine without one (CUDA_VISIBLE_DEVICES="" hides a GPU the machine has)
NO_GPU = ("train.use_gpu=true", "train.use_gpu=true: this machine has no NVIDIA GPU that Ray "
                                "would count")
# generate's and export's key=value arguments get the checks train's get, and a model directory
# without a model the line and exit status evaluate gives (issue 67: the values printed nothing,
# or garbage, and exited 0; the directory exited 1)
NO_MODEL = "model_dir=/no/model: no model.safetensors, config.json, tokenizer.json there"
KEY_VALUE = [
    ("generate", ("model_dir=/m", "max_new_tokens=-5"),
     "max_new_tokens=-5 is not allowed: use a number ≥ 0"),
    ("generate", ("model_dir=/m", "temperature=-1"),
     "temperature=-1.0 is not allowed: use a number ≥ 0"),
    ("generate", ("model_dir=/m", "top_k=0"), "top_k=0 is not allowed: use null or a number ≥ 1"),
    ("generate", ("model_dir=/m", "chat=maybe"), "chat='maybe' is not a valid bool"),
    ("generate", ("model_dir=/no/model", "prompt=hi"), NO_MODEL),
    ("export", ("model_dir=/no/model", "out=/no/out"), NO_MODEL),
]
EVALUATE = [
    ((), "model_dir is required: give the model/ directory of a finished run"),
    (("model_dir=/no/model",), "model_dir=/no/model: no model.safetensors, config.json, "
                               "tokenizer.json there"),
]


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """Every bad-input command of this module, each its own process, forked from one interpreter
    that imported the entry points once (helpers/cli_batch.py: each command is ~3 s of imports),
    two at a time; and whether a Ray session was started meanwhile."""
    cases = (
        [
            (m, tuple(o.split()))
            for m in ("raydp_llm.train", "raydp_llm.prepare")
            for o, _ in BAD_INPUT
        ]
        + [("raydp_llm.train", tuple(o.split())) for o, _ in BAD_SETTINGS + HYDRA_ERRORS]
        + [("raydp_llm.evaluate", args) for args, _ in EVALUATE]
    )
    work = tmp_path_factory.mktemp("cli")
    files = grpo_files(work / "grpo")
    cases += [("raydp_llm.train", tuple(o.format(d=files).split()))
              for o, _ in BAD_GRPO + BAD_SWEEPS]
    cases.append(("raydp_llm.train", EACH_JOB))
    commands = [[m, [*args, f"hydra.run.dir={work / str(i)}"], str(work / f"{i}")]
                for i, (m, args) in enumerate(cases)]
    cases.append(("raydp_llm.train", (NO_GPU[0],)))
    commands.append(["raydp_llm.train", [NO_GPU[0], f"hydra.run.dir={work / 'gpu'}"],
                     str(work / "gpu"), {"CUDA_VISIBLE_DEVICES": ""}])
    # generate and export take key=value arguments, not Hydra's: no run directory
    cases += [(f"raydp_llm.{entry}", args) for entry, args, _ in KEY_VALUE]
    commands += [[f"raydp_llm.{entry}", list(args), str(work / f"key_value{i}")]
                 for i, (entry, args, _) in enumerate(KEY_VALUE)]
    before = ray_session_dir()
    batch = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "cli_batch.py"), "2"],
                           input=json.dumps(commands), cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert batch.returncode == 0, batch.stderr[-3000:]
    outputs = {
        case: subprocess.CompletedProcess(command[:2], status,
                                          Path(f"{command[2]}.out").read_text(),
                                          Path(f"{command[2]}.err").read_text())
        for case, command, status in zip(cases, commands, json.loads(batch.stdout))
    }
    named = [Path(a.split("=", 1)[1]) for c in commands for a in c[1]
             if a.startswith("hydra.run.dir=")]
    left = [str(d) for d in named if d.exists()]
    return {"outputs": outputs, "ray_started": ray_session_dir() != before, "grpo_files": files,
            "run_dirs_left": left}


def grpo_files(d: Path) -> Path:
    """A prompts table (with and without a prompt column), a reward file, a tokenizer file."""
    from helpers.grpo_task import REWARDS

    d.mkdir()
    (d / "prompts.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "id": 0}\n')
    (d / "no_prompt.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    (d / "rewards.py").write_text(REWARDS)
    (d / "tokenizer.json").write_text("{}")
    (d / "syntax.py").write_text("def f(:\n")
    (d / "raises.py").write_text("raise RuntimeError('no network here')\n")
    (d / "binary.txt").write_bytes(b"hello\0\1 a binary file")
    (d / "utf16.txt").write_text("To be, or not to be\n" * 50, encoding="utf-16")
    (d / "own_gpt").mkdir()  # as this project writes a model/ (no model_type in its config)
    (d / "own_gpt" / "config.json").write_text('{"kind": "gpt", "n_layer": 2}')
    (d / "own_gpt" / "model.safetensors").write_bytes(b"")
    return d


def assert_one_line_error_before_any_engine(cli: dict, module: str, args, message: str) -> None:
    out = cli["outputs"][(module, tuple(args))]
    assert out.returncode == 2  # bad input
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not cli["ray_started"], "a Ray session was started for bad input"


def test_refused_commands_leave_no_run_directory(cli):
    """Each command of the batch was refused (or printed its config): none left the run directory
    it named (issue 67: each left Hydra's .hydra/ and log, so the newest entry under outputs/ was
    no run)."""
    assert cli["run_dirs_left"] == []
    assert {o.returncode for o in cli["outputs"].values()} == {0, 2}


@pytest.mark.parametrize("module", ["raydp_llm.train", "raydp_llm.prepare"])
@pytest.mark.parametrize("override,message", BAD_INPUT)
def test_bad_input_is_one_line_before_any_engine_starts(cli, module, override, message):
    assert_one_line_error_before_any_engine(cli, module, override.split(), message)


@pytest.mark.parametrize("override,message", BAD_SETTINGS)
def test_bad_training_settings_are_one_line_before_any_engine_starts(cli, override, message):
    assert_one_line_error_before_any_engine(cli, "raydp_llm.train", override.split(), message)


@pytest.mark.parametrize("override,message", HYDRA_ERRORS)
def test_what_hydra_refuses_is_one_line_before_any_engine_starts(cli, override, message):
    assert_one_line_error_before_any_engine(cli, "raydp_llm.train", override.split(), message)


@pytest.mark.parametrize("override,message", BAD_SWEEPS)
def test_a_sweep_no_job_of_which_could_run_is_one_line_before_any_engine_starts(cli, override,
                                                                                message):
    d = cli["grpo_files"]
    assert_one_line_error_before_any_engine(cli, "raydp_llm.train", override.format(d=d).split(),
                                            message)
    assert not (d / "optuna").exists()  # no sweep directory either


def test_a_sweeps_cfg_prints_each_jobs_config(cli):
    """``-m ... --cfg job``: Hydra refuses the two together (a ValueError's traceback); each job's
    config, under a line naming the job, annotated as a single run's is."""
    out = cli["outputs"][("raydp_llm.train", EACH_JOB)]
    assert out.returncode == 0, out.stderr
    jobs = [line for line in out.stdout.splitlines() if line.startswith("# job ")]
    assert [j.split()[3] for j in jobs] == ["optim.lr=0.001", "optim.lr=0.002"], out.stdout
    assert "lr: 0.002  # peak learning rate" in out.stdout and "weight_decay: 0.1" in out.stdout
    assert "n_layer" not in out.stdout  # --package optim: that part alone


@pytest.mark.parametrize("override,message", BAD_GRPO)
def test_bad_grpo_input_is_one_line_before_any_engine_starts(cli, override, message):
    d = cli["grpo_files"]
    assert_one_line_error_before_any_engine(cli, "raydp_llm.train", override.format(d=d).split(),
                                            message)


def test_a_gpu_asked_for_on_a_machine_without_one_is_one_line_before_any_engine_starts(cli):
    assert_one_line_error_before_any_engine(cli, "raydp_llm.train", [NO_GPU[0]], NO_GPU[1])


@pytest.mark.parametrize("args,message", EVALUATE)
def test_evaluate_without_a_model_dir_is_one_line_before_any_engine_starts(cli, args, message):
    assert_one_line_error_before_any_engine(cli, "raydp_llm.evaluate", args, message)


@pytest.mark.parametrize("entry,args,message", KEY_VALUE)
def test_impossible_key_values_are_one_line_before_any_engine_starts(cli, entry, args, message):
    assert_one_line_error_before_any_engine(cli, f"raydp_llm.{entry}", args, message)


def test_generate_without_a_model_dir_prints_usage(tmp_path):
    out = subprocess.run([sys.executable, "-m", "raydp_llm.generate", f"model_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no model.safetensors" in out.stderr  # as evaluate
    for args in (
        ["prompt=x"],
        [f"model_dir={tmp_path}", "temperature=hot"],
        [f"model_dir={tmp_path}", "colour=red"],
        [f"model_dir={tmp_path}", "data.path=prompts/"],  # batch answers: no out
        [f"model_dir={tmp_path}", "data.path=p/", "data.query=SELECT 1", "out=answers/"],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "raydp_llm.generate", *args], capture_output=True, text=True
        )
        assert out.returncode == 2 and out.stderr.startswith("usage:"), out.stderr


def test_an_unexpected_error_is_one_line_pointing_at_the_log_file(tmp_path, caplog):
    log_file = tmp_path / "train.log"
    handler = logging.FileHandler(log_file)
    logging.getLogger().addHandler(handler)

    @cli_errors
    def main():
        raise RuntimeError("boom\nthe rest of a long message")

    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert exit_.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"error: RuntimeError: boom (full log: {log_file})"]
    assert (
        "Traceback" in log_file.read_text() and "the rest of a long message" in log_file.read_text()
    )


@pytest.mark.parametrize("error,status", [
    (InputError("data.path=x: no such file"), 2),
    (RunFailure("training diverged at step 3 (loss nan)"), 1),
])
def test_a_one_line_error_is_one_line_and_exit_2_or_1(error, status, caplog):
    @cli_errors
    def main():
        raise error

    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == status  # bad input 2, a failed run 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"error: {error}"
    ]


def test_ray_out_of_disk_says_what_to_do(caplog):
    """Ray refuses to spill once the disk is 95% full; its own first line names a Ray task."""
    import ray.exceptions

    @cli_errors
    def main():
        cause = ray.exceptions.OutOfDiskError("ray::get_table_block_metadata_schema() failed")
        raise ray.exceptions.RayTaskError("f", "traceback", cause).as_instanceof_cause()

    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.startswith("error: RayTaskError(OutOfDiskError): the object store is full")
    assert "RAY_local_fs_capacity_threshold=0.99" in error and "data.cache=true" in error


@pytest.mark.parametrize("args, message", [
    (["hydra/launcher=ray", "sweep.metric=val_los", "optim.lr=1e-3,2e-3"],
     "error: sweep.metric=val_los: not a column every checkpoint reports; give val_loss, val_acc"),
    # GRPO reports rewards, no val_loss: ASHA crashed Tune's controller on None
    (["train.objective=grpo", "optim.lr=1e-3,2e-3"],
     "error: sweep.metric=val_loss: a GRPO run (train.objective=grpo) reports no such column; "
     "its evaluations report val_reward"),
    (["hydra/sweeper=optuna", "model.n_layer=interval(2.2,2.8)"],
     "error: model.n_layer=interval(2.2,2.8): model.n_layer is a whole number and the interval "
     "holds none"),
    (["hydra/sweeper=optuna", "optim.lr=interval(1e-4,1e-2)", "hydra.sweeper.direction=lower"],
     "error: hydra.sweeper.direction=lower: give minimize or maximize"),
    (["hydra/sweeper=optuna", "optim.lr=1e-3"], "error: hydra/sweeper=optuna: no setting to "
                                                "search"),
])
def test_a_sweep_refused_for_its_own_settings_is_one_line_before_ray(tmp_path, args, message):
    before = ray_session_dir()
    out = subprocess.run([sys.executable, "-m", "raydp_llm.train", "-m", *args,
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(message), lines
    assert ray_session_dir() == before


def test_the_preflights_grid_is_hydras_basic_sweepers():
    """cli/preflight.jobs against Hydra's own BasicSweeper.split_arguments (hydra-core 1.3.8), on
    sweeps, a key given twice (the last wins) and a fixed key between them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from raydp_llm.cli.preflight import jobs

    given = ["optim.lr=1e-3,2e-3", "train.max_steps=10", "model.n_head=1,2,4", "+x=a,'b c'",
             "train.max_steps=20"]
    (hydras,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(given),
                                             None)
    assert jobs(given) == hydras and len(hydras) == 12
