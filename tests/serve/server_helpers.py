"""A uvicorn server in a background thread, for the serving tests."""

from __future__ import annotations

import threading
import time

from transduce.errors import require


class BackgroundServer:
    """A uvicorn server in a thread, for tests and benchmarks (``port=0`` picks a free port).

    Examples:
        >>> with BackgroundServer(app) as server:      # doctest: +SKIP
        ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        uvicorn = require("uvicorn", "serve", "serving tests")
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="transduce-uvicorn", daemon=True)
        self.url = ""

    def start(self, timeout: float = 20.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
