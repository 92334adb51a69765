"""The README is the newcomer's first ten minutes: its Quickstart must stay two commands, and no link in it
or in docs/ may point at a file that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def quickstart_commands() -> list[str]:
    section = ROOT.joinpath("README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_quickstart_is_two_commands_one_demo_one_tests():
    commands = quickstart_commands()
    assert len(commands) == 2, commands
    assert "cortex-nb demo" in commands[0] and "torch==2.13.0" in commands[0]
    assert commands[1] == "bash .ci/run"


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_shows_the_screenshots_the_browser_tests_take():
    text = ROOT.joinpath("README.md").read_text()
    for image in ("docs/images/job-widget.png", "docs/images/jupyterlab-sidebar.png"):
        assert f"({image})" in text
        assert ROOT.joinpath(image).stat().st_size > 10_000
