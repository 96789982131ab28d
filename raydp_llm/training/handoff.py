"""How a worker group started before its data gets it: the driver launches Ray Train as soon as Ray
is up (driver/fit.py, ``started``), while Spark runs the ETL; each worker imports, joins the
process group and warms up, then waits here for what only the ETL can tell (the spec: the
vocabulary, the windows, the steps; the chunks; the checkpoint to resume), which the driver
delivers once it has it. A restarted group finds it here at once.

Rank 0 posts its worker group's placement group here (``post_group``), for the driver to free
should Ray Train's controller die without removing it, and its progress for the driver's display
(``LivePosts``, read by driver/progress.py; Ray's metrics get it too): one actor a run, not two
(each is a fresh Python process, about a second of CPU on the way to the first step).

This module imports Ray alone: the actor's process imports it, and ray.train would cost it seconds
of CPU while Spark starts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group_table, remove_placement_group

from raydp_llm.core.errors import first_line
from raydp_llm.core.timing import Stopwatch

# the named actor of a sweep that keeps its trials' placement groups (cli/sweep/launcher.py): a
# trial a scheduler stops ends with its controller, whose group Ray Train's cleaner frees only
# through the State API, which a Ray without its dashboard does not serve
SWEEP_GROUPS = "raydp_llm_sweep_groups"


@dataclass(frozen=True)
class Delivery:
    """What the workers wait for: the run's spec, its data (``{split: SplitChunks}``) and
    the checkpoint it starts from (local or s3://), if any."""

    spec: object  # TrainSpec
    data: dict
    resume_from: str | None = None


@dataclass(frozen=True)
class RunContext:
    """What a run adds beside the spec: its Ray Train name (which tags its Ray metrics) and the
    hand-off the workers take their spec, data and checkpoint (local or s3://, if any) from, and
    rank 0 posts its progress to for the driver's display (progress.py). It lives here, not with
    the workers' loop: Ray Train's controller unpickles it (the loop's config), and loop.py's
    imports (torch, the models) cost the controller about 5 s on 2 cores before it started the
    workers. ``sweep_key``: a sweep's trial (its run directory), whose worker groups go to the
    sweep's ledger too (``post_group``)."""

    run_name: str
    handoff: object = None
    sweep_key: str | None = None


@ray.remote(num_cpus=0)
class Handoff:
    """The driver's delivery to the workers, the worker group's placement group, and rank 0's
    latest step, loss and throughput with the moments it reached
    (``post``, ``mark``). The delivery comes as
    ``[ObjectRef]`` of a ``Delivery``: inside a list Ray leaves the reference as it is, so this
    actor never loads the spec and the data (nor imports what they are made of); None: the driver
    gave up before training, and the workers return at once. Async: every worker waits on it at
    once, and the driver still reaches it meanwhile."""

    def __init__(self):
        self.ready = asyncio.Event()
        self.delivery: list | None = None
        self.placement_group = None  # the worker group's, the latest
        self.latest: dict = {}
        self.marks: dict = {}
        # blocks lost with a node (data.cache=false): why a worker could not read one (once
        # told, the driver makes the data again), and where the workers read it then
        self.lost, self.why = asyncio.Event(), None
        self.remade, self.sources = asyncio.Event(), None

    async def deliver(self, delivery: list | None) -> None:
        """The first delivery stands: a None after it (the driver aborting) changes nothing for
        workers that have theirs already."""
        if not self.ready.is_set():
            self.delivery = delivery
            self.ready.set()

    async def wait(self) -> list | None:
        await self.ready.wait()
        return self.delivery

    async def set_group(self, placement_group) -> None:
        self.placement_group = placement_group

    async def group(self):
        return self.placement_group

    async def post(self, latest: dict) -> None:
        self.latest = latest

    async def read(self) -> dict:
        return self.latest

    async def mark(self, name: str, at: float, first: bool = True) -> None:
        """When rank 0 reached ``name`` (``time.time()``): the first time, or the last."""
        if not (first and name in self.marks):
            self.marks[name] = at

    async def read_marks(self) -> dict:
        return self.marks

    async def blocks_lost(self, why: str) -> list | None:
        """A worker could not read a block: the driver is told (by the first), and every worker
        that asks gets the data made again, once there (``[ObjectRef]`` of its sources by slot;
        None: it could not be made)."""
        if not self.lost.is_set():
            self.why = why
            self.lost.set()
        await self.remade.wait()
        return self.sources

    async def wait_lost(self) -> str:
        """On the driver: until a worker finds blocks lost; why it could not read them."""
        await self.lost.wait()
        return self.why

    async def remake(self, sources: list | None) -> None:
        """The driver's data made again (None: it could not be made)."""
        self.sources = sources
        self.remade.set()


def delivered(handoff) -> Delivery | None:
    """What the driver delivered through ``handoff``, once it has (None: nothing will come)."""
    box = ray.get(handoff.wait.remote())
    return None if box is None else ray.get(box[0])


@dataclass(frozen=True)
class LostBlocks:
    """What a worker's ``BlockChunks`` asks when a block cannot be read (``on_lost``): the run's
    hand-off, and which of the run's block sources it is (its slot)."""

    handoff: object
    slot: int

    def replacement(self, error: Exception):
        """Where this source's chunks are read once a block of it was lost (the driver runs the
        ETL again meanwhile); one line when they could not be made."""
        # a RayTaskError's first line names the task; its cause is what failed (RayDP's fetch)
        why = first_line(getattr(error, "cause", None) or error, 300, with_type=True)
        box = ray.get(self.handoff.blocks_lost.remote(why))
        if box is None:
            raise RuntimeError(f"blocks of the hand-off were lost ({why}) and the data could not "
                               "be made again; see the driver's log (data.cache=true keeps it on "
                               "storage)")
        return ray.get(box[0])[self.slot]


def post_group(run: RunContext) -> None:
    """On rank 0, as its worker group starts: the group's placement group to the run's hand-off
    (and to a sweep's ledger for a trial's), to be freed should the controller leave it."""
    group = ray.util.get_current_placement_group()
    run.handoff.set_group.remote(group)
    if run.sweep_key is not None:  # the sweep frees it when the trial ends (cli/sweep/)
        ray.get_actor(SWEEP_GROUPS).add.remote(run.sweep_key, group)


def free_group(group) -> None:
    """A worker group's placement group, removed if its controller left it (killed, out of memory,
    its trial stopped)."""
    if placement_group_table(group)["state"] != "REMOVED":
        remove_placement_group(group)


class LivePosts:
    """Rank 0's live figures, at most every ``interval_s``: to the driver's board and to Ray's
    metrics."""

    def __init__(self, board, run: str, interval_s: float = 0.5):
        from raydp_llm.engines.dashboard import RunGauges

        self.board, self.gauges, self.interval_s = board, RunGauges(run), interval_s
        self.since_post = Stopwatch(already_s=interval_s)
        self.first_step = True  # until the first step is posted

    def step(self, step: int, loss: float, tokens_per_s: float, figures: dict | None = None
             ) -> None:
        """A step's figures: its loss and tokens/s, and the objective's (``StepResult.live``:
        a GRPO step's ``reward`` and ``reward_std``)."""
        self.first_step = False
        if self.since_post.seconds() < self.interval_s:
            return
        self.since_post = Stopwatch()
        figures = figures or {}
        if self.board is not None:
            self.board.post.remote({"step": step, "loss": loss, "tokens_per_s": tokens_per_s,
                                    **figures})
        self.gauges.set(step=step, train_loss=loss, tokens_per_s=tokens_per_s,
                        **{k: v for k, v in figures.items() if k in self.gauges.NAMES})

    def evaluation(self, figures: dict) -> None:
        """An evaluation's ``val_loss`` (a GRPO run's ``val_reward``)."""
        self.gauges.set(**figures)

    def mark(self, name: str, at: float | None = None, first: bool = True) -> None:
        """That rank 0 reached ``name`` now (or ``at``, a ``time.time()``), on the board
        (``Handoff.mark``)."""
        if self.board is not None:
            self.board.mark.remote(name, time.time() if at is None else at, first=first)
