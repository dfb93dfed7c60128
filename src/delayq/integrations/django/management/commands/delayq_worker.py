"""``manage.py delayq_worker``: run a delayq worker for the project's app."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils.module_loading import autodiscover_modules

from delayq._loader import import_modules
from delayq.integrations.django import get_app, modules, worker_options
from delayq.worker import Worker, run_due

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        "Run a delayq worker for settings.DELAYQ (until SIGINT / SIGTERM); --once runs "
        "the jobs due now in this process and exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, help="handlers run at once")
        parser.add_argument("--once", action="store_true", help="run the jobs due now, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        import_modules(modules())
        autodiscover_modules("jobs")  # each installed app's jobs.py registers its tasks
        app = get_app()
        if options["once"]:
            results = run_due(app)
            for r in results:
                self.stdout.write(f"{r.job_id} {r.name} attempt {r.attempt}: {r.outcome}")
            self.stdout.write(f"{len(results)} job(s) run")
            return
        settings = worker_options()
        if options["concurrency"] is not None:
            settings["concurrency"] = options["concurrency"]
        self.stdout.write(f"delayq worker on {app.url}, handlers {sorted(app.handlers)}")
        Worker(app, **settings).run()
