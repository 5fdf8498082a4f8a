"""An OTLP profiles receiver for allocscope's agent tests.

Decodes what the agent exports with the OpenTelemetry project's own generated classes
(PyPI's opentelemetry-proto, pinned by `cargo xtask setup`), over gRPC
(ProfilesService/Export, served with grpcio) and over HTTP (POST /v1development/profiles,
application/x-protobuf), checks the rules receivers apply (Parca's normalizer: every
dictionary table non-empty with its zero entry empty; every index in range), and writes
one JSON line per request to --out: the transport, the request's headers that matter, the
rule violations found, and per resource its attributes and per profile its sample type,
total, per-leaf-function totals and whether each sample's bounds hold its value.

Usage: otlp_receiver.py --out FILE   (prints "ports GRPC HTTP" once listening)
"""

import argparse
import http.server
import json
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as service,
    profiles_service_pb2_grpc as service_grpc,
)

LOCK = threading.Lock()


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def check(request):
    """Rule violations and a summary of `request`."""
    errors = []
    d = request.dictionary
    tables = {
        "string_table": d.string_table,
        "mapping_table": d.mapping_table,
        "location_table": d.location_table,
        "function_table": d.function_table,
        "link_table": d.link_table,
        "attribute_table": d.attribute_table,
        "stack_table": d.stack_table,
    }
    for name, table in tables.items():
        if len(table) == 0:
            errors.append(f"{name} is empty")
        elif name == "string_table":
            if table[0] != "":
                errors.append("string_table[0] is not empty")
        elif table[0].ByteSize() != 0:
            errors.append(f"{name}[0] is not the empty entry")

    def in_range(what, index, table):
        if not 0 <= index < len(table):
            errors.append(f"{what} {index} out of range ({len(table)})")
            return False
        return True

    s = lambda i: d.string_table[i] if 0 <= i < len(d.string_table) else None
    for f in d.function_table:
        for i in (f.name_strindex, f.system_name_strindex, f.filename_strindex):
            in_range("function string", i, d.string_table)
    for loc in d.location_table:
        in_range("location mapping", loc.mapping_index, d.mapping_table)
        for line in loc.lines:
            in_range("line function", line.function_index, d.function_table)
    for stack in d.stack_table:
        for i in stack.location_indices:
            in_range("stack location", i, d.location_table)
    resources = []
    for rp in request.resource_profiles:
        attrs = {kv.key: value_of(kv.value) for kv in rp.resource.attributes}
        profiles = []
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                kind = s(p.sample_type.type_strindex)
                unit = s(p.sample_type.unit_strindex)
                total, leaves, bounds_ok = 0, {}, True
                for sample in p.samples:
                    if not in_range("sample stack", sample.stack_index, d.stack_table):
                        continue
                    value = sum(sample.values)
                    total += value
                    stack = d.stack_table[sample.stack_index].location_indices
                    leaf = "?"
                    if stack and in_range("leaf", stack[0], d.location_table):
                        lines = d.location_table[stack[0]].lines
                        if lines:
                            leaf = s(d.function_table[lines[0].function_index].name_strindex)
                    leaves[leaf] = leaves.get(leaf, 0) + value
                    bounds = {}
                    for a in sample.attribute_indices:
                        if in_range("sample attribute", a, d.attribute_table):
                            kv = d.attribute_table[a]
                            bounds[s(kv.key_strindex)] = value_of(kv.value)
                    lower = bounds.get(f"allocscope.{kind}.lower")
                    upper = bounds.get(f"allocscope.{kind}.upper")
                    if kind.endswith("space") and (lower is None or upper is None
                                                   or not lower <= value <= upper):
                        bounds_ok = False
                profiles.append({
                    "type": kind, "unit": unit, "samples": len(p.samples), "total": total,
                    "leaves": leaves, "bounds_ok": bounds_ok,
                    "period_type": s(p.period_type.type_strindex), "period": p.period,
                    "time_unix_nano": p.time_unix_nano, "duration_nano": p.duration_nano,
                    "profile_id_len": len(p.profile_id),
                })
        scope = rp.scope_profiles[0].scope.name if rp.scope_profiles else None
        resources.append({"attributes": attrs, "scope": scope, "profiles": profiles})
    return errors, resources


def record(transport, headers, body):
    request = service.ExportProfilesServiceRequest()
    request.ParseFromString(body)
    errors, resources = check(request)
    line = json.dumps({"transport": transport, "headers": headers, "errors": errors,
                       "resources": resources})
    with LOCK:
        with open(ARGS.out, "a") as out:
            out.write(line + "\n")


class Profiles(service_grpc.ProfilesServiceServicer):
    def Export(self, request, context):
        headers = {k: v for k, v in context.invocation_metadata()
                   if k in ("authorization", "x-scope-orgid")}
        record("grpc", headers, request.SerializeToString())
        return service.ExportProfilesServiceResponse()


class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1development/profiles" or \
                self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        headers = {k.lower(): v for k, v in self.headers.items()
                   if k.lower() in ("authorization", "x-scope-orgid")}
        record("http", headers, body)
        reply = service.ExportProfilesServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_grpc.add_ProfilesServiceServicer_to_server(Profiles(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Http)
    print(f"ports {grpc_port} {web.server_address[1]}", flush=True)
    web.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    ARGS = parser.parse_args()
    sys.exit(main())
