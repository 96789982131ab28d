"""The two-node Ray cluster of tests/helpers/two_node_cluster.py, as the tests drive it: its
address and node ids, its GCS actor table, a node replaced (``TwoNodes``)."""

from __future__ import annotations

import functools
import json
import queue
import subprocess
import threading
from pathlib import Path

CPUS_PER_NODE = 3  # logical: the machine may have 2 cores


class TwoNodes:
    """The helper process; its cluster starts in the background, and the first use of ``address`` or
    ``nodes`` waits until it is up."""

    def __init__(self, proc: subprocess.Popen, log: Path, env: dict):
        self.proc, self.log = proc, log  # log: the helper's stderr (Ray's start-up messages)
        self.env = (
            env  # the environment to run a job with (RAY_TMPDIR: the cluster's short temp dir)
        )
        self.lines: queue.Queue[str] = queue.Queue()  # the helper's stdout, "" at its end
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    @functools.cached_property
    def _info(self) -> dict:
        return self._answer(timeout_s=180)

    @property
    def address(self) -> str:
        """The GCS address, host:port."""
        return self._info["address"]

    @property
    def nodes(self) -> list[str]:
        """The node ids: head, worker."""
        return self._info["nodes"]

    def replace_worker(self) -> dict:
        """The worker node removed without grace and a fresh one added (the helper's
        ``replace``): ``{"removed": <node id>, "added": <node id>}``; ``nodes`` names the fresh
        one from now on."""
        self.proc.stdin.write("replace\n")
        self.proc.stdin.flush()
        replaced = self._answer(timeout_s=180)
        self._info["nodes"] = [self.nodes[0], replaced["added"]]
        return replaced

    def actors(self) -> list[dict]:
        """Every actor the cluster has had, dead ones too: class, name, node id, state."""
        assert self._info  # the cluster is up
        self.proc.stdin.write("actors\n")
        self.proc.stdin.flush()
        return self._answer(timeout_s=60)

    def _answer(self, timeout_s: float):
        """The helper's next JSON line."""
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                line = ""
            if not line:
                raise RuntimeError("the two-node cluster helper did not answer within "
                                   f"{timeout_s:.0f}s (exit status {self.proc.poll()}); its "
                                   f"log:\n{self.log.read_text()[-3000:]}")
            if line.startswith(("{", "[")):
                return json.loads(line)
