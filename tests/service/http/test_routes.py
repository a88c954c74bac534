"""The route table: each route declared once, and the OpenAPI document built from it."""

from __future__ import annotations

import re

from fastapi.routing import APIRoute

from service.app import create_app
from service.http.routes import ROUTES, api_routes


def test_every_route_and_method_is_declared_once_and_served_by_the_app():
    declared = [(route.path, method) for route in ROUTES for method in route.methods]
    assert len(declared) == len(set(declared))
    app = create_app()
    served = [(r.path, m) for r in app.routes if isinstance(r, APIRoute) for m in r.methods]
    assert sorted(served) == sorted(declared)


def test_the_fast_routes_are_the_hot_ones_and_the_router_keeps_them():
    routes, fast = api_routes()
    assert {(r.path, *r.methods) for r in fast} == {
        ("/predict", "POST"),
        ("/feedback", "POST"),
        ("/v2/models/{name}/infer", "POST"),
        ("/v2/models/{name}/versions/{version}/infer", "POST"),
    }
    assert all(route in routes for route in fast)


def test_the_document_describes_every_route_with_its_body_and_path_parameters():
    document = create_app().openapi()
    components = document["components"]["schemas"]
    for route in ROUTES:
        for method in route.methods:
            operation = document["paths"][route.path][method.lower()]
            names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"{(\w+)}", route.path)), route.path
            if route.body is not None:
                ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert ref.rsplit("/", 1)[1] == route.body.__name__ in components
