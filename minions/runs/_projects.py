"""Projects: what keeps teams apart on one store. A run, a schedule and an eval belong to one
project (``default`` unless named); a key has projects, and sees and acts only in them.

`ScopedRuns` is the one place where that holds: a `RunStore` seen through a `Scope`. It has
the operations the REST service's routes use, and nothing else; each one that takes an id
first reads the project of the run (a schedule, an eval) and answers as if it did not exist
when the scope does not see it (`UnknownRunError`: a 404, not a 403, so another project's
ids are not even confirmed), and each listing is narrowed in its SQL. A run's project never
changes after it is stored, so reading it first and acting after is no race.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions.errors import MinionsError, UnknownProjectError, UnknownRunError, UnknownScheduleError

if TYPE_CHECKING:
    from collections.abc import Callable

    from minions._fold import RunStates
    from minions.events import Event
    from minions.recipes import RecipeSpec
    from minions.recipes._internal import CatchUp, Overlap
    from minions.runs._diff import RunDiff
    from minions.runs._evals import EvalRecord
    from minions.runs._fleet import EndpointStatus, QueueState
    from minions.runs._keys import KeyRecord
    from minions.runs._notify import Delivery
    from minions.runs._prune import History
    from minions.runs._runs import RerunPlan, RunRecord, Submitted
    from minions.runs._schedules import ScheduleRecord
    from minions.runs._snapshot import RecipeNode
    from minions.runs._steps import StepDetail
    from minions.runs._store import RunFilters, RunStore, Who
    from minions.runs._usage import UsageReport
    from minions.runs._workers import WorkerRecord

__all__ = ["Scope", "ScopedRuns"]

DEFAULT_PROJECT = "default"
"""The project of what names none."""
PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A project's name."""


def check_project(name: str) -> str:
    """`name`, when it can name a project.

    Raises:
        ValueError: it cannot (the message says why).
    """
    if not isinstance(name, str) or not PROJECT.fullmatch(name):
        raise ValueError(
            f"project {name!r}: use 1 to 64 letters, digits, '_' or '-', starting with a "
            "letter or a digit"
        )
    return name


@dataclass(frozen=True, kw_only=True)
class Scope:
    """The projects a caller sees.

    Attributes:
        projects: those projects (None: every one; the server's token and admin keys).
    """

    projects: frozenset[str] | None = None

    @classmethod
    def of(cls, projects: Iterable[str] | None) -> Scope:
        """The scope of these projects (None: every one)."""
        return cls(projects=None if projects is None else frozenset(projects))

    @property
    def every(self) -> bool:
        return self.projects is None

    def sees(self, project: str) -> bool:
        return self.projects is None or project in self.projects

    @property
    def listed(self) -> tuple[str, ...] | None:
        """Its projects in order, for a query (None: no narrowing)."""
        return None if self.projects is None else tuple(sorted(self.projects))

    def project_for(self, given: str | None) -> str:
        """The project of something this caller makes: `given`, when it sees it; else its
        one project; else ``default`` for a caller of every project.

        Raises:
            ValueError: `given` is not a project's name.
            UnknownProjectError: `given` is not one of its projects.
            MinionsError: it names none and has several.
        """
        if given is not None:
            if not self.sees(check_project(given)):
                raise UnknownProjectError(given)
            return given
        if self.projects is None:
            return DEFAULT_PROJECT
        if len(self.projects) == 1:
            return next(iter(self.projects))
        raise MinionsError(
            f"this key has several projects ({', '.join(sorted(self.projects))}): name "
            "the one to use (`project`)"
        )

    def within(self, project: str | None) -> Scope:
        """This scope narrowed to `project` (None: as it is): what a listing asked for one
        project sees.

        Raises:
            ValueError: `project` is not a project's name.
            UnknownProjectError: it is not one of the scope's projects (one it does not see
                is as unknown as one that does not exist).
        """
        if project is None:
            return self
        if not self.sees(check_project(project)):
            raise UnknownProjectError(project)
        return Scope.of([project])


EVERY_PROJECT = Scope()


class ScopedRuns:
    """A `RunStore` as a caller of `scope` sees it (`RunStore.scoped`): the runs, schedules
    and evals of its projects only; the others are unknown to it.

    Args:
        store: the store.
        scope: the projects seen.
    """

    def __init__(self, store: RunStore, scope: Scope) -> None:
        self._store = store
        self.scope = scope

    def within(self, project: str | None) -> ScopedRuns:
        """The store as seen by this scope narrowed to `project` (see `Scope.within`): what
        a listing of one project reads.

        Raises:
            ValueError: `project` is not a project's name.
            UnknownProjectError: it is not one the scope sees.
        """
        narrowed = self.scope.within(project)
        return self if narrowed is self.scope else ScopedRuns(self._store, narrowed)

    async def projects(self) -> list[str]:
        """The projects it may pick, sorted: its own; for a scope of every project, every
        one the store knows (`RunStore.projects`)."""
        if self.scope.projects is not None:
            return sorted(self.scope.projects)
        return await self._store.projects()

    # -- what is checked before anything else --------------------------------------------------

    async def _run(self, run_id: str) -> None:
        """Raises `UnknownRunError` unless the run is of a project the scope sees."""
        if self.scope.every:
            return
        from minions.runs import _runs

        project = await self._store._database.apply(_runs.project_of, run_id)
        if not self.scope.sees(project):
            raise UnknownRunError(run_id)

    async def _schedule(self, name: str) -> ScheduleRecord:
        record = await self._store.schedule(name)
        if not self.scope.sees(record.project):
            raise UnknownScheduleError(name)
        return record

    # -- runs ------------------------------------------------------------------------------------

    async def submit(
        self,
        recipe: str | Path,
        inputs: Mapping[str, Any] | None = None,
        *,
        project: str | None = None,
        idempotency_key: str | None = None,
        actor: Who = None,
    ) -> Submitted:
        """`RunStore.submit`, in `project` (see `Scope.project_for`)."""
        return await self._store.submit(
            recipe,
            inputs,
            idempotency_key=idempotency_key,
            actor=actor,
            project=self.scope.project_for(project),
        )

    async def submit_yaml(
        self,
        text: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        base: str | Path,
        project: str | None = None,
        idempotency_key: str | None = None,
        check: Callable[[RecipeSpec], object] | None = None,
        actor: Who = None,
    ) -> Submitted:
        """`RunStore.submit_yaml`, in `project` (see `Scope.project_for`)."""
        return await self._store.submit_yaml(
            text,
            inputs,
            base=base,
            idempotency_key=idempotency_key,
            check=check,
            actor=actor,
            project=self.scope.project_for(project),
        )

    async def get(self, run_id: str) -> RunRecord:
        record = await self._store.get(run_id)
        if not self.scope.sees(record.project):
            raise UnknownRunError(run_id)
        return record

    async def recipe_yaml(self, run_id: str) -> str:
        await self._run(run_id)
        return await self._store.recipe_yaml(run_id)

    async def recipe_graph(self, run_id: str) -> tuple[RecipeNode, ...]:
        await self._run(run_id)
        return await self._store.recipe_graph(run_id)

    async def list_runs(
        self, *, limit: int = 50, before: tuple[float, str] | None = None, **which: Any
    ) -> list[RunRecord]:
        return await self._store.list_runs(limit=limit, before=before, **self._narrowed(which))

    async def count_runs(self, **which: Any) -> int:
        return await self._store.count_runs(**self._narrowed(which))

    def _narrowed(self, which: Mapping[str, Any]) -> RunFilters:
        """`which`, narrowed to the scope's projects.

        Raises:
            UnknownProjectError: `which` names a project the scope does not see.
        """
        narrowed: Any = dict(which)
        asked = narrowed.get("project")
        if asked is not None and not self.scope.sees(asked):
            raise UnknownProjectError(asked)
        if self.scope.projects is not None:
            narrowed["projects"] = self.scope.listed  # `project` narrows it further
        return narrowed  # type: ignore[no-any-return]

    async def history(self) -> History:
        return await self._store.history()

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        await self._run(run_id)
        return await self._store.events(run_id, after=after, limit=limit)

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        await self._run(run_id)
        async for event in self._store.follow(run_id, after=after):
            yield event

    async def step_states(self, run: str | RunRecord) -> RunStates:
        await self._run(run if isinstance(run, str) else run.run_id)
        return await self._store.step_states(run)

    async def step_detail(self, run_id: str, step_id: str) -> StepDetail:
        await self._run(run_id)
        return await self._store.step_detail(run_id, step_id)

    async def diff(self, run_a: str, run_b: str, *, max_values: int | None = None) -> RunDiff:
        await self._run(run_a)
        await self._run(run_b)
        return await self._store.diff(run_a, run_b, max_values=max_values)

    async def cancel(self, run_id: str, *, wait: float = 0.0, actor: Who = None) -> Any:
        await self._run(run_id)
        return await self._store.cancel(run_id, wait=wait, actor=actor)

    async def resume(self, run_id: str, *, actor: Who = None) -> RunRecord:
        await self._run(run_id)
        return await self._store.resume(run_id, actor=actor)

    async def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        approved: bool,
        reason: str | None = None,
        actor: Who = None,
    ) -> RunRecord:
        await self._run(run_id)
        return await self._store.approve(
            run_id, call_id, approved=approved, reason=reason, actor=actor
        )

    async def rerun(self, run_id: str, **given: Any) -> RerunPlan:
        """`RunStore.rerun`: the rerun is of its parent's project."""
        await self._run(run_id)
        return await self._store.rerun(run_id, **given)

    # -- schedules -------------------------------------------------------------------------------

    async def add_schedule(
        self,
        recipe: str | Path,
        *,
        cron: str | None = None,
        every: str | int | None = None,
        inputs: Mapping[str, Any] | None = None,
        name: str | None = None,
        timezone: str | None = None,
        catch_up: CatchUp | None = None,
        overlap: Overlap | None = None,
        replace: bool = False,
        actor: Who = None,
        project: str | None = None,
    ) -> ScheduleRecord:
        """`RunStore.add_schedule`, in `project` (see `Scope.project_for`)."""
        return await self._store.add_schedule(
            recipe,
            cron=cron,
            every=every,
            inputs=inputs,
            name=name,
            timezone=timezone,
            catch_up=catch_up,
            overlap=overlap,
            replace=replace,
            actor=actor,
            project=self.scope.project_for(project),
        )

    async def endpoint_status(self) -> list[EndpointStatus]:
        """The model endpoints' load and lessons: shared by every project (no run of any
        is named)."""
        return await self._store.endpoint_status()

    async def queue(self, *, limit: int = 20) -> QueueState:
        """The backlog of its projects' runs."""
        return await self._store.queue(limit=limit, projects=self.scope.projects)

    async def usage(
        self,
        *,
        since: float,
        until: float | None = None,
        group_by: Sequence[str] = ("day",),
        project: str | None = None,
    ) -> UsageReport:
        """The tokens and cost of its projects' runs (of `project` alone, when given).

        Raises:
            UnknownProjectError: `project` is not one of its projects.
            ValueError: a group that is not one of `RunStore.usage`'s.
        """
        projects = self.scope.projects
        if project is not None:
            if not self.scope.sees(project):
                raise UnknownProjectError(project)
            projects = frozenset((project,))
        return await self._store.usage(
            since=since, until=until, group_by=group_by, projects=projects
        )

    async def notifications(self) -> list[Delivery]:
        """How notifications fared: the server's configuration, seen by keys of every
        project only (an admin's); none for a key of some projects."""
        return await self._store.notifications() if self.scope.every else []

    async def waiting_approvals(self) -> int:
        """How many calls of its projects' runs wait for a person's decision."""
        return await self._store.waiting_approvals(self.scope.projects)

    async def schedules(self) -> list[ScheduleRecord]:
        return [s for s in await self._store.schedules() if self.scope.sees(s.project)]

    async def schedule(self, name: str) -> ScheduleRecord:
        return await self._schedule(name)

    async def pause_schedule(self, name: str, *, actor: Who = None) -> ScheduleRecord:
        await self._schedule(name)
        return await self._store.pause_schedule(name, actor=actor)

    async def resume_schedule(self, name: str, *, actor: Who = None) -> ScheduleRecord:
        await self._schedule(name)
        return await self._store.resume_schedule(name, actor=actor)

    async def remove_schedule(self, name: str, *, actor: Who = None) -> None:
        await self._schedule(name)
        await self._store.remove_schedule(name, actor=actor)

    # -- evals, workers, keys --------------------------------------------------------------------

    async def evals(
        self, *, limit: int = 50, before: tuple[float, str] | None = None
    ) -> list[EvalRecord]:
        return await self._store.evals(limit=limit, before=before, projects=self.scope.listed)

    async def eval(self, eval_id: str) -> EvalRecord | None:
        record = await self._store.eval(eval_id)
        return record if record is not None and self.scope.sees(record.project) else None

    async def workers(self) -> list[WorkerRecord]:
        """The workers, with only the runs in hand this scope sees."""
        import dataclasses

        found = await self._store.workers()
        if self.scope.every:
            return found
        seen: dict[str, bool] = {}
        for run_id in {run_id for w in found for run_id in w.runs}:
            try:
                await self._run(run_id)
                seen[run_id] = True
            except UnknownRunError:  # another project's, or pruned since
                seen[run_id] = False
        return [dataclasses.replace(w, runs=[r for r in w.runs if seen[r]]) for w in found]

    async def key_by_id(self, key_id: str) -> KeyRecord | None:
        return await self._store.key_by_id(key_id)
