"""pytest-jupyter's fixtures (jp_fetch, jp_serverapp, ...) and its async-test hooks, for this folder
only: loaded as a plugin they would wrap every test in the suite (autouse event loops, ServerApp cleanup)."""

from pytest_jupyter.jupyter_server import *  # noqa: F403
