"""The browser playground (`/`) and the methods listing it reads (`/v1/specdec/methods`).

Why: speculation's point is which guesses were right, and a picture beats a
table: the page streams a chat reply with each token coloured by its draft
source (`specdec.engine.provenance`), shows tokens per pass and MAT as they
arrive, offers every method with its request options, and can send the same
request with `plain` beside it. It is plain HTML, CSS and JavaScript shipped in
the package (`static/`): no build step, nothing fetched from elsewhere, so it
works offline. The page is an ordinary client of the OpenAI-compatible API
(streaming with `specdec.sources`), so what it shows is what any client gets.

Invariants:
- the page and its two files (PAGE_PATHS) hold no data and are served without a
  key (`specdec.serve.guard` lists them as public); every call the page makes
  (/v1/models, /v1/specdec/methods, /v1/chat/completions) needs the API key
  exactly as any client's, and the page asks for one when the server answers 401;
- the files are read once, at startup, and served with a Content-Security-Policy
  that lets the page load and call this origin only;
- /v1/specdec/methods lists every method with the options a request may set, as
  declared (`specdec.proposers.schema`: kind, choices, bounds, a request's cap),
  their values on this server, and whether this server serves the method (one
  that needs setup it did not do is listed with the refusal a request would get).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from specdec.proposers import METHODS
from specdec.proposers.schema import OptionSpec
from specdec.serve.options import REQUEST_OPTIONS, MethodSettings, RequestRefused
from specdec.serve.pool import ProposerPool

# path -> (file under static/, media type)
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/playground/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/playground/style.css": ("style.css", "text/css; charset=utf-8"),
}
PAGE_PATHS = frozenset(PAGE_FILES)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def add_playground(app: FastAPI) -> None:
    """Serve the page at / and its script and style under /playground/."""
    static = resources.files("specdec.serve") / "static"
    for path, (name, media_type) in PAGE_FILES.items():
        page = _page((static / name).read_bytes(), media_type)
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)


def _page(body: bytes, media_type: str) -> Any:
    async def page() -> Response:
        return Response(body, media_type=media_type, headers=PAGE_HEADERS)

    return page


def add_methods_route(app: FastAPI, methods: MethodSettings, pool: ProposerPool) -> None:
    """GET /v1/specdec/methods: the listing, made once (the server's methods do not change while it runs)."""
    listing = methods_listing(methods, pool)

    @app.get("/v1/specdec/methods", responses={401: {"description": "missing or incorrect API key"}})
    async def list_methods() -> dict:
        return listing


def methods_listing(methods: MethodSettings, pool: ProposerPool) -> dict[str, Any]:
    """Every method: whether this server serves it, and the options a request may set (with this server's
    values as defaults)."""
    listed = []
    for name in METHODS:
        values: dict[str, Any] = {}
        reason = None
        try:
            resolved = methods.resolve(name, None)
            pool.check(resolved.config)
            values = resolved.visible
        except RequestRefused as error:
            reason = str(error)
        allowed = REQUEST_OPTIONS[name]
        options = [option_entry(spec, values.get(option, spec.default)) for option, spec in allowed.items()]
        listed.append({"name": name, "available": reason is None, "reason": reason, "options": options})
    return {"object": "list", "default": methods.default, "data": listed}


def option_entry(spec: OptionSpec, value: Any) -> dict[str, Any]:
    """One request option as the page's form needs it: kind, choices, bounds (a request's cap applied)."""
    high = spec.high
    if spec.request_max is not None and (high is None or spec.request_max <= high[1]):
        high = ("<=", spec.request_max)
    return {
        "name": spec.name,
        "kind": spec.kind.__name__,
        "choices": list(spec.choices),
        "value": value,
        "min": spec.low[1] if spec.low else None,
        "min_exclusive": bool(spec.low and spec.low[0] == ">"),
        "max": high[1] if high else None,
        "max_exclusive": bool(high and high[0] == "<"),
        "describe": spec.describe(),
    }
