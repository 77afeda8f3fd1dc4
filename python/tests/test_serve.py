"""Serving on Ray Serve: a local Ray instance, two replicas of a Kiln
artifact and, beside it, two replicas of the same model on onnxruntime;
1,000 requests to each from concurrent HTTP clients over loopback, every
response checked against onnxruntime, latency percentiles and throughput
printed. Bounded: every request has a timeout, the whole exchange a
deadline, and Ray is shut down whatever happens."""

import asyncio
import os
import socket
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kiln
from conftest import FIXTURES, FP32_TOLERANCE, rel_error

if os.environ.get("KILN_REQUIRE_SERVE") == "1":
    import ray  # CI installs it: a missing Ray fails here
else:
    ray = pytest.importorskip("ray")
ort = pytest.importorskip("onnxruntime")

from ray import serve  # noqa: E402

from kiln.serve import decode, deployment, encode  # noqa: E402

MODEL = FIXTURES / "zoo_resnet18" / "model.onnx"
REQUESTS = 1000
CLIENTS = 8
REQUEST_TIMEOUT_S = 30
DEADLINE_S = 300


class OrtServer:
    """The onnxruntime replica: the same protocol as kiln.serve.KilnServer."""

    def __init__(self, model: bytes, threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]

    async def __call__(self, request):
        from starlette.responses import Response

        inputs = decode(await request.body())
        outputs = await asyncio.to_thread(self.session.run, None, inputs)
        return Response(encode(dict(zip(self.names, outputs))), media_type="application/x-npz")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile_row(name, latencies, seconds):
    p50, p95, p99 = np.percentile(np.array(latencies) * 1e3, [50, 95, 99])
    return f"{name:<12} {p50:>8.2f} {p95:>8.2f} {p99:>8.2f} {len(latencies) / seconds:>10.1f}"


def hammer(url, bodies, references, deadline):
    """REQUESTS posts from CLIENTS threads; returns (latencies, seconds,
    failures)."""

    def one(i):
        if time.monotonic() > deadline:
            return None, f"request {i}: deadline passed"
        k = i % len(bodies)
        start = time.perf_counter()
        request = urllib.request.Request(url, data=bodies[k], method="POST")
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            outputs = decode(response.read())
        latency = time.perf_counter() - start
        for name, reference in references[k].items():
            err = rel_error(outputs[name], reference)
            if not err <= FP32_TOLERANCE:
                return latency, f"request {i}: output {name}: rel error {err:.3e}"
        return latency, None

    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(one, range(REQUESTS)))
    seconds = time.perf_counter() - start
    latencies = [lat for lat, _ in results if lat is not None]
    failures = [f for _, f in results if f is not None]
    return latencies, seconds, failures


def test_two_replicas_serve_a_thousand_requests_like_onnxruntime(tmp_path, capsys):
    artifact = tmp_path / "resnet18.kiln"
    kiln.compile(MODEL, artifact, dims={"batch": 1}, threads=1)
    model_bytes = MODEL.read_bytes()
    reference = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    (x,) = reference.get_inputs()
    names = [o.name for o in reference.get_outputs()]
    rng = np.random.default_rng(3)
    inputs = [{x.name: rng.standard_normal((1, 3, 56, 56)).astype(np.float32)} for _ in range(16)]
    bodies = [encode(i) for i in inputs]
    references = [dict(zip(names, reference.run(None, i))) for i in inputs]

    port = free_port()
    # Replicas cannot import this test module: OrtServer travels by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # Replicas take no CPU reservation: four replicas share two cores.
        serve.run(
            deployment(str(artifact), num_replicas=2, threads=1, ray_actor_options={"num_cpus": 0}),
            name="kiln",
            route_prefix="/kiln",
        )
        ort_server = serve.deployment(
            OrtServer, name="ort", num_replicas=2, max_ongoing_requests=8, ray_actor_options={"num_cpus": 0}
        )
        serve.run(ort_server.bind(model_bytes, 1), name="ort", route_prefix="/ort")
        deadline = time.monotonic() + DEADLINE_S
        rows = []
        for name in ["kiln", "ort"]:
            url = f"http://127.0.0.1:{port}/{name}"
            hammer(url, bodies[:4], references[:4], deadline)  # warm-up (not counted)
            latencies, seconds, failures = hammer(url, bodies, references, deadline)
            assert failures == [], failures[:5]
            assert len(latencies) == REQUESTS
            rows.append(percentile_row(name, latencies, seconds))
        with capsys.disabled():
            print(
                f"\nRay Serve, 2 replicas x 1 thread each, {REQUESTS} requests from {CLIENTS} "
                f"clients, zoo_resnet18 1x3x56x56 over HTTP loopback"
            )
            print(f"{'replicas':<12} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s':>10}")
            for row in rows:
                print(row)
    finally:
        serve.shutdown()
        ray.shutdown()
