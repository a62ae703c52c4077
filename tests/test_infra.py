"""infra/ holds together: what can be checked here without a container engine.

- the compose file: every rutster command in it parses with ``rutster``'s own
  argument parser, every gateway's environment (secret files stood in for) is a
  configuration the gateway accepts, every variable it sets is documented, every
  secret and dependency it names exists, and, where ``docker-compose`` is
  installed, the compose schema accepts it;
- the alert rules: every rutster metric they name is one the gateway exports, and,
  where ``promtool`` is installed, Prometheus checks the rules and the config;
- the Kamailio image's dispatcher list passes ``kamailio -c`` with the edge config.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from rutster.gateway.config import GatewayConfig
from rutster.gateway.metrics import GatewayMetrics
from rutster.tools.cli import build_parser
from tests.test_sip_kamailio import CONFIG as KAMAILIO_CONFIG
from tests.test_sip_kamailio import free_udp_port, kamailio_binary

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
COMPOSE = INFRA / "compose.yaml"
PROMETHEUS = INFRA / "prometheus" / "prometheus.yml"
ALERTS = INFRA / "prometheus" / "alerts.yml"
DISPATCHER = INFRA / "kamailio" / "dispatcher.compose.list"
#: Where operators find the variables: the README's table, the SIP guide's.
ENV_DOCS = (ROOT / "README.md", ROOT / "docs" / "SIP.md")
#: Metrics Prometheus makes itself (not the gateway's).
PROMETHEUS_OWN = {"up"}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # resolves the << merges
    return loaded


def rutster_services() -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("image") == "rutster:local"
    }


def test_every_rutster_command_parses() -> None:
    parser = build_parser()
    for name, service in rutster_services().items():
        command = service.get("command", ["rutster", "serve", "--host", "0.0.0.0"])
        assert command[0] == "rutster", name
        parser.parse_args(command[1:])  # exits (fails the test) on a bad argument


def test_each_gateway_environment_is_a_configuration_the_gateway_accepts(
    tmp_path: Path,
) -> None:
    gateways = {n: s for n, s in rutster_services().items() if n.startswith("gateway")}
    assert len(gateways) == 2
    nodes = set()
    for name, service in gateways.items():
        env = {k: str(v) for k, v in service["environment"].items()}
        for key, value in list(env.items()):
            if value.startswith("/run/secrets/"):
                stand_in = tmp_path / Path(value).name
                stand_in.write_text("x" * 40)
                env[key] = str(stand_in)
                assert Path(value).name in service["secrets"], f"{name}: {key}"
        config = GatewayConfig.from_env(env)
        assert config.sip_enabled and config.spend.redis_url == "redis://redis:6379/0"
        assert config.public_url == "https://gw.example.com"  # one public URL for all
        nodes.add(config.spend.node_id)
    assert nodes == set(gateways)


def test_every_variable_set_is_documented() -> None:
    documented = "\n".join(p.read_text() for p in ENV_DOCS)
    for name, service in rutster_services().items():
        for key in service.get("environment", {}):
            base = key.removesuffix("_FILE")
            assert f"`{base}`" in documented or f"`{key}`" in documented, f"{name}: {key}"


def test_every_secret_and_dependency_named_exists() -> None:
    spec = compose()
    services, secrets = spec["services"], spec["secrets"]
    for name, service in services.items():
        for needed in service.get("depends_on", []):
            assert needed in services, f"{name} depends on {needed}"
        for secret in service.get("secrets", []):
            assert secret in secrets, f"{name} uses secret {secret}"


def test_the_compose_schema_accepts_the_file(tmp_path: Path) -> None:
    compose_cli = shutil.which("docker-compose")
    if compose_cli is None:
        pytest.skip("docker-compose is not installed (scripts/setup-infra-tools installs it)")
    secrets = tmp_path / "infra" / "secrets"
    # The file names secrets relative to itself: validate a copy with stand-ins.
    shutil.copytree(INFRA, tmp_path / "infra", ignore=shutil.ignore_patterns("secrets", "tls"))
    secrets.mkdir()
    for name in compose()["secrets"]:
        (secrets / name).write_text("x" * 40)
    done = subprocess.run(
        [compose_cli, "-f", str(tmp_path / "infra" / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def gateway_metric_names() -> set[str]:
    """Every sample name the gateway exports, from its families' declared types (a
    labelled family exports no sample until a label set is used)."""
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("_count", "_sum", ""),
    }
    names = set()
    for line in generate_latest(GatewayMetrics().registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            # An unlabelled counter's TYPE line already names its _total sample.
            family = family.removesuffix("_total") if kind == "counter" else family
            names |= {family + suffix for suffix in suffixes.get(kind, ("",))}
    return names


def test_every_alert_names_a_metric_the_gateway_exports() -> None:
    exported = gateway_metric_names()
    rules = yaml.safe_load(ALERTS.read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert len(alerts) >= 8
    for rule in alerts:
        named = set(re.findall(r"\b(rutster_[a-z_]+|up)\b", rule["expr"]))
        assert named, rule["alert"]
        unknown = named - exported - PROMETHEUS_OWN
        assert not unknown, f"{rule['alert']} names {unknown}"
    scrape = yaml.safe_load(PROMETHEUS.read_text())
    assert scrape["rule_files"] == [ALERTS.name]
    job = scrape["scrape_configs"][0]
    assert job["job_name"] == "rutster-gateway" and job["metrics_path"] == "/metrics"


def test_promtool_accepts_the_rules_and_the_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/setup-infra-tools installs it)")
    for args in (["check", "rules", str(ALERTS)], ["check", "config", str(PROMETHEUS)]):
        done = subprocess.run(
            [promtool, *args], capture_output=True, text=True, timeout=60, cwd=ALERTS.parent
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_dispatcher_list_passes_kamailio_check(tmp_path: Path) -> None:
    binary = kamailio_binary()
    done = subprocess.run(
        [
            str(binary),
            "-c",
            "-f",
            str(KAMAILIO_CONFIG),
            "-Y",
            str(tmp_path),
            "-A",
            f"LISTEN=udp:127.0.0.1:{free_udp_port()}",
            "-A",
            f'DISPATCHER_LIST="{DISPATCHER}"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr[-2000:]
