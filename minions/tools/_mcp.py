"""MCP servers as tools: their configuration, the names their tools get, and the connections
of one run.

A server named ``files`` offering ``read_file`` contributes the tool ``files_read_file``; a
step asks for it as ``files.read_file`` (or for all of the server's tools as ``files.*``).
The MCP Python SDK (``pip install 'minions[mcp]'``) is imported only when a run connects.

Each server is served by one task of its own that opens the connection, lists the tools,
refreshes them when the server says they changed, and closes the connection: the SDK's
transports must be entered and left in the same task, and a server that dies takes only
that task down, never the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from minions._log import info, warn
from minions._text import cut_note
from minions.errors import MCPServerError, Problem, RecipeError, ToolError
from minions.tools._builtin import MAX_HTTP_CHARS
from minions.tools._mcp_stderr import StderrTail
from minions.tools._tool import Tool, ToolRegistry

__all__ = ["MCPHttpServer", "MCPStdioServer"]

DEFAULT_TIMEOUT = 30.0
"""Seconds a server has to start and list its tools, and to answer each tool call."""

MAX_RESULT_CHARS = MAX_HTTP_CHARS
"""The most characters of an MCP tool's result the model gets, as for `http_get`: a longer
result is cut, with a note saying so."""

SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_VARIABLE = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, kw_only=True)
class MCPStdioServer:
    """An MCP server started as a child process, spoken to over its stdin and stdout.

    The child gets only `env` and what it needs to start: on POSIX ``HOME``, ``LOGNAME``,
    ``PATH``, ``SHELL``, ``TERM`` and ``USER`` from the run's environment (on Windows the
    MCP SDK's list: ``APPDATA``, ``PATH``, ``SYSTEMROOT``, ``TEMP``, ``USERPROFILE`` and a few
    more). Nothing else of the run's environment reaches it: pass a secret as
    ``env={"TOKEN": "${TOKEN}"}``.

    Args:
        command: the program (looked up on ``PATH``).
        args: its arguments.
        env: its environment variables (over the ones above).
        cwd: its working directory; the current one by default (a YAML recipe's folder for a
            recipe loaded from a file).
        timeout: seconds it has to start and list its tools, and to answer each tool call.
    """

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | Path | None = None
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", dict(self.env))

    def describe(self) -> str:
        """The server as logs and errors name it (its command line)."""
        return " ".join(["stdio:", self.command, *self.args])


@dataclass(frozen=True, kw_only=True)
class MCPHttpServer:
    """An MCP server reached over streamable HTTP.

    Args:
        url: its endpoint, e.g. ``http://127.0.0.1:8000/mcp``.
        headers: sent with every request (``{"Authorization": "Bearer ${TOKEN}"}``).
        timeout: seconds it has to connect and list its tools, and to answer each tool call.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", dict(self.headers))

    def describe(self) -> str:
        """The server as logs and errors name it (its URL, without credentials)."""
        return f"http: {_without_credentials(self.url)}"


def _without_credentials(url: str) -> str:
    """The URL without user, password, query or fragment (where tokens hide)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(an invalid URL)"
    netloc = (parts.hostname or "") + (f":{port}" if port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc, query="", fragment=""))


MCPServerConfig = MCPStdioServer | MCPHttpServer | Any
"""A server of `mcp_servers`: an `MCPStdioServer`, an `MCPHttpServer`, or (in tests) an
in-process server of the MCP SDK (``mcp.server.mcpserver.MCPServer``)."""


# -- configuration -------------------------------------------------------------------------------


def expand(
    text: str, where: str, problems: list[Problem], environ: Mapping[str, str] | None = None
) -> str:
    """`text` with each ``${VAR}`` replaced by the environment variable (``$${VAR}`` is the
    text ``${VAR}``); a variable that is not set is a problem naming it and `where`."""
    env = os.environ if environ is None else environ

    def replace(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return "${" + name + "}"
        value = env.get(name)
        if value is None:
            problems.append(
                Problem(message=f"environment variable {name!r} is not set", field=where)
            )
            return ""
        return value

    return _VARIABLE.sub(replace, text)


_STDIO_KEYS = ("command", "args", "env", "cwd", "timeout")
_HTTP_KEYS = ("url", "headers", "timeout")


def server_config(
    name: str,
    value: Any,
    problems: list[Problem],
    *,
    base: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> MCPServerConfig | None:
    """One server of `mcp_servers` as a config, ``${VAR}`` expanded; what is wrong goes to
    `problems` (each naming ``mcp_servers.NAME.FIELD``). A mapping with ``command`` is a stdio
    server, one with ``url`` an HTTP server; configs and in-process servers pass as they are.
    `base` is the working directory of a stdio server that names none."""
    where = f"mcp_servers.{name}"
    if not isinstance(name, str) or not SERVER_NAME.match(name):
        problems.append(
            Problem(
                message=f"MCP server name {name!r} must be a letter then letters, digits, '_' "
                "or '-' (at most 32)",
                field=where,
            )
        )
        return None
    if isinstance(value, MCPStdioServer | MCPHttpServer) or not isinstance(value, Mapping):
        if isinstance(value, str | bytes | int | float | list | tuple) or value is None:
            problems.append(
                Problem(
                    message="an MCP server is a mapping with `command` (stdio) or `url` (HTTP)",
                    field=where,
                )
            )
            return None
        return value
    kind_keys = [k for k in ("command", "url") if k in value]
    if len(kind_keys) != 1:
        found = "both" if kind_keys else "neither"
        problems.append(
            Problem(
                message=f"an MCP server needs exactly one of `command` (stdio) or `url` "
                f"(streamable HTTP); it has {found}",
                field=where,
            )
        )
        return None
    allowed = _STDIO_KEYS if kind_keys[0] == "command" else _HTTP_KEYS
    before = len(problems)
    for key in value:
        if key not in allowed:
            from minions.errors import did_you_mean

            problems.append(
                Problem(
                    message=f"unknown field {key!r}{did_you_mean(str(key), allowed)}; an MCP "
                    f"server over {'stdio' if kind_keys[0] == 'command' else 'HTTP'} has: "
                    f"{', '.join(allowed)}",
                    field=f"{where}.{key}",
                )
            )

    def text(key: str, raw: Any) -> str:
        if not isinstance(raw, str | int | float) or isinstance(raw, bool):
            problems.append(Problem(message="must be text", field=f"{where}.{key}"))
            return ""
        return expand(str(raw), f"{where}.{key}", problems, environ)

    def mapping(key: str) -> dict[str, str]:
        raw = value.get(key) or {}
        if not isinstance(raw, Mapping):
            problems.append(Problem(message="must be a mapping", field=f"{where}.{key}"))
            return {}
        return {str(k): text(f"{key}.{k}", v) for k, v in raw.items()}

    timeout = value.get("timeout", DEFAULT_TIMEOUT)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        problems.append(
            Problem(message=f"timeout must be a positive number, not {timeout!r}", field=where)
        )
        timeout = DEFAULT_TIMEOUT
    if kind_keys[0] == "url":
        url = text("url", value["url"])
        if url and not url.startswith(("http://", "https://")):
            problems.append(
                Problem(message="url must start with http:// or https://", field=f"{where}.url")
            )
        headers = mapping("headers")
        if len(problems) > before:
            return None
        return MCPHttpServer(url=url, headers=headers, timeout=float(timeout))
    args = value.get("args") or []
    if isinstance(args, str) or not isinstance(args, Sequence):
        problems.append(Problem(message="must be a list", field=f"{where}.args"))
        args = []
    command = text("command", value["command"])
    if not command.strip():
        problems.append(Problem(message="command is empty", field=f"{where}.command"))
    expanded_args = [text(f"args.{i}", a) for i, a in enumerate(args)]
    env = mapping("env")
    cwd_raw = value.get("cwd")
    cwd: Path | None = base
    if cwd_raw is not None:
        cwd = Path(text("cwd", cwd_raw))
        if base is not None:
            cwd = base / cwd
    if len(problems) > before:
        return None
    return MCPStdioServer(
        command=command, args=expanded_args, env=env, cwd=cwd, timeout=float(timeout)
    )


def server_configs(
    servers: Mapping[str, Any], *, base: Path | None = None
) -> dict[str, MCPServerConfig]:
    """`mcp_servers` as configs (see `server_config`).

    Raises:
        RecipeError: every problem, each naming its server and field (a variable that is not
            set names the variable).
    """
    problems: list[Problem] = []
    configs: dict[str, MCPServerConfig] = {}
    for name, value in servers.items():
        config = server_config(name, value, problems, base=base)
        if config is not None:
            configs[name] = config
    if problems:
        raise RecipeError(problems)
    return configs


def describe_server(config: MCPServerConfig) -> str:
    """How a server is reached, for people (no secrets: no env, no headers)."""
    if isinstance(config, MCPStdioServer | MCPHttpServer):
        return config.describe()
    return f"in-process: {type(config).__name__}"


# -- names ---------------------------------------------------------------------------------------


def exposed_name(server: str, tool: str) -> str:
    """The name the model sees for `tool` of `server`: ``server_tool``, with characters a
    model API refuses replaced by ``_`` and, past 64 characters, cut short with a hash of the
    whole name (so two long names stay apart)."""
    name = _UNSAFE.sub("_", f"{server}_{tool}")
    if len(name) > 64:
        digest = hashlib.sha1(f"{server}.{tool}".encode()).hexdigest()[:8]
        name = f"{name[:55]}_{digest}"
    return name


def is_reference(name: str) -> bool:
    """Whether a step's tool name is an MCP reference (``server.tool`` or ``server.*``)."""
    return "." in name


def split_reference(name: str) -> tuple[str, str]:
    """``("files", "read_file")`` for ``files.read_file`` (tool names may hold dots)."""
    server, _, tool = name.partition(".")
    return server, tool


# -- tools ---------------------------------------------------------------------------------------


class MCPTool(Tool):
    """A tool of an MCP server, as a `Tool`: called on the server with its own name."""

    origin: tuple[str, str]

    def __init__(
        self,
        *,
        server: str,
        remote_name: str,
        description: str,
        input_schema: Mapping[str, Any],
        call: Callable[[str, dict[str, Any]], Any],
    ) -> None:
        # Not Tool.__init__: there is no Python function to read a signature from.
        self.name = exposed_name(server, remote_name)
        self.origin = (server, remote_name)
        self.requires_approval = False
        self.side_effects = True  # a server's tool may do anything
        self.is_async = True
        self.run_in_thread = False
        self._description = self._summary = description
        self._schema = dict(input_schema)
        self._schema.setdefault("type", "object")
        self._schema.setdefault("properties", {})
        self._call = call

        async def invoke(**arguments: Any) -> Any:
            return await call(remote_name, arguments)

        self.fn = invoke

    @property
    def description(self) -> str:
        return self._summary

    @property
    def parameters(self) -> Mapping[str, Any]:
        return self._schema

    def problems(self) -> list[str]:
        return []

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check arguments against the server's JSON Schema (the server checks them too).

        Raises:
            ToolError: naming each invalid argument, for the model to correct.
        """
        validator = self._validator
        if validator is None:
            return dict(arguments)  # a schema that is not one: the server judges
        errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.path))
        if errors:
            problems = "; ".join(
                f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in errors
            )
            raise ToolError(f"Invalid arguments for tool {self.name!r}: {problems}.")
        return dict(arguments)

    @cached_property
    def _validator(self) -> Any:
        import jsonschema

        validator_class = jsonschema.validators.validator_for(self._schema)
        try:
            validator_class.check_schema(self._schema)
        except jsonschema.SchemaError:
            return None
        return validator_class(self._schema)

    def argument_problem(self, name: str, value: Any) -> str | None:
        properties = self._schema.get("properties") or {}
        if name not in properties and self._schema.get("additionalProperties") is False:
            return f"tool {self.name!r} has no parameter {name!r}"
        return None

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.origin[0]!r})"


def _capped(value: Any) -> Any:
    """`value` as it is when its text fits `MAX_RESULT_CHARS`, else its text cut there with a
    note the model sees (structured content becomes its JSON text, cut)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= MAX_RESULT_CHARS:
        return value
    return text[:MAX_RESULT_CHARS] + cut_note(len(text), MAX_RESULT_CHARS, "characters")


def _result(server: str, tool: str, result: Any) -> Any:
    """What a call's result gives the model, at most `MAX_RESULT_CHARS` of it; an
    ``is_error`` result is a `ToolError` with the server's message.

    The structured result (``structuredContent``) is the value when the content is only text
    (which the spec asks to be that value's JSON) or nothing: a typed value, which a tool
    step's output keeps. Content with anything else (an image, an audio clip, a resource) is
    what the server means the model to read, and the structured result may hold the same bytes
    as base64: then the content blocks are the value, each as text (`_block_text`).
    """
    blocks = list(result.content or [])
    if result.is_error:
        message = _capped("\n".join(_block_text(b) for b in blocks) or "no message")
        raise ToolError(f"MCP tool {tool!r} of server {server!r} failed: {message}")
    structured = result.structured_content
    if structured is not None and all(getattr(b, "type", None) == "text" for b in blocks):
        # The SDK wraps a plain return value as {"result": value}.
        if isinstance(structured, Mapping) and list(structured) == ["result"]:
            return _capped(structured["result"])
        return _capped(structured)
    return _capped("\n".join(_block_text(b) for b in blocks))


def _block_text(block: Any) -> str:
    """One content block as the model reads it: text as it is, an embedded text resource as
    its text under its URI, a resource link as its URI, and binary content (images, audio,
    blobs) as a short placeholder with its type and size, never as base64 (minions' messages
    hold text only, so no model gets the bytes themselves)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {_binary(block.mime_type, block.data)}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        header = _described(str(resource.uri), getattr(resource, "mime_type", None))
        if isinstance(text, str):
            return f"[resource {header}]\n{text}"
        blob = getattr(resource, "blob", "") or ""
        return f"[resource {resource.uri}: {_binary(resource.mime_type, blob)}]"
    if kind == "resource_link":
        details = [d for d in (getattr(block, "mime_type", None), _size(block.size)) if d]
        name = getattr(block, "title", None) or block.name
        said = f"[resource link: {name} <{block.uri}>"
        said += f" ({', '.join(details)})" if details else ""
        description = getattr(block, "description", None)
        return said + (f": {description}]" if description else "]")
    return f"[{kind or type(block).__name__} content]"


def _described(uri: str, mime_type: str | None) -> str:
    return f"{uri} ({mime_type})" if mime_type else uri


def _binary(mime_type: str | None, data: str | bytes) -> str:
    """``image/png, 150 KB`` for base64 `data` of that type."""
    size = _size(_decoded_size(data))
    return ", ".join(d for d in (mime_type or "unknown type", size) if d)


def _decoded_size(data: str | bytes) -> int:
    """How many bytes base64 `data` decodes to (without decoding it)."""
    text = data.decode("ascii", "replace") if isinstance(data, bytes) else data
    stripped = text.strip().rstrip("=")
    return len(stripped) * 3 // 4


def _size(size: int | None) -> str:
    if size is None:
        return ""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def _import_mcp() -> Any:
    try:
        import mcp
    except ImportError:
        raise MCPServerError("MCP servers need the MCP SDK: pip install 'minions[mcp]'") from None
    logging.getLogger("mcp.client.stdio").addFilter(_NOT_JSON_RPC)  # once: filters are a set
    return mcp


_SERVING: ContextVar[MCPConnection | None] = ContextVar("minions_mcp_connection", default=None)
"""The connection whose task (and the SDK's tasks it starts) the code runs in."""


class _NotJsonRpcFilter(logging.Filter):
    """Turns the MCP SDK's error for each stdout line of a server that is not JSON-RPC (a log
    record with the parse error's traceback, per line) into a count on the connection the
    line came from, inside minions' own connections only. A server printing its logs to
    stdout would otherwise flood the log with tracebacks."""

    message = "Failed to parse JSONRPC message from server"

    def filter(self, record: logging.LogRecord) -> bool:
        connection = _SERVING.get()
        if connection is None or record.msg != self.message:
            return True
        connection.not_json_rpc_line()
        return False


_NOT_JSON_RPC = _NotJsonRpcFilter()


# -- connections ---------------------------------------------------------------------------------


class MCPConnection:
    """One server's connection for one run, served by a task of its own."""

    def __init__(
        self,
        name: str,
        config: MCPServerConfig,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.config = config
        self.timeout: float = float(getattr(config, "timeout", DEFAULT_TIMEOUT))
        self.tools: list[MCPTool] = []
        self._on_change = on_change
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self.gone: str | None = None
        """Why the connection ended before the run did (the server exited, say)."""
        self.not_json_rpc = 0
        """How many lines of the server's stdout were not JSON-RPC (logs printed there)."""
        self.stderr: StderrTail | None = None
        """A stdio server's stderr: counted, its last lines kept (see `StderrTail`)."""

    async def open(self) -> None:
        """Start the server (or connect to it) and list its tools.

        Raises:
            MCPServerError: it did not start, or did not list its tools within its timeout.
        """
        _import_mcp()
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._task = asyncio.create_task(self._serve(), name=f"mcp server {self.name}")
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close()
            said = ""
            if self.stderr is not None:
                await self.stderr.drained()
                said = self.stderr.said()
            raise MCPServerError(
                f"MCP server {self.name!r} ({describe_server(self.config)}) did not start and "
                f"list its tools within {self.timeout:g}s (its `timeout`){said}"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the connection (stop the child process) and wait for its task."""
        self._stop.set()
        task = self._task
        if task is None:
            return
        if self._ready is not None and not self._ready.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)
        if not task.done():
            task.cancel()

    # -- the connection's own task ---------------------------------------------------------------

    async def _serve(self) -> None:
        ready = self._ready
        assert ready is not None
        _SERVING.set(self)  # this task's context, and the SDK's tasks started from it
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await self._connect(stack)
                self.tools = await self._list(client)
                self._client = client
                ready.set_result(None)
                await self._watch(client)
        except BaseException as exc:
            reason = _reason(exc)
            if self.stderr is not None and isinstance(exc, Exception):
                # The server's last words (a traceback, a missing setting) say why.
                await self.stderr.drained()
                reason += self.stderr.said()
            if not ready.done():
                if isinstance(exc, asyncio.CancelledError):
                    ready.cancel()
                else:
                    verb = "reached" if isinstance(self.config, MCPHttpServer) else "started"
                    ready.set_exception(
                        MCPServerError(
                            f"MCP server {self.name!r} ({describe_server(self.config)}) could "
                            f"not be {verb}: {reason}"
                        )
                    )
            elif not self._stop.is_set():
                self.gone = reason
                info("mcp_server_gone", server=self.name, reason=reason)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._client = None
            if ready.done() and self.gone is None and not self._stop.is_set():
                self.gone = "the connection ended"
            if self.stderr is not None:
                self.stderr.release()
                if self.stderr.lines:
                    info(
                        "mcp_server_stderr",
                        server=self.name,
                        lines=self.stderr.lines,
                        last=self.stderr.last(),
                    )
            if self.not_json_rpc:
                warn(
                    "mcp_server_output_not_json_rpc_total",
                    server=self.name,
                    count=self.not_json_rpc,
                )

    async def _connect(self, stack: contextlib.AsyncExitStack) -> Any:
        mcp = _import_mcp()
        config = self.config
        target: Any
        if isinstance(config, MCPStdioServer):
            from mcp.client.stdio import stdio_client

            parameters = mcp.StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env),
                cwd=config.cwd,
            )
            self.stderr = StderrTail(self.name)
            target = stdio_client(parameters, errlog=self.stderr.file)
        elif isinstance(config, MCPHttpServer):
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            # The MCP SDK's own timeouts: a response stream may stay open a long time.
            timeout = httpx2.Timeout(30.0, read=300.0)
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout)
            )
            target = streamable_http_client(config.url, http_client=http)
        else:
            target = config
        client = mcp.Client(
            target,
            read_timeout_seconds=self.timeout,
            message_handler=self._on_message,
        )
        entered = await stack.enter_async_context(client)
        if self.stderr is not None:
            self.stderr.release()  # The child has its own end now: its exit ends the pipe.
        return entered

    async def _list(self, client: Any) -> list[MCPTool]:
        if getattr(client.server_capabilities, "tools", None) is None:
            return []  # a server of prompts or resources only: it has no tools to list
        listed = []
        cursor = None
        for _ in range(100):  # a server whose pages never end cannot hang the run
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return [
            MCPTool(
                server=self.name,
                remote_name=t.name,
                description=t.description or t.title or "",
                input_schema=t.input_schema or {},
                call=self.call,
            )
            for t in listed
        ]

    async def _watch(self, client: Any) -> None:
        """Until the run ends: refresh the tools whenever the server says they changed."""
        import anyio

        async with anyio.create_task_group() as group:
            group.start_soon(self._listen, client)
            stop = asyncio.ensure_future(self._stop.wait())
            try:
                while not self._stop.is_set():
                    changed = asyncio.ensure_future(self._changed.wait())
                    await asyncio.wait({stop, changed}, return_when=asyncio.FIRST_COMPLETED)
                    if not changed.done():
                        changed.cancel()
                        break
                    self._changed.clear()
                    try:
                        self.tools = await self._list(client)
                    except Exception as exc:
                        info("mcp_tools_refresh_failed", server=self.name, error=str(exc))
                        continue
                    self._on_change()
            finally:
                stop.cancel()
                group.cancel_scope.cancel()

    async def _listen(self, client: Any) -> None:
        """Change events on connections of the 2026 protocol (older ones send notifications
        that `_on_message` receives)."""
        capabilities = client.server_capabilities
        tools = getattr(capabilities, "tools", None)
        if tools is None or not getattr(tools, "list_changed", False):
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._changed.set()
        except Exception:
            return  # not supported (an older protocol), or the server went away

    async def _on_message(self, message: Any) -> None:
        # Exceptions come here too: what the transport could not read (counted already, as
        # `not_json_rpc_line`, where the SDK reports it).
        if type(message).__name__ == "ToolListChangedNotification":
            self._changed.set()

    def not_json_rpc_line(self) -> None:
        """Count a line of the server's stdout that is not JSON-RPC: said once now, and as a
        total when the connection closes."""
        self.not_json_rpc += 1
        if self.not_json_rpc == 1:
            warn(
                "mcp_server_output_not_json_rpc",
                server=self.name,
                hint="an MCP server over stdio must write only JSON-RPC to stdout (logs belong "
                "on stderr); such lines are counted, not logged one by one",
            )

    # -- calls from the steps' tasks -------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call `tool` on the server.

        Raises:
            ToolError: the server answered with an error, did not answer within the timeout,
                or is gone; the model sees the message.
        """
        client = self._client
        if client is None:
            reason = f": {self.gone}" if self.gone else ""
            raise ToolError(f"MCP server {self.name!r} is not connected any more{reason}.")
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=self.timeout)
        except MCPError as exc:
            if exc.error.code == REQUEST_TIMEOUT:
                raise ToolError(
                    f"MCP tool {tool!r} of server {self.name!r} did not answer within "
                    f"{self.timeout:g}s."
                ) from None
            if exc.error.code == CONNECTION_CLOSED:
                raise ToolError(
                    f"MCP server {self.name!r} closed the connection during the call to "
                    f"{tool!r} (did it exit?)."
                ) from None
            raise ToolError(f"MCP tool {tool!r} of server {self.name!r} failed: {exc}") from None
        except RuntimeError as exc:  # the client closed meanwhile
            raise ToolError(f"MCP server {self.name!r} is not connected any more: {exc}") from None
        return _result(self.name, tool, result)


def _reason(exc: BaseException) -> str:
    """The innermost useful message of an exception (task groups wrap them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class MCPConnections:
    """The MCP servers of one run: opened together, their tools added to the run's registry,
    closed together (in the task that opened them).

    Args:
        servers: the servers by name.
        base: the run's other tools; an MCP tool named like one of them is an error.
        references: what steps ask for, by step id (``files.read_file``, ``files.*``): a
            tool a server does not offer is an error naming the step.
        on_change: called with the new registry when a server's tools changed.
    """

    def __init__(
        self,
        servers: Mapping[str, MCPServerConfig],
        *,
        base: ToolRegistry | None = None,
        references: Mapping[str, Iterable[str]] | None = None,
        on_change: Callable[[ToolRegistry], None] = lambda _registry: None,
    ) -> None:
        self.base = base if base is not None else ToolRegistry()
        self.references = references or {}
        self._on_change = on_change
        self.connections = {
            name: MCPConnection(name, config, self._changed) for name, config in servers.items()
        }

    async def open(self) -> ToolRegistry:
        """Connect to every server (at once) and return the run's registry with their tools.

        Raises:
            MCPServerError: a server did not start, two tools have one name, or a step asks
                for a tool its server does not offer. Every connection is closed again.
        """
        results = await asyncio.gather(
            *(c.open() for c in self.connections.values()), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        try:
            for error in errors:
                raise error
            registry = self.registry(strict=True)
            self._check_references()
        except BaseException:
            await self.close()
            raise
        return registry

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.connections.values()))

    @property
    def tools(self) -> list[MCPTool]:
        return [t for c in self.connections.values() for t in c.tools]

    def registry(self, *, strict: bool = False) -> ToolRegistry:
        """The base tools and every server's tools; with `strict`, two tools of one name
        raise `MCPServerError` (else the later one is left out)."""
        registry = ToolRegistry(self.base)
        owners: dict[str, str] = {t.name: f"tool {t.name!r}" for t in self.base}
        for tool in self.tools:
            server, remote = tool.origin
            owner = f"tool {remote!r} of MCP server {server!r}"
            if tool.name in owners:
                message = (
                    f"{owners[tool.name]} and {owner} would both be offered to the model as "
                    f"{tool.name!r}; rename one of them (or the server)"
                )
                if strict:
                    raise MCPServerError(message)
                info("mcp_tool_name_collision", message=message)
                continue
            owners[tool.name] = owner
            registry.register(tool)
        return registry

    def _check_references(self) -> None:
        for step_id, names in self.references.items():
            for name in sorted(names):
                if not is_reference(name):
                    continue
                server, tool = split_reference(name)
                connection = self.connections.get(server)
                if connection is None or tool == "*":
                    continue
                offered = sorted(t.origin[1] for t in connection.tools)
                if tool not in offered:
                    from minions.errors import did_you_mean

                    raise MCPServerError(
                        f"step {step_id!r} asks for {name!r}, but MCP server {server!r} has no "
                        f"tool {tool!r}{did_you_mean(tool, offered)}; it offers: "
                        f"{', '.join(offered) or 'none'}"
                    )

    def _changed(self) -> None:
        self._on_change(self.registry())


async def list_mcp_tools(servers: Mapping[str, MCPServerConfig]) -> dict[str, list[MCPTool]]:
    """Connect to each server, list its tools, and disconnect (no tool is called): what
    ``minions run --dry-run`` shows.

    Raises:
        MCPServerError: a server did not start or did not list its tools.
    """
    connections = MCPConnections(servers)
    await connections.open()
    try:
        return {name: list(c.tools) for name, c in connections.connections.items()}
    finally:
        await connections.close()
