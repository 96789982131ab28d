"""What a run shows outside its own files: where the Ray dashboard is (and how to get in), and the
run's metrics in Ray's metrics (Prometheus) beside Ray's own, tagged with the run's name."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from raydp_llm.core.config import ClusterSettings

log = logging.getLogger(__name__)

TOKEN_HELP = "the token: `ray get-auth-token` (it is in ~/.ray/auth_token)"


def announce_dashboard(cfg: ClusterSettings, dashboard_url: str | None, gcs_address: str) -> None:
    """One console line: the dashboard's URL and how to get in; for a joined cluster, the SSH tunnel
    to its head node (dashboards listen on the head's 127.0.0.1 unless told otherwise)."""
    if not dashboard_url:
        if cfg.address == "local":
            log.info("Ray dashboard off (cluster.dashboard=false)")
        return
    url = dashboard_url if "://" in dashboard_url else f"http://{dashboard_url}"
    port = urlsplit(url).port or 8265
    if cfg.address == "local":
        log.info("Ray dashboard: %s (%s)", url, TOKEN_HELP)
        if urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
            log.warning(
                "the dashboard listens on %s (cluster.dashboard_host): every machine that "
                "can reach it is asked for the token, and nothing else keeps it out",
                urlsplit(url).hostname,
            )
    else:
        head = gcs_address.rsplit(":", 1)[0]
        log.info(
            "Ray dashboard of the cluster: ssh -N -L %d:127.0.0.1:%d <user>@%s, then "
            "http://127.0.0.1:%d (%s, run on the head node)",
            port,
            port,
            head,
            port,
            TOKEN_HELP,
        )


class RunGauges:
    """The run's figures as Ray metrics (``ray.util.metrics``), tagged ``run=<name>``: Ray exports
    them with its own (the dashboard's Metrics page, Prometheus/Grafana) as
    ``ray_raydp_llm_<name>``. Create it in the process that records (the driver for the ETL, rank 0
    for training)."""

    NAMES = {
        "step": "optimizer steps done",
        "train_loss": "training loss (mean cross-entropy per token, nats)",
        "val_loss": "validation loss at the latest evaluation (nats per token)",
        "tokens_per_s": "training throughput, tokens per second over all workers",
        "reward": "a GRPO step's mean reward over every worker's answers",
        "val_reward": "a GRPO run's reward of its held-out prompts at the latest evaluation",
        "etl_phase_s": "seconds an ETL phase took (tag phase)",
        "etl_chunks": "chunks of the token stream the ETL stored, per split (tag split)",
    }
    TAGS = {"etl_phase_s": "phase", "etl_chunks": "split"}  # a second tag beside ``run``

    def __init__(self, run: str):
        from ray.util.metrics import Gauge

        self.run = run
        self.gauges = {
            name: Gauge(
                f"raydp_llm_{name}",
                description=text,
                tag_keys=("run", self.TAGS[name]) if name in self.TAGS else ("run",),
            )
            for name, text in self.NAMES.items()
        }

    def set(self, **values: float | None) -> None:
        for name, value in values.items():
            if value is not None:
                self.gauges[name].set(value, tags={"run": self.run})

    def set_tagged(self, name: str, tag: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.gauges[name].set(value, tags={"run": self.run, tag: key})
