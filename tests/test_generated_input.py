"""Generated manifests, deploys and TOML: no input may produce anything but a model or a
clear InputError (and, through the CLI, exit 0 or 2 without a traceback)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import InputError
from harness.manifests.agent import AgentConfig
from harness.manifests.deploy import Deploy
from harness.manifests.loading import parse_toml, validate_data
from harness.manifests.model import BenchmarkManifest, ServiceManifest

KEYS = [
    "kind",
    "summary",
    "protocol",
    "command",
    "port",
    "vram_gb",
    "load_seconds",
    "client",
    "scoped",
    "environment",
    "weights",
    "xpolicylab",
    "health",
    "python",
    "requirements",
    "sources",
    "repo",
    "rev",
    "install",
    "subdirectory",
    "dir",
    "modelscope_model",
    "huggingface_model",
    "url",
    "path",
    "revision",
    "include",
    "sha256",
    "gpu",
    "mode",
    "swap",
    "idle_seconds",
    "gpus",
    "sim",
    "services",
    "agent",
    "skills",
    "needs",
    "x",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "{python}",
            "{weights}/m",
            "{port",
            "{x}",
            "3.11",
            "torch==2.7.0",
            "editable",
            "auto",
            "on_demand",
            "a/b",
            "../x",
            "https://h/x",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=20,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=10)

VALID = {"kind": "policy", "summary": "s", "command": ["{python}"], "port": 9000, "environment": {"python": "3.11"}}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(documents, st.sampled_from([ServiceManifest, BenchmarkManifest, Deploy, AgentConfig]))
def test_random_documents_validate_or_fail_cleanly(document: dict, model: type) -> None:
    try:
        validate_data(model, document, "gen.toml")
    except InputError as exc:
        assert exc.message.startswith("gen.toml")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=4), st.lists(st.sampled_from(list(VALID)), max_size=3))
def test_mutated_valid_manifests(changes: dict, removed: list[str]) -> None:
    document = {**VALID, **changes}
    for key in removed:
        document.pop(key, None)
    try:
        validate_data(ServiceManifest, document, "gen.toml")
    except InputError as exc:
        assert exc.message.startswith("gen.toml")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_toml_text(text: str) -> None:
    try:
        parse_toml(text, "gen.toml")
    except InputError as exc:
        assert exc.message.startswith("gen.toml")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=120))
def test_random_bytes_through_the_cli(data: bytes, tmp_path: Path, harness_cli) -> None:
    services = tmp_path / "services"
    services.mkdir(exist_ok=True)
    (services / "gen.toml").write_bytes(data)
    result = harness_cli("--project", str(tmp_path), "services", "--json")
    assert result.code in (0, 2), result
    assert "Traceback" not in result.err and "internal error" not in result.err
