"""The control plane's database: SQLite embedded by default, PostgreSQL for production.

`connect(url)` opens it, `migrate(engine)` brings the schema to the newest revision shipped in
this package, and `Store` is every read and write the control plane makes. See docs/store.md.
"""

from warden.store.db import connect, current_revision, default_url, migrate, state_dir
from warden.store.history import HistorySample, LedgerState, PreemptionRecord
from warden.store.jobs import ActiveJob, EventRecord, JobNotFound, StoredAttempt, StoredJob
from warden.store.nodes import NodeRecord
from warden.store.policies import CurrentPolicy, PolicyRecord
from warden.store.repo import Store
from warden.store.tokens import AuditEntry, TokenInfo, hash_token

__all__ = [
    "ActiveJob",
    "AuditEntry",
    "CurrentPolicy",
    "EventRecord",
    "HistorySample",
    "JobNotFound",
    "LedgerState",
    "NodeRecord",
    "PolicyRecord",
    "PreemptionRecord",
    "Store",
    "StoredAttempt",
    "StoredJob",
    "TokenInfo",
    "connect",
    "current_revision",
    "default_url",
    "hash_token",
    "migrate",
    "state_dir",
]
