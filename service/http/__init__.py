"""The HTTP adapter: the route table (``routes``), the handlers per API (``inference``, ``monitoring``, ``v2``,
``dashboard``), the middleware, the JSON codecs and the one mapping of errors to responses (``errors``)."""
