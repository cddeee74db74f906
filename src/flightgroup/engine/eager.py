"""A task whose first step runs at once, in its caller's thread, on every Python; and
the cheapest read of a loop's current task on each Python (``current_task_of``).

A leader's work runs in a task of its own (ADR 0002); started eagerly, a work that
finishes without suspending costs no trip through the event loop and its leader never
waits. Python 3.12+ does this itself (``asyncio.Task(coro, eager_start=True)``). On
3.11 ``start_eagerly`` does the same by hand (ADR 0052): it makes the task, makes it the
loop's current task, runs the coroutine's first step in the task's context, and parks
what that step yielded in the task's own coroutine, a thin generator that hands it to
the task when the task's first step comes and then delegates to the coroutine in C
(``yield from``). Inside the work, ``asyncio.current_task()`` is the work's own task from
its first line on; a cancel that comes before the task's first step is thrown into the
coroutine where it waits, as it would be once the task waits on its future.

What differs from 3.12's own on 3.11: the task still has its first step scheduled, which
ends it at once when the work already finished (it is done one loop turn later, not at
once); and a KeyboardInterrupt or SystemExit of that first step reaches the caller, as
on 3.12, and its task ends with no result of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final

__all__ = ["current_task_of", "start_eagerly"]


if sys.version_info >= (3, 12):
    current_task_of: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = (
        asyncio.current_task
    )
    """The task running on ``loop`` now, or None (``asyncio.current_task(loop)``)."""

    def start_eagerly(
        coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[None]:
        """Make a task of ``coro`` on ``loop`` (running, in this thread) and run its
        first step now."""
        return asyncio.Task(coro, loop=loop, eager_start=True)

else:  # pragma: no cover - the 3.11 run covers it
    from asyncio.tasks import _enter_task, _leave_task

    # The loop -> task dict that asyncio.current_task reads (C's, on 3.11), read directly:
    # a quarter of that Python function's cost, on every call.
    _current_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = vars(asyncio.tasks)[
        "_current_tasks"
    ]
    current_task_of = _current_tasks.get

    class _Raised:
        """The coroutine's first step raised ``error``: its task ends with it."""

        __slots__ = ("error",)

        def __init__(self, error: BaseException) -> None:
            self.error = error

    _FINISHED: Final = object()  # the first step finished the coroutine
    _PARKED: Final = object()  # what the parked task coroutine answers its starter

    @types.coroutine
    def _resumed(coro: Coroutine[Any, Any, None]) -> Generator[Any, Any, None]:
        """The task's coroutine: made and primed before the first step, told its
        outcome after it (``send``), then resumed by the task. (Its frame is held by
        every in-flight key: the rare paths are generators of their own.)"""
        step = yield  # primed: the starter sends the first step's outcome here
        if step is _FINISHED or type(step) is _Raised:
            return (yield from _ended(step))
        try:
            yield _PARKED  # the task's first step goes on below at once
            yield step  # the task waits on what the coroutine waits on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            return (yield from _thrown(coro, exc))
        # The awaited future is done: the coroutine reads it when it is resumed, and runs
        # on in C from here.
        yield from coro
        return None

    @types.coroutine
    def _ended(step: object) -> Generator[Any, Any, None]:
        """The first step ended the coroutine: the task's first step ends as it did."""
        try:
            yield _PARKED
        except GeneratorExit:
            raise
        except BaseException:
            pass  # a cancel that comes after the end changes nothing
        if type(step) is _Raised:
            raise step.error
        return None

    @types.coroutine
    def _thrown(coro: Coroutine[Any, Any, None], exc: BaseException) -> Generator[Any, Any, None]:
        """Something was thrown into the task while it waited on the coroutine's first
        wait (a cancel, before the task's first step too): into the coroutine, where it
        waits, and on from there."""
        while True:
            try:
                yielded = coro.throw(exc)
            except StopIteration:
                return None  # (a driver's coroutine returns None)
            try:
                yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as again:
                exc = again
                continue
            yield from coro
            return None

    def start_eagerly(
        coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[None]:
        """Make a task of ``coro`` on ``loop`` (running, in this thread) and run its
        first step now, as the task."""
        runner = _resumed(coro)
        runner.send(None)
        context = contextvars.copy_context()
        task: asyncio.Task[None] = asyncio.Task(runner, loop=loop, context=context)
        caller = current_task_of(loop)
        if caller is not None:
            _leave_task(loop, caller)
        _enter_task(loop, task)
        stop: BaseException | None = None
        try:
            step: Any = context.run(coro.send, None)
        except StopIteration:
            step = _FINISHED
        except (KeyboardInterrupt, SystemExit) as exc:
            step, stop = _FINISHED, exc  # the caller gets it now, as on 3.12
        except BaseException as exc:
            step = _Raised(exc)
        finally:
            _leave_task(loop, task)
            if caller is not None:
                _enter_task(loop, caller)
        runner.send(step)  # parks it: the task's first step resumes it
        if stop is not None:
            raise stop
        return task
