"""One inference engine process per device, fed by front-end processes over ZeroMQ (issue 54, first part).

The engine owns the onnxruntime sessions and the one dynamic batcher per model (``server``); a front-end sends a
request's rows and gets back the batch's outputs for them with the batch's facts (``client``). Frames carry a small
msgspec header and the raw tensor bytes, never pickle (``wire``). The shape follows vLLM's API servers feeding one
engine and PyTriton's ZeroMQ proxies: many processes parse, validate and encode; one owns the device.
"""
