"""A screenshot of a live Ray dashboard page, as docs/monitoring.md shows, with Debian's headless
chromium.

    python -m raydp_llm.train +experiment=smoke &          # a run to look at
    python docs/dashboard_screenshot.py --page '#/jobs' --out docs/dashboard-jobs.png

The dashboard wants its token, which chromium's command line cannot send: a small proxy on 127.0.0.1
adds the ``Authorization`` header to every request the page makes (a person pastes the token into
the dashboard once).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import threading
from pathlib import Path

import aiohttp
from aiohttp import web


def serve_with_token(dashboard: str, token: str, port: int) -> None:
    """Forward every request on 127.0.0.1:``port`` to ``dashboard`` with the token; runs until the
    process ends."""

    async def forward(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as session:
            async with session.request(request.method, f"{dashboard}{request.path_qs}",
                                       data=await request.read(),
                                       headers={"Authorization": f"Bearer {token}"}) as upstream:
                body = await upstream.read()
                return web.Response(body=body, status=upstream.status,
                                    content_type=upstream.content_type, charset=upstream.charset)

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    threading.Thread(target=asyncio.run, args=(main(),), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dashboard", default="http://127.0.0.1:8265")
    parser.add_argument("--page", default="#/jobs", help="the dashboard page, e.g. '#/jobs', "
                                                         "'#/actors', '#/train'")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--token-file", type=Path, default=Path.home() / ".ray" / "auth_token")
    parser.add_argument("--port", type=int, default=8299, help="the proxy's port on 127.0.0.1")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise SystemExit("chromium not found: apt-get install chromium")
    serve_with_token(args.dashboard.rstrip("/"), args.token_file.read_text().strip(), args.port)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1440,900", "--virtual-time-budget=15000",
                    f"--screenshot={args.out.resolve()}",
                    f"http://127.0.0.1:{args.port}/{args.page}"],
                   check=True, capture_output=True, timeout=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
