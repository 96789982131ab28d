"""The checkout's folders the tests read, and the benchmark corpus beside the checkout."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
LAUNCH = ROOT / "launch"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
