"""How entry points end on bad input (one line: what, where, what to do; exit 2), on a failed run
(one line; exit 1) and on Ctrl-C (exit 130); in a sweep, how a failed job ends without ending the
sweep."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from raydp_llm.core.errors import InputError, OneLineError, first_line

log = logging.getLogger("raydp_llm")


def cli_errors(main):
    """Wrap an entry point: a ``OneLineError`` becomes one logged line and exit status 2 for bad
    input (``InputError``), 1 for a failed run (``RunFailure``); any other
    error one line (its type and first line) pointing at the log file, which gets the traceback, and
    exit status 1; Ctrl-C exits with 130.

    In a Hydra sweep (``-m``) any error is logged (one line for a ``OneLineError``, with its
    traceback otherwise) and the job returns NaN, so that the sweep goes on and records the job as
    failed (``cli/sweep/summary.py``). Spark and Ray are already stopped by then: their context
    managers end on any exception.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as err:
            if _in_sweep():
                log.error("error: %s", err, exc_info=not isinstance(err, OneLineError))
                return float("nan")
            if isinstance(err, OneLineError):
                log.error("error: %s", err)
            else:  # the traceback goes to the log file only
                log_file = _traceback_to_log_file()
                first = _known_cause(err) or first_line(_message(err))
                first = first[:300]
                log.error(
                    "error: %s: %s%s",
                    type(err).__name__,
                    first,
                    f" (full log: {log_file})" if log_file else "",
                )
            if isinstance(err, InputError):
                _remove_refused_run_dir()
            sys.exit(2 if isinstance(err, InputError) else 1)  # bad input: 2, as a usage error
        except KeyboardInterrupt:
            log.error("interrupted: Spark and Ray are stopped")
            sys.exit(130)

    return wrapper


def _message(err: BaseException) -> str:
    """``str(err)``; for a PySpark error once Spark has stopped (its ``str`` asks the JVM, which is
    gone), the message it was made with."""
    try:
        return str(err)
    except Exception:
        return str(getattr(err, "desc", None) or "(no message: see the log file)")


# Engine errors whose own first line does not say what to do (keyed by the exception's class name,
# which Ray wraps: "RayTaskError(OutOfDiskError)").
KNOWN_CAUSES = {
    "OutOfDiskError": "the object store is full and Ray spills to local disk only while the disk "
                      "is under its threshold (95% full by default): free disk space (Ray's temp "
                      "dir, /tmp/ray), set RAY_local_fs_capacity_threshold=0.99, or hand over "
                      "through the ETL cache (data.cache=true)",
}


def _known_cause(err: BaseException) -> str | None:
    name = type(err).__name__
    return next((cause for key, cause in KNOWN_CAUSES.items() if key in name), None)


def _remove_refused_run_dir() -> None:
    """A command refused at the door leaves no run directory: Hydra made it (its ``.hydra/`` and
    the log) before the checks ran, and the newest entry under ``outputs/<name>/`` would be no run
    (issue 67). Hydra's files alone go, and the directory once empty; the line is on the console.
    A directory that holds anything else stays as it is."""
    if not HydraConfig.initialized():
        return
    hydra = HydraConfig.get()
    out = Path(hydra.runtime.output_dir)
    own = {out / f"{hydra.job.name}.log"} | ({out / hydra.output_subdir}
                                              if hydra.output_subdir else set())
    if not out.is_dir() or set(out.iterdir()) - own:
        return
    for path in own:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        out.rmdir()


def _in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _traceback_to_log_file() -> str | None:
    """Write the exception being handled to the run's log file (Hydra's file handler); returns its
    path."""
    for handler in reversed(logging.getLogger().handlers):
        if isinstance(handler, logging.FileHandler) and handler.baseFilename != os.devnull:
            handler.stream.write(traceback.format_exc())
            handler.flush()
            return handler.baseFilename
    return None
