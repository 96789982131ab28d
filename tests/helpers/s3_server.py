"""The tests' S3 stand-in as a process of its own: ``python tests/helpers/s3_server.py`` starts a
moto server on 127.0.0.1 (a free port), prints ``host:port`` and serves until its stdin closes.

Why a process, not a thread of pytest's: deltalake 1.6.6 holds the GIL while its history call
reads the table's log (``DeltaTable.history``), so a moto thread in the same process never answers
it and the call hangs (measured 2026-12-03: the same calls answer in 0.02 s from a moto process).
Any library that calls S3 without releasing the GIL would hang the same way."""

from __future__ import annotations

import contextlib
import logging
import sys

from moto.server import ThreadedMotoServer


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    with contextlib.redirect_stdout(sys.stderr):  # its own start line: stdout is the address's
        server.start()
    host, port = server.get_host_and_port()
    print(f"{host}:{port}", flush=True)
    sys.stdin.read()  # until the fixture closes it (or dies)
    server.stop()


if __name__ == "__main__":
    main()
