"""Settings of the example shop: delayq is configured by ``DELAYQ``."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["delayq.integrations.django", "orders"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "shop.sqlite3")),
    }
}

DELAYQ = {
    "URL": os.environ.get("DELAYQ_URL", f"sqlite:///{BASE_DIR / 'jobs.db'}"),
    "OPTIONS": {"max_attempts": 5, "backoff": [2, 5, 10]},
    "WORKER": {"concurrency": 2},
}
