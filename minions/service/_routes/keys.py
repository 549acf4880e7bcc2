"""``/keys``: the named API keys of the store, for admins: list, add (the key is in the answer,
once), revoke. `minions keys` does the same on the store directly."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from pydantic import AliasPath, BaseModel, ConfigDict, Field

from minions.runs import Role
from minions.service._access import Admin
from minions.service._deps import WholeStore
from minions.service._errors import ERRORS, Refused

__all__: list[str] = []

router = APIRouter(responses=ERRORS)


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        max_length=64,
        description="Who the key is (lowercase letters, digits, '.', '_', '-'): what the "
        "history records for what it does.",
    )
    role: Role = Field(description="viewer, approver, operator or admin.")
    projects: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=100,
        description="Its projects (default: default); stored and listed, not enforced yet.",
    )


class NewKeyOut(BaseModel):
    """A key just added (`NewKey`): its record's name, role and projects, and the key."""

    model_config = ConfigDict(from_attributes=True)

    name: str = Field(validation_alias=AliasPath("record", "name"))
    key: str = Field(description="The key: shown this once, only its hash is stored.")
    role: Role = Field(validation_alias=AliasPath("record", "role"))
    projects: list[str] = Field(validation_alias=AliasPath("record", "projects"))


class KeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    role: Role
    projects: list[str]
    created_at: float
    created_by: str | None


@router.get("/keys", response_model=list[KeyOut])
async def list_keys(caller: Admin, runs: WholeStore) -> list[KeyOut]:
    """The keys that work, by name (never the keys themselves)."""
    return [KeyOut.model_validate(r) for r in await runs.keys()]


@router.post("/keys", status_code=201, response_model=NewKeyOut)
async def add_key(caller: Admin, body: KeyRequest, runs: WholeStore) -> NewKeyOut:
    """Add a key; the answer holds it, once (a name a working key has is a 409
    `key_exists`)."""
    try:
        made = await runs.add_key(
            body.name, role=body.role, projects=body.projects, actor=caller.actor
        )
    except ValueError as exc:
        raise Refused(400, str(exc)) from None
    return NewKeyOut.model_validate(made)


@router.delete("/keys/{name}", status_code=204)
async def revoke_key(
    caller: Admin,
    name: Annotated[str, PathParam(description="The key's name.", max_length=64)],
    runs: WholeStore,
) -> Response:
    """Revoke a key: its next request is a 401, and its open event streams end."""
    await runs.revoke_key(name, actor=caller.actor)
    return Response(status_code=204)
