"""moto's S3 server for the tests, as `moto_server` starts it but serving one request
at a time: moto checks a conditional put (If-Match, If-None-Match) and then writes, two
steps that its threaded server can interleave, where real S3 makes them one. Served one
at a time, each conditional put is atomic, as the file store's quota tests need.

Usage: s3-server.py PORT (listens on 127.0.0.1)."""

import os
import sys

from moto.moto_server.threaded_moto_server import MotoRequestHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

port = int(sys.argv[1])
os.environ.setdefault("MOTO_PORT", str(port))
run_simple(
    "127.0.0.1",
    port,
    DomainDispatcherApplication(create_backend_app),
    threaded=False,
    request_handler=MotoRequestHandler,
)
