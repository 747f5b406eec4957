"""Fake Vast.ai API: bundles search, asks (launch), dict-shaped status, paginated v1 list, volumes."""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

from .base import FakeCloud, Request, Response

VAST_GPUS: list[tuple[str, int, float]] = [  # name, gpu_ram MB, $/h per GPU
    ("RTX 3090", 24576, 0.18),
    ("RTX 4090", 24564, 0.35),
    ("RTX A6000", 49140, 0.45),
    ("RTX 6000Ada", 49140, 0.75),
    ("L40S", 46068, 0.80),
    ("A100 PCIE", 40960, 0.70),
    ("A100 SXM4", 81920, 1.10),
    ("H100 SXM", 81559, 2.10),
    ("H200", 143771, 3.00),
    ("RTX 3060", 12288, 0.06),  # unknown to tunebot: dropped
    ("Tesla T4", 15360, 0.10),  # unknown to tunebot: dropped
]
CITIES = ["Oslo, NO", "Texas, US", "Quebec, CA", "Bavaria, DE", None]

_OPS = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "lt": lambda a, b: a is not None and a < b,
    "lte": lambda a, b: a is not None and a <= b,
    "gt": lambda a, b: a is not None and a > b,
    "gte": lambda a, b: a is not None and a >= b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}


class FakeVast(FakeCloud):
    """With ``hosts`` (tests/fakes/remote_host.py) every created instance really runs its image's entry point
    in a fresh sandbox with only the create call's image, args and env; ``preempt`` then SIGTERMs it (the
    outbid container gets its grace period) and a destroy kills it. Without, instances are records only."""

    provider = "vast"
    # Benches set this: identical searches answer pre-encoded bytes, so only the client is measured.
    cache_search = False

    def __init__(self, *, hosts: Any = None, **kwargs: Any) -> None:
        self.billed: dict[str, tuple[float, float]] = {}  # destroyed instance id -> (seconds, $/h)
        self.hosts = hosts
        super().__init__(**kwargs)

    def authorized(self, req: Request) -> bool:
        return req.bearer == self.api_key or req.query.get("api_key") == self.api_key

    def unauthorized(self, req: Request) -> Response:
        return Response(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})

    def generate_offers(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        offers = []
        for k in range(n):
            name, ram, per_gpu = rng.choice(VAST_GPUS)
            count = rng.choice([1, 1, 1, 2, 4, 8])
            base = round(per_gpu * count * rng.uniform(0.8, 1.4), 4)
            storage_cost = round(rng.uniform(0.05, 0.3), 3)
            offers.append(
                {
                    "id": 5_000_000 + k,
                    "machine_id": 10_000 + k,
                    "host_id": 300 + k % 50,
                    "gpu_name": name,
                    "num_gpus": count,
                    "gpu_ram": ram,
                    "gpu_total_ram": ram * count,
                    "dph_base": base,
                    "dph_total": round(base + storage_cost * 100 / 730, 4),
                    "min_bid": round(base * rng.uniform(0.3, 0.6), 4),
                    "storage_cost": storage_cost,
                    "inet_up_cost": round(rng.uniform(0.0, 0.02), 4),
                    "inet_down_cost": round(rng.uniform(0.0, 0.01), 4),
                    "reliability2": None if k % 17 == 0 else round(rng.uniform(0.9, 0.999), 4),
                    "geolocation": rng.choice(CITIES),
                    "inet_down": None if k % 13 == 0 else round(rng.uniform(50, 2000), 1),
                    "inet_up": round(rng.uniform(50, 1000), 1),
                    "disk_space": rng.choice([100, 150, 200, 500, 1000]),
                    "cpu_cores_effective": 8.0 * count,
                    "cpu_ram": 32768 * count,
                    "cuda_max_good": 12.4,
                    "verified": k % 11 != 0,
                    "rentable": True,
                    "rented": False,
                }
            )
        return offers

    def op_of(self, req: Request) -> str:
        p, m = req.path, req.method
        if p.startswith("/api/v0/bundles") or p.startswith("/api/v0/search/asks"):
            return "search"
        if p.startswith("/api/v0/asks/") and m == "PUT":
            return "create"
        if p.startswith("/api/v1/instances"):
            return "list"
        if p.startswith("/api/v0/instances/"):
            return "delete" if m == "DELETE" else "status"
        if p.startswith("/api/v0/volumes"):
            return "volumes"
        if p.startswith("/api/v0/users"):
            return "billing"
        return "other"

    # -- routes ------------------------------------------------------------------------------------
    def route(self, req: Request, op: str) -> Response:
        p = req.path
        if op == "search":
            if not self.cache_search:
                return self._search(req.body or {})
            key = json.dumps(req.body, sort_keys=True)
            cache = self.__dict__.setdefault("_search_cache", {})
            if key not in cache:
                found = self._search(req.body or {})
                cache[key] = Response(
                    found.status, json.dumps(found.body).encode(), {"Content-Type": "application/json"}
                )
            return cache[key]
        if op == "create":
            return self._create(p.rstrip("/").rsplit("/", 1)[-1], req.body or {})
        if op == "list":
            items = sorted(self.instances.values(), key=lambda i: i["id"])
            page, token = self.paginate(items, req.query.get("after_token"), int(req.query.get("limit", 25)))
            return Response(
                200,
                {
                    "instances": [self._public(i) for i in page],
                    "next_token": token,
                    "total_instances": len(items),
                },
            )
        m = re.match(r"^/api/v0/instances/(\d+)/?$", p)
        if m and req.method == "GET":
            inst = self.instances.get(m.group(1))
            if inst is None:
                return Response(200, {"instances": None})
            self._advance(inst)
            return Response(200, {"instances": self._public(inst)})
        if m and req.method == "DELETE":
            if self.hosts is not None:
                self.hosts.destroy(m.group(1))
            gone = self.instances.pop(m.group(1), None)
            if gone is None:
                return Response(
                    404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}
                )
            # what Vast bills: start_date to destroy, at the instance's dph_total
            self.billed[m.group(1)] = (time.time() - gone["start_date"], gone["dph_total"])
            return Response(200, {"success": True})
        if m and req.method == "PUT":
            inst = self.instances.get(m.group(1))
            if inst is None:
                return Response(
                    404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}
                )
            state = (req.body or {}).get("state")
            inst["intended_status"] = inst["cur_state"] = inst["next_state"] = state
            inst["actual_status"] = "stopped" if state == "stopped" else "loading"
            return Response(200, {"success": True})
        if op == "volumes":
            return self._volumes(req)
        if op == "billing":
            return Response(200, {"balance": 42.5, "credit": 10.0})
        return Response(404, {"success": False, "error": "not_found", "msg": f"no route {req.method} {p}"})

    def _search(self, q: dict[str, Any]) -> Response:
        offers = self.offers
        for fieldname, cond in q.items():
            if fieldname in ("order", "type", "limit", "allocated_storage") or not isinstance(cond, dict):
                continue
            for op, value in cond.items():
                fn = _OPS.get(op)
                if fn is None:
                    return Response(400, {"success": False, "error": "invalid_args", "msg": f"bad op {op}"})
                offers = [o for o in offers if fieldname not in o or fn(o.get(fieldname), value)]
        for key, direction in reversed(q.get("order") or []):
            offers = sorted(
                offers, key=lambda o, k=key: (o.get(k) is None, o.get(k) or 0), reverse=direction == "desc"
            )
        return Response(200, {"offers": offers[: int(q.get("limit") or 64)]})

    def _create(self, ask_id: str, body: dict[str, Any]) -> Response:
        ask = next((o for o in self.offers if str(o["id"]) == ask_id), None)
        if ask is None:
            return Response(404, {"success": False, "error": "no_such_ask", "msg": f"ask {ask_id} not found"})
        if not body.get("image"):
            return Response(400, {"success": False, "error": "invalid_args", "msg": "image required"})
        if float(body.get("disk") or 0) > float(ask.get("disk_space") or 0):  # more than the host has
            msg = f"disk {body.get('disk')} GB exceeds the host's {ask.get('disk_space')} GB"
            return Response(400, {"success": False, "error": "invalid_args", "msg": msg})
        iid = self.new_id()
        bid = body.get("price")
        too_low = bid is not None and bid < ask["min_bid"]
        inst = {
            "id": int(iid),
            "label": body.get("label"),
            "image_uuid": body["image"],
            "env": body.get("env"),
            "actual_status": None,
            "intended_status": "stopped" if too_low else "running",
            "cur_state": "stopped" if too_low else "running",
            "next_state": "stopped" if too_low else "running",
            "status_msg": None,
            "dph_total": bid if bid is not None else ask["dph_total"],
            "is_bid": bid is not None,
            "gpu_name": ask["gpu_name"],
            "num_gpus": ask["num_gpus"],
            "public_ipaddr": None,
            "ssh_host": None,
            "ssh_port": None,
            "start_date": time.time(),
            "disk_space": body.get("disk"),
            "_polls": 0,
        }
        self.instances[iid] = inst
        self.track_created(inst["label"])
        if self.hosts is not None and not too_low:
            # The env object also carries docker port flags as keys ("-p 8000:8000"): not variables.
            env = {k: v for k, v in (body.get("env") or {}).items() if not k.startswith("-")}
            self.hosts.start(iid, image=body["image"], args=body.get("args"), env=env)
        if too_low:  # refused, but the contract exists (stopped): the client must destroy it
            return Response(
                200,
                {
                    "success": False,
                    "error": "invalid_price",
                    "msg": "bid below minimum",
                    "new_contract": int(iid),
                },
            )
        return Response(200, {"success": True, "new_contract": int(iid)})

    def capacity_response(self, req: Request) -> Response:
        return Response(
            410, {"success": False, "error": "no_such_ask", "msg": "This offer is no longer available"}
        )

    def _advance(self, inst: dict[str, Any]) -> None:
        if inst["intended_status"] != "running":
            return
        host = self.hosts.hosts.get(str(inst["id"])) if self.hosts is not None else None
        if host is not None and (host.problem or (host.proc is not None and not host.running)):
            inst["actual_status"] = "exited"  # the container's process ended (or never started)
            inst["status_msg"] = host.problem or f"exited with code {host.exit_code}"
            return
        inst["_polls"] += 1
        if inst["actual_status"] is None and inst["_polls"] >= 1:
            inst["actual_status"] = "loading"
        if inst["actual_status"] == "loading" and inst["_polls"] > self.boot_polls:
            inst["actual_status"] = "running"
            inst["public_ipaddr"] = f"10.0.0.{inst['id'] % 250}"

    def _public(self, inst: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def _volumes(self, req: Request) -> Response:
        if req.method == "GET":
            return Response(200, {"volumes": list(self.volumes.values())})
        if req.method == "PUT":
            body = req.body or {}
            vid = self.new_id()
            self.volumes[vid] = {
                "id": int(vid),
                "name": body.get("name"),
                "size": body.get("size"),
                "storage_cost": 0.15,
                "instances": [],
                "idle_since": time.time(),
            }
            return Response(200, {"success": True, "volume_id": int(vid)})
        if req.method == "DELETE":
            if self.volumes.pop(str(req.query.get("id")), None) is None:
                return Response(404, {"success": False, "error": "no_such_volume", "msg": "not found"})
            return Response(200, {"success": True})
        return Response(405, "method not allowed")

    # -- test controls -----------------------------------------------------------------------------
    def preempt(self, instance_id: str) -> None:
        """Outbid: the instance is paused; all three states read "stopped". With hosts, its process first
        gets SIGTERM and its grace period (this call returns once it is gone)."""
        if self.hosts is not None:
            self.hosts.preempt(str(instance_id))
        with self.lock:
            inst = self.instances[str(instance_id)]
            inst["cur_state"] = inst["intended_status"] = inst["next_state"] = "stopped"
            inst["actual_status"] = "exited"
            inst["status_msg"] = "outbid"

    def crash(self, instance_id: str, actual: str = "exited") -> None:
        """The container died (exited / offline / unknown) while intended to run."""
        with self.lock:
            self.instances[str(instance_id)]["actual_status"] = actual

    def is_live(self, inst: dict[str, Any]) -> bool:
        return True  # destroyed instances are removed at once
