"""Django on PostgreSQL: ``schedule(..., connection=django.db.connection)`` joins the
transaction of ``transaction.atomic()`` (the job exists if and only if it commits).

Django's settings are configured once per process, so the project runs in a
subprocess of its own, on the test's own schema.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from urllib.parse import urlsplit

import pytest

from tests.postgres_support import POSTGRES_URL, pg_schema

pytest.importorskip("django", reason="the django extra is not installed")

pytestmark = pytest.mark.postgres

PROJECT = """
import sys
import django
from django.conf import settings

store_url, schema, host, port, name, user = sys.argv[1:]
settings.configure(
    INSTALLED_APPS=["delayq.integrations.django"],
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": host, "PORT": port, "NAME": name, "USER": user,
        "OPTIONS": {"options": f"-c search_path={schema}"},
    }},
    DELAYQ={"URL": store_url},
)
django.setup()
from django.db import connection, transaction
from delayq.integrations.django import get_app

app = get_app()
with connection.cursor() as cur:
    cur.execute("CREATE TABLE orders (id int PRIMARY KEY, state text)")

with transaction.atomic():
    with connection.cursor() as cur:
        cur.execute("INSERT INTO orders VALUES (42, 'unpaid')")
    app.schedule("order.cancel", {"order": 42}, job_id="cancel-42", delay=1800,
                 connection=connection)
    assert app.get("cancel-42") is None  # not committed yet: no worker sees it
assert app.get("cancel-42").state == "scheduled"

try:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders VALUES (43, 'unpaid')")
        app.schedule("order.cancel", {"order": 43}, job_id="cancel-43", delay=1800,
                     connection=connection)
        raise KeyError("rolled back")
except KeyError:
    pass
assert app.get("cancel-43") is None
with connection.cursor() as cur:
    cur.execute("SELECT count(*) FROM orders")
    assert cur.fetchone()[0] == 1  # the order and its job went together

app.schedule("order.cancel", {"order": 44}, job_id="cancel-44", connection=connection)
assert app.get("cancel-44") is not None  # outside a transaction: stored at once
app.close()
print("ok")
"""


def test_a_job_scheduled_with_django_s_connection_commits_and_rolls_back_with_it() -> None:
    pytest.importorskip("psycopg")
    with pg_schema() as schema:
        db = urlsplit(POSTGRES_URL)
        store_url = f"{POSTGRES_URL}{'&' if db.query else '?'}schema={schema}&queue=orders"
        args = [
            store_url,
            schema,
            db.hostname or "127.0.0.1",
            str(db.port or 5432),
            db.path.lstrip("/"),
            db.username or "postgres",
        ]
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(PROJECT), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith("ok")
