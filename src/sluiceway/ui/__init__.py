"""``sluice ui``: a web console over :mod:`sluiceway.overview` (needs the ``ui`` extra:
Starlette, uvicorn, Jinja2). Server-rendered pages, no front-end build.

For example::

    from sluiceway.ui import Console, create_app
    app = create_app(Console(Workspace.from_file("sluice.yaml")))
"""

from sluiceway.overview.actions import launch_step
from sluiceway.ui.app import Console, create_app

__all__ = ["Console", "create_app", "launch_step"]
