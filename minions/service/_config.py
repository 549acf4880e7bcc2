"""What a service process serves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServiceConfig"]


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """What a service process serves.

    Attributes:
        token: the bearer token every request but the probes (``/health``,
            ``/health/live``, ``/health/ready``) and the console's static page must carry.
        database_url: the run store (see `minions.runs.database_url`).
        recipes: the folder of the recipes clients may run by id (None: none), for every
            project that has no folder of its own.
        project_recipes: the folders of projects that have their own: a project named here
            is offered its folder's recipes only (and its inline recipes may name its
            folder's modules only).
        allow_inline_recipes: accept recipe YAML in a submission; it may still name only
            built-in tools and tools modules of `recipes`, and models served where `model` is.
        model: the model of runs whose recipe names none (`minions serve` takes
            ``MINIONS_MODEL``): a model string. An inline recipe may name only models of its
            provider and base URL.
        max_body_bytes: a larger request body is refused with 413.
        request_timeout: seconds a client may take to send a request's head, and then its
            body; a slower connection is closed (a slower body is a 408).
        max_connections: connections served at once (more are closed as they come); kept
            below the process's descriptor limit.
        heartbeat: seconds of silence after which an event stream sends a comment line.
        poll: seconds between a followed run's reads of the store when nothing woke it.
        metrics: serve ``GET /metrics`` (Prometheus text: this process's metrics and the
            store's gauges); it needs a key (a viewer's will do) unless `metrics_public`.
        metrics_public: serve ``/metrics`` without the token (to a scraper on a trusted
            network; it names recipes, steps, schedules and endpoints).
        max_diff_values: the most JSON values of step outputs (both runs together) a diff
            compares; a bigger one is a 422 (None: the store's default, 500,000).
        proxy_user_header: a header (``X-Forwarded-User``) that names the user of a request
            coming from one of `trusted_proxies`, an authenticating proxy (SSO): the user is
            the named key of that name, with its role, without the key itself.
        trusted_proxies: the addresses (or networks, ``10.0.0.0/24``) of those proxies, as
            the server sees its peers.
    """

    token: str = field(repr=False)
    database_url: str | None = None
    recipes: Path | None = None
    project_recipes: Mapping[str, Path] = field(default_factory=dict)
    allow_inline_recipes: bool = False
    model: str | None = None
    max_body_bytes: int = 1 << 20
    request_timeout: float = 10.0
    max_connections: int = 2000
    heartbeat: float = 15.0
    poll: float = 0.1
    metrics: bool = False
    metrics_public: bool = False
    max_diff_values: int | None = None
    proxy_user_header: str | None = None
    trusted_proxies: tuple[str, ...] = ()
