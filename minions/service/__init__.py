"""The run service: a REST API over the durable run store, a resumable live event stream
(Server-Sent Events), and a console page, served by FastAPI and uvicorn (the ``service`` extra:
``pip install 'minions[service]'``). See docs/service.md.

    from minions.service import ServiceConfig, create_app

    app = create_app(ServiceConfig(token="secret", recipes=Path("recipes")))
    # uvicorn.run(app)  -- or `minions serve --recipes recipes`
"""

from __future__ import annotations

from minions.service._app import create_app
from minions.service._config import ServiceConfig
from minions.service._serve import serve
from minions.service._token import TOKEN_ENV, Token, load_token

__all__ = ["TOKEN_ENV", "ServiceConfig", "Token", "create_app", "load_token", "serve"]
