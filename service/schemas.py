"""Request and response models: the HTTP contract; the v2 protocol's are in ``service.serving.v2_protocol``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictInt, StrictStr, model_validator

Row = str | list[Any]
WINDOW_PATTERN = r"^(?:(0*[1-9][0-9]*)|([0-9]+(?:\.[0-9]+)?)([smhd]))$"  # groups: count | amount, unit
WINDOW = Field(
    default=None, pattern=WINDOW_PATTERN, description="a label count (1000) or a duration (30s, 15m, 1h, 7d)"
)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PredictOptions(_Request):
    """Everything of a /predict body but its rows (validated on their own when they arrive as one array)."""

    model: str | None = Field(default=None, description="model name; the default model when omitted")
    version: str | None = Field(default=None, description="model version; the latest when omitted")
    top_k: int | None = Field(default=None, ge=1, description="also list the k most probable classes")
    return_logits: bool = False
    return_uncalibrated: bool = Field(default=False, description="also return softmax(logits) without calibration")
    coverage: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="the prediction sets' coverage 1 - alpha: each row's set holds its true label with at least "
        "this probability on data like the calibration split's; one of the levels the model serves (GET /models), "
        "its default when omitted",
    )
    set_method: Literal["lac", "aps", "raps"] | None = Field(
        default=None, description="the conformal score of the sets (LAC, APS or RAPS); the model's default when omitted"
    )
    randomized: bool | None = Field(
        default=None,
        description="true: the exact sets (randomized APS and RAPS, LAC without its floor): coverage 1 - alpha to "
        "within 1 / (n + 1), but a set may be empty and, for APS and RAPS, differ between rows of the same input; "
        "false: the floor sets, never empty, the same for the same input, coverage at least 1 - alpha; the "
        "service's default (CALIB_CONFORMAL__RANDOMIZED) when omitted",
    )
    return_p_values: bool = Field(default=False, description="also return each class's conformal p-value")
    adapt_priors: bool | None = Field(
        default=None,
        description="true: probabilities adapted to the class priors estimated on recent traffic (label shift; "
        "p(y|x) reweighted by pi_t(y) / pi_s(y) and renormalised) and sets by the weighted conformal quantile, "
        "their version in priors_version; false: the model's own; the service's default (CALIB_SHIFT__ADAPT) when "
        "omitted",
    )


class PredictRequest(PredictOptions):
    """A batch of rows: nested arrays of the model's input shape, (C, H, W) -- (H, W) or a flat
    C*H*W vector also work -- or (F,) for a model over feature vectors; or, for an image model with
    preprocessing, base64-encoded PNG/JPEG images (optionally as data URLs)."""

    inputs: list[Row] = Field(
        min_length=1,
        description="one entry per row: a nested numeric array of the model's input shape (GET /models) or, "
        "for an image model, a base64 image (PNG/JPEG in the polarity the model was trained on; see the manifest's "
        "preprocessing.invert in GET /models)",
    )


class ClassProbability(BaseModel):
    label: str
    class_index: int
    probability: float


class Prediction(BaseModel):
    id: str = Field(description="unique prediction id; POST /feedback refers to it")
    label: str
    class_index: int
    confidence: float = Field(description="calibrated probability of the predicted class")
    probabilities: list[float] = Field(description="calibrated probabilities, one per class")
    top_k: list[ClassProbability] | None = None
    logits: list[float] | None = None
    uncalibrated_probabilities: list[float] | None = None
    prediction_set: list[str] | None = Field(
        default=None, description="the labels of the row's conformal prediction set, most probable first"
    )
    set_size: int | None = None
    p_values: list[float] | None = Field(default=None, description="each class's conformal p-value, when asked for")


class SetsInfo(BaseModel):
    """How a response's prediction sets were made."""

    method: Literal["lac", "aps", "raps"]
    coverage: float
    threshold: float | None = Field(description="the score threshold; null when the set is every class")
    threshold_version: str = Field(description="the conformal scores' checksum and the labels folded into it")
    randomized: bool = Field(
        description="true: the exact sets (randomized APS and RAPS, one uniform draw per row from its prediction id; "
        "LAC without its floor), which may be empty; false: the floor sets, which always hold the most probable label"
    )


class PredictResponse(BaseModel):
    model: str
    version: str
    calibration_version: int = Field(description="0 = the manifest's calibration; higher = refitted in service")
    temperature: float | None = Field(description="temperature of the calibration (null for other methods)")
    provider: str = Field(description="onnxruntime execution provider that computed the result")
    conformal: SetsInfo | None = Field(default=None, description="the prediction sets; null when none are served")
    priors_version: str | None = Field(
        default=None,
        description="the version of the class priors the probabilities and sets were adapted to (the estimate's "
        "method, window size and newest prediction); null when not adapted",
    )
    predictions: list[Prediction]


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelVersionInfo(BaseModel):
    version: str
    latest: bool
    classes: list[str]
    input: dict[str, Any]
    preprocessing: dict[str, Any] | None = Field(description="null for a model that takes numbers only")
    calibration: dict[str, Any]
    temperature: float | None
    provider: str
    batching: dict[str, Any]
    ready: bool
    prediction_sets: dict[str, Any] = Field(
        description="whether the version serves conformal prediction sets (and why not), its methods, default "
        "method and coverage, calibration rows and threshold version"
    )


class ModelInfo(BaseModel):
    name: str
    versions: list[ModelVersionInfo]


class ModelsResponse(BaseModel):
    default: str | None
    models: list[ModelInfo]


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded", "not_ready"]
    ready: bool
    models: list[dict[str, Any]]
    failed_artifacts: list[dict[str, str]]
    storage: dict[str, Any]
    device: str
    available_providers: list[str]
    onnxruntime: str
    grpc_port: int | None = Field(
        default=None, description="the port of the Open Inference Protocol over gRPC (null when gRPC is off)"
    )
    cuda_libraries: list[str] | None = Field(
        default=None, description="CUDA and cuDNN libraries loaded at start-up (null when CUDA was not asked for)"
    )
    version: str
    pod: dict[str, Any] | None = Field(
        default=None,
        description="in a pod (CALIB_FRONTENDS > 1): this front-end's index and pid, the number of front-ends, "
        "and the engine's endpoint and whether it answers; null for a process that runs its own inference",
    )


class FeedbackItem(_Request):
    """A true label for an earlier prediction (``prediction_id``), or for probabilities scored elsewhere."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["prediction_id"]}, {"required": ["probabilities"]}]}
    )

    # absent when unused, never null: the schema's oneOf says exactly one of the two is given (the types leave
    # out None, which would admit a null, so the None defaults need their type: ignore)
    prediction_id: str = Field(default=None, max_length=64)  # type: ignore[assignment]
    label: StrictStr | StrictInt = Field(description="class name or class index")
    # strict floats: no true/false
    probabilities: list[Annotated[float, Strict()]] = Field(default=None, max_length=100_000)  # type: ignore[arg-type]
    model: str | None = None
    version: str | None = None

    @model_validator(mode="after")
    def _one_source(self):
        if (self.prediction_id is None) == (self.probabilities is None):
            raise ValueError("give either prediction_id or probabilities (with model)")
        return self


class FeedbackRequest(_Request):
    items: list[FeedbackItem] = Field(min_length=1)


class RejectedItem(BaseModel):
    index: int
    prediction_id: str | None
    reason: str


class PendingItem(BaseModel):
    index: int
    prediction_id: str


class FeedbackResponse(BaseModel):
    """Every item is accepted (joined and counted), pending (stored until its prediction is in the store,
    then joined, or listed by GET /feedback/unmatched when it expires) or rejected (with why)."""

    accepted: int = Field(description="items joined with their prediction and stored")
    pending: list[PendingItem] = Field(
        description="items stored to wait for their prediction: not an error; they count once joined"
    )
    rejected: list[RejectedItem] = Field(
        description="items not stored: a bad label, a duplicate, an id that cannot be a prediction id"
    )


class UnmatchedLabel(BaseModel):
    seq: int
    prediction_id: str
    label: str = Field(description="the label as sent (JSON)")
    received_at: float
    status: Literal["pending", "expired", "rejected"]
    reason: str | None
    resolved_at: float | None
    source: str | None = Field(default=None, description="the name of the feedback token that sent it")


class UnmatchedLabels(BaseModel):
    """Labels that arrived before their prediction: still pending, or ended without a join (all models)."""

    pending: int
    expired: int
    rejected: int
    items: list[UnmatchedLabel] = Field(description="the most recent, newest first")


class ReliabilityBin(BaseModel):
    lo: float
    hi: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


class AlarmInfo(BaseModel):
    state: Literal["ok", "warning", "alarm"]
    reasons: list[str]
    since: float | None


class Refit(BaseModel):
    """A temperature refitted on labelled logits (Guo et al. 2017) and its in-sample effect."""

    temperature: float
    n: int
    ece_current: float
    ece_after: float
    nll_current: float
    nll_after: float


class CalibrationReport(BaseModel):
    """Rolling calibration of one model version over one label window."""

    model: str
    version: str
    calibration_version: int
    temperature: float | None
    window: dict[str, Any]
    n: int
    first_labelled_at: float | None
    last_labelled_at: float | None
    accuracy: float | None
    mean_confidence: float | None
    ece: float | None
    ece_ci: list[float] | None = Field(description="bias-corrected binomial bootstrap interval")
    ece_ci_level: float | None
    mce: float | None
    debiased_ece: float | None
    adaptive_ece: float | None
    classwise_ece: float | None
    brier: float | None
    nll: float | None
    calibration_test_p_value: float | None
    bins: list[ReliabilityBin]
    detail_rows: int
    recalibration: Refit | None = Field(
        description="the temperature refitted on the window's most recent "
        "labelled logits and what it would do (in-sample); null below the minimum"
    )
    reference: dict[str, Any]
    drift: dict[str, Any]
    coverage: dict[str, Any] | None = Field(
        default=None,
        description="the served prediction sets over the window, per set choice (method, coverage): observed "
        "coverage with its Wilson interval, mean set size, coverage per class and by set size; the adapted "
        "threshold against the static one with its version and long-run bound; the coverage alarm",
    )
    label_shift: dict[str, Any] | None = Field(
        default=None,
        description="the label-shift alarm on the served predictions, no labels needed: state, e-detector and "
        "clearing evidence against their thresholds, the class that drives it, and per class the reference mean "
        "probability, its band and the traffic's means (docs/monitoring.md)",
    )
    alarm: AlarmInfo
    e_detector: dict[str, Any]
    thresholds: dict[str, Any]
    unmatched_labels: dict[str, int] = Field(
        description="labels (of every model) still waiting for their "
        "prediction, and those that expired or were rejected at the join "
        "(GET /feedback/unmatched lists them)"
    )
    by_source: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="with ?by_source=true: per source (the name of the feedback token that sent the "
        "labels, or 'anonymous'), the window's label count, accuracy, mean confidence, ECE, and whether the source "
        "counts for the alarm and the refit (CALIB_LABELS__TRUSTED_SOURCES)",
    )


class RecalibrateRequest(_Request):
    model: str | None = None
    version: str | None = None
    window: str | None = WINDOW


class ActivateRequest(_Request):
    model: str | None = None
    version: str | None = None
    calibration_version: int = Field(ge=0)


class RecalibrateResponse(Refit):
    model: str
    version: str
    calibration_version: int = Field(description="the new calibration version, now in force")


class ActivateResponse(BaseModel):
    model: str
    version: str
    calibration_version: int = Field(description="the calibration version now in force (0 = the manifest's)")
    temperature: float | None


class TimelinePoint(BaseModel):
    seq: int = Field(description="sequence number of the newest label in the point's window")
    labelled_at: float
    n: int
    ece: float
    ece_ci: list[float]


class TimelineResponse(BaseModel):
    model: str
    version: str
    calibration_version: int
    window: int
    step: int
    points: list[TimelinePoint] = Field(description="oldest first")


class CalibrationVersionInfo(BaseModel):
    calibration_version: int
    method: str
    temperature: float | None
    source: Literal["manifest", "refit"] = Field(description="the artifact's manifest, or POST /admin/recalibrate")
    active: bool
    created_at: float
    details: dict[str, Any]


class AlarmEvent(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    at: float
    calibration_version: int
    from_state: Literal["ok", "warning", "alarm"] = Field(alias="from")
    to_state: Literal["ok", "warning", "alarm"] = Field(alias="to")
    reasons: list[str]


class HistoryResponse(BaseModel):
    model: str
    version: str
    active_calibration_version: int
    calibrations: list[CalibrationVersionInfo]
    alarm_events: list[AlarmEvent]
