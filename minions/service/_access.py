"""Who a request is, and what it may do: the caller the guard found (a named key, or the
server's token), and one FastAPI dependency per permission, which every route declares in its
signature (`Reader`, `Approver`, `Operator`, `Admin`, or `Public` for what strangers may
read). `undeclared` names the routes that declare none or several: the app refuses to start
with one, so a new route cannot forget its permission."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute

from minions.runs import ROLES, Actor, Role, Scope
from minions.service._errors import Refused

__all__: list[str] = []

Permission = Literal["public", "read", "approve", "operate", "admin"]
NEEDS: dict[Permission, Role | None] = {
    "public": None,
    "read": "viewer",
    "approve": "approver",
    "operate": "operator",
    "admin": "admin",
}
"""The least role each permission needs (each role may do what the ones before it may)."""
CALLER = "minions.caller"
"""The key of a request's scope where the guard puts its `Caller`."""
TOKEN_ACTOR = "token"
"""The actor recorded for requests made with the server's token (``MINIONS_API_TOKEN``)."""


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who made a request.

    Attributes:
        name: the actor recorded for what it changes: the key's name, or ``token``.
        role: what it may do.
        projects: the key's projects (an admin sees every one, whatever it names).
        key_id: the key's id (stream tickets name it), or ``token``.
        address: where the request came from (the TCP peer's address).
    """

    name: str
    role: Role
    projects: tuple[str, ...] = ()
    key_id: str = TOKEN_ACTOR
    address: str | None = None

    @property
    def actor(self) -> Actor:
        """Who the run store records as making the changes of this request, and from
        where."""
        return Actor(name=self.name, address=self.address)

    @property
    def scope(self) -> Scope:
        """The projects it sees: an admin's (and the token's) are every one."""
        return Scope() if self.role == "admin" else Scope.of(self.projects)

    @property
    def revocable(self) -> bool:
        """A named key (the token lasts as long as the server's configuration)."""
        return self.key_id != TOKEN_ACTOR

    def may(self, permission: Permission) -> bool:
        least = NEEDS[permission]
        return least is None or ROLES.index(self.role) >= ROLES.index(least)


TOKEN_CALLER = Caller(name=TOKEN_ACTOR, role="admin")


def _caller(request: Request, permission: Permission) -> Caller:
    caller: Caller | None = request.scope.get(CALLER)
    if caller is None:  # the guard lets no request without one reach a route but public ones
        raise Refused(401, "this endpoint needs an Authorization: Bearer <key> header")
    if not caller.may(permission):
        least = NEEDS[permission]
        raise Refused(
            403,
            f"key {caller.name!r} is {caller.role}; this needs the {least} role or above",
            "forbidden",
        )
    return caller


def _public() -> None:
    """Anyone (no key needed)."""


def _read(request: Request) -> Caller:
    return _caller(request, "read")


def _approve(request: Request) -> Caller:
    return _caller(request, "approve")


def _operate(request: Request) -> Caller:
    return _caller(request, "operate")


def _admin(request: Request) -> Caller:
    return _caller(request, "admin")


def _scrape(request: Request) -> Caller | None:
    """``/metrics``: a reader, unless the server serves it publicly (``--metrics-public``)."""
    if request.scope["path"] in request.app.state.public:
        return None
    return _caller(request, "read")


PERMISSIONS: dict[Callable[..., Any], Permission] = {
    _public: "public",
    _read: "read",
    _approve: "approve",
    _operate: "operate",
    _admin: "admin",
    _scrape: "read",
}
"""Each permission's dependency, as routes declare it."""

Public = Annotated[None, Depends(_public)]
Reader = Annotated[Caller, Depends(_read)]
Approver = Annotated[Caller, Depends(_approve)]
Operator = Annotated[Caller, Depends(_operate)]
Admin = Annotated[Caller, Depends(_admin)]
Scraper = Annotated[Caller | None, Depends(_scrape)]
"""A reader, or anyone when the server makes ``/metrics`` public."""


def permission_of(route: APIRoute) -> Permission | None:
    """The permission `route` declares (None: none, or several)."""
    found = {PERMISSIONS[d.call] for d in route.dependant.dependencies if d.call in PERMISSIONS}
    return found.pop() if len(found) == 1 else None


def api_routes(app: FastAPI) -> list[tuple[str, str, APIRoute]]:
    """Each method and path the app's routes serve (those of included routers too), with its
    route; FastAPI's own (``/openapi.json``) are not theirs."""
    from fastapi.routing import iter_route_contexts

    found = []
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute):
            found += [(m, context.path or route.path, route) for m in sorted(route.methods or ())]
    return found


WHOLE_STORE: dict[str, str] = {
    "/metrics": "the store's gauges: counts over every project, no row of any",
}
"""The routes, besides admins' and public ones, that may take the whole store, and why."""


def _takes(route: APIRoute, name: str) -> bool:
    """Whether `route` depends, at any depth, on the dependency function called `name` of
    `minions.service._deps`."""
    found = [route.dependant]
    while found:
        dependant = found.pop()
        for sub in dependant.dependencies:
            call = sub.call
            if getattr(call, "__module__", "") == "minions.service._deps" and (
                getattr(call, "__name__", "") == name
            ):
                return True
            found.append(sub)
    return False


def scoped(route: APIRoute) -> bool:
    """Whether `route` reaches the store as its caller sees it (`_deps.Runs`)."""
    return _takes(route, "_scoped")


def unscoped(app: FastAPI) -> list[str]:
    """The routes of `app` that could reach another project's rows (``METHOD path``): those
    that take the whole store without being an admin's, public, or in `WHOLE_STORE`, and
    those that take an id in their path without the scoped store."""
    wrong = []
    for method, path, route in api_routes(app):
        trusted = permission_of(route) in ("admin", "public")
        whole = _takes(route, "_whole") and not trusted and path not in WHOLE_STORE
        takes_id = "{" in path and not trusted
        if whole or (takes_id and not scoped(route)):
            wrong.append(f"{method} {path}")
    return wrong


def undeclared(app: FastAPI) -> list[str]:
    """The routes of `app` that declare no permission, or several (``METHOD path``)."""
    return [
        f"{method} {path}"
        for method, path, route in api_routes(app)
        if permission_of(route) is None
    ]
