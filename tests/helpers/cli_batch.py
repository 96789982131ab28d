"""Many command lines of the entry points, each its own process, sharing one interpreter start.

``python -m raydp_llm.train`` spends about 3 s of CPU importing (Hydra, torch, Ray) before it reads
its arguments; fifty bad-input commands would spend minutes on it. This script imports the entry
modules once, then runs each command in a forked child as ``python -m MODULE ARGS`` would run it:
``runpy`` executes the module as ``__main__`` with that ``sys.argv``, its output goes to its own
files, and its exit status is the child's. No child shares Hydra's or the logging's state with
another: each starts from the parent's state after the imports, which no command ran in.

Run as ``python cli_batch.py JOBS``; stdin: a JSON list of ``[module, args, out_prefix]`` (and
optionally an environment to add, as a fourth item);
stdout: a JSON list of exit statuses, in order. Each child writes ``out_prefix.out`` and
``out_prefix.err``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback


def child(module: str, args: list[str], prefix: str, env: dict | None = None) -> None:
    """In the forked child: run the command (with ``env`` added to its environment), then end the
    process with its status."""
    os.environ.update(env or {})
    for fd, suffix in ((1, ".out"), (2, ".err")):
        os.dup2(os.open(prefix + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.argv = [module, *args]
    status = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # as the interpreter reads it
        if isinstance(done.code, int):
            status = done.code
        elif done.code is not None:
            print(done.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 - an uncaught error, as the interpreter reports it
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main() -> None:
    jobs, commands = int(sys.argv[1]), json.load(sys.stdin)
    for module in sorted({command[0] for command in commands}):
        importlib.import_module(module)  # what it imports stays; runpy runs the module itself
        del sys.modules[module]
    running: dict[int, int] = {}  # pid -> index
    statuses: list[int | None] = [None] * len(commands)
    for index, command in enumerate(commands):
        if len(running) >= jobs:
            pid, status = os.wait()
            statuses[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        pid = os.fork()
        if pid == 0:
            child(*command)
        running[pid] = index
    while running:
        pid, status = os.wait()
        statuses[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    json.dump(statuses, sys.stdout)


if __name__ == "__main__":
    main()
