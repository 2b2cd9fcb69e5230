"""Which database the store uses: `[storage] url` or, winning over it, KIMIAUDIO_DATABASE_URL.

Empty: the SQLite file `storage.database` under `storage.data_dir` (the embedded default). A
`postgresql://user:password@host:port/dbname` URL: that PostgreSQL database, shared by every
instance pointed at it. `shown` is how a location appears in logs and errors: never with its
password.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kimiaudio.config import Config, check_setting
from kimiaudio.errors import ConfigError

DATABASE_URL_ENV = "KIMIAUDIO_DATABASE_URL"
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def is_postgres_url(location) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def database_location(config: Config) -> str | Path:
    """The PostgreSQL URL, or the SQLite file's path."""
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        try:
            check_setting("storage", "url", url)
        except ConfigError as exc:
            message = str(exc).replace("storage.url", DATABASE_URL_ENV, 1).replace(repr(url), repr(shown(url)))
            raise ConfigError(message) from None
    else:
        url = config.storage.url
    return url if url else config.data_dir / config.storage.database


def url_setting() -> str:
    """The setting the database URL in use comes from, as errors about it name it."""
    return DATABASE_URL_ENV if os.environ.get(DATABASE_URL_ENV) else "storage.url"


def shown(location: str | Path) -> str:
    return _PASSWORD.sub(r"\1***@", str(location))
