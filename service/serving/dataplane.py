"""What the inference routes do, independent of the protocol: predict, model listing and v2 inference; the handlers
in ``service.http`` and the gRPC servicer only translate their protocol to these calls and back."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from service.errors import Overloaded
from service.metrics import Phases, ServiceMetrics
from service.schemas import ModelInfo, ModelsResponse, ModelVersionInfo, PredictOptions, PredictRequest
from service.serving import v2_protocol
from service.serving.adaptation import Adaptation, adapted, chosen
from service.serving.batching import DynamicBatcher, Timing
from service.serving.conformal import ServedSets, SetChoice
from service.serving.preprocessing import numeric_batch, to_batch
from service.serving.repository import ModelRepository, ServedModel
from service.serving.scoring import InferenceResult, ScoredBatch, score
from service.serving.v2_protocol import P_VALUES, PREDICTION_ID, PREDICTION_SET, V2InferenceRequest
from service.settings import Settings

if TYPE_CHECKING:
    from service.engine.client import EngineClient


@dataclass(eq=False)
class DataPlane:
    """The service's behaviour over a model repository."""

    repository: ModelRepository
    settings: Settings
    metrics: ServiceMetrics
    monitor: Any = None
    prediction_log: Any = None
    engine: EngineClient | None = field(default=None, init=False)
    _model_metrics: dict[tuple[str, str], tuple] = field(default_factory=dict, init=False)

    async def start(self) -> None:
        """Start a batcher for every loaded model version, over its sessions or the engine's."""
        if self.settings.pod.engine_endpoint is not None:
            await self._connect_engine(self.settings.pod.engine_endpoint)
        for model in self.repository.all():
            label = f"{model.name}:{model.version}"
            finish = functools.partial(self.finish_batch, model)
            retry_after = self.settings.limits.retry_after_seconds
            if self.engine is None:
                runs = [runtime.run for runtime in model.runtimes]
                observe = functools.partial(self.metrics.observe_batch, label)
                batcher = DynamicBatcher(
                    runs, model.batching, label, retry_after, on_batch=observe, finish=finish, gather=True
                )
            else:  # the engine observes its own batches; a front-end, the messages it sends and its share of the queue
                from service.engine.frontend import EngineBatcher
                from service.engine.pod import frontend_count

                share = -(-model.batching.max_queue_rows // frontend_count(self.settings))
                batcher = EngineBatcher(
                    model.runtime,  # type: ignore[arg-type]  # _connect_engine made it a RemoteRuntime
                    model.batching.model_copy(update={"max_queue_rows": share}),
                    label,
                    retry_after,
                    on_queue_wait=self.metrics.engine_queue.labels(label).observe,
                    max_window=self.settings.pod.max_window,
                    on_batch=functools.partial(self.metrics.observe_engine_message, label),
                    finish=finish,
                )
            batcher.start()
            model.batcher = batcher
            self.metrics.model_info.labels(
                model.name, model.version, model.runtime.provider, model.manifest.calibration.method
            ).set(1)
            self.metrics.model_ready.labels(model.name, model.version).set(1)

    async def _connect_engine(self, endpoint: str) -> None:
        """Connect to the engine and give each version its remote sessions; one the engine lacks is refused."""
        from service.engine.client import EngineClient
        from service.engine.frontend import RemoteRuntime  # no zmq import on the in-process path

        self.engine = EngineClient(endpoint)
        await self.engine.start(wait=self.settings.pod.engine_wait_seconds)
        facts = {(f["model"], f["version"]): f for f in await self.engine.describe()}
        for model in self.repository.all():
            found = facts.get((model.name, model.version))
            if found is None:
                del self.repository.models[model.name][model.version]
                self.repository.failed.append(
                    {"path": f"{model.name}/{model.version}", "error": "the engine does not serve this version"}
                )
                continue
            model.runtimes = [
                RemoteRuntime(found, self.engine, model.name, model.version, model.batching.deadline_seconds)
            ]
        self.repository.models = {name: versions for name, versions in self.repository.models.items() if versions}

    async def stop(self) -> None:
        """Finish queued and in-flight batches, then stop every batcher."""
        for model in self.repository.all():
            self.metrics.model_ready.labels(model.name, model.version).set(0)
            if model.batcher is not None:
                await model.batcher.stop()
        if self.engine is not None:
            await self.engine.stop()

    async def infer(self, model: ServedModel, x: np.ndarray) -> tuple[InferenceResult, Timing]:
        """Run a batch through the model's batcher; record the queue time."""
        queue, predictions, rejected = self._metrics_of(model)
        assert model.batcher is not None  # start() gave every loaded model version one
        try:
            result, timing = await model.batcher.submit(x)
        except Overloaded:
            rejected.inc()
            raise
        queue.observe(timing.queue_seconds)
        predictions.inc(len(x))
        return result, timing

    def _metrics_of(self, model: ServedModel) -> tuple:
        """The model's queue histogram and prediction and rejection counters (label lookups done once)."""
        found = self._model_metrics.get((model.name, model.version))
        if found is None:
            label = f"{model.name}:{model.version}"
            found = self._model_metrics[(model.name, model.version)] = (
                self.metrics.queue.labels(label),
                self.metrics.predictions.labels(model.name, model.version),
                self.metrics.rejected.labels(label),
            )
        return found

    def prepare(self, request: PredictRequest) -> tuple[PredictRequest, ServedModel, np.ndarray]:
        """The request, its model and its rows as one float32 batch (422 naming the row); the rows' Python objects,
        many times the array's size, are dropped."""
        model = self.repository.get(request.model, request.version)
        x = to_batch(
            request.inputs,
            model.shape,
            model.manifest.preprocessing,
            max_rows=self.settings.limits.max_rows_per_request,
            max_pixels=self.settings.limits.max_image_pixels,
        )
        request.inputs = []
        return request, model, x

    def prepare_numeric(self, fields: dict, rows: np.ndarray) -> tuple[PredictOptions, ServedModel, np.ndarray] | None:
        """A /predict body whose rows arrived as one array (``service.http.numeric_json``): its options, model and
        batch; None where ``prepare`` must answer, so that every error is the general path's."""
        try:
            options = PredictOptions.model_validate(fields)
        except ValidationError:
            return None
        model = self.repository.get(options.model, options.version)
        x = numeric_batch(rows, model.shape) if len(rows) <= self.settings.limits.max_rows_per_request else None
        return None if x is None else (options, model, x)

    async def predict(
        self, model: ServedModel, options: PredictOptions, x: np.ndarray, phases: Phases
    ) -> tuple[dict, Timing]:
        """The /predict body for a prepared request (``respond``) and the batch's timing."""
        choice = model.sets.choice(
            options.set_method, options.coverage, options.return_p_values, randomized=options.randomized
        )
        adaptation = chosen(self.settings.shift.adapt, model.adaptation, options.adapt_priors)
        phases.mark("validate")
        result, timing = await self.infer(model, x)
        phases.mark("batch")
        scored, sets, ids = await self.answered(model, result, choice, adaptation)
        body = self.respond(model, options, scored, ids, sets)
        return (body if adaptation is None else body | {"priors_version": adaptation.version}), timing

    def finish_batch(self, model: ServedModel, outputs: dict[str, np.ndarray]) -> InferenceResult:
        """On an inference thread: a batch's outputs scored under the calibration in force, with its ids and its
        sets under the model's default choice."""
        names = model.manifest.outputs
        calibration_version, temperature = (
            self.monitor.calibrations.active(model)
            if self.monitor is not None
            else (0, model.manifest.calibration.temperature)
        )
        scored = score(
            outputs[names["logits"]],
            outputs[names["probabilities"]],
            calibration_version,
            temperature,
            encode=self.prediction_log is not None,
        )
        sets = model.sets
        default = sets.choice(None, None, False)
        served = None
        if default is not None:
            served = sets.sets(outputs[names["probabilities"]], scored.ids, default).listed()
        adaptation = chosen(self.settings.shift.adapt, model.adaptation, None)
        if adaptation is None:
            return InferenceResult(outputs, scored, served)
        batch = InferenceResult(outputs, scored, served, adaptation, adapted(scored, adaptation))
        weighted = self.adapted_sets(model, batch, default, adaptation)
        return replace(batch, adapted_sets=None if weighted is None else weighted.listed())

    @staticmethod
    def sets_for(model: ServedModel, result: InferenceResult, choice: SetChoice | None) -> ServedSets | None:
        """A request's sets: its share of the batch's when it asks for the default choice, else its own."""
        if choice is None:
            return None
        if result.sets is not None and result.sets.choice == choice:
            return result.sets
        probs = result.outputs[model.manifest.outputs["probabilities"]]
        return model.sets.sets(probs, result.scored.ids, choice)

    async def answered(
        self, model: ServedModel, result: InferenceResult, choice: SetChoice | None, adaptation: Adaptation | None
    ) -> tuple[ScoredBatch, ServedSets | None, list[str]]:
        """What both protocols answer a request with: its rows, their sets and their ids once logged."""
        if adaptation is None:
            sets, scored = self.sets_for(model, result, choice), result.scored
        else:
            sets, scored = self.adapted_for(model, result, choice, adaptation)
        ids = await self.log(model, result.scored, sets, None if adaptation is None else adaptation.version)
        return scored, sets, ids

    def adapted_for(
        self, model: ServedModel, result: InferenceResult, choice: SetChoice | None, adaptation: Adaptation
    ) -> tuple[ServedSets | None, ScoredBatch]:
        """A request's adapted sets and rows: its share of the batch's when adapted alike, else its own."""
        same = result.adaptation is adaptation and result.adapted is not None
        scored = result.adapted if same and result.adapted is not None else adapted(result.scored, adaptation)
        if same and result.adapted_sets is not None and result.adapted_sets.choice == choice:
            return result.adapted_sets, scored
        return self.adapted_sets(model, result, choice, adaptation), scored

    def adapted_sets(
        self, model: ServedModel, result: InferenceResult, choice: SetChoice | None, adaptation: Adaptation
    ) -> ServedSets | None:
        """A request's sets under new class priors (``ModelSets.label_shift_sets``), else the unweighted ones."""
        if choice is None:
            return None
        probs = result.outputs[model.manifest.outputs["probabilities"]]
        weighted = model.sets.label_shift_sets(probs, result.scored.ids, choice, adaptation.weights, adaptation.version)
        return weighted if weighted is not None else self.sets_for(model, result, choice)

    async def log(
        self, model: ServedModel, scored: ScoredBatch, sets: ServedSets | None = None, priors_version: str | None = None
    ) -> list[str]:
        """The logging hook of both protocols: queue a request's rows (the model's own probabilities, the sets and
        priors' version served) unless logging is off, under sync durability until committed; their ids."""
        if self.prediction_log is not None:
            rows = scored.prediction_rows(model.name, model.version, sets=sets, priors_version=priors_version)
            ticket = self.prediction_log.enqueue(rows)
            if self.prediction_log.sync:
                await self.prediction_log.written(ticket)
        return scored.ids

    def respond(
        self, model: ServedModel, request: PredictOptions, s: ScoredBatch, ids: list[str], sets: ServedSets | None
    ) -> dict:
        """The /predict body (a ``PredictResponse`` as plain data) of the request's rows, ids and sets."""
        classes, probs = model.manifest.class_names, s.probabilities
        order = np.argsort(-probs, axis=1, kind="stable")[:, : request.top_k].tolist() if request.top_k else None
        members = None if sets is None else sets.members_ranked()
        p_values = sets.p_values if sets is not None else None
        predictions = [
            {
                "id": ids[i],
                "label": classes[k],
                "class_index": k,
                "confidence": s.confidence[i],
                "probabilities": probs[i],
                "top_k": None
                if order is None
                else [{"label": classes[j], "class_index": j, "probability": float(probs[i, j])} for j in order[i]],
                "logits": s.logits[i] if request.return_logits else None,
                "uncalibrated_probabilities": s.uncalibrated[i] if request.return_uncalibrated else None,
                "prediction_set": None if members is None else [classes[j] for j in members[i]],
                "set_size": None if members is None else len(members[i]),
                "p_values": None if p_values is None else p_values[i],
            }
            for i, k in enumerate(s.predicted)
        ]
        return {
            "model": model.name,
            "version": model.version,
            "calibration_version": s.calibration_version,
            "temperature": s.temperature,
            "provider": model.runtime.provider,
            "conformal": None if sets is None else sets.info(),
            "priors_version": None,
            "predictions": predictions,
        }

    def models(self) -> ModelsResponse:
        infos = []
        for name in sorted(self.repository.models):
            latest = self.repository.latest_version(name)
            versions = [self._version_info(m, m.version == latest) for m in self.repository.all() if m.name == name]
            infos.append(ModelInfo(name=name, versions=versions))
        return ModelsResponse(default=self.repository.default, models=infos)

    @staticmethod
    def _version_info(model: ServedModel, latest: bool) -> ModelVersionInfo:
        m = model.manifest
        return ModelVersionInfo(
            version=model.version,
            latest=latest,
            classes=m.class_names,
            input=m.input.model_dump(),
            preprocessing=None if m.preprocessing is None else m.preprocessing.model_dump(),
            calibration=m.calibration.model_dump(),
            temperature=m.calibration.temperature,
            provider=model.runtime.provider,
            batching=model.batching.model_dump(),
            ready=model.ready,
            prediction_sets=model.sets.describe(),
        )

    async def v2_infer(
        self,
        name: str,
        version: str | None,
        request: V2InferenceRequest,
        values: dict[str, np.ndarray | list],
        phases: Phases,
    ) -> tuple[ServedModel, dict[str, np.ndarray], list[str], dict]:
        """Run a v2 request (``values``: its inputs by name) and log its rows as /predict does."""
        model = self.repository.get(name, version)
        x = v2_protocol.input_batch(model, request, values, self.settings.limits.max_rows_per_request)
        requested = v2_protocol.requested_outputs(model, request)
        parameters = request.parameters or {}
        choice = v2_protocol.set_choice(model, parameters, requested)
        asked = v2_protocol.flag(parameters, "adapt_priors")
        adaptation = chosen(self.settings.shift.adapt, model.adaptation, asked, field="parameters.adapt_priors")
        phases.mark("validate")
        result, _ = await self.infer(model, x)
        phases.mark("batch")
        scored, sets, ids = await self.answered(model, result, choice, adaptation)
        # the probabilities answered are the scored ones: after a recalibration they are not the graph's
        served = {
            model.manifest.outputs["probabilities"]: scored.probabilities,
            PREDICTION_ID: np.array(ids, dtype=object),
        }
        info: dict = {} if adaptation is None else {"priors_version": adaptation.version}
        if sets is not None:
            served[PREDICTION_SET] = sets.members
            if sets.p_values is not None:
                served[P_VALUES] = sets.p_values
            info |= {("set_method" if k == "method" else k): v for k, v in sets.info().items() if v is not None}
        # every requested name is known: served here or an output of the graph
        outputs = {name: served[name] if name in served else result.outputs[name] for name in requested}
        return model, outputs, ids, info
