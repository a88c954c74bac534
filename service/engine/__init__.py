"""One inference engine process per device (``server``), fed by front-end processes over ZeroMQ, as in vLLM."""
