"""Every code block of the docs (docs/**/*.md and README.md) runs, or is checked.

* ``python`` blocks of one page run in order as one script, in a fresh working
  directory (a page's ``sqlite:///jobs.db`` is a file of the test's own). A
  block may use a top-level ``await`` (it then runs in ``asyncio.run``). A
  top-level ``print(...)  # comment`` must print what its comment says (the
  printed text is part of the comment: ``# paid in time: cancelled``).
* A store URL in a block must be one of :data:`DOC_URLS`: the test replaces it
  with the test servers' URL under the test's own Redis prefix, PostgreSQL
  schema or RabbitMQ virtual host and queue, and the page is skipped (failed
  under ``DELAYQ_REQUIRE_SERVICES=1``) when that server is absent.
* ``sh`` blocks are parsed by ``bash -n``; each ``delayq ...`` command in them is
  parsed by the CLI itself (command, options and arguments must exist) and each
  ``make TARGET`` must name a Makefile target.
* A block deliberately not run says so in an HTML comment on the line before it,
  with its reason: ``<!-- docs-test: skip (the reason) -->``. There are few of
  them (:data:`MOST_SKIPPED`).
* Every block names its language: ``python``, ``sh``, or one of :data:`NOT_CODE`.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import re
import shlex
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest

from delayq import AsyncDelayQ, DelayQ
from delayq.cli import cli
from tests.postgres_support import POSTGRES_URL, pg_schema
from tests.rabbitmq_support import delete_queues, private_vhost, unique_queue, vhost_url
from tests.redis_support import REDIS_URL, redis_prefix

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda p: str(p.relative_to(ROOT)),
)
NOT_CODE = frozenset({"text", "toml", "json", "ini", "yaml"})
"""Languages of blocks that are data, not code (nothing to run)."""
MOST_SKIPPED = 4
"""At most this many blocks in all the docs are not run (each says why)."""

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*docs-test:\s*(skip)\b\s*(.*?)\s*-->\s*$")
_URL = re.compile(
    r"""["']((?:redis|rediss|postgresql|postgres|postgresql\+psycopg|amqp)://[^"']*)["']"""
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mark: str = ""  # "" or "skip"
    note: str = ""  # the skip's reason

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        found.append(
            Block(
                page,
                line,
                match.group(1).strip(),
                match.group(2),
                mark.group(1) if mark else "",
                mark.group(2).strip("() ") if mark else "",
            )
        )
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]
PYTHON_PAGES = sorted({b.page for b in ALL_BLOCKS if b.lang == "python"})
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "sh"]


# -- the services a page's URLs need ---------------------------------------------


@dataclass
class Services:
    """The test's own places on the shared servers, opened on first use."""

    stack: contextlib.ExitStack
    opened: dict[str, Any] = field(default_factory=dict)

    def redis_prefix(self) -> str:
        if "redis" not in self.opened:
            self.opened["redis"] = self.stack.enter_context(redis_prefix())
        return str(self.opened["redis"])

    def pg_schema(self) -> str:
        if "postgres" not in self.opened:
            self.opened["postgres"] = self.stack.enter_context(pg_schema())
        return str(self.opened["postgres"])

    def rabbit_queue(self) -> str:
        if "rabbitmq" not in self.opened:
            private_vhost()  # skips early when the broker is absent
            queue = unique_queue()
            self.stack.callback(delete_queues, queue)
            self.opened["rabbitmq"] = queue
        return str(self.opened["rabbitmq"])


def _with(url: str, **query: str) -> str:
    extra = "&".join(f"{k}={v}" for k, v in query.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def _redis(s: Services) -> str:
    return _with(REDIS_URL, queue="orders", prefix=s.redis_prefix())


def _pg_store(s: Services) -> str:
    return _with(POSTGRES_URL, queue="orders", schema=s.pg_schema())


def _pg_conn(s: Services, scheme: str = "postgresql") -> str:
    url = _with(POSTGRES_URL, options=f"-csearch_path%3D{s.pg_schema()}")
    return scheme + url[url.index("://") :]


def _amqp(s: Services) -> str:
    return vhost_url(queue=s.rabbit_queue())


DOC_URLS: dict[str, tuple[str, Callable[[Services], str]]] = {
    "redis://localhost:6379/0?queue=orders": ("redis", _redis),
    "postgresql://app@db/shop?queue=orders": ("postgres", _pg_store),
    "postgresql://app@db/shop": ("postgres", _pg_conn),
    "postgresql+psycopg://app@db/shop": ("postgres", lambda s: _pg_conn(s, "postgresql+psycopg")),
    "amqp://guest:guest@localhost:5672/%2F?queue=orders": ("rabbitmq", _amqp),
}
"""The store URLs the docs' Python blocks use: the server each needs (its marker),
and the test's own URL for it."""


def _for_test(code: str, services: Services, where: str) -> str:
    urls = {url for url in _URL.findall(code) if "..." not in url}  # "redis://..." stands for any
    for url in urls:
        assert url in DOC_URLS, f"{where}: add {url!r} to DOC_URLS (the test's URL for it)"
    for url in sorted(urls, key=len, reverse=True):
        mine = DOC_URLS[url][1](services)
        code = code.replace(f'"{url}"', repr(mine)).replace(f"'{url}'", repr(mine))
    return code


# -- running a page ---------------------------------------------------------------


def _printed_comments(code: str) -> dict[int, str]:
    """Line number -> comment of each top-level ``print(...)  # comment`` line."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        line = tok.line
        if tok.type == tokenize.COMMENT and line.startswith("print(") and tok.start[1] > 0:
            found[tok.start[0]] = tok.string.lstrip("# ")
    return found


def _run(code: str, namespace: dict[str, Any], where: str) -> None:
    """Run one block; check that each commented top-level print printed what it says."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    compiled = compile(code, where, "exec", flags=flags)
    printed: dict[int, list[str]] = {}

    def recording_print(*args: Any, **kwargs: Any) -> None:
        frame = sys._getframe(1)
        if frame.f_code.co_filename == where:
            out = io.StringIO()
            print(*args, **{**kwargs, "file": out})
            printed.setdefault(frame.f_lineno, []).append(out.getvalue().strip())
        print(*args, **kwargs)

    namespace["print"] = recording_print
    result = eval(compiled, namespace)  # a coroutine when the block awaits
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    for line, comment in _printed_comments(code).items():
        said = printed.get(line)
        assert said, f"{where}, line {line}: nothing printed"
        assert all(text and text in comment for text in said), (
            f"{where}, line {line}: printed {said}, the comment says {comment!r}"
        )


def _close_what_it_opened(namespace: dict[str, Any]) -> None:
    for value in list(namespace.values()):
        with contextlib.suppress(Exception):
            if isinstance(value, DelayQ):
                value.close()
            elif isinstance(value, AsyncDelayQ):
                asyncio.run(value.close())
            elif type(value).__name__ == "Engine" and hasattr(value, "dispose"):
                value.dispose()


@contextlib.contextmanager
def _page_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Services]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with contextlib.ExitStack() as stack:
        yield Services(stack)


def test_every_block_names_its_language() -> None:
    unnamed = [b.where for b in ALL_BLOCKS if b.lang not in {"python", "sh"} | NOT_CODE]
    assert unnamed == [], "name the language of these blocks (python, sh, text ...)"


def test_few_blocks_are_not_run_and_each_says_why() -> None:
    skipped = [b for b in ALL_BLOCKS if b.mark == "skip"]
    assert all(b.note for b in skipped), [b.where for b in skipped if not b.note]
    assert len(skipped) <= MOST_SKIPPED, [b.where for b in skipped]


def test_the_docs_have_code_to_check() -> None:
    assert len(PYTHON_PAGES) >= 8 and len(SHELL_BLOCKS) >= 5


def _page_param(page: Path) -> Any:
    """The page, marked with the servers its URLs need (``-m "not rabbitmq"`` ...)."""
    code = "".join(b.code for b in blocks_of(page) if b.lang == "python")
    needs = sorted({DOC_URLS[url][0] for url in _URL.findall(code) if url in DOC_URLS})
    marks = [getattr(pytest.mark, name) for name in needs]
    return pytest.param(page, marks=marks, id=str(page.relative_to(ROOT)))


@pytest.mark.parametrize("page", [_page_param(page) for page in PYTHON_PAGES])
def test_the_python_blocks_of_each_page_run(
    page: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocks = [b for b in blocks_of(page) if b.lang == "python" and b.mark != "skip"]
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    with _page_env(monkeypatch, tmp_path) as services:
        try:
            for block in blocks:
                code = _for_test(block.code, services, block.where)
                with contextlib.redirect_stdout(io.StringIO()):
                    _run(code, namespace, block.where)
        finally:
            _close_what_it_opened(namespace)


# -- shell blocks ---------------------------------------------------------------------


def _commands(code: str) -> list[list[str]]:
    """The simple commands of a block: continuation lines joined, comments dropped."""
    lines = code.replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def _check_delayq_command(args: list[str]) -> None:
    """Parse ``delayq ARGS`` as the CLI would, without running it."""
    ctx = cli.make_context("delayq", list(args))
    command: click.Command = cli
    while isinstance(command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub


_MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_each_shell_block_parses_and_names_real_commands(block: Block) -> None:
    syntax = subprocess.run(
        ["bash", "-n"], input=block.code, capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, f"{block.where}: {syntax.stderr}"
    for words in _commands(block.code):
        program = words[0].rsplit("/", 1)[-1]
        if program == "delayq":
            try:
                _check_delayq_command(words[1:])
            except click.BadParameter as exc:  # a file the example names: not here
                assert "does not exist" in exc.format_message(), f"{block.where}: {exc}"
            except click.ClickException as exc:
                pytest.fail(f"{block.where}: {shlex.join(words)}: {exc.format_message()}")
        elif program == "make":
            assert set(words[1:]) <= _MAKE_TARGETS, f"{block.where}: {shlex.join(words)}"


def test_the_checks_catch_a_wrong_command() -> None:
    with pytest.raises(click.NoSuchOption):
        _check_delayq_command(["worker", "shop:app", "--no-such-option"])
    with pytest.raises(click.UsageError):
        _check_delayq_command(["no-such-command"])


def test_the_checks_catch_a_print_that_prints_what_its_comment_does_not_say() -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        _run('print("cancelled")   # paid in time: cancelled\n', {}, "good")
        with pytest.raises(AssertionError, match="the comment says 'cancelled'"):
            _run('print("kept")   # cancelled\n', {}, "bad")
