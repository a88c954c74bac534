"""Tables (SQLAlchemy Core). Every table but ``pending_labels`` is scoped by a ``CalibrationKey``;
``label_bins`` holds the mergeable per-bin sums of each block of ``BLOCK_LABELS`` consecutive labels (see
``service.store.labels``); ``pending_labels`` the labels that arrived before their prediction
(``service.store.pending``)."""

from __future__ import annotations

import sqlalchemy as sa

from service.store.rows import ANONYMOUS, CalibrationKey

SCHEMA_VERSION = 2
BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")

metadata = sa.MetaData()


def _calibration_key(primary_key: bool = False) -> list[sa.Column]:
    """The (model, version, calibration_version) columns every table is scoped by; part of the
    primary key for tables with one row per model version and calibration version."""
    return [
        sa.Column("model", sa.String(128), primary_key=primary_key, nullable=False),
        sa.Column("version", sa.String(32), primary_key=primary_key, nullable=False),
        sa.Column("calibration_version", sa.Integer, primary_key=primary_key, nullable=False),
    ]


schema_info = sa.Table("schema_info", metadata, sa.Column("version", sa.Integer, primary_key=True))

predictions = sa.Table(
    "predictions",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    *_calibration_key(),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("predicted", sa.Integer, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("uncalibrated_confidence", sa.Float),
    sa.Column("probabilities", sa.LargeBinary, nullable=False),
    sa.Column("logits", sa.LargeBinary),
    sa.Column("source", sa.String(16), nullable=False),
    # the prediction set served with the row (NULL: none): its members as packed bits, coverage and score,
    # whether it was randomized (NULL: served before floor sets, randomized for APS and RAPS), and the probabilities
    # it was computed from when they are not ``probabilities`` (under a refitted temperature; NULL otherwise)
    sa.Column("set_members", sa.LargeBinary),
    sa.Column("set_coverage", sa.Float),
    sa.Column("set_method", sa.String(8)),
    sa.Column("set_randomized", sa.Boolean),
    sa.Column("set_probabilities", sa.LargeBinary),
    # the version of the class priors the served probabilities and sets were adapted to (NULL: not adapted; the
    # probabilities above are then the model's, before the adaptation, which the label-free estimates need)
    sa.Column("priors_version", sa.String(64)),
    sa.Index("ix_predictions_model_time", "model", "version", "calibration_version", "created_at"),
)

labels = sa.Table(
    "labels",
    metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column(
        "prediction_id", sa.String(32), sa.ForeignKey("predictions.id", ondelete="CASCADE"), nullable=False, unique=True
    ),
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
    # whether the set served with the prediction held the label (NULL: no set), its size, coverage and score,
    # whether it was randomized, and the label's conformity score under that set's rule (NULL: labelled before
    # scores were kept), which the adaptive threshold and the coverage alarm fold
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
    sa.Column("prediction_id", sa.String(32), nullable=False),  # no foreign key: the prediction may come later
    sa.Column("label", sa.Text, nullable=False),  # as sent (class name or index), JSON
    sa.Column("received_at", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),  # pending, expired or rejected; a joined one leaves
    sa.Column("reason", sa.Text),
    sa.Column("resolved_at", sa.Float),
    sa.Column("source", sa.String(64)),
    sa.Index("ix_pending_labels_id", "prediction_id"),
    sa.Index("ix_pending_labels_status", "status", "seq"),
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
    # the newest prediction folded, by (created_at, id): the label-shift alarm folds the served predictions in
    # that order (NULL: none yet)
    sa.Column("cursor_at", sa.Float),
    sa.Column("cursor_id", sa.String(32)),
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


def scope(table: sa.Table, key: CalibrationKey) -> list:
    """The WHERE terms selecting ``key``'s rows of ``table``."""
    return [
        table.c.model == key.model,
        table.c.version == key.version,
        table.c.calibration_version == key.calibration_version,
    ]
