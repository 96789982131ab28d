"""Ray started early (``ray_cluster.begin``): its processes start in a thread while the driver
imports the training code, the run's ``ray_session`` takes that Ray over, and Ray lives until the
session stops it, not until the starting thread is done (Linux's parent-death signal, which Ray's
processes ask for, follows the thread that started them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.paths import ROOT

pytestmark = pytest.mark.integration

# In a process of its own: this one may hold the tests' shared Ray.
EARLY_START = """
import json, sys, threading, time
sys.path.insert(0, 'tests')
import psutil, ray
from helpers.configs import make_config
from raydp_llm.engines import ray_cluster

cluster = make_config('cluster.dashboard=false').cluster
ray_cluster.begin(cluster, 'early')
importing = time.time()
import torch  # what the driver does meanwhile
with ray_cluster.ray_session(cluster, 'early') as up:
    time.sleep(3)  # long past the end of ray.init in the starting thread
    # this Ray's raylet (the driver's child; the tests' shared Ray may run beside)
    raylet = [p for p in psutil.Process().children(recursive=True) if p.name() == 'raylet']
    answer = ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60)
    inside = {'began': up.began, 'done': up.done, 'importing': importing, 'answer': answer,
              'raylets': len(raylet),
              'threads': [t.name for t in threading.enumerate()]}
def alive(p):
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
after = {'initialized': ray.is_initialized(), 'raylet_alive': any(alive(p) for p in raylet)}
print(json.dumps(inside | after))
"""


def test_ray_begun_early_is_taken_over_by_the_session_and_lives_until_it_stops():
    p = subprocess.run([sys.executable, "-c", EARLY_START], cwd=ROOT, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["answer"] == 42 and got["raylets"] >= 1  # Ray outlived its start by seconds
    assert got["began"] < got["importing"] < got["done"]  # torch imported while Ray started
    assert "ray-start" in got["threads"]  # the starting thread holds on while Ray runs
    assert not got["initialized"] and not got["raylet_alive"]  # the session stopped it
