#!/usr/bin/env python3
"""Follow hdsd's readiness from a program: list, then watch and reconcile.

Generate the client code from hdsd's proto/ first (grpcio-tools):

    python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
        proto/hdsd/v1/readiness.proto
    PYTHONPATH=gen python examples/python/follow_readiness.py --target 127.0.0.1:5680

Prints one JSON object per line: the list, then every watch event; for a
CHANGED event also the dataplane's inbound statuses, read with GetDataplane
(events say *which* dataplane changed, not what: read the details you need).
Run it again with --since REVISION (the last revision printed) to continue
where it stopped: nothing twice, nothing missed.
"""
import argparse
import json
import sys

import grpc
from hdsd.v1 import readiness_pb2 as pb
from hdsd.v1 import readiness_pb2_grpc as rpc


def emit(obj):
    print(json.dumps(obj), flush=True)


def follow(target, token=None, since=None, mesh=""):
    channel = grpc.insecure_channel(target)
    stub = rpc.ReadinessServiceStub(channel)
    metadata = [("authorization", f"Bearer {token}")] if token else []

    # List: the current state, and the revision it was taken at.
    listed = stub.ListDataplanes(pb.ListDataplanesRequest(mesh=mesh), metadata=metadata)
    emit({"list": [{"mesh": d.mesh, "name": d.name, "ready": d.ready,
                    "revision": d.revision} for d in listed.items],
          "revision": listed.revision})

    # Watch: a SNAPSHOT then SYNCED (or, with since, what changed after it),
    # then one event per change.
    request = pb.WatchRequest(mesh=mesh)
    if since is not None:
        request.since_revision = since
    for event in stub.Watch(request, metadata=metadata):
        kind = pb.WatchEvent.Type.Name(event.type)
        out = {"type": kind, "revision": event.revision}
        if kind == "SNAPSHOT":
            out["dataplanes"] = [{"mesh": d.mesh, "name": d.name, "ready": d.ready,
                                  "revision": d.revision} for d in event.snapshot]
        elif kind in ("CHANGED", "DELETED"):
            dp = event.dataplane
            out.update(mesh=dp.mesh, name=dp.name, ready=dp.ready)
            if kind == "CHANGED":
                # Reconcile: read what changed.
                item = stub.GetDataplane(
                    pb.GetDataplaneRequest(mesh=dp.mesh, name=dp.name), metadata=metadata)
                out["inbounds"] = {str(i.port): pb.Status.Name(i.health.status)
                                   for i in item.inbounds}
        elif kind == "RESYNC":
            out["reason"] = pb.WatchEvent.ResyncReason.Name(event.resync_reason)
        emit(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:5680", help="hdsd's api.listen")
    parser.add_argument("--token", help="one of hdsd's api.tokens")
    parser.add_argument("--since", type=int, help="resume after this revision")
    parser.add_argument("--mesh", default="")
    args = parser.parse_args()
    try:
        follow(args.target, args.token, args.since, args.mesh)
    except grpc.RpcError as e:
        emit({"error": e.code().name, "message": e.details()})
        sys.exit(1)


if __name__ == "__main__":
    main()
