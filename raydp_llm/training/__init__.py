"""Training, by where each line runs:

    driver/      the process the user started: Ray up, the ETL, Ray Train's fit, the console, the
                 metrics, the run's outputs (driver/run.py reads top to bottom)
    worker/      each Ray Train worker: the model placed, the loop (worker/loop.py), checkpoints
    objectives/  what a worker learns by (lm, dpo, grpo), behind the interface the worker calls

and what both sides share: the spec the driver hands every worker (spec.py), the hand-off between
them (handoff.py), and lm-evaluation-harness' tasks (tasks.py, task_files.py). Imports run one
way: driver → worker → objectives → the shared modules (tests/unit/test_layout.py)."""
