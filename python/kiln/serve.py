"""Serving a ``.kiln`` artifact on Ray Serve.

>>> from ray import serve
>>> from kiln.serve import deployment
>>> serve.run(deployment("model.kiln", num_replicas=2), route_prefix="/model")

A request is an HTTP POST whose body is an ``.npz`` archive with one array
per model input (``kiln.serve.encode``); the response is an ``.npz``
archive of the outputs. The artifact's bytes travel with the deployment,
so replicas on other nodes of a cluster need no shared file system
(``docs/serving.md``). Each replica holds one loaded model and one session
of ``threads`` threads.

Batching requests together waits on shape profiles (an artifact that
serves several batch sizes): with one fixed batch size, padding a batch
is only safe where the compiler proves that no op mixes rows.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any, Dict, Mapping, Optional

import numpy as np

import kiln

MEDIA_TYPE = "application/x-npz"


def encode(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Arrays as an uncompressed ``.npz`` archive (a request or response body)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decode(body: bytes) -> Dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive (no pickled objects accepted)."""
    with np.load(io.BytesIO(body), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


class KilnServer:
    """The replica: one model, one session; runs off the event loop so a
    replica keeps accepting requests while one executes."""

    def __init__(self, artifact: bytes, threads: int = 1):
        self.model = kiln.load_bytes(artifact)
        self.session = self.model.session(threads=threads)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import PlainTextResponse, Response

        try:
            inputs = decode(await request.body())
            outputs = await asyncio.to_thread(self.session.run, inputs)
        except kiln.InputError as e:
            return PlainTextResponse(f"error: {e}\n", status_code=400)
        except (ValueError, OSError) as e:  # not an .npz archive
            return PlainTextResponse(f"error: the body is not an .npz archive: {e}\n", status_code=400)
        return Response(encode(outputs), media_type=MEDIA_TYPE)


def deployment(
    artifact: str,
    *,
    name: str = "kiln",
    num_replicas: int = 2,
    threads: int = 1,
    max_ongoing_requests: int = 8,
    ray_actor_options: Optional[Dict[str, Any]] = None,
):
    """A bound Ray Serve application serving ``artifact`` (a path read now:
    the bytes travel with the deployment) with ``num_replicas`` replicas of
    ``threads`` threads each; pass it to ``serve.run``."""
    from ray import serve

    with open(artifact, "rb") as f:
        data = f.read()
    # Fail here, on the driver, rather than in every replica.
    kiln.load_bytes(data)
    options = {"num_cpus": threads} if ray_actor_options is None else ray_actor_options
    server = serve.deployment(
        KilnServer,
        name=name,
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options=options,
    )
    return server.bind(data, threads)
