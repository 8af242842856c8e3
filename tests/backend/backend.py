"""A stand-in for Grafana Pyroscope and an OpenTelemetry Collector, for the export tests.

No Pyroscope or Collector server can be installed here, so this server receives what they
would and decodes it with the real schemas: Pyroscope's push.v1 messages compiled at start
from profiler-daemon/proto/pyroscope (protoc from grpcio-tools; those .proto files are the
contract, written from Pyroscope's published field numbers), and OTLP profiles with the
generated classes of PyPI's opentelemetry-proto. Whatever it cannot decode, or decodes into
something the schema forbids (a dictionary without its zero entries), it answers with 400,
which the exporter counts as failed, so a test sees it.

Every accepted push is logged as JSON lines in OUT/received.jsonl; Pyroscope's raw profiles
are kept as OUT/profiles/N.pb.gz for `go tool pprof`. POST /admin/mode sets how the next
pushes are answered (ok, a status such as 503 or 429, slow, or a connection closed in the
middle of the request); GET /admin/stats counts the pushes seen.

Usage: backend.py --out DIR --proto DIR [--port N] [--cert FILE --key FILE]
"""

import argparse
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

PYROSCOPE_PATH = "/push.v1.PusherService/Push"
OTLP_PATH = "/v1development/profiles"


def push_request_class(proto_dir):
    """push.v1.PushRequest compiled from our .proto with grpcio-tools' protoc."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "push.desc")
        include = os.path.join(proto_dir, "pyroscope")
        from grpc_tools import protoc

        if protoc.main(["protoc", "-I", include, "--include_imports", "--descriptor_set_out", out, "push/v1/push.proto"]) != 0:
            sys.exit("protoc failed on " + include)
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("push.v1.PushRequest"))


class State:
    """What the server has seen and how it answers next."""

    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()
        self.mode = {"mode": "ok"}
        self.pushes = 0
        self.accepted = 0
        os.makedirs(os.path.join(out, "profiles"), exist_ok=True)
        # A restarted backend (the same OUT) goes on numbering where the last one stopped.
        self.profiles = len(os.listdir(os.path.join(out, "profiles")))
        self.log = open(os.path.join(out, "received.jsonl"), "a", buffering=1)

    def take_mode(self):
        """The mode for this push; a counted mode runs out."""
        with self.lock:
            self.pushes += 1
            mode = dict(self.mode)
            count = self.mode.get("count", -1)
            if count > 0:
                self.mode["count"] = count - 1
                if count == 1:
                    self.mode = {"mode": "ok"}
            return mode

    def record(self, records):
        with self.lock:
            self.accepted += 1
            for record in records:
                record["push"] = self.accepted
                self.log.write(json.dumps(record) + "\n")

    def save_profile(self, raw):
        with self.lock:
            self.profiles += 1
            name = os.path.join("profiles", "%06d.pb.gz" % self.profiles)
        with open(os.path.join(self.out, name), "wb") as f:
            f.write(raw)
        return name


def decode_pyroscope(state, body, headers, push_request):
    request = push_request.FromString(body)
    records = []
    for series in request.series:
        labels = {label.name: label.value for label in series.labels}
        if len(labels) != len(series.labels):
            raise ValueError("duplicate label names")
        if len(series.labels) > 30:
            raise ValueError("more than 30 labels")
        for sample in series.samples:
            records.append({
                "protocol": "pyroscope",
                "labels": labels,
                "id": sample.ID,
                "file": state.save_profile(sample.raw_profile),
                "headers": headers,
            })
    return records


def attributes(dictionary, indices):
    out = {}
    for index in indices:
        kv = dictionary.attribute_table[index]
        out[dictionary.string_table[kv.key_strindex]] = any_value(kv.value)
    return out


def any_value(value):
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def check_dictionary(d):
    """The schema's rules for a dictionary: every table starts with its zero value."""
    if not d.string_table or d.string_table[0] != "":
        raise ValueError("string_table[0] must be \"\"")
    for name in ["mapping_table", "location_table", "function_table", "link_table", "attribute_table", "stack_table"]:
        table = getattr(d, name)
        if len(table) == 0 or table[0].ByteSize() != 0:
            raise ValueError(name + "[0] must be the zero value")


def decode_otlp(body, headers):
    request = profiles_service_pb2.ExportProfilesServiceRequest.FromString(body)
    d = request.dictionary
    check_dictionary(d)
    string = lambda i: d.string_table[i]

    def frames(stack_index):
        names = []
        for location_index in d.stack_table[stack_index].location_indices:
            location = d.location_table[location_index]
            if not location.lines:
                names.append(hex(location.address))
            for line in location.lines:
                names.append(string(d.function_table[line.function_index].name_strindex))
        return names

    records = []
    for resource_profiles in request.resource_profiles:
        resource = {kv.key: any_value(kv.value) for kv in resource_profiles.resource.attributes}
        profiles = []
        for scope in resource_profiles.scope_profiles:
            for p in scope.profiles:
                profiles.append({
                    "scope": scope.scope.name,
                    "type": string(p.sample_type.type_strindex),
                    "unit": string(p.sample_type.unit_strindex),
                    "period_type": string(p.period_type.type_strindex),
                    "period": p.period,
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "samples": [
                        {"stack": frames(s.stack_index), "values": list(s.values), "attributes": attributes(d, s.attribute_indices)}
                        for s in p.samples
                    ],
                })
        records.append({"protocol": "otlp", "resource": resource, "profiles": profiles, "headers": headers})
    return records


def handler_class(state, push_request, prefix):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, body=b"", content_type="text/plain", extra=None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                # A client that gave up (it timed out on a slow answer) retries on its own.
                self.close_connection = True

        def do_GET(self):
            if self.path == "/admin/stats":
                with state.lock:
                    stats = {"pushes": state.pushes, "accepted": state.accepted, "profiles": state.profiles}
                self.answer(200, json.dumps(stats).encode(), "application/json")
            else:
                self.answer(404)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            if self.path == "/admin/mode":
                mode = json.loads(self.rfile.read(length))
                with state.lock:
                    state.mode = mode
                return self.answer(200)
            if self.path not in (prefix + PYROSCOPE_PATH, prefix + OTLP_PATH):
                self.rfile.read(length)
                return self.answer(404, b"no such path: " + self.path.encode())
            mode = state.take_mode()
            if mode["mode"] == "close":
                # Half the request read, then the connection dropped without an answer.
                self.rfile.read(length // 2)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            body = self.rfile.read(length)
            if mode["mode"] == "slow":
                time.sleep(mode.get("delay", 5))
            if mode["mode"] == "status":
                extra = {"Retry-After": str(mode["retry_after"])} if "retry_after" in mode else {}
                return self.answer(mode["status"], b'{"code":"unavailable","message":"test server says no"}', "application/json", extra)
            headers = {k.lower(): v for k, v in self.headers.items() if k.lower() != "content-length"}
            try:
                if self.path.endswith(PYROSCOPE_PATH):
                    if headers.get("content-type") != "application/proto":
                        raise ValueError("content-type must be application/proto")
                    records = decode_pyroscope(state, body, headers, push_request)
                    response, content_type = b"", "application/proto"
                else:
                    if headers.get("content-type") != "application/x-protobuf":
                        raise ValueError("content-type must be application/x-protobuf")
                    records = decode_otlp(body, headers)
                    response = profiles_service_pb2.ExportProfilesServiceResponse().SerializeToString()
                    content_type = "application/x-protobuf"
            except Exception as err:  # anything undecodable is the exporter's bug: 400
                return self.answer(400, ("cannot decode: %r" % err).encode())
            state.record(records)
            self.answer(200, response, content_type)

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--proto", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--prefix", default="")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    state = State(args.out)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler_class(state, push_request_class(args.proto), args.prefix))
    server.daemon_threads = True
    if args.cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    with open(os.path.join(args.out, "port.tmp"), "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(os.path.join(args.out, "port.tmp"), os.path.join(args.out, "port"))
    server.serve_forever()


if __name__ == "__main__":
    main()
