"""Screenshots of the documentation site, for a person to look at: what a reader sees, math and figures included.

    .venv/bin/python docs/screenshots.py                      # build, serve, shoot the default pages
    .venv/bin/python docs/screenshots.py --out shots method/ reference/objectives/
    .venv/bin/python docs/screenshots.py --no-build --site site --height 4000

Builds the site (``mkdocs build --strict``, unless ``--no-build``), serves it on 127.0.0.1 (a free port,
this machine only), and opens each page in headless Chromium at a 1280 px wide window, saving
``<out>/<page>.png`` (default ``out``: ``site-screenshots/``). Chromium runs the page's scripts, so the
shots show MathJax's rendering, which the site carries itself: no network is used. Needs a Chromium
(``chromium``, ``chromium-browser`` or ``google-chrome`` on the PATH; ``apt-get install chromium`` on
Debian); without one it says so and exits 2.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The pages shot by default: the ones with math, figures and the most cross-references.
PAGES = (
    "", "method/", "benchmarks/", "environments/bandits/", "environments/token-tasks/", "environments/mnist/",
    "environments/reasoning-gym/", "getting-started/", "agents/tpo/", "reference/objectives/",
    "reference/envs/", "reference/evaluation/",
)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def build(site: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                   cwd=ROOT, env=env, check=True)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


def serve(site: Path) -> http.server.ThreadingHTTPServer:
    """A server of ``site`` on 127.0.0.1 at a free port, answering from a background thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def shoot(browser: str, url: str, path: Path, width: int, height: int) -> None:
    """``url`` as a ``width`` x ``height`` PNG at ``path``, after its scripts ran (``--virtual-time-budget``)."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", "--no-first-run", "--disable-extensions",
                        f"--window-size={width},{height}", "--virtual-time-budget=8000",
                        f"--screenshot={path}", url],
                       check=True, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", default=list(PAGES), help="site paths, e.g. method/ (default: a set)")
    parser.add_argument("--out", type=Path, default=ROOT / "site-screenshots", help="folder of the PNGs")
    parser.add_argument("--site", type=Path, default=None, help="built site (default: a fresh build in a temp dir)")
    parser.add_argument("--no-build", action="store_true", help="shoot --site as it is")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2400, help="the page's first HEIGHT pixels")
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print(f"no Chromium found (looked for {', '.join(BROWSERS)}): apt-get install chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if not args.no_build:
            build(site)
        server = serve(site)
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            for page in args.pages:
                name = page.strip("/").replace("/", "_") or "home"
                path = args.out / f"{name}.png"
                shoot(browser, f"http://127.0.0.1:{server.server_port}/{page.lstrip('/')}", path,
                      args.width, args.height)
                print(path)
        finally:
            server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
