"""One place for the release and wire-protocol versions shared by client and backend."""

__version__ = "0.1.0"

# Clients refuse a backend whose API major differs; minor bumps only add.
API_VERSION = "1.0"


def api_major(version: str) -> int:
    """The major part of an `API_VERSION`-style string."""
    return int(version.split(".", 1)[0])
