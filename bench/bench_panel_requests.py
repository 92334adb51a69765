"""How many requests the JupyterLab panel makes to follow one running training job, per second:
the sidebar alone, then the sidebar with the job's view open. A real backend, a real `jupyter lab`
and Debian's Chromium; a client drives a training loop (forward_backward + step) the whole time, and
every request the page sends under `{base_url}cortex/api/` is counted by route.

    python bench/bench_panel_requests.py [--seconds 30] [--root CHECKOUT]

`--root` runs the same measurement against another checkout's panel and server extension (e.g. the
main branch, with that checkout's Python: `/work/main/.venv/bin/python bench/bench_panel_requests.py
--root /work/main`), so a change is measured as a ratio against its baseline on the same machine.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import threading
from pathlib import Path

BATCH = {"input_ids": [[1, 2, 3, 4, 5, 6]], "target_tokens": [[2, 3, 4, 5, 6, 7]], "weights": [[1] * 6]}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def route_of(url: str) -> str:
    """`GET v1/jobs/{id}/logs` style keys, ids folded."""
    path = url.split("cortex/api/", 1)[1].split("?", 1)[0]
    return re.sub(r"(job|req)-[0-9a-f]+", r"{\1}", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each phase counts")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout whose panel is measured (its tests/ helpers start the servers)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.root))
    from playwright.sync_api import sync_playwright

    from cortex_nb import Client
    from tests.backend_process import start_backend
    from tests.jupyter_process import start_jupyter_for

    home = Path(tempfile.mkdtemp(prefix="bench-panel-"))
    backend = start_backend(home / "backend", "--devices", "cpu:2", "--worker-threads", "1")
    lab = start_jupyter_for(backend, home, app="lab")
    client = Client(backend.url, backend.token)
    stop = threading.Event()
    job_id = client.create_job([{"type": "training", "base_model": "tiny", "lora": {"r": 4}}], name="bench")[
        "job_id"
    ]
    client.wait_for_job(job_id, timeout_s=120)

    def train() -> None:
        while not stop.is_set():
            client.poll_request(job_id, client.forward_backward(job_id, BATCH), timeout_s=60)
            client.poll_request(job_id, client.step(job_id, 1e-3), timeout_s=60)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    counts: collections.Counter[str] = collections.Counter()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
            )
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.on(
                "request",
                lambda r: (
                    counts.update([f"{r.method} {route_of(r.url)}"]) if "cortex/api/" in r.url else None
                ),
            )
            page.goto(f"{lab.url}lab?token={lab.token}")
            page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
            if not page.locator("#cortex-nb-sidebar").is_visible():
                page.locator('.lm-TabBar-tab[data-id="cortex-nb-sidebar"]').click()
            row = page.locator(f'#cortex-nb-sidebar [data-job-id="{job_id}"]')
            row.wait_for(timeout=60_000)
            phases = {}
            for phase in ("sidebar", "sidebar + job view"):
                if phase != "sidebar":
                    row.click()
                    page.locator(f"#cortex-job-{job_id}").wait_for(timeout=60_000)
                # Playwright delivers request events while it waits, not during time.sleep.
                page.wait_for_timeout(3000)  # let the first fetches settle
                counts.clear()
                page.wait_for_timeout(args.seconds * 1000)
                phases[phase] = dict(counts)
            browser.close()
    finally:
        stop.set()
        trainer.join(60)
        client.cancel_job(job_id)
        client.close()
        lab.stop()
        backend.stop()
    for phase, seen in phases.items():
        total = sum(seen.values())
        print(f"{phase}: {total / args.seconds:.2f} requests/s over {args.seconds:.0f} s")
        for key, count in sorted(seen.items(), key=lambda item: -item[1]):
            print(f"  {count / args.seconds:6.2f}/s  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
