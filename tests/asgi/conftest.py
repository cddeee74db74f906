"""The ASGI tests' coroutine tests each run on a loop of their own, under a bound."""

from __future__ import annotations

import inspect

import pytest

from ..support import run


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test with ``support.run`` (a hang fails in 20 s)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
