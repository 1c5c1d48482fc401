"""sealsync's embeddable engine: an encrypted, offline-first replica and its sync session.

No network code lives here: `relay/` serves envelopes and `clients/` moves them.
"""

from replica.aside import AsideVersion
from replica.asides import ChangeMark
from replica.bundles import NewAccount
from replica.compaction import Compacted
from replica.errors import (
    DegradedError,
    EnvelopeError,
    FeedResetError,
    InvalidArgumentError,
    ItemLimitError,
    KdfParametersError,
    LeaseBusyError,
    ProtocolError,
    RepairRefusedError,
    ReplicaClosedError,
    ReplicaLockedError,
    RollbackError,
    SealsyncError,
    StaleContextError,
    StoreError,
    UnknownEpochError,
    WeakPassphraseError,
    WrongKeyError,
)
from replica.events import ChangeEvent
from replica.feed import Change, ChangePage
from replica.folder import FileBody, FolderSession, Sealed
from replica.indexed import IndexStats, ScanPage
from replica.journal import DeferredWrite, JournalEntry
from replica.keys import LoginKeys, passphrase_login_keys, recovery_login_keys
from replica.leases import Lease
from replica.options import ReplicaOptions
from replica.outside import Merged
from replica.record import Context, Record, Version
from replica.repair import Diagnosis, Finding, RepairReport
from replica.replica import Replica
from replica.resync import RESYNC_LEASE, RESYNC_LEASE_TTL_S, Resynced
from replica.schema import DEFAULT_PROFILE, REGISTER_ID, Collection, Schema
from replica.snapshot import backup_replica_file, copy_replica_file
from replica.status import Status
from replica.sync import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_COUNT,
    Acknowledged,
    Applied,
    SyncSession,
)
from replica.wire import (
    ErrorCode,
    KdfParams,
    Page,
    PageEntry,
    PushBatch,
    PushResult,
    Receipt,
    RelayState,
)

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_BATCH_COUNT",
    "DEFAULT_PROFILE",
    "REGISTER_ID",
    "RESYNC_LEASE",
    "RESYNC_LEASE_TTL_S",
    "Acknowledged",
    "Applied",
    "AsideVersion",
    "Change",
    "ChangeEvent",
    "ChangeMark",
    "ChangePage",
    "Collection",
    "Compacted",
    "Context",
    "DeferredWrite",
    "DegradedError",
    "Diagnosis",
    "EnvelopeError",
    "ErrorCode",
    "FeedResetError",
    "FileBody",
    "Finding",
    "FolderSession",
    "IndexStats",
    "InvalidArgumentError",
    "ItemLimitError",
    "JournalEntry",
    "KdfParametersError",
    "KdfParams",
    "Lease",
    "LeaseBusyError",
    "LoginKeys",
    "Merged",
    "NewAccount",
    "Page",
    "PageEntry",
    "ProtocolError",
    "PushBatch",
    "PushResult",
    "Receipt",
    "Record",
    "RelayState",
    "RepairRefusedError",
    "RepairReport",
    "Replica",
    "ReplicaClosedError",
    "ReplicaLockedError",
    "ReplicaOptions",
    "Resynced",
    "RollbackError",
    "ScanPage",
    "Schema",
    "Sealed",
    "SealsyncError",
    "StaleContextError",
    "Status",
    "StoreError",
    "SyncSession",
    "UnknownEpochError",
    "Version",
    "WeakPassphraseError",
    "WrongKeyError",
    "backup_replica_file",
    "copy_replica_file",
    "passphrase_login_keys",
    "recovery_login_keys",
]
