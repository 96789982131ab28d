"""What Spark did for the ETL, read from its own event log: jobs, stages, tasks, times, bytes,
memory.

Spark writes the log (``spark.eventLog.*``, set in cluster.py) to the run directory; it is complete
once Spark has stopped. Times are in milliseconds, sizes in bytes.
"""

from __future__ import annotations

import json
from pathlib import Path


def _task_totals(events: list[dict]) -> dict:
    tasks = [e for e in events if e["Event"] == "SparkListenerTaskEnd"]
    durations = [e["Task Info"]["Finish Time"] - e["Task Info"]["Launch Time"] for e in tasks]
    metrics = [e.get("Task Metrics") or {} for e in tasks]

    def total(*path: str) -> int:
        out = 0
        for m in metrics:
            for key in path[:-1]:
                m = m.get(key, {})
            out += m.get(path[-1], 0)
        return out

    return {
        "tasks": len(tasks),
        "failed_tasks": sum(e["Task End Reason"]["Reason"] != "Success" for e in tasks),
        "task_duration_ms_min": min(durations, default=0),
        "task_duration_ms_avg": round(sum(durations) / len(durations), 1) if durations else 0,
        "task_duration_ms_max": max(durations, default=0),
        "executor_run_time_ms": total("Executor Run Time"),
        "executor_cpu_time_ms": round(total("Executor CPU Time") / 1e6),
        "jvm_gc_time_ms": total("JVM GC Time"),
        "input_bytes": total("Input Metrics", "Bytes Read"),
        "input_records": total("Input Metrics", "Records Read"),
        "shuffle_read_bytes": total("Shuffle Read Metrics", "Remote Bytes Read")
        + total("Shuffle Read Metrics", "Local Bytes Read"),
        "shuffle_write_bytes": total("Shuffle Write Metrics", "Shuffle Bytes Written"),
        "output_bytes": total("Output Metrics", "Bytes Written"),
        "spilled_bytes": total("Memory Bytes Spilled") + total("Disk Bytes Spilled"),
        "peak_execution_memory_bytes": max((m.get("Peak Execution "
                                                  "Memory", 0) for m in metrics), default=0),
    }


def _of_group(events: list[dict], group: str) -> list[dict]:
    """The job, stage and task events of the jobs of job group ``group``."""
    jobs = [e for e in events if e["Event"] == "SparkListenerJobStart"
            and (e.get("Properties") or {}).get("spark.jobGroup.id") == group]
    stages = {s for job in jobs for s in job["Stage IDs"]}
    ids = {job["Job ID"] for job in jobs}

    def mine(e: dict) -> bool:
        if e["Event"] in ("SparkListenerJobStart", "SparkListenerJobEnd"):
            return e["Job ID"] in ids
        if "Stage Info" in e:
            return e["Stage Info"]["Stage ID"] in stages
        return e.get("Stage ID", -1) in stages

    return [e for e in events if mine(e)]


def read_event_log(directory: Path, job_group: str | None = None) -> dict:
    """Totals over the newest event log in ``directory``, and the same per stage; with
    ``job_group``, over that group's jobs only (a Spark that ran several ETLs)."""
    logs = sorted(Path(directory).glob("*"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return {}
    events = [json.loads(line) for line in logs[-1].read_text().splitlines() if line.strip()]
    if job_group is not None:
        events = _of_group(events, job_group)
    stages = []
    for e in events:
        if e["Event"] == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            mine = [
                t
                for t in events
                if t["Event"] == "SparkListenerTaskEnd" and t["Stage ID"] == info["Stage ID"]
            ]
            stages.append(
                {
                    "stage": info["Stage ID"],
                    "name": info["Stage Name"].split(" at ")[0],
                    "wall_ms": info.get("Completion Time", 0) - info.get("Submission Time", 0),
                    **_task_totals(mine),
                }
            )
    return {
        # a running Spark's log is renamed without ".inprogress" when Spark stops
        "event_log": str(logs[-1]).removesuffix(".inprogress"),
        "jobs": sum(e["Event"] == "SparkListenerJobStart" for e in events),
        "stages": len(stages),
        **_task_totals(events),
        "per_stage": stages,
    }
