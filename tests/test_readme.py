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


def readme_blocks(language: str) -> list[str]:
    text = ROOT.joinpath("README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split(f"```{language}\n")[1:]]


def test_a_laptop_is_told_how_to_get_the_cpu_build_of_torch():
    """PyPI's torch on Linux is the CUDA build: the README names PyTorch's CPU wheel index for a laptop."""
    commands = "\n".join(readme_blocks("bash"))
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in commands


def test_the_readme_train_cell_reads_data_that_ships_with_the_package():
    """Pasted as written, the README's Python cell and its `%%cortex train` spec find their data anywhere."""
    from cortex_nb.train_data import load_examples
    from cortex_nb.train_spec import spec_from

    setup = next(block for block in readme_blocks("python") if "%cortex connect --local" in block)
    namespace: dict = {}
    exec("\n".join(line for line in setup.splitlines() if not line.startswith("%")), namespace)
    train = next(block for block in readme_blocks("yaml") if block.startswith("%%cortex train"))
    spec, _, _ = spec_from(train.split("\n", 1)[1])
    assert load_examples(spec.data, namespace)[0].text.startswith("The lighthouse keeper")
    assert load_examples(spec.eval.data, namespace)


def test_the_sdk_facing_docs_show_the_tls_ca_line_for_tinker():
    for page in (ROOT / "README.md", ROOT / "docs" / "tinker.md"):
        assert "export SSL_CERT_FILE=DATA_DIR/tls/cert.pem" in page.read_text(), page


def test_the_notebook_count_and_run_times_agree_with_docs_notebooks():
    readme = ROOT.joinpath("README.md").read_text()
    shipped = sorted(ROOT.joinpath("notebooks").glob("*.ipynb"))
    assert "all eight" in readme and len(shipped) == 8
    times = re.findall(r"\| (\d+) s \|", ROOT.joinpath("docs", "notebooks.md").read_text())
    assert len(times) == 8 and max(map(int, times)) > 60  # so the README must not promise "under a minute"
    assert "under a minute" not in readme
