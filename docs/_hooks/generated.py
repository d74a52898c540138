"""MkDocs hook: the pages made at build time, and where the API reference reads code.

- `http-api-reference.md` is written from the OpenAPI document `shardq serve`
  serves (`document()` in the HTTP API's openapi module), so the reference can
  never drift from the routes: the page is the served document, rendered.
- The Python API reference (mkdocstrings) reads the product's modules as
  the product's layers (`shardq.workflow`, `shardq.client`, ...). The editable install's
  `.pkgroot/shardq` is the whole repository, `.venv/` and the symlink's own
  loop included, which griffe would walk entire (half a million files: a
  minute). The hook points it at a temporary `shardq/` holding those three
  folders' modules alone, made regular packages (`__init__.py` files) so that
  griffe takes them whole instead of merging every namespace portion on the
  path.

The changelog is not made here: docs/changelog.md includes CHANGELOG.md with a
snippet, and docs/performance.md is generated ahead of time from a saved
benchmark result (`python -m shardq.benchmarks.report --page`).
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
API_PACKAGES = ("core", "workflow", "client", "worker", "store", "shards", "outbox")
"""The product's layers the Python API reference documents; bin/ (the faces) is left out."""
OPENAPI_MODULES = ("shardq.bin.web.openapi", "shardq.bin.openapi")
"""Where the document is built: bin/web/ since the bin/ reorganisation, bin/ before it."""
PAGE = "http-api-reference.md"

_tmp: tempfile.TemporaryDirectory[str] | None = None
_document: dict[str, Any] = {}


@event_priority(100)  # before mkdocstrings reads its handler's paths
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    global _tmp  # noqa: PLW0603 - one build, one temporary package root
    _document.clear()
    _document.update(openapi_document())
    _tmp = tempfile.TemporaryDirectory(prefix="shardq-docs-")
    package = Path(_tmp.name) / "shardq"
    package.mkdir()
    (package / "__init__.py").write_text('"""shardq, as the API reference reads it."""\n')
    for name in API_PACKAGES:
        (package / name).mkdir()
        (package / name / "__init__.py").write_text("")
        for module in (ROOT / name).glob("*.py"):
            (package / name / module.name).symlink_to(module)
    plugin = config.plugins.get("mkdocstrings")
    if plugin is not None:
        plugin.config["handlers"].setdefault("python", {})["paths"] = [_tmp.name]
    return config


def on_post_build(config: MkDocsConfig) -> None:
    global _tmp  # noqa: PLW0603
    if _tmp is not None:
        _tmp.cleanup()
        _tmp = None


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, PAGE, content=openapi_page(_document)))
    return files


def openapi_document() -> dict[str, Any]:
    for name in OPENAPI_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        document: dict[str, Any] = module.document([])
        return document
    raise RuntimeError(f"no OpenAPI module found among {', '.join(OPENAPI_MODULES)}")


def _schema(schema: dict[str, Any]) -> str:
    """A short inline description of a JSON Schema."""
    if not schema:
        return "any JSON"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_schema(s) for s in schema["anyOf"])
    kind = schema.get("type", "")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    facts = [f"`{kind}`" if kind else "any JSON"]
    for key, label in (("format", "format"), ("pattern", "pattern"), ("minLength", "min length"),
                       ("maxLength", "max length"), ("minimum", "min"), ("maximum", "max")):
        if key in schema:
            value = schema[key]
            facts.append(f"{label} `{value}`" if key in ("format", "pattern") else
                         f"{label} {value}")
    return ", ".join(facts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | schema | required |", "| --- | --- | --- |"]
    for name, sub in schema.get("properties", {}).items():
        rows.append(f"| `{name}` | {_cell(_schema(sub))} | {'yes' if name in required else ''} |")
    return rows


def openapi_page(doc: dict[str, Any]) -> str:
    info = doc["info"]
    lines = [
        "# HTTP API reference",
        "",
        "<!-- Generated at build time from the OpenAPI document `shardq serve` serves "
        "(docs/_hooks/generated.py): edit the document in the code, not this page. -->",
        "",
        f"{info['title']}, OpenAPI {doc['openapi']}, document version {info['version']}. "
        f"{info.get('description', '')}",
        "",
        "This page is the document `GET /api/shardq/openapi.json` answers, rendered when the "
        "site is built; a running server fills in its app's workflow names as an enum of the "
        "`name` parameter. Every route but `/healthz` needs `Authorization: Bearer TOKEN`. "
        "Routes that take a JSON object refuse a key they do not list (400). "
        "See [the HTTP API](http-api.md) for the rules behind the statuses.",
        "",
        "## Routes",
        "",
        "| method | path | summary |",
        "| --- | --- | --- |",
    ]
    operations = [(path, method, op) for path, ops in doc["paths"].items()
                  for method, op in ops.items()]
    for path, method, op in operations:
        lines.append(f"| {method.upper()} | [`{path}`](#{op['operationId'].lower()}) | "
                     f"{_cell(op['summary'])} |")
    for path, method, op in operations:
        lines += ["", f"### {method.upper()} `{path}` {{ #{op['operationId'].lower()} }}", "",
                  f"`{op['operationId']}`: {op['summary']}.", ""]
        if "security" not in op:
            lines += ["No token needed.", ""]
        params = op.get("parameters", [])
        if params:
            lines += ["| parameter | in | schema | required | description |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| `{p['name']}` | {p['in']} | {_cell(_schema(p.get('schema', {})))} | "
                      f"{'yes' if p.get('required') else ''} | {_cell(p.get('description', ''))} |"
                      for p in params]
            lines.append("")
        body = op.get("requestBody")
        if body:
            schema = body["content"]["application/json"]["schema"]
            need = "required" if body.get("required") else "optional"
            if schema.get("properties"):
                closed = " (no other keys)" if schema.get("additionalProperties") is False else ""
                lines += [f"Request body ({need}), a JSON object{closed}:", ""]
                lines += _fields(schema)
            else:
                lines.append(f"Request body ({need}): {_schema(schema)}.")
            lines.append("")
        lines += ["| status | meaning | body |", "| --- | --- | --- |"]
        for status, response in op["responses"].items():
            schema = response.get("content", {}).get("application/json", {}).get("schema", {})
            props = schema.get("properties")
            shape = (", ".join(f"`{k}`" for k in props) if props else _schema(schema))
            lines.append(f"| {status} | {_cell(response['description'])} | {_cell(shape)} |")
    lines += ["", "## The document", "", "??? note \"openapi.json as served (no workflows)\"", "",
              "    ```json"]
    lines += ["    " + line for line in json.dumps(doc, indent=2).splitlines()]
    lines += ["    ```", ""]
    return "\n".join(lines)
