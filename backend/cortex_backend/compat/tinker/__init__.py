"""The Tinker API face: the published `tinker` SDK (and tinker-cookbook) against this backend.

See docs/tinker.md. `face.py` translates each operation into service calls, `messages.py` and
`protobuf_wire.py` are its codec, `handlers.py` and `routes.py` serve it.
"""

from .face import TinkerFace
from .handlers import url_specs

__all__ = ["TinkerFace", "url_specs"]
