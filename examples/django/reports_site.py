"""Django recipe: a whole project in one file, sync views sharing flights across threads
and worker processes, the expensive part a PostgreSQL query.

The group is made at import, at module level, and used from sync views through
``run_sync`` in whatever thread serves the request. Making a group does no I/O: with
``--preload`` the master imports this module and forks, and each worker starts the
group at its first call (a group *used* in the master before the fork would be closed
in the workers: docs/adr/0014, 0018).

Run: ``gunicorn -c gunicorn.conf.py reports_site:application`` from this folder.
"""

from __future__ import annotations

import os
import tempfile

import django
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import path

from flightgroup import JSON, FlightGroup

settings.configure(
    DEBUG=False,
    SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "only-for-the-example"),
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=[],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "NAME": os.environ.get("PGDATABASE", "test"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    },
)
django.setup()

# One group per process, shared by every thread of it; the directory scope makes the
# workers of the host share flights too.
group = FlightGroup(
    directory=os.environ.get("FLIGHTGROUP_DIR")
    or os.path.join(tempfile.gettempdir(), f"reports-flights-{os.getuid()}"),
    codec=JSON,
)


def build_report(day: str) -> dict[str, object]:
    """The expensive part: an aggregate over many rows (a stand-in for a real report)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT %s::date::text, count(*), sum(n), pg_backend_pid()"
            " FROM generate_series(1, 200000) AS n",
            [day],
        )
        row = cursor.fetchone()
    assert row is not None
    return {"day": row[0], "orders": row[1], "total": int(row[2]), "backend_pid": row[3]}


def report(request: HttpRequest, day: str) -> JsonResponse:
    """The day's report: one query for every request that comes while it runs."""
    result = group.run_sync(f"report:{day}", lambda: build_report(day))
    response = JsonResponse(result.value)
    response["X-Flight"] = "joined" if result.joined else "led"
    response["X-Worker"] = str(os.getpid())
    return response


def healthz(request: HttpRequest) -> JsonResponse:
    """Ready once the worker has loaded the project."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("reports/<str:day>", report),
    path("healthz", healthz),
]

from django.core.wsgi import get_wsgi_application  # noqa: E402  (after settings)

application = get_wsgi_application()
