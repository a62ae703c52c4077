"""The REST API and its OpenAPI document agree: a bounded schemathesis run against a live gateway.

A real gateway (uvicorn on a free loopback port, the suite's embedded Redis
under a prefix of its own, the FAKE Twilio REST placing calls) serves
``/v1/openapi.json``; schemathesis loads the document from there and runs every
built-in check on every operation, with positive and negative data, once each
with a tenant key, an admin-role key issued through the API and the operator's
admin key (no tenant of its own): no 5xx, only documented statuses,
bodies and headers as documented, invalid input refused, schema-valid input
accepted, 405 with ``Allow`` for undocumented methods, ``Allow`` on OPTIONS
matching the document, auth enforced.

The gateway runs on its own event loop in a thread, because schemathesis calls
it synchronously (``requests``). Each run gets a fresh gateway: the admin run
may engage the kill switch or change limits, which must not leak into the
tenant run. Generation is seeded and derandomized, and no Hypothesis example
database is written.

Schema-valid data this gateway may still refuse, by design and as documented,
on ``createCall`` only: ``402`` (the spend gate: kill switch, budgets) and
``422`` for what the schema cannot express (a brain name it has not configured,
a brain URL off its allowlist, metadata over 2 KiB serialized), the latter
checked to be exactly that (:func:`semantic_refusals_only`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from schemathesis import Case as GenericCase
from schemathesis import CheckContext, Response
from schemathesis.schemas import BaseSchema

from rutster.brains.echo import EchoBrain
from tests.conftest import TEST_ADMIN_KEY, TEST_AUTH_TOKEN, gateway_config, serve_gateway
from tests.conftest import spend_settings as suite_spend_settings
from tests.support.fake_plivo_rest import FAKE_AUTH_ID, FAKE_AUTH_TOKEN, serve_fake_plivo
from tests.support.fake_telnyx_rest import FAKE_API_KEY, serve_fake_telnyx
from tests.support.fake_twilio_rest import CalleeBehaviour, CalleeOutcome, FakeTwilioRest
from tests.support.fake_vonage_rest import serve_fake_vonage

#: A case of any OpenAPI operation (schemathesis' Case is generic in its operation).
Case = GenericCase[Any]

ACCOUNT_SID = "AC" + "c0" * 16
VONAGE_APPLICATION_ID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
#: The tenant whose key the tenant run uses (long, so generated tenant ids rarely hit it).
TENANT = "contract-tenant-7f3a"
#: Generated cases per operation and phase (schemathesis' ``max-examples``; its default
#: is 100). Chosen so the whole file runs in well under 2 minutes on 2 cores.
MAX_EXAMPLES = 20
#: Fixed seed, with derandomized generation: a run (and a failure) is reproducible.
SEED = 20261201
#: Per-key API rate limit of the gateway under test: far above what one run sends,
#: so the run tests the contract, not the limiter (tests/test_api_rate_limit.py does).
RATE_PER_S = 100_000.0
BURST = 100_000
#: A generous deadline for the gateway thread to start or stop (loopback, in-process).
THREAD_TIMEOUT_S = 30.0
#: Schemathesis reads this many events of the endless dashboard stream, then cuts it.
STREAM_EVENTS = 1
#: Statuses a schema-valid call request may get: schemathesis' defaults for
#: positive_data_acceptance, plus 402 (the spend gate refused it) and 422 (see above).
CREATE_CALL_POSITIVE_STATUSES = [
    "2xx",
    "3xx",
    "401",
    "402",
    "403",
    "404",
    "409",
    "422",
    "429",
    "5xx",
]

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
        "operations": [
            {
                "include-operation-id": "createCall",
                "checks": {
                    "positive_data_acceptance": {"expected-statuses": CREATE_CALL_POSITIVE_STATUSES}
                },
            },
            {"include-operation-id": "dashboardEvents", "max-stream-events": STREAM_EVENTS},
        ],
    }
)


@dataclass
class LiveGateway:
    """A gateway serving in a background thread, the keys of the runs, and what it answered."""

    url: str
    #: A tenant's key (tenant :data:`TENANT`).
    tenant_key: str
    #: An admin-role key issued through the API: it belongs to a tenant of its own ("ops").
    admin_key: str
    #: The operator's admin key (``RUTSTER_ADMIN_KEY``): an admin with no tenant.
    operator_key: str = TEST_ADMIN_KEY
    #: (operationId, status) -> how many validated answers.
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)

    def record(self, case: Case, status: int) -> None:
        """Count one validated answer."""
        self.answers[(case.operation.definition.raw["operationId"], status)] += 1


def _vonage_key(folder: Path) -> tuple[str, str]:
    """A Vonage application key pair: writes the private key, returns the public PEM and
    the application id the fake trusts."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "app.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return public.decode(), VONAGE_APPLICATION_ID


async def _serve(url: Future[str], stop: asyncio.Event) -> None:
    with tempfile.TemporaryDirectory(prefix="rutster-vonage-") as folder:
        key_dir = Path(folder)
        async with (
            EchoBrain() as brain,
            FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=TEST_AUTH_TOKEN) as fake,
            serve_fake_telnyx() as telnyx,
            serve_fake_plivo() as plivo,
            serve_fake_vonage(*_vonage_key(key_dir)) as vonage,
        ):
            # Every generated number is busy at once: calls end unanswered and settle at 0.
            fake.default_callee = CalleeBehaviour(CalleeOutcome.BUSY, ring_s=0.0)
            # Every outbound provider is set up (the others' calls ring unanswered until the
            # gateway stops): a generated provider is never "not configured" for lack of it.
            config = gateway_config(
                brain.url,
                barge_in=False,
                spend=suite_spend_settings(api_rate_per_s=RATE_PER_S, api_burst=BURST),
                twilio_account_sid=ACCOUNT_SID,
                twilio_api_base_url=fake.base_url,
                env={
                    "TELNYX_API_KEY": FAKE_API_KEY,
                    "TELNYX_API_BASE_URL": telnyx.base_url,
                    "TELNYX_CONNECTION_ID": "1234567890",
                    "PLIVO_AUTH_ID": FAKE_AUTH_ID,
                    "PLIVO_AUTH_TOKEN": FAKE_AUTH_TOKEN,
                    "PLIVO_API_BASE_URL": plivo.base_url,
                    "VONAGE_APPLICATION_ID": VONAGE_APPLICATION_ID,
                    "VONAGE_PRIVATE_KEY_FILE": str(key_dir / "app.key"),
                    "VONAGE_API_BASE_URL": vonage.base_url,
                },
            )
            async with serve_gateway(config) as gateway:
                url.set_result(gateway.url)
                await stop.wait()


@contextlib.contextmanager
def background_gateway() -> Iterator[str]:
    """Run a gateway on its own event loop in a thread; yield its base URL."""
    url: Future[str] = Future()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        try:
            loop.run_until_complete(_serve(url, stop))
        except BaseException as exc:  # surfaced to the waiting test, not lost in the thread
            if not url.done():
                url.set_exception(exc)
            raise
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="contract-gateway", daemon=True)
    thread.start()
    try:
        yield url.result(timeout=THREAD_TIMEOUT_S)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(THREAD_TIMEOUT_S)
        assert not thread.is_alive(), "the gateway thread did not stop"


def _issue_key(client: httpx.Client, tenant: str, role: str) -> str:
    answer = client.post(
        "/v1/admin/keys",
        headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"},
        json={"tenant": tenant, "role": role, "label": f"contract {role}"},
    )
    assert answer.status_code == 201, answer.text
    key: str = answer.json()["key"]
    return key


#: Answers each run must have seen (beyond failing on none): proof that it reached the
#: operations' real work, not only their refusals.
REQUIRED_ANSWERS: dict[str, set[tuple[str, int]]] = {
    "test_the_api_keeps_its_contract_with_a_tenant_key": {
        ("createCall", 201),
        ("listCalls", 200),
        ("getSpend", 200),
        ("getCall", 404),
        ("setKillSwitch", 403),
        ("dashboardEvents", 200),
    },
    "test_the_api_keeps_its_contract_with_an_admin_key": {
        ("createApiKey", 201),
        ("setTenantLimits", 200),
        ("getTenantLimits", 200),
        ("setKillSwitch", 200),
        ("listCalls", 200),
    },
    "test_the_api_keeps_its_contract_with_the_operator_key": {
        ("createCall", 403),
        ("listCalls", 200),
        ("listCalls", 403),
        ("getSpend", 403),
        ("getTenantLimits", 200),
    },
}


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Iterator[LiveGateway]:
    """A fresh gateway with a tenant key and an admin-role key issued through the API.

    After the run: every documented operation was exercised, and the run saw the
    answers :data:`REQUIRED_ANSWERS` lists for it.
    """
    with background_gateway() as url, httpx.Client(base_url=url) as client:
        gateway = LiveGateway(
            url,
            tenant_key=_issue_key(client, TENANT, "tenant"),
            admin_key=_issue_key(client, "ops", "admin"),
        )
        failed_before = request.session.testsfailed
        yield gateway
        document = client.get("/v1/openapi.json").json()
    if request.node.name not in REQUIRED_ANSWERS or request.session.testsfailed > failed_before:
        return  # a failed run has said what is wrong; its coverage says nothing more
    documented = {
        operation["operationId"]
        for item in document["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    # Schemathesis does not fuzz the operation that served it the document.
    assert {op for op, _ in gateway.answers} == documented - {"getOpenApi"}
    missing = REQUIRED_ANSWERS[request.node.name] - set(gateway.answers)
    assert not missing, f"the run never got {sorted(missing)}: {sorted(gateway.answers)}"


@pytest.fixture
def api_schema(live: LiveGateway) -> BaseSchema:
    """The document as the live gateway serves it."""
    return schemathesis.openapi.from_url(f"{live.url}/v1/openapi.json", config=CONFIG)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32's from_fixture reads and rewrites ``Function._nodeid``, which
    # pytest 9.2 no longer has (it keeps ``_id``); give it the attribute it expects.
    # Only its subtest labels use it.
    request.node._nodeid = request.node.nodeid


#: The only 422s a schema-valid ``createCall`` may get: (field, message pattern) of what
#: the schema cannot express. A 422 from the schema's own rules (a pattern the server
#: reads differently, say) fails the run.
SEMANTIC_CREATE_CALL_422 = (
    ("brain", re.compile(r"allowlist|no brain named")),
    ("metadata", re.compile(r"bytes as compact UTF-8 JSON")),
)


def semantic_refusals_only(_ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """A schema-valid ``createCall`` is refused 422 only for what its schema cannot say."""
    operation_id = case.operation.definition.raw.get("operationId")
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    if operation_id != "createCall" or not positive or response.status_code != 422:
        return None
    error = response.json()["error"]
    assert any(
        error["field"] == name and pattern.search(error["message"])
        for name, pattern in SEMANTIC_CREATE_CALL_422
    ), f"schema-valid call refused by a schema rule: {error}"
    return True


def _call(case: Case, live: LiveGateway, key: str) -> None:
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {key}"}, additional_checks=[semantic_refusals_only]
    )
    live.record(case, response.status_code)


@schema.parametrize()
def test_the_api_keeps_its_contract_with_a_tenant_key(case: Case, live: LiveGateway) -> None:
    _call(case, live, live.tenant_key)


@schema.parametrize()
def test_the_api_keeps_its_contract_with_an_admin_key(case: Case, live: LiveGateway) -> None:
    _call(case, live, live.admin_key)


@schema.parametrize()
def test_the_api_keeps_its_contract_with_the_operator_key(case: Case, live: LiveGateway) -> None:
    _call(case, live, live.operator_key)
