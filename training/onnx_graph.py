"""Reading and editing a user's ONNX classifier: its one input, its classifier output, and the calibrated head.

``signature`` reads what the service needs from a graph (one float32 input of shape [N, F] or [N, C, H, W] with a
dynamic batch axis) and finds the tensor that holds the classes' scores: a float [N, K] output, or the probability
tensor behind a ZipMap (skl2onnx's default ``output_probability``, a sequence of maps the service cannot serve).
``calibrated_graph`` replaces the graph's outputs with ``logits`` (those scores, or the log of probabilities) and
``probabilities`` = softmax((w * logits + b) / T): temperature scaling (Guo et al. 2017) at w = 1, b = 0, vector scaling
at T = 1, bias-corrected temperature scaling at w = 1 / T and T = 1, as ``training.export`` bakes them into a trained
model. Nodes that no longer feed an output (a ZipMap, a label output) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Probabilities are clipped here before their log, so an exact 0 (trees, k-NN) gives a finite logit.
TINY_PROBABILITY = 1e-30
_FLOAT_TYPES = {1, 10, 11}  # TensorProto FLOAT, FLOAT16, DOUBLE


@dataclass(frozen=True)
class Signature:
    """What the service needs from a graph: its input's name and dims past the batch axis (None where symbolic),
    the tensor with the classes' scores, and whether that tensor holds probabilities behind a ZipMap."""

    input_name: str
    row_dims: tuple[int | None, ...]
    scores: str
    zipmap: bool


def load(path: Path):
    """The ONNX model at ``path``, with a clear error for anything else."""
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, ValueError or OSError depending on the damage
        raise ValueError(f"{path} is not an ONNX model: {exc}") from None


def signature(model, output_name: str | None = None) -> Signature:
    """Check the graph's input and find its classifier output (``output_name``, else ``logits``, else the first float
    [N, K] output, else the tensor behind a ZipMap); raises ``ValueError`` naming what the service cannot serve."""
    from onnx import TensorProto

    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ValueError(f"the service feeds one input tensor; the graph has {len(inputs)}: {[i.name for i in inputs]}")
    tensor = inputs[0].type.tensor_type
    if tensor.elem_type != TensorProto.FLOAT:
        raise ValueError(
            f"input {inputs[0].name!r} is {TensorProto.DataType.Name(tensor.elem_type)}; the service sends float32: "
            "export the model with a float32 input (integer and string inputs are not served)"
        )
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if len(dims) not in (2, 4):
        raise ValueError(
            f"input {inputs[0].name!r} has rank {len(dims)}; the service serves feature vectors [N, F] and images "
            "[N, C, H, W]"
        )
    if dims[0] is not None:
        raise ValueError(
            f"input {inputs[0].name!r} has a fixed batch axis of {dims[0]}; export it with a dynamic one "
            f"(torch.onnx.export(..., dynamic_axes={{{inputs[0].name!r}: {{0: 'batch'}}}}), or skl2onnx's "
            "initial_types [None, F])"
        )
    return Signature(inputs[0].name, tuple(dims[1:]), *_scores(graph, output_name))


def _scores(graph, output_name: str | None) -> tuple[str, bool]:
    outputs = {o.name: o for o in graph.output}
    producer = {name: node for node in graph.node for name in node.output}

    def behind_zipmap(name: str) -> str | None:
        node = producer.get(name)
        return node.input[0] if node is not None and node.op_type == "ZipMap" else None

    def classifier(info) -> bool:
        t = info.type.tensor_type if info.type.HasField("tensor_type") else None
        return t is not None and t.elem_type in _FLOAT_TYPES and len(t.shape.dim) in (0, 2)

    listed = ", ".join(f"{o.name} ({_type_name(o)})" for o in graph.output)
    if output_name is not None:
        if output_name not in outputs:
            raise ValueError(f"--output-name {output_name!r} is not an output of the graph; outputs: {listed}")
        zipped = behind_zipmap(output_name)
        if zipped is not None:
            return zipped, True
        if not classifier(outputs[output_name]):
            raise ValueError(f"output {output_name!r} is {_type_name(outputs[output_name])}, not a float [N, K] tensor")
        return output_name, False
    if "logits" in outputs and classifier(outputs["logits"]):
        return "logits", False
    for info in graph.output:
        if classifier(info):
            return info.name, False
    for info in graph.output:
        zipped = behind_zipmap(info.name)
        if zipped is not None:
            return zipped, True
    raise ValueError(
        f"the graph has no classifier output: expected a float tensor of shape [N, K] (logits or probabilities) or "
        f"a ZipMap of probabilities; outputs: {listed}"
    )


def _type_name(info) -> str:
    if info.type.HasField("tensor_type"):
        from onnx import TensorProto

        t = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        return f"{TensorProto.DataType.Name(t.elem_type).lower()} {dims}"
    return info.type.WhichOneof("value")  # sequence, map, optional


def calibrated_graph(
    model,
    sig: Signature,
    n_classes: int | None,
    *,
    probabilities: bool,
    temperature: float = 1.0,
    weights: np.ndarray | None = None,
    bias: np.ndarray | None = None,
):
    """A copy of ``model`` whose outputs are ``logits`` (the scores, or log max(p, ``TINY_PROBABILITY``)) and
    ``probabilities`` = softmax((w * logits + b) / T), every other output and the nodes only they used dropped.
    ``n_classes`` None leaves the class axis symbolic (before the classes are known)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    # the new outputs are called logits and probabilities: move any tensor of those names out of the way
    renames = {n: f"byom_original_{n}" for n in ("logits", "probabilities")}
    _rename(graph, renames)
    scores = renames.get(sig.scores, sig.scores)
    consts = {"byom_temperature": np.array(temperature, dtype=np.float32)}
    nodes = [helper.make_node("Cast", [scores], ["byom_scores"], to=TensorProto.FLOAT)]
    if probabilities:
        consts["byom_tiny"] = np.array(TINY_PROBABILITY, dtype=np.float32)
        nodes += [
            helper.make_node("Max", ["byom_scores", "byom_tiny"], ["byom_clipped"]),
            helper.make_node("Log", ["byom_clipped"], ["logits"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["byom_scores"], ["logits"]))
    scaled = "logits"
    if weights is not None and bias is not None:
        consts["byom_weights"] = np.asarray(weights, dtype=np.float32).reshape(1, -1)
        consts["byom_bias"] = np.asarray(bias, dtype=np.float32).reshape(1, -1)
        nodes += [
            helper.make_node("Mul", ["logits", "byom_weights"], ["byom_weighted"]),
            helper.make_node("Add", ["byom_weighted", "byom_bias"], ["byom_shifted"]),
        ]
        scaled = "byom_shifted"
    nodes += [
        helper.make_node("Div", [scaled, "byom_temperature"], ["byom_tempered"]),
        helper.make_node("Softmax", ["byom_tempered"], ["probabilities"], axis=-1),
    ]
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in consts.items())
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", n_classes or "classes"])
        for name in ("logits", "probabilities")
    )
    _prune(graph)
    onnx.checker.check_model(out)
    return out


def _rename(graph, renames: dict[str, str]) -> None:
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for info in (*graph.value_info, *graph.output):
        info.name = renames.get(info.name, info.name)


def _prune(graph) -> None:
    """Drop the nodes, initializers and value infos that no output needs (nodes are in topological order)."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input, _subgraph_names(node))
    for field, items in (
        (graph.node, kept[::-1]),
        (graph.initializer, [i for i in graph.initializer if i.name in needed]),
        (graph.value_info, [v for v in graph.value_info if v.name in needed]),
    ):
        del field[:]
        field.extend(items)


def _subgraph_names(node) -> set[str]:
    """Every name the subgraphs of ``node`` (If, Loop, Scan bodies) read, outer-scope names among them."""
    names: set[str] = set()
    for attribute in node.attribute:
        for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in sub.node:
                names.update(inner.input, _subgraph_names(inner))
    return names
