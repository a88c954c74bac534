"""Tables (SQLAlchemy Core): the compact ``prediction_log`` and its dictionaries, the block sums ``label_bins``,
``pending_labels`` and tables scoped by a ``CalibrationKey``; prediction ids are 16 bytes everywhere."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from service.store.rows import ANONYMOUS, CalibrationKey

SCHEMA_VERSION = 3
BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")

metadata = sa.MetaData()


def _calibration_key(primary_key: bool = False) -> list[sa.Column]:
    """The (model, version, calibration_version) columns a table is scoped by (its primary key's with one row each)."""
    return [
        sa.Column("model", sa.String(128), primary_key=primary_key, nullable=False),
        sa.Column("version", sa.String(32), primary_key=primary_key, nullable=False),
        sa.Column("calibration_version", sa.Integer, primary_key=primary_key, nullable=False),
    ]


schema_info = sa.Table("schema_info", metadata, sa.Column("version", sa.Integer, primary_key=True))


class PredictionId(sa.types.TypeDecorator):
    """A prediction id, 32 hex digits to the service, 16 bytes in the store: PostgreSQL's ``uuid`` (sorted by its
    bytes, so id ranges are time ranges), SQLite's BLOB."""

    impl = sa.LargeBinary
    cache_ok = True

    def load_dialect_impl(self, dialect):
        return dialect.type_descriptor(
            postgresql.UUID(as_uuid=True) if dialect.name == "postgresql" else sa.LargeBinary()
        )

    def process_bind_param(self, value, dialect):
        return None if value is None else id_value(value, dialect.name)

    def process_result_value(self, value, dialect):
        return None if value is None else id_hex(value)


def id_value(hex_id: str, dialect: str):
    """The stored form of a prediction id: a ``uuid.UUID`` on PostgreSQL, 16 bytes elsewhere."""
    if not isinstance(hex_id, str):  # already stored form
        return hex_id
    return uuid.UUID(hex=hex_id) if dialect == "postgresql" else bytes.fromhex(hex_id)


def id_hex(value) -> str:
    """The 32 hex digits of a stored prediction id (``uuid.UUID`` or 16 bytes)."""
    return value.hex if isinstance(value, uuid.UUID) else bytes(value).hex()


# One small integer per (model, version, calibration_version), with its temperature T when its probabilities are
# softmax(z / T): the log then keeps the logits z only where T * log p does not give them back.
calibration_keys = sa.Table(
    "calibration_keys",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    *_calibration_key(),
    sa.Column("temperature", sa.Float),
    sa.UniqueConstraint("model", "version", "calibration_version", name="uq_calibration_keys"),
)

# What a batch was served with: the set choice (randomized NULL: before floor sets) and the priors' version;
# ``signature`` is the four as one unique string, as NULLs are distinct in a unique constraint.
served_choices = sa.Table(
    "served_choices",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("signature", sa.Text, nullable=False, unique=True),
    sa.Column("set_coverage", sa.Float),
    sa.Column("set_method", sa.String(8)),
    sa.Column("set_randomized", sa.Boolean),
    sa.Column("priors_version", sa.String(64)),
)

# One row per served prediction, eight columns so PostgreSQL's row header stays 24 bytes; the primary key (key, id),
# time order per key, is its only index. Range-partitioned by id on PostgreSQL, WITHOUT ROWID on SQLite.
prediction_log = sa.Table(
    "prediction_log",
    metadata,
    sa.Column("id", PredictionId, nullable=False),
    sa.Column("key", sa.Integer, nullable=False),  # calibration_keys.id
    sa.Column("offline", sa.Boolean, nullable=False),  # scored elsewhere, sent with its label
    sa.Column("probabilities", sa.LargeBinary, nullable=False),  # float32, as served (before any adaptation)
    sa.Column("logits", sa.LargeBinary),  # float32; NULL where the key's temperature gives them back (offline: none)
    # the set served (NULL: none) as packed bits, its choice, and the probabilities it was computed from when they
    # are not ``probabilities`` (under a refitted temperature)
    sa.Column("set_members", sa.LargeBinary),
    sa.Column("choice", sa.Integer),  # served_choices.id
    sa.Column("set_probabilities", sa.LargeBinary),
    sa.PrimaryKeyConstraint("key", "id", name="pk_prediction_log"),
    postgresql_partition_by="RANGE (id)",
    sqlite_with_rowid=False,
)

labels = sa.Table(
    "labels",
    metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    # the labelled prediction's id: no foreign key, the log's partitions go by retention (which deletes their labels
    # first, by this unique index's range), and its unique index keeps one label per prediction
    sa.Column("prediction_id", PredictionId, nullable=False, unique=True),
    *_calibration_key(),
    sa.Column("label", sa.Integer, nullable=False),
    sa.Column("correct", sa.Integer, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("conf_bin", sa.Integer, nullable=False),
    sa.Column("nll", sa.Float, nullable=False),
    sa.Column("brier", sa.Float, nullable=False),
    sa.Column("labelled_at", sa.Float, nullable=False),
    sa.Column("probabilities", sa.LargeBinary),  # as served (copied from the prediction): detail metrics
    sa.Column("logits", sa.LargeBinary),  # read one index range of labels, never a join
    sa.Column("source", sa.String(64)),  # the name of the token that sent it; NULL (labels of older versions) and
    # "anonymous" (feedback open) are the same source
    # the served set (NULL: none): whether it held the label, and the label's conformity score under its rule,
    # which the adaptive threshold and the coverage alarm fold
    sa.Column("covered", sa.Integer),
    sa.Column("set_size", sa.Integer),
    sa.Column("set_coverage", sa.Float),
    sa.Column("set_method", sa.String(8)),
    sa.Column("set_randomized", sa.Boolean),
    sa.Column("set_score", sa.Float),
    sa.Index("ix_labels_window", "model", "version", "calibration_version", "seq"),
    # the labels whose prediction had a set, in order: the coverage fold and its window read these alone, and a
    # store of labels from before sets (or of models without them) must not be scanned for them
    sa.Index(
        "ix_labels_covered",
        "model",
        "version",
        "seq",
        sqlite_where=sa.text("covered IS NOT NULL"),
        postgresql_where=sa.text("covered IS NOT NULL"),
    ),
    sa.Index("ix_labels_time", "model", "version", "calibration_version", "labelled_at"),
)

label_bins = sa.Table(
    "label_bins",
    metadata,
    *_calibration_key(primary_key=True),
    sa.Column("block", BigId, primary_key=True),
    sa.Column("conf_bin", sa.Integer, primary_key=True),
    sa.Column("count", BigId, nullable=False),
    sa.Column("confidence_sum", sa.Float, nullable=False),
    sa.Column("correct_sum", sa.Float, nullable=False),
    sa.Column("nll_sum", sa.Float, nullable=False),
    sa.Column("brier_sum", sa.Float, nullable=False),
    sa.Column("first_at", sa.Float, nullable=False),
    sa.Column("last_at", sa.Float, nullable=False),
    sa.Column("last_seq", BigId, nullable=False),
)

calibrations = sa.Table(
    "calibrations",
    metadata,
    *_calibration_key(primary_key=True),
    sa.Column("method", sa.String(32), nullable=False),
    sa.Column("temperature", sa.Float),
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("details", sa.Text),
)

pending_labels = sa.Table(
    "pending_labels",
    metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column("prediction_id", PredictionId, nullable=False),  # no foreign key: the prediction may come later
    sa.Column("label", sa.Text, nullable=False),  # as sent (class name or index), JSON
    sa.Column("received_at", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),  # pending, expired or rejected; a joined one leaves
    sa.Column("reason", sa.Text),
    sa.Column("resolved_at", sa.Float),
    sa.Column("source", sa.String(64)),
    sa.Index("ix_pending_labels_id", "prediction_id"),
    sa.Index("ix_pending_labels_status", "status", "seq"),
    sa.Index("ix_pending_labels_received", "received_at"),  # retention deletes by it
)

monitor_state = sa.Table(
    "monitor_state",
    metadata,
    *_calibration_key(primary_key=True),
    sa.Column("last_seq", BigId, nullable=False),
    sa.Column("detector", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("since", sa.Float),
    sa.Column("reasons", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # JSON: how often the label-free accuracy interval held on the labels folded (calibkit IntervalChecks)
    sa.Column("estimate_checks", sa.Text),
)

shift_state = sa.Table(
    "shift_state",
    metadata,
    *_calibration_key(primary_key=True),
    # the newest prediction the label-shift alarm folded, in id order (NULL: none yet)
    sa.Column("cursor_at", sa.Float),
    sa.Column("cursor_id", PredictionId),
    sa.Column("state", sa.Text, nullable=False),  # JSON: calibkit.label_shift_alarm.LabelShiftAlarmState
    # JSON: the class priors served adaptations use, {"version", "weights", "priors"} (NULL: none estimated yet)
    sa.Column("priors", sa.Text),
    sa.Column("alarmed", sa.Boolean, nullable=False),
    sa.Column("since", sa.Float),  # when the current state (raised or clear) began
    sa.Column("updated_at", sa.Float, nullable=False),
)

coverage_state = sa.Table(
    "coverage_state",
    metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(32), primary_key=True),
    sa.Column("last_seq", BigId, nullable=False),
    sa.Column("states", sa.Text, nullable=False),  # JSON: the adaptive threshold and coverage alarm per set choice
    sa.Column("updated_at", sa.Float, nullable=False),
)

alarm_events = sa.Table(
    "alarm_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    *_calibration_key(),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("from_state", sa.String(16), nullable=False),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("reasons", sa.Text, nullable=False),
)


def from_sources(table: sa.Table, sources: frozenset[str] | None) -> list:
    """The WHERE terms selecting the rows of ``table`` sent by ``sources`` (every row when None)."""
    if sources is None:
        return []
    return [sa.func.coalesce(table.c.source, ANONYMOUS).in_(sorted(sources))]


def of_version(table: sa.Table, model: str, version: str) -> list:
    """The WHERE terms selecting a model version's rows of ``table``."""
    return [table.c.model == model, table.c.version == version]


def scope(table: sa.Table, key: CalibrationKey) -> list:
    """The WHERE terms selecting ``key``'s rows of ``table``."""
    return [*of_version(table, key.model, key.version), table.c.calibration_version == key.calibration_version]
